//! The embedded backend: a durable redb file with Elasticsearch's per-document semantics.
//!
//! It is the default store (no `ELASTICSEARCH_URL`), so `cargo run` works with nothing else
//! installed and every protocol test runs against real, crash-safe storage.
//!
//! - **Durability.** Every write transaction commits with [`Durability::Immediate`]: when a
//!   write is acknowledged, redb has fsynced it, so it survives `kill -9` and power loss.
//! - **Group commit.** One committer at a time owns the write transactions: the caller that
//!   finds nobody committing becomes it, on tokio's blocking pool, and while it commits the
//!   others queue. It takes every batch that is waiting (up to [`MAX_GROUP_OPS`] ops),
//!   applies them one by one in a single transaction and commits once, answers every caller,
//!   and goes on until the queue is empty. (On the blocking pool, tokio knows work is under
//!   way: tests on paused time do not see the clock jump while a commit runs.) Concurrent writers therefore
//!   share one fsync instead of paying one each. Each op is checked on its own, so a
//!   conflicting op changes nothing and does not affect the others (like `_bulk`); an op that
//!   cannot be applied (its stored document does not decode) fails alone, `Permanent`, having
//!   written nothing. Only a failure of the transaction itself fails the whole group.
//! - **Errors.** An I/O failure of the running store (starting a write transaction, a table
//!   access, a commit) is `Unavailable`: the outcome is unknown to the callers, who re-read
//!   and retry or leave the transfer to recovery. Corruption and other refusals are
//!   `Permanent`, as is any failure to open the file.
//! - **Versions.** `seq_no` is per index and increases on every applied write, like a
//!   single-shard Elasticsearch index; the primary term is always 1 (there is no failover).
//! - **Searches** use secondary index tables kept in the same transaction as the documents, so
//!   they are realtime (stricter than Elasticsearch's near-real-time; the engine relies on
//!   neither). A stored transfer that does not decode is skipped by them (with a warning), so
//!   recovery and the listing page past it instead of stopping there.
//! - One process holds the file at a time (redb locks it); a second one fails to open it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use async_trait::async_trait;
use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, Table, TableDefinition,
    WriteTransaction,
};
use serde_json::Value;
use tokio::sync::oneshot;

use super::{
    carries_attention, fields, parse_millis, Doc, Index, Page, ScanPage, SortKey, StaleQuery,
    Store, StoreError, StoreResult, TransferFilter, Version, WriteOp, WriteOutcome,
};

/// `(index, id)` → `seq_no` (8 bytes, little endian) followed by the JSON source.
const DOCS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("docs");
/// `"seq:<index>"` → the last `seq_no` handed out in that index.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Transfers by `(state, modification_time, id)`: the recovery query.
const TX_BY_STATE_MODIFIED: TableDefinition<(&str, i64, &str), ()> =
    TableDefinition::new("tx_by_state_modified");
/// Transfers by `(creation_time, id)`: the unfiltered listing.
const TX_BY_CREATED: TableDefinition<(i64, &str), ()> = TableDefinition::new("tx_by_created");
/// Transfers by `(state, creation_time, id)`: the listing filtered by state.
const TX_BY_STATE_CREATED: TableDefinition<(&str, i64, &str), ()> =
    TableDefinition::new("tx_by_state_created");
/// Transfers by `(account, creation_time, id)`, once for the source and once for the
/// destination: the listing filtered by account.
const TX_BY_ACCOUNT: TableDefinition<(&str, i64, &str), ()> = TableDefinition::new("tx_by_account");
/// Transfers by `(state, id)` whose lease was released (no `lease_owner`): recovery
/// candidates at once, whatever their `modification_time`. Only in-flight states matter;
/// the table holds whichever states such transfers are in.
const TX_RELEASED: TableDefinition<(&str, &str), ()> = TableDefinition::new("tx_released");
/// Transfers by `(creation_time, id)` that carry `attention` (flagged for a person): the
/// listing `?attention=true`. Few entries, so the other filters of that listing are checked
/// on the documents.
const TX_ATTENTION: TableDefinition<(i64, &str), ()> = TableDefinition::new("tx_attention");
/// The key in [`META`] that says [`TX_ATTENTION`] holds every flagged transfer (it was built
/// from the documents once, when a store written by an older version was first opened).
const ATTENTION_BUILT: &str = "built:tx_attention";

/// The most ops one group commit takes; bounds the latency a large group adds.
pub const MAX_GROUP_OPS: usize = 4096;

/// The only primary term this backend knows (no replicas, no failover).
const PRIMARY_TERM: u64 = 1;

/// File name of the database inside `DATA_DIR`.
pub const FILE_NAME: &str = "transfer-service.redb";

type Reply = oneshot::Sender<StoreResult<Vec<StoreResult<WriteOutcome>>>>;

/// Writes waiting for the committer, and whether one is running.
#[derive(Default)]
struct CommitQueue {
    waiting: Vec<(Vec<WriteOp>, Reply)>,
    committing: bool,
    closed: bool,
}

/// The queue, and a signal for whoever waits for the committer to finish.
#[derive(Default)]
struct Committer {
    queue: Mutex<CommitQueue>,
    idle: Condvar,
}

/// The redb-backed store. Hold it in an `Arc` (it is a [`Store`]).
pub struct EmbeddedStore {
    db: Arc<Database>,
    committer: Arc<Committer>,
    path: PathBuf,
}

