//! `POST /transfers`, `GET /transfers`, `GET /transfers/{id}`, `POST /transfers/{id}/cancel`,
//! `POST /transfers/{id}/capture`.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use super::body::{json_fields, Array, Flag, Integer, MetadataField, Object, Text};
use super::error::responses::{JsonBodyRefused, MalformedJson, NoSuchTransfer, StoreUnavailable};
use super::{
    field, idempotency, shorten, ApiError, AppState, JsonFields, OptionalJsonFields, PathId,
    Problem, QueryParams, QuerySpec, MAX_WAIT,
};
use crate::store::{SortKey, TransferFilter};
use crate::transfer::model::TransferState;
use crate::transfer::operations::Created;
use crate::transfer::requests::{Hold, InvalidLegs, Movement, NewLeg, NewTransfer};
use crate::transfer::validated::{
    id_pattern, metadata_key_pattern, text_schema, valid_id, valid_metadata_key,
    valid_metadata_value, HoldExpiry, PositiveAmount, TransferId, MAX_ID_LEN,
    METADATA_KEY_MAX_CHARS, METADATA_MAX_KEYS, METADATA_MAX_VALUE_CHARS,
};
use crate::transfer::view::Transfer;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/transfers", post(create_transfer).get(list_transfers))
        .route("/transfers/{id}", get(get_transfer))
        .route("/transfers/{id}/cancel", post(cancel_transfer))
        .route("/transfers/{id}/capture", post(capture_transfer))
}

json_fields! {
    /// The body of `POST /transfers`. Any other field is a 422 naming it (names are
    /// case-sensitive: `Hold` is not `hold`).
    pub struct CreateTransfer ("a transfer") {
        /// Idempotency key: 1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`. Absent or
        /// null: the `Idempotency-Key` header's key, else a UUIDv7 the server makes (then a retry
        /// is a new transfer). With an `Idempotency-Key` header, it must equal the key (else 422).
        #[schema(value_type = Option<crate::transfer::validated::TransferId>)]
        id: Text,
        /// Source account id (1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`), with `to`
        /// and `amount`: a one-leg transfer (never with `legs`, else 422).
        #[schema(value_type = Option<crate::transfer::validated::AccountId>, nullable = false)]
        from: Text,
        /// Destination account id (same rules); must differ from `from`, else 422. With `from`
        /// and `amount`, never with `legs`.
        #[schema(value_type = Option<crate::transfer::validated::AccountId>, nullable = false)]
        to: Text,
        /// Units to move: an integer from 1 to 2^63-1 (a JSON integer: `5`, not `5.0`). With
        /// `from` and `to`, never with `legs`.
        #[schema(value_type = Option<i64>, nullable = false, minimum = 1)]
        amount: Integer,
        /// A multi-leg transaction instead of `from`, `to` and `amount`: 1 to 16 legs, all
        /// applied or none. An account may appear in several legs; its floor is checked on its
        /// net debit. Each leg's `from` ≠ `to` and `amount` ≥ 1, the amounts summing to at most
        /// 2^63-1 (else 422). Every account must share the currency. One leg is the same as
        /// `from`, `to` and `amount`. A multi-leg hold is captured whole.
        #[schema(value_type = Option<Vec<CreateLeg>>, nullable = false, min_items = 1, max_items = 16)]
        legs: Array<Object<CreateLeg>>,
        /// `true`: a hold. It is driven to `pending` (the source debited, the destination credited
        /// but not spendable) and waits there for `POST /transfers/{id}/capture`, `.../cancel`
        /// or its expiry (then it rolls back with `expired`). Default `false`.
        #[schema(value_type = Option<bool>, nullable = false)]
        hold: Flag,
        /// How long a hold waits: a duration such as `10m`, `1h30m` or `2days`, from 1 s to 30
        /// days (else 422); default the service's `HOLD_TIMEOUT` (24 h unless configured). Only
        /// with `"hold": true` (else 422).
        #[schema(value_type = Option<crate::transfer::validated::HoldExpiry>, nullable = false)]
        hold_expires_in: Text,
        /// The currency (1–16 characters of `[A-Z0-9_]`) both accounts must have; absent or
        /// null: they must merely share one, or both have none. Otherwise the transfer rolls
        /// back with reason `currency_mismatch` and no unit moves.
        #[schema(value_type = Option<crate::transfer::validated::Currency>)]
        currency: Text,
        /// Labels (such as an order id): at most 16 keys of `[a-z0-9_.-]{1,40}`, string values
        /// of at most 256 characters; absent or null: none. Part of the replay comparison, and
        /// filterable: `GET /transfers?metadata=<key>:<value>`.
        #[schema(value_type = Option<crate::transfer::validated::Metadata>)]
        metadata: MetadataField,
    }
}

