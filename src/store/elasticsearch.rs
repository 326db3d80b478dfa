//! The Elasticsearch backend of [`Store`], on the official `elasticsearch` client.
//!
//! Every operation is one HTTP request on Elasticsearch's plain document API:
//!
//! | store call       | request                                                          |
//! |------------------|------------------------------------------------------------------|
//! | `get`            | `GET /{p}{index}/_doc/{id}` (realtime)                          |
//! | `bulk`           | `POST /_bulk`: `create` actions, `index` actions with `if_seq_no` + `if_primary_term` |
//! | `find_stale`     | `POST /{p}transactions/_search`, `search_after` on `(modification_time, transaction_id)` |
//! | `list_transfers` | `POST /{p}transactions/_search`, `search_after` on `(creation_time, transaction_id)` |
//! | `account_entries` | `POST /{p}transactions/_search`, a `range` on `entries`, sorted on `transaction_id` |
//! | `scan`           | `POST /{p}{index}/_search`, `search_after` on `account_id` / `transaction_id` |
//! | `ready`          | this instance migrated; `HEAD` of every index; `GET /{p}migrations/_doc/{last migration}` |
//! | `refresh`        | `POST /{p}accounts,{p}transactions/_refresh`                    |
//!
//! How answers map to outcomes and errors is in `elasticsearch/reply.rs` (one table for
//! everything).
//!
//! # Parts
//!
//! [`ElasticsearchStore`] sends the requests of the table above; the rest is done by parts it
//! builds and owns, each in its file, all sharing one connection:
//! - the connection (`elasticsearch/connection.rs`): the client, the index names under
//!   `INDEX_PREFIX`, and what a missing index means (below); the engine behind it and how its
//!   answers are read are in `elasticsearch/engine.rs`;
//! - the migrations (`elasticsearch/migrations.rs`), applied by `migrate` and checked by
//!   `verify_migrated` and `ready`;
//! - the vouch for reads (`elasticsearch/vouch.rs`), through which every realtime GET is sent;
//! - shard growth (`elasticsearch/shards.rs`), `transfer-service shards`.
//!
//! # Answers: only what is read, uncompressed
//!
//! A `_bulk` asks for only what the backend reads of each item (`filter_path`, [`BULK_ANSWER`]):
//! its status, `_seq_no`, `_primary_term` and error, under its action's name. The rest
//! (index, id, version, result, shards) is three quarters of an item's bytes, which
//! Elasticsearch would write and the backend parse into a tree for nothing. Error envelopes
//! are never filtered (Elasticsearch does not), so a refused request still says why.
//!
//! Every request asks for an uncompressed answer (`Accept-Encoding: identity`). The HTTP
//! client would otherwise ask for gzip, and Elasticsearch then deflates every answer and the
//! service inflates it: CPU on both sides for the few kilobytes of an answer on the network
//! next to the cluster (inflating alone was 7% of the service's CPU on the two-phase path).
//!
//! # Pages of the sweeps
//!
//! `find_stale` (recovery) and `scan` (the late-apply sweep, the auditor) read the store page
//! after page, and a store of any size must not make one of them fail. Each page is bounded
//! by what it returns: `size`, `search_after` on a unique sort (never `from`), and
//! `track_total_hits: false` (nothing counts every match). Their time limit is a page timeout
//! of its own ([`ElasticsearchStore::with_page_timeout`]), not the request timeout that other
//! calls share: that one must fit in a quarter lease because a worker writes on the answer,
//! whereas nothing is ever decided on a search hit (it is re-read with a realtime `get`), so
//! a slow page delays a sweep and endangers nothing. The page also carries a server-side
//! `timeout` of half that, so a cluster that cannot finish it stops and says so
//! (`timed_out`, refused as a whole) instead of working on after the client gave up.
//!
//! # A missing index
//!
//! Before this instance has run [`ElasticsearchStore::migrate`], a missing index reads as
//! empty (`get` → `None`, searches → an empty page, `refresh` → nothing to do): the store
//! simply has no documents yet. Once migrations are applied, the indices exist, so a missing
//! one means someone deleted it or `INDEX_PREFIX` points elsewhere; answering "no such
//! document" then would make the protocol take wrong decisions (roll transfers back with
//! `account_not_found`, accept a replayed transfer id as new). After `migrate`, a missing
//! index is therefore a [`StoreError::Permanent`].
//!
//! Writes are stricter. With the default `action.auto_create_index`, a bulk write to a
//! missing index creates it with *dynamic* mappings (`transaction_state` as analysed text,
//! say), and a later `migrate` would take that index as already created: searches would be
//! silently wrong for good. So `bulk` answers `Unavailable` until this instance's `migrate`
//! has succeeded (the service retries migrations in the background and `/readyz` says not
//! ready meanwhile). After migrations, a deleted index would still be re-created by a write;
//! `/readyz` then reports the missing index (it checks every index exists), `migrate` at the
//! next start re-creates missing indices with their mappings, and operators who want to rule
//! it out entirely set `action.auto_create_index: "-{prefix}*,+*"`.
//!
//! # Ids that cannot be written in a URL
//!
//! `""`, `"."` and `".."` are valid document ids in a bulk body but cannot be addressed in a
//! URL path (`/_doc/..` is normalised away by every HTTP client, `%2e%2e` included). A
//! document created under such an id could never be read back, so this backend refuses them
//! on writes and reads alike (`Permanent`), before any request.

