//! Authentication of API requests by bearer key (the keys and their file: [`crate::auth`]).
//!
//! With `API_KEYS_FILE` set, every request under `/accounts`, `/transfers` and `/events`
//! (and `/metrics` with `METRICS_REQUIRE_AUTH`) needs `Authorization: Bearer <key>`:
//! - no key, another scheme, or a key the service does not know: `401` with
//!   `WWW-Authenticate: Bearer` (RFC 6750 §3; `error="invalid_token"` for an unknown key);
//! - a known key without the scope: `403` with `error="insufficient_scope"`. `GET` and
//!   `HEAD` need `read`, every other method `write`.
//!
//! The probes (`/livez`, `/healthz`, `/readyz`), `/metrics` (unless required) and the OpenAPI
//! document and its UI stay open. Without `API_KEYS_FILE` everything is open.
//!
//! The outcome names the request's client: the key's name, [`ANONYMOUS`] or
//! [`UNAUTHENTICATED`]. It is recorded on the request span (`client`) and handed to the
//! metrics layer as a response extension ([`Client`]) for `http_requests_total{client}`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::auth::{ApiKeys, Scope, ANONYMOUS, UNAUTHENTICATED};

/// The first path segments that need a key when keys are configured. `/events` is listed
/// ahead of the routes that will serve it, so they are protected from their first day.
pub const PROTECTED_PREFIXES: [&str; 3] = ["/accounts", "/transfers", "/events"];

/// The `realm` of every challenge.
pub const REALM: &str = "transfer-service";

/// Who made a request, as the `client` label says it: a response extension set by
/// [`authenticate`] and read by the metrics layer.
#[derive(Debug, Clone)]
pub struct Client(pub Arc<str>);

/// The authentication the router applies.
pub struct Auth {
    /// `None`: the service runs open.
    keys: Option<Arc<ApiKeys>>,
    metrics_require_auth: bool,
}

impl Auth {
    /// No keys: every route open.
    pub fn open() -> Auth {
        Auth {
            keys: None,
            metrics_require_auth: false,
        }
    }

    /// Keys required on the API (and on `/metrics` if `metrics_require_auth`).
    pub fn with_keys(keys: Arc<ApiKeys>, metrics_require_auth: bool) -> Auth {
        Auth {
            keys: Some(keys),
            metrics_require_auth,
        }
    }

    /// The keys, when configured (the app's watcher reloads them).
    pub fn keys(&self) -> Option<&Arc<ApiKeys>> {
        self.keys.as_ref()
    }

    /// The scope `method` on `path` needs, or `None` when the path is open.
    pub fn required_scope(&self, method: &Method, path: &str) -> Option<Scope> {
        required_scope(method, path, self.metrics_require_auth)
    }

