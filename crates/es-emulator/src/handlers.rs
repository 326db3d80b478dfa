//! The endpoints. Each takes the decoded request ([`Ctx`]) and answers a response or an
//! [`EsError`]. The cluster lock is only held in synchronous blocks, never across `.await`.

use std::time::Instant;

use axum::response::Response;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::bulk;
use crate::dates;
use crate::errors::{bytes_response, empty_response, json_response, EsError, NODE_ID};
use crate::routes::{Ctx, Params};
use crate::search::{self, SearchRequest, SourceFilter};
use crate::state::{random_id, WriteKind, WriteRequest};
use crate::Shared;

type Answer = Result<Response, EsError>;

/// The `refresh` parameter of writes (§7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefreshPolicy {
    No,
    Now,
    WaitFor,
}

fn refresh_policy(params: &Params) -> Result<RefreshPolicy, EsError> {
    match params.get("refresh") {
        None | Some("false") => Ok(RefreshPolicy::No),
        Some("true" | "") => Ok(RefreshPolicy::Now),
        Some("wait_for") => Ok(RefreshPolicy::WaitFor),
        Some(other) => Err(EsError::illegal_argument(format!(
            "Unknown value for refresh: [{other}]."
        ))),
    }
}

/// A JSON request body; `None` when empty.
fn json_body(body: &[u8]) -> Result<Option<Value>, EsError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(body)
        .map(Some)
        .map_err(|e| EsError::x_content(&e))
}

fn check_pipeline(params: &Params) -> Result<(), EsError> {
    match params.get("pipeline") {
        None | Some("_none") => Ok(()),
        Some("") => Err(EsError::validation(&[
            "pipeline cannot be an empty string".to_owned()
        ])),
        Some(other) => Err(EsError::illegal_argument(format!(
            "pipeline with id [{other}] does not exist"
        ))),
    }
}

