//! `--preload N`: the embedded store the service starts on already holds N transfers, so that
//! the figures say what the service costs as its store grows.
//!
//! They are made before the service starts, in this process, by the engine itself (the
//! service's own code and its one-transaction path) on the service's data directory, not over
//! HTTP: the documents, index entries and tombstones are exactly what the service writes. The
//! transfers move 1 unit each between [`ACCOUNTS`] accounts of their own (opened with enough
//! units that none refuses), so every invariant holds in the store the service then opens.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use transfer_service::metrics::Metrics;
use transfer_service::store::embedded::{EmbeddedStore, ReadOnlyEmbeddedStore};
use transfer_service::store::DynStore;
use transfer_service::transfer::requests::{Movement, NewAccount, NewTransfer};
use transfer_service::transfer::validated::{AccountId, TransferId};
use transfer_service::transfer::{Engine, EngineConfig};

/// The accounts the preloaded transfers move between.
const ACCOUNTS: u64 = 1000;
/// Creates in flight at once: enough to fill the store's write groups.
const CONCURRENT: u64 = 256;

/// What was preloaded, and what it costs on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Preloaded {
    pub transfers: u64,
    /// Transfers the store held when this run started: the preloaded ones and those of
    /// earlier runs on the same kept store (`--data-dir`).
    pub held_before_run: u64,
    /// How long making them took, and their rate.
    pub seconds: f64,
    pub per_s: f64,
    /// The data directory's size once the store was closed (checkpointed), a transfer.
    pub store_bytes_per_transfer: f64,
    /// The JSON of one preloaded transfer document as stored (its `_source`).
    pub document_bytes: usize,
    /// What the file holds a transfer, table by table, once they were made.
    pub tables: Vec<TableBytes>,
}

/// One table of the store: its bytes a preloaded transfer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableBytes {
    pub table: String,
    pub entries: u64,
    /// Its keys and values.
    pub stored_per_transfer: f64,
    /// And its branch pages, bookkeeping and the free room in its pages.
    pub in_pages_per_transfer: f64,
}

/// The tables of the closed store in `dir`, a transfer of `transfers`.
fn table_bytes(dir: &Path, transfers: u64) -> Vec<TableBytes> {
    let store = ReadOnlyEmbeddedStore::open(dir, 32).expect("open the store read-only");
    let per = |bytes: u64| bytes as f64 / transfers.max(1) as f64;
    let mut tables: Vec<TableBytes> = store
        .table_sizes()
        .expect("table sizes")
        .into_iter()
        .map(|t| TableBytes {
            stored_per_transfer: per(t.stored_bytes),
            in_pages_per_transfer: per(t.stored_bytes + t.metadata_bytes + t.fragmented_bytes),
            table: t.name,
            entries: t.entries,
        })
        .collect();
    tables.sort_by(|a, b| b.in_pages_per_transfer.total_cmp(&a.in_pages_per_transfer));
    tables
}

/// The service's data directory: a temp dir deleted after the run, or one kept
/// (`--data-dir`).
pub enum DataDir {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl DataDir {
    pub fn new(kept: Option<&Path>) -> Self {
        match kept {
            Some(dir) => {
                std::fs::create_dir_all(dir).expect("create --data-dir");
                DataDir::Kept(dir.to_owned())
            }
            None => DataDir::Temp(tempfile::tempdir().expect("temp dir")),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            DataDir::Temp(dir) => dir.path(),
            DataDir::Kept(dir) => dir,
        }
    }
}

/// The file beside the store that says what it holds (a [`Preloaded`]).
const RECORD: &str = "bench-preloaded.json";

/// [`preload`], unless `dir` already holds a store preloaded with `transfers` (its record
/// says so): then that one, as the record describes it.
pub fn preload_once(dir: &Path, transfers: u64) -> Preloaded {
    let record = std::fs::read(dir.join(RECORD))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Preloaded>(&bytes).ok());
    match record {
        Some(kept) if kept.transfers == transfers => kept,
        Some(kept) => panic!(
            "{} holds a store preloaded with {} transfers, not {transfers}",
            dir.display(),
            kept.transfers
        ),
        None => {
            let made = preload(dir, transfers);
            write_record(dir, &made);
            made
        }
    }
}

