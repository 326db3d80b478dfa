//! The backend's connection to the cluster, which every part of it borrows (the store, its
//! migrations, the vouch, shard growth): the HTTP client to one base URL, the index names
//! under `INDEX_PREFIX`, the engine that answers (`GET /`, `engine.rs`, where the answers are
//! read), and whether this instance has migrated, which decides what a missing index means
//! ("A missing index" in the module docs of `elasticsearch.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use elasticsearch::auth::Credentials;
use elasticsearch::http::headers::{HeaderName, HeaderValue, ACCEPT_ENCODING};
use elasticsearch::http::transport::{SingleNodeConnectionPool, TransportBuilder};
use elasticsearch::indices::{IndicesExistsParts, IndicesGetParts, IndicesRefreshParts};
use elasticsearch::Elasticsearch;
use serde_json::Value;
use url::Url;

use super::reply::{self, Reply};
use super::{EsConfig, EsSecurity, SearchEngine};
use crate::store::{Index, StoreError, StoreResult};
use crate::trace_context;

/// An Elasticsearch request builder with the current span's `traceparent` when traces are
/// exported (`crate::trace_context`): the engine's own tracing, or a proxy between, can join
/// the operation's trace. The builder unchanged otherwise. Used on the requests a transfer
/// makes (reads, searches, bulks, refreshes); a `_bulk` of several transfers carries the
/// first traced one's (`crate::store::coalescer`).
macro_rules! traced {
    ($request:expr) => {{
        let request = $request;
        match $crate::store::elasticsearch::connection::trace_header() {
            Some((name, value)) => request.header(name, value),
            None => request,
        }
    }};
}
pub(super) use traced;

/// The `traceparent` header of the current span, if it is traced.
pub(super) fn trace_header() -> Option<(HeaderName, HeaderValue)> {
    let traceparent = trace_context::current_traceparent()?;
    let value = HeaderValue::from_str(&traceparent).ok()?;
    Some((HeaderName::from_static(trace_context::TRACEPARENT), value))
}

/// The client and what this instance knows of the cluster behind it.
pub(super) struct Connection {
    pub(super) client: Elasticsearch,
    pub(super) index_prefix: String,
    /// Elasticsearch or OpenSearch, read from `GET /` before the migrations
    /// (`elasticsearch/engine.rs`); unset until the engine has answered.
    pub(super) engine: OnceLock<SearchEngine>,
    /// Set once this instance has applied (or found applied) every migration; from then on a
    /// missing index is an error, not an empty store (see the module docs of
    /// `elasticsearch.rs`).
    migrated: AtomicBool,
}

