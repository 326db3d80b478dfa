//! Which search engine `ELASTICSEARCH_URL` points at, read once from `GET /` before any other
//! answer is read (`docs/elasticsearch.md` §13, "OpenSearch 2.x").
//!
//! | `GET /` answers                                                 | engine                 |
//! |-----------------------------------------------------------------|------------------------|
//! | header `X-elastic-product: Elasticsearch`, `version.number` ≥ 8 | Elasticsearch          |
//! | 403 with header `X-elastic-product: Elasticsearch`              | Elasticsearch, version `unknown` (the role lacks `monitor`) |
//! | `version.distribution: "opensearch"`, `version.number` ≥ 2.7    | OpenSearch             |
//! | anything else (an older version, another server, not JSON)      | refused, naming it     |
//!
//! What the two engines differ in, for this service: Elasticsearch marks every answer with its
//! product header, which the store checks on each reply (so that a 404 from some other HTTP
//! server never reads as "document absent"); OpenSearch has no such header, so there the check
//! is this one at the start. And the metadata field's type: `flattened` on Elasticsearch,
//! `flat_object` on OpenSearch ([`SearchEngine::mapping_type`]). The protocol's requests
//! (`_create`, `if_seq_no`/`if_primary_term`, `_bulk`, `search_after`, refresh) and the
//! answers the store reads are the same on both.

use serde_json::Value;

use super::connection::Connection;
use super::{reply, security};
use crate::store::{StoreError, StoreResult};

/// The engine behind `ELASTICSEARCH_URL`, with its version (`8.19.21`, `2.19.6`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchEngine {
    Elasticsearch(String),
    OpenSearch(String),
}

/// The version of an Elasticsearch whose `GET /` the service's role may not read (it needs
/// the `monitor` cluster privilege, which nothing else does): its answers carry the product
/// header, so it is Elasticsearch, of a version not checked.
pub const UNREAD_VERSION: &str = "unknown";

/// The oldest versions supported, `(major, minor)`: Elasticsearch 8 (the protocol's requests
/// and answers as `docs/elasticsearch.md` describes them), OpenSearch 2.7 (the first with
/// `flat_object`, which the metadata field needs).
const ELASTICSEARCH_OLDEST: (u64, u64) = (8, 0);
const OPENSEARCH_OLDEST: (u64, u64) = (2, 7);

impl SearchEngine {
    /// The engine that answered `GET /` with `body` and, if present, the product header
    /// `product`; an error names what was found and what is supported.
    pub fn from_root(product: Option<&str>, body: &Value) -> Result<Self, String> {
        let version = body.pointer("/version/number").and_then(Value::as_str);
        let distribution = body
            .pointer("/version/distribution")
            .and_then(Value::as_str);
        let major_minor = version.and_then(|v| {
            let mut parts = v.split('.').map(|part| part.parse::<u64>().ok());
            Some((parts.next()??, parts.next()??))
        });
        let found = match (product, distribution, version) {
            (Some(product), _, Some(version)) => format!("{product} {version}"),
            (None, Some(distribution), Some(version)) => format!("{distribution} {version}"),
            (None, None, Some(version)) => {
                format!("a server of version {version} that names no product")
            }
            _ => "an answer to GET / without a version".to_owned(),
        };
        let version_text = version.unwrap_or_default().to_owned();
        let engine = match (product, distribution, major_minor) {
            (Some("Elasticsearch"), _, Some(v)) if v >= ELASTICSEARCH_OLDEST => {
                Some(SearchEngine::Elasticsearch(version_text))
            }
            (None, Some("opensearch"), Some(v)) if v >= OPENSEARCH_OLDEST => {
                Some(SearchEngine::OpenSearch(version_text))
            }
            _ => None,
        };
        engine.ok_or_else(|| {
            format!(
                "ELASTICSEARCH_URL points at {found}; supported: Elasticsearch {}.x or later, \
                 OpenSearch {}.{} or later",
                ELASTICSEARCH_OLDEST.0, OPENSEARCH_OLDEST.0, OPENSEARCH_OLDEST.1
            )
        })
    }

    /// `elasticsearch` or `opensearch`, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            SearchEngine::Elasticsearch(_) => "elasticsearch",
            SearchEngine::OpenSearch(_) => "opensearch",
        }
    }

    pub fn version(&self) -> &str {
        match self {
            SearchEngine::Elasticsearch(version) | SearchEngine::OpenSearch(version) => version,
        }
    }

    /// Whether every answer carries `X-elastic-product: Elasticsearch` (checked on each).
    pub fn marks_its_answers(&self) -> bool {
        matches!(self, SearchEngine::Elasticsearch(_))
    }

    /// A field type of the migrations (written for Elasticsearch) as this engine names it.
    pub fn mapping_type<'t>(&self, elasticsearch_type: &'t str) -> &'t str {
        match (self, elasticsearch_type) {
            (SearchEngine::OpenSearch(_), "flattened") => "flat_object",
            _ => elasticsearch_type,
        }
    }

    /// A mapping body written for Elasticsearch, with every `"type"` as this engine names it.
    pub fn mapping(&self, body: &Value) -> Value {
        match body {
            Value::Object(fields) => fields
                .iter()
                .map(|(key, value)| match (key.as_str(), value) {
                    ("type", Value::String(t)) => (key.clone(), Value::from(self.mapping_type(t))),
                    _ => (key.clone(), self.mapping(value)),
                })
                .collect(),
            Value::Array(items) => items.iter().map(|item| self.mapping(item)).collect(),
            other => other.clone(),
        }
    }
}

