//! **es-emulator: a TEST DOUBLE of Elasticsearch**, not Elasticsearch. It serves, in memory,
//! the subset of the Elasticsearch 8.x REST API that the service's Elasticsearch backend
//! (`src/store/elasticsearch.rs` of `transfer-service`) uses, with the status codes and bodies
//! documented in the service's `docs/elasticsearch.md` (the §-numbers below refer to it). Where
//! it and a real cluster disagree, the real cluster is right and this emulator is the bug.
//!
//! A workspace crate of its own, compiled once: the service's tests use it in-process
//! ([`spawn`]), and its binary runs it as a separate process:
//! `cargo run -p es-emulator -- --listen 127.0.0.1:9200 [--refresh-interval 1s|-1]
//! [--shard-op-cost 300us]`.
//!
//! # Implemented
//! - §0 every response carries `X-elastic-product: Elasticsearch`; write bodies
//!   (`_index`, `_id`, `_version`, `result`, `_shards`, `_seq_no`, `_primary_term`,
//!   `forced_refresh` when `refresh=true`); `_shards` of a write `{"total":1+replicas,
//!   "successful":1,"failed":0}` (its shard's copies), of a refresh or `_stats`
//!   `shards × (1+replicas)` and `shards`, of a search or `_count` every primary searched;
//!   error envelopes with `root_cause`, shard meta (`index_uuid`, `shard` of the document,
//!   `index`) and `resource.type`/`resource.id`; `Validation Failed: 1: …;` messages.
//! - §1 create (`PUT|POST /{i}/_create/{id}`, `op_type=create`): 201, 409 "document already
//!   exists (current version \[v\])", re-create after delete continues the tombstone's version,
//!   create + `if_seq_no` and `/_create?op_type=index` refused, ids over 512 bytes and empty
//!   ids refused, auto-creation of missing indices (index, create, bulk; not delete).
//! - §2 realtime GET (`found:true|false`, 404 `index_not_found_exception` with resource meta),
//!   `realtime=false` (refreshed view only), `refresh=true`, `version=N` precondition (409),
//!   `_source`/`_source_includes`/`_source_excludes`, `HEAD` for existence.
//! - §3 index with and without `if_seq_no`+`if_primary_term`: 201 created / 200 updated,
//!   `_version+1` on every write, the two CAS reason strings verbatim, parameter validation.
//! - §5 delete: 200 deleted, 404 `not_found` write body that still consumes a `_seq_no`, CAS,
//!   no auto-create. Tombstones keep the version for `index.gc_deletes` (default 60s) and are
//!   pruned on a refresh after that. A delete of an absent id also leaves a tombstone (so a
//!   later create gets `_version:2`), as Elasticsearch's version map does.
//! - §6 `_bulk` and `/{i}/_bulk`: NDJSON (`index` with CAS, `create`, `delete`; `update`
//!   answers its item with a 400 "not implemented"), per-item results in order with `status`,
//!   `errors`, sequential application, `?refresh=`. Failures are the request's or one item's
//!   as in Elasticsearch: a missing final newline, a malformed action line, an unknown action
//!   parameter and what `BulkRequest.validate()` collects (ids over 512 bytes, CAS on `create`,
//!   half a CAS pair, a delete without an id) refuse the whole request with nothing applied;
//!   an empty `_id` on `index`/`create` (`illegal_argument_exception`), a missing index of a
//!   delete, a bad source or a conflict fail their item alone while the others apply.
//! - §7 `_search` (`GET|POST /_search`, `/{i,j,pattern*}/_search`, `ignore_unavailable`):
//!   `query` `match_all`, `match_none`, `term`, `terms`, `range` (long, double, keyword and
//!   date fields; RFC 3339 / epoch-millis / `"format":"epoch_millis"`; date math `now-2m`,
//!   `now/d`, `date||+1M` with the gt/gte/lt/lte rounding rules, partial dates rounded up for
//!   gt/lte), `exists`, `ids`, `bool` (`must`/`filter`/`should`/`must_not`,
//!   `minimum_should_match` as number or percentage), `constant_score`; `sort` (`"f"`,
//!   `{"f":"asc"}`, `{"f":{"order","missing","unmapped_type","mode","format"}}`, `_score`,
//!   `_doc`; dates sort as epoch-millis longs; missing values last, as Elasticsearch's
//!   `Long.MAX_VALUE`/`MIN_VALUE` sentinels for numeric fields and `null` for keywords; errors
//!   for unmapped, `text` and `_id` sort fields), `search_after` (strictly after, checked
//!   against the sort), `from`/`size` (default 10, `from+size ≤ max_result_window`),
//!   `seq_no_primary_term` and `version` (body or URL), `track_total_hits` (`eq`/`gte`/omitted),
//!   `track_scores`, `_source` filtering, `rest_total_hits_as_int`; `_score`/`max_score` null
//!   with a field sort. Also `_count`.
//! - Near-real-time (§7): searches and `realtime=false` GETs see each index as of its last
//!   refresh. Refreshes happen every `refresh_interval` on the wall clock (index setting,
//!   else [`EmulatorConfig::refresh_interval`]; computed lazily on access, each scheduled
//!   refresh exposing only the writes made before its tick), on `POST|GET /_refresh` and
//!   `/{i,j}/_refresh`, and on writes with `refresh=true`. `refresh=wait_for` blocks until a
//!   refresh shows the write (forever with refreshes disabled and nobody refreshing).
//! - §8 `PUT /{i}` with `settings` (flat, nested under `index`, or dotted: `number_of_shards`
//!   (1 to 1,024) and `number_of_routing_shards` (refused, in Elasticsearch's words, below 1,
//!   below the shard count or not a multiple of it; not shown by `GET /{i}`, as in
//!   Elasticsearch), `number_of_replicas`, `refresh_interval` (`1s`, `-1`…), `gc_deletes`,
//!   `max_result_window`; unknown settings refused) and `mappings` (`properties` with types,
//!   multi-fields, `dynamic` true/false/strict, `enabled:false`, date `format`); documents are
//!   checked against the mapping (`document_parsing_exception`,
//!   `strict_dynamic_mapping_exception`) and new fields are mapped dynamically (strings →
//!   `text` + `.keyword`, or `date` when they look like one). 400
//!   `resource_already_exists_exception` and `invalid_index_name_exception`. `HEAD /{i}` 200/404
//!   with an empty body, `GET /{i}`, `DELETE /{i}`.
//! - §8 `PUT|POST /{i}/_mapping` adding fields (`{"acknowledged":true}`; the same addition
//!   again is a no-op; 404 `index_not_found_exception` for a missing index, which it does not
//!   create; 400 `illegal_argument_exception` "mapper \[f\] cannot be changed from type \[a\] to
//!   \[b\]", nothing applied), and `GET /{i}/_mapping`. As in Elasticsearch, documents stored
//!   before a field was mapped are not indexed for it until written again (each document
//!   remembers the mapping generation it was indexed with).
//! - **Shards** (module `state`): a document lives on the shard its id routes to by the
//!   engines' own rule (crate `es_routing`, checked against Elasticsearch and OpenSearch by
//!   the service's differential test). §10/§11 `_seq_no` per shard from 0, +1 per applied op
//!   (not for conflicts or failed items; a delete of an absent id counts on its shard),
//!   `_primary_term` 1 per shard, `_version` per document. `GET /{i}/_stats[/docs]?level=shards`
//!   reports every shard (`"0"` … `"N-1"`) with its one copy: started primary, `docs.count`,
//!   `max_seq_no` = local = global checkpoint, `retention_leases.primary_term`. Searches,
//!   sorts, `search_after`, refreshes and the near-real-time view run over all shards at
//!   once and answer the same whatever the shard count, but for `_seq_no` (ties are broken
//!   by the index-wide order of writes, the `_seq_no` order on one shard). `_cluster/health`
//!   counts every shard.
//! - **The capacity model** (module `capacity`, [`RunningEmulator::set_shard_op_cost`],
//!   [`serve_with_shard_op_cost`], `--shard-op-cost`; off by default): each shard a server
//!   of bounded capacity, on which every operation (a bulk item, a document write or get;
//!   one unit per shard for a search, `_count`, refresh or `_stats`) takes the set cost, one
//!   at a time, shards in parallel; a request answers when its last operation is served. It
//!   sleeps rather than spins, so it costs no CPU, and answers within about 0.1 ms of the
//!   reservation's end (a thread parked until the next one, not tokio's millisecond timer).
//!   [`RunningEmulator::shard_operations`] counts what it served and
//!   [`RunningEmulator::request_time`] adds up the requests' times (their mean concurrency).
//!   A model of per-shard serialization, for measuring how a client scales with shards, not
//!   of a real engine's costs.
//! - `GET|HEAD /` (cluster info, `version.number` 8.19.21: the version the service's
//!   differential test compares the emulator with), `GET /_cluster/health` (`green`, or
//!   `yellow` while some index has replicas, which a one-node cluster cannot assign; a stricter
//!   `wait_for_status` answers 408 at once instead of waiting).
//! - Failure injection for tests: [`RunningEmulator::fail_next`],
//!   [`RunningEmulator::set_unavailable`]; request counters.
//! - §12 optional security ([`EmulatorConfig::security`], module `security`): API keys and
//!   basic users with cluster and index privileges; 401 with Elasticsearch's
//!   `security_exception` and `WWW-Authenticate` challenges; 403 naming the action, the
//!   indices and the privileges that would grant it (per request, and per `_bulk` item); keys
//!   invalidated or re-granted while running ([`RunningEmulator::invalidate_api_key`],
//!   [`RunningEmulator::set_api_key_grant`]). Optional HTTPS with a given certificate
//!   ([`EmulatorConfig::tls`]).
//! - Wrong method on a known path: 405 with Elasticsearch's plain-string `error` and `Allow`;
//!   paths no handler matches: 400 with a plain-string `error` "no handler found for uri" (a
//!   first segment starting with `_` that is no API is an index name, refused with
//!   `invalid_index_name_exception`); known Elasticsearch APIs this double lacks and
//!   unrecognized URL parameters: 400 `illegal_argument_exception`; malformed JSON: 400
//!   `x_content_parse_exception`, or `x_content_e_o_f_exception` for a body cut short
//!   (request bodies, bulk action lines), or `document_parsing_exception` (document sources);
//!   `root_cause` is the deepest Elasticsearch exception of the chain, as
//!   `ElasticsearchException.guessRootCauses` computes it; bodies up to 100 MiB (413 beyond).
//! - Mappings are shown as given, except `dynamic`, which Elasticsearch prints as a string.
//! - `filter_path` on every answer (module `filter_path`): inclusion patterns with `*` and
//!   `**`, arrays transparent, `{}` when nothing is kept; error envelopes are never
//!   filtered, as in Elasticsearch.
//!
//! # Not implemented
//! - §4 the `_update` API and bulk `update` (400), §9 ingest pipelines and stored scripts (a
//!   `pipeline` other than `_none` is refused as "does not exist", which is what a cluster
//!   without pipelines answers), `index.default_pipeline`.
//! - The **search-idle exception** of §7: with the default interval, background refreshes
//!   never stop, so a search never triggers a refresh by itself.
//! - Relevance scoring: every matching scoring clause scores `1.0 × boost` (no BM25); an
//!   empty `bool` is a `match_all`. Full-text queries (`match`, `query_string`, …),
//!   aggregations, highlighting, scroll, PIT, `_mget`, `_msearch`, aliases, templates,
//!   external versioning (`version`/`version_type` on writes) and `filter_path` exclusions
//!   (`-field`) answer 400 "not implemented".
//! - Parameters, settings and mapping options are accepted only with values that change
//!   nothing on a one-node cluster (`timeout`, `master_timeout`, `preference`,
//!   `pretty`, `wait_for_active_shards` of 0 or 1, `routing` of reads and deletes, `blocks.*`
//!   false, …). Values that would change the answer — a custom `routing` on a write (stored
//!   as `_routing`), `require_alias`/`require_data_stream`/`list_executed_pipelines` true,
//!   `dynamic_templates`, `stored_fields`, `flat_settings`, `include_defaults`, `features`,
//!   `explain`, `expand_wildcards` without `open`, health `level` other than `cluster` or
//!   `wait_for_nodes` above 1, index blocks, hidden indices, `auto_expand_replicas`, and root
//!   mapping options other than the defaults (`_source`, `_routing`, `numeric_detection`,
//!   `subobjects`, `dynamic_date_formats`), and `PUT _mapping` with anything but new
//!   `properties` (root options, changed parameters of a mapped field, a field turned into an
//!   object or back, `write_index_only=true`) — answer 400 "not implemented by es-emulator".
//! - No real replicas, and so no copy that lags; no shard limit of the cluster
//!   (`cluster.max_shards_per_node`: Elasticsearch refuses an index whose copies would take a
//!   one-node cluster past 1,000 shards, the emulator accepts up to 1,024 primaries); docs
//!   `deleted` always 0 in `_stats`; shard-level search failures name shard 0. UTC only, no `Content-Type`
//!   enforcement beyond refusing non-JSON types (406), no circuit breakers or real
//!   back-pressure (use `fail_next`). `_cluster/health/{index}` of a missing index is a 404
//!   instead of a wait. Text fields are analyzed by a crude lower-case/non-alphanumeric split.
//! - Duplicate keys in a source are not refused (the last one wins for queries).

