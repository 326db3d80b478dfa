//! The one error type of the API, answered as RFC 9457 `application/problem+json`.

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::store::StoreError;
use crate::transfer::admission::Overloaded;
use crate::transfer::operations::ServiceError;

/// An RFC 9457 problem document.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// A URI reference naming the kind of problem (`/problems/<kind>`).
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
}

/// The problem answers several operations document alike, for their `responses(...)` (each
/// an RFC 9457 [`Problem`]).
pub mod responses {
    use super::Problem;

    /// 503: the store did not answer.
    #[derive(utoipa::IntoResponses)]
    #[response(
        status = 503,
        description = "Store unavailable",
        content_type = "application/problem+json"
    )]
    pub struct StoreUnavailable(pub Problem);

    /// 404: no transfer with the path's id.
    #[derive(utoipa::IntoResponses)]
    #[response(
        status = 404,
        description = "No such transfer",
        content_type = "application/problem+json"
    )]
    pub struct NoSuchTransfer(pub Problem);

    /// 404: no account with the path's id.
    #[derive(utoipa::IntoResponses)]
    #[response(
        status = 404,
        description = "No such account",
        content_type = "application/problem+json"
    )]
    pub struct NoSuchAccount(pub Problem);

    /// 400: a body that does not parse as JSON.
    #[derive(utoipa::IntoResponses)]
    #[response(
        status = 400,
        description = "Malformed JSON",
        content_type = "application/problem+json"
    )]
    pub struct MalformedJson(pub Problem);

    /// What a JSON body refused before its fields are read answers: malformed, too large, or
    /// not JSON.
    #[derive(utoipa::IntoResponses)]
    pub enum JsonBodyRefused {
        #[response(
            status = 400,
            description = "Malformed JSON",
            content_type = "application/problem+json"
        )]
        Malformed(Problem),
        #[response(
            status = 413,
            description = "Body too large",
            content_type = "application/problem+json"
        )]
        TooLarge(Problem),
        #[response(
            status = 415,
            description = "Not JSON",
            content_type = "application/problem+json"
        )]
        NotJson(Problem),
    }
}

/// A response extension set by [`ApiError::into_response`] when it has already logged the
/// error at ERROR, with its detail, inside the request span. The response line of the trace
/// layer then stays at INFO, so every 5xx yields exactly one ERROR line whatever its body or
/// content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorLogged;

/// Every error answer of the API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the body is not JSON, or a query string cannot be parsed.
    #[error("{0}")]
    Malformed(String),
    /// 401 with `WWW-Authenticate` (`challenge`): no API key, or one the service does not
    /// know.
    #[error("{detail}")]
    Unauthorized { detail: String, challenge: String },
    /// 403 with `WWW-Authenticate` (`challenge`): the API key of `client` lacks the scope.
    #[error("{detail}")]
    Forbidden {
        detail: String,
        challenge: String,
        client: std::sync::Arc<str>,
    },
    /// 404: no such resource or route.
    #[error("{0}")]
    NotFound(String),
    /// 405: the route exists but not with this method.
    #[error("this route does not answer this method")]
    MethodNotAllowed,
    /// 409: the id exists with other data, or the transfer can no longer be cancelled.
    #[error("{0}")]
    Conflict(String),
    /// 413: the body is larger than the limit.
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    /// 415: the body is not `application/json`.
    #[error("expected Content-Type: application/json")]
    UnsupportedMediaType,
    /// 422: well-formed JSON with an invalid field.
    #[error("{0}")]
    Invalid(String),
    /// 503: the store is unreachable or overloaded; retry later. The store's error text is
    /// logged at WARN, never sent (it names hosts, indices and internals).
    #[error("{0}")]
    Unavailable(String),
    /// 503 with `Retry-After`: admission control refused the create (`MAX_IN_FLIGHT`
    /// transfers in flight); nothing was created.
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
    /// 503: the request did not complete within the request timeout; retry later.
    #[error("the request did not complete within {}", humantime::format_duration(*.0))]
    Timeout(std::time::Duration),
    /// 500: a fault of ours; the detail is logged at ERROR, never sent.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::Malformed(_) => (StatusCode::BAD_REQUEST, "malformed", "Malformed request"),
            ApiError::Unauthorized { .. } => {
                (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized")
            }
            ApiError::Forbidden { .. } => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            ApiError::TooLarge(_) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "too-large",
                "Request body too large",
            ),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
            ),
            ApiError::Invalid(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-field",
                "Invalid field",
            ),
            ApiError::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Store unavailable",
            ),
            ApiError::Overloaded(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "Too many transfers in flight",
            ),
            ApiError::Timeout(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "timeout",
                "Request timed out",
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
            ),
        }
    }

    pub fn problem(&self) -> Problem {
        let (status, kind, title) = self.parts();
        let detail = match self {
            // Never leak internals; the request span logs them.
            ApiError::Internal(_) => "an internal error occurred; it has been logged".into(),
            ApiError::Unavailable(_) => UNAVAILABLE_DETAIL.into(),
            other => other.to_string(),
        };
        Problem {
            kind: format!("/problems/{kind}"),
            title: title.into(),
            status: status.as_u16(),
            detail,
        }
    }
}

