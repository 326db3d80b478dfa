//! The embedded store as `transfer-service audit` opens it: the redb file read-only, nothing
//! created, migrated, replayed or caught up, so that an audit can never change what it
//! audits (nor make an empty store where a mistyped `DATA_DIR` points).
//!
//! What a read-only open cannot do, it refuses, saying what to do instead:
//! - no directory, or no store file in it: nothing to audit (check `DATA_DIR`);
//! - a write-ahead log that holds writes: the service did not stop cleanly, and the file
//!   lacks what the log holds; starting the service once replays it (a clean stop then
//!   leaves the log empty);
//! - a file another process holds (the service running), or one that needs repair.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use redb::ReadOnlyDatabase;

use super::{
    read_doc_of, scan_docs, storage, ChangesPage, ChangesQuery, Doc, EntriesQuery, Index, Page,
    ScanPage, StaleQuery, Store, StoreError, StoreResult, TransferFilter, WriteOp, WriteOutcome,
    FILE_NAME, LOG_FILE_NAME,
};

/// The embedded store's file, read-only: [`Store::get`] and [`Store::scan`] read it; every
/// other operation is refused.
pub struct ReadOnlyEmbeddedStore {
    db: std::sync::Arc<ReadOnlyDatabase>,
    path: PathBuf,
}

impl ReadOnlyEmbeddedStore {
    /// Opens the store in `dir` for reading, with a page cache of `cache_mib` MiB; an error
    /// (naming the path and what to do) where there is none to read as it is.
    pub fn open(dir: &Path, cache_mib: usize) -> StoreResult<Self> {
        let refuse = |why: String| Err(StoreError::Permanent(why));
        if !dir.is_dir() {
            return refuse(format!(
                "DATA_DIR {} is not a directory: there is no embedded store to read (check \
                 DATA_DIR or --data-dir; the audit creates nothing)",
                dir.display()
            ));
        }
        let path = dir.join(FILE_NAME);
        if !path.is_file() {
            return refuse(format!(
                "DATA_DIR {} holds no embedded store ({FILE_NAME} is missing): nothing to audit \
                 (check DATA_DIR or --data-dir; the audit creates nothing)",
                dir.display()
            ));
        }
        // The file lock first: a running service's log holds writes too, and "did not stop
        // cleanly" would send its operator the wrong way.
        let db = redb::Builder::new()
            .set_cache_size(cache_mib.saturating_mul(1024 * 1024))
            .open_read_only(&path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Permanent(format!(
                    "{} is held by another process (a running service?): stop it first",
                    path.display()
                )),
                other => StoreError::Permanent(format!(
                    "cannot open {} read-only: {other}",
                    path.display()
                )),
            })?;
        let log = dir.join(LOG_FILE_NAME);
        let log_bytes = match std::fs::metadata(&log) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return refuse(format!("cannot read {}: {e}", log.display())),
        };
        if log_bytes > 0 {
            return refuse(format!(
                "{} holds {log_bytes} bytes of writes that are not in {} yet (the service did \
                 not stop cleanly): start the service on this DATA_DIR once, which replays \
                 them, stop it, and audit again",
                log.display(),
                path.display()
            ));
        }
        Ok(Self {
            db: std::sync::Arc::new(db),
            path,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What each table of the file holds: its entries, the bytes of their keys and values,
    /// and its pages (for the benchmark's account of a transfer's bytes).
    pub fn table_sizes(&self) -> StoreResult<Vec<TableSize>> {
        use redb::{ReadableDatabase, ReadableTableMetadata, TableHandle};
        let txn = self.db.begin_read().map_err(storage)?;
        let mut sizes = Vec::new();
        for handle in txn.list_tables().map_err(storage)? {
            let table = txn.open_untyped_table(handle.clone()).map_err(storage)?;
            let stats = table.stats().map_err(storage)?;
            sizes.push(TableSize {
                name: handle.name().to_owned(),
                entries: table.len().map_err(storage)?,
                stored_bytes: stats.stored_bytes(),
                metadata_bytes: stats.metadata_bytes(),
                fragmented_bytes: stats.fragmented_bytes(),
                pages: stats.leaf_pages() + stats.branch_pages(),
            });
        }
        Ok(sizes)
    }

    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&ReadOnlyDatabase) -> StoreResult<T> + Send + 'static,
    {
        super::read_blocking(&self.db, f).await
    }
}

/// One table of the embedded store's file, as [`ReadOnlyEmbeddedStore::table_sizes`] reads it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TableSize {
    pub name: String,
    pub entries: u64,
    /// The bytes of its keys and values.
    pub stored_bytes: u64,
    /// The bytes of its branch pages' keys and other bookkeeping.
    pub metadata_bytes: u64,
    /// The bytes of its pages not in use (pages are 4 KiB; a page split leaves room).
    pub fragmented_bytes: u64,
    pub pages: u64,
}

