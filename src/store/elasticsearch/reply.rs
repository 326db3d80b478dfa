//! Turning Elasticsearch's HTTP answers into store results: the one place where status codes,
//! error envelopes and bulk items are mapped to [`StoreError`] and [`WriteOutcome`].
//!
//! # Whole-request mapping
//!
//! | answer                                                   | result                       |
//! |----------------------------------------------------------|------------------------------|
//! | connection refused/reset, timeout, body cut off           | `Unavailable`                |
//! | 429 (rejected execution, circuit breaker, flood stage)   | `Unavailable`                |
//! | 500, 502, 503, 504 (node closing, proxy/LB errors, no master, shards down) | `Unavailable` |
//! | a shard not available now ([`SHARD_NOT_AVAILABLE`]), whatever the status (404 included) | `Unavailable` |
//! | a block on the index or cluster (`cluster_block_exception`: a write block while the index is split, 403) | `Unavailable` |
//! | 401 (credentials refused), 403 (privilege missing), whoever sent them | `Denied` (§12) |
//! | 2xx (or an expected 4xx) without `X-elastic-product`     | `Permanent` (not ES); on OpenSearch, which has no such header, the engine is checked once, by `GET /` (`engine.rs`) |
//! | 2xx from Elasticsearch                                   | handled by the caller        |
//! | 4xx the caller expects (GET 404, 400 index exists, ...) | handled by the caller        |
//! | any other status (400, 401, 403, 404, ...)               | `Permanent`, ES type+reason  |
//!
//! The transient statuses are mapped before the product header is checked: a load balancer
//! answering 503 for a dead node is exactly what `Unavailable` is for, and it never carries
//! the header. Everything else we only believe when it came from Elasticsearch, because a
//! 404 from some other HTTP server would otherwise read as "document absent".
//!
//! 500 is `Unavailable`: Elasticsearch answers it for unexpected exceptions, and among them
//! transient ones (a coordinating node closing during a rolling restart throws
//! `NodeClosedException`, which carries no status of its own); a `_bulk` answered 500 may
//! also have applied some items. Retries are bounded and conditional writes make them safe,
//! so treating a 500 as "outcome unknown, try again later" costs little and never answers a
//! client 500 for a cluster hiccup.
//!
//! # Bulk item mapping
//!
//! `_bulk` answers 200 even when items fail, so every item's own `status` decides:
//!
//! | item status | reason contains                | outcome                       |
//! |-------------|--------------------------------|-------------------------------|
//! | 200, 201    |                                | `Written(_seq_no, _primary_term)` |
//! | 409         | "document already exists"      | `AlreadyExists` (create)      |
//! | 409         | "but no document was found"    | `NotFound` (CAS on a missing doc) |
//! | 409         | anything else                  | `Conflict` (CAS mismatch)     |
//! | 429, 5xx    |                                | `Err(Unavailable)`            |
//! | any         | (type) a shard not available now, or its index on the node asked | `Err(Unavailable)` |
//! | 401, 403    |                                | `Err(Denied)` (a privilege on that index) |
//! | other       |                                | `Err(Permanent)`              |
//!
//! The 409 reasons are the fixed texts of `VersionConflictEngineException` (see
//! `docs/elasticsearch.md` §1 and §3).
//!
//! # A shard not available now
//!
//! A write waits for its shard's primary up to the request's `timeout`, then fails with the
//! last reason it was refused. While a primary relocates or fails over that reason is often
//! a shard in the wrong state (`IllegalIndexShardStateException` and its kinds, or
//! `ShardNotFoundException`), which Elasticsearch and OpenSearch answer with **404**, not
//! 503 (`docs/elasticsearch.md` §10). The engine itself retries those as "shard not
//! available" (`TransportActions.isShardNotAvailableException`); so do we: by their `type`,
//! [`SHARD_NOT_AVAILABLE`], they are `Unavailable` whatever their status.
//!
//! `index_not_found_exception` is of that family too. In a whole answer (a `get`, a search)
//! it keeps the meaning the `super` module docs give a missing index. In a bulk item it is
//! `Unavailable`: the node a write was sent to answers "no such index" once its last shard
//! of the index has moved away (20 to 34 of 1,806 creates on three OpenSearch 2.19.6 nodes
//! while the accounts index moved between them, with a 20 ms bulk `timeout`; each was a
//! `500` before). An index that is really gone is re-created by the write itself (default
//! `action.auto_create_index`) or, where that is forbidden, refuses every write as
//! unavailable while `/readyz` names it.

use elasticsearch::http::response::Response;
use serde_json::Value;

use crate::store::{StoreError, StoreResult, Version, WriteOutcome};