json_fields! {
    /// One of the `legs` of `POST /transfers`: `amount` units from `from` to `to`. Any other
    /// field is a 422.
    pub struct CreateLeg ("a leg") {
        /// Source account id (1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`).
        #[schema(value_type = crate::transfer::validated::AccountId)]
        from: Text,
        /// Destination account id (same rules); must differ from `from`.
        #[schema(value_type = crate::transfer::validated::AccountId)]
        to: Text,
        /// Units this leg moves: an integer from 1 to 2^63-1.
        #[schema(value_type = i64, minimum = 1)]
        amount: Integer,
    }
}

json_fields! {
    /// The body of `POST /transfers/{id}/capture`; it may also be empty. Any other field is a
    /// 422 naming it.
    #[schema(examples(json!({"amount": 60})))]
    pub struct CaptureHold ("a capture") {
        /// Units to move, from 1 to the held amount (else 422); default: all of it. The rest
        /// goes back to the source. A multi-leg hold is captured whole: no `amount`, or the sum
        /// of its legs (anything else is 422).
        #[schema(value_type = Option<i64>, nullable = false, minimum = 1)]
        amount: Integer,
    }
}

/// A page of transfers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TransferPage {
    pub items: Vec<Transfer>,
    /// Pass as `cursor` for the next page; null at the end.
    pub next_cursor: Option<String>,
}

/// Creates a transfer: settled before the answer on the embedded store, driven by a worker on
/// Elasticsearch.
///
/// On the embedded store one transaction creates and settles it (`finished`, or `rolled-back`
/// with its `reason`); a hold, and every transfer on Elasticsearch, is answered `created` and
/// driven on by a background worker: poll `GET /transfers/{id}` (`?wait=5s` long-polls).
///
/// Idempotent by the transfer's `id`, given in the body or as the `Idempotency-Key` header:
/// the same id with the same `from`, `to`, `amount`, `currency` and `metadata` replays the transfer (`200`, as it is
/// now); with another, `409`. Ids are kept forever (transfers are never deleted), so a retry
/// is a replay however late it comes.
#[utoipa::path(post, path = "/transfers", tag = "transfers",
    request_body = CreateTransfer,
    params(("Idempotency-Key" = Option<super::idempotency::IdempotencyKey>, Header, nullable = false,
        description = "The transfer's id, as the `Idempotency-Key` header \
            (draft-ietf-httpapi-idempotency-key-header): without a body `id` the key is the \
            id (so it must be a valid id, else `422`); with a body `id` it must be the same \
            (else `422`). Bare (`t-1`) or a quoted Structured Field string (`\"t-1\"`). \
            Retention: forever (transfers are never deleted). Unlike the draft's suggestion, \
            reusing a key with another request is a `409` (the id exists with another \
            request), and a concurrent duplicate is answered as a replay, not a `409`.")),
    responses(
        (status = 201, description = "Stored, and shown as stored: `finished` or `rolled-back` where one store transaction settled it (the embedded store), `created` where a worker drives it (Elasticsearch, and holds)", body = Transfer,
            headers(("Location" = String, description = "/transfers/{id}"))),
        (status = 200, description = "Identical replay: the transfer as it is now", body = Transfer),
        JsonBodyRefused,
        (status = 409, description = "Same id, different request", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, an `Idempotency-Key` that is not a valid id, or one that differs from the body's `id`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable, or too many transfers in flight (`type` `/problems/overloaded`, nothing created; retry after `Retry-After` seconds)",
            body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before retrying; sent when the service is overloaded"))),
    ))]