mod bulk;
mod capacity;
pub mod dates;
mod errors;
mod filter_path;
mod handlers;
mod mapping;
mod query;
mod routes;
mod search;
pub mod security;
mod state;
mod tls;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use security::{ApiKey, Grant, IndexGrant, SecurityConfig, User};
pub use tls::TlsConfig;

/// How the emulator behaves.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    /// `refresh_interval` of indices that do not set one. `None` is `-1`: only explicit
    /// refreshes (`_refresh`, `refresh=true`) make writes searchable.
    pub refresh_interval: Option<Duration>,
    /// `Some`: security on, only these credentials are accepted (`security` module). `None`:
    /// security off, as `xpack.security.enabled: false`.
    pub security: Option<SecurityConfig>,
    /// `Some`: serve HTTPS with this certificate instead of HTTP.
    pub tls: Option<TlsConfig>,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig {
            refresh_interval: Some(Duration::from_secs(1)),
            security: None,
            tls: None,
        }
    }
}

/// The request kinds counted by [`RunningEmulator::request_count_of`].
pub const KINDS: [&str; 10] = [
    "bulk", "get", "search", "index", "create", "delete", "refresh", "indices", "info", "other",
];

#[derive(Debug, Default)]
struct Faults {
    unavailable: bool,
    status: u16,
    remaining: usize,
}