impl std::fmt::Display for SearchEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SearchEngine::Elasticsearch(v) if v == UNREAD_VERSION => {
                write!(f, "Elasticsearch (its version needs the monitor privilege)")
            }
            SearchEngine::Elasticsearch(v) => write!(f, "Elasticsearch {v}"),
            SearchEngine::OpenSearch(v) => write!(f, "OpenSearch {v}"),
        }
    }
}

impl Connection {
    /// The engine behind `ELASTICSEARCH_URL` (`GET /`, once; `elasticsearch/engine.rs`): an
    /// engine or version the service does not support is a `Permanent` error naming it.
    pub(super) async fn detect_engine(&self) -> StoreResult<&SearchEngine> {
        if let Some(engine) = self.engine.get() {
            return Ok(engine);
        }
        let op = "GET /";
        let sent = self.client.info().send().await;
        let (product, reply) = reply::read_unmarked(op, sent).await?;
        let engine = if reply.status == 403 && product.as_deref() == Some("Elasticsearch") {
            // A role without the `monitor` cluster privilege may not read `GET /` (the minimal
            // role of docs/configuration.md does not need it): Elasticsearch says who it is
            // by its header, and the version stays unread.
            SearchEngine::Elasticsearch(UNREAD_VERSION.to_owned())
        } else if reply::is_denial(reply.status) {
            return Err(security::denied(op, reply.status, &reply.body));
        } else if !reply.is_success() {
            return Err(reply.into_error(op));
        } else {
            SearchEngine::from_root(product.as_deref(), &reply.body)
                .map_err(StoreError::Permanent)?
        };
        tracing::info!(
            engine = engine.name(),
            version = engine.version(),
            "search engine"
        );
        Ok(self.engine.get_or_init(|| engine))
    }

    /// Reads an answer, checking the product header where the engine marks its answers. An
    /// answer that comes before the engine is known (a store used before `migrate`, as the
    /// auditor's and the tests' are) asks `GET /` first.
    pub(super) async fn read(
        &self,
        op: &str,
        sent: Result<elasticsearch::http::response::Response, elasticsearch::Error>,
    ) -> StoreResult<reply::Reply> {
        let marked = match self.engine.get() {
            Some(engine) => engine.marks_its_answers(),
            None => self.detect_engine().await?.marks_its_answers(),
        };
        reply::read(op, sent, marked).await
    }

    /// [`Self::read`] of an answer that must be a success: else the error it is.
    pub(super) async fn successful(
        &self,
        op: &str,
        sent: Result<elasticsearch::http::response::Response, elasticsearch::Error>,
    ) -> StoreResult<reply::Reply> {
        let reply = self.read(op, sent).await?;
        if reply.is_success() {
            Ok(reply)
        } else {
            Err(reply.into_error(op))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn elasticsearch_8_is_known_by_its_header() {
        let body = json!({"version": {"number": "8.19.21", "build_flavor": "default"}});
        assert_eq!(
            SearchEngine::from_root(Some("Elasticsearch"), &body),
            Ok(SearchEngine::Elasticsearch("8.19.21".into()))
        );
    }

    #[test]
    fn opensearch_2_is_known_by_its_distribution() {
        let body = json!({"version": {"distribution": "opensearch", "number": "2.19.6"}});
        assert_eq!(
            SearchEngine::from_root(None, &body),
            Ok(SearchEngine::OpenSearch("2.19.6".into()))
        );
    }

    #[test]
    fn older_versions_and_other_servers_are_refused_by_name() {
        let cases = [
            (
                Some("Elasticsearch"),
                json!({"version": {"number": "7.17.0"}}),
                "Elasticsearch 7.17.0",
            ),
            (
                None,
                json!({"version": {"distribution": "opensearch", "number": "1.3.2"}}),
                "opensearch 1.3.2",
            ),
            (
                None,
                json!({"version": {"distribution": "opensearch", "number": "2.6.0"}}),
                "opensearch 2.6.0",
            ),
            (
                None,
                json!({"version": {"number": "7.10.2"}}),
                "version 7.10.2 that names no product",
            ),
            (None, json!({"hello": "world"}), "without a version"),
            (None, Value::Null, "without a version"),
        ];
        for (product, body, found) in cases {
            let refused = SearchEngine::from_root(product, &body).unwrap_err();
            assert!(refused.contains(found), "{refused}");
            assert!(
                refused.contains("supported: Elasticsearch 8.x or later, OpenSearch 2.7 or later"),
                "{refused}"
            );
        }
    }

    #[test]
    fn opensearch_maps_flattened_as_flat_object_and_nothing_else_changes() {
        let body = json!({"properties": {
            "metadata": {"type": "flattened"},
            "state": {"type": "keyword"},
            "legs": {"properties": {"type": {"type": "keyword"}}},
        }});
        let opensearch = SearchEngine::OpenSearch("2.19.6".into()).mapping(&body);
        assert_eq!(opensearch["properties"]["metadata"]["type"], "flat_object");
        assert_eq!(opensearch["properties"]["state"]["type"], "keyword");
        assert_eq!(
            opensearch["properties"]["legs"]["properties"]["type"]["type"],
            "keyword"
        );
        let elasticsearch = SearchEngine::Elasticsearch("8.19.21".into()).mapping(&body);
        assert_eq!(elasticsearch, body);
    }
}