pub async fn create_transfer(
    State(state): State<AppState>,
    headers: HeaderMap,
    _: QueryParams,
    JsonFields(body): JsonFields<CreateTransfer>,
) -> Result<Response, ApiError> {
    let key = idempotency::transfer_key(&headers)?;
    let new = new_transfer(body, key.clone().map(TransferId::from))?;
    if let Some(key) = &key {
        idempotency::check_same(new.id(), key)?;
    }
    if crate::trace_context::is_on() {
        // The request's span names the transfer: on the default protocol it holds the whole
        // settlement (`crate::transfer::transfer_span_in_request`).
        tracing::Span::current().record("transfer.id", new.id().as_str());
    }
    let created = state
        .engine
        .create_transfer(new)
        .await
        .map_err(|e| counted_if_shed(&state, "/transfers", e.into()))?;
    Ok(match created {
        Created::New(doc) => {
            let location = format!("/transfers/{}", doc.transaction_id);
            (
                StatusCode::CREATED,
                [(header::LOCATION, location)],
                Json(Transfer::from(doc)),
            )
                .into_response()
        }
        Created::Replayed(doc) => (StatusCode::OK, Json(Transfer::from(doc))).into_response(),
    })
}

/// The body of `POST /transfers` (one item of a batch), validated: 422 on the first invalid
/// field. A missing id becomes `id_if_absent` (from an `Idempotency-Key`), else a new UUIDv7.
pub(crate) fn new_transfer(
    body: CreateTransfer,
    id_if_absent: Option<TransferId>,
) -> Result<NewTransfer, ApiError> {
    let id_given = body.id.is_some();
    let new = NewTransfer::try_from(body)?;
    Ok(match id_if_absent {
        Some(id) if !id_given => new.with_id(id),
        _ => new,
    })
}

impl TryFrom<CreateTransfer> for NewTransfer {
    type Error = ApiError;

    /// The body, each field read once into its validated value: 422 on the first invalid
    /// field. Without an `id`, a new UUIDv7.
    fn try_from(mut body: CreateTransfer) -> Result<Self, ApiError> {
        field::known_and_once(&body)?;
        let id = field::transfer_id(body.id.take(), "id")?;
        let movement = match body.legs.take() {
            None => {
                let leg = CreateLeg {
                    from: body.from.take(),
                    to: body.to.take(),
                    amount: body.amount.take(),
                    ..CreateLeg::default()
                };
                Movement::one(NewLeg::try_from(leg)?).map_err(ApiError::Invalid)?
            }
            Some(given) => {
                let one_leg_fields = [
                    ("from", body.from.is_some()),
                    ("to", body.to.is_some()),
                    ("amount", body.amount.is_some()),
                ];
                if let Some((name, _)) = one_leg_fields.into_iter().find(|(_, given)| *given) {
                    return Err(ApiError::Invalid(format!(
                        "give either `legs` or `from`, `to` and `amount`, not both (`{name}` is \
                         there with `legs`)"
                    )));
                }
                legs_of(given)?
            }
        };
        let currency = field::currency(body.currency, "currency")?;
        let metadata = field::metadata(body.metadata, "metadata")?;
        let hold = hold_fields(body.hold, body.hold_expires_in)?;
        Ok(
            NewTransfer::new(id.unwrap_or_else(TransferId::fresh), movement)
                .with_hold(hold)
                .with_currency(currency)
                .with_metadata(metadata),
        )
    }
}

impl TryFrom<CreateLeg> for NewLeg {
    type Error = ApiError;

    /// `from`, `to` and `amount` (of a one-leg transfer, or of one of `legs`).
    fn try_from(leg: CreateLeg) -> Result<Self, ApiError> {
        field::known_and_once(&leg)?;
        let from = field::account_id(leg.from, "from")?;
        let to = field::account_id(leg.to, "to")?;
        let amount = field::required_amount(leg.amount, "amount")?;
        Ok(NewLeg::new(from, to, amount))
    }
}

impl From<InvalidLegs> for ApiError {
    fn from(invalid: InvalidLegs) -> Self {
        ApiError::Invalid(invalid.to_string())
    }
}

/// `legs`: 1 to [`MAX_LEGS`](crate::transfer::requests::MAX_LEGS) objects
/// `{"from","to","amount"}` ([`Movement::of_legs`]). One leg is a one-leg transfer, stored
/// and answered exactly as one sent with `from`, `to` and `amount`; with several, the sum.
fn legs_of(given: Array<Object<CreateLeg>>) -> Result<Movement, ApiError> {
    let Array::Given(items) = given else {
        return Err(ApiError::Invalid(
            "`legs` must be an array of {\"from\", \"to\", \"amount\"} objects".into(),
        ));
    };
    Movement::of_legs(items.into_iter().enumerate().map(|(i, item)| leg(i, item)))
}

