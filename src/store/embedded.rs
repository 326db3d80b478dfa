//! The embedded backend: a durable redb file with Elasticsearch's per-document semantics.
//!
//! It is the default store (no `ELASTICSEARCH_URL`), so `cargo run` works with nothing else
//! installed and every protocol test runs against real, crash-safe storage.
//!
//! - **Durability.** Every write transaction commits with [`Durability::Immediate`]: when a
//!   write is acknowledged, redb has fsynced it, so it survives `kill -9` and power loss.
//! - **Group commit.** One writer thread owns all write transactions. It takes every batch
//!   that is waiting (up to [`MAX_GROUP_OPS`] ops), applies them one by one in a single
//!   transaction and commits once, then answers every caller. Concurrent writers therefore
//!   share one fsync instead of paying one each. Each op is checked on its own, so a
//!   conflicting op changes nothing and does not affect the others (like `_bulk`).
//! - **Versions.** `seq_no` is per index and increases on every applied write, like a
//!   single-shard Elasticsearch index; the primary term is always 1 (there is no failover).
//! - **Searches** use secondary index tables kept in the same transaction as the documents, so
//!   they are realtime (stricter than Elasticsearch's near-real-time; the engine relies on
//!   neither).
//! - One process holds the file at a time (redb locks it); a second one fails to open it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, Table, TableDefinition, WriteTransaction,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::{
    fields, parse_millis, Doc, Index, Page, SortKey, StaleQuery, Store, StoreError, StoreResult,
    TransferFilter, Version, WriteOp, WriteOutcome,
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

/// The most ops one group commit takes; bounds the latency a large group adds.
pub const MAX_GROUP_OPS: usize = 4096;

/// The only primary term this backend knows (no replicas, no failover).
const PRIMARY_TERM: u64 = 1;

/// File name of the database inside `DATA_DIR`.
pub const FILE_NAME: &str = "transfer-service.redb";

type Reply = oneshot::Sender<StoreResult<Vec<StoreResult<WriteOutcome>>>>;

/// The redb-backed store. Cheap to clone? No: hold it in an `Arc` (it is a [`Store`]).
pub struct EmbeddedStore {
    db: Arc<Database>,
    writes: Option<mpsc::UnboundedSender<(Vec<WriteOp>, Reply)>>,
    writer: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
}

impl Drop for EmbeddedStore {
    /// Stops the writer thread and waits for it, so that once the store is dropped the file
    /// is closed and may be opened again (by this process or another).
    fn drop(&mut self) {
        self.writes.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
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
        }
        txn.commit().map_err(permanent)?;

