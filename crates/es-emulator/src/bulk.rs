//! `_bulk` (`docs/elasticsearch.md` §6): NDJSON parsing with Elasticsearch's whole-request errors,
//! request validation shared with the single-document APIs (§1, §3), and sequential application
//! with one result per item, in order.
//!
//! Which failures are whose, as in Elasticsearch:
//! - **The whole request** (a 400 and nothing applied): a body without its final newline, a
//!   malformed action line or unknown action parameter, a negative `if_seq_no` or
//!   `if_primary_term` (thrown while parsing), and everything `BulkRequest.validate()` collects
//!   from its items' own `validate()`: an id over 512 bytes, `create` with compare-and-set,
//!   `if_seq_no` without `if_primary_term` or the reverse, a delete without an id, a missing
//!   index or source (`action_request_validation_exception`, every message numbered).
//! - **One item** (its own `status` and `error`, the others applied): an empty `_id` on `index`
//!   or `create` (`illegal_argument_exception`, raised when the item is routed, after its
//!   index was auto-created), a missing index for `delete`, an invalid index name, a source
//!   that does not parse or does not fit the mapping, version conflicts, and `update` (not
//!   implemented by this test double).

use std::time::Instant;

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::capacity::AnswerAt;
use crate::errors::{token_name, EsError};
use crate::state::{random_id, Cluster, WriteKind, WriteRequest, Written};

/// The longest document id Elasticsearch accepts, in bytes.
const MAX_ID_BYTES: usize = 512;

/// Validation messages of one write, in the order of `IndexRequest.validate()` and
/// `DeleteRequest.validate()` (index, source, the create checks that end validation, the id of
/// a delete, `DocWriteRequest.validateSeqNoBasedCASParams`, `validateDocIdLength`); the caller
/// turns them into one `action_request_validation_exception` for the whole request.
pub fn validate_write(
    kind: WriteKind,
    index: Option<&str>,
    id: Option<&str>,
    if_seq_no: Option<i64>,
    if_primary_term: Option<u64>,
    has_source: bool,
) -> Vec<String> {
    let mut messages = Vec::new();
    if index.is_none_or(str::is_empty) {
        messages.push("index is missing".to_owned());
    }
    if kind != WriteKind::Delete && !has_source {
        messages.push("source is missing".to_owned());
    }
    let term = if_primary_term.unwrap_or(0);
    if kind == WriteKind::Create && (if_seq_no.is_some() || term != 0) {
        messages
            .push("create operations do not support compare and set. use index instead".to_owned());
        return messages;
    }
    // `Strings.isEmpty(id)`. An empty id of an index or create is not a validation error: it
    // fails when the item is routed ([`EMPTY_ID`]).
    if kind == WriteKind::Delete && id.is_none_or(str::is_empty) {
        messages.push("id is missing".to_owned());
    }
    if if_seq_no.is_some() && term == 0 {
        messages.push("ifSeqNo is set, but primary term is [0]".to_owned());
    }
    if if_seq_no.is_none() && term != 0 {
        messages.push(format!(
            "ifSeqNo is unassigned, but primary term is [{term}]"
        ));
    }
    if let Some(id) = id.filter(|id| id.len() > MAX_ID_BYTES) {
        messages.push(format!(
            "id [{id}] is too long, must be no longer than 512 bytes but was: {}",
            id.len()
        ));
    }
    messages
}

/// What Elasticsearch's `IndexRouting` answers for an index or create item whose `_id` is
/// `""`: an error of that item alone (`rest-api-spec` `bulk/10_basic.yml`, "Empty _id").
pub const EMPTY_ID: &str = "if _id is specified it must not be empty";

/// `if_seq_no` must not be negative (an `illegal_argument_exception`, not a validation).
pub fn check_seq_no(if_seq_no: Option<i64>) -> Result<(), EsError> {
    match if_seq_no {
        Some(seq) if seq < 0 => Err(EsError::illegal_argument(format!(
            "sequence numbers must be non negative. got [{seq}]."
        ))),
        _ => Ok(()),
    }
}

/// The body of a successful write (§0), as the document APIs and bulk items show it.
pub fn write_body(
    index: &str,
    id: &str,
    written: &Written,
    shards: Value,
    forced_refresh: Option<bool>,
) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("_index".into(), json!(index));
    body.insert("_id".into(), json!(id));
    body.insert("_version".into(), json!(written.version));
    body.insert("result".into(), json!(written.result));
    if let Some(forced) = forced_refresh {
        body.insert("forced_refresh".into(), json!(forced));
    }
    body.insert("_shards".into(), shards);
    body.insert("_seq_no".into(), json!(written.seq_no));
    body.insert("_primary_term".into(), json!(written.primary_term));
    body
}

