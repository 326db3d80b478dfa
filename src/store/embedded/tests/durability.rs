//! What survives a crash and what a failure stops: the log, its replay, checkpoints, failed
//! writes and commits (on a real directory; power cuts and failed syncs, on a simulated disk,
//! are in `power_loss`).

use std::sync::atomic::Ordering;

use super::*;

#[test]
fn storage_errors_are_classified() {
    let io = redb::StorageError::Io(std::io::Error::other("disk"));
    assert!(storage(io).is_retryable());
    assert!(storage(redb::StorageError::PreviousIo).is_retryable());
    assert!(!storage(redb::StorageError::Corrupted("bad page".into())).is_retryable());
    assert!(!storage(redb::StorageError::ValueTooLarge(1 << 40)).is_retryable());
}

/// What `kill -9` would leave of `dir` now (the store is idle: nothing is being written):
/// a copy of its files, taken while the store is still open.
pub(super) fn crash_image(dir: &Path, with_log: bool) -> tempfile::TempDir {
    let image = tempfile::tempdir().expect("temp dir");
    let mut files = vec![FILE_NAME];
    if with_log {
        files.push(LOG_FILE_NAME);
    }
    for name in files {
        std::fs::copy(dir.join(name), image.path().join(name)).expect("copy");
    }
    image
}

/// Opening `dir` fails, `Permanent`, saying `why`.
fn assert_refused_to_open(dir: &Path, why: &str) {
    let opened = EmbeddedStore::open(dir);
    assert!(
        matches!(&opened, Err(StoreError::Permanent(e)) if e.contains(why)),
        "{:?}",
        opened.err()
    );
}

#[tokio::test]
async fn writes_acknowledged_between_checkpoints_survive_a_crash_by_replay() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    let written = write_history(&store).await;

    // The redb file alone does not hold them: the log is what makes them durable.
    let file_only = EmbeddedStore::open(crash_image(dir.path(), false).path()).unwrap();
    for (index, id, _) in &written {
        assert_eq!(file_only.get(*index, id).await.unwrap(), None, "{id}");
    }

    let image = crash_image(dir.path(), true);
    let replayed = EmbeddedStore::open(image.path()).unwrap();
    for (index, id, version) in &written {
        let doc = replayed.get(*index, id).await.unwrap().expect("replayed");
        let before = store.get(*index, id).await.unwrap().expect("written");
        assert_eq!(
            (doc.version, doc.source.as_bytes()),
            (*version, before.source.as_bytes())
        );
    }
    // The secondary indexes and the feed moved as the writes did.
    assert_eq!(in_state(&replayed, "committed").await, ["t1"]);
    assert_eq!(in_state(&replayed, "created").await, ["t2"]);
    assert_eq!(
        feed(&replayed).await,
        [
            (FeedPosition::Seq(1), "t2".to_owned()),
            (FeedPosition::Seq(2), "t1".to_owned())
        ]
    );
    // Numbering goes on after the replayed writes.
    let next = create_transfer(&replayed, "t3", "created", 4).await;
    assert!(
        matches!(next, WriteOutcome::Written(Version { seq_no: 3, .. })),
        "{next:?}"
    );
}

#[tokio::test]
async fn replay_is_not_repeated_once_the_log_is_applied() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    let written = write_history(&store).await;
    let image = crash_image(dir.path(), true);
    let log = std::fs::read(image.path().join(LOG_FILE_NAME)).unwrap();
    drop(EmbeddedStore::open(image.path()).unwrap());
    // Applied and checkpointed by that open; the log is empty.
    assert_eq!(
        std::fs::read(image.path().join(LOG_FILE_NAME)).unwrap(),
        b""
    );
    // As if emptying it had not reached the disk: its records are all in the file now, and
    // opening again skips them (no write applied twice, no seq_no handed out again).
    std::fs::write(image.path().join(LOG_FILE_NAME), log).unwrap();
    let reopened = EmbeddedStore::open(image.path()).unwrap();
    for (index, id, version) in &written {
        let doc = reopened.get(*index, id).await.unwrap().expect("kept");
        assert_eq!(doc.version, *version);
    }
    assert_eq!(in_state(&reopened, "created").await, ["t2"]);
}