    /// The request's client, or the refusal to answer with.
    fn check(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<Arc<str>, ApiError> {
        let (Some(keys), Some(scope)) = (&self.keys, self.required_scope(method, path)) else {
            return Ok(Arc::from(ANONYMOUS));
        };
        let Some(presented) = bearer_token(headers) else {
            return Err(ApiError::Unauthorized {
                detail: "this route needs an API key: send `Authorization: Bearer <key>`".into(),
                challenge: format!("Bearer realm=\"{REALM}\""),
            });
        };
        let keys = keys.current();
        let Some(key) = keys.find(presented.as_bytes()) else {
            return Err(ApiError::Unauthorized {
                detail: "the API key is not one this service knows (mistyped, or revoked)".into(),
                challenge: format!(
                    "Bearer realm=\"{REALM}\", error=\"invalid_token\", \
                     error_description=\"unknown API key\""
                ),
            });
        };
        if !key.allows(scope) {
            return Err(ApiError::Forbidden {
                detail: format!(
                    "the API key of `{}` lacks the `{scope}` scope, which {method} needs",
                    key.name()
                ),
                challenge: format!(
                    "Bearer realm=\"{REALM}\", error=\"insufficient_scope\", scope=\"{scope}\""
                ),
                client: key.name().clone(),
            });
        }
        Ok(key.name().clone())
    }
}

/// The scope `method` on `path` (a path or a route template) needs when the service has keys,
/// or `None` when the path is open. The OpenAPI document declares its security from this too.
pub fn required_scope(method: &Method, path: &str, metrics_require_auth: bool) -> Option<Scope> {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    let protected = PROTECTED_PREFIXES.iter().any(|prefix| under(prefix))
        || (metrics_require_auth && under("/metrics"));
    protected.then(|| scope_of(method))
}

/// `GET` and `HEAD` read; every other method writes.
fn scope_of(method: &Method) -> Scope {
    if method == Method::GET || method == Method::HEAD {
        Scope::Read
    } else {
        Scope::Write
    }
}

/// The token of the one `Authorization: Bearer <token>` header (scheme case-insensitive,
/// RFC 9110 §11.1), or `None`: no header, two of them, another scheme, an empty token.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let (scheme, token) = value.to_str().ok()?.split_once(' ')?;
    let token = token.trim_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The middleware: records the client on the request span and answers 401/403 for a
/// protected route without a key that allows the request.
pub async fn authenticate(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let outcome = auth.check(request.method(), request.uri().path(), request.headers());
    let (client, mut response) = match outcome {
        Ok(client) => {
            tracing::Span::current().record("client", &*client);
            (client, next.run(request).await)
        }
        Err(refusal) => {
            let client = match &refusal {
                ApiError::Forbidden { client, .. } => client.clone(),
                _ => Arc::from(UNAUTHENTICATED),
            };
            tracing::Span::current().record("client", &*client);
            (client, refusal.into_response())
        }
    };
    response.extensions_mut().insert(Client(client));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn only_one_bearer_header_with_a_token_is_read() {
        assert_eq!(bearer_token(&headers(&["Bearer abc"])), Some("abc"));
        assert_eq!(bearer_token(&headers(&["bearer  abc "])), Some("abc"));
        assert_eq!(bearer_token(&headers(&["BEARER abc"])), Some("abc"));
        for refused in [
            &["Basic YTpi"][..],
            &["Bearer"],
            &["Bearer "],
            &["Bearerabc"],
            &["Bearer a", "Bearer a"],
        ] {
            assert_eq!(bearer_token(&headers(refused)), None, "{refused:?}");
        }
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn the_api_is_protected_by_path_and_the_rest_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, "").unwrap();
        let keys = Arc::new(ApiKeys::load(&path, crate::metrics::Metrics::new()).unwrap());
        let auth = Auth::with_keys(keys.clone(), false);
        for (method, path, scope) in [
            (Method::GET, "/accounts", Some(Scope::Read)),
            (Method::HEAD, "/accounts/a", Some(Scope::Read)),
            (Method::POST, "/accounts", Some(Scope::Write)),
            (Method::GET, "/transfers/batch", Some(Scope::Read)),
            (Method::POST, "/transfers/t/cancel", Some(Scope::Write)),
            (Method::DELETE, "/transfers/t", Some(Scope::Write)),
            (Method::GET, "/events", Some(Scope::Read)),
            (Method::GET, "/accounts/", Some(Scope::Read)),
            (Method::GET, "/accountsx", None),
            (Method::GET, "/metrics", None),
            (Method::GET, "/livez", None),
            (Method::GET, "/healthz", None),
            (Method::GET, "/readyz", None),
            (Method::GET, "/openapi.json", None),
            (Method::GET, "/docs/", None),
        ] {
            assert_eq!(auth.required_scope(&method, path), scope, "{method} {path}");
        }
        let strict = Auth::with_keys(keys, true);
        assert_eq!(
            strict.required_scope(&Method::GET, "/metrics"),
            Some(Scope::Read)
        );
        assert_eq!(strict.required_scope(&Method::GET, "/readyz"), None);
    }
}