/// A document source: parsed, and exactly as sent. A malformed source is an error of its
/// own write only (`document_parsing_exception`).
pub fn parse_source(bytes: &[u8]) -> Result<(Value, Box<RawValue>), EsError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        EsError::new(
            400,
            "document_parsing_exception",
            format!("failed to parse: {e}"),
        )
    })?;
    let parse_error = |e: serde_json::Error| {
        EsError::new(
            400,
            "document_parsing_exception",
            format!("[{}:{}] failed to parse: {e}", e.line(), e.column()),
        )
    };
    let value: Value = serde_json::from_str(text).map_err(parse_error)?;
    if !value.is_object() {
        return Err(EsError::new(
            400,
            "document_parsing_exception",
            "[1:1] failed to parse: root of the document must be an object",
        ));
    }
    let raw = RawValue::from_string(text.trim().to_owned()).map_err(parse_error)?;
    Ok((value, raw))
}

/// One operation of a bulk request.
pub struct BulkItem {
    pub action: &'static str,
    pub index: String,
    pub id: Option<String>,
    pub if_seq_no: Option<i64>,
    pub if_primary_term: Option<u64>,
    /// A delete's custom `routing`.
    pub routing: Option<String>,
    pub source: Option<Result<(Value, Box<RawValue>), EsError>>,
}

fn malformed(line: usize, what: String) -> EsError {
    EsError::illegal_argument(format!("Malformed action/metadata line [{line}], {what}"))
}

/// Parses an NDJSON bulk body. `default_index` comes from `/{index}/_bulk`.
pub fn parse(body: &[u8], default_index: Option<&str>) -> Result<Vec<BulkItem>, EsError> {
    if body.is_empty() {
        return Err(EsError::parse("request body is required"));
    }
    if body.last() != Some(&b'\n') {
        return Err(EsError::illegal_argument(
            "The bulk request must be terminated by a newline [\\n]",
        ));
    }
    let lines: Vec<&[u8]> = body[..body.len() - 1].split(|b| *b == b'\n').collect();
    let mut items = Vec::new();
    let mut messages = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let number = i + 1;
        let line = lines[i];
        i += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let action: Value =
            serde_json::from_slice(line).map_err(|e| EsError::x_content_at(&e, number))?;
        let Value::Object(action) = action else {
            return Err(malformed(
                number,
                format!("expected START_OBJECT but found [{}]", token_name(&action)),
            ));
        };
        let mut entries = action.iter();
        let (name, params) = match (entries.next(), entries.next()) {
            (None, _) => {
                return Err(malformed(
                    number,
                    "expected FIELD_NAME but found [END_OBJECT]".into(),
                ))
            }
            (Some(_), Some(_)) => {
                return Err(malformed(
                    number,
                    "expected END_OBJECT but found [FIELD_NAME]".into(),
                ))
            }
            (Some(entry), None) => entry,
        };
        let mut kind: &'static str = match name.as_str() {
            "index" => "index",
            "create" => "create",
            "delete" => "delete",
            "update" => "update",
            other => {
                return Err(malformed(
                    number,
                    format!("expected one of [create, delete, index, update] but found [{other}]"),
                ))
            }
        };
        let Value::Object(params) = params else {
            return Err(malformed(
                number,
                format!("expected START_OBJECT but found [{}]", token_name(params)),
            ));
        };
        let mut index = default_index.map(str::to_owned);
        let mut id = None;
        let mut if_seq_no = None;
        let mut if_primary_term = None;
        let mut routing = None;
        for (key, value) in params {
            let text = match value {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                Value::Bool(b) => Some(b.to_string()),
                _ => None,
            };
            let number_of = |v: &Value| {
                v.as_i64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            };
            match key.as_str() {
                "_index" => index = text,
                "_id" => id = text,
                "if_seq_no" => {
                    if_seq_no = Some(number_of(value).ok_or_else(|| {
                        EsError::illegal_argument(format!("failed to parse if_seq_no [{value}]"))
                    })?)
                }
                "if_primary_term" => {
                    let term = number_of(value).ok_or_else(|| {
                        EsError::illegal_argument(format!(
                            "failed to parse if_primary_term [{value}]"
                        ))
                    })?;
                    if_primary_term = Some(u64::try_from(term).map_err(|_| {
                        EsError::illegal_argument(format!(
                            "primary term must be non negative. got [{term}]"
                        ))
                    })?)
                }
                "op_type" if kind == "index" => match text.as_deref() {
                    Some("create") => kind = "create",
                    Some("index") => {}
                    _ => {
                        return Err(EsError::illegal_argument(format!(
                            "opType must be 'create' or 'index', found: [{value}]"
                        )))
                    }
                },
                "pipeline" if text.as_deref() == Some("_none") => {}
                "pipeline" => {
                    return Err(EsError::illegal_argument(format!(
                        "pipeline with id [{}] does not exist",
                        text.unwrap_or_default()
                    )))
                }
                // Meaningful only for `update` (refused per item). A `routing` of a delete has
                // no effect on one shard (refused per item on several).
                "retry_on_conflict" | "_source" => {}
                "routing" if value.is_null() => {}
                "routing" if kind == "delete" => routing = text,
                "require_alias" | "list_executed_pipelines" | "require_data_stream"
                    if value == &Value::Bool(false) => {}
                "dynamic_templates" if value.as_object().is_some_and(Map::is_empty) => {}
                "routing"
                | "require_alias"
                | "list_executed_pipelines"
                | "require_data_stream"
                | "dynamic_templates" => {
                    return Err(EsError::unsupported(&format!("bulk {key} [{value}]")))
                }
                "version" | "version_type" => {
                    return Err(EsError::unsupported("bulk external versioning"))
                }
                other => {
                    return Err(EsError::illegal_argument(format!(
                        "Action/metadata line [{number}] contains an unknown parameter [{other}]"
                    )))
                }
            }
        }
        check_seq_no(if_seq_no)?;
        let source = if kind == "delete" {
            None
        } else {
            // The source line; an action without one at the end of the body is dropped, as
            // Elasticsearch's parser does.
            let Some(line) = lines.get(i) else { break };
            i += 1;
            Some(parse_source(line))
        };
        let write_kind = match kind {
            "create" => WriteKind::Create,
            "delete" => WriteKind::Delete,
            _ => WriteKind::Index,
        };
        if kind != "update" {
            let has_source = source
                .as_ref()
                .is_some_and(|_| !lines[i - 1].iter().all(u8::is_ascii_whitespace));
            messages.extend(validate_write(
                write_kind,
                index.as_deref(),
                id.as_deref(),
                if_seq_no,
                if_primary_term,
                has_source || kind == "delete",
            ));
        }
        items.push(BulkItem {
            action: kind,
            index: index.unwrap_or_default(),
            id,
            if_seq_no,
            if_primary_term,
            routing,
            source,
        });
    }
    if items.is_empty() {
        messages.push("no requests added".to_owned());
    }
    if !messages.is_empty() {
        return Err(EsError::validation(&messages));
    }
    Ok(items)
}