fn list_param(params: &Params, name: &str) -> Vec<String> {
    params
        .get(name)
        .map(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `_source`, `_source_includes`, `_source_excludes` as URL parameters.
fn source_params(params: &Params, filter: &mut SourceFilter) {
    match params.get("_source") {
        None => {}
        Some("true") => filter.disabled = false,
        Some("false") => filter.disabled = true,
        Some(_) => filter.includes = list_param(params, "_source"),
    }
    if params.get("_source_includes").is_some() {
        filter.includes = list_param(params, "_source_includes");
    }
    if params.get("_source_excludes").is_some() {
        filter.excludes = list_param(params, "_source_excludes");
    }
}

/// Blocks until every `(index, order)` ([`crate::state::Written::order`]) is searchable
/// (`refresh=wait_for`), following the refresh schedule and waking on explicit refreshes.
async fn wait_until_visible(shared: &Shared, targets: &[(String, u64)]) {
    loop {
        let notified = shared.refreshed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let next = {
            let mut cluster = shared.cluster();
            let default = cluster.default_refresh;
            let now = Instant::now();
            let mut waiting = false;
            let mut next: Option<Instant> = None;
            for (name, order) in targets {
                if let Some(index) = cluster.indices.get_mut(name) {
                    index.catch_up(now, default);
                    if !index.is_visible(*order) {
                        waiting = true;
                        if let Some(at) = index.next_refresh(default) {
                            next = Some(next.map_or(at, |n| n.min(at)));
                        }
                    }
                }
            }
            if !waiting {
                return;
            }
            next
        };
        let tick = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = &mut notified => {}
            _ = tick => {}
            _ = shared.cancel.cancelled() => return,
        }
    }
}

// ---- cluster ---------------------------------------------------------------------------

pub fn info(ctx: &Ctx<'_>) -> Answer {
    ctx.params.check(ctx.path, &[])?;
    let uuid = ctx.shared.cluster().uuid.clone();
    Ok(json_response(
        200,
        &json!({
            "name": NODE_ID,
            "cluster_name": "es-emulator",
            "cluster_uuid": uuid,
            "version": {
                "number": "8.19.21",
                "build_flavor": "default",
                "build_type": "es-emulator (test double)",
                "build_hash": "0000000000000000000000000000000000000000",
                "build_date": "2025-01-01T00:00:00.000Z",
                "build_snapshot": false,
                "lucene_version": "9.12.2",
                "minimum_wire_compatibility_version": "7.17.0",
                "minimum_index_compatibility_version": "7.0.0"
            },
            "tagline": "You Know, for Search"
        }),
    ))
}

pub fn health(ctx: &Ctx<'_>, index: Option<&str>) -> Answer {
    ctx.params.check(
        ctx.path,
        &[
            "wait_for_status",
            "timeout",
            "level",
            "local",
            "master_timeout",
            "wait_for_nodes",
            "wait_for_active_shards",
            "wait_for_events",
            "wait_for_no_relocating_shards",
            "wait_for_no_initializing_shards",
            "expand_wildcards",
        ],
    )?;
    ctx.params.check_expand_wildcards()?;
    ctx.params.refuse_unless("level", &["cluster"])?;
    ctx.params
        .refuse_unless("wait_for_nodes", &["1", ">=1", "<=1", "ge(1)", "le(1)"])?;
    ctx.params
        .refuse_unless("wait_for_active_shards", &["0", "1"])?;
    let cluster = ctx.shared.cluster();
    let names = cluster.resolve(index.unwrap_or("_all"), false)?;
    let indices = || names.iter().filter_map(|n| cluster.indices.get(n));
    let primaries: u64 = indices().map(|i| i.shard_count()).sum();
    let unassigned: u64 = indices().map(|i| i.copies() - i.shard_count()).sum();
    drop(cluster);
    let status = if unassigned > 0 { "yellow" } else { "green" };
    // A stricter wanted status than the current one is answered at once as timed out
    // (Elasticsearch would wait for `timeout` first).
    let rank = |s: &str| ["green", "yellow", "red"].iter().position(|c| *c == s);
    let timed_out = match ctx.params.get("wait_for_status") {
        None => false,
        Some(wanted) => match rank(wanted) {
            Some(wanted) => rank(status).is_some_and(|current| current > wanted),
            None => {
                return Err(EsError::illegal_argument(format!(
                    "unknown cluster health status [{wanted}]"
                )))
            }
        },
    };
    let total = primaries + unassigned;
    let percent = if total == 0 {
        100.0
    } else {
        primaries as f64 * 100.0 / total as f64
    };
    let body = json!({
        "cluster_name": "es-emulator",
        "status": status,
        "timed_out": timed_out,
        "number_of_nodes": 1,
        "number_of_data_nodes": 1,
        "active_primary_shards": primaries,
        "active_shards": primaries,
        "relocating_shards": 0,
        "initializing_shards": 0,
        "unassigned_shards": unassigned,
        "unassigned_primary_shards": 0,
        "delayed_unassigned_shards": 0,
        "number_of_pending_tasks": 0,
        "number_of_in_flight_fetch": 0,
        "task_max_waiting_in_queue_millis": 0,
        "active_shards_percent_as_number": percent,
    });
    Ok(json_response(if timed_out { 408 } else { 200 }, &body))
}

// ---- indices ---------------------------------------------------------------------------

pub fn create_index(ctx: &Ctx<'_>, index: &str) -> Answer {
    ctx.params.check(
        ctx.path,
        &["wait_for_active_shards", "timeout", "master_timeout"],
    )?;
    refuse_more_active_shards(ctx.params)?;
    let body = json_body(ctx.body)?.unwrap_or_else(|| json!({}));
    let answer = ctx
        .shared
        .cluster()
        .create_index(index, &body, Instant::now())?;
    Ok(json_response(200, &answer))
}

const INDEX_READ_PARAMS: [&str; 9] = [
    "allow_no_indices",
    "expand_wildcards",
    "ignore_unavailable",
    "flat_settings",
    "include_defaults",
    "local",
    "master_timeout",
    "features",
    "timeout",
];

/// `GET|HEAD /{index}` parameters: those that reshape the answer are not implemented.
fn check_index_read(ctx: &Ctx<'_>) -> Result<(), EsError> {
    ctx.params.check(ctx.path, &INDEX_READ_PARAMS)?;
    ctx.params.check_expand_wildcards()?;
    ctx.params.refuse_unless("flat_settings", &["false"])?;
    ctx.params.refuse_unless("include_defaults", &["false"])?;
    ctx.params.refuse_unless("features", &[])
}

pub fn index_exists(ctx: &Ctx<'_>, index: &str) -> Answer {
    check_index_read(ctx)?;
    let found = match ctx.shared.cluster().resolve(index, false) {
        Ok(names) => !names.is_empty(),
        Err(missing) if missing.status == 404 => false,
        // An invalid name is a 400 (its body is dropped, as for every HEAD).
        Err(invalid) => return Err(invalid),
    };
    Ok(empty_response(if found { 200 } else { 404 }))
}

pub fn get_index(ctx: &Ctx<'_>, index: &str) -> Answer {
    check_index_read(ctx)?;
    let ignore = ctx.params.bool("ignore_unavailable")?.unwrap_or(false);
    let cluster = ctx.shared.cluster();
    let mut out = Map::new();
    for name in cluster.resolve(index, ignore)? {
        if let Some(Value::Object(described)) = cluster.indices.get(&name).map(|i| i.describe()) {
            out.extend(described);
        }
    }
    Ok(json_response(200, &Value::Object(out)))
}

/// `PUT|POST /{index}/_mapping` (§8): adds fields to every named index, or to none when one
/// of them refuses the update.
pub fn put_mapping(ctx: &Ctx<'_>, index: &str) -> Answer {
    let ignore = ctx
        .params
        .check_multi_target(ctx.path, &["master_timeout", "timeout", "write_index_only"])?;
    ctx.params.refuse_unless("write_index_only", &["false"])?;
    let body = json_body(ctx.body)?.ok_or_else(|| EsError::parse("request body is required"))?;
    let mut cluster = ctx.shared.cluster();
    let names = cluster.resolve(index, ignore)?;
    let mut merged = Vec::with_capacity(names.len());
    for name in &names {
        merged.push(cluster.indices[name].mapping.merge(&body)?);
    }
    for (name, mapping) in names.iter().zip(merged) {
        if let Some(state) = cluster.indices.get_mut(name) {
            state.mapping = mapping;
        }
    }
    Ok(json_response(200, &json!({"acknowledged": true})))
}

/// `GET /{index}/_mapping` (§8): `{"<index>": {"mappings": {...}}}` for every named index.
pub fn get_mapping(ctx: &Ctx<'_>, index: &str) -> Answer {
    let ignore = ctx
        .params
        .check_multi_target(ctx.path, &["local", "master_timeout"])?;
    let cluster = ctx.shared.cluster();
    let mut out = Map::new();
    for name in cluster.resolve(index, ignore)? {
        if let Some(state) = cluster.indices.get(&name) {
            out.insert(name, json!({"mappings": state.mapping.shown()}));
        }
    }
    Ok(json_response(200, &Value::Object(out)))
}

pub fn delete_index(ctx: &Ctx<'_>, index: &str) -> Answer {
    ctx.params.check(
        ctx.path,
        &[
            "allow_no_indices",
            "expand_wildcards",
            "ignore_unavailable",
            "master_timeout",
            "timeout",
        ],
    )?;
    if index.contains('*') || index.split(',').any(|p| p == "_all") {
        return Err(EsError::illegal_argument(
            "Wildcard expressions or all indices are not allowed",
        ));
    }
    let ignore = ctx.params.bool("ignore_unavailable")?.unwrap_or(false);
    let mut cluster = ctx.shared.cluster();
    for name in cluster.resolve(index, ignore)? {
        cluster.indices.remove(&name);
    }
    Ok(json_response(200, &json!({"acknowledged": true})))
}

pub fn refresh(ctx: &Ctx<'_>, index: Option<&str>) -> Answer {
    let ignore = ctx.params.check_multi_target(ctx.path, &[])?;
    let allow_none = ctx.params.bool("allow_no_indices")?.unwrap_or(true);
    let now = Instant::now();
    let mut cluster = ctx.shared.cluster();
    let expression = index.unwrap_or("_all");
    let names = cluster.resolve(expression, ignore)?;
    if names.is_empty() && !allow_none {
        return Err(EsError::index_not_found(expression));
    }
    let capacity = cluster.capacity;
    let (mut total, mut successful) = (0, 0);
    for name in &names {
        if let Some(state) = cluster.indices.get_mut(name) {
            state.occupy_every_shard(capacity, &ctx.answer_at);
            state.refresh(now);
            total += state.copies();
            successful += state.shard_count();
        }
    }
    drop(cluster);
    ctx.shared.refreshed.notify_waiters();
    Ok(json_response(
        200,
        &json!({"_shards": {"total": total, "successful": successful, "failed": 0}}),
    ))
}

/// `GET /{index}/_stats[/{metric}]`: only `level=shards` answers what a caller reads (each
/// copy's routing, checkpoints and term); the index and total levels, which the service never
/// asks for, are refused rather than answered half.
pub fn stats(ctx: &Ctx<'_>, index: &str, metric: Option<&str>) -> Answer {
    ctx.params.check(ctx.path, &["level"])?;
    ctx.params.refuse_unless("level", &["shards"])?;
    if ctx.params.get("level").is_none() {
        return Err(EsError::unsupported("_stats without level=shards"));
    }
    if metric.is_some_and(|m| m != "docs") {
        return Err(EsError::unsupported("_stats of a metric other than docs"));
    }
    let mut cluster = ctx.shared.cluster();
    let capacity = cluster.capacity;
    let state = cluster.index(index, Instant::now())?;
    state.occupy_every_shard(capacity, &ctx.answer_at);
    let shards = json!({"total": state.copies(), "successful": state.shard_count(), "failed": 0});
    Ok(json_response(
        200,
        &json!({
            "_shards": shards,
            "indices": {index: {"uuid": state.uuid, "shards": state.shard_stats()}},
        }),
    ))
}

// ---- documents -------------------------------------------------------------------------

#[derive(Serialize)]
struct GetOut<'a> {
    _index: &'a str,
    _id: &'a str,
    _version: u64,
    _seq_no: i64,
    _primary_term: u64,
    found: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    _source: Option<Box<RawValue>>,
}