impl Drop for EmbeddedStore {
    /// Refuses new writes and waits for the committer to finish, so that once the store is
    /// dropped the file is closed and may be opened again (by this process or another).
    fn drop(&mut self) {
        let mut queue = lock(&self.committer.queue);
        queue.closed = true;
        while queue.committing {
            queue = self
                .committer
                .idle
                .wait(queue)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn lock(queue: &Mutex<CommitQueue>) -> std::sync::MutexGuard<'_, CommitQueue> {
    queue.lock().unwrap_or_else(|e| e.into_inner())
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir`, creating the directory if needed.
    pub fn open(dir: &Path) -> StoreResult<Self> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Permanent(format!("cannot create data dir {}: {e}", dir.display()))
        })?;
        let path = dir.join(FILE_NAME);
        let db = Database::create(&path)
            .map_err(|e| StoreError::Permanent(format!("cannot open {}: {e}", path.display())))?;
        Self::start(db, path)
    }

    /// Creates the tables if needed.
    fn start(db: Database, path: PathBuf) -> StoreResult<Self> {
        let db = Arc::new(db);
        // Create every table up front so readers never meet a missing one.
        let txn = db.begin_write().map_err(permanent)?;
        {
            txn.open_table(DOCS).map_err(permanent)?;
            txn.open_table(META).map_err(permanent)?;
            txn.open_table(TX_BY_STATE_MODIFIED).map_err(permanent)?;
            txn.open_table(TX_BY_CREATED).map_err(permanent)?;
            txn.open_table(TX_BY_STATE_CREATED).map_err(permanent)?;
            txn.open_table(TX_BY_ACCOUNT).map_err(permanent)?;
            txn.open_table(TX_RELEASED).map_err(permanent)?;
            txn.open_table(TX_ATTENTION).map_err(permanent)?;
            build_attention_index(&txn)?;
        }
        txn.commit().map_err(permanent)?;
        Ok(Self {
            db,
            committer: Arc::default(),
            path,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> StoreResult<T> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(|e| StoreError::Permanent(format!("read task failed: {e}")))?
    }
}

/// Fills [`TX_ATTENTION`] from the stored transfers, once: a store written before the table
/// existed may hold flagged transfers. Afterwards every write keeps the table up to date.
fn build_attention_index(txn: &WriteTransaction) -> StoreResult<()> {
    let mut meta = txn.open_table(META).map_err(permanent)?;
    if meta.get(ATTENTION_BUILT).map_err(permanent)?.is_some() {
        return Ok(());
    }
    let docs = txn.open_table(DOCS).map_err(permanent)?;
    let mut attention = txn.open_table(TX_ATTENTION).map_err(permanent)?;
    let name = Index::Transactions.name();
    for entry in docs.range((name, "")..).map_err(permanent)? {
        let (key, value) = entry.map_err(permanent)?;
        let (index, id) = key.value();
        if index != name {
            break;
        }
        // An undecodable document is skipped here as it is by the searches.
        if let Ok(doc) = decode(id, value.value()) {
            let keys = transfer_keys(&doc.source);
            if keys.attention {
                attention
                    .insert((keys.created, id), ())
                    .map_err(permanent)?;
            }
        }
    }
    meta.insert(ATTENTION_BUILT, 1).map_err(permanent)?;
    Ok(())
}

fn permanent(e: impl std::fmt::Display) -> StoreError {
    StoreError::Permanent(format!("embedded store: {e}"))
}

/// A redb error on the running store. An I/O failure is transient from the caller's point of
/// view (the write's outcome is unknown, the disk may recover, a restart may be needed):
/// `Unavailable`, so the API answers 503 and the engine retries or leaves the transfer to
/// recovery. Anything else (corruption, a value too large, a bug) is `Permanent`. Opening the
/// file keeps every failure `Permanent` ([`permanent`]): the service cannot start on it.
fn storage(e: impl Into<redb::Error>) -> StoreError {
    let e: redb::Error = e.into();
    match e {
        redb::Error::Io(_)
        | redb::Error::PreviousIo
        | redb::Error::DatabaseClosed
        | redb::Error::TransactionInProgress
        | redb::Error::WouldBlock => StoreError::Unavailable(format!("embedded store: {e}")),
        _ => StoreError::Permanent(format!("embedded store: {e}")),
    }
}

/// One committer's turn. Should it end abnormally (a panic, or the runtime dropping the
/// blocking task before it ran), dropping it fails the waiting writes (their callers get an
/// error instead of waiting forever) and lets the next write start a new committer.
struct CommitterTurn {
    committer: Arc<Committer>,
    finished: bool,
}

impl Drop for CommitterTurn {
    fn drop(&mut self) {
        if !self.finished {
            let mut queue = lock(&self.committer.queue);
            queue.committing = false;
            queue.waiting.clear();
            self.committer.idle.notify_all();
        }
    }
}

/// The committer: drains waiting batches into one transaction, commits once, answers all;
/// again until nothing waits. Runs on the blocking pool.
fn run_commits(db: &Database, mut turn: CommitterTurn) {
    let committer = turn.committer.clone();
    loop {
        let group = {
            let mut queue = lock(&committer.queue);
            if queue.waiting.is_empty() {
                queue.committing = false;
                turn.finished = true;
                committer.idle.notify_all();
                return;
            }
            take_group(&mut queue.waiting)
        };
        match apply_group(db, &group) {
            Ok(mut results) => {
                // `results` is in group order; hand each caller its own slice.
                for (batch, reply) in group.into_iter().rev() {
                    let mine = results.split_off(results.len() - batch.len());
                    let _ = reply.send(Ok(mine));
                }
            }
            Err(e) => {
                for (_, reply) in group {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// The oldest waiting batches, up to [`MAX_GROUP_OPS`] ops (at least one batch).
fn take_group(waiting: &mut Vec<(Vec<WriteOp>, Reply)>) -> Vec<(Vec<WriteOp>, Reply)> {
    let mut ops = 0;
    let mut count = 0;
    for (batch, _) in waiting.iter() {
        if count > 0 && ops + batch.len() > MAX_GROUP_OPS {
            break;
        }
        ops += batch.len();
        count += 1;
    }
    waiting.drain(..count).collect()
}

/// The tables one write transaction touches, opened once per group.
struct Tables<'txn> {
    docs: Table<'txn, (&'static str, &'static str), &'static [u8]>,
    meta: Table<'txn, &'static str, u64>,
    by_state_modified: Table<'txn, (&'static str, i64, &'static str), ()>,
    by_created: Table<'txn, (i64, &'static str), ()>,
    by_state_created: Table<'txn, (&'static str, i64, &'static str), ()>,
    by_account: Table<'txn, (&'static str, i64, &'static str), ()>,
    released: Table<'txn, (&'static str, &'static str), ()>,
    attention: Table<'txn, (i64, &'static str), ()>,
}

impl<'txn> Tables<'txn> {
    fn open(txn: &'txn WriteTransaction) -> StoreResult<Self> {
        Ok(Self {
            docs: txn.open_table(DOCS).map_err(storage)?,
            meta: txn.open_table(META).map_err(storage)?,
            by_state_modified: txn.open_table(TX_BY_STATE_MODIFIED).map_err(storage)?,
            by_created: txn.open_table(TX_BY_CREATED).map_err(storage)?,
            by_state_created: txn.open_table(TX_BY_STATE_CREATED).map_err(storage)?,
            by_account: txn.open_table(TX_BY_ACCOUNT).map_err(storage)?,
            released: txn.open_table(TX_RELEASED).map_err(storage)?,
            attention: txn.open_table(TX_ATTENTION).map_err(storage)?,
        })
    }
}

/// Applies a group in one write transaction. An op that cannot be applied (its stored
/// document does not decode, its source does not serialize) fails alone, having written
/// nothing; the group fails as a whole only when the transaction does (a storage error, a
/// failed commit), and then no op of it was acknowledged.
fn apply_group(
    db: &Database,
    group: &[(Vec<WriteOp>, Reply)],
) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
    let mut txn = db.begin_write().map_err(storage)?;
    txn.set_durability(Durability::Immediate).map_err(storage)?;
    let mut results = Vec::new();
    {
        let mut tables = Tables::open(&txn)?;
        for (batch, _) in group {
            for op in batch {
                results.push(apply_op(&mut tables, op)?);
            }
        }
    }
    // Only now is anything acknowledged: until commit returns, a crash loses the whole group
    // and no caller has been told it was written. A failed commit leaves the outcome unknown
    // to the callers (they re-read before deciding again), whatever redb's reason.
    txn.commit().map_err(|e| {
        StoreError::Unavailable(format!(
            "embedded store: commit failed, the writes may or may not be applied: {e}"
        ))
    })?;
    Ok(results)
}

/// Applies one op. The inner result is the op's own outcome; an inner error is returned only
/// before the op wrote anything (every check and the serialization come first). The outer
/// error is a storage error, which fails the whole transaction (redb poisons a transaction
/// that failed part-way through a change).
fn apply_op(tables: &mut Tables<'_>, op: &WriteOp) -> StoreResult<StoreResult<WriteOutcome>> {
    let index = op.index();
    let id = op.id();
    let current = match tables.docs.get((index.name(), id)).map_err(storage)? {
        // A create only needs to know that the id is taken, whatever is stored there.
        Some(_) if matches!(op, WriteOp::Create { .. }) => {
            return Ok(Ok(WriteOutcome::AlreadyExists))
        }
        Some(bytes) => match decode(id, bytes.value()) {
            Ok(doc) => Some(doc),
            Err(e) => return Ok(Err(e)),
        },
        None => None,
    };
    let source = match (op, &current) {
        (WriteOp::Create { .. }, Some(_)) => return Ok(Ok(WriteOutcome::AlreadyExists)),
        (WriteOp::Create { source, .. }, None) => source,
        (WriteOp::ReplaceIf { .. }, None) => return Ok(Ok(WriteOutcome::NotFound)),
        (
            WriteOp::ReplaceIf {
                source, expected, ..
            },
            Some(doc),
        ) => {
            if doc.version != *expected {
                return Ok(Ok(WriteOutcome::Conflict));
            }
            source
        }
    };
    let bytes = match serde_json::to_vec(source) {
        Ok(bytes) => bytes,
        Err(e) => return Ok(Err(permanent(format_args!("document {id}: {e}")))),
    };
    let counter = match index {
        Index::Accounts => "seq:accounts",
        Index::Transactions => "seq:transactions",
    };
    let seq_no = match tables.meta.get(counter).map_err(storage)? {
        Some(last) => last.value() + 1,
        None => 0,
    };
    // Every check passed: from here on, only writes.
    tables.meta.insert(counter, seq_no).map_err(storage)?;
    let mut value = Vec::with_capacity(8 + bytes.len());
    value.extend_from_slice(&seq_no.to_le_bytes());
    value.extend_from_slice(&bytes);
    tables
        .docs
        .insert((index.name(), id), value.as_slice())
        .map_err(storage)?;
    if index == Index::Transactions {
        let old = current.as_ref().map(|doc| transfer_keys(&doc.source));
        update_transfer_indexes(tables, id, old.as_ref(), &transfer_keys(source))?;
    }
    Ok(Ok(WriteOutcome::Written(Version {
        seq_no,
        primary_term: PRIMARY_TERM,
    })))
}

/// The secondary-index keys of one transfer document.
#[derive(PartialEq, Eq)]
struct TransferKeys<'a> {
    state: &'a str,
    /// No lease owner: the lease was released.
    released: bool,
    modified: i64,
    created: i64,
    src: &'a str,
    dest: &'a str,
    /// Flagged for a person ([`carries_attention`]).
    attention: bool,
}

fn transfer_keys(source: &Value) -> TransferKeys<'_> {
    let text = |f: &str| source.get(f).and_then(Value::as_str).unwrap_or("");
    let millis = |f: &str| {
        source
            .get(f)
            .and_then(Value::as_str)
            .and_then(parse_millis)
            .unwrap_or(0)
    };
    TransferKeys {
        state: text(fields::STATE),
        // Terminal transfers have no owner either; only in-flight ones are candidates.
        released: source.get(fields::LEASE_OWNER).is_none_or(Value::is_null)
            && !matches!(text(fields::STATE), "finished" | "rolled-back"),
        modified: millis(fields::MODIFIED),
        created: millis(fields::CREATED),
        src: text(fields::SRC),
        dest: text(fields::DEST),
        attention: carries_attention(source),
    }
}

/// Moves a transfer's index entries from `old` keys (if it existed) to `new` keys, touching
/// only the entries whose keys changed.
fn update_transfer_indexes(
    t: &mut Tables<'_>,
    id: &str,
    old: Option<&TransferKeys<'_>>,
    new: &TransferKeys<'_>,
) -> StoreResult<()> {
    let e = storage;
    if let Some(old) = old {
        if old.released && (old.state, old.released) != (new.state, new.released) {
            t.released.remove((old.state, id)).map_err(e)?;
        }
        if (old.state, old.modified) != (new.state, new.modified) {
            t.by_state_modified
                .remove((old.state, old.modified, id))
                .map_err(e)?;
        }
        if old.created != new.created {
            t.by_created.remove((old.created, id)).map_err(e)?;
        }
        if old.attention && (old.created, old.attention) != (new.created, new.attention) {
            t.attention.remove((old.created, id)).map_err(e)?;
        }
        if (old.state, old.created) != (new.state, new.created) {
            t.by_state_created
                .remove((old.state, old.created, id))
                .map_err(e)?;
        }
        if (old.src, old.dest, old.created) != (new.src, new.dest, new.created) {
            t.by_account.remove((old.src, old.created, id)).map_err(e)?;
            t.by_account
                .remove((old.dest, old.created, id))
                .map_err(e)?;
        }
    }
    t.by_state_modified
        .insert((new.state, new.modified, id), ())
        .map_err(e)?;
    t.by_created.insert((new.created, id), ()).map_err(e)?;
    if new.released {
        t.released.insert((new.state, id), ()).map_err(e)?;
    }
    if new.attention {
        t.attention.insert((new.created, id), ()).map_err(e)?;
    }
    t.by_state_created
        .insert((new.state, new.created, id), ())
        .map_err(e)?;
    t.by_account
        .insert((new.src, new.created, id), ())
        .map_err(e)?;
    t.by_account
        .insert((new.dest, new.created, id), ())
        .map_err(e)?;
    Ok(())
}

fn decode(id: &str, bytes: &[u8]) -> StoreResult<Doc> {
    if bytes.len() < 8 {
        return Err(StoreError::Permanent(format!(
            "embedded store: document {id} is truncated"
        )));
    }
    let (seq, json) = bytes.split_at(8);
    let seq_no = u64::from_le_bytes(seq.try_into().expect("8 bytes"));
    let source = serde_json::from_slice(json).map_err(permanent)?;
    Ok(Doc {
        id: id.to_owned(),
        version: Version {
            seq_no,
            primary_term: PRIMARY_TERM,
        },
        source,
    })
}

fn read_doc(db: &Database, index: Index, id: &str) -> StoreResult<Option<Doc>> {
    let txn = db.begin_read().map_err(storage)?;
    let docs = txn.open_table(DOCS).map_err(storage)?;
    match docs.get((index.name(), id)).map_err(storage)? {
        Some(bytes) => Ok(Some(decode(id, bytes.value())?)),
        None => Ok(None),
    }
}

/// Loads the transfers named by `keys` (in that order) from one read transaction, up to
/// `limit` of those `filter` keeps. `next` is the last key taken when the page is full.
///
/// A stored document that does not decode is skipped with a warning rather than failing the
/// page: otherwise recovery would stop at the oldest broken document forever, and the listing
/// could not page past it. Skipped keys count as examined: callers that cut their key scan
/// set `next` to the last key, so the cursor still moves past them.
fn load_transfers(
    db: &Database,
    keys: Vec<SortKey>,
    limit: usize,
    filter: impl Fn(&Doc) -> bool,
) -> StoreResult<Page> {
    let txn = db.begin_read().map_err(storage)?;
    let docs = txn.open_table(DOCS).map_err(storage)?;
    let mut out = Vec::new();
    let mut last = None;
    for key in keys {
        if out.len() == limit {
            break;
        }
        let Some(bytes) = docs
            .get((Index::Transactions.name(), key.id.as_str()))
            .map_err(storage)?
        else {
            continue;
        };
        match decode(&key.id, bytes.value()) {
            Ok(doc) => {
                if filter(&doc) {
                    out.push(doc);
                    last = Some(key);
                }
            }
            Err(error) => tracing::warn!(
                transfer_id = %key.id,
                %error,
                "skipping a stored transfer that does not decode"
            ),
        }
    }
    let next = if out.len() == limit && limit > 0 {
        last
    } else {
        None
    };
    Ok(Page { docs: out, next })
}

/// The keys of released transfers in the query's states that the stale range does not
/// already cover (modified at or after the bound), after the cursor.
fn released_keys(txn: &redb::ReadTransaction, q: &StaleQuery) -> StoreResult<Vec<SortKey>> {
    let released = txn.open_table(TX_RELEASED).map_err(storage)?;
    let docs = txn.open_table(DOCS).map_err(storage)?;
    let mut keys = Vec::new();
    for state in &q.states {
        for entry in released.range((state.as_str(), "")..).map_err(storage)? {
            let (key, _) = entry.map_err(storage)?;
            let (key_state, id) = key.value();
            if key_state != state {
                break;
            }
            let Some(bytes) = docs
                .get((Index::Transactions.name(), id))
                .map_err(storage)?
            else {
                continue;
            };
            let Ok(doc) = decode(id, bytes.value()) else {
                continue;
            };
            let millis = transfer_keys(&doc.source).modified;
            let key = SortKey {
                millis,
                id: id.to_owned(),
            };
            if millis >= q.modified_before && q.after.as_ref().is_none_or(|after| &key > after) {
                keys.push(key);
            }
        }
    }
    Ok(keys)
}

fn find_stale_blocking(db: &Database, q: &StaleQuery) -> StoreResult<Page> {
    let txn = db.begin_read().map_err(storage)?;
    let table = txn.open_table(TX_BY_STATE_MODIFIED).map_err(storage)?;
    // Up to `limit` candidates from each state, merged by (modification_time, id).
    let mut keys = Vec::new();
    // The lowest last candidate among the states whose scan stopped at its bound: beyond it,
    // that state's keys were not looked at, so the merged page must not go past it.
    let mut horizon: Option<SortKey> = None;
    for state in &q.states {
        let (from_millis, from_id) = match &q.after {
            Some(k) => (k.millis, k.id.as_str()),
            None => (i64::MIN, ""),
        };
        if from_millis >= q.modified_before {
            continue;
        }
        let range = table
            .range((state.as_str(), from_millis, from_id)..(state.as_str(), q.modified_before, ""))
            .map_err(storage)?;
        let mut seen = 0;
        let mut last = None;
        for entry in range.take(q.limit + 1) {
            let (key, _) = entry.map_err(storage)?;
            let (_, millis, id) = key.value();
            let key = SortKey {
                millis,
                id: id.to_owned(),
            };
            seen += 1;
            last = Some(key.clone());
            if q.after.as_ref() != Some(&key) {
                keys.push(key);
            }
        }
        if seen == q.limit + 1 {
            horizon = match (horizon, last) {
                (Some(h), Some(l)) => Some(h.min(l)),
                (h, l) => h.or(l),
            };
        }
    }
    keys.extend(released_keys(&txn, q)?);
    keys.sort();
    keys.dedup();
    if let Some(horizon) = &horizon {
        keys.retain(|key| key <= horizon);
    }
    drop(table);
    drop(txn);
    // Not full although a state was cut: every key up to the horizon was examined (some did
    // not decode), so continue after the last one.
    let cut = horizon
        .filter(|_| q.limit > 0)
        .and_then(|_| keys.last().cloned());
    let mut page = load_transfers(db, keys, q.limit, |_| true)?;
    if page.next.is_none() {
        page.next = cut;
    }
    Ok(page)
}

fn list_blocking(db: &Database, f: &TransferFilter) -> StoreResult<Page> {
    // How many index entries to look at: one index serves the most selective filter and the
    // others are checked on the documents, so with more than one filter look further
    // (bounded, to keep one request cheap).
    let filters = [f.attention, f.account.is_some(), f.state.is_some()];
    let scan = if filters.into_iter().filter(|&on| on).count() > 1 {
        f.limit.saturating_mul(50).max(1000)
    } else {
        f.limit + 1
    };
    let (keys, scanned) = keys_before_cursor(db, f, scan)?;
    // When the scan stopped at its bound, say where it stopped even if the page is not full,
    // so a client paging through a busy account never mistakes "not scanned" for "none".
    // (Keys whose document does not decode are skipped by `load_transfers`, so the page may
    // be short for that reason too: counting entries scanned, not keys kept, still moves the
    // cursor past them.)
    let scan_cut = (scanned >= scan).then(|| keys.last().cloned()).flatten();
    let filter = f.clone();
    let mut page = load_transfers(db, keys, f.limit, move |doc| matches(&filter, &doc.source))?;
    if page.next.is_none() {
        page.next = scan_cut;
    }
    Ok(page)
}

/// Whether a transfer passes every filter of `f` (the index walked serves one of them).
fn matches(f: &TransferFilter, source: &Value) -> bool {
    let text = |field: &str| source.get(field).and_then(Value::as_str);
    f.state
        .as_deref()
        .is_none_or(|s| text(fields::STATE) == Some(s))
        && f.account
            .as_deref()
            .is_none_or(|a| text(fields::SRC) == Some(a) || text(fields::DEST) == Some(a))
        && (!f.attention || carries_attention(source))
}

/// Newest first: the keys of up to `scan` entries of the index that serves `f`, walked
/// backwards from the cursor (exclusive), and how many entries were looked at, the cursor's
/// own included.
fn keys_before_cursor(
    db: &Database,
    f: &TransferFilter,
    scan: usize,
) -> StoreResult<(Vec<SortKey>, usize)> {
    let txn = db.begin_read().map_err(storage)?;
    let upper = match &f.after {
        Some(k) => (k.millis, k.id.as_str()),
        None => (i64::MAX, "\u{10FFFF}"),
    };
    let mut keys = Vec::new();
    let mut scanned = 0;
    let mut push = |millis: i64, id: &str| {
        scanned += 1;
        let key = SortKey {
            millis,
            id: id.to_owned(),
        };
        if f.after.is_none() || Some(&key) < f.after.as_ref() {
            keys.push(key);
        }
    };
    if f.attention {
        // Flagged transfers are few: the most selective index whatever else is asked.
        let table = txn.open_table(TX_ATTENTION).map_err(storage)?;
        let range = table.range((i64::MIN, "")..=upper).map_err(storage)?;
        for entry in range.rev().take(scan) {
            let (key, _) = entry.map_err(storage)?;
            let (millis, id) = key.value();
            push(millis, id);
        }
    } else if let Some(account) = &f.account {
        walk_back_within(&txn, TX_BY_ACCOUNT, account, upper, scan, &mut push)?;
    } else if let Some(state) = &f.state {
        walk_back_within(&txn, TX_BY_STATE_CREATED, state, upper, scan, &mut push)?;
    } else {
        let table = txn.open_table(TX_BY_CREATED).map_err(storage)?;
        let range = table.range((i64::MIN, "")..=upper).map_err(storage)?;
        for entry in range.rev().take(scan) {
            let (key, _) = entry.map_err(storage)?;
            let (millis, id) = key.value();
            push(millis, id);
        }
    }
    Ok((keys, scanned))
}

/// Walks the entries of `prefix` in a `(prefix, millis, id)` index backwards from `upper`
/// (inclusive), passing up to `scan` of them to `push`.
fn walk_back_within(
    txn: &ReadTransaction,
    index: TableDefinition<'static, (&'static str, i64, &'static str), ()>,
    prefix: &str,
    (to_millis, to_id): (i64, &str),
    scan: usize,
    push: &mut impl FnMut(i64, &str),
) -> StoreResult<()> {
    let table = txn.open_table(index).map_err(storage)?;
    let range = table
        .range((prefix, i64::MIN, "")..=(prefix, to_millis, to_id))
        .map_err(storage)?;
    for entry in range.rev().take(scan) {
        let (key, _) = entry.map_err(storage)?;
        let (_, millis, id) = key.value();
        push(millis, id);
    }
    Ok(())
}

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        let id = id.to_owned();
        self.read(move |db| read_doc(db, index, &id)).await
    }

    async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        let start_committer = {
            let mut queue = lock(&self.committer.queue);
            if queue.closed {
                return Err(StoreError::Permanent("embedded store is closed".into()));
            }
            queue.waiting.push((ops, reply));
            !std::mem::replace(&mut queue.committing, true)
        };
        if start_committer {
            let db = self.db.clone();
            let turn = CommitterTurn {
                committer: self.committer.clone(),
                finished: false,
            };
            tokio::task::spawn_blocking(move || run_commits(&db, turn));
        }
        answer
            .await
            .map_err(|_| StoreError::Permanent("embedded store committer has stopped".into()))?
    }

    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page> {
        let query = query.clone();
        self.read(move |db| find_stale_blocking(db, &query)).await
    }

    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page> {
        let filter = filter.clone();
        self.read(move |db| list_blocking(db, &filter)).await
    }

    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<ScanPage> {
        let after = after.map(str::to_owned);
        self.read(move |db| {
            let txn = db.begin_read().map_err(storage)?;
            let docs = txn.open_table(DOCS).map_err(storage)?;
            let start = after.as_deref().unwrap_or("");
            let mut out = Vec::new();
            for entry in docs.range((index.name(), start)..).map_err(storage)? {
                let (key, value) = entry.map_err(storage)?;
                let (doc_index, id) = key.value();
                if doc_index != index.name() || out.len() == limit {
                    break;
                }
                if after.as_deref() == Some(id) {
                    continue;
                }
                out.push(decode(id, value.value())?);
            }
            let next = (out.len() == limit)
                .then(|| out.last().map(|d| d.id.clone()))
                .flatten();
            Ok(ScanPage { docs: out, next })
        })
        .await
    }

    async fn ready(&self) -> StoreResult<()> {
        self.read(|db| {
            let txn = db.begin_read().map_err(storage)?;
            txn.open_table(DOCS).map_err(storage)?;
            Ok(())
        })
        .await
    }

    async fn refresh(&self) -> StoreResult<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use serde_json::json;

    use super::*;
    use crate::store::format_millis;

    fn open() -> (tempfile::TempDir, EmbeddedStore) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open(dir.path()).expect("open");
        (dir, store)
    }

    fn transfer(id: &str, state: &str, modified: i64) -> Value {
        json!({
            "transaction_id": id,
            "src_acct": "a",
            "dest_acct": "b",
            "amount": 1,
            "transaction_state": state,
            "creation_time": format_millis(modified),
            "modification_time": format_millis(modified),
        })
    }

    /// Overwrites a stored document with bytes that do not decode, leaving its version
    /// prefix and its index entries in place (as a torn or foreign write would).
    fn break_doc(db: &Database, index: Index, id: &str) {
        let txn = db.begin_write().unwrap();
        {
            let mut docs = txn.open_table(DOCS).unwrap();
            let mut value = 42u64.to_le_bytes().to_vec();
            value.extend_from_slice(b"{\"not json");
            docs.insert((index.name(), id), value.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }

    #[tokio::test]
    async fn a_store_written_before_the_attention_index_gets_it_built_when_opened() {
        let dir = tempfile::tempdir().expect("temp dir");
        let flagged = || {
            let mut doc = transfer("t2", "pending", 2);
            doc[fields::ATTENTION] = json!("contradiction");
            doc
        };
        let list = TransferFilter {
            attention: true,
            limit: 10,
            ..TransferFilter::default()
        };
        {
            let store = EmbeddedStore::open(dir.path()).unwrap();
            store
                .create(Index::Transactions, "t1", transfer("t1", "pending", 1))
                .await
                .unwrap();
            store
                .create(Index::Transactions, "t2", flagged())
                .await
                .unwrap();
            // As an older version left it: no index of flagged transfers, no marker.
            let txn = store.db.begin_write().unwrap();
            txn.delete_table(TX_ATTENTION).unwrap();
            txn.open_table(META)
                .unwrap()
                .remove(ATTENTION_BUILT)
                .unwrap();
            txn.commit().unwrap();
        }
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let page = store.list_transfers(&list).await.unwrap();
        let ids: Vec<&str> = page.docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["t2"]);
        // Built once: opening again neither duplicates nor loses it.
        drop(store);
        let store = EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(store.list_transfers(&list).await.unwrap().docs.len(), 1);
    }

    fn raw(db: &Database, index: Index, id: &str) -> Option<Vec<u8>> {
        let txn = db.begin_read().unwrap();
        let docs = txn.open_table(DOCS).unwrap();
        let value = docs.get((index.name(), id)).unwrap();
        value.map(|v| v.value().to_vec())
    }

    fn created_index_ids(db: &Database) -> Vec<String> {
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(TX_BY_CREATED).unwrap();
        let ids = table
            .iter()
            .unwrap()
            .map(|entry| entry.unwrap().0.value().1.to_owned())
            .collect();
        ids
    }

    fn replace(id: &str, source: Value, seq_no: u64) -> WriteOp {
        WriteOp::ReplaceIf {
            index: Index::Transactions,
            id: id.into(),
            source,
            expected: Version {
                seq_no,
                primary_term: PRIMARY_TERM,
            },
        }
    }

    fn create(id: &str, source: Value) -> WriteOp {
        WriteOp::Create {
            index: Index::Transactions,
            id: id.into(),
            source,
        }
    }

    fn written(result: &StoreResult<WriteOutcome>) -> u64 {
        match result {
            Ok(WriteOutcome::Written(v)) => v.seq_no,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_op_on_an_undecodable_document_fails_alone_and_writes_nothing() {
        let (_dir, store) = open();
        store
            .create(
                Index::Transactions,
                "bad",
                transfer("bad", "created", 1_000),
            )
            .await
            .unwrap();
        break_doc(&store.db, Index::Transactions, "bad");
        let before = raw(&store.db, Index::Transactions, "bad");

        let results = store
            .bulk(vec![
                create("one", transfer("one", "created", 2_000)),
                replace("bad", transfer("bad", "pending", 3_000), 42),
                create("bad", transfer("bad", "pending", 3_000)),
                create("two", transfer("two", "created", 4_000)),
            ])
            .await
            .expect("the group commits");
        assert_eq!(results.len(), 4);
        let one = written(&results[0]);
        assert!(
            matches!(results[1], Err(StoreError::Permanent(_))),
            "{:?}",
            results[1]
        );
        assert_eq!(
            results[2],
            Ok(WriteOutcome::AlreadyExists),
            "the id is taken"
        );
        // No sequence number was spent on the failed ops: nothing of theirs was written.
        assert_eq!(written(&results[3]), one + 1);
        assert_eq!(raw(&store.db, Index::Transactions, "bad"), before);
        let mut indexed = created_index_ids(&store.db);
        indexed.sort();
        assert_eq!(
            indexed,
            ["bad", "one", "two"],
            "bad keeps its one old entry"
        );
        assert!(store
            .get(Index::Transactions, "one")
            .await
            .unwrap()
            .is_some());
        assert!(store
            .get(Index::Transactions, "two")
            .await
            .unwrap()
            .is_some());
    }

    #[test]
    fn in_a_group_of_callers_only_the_failing_op_fails() {
        let (_dir, store) = open();
        break_doc(&store.db, Index::Accounts, "bad");
        let reply = || oneshot::channel().0;
        let group = vec![
            (
                vec![create("first", transfer("first", "created", 1))],
                reply(),
            ),
            (
                vec![WriteOp::ReplaceIf {
                    index: Index::Accounts,
                    id: "bad".into(),
                    source: json!({}),
                    expected: Version {
                        seq_no: 42,
                        primary_term: PRIMARY_TERM,
                    },
                }],
                reply(),
            ),
            (
                vec![create("third", transfer("third", "created", 3))],
                reply(),
            ),
        ];
        let results = apply_group(&store.db, &group).expect("the group commits");
        assert_eq!(results.len(), 3);
        assert_eq!(written(&results[0]) + 1, written(&results[2]));
        assert!(matches!(results[1], Err(StoreError::Permanent(_))));
        assert!(raw(&store.db, Index::Transactions, "first").is_some());
        assert!(raw(&store.db, Index::Transactions, "third").is_some());
    }

    async fn stale_ids(store: &EmbeddedStore, states: &[&str], limit: usize) -> Vec<String> {
        let mut after = None;
        let mut ids = Vec::new();
        for _ in 0..100 {
            let page = store
                .find_stale(&StaleQuery {
                    states: states.iter().map(|s| s.to_string()).collect(),
                    modified_before: 1_000_000,
                    after: after.clone(),
                    limit,
                })
                .await
                .expect("a broken document does not fail the page");
            ids.extend(page.docs.into_iter().map(|d| d.id));
            match page.next {
                Some(next) => after = Some(next),
                None => return ids,
            }
        }
        panic!("paging does not end: {ids:?}");
    }

    #[tokio::test]
    async fn find_stale_skips_undecodable_documents_and_pages_past_them() {
        let (_dir, store) = open();
        // Two states, interleaved in time, so pages merge candidates of both.
        let mut all = Vec::new();
        for i in 0..12 {
            let (id, state) = if i % 2 == 0 {
                (format!("c{i:02}"), "created")
            } else {
                (format!("p{i:02}"), "pending")
            };
            store
                .create(Index::Transactions, &id, transfer(&id, state, 1_000 + i))
                .await
                .unwrap();
            all.push(id);
        }
        // Broken: the two oldest (a whole first page), and a run in the middle.
        let broken = ["c00", "p01", "c04", "p05", "c06"];
        for id in broken {
            break_doc(&store.db, Index::Transactions, id);
        }
        let good: Vec<_> = all
            .iter()
            .filter(|id| !broken.contains(&id.as_str()))
            .cloned()
            .collect();
        for limit in [1, 2, 3, 5, 20] {
            assert_eq!(
                stale_ids(&store, &["created", "pending"], limit).await,
                good,
                "limit {limit}"
            );
        }
        let created: Vec<_> = good
            .iter()
            .filter(|id| id.starts_with('c'))
            .cloned()
            .collect();
        assert_eq!(stale_ids(&store, &["created"], 1).await, created);
    }

    #[tokio::test]
    async fn find_stale_pages_are_unchanged_without_broken_documents() {
        let (_dir, store) = open();
        for i in 0..7 {
            let id = format!("t{i}");
            let state = if i % 3 == 0 { "pending" } else { "created" };
            store
                .create(Index::Transactions, &id, transfer(&id, state, 1_000 + i))
                .await
                .unwrap();
        }
        let page = store
            .find_stale(&StaleQuery {
                states: vec!["created".into(), "pending".into()],
                modified_before: 1_000_000,
                after: None,
                limit: 3,
            })
            .await
            .unwrap();
        let ids: Vec<_> = page.docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["t0", "t1", "t2"]);
        assert_eq!(page.next.map(|k| k.id).as_deref(), Some("t2"));
        let all = stale_ids(&store, &["created", "pending"], 3).await;
        assert_eq!(all, ["t0", "t1", "t2", "t3", "t4", "t5", "t6"]);
    }

    #[tokio::test]
    async fn list_transfers_skips_undecodable_documents_and_pages_past_them() {
        let (_dir, store) = open();
        for i in 0..6 {
            let id = format!("t{i}");
            store
                .create(
                    Index::Transactions,
                    &id,
                    transfer(&id, "created", 1_000 + i),
                )
                .await
                .unwrap();
        }
        for id in ["t5", "t4", "t2"] {
            break_doc(&store.db, Index::Transactions, id);
        }
        for filter in [
            TransferFilter::default(),
            TransferFilter {
                state: Some("created".into()),
                ..Default::default()
            },
            TransferFilter {
                account: Some("a".into()),
                ..Default::default()
            },
        ] {
            for limit in [1, 2, 10] {
                let mut after = None;
                let mut ids = Vec::new();
                for _ in 0..100 {
                    let page = store
                        .list_transfers(&TransferFilter {
                            after: after.clone(),
                            limit,
                            ..filter.clone()
                        })
                        .await
                        .expect("a broken document does not fail the page");
                    ids.extend(page.docs.into_iter().map(|d| d.id));
                    after = page.next;
                    if after.is_none() {
                        break;
                    }
                }
                assert_eq!(ids, ["t3", "t1", "t0"], "{filter:?}, limit {limit}");
            }
        }
    }

    /// An in-memory redb backend whose writes and syncs fail while `failing` is set.
    #[derive(Debug, Default)]
    struct FlakyDisk {
        inner: redb::backends::InMemoryBackend,
        failing: Arc<AtomicBool>,
    }

    impl FlakyDisk {
        fn check(&self) -> std::io::Result<()> {
            if self.failing.load(Ordering::SeqCst) {
                Err(std::io::Error::other("injected I/O error"))
            } else {
                Ok(())
            }
        }
    }

    impl redb::StorageBackend for FlakyDisk {
        fn len(&self) -> std::io::Result<u64> {
            self.inner.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
            self.inner.read(offset, out)
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.check()?;
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.check()?;
            self.inner.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.check()?;
            self.inner.write(offset, data)
        }
    }

    #[tokio::test]
    async fn an_io_error_in_the_group_commit_is_unavailable_not_permanent() {
        let disk = FlakyDisk::default();
        let failing = disk.failing.clone();
        let db = redb::Builder::new().create_with_backend(disk).unwrap();
        let store = EmbeddedStore::start(db, PathBuf::from("memory")).unwrap();
        let ok = store
            .create(Index::Accounts, "a", json!({ "n": 1 }))
            .await
            .unwrap();
        assert!(matches!(ok, WriteOutcome::Written(_)));

        failing.store(true, Ordering::SeqCst);
        let failed = store.create(Index::Accounts, "b", json!({ "n": 2 })).await;
        assert!(
            matches!(&failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );
        // redb refuses further writes after an I/O error (until reopened): still transient
        // from the callers' point of view, never a refusal of their request.
        failing.store(false, Ordering::SeqCst);
        let after = store.create(Index::Accounts, "c", json!({ "n": 3 })).await;
        assert!(
            matches!(
                &after,
                Ok(WriteOutcome::Written(_)) | Err(StoreError::Unavailable(_))
            ),
            "{after:?}"
        );
    }

    #[test]
    fn storage_errors_are_classified() {
        let io = redb::StorageError::Io(std::io::Error::other("disk"));
        assert!(storage(io).is_retryable());
        assert!(storage(redb::StorageError::PreviousIo).is_retryable());
        assert!(!storage(redb::StorageError::Corrupted("bad page".into())).is_retryable());
        assert!(!storage(redb::StorageError::ValueTooLarge(1 << 40)).is_retryable());
    }
}
