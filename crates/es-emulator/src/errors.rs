//! Elasticsearch error envelopes (`docs/elasticsearch.md` §0 and §10), and turning any answer of
//! the emulator into an HTTP response that carries `X-elastic-product: Elasticsearch`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Map, Value};

/// The header every Elasticsearch 7.14+ response carries.
pub const PRODUCT_HEADER: &str = "x-elastic-product";
pub const PRODUCT: &str = "Elasticsearch";

/// One `ErrorCause`: a type, a reason, extra meta keys and an optional nested cause.
#[derive(Debug, Clone)]
pub struct Cause {
    pub kind: String,
    pub reason: String,
    pub meta: Map<String, Value>,
    pub caused_by: Option<Box<Cause>>,
}

impl Cause {
    pub fn new(kind: &str, reason: impl Into<String>) -> Self {
        Cause {
            kind: kind.to_owned(),
            reason: reason.into(),
            meta: Map::new(),
            caused_by: None,
        }
    }

    pub fn meta(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.meta.insert(key.to_owned(), value.into());
        self
    }

    /// `index_uuid`, `shard` (its number, as a string) and `index`, as on shard-level
    /// errors.
    pub fn shard(self, index: &str, uuid: &str, shard: usize) -> Self {
        self.meta("index_uuid", uuid)
            .meta("shard", shard.to_string())
            .meta("index", index)
    }

    /// `type`, `reason` and the meta keys, without `caused_by`.
    fn flat(&self) -> Map<String, Value> {
        let mut out = Map::new();
        out.insert("type".into(), Value::String(self.kind.clone()));
        out.insert("reason".into(), Value::String(self.reason.clone()));
        for (k, v) in &self.meta {
            out.insert(k.clone(), v.clone());
        }
        out
    }

    /// The full cause, nested causes included.
    pub fn to_json(&self) -> Value {
        let mut out = self.flat();
        if let Some(inner) = &self.caused_by {
            out.insert("caused_by".into(), inner.to_json());
        }
        Value::Object(out)
    }

    /// The `root_cause` Elasticsearch reports for this cause: the deepest cause of the chain
    /// that is an `ElasticsearchException` (`ElasticsearchException.guessRootCauses`), so
    /// the walk stops above a plain Java or XContent exception (`illegal_argument_exception`,
    /// `x_content_parse_exception`, …). Observed on 8.19.21 by the differential test:
    /// `document_parsing_exception` caused by `illegal_argument_exception` has the former as
    /// its root cause, `parsing_exception` caused by `named_object_not_found_exception` too.
    pub fn root(&self) -> &Cause {
        match &self.caused_by {
            Some(inner) if !NOT_ELASTICSEARCH_EXCEPTIONS.contains(&inner.kind.as_str()) => {
                inner.root()
            }
            _ => self,
        }
    }
}

/// Exception types the emulator raises that are not `ElasticsearchException`s in
/// Elasticsearch's Java code (JDK exceptions, and the XContent library's parse exceptions):
/// [`Cause::root`] does not descend into them.
const NOT_ELASTICSEARCH_EXCEPTIONS: &[&str] = &[
    "illegal_argument_exception",
    "illegal_state_exception",
    "number_format_exception",
    "arithmetic_exception",
    "date_time_parse_exception",
    "x_content_parse_exception",
    "x_content_e_o_f_exception",
    "json_parse_exception",
    "json_e_o_f_exception",
    "named_object_not_found_exception",
];

/// A whole-request error: `{"error":{"root_cause":[…],"type",…},"status":N}`.
#[derive(Debug, Clone)]
pub struct EsError {
    pub status: u16,
    pub cause: Cause,
    /// Overrides the computed `root_cause` list (the deepest cause by default).
    pub root_causes: Option<Vec<Cause>>,
}

impl EsError {
    pub fn new(status: u16, kind: &str, reason: impl Into<String>) -> Self {
        EsError {
            status,
            cause: Cause::new(kind, reason),
            root_causes: None,
        }
    }

    pub fn from_cause(status: u16, cause: Cause) -> Self {
        EsError {
            status,
            cause,
            root_causes: None,
        }
    }

    pub fn meta(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.cause = self.cause.meta(key, value);
        self
    }

    pub fn caused_by(mut self, inner: Cause) -> Self {
        self.cause.caused_by = Some(Box::new(inner));
        self
    }

    /// The `error` object of the envelope (also the `error` of a failed bulk item, minus
    /// `root_cause`).
    pub fn envelope(&self) -> Value {
        let roots = match &self.root_causes {
            Some(list) => list.iter().map(|c| Value::Object(c.flat())).collect(),
            None => vec![Value::Object(self.cause.root().flat())],
        };
        let mut error = Map::new();
        error.insert("root_cause".into(), Value::Array(roots));
        if let Value::Object(rest) = self.cause.to_json() {
            error.extend(rest);
        }
        json!({"error": Value::Object(error), "status": self.status})
    }