/// Statuses that mean "try again later" whoever sent them.
const TRANSIENT_STATUSES: [u16; 5] = [429, 500, 502, 503, 504];

/// The `error.type`s of a shard that is not available now (relocating, closing, recovering,
/// not yet started, not found on the node asked): Elasticsearch's and OpenSearch's
/// `isShardNotAvailableException` family, by name, without `index_not_found_exception`. A
/// retry later finds the shard where it went.
pub(super) const SHARD_NOT_AVAILABLE: [&str; 12] = [
    "illegal_index_shard_state_exception",
    "index_shard_closed_exception",
    "index_shard_not_started_exception",
    "index_shard_not_recovering_exception",
    "index_shard_recovering_exception",
    "index_shard_relocated_exception",
    "index_shard_started_exception",
    "shard_not_in_primary_mode_exception",
    "shard_not_found_exception",
    "no_shard_available_action_exception",
    "unavailable_shards_exception",
    "already_closed_exception",
];

fn is_shard_not_available(error_type: Option<&str>) -> bool {
    error_type.is_some_and(|kind| SHARD_NOT_AVAILABLE.contains(&kind))
}

/// The header every Elasticsearch (7.14+) response carries. The official clients refuse a
/// 2xx without it; so do we, for every answer we act on.
const PRODUCT_HEADER: &str = "x-elastic-product";
const PRODUCT: &str = "Elasticsearch";

/// A decoded answer from Elasticsearch that is not a transient failure.
#[derive(Debug)]
pub(super) struct Reply {
    pub status: u16,
    /// The JSON body; `Null` when the body was empty.
    pub body: Value,
}

impl Reply {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The `error.type` of an error envelope, if the body is one.
    pub fn error_type(&self) -> Option<&str> {
        self.body.pointer("/error/type").and_then(Value::as_str)
    }

    /// The answer as an error, for statuses the caller does not expect.
    pub fn into_error(self, op: &str) -> StoreError {
        let message = format!("{op}: HTTP {} {}", self.status, describe(&self.body));
        if is_transient(self.status)
            || is_shard_not_available(self.error_type())
            || is_blocked(&self.body["error"])
        {
            StoreError::Unavailable(message)
        } else {
            StoreError::Permanent(message)
        }
    }
}

fn is_transient(status: u16) -> bool {
    TRANSIENT_STATUSES.contains(&status)
}

/// 401: the credentials do not authenticate; 403: they lack a privilege (§12).
pub(super) fn is_denial(status: u16) -> bool {
    matches!(status, 401 | 403)
}

/// A write block on the index (`cluster_block_exception`, `index write (api)`, answered 403),
/// as while `transfer-service shards` splits it: nothing was applied, and the block is lifted
/// in moments, so retry later. Other blocks stay what their status says: no master (503) and
/// a full disk (429) are retried anyway; one an operator set (`read_only`, 403) is refused.
pub(super) fn is_blocked(error: &Value) -> bool {
    error["type"] == "cluster_block_exception"
        && error["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("index write (api)"))
}

/// Reads a response (or the failure to get one) for operation `op`, mapping transport errors
/// and transient statuses to `Unavailable`, and, when the engine `marked` its answers
/// (Elasticsearch), refusing those without its product header. See the module docs for the
/// table.
pub(super) async fn read(
    op: &str,
    sent: Result<Response, elasticsearch::Error>,
    marked: bool,
) -> StoreResult<Reply> {
    let (product, reply) = read_unmarked(op, sent).await?;
    // Before the product check: a security refusal is what it is whoever answers it (a
    // proxy's 401 also means the credentials were refused), and it must never read as "not
    // Elasticsearch".
    if is_denial(reply.status) && !is_blocked(&reply.body["error"]) {
        return Err(super::security::denied(op, reply.status, &reply.body));
    }
    if marked && product.as_deref() != Some(PRODUCT) {
        return Err(StoreError::Permanent(format!(
            "{op}: HTTP {} without the header `X-elastic-product: Elasticsearch`; \
             ELASTICSEARCH_URL does not seem to point at Elasticsearch",
            reply.status
        )));
    }
    Ok(reply)
}

/// [`read`] without the product check and without mapping 401 and 403 to `Denied`: the
/// answer and its product header, if any (the engine's detection reads both,
/// `super::engine`).
pub(super) async fn read_unmarked(
    op: &str,
    sent: Result<Response, elasticsearch::Error>,
) -> StoreResult<(Option<String>, Reply)> {
    let response = sent.map_err(|e| transport_error(op, &e))?;
    let status = response.status_code().as_u16();
    // Read headers ourselves: `Response::content_type()` panics when the header is missing.
    let product = response
        .headers()
        .get(PRODUCT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = response
        .bytes()
        .await
        .map_err(|e| transport_error(op, &e))?;

    let body = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => v,
            // A transient status from a proxy often has an HTML body; the status says enough.
            Err(_) if is_transient(status) => Value::String(snippet(&bytes)),
            Err(e) => {
                return Err(StoreError::Permanent(format!(
                    "{op}: HTTP {status} with a body that is not JSON ({e}): {}",
                    snippet(&bytes)
                )))
            }
        }
    };
    let reply = Reply { status, body };

    if is_transient(status) {
        return Err(reply.into_error(op));
    }
    Ok((product, reply))
}

