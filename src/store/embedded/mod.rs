//! The embedded backend: a durable redb file with Elasticsearch's per-document semantics.
//!
//! It is the default store (no `ELASTICSEARCH_URL`), so `cargo run` works with nothing else
//! installed and every protocol test runs against real, crash-safe storage.
//!
//! - **Durability.** When a write is acknowledged it is on disk and survives `kill -9` and
//!   power loss: its group's record in the write-ahead log was fsynced before the group's
//!   transaction committed (`wal`: redb commits without an fsync of its own between
//!   checkpoints, and opening the store replays the log).
//! - **Group commit.** One committer at a time owns the write transactions: the caller that
//!   finds nobody committing becomes it, on tokio's blocking pool, and while it commits the
//!   others queue. It takes every batch that is waiting (up to [`MAX_GROUP_OPS`] ops),
//!   applies them one by one in its open transaction, logs them once, answers every caller,
//!   and goes on until the queue is empty. (The transaction stays open across groups and
//!   commits now and then, or before a search: `recent_writes`.) (On the blocking pool, tokio knows work is under
//!   way: tests on paused time do not see the clock jump while a commit runs.) Concurrent writers therefore
//!   share one log append and one fsync instead of paying one each. Each op is checked on its own, so a
//!   conflicting op changes nothing and does not affect the others (like `_bulk`); an op that
//!   cannot be applied (a transfer whose stored or new source is not a JSON object, so its
//!   index entries cannot be found) fails alone, `Permanent`, having written nothing. Only a failure of the transaction itself fails the whole group.
//! - **Errors.** An I/O failure of the running store (starting a write transaction, a table
//!   access, a commit) is `Unavailable`: the outcome is unknown to the callers, who re-read
//!   and retry or leave the transfer to recovery. Corruption and other refusals are
//!   `Permanent`, as is any failure to open the file.
//! - **Versions.** `seq_no` is per index and increases on every applied write, like a
//!   single-shard Elasticsearch index; the primary term is always 1 (there is no failover).
//! - **Sources are bytes.** Documents are stored as the JSON the caller sent (a transfer
//!   written terminal compressed, `at_rest`) and handed back as sent; only a transfer's
//!   indexed fields are read (borrowed, the rest skipped).
//! - **Searches** use secondary index tables kept in the same transaction as the documents, so
//!   they are realtime (stricter than Elasticsearch's near-real-time; the engine relies on
//!   neither). A stored transfer that does not decode is skipped by them (with a warning), so
//!   recovery and the listing page past it instead of stopping there.
//! - One process holds the file at a time (redb locks it); a second one fails to open it.
//!
//! Here: the store and its `Store` implementation. `read_only`: the store as the auditor
//! opens it, reading the file and writing nothing. `commit`: the group commit; `wal`: the
//! write-ahead log and its replay; `disk`: the files as the store writes them (what a power
//! cut can take is decided there; the power-loss tests put a simulated disk behind it);
//! `recent_writes`: the acknowledged writes of the open transaction; `listing_entries`: new
//! transfers' listing entries, written in sorted runs; `tables`: the tables, the document encoding and the secondary indexes; `at_rest`:
//! a document's value as stored (its `seq_no`, and terminal transfers compressed); `search`: the
//! searches that walk those indexes.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};

use async_trait::async_trait;
use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, Table, TableDefinition,
    WriteTransaction,
};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use tokio::sync::oneshot;

use super::{
    ChangesPage, ChangesQuery, Doc, EntriesQuery, FeedPosition, Index, Page, ScanPage, SortKey,
    Source, StaleQuery, Store, StoreError, StoreResult, TransferFilter, TxnOutcome, TxnReads,
    TxnWork, Version, WriteOp, WriteOutcome,
};
use crate::time::parse_millis;

mod at_rest;
mod commit;
mod disk;
mod listing_entries;
mod read_only;
mod recent_writes;
mod search;
mod statement_index;
mod tables;
#[cfg(test)]
mod tests;
mod wal;
mod writes;

use at_rest::{seq_no_of, split_stored, value_of};
pub use commit::MAX_GROUP_OPS;
use commit::*;
use disk::{DataDir, DatabaseBackend, DatabaseFile, OsDataDir};
pub use disk::{NEW_DATABASE_FILE_NAME, STOPPED_FILE_NAME};
use listing_entries::*;
pub use read_only::{ReadOnlyEmbeddedStore, TableSize};
use recent_writes::*;
use search::*;
use tables::*;
use wal::*;
pub use wal::{BUSY_GROUP_OPS, CHECKPOINT_BYTES, CHECKPOINT_INTERVAL, LOG_FILE_NAME};
use writes::*;

