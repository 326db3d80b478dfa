//! `POST /transfers/batch`: up to [`MAX_BATCH`] transfers in one request, each handled
//! exactly as `POST /transfers` would handle it (docs/design.md §5).
//!
//! Items are independent, like the items of Elasticsearch's `_bulk`: each gets the status
//! and body its single request would have got, in request order. Only the envelope can fail
//! the whole request (400, 413, 415, 422), and admission control, which admits the batch
//! whole or not at all (503 with `Retry-After`).

use crate::transfer::validated::TransferId;
use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use futures_util::stream::{self, StreamExt};
use serde::Serialize;

use super::body::{json_fields, Array, Object};
use super::error::responses::MalformedJson;
use super::transfers::{counted_if_shed, new_transfer, CreateTransfer};
use super::{
    field, idempotency, ApiError, AppState, JsonFields, PathId, Problem, QueryParams, NOT_AN_OBJECT,
};
use crate::transfer::admission::Admitted;
use crate::transfer::operations::Created;
use crate::transfer::requests::NewTransfer;
use crate::transfer::view::Transfer;
use crate::transfer::Engine;

/// The most transfers one batch holds (and fewer if `MAX_IN_FLIGHT` is lower). 1,000
/// items of the largest valid transfer (ids of 128 characters) are about 450 KB, inside the
/// 1 MiB body limit.
pub const MAX_BATCH: usize = 1000;

/// Items of one batch being created at once. Enough to keep the store's write coalescing
/// busy (the Elasticsearch backend groups up to 512 writes in one `_bulk`), few enough that
/// one batch does not open a thousand store requests at the same moment.
const CONCURRENT_ITEMS: usize = 64;

const ROUTE: &str = "/transfers/batch";

pub fn router() -> Router<AppState> {
    // The static segment wins over `/transfers/{id}` for every method, so a transfer whose
    // id is `batch` is read here.
    Router::new().route(ROUTE, post(create_batch).get(get_transfer_named_batch))
}

json_fields! {
    /// The body of `POST /transfers/batch`. Any other field is a 422 for the whole batch; an
    /// item with a field a transfer does not have is that item's 422.
    #[schema(examples(json!({"transfers": [
        {"from": "alice", "to": "bob", "amount": 10},
        {"from": "alice", "to": "carol", "amount": 20, "metadata": {"order_id": "124"}},
    ]})))]
    pub struct CreateBatch ("a batch") {
        /// 1 to 1,000 transfers, each exactly the body of `POST /transfers`.
        #[schema(value_type = Vec<CreateTransfer>, min_items = 1, max_items = 1000)]
        transfers: Array<Object<CreateTransfer>>,
    }
}

/// The outcome of one item: what `POST /transfers` would have answered for it, told apart by
/// `outcome` (a discriminator, so that a generated client reads each item as its one type).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[schema(discriminator(property_name = "outcome", mapping(
    ("transfer" = "#/components/schemas/BatchTransfer"),
    ("problem" = "#/components/schemas/BatchProblem"),
)))]
pub enum BatchItem {
    Transfer(BatchTransfer),
    Problem(BatchProblem),
}

/// An item that made its transfer (`201`: created, shown as stored, as `POST /transfers`
/// answers) or found it made by an identical request (`200`: a replay, as it is now).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BatchTransfer {
    #[schema(inline)]
    pub outcome: TransferOutcome,
    /// `201` or `200`.
    pub status: u16,
    pub transfer: Box<Transfer>,
}

/// An item refused or failed: `409`, the id exists with another request; `422`, the item is
/// invalid; `503`, the store was unavailable for this item, which may or may not have been
/// created (retry it: with its `id`, a retry is a replay); `500`, a fault of ours, logged.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BatchProblem {
    #[schema(inline)]
    pub outcome: ProblemOutcome,
    /// The problem's status: what `POST /transfers` would have answered.
    pub status: u16,
    pub problem: Problem,
}

/// `outcome` of a [`BatchTransfer`]: always `transfer`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TransferOutcome {
    Transfer,
}

/// `outcome` of a [`BatchProblem`]: always `problem`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProblemOutcome {
    Problem,
}

