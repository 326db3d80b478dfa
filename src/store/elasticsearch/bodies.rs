//! The bodies the Elasticsearch backend sends and the search answers it reads: `_bulk`'s NDJSON
//! lines, the listings' search body, and hits turned into documents, pages and cursors. Pure
//! functions; the requests themselves are in `super` (the module table there says which).

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::connection::Connection;
use super::reply;
use crate::store::{
    entries, fields, Doc, EntriesQuery, Page, SortKey, Source, StoreError, StoreResult, WriteOp,
};

/// The action line of one bulk write: `{"create": {..}}` or `{"index": {..}}`.
#[derive(serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum BulkAction<'a> {
    Create(BulkTarget<'a>),
    Index(BulkTarget<'a>),
}

#[derive(serde::Serialize)]
struct BulkTarget<'a> {
    _index: &'a str,
    _id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    if_seq_no: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    if_primary_term: Option<u64>,
}

/// The two NDJSON lines of one bulk write: the action, then the source as it is (no tree is
/// built). `ReplaceIf` is an `index` action with `if_seq_no`/`if_primary_term` (a `create`
/// action cannot carry them).
pub(super) fn bulk_lines(connection: &Connection, op: WriteOp) -> StoreResult<[Bytes; 2]> {
    let index_name = connection.index_name(op.index());
    let (action, source) = match &op {
        WriteOp::Create { id, source, .. } => (
            BulkAction::Create(BulkTarget {
                _index: &index_name,
                _id: id,
                if_seq_no: None,
                if_primary_term: None,
            }),
            source,
        ),
        WriteOp::ReplaceIf {
            id,
            source,
            expected,
            ..
        } => (
            BulkAction::Index(BulkTarget {
                _index: &index_name,
                _id: id,
                if_seq_no: Some(expected.seq_no),
                if_primary_term: Some(expected.primary_term),
            }),
            source,
        ),
    };
    let action = serde_json::to_vec(&action)
        .map_err(|e| StoreError::Permanent(format!("bulk: cannot encode an action: {e}")))?;
    Ok([action.into(), source.clone().into_bytes()])
}

/// A document from a GET answer or a search hit.
pub(super) fn doc_of(op: &str, hit: &Value) -> StoreResult<Doc> {
    let id = hit
        .get("_id")
        .and_then(Value::as_str)
        .ok_or_else(|| StoreError::Permanent(format!("{op}: document without _id")))?;
    Ok(Doc {
        id: id.to_owned(),
        version: reply::version_of(op, hit)?,
        source: Source::from(hit.get("_source").unwrap_or(&Value::Null)),
    })
}

/// The hits of a search answer.
pub(super) fn hits_of(op: &str, mut body: Value) -> StoreResult<Vec<Value>> {
    // A timed-out or partly failed search may have skipped documents: paging on from its
    // last hit would silently miss them, so the answer is refused as a whole.
    let failed_shards = body
        .pointer("/_shards/failed")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if body["timed_out"] == Value::Bool(true) || failed_shards > 0 {
        return Err(StoreError::Unavailable(format!(
            "{op}: partial results (timed_out={}, failed shards={failed_shards})",
            body["timed_out"]
        )));
    }
    match body.pointer_mut("/hits/hits").map(Value::take) {
        Some(Value::Array(hits)) => Ok(hits),
        _ => Err(StoreError::Permanent(format!(
            "{op}: answer without hits.hits"
        ))),
    }
}

/// Cuts hits into a [`Page`]. Both our sorts are `[<date field>, transaction_id]`, so each
/// hit's `sort` is `[epoch millis, id]`: the cursor to continue after it.
pub(super) fn page_of(op: &str, hits: &[Value], limit: usize) -> StoreResult<Page> {
    let docs = hits
        .iter()
        .map(|hit| doc_of(op, hit))
        .collect::<StoreResult<Vec<_>>>()?;
    let next = match hits.last() {
        Some(last) if docs.len() == limit => Some(sort_key_of(op, last)?),
        _ => None,
    };
    Ok(Page { docs, next })
}

pub(super) fn sort_key_of(op: &str, hit: &Value) -> StoreResult<SortKey> {
    let sort = hit.get("sort").and_then(Value::as_array);
    let millis = sort.and_then(|s| s.first()).and_then(Value::as_i64);
    let id = sort.and_then(|s| s.get(1)).and_then(Value::as_str);
    match (millis, id) {
        (Some(millis), Some(id)) => Ok(SortKey {
            millis,
            id: id.to_owned(),
        }),
        _ => Err(StoreError::Permanent(format!(
            "{op}: hit without a [millis, id] sort value: {:?}",
            hit.get("sort")
        ))),
    }
}

/// The search body shared by both listings: versions included (callers may write on them
/// after a realtime re-read), no total count (nobody reads it; counting costs), a
/// deterministic sort with a unique tie-breaker, and `search_after` for the cursor.
pub(super) fn search_body(
    filter: Vec<Value>,
    should: Vec<Value>,
    sort: Value,
    after: Option<&SortKey>,
    limit: usize,
) -> Value {
    let mut bool_query = Map::new();
    bool_query.insert("filter".into(), Value::Array(filter));
    if !should.is_empty() {
        bool_query.insert("should".into(), Value::Array(should));
        // With a filter present, `should` clauses are optional unless we say otherwise.
        bool_query.insert("minimum_should_match".into(), json!(1));
    }
    let mut body = json!({
        "size": limit,
        "seq_no_primary_term": true,
        "track_total_hits": false,
        "query": { "bool": bool_query },
        "sort": sort,
    });
    if let Some(after) = after {
        body["search_after"] = json!([after.millis, after.id]);
    }
    body
}

/// The search body of an account's entries ([`crate::store::Store::account_entries`]): a
/// `range` on the keyword field `entries` from `<account>/<from:020>` (inclusive) to
/// `<account>/<to:020>` (exclusive), which holds exactly the entry values of that account in
/// that range ([`entries`] says why). A document matches when any of its values does. Sorted
/// on the repeated id, so that a page cut by `limit` is the same on every engine.
pub(super) fn entries_body(query: &EntriesQuery) -> Value {
    let range = json!({"range": {fields::ENTRIES: {
        "gte": entries::bound(&query.account, query.seqs.start),
        "lt": entries::bound(&query.account, query.seqs.end),
    }}});
    let sort = json!([{fields::ID: "asc"}]);
    search_body(vec![range], Vec::new(), sort, None, query.limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entries_body_is_a_range_of_one_account_from_inclusive_to_exclusive() {
        let query = EntriesQuery {
            account: "a.b".into(),
            seqs: 7..12,
            limit: 50,
        };
        let body = entries_body(&query);
        assert_eq!(
            body["query"]["bool"]["filter"],
            json!([{"range": {"entries": {
                "gte": "a.b/00000000000000000007",
                "lt": "a.b/00000000000000000012",
            }}}])
        );
        assert_eq!(body["size"], 50);
        assert_eq!(body["seq_no_primary_term"], true);
    }
}