/// State shared by the request handlers of one emulator.
#[derive(Debug)]
pub struct Shared {
    cluster: Mutex<state::Cluster>,
    /// Woken on every explicit refresh (for `refresh=wait_for`).
    pub refreshed: Notify,
    faults: Mutex<Faults>,
    total: AtomicU64,
    per_kind: [AtomicU64; KINDS.len()],
    /// Cancelled when the emulator stops; ends pending `wait_for` waits.
    pub cancel: CancellationToken,
    /// Set when security is on.
    pub security: Option<security::Security>,
    /// How requests wait for their answers in the capacity model.
    wake: capacity::Wake,
    /// Shard operations served in the capacity model ([`RunningEmulator::shard_operations`]).
    shard_operations: AtomicU64,
    /// Every request's time from arrival to answer, added up ([`RunningEmulator::request_time`]).
    request_nanos: AtomicU64,
    /// The last [`TRACEPARENTS_KEPT`] `traceparent` headers received, oldest first
    /// ([`RunningEmulator::traceparents`]).
    traceparents: Mutex<std::collections::VecDeque<String>>,
}

/// How many of the last `traceparent` headers the emulator keeps.
const TRACEPARENTS_KEPT: usize = 1_000;

impl Shared {
    fn new(config: &EmulatorConfig, cancel: CancellationToken) -> Self {
        Shared {
            cluster: Mutex::new(state::Cluster::new(config.refresh_interval)),
            refreshed: Notify::new(),
            faults: Mutex::new(Faults::default()),
            total: AtomicU64::new(0),
            per_kind: Default::default(),
            cancel,
            security: config.security.clone().map(security::Security::new),
            wake: capacity::Wake::default(),
            shard_operations: AtomicU64::new(0),
            request_nanos: AtomicU64::new(0),
            traceparents: Mutex::default(),
        }
    }