/// One outcome per item, in request order.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BatchResult {
    pub items: Vec<BatchItem>,
}

impl From<Created<crate::transfer::model::TransferDoc>> for BatchItem {
    fn from(created: Created<crate::transfer::model::TransferDoc>) -> Self {
        match created {
            Created::New(doc) => BatchItem::Transfer(BatchTransfer {
                outcome: TransferOutcome::Transfer,
                status: 201,
                transfer: Box::new(doc.into()),
            }),
            Created::Replayed(doc) => BatchItem::Transfer(BatchTransfer {
                outcome: TransferOutcome::Transfer,
                status: 200,
                transfer: Box::new(doc.into()),
            }),
        }
    }
}

impl From<ApiError> for BatchItem {
    fn from(error: ApiError) -> Self {
        if let ApiError::Internal(detail) = &error {
            // The item's problem never carries internals; they are logged here, once.
            tracing::error!(%detail, "internal error on a batch item");
        }
        let problem = error.problem();
        BatchItem::Problem(BatchProblem {
            outcome: ProblemOutcome::Problem,
            status: problem.status,
            problem,
        })
    }
}

/// Accepts up to 1,000 transfers; each item is answered as `POST /transfers` would answer it.
///
/// With an `Idempotency-Key`, item `i` (from 0) without an `id` gets the id `<key>:<i>`:
/// resending the same batch (the same items in the same order) with the same key replays
/// every item instead of creating it again.
#[utoipa::path(post, path = "/transfers/batch", tag = "transfers",
    request_body = CreateBatch,
    params(("Idempotency-Key" = Option<super::idempotency::BatchIdempotencyKey>, Header, nullable = false,
        description = "Names the batch (draft-ietf-httpapi-idempotency-key-header): item `i` \
            (counted from 0) without an `id` gets the id `<key>:<i>`, so resending the same \
            items in the same order with the same key replays each of them (`200`) instead of \
            creating new transfers; an item whose derived id exists with another request is \
            that item's `409`. Items with an `id` keep it. 1–124 characters (so that \
            `<key>:<i>` is a valid id), bare or a quoted Structured Field string; anything \
            else is a `422` for the whole batch. Retention: forever (transfers are never \
            deleted).")),
    responses(
        (status = 200, description = "One outcome per item, in request order; items are independent (`201`, `200`, `409`, `422`, `503` or `500` each)", body = BatchResult),
        MalformedJson,
        (status = 413, description = "Body too large (over 1 MiB): a batch of 1,000 items with maximal metadata (16 keys of 40 characters, values of 256) exceeds it; send fewer items per batch", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not an object, `transfers` missing or not an array, or not 1 to 1,000 items (nor more than `MAX_IN_FLIGHT`), or an `Idempotency-Key` that is not 1–124 characters of an id", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Too many transfers in flight (`type` `/problems/overloaded`): nothing created; retry after `Retry-After` seconds",
            body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before retrying"))),
    ))]
pub async fn create_batch(
    State(state): State<AppState>,
    headers: HeaderMap,
    _: QueryParams,
    JsonFields(body): JsonFields<CreateBatch>,
) -> Result<Json<BatchResult>, ApiError> {
    let key = idempotency::batch_key(&headers)?;
    let items = envelope(body, state.engine.max_in_flight())?;
    let parsed: Vec<Result<NewTransfer, ApiError>> = items
        .into_iter()
        .enumerate()
        .map(|(index, value)| {
            let id_if_absent = key.as_ref().map(|key| idempotency::item_id(key, index));
            item(value, id_if_absent)
        })
        .collect();
    let valid = parsed.iter().filter(|p| p.is_ok()).count();
    let admitted = state
        .engine
        .admit(valid)
        .await
        .map_err(|e| counted_if_shed(&state, ROUTE, e.into()))?;
    let items = create_all(&state.engine, parsed, admitted).await;
    Ok(Json(BatchResult { items }))
}