/// `legs[i]`, checked like a one-leg transfer's fields; a refusal names it (`legs[1].from`).
fn leg(i: usize, item: Object<CreateLeg>) -> Result<NewLeg, ApiError> {
    let Object::Given(leg) = item else {
        return Err(ApiError::Invalid(format!(
            "`legs[{i}]` must be an object {{\"from\", \"to\", \"amount\"}}"
        )));
    };
    NewLeg::try_from(leg).map_err(|error| match error {
        ApiError::Invalid(why) => ApiError::Invalid(why.replacen('`', &format!("`legs[{i}]."), 1)),
        other => other,
    })
}

/// `hold` (a boolean, default false) and `hold_expires_in` (a duration string within the
/// hold bounds, only with `"hold": true`).
fn hold_fields(hold: Option<Flag>, expires_in: Option<Text>) -> Result<Option<Hold>, ApiError> {
    let hold = match hold {
        None => false,
        Some(Flag::Given(hold)) => hold,
        Some(Flag::Other) => return Err(ApiError::Invalid("`hold` must be true or false".into())),
    };
    let expires_in = match expires_in {
        None => None,
        Some(_) if !hold => {
            return Err(ApiError::Invalid(
                "`hold_expires_in` is only for a hold (`\"hold\": true`)".into(),
            ))
        }
        Some(Text::Given(text)) => Some(*HoldExpiry::parse(&text).ok_or_else(|| {
            ApiError::Invalid(format!(
                "`hold_expires_in` must be a duration {}, such as \"10m\", \"1h30m\" or \
                 \"2days\" (received \"{}\")",
                HoldExpiry::bounds(),
                shorten(&text)
            ))
        })?),
        Some(Text::Other) => {
            return Err(ApiError::Invalid(
                "`hold_expires_in` must be a duration string such as \"10m\"".into(),
            ))
        }
    };
    Ok(hold.then_some(Hold { expires_in }))
}

/// Counts a create that admission control shed (`requests_shed_total{route}`).
pub(crate) fn counted_if_shed(state: &AppState, route: &str, error: ApiError) -> ApiError {
    if let ApiError::Overloaded(_) = error {
        state
            .metrics
            .requests_shed_total
            .with_label_values(&[route])
            .inc();
    }
    error
}

/// The query of `GET /transfers/{id}`.
pub struct WaitQuery;

impl QuerySpec for WaitQuery {
    const NAMES: &'static [&'static str] = &["wait"];
    const EXAMPLE: &'static str = "?wait=5s";
}

/// A transfer; with `?wait=5s`, answers as soon as it is terminal or when the wait ends.
#[utoipa::path(get, path = "/transfers/{id}", tag = "transfers",
    params(("id" = crate::transfer::validated::TransferId, Path,
            description = "Transfer id (1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`; any other value is 404)"),
        ("wait" = Option<Wait>, Query,
            description = "Long-poll up to this long for a terminal state: `<digits><unit>`, repeated (`5s`, `500ms`, `1m30s`; units `ns`, `us`, `ms`, `s`, `m`, `h`); `0s` answers at once, more than 30 s waits 30 s. Any other parameter, or `wait` given twice, is a 422.")),
    responses(
        (status = 200, description = "The transfer", body = Transfer),
        NoSuchTransfer,
        (status = 422, description = "Invalid `wait`, or a query parameter given twice", body = Problem, content_type = "application/problem+json"),
        StoreUnavailable,
    ))]
pub async fn get_transfer(
    State(state): State<AppState>,
    PathId(id): PathId<TransferId>,
    QueryParams(query, _, _): QueryParams<WaitQuery>,
) -> Result<Json<Transfer>, ApiError> {
    let wait = query
        .get("wait")
        .map(|text| Wait::parse(text))
        .transpose()?;
    let Some(id) = id else {
        return Err(ApiError::NotFound("no transfer with this id".into()));
    };
    let found = match wait {
        Some(wait) => state.engine.wait_transfer(&id, *wait).await?,
        None => state.engine.get_transfer(&id).await?,
    };
    found
        .map(|doc| Json(Transfer::from(doc)))
        .ok_or_else(|| ApiError::NotFound(format!("no transfer {id}")))
}

