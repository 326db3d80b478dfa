//! The HTTP API (DESIGN §5). Each resource module exposes `router()`; [`router`] merges them
//! and adds the layers every request passes: request id, tracing span, metrics, timeout, body
//! limit, and a problem+json 404 for unknown routes.

pub mod accounts;
pub mod error;
pub mod health;
pub mod openapi;
pub mod transfers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Request, State};
use axum::http::{header, HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use serde_json::{Map, Value};
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::metrics::Metrics;
use crate::transfer::Engine;
pub use error::{ApiError, Problem};

/// Bodies larger than this are refused with 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Long-polls (`?wait=`) are capped here, below the request timeout.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    pub metrics: Arc<Metrics>,
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(accounts::router())
        .merge(transfers::router())
        .merge(health::router())
        .merge(openapi::router())
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            MAX_WAIT + Duration::from_secs(15),
        ))
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
                    tracing::info_span!(
                        "request",
                        method = %request.method(),
                        route = route.as_deref().unwrap_or("unmatched"),
                        request_id,
                    )
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

/// Counts and times every request by method, route template and status. Logging is the
/// trace layer's (`log_response`), so each request is logged once.
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
    state
        .metrics
        .http_requests_total
        .with_label_values(&[&method, &route, status.as_str()])
        .inc();
    state
        .metrics
        .http_request_duration_seconds
        .with_label_values(&[&method, &route])
        .observe(started.elapsed().as_secs_f64());
    response
}

/// One line per response, in the request span (method, route, request id): INFO with the
/// status and latency, or ERROR for a 5xx, so every 5xx yields exactly one error line. A
/// `500 application/problem+json` is `ApiError::Internal`, which has already logged its
/// detail at ERROR inside the span: its response line stays at INFO.
fn log_response(response: &Response, latency: Duration, _span: &tracing::Span) {
    let status = response.status();
    let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    let logged_by_handler = status == StatusCode::INTERNAL_SERVER_ERROR
        && response
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
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

/// A JSON object body: 415 unless `Content-Type` is JSON, 413 over the limit, 400 unless the
/// body parses, 422 unless it is an object. Handlers then validate each field (422).
pub struct JsonObject(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for JsonObject {
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
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::Malformed(format!("body is not valid JSON: {e}")))?;
        match value {
            Value::Object(map) => Ok(JsonObject(map)),
            _ => Err(ApiError::Invalid("body must be a JSON object".into())),
        }
    }
}

/// Field readers with clear 422 messages.
pub(crate) mod field {
    use super::ApiError;
    use crate::transfer::model::valid_id;
    use serde_json::{Map, Value};

    pub fn id(body: &Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
        match body.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if valid_id(s) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::Invalid(format!(
                "`{name}` must be 1–128 characters of A-Z a-z 0-9 . _ : -"
            ))),
        }
    }

    pub fn required_id(body: &Map<String, Value>, name: &str) -> Result<String, ApiError> {
        id(body, name)?.ok_or_else(|| ApiError::Invalid(format!("`{name}` is required")))
    }

    /// A signed 64-bit integer; not a float, a string or out of range.
    pub fn integer(body: &Map<String, Value>, name: &str) -> Result<Option<i64>, ApiError> {
        match body.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n.as_i64().map(Some).ok_or_else(|| {
                ApiError::Invalid(format!(
                    "`{name}` must be an integer between -2^63 and 2^63-1"
                ))
            }),
            Some(_) => Err(ApiError::Invalid(format!("`{name}` must be an integer"))),
        }
    }

    pub fn required_integer(body: &Map<String, Value>, name: &str) -> Result<i64, ApiError> {
        integer(body, name)?.ok_or_else(|| ApiError::Invalid(format!("`{name}` is required")))
    }
}