mod bodies;
mod connection;
mod engine;
mod migrations;
mod reply;
mod security;
mod shards;
mod vouch;

/// The body that creates the migrations index (the differential test sends it as is).
pub use self::engine::{SearchEngine, UNREAD_VERSION};
pub use self::migrations::migrations_index_body;
pub use self::security::{sha256_hex, EsCredentials, EsSecurity, EsSecuritySettings, Secret};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use elasticsearch::http::headers::{HeaderValue, CONTENT_TYPE};
use elasticsearch::{BulkParts, SearchParts};
use serde_json::{json, Value};
use url::Url;

use self::bodies::{bulk_lines, doc_of, entries_body, hits_of, page_of, search_body, sort_key_of};
use self::connection::{traced, Connection};
use self::migrations::Migrations;
use self::reply::Reply;
use self::shards::{Described, Growth, ShardGrowth};
use self::vouch::Vouch;
use super::{
    fields, ChangesPage, ChangesQuery, Doc, EntriesQuery, FeedPosition, Index, Page, ScanPage,
    StaleQuery, Store, StoreError, StoreResult, TransferFilter, Version, WriteOp, WriteOutcome,
};

/// What the backend reads of a `_bulk` answer: each item's status, version and error, under
/// its action's name ([`reply::bulk_item`]; see "Answers" in the module docs).
const BULK_ANSWER: &[&str] = &[
    "items.*.status",
    "items.*._seq_no",
    "items.*._primary_term",
    "items.*.error",
];

/// How to reach the cluster.
#[derive(Clone)]
pub struct EsConfig {
    /// Base URL of a node (or of a load balancer in front of the cluster), e.g.
    /// `http://localhost:9200`. `user:password@` in the URL is sent as basic auth.
    pub url: String,
    /// Prepended to every index name the service owns (`INDEX_PREFIX`), so several
    /// deployments (or test runs) can share a cluster.
    pub index_prefix: String,
    /// Upper bound for one HTTP request, connect to last byte. A request that exceeds it is
    /// `Unavailable` (it may still have been applied).
    pub request_timeout: Duration,
    /// Primary shards of the data indices when this instance creates them
    /// (`ELASTICSEARCH_SHARDS`); an index that exists keeps its own.
    pub shards: u32,
}

/// Never prints the password of a URL with credentials.
impl fmt::Debug for EsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = match Url::parse(&self.url) {
            Ok(mut url) if url.password().is_some() => {
                let _ = url.set_password(Some("***"));
                url.to_string()
            }
            _ => self.url.clone(),
        };
        f.debug_struct("EsConfig")
            .field("url", &url)
            .field("index_prefix", &self.index_prefix)
            .field("request_timeout", &self.request_timeout)
            .field("shards", &self.shards)
            .finish()
    }
}