text_schema! {
    /// How long a long-poll may wait: one or more `<digits><unit>`, units `ns`, `us`, `ms`,
    /// `s`, `m`, `h` (`5s`, `500ms`, `1m30s`); `0s` answers at once; more than 30 s (however
    /// large the number) waits 30 s.
    pub struct Wait(std::time::Duration) {
        pattern: WAIT_PATTERN,
        example: "5s",
    }
}

/// The values of `?wait=` the server accepts: the pattern [`Wait::parse`] follows.
const WAIT_PATTERN: &str = "^([0-9]+(ns|us|ms|s|m|h))+$";

impl Wait {
    /// `?wait=`: one or more `<digits><unit>` with units `ns`, `us`, `ms`, `s`, `m`, `h` (`5s`,
    /// `500ms`, `1m30s`), exactly what [`WAIT_PATTERN`] admits, capped at [`MAX_WAIT`]: a
    /// number too large for any clock is "more than 30 s" too. Anything else is 422.
    pub(crate) fn parse(text: &str) -> Result<Self, ApiError> {
        let invalid = || {
            ApiError::Invalid(
                "`wait` must be a duration like 5s, 500ms or 1m30s (units ns, us, ms, s, m, h)"
                    .into(),
            )
        };
        if text.is_empty() {
            return Err(invalid());
        }
        let mut rest = text;
        let mut total_ns: u128 = 0;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(invalid());
            }
            let (number, after) = rest.split_at(digits);
            // Two-letter units first: `1ms` is a millisecond, never a minute and a stray `s`.
            let (unit_ns, unit_len): (u128, usize) = match after.as_bytes() {
                [b'n', b's', ..] => (1, 2),
                [b'u', b's', ..] => (1_000, 2),
                [b'm', b's', ..] => (1_000_000, 2),
                [b's', ..] => (1_000_000_000, 1),
                [b'm', ..] => (60_000_000_000, 1),
                [b'h', ..] => (3_600_000_000_000, 1),
                _ => return Err(invalid()),
            };
            let number = u128::from(number.parse::<u64>().unwrap_or(u64::MAX));
            total_ns = total_ns.saturating_add(number.saturating_mul(unit_ns));
            rest = &after[unit_len..];
        }
        let capped = total_ns.min(MAX_WAIT.as_nanos());
        Ok(Self(std::time::Duration::from_nanos(
            u64::try_from(capped).unwrap_or(u64::MAX),
        )))
    }
}

/// Cancels a transfer that has not committed; for a hold, releases it (reason `cancelled`).
#[utoipa::path(post, path = "/transfers/{id}/cancel", tag = "transfers",
    params(("id" = crate::transfer::validated::TransferId, Path,
        description = "Transfer id (1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`; any other value is 404)")),
    responses(
        (status = 200, description = "`terminating` (rollback under way) or `rolled-back`", body = Transfer),
        NoSuchTransfer,
        (status = 409, description = "Already committed or finished, or a hold already captured", body = Problem, content_type = "application/problem+json"),
        StoreUnavailable,
    ))]
pub async fn cancel_transfer(
    State(state): State<AppState>,
    PathId(id): PathId<TransferId>,
    _: QueryParams,
) -> Result<Json<Transfer>, ApiError> {
    let Some(id) = id else {
        return Err(ApiError::NotFound("no transfer with this id".into()));
    };
    let cancelled = state.engine.cancel_transfer(&id).await;
    Ok(Json(Transfer::from(
        cancelled.map_err(|e| no_transfer(e, &id))?,
    )))
}

/// A missing transfer's 404 says which, as `GET /transfers/{id}` does.
fn no_transfer(error: crate::transfer::operations::ServiceError, id: &str) -> ApiError {
    match error {
        crate::transfer::operations::ServiceError::NotFound => {
            ApiError::NotFound(format!("no transfer {id}"))
        }
        other => other.into(),
    }
}

