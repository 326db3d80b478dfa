//! New transfers' listing entries (by creation time, by account), written in sorted runs:
//! what a listing sees before a run, what a run writes, and what a crash leaves.

use redb::ReadableTableMetadata;

use super::durability::crash_image;
use super::*;

async fn of_account(store: &EmbeddedStore, account: &str) -> Vec<String> {
    listed_by(store, Some(account), None).await
}

/// The entries of `TX_BY_ACCOUNT` as redb's tables hold them now, without writing anything.
fn account_entries_in_tables(store: &EmbeddedStore) -> usize {
    committer_idle(store);
    let txn = store.db.begin_read().unwrap();
    let table = txn.open_table(TX_BY_ACCOUNT).unwrap();
    table.len().unwrap() as usize
}

fn entries_from(store: &EmbeddedStore) -> Option<u64> {
    let txn = store.db.begin_read().unwrap();
    let meta = txn.open_table(META).unwrap();
    let from = meta.get(CREATION_ENTRIES_FROM).unwrap();
    from.map(|from| from.value())
}

/// No run begins before `due` says so.
fn runs_due(store: &EmbeddedStore, due: bool) {
    lock(&store.committer.creations).run_after = match due {
        true => Duration::ZERO,
        false => Duration::MAX,
    };
}

#[tokio::test]
async fn new_transfers_wait_for_a_run_and_a_listing_has_them_written_first() {
    let (_dir, store) = open();
    runs_due(&store, false);
    for (n, id) in ["t1", "t2", "t3"].into_iter().enumerate() {
        create_transfer(&store, id, "created", 1_000 + n as i64).await;
    }
    // Committing the transaction does not write them: a run, or a listing, does.
    if let Some(open) = lock(&store.committer.open).take() {
        open.commit(&store.committer, Durability::None).unwrap();
    }
    assert_eq!(account_entries_in_tables(&store), 0, "pending, not written");
    assert_eq!(of_account(&store, "a").await, ["t3", "t2", "t1"]);
    assert_eq!(of_account(&store, "b").await, ["t3", "t2", "t1"]);
    assert_eq!(account_entries_in_tables(&store), 6);
    assert!(lock(&store.committer.creations).is_empty());
}

#[tokio::test]
async fn a_run_is_written_in_chunks_after_groups_and_then_moves_the_mark() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    runs_due(&store, false);
    let count = 600;
    for n in 0..count {
        create_transfer(&store, &format!("t{n:03}"), "created", 1_000 + n).await;
    }
    committer_idle(&store);
    runs_due(&store, true);
    assert_eq!(entries_from(&store), Some(0));
    // Each later group writes a chunk (at least 256 entries) of the 1,800 pending.
    let mut groups = 0;
    while !lock(&store.committer.creations).is_empty() {
        groups += 1;
        assert!(groups < 20, "the run never ends");
        let id = format!("a{groups}");
        store
            .create(Index::Accounts, &id, json!({ "n": groups }).into())
            .await
            .unwrap();
        committer_idle(&store);
    }
    assert!(groups > 1, "written over several groups, not at once");
    settle(&store);
    assert_eq!(account_entries_in_tables(&store), 2 * count as usize);
    assert_eq!(created_index_ids(&store).len(), count as usize);
    assert_eq!(
        entries_from(&store),
        Some(count as u64),
        "past the last seq_no"
    );
}

#[tokio::test]
async fn a_crash_with_entries_pending_leaves_the_next_start_to_write_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A checkpoint after every group: the file alone holds the transfers, the log is empty.
    let store = EmbeddedStore::open_with(dir.path(), DEFAULT_CACHE_MIB, Duration::ZERO).unwrap();
    runs_due(&store, false);
    for (n, id) in ["t1", "t2"].into_iter().enumerate() {
        create_transfer(&store, id, "created", 1_000 + n as i64).await;
    }
    committer_idle(&store);
    assert!(!lock(&store.committer.creations).is_empty());
    let image = crash_image(dir.path(), true);
    let reopened = EmbeddedStore::open(image.path()).unwrap();
    assert_eq!(
        account_entries_in_tables(&reopened),
        4,
        "written at the start"
    );
    assert_eq!(of_account(&reopened, "a").await, ["t2", "t1"]);
    assert_eq!(created_index_ids(&reopened), ["t1", "t2"]);
    assert_eq!(entries_from(&reopened), Some(2));
}

#[tokio::test]
async fn closing_the_store_writes_every_pending_entry() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    runs_due(&store, false);
    create_transfer(&store, "t1", "created", 1_000).await;
    drop(store);
    // The file as closing left it, without the catching up a start would do.
    let db = redb::Database::open(dir.path().join(FILE_NAME)).unwrap();
    let txn = db.begin_read().unwrap();
    assert_eq!(txn.open_table(TX_BY_ACCOUNT).unwrap().len().unwrap(), 2);
    let meta = txn.open_table(META).unwrap();
    let from = meta.get(CREATION_ENTRIES_FROM).unwrap().map(|v| v.value());
    assert_eq!(from, Some(1));
}