#[tokio::test]
async fn a_log_older_than_writes_made_to_the_file_is_refused_not_replayed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    write_history(&store).await;
    let image = crash_image(dir.path(), true);
    let log = std::fs::read(image.path().join(LOG_FILE_NAME)).unwrap();
    // A version that does not read the log opens the file after the crash and writes an
    // account: the document at the next seq_no, and the counter (never `log:applied`).
    std::fs::remove_file(image.path().join(LOG_FILE_NAME)).unwrap();
    {
        let older = EmbeddedStore::open(image.path()).unwrap();
        settle(&older);
        let txn = older.db.begin_write().unwrap();
        {
            let mut docs = txn.open_table(DOCS).unwrap();
            let value = [&0u64.to_le_bytes()[..], br#"{"balance":9}"#].concat();
            docs.insert((Index::Accounts.name(), "a9"), value.as_slice())
                .unwrap();
            txn.open_table(META)
                .unwrap()
                .insert("seq:accounts", 0)
                .unwrap();
        }
        txn.commit().unwrap();
    }
    std::fs::write(image.path().join(LOG_FILE_NAME), log).unwrap();
    assert_refused_to_open(image.path(), "written after the log");
}

#[tokio::test]
async fn a_checkpoint_puts_every_write_in_the_file_and_empties_the_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_with(dir.path(), DEFAULT_CACHE_MIB, Duration::ZERO).unwrap();
    let written = write_history(&store).await;
    committer_idle(&store);
    assert_eq!(
        std::fs::metadata(dir.path().join(LOG_FILE_NAME))
            .unwrap()
            .len(),
        0
    );
    let file_only = EmbeddedStore::open(crash_image(dir.path(), false).path()).unwrap();
    for (index, id, version) in &written {
        let doc = file_only
            .get(*index, id)
            .await
            .unwrap()
            .expect("in the file");
        assert_eq!(doc.version, *version);
    }
}

#[tokio::test]
async fn closing_the_store_checkpoints() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    let written = write_history(&store).await;
    assert!(
        std::fs::metadata(dir.path().join(LOG_FILE_NAME))
            .unwrap()
            .len()
            > 0
    );
    drop(store);
    assert_eq!(
        std::fs::metadata(dir.path().join(LOG_FILE_NAME))
            .unwrap()
            .len(),
        0
    );
    std::fs::remove_file(dir.path().join(LOG_FILE_NAME)).unwrap();
    let file_only = EmbeddedStore::open(dir.path()).unwrap();
    for (index, id, _) in &written {
        assert!(file_only.get(*index, id).await.unwrap().is_some(), "{id}");
    }
}

#[tokio::test]
async fn a_log_that_does_not_continue_the_file_refuses_to_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let store = open_without_checkpoints(dir.path());
        write_history(&store).await;
    } // closed: checkpointed, the file holds records 1-4
    let store = open_without_checkpoints(dir.path());
    store
        .create(Index::Accounts, "a2", json!({ "balance": 1 }).into())
        .await
        .unwrap(); // record 5, in the log only
    let image = crash_image(dir.path(), true);
    // The log beside another database file (a fresh one, holding no record).
    std::fs::remove_file(image.path().join(FILE_NAME)).unwrap();
    assert_refused_to_open(image.path(), "skips from record 0 to 5");
}

#[tokio::test]
async fn after_a_failed_log_write_the_store_stops_writing_until_reopened() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    let kept = create_numbered(&store, "kept", 1).await.unwrap();
    assert!(matches!(kept, WriteOutcome::Written(_)));
    lock(&store.committer.log).fail_appends = true;
    let failed = create_numbered(&store, "lost", 2).await;
    assert!(
        matches!(&failed, Err(StoreError::Unavailable(_))),
        "{failed:?}"
    );
    assert_eq!(
        store.get(Index::Accounts, "lost").await.unwrap(),
        None,
        "never visible"
    );
    // The open transaction that held the acknowledged write is gone; the write is not.
    assert!(!transaction_open(&store));
    assert!(store.get(Index::Accounts, "kept").await.unwrap().is_some());
    // The disk recovers, but the log may end in half a record: nothing more is written.
    lock(&store.committer.log).fail_appends = false;
    assert_writes_stopped(&store).await;

    let image = crash_image(dir.path(), true);
    let restarted = EmbeddedStore::open(image.path()).unwrap();
    assert!(restarted
        .get(Index::Accounts, "kept")
        .await
        .unwrap()
        .is_some());
    assert_eq!(restarted.get(Index::Accounts, "lost").await.unwrap(), None);
    let written = create_numbered(&restarted, "later", 3).await.unwrap();
    assert!(matches!(written, WriteOutcome::Written(_)));
    restarted.ready().await.unwrap();
}

