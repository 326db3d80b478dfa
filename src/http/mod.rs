//! The HTTP API (docs/design.md §5). Each resource module has a `router()`; [`router`] merges them
//! and adds the layers every request passes: request id, tracing span, metrics,
//! authentication, timeout, body limit, and a problem+json 404 for unknown routes.

pub mod accounts;
pub mod auth;
pub mod batch;
pub mod body;
pub mod error;
pub mod events;
pub mod health;
pub mod idempotency;
pub mod openapi;
pub mod statements;
pub mod transfers;

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{
    DefaultBodyLimit, FromRequest, FromRequestParts, MatchedPath, Path, Query, Request, State,
};
use axum::http::request::Parts;
use axum::http::{header, HeaderName};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::metrics::Metrics;
use crate::trace_context;
use crate::transfer::validated::{AccountId, TransferId};
use crate::transfer::Engine;
pub use error::{ApiError, ErrorLogged, Problem};

/// Bodies larger than this are refused with 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Long-polls (`?wait=`) are capped here, below the request timeout.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    pub metrics: Arc<Metrics>,
    /// Which routes need an API key, and the keys.
    pub auth: Arc<auth::Auth>,
}

/// A request still running after this is answered 503 (and counted and logged as such).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(MAX_WAIT.as_secs() + 15);

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The whole API.
pub fn router(state: AppState) -> Router {
    router_with_timeout(state, REQUEST_TIMEOUT)
}

/// The whole API with another request timeout than [`REQUEST_TIMEOUT`] (tests use a short
/// one to see a request cut off).
///
/// Every layer is added with `Router::layer`, so it runs after routing and sees the route
/// template (`MatchedPath`); unknown paths reach the fallback, whose template is
/// `unmatched`. From the innermost: the body limit, the timeout (a problem+json 503),
/// authentication (a 401/403 before any work; it names the client on the span), `track`
/// (metrics: outside the timeout, so a request the timeout cuts off is counted with its 503,
/// and outside authentication, so a refusal is counted with its client), request-id
/// propagation, the trace span and response line, and the request-id generator.
pub fn router_with_timeout(state: AppState, request_timeout: Duration) -> Router {
    Router::new()
        .merge(accounts::router())
        .merge(statements::router())
        .merge(transfers::router())
        .merge(batch::router())
        .merge(events::router())
        .merge(health::router())
        .merge(openapi::router())
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(request_timeout, timeout))
        .layer(middleware::from_fn_with_state(
            state.auth.clone(),
            auth::authenticate,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request<Body>| {
                    let route = request
                        .extensions()
                        .get::<MatchedPath>()
                        .map(|p| p.as_str().to_owned());
                    let request_id = request
                        .headers()
                        .get(REQUEST_ID)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    let route = route.as_deref().unwrap_or("unmatched");
                    if !trace_context::is_on() {
                        return tracing::info_span!(
                            "request",
                            method = %request.method(),
                            route,
                            request_id,
                            client = tracing::field::Empty,
                        );
                    }
                    // Traced: the same span with OpenTelemetry's fields (`otel.*`, the HTTP
                    // semantic conventions), a child of the caller's `traceparent`
                    // (`crate::trace_context`).
                    let span = tracing::info_span!(
                        "request",
                        method = %request.method(),
                        route,
                        request_id,
                        client = tracing::field::Empty,
                        otel.name = %format_args!("{} {route}", request.method()),
                        otel.kind = "server",
                        otel.status_code = tracing::field::Empty,
                        http.request.method = %request.method(),
                        http.route = route,
                        url.path = request.uri().path(),
                        http.response.status_code = tracing::field::Empty,
                        transfer.id = tracing::field::Empty,
                    );
                    trace_context::continue_from_headers(&span, request.headers());
                    span
                })
                .on_response(log_response)
                .on_failure(log_failure),
        )
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .with_state(state)
}

async fn unknown_route() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Answers 503 (`ApiError::Timeout`, problem+json like every other error) when the request
/// has not completed within `limit`; the handler's future is dropped.
async fn timeout(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout(limit).into_response(),
    }
}

/// Counts and times every request by method, route template, status and client (the name of
/// its API key, see [`auth`]), including the 503 of a request the timeout layer (inside this
/// one) cut off. Logging is the trace layer's (`log_response`), so each request is logged
/// once.
async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".into());
    let response = next.run(request).await;
    let status = response.status();
    let client = response
        .extensions()
        .get::<auth::Client>()
        .map(|c| c.0.clone())
        .unwrap_or_else(|| Arc::from(crate::auth::ANONYMOUS));
    state
        .metrics
        .http_requests_total
        .with_label_values(&[&method, &route, status.as_str(), &client])
        .inc();
    state
        .metrics
        .http_request_duration_seconds
        .with_label_values(&[&method, &route, status.as_str()])
        .observe(started.elapsed().as_secs_f64());
    response
}

