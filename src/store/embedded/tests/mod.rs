//! Unit tests of the embedded store's internals (the shared store suite is in `tests/store/`),
//! by concept, on the helpers below.
use std::time::Duration;

use serde_json::{json, Value};

use super::*;
use crate::store::fields;
use crate::time::format_millis;

mod creation_entries;
mod durability;
mod groups;
mod migrations;
mod open_transaction;
mod power_loss;
mod searches;
mod sim_disk;

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

/// Stores a new transfer `id` in `state`, modified (and created) at `modified`: what the
/// create did.
async fn create_transfer(
    store: &EmbeddedStore,
    id: &str,
    state: &str,
    modified: i64,
) -> WriteOutcome {
    let source = transfer(id, state, modified).into();
    store.create(Index::Transactions, id, source).await.unwrap()
}

/// Overwrites a stored document with bytes that do not decode, leaving its version
/// prefix and its index entries in place (as a torn or foreign write would).
fn break_doc(store: &EmbeddedStore, index: Index, id: &str) {
    settle(store);
    let txn = store.db.begin_write().unwrap();
    {
        let mut docs = txn.open_table(DOCS).unwrap();
        let mut value = 42u64.to_le_bytes().to_vec();
        value.extend_from_slice(b"{\"not json");
        docs.insert((index.name(), id), value.as_slice()).unwrap();
    }
    txn.commit().unwrap();
}

fn raw(store: &EmbeddedStore, index: Index, id: &str) -> Option<Vec<u8>> {
    settle(store);
    let db = &store.db;
    let txn = db.begin_read().unwrap();
    let docs = txn.open_table(DOCS).unwrap();
    let value = docs.get((index.name(), id)).unwrap();
    value.map(|v| v.value().to_vec())
}

fn created_index_ids(store: &EmbeddedStore) -> Vec<String> {
    settle(store);
    let db = &store.db;
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(TX_BY_CREATED).unwrap();
    let ids = txn.open_table(TX_IDS).unwrap();
    let named = table
        .iter()
        .unwrap()
        .map(|entry| {
            let number = entry.unwrap().0.value().1;
            ids.get(number)
                .unwrap()
                .expect("numbered")
                .value()
                .to_owned()
        })
        .collect();
    named
}

fn replace(id: &str, source: Value, seq_no: u64) -> WriteOp {
    WriteOp::ReplaceIf {
        index: Index::Transactions,
        id: id.into(),
        source: source.into(),
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
        source: source.into(),
    }
}