/// Adds a run's `terminal` transfers to the record of a preloaded store in `dir`, if any.
pub fn count_run(dir: &Path, terminal: u64) {
    let record = std::fs::read(dir.join(RECORD))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Preloaded>(&bytes).ok());
    if let Some(mut kept) = record {
        kept.held_before_run += terminal;
        write_record(dir, &kept);
    }
}

fn write_record(dir: &Path, preloaded: &Preloaded) {
    let json = serde_json::to_vec_pretty(preloaded).expect("JSON");
    std::fs::write(dir.join(RECORD), json).expect("write the preload record");
}

/// Makes `transfers` transfers in the embedded store in `dir`, and closes it.
pub fn preload(dir: &Path, transfers: u64) -> Preloaded {
    let started = Instant::now();
    // A runtime of its own, on a thread of its own: the caller may be inside one.
    let filling = dir.to_owned();
    let document_bytes = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(fill(&filling, transfers))
    })
    .join()
    .expect("the preload finished");
    let seconds = started.elapsed().as_secs_f64();
    Preloaded {
        transfers,
        held_before_run: transfers,
        seconds,
        per_s: transfers as f64 / seconds,
        store_bytes_per_transfer: dir_bytes(dir) as f64 / transfers.max(1) as f64,
        document_bytes,
        tables: table_bytes(dir, transfers),
    }
}

fn account(i: u64) -> AccountId {
    AccountId::parse(format!("preload-{i}")).expect("a valid id")
}

/// Opens the accounts, creates the transfers (printing progress every 10 s), and returns the
/// size of the last transfer's document; the store is closed on return.
async fn fill(dir: &Path, transfers: u64) -> usize {
    let store: DynStore = Arc::new(EmbeddedStore::open(dir).expect("open the embedded store"));
    let config = EngineConfig::with_lease(Duration::from_secs(30));
    let engine = Engine::new(store.clone(), config, Metrics::new());
    for i in 0..ACCOUNTS {
        let opening = NewAccount::new(account(i), i64::MAX / 4).expect("a positive balance");
        engine.create_account(opening).await.expect("account opens");
    }
    let next = Arc::new(AtomicU64::new(0));
    let last = Arc::new(std::sync::OnceLock::new());
    let mut workers = Vec::new();
    for _ in 0..CONCURRENT {
        let (engine, next, last) = (engine.clone(), next.clone(), last.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= transfers {
                    return;
                }
                let (from, to) = (n % ACCOUNTS, (n * 7 + 1) % ACCOUNTS);
                let to = if to == from { (to + 1) % ACCOUNTS } else { to };
                let movement = Movement::one_leg(account(from), account(to), 1).expect("valid");
                // The id the service gives a transfer posted without one (time-ordered).
                let id = TransferId::fresh();
                if n + 1 == transfers {
                    let _ = last.set(id.to_string());
                }
                engine
                    .create_transfer(NewTransfer::new(id, movement))
                    .await
                    .expect("a preloaded transfer is accepted");
            }
        }));
    }
    let progress = tokio::spawn({
        let next = next.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let done = next.load(Ordering::Relaxed).min(transfers);
                eprintln!("preload: {done} of {transfers} transfers");
            }
        }
    });
    for worker in workers {
        worker.await.expect("a preload worker");
    }
    progress.abort();
    let document_bytes = match last.get() {
        Some(last) => match engine.get_transfer(last).await.expect("read") {
            Some(doc) => serde_json::to_vec(&doc).expect("JSON").len(),
            None => 0,
        },
        None => 0,
    };
    engine.shut_down();
    while engine.running_tasks() > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(engine);
    drop(store);
    document_bytes
}

/// The bytes of every file in `dir` (not recursive: the store keeps its files at the top).
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