/// The result of one applied item: its JSON, and the index and index-wide order
/// ([`Written::order`]) it wrote if any.
pub struct ItemResult {
    pub json: Value,
    pub failed: bool,
    pub written: Option<(String, u64)>,
}

fn item_error(item: &BulkItem, id: &str, error: &EsError) -> ItemResult {
    ItemResult {
        json: json!({ item.action: {
            "_index": item.index,
            "_id": id,
            "status": error.status,
            "error": error.item_error(),
        }}),
        failed: true,
        written: None,
    }
}

/// The result of an item refused before it was applied (403 from security, `security` module).
pub fn denied_item(item: &BulkItem, error: &EsError) -> Value {
    let id = item.id.clone().unwrap_or_default();
    item_error(item, &id, error).json
}

/// Applies one bulk item to the cluster (the index is auto-created for index/create); an
/// item that reaches its shard occupies it in the capacity model.
pub fn apply_item(
    cluster: &mut Cluster,
    item: BulkItem,
    now: Instant,
    forced_refresh: Option<bool>,
    answer: &AnswerAt,
) -> ItemResult {
    let capacity = cluster.capacity;
    let id = item.id.clone().unwrap_or_else(|| random_id(20));
    if item.action == "update" {
        return item_error(&item, &id, &EsError::unsupported("bulk update"));
    }
    let kind = match item.action {
        "create" => WriteKind::Create,
        "delete" => WriteKind::Delete,
        _ => WriteKind::Index,
    };
    let target = if kind == WriteKind::Delete {
        cluster
            .indices
            .get_mut(&item.index)
            .ok_or_else(|| EsError::index_not_found(&item.index))
    } else {
        cluster.index_for_write(&item.index, now)
    };
    let index = match target {
        Ok(index) => index,
        Err(error) => return item_error(&item, &id, &error),
    };
    if kind != WriteKind::Delete && id.is_empty() {
        return item_error(&item, &id, &EsError::illegal_argument(EMPTY_ID));
    }
    if let Err(error) = index.refuse_custom_routing(item.routing.as_deref()) {
        return item_error(&item, &id, &error);
    }
    index.occupy_shard_of(&id, capacity, answer);
    let source = match &item.source {
        Some(Ok((value, raw))) => Some((value.clone(), raw.clone())),
        Some(Err(error)) => return item_error(&item, &id, error),
        None => None,
    };
    let request = WriteRequest {
        kind,
        id: id.clone(),
        source,
        if_seq_no: item.if_seq_no,
        if_primary_term: item.if_primary_term,
    };
    match index.apply(request, now) {
        Ok(written) => {
            let mut body = write_body(&item.index, &id, &written, index.shards(), forced_refresh);
            body.insert("status".into(), json!(written.status));
            ItemResult {
                json: json!({ item.action: Value::Object(body) }),
                failed: false,
                written: Some((item.index.clone(), written.order)),
            }
        }
        Err(error) => item_error(&item, &id, &error),
    }
}