pub fn get_doc(ctx: &Ctx<'_>, index: &str, id: &str) -> Answer {
    ctx.params.check(
        ctx.path,
        &[
            "realtime",
            "refresh",
            "routing",
            "preference",
            "_source",
            "_source_includes",
            "_source_excludes",
            "stored_fields",
            "version",
            "version_type",
        ],
    )?;
    ctx.params.refuse_unless("stored_fields", &[])?;
    ctx.params.refuse_unless("version_type", &["internal"])?;
    let realtime = ctx.params.bool("realtime")?.unwrap_or(true);
    let refresh = ctx.params.bool("refresh")?.unwrap_or(false);
    let version = ctx.params.long("version")?;
    let mut filter = SourceFilter::default();
    source_params(ctx.params, &mut filter);
    let now = Instant::now();
    let doc = {
        let mut cluster = ctx.shared.cluster();
        let capacity = cluster.capacity;
        let state = cluster.index(index, now)?;
        state.refuse_custom_routing(ctx.params.get("routing"))?;
        state.occupy_shard_of(id, capacity, &ctx.answer_at);
        if refresh {
            state.refresh(now);
        }
        let doc = if realtime {
            state.live(id)
        } else {
            state.searchable(id)
        };
        (doc.cloned(), state.uuid.clone(), state.shard_of(id))
    };
    if refresh {
        ctx.shared.refreshed.notify_waiters();
    }
    let (doc, uuid, shard) = doc;
    let Some(doc) = doc else {
        return Ok(json_response(
            404,
            &json!({"_index": index, "_id": id, "found": false}),
        ));
    };
    if let Some(wanted) = version {
        if doc.version as i64 != wanted {
            return Err(EsError::conflict(
                format!(
                    "[{id}]: version conflict, current version [{}] is different than the one provided [{wanted}]",
                    doc.version
                ),
                index,
                &uuid,
                shard,
            ));
        }
    }
    let out = GetOut {
        _index: index,
        _id: id,
        _version: doc.version,
        _seq_no: doc.seq_no,
        _primary_term: doc.primary_term,
        found: true,
        _source: search::filter_source(&doc.raw, &doc.source, &filter),
    };
    let bytes =
        serde_json::to_vec(&out).map_err(|e| EsError::new(500, "exception", e.to_string()))?;
    Ok(bytes_response(200, bytes))
}