fn written(result: &StoreResult<WriteOutcome>) -> u64 {
    match result {
        Ok(WriteOutcome::Written(v)) => v.seq_no,
        other => panic!("expected a write, got {other:?}"),
    }
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

/// Writes the pending listing entries and commits the committer's open transaction once its
/// turn is over (as a search would have it), so that the test may read or write redb's
/// tables directly.
fn settle(store: &EmbeddedStore) {
    committer_idle(store);
    write_all_creations(&store.db, &store.committer).expect("the listing entries are written");
    if let Some(open) = lock(&store.committer.open).take() {
        open.commit(&store.committer, Durability::None)
            .expect("the open transaction commits");
    }
}

/// Waits until the committer has finished its turn, the checkpoint after its last group
/// included.
fn committer_idle(store: &EmbeddedStore) {
    drop(store.committer.wait_idle());
}

/// Writes are refused (transient for the callers) and `ready` fails, until a restart.
async fn assert_writes_stopped(store: &EmbeddedStore) {
    let refused = create_numbered(store, "later", 3).await;
    assert!(
        matches!(&refused, Err(StoreError::Unavailable(e)) if e.contains("restarts")),
        "{refused:?}"
    );
    assert!(matches!(
        store.ready().await,
        Err(StoreError::Unavailable(_))
    ));
}

/// The feed's first page, as (position, id).
async fn feed(store: &EmbeddedStore) -> Vec<(FeedPosition, String)> {
    let query = ChangesQuery {
        after: None,
        horizon: 0,
        limit: 10,
        newest: false,
    };
    let page = store.changes(&query).await.unwrap();
    page.docs
        .into_iter()
        .map(|(position, doc)| (position, doc.id))
        .collect()
}

/// A store that never checkpoints on its own: every acknowledged write lives in the log
/// until the store is closed.
fn open_without_checkpoints(dir: &Path) -> EmbeddedStore {
    EmbeddedStore::open_with(dir, DEFAULT_CACHE_MIB, Duration::from_secs(24 * 3600)).unwrap()
}

/// Creates the account document `id` numbered `n` (`{"n": n}`): what the create did.
async fn create_numbered(store: &EmbeddedStore, id: &str, n: u64) -> StoreResult<WriteOutcome> {
    store
        .create(Index::Accounts, id, json!({ "n": n }).into())
        .await
}

/// A one-leg transfer moving through states, an account, and their versions as written.
async fn write_history(store: &EmbeddedStore) -> Vec<(Index, &'static str, Version)> {
    let mut written = Vec::new();
    for (index, id, source) in [
        (Index::Accounts, "a1", json!({ "balance": 5 })),
        (Index::Transactions, "t1", transfer("t1", "created", 1)),
        (Index::Transactions, "t2", transfer("t2", "created", 2)),
    ] {
        let WriteOutcome::Written(version) = store.create(index, id, source.into()).await.unwrap()
        else {
            panic!("{id} not written");
        };
        written.push((index, id, version));
    }
    written[1].2 = move_transfer(store, "t1", "committed", 3, written[1].2).await;
    written
}

/// Writes transfer `id` again in `state`, over `version`; its new version.
async fn move_transfer(
    store: &EmbeddedStore,
    id: &str,
    state: &str,
    modified: i64,
    version: Version,
) -> Version {
    let source = transfer(id, state, modified).into();
    let outcome = store
        .replace_if(Index::Transactions, id, source, version)
        .await
        .unwrap();
    let WriteOutcome::Written(version) = outcome else {
        panic!("{id} not replaced: {outcome:?}");
    };
    version
}

/// The ids of the first page (up to 100) that `filter` lists.
async fn listed(store: &EmbeddedStore, filter: TransferFilter) -> Vec<String> {
    let filter = TransferFilter {
        limit: 100,
        ..filter
    };
    let page = store.list_transfers(&filter).await.unwrap();
    page.docs.into_iter().map(|d| d.id).collect()
}

/// The ids listed (first page) in `state`.
async fn in_state(store: &EmbeddedStore, state: &str) -> Vec<String> {
    listed_by(store, None, Some(state)).await
}

/// The ids listed (first page) of `account` or in `state`, where given.
async fn listed_by(
    store: &EmbeddedStore,
    account: Option<&str>,
    state: Option<&str>,
) -> Vec<String> {
    let filter = TransferFilter {
        account: account.map(str::to_owned),
        state: state.map(str::to_owned),
        ..TransferFilter::default()
    };
    listed(store, filter).await
}

/// Every entry of an index keyed `(text, time, id)` (state or metadata pair, time, id), in
/// key order, as redb's tables hold it once the committer is idle.
fn index_rows(
    store: &EmbeddedStore,
    index: TableDefinition<'static, (&'static str, i64, &'static str), ()>,
) -> Vec<(String, i64, String)> {
    settle(store);
    let txn = store.db.begin_read().unwrap();
    let table = txn.open_table(index).unwrap();
    let rows = table
        .iter()
        .unwrap()
        .map(|entry| {
            let key = entry.unwrap().0;
            let (text, time, id) = key.value();
            (text.to_owned(), time, id.to_owned())
        })
        .collect();
    rows
}

/// The entries [`TX_ENTRIES`] holds, as `(account, seq, transfer id)`, in order.
fn entry_rows(store: &EmbeddedStore) -> Vec<(String, u64, String)> {
    settle(store);
    let txn = store.db.begin_read().unwrap();
    let table = txn.open_table(TX_ENTRIES).unwrap();
    let ids = txn.open_table(TX_IDS).unwrap();
    let rows = statement_index::all_rows(&table)
        .into_iter()
        .map(|(account, seq, number)| {
            let id = ids.get(number).unwrap().expect("numbered");
            (account, seq, id.value().to_owned())
        })
        .collect();
    rows
}

/// The ids of the transfers [`Store::account_entries`] answers for `account`, any seq, sorted.
async fn filing_entries_of(store: &EmbeddedStore, account: &str) -> Vec<String> {
    let query = crate::store::EntriesQuery {
        account: account.to_owned(),
        seqs: 0..u64::MAX,
        limit: 100,
    };
    let docs = store.account_entries(&query).await.unwrap();
    let mut ids: Vec<String> = docs.into_iter().map(|d| d.id).collect();
    ids.sort();
    ids
}

/// Leaves the store as a version before the index `table` left it: the table deleted, its
/// built marker `built` gone.
fn as_before_the_index(store: &EmbeddedStore, table: impl redb::TableHandle, built: &str) {
    settle(store);
    let txn = store.db.begin_write().unwrap();
    txn.delete_table(table).unwrap();
    txn.open_table(META).unwrap().remove(built).unwrap();
    txn.commit().unwrap();
}

/// Whether the committer's transaction is open, holding writes not yet in redb's tables.
fn transaction_open(store: &EmbeddedStore) -> bool {
    committer_idle(store);
    lock(&store.committer.open).is_some()
}