/// The items of a well-formed envelope: `transfers`, an array of 1 to [`MAX_BATCH`] items,
/// and no more than admission control could ever admit at once.
fn envelope(
    body: CreateBatch,
    max_in_flight: usize,
) -> Result<Vec<Object<CreateTransfer>>, ApiError> {
    field::known_and_once(&body)?;
    let items = match body.transfers {
        None => return Err(ApiError::Invalid("`transfers` is required".into())),
        Some(Array::Given(items)) => items,
        Some(Array::Other) => {
            return Err(ApiError::Invalid(
                "`transfers` must be an array of transfers".into(),
            ))
        }
    };
    if items.is_empty() {
        return Err(ApiError::Invalid(
            "`transfers` must hold at least one transfer".into(),
        ));
    }
    if items.len() > MAX_BATCH {
        return Err(ApiError::Invalid(format!(
            "`transfers` holds {} transfers; a batch holds at most {MAX_BATCH}",
            items.len()
        )));
    }
    if items.len() > max_in_flight {
        return Err(ApiError::Invalid(format!(
            "`transfers` holds {} transfers; this instance admits at most {max_in_flight} in \
             flight (MAX_IN_FLIGHT): split the batch",
            items.len()
        )));
    }
    Ok(items)
}

/// One item, validated as the body of `POST /transfers` is; without an `id` it gets
/// `id_if_absent` (derived from the batch's `Idempotency-Key`), else a UUIDv7.
fn item(
    value: Object<CreateTransfer>,
    id_if_absent: Option<crate::transfer::validated::TransferId>,
) -> Result<NewTransfer, ApiError> {
    match value {
        Object::Given(body) => new_transfer(body, id_if_absent),
        Object::Other => Err(ApiError::Invalid(NOT_AN_OBJECT.into())),
    }
}

/// Creates every valid item, [`CONCURRENT_ITEMS`] ids at a time, each with one of the
/// batch's permits. Items sharing an id run one after the other in request order, so they
/// behave as sequential single requests would (the later ones replay or conflict).
async fn create_all(
    engine: &Arc<Engine>,
    parsed: Vec<Result<NewTransfer, ApiError>>,
    mut admitted: Admitted,
) -> Vec<BatchItem> {
    let mut slots: Vec<Option<BatchItem>> = Vec::with_capacity(parsed.len());
    let mut groups: Vec<Vec<(usize, NewTransfer, Admitted)>> = Vec::new();
    let mut group_of_id: HashMap<String, usize> = HashMap::new();
    for (slot, parsed) in parsed.into_iter().enumerate() {
        match parsed {
            Err(invalid) => slots.push(Some(invalid.into())),
            Ok(new) => {
                slots.push(None);
                let permit = admitted
                    .take_one()
                    .expect("the batch was admitted one permit per valid item");
                let group = *group_of_id
                    .entry(String::from(new.id().clone()))
                    .or_insert_with(|| {
                        groups.push(Vec::new());
                        groups.len() - 1
                    });
                groups[group].push((slot, new, permit));
            }
        }
    }
    let mut done = stream::iter(groups)
        .map(|group| create_in_order(engine, group))
        .buffer_unordered(CONCURRENT_ITEMS);
    while let Some(outcomes) = done.next().await {
        for (slot, outcome) in outcomes {
            slots[slot] = Some(outcome);
        }
    }
    slots
        .into_iter()
        .map(|slot| slot.expect("every item is answered"))
        .collect()
}

/// The items of one id, one after the other.
async fn create_in_order(
    engine: &Arc<Engine>,
    group: Vec<(usize, NewTransfer, Admitted)>,
) -> Vec<(usize, BatchItem)> {
    let mut outcomes = Vec::with_capacity(group.len());
    for (slot, new, permit) in group {
        let outcome = match engine.create_admitted(new, permit).await {
            Ok(created) => created.into(),
            Err(error) => ApiError::from(error).into(),
        };
        outcomes.push((slot, outcome));
    }
    outcomes
}

/// `GET /transfers/batch`: the transfer whose id is `batch` (the static route shadows
/// `/transfers/{id}` for this one id).
async fn get_transfer_named_batch(
    state: State<AppState>,
    query: QueryParams<super::transfers::WaitQuery>,
) -> Result<Json<Transfer>, ApiError> {
    super::transfers::get_transfer(state, PathId(TransferId::parse("batch".into())), query).await
}