/// No answer at all: refused or reset connections, DNS failures, timeouts, a body cut off.
/// The request may or may not have reached the cluster, which is what `Unavailable` says.
pub(super) fn transport_error(op: &str, e: &elasticsearch::Error) -> StoreError {
    if e.is_timeout() {
        StoreError::Unavailable(format!("{op}: timed out: {e}"))
    } else {
        StoreError::Unavailable(format!("{op}: {}", with_causes(e)))
    }
}

/// The error and its causes: "error sending request" alone hides a refused connection or a
/// certificate the client does not trust (an ELASTICSEARCH_CA_CERT to set).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(inner) = cause {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        cause = inner.source();
    }
    text
}

/// `type: reason` of an error envelope, or a snippet of whatever the body is.
pub(super) fn describe(body: &Value) -> String {
    match body.get("error") {
        Some(Value::Object(error)) => {
            let kind = error.get("type").and_then(Value::as_str).unwrap_or("error");
            let reason = error.get("reason").and_then(Value::as_str).unwrap_or("");
            format!("{kind}: {reason}")
        }
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => snippet(body.to_string().as_bytes()),
    }
}

fn snippet(bytes: &[u8]) -> String {
    const MAX: usize = 300;
    let text = String::from_utf8_lossy(bytes);
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.into_owned(),
    }
}

/// The `(_seq_no, _primary_term)` of a write result, a GET or a search hit.
pub(super) fn version_of(op: &str, object: &Value) -> StoreResult<Version> {
    let seq_no = object.get("_seq_no").and_then(Value::as_u64);
    let primary_term = object.get("_primary_term").and_then(Value::as_u64);
    match (seq_no, primary_term) {
        (Some(seq_no), Some(primary_term)) => Ok(Version {
            seq_no,
            primary_term,
        }),
        _ => Err(StoreError::Permanent(format!(
            "{op}: answer without _seq_no/_primary_term: {}",
            snippet(object.to_string().as_bytes())
        ))),
    }
}