/// A [`Store`] on an Elasticsearch 8 cluster: the store's requests, over the parts it builds
/// and owns (see "Parts" in the module docs).
pub struct ElasticsearchStore {
    /// The client, the index names, the engine and whether this instance has migrated
    /// (`elasticsearch/connection.rs`), which the parts below share.
    connection: Arc<Connection>,
    /// Applies and verifies the migrations (`elasticsearch/migrations.rs`).
    migrations: Migrations,
    /// Vouches for reads against the global checkpoints (`elasticsearch/vouch.rs`); every
    /// realtime GET is sent through it.
    vouch: Vouch,
    /// `transfer-service shards` (`elasticsearch/shards.rs`).
    shard_growth: ShardGrowth,
    /// The server-side `timeout` of a `_bulk` (half the client's): an unavailable shard then
    /// fails its own items with 503 while the rest of the batch is applied, instead of the
    /// whole request timing out on the client while the server keeps executing it.
    bulk_timeout: String,
    /// The client-side limit of one page of `find_stale` or `scan` (see "Pages of the
    /// sweeps" in the module docs); the request timeout until set.
    page_timeout: Duration,
}

impl fmt::Debug for ElasticsearchStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElasticsearchStore")
            .field("index_prefix", &self.connection.index_prefix)
            .field("migrated", &self.connection.is_migrated())
            .finish_non_exhaustive()
    }
}

impl ElasticsearchStore {
    /// Builds the client, without credentials other than those in the URL. Sends nothing:
    /// the cluster does not have to be up yet ([`Store::ready`] tells when it is). Fails only
    /// on a malformed URL or prefix.
    pub async fn connect(config: EsConfig) -> Result<Self, StoreError> {
        Self::connect_secured(config, EsSecurity::default()).await
    }

    /// [`Self::connect`] with credentials and a CA to trust (`elasticsearch/security.rs`).
    pub async fn connect_secured(
        config: EsConfig,
        security: EsSecurity,
    ) -> Result<Self, StoreError> {
        let connection = Arc::new(Connection::open(&config, security)?);
        Ok(Self {
            migrations: Migrations::new(connection.clone(), config.shards.max(1)),
            vouch: Vouch::new(connection.clone(), config.request_timeout / 2),
            shard_growth: ShardGrowth::new(connection.clone()),
            connection,
            bulk_timeout: format!("{}ms", (config.request_timeout / 2).as_millis().max(1)),
            page_timeout: config.request_timeout,
        })
    }

    /// Gives each page of `find_stale` and `scan` a time limit of its own instead of the
    /// request timeout (see "Pages of the sweeps" in the module docs).
    pub fn with_page_timeout(mut self, page_timeout: Duration) -> Self {
        self.page_timeout = page_timeout;
        self
    }

    /// A sweep's page: the body, with the server-side half of [`Self::page_timeout`].
    fn page_body(&self, mut body: Value) -> Value {
        body["timeout"] = json!(format!("{}ms", (self.page_timeout / 2).as_millis().max(1)));
        body
    }