fn cas_params(params: &Params) -> Result<(Option<i64>, Option<u64>), EsError> {
    let if_seq_no = params.long("if_seq_no")?;
    let if_primary_term = params
        .long("if_primary_term")?
        .map(|t| {
            u64::try_from(t).map_err(|_| {
                EsError::illegal_argument(format!("primary term must be non negative. got [{t}]."))
            })
        })
        .transpose()?;
    bulk::check_seq_no(if_seq_no)?;
    Ok((if_seq_no, if_primary_term))
}

/// `wait_for_active_shards` above one copy: a one-node cluster never has the replicas, so
/// Elasticsearch would wait for the timeout; the emulator refuses instead.
fn refuse_more_active_shards(params: &Params) -> Result<(), EsError> {
    params.refuse_unless("wait_for_active_shards", &["0", "1"])
}

/// Write parameters that change what is stored or checked, which the emulator does not
/// model: a custom `routing` (stored as `_routing`), `require_alias` (there are no aliases),
/// `require_data_stream` (no data streams), `list_executed_pipelines` (no pipelines).
fn refuse_unmodelled_write_params(params: &Params) -> Result<(), EsError> {
    params.refuse_unless("routing", &[""])?;
    for flag in [
        "require_alias",
        "require_data_stream",
        "list_executed_pipelines",
    ] {
        params.refuse_unless(flag, &["false"])?;
    }
    refuse_more_active_shards(params)
}