        let (tx, rx) = mpsc::unbounded_channel();
        let writer_db = db.clone();
        let writer = std::thread::Builder::new()
            .name("redb-writer".into())
            .spawn(move || run_writer(writer_db, rx))
            .map_err(|e| StoreError::Permanent(format!("cannot start writer thread: {e}")))?;
        Ok(Self {
            db,
            writes: Some(tx),
            writer: Some(writer),
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

fn permanent(e: impl std::fmt::Display) -> StoreError {
    StoreError::Permanent(format!("embedded store: {e}"))
}

/// The writer thread: drains waiting batches into one transaction, commits once, answers all.
/// It ends when every sender (the store) is gone.
fn run_writer(db: Arc<Database>, mut rx: mpsc::UnboundedReceiver<(Vec<WriteOp>, Reply)>) {
    while let Some(first) = rx.blocking_recv() {
        let mut group = vec![first];
        let mut ops = group[0].0.len();
        while ops < MAX_GROUP_OPS {
            match rx.try_recv() {
                Ok(batch) => {
                    ops += batch.0.len();
                    group.push(batch);
                }
                Err(_) => break,
            }
        }
        let outcome = apply_group(&db, &group);
        match outcome {
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

/// The tables one write transaction touches, opened once per group.
struct Tables<'txn> {
    docs: Table<'txn, (&'static str, &'static str), &'static [u8]>,
    meta: Table<'txn, &'static str, u64>,
    by_state_modified: Table<'txn, (&'static str, i64, &'static str), ()>,
    by_created: Table<'txn, (i64, &'static str), ()>,
    by_state_created: Table<'txn, (&'static str, i64, &'static str), ()>,
    by_account: Table<'txn, (&'static str, i64, &'static str), ()>,
}

impl<'txn> Tables<'txn> {
    fn open(txn: &'txn WriteTransaction) -> StoreResult<Self> {
        Ok(Self {
            docs: txn.open_table(DOCS).map_err(permanent)?,
            meta: txn.open_table(META).map_err(permanent)?,
            by_state_modified: txn.open_table(TX_BY_STATE_MODIFIED).map_err(permanent)?,
            by_created: txn.open_table(TX_BY_CREATED).map_err(permanent)?,
            by_state_created: txn.open_table(TX_BY_STATE_CREATED).map_err(permanent)?,
            by_account: txn.open_table(TX_BY_ACCOUNT).map_err(permanent)?,
        })
    }
}

fn apply_group(
    db: &Database,
    group: &[(Vec<WriteOp>, Reply)],
) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
    let mut txn = db.begin_write().map_err(permanent)?;
    txn.set_durability(Durability::Immediate)
        .map_err(permanent)?;
    let mut results = Vec::new();
    {
        let mut tables = Tables::open(&txn)?;
        for (batch, _) in group {
            for op in batch {
                results.push(Ok(apply_op(&mut tables, op)?));
            }
        }
    }
    // Only now is anything acknowledged: until commit returns, a crash loses the whole group
    // and no caller has been told it was written.
    txn.commit().map_err(permanent)?;
    Ok(results)
}

fn apply_op(tables: &mut Tables<'_>, op: &WriteOp) -> StoreResult<WriteOutcome> {
    let index = op.index();
    let id = op.id();
    let current = match tables.docs.get((index.name(), id)).map_err(permanent)? {
        Some(bytes) => Some(decode(id, bytes.value())?),
        None => None,
    };
    let source = match (op, &current) {
        (WriteOp::Create { .. }, Some(_)) => return Ok(WriteOutcome::AlreadyExists),
        (WriteOp::Create { source, .. }, None) => source,
        (WriteOp::ReplaceIf { .. }, None) => return Ok(WriteOutcome::NotFound),
        (
            WriteOp::ReplaceIf {
                source, expected, ..
            },
            Some(doc),
        ) => {
            if doc.version != *expected {
                return Ok(WriteOutcome::Conflict);
            }
            source
        }
    };
    let bytes = serde_json::to_vec(source).map_err(permanent)?;
    let counter = match index {
        Index::Accounts => "seq:accounts",
        Index::Transactions => "seq:transactions",
    };
    let seq_no = match tables.meta.get(counter).map_err(permanent)? {
        Some(last) => last.value() + 1,
        None => 0,
    };
    tables.meta.insert(counter, seq_no).map_err(permanent)?;
    let mut value = Vec::with_capacity(8 + bytes.len());
    value.extend_from_slice(&seq_no.to_le_bytes());
    value.extend_from_slice(&bytes);
    tables
        .docs
        .insert((index.name(), id), value.as_slice())
        .map_err(permanent)?;
    if index == Index::Transactions {
        let old = current.as_ref().map(|doc| transfer_keys(&doc.source));
        update_transfer_indexes(tables, id, old.as_ref(), &transfer_keys(source))?;
    }
    Ok(WriteOutcome::Written(Version {
        seq_no,
        primary_term: PRIMARY_TERM,
    }))
}

/// The secondary-index keys of one transfer document.
#[derive(PartialEq, Eq)]
struct TransferKeys<'a> {
    state: &'a str,
    modified: i64,
    created: i64,
    src: &'a str,
    dest: &'a str,
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
        modified: millis(fields::MODIFIED),
        created: millis(fields::CREATED),
        src: text(fields::SRC),
        dest: text(fields::DEST),
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
    let e = permanent;
    if let Some(old) = old {
        if (old.state, old.modified) != (new.state, new.modified) {
            t.by_state_modified
                .remove((old.state, old.modified, id))
                .map_err(e)?;
        }
        if old.created != new.created {
            t.by_created.remove((old.created, id)).map_err(e)?;
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
    let txn = db.begin_read().map_err(permanent)?;
    let docs = txn.open_table(DOCS).map_err(permanent)?;
    match docs.get((index.name(), id)).map_err(permanent)? {
        Some(bytes) => Ok(Some(decode(id, bytes.value())?)),
        None => Ok(None),
    }
}

/// Loads the transfers named by `keys` (in that order) from one read transaction.
fn load_transfers(
    db: &Database,
    keys: Vec<SortKey>,
    limit: usize,
    filter: impl Fn(&Doc) -> bool,
) -> StoreResult<Page> {
    let txn = db.begin_read().map_err(permanent)?;
    let docs = txn.open_table(DOCS).map_err(permanent)?;
    let mut out = Vec::new();
    let mut last = None;
    for key in keys {
        if out.len() == limit {
            break;
        }
        if let Some(bytes) = docs
            .get((Index::Transactions.name(), key.id.as_str()))
            .map_err(permanent)?
        {
            let doc = decode(&key.id, bytes.value())?;
            if filter(&doc) {
                out.push(doc);
                last = Some(key);
            }
        }
    }
    let next = if out.len() == limit && limit > 0 {
        last
    } else {
        None
    };
    Ok(Page { docs: out, next })
}

fn find_stale_blocking(db: &Database, q: &StaleQuery) -> StoreResult<Page> {
    let txn = db.begin_read().map_err(permanent)?;
    let table = txn.open_table(TX_BY_STATE_MODIFIED).map_err(permanent)?;
    // Up to `limit` candidates from each state, merged by (modification_time, id).
    let mut keys = Vec::new();
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
            .map_err(permanent)?;
        for entry in range.take(q.limit + 1) {
            let (key, _) = entry.map_err(permanent)?;
            let (_, millis, id) = key.value();
            let key = SortKey {
                millis,
                id: id.to_owned(),
            };
            if q.after.as_ref() != Some(&key) {
                keys.push(key);
            }
        }
    }
    keys.sort();
    drop(table);
    drop(txn);
    load_transfers(db, keys, q.limit, |_| true)
}

fn list_blocking(db: &Database, f: &TransferFilter) -> StoreResult<Page> {
    let txn = db.begin_read().map_err(permanent)?;
    // Newest first: walk an index backwards from the cursor (exclusive).
    let (to_millis, to_id) = match &f.after {
        Some(k) => (k.millis, k.id.clone()),
        None => (i64::MAX, String::new()),
    };
    let mut keys = Vec::new();
    let mut push = |millis: i64, id: &str| {
        let key = SortKey {
            millis,
            id: id.to_owned(),
        };
        if f.after.is_none() || Some(&key) < f.after.as_ref() {
            keys.push(key);
        }
    };
    // How many index entries to look at: with an account and a state we filter by state after
    // the account index, so look further (bounded, to keep one request cheap).
    let scan = if f.account.is_some() && f.state.is_some() {
        f.limit.saturating_mul(50).max(1000)
    } else {
        f.limit + 1
    };
    let upper_id: &str = if f.after.is_none() {
        "\u{10FFFF}"
    } else {
        &to_id
    };
    if let Some(account) = &f.account {
        let table = txn.open_table(TX_BY_ACCOUNT).map_err(permanent)?;
        let range = table
            .range((account.as_str(), i64::MIN, "")..=(account.as_str(), to_millis, upper_id))
            .map_err(permanent)?;
        for entry in range.rev().take(scan) {
            let (key, _) = entry.map_err(permanent)?;
            let (_, millis, id) = key.value();
            push(millis, id);
        }
    } else if let Some(state) = &f.state {
        let table = txn.open_table(TX_BY_STATE_CREATED).map_err(permanent)?;
        let range = table
            .range((state.as_str(), i64::MIN, "")..=(state.as_str(), to_millis, upper_id))
            .map_err(permanent)?;
        for entry in range.rev().take(scan) {
            let (key, _) = entry.map_err(permanent)?;
            let (_, millis, id) = key.value();
            push(millis, id);
        }
    } else {
        let table = txn.open_table(TX_BY_CREATED).map_err(permanent)?;
        let range = table
            .range((i64::MIN, "")..=(to_millis, upper_id))
            .map_err(permanent)?;
        for entry in range.rev().take(scan) {
            let (key, _) = entry.map_err(permanent)?;
            let (millis, id) = key.value();
            push(millis, id);
        }
    }
    drop(txn);
    // When the scan stopped at its bound, say where it stopped even if the page is not full,
    // so a client paging through a busy account never mistakes "not scanned" for "none".
    let scan_cut = (keys.len() >= scan).then(|| keys.last().cloned()).flatten();
    let state = f.state.clone();
    let mut page = load_transfers(db, keys, f.limit, move |doc| match &state {
        Some(s) => doc.source.get(fields::STATE).and_then(Value::as_str) == Some(s.as_str()),
        None => true,
    })?;
    if page.next.is_none() {
        page.next = scan_cut;
    }
    Ok(page)
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
        self.writes
            .as_ref()
            .ok_or_else(|| StoreError::Permanent("embedded store is closed".into()))?
            .send((ops, reply))
            .map_err(|_| StoreError::Permanent("embedded store writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Permanent("embedded store writer has stopped".into()))?
    }

    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page> {
        let query = query.clone();
        self.read(move |db| find_stale_blocking(db, &query)).await
    }

    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page> {
        let filter = filter.clone();
        self.read(move |db| list_blocking(db, &filter)).await
    }

    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<Vec<Doc>> {
        let after = after.map(str::to_owned);
        self.read(move |db| {
            let txn = db.begin_read().map_err(permanent)?;
            let docs = txn.open_table(DOCS).map_err(permanent)?;
            let start = after.as_deref().unwrap_or("");
            let mut out = Vec::new();
            for entry in docs.range((index.name(), start)..).map_err(permanent)? {
                let (key, value) = entry.map_err(permanent)?;
                let (doc_index, id) = key.value();
                if doc_index != index.name() || out.len() == limit {
                    break;
                }
                if after.as_deref() == Some(id) {
                    continue;
                }
                out.push(decode(id, value.value())?);
            }
            Ok(out)
        })
        .await
    }

    async fn ready(&self) -> StoreResult<()> {
        self.read(|db| {
            let txn = db.begin_read().map_err(permanent)?;
            txn.open_table(DOCS).map_err(permanent)?;
            Ok(())
        })
        .await
    }

    async fn refresh(&self) -> StoreResult<()> {
        Ok(())
    }
}