/// What every operation that would write or search answers.
fn read_only<T>(what: &str) -> StoreResult<T> {
    Err(StoreError::Permanent(format!(
        "embedded store opened read-only: no {what}"
    )))
}

#[async_trait]
impl Store for ReadOnlyEmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        let id = id.to_owned();
        self.read(move |db| read_doc_of(db, index, &id)).await
    }

    async fn bulk(&self, _: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        read_only("writes")
    }

    async fn find_stale(&self, _: &StaleQuery) -> StoreResult<Page> {
        read_only("searches")
    }

    async fn list_transfers(&self, _: &TransferFilter) -> StoreResult<Page> {
        read_only("searches")
    }

    async fn account_entries(&self, _: &EntriesQuery) -> StoreResult<Vec<Doc>> {
        read_only("searches")
    }

    async fn ready(&self) -> StoreResult<()> {
        self.read(|db| {
            let txn = redb::ReadableDatabase::begin_read(db).map_err(storage)?;
            txn.open_table(super::DOCS).map_err(storage)?;
            Ok(())
        })
        .await
    }

    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<ScanPage> {
        let after = after.map(str::to_owned);
        self.read(move |db| scan_docs(db, index, after.as_deref(), limit))
            .await
    }

    async fn changes(&self, _: &ChangesQuery) -> StoreResult<ChangesPage> {
        read_only("feed")
    }

    /// Nothing to wait for: the file changes only when a process opens it for writing, and
    /// then this one could not have opened it.
    async fn refresh(&self) -> StoreResult<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::embedded::EmbeddedStore;

    /// Every file under `dir` with its bytes, to see that nothing was written.
    fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let path = entry.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                (path, bytes)
            })
            .collect();
        files.sort();
        files
    }

    fn refusal(dir: &Path) -> String {
        match ReadOnlyEmbeddedStore::open(dir, 1) {
            Ok(_) => panic!("{} opened", dir.display()),
            Err(error) => error.to_string(),
        }
    }

    /// A store in `dir` holding one account, closed cleanly.
    async fn a_store_with_one_account(dir: &Path) {
        let store = EmbeddedStore::open(dir).unwrap();
        let outcome = store
            .create(Index::Accounts, "alice", json!({"balance": 5}).into())
            .await
            .unwrap();
        assert!(outcome.written().is_some());
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it_and_nothing_is_created() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("mistyped");
        let why = refusal(&dir);
        assert!(why.contains(&dir.display().to_string()), "{why}");
        assert!(why.contains("DATA_DIR"), "{why}");
        assert!(!dir.exists());
    }

    #[test]
    fn an_empty_directory_is_an_error_naming_it_and_stays_empty() {
        let dir = tempfile::tempdir().unwrap();
        let why = refusal(dir.path());
        assert!(why.contains(&dir.path().display().to_string()), "{why}");
        assert!(why.contains(FILE_NAME), "{why}");
        assert!(files(dir.path()).is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cleanly_stopped_store_is_read_and_left_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        a_store_with_one_account(dir.path()).await;
        let before = files(dir.path());
        {
            let store = ReadOnlyEmbeddedStore::open(dir.path(), 1).unwrap();
            store.ready().await.unwrap();
            store.refresh().await.unwrap();
            let page = store.scan(Index::Accounts, None, 10).await.unwrap();
            let ids: Vec<&str> = page.docs.iter().map(|d| d.id.as_str()).collect();
            assert_eq!(ids, ["alice"]);
            assert!(store.get(Index::Accounts, "alice").await.unwrap().is_some());
            let write = store
                .create(Index::Accounts, "bob", json!({"balance": 1}).into())
                .await;
            assert!(write.is_err(), "a write through a read-only store");
        }
        assert_eq!(files(dir.path()), before, "the audit's open wrote nothing");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_log_holding_writes_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        a_store_with_one_account(dir.path()).await;
        std::fs::write(dir.path().join(LOG_FILE_NAME), b"a record not replayed").unwrap();
        let before = files(dir.path());
        let why = refusal(dir.path());
        assert!(why.contains("start the service"), "{why}");
        assert_eq!(files(dir.path()), before);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_running_store_whose_log_holds_writes_is_refused_as_running() {
        let dir = tempfile::tempdir().unwrap();
        let running = EmbeddedStore::open(dir.path()).unwrap();
        running
            .create(Index::Accounts, "alice", json!({"balance": 1}).into())
            .await
            .unwrap();
        let log = std::fs::metadata(dir.path().join(LOG_FILE_NAME)).unwrap();
        assert!(
            log.len() > 0,
            "the write is in the log, not yet checkpointed"
        );
        let why = refusal(dir.path());
        assert!(why.contains("held by another process"), "{why}");
        drop(running);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_a_service_holds_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let running = EmbeddedStore::open(dir.path()).unwrap();
        let why = refusal(dir.path());
        assert!(why.contains("held by another process"), "{why}");
        drop(running);
    }
}