    /// Applies the embedded migrations in order, each once; safe when several instances do
    /// it at the same moment (the argument is in `elasticsearch/migrations.rs`).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.connection.detect_engine().await?;
        self.migrations.apply().await?;
        self.connection.mark_migrated();
        Ok(())
    }

    /// Checks, without writing anything, that the store is migrated (every index exists, the
    /// last migration is recorded), and from then on treats a missing index as an error.
    /// For read-only users of the store such as the auditor.
    pub async fn verify_migrated(&self) -> Result<(), StoreError> {
        self.connection.detect_engine().await?;
        self.migrations.verify().await?;
        self.connection.mark_migrated();
        Ok(())
    }

    /// The physical name of `index`: `INDEX_PREFIX` + its logical name.
    pub fn index_name(&self, index: Index) -> String {
        self.connection.index_name(index)
    }

    /// The engine behind `ELASTICSEARCH_URL` (`GET /`, once; `elasticsearch/engine.rs`): an
    /// engine or version the service does not support is a `Permanent` error naming it.
    pub async fn detect_engine(&self) -> StoreResult<&SearchEngine> {
        self.connection.detect_engine().await
    }

    /// Splits the accounts and transactions indices into `to` shards each
    /// (`elasticsearch/shards.rs`); with `dry_run`, only says what it would do. The store
    /// must be migrated.
    pub async fn grow_shards(&self, to: u32, dry_run: bool) -> StoreResult<Vec<Growth>> {
        self.shard_growth.grow(to, dry_run).await
    }

    /// Runs one search on the transactions index and cuts the answer into a [`Page`].
    async fn search_transactions(
        &self,
        op: &str,
        body: Value,
        limit: usize,
        timeout: Option<Duration>,
    ) -> StoreResult<Page> {
        let hits = self.search(op, Index::Transactions, body, timeout).await?;
        page_of(op, &hits, limit)
    }

    /// Runs one search on `index` and returns its hits (none if the index does not exist
    /// before migrations; see the module docs). `timeout` replaces the request timeout.
    async fn search(
        &self,
        op: &str,
        index: Index,
        body: Value,
        timeout: Option<Duration>,
    ) -> StoreResult<Vec<Value>> {
        let name = self.connection.index_name(index);
        let names = [name.as_str()];
        let mut search = traced!(self
            .connection
            .client
            .search(SearchParts::Index(&names))
            .body(body));
        if let Some(timeout) = timeout {
            search = search.request_timeout(timeout);
        }
        let sent = search.send().await;
        let reply = self.connection.read(op, sent).await?;
        if reply.status == 404 && reply.error_type() == Some("index_not_found_exception") {
            self.connection.missing_index(op, reply).await?;
            return Ok(Vec::new());
        }
        if !reply.is_success() {
            return Err(reply.into_error(op));
        }
        hits_of(op, reply.body)
    }
}

/// See "Ids that cannot be written in a URL" in the module docs.
fn check_addressable(op: &str, id: &str) -> StoreResult<()> {
    if matches!(id, "" | "." | "..") {
        Err(StoreError::Permanent(format!(
            "{op}: id {id:?} cannot be used with Elasticsearch (not addressable in a URL)"
        )))
    } else {
        Ok(())
    }
}