/// One line per response, in the request span (method, route, request id): INFO with the
/// status and latency, or ERROR for a 5xx, so every 5xx yields exactly one error line. A
/// response carrying [`ErrorLogged`] (`ApiError::Internal`) has already logged its detail at
/// ERROR inside the span: its response line stays at INFO.
fn log_response(response: &Response, latency: Duration, span: &tracing::Span) {
    let status = response.status();
    if trace_context::is_on() {
        span.record("http.response.status_code", i64::from(status.as_u16()));
        if status.is_server_error() {
            span.record("otel.status_code", "ERROR");
        }
    }
    let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    let logged_by_handler = response.extensions().get::<ErrorLogged>().is_some();
    if status.is_server_error() && !logged_by_handler {
        tracing::error!(status = status.as_u16(), latency_us, "request failed");
    } else {
        tracing::info!(status = status.as_u16(), latency_us, "request finished");
    }
}

/// A 5xx status is logged by [`log_response`]; this logs only what has no status line of its
/// own: an error of the service or of the response body stream.
fn log_failure(failure: ServerErrorsFailureClass, latency: Duration, _span: &tracing::Span) {
    if let ServerErrorsFailureClass::Error(error) = failure {
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        tracing::error!(%error, latency_us, "request failed while streaming");
    }
}

/// The 422 detail of a body (or batch item) that is JSON but not an object.
pub(crate) const NOT_AN_OBJECT: &str = "body must be a JSON object";

/// A JSON object body with the fields of `T` ([`body`]): 415 unless `Content-Type` is JSON,
/// 413 over the limit, 400 unless the body parses, 422 unless it is an object. Handlers then
/// validate each field (422).
pub struct JsonFields<T>(pub T);

impl<S: Send + Sync, T: body::Fields> FromRequest<S> for JsonFields<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|mime| {
                let mime = mime.trim().to_ascii_lowercase();
                mime == "application/json" || mime.ends_with("+json")
            })
            .unwrap_or(false);
        if !json {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(request, state).await?;
        body::parse(&bytes).map(JsonFields)
    }
}

/// An optional JSON object body: an empty body is `None`; anything else must be what
/// [`JsonFields`] accepts.
pub struct OptionalJsonFields<T>(pub Option<T>);

impl<S: Send + Sync, T: body::Fields> FromRequest<S> for OptionalJsonFields<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state).await?;
        if bytes.is_empty() {
            return Ok(OptionalJsonFields(None));
        }
        let request = Request::from_parts(parts, axum::body::Body::from(bytes));
        let JsonFields(fields) = JsonFields::from_request(request, state).await?;
        Ok(OptionalJsonFields(Some(fields)))
    }
}

/// The `{id}` of a route, parsed into the id it names (`AccountId`, `TransferId`): `Some`
/// only for a valid id (see `valid_id`). Anything else (odd characters, `.` or `..`, too
/// long, not UTF-8 once percent-decoded) cannot name a resource, so handlers answer 404
/// without asking the store.
pub struct PathId<Id>(pub Option<Id>);

/// An id a route's path names.
pub trait PathIdKind: Sized {
    /// `text` as this id, if it is one.
    fn parse(text: String) -> Option<Self>;
}

impl PathIdKind for AccountId {
    fn parse(text: String) -> Option<Self> {
        AccountId::parse(text)
    }
}

impl PathIdKind for TransferId {
    fn parse(text: String) -> Option<Self> {
        TransferId::parse(text)
    }
}

impl<S: Send + Sync, Id: PathIdKind> FromRequestParts<S> for PathId<Id> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) => Ok(PathId(Id::parse(id))),
            // A client's path that does not decode to a string (e.g. `%FF`): no id is that.
            Err(PathRejection::FailedToDeserializePathParams(e))
                if e.status().is_client_error() =>
            {
                Ok(PathId(None))
            }
            // A route without exactly one parameter: a fault of ours.
            Err(other) => Err(ApiError::Internal(other.body_text())),
        }
    }
}

/// The query parameters a route takes, for [`QueryParams`]: anything else is refused.
pub trait QuerySpec {
    /// The names it takes, exactly (case-sensitive).
    const NAMES: &'static [&'static str];
    /// Families of names it takes: `metadata.` takes every `metadata.<key>` (the handler
    /// checks the key).
    const PREFIXES: &'static [&'static str] = &[];
    /// Names it takes any number of times (`metadata=a:1&metadata=b:2`, an array in the
    /// OpenAPI document); each must also be in [`QuerySpec::NAMES`].
    const REPEATABLE: &'static [&'static str] = &[];
    /// A query it accepts, for messages (`?wait=5s`).
    const EXAMPLE: &'static str = "";
}