impl Connection {
    /// Builds the client; sends nothing. Fails only on a malformed URL or prefix, or
    /// credentials and a CA that cannot be used (`elasticsearch/security.rs`).
    pub(super) fn open(config: &EsConfig, security: EsSecurity) -> StoreResult<Connection> {
        validate_prefix(&config.index_prefix)?;
        let mut url = Url::parse(&config.url).map_err(|e| {
            StoreError::Permanent(format!("ELASTICSEARCH_URL is not a valid URL: {e}"))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(StoreError::Permanent(format!(
                "ELASTICSEARCH_URL must be http or https, not {}",
                url.scheme()
            )));
        }
        // Credentials in the URL become basic auth; the URL kept by the client has none, so
        // they never show up in error messages.
        let credentials = (!url.username().is_empty()).then(|| {
            Credentials::Basic(
                url.username().to_owned(),
                url.password().unwrap_or("").to_owned(),
            )
        });
        let _ = url.set_username("");
        let _ = url.set_password(None);

        // No proxy: HTTP(S)_PROXY set for other traffic must not reroute the store (and a
        // proxy's own errors would be mistaken for the cluster's). Answers uncompressed: see
        // "Answers" in the module docs of `elasticsearch.rs`.
        let mut builder = TransportBuilder::new(SingleNodeConnectionPool::new(url))
            .disable_proxy()
            .header(ACCEPT_ENCODING, HeaderValue::from_static("identity"))
            .timeout(config.request_timeout);
        builder = security.apply(builder, credentials)?;
        let transport = builder.build().map_err(|e| {
            StoreError::Permanent(format!("cannot build the Elasticsearch client: {e}"))
        })?;
        Ok(Connection {
            client: Elasticsearch::new(transport),
            index_prefix: config.index_prefix.clone(),
            engine: OnceLock::new(),
            migrated: AtomicBool::new(false),
        })
    }

    /// The physical name of `index`: `INDEX_PREFIX` + its logical name.
    pub(super) fn index_name(&self, index: Index) -> String {
        self.physical_name(index.name())
    }

    pub(super) fn physical_name(&self, logical: &str) -> String {
        format!("{}{}", self.index_prefix, logical)
    }

    /// Whether this instance has applied (or verified) every migration.
    pub(super) fn is_migrated(&self) -> bool {
        self.migrated.load(Ordering::Acquire)
    }

    /// From now on, a missing index is an error.
    pub(super) fn mark_migrated(&self) {
        self.migrated.store(true, Ordering::Release);
    }

    /// What a 404 `index_not_found_exception` means; see "A missing index" in the module docs
    /// of `elasticsearch.rs`.
    pub(super) async fn missing_index(&self, op: &str, reply: Reply) -> StoreResult<()> {
        // A request that reached the old index as `transfer-service shards` moved its name
        // onto the copy: the name is there again (an alias), so ask again.
        let name = reply.body.pointer("/error/index").and_then(Value::as_str);
        if let Some(name) = name.filter(|_| self.is_migrated()) {
            if self.index_exists(name).await.unwrap_or(false) {
                return Err(StoreError::Unavailable(format!(
                    "{op}: {name} was gone a moment (its name moved onto a copy of more shards)"
                )));
            }
        }
        if self.is_migrated() {
            Err(StoreError::Permanent(format!(
                "{op}: {} although migrations were applied (deleted index, or wrong INDEX_PREFIX?)",
                reply::describe(&reply.body)
            )))
        } else {
            Ok(())
        }
    }

    /// `HEAD /{index}`.
    pub(super) async fn index_exists(&self, index: &str) -> StoreResult<bool> {
        let sent = self
            .client
            .indices()
            .exists(IndicesExistsParts::Index(&[index]))
            .send()
            .await
            .map_err(|e| reply::transport_error(&format!("HEAD {index}"), &e))?;
        match sent.status_code().as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            status if reply::is_denial(status) => Err(self.head_denied(index, status).await),
            429 | 502 | 503 | 504 => Err(StoreError::Unavailable(format!(
                "HEAD {index}: status {}",
                sent.status_code()
            ))),
            status => Err(StoreError::Permanent(format!(
                "HEAD {index}: status {status}"
            ))),
        }
    }

    /// `POST /{indices}/_refresh`, its answer read: whether a refusal, a missing index or
    /// a shard that failed to refresh matters is the caller's to say.
    pub(super) async fn refresh(&self, op: &str, indices: &[&str]) -> StoreResult<Reply> {
        let sent = self
            .client
            .indices()
            .refresh(IndicesRefreshParts::Index(indices))
            .send()
            .await;
        self.read(op, sent).await
    }

    /// A refused `HEAD /{index}` has no body to say why; for a 403, `GET /{index}` (the same
    /// action, `indices:admin/get`) gets Elasticsearch's reason, which names the privilege.
    async fn head_denied(&self, index: &str, status: u16) -> StoreError {
        let op = format!("HEAD {index}");
        if status == 403 {
            let sent = self
                .client
                .indices()
                .get(IndicesGetParts::Index(&[index]))
                .send()
                .await;
            if let Err(denied @ StoreError::Denied { .. }) = self.read(&op, sent).await {
                return denied;
            }
        }
        super::security::denied(&op, status, &Value::Null)
    }
}

/// Elasticsearch index names are lower case, without `\ / * ? " < > | , #` or spaces, and do
/// not start with `-`, `_` or `+`. Checking the prefix here turns a typo into a start-up
/// error instead of a 400 on every request.
fn validate_prefix(prefix: &str) -> StoreResult<()> {
    let bad_char = prefix
        .chars()
        .find(|c| c.is_uppercase() || c.is_whitespace() || r#"\/*?"<>|,#:"#.contains(*c));
    if let Some(c) = bad_char {
        return Err(StoreError::Permanent(format!(
            "INDEX_PREFIX {prefix:?} contains {c:?}, not allowed in an index name"
        )));
    }
    if prefix.starts_with(['-', '_', '+']) {
        return Err(StoreError::Permanent(format!(
            "INDEX_PREFIX {prefix:?} must not start with '-', '_' or '+'"
        )));
    }
    Ok(())
}