/// File name of the database inside `DATA_DIR`.
pub const FILE_NAME: &str = "transfer-service.redb";

/// redb's page cache unless configured (`EMBEDDED_CACHE_MIB`): redb's own default is 1 GiB,
/// which the process's memory grows into as the file grows. The working set (the accounts,
/// the transfers in flight, the newest index pages) is far smaller; a page the cache no longer
/// holds is read again from the kernel's page cache. Under 2,000 connections the benchmark's
/// peak RSS was 213 MiB with 64 and 188 MiB with 32, at the same CPU per transfer
/// (docs/benchmark.md).
pub const DEFAULT_CACHE_MIB: usize = 32;

/// The redb-backed store. Hold it in an `Arc` (it is a [`Store`]).
pub struct EmbeddedStore {
    db: Arc<Database>,
    committer: Arc<Committer>,
    path: PathBuf,
    /// Its identity ([`Store::identity`]): `e` and the random id made when it was created.
    identity: String,
}

impl Drop for EmbeddedStore {
    /// Refuses new writes and waits for the committer to finish, so that once the store is
    /// dropped the file is closed and may be opened again (by this process or another).
    ///
    /// Then, unless writes have stopped, it checkpoints (the open transaction commits
    /// durably): the redb file alone holds every write, so the next start has nothing to
    /// replay.
    fn drop(&mut self) {
        lock(&self.committer.queue).closed = true;
        drop(self.committer.wait_idle());
        if self.committer.check_writing().is_ok() {
            let mut log = lock(&self.committer.log);
            let written = write_all_creations(&self.db, &self.committer);
            if let Err(error) =
                written.and_then(|()| checkpoint(&self.db, &self.committer, &mut log))
            {
                tracing::warn!(%error, "embedded store: no checkpoint at close; the next start replays the log");
            }
        }
        // Defensive: every path that stops writing has given up the open transaction
        // already; should one remain, it is rolled back before the file closes (the log
        // holds its acknowledged groups).
        drop(lock(&self.committer.open).take());
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir`, creating the directory if needed, with the
    /// default page cache.
    pub fn open(dir: &Path) -> StoreResult<Self> {
        Self::open_with_cache(dir, DEFAULT_CACHE_MIB)
    }

    /// [`EmbeddedStore::open`] with a page cache of `cache_mib` MiB.
    pub fn open_with_cache(dir: &Path, cache_mib: usize) -> StoreResult<Self> {
        Self::open_with(dir, cache_mib, CHECKPOINT_INTERVAL)
    }

    /// [`EmbeddedStore::open_with_cache`], checkpointing at least every `checkpoint_interval`
    /// under load instead of [`CHECKPOINT_INTERVAL`] (tests choose never, or every group).
    pub fn open_with(
        dir: &Path,
        cache_mib: usize,
        checkpoint_interval: std::time::Duration,
    ) -> StoreResult<Self> {
        let files = OsDataDir::create(dir).map_err(|e| {
            StoreError::Permanent(format!("cannot create data dir {}: {e}", dir.display()))
        })?;
        let (path, new) = (
            files.database(DatabaseFile::Current),
            files.database(DatabaseFile::New),
        );
        let open_db = |file| {
            let backend = DatabaseBackend::open(match file {
                DatabaseFile::Current => &path,
                DatabaseFile::New => &new,
            })?;
            redb::Builder::new()
                .set_cache_size(cache_mib.saturating_mul(1024 * 1024))
                .create_with_backend(backend)
        };
        Self::open_files(Arc::new(files), &path, checkpoint_interval, open_db)
    }

    /// Opens the store on `files`, its database files opened by `open_db`: reads both files
    /// from the disk, not the page cache ([`DataDir::drop_cache`]), makes the database if
    /// there is none, replays the log, and, once that is durable, forgets that the last run
    /// stopped writing, if it did.
    ///
    /// The cache is dropped at every start, not only after a run that recorded a stop: the
    /// note may itself have failed to reach the disk.
    fn open_files(
        files: Arc<dyn DataDir>,
        path: &Path,
        checkpoint_interval: std::time::Duration,
        open_db: impl Fn(DatabaseFile) -> Result<Database, redb::DatabaseError>,
    ) -> StoreResult<Self> {
        let stopped = files.stopped_reason().map_err(permanent)?;
        if let Some(reason) = &stopped {
            tracing::warn!(
                %reason,
                "embedded store: the last run stopped writing; if that was an I/O error, check \
                 the disk (the kernel log, SMART). The files are read from the disk and the \
                 write-ahead log replayed over them"
            );
        }
        files.drop_cache().map_err(permanent)?;
        let cannot_open = |e| StoreError::Permanent(format!("cannot open {}: {e}", path.display()));
        if !files.database_exists().map_err(permanent)? {
            make_database(files.as_ref(), || open_db(DatabaseFile::New)).map_err(cannot_open)?;
        }
        let db = open_db(DatabaseFile::Current).map_err(|e| cannot_open(e.into()))?;
        let (log, content) = Wal::open(files.as_ref(), checkpoint_interval)?;
        let store = Self::start(db, path.to_owned(), log, &content, files.clone())?;
        if stopped.is_some() {
            files.clear_stopped().map_err(permanent)?;
        }
        Ok(store)
    }

    /// Replays the log and creates the tables if needed, in one durable transaction, then
    /// empties the log.
    fn start(
        db: Database,
        path: PathBuf,
        mut log: Wal,
        content: &[u8],
        files: Arc<dyn DataDir>,
    ) -> StoreResult<Self> {
        let db = Arc::new(db);
        // Create every table up front so readers never meet a missing one.
        let txn = db.begin_write().map_err(permanent)?;
        // Numbered first: the log's replay finds a transfer's number in its feed entry (the
        // log holds documents only, so it replays over either layout of the tables).
        number_transfers(&txn)?;
        let replayed = replay_log(&txn, content)?;
        {
            txn.open_table(DOCS).map_err(permanent)?;
            txn.open_table(META).map_err(permanent)?;
            txn.open_table(TX_BY_STATE_MODIFIED).map_err(permanent)?;
            txn.open_table(TX_BY_STATE_CREATED).map_err(permanent)?;
            txn.open_table(TX_RELEASED).map_err(permanent)?;
            txn.open_table(TX_ATTENTION).map_err(permanent)?;
            txn.open_table(TX_METADATA).map_err(permanent)?;
            txn.open_table(TX_ENTRIES).map_err(permanent)?;
            build_attention_index(&txn)?;
            build_metadata_index(&txn)?;
            build_entries_index(&txn)?;
        }
        catch_up_creation_entries(&txn)?;
        let identity = store_id(&txn)?;
        txn.commit().map_err(permanent)?;
        log.continue_after(replayed);
        log.checkpointed().map_err(permanent)?;
        Ok(Self {
            db,
            committer: Arc::new(Committer::new(log, files)),
            path,
            identity: format!("e{identity:016x}"),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues work for the committer, starting one if none is running.
    fn enqueue(&self, waiting: Waiting) -> StoreResult<()> {
        let start_committer = {
            let mut queue = lock(&self.committer.queue);
            if queue.closed {
                return Err(StoreError::Permanent("embedded store is closed".into()));
            }
            queue.waiting.push(waiting);
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
        Ok(())
    }

    /// Has the committer commit its open transaction if it holds acknowledged writes, so that
    /// a search, scan or feed read that starts after this sees every write acknowledged
    /// before it was called (see [`recent_writes`]).
    async fn flush(&self) -> StoreResult<()> {
        // The committer holds the listing entries while it runs a group: then ask it.
        let creations_written = match self.committer.creations.try_lock() {
            Ok(creations) => creations.is_empty(),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner().is_empty(),
            Err(std::sync::TryLockError::WouldBlock) => false,
        };
        // Entries written into the open transaction and not committed yet.
        let uncommitted = (self.committer.listing_uncommitted).load(Ordering::SeqCst);
        if self.committer.recent.is_empty() && creations_written && !uncommitted {
            return Ok(());
        }
        let (reply, answer) = oneshot::channel();
        self.enqueue(Waiting::Flush(reply))?;
        answer.await.map_err(|_| committer_stopped())?
    }

    /// [`EmbeddedStore::flush`], then `f` on the blocking pool.
    async fn search<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> StoreResult<T> + Send + 'static,
    {
        self.flush().await?;
        self.read(f).await
    }

    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> StoreResult<T> + Send + 'static,
    {
        read_blocking(&self.db, f).await
    }
}

/// Runs the read `f` on `db` on the blocking pool (a redb read blocks its thread): the
/// store's and the read-only view's reads.
async fn read_blocking<D, T, F>(db: &Arc<D>, f: F) -> StoreResult<T>
where
    D: Send + Sync + 'static,
    T: Send + 'static,
    F: FnOnce(&D) -> StoreResult<T> + Send + 'static,
{
    let db = db.clone();
    tokio::task::spawn_blocking(move || f(&db))
        .await
        .map_err(|e| StoreError::Permanent(format!("read task failed: {e}")))?
}

/// Makes a new, empty database under its own name, durably, then gives it the store's.
fn make_database(
    files: &dyn DataDir,
    create: impl FnOnce() -> Result<Database, redb::DatabaseError>,
) -> Result<(), redb::Error> {
    files.discard_new_database()?;
    let db = create()?;
    // An empty commit with redb's default durability: the file is a database on the disk.
    db.begin_write()?.commit()?;
    db.close()?;
    files.install_new_database()?;
    Ok(())
}

/// The store's random id in [`META`], made the first time a version that has it opens the
/// store (never 0, which reads as "none yet").
fn store_id(txn: &WriteTransaction) -> StoreResult<u64> {
    let mut meta = txn.open_table(META).map_err(permanent)?;
    let existing = meta.get(STORE_ID).map_err(permanent)?.map(|v| v.value());
    if let Some(id) = existing.filter(|id| *id != 0) {
        return Ok(id);
    }
    let id = rand::random::<u64>().max(1);
    meta.insert(STORE_ID, id).map_err(permanent)?;
    Ok(id)
}

/// Up to `limit` documents of `index` in id order, after the id `after` (for
/// [`Store::scan`]), from the file as committed: of the running store or of one opened
/// read-only ([`ReadOnlyEmbeddedStore`]).
fn scan_docs(
    db: &impl ReadableDatabase,
    index: Index,
    after: Option<&str>,
    limit: usize,
) -> StoreResult<ScanPage> {
    let txn = db.begin_read().map_err(storage)?;
    let docs = txn.open_table(DOCS).map_err(storage)?;
    let start = after.unwrap_or("");
    let mut out = Vec::new();
    for entry in docs.range((index.name(), start)..).map_err(storage)? {
        let (key, value) = entry.map_err(storage)?;
        let (doc_index, id) = key.value();
        if doc_index != index.name() || out.len() == limit {
            break;
        }
        if after == Some(id) {
            continue;
        }
        out.push(decode(id, value.value())?);
    }
    let next = (out.len() == limit)
        .then(|| out.last().map(|d| d.id.clone()))
        .flatten();
    Ok(ScanPage { docs: out, next })
}

/// A caller whose answer the committer dropped: it stopped part-way through the caller's group
/// (a panic), so the outcome is unknown, as after a failed commit.
fn committer_stopped() -> StoreError {
    StoreError::Unavailable(
        "embedded store: the committer stopped part-way; the outcome is unknown".into(),
    )
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

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        // The recent writes first, then redb: the order `recent_writes` explains.
        if let Some(value) = self.committer.recent.get(index, id) {
            return decode(id, &value).map(Some);
        }
        let id = id.to_owned();
        self.read(move |db| read_doc(db, index, &id)).await
    }

    async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        self.enqueue(Waiting::Ops(ops, reply))?;
        answer.await.map_err(|_| committer_stopped())?
    }

    fn transactions(&self) -> bool {
        true
    }

    async fn transact(&self, work: TxnWork) -> StoreResult<TxnOutcome> {
        let (reply, answer) = oneshot::channel();
        self.enqueue(Waiting::Txn(work, reply))?;
        answer.await.map_err(|_| committer_stopped())?
    }

    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page> {
        let query = query.clone();
        self.search(move |db| find_stale_blocking(db, &query)).await
    }

    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page> {
        let filter = filter.clone();
        self.search(move |db| list_blocking(db, &filter)).await
    }

    async fn account_entries(&self, query: &EntriesQuery) -> StoreResult<Vec<Doc>> {
        let query = query.clone();
        self.search(move |db| entries_blocking(db, &query)).await
    }

    async fn changes(&self, query: &ChangesQuery) -> StoreResult<ChangesPage> {
        let query = query.clone();
        self.search(move |db| changes_blocking(db, &query)).await
    }

    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<ScanPage> {
        let after = after.map(str::to_owned);
        self.search(move |db| scan_docs(db, index, after.as_deref(), limit))
            .await
    }

    async fn ready(&self) -> StoreResult<()> {
        self.committer.check_writing()?;
        self.read(|db| {
            let txn = db.begin_read().map_err(storage)?;
            txn.open_table(DOCS).map_err(storage)?;
            Ok(())
        })
        .await
    }

    async fn refresh(&self) -> StoreResult<()> {
        self.flush().await
    }

    async fn identity(&self) -> StoreResult<Option<String>> {
        Ok(Some(self.identity.clone()))
    }
}