/// A route that takes no query parameter.
pub struct NoQuery;

impl QuerySpec for NoQuery {
    const NAMES: &'static [&'static str] = &[];
}

/// The query string as name → value, holding only the parameters the route takes (`S`): an
/// unknown name (`WAIT` is not `wait`) or one given twice is a 422 naming it, so that a typo
/// is never silently ignored (it would turn a long-poll off, or a filter). The names a route
/// takes repeatedly ([`QuerySpec::REPEATABLE`]) are kept apart, every value in order. Every
/// route's handler takes this extractor, also the routes that take no parameter
/// (`NoQuery`). Percent-decoding never fails: bytes that are not UTF-8 become U+FFFD, which
/// no parameter accepts.
pub struct QueryParams<S: QuerySpec = NoQuery>(
    pub HashMap<String, String>,
    pub Vec<(String, String)>,
    PhantomData<S>,
);

impl<S: Send + Sync, Q: QuerySpec> FromRequestParts<S> for QueryParams<Q> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state).await?;
        let mut params = HashMap::with_capacity(pairs.len());
        let mut repeated = Vec::new();
        for (name, value) in pairs {
            let known = Q::NAMES.contains(&name.as_str())
                || Q::PREFIXES.iter().any(|prefix| name.starts_with(prefix));
            if !known {
                return Err(ApiError::Invalid(unknown_parameter::<Q>(&name, parts)));
            }
            if Q::REPEATABLE.contains(&name.as_str()) {
                repeated.push((name, value));
                continue;
            }
            if params.contains_key(&name) {
                return Err(ApiError::Invalid(format!(
                    "query parameter `{}` is given more than once; give it once",
                    shorten(&name)
                )));
            }
            params.insert(name, value);
        }
        Ok(QueryParams(params, repeated, PhantomData))
    }
}

/// "unknown parameter `WAIT` (did you mean `wait`?): GET /transfers/{id} takes `wait`, such
/// as `?wait=5s`", or "… takes no query parameters".
fn unknown_parameter<Q: QuerySpec>(name: &str, parts: &Parts) -> String {
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map_or("this route", |path| path.as_str());
    let name = shorten(name);
    if Q::NAMES.is_empty() && Q::PREFIXES.is_empty() {
        return format!(
            "unknown parameter `{name}`: {} {route} takes no query parameters",
            parts.method
        );
    }
    let meant = body::did_you_mean(&name, Q::NAMES)
        .map(|meant| format!(" (did you mean `{meant}`?)"))
        .unwrap_or_default();
    let taken: Vec<String> = Q::NAMES
        .iter()
        .map(|n| format!("`{n}`"))
        .chain(Q::PREFIXES.iter().map(|p| format!("`{p}<key>`")))
        .collect();
    format!(
        "unknown parameter `{name}`{meant}: {} {route} takes {}, such as `{}`",
        parts.method,
        taken.join(", "),
        Q::EXAMPLE
    )
}

/// At most 64 characters of a client's text, for an error detail.
/// A page size parameter: `1..=max`, else 422.
pub(crate) fn parse_limit(value: &str, max: usize) -> Result<usize, error::ApiError> {
    value
        .parse()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| error::ApiError::Invalid(format!("`limit` must be 1–{max}")))
}