#[tokio::test]
async fn a_transaction_whose_record_cannot_be_logged_answers_an_error_not_what_its_work_decided() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    lock(&store.committer.log).fail_appends = true;
    // The work runs before its record is written: what it decided reaches nobody unless the
    // store answers that the writes were made (TxnWork's rule: it has no effect of its own).
    let outcome = store
        .transact(Box::new(|_| {
            vec![WriteOp::Create {
                index: Index::Accounts,
                id: "decided".into(),
                source: json!({ "n": 1 }).into(),
            }]
        }))
        .await;
    assert!(
        matches!(outcome, Err(StoreError::Unavailable(_))),
        "{outcome:?}"
    );
    assert_eq!(store.get(Index::Accounts, "decided").await.unwrap(), None);
}

/// A store that never checkpoints, holding one acknowledged account, "kept", in its recent
/// writes only; and kept's version.
async fn store_keeping_an_account(dir: &Path) -> (EmbeddedStore, Option<Version>) {
    let store = open_without_checkpoints(dir);
    let kept = create_numbered(&store, "kept", 1).await.unwrap().written();
    assert!(
        transaction_open(&store),
        "kept is in the recent writes only"
    );
    (store, kept)
}

/// After a panic with kept acknowledged: writes stop, kept is still read, and a restart
/// from what `kill -9` would leave replays it. Returns the restarted store.
async fn assert_kept_until_replayed(
    store: &EmbeddedStore,
    dir: &Path,
    kept: Option<Version>,
) -> (tempfile::TempDir, EmbeddedStore) {
    assert_writes_stopped(store).await;
    let doc = store.get(Index::Accounts, "kept").await.unwrap();
    assert_eq!(
        doc.map(|d| d.version),
        kept,
        "still read, from the recent writes"
    );
    let image = crash_image(dir, true);
    let restarted = EmbeddedStore::open(image.path()).unwrap();
    let doc = restarted.get(Index::Accounts, "kept").await.unwrap();
    assert_eq!(doc.map(|d| d.version), kept, "replayed");
    (image, restarted)
}

#[tokio::test]
async fn a_committer_that_panics_holding_acknowledged_writes_stops_writing_until_reopened() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, kept) = store_keeping_an_account(dir.path()).await;
    lock(&store.committer.log).panic_appends = true;
    let lost = create_numbered(&store, "lost", 2).await;
    assert!(matches!(lost, Err(StoreError::Unavailable(_))), "{lost:?}");
    lock(&store.committer.log).panic_appends = false;
    // The open transaction went with the panic: later writes would reuse kept's seq_no.
    let (_image, restarted) = assert_kept_until_replayed(&store, dir.path(), kept).await;
    assert_eq!(restarted.get(Index::Accounts, "lost").await.unwrap(), None);
    let next = create_numbered(&restarted, "next", 3).await.unwrap();
    let seq_no = |version: Option<Version>| version.map(|v| v.seq_no);
    assert_eq!(
        seq_no(next.written()),
        seq_no(kept).map(|s| s + 1),
        "numbering continues"
    );
}

#[tokio::test]
async fn a_committer_that_panics_while_committing_acknowledged_accounts_stops_writing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, kept) = store_keeping_an_account(dir.path()).await;
    let panic_writes = |on| {
        store
            .committer
            .recent
            .panic_writes
            .store(on, Ordering::Relaxed)
    };
    panic_writes(true);
    // A search has the open transaction commit, which writes the account, and panics.
    let search = store.refresh().await;
    assert!(
        matches!(search, Err(StoreError::Unavailable(_))),
        "{search:?}"
    );
    panic_writes(false);
    // Stopped by the panic itself (the caller is answered after the guard ran): no
    // transaction holds kept's group any more, and a later commit must not write it.
    assert!(store.committer.check_writing().is_err());
    assert_kept_until_replayed(&store, dir.path(), kept).await;
}