/// The engine never changes a transfer's accounts, but the store does not rely on it: a
/// change before the run forgets the pending entries, and the tables get the new ones.
#[tokio::test]
async fn a_transfer_whose_accounts_change_before_its_run_is_listed_under_the_new_ones() {
    let (_dir, store) = open();
    runs_due(&store, false);
    create_transfer(&store, "t1", "created", 1_000).await;
    let version = store
        .get(Index::Transactions, "t1")
        .await
        .unwrap()
        .expect("created")
        .version;
    let mut moved = transfer("t1", "created", 1_000);
    moved["src_acct"] = json!("c");
    let outcome = store
        .replace_if(Index::Transactions, "t1", moved.into(), version)
        .await
        .unwrap();
    assert!(matches!(outcome, WriteOutcome::Written(_)), "{outcome:?}");
    assert_eq!(of_account(&store, "a").await, Vec::<String>::new());
    assert_eq!(of_account(&store, "c").await, ["t1"]);
    assert_eq!(of_account(&store, "b").await, ["t1"]);
    assert_eq!(account_entries_in_tables(&store), 2);
    assert_eq!(
        created_index_ids(&store),
        ["t1"],
        "still listed by creation time"
    );
}

/// A group that writes nothing can finish a run: the transaction then holds listing entries
/// with nothing recent, and a search must still have it commit.
#[tokio::test]
async fn entries_a_run_left_in_the_open_transaction_are_committed_before_a_search() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    runs_due(&store, false);
    for (n, id) in ["t1", "t2"].into_iter().enumerate() {
        create_transfer(&store, id, "created", 1_000 + n as i64).await;
    }
    committer_idle(&store);
    if let Some(open) = lock(&store.committer.open).take() {
        open.commit(&store.committer, Durability::None).unwrap();
    }
    runs_due(&store, true);
    let taken = create_transfer(&store, "t1", "created", 5).await;
    assert_eq!(
        taken,
        WriteOutcome::AlreadyExists,
        "a group that writes nothing"
    );
    committer_idle(&store);
    assert!(store.committer.recent.is_empty());
    assert!(
        lock(&store.committer.creations).is_empty(),
        "the run is written"
    );
    assert!(transaction_open(&store), "into the open transaction");
    assert_eq!(of_account(&store, "a").await, ["t2", "t1"]);
}

/// A storage error part-way through writing entries leaves entries and the mark written in
/// part, in a transaction that is then lost. Here a search finishes a run (its mark moves)
/// and fails in the next: were writing to go on, the first run's entries would be lost for
/// good. The store stops writing, and the restart catches up from the mark the file holds.
#[tokio::test]
async fn a_failure_while_writing_entries_stops_writing_and_the_restart_catches_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A checkpoint after every group: each group begins a transaction of its own.
    let store = EmbeddedStore::open_with(dir.path(), DEFAULT_CACHE_MIB, Duration::ZERO).unwrap();
    runs_due(&store, false);
    let count = 1000;
    for n in 0..count {
        create_transfer(&store, &format!("t{n:04}"), "created", 1_000 + n).await;
    }
    runs_due(&store, true);
    // Two groups: the run of 3,000 entries begins, 256 are written after each.
    let account = json!({ "n": 1 }).into();
    store.create(Index::Accounts, "x", account).await.unwrap();
    create_transfer(&store, "t-new", "created", 9_000).await;
    committer_idle(&store);
    lock(&store.committer.creations).fail_after = Some(3 * count as usize - 2 * 256 + 1);
    let listed = store.list_transfers(&TransferFilter::default()).await;
    assert!(listed.is_err(), "the search's flush failed");
    assert_writes_stopped(&store).await;
    let image = crash_image(dir.path(), true);
    let reopened = EmbeddedStore::open(image.path()).unwrap();
    assert_eq!(
        account_entries_in_tables(&reopened),
        2 * (count as usize + 1)
    );
    assert_eq!(created_index_ids(&reopened).len(), count as usize + 1);
}

/// The entries `TX_ENTRIES` holds as redb's tables hold them now, without writing anything.
fn statement_entries_in_tables(store: &EmbeddedStore) -> usize {
    committer_idle(store);
    let txn = store.db.begin_read().unwrap();
    let table = txn.open_table(TX_ENTRIES).unwrap();
    statement_index::all_rows(&table).len()
}