/// Captures a hold: it commits and moves `amount` (default all); the rest returns to the
/// source.
///
/// Waits up to 10 s for the commit and answers the transfer `committed` or `finished` with
/// `captured_amount`; a capture that arrives while the hold is still `created` is recorded
/// and applied once it is `pending` (answered `created`/`pending` with `captured_amount` if
/// that takes longer). An identical repeat answers `200` again. Of a capture and a cancel (or
/// the expiry) racing, exactly one wins; the other is a `409`.
#[utoipa::path(post, path = "/transfers/{id}/capture", tag = "transfers",
    params(("id" = crate::transfer::validated::TransferId, Path,
        description = "Transfer id (1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`; any other value is 404)")),
    request_body(content = Option<CaptureHold>, description = "Optional: no body (or `{}`) captures all of it"),
    responses(
        (status = 200, description = "Captured: `committed` or `finished`, with `captured_amount`", body = Transfer),
        MalformedJson,
        NoSuchTransfer,
        (status = 409, description = "Not a hold; rolled back, cancelled or expired; or captured with another amount", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body that is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`amount` not an integer from 1 to the held amount", body = Problem, content_type = "application/problem+json"),
        StoreUnavailable,
    ))]
pub async fn capture_transfer(
    State(state): State<AppState>,
    PathId(id): PathId<TransferId>,
    _: QueryParams,
    OptionalJsonFields(body): OptionalJsonFields<CaptureHold>,
) -> Result<Json<Transfer>, ApiError> {
    let amount = match body {
        Some(body) => {
            field::known_and_once(&body)?;
            field::amount(body.amount, "amount")?.map(PositiveAmount::get)
        }
        None => None,
    };
    let Some(id) = id else {
        return Err(ApiError::NotFound("no transfer with this id".into()));
    };
    let captured = state.engine.capture_transfer(&id, amount).await;
    Ok(Json(Transfer::from(
        captured.map_err(|e| no_transfer(e, &id))?,
    )))
}

const DEFAULT_LIMIT: usize = 50;
pub(crate) const MAX_LIMIT: usize = 1000;

/// The query of `GET /transfers`.
pub struct ListQuery;

impl QuerySpec for ListQuery {
    const NAMES: &'static [&'static str] = &[
        "account",
        "state",
        "attention",
        "metadata",
        "limit",
        "cursor",
    ];
    /// `metadata.<key>=<value>`, the form before `metadata=<key>:<value>`, still taken.
    const PREFIXES: &'static [&'static str] = &["metadata."];
    const REPEATABLE: &'static [&'static str] = &["metadata"];
    const EXAMPLE: &'static str = "?account=alice&state=finished&limit=50";
}

/// Transfers, newest first, optionally of one account, in one state, flagged for a person
/// and/or with given metadata (`?metadata=order_id:123`, any number of keys, all must
/// match). Near-real-time on Elasticsearch: a transfer may take up to a second to appear.
///
/// The parameters combine (all must hold). They are strict: a parameter not listed here, or
/// one given twice, is a 422.
#[utoipa::path(get, path = "/transfers", tag = "transfers",
    params(
        ("account" = Option<crate::transfer::validated::AccountId>, Query,
            description = "Only transfers from or to this account (an account id: 1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`)"),
        ("state" = Option<TransferState>, Query, description = "Only transfers in this state"),
        ("attention" = Option<Attention>, Query,
            description = "`true`: only transfers flagged for a person (they carry `attention`: their documents contradict each other; `docs/design.md` §9 says what to do). The only value accepted: omit the parameter to list every transfer; `false` or anything else is 422"),
        ("metadata" = Option<Vec<MetadataFilter>>, Query, style = Form, explode, max_items = 16,
            description = "Only transfers whose metadata has, for each filter `<key>:<value>`, exactly this value for this key: `metadata=order_id:123`. Repeat it for several keys (at most 16, each key once), all must match. The key is 1–40 characters of `[a-z0-9_.-]`, the value (everything after the first `:`) at most 256 characters; anything else is 422. The same filter is also accepted as `metadata.<key>=<value>` (`metadata.order_id=123`), the form this service took first"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 1000, description = "Page size, 1–1000, default 50"),
        ("cursor" = Option<Cursor>, Query, description = "`next_cursor` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page", body = TransferPage),
        (status = 422, description = "Bad, unknown or repeated parameter", body = Problem, content_type = "application/problem+json"),
        StoreUnavailable,
    ))]