/// The detail of every store-unavailable answer: the client learns to retry, not the
/// store's error text.
pub const UNAVAILABLE_DETAIL: &str = "the store is unavailable; retry later";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Details kept from the client are logged once, inside the request span.
        let logged = match &self {
            ApiError::Internal(detail) => {
                // The marker keeps the response line at INFO: one ERROR line per 5xx.
                tracing::error!(%detail, "internal error");
                true
            }
            ApiError::Unavailable(detail) => {
                // A WARN of its own; the response line still reports the 503 at ERROR.
                tracing::warn!(store_error = %detail, "store unavailable");
                false
            }
            _ => false,
        };
        let problem = self.problem();
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (
            status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body,
        )
            .into_response();
        if logged {
            response.extensions_mut().insert(ErrorLogged);
        }
        match &self {
            ApiError::Overloaded(overloaded) => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, overloaded.retry_after.as_secs().into());
            }
            ApiError::Unauthorized { challenge, .. } | ApiError::Forbidden { challenge, .. } => {
                if let Ok(value) = header::HeaderValue::from_str(challenge) {
                    response
                        .headers_mut()
                        .insert(header::WWW_AUTHENTICATE, value);
                }
            }
            _ => {}
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(detail) => ApiError::Unavailable(detail),
            StoreError::Permanent(detail) => ApiError::Internal(detail),
            // Not the client's fault nor a bug of ours: the service cannot use its store until
            // an operator fixes its credentials (the log and /readyz say so).
            denied @ StoreError::Denied { .. } => ApiError::Unavailable(denied.to_string()),
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::Conflict(detail) => ApiError::Conflict(detail),
            ServiceError::NotFound => ApiError::NotFound("no such resource".into()),
            ServiceError::Invalid(detail) => ApiError::Invalid(detail),
            ServiceError::Overloaded(e) => ApiError::Overloaded(e),
            ServiceError::Store(e) => e.into(),
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge(super::MAX_BODY_BYTES)
        } else {
            ApiError::Malformed(rejection.body_text())
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::Invalid(rejection.body_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_outage_answers_a_generic_detail() {
        let store_text = "bulk: HTTP 503 no_shard_available_action_exception at es-3.internal:9200";
        let problem = ApiError::from(StoreError::Unavailable(store_text.into())).problem();
        assert_eq!(problem.status, 503);
        assert_eq!(problem.kind, "/problems/store-unavailable");
        assert_eq!(problem.detail, UNAVAILABLE_DETAIL);
        let body = serde_json::to_string(&problem).unwrap();
        assert!(!body.contains("es-3.internal"), "{body}");
        assert!(!body.contains("no_shard_available"), "{body}");
    }
}