fn reject_external_versioning(params: &Params) -> Result<(), EsError> {
    if params.get("version").is_some() || params.get("version_type").is_some() {
        return Err(EsError::unsupported("version / version_type on writes"));
    }
    Ok(())
}

/// `PUT|POST /{i}/_doc/{id}`, `POST /{i}/_doc`, `PUT|POST /{i}/_create/{id}` (§1, §3).
pub async fn write_doc(ctx: &Ctx<'_>, index: &str, id: Option<&str>, create_route: bool) -> Answer {
    let allowed: Vec<&str> = DOC_WRITE_PARAMS
        .into_iter()
        .chain([
            "op_type",
            "pipeline",
            "require_alias",
            "require_data_stream",
            "include_source_on_error",
        ])
        .collect();
    ctx.params.check(ctx.path, &allowed)?;
    let op_type = ctx.params.get("op_type");
    let kind = match (create_route, op_type) {
        (true, None | Some("create")) => WriteKind::Create,
        (true, Some(other)) => {
            return Err(EsError::illegal_argument(format!(
                "opType must be 'create', found: [{other}]"
            )))
        }
        (false, None | Some("index")) => WriteKind::Index,
        (false, Some("create")) => WriteKind::Create,
        (false, Some(other)) => {
            return Err(EsError::illegal_argument(format!(
                "opType must be 'create' or 'index', found: [{other}]"
            )))
        }
    };
    reject_external_versioning(ctx.params)?;
    refuse_unmodelled_write_params(ctx.params)?;
    check_pipeline(ctx.params)?;
    let (if_seq_no, if_primary_term) = cas_params(ctx.params)?;
    let refresh = refresh_policy(ctx.params)?;
    if ctx.body.iter().all(u8::is_ascii_whitespace) {
        return Err(EsError::parse("request body is required"));
    }
    validate_doc_write(kind, index, id, (if_seq_no, if_primary_term))?;
    let source = bulk::parse_source(ctx.body)?;
    let request = WriteRequest {
        kind,
        id: id.map_or_else(|| random_id(20), str::to_owned),
        source: Some(source),
        if_seq_no,
        if_primary_term,
    };
    write_one(ctx, index, request, refresh).await
}