pub(crate) fn shorten(text: &str) -> String {
    const MAX: usize = 64;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Field validators with clear 422 messages, over the typed fields of [`body`] (absent or
/// null: `None`).
pub(crate) mod field {
    use super::body::{Fields, Integer, MetadataField, Text};
    use super::ApiError;
    use crate::transfer::validated::{
        AccountId, Currency, PositiveAmount, TransferId, MAX_CURRENCY_LEN, MAX_ID_LEN,
    };

    /// 422 if the body gave a field its type does not have (naming it, and the field it
    /// most likely misspells), or one field twice.
    pub fn known_and_once<T: Fields>(fields: &T) -> Result<(), ApiError> {
        if let Some(name) = fields.unknown() {
            return Err(ApiError::Invalid(unknown_field(name, T::KIND, T::NAMES)));
        }
        match fields.twice() {
            Some(name) => Err(ApiError::Invalid(format!(
                "`{name}` is given more than once"
            ))),
            None => Ok(()),
        }
    }

    /// "`amt` is not a field of a capture; did you mean `amount`?", or with no close one the
    /// fields there are. Names are case-sensitive: `Hold` is not `hold`.
    pub fn unknown_field(name: &str, kind: &str, names: &[&'static str]) -> String {
        let name = super::shorten(name);
        match super::body::did_you_mean(&name, names) {
            Some(meant) => format!("`{name}` is not a field of {kind}; did you mean `{meant}`?"),
            None => format!(
                "`{name}` is not a field of {kind}; its fields are {}",
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// The 422 of a body field or query parameter `name` that is not an id (`valid_id`).
    pub fn invalid_id(name: &str) -> ApiError {
        ApiError::Invalid(format!(
            "`{name}` must be 1–{MAX_ID_LEN} characters of A-Z a-z 0-9 . _ : -, and not `.` or `..`"
        ))
    }

    /// An id (`valid_id`) of type `T`, parsed by `parse`; absent or null: none.
    fn id<T>(
        value: Option<Text>,
        name: &str,
        parse: fn(String) -> Option<T>,
    ) -> Result<Option<T>, ApiError> {
        let invalid = || invalid_id(name);
        match value {
            None => Ok(None),
            Some(Text::Given(s)) => parse(s).map(Some).ok_or_else(invalid),
            Some(Text::Other) => Err(invalid()),
        }
    }

    /// A transfer id; absent or null: none.
    pub fn transfer_id(value: Option<Text>, name: &str) -> Result<Option<TransferId>, ApiError> {
        id(value, name, TransferId::parse)
    }

    /// An account id, required.
    pub fn account_id(value: Option<Text>, name: &str) -> Result<AccountId, ApiError> {
        id(value, name, AccountId::parse)?
            .ok_or_else(|| ApiError::Invalid(format!("`{name}` is required")))
    }

    /// A signed 64-bit integer; not a float, a string or out of range.
    pub fn integer(value: Option<Integer>, name: &str) -> Result<Option<i64>, ApiError> {
        match value {
            None => Ok(None),
            Some(Integer::Given(n)) => Ok(Some(n)),
            Some(Integer::OtherNumber) => Err(ApiError::Invalid(format!(
                "`{name}` must be an integer between -2^63 and 2^63-1"
            ))),
            Some(Integer::Other) => Err(ApiError::Invalid(format!("`{name}` must be an integer"))),
        }
    }

    pub fn required_integer(value: Option<Integer>, name: &str) -> Result<i64, ApiError> {
        integer(value, name)?.ok_or_else(|| ApiError::Invalid(format!("`{name}` is required")))
    }

    /// Units to move: a whole number from 1 to 2^63-1; absent or null: none.
    pub fn amount(value: Option<Integer>, name: &str) -> Result<Option<PositiveAmount>, ApiError> {
        let not_an_integer = |received: &str| {
            ApiError::Invalid(format!(
                "`{name}` must be an integer from 1 to 2^63-1, such as 100 (received {received})"
            ))
        };
        match value {
            None => Ok(None),
            Some(Integer::Given(n)) => PositiveAmount::new(n).map(Some).ok_or_else(|| {
                ApiError::Invalid(format!(
                    "`{name}` must be positive: a whole number of units from 1 to 2^63-1, such \
                     as 100 (received {n})"
                ))
            }),
            Some(Integer::OtherNumber) => Err(not_an_integer(
                "a fraction, an exponent or a number beyond 2^63-1",
            )),
            Some(Integer::Other) => Err(not_an_integer("something that is not a number")),
        }
    }

    pub fn required_amount(value: Option<Integer>, name: &str) -> Result<PositiveAmount, ApiError> {
        amount(value, name)?.ok_or_else(|| ApiError::Invalid(format!("`{name}` is required")))
    }

    /// A metadata object (`valid_metadata`): string values by key; absent or null: none.
    pub fn metadata(
        value: Option<MetadataField>,
        name: &str,
    ) -> Result<crate::transfer::model::Metadata, ApiError> {
        let labels = match value {
            None => return Ok(Default::default()),
            Some(MetadataField::Given(labels)) => labels,
            Some(MetadataField::Other) => {
                return Err(ApiError::Invalid(format!(
                    "`{name}` must be an object of string values"
                )))
            }
        };
        let mut strings = Vec::with_capacity(labels.len());
        for (key, value) in labels {
            match value {
                Text::Given(s) => strings.push((key, s)),
                Text::Other => {
                    return Err(ApiError::Invalid(format!(
                        "`{name}` values must be strings (`{}` is not)",
                        super::shorten(&key)
                    )))
                }
            }
        }
        crate::transfer::model::Metadata::parse(strings).map_err(ApiError::Invalid)
    }

    /// A currency code (`valid_currency`); absent or null: none.
    pub fn currency(value: Option<Text>, name: &str) -> Result<Option<Currency>, ApiError> {
        let invalid = || {
            ApiError::Invalid(format!(
                "`{name}` must be 1–{MAX_CURRENCY_LEN} characters of A-Z 0-9 _ (such as USD)"
            ))
        };
        match value {
            None => Ok(None),
            Some(Text::Given(s)) => Currency::parse(s).map(Some).ok_or_else(invalid),
            Some(Text::Other) => Err(invalid()),
        }
    }
}