    /// The `error` object of a bulk item: the cause without `root_cause`.
    pub fn item_error(&self) -> Value {
        self.cause.to_json()
    }

    pub fn into_response(self) -> Response {
        json_response(self.status, &self.envelope())
    }

    // ---- the errors the emulator raises, with Elasticsearch's own texts ------------------

    /// 400 `action_request_validation_exception` with numbered messages.
    pub fn validation(messages: &[String]) -> Self {
        let mut reason = String::from("Validation Failed: ");
        for (n, message) in messages.iter().enumerate() {
            reason.push_str(&format!("{}: {message};", n + 1));
        }
        EsError::new(400, "action_request_validation_exception", reason)
    }

    pub fn illegal_argument(reason: impl Into<String>) -> Self {
        EsError::new(400, "illegal_argument_exception", reason)
    }

    pub fn parse(reason: impl Into<String>) -> Self {
        EsError::new(400, "parse_exception", reason)
    }

    /// A body that is not valid JSON, or has the wrong shape: `x_content_parse_exception`
    /// caused by Jackson's `json_parse_exception`, or, for a body cut short,
    /// `x_content_e_o_f_exception` caused by `json_e_o_f_exception` (8.19.21, observed by
    /// the differential test).
    pub fn x_content(error: &serde_json::Error) -> Self {
        Self::x_content_at(error, error.line())
    }

    /// [`Self::x_content`] for a parse of line `line` of a larger body (a bulk action line).
    pub fn x_content_at(error: &serde_json::Error, line: usize) -> Self {
        let (kind, inner) = if error.is_eof() {
            ("x_content_e_o_f_exception", "json_e_o_f_exception")
        } else {
            ("x_content_parse_exception", "json_parse_exception")
        };
        let reason = if error.is_eof() {
            "Unexpected end of file".to_owned()
        } else {
            error.to_string()
        };
        EsError::new(400, kind, format!("[{line}:{}] {reason}", error.column()))
            .caused_by(Cause::new(inner, error.to_string()))
    }

    /// An unknown or malformed search/query construct.
    pub fn parsing(reason: impl Into<String>) -> Self {
        EsError::new(400, "parsing_exception", reason)
    }

    pub fn index_not_found(index: &str) -> Self {
        EsError::new(
            404,
            "index_not_found_exception",
            format!("no such index [{index}]"),
        )
        .meta("resource.type", "index_or_alias")
        .meta("resource.id", index)
        .meta("index_uuid", "_na_")
        .meta("index", index)
    }

    pub fn invalid_index_name(index: &str, why: &str) -> Self {
        EsError::new(
            400,
            "invalid_index_name_exception",
            format!("Invalid index name [{index}], {why}"),
        )
        .meta("index_uuid", "_na_")
        .meta("index", index)
    }

    pub fn already_exists(index: &str, uuid: &str) -> Self {
        EsError::new(
            400,
            "resource_already_exists_exception",
            format!("index [{index}/{uuid}] already exists"),
        )
        .meta("index_uuid", uuid)
        .meta("index", index)
    }

    /// 409 `version_conflict_engine_exception` with the given reason, on shard `shard`.
    pub fn conflict(reason: String, index: &str, uuid: &str, shard: usize) -> Self {
        EsError::from_cause(
            409,
            Cause::new("version_conflict_engine_exception", reason).shard(index, uuid, shard),
        )
    }

    /// A failure while executing a search on a shard: Elasticsearch wraps it in a 400
    /// `search_phase_execution_exception` ("all shards failed").
    pub fn shard_search_failure(inner: Cause, index: &str) -> Self {
        let failed_shard = json!({
            "shard": 0,
            "index": index,
            "node": NODE_ID,
            "reason": inner.to_json(),
        });
        let cause = Cause::new("search_phase_execution_exception", "all shards failed")
            .meta("phase", "query")
            .meta("grouped", true)
            .meta("failed_shards", Value::Array(vec![failed_shard]));
        let mut error = EsError::from_cause(400, cause);
        error.root_causes = Some(vec![inner.root().clone()]);
        error.cause.caused_by = Some(Box::new(inner));
        error
    }

    /// 400 for an Elasticsearch feature this test double does not implement.
    pub fn unsupported(what: &str) -> Self {
        EsError::illegal_argument(format!(
            "[{what}] is not implemented by es-emulator (a test double of a subset of the \
             Elasticsearch REST API)"
        ))
    }