/// The parameters every single-document write takes (§1, §5).
const DOC_WRITE_PARAMS: [&str; 8] = [
    "if_seq_no",
    "if_primary_term",
    "refresh",
    "routing",
    "timeout",
    "version",
    "version_type",
    "wait_for_active_shards",
];

/// Refuses a single-document write as a bulk item's checks would.
fn validate_doc_write(
    kind: WriteKind,
    index: &str,
    id: Option<&str>,
    (if_seq_no, if_primary_term): (Option<i64>, Option<u64>),
) -> Result<(), EsError> {
    let messages = bulk::validate_write(kind, Some(index), id, if_seq_no, if_primary_term, true);
    if !messages.is_empty() {
        return Err(EsError::validation(&messages));
    }
    Ok(())
}

/// Applies one document write to `index` (created by an index or create; a delete refuses a
/// custom routing), occupying its shard, refreshing at once for `refresh=true`, and answers
/// once `refresh` is honoured.
async fn write_one(
    ctx: &Ctx<'_>,
    index: &str,
    request: WriteRequest,
    refresh: RefreshPolicy,
) -> Answer {
    let now = Instant::now();
    let id = request.id.clone();
    let (status, body, order) = {
        let mut cluster = ctx.shared.cluster();
        let capacity = cluster.capacity;
        let state = if request.kind == WriteKind::Delete {
            let state = cluster.index(index, now)?;
            state.refuse_custom_routing(ctx.params.get("routing"))?;
            state
        } else {
            cluster.index_for_write(index, now)?
        };
        state.occupy_shard_of(&id, capacity, &ctx.answer_at);
        let written = state.apply(request, now)?;
        let forced = (refresh == RefreshPolicy::Now).then(|| {
            state.refresh(now);
            true
        });
        let body = bulk::write_body(index, &id, &written, state.shards(), forced);
        (written.status, body, written.order)
    };
    honour_refresh(ctx, refresh, &[(index.to_owned(), order)]).await;
    Ok(json_response(status, &Value::Object(body)))
}

/// What `refresh` asks once the writes are applied: a forced refresh wakes the requests
/// waiting for one; `wait_for` waits until the writes (`(index, order)`) are visible.
async fn honour_refresh(ctx: &Ctx<'_>, refresh: RefreshPolicy, written: &[(String, u64)]) {
    match refresh {
        RefreshPolicy::Now => ctx.shared.refreshed.notify_waiters(),
        RefreshPolicy::WaitFor => wait_until_visible(ctx.shared, written).await,
        RefreshPolicy::No => {}
    }
}