pub async fn list_transfers(
    State(state): State<AppState>,
    QueryParams(query, repeated, _): QueryParams<ListQuery>,
) -> Result<Json<TransferPage>, ApiError> {
    let mut filter = TransferFilter {
        limit: DEFAULT_LIMIT,
        ..TransferFilter::default()
    };
    for (key, value) in &query {
        match key.as_str() {
            "account" if valid_id(value) => filter.account = Some(value.clone()),
            "account" => return Err(field::invalid_id("account")),
            "state" => {
                let s: TransferState = value.parse().map_err(|_| {
                    let states: Vec<&str> = TransferState::ALL.iter().map(|s| s.as_str()).collect();
                    ApiError::Invalid(format!(
                        "unknown state `{}`: `state` is one of {}, such as `state=rolled-back`",
                        shorten(value),
                        states.join(", ")
                    ))
                })?;
                filter.state = Some(s.as_str().to_owned());
            }
            "limit" => filter.limit = super::parse_limit(value, MAX_LIMIT)?,
            "cursor" => filter.after = Some(Cursor::parse(value)?.into()),
            "attention" => filter.attention = matches!(Attention::parse(value)?, Attention::True),
            other => match other.strip_prefix("metadata.") {
                Some(key) => filter
                    .metadata
                    .push(MetadataFilter::new(key, value, other)?.into()),
                None => {
                    return Err(ApiError::Invalid(format!(
                        "unknown parameter `{}`",
                        shorten(other)
                    )))
                }
            },
        }
    }
    for (_, given) in &repeated {
        filter.metadata.push(MetadataFilter::parse(given)?.into());
    }
    if filter.metadata.len() > METADATA_MAX_KEYS {
        return Err(ApiError::Invalid(format!(
            "at most {METADATA_MAX_KEYS} metadata filters"
        )));
    }
    // In key order, so the same filters always make the same search.
    filter.metadata.sort();
    if let Some(twice) = filter.metadata.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ApiError::Invalid(format!(
            "metadata key `{}` is filtered more than once; give each key once",
            twice[0].0
        )));
    }
    let (docs, next) = state.engine.list_transfers(filter).await?;
    Ok(Json(TransferPage {
        items: docs.into_iter().map(Transfer::from).collect(),
        next_cursor: next.map(|key| Cursor(key).to_string()),
    }))
}

/// The one value `attention` takes.
#[derive(utoipa::ToSchema)]
pub enum Attention {
    #[schema(rename = "true")]
    True,
}

impl Attention {
    /// Only `true`: `false` could be read as "only the unflagged ones", which the listing
    /// does not offer, so it is refused rather than silently ignored.
    fn parse(value: &str) -> Result<Self, ApiError> {
        match value {
            "true" => Ok(Attention::True),
            _ => Err(ApiError::Invalid(
                "`attention` must be `true` (omit it to list every transfer)".into(),
            )),
        }
    }
}

text_schema! {
    /// One metadata filter of `GET /transfers`: `<key>:<value>`, the key 1–40 characters of
    /// `[a-z0-9_.-]` (so the first `:` ends it), the value everything after it (at most 256
    /// characters), matched exactly.
    pub struct MetadataFilter((String, String)) {
        pattern: format!(
            "^{}:[\\s\\S]{{0,{METADATA_MAX_VALUE_CHARS}}}$",
            metadata_key_pattern()
        ),
        example: "order_id:123",
    }
}

impl MetadataFilter {
    /// `metadata=<key>:<value>`: the key ends at the first `:`.
    fn parse(given: &str) -> Result<Self, ApiError> {
        let (key, value) = given.split_once(':').ok_or_else(|| {
            ApiError::Invalid(format!(
                "`metadata={}`: a metadata filter is `<key>:<value>`, such as \
                 `metadata=order_id:123`",
                shorten(given)
            ))
        })?;
        Self::new(key, value, "metadata")
    }

    /// A filter given as `metadata=<key>:<value>` or `metadata.<key>=<value>` (`parameter`
    /// names it in the 422): a valid key and a value a transfer's metadata can hold.
    fn new(key: &str, value: &str, parameter: &str) -> Result<Self, ApiError> {
        if !valid_metadata_key(key) {
            return Err(ApiError::Invalid(format!(
                "`{}`: metadata keys are 1–{METADATA_KEY_MAX_CHARS} characters of a-z 0-9 _ . - \
                 (received `{}`)",
                shorten(parameter),
                shorten(key)
            )));
        }
        if !valid_metadata_value(value) {
            return Err(ApiError::Invalid(format!(
                "`{}`: metadata values are at most {METADATA_MAX_VALUE_CHARS} characters",
                shorten(parameter)
            )));
        }
        Ok(Self((key.to_owned(), value.to_owned())))
    }
}