/// The outcome of one `_bulk` item (`{"<action>": {...,"status":N}}`); see the module docs.
pub(super) fn bulk_item(item: &Value) -> StoreResult<WriteOutcome> {
    let result = item
        .as_object()
        .and_then(|o| o.values().next())
        .ok_or_else(|| StoreError::Permanent(format!("bulk: malformed item {item}")))?;
    let status = result
        .get("status")
        .and_then(Value::as_u64)
        .ok_or_else(|| StoreError::Permanent(format!("bulk: item without status {item}")))?;
    let reason = result
        .pointer("/error/reason")
        .and_then(Value::as_str)
        .unwrap_or("");
    let error_type = result.pointer("/error/type").and_then(Value::as_str);
    let shard_moved =
        is_shard_not_available(error_type) || error_type == Some("index_not_found_exception");
    match status {
        200 | 201 => version_of("bulk", result).map(WriteOutcome::Written),
        409 if reason.contains("document already exists") => Ok(WriteOutcome::AlreadyExists),
        409 if reason.contains("but no document was found") => Ok(WriteOutcome::NotFound),
        409 => Ok(WriteOutcome::Conflict),
        403 if is_blocked(&result["error"]) => Err(StoreError::Unavailable(format!(
            "bulk item: HTTP {status} {}",
            describe(result)
        ))),
        401 | 403 => Err(super::security::denied(
            "bulk item",
            status as u16,
            &serde_json::json!({ "error": result.get("error") }),
        )),
        // 429 and 5xx; and a relocating or failing-over primary, answered 404 (see "A shard
        // not available now").
        _ if status == 429 || (500..600).contains(&status) || shard_moved => Err(
            StoreError::Unavailable(format!("bulk item: HTTP {status} {}", describe(result))),
        ),
        _ => Err(StoreError::Permanent(format!(
            "bulk item: HTTP {status} {}",
            describe(result)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn item(action: &str, body: Value) -> Value {
        json!({ action: body })
    }

    #[test]
    fn written_items_carry_their_new_version() {
        let created = item(
            "create",
            json!({"_index":"a","_id":"1","_version":1,"result":"created","_seq_no":7,"_primary_term":2,"status":201}),
        );
        assert_eq!(
            bulk_item(&created).unwrap(),
            WriteOutcome::Written(Version {
                seq_no: 7,
                primary_term: 2
            })
        );
        let updated = item(
            "index",
            json!({"_id":"1","result":"updated","_seq_no":8,"_primary_term":2,"status":200}),
        );
        assert_eq!(bulk_item(&updated).unwrap().written().unwrap().seq_no, 8);
    }

    #[test]
    fn conflicts_are_told_apart_by_their_reason() {
        let conflict = |reason: &str| {
            item(
                "index",
                json!({"_id":"1","status":409,"error":{"type":"version_conflict_engine_exception","reason":reason}}),
            )
        };
        assert_eq!(
            bulk_item(&conflict(
                "[1]: version conflict, document already exists (current version [1])"
            ))
            .unwrap(),
            WriteOutcome::AlreadyExists
        );
        assert_eq!(
            bulk_item(&conflict(
                "[1]: version conflict, required seqNo [3], primary term [1]. but no document was found"
            ))
            .unwrap(),
            WriteOutcome::NotFound
        );
        assert_eq!(
            bulk_item(&conflict(
                "[1]: version conflict, required seqNo [3], primary term [1]. current document has seqNo [4] and primary term [1]"
            ))
            .unwrap(),
            WriteOutcome::Conflict
        );
    }

    #[test]
    fn rejected_and_failed_items_are_errors_of_the_right_kind() {
        let failed = |status: u16| {
            item(
                "create",
                json!({"_id":"1","status":status,"error":{"type":"x","reason":"y"}}),
            )
        };
        for status in [429, 500, 503] {
            assert!(
                bulk_item(&failed(status)).unwrap_err().is_retryable(),
                "{status}"
            );
        }
        for status in [400, 404] {
            assert!(
                !bulk_item(&failed(status)).unwrap_err().is_retryable(),
                "{status}"
            );
        }
        assert!(!bulk_item(&json!("nonsense")).unwrap_err().is_retryable());
    }

    /// What Elasticsearch 8.19.21 answers a write to an index with a write block (as while
    /// it is split to more shards): a 403 that is no missing privilege.
    #[test]
    fn a_write_to_a_blocked_index_is_retried_later_not_denied() {
        let blocked = json!({"type": "cluster_block_exception",
            "reason": "index [t1] blocked by: [FORBIDDEN/8/index write (api)];"});
        let item = item(
            "index",
            json!({"_id": "y", "status": 403, "error": blocked}),
        );
        let error = bulk_item(&item).unwrap_err();
        assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");
        let reply = Reply {
            status: 403,
            body: json!({"error": blocked, "status": 403}),
        };
        let error = reply.into_error("get");
        assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");
    }

    #[test]
    fn a_shard_not_available_now_is_retryable_whatever_its_status() {
        // What a write whose primary relocated answers once its `timeout` runs out: the last
        // refusal, a shard in the wrong state, with the 404 of its exception.
        let refused = |kind: &str| {
            item(
                "create",
                json!({"_id":"1","status":404,"error":{"type":kind,"reason":"[i][0] CurrentState[CLOSED]"}}),
            )
        };
        for kind in SHARD_NOT_AVAILABLE {
            assert!(
                bulk_item(&refused(kind)).unwrap_err().is_retryable(),
                "{kind}"
            );
            let body = json!({"error":{"type":kind,"reason":"r"},"status":404});
            assert!(
                Reply { status: 404, body }.into_error("get").is_retryable(),
                "{kind}"
            );
        }
        // The node asked no longer holds a shard of the index: retried as well.
        assert!(bulk_item(&refused("index_not_found_exception"))
            .unwrap_err()
            .is_retryable());
        // In a whole answer a missing index keeps its meaning (the backend decides it).
        let missing =
            json!({"error":{"type":"index_not_found_exception","reason":"r"},"status":404});
        assert!(!Reply {
            status: 404,
            body: missing
        }
        .into_error("get")
        .is_retryable());
    }

    #[test]
    fn errors_name_the_elasticsearch_type_and_reason() {
        let body = json!({"error":{"root_cause":[],"type":"mapper_parsing_exception","reason":"failed to parse"},"status":400});
        let error = Reply { status: 400, body }.into_error("bulk");
        assert!(!error.is_retryable());
        assert!(
            error
                .to_string()
                .contains("mapper_parsing_exception: failed to parse"),
            "{error}"
        );
    }
}