/// `DELETE /{i}/_doc/{id}` (§5).
pub async fn delete_doc(ctx: &Ctx<'_>, index: &str, id: &str) -> Answer {
    ctx.params.check(ctx.path, &DOC_WRITE_PARAMS)?;
    reject_external_versioning(ctx.params)?;
    refuse_more_active_shards(ctx.params)?;
    let (if_seq_no, if_primary_term) = cas_params(ctx.params)?;
    let refresh = refresh_policy(ctx.params)?;
    validate_doc_write(
        WriteKind::Delete,
        index,
        Some(id),
        (if_seq_no, if_primary_term),
    )?;
    let request = WriteRequest {
        kind: WriteKind::Delete,
        id: id.to_owned(),
        source: None,
        if_seq_no,
        if_primary_term,
    };
    write_one(ctx, index, request, refresh).await
}

/// `POST /_bulk`, `POST /{i}/_bulk` (§6).
pub async fn bulk(ctx: &Ctx<'_>, index: Option<&str>) -> Answer {
    ctx.params.check(
        ctx.path,
        &[
            "refresh",
            "routing",
            "timeout",
            "wait_for_active_shards",
            "pipeline",
            "require_alias",
            "require_data_stream",
            "_source",
            "_source_includes",
            "_source_excludes",
            "list_executed_pipelines",
            "include_source_on_error",
        ],
    )?;
    refuse_unmodelled_write_params(ctx.params)?;
    check_pipeline(ctx.params)?;
    let refresh = refresh_policy(ctx.params)?;
    let items = bulk::parse(ctx.body, index)?;
    let now = Instant::now();
    let forced = (refresh == RefreshPolicy::Now).then_some(true);
    let mut results = Vec::with_capacity(items.len());
    let mut errors = false;
    let mut written: Vec<(String, u64)> = Vec::new();
    {
        let mut cluster = ctx.shared.cluster();
        for item in items {
            if let Some(denied) = ctx
                .principal
                .and_then(|p| p.check_bulk_item(item.action, &item.index).err())
            {
                errors = true;
                results.push(bulk::denied_item(&item, &denied));
                continue;
            }
            let result = bulk::apply_item(&mut cluster, item, now, forced, &ctx.answer_at);
            errors |= result.failed;
            if let Some((name, order)) = result.written {
                match written.iter_mut().find(|(n, _)| *n == name) {
                    Some(entry) => entry.1 = entry.1.max(order),
                    None => written.push((name, order)),
                }
            }
            results.push(result.json);
        }
        if refresh == RefreshPolicy::Now {
            for (name, _) in &written {
                if let Some(state) = cluster.indices.get_mut(name) {
                    state.refresh(now);
                }
            }
        }
    }
    honour_refresh(ctx, refresh, &written).await;
    Ok(json_response(
        200,
        &json!({"errors": errors, "took": ctx.took(), "items": results}),
    ))
}

// ---- search ----------------------------------------------------------------------------

const SEARCH_PARAMS: [&str; 27] = [
    "size",
    "from",
    "sort",
    "seq_no_primary_term",
    "version",
    "track_total_hits",
    "track_scores",
    "_source",
    "_source_includes",
    "_source_excludes",
    "rest_total_hits_as_int",
    "ignore_unavailable",
    "allow_no_indices",
    "expand_wildcards",
    "typed_keys",
    "request_cache",
    "preference",
    "routing",
    "timeout",
    "batched_reduce_size",
    "ccs_minimize_roundtrips",
    "pre_filter_shard_size",
    "max_concurrent_shard_requests",
    "allow_partial_search_results",
    "search_type",
    "ignore_throttled",
    "explain",
];

/// The search parameters of a query given in the URL (`q`, with what tunes it), which the
/// emulator knows but does not implement.
const URL_QUERY_PARAMS: [&str; 6] = [
    "q",
    "df",
    "analyzer",
    "default_operator",
    "lenient",
    "terminate_after",
];