    /// Keeps a request's `traceparent` header (W3C Trace Context), as a tracing engine would
    /// read it: the test of a traced service finds its context here.
    pub fn record_traceparent(&self, traceparent: &str) {
        let mut kept = self.traceparents.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() == TRACEPARENTS_KEPT {
            kept.pop_front();
        }
        kept.push_back(traceparent.to_owned());
    }

    /// The cluster. Never hold the guard across an `.await`.
    pub fn cluster(&self) -> MutexGuard<'_, state::Cluster> {
        self.cluster.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn count(&self, kind: &str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let slot = KINDS
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(KINDS.len() - 1);
        self.per_kind[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// The status an injected failure answers this request with, if any.
    pub fn take_fault(&self) -> Option<u16> {
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        if faults.unavailable {
            return Some(503);
        }
        if faults.remaining > 0 {
            faults.remaining -= 1;
            return Some(faults.status);
        }
        None
    }
}

/// An emulator serving on a tokio task. Dropping it stops the server.
pub struct RunningEmulator {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl RunningEmulator {
    /// The next `count` requests are answered with `status` without being applied: 429 is an
    /// `es_rejected_execution_exception`, 503 an `unavailable_shards_exception`, anything else
    /// a generic envelope of that status.
    pub fn fail_next(&self, status: u16, count: usize) {
        let mut faults = self.shared.faults.lock().unwrap_or_else(|e| e.into_inner());
        faults.status = status;
        faults.remaining = count;
    }

    /// While `true`, every request is answered 503 without being applied.
    pub fn set_unavailable(&self, down: bool) {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unavailable = down;
    }

    /// Turns the capacity model on (`cost` above zero) or off (zero): from the next request
    /// on, every shard serves its operations one at a time, each taking `cost` (module
    /// `capacity`).
    pub fn set_shard_op_cost(&self, cost: Duration) {
        self.shared.cluster().capacity = capacity::Capacity::new(cost);
    }

    /// Shard operations the capacity model has served so far (none while it is off): over a
    /// time, times the cost, over the shards, how busy they were.
    pub fn shard_operations(&self) -> u64 {
        self.shared.shard_operations.load(Ordering::Relaxed)
    }

    /// The time every request took from its arrival to its answer, added up: its growth over
    /// a time, over that time, is how many requests were in flight on average.
    pub fn request_time(&self) -> Duration {
        Duration::from_nanos(self.shared.request_nanos.load(Ordering::Relaxed))
    }

    /// The last `traceparent` headers requests carried (up to 1,000), oldest first.
    pub fn traceparents(&self) -> Vec<String> {
        let kept = self.shared.traceparents.lock();
        kept.unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Every request received, failed ones included.
    pub fn request_count(&self) -> u64 {
        self.shared.total.load(Ordering::Relaxed)
    }

    /// Requests of one kind: one of [`KINDS`] (0 for anything else).
    pub fn request_count_of(&self, kind: &str) -> u64 {
        KINDS
            .iter()
            .position(|k| *k == kind)
            .map_or(0, |i| self.shared.per_kind[i].load(Ordering::Relaxed))
    }

    /// Invalidates the API key `id`, as `DELETE /_security/api_key` does: from the next
    /// request on it answers 401. Panics when security is off.
    pub fn invalidate_api_key(&self, id: &str) {
        self.security().invalidate(id);
    }

    /// Replaces what the API key `id` may do (a role changed under a running service).
    /// Panics when security is off.
    pub fn set_api_key_grant(&self, id: &str, grant: Grant) {
        self.security().set_grant(id, grant);
    }

    fn security(&self) -> &security::Security {
        self.shared
            .security
            .as_ref()
            .expect("an emulator with EmulatorConfig::security")
    }

    /// Stops serving and waits for the server task to end.
    pub async fn shutdown(mut self) {
        self.shared.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for RunningEmulator {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

/// Binds `127.0.0.1:0` and serves on a tokio task (HTTPS when [`EmulatorConfig::tls`] is set;
/// panics on an unusable certificate).
pub async fn spawn(config: EmulatorConfig) -> RunningEmulator {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("es-emulator: bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("es-emulator: local address");
    let shared = Arc::new(Shared::new(&config, CancellationToken::new()));
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let task = match &config.tls {
        Some(tls) => {
            let listener = tls::TlsListener::new(listener, tls).expect("es-emulator: TLS");
            tokio::spawn(serve_shared(listener, shared.clone()))
        }
        None => tokio::spawn(serve_shared(listener, shared.clone())),
    };
    RunningEmulator {
        url: format!("{scheme}://{addr}"),
        addr,
        shared,
        task: Some(task),
    }
}

/// Serves on `listener` until the process ends (or the listener fails); HTTPS when
/// [`EmulatorConfig::tls`] is set.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: EmulatorConfig,
) -> std::io::Result<()> {
    serve_with_shard_op_cost(listener, config, Duration::ZERO).await
}

/// [`serve`] with the capacity model on when `shard_op_cost` is above zero (see
/// [`RunningEmulator::set_shard_op_cost`]).
pub async fn serve_with_shard_op_cost(
    listener: tokio::net::TcpListener,
    config: EmulatorConfig,
    shard_op_cost: Duration,
) -> std::io::Result<()> {
    let shared = Arc::new(Shared::new(&config, CancellationToken::new()));
    shared.cluster().capacity = capacity::Capacity::new(shard_op_cost);
    match &config.tls {
        Some(tls) => serve_shared(tls::TlsListener::new(listener, tls)?, shared).await,
        None => serve_shared(listener, shared).await,
    }
}

async fn serve_shared<L>(listener: L, shared: Arc<Shared>) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let cancel = shared.cancel.clone();
    let app = routes::router(shared);
    axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
}