    /// The answer to an injected failure ([`crate::RunningEmulator::fail_next`]).
    pub fn injected(status: u16) -> Self {
        match status {
            429 => EsError::new(
                429,
                "es_rejected_execution_exception",
                "rejected execution of coordinating operation [coordinating_and_primary_bytes=0, \
                 replica_bytes=0, all_bytes=0, coordinating_operation_bytes=1, \
                 max_coordinating_and_primary_bytes=0] (injected by es-emulator)",
            ),
            503 => EsError::new(
                503,
                "unavailable_shards_exception",
                "[_na_][0] primary shard is not active Timeout: [1m], request: [injected by \
                 es-emulator]",
            ),
            400 => EsError::illegal_argument("injected failure (es-emulator)"),
            401 => EsError::new(401, "security_exception", "injected failure (es-emulator)"),
            403 => EsError::new(403, "security_exception", "injected failure (es-emulator)"),
            404 => EsError::new(
                404,
                "resource_not_found_exception",
                "injected failure (es-emulator)",
            ),
            _ => EsError::new(
                status,
                "exception",
                format!("injected failure (es-emulator): HTTP {status}"),
            ),
        }
    }
}

/// The node id shown in search shard failures and cluster info.
pub const NODE_ID: &str = "es-emulator-node-0";

/// Keys in the order Elasticsearch prints them; other keys follow, alphabetically.
/// (`serde_json` here keeps object keys sorted, so responses are reordered on output.)
const KEY_ORDER: &[&str] = &[
    "error",
    "root_cause",
    "name",
    "cluster_name",
    "cluster_uuid",
    "count",
    "acknowledged",
    "shards_acknowledged",
    "type",
    "reason",
    "resource.type",
    "resource.id",
    "index_uuid",
    "shard",
    "index",
    "phase",
    "grouped",
    "failed_shards",
    "node",
    "_index",
    "_id",
    "_version",
    "result",
    "forced_refresh",
    "found",
    "errors",
    "took",
    "timed_out",
    "_shards",
    "total",
    "successful",
    "skipped",
    "failed",
    "_seq_no",
    "_primary_term",
    "status",
    "number_of_nodes",
    "number_of_data_nodes",
    "active_primary_shards",
    "active_shards",
    "relocating_shards",
    "initializing_shards",
    "unassigned_shards",
    "unassigned_primary_shards",
    "delayed_unassigned_shards",
    "number_of_pending_tasks",
    "number_of_in_flight_fetch",
    "task_max_waiting_in_queue_millis",
    "active_shards_percent_as_number",
    "version",
    "number",
    "build_flavor",
    "build_type",
    "build_hash",
    "build_date",
    "build_snapshot",
    "lucene_version",
    "minimum_wire_compatibility_version",
    "minimum_index_compatibility_version",
    "tagline",
    "value",
    "relation",
    "items",
    "aliases",
    "mappings",
    "settings",
];

/// Serializes a JSON value with object keys in Elasticsearch's order ([`KEY_ORDER`]).
pub struct Ordered<'a>(pub &'a Value);

impl serde::Serialize for Ordered<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(map) => {
                let rank = |k: &str| KEY_ORDER.iter().position(|o| *o == k).unwrap_or(usize::MAX);
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_by_key(|k| rank(k));
                let mut out = serializer.serialize_map(Some(keys.len()))?;
                for key in keys {
                    out.serialize_entry(key, &Ordered(&map[key]))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Ordered(item))?;
                }
                out.end()
            }
            other => other.serialize(serializer),
        }
    }
}

/// A JSON response with the product header.
pub fn json_response(status: u16, body: &Value) -> Response {
    bytes_response(
        status,
        serde_json::to_vec(&Ordered(body)).unwrap_or_default(),
    )
}

/// A response whose body is already serialized JSON.
pub fn bytes_response(status: u16, body: Vec<u8>) -> Response {
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    with_product_header(response)
}

/// A response without a body (HEAD requests).
pub fn empty_response(status: u16) -> Response {
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    with_product_header(response)
}

pub fn with_product_header(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(PRODUCT_HEADER, HeaderValue::from_static(PRODUCT));
    response
}

/// Elasticsearch's answer to a known path with a method it does not accept: a 405 whose
/// `error` is a plain string (not an envelope), with an `Allow` header.
pub fn method_not_allowed(path: &str, method: &str, allowed: &[&str]) -> Response {
    let body = json!({
        "error": format!(
            "Incorrect HTTP method for uri [{path}] and method [{method}], allowed: [{}]",
            allowed.join(", ")
        ),
        "status": 405,
    });
    let mut response = json_response(405, &body);
    if let Ok(value) = HeaderValue::from_str(&allowed.join(",")) {
        response.headers_mut().insert(header::ALLOW, value);
    }
    response
}

/// The parser's token for a JSON value, as a bulk or search body's errors name it.
pub(crate) fn token_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "VALUE_NULL",
        Value::Bool(_) => "VALUE_BOOLEAN",
        Value::Number(_) => "VALUE_NUMBER",
        Value::String(_) => "VALUE_STRING",
        Value::Array(_) => "START_ARRAY",
        Value::Object(_) => "START_OBJECT",
    }
}