#[async_trait]
impl Store for ElasticsearchStore {
    fn backend(&self) -> &'static str {
        "elasticsearch"
    }

    fn engine(&self) -> Option<SearchEngine> {
        self.connection.engine.get().cloned()
    }

    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        self.vouch.get(index, id).await
    }

    async fn vouch(&self, index: Index, id: &str, read: Option<Version>) -> StoreResult<()> {
        self.vouch.vouch_for(index, id, read).await
    }

    async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        let op = "bulk";
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        if !self.connection.is_migrated() {
            // See "A missing index" in the module docs: a write now could create an index
            // with the wrong mappings.
            return Err(StoreError::Unavailable(format!(
                "{op}: migrations are not applied yet; refusing writes that would auto-create \
                 indices with dynamic mappings"
            )));
        }
        // Unaddressable ids get their error in place; the others go out in one request.
        let mut results: Vec<Option<StoreResult<WriteOutcome>>> = Vec::with_capacity(ops.len());
        let mut lines = Vec::with_capacity(ops.len() * 2);
        for write in ops {
            match check_addressable(op, write.id()) {
                Ok(()) => {
                    results.push(None);
                    lines.extend(bulk_lines(&self.connection, write)?);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let sent_count = lines.len() / 2;
        if sent_count > 0 {
            // The client ends every line (the last one included) with '\n'.
            let sent = traced!(self.connection.client.bulk(BulkParts::None))
                .filter_path(BULK_ANSWER)
                .timeout(&self.bulk_timeout)
                .header(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/x-ndjson"),
                )
                .body(lines)
                .send()
                .await;
            let reply = self.connection.successful(op, sent).await?;
            // `errors` only says whether some item failed; each item's status is what counts.
            let items = reply
                .body
                .get("items")
                .and_then(Value::as_array)
                .ok_or_else(|| StoreError::Permanent(format!("{op}: answer without items")))?;
            if items.len() != sent_count {
                return Err(StoreError::Permanent(format!(
                    "{op}: {} items answered for {sent_count} sent",
                    items.len()
                )));
            }
            let mut outcomes = items.iter().map(reply::bulk_item);
            for slot in results.iter_mut().filter(|slot| slot.is_none()) {
                *slot = outcomes.next();
            }
        }
        Ok(results
            .into_iter()
            .map(|slot| slot.expect("every slot is filled: counts checked above"))
            .collect())
    }

    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page> {
        if query.states.is_empty() {
            // `terms` with no values matches nothing; skip the round trip.
            return Ok(Page {
                docs: Vec::new(),
                next: None,
            });
        }
        let filter = vec![json!({"terms": {fields::STATE: query.states}})];
        // Stale, or released (a shutdown gave the lease back: resume it at once).
        let should = vec![
            json!({"range": {fields::MODIFIED: {
                "lt": query.modified_before,
                "format": "epoch_millis",
            }}}),
            json!({"bool": {"must_not": {"exists": {"field": fields::LEASE_OWNER}}}}),
        ];
        let sort = json!([{fields::MODIFIED: "asc"}, {fields::ID: "asc"}]);
        let body = search_body(filter, should, sort, query.after.as_ref(), query.limit);
        let body = self.page_body(body);
        self.search_transactions("find_stale", body, query.limit, Some(self.page_timeout))
            .await
    }

    /// The feed: `(modification_time, id)` ascending below the horizon. A search shows a
    /// write one refresh after it is applied and a slow write may be applied after a later
    /// one, so only documents stamped before the horizon are served (`docs/design.md §11`
    /// says why that is enough, and what covers a write that took longer).
    async fn changes(&self, query: &ChangesQuery) -> StoreResult<ChangesPage> {
        let op = "changes";
        let after = match &query.after {
            None => None,
            Some(FeedPosition::Time(key)) => Some(key),
            Some(FeedPosition::Seq(_)) => {
                return Err(StoreError::Permanent(format!(
                    "{op}: a feed position on Elasticsearch is a (time, id), not a seq_no"
                )))
            }
        };
        let filter = vec![json!({"range": {fields::MODIFIED: {
            "lt": query.horizon,
            "format": "epoch_millis",
        }}})];
        let (order, after, limit) = match query.newest {
            true => ("desc", None, 1),
            false => ("asc", after, query.limit),
        };
        let sort = json!([{fields::MODIFIED: order}, {fields::ID: order}]);
        let body = search_body(filter, Vec::new(), sort, after, limit);
        let body = self.page_body(body);
        let name = self.connection.index_name(Index::Transactions);
        if self.vouch.searching(&name) == 0 {
            // The copies listed before the search are what its hits are vouched by: have an
            // answer first (`elasticsearch/vouch.rs`, the copies listed around a read).
            self.vouch.vouch_for(Index::Transactions, "", None).await?;
        }
        let searching = self.vouch.searching(&name);
        let hits = self
            .search(op, Index::Transactions, body, Some(self.page_timeout))
            .await?;
        let mut docs: Vec<(FeedPosition, Doc)> = hits
            .iter()
            .map(|hit| Ok((FeedPosition::Time(sort_key_of(op, hit)?), doc_of(op, hit)?)))
            .collect::<StoreResult<_>>()?;
        // A consumer (a webhook receiver among them) must never be shown a write that a
        // cut-off primary accepted and rolls back: the page is served only as far as every
        // hit is vouched for (`elasticsearch/vouch.rs`); one stats answer covers them all. A
        // hit found written since the search ends the page before it: the page's end is the
        // consumer's next cursor, and the document's newer write comes after it.
        for k in 0..docs.len() {
            let doc = &docs[k].1;
            self.vouch.found_by_search(&name, &doc.id, searching);
            match self
                .vouch
                .vouch_for(Index::Transactions, &doc.id, Some(doc.version))
                .await
            {
                Ok(()) => {}
                Err(error) if error.changed_since_read() => {
                    docs.truncate(k);
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(ChangesPage { docs })
    }

    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page> {
        let mut clauses = Vec::new();
        if let Some(state) = &filter.state {
            clauses.push(json!({"term": {fields::STATE: state}}));
        }
        if filter.attention {
            // Mapped by migration 0003; see `carries_attention` for why `exists` is the same
            // set as the embedded store's.
            clauses.push(json!({"exists": {"field": fields::ATTENTION}}));
        }
        for (key, value) in &filter.metadata {
            // A keyed sub-field of the `flattened` field (migration 0004): exact match.
            let field = format!("{}.{key}", fields::METADATA);
            clauses.push(json!({"term": {field: value}}));
        }
        let should = match &filter.account {
            Some(account) => vec![
                json!({"term": {fields::SRC: account}}),
                json!({"term": {fields::DEST: account}}),
                // A multi-leg transaction's accounts (migration 0005).
                json!({"term": {fields::ACCOUNTS: account}}),
            ],
            None => Vec::new(),
        };
        let sort = json!([{fields::CREATED: "desc"}, {fields::ID: "desc"}]);
        let body = search_body(clauses, should, sort, filter.after.as_ref(), filter.limit);
        self.search_transactions("list_transfers", body, filter.limit, None)
            .await
    }

    /// Near-real-time, like the listing: a range on `entries` (migration 0007,
    /// [`entries_body`]).
    async fn account_entries(&self, query: &EntriesQuery) -> StoreResult<Vec<Doc>> {
        let op = "account_entries";
        if query.limit == 0 || query.seqs.is_empty() {
            return Ok(Vec::new());
        }
        let hits = self
            .search(op, Index::Transactions, entries_body(query), None)
            .await?;
        hits.iter().map(|hit| doc_of(op, hit)).collect()
    }

    /// One realtime GET of the last migration's record: it answers both "reachable" and
    /// "migrated" (the record is written only after every earlier step is applied). Then one
    /// `_stats` of each data index: every shard copy answers, one of them the primary (a
    /// node on the minority side of a partition cannot say so).
    async fn ready(&self) -> StoreResult<()> {
        // Ready means this instance can write: it has applied (or verified) the migrations,
        // and the indices are still there.
        if !self.connection.is_migrated() {
            return Err(StoreError::Unavailable(
                "ready: this instance has not applied the migrations yet".into(),
            ));
        }
        self.migrations.verify().await?;
        // A node cut off from the others answers the checks above from its own copies;
        // reaching every copy of the data indices is what it cannot do then
        // (`elasticsearch/vouch.rs`).
        for index in [Index::Accounts, Index::Transactions] {
            self.vouch.vouch_for(index, "", None).await?;
        }
        Ok(())
    }

    /// Sorted on the id repeated in the source (`account_id`, `transaction_id`): Elasticsearch
    /// 8 cannot sort on `_id`. A document without that field cannot be placed in id order;
    /// rather than skip it (the auditor would miss it) or loop on it, the scan fails.
    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<ScanPage> {
        let op = "scan";
        let id_field = match index {
            Index::Accounts => fields::ACCOUNT_ID,
            Index::Transactions => fields::ID,
            Index::Webhooks => fields::RECEIVER_ID,
        };
        let mut body = self.page_body(json!({
            "size": limit,
            "seq_no_primary_term": true,
            "track_total_hits": false,
            "query": { "match_all": {} },
            "sort": [{ id_field: "asc" }],
        }));
        if let Some(after) = after {
            body["search_after"] = json!([after]);
        }
        let hits = self
            .search(op, index, body, Some(self.page_timeout))
            .await?;
        let mut docs = Vec::with_capacity(hits.len());
        let mut last_sort = None;
        for hit in &hits {
            let doc = doc_of(op, hit)?;
            // The cursor is the sort value, not `_id`: a corrupt document whose repeated id
            // differs from its `_id` must neither send the scan backwards nor skip others.
            match hit.pointer("/sort/0").and_then(Value::as_str) {
                Some(sort) => last_sort = Some(sort.to_owned()),
                None => {
                    return Err(StoreError::Permanent(format!(
                        "{op}: {index}/{} has no {id_field}; cannot scan past it",
                        doc.id
                    )))
                }
            }
            docs.push(doc);
        }
        let next = if docs.len() == limit { last_sort } else { None };
        Ok(ScanPage { docs, next })
    }

    async fn refresh(&self) -> StoreResult<()> {
        let op = "refresh";
        let accounts = self.connection.index_name(Index::Accounts);
        let transactions = self.connection.index_name(Index::Transactions);
        let indices = [accounts.as_str(), transactions.as_str()];
        let reply = self.connection.refresh(op, &indices).await?;
        if reply.status == 404 && reply.error_type() == Some("index_not_found_exception") {
            // Before migrations nothing may exist yet. Refresh the indices that do exist one
            // by one (a multi-index refresh fails as a whole on one missing index).
            self.connection.missing_index(op, reply).await?;
            for index in indices {
                self.refresh_one(index).await?;
            }
            return Ok(());
        }
        check_refreshed(op, reply)
    }

    /// The transactions index's uuid (`GET /<index>`: `settings.index.uuid`), which a
    /// restore or a re-creation of the index changes; after `transfer-service shards`, the
    /// identity the split wrote on the copy's mapping for the copy's uuid
    /// (`elasticsearch/shards.rs`), so cursors issued before the split still read.
    async fn identity(&self) -> StoreResult<Option<String>> {
        let name = self.connection.index_name(Index::Transactions);
        let described = Described::of(&self.connection, &name).await?;
        Ok(Some(described.kept_identity.unwrap_or(described.uuid)))
    }
}

impl ElasticsearchStore {
    /// Refresh of a single index; a missing one has nothing to refresh.
    async fn refresh_one(&self, index: &str) -> StoreResult<()> {
        let op = "refresh";
        let reply = self.connection.refresh(op, &[index]).await?;
        if reply.status == 404 && reply.error_type() == Some("index_not_found_exception") {
            return Ok(());
        }
        check_refreshed(op, reply)
    }
}

/// A refresh whose shards partly failed did not make every write visible.
fn check_refreshed(op: &str, reply: Reply) -> StoreResult<()> {
    if !reply.is_success() {
        return Err(reply.into_error(op));
    }
    let failed = reply
        .body
        .pointer("/_shards/failed")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if failed > 0 {
        return Err(StoreError::Unavailable(format!(
            "{op}: {failed} shard(s) failed to refresh"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SortKey;
    use crate::store::Version;
    use bytes::Bytes;

    async fn store(prefix: &str) -> ElasticsearchStore {
        ElasticsearchStore::connect(EsConfig {
            url: "http://127.0.0.1:9".into(),
            index_prefix: prefix.into(),
            request_timeout: Duration::from_secs(1),
            shards: 1,
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn index_names_carry_the_prefix() {
        let store = store("ts-test-").await;
        assert_eq!(store.index_name(Index::Accounts), "ts-test-accounts");
        assert_eq!(
            store.index_name(Index::Transactions),
            "ts-test-transactions"
        );
    }

    #[tokio::test]
    async fn bad_prefixes_and_urls_are_refused_at_connect() {
        for prefix in ["Upper-", "a b", "a,b", "_x", "x*"] {
            let config = EsConfig {
                url: "http://127.0.0.1:9200".into(),
                index_prefix: prefix.into(),
                request_timeout: Duration::from_secs(1),
                shards: 1,
            };
            assert!(
                ElasticsearchStore::connect(config).await.is_err(),
                "{prefix}"
            );
        }
        for url in ["not a url", "ftp://host/"] {
            let config = EsConfig {
                url: url.into(),
                index_prefix: "x-".into(),
                request_timeout: Duration::from_secs(1),
                shards: 1,
            };
            assert!(ElasticsearchStore::connect(config).await.is_err(), "{url}");
        }
    }

    #[test]
    fn config_debug_hides_the_password() {
        let config = EsConfig {
            url: "https://elastic:secret@es.example:9200".into(),
            index_prefix: "x-".into(),
            request_timeout: Duration::from_secs(1),
            shards: 1,
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("elastic"), "{shown}");
    }

    #[tokio::test]
    async fn a_conditional_replace_is_an_index_action_with_seq_no_and_term() {
        let store = store("p-").await;
        let [action, source] = bulk_lines(
            &store.connection,
            WriteOp::ReplaceIf {
                index: Index::Accounts,
                id: "a".into(),
                source: json!({"balance": 1}).into(),
                expected: Version {
                    seq_no: 4,
                    primary_term: 2,
                },
            },
        )
        .unwrap();
        let json = |line: &Bytes| serde_json::from_slice::<Value>(line).unwrap();
        assert_eq!(
            json(&action),
            json!({"index": {"_index": "p-accounts", "_id": "a", "if_seq_no": 4, "if_primary_term": 2}})
        );
        assert_eq!(
            &source[..],
            br#"{"balance":1}"#,
            "the source is sent as it is"
        );
        let [action, _] = bulk_lines(
            &store.connection,
            WriteOp::Create {
                index: Index::Transactions,
                id: "t".into(),
                source: json!({}).into(),
            },
        )
        .unwrap();
        assert_eq!(
            json(&action),
            json!({"create": {"_index": "p-transactions", "_id": "t"}})
        );
    }

    #[test]
    fn a_full_page_continues_after_its_last_hit() {
        let body = json!({"timed_out": false, "_shards": {"total":1,"successful":1,"failed":0},
            "hits": {"hits": [
                {"_id":"t1","_seq_no":1,"_primary_term":1,"_source":{},"sort":[10,"t1"]},
                {"_id":"t2","_seq_no":2,"_primary_term":1,"_source":{},"sort":[11,"t2"]}]}});
        let hits = hits_of("test", body).unwrap();
        let page = page_of("test", &hits, 2).unwrap();
        assert_eq!(page.docs.len(), 2);
        assert_eq!(
            page.next,
            Some(SortKey {
                millis: 11,
                id: "t2".into()
            })
        );
        assert!(page_of("test", &hits, 3).unwrap().next.is_none());
    }

    #[test]
    fn a_partial_search_is_refused() {
        let body = json!({"timed_out": true, "hits": {"hits": []}});
        assert!(hits_of("test", body).unwrap_err().is_retryable());
    }

    #[test]
    fn an_account_filter_needs_one_of_its_should_clauses() {
        let body = search_body(
            vec![],
            vec![json!({"term": {"src_acct": "a"}})],
            json!([]),
            None,
            5,
        );
        assert_eq!(body["query"]["bool"]["minimum_should_match"], 1);
        assert!(body.get("search_after").is_none());
    }

    #[tokio::test]
    async fn unaddressable_ids_fail_without_a_request() {
        // Port 9 (discard) is closed: had a request been sent, the error would be
        // Unavailable, not Permanent.
        let store = store("p-").await;
        store.connection.mark_migrated();
        let error = store.get(Index::Accounts, "..").await.unwrap_err();
        assert!(!error.is_retryable(), "{error}");
        let results = store
            .bulk(vec![WriteOp::Create {
                index: Index::Accounts,
                id: ".".into(),
                source: json!({}).into(),
            }])
            .await
            .unwrap();
        assert!(!results[0].as_ref().unwrap_err().is_retryable());
    }

    #[tokio::test]
    async fn writes_wait_for_migrations() {
        let store = store("p-").await;
        let write = || {
            vec![WriteOp::Create {
                index: Index::Accounts,
                id: "a".into(),
                source: json!({}).into(),
            }]
        };
        assert!(store.bulk(write()).await.unwrap_err().is_retryable());
        assert!(store.bulk(Vec::new()).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_unreachable_cluster_is_unavailable() {
        let store = store("p-").await;
        let error = store.get(Index::Accounts, "a").await.unwrap_err();
        assert!(error.is_retryable(), "{error}");
        assert!(store.ready().await.unwrap_err().is_retryable());
    }
}