/// The latest creation time a cursor may carry: 9999-12-31T23:59:59.999Z, the last instant
/// an RFC 3339 date (and an Elasticsearch `date`) can hold.
const MAX_CURSOR_MILLIS: i64 = 253_402_300_799_999;

text_schema! {
    /// The `next_cursor` of the previous page: `<creation time, ms since the epoch>~<id>`. Any
    /// cursor of that form is accepted (a time past 9999-12-31T23:59:59.999Z reads as that
    /// instant).
    pub struct Cursor(SortKey) {
        pattern: format!("^[0-9]+~{}$", id_pattern(MAX_ID_LEN)),
        example: "1700000000000~t-1",
    }
}

impl Cursor {
    /// `<creation millis>~<id>`, as [`list_transfers`] issues them: digits, `~`, a valid id.
    /// A time past [`MAX_CURSOR_MILLIS`] reads as that instant (no transfer is newer), so
    /// every cursor of that form is accepted and none outside the store's range reaches it;
    /// anything else is 422.
    fn parse(text: &str) -> Result<Self, ApiError> {
        let invalid = || ApiError::Invalid("`cursor` is not one this service issued".into());
        let (millis, id) = text.split_once('~').ok_or_else(invalid)?;
        if millis.is_empty() || !millis.bytes().all(|b| b.is_ascii_digit()) || !valid_id(id) {
            return Err(invalid());
        }
        let millis = millis
            .parse::<i64>()
            .unwrap_or(i64::MAX)
            .min(MAX_CURSOR_MILLIS);
        Ok(Self(SortKey {
            millis,
            id: id.to_owned(),
        }))
    }
}

/// The cursor as [`Cursor::parse`] reads it.
impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{}~{}", self.0.millis, self.0.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::model::RollbackReason;

    #[test]
    fn rollback_reasons_are_shown_by_their_names() {
        for reason in [
            RollbackReason::InsufficientFunds,
            RollbackReason::AccountNotFound,
            RollbackReason::BalanceOverflow,
            RollbackReason::Cancelled,
            RollbackReason::TimedOut,
            RollbackReason::Expired,
            RollbackReason::AccountBusy,
            RollbackReason::CurrencyMismatch,
        ] {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
    }

    #[test]
    fn waits_are_digits_and_units_capped_at_30_seconds() {
        use std::time::Duration;
        for (text, wait) in [
            ("0s", Duration::ZERO),
            ("500ms", Duration::from_millis(500)),
            ("1ms", Duration::from_millis(1)),
            ("1m", MAX_WAIT),
            ("1s500ms", Duration::from_millis(1500)),
            ("2us3ns", Duration::from_nanos(2003)),
            ("007s", Duration::from_secs(7)),
            ("29s999ms999us999ns", Duration::from_nanos(29_999_999_999)),
            ("1h", MAX_WAIT),
            ("99999999999999999999999999h", MAX_WAIT),
        ] {
            assert_eq!(*Wait::parse(text).unwrap(), wait, "{text}");
        }
        for text in [
            "", "5", "s", "5 s", " 5s", "5s ", "-1s", "1.5s", "5sec", "1d", "5S", "1mss",
        ] {
            assert!(Wait::parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn a_cursor_past_the_last_date_reads_as_the_last_date() {
        for text in [
            "253402300800000~a",
            "9223372036854775808~a",
            "99999999999999999999~a",
        ] {
            let key = Cursor::parse(text).unwrap();
            assert_eq!(key.millis, MAX_CURSOR_MILLIS, "{text}");
        }
        assert_eq!(Cursor::parse("0007~a").unwrap().millis, 7);
    }

    #[test]
    fn cursors_round_trip_and_odd_ones_are_refused() {
        let key = Cursor::parse("1700000000000~t-1").unwrap();
        assert_eq!((key.millis, key.id.as_str()), (1_700_000_000_000, "t-1"));
        for bad in [
            "", "~", "1~", "~a", "-1~a", "+1~a", " 1~a", "1.5~a", "1~a~b", "1~..",
        ] {
            assert!(Cursor::parse(bad).is_err(), "{bad:?}");
        }
    }
}