/// Resolves the searched indices, runs their scheduled refreshes, and occupies each of their
/// shards for one operation in the capacity model.
fn searched_indices(
    ctx: &Ctx<'_>,
    cluster: &mut crate::state::Cluster,
    index: Option<&str>,
    now: Instant,
) -> Result<Vec<String>, EsError> {
    let expression = index.unwrap_or("_all");
    let ignore = ctx.params.bool("ignore_unavailable")?.unwrap_or(false);
    let allow_none = ctx.params.bool("allow_no_indices")?.unwrap_or(true);
    let names = cluster.resolve(expression, ignore)?;
    if names.is_empty() && !allow_none {
        return Err(EsError::index_not_found(expression));
    }
    let capacity = cluster.capacity;
    for name in &names {
        let state = cluster.index(name, now)?;
        state.refuse_custom_routing(ctx.params.get("routing"))?;
        state.occupy_every_shard(capacity, &ctx.answer_at);
    }
    Ok(names)
}

pub fn search(ctx: &Ctx<'_>, index: Option<&str>) -> Answer {
    let params = ctx.params;
    let allowed: Vec<&str> = SEARCH_PARAMS.into_iter().chain(URL_QUERY_PARAMS).collect();
    params.check(ctx.path, &allowed)?;
    params.check_expand_wildcards()?;
    params.refuse_unless("explain", &["false"])?;
    for unsupported in URL_QUERY_PARAMS {
        if params.get(unsupported).is_some() {
            return Err(EsError::unsupported(&format!(
                "search URL parameter {unsupported}"
            )));
        }
    }
    let mut request = SearchRequest::default();
    if let Some(body) = json_body(ctx.body)? {
        search::parse_body(&body, &mut request)?;
    }
    if let Some(size) = params.long("size")? {
        request.size = size;
    }
    if let Some(from) = params.long("from")? {
        request.from = from;
    }
    if let Some(sort) = params.get("sort") {
        request.sort = search::parse_sort_param(sort)?;
    }
    if let Some(v) = params.bool("seq_no_primary_term")? {
        request.seq_no_primary_term = v;
    }
    if let Some(v) = params.bool("version")? {
        request.version = v;
    }
    if let Some(v) = params.bool("track_scores")? {
        request.track_scores = v;
    }
    if let Some(v) = params.get("track_total_hits") {
        request.track_total = search::parse_track_total(&json!(v))?;
    }
    if let Some(v) = params.bool("rest_total_hits_as_int")? {
        request.total_as_int = v;
    }
    source_params(params, &mut request.source);
    let now = Instant::now();
    let mut cluster = ctx.shared.cluster();
    let names = searched_indices(ctx, &mut cluster, index, now)?;
    let bytes = search::execute(&cluster, &names, &request, dates::now_millis(), ctx.took())?;
    Ok(bytes_response(200, bytes))
}

pub fn count(ctx: &Ctx<'_>, index: Option<&str>) -> Answer {
    ctx.params.check(
        ctx.path,
        &[
            "ignore_unavailable",
            "allow_no_indices",
            "expand_wildcards",
            "preference",
            "routing",
            "q",
            "terminate_after",
            "min_score",
        ],
    )?;
    ctx.params.check_expand_wildcards()?;
    for unsupported in ["q", "terminate_after", "min_score"] {
        if ctx.params.get(unsupported).is_some() {
            return Err(EsError::unsupported(&format!(
                "_count URL parameter {unsupported}"
            )));
        }
    }
    let mut query = crate::query::Query::MatchAll { boost: 1.0 };
    if let Some(body) = json_body(ctx.body)? {
        let Value::Object(map) = &body else {
            return Err(EsError::parsing("request body must be an object"));
        };
        for (key, value) in map {
            match key.as_str() {
                "query" => query = crate::query::parse(value)?,
                other => {
                    return Err(EsError::parsing(format!(
                        "request does not support [{other}]"
                    )))
                }
            }
        }
    }
    let now = Instant::now();
    let mut cluster = ctx.shared.cluster();
    let names = searched_indices(ctx, &mut cluster, index, now)?;
    let body = search::count(&cluster, &names, &query, dates::now_millis())?;
    Ok(json_response(200, &body))
}