/// Writes `entries` (`(account, seq)`) as transfer `id`'s, creating it if `version` is none.
async fn file_entries(
    store: &EmbeddedStore,
    id: &str,
    entries: &[(&str, u64)],
    version: Option<Version>,
) -> Version {
    let mut doc = transfer(id, "pending", 1_000);
    let values: Vec<String> = entries
        .iter()
        .map(|(account, seq)| format!("{}/1/-1/0/d", crate::store::entries::bound(account, *seq)))
        .collect();
    doc[fields::ENTRIES] = json!(values);
    let outcome = match version {
        None => store.create(Index::Transactions, id, doc.into()).await,
        Some(version) => (store.replace_if(Index::Transactions, id, doc.into(), version)).await,
    };
    match outcome.unwrap() {
        WriteOutcome::Written(version) => version,
        other => panic!("{id}: {other:?}"),
    }
}

#[tokio::test]
async fn account_entries_wait_for_a_run_and_a_statement_has_them_written_first() {
    let (_dir, store) = open();
    runs_due(&store, false);
    let v = file_entries(&store, "t1", &[("a", 1), ("b", 1)], None).await;
    // A later write of the transfer files one more: it waits as well.
    file_entries(&store, "t1", &[("a", 1), ("b", 1), ("a", 2)], Some(v)).await;
    file_entries(&store, "t2", &[("a", 3)], None).await;
    if let Some(open) = lock(&store.committer.open).take() {
        open.commit(&store.committer, Durability::None).unwrap();
    }
    assert_eq!(
        statement_entries_in_tables(&store),
        0,
        "pending, not written"
    );
    assert_eq!(filing_entries_of(&store, "a").await, ["t1", "t2"]);
    assert_eq!(statement_entries_in_tables(&store), 4);
    assert!(lock(&store.committer.creations).is_empty());
    // Only a filed entry pending, of a transfer created before: written first too.
    let v = store.get(Index::Transactions, "t2").await.unwrap().unwrap();
    file_entries(&store, "t2", &[("a", 3), ("c", 1)], Some(v.version)).await;
    assert_eq!(filing_entries_of(&store, "c").await, ["t2"]);
    assert_eq!(statement_entries_in_tables(&store), 5);
}

#[tokio::test]
async fn a_crash_with_account_entries_pending_leaves_the_next_start_to_write_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A checkpoint after every group: the file alone holds the transfers, the log is empty.
    let store = EmbeddedStore::open_with(dir.path(), DEFAULT_CACHE_MIB, Duration::ZERO).unwrap();
    // t1's entries are written by a run; then it files one more, which a crash leaves pending.
    let v = file_entries(&store, "t1", &[("a", 1)], None).await;
    settle(&store);
    assert_eq!(statement_entries_in_tables(&store), 1);
    runs_due(&store, false);
    file_entries(&store, "t1", &[("a", 1), ("a", 2)], Some(v)).await;
    file_entries(&store, "t2", &[("b", 1)], None).await;
    committer_idle(&store);
    assert!(!lock(&store.committer.creations).is_empty());
    let image = crash_image(dir.path(), true);
    let reopened = EmbeddedStore::open(image.path()).unwrap();
    assert_eq!(
        statement_entries_in_tables(&reopened),
        3,
        "written at the start"
    );
    let t = |account: &str, seq, id: &str| (account.to_owned(), seq, id.to_owned());
    assert_eq!(
        entry_rows(&reopened),
        [t("a", 1, "t1"), t("a", 2, "t1"), t("b", 1, "t2")]
    );
}

/// The engine never takes a value from a transfer's `entries`, but the store does not rely
/// on it: the entry goes at once, pending or written, and no run writes it back.
#[tokio::test]
async fn an_account_entry_taken_back_is_gone_whether_written_or_pending() {
    let (_dir, store) = open();
    runs_due(&store, false);
    let v = file_entries(&store, "t1", &[("a", 1), ("a", 2)], None).await;
    settle(&store);
    let v = file_entries(&store, "t1", &[("a", 1), ("a", 2), ("a", 3)], Some(v)).await;
    // a/2 was written, a/3 is pending: both go.
    let v = file_entries(&store, "t1", &[("a", 1)], Some(v)).await;
    // Within one group: filed, then taken back, then filed again.
    let doc = |entries: &[u64]| {
        let mut doc = transfer("t1", "pending", 1_000);
        let values: Vec<String> = entries
            .iter()
            .map(|seq| format!("{}/1/-1/0/d", crate::store::entries::bound("a", *seq)))
            .collect();
        doc[fields::ENTRIES] = json!(values);
        doc
    };
    let ops = vec![
        replace("t1", doc(&[1, 4]), v.seq_no),
        replace("t1", doc(&[1]), v.seq_no + 1),
        replace("t1", doc(&[1, 5]), v.seq_no + 2),
    ];
    for outcome in store.bulk(ops).await.unwrap() {
        written(&outcome);
    }
    let t = |seq| ("a".to_owned(), seq, "t1".to_owned());
    assert_eq!(entry_rows(&store), [t(1), t(5)]);
}
