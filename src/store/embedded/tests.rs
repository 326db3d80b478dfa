//! Unit tests of the embedded store's internals (the shared store suite is in `tests/store/`).
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{json, Value};

use super::*;
use crate::store::{fields, format_millis};

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
            .create(
                Index::Transactions,
                "t1",
                transfer("t1", "pending", 1).into(),
            )
            .await
            .unwrap();
        store
            .create(Index::Transactions, "t2", flagged().into())
            .await
            .unwrap();
        // As an older version left it: no index of flagged transfers, no marker.
        settle(&store);
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

#[tokio::test]
async fn a_store_holding_metadata_without_its_index_gets_it_built_when_opened() {
    let dir = tempfile::tempdir().expect("temp dir");
    let labelled = |id: &str, modified: i64, order: &str| {
        let mut doc = transfer(id, "finished", modified);
        doc[fields::METADATA] = json!({"order_id": order, "channel": "web"});
        doc
    };
    let by = |key: &str, value: &str| TransferFilter {
        metadata: vec![(key.to_owned(), value.to_owned())],
        limit: 10,
        ..TransferFilter::default()
    };
    let entries = |store: &EmbeddedStore| -> Vec<(String, i64, String)> {
        settle(store);
        let txn = store.db.begin_read().unwrap();
        let table = txn.open_table(TX_METADATA).unwrap();
        let rows = table
            .iter()
            .unwrap()
            .map(|entry| {
                let key = entry.unwrap().0;
                let (pair, created, id) = key.value();
                (pair.to_owned(), created, id.to_owned())
            })
            .collect();
        rows
    };
    {
        let store = EmbeddedStore::open(dir.path()).unwrap();
        for (id, doc) in [
            ("t1", labelled("t1", 1, "123")),
            ("t2", transfer("t2", "finished", 2)),
            ("t3", labelled("t3", 3, "456")),
        ] {
            store
                .create(Index::Transactions, id, doc.into())
                .await
                .unwrap();
        }
        assert_eq!(entries(&store).len(), 4, "two pairs each of t1 and t3");
        // As a version without the table (or one that opened the store in between) left it:
        // transfers with metadata, no entries, no marker.
        settle(&store);
        let txn = store.db.begin_write().unwrap();
        txn.delete_table(TX_METADATA).unwrap();
        txn.open_table(META)
            .unwrap()
            .remove(METADATA_BUILT)
            .unwrap();
        txn.commit().unwrap();
    }
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let ids =
        |page: crate::store::Page| -> Vec<String> { page.docs.into_iter().map(|d| d.id).collect() };
    assert_eq!(
        ids(store.list_transfers(&by("order_id", "123")).await.unwrap()),
        ["t1"]
    );
    assert_eq!(
        ids(store.list_transfers(&by("order_id", "456")).await.unwrap()),
        ["t3"]
    );
    assert_eq!(
        ids(store.list_transfers(&by("channel", "web")).await.unwrap()),
        ["t3", "t1"]
    );
    let built = entries(&store);
    assert_eq!(
        built,
        [
            ("channel=web".to_owned(), 1, "t1".to_owned()),
            ("channel=web".to_owned(), 3, "t3".to_owned()),
            ("order_id=123".to_owned(), 1, "t1".to_owned()),
            ("order_id=456".to_owned(), 3, "t3".to_owned()),
        ]
    );
    // Built once: opening again neither duplicates nor loses it.
    drop(store);
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(entries(&store), built);
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

#[tokio::test]
async fn an_op_on_an_undecodable_document_fails_alone_and_writes_nothing() {
    let (_dir, store) = open();
    store
        .create(
            Index::Transactions,
            "bad",
            transfer("bad", "created", 1_000).into(),
        )
        .await
        .unwrap();
    break_doc(&store, Index::Transactions, "bad");
    let before = raw(&store, Index::Transactions, "bad");

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
    assert_eq!(raw(&store, Index::Transactions, "bad"), before);
    let mut indexed = created_index_ids(&store);
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
    // A transfer's old index keys cannot be read from a broken source: its write must fail.
    break_doc(&store, Index::Transactions, "bad");
    let ops = |ops| Waiting::Ops(ops, oneshot::channel().0);
    let mut group = vec![
        ops(vec![create("first", transfer("first", "created", 1))]),
        ops(vec![WriteOp::ReplaceIf {
            index: Index::Transactions,
            id: "bad".into(),
            source: transfer("bad", "pending", 2).into(),
            expected: Version {
                seq_no: 42,
                primary_term: PRIMARY_TERM,
            },
        }]),
        ops(vec![create("third", transfer("third", "created", 3))]),
    ];
    let results = op_results(
        apply_group(&store.db, &store.committer, &mut group).expect("the group commits"),
    );
    assert_eq!(results.len(), 3);
    assert_eq!(written(&results[0]) + 1, written(&results[2]));
    assert!(matches!(results[1], Err(StoreError::Permanent(_))));
    assert!(raw(&store, Index::Transactions, "first").is_some());
    assert!(raw(&store, Index::Transactions, "third").is_some());
}

/// The outcomes of a group's `bulk` callers, in order.
fn op_results(answers: Vec<Answer>) -> Vec<StoreResult<WriteOutcome>> {
    answers
        .into_iter()
        .flat_map(|answer| match answer {
            Answer::Ops(results) => results,
            Answer::Txn(_) | Answer::Flushed => Vec::new(),
        })
        .collect()
}

/// The outcomes of a group's transactions, in order.
fn txn_outcomes(answers: &[Answer]) -> Vec<TxnOutcome> {
    answers
        .iter()
        .filter_map(|answer| match answer {
            Answer::Txn(outcome) => Some(outcome.clone()),
            Answer::Ops(_) | Answer::Flushed => None,
        })
        .collect()
}

fn txn(work: impl FnOnce(&mut dyn TxnReads) -> Vec<WriteOp> + Send + 'static) -> Waiting {
    Waiting::Txn(Box::new(work), oneshot::channel().0)
}

#[test]
fn a_transaction_reads_the_writes_made_before_it_in_its_group() {
    let (_dir, store) = open();
    let mut group = vec![
        Waiting::Ops(
            vec![create("t1", transfer("t1", "created", 1))],
            oneshot::channel().0,
        ),
        // Writes t1 again on the version it finds: the create made just before, uncommitted.
        txn(|reads| {
            let t1 = reads
                .get(Index::Transactions, "t1")
                .expect("read")
                .expect("the create before it is seen");
            vec![replace(
                "t1",
                transfer("t1", "pending", 2),
                t1.version.seq_no,
            )]
        }),
    ];
    let answers = apply_group(&store.db, &store.committer, &mut group).expect("the group commits");
    let [TxnOutcome::Committed(versions)] = &txn_outcomes(&answers)[..] else {
        panic!("the transaction was not committed");
    };
    assert_eq!(versions[0].seq_no, written(&op_results(answers)[0]) + 1);
    settle(&store);
    let stored = read_doc(&store.db, Index::Transactions, "t1")
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.source.to_value().unwrap()["transaction_state"],
        "pending"
    );
}

/// What a transaction's work read stands for the lookup when its writes are checked: it
/// must give the same outcomes a lookup would.
#[test]
fn a_transactions_writes_are_checked_against_what_its_work_read() {
    let (_dir, store) = open();
    let account = |n: i64, seq_no: u64| WriteOp::ReplaceIf {
        index: Index::Accounts,
        id: "a1".into(),
        source: json!({ "n": n }).into(),
        expected: Version {
            seq_no,
            primary_term: PRIMARY_TERM,
        },
    };
    let a1_seq_no = |reads: &mut dyn TxnReads| {
        let a1 = reads.get(Index::Accounts, "a1").expect("read");
        a1.expect("a1 exists").version.seq_no
    };
    let mut group = vec![
        Waiting::Ops(
            vec![WriteOp::Create {
                index: Index::Accounts,
                id: "a1".into(),
                source: json!({ "n": 0 }).into(),
            }],
            oneshot::channel().0,
        ),
        // Read at one version, written at another: a conflict.
        txn(move |reads| vec![account(1, a1_seq_no(reads) + 1)]),
        // Read absent and created; read and written at the version read: committed.
        txn(move |reads| {
            assert_eq!(
                reads.version(Index::Transactions, "t1").expect("read"),
                None
            );
            let seq_no = a1_seq_no(reads);
            vec![
                create("t1", transfer("t1", "finished", 1)),
                account(2, seq_no),
            ]
        }),
        // Read as taken (by the transaction before), created again: refused.
        txn(|reads| {
            assert!(reads
                .version(Index::Transactions, "t1")
                .expect("read")
                .is_some());
            vec![create("t1", transfer("t1", "finished", 1))]
        }),
        // Read absent, replaced: refused.
        txn(|reads| {
            assert_eq!(
                reads.version(Index::Transactions, "t2").expect("read"),
                None
            );
            vec![replace("t2", transfer("t2", "finished", 1), 0)]
        }),
    ];
    let answers = apply_group(&store.db, &store.committer, &mut group).expect("the group commits");
    let outcomes = txn_outcomes(&answers);
    assert_eq!(outcomes[0], TxnOutcome::Refused, "stale version");
    assert!(
        matches!(outcomes[1], TxnOutcome::Committed(_)),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[2..], [TxnOutcome::Refused, TxnOutcome::Refused]);
    settle(&store);
    let a1 = read_doc(&store.db, Index::Accounts, "a1").unwrap().unwrap();
    assert_eq!(a1.source, Source::from(json!({ "n": 2 })));
}

#[test]
fn a_panicking_transaction_writes_nothing_and_fails_alone() {
    let (_dir, store) = open();
    let mut group = vec![
        txn(|_| panic!("a bug in the work")),
        Waiting::Ops(
            vec![create("t1", transfer("t1", "created", 1))],
            oneshot::channel().0,
        ),
    ];
    let answers = apply_group(&store.db, &store.committer, &mut group).expect("the group commits");
    assert_eq!(txn_outcomes(&answers), vec![TxnOutcome::Refused]);
    assert!(matches!(
        op_results(answers)[0],
        Ok(WriteOutcome::Written(_))
    ));
}

#[test]
fn a_transaction_writing_one_document_twice_writes_nothing() {
    let (_dir, store) = open();
    let mut group = vec![txn(|_| {
        vec![
            create("t1", transfer("t1", "created", 1)),
            create("t1", transfer("t1", "created", 1)),
        ]
    })];
    let answers = apply_group(&store.db, &store.committer, &mut group).expect("the group commits");
    assert_eq!(txn_outcomes(&answers), vec![TxnOutcome::Refused]);
    assert!(raw(&store, Index::Transactions, "t1").is_none());
}

#[tokio::test]
async fn an_account_source_is_stored_and_returned_as_given_without_being_parsed() {
    let (_dir, store) = open();
    // Accounts have no index keys: like Elasticsearch, a conditional replace with the right
    // version overwrites whatever is stored, and the bytes come back as they were written.
    break_doc(&store, Index::Accounts, "a");
    let source = Source::from_store(&br#"{"balance":1,  "z":[1,2]}"#[..]);
    let outcome = store
        .replace_if(
            Index::Accounts,
            "a",
            source.clone(),
            Version {
                seq_no: 42,
                primary_term: PRIMARY_TERM,
            },
        )
        .await
        .unwrap();
    assert!(matches!(outcome, WriteOutcome::Written(_)), "{outcome:?}");
    let doc = store.get(Index::Accounts, "a").await.unwrap().unwrap();
    assert_eq!(doc.source.as_bytes(), source.as_bytes());
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
            .create(
                Index::Transactions,
                &id,
                transfer(&id, state, 1_000 + i).into(),
            )
            .await
            .unwrap();
        all.push(id);
    }
    // Broken: the two oldest (a whole first page), and a run in the middle.
    let broken = ["c00", "p01", "c04", "p05", "c06"];
    for id in broken {
        break_doc(&store, Index::Transactions, id);
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
            .create(
                Index::Transactions,
                &id,
                transfer(&id, state, 1_000 + i).into(),
            )
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
                transfer(&id, "created", 1_000 + i).into(),
            )
            .await
            .unwrap();
    }
    for id in ["t5", "t4", "t2"] {
        break_doc(&store, Index::Transactions, id);
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
async fn a_failed_checkpoint_stops_writing_until_a_restart() {
    let disk = FlakyDisk::default();
    let failing = disk.failing.clone();
    let db = redb::Builder::new().create_with_backend(disk).unwrap();
    // Every group is followed by a checkpoint, which writes to the disk.
    let log_dir = tempfile::tempdir().expect("temp dir");
    let (log, content) = Wal::open(log_dir.path(), Duration::ZERO).unwrap();
    let store = EmbeddedStore::start(db, PathBuf::from("memory"), log, &content).unwrap();
    let ok = store
        .create(Index::Accounts, "a", json!({ "n": 1 }).into())
        .await
        .unwrap();
    assert!(matches!(ok, WriteOutcome::Written(_)));
    committer_idle(&store); // its checkpoint done, on a healthy disk

    failing.store(true, Ordering::SeqCst);
    // Acknowledged once its record is in the log (on another disk here); the checkpoint
    // after it fails.
    let logged = store
        .create(Index::Accounts, "b", json!({ "n": 2 }).into())
        .await;
    assert!(matches!(logged, Ok(WriteOutcome::Written(_))), "{logged:?}");
    committer_idle(&store);
    // redb's state is uncertain, the log holds every write: the store stops writing until a
    // restart replays the log, transient from the callers' point of view, never a refusal
    // of their request.
    failing.store(false, Ordering::SeqCst);
    assert_writes_stopped(&store).await;
}

/// Commits the committer's open transaction once its turn is over (as a search would have
/// it), so that the test may read or write redb's tables directly.
fn settle(store: &EmbeddedStore) {
    committer_idle(store);
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
    let refused = store
        .create(Index::Accounts, "later", json!({ "n": 3 }).into())
        .await;
    assert!(
        matches!(&refused, Err(StoreError::Unavailable(e)) if e.contains("restarts")),
        "{refused:?}"
    );
    assert!(matches!(
        store.ready().await,
        Err(StoreError::Unavailable(_))
    ));
}

#[test]
fn storage_errors_are_classified() {
    let io = redb::StorageError::Io(std::io::Error::other("disk"));
    assert!(storage(io).is_retryable());
    assert!(storage(redb::StorageError::PreviousIo).is_retryable());
    assert!(!storage(redb::StorageError::Corrupted("bad page".into())).is_retryable());
    assert!(!storage(redb::StorageError::ValueTooLarge(1 << 40)).is_retryable());
}

#[tokio::test]
async fn a_store_written_before_the_change_feed_gets_its_index_built_when_opened() {
    let dir = tempfile::tempdir().expect("temp dir");
    let written = {
        let store = EmbeddedStore::open(dir.path()).unwrap();
        for id in ["t2", "t1"] {
            store
                .create(Index::Transactions, id, transfer(id, "created", 1).into())
                .await
                .unwrap();
        }
        let written = feed(&store).await;
        // As a version without the table left it: transfers, no entries, no marker.
        settle(&store);
        let txn = store.db.begin_write().unwrap();
        txn.delete_table(TX_CHANGES).unwrap();
        txn.open_table(META).unwrap().remove(CHANGES_BUILT).unwrap();
        txn.commit().unwrap();
        written
    };
    assert_eq!(
        written,
        [
            (FeedPosition::Seq(0), "t2".to_owned()),
            (FeedPosition::Seq(1), "t1".to_owned())
        ]
    );
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(feed(&store).await, written, "rebuilt in write order");
    drop(store);
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(feed(&store).await, written, "built once");
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

/// What `kill -9` would leave of `dir` now (the store is idle: nothing is being written):
/// a copy of its files, taken while the store is still open.
fn crash_image(dir: &Path, with_log: bool) -> tempfile::TempDir {
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

async fn in_state(store: &EmbeddedStore, state: &str) -> Vec<String> {
    let filter = TransferFilter {
        state: Some(state.to_owned()),
        limit: 10,
        ..TransferFilter::default()
    };
    let page = store.list_transfers(&filter).await.unwrap();
    page.docs.into_iter().map(|d| d.id).collect()
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
    let next = replayed
        .create(
            Index::Transactions,
            "t3",
            transfer("t3", "created", 4).into(),
        )
        .await
        .unwrap();
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
    let kept = store
        .create(Index::Accounts, "kept", json!({ "n": 1 }).into())
        .await
        .unwrap();
    assert!(matches!(kept, WriteOutcome::Written(_)));
    lock(&store.committer.log).fail_appends = true;
    let failed = store
        .create(Index::Accounts, "lost", json!({ "n": 2 }).into())
        .await;
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
    let written = restarted
        .create(Index::Accounts, "later", json!({ "n": 3 }).into())
        .await
        .unwrap();
    assert!(matches!(written, WriteOutcome::Written(_)));
    restarted.ready().await.unwrap();
}

/// The recovery index's entries, as (state, id).
fn recovery_entries(store: &EmbeddedStore) -> Vec<(String, String)> {
    settle(store);
    let db = &store.db;
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(TX_BY_STATE_MODIFIED).unwrap();
    let rows = table
        .iter()
        .unwrap()
        .map(|entry| {
            let key = entry.unwrap().0;
            let (state, _, id) = key.value();
            (state.to_owned(), id.to_owned())
        })
        .collect();
    rows
}

#[tokio::test]
async fn only_in_flight_transfers_have_recovery_entries() {
    let (_dir, store) = open();
    let created = store
        .create(
            Index::Transactions,
            "t1",
            transfer("t1", "created", 1).into(),
        )
        .await
        .unwrap();
    store
        .create(
            Index::Transactions,
            "t2",
            transfer("t2", "rolled-back", 1).into(),
        )
        .await
        .unwrap();
    let entry = |state: &str, id: &str| (state.to_owned(), id.to_owned());
    assert_eq!(recovery_entries(&store), [entry("created", "t1")]);
    let WriteOutcome::Written(version) = created else {
        panic!("t1: {created:?}");
    };
    move_transfer(&store, "t1", "finished", 2, version).await;
    assert_eq!(recovery_entries(&store), []);
}

/// Whether the committer's transaction is open, holding writes not yet in redb's tables.
fn transaction_open(store: &EmbeddedStore) -> bool {
    committer_idle(store);
    lock(&store.committer.open).is_some()
}

#[tokio::test]
async fn a_get_sees_an_acknowledged_write_before_its_transaction_commits() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    let source = json!({ "balance": 5 });
    store
        .create(Index::Accounts, "a1", source.clone().into())
        .await
        .unwrap();
    assert!(transaction_open(&store), "the transaction stays open");
    let in_tables = read_doc(&store.db, Index::Accounts, "a1").unwrap();
    assert_eq!(in_tables, None, "not committed to redb's tables yet");
    let doc = store.get(Index::Accounts, "a1").await.unwrap();
    assert_eq!(doc.expect("acknowledged, so visible").source, source);
}

#[tokio::test]
async fn searches_commit_the_open_transaction_first_so_they_stay_realtime() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    write_history(&store).await;
    assert!(transaction_open(&store));
    assert_eq!(in_state(&store, "committed").await, ["t1"]);
    assert!(!transaction_open(&store), "the listing had it commit");
    assert!(store.committer.recent.is_empty());
    // Every other reader of the tables does the same.
    move_transfer(&store, "t2", "committed", 4, version_of(&store, "t2").await).await;
    assert_eq!(stale_ids(&store, &["committed"], 10).await, ["t1", "t2"]);
    move_transfer(&store, "t2", "finished", 5, version_of(&store, "t2").await).await;
    let page = store.scan(Index::Transactions, None, 10).await.unwrap();
    let t2 = page.docs.iter().find(|d| d.id == "t2").expect("t2 scanned");
    assert_eq!(
        t2.source.decode::<Value>().unwrap()["transaction_state"],
        "finished"
    );
    move_transfer(&store, "t1", "finished", 6, version_of(&store, "t1").await).await;
    let newest = feed(&store).await.pop().expect("a feed entry").1;
    assert_eq!(newest, "t1", "the feed shows the latest write");
    assert!(!transaction_open(&store));
}

async fn version_of(store: &EmbeddedStore, id: &str) -> Version {
    let doc = store.get(Index::Transactions, id).await.unwrap();
    doc.expect("the transfer exists").version
}

#[tokio::test]
async fn a_refresh_with_nothing_acknowledged_since_the_last_commit_asks_nothing_of_the_committer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    store.refresh().await.unwrap();
    assert!(!transaction_open(&store), "no empty transaction was begun");
}

#[tokio::test]
async fn a_committer_that_panics_holding_acknowledged_writes_stops_writing_until_reopened() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    let kept = store
        .create(Index::Accounts, "kept", json!({ "n": 1 }).into())
        .await
        .unwrap()
        .written();
    assert!(
        transaction_open(&store),
        "kept is in the open transaction only"
    );
    lock(&store.committer.log).panic_appends = true;
    let lost = store
        .create(Index::Accounts, "lost", json!({ "n": 2 }).into())
        .await;
    assert!(lost.is_err(), "{lost:?}");
    lock(&store.committer.log).panic_appends = false;
    // The open transaction went with the panic: later writes would reuse kept's seq_no.
    assert_writes_stopped(&store).await;
    let doc = store.get(Index::Accounts, "kept").await.unwrap();
    assert_eq!(
        doc.map(|d| d.version),
        kept,
        "still read, from the recent writes"
    );

    let image = crash_image(dir.path(), true);
    let restarted = EmbeddedStore::open(image.path()).unwrap();
    let doc = restarted.get(Index::Accounts, "kept").await.unwrap();
    assert_eq!(doc.map(|d| d.version), kept, "replayed");
    assert_eq!(restarted.get(Index::Accounts, "lost").await.unwrap(), None);
    let next = restarted
        .create(Index::Accounts, "next", json!({ "n": 3 }).into())
        .await
        .unwrap();
    let seq_no = |version: Option<Version>| version.map(|v| v.seq_no);
    assert_eq!(
        seq_no(next.written()),
        seq_no(kept).map(|s| s + 1),
        "numbering continues"
    );
}

#[tokio::test]
async fn the_open_transaction_commits_with_the_first_group_after_a_tenth_of_the_interval() {
    let dir = tempfile::tempdir().expect("temp dir");
    let interval = Duration::from_secs(1);
    let store = EmbeddedStore::open_with(dir.path(), DEFAULT_CACHE_MIB, interval).unwrap();
    let account = |n: u32| (format!("a{n}"), Source::from(json!({ "n": n })));
    // Writes until a transaction is left open (a group slower than 100 ms commits its own).
    let mut n = 0;
    let opened = loop {
        n += 1;
        assert!(
            n < 100,
            "every group took 100 ms or more: the machine is too slow to tell"
        );
        let (id, source) = account(n);
        store.create(Index::Accounts, &id, source).await.unwrap();
        committer_idle(&store);
        if let Some(open) = lock(&store.committer.open).as_ref() {
            break open.opened;
        }
    };
    // Past a tenth of the interval since it opened (real time, which only grows).
    std::thread::sleep(
        (interval / 10 + Duration::from_millis(10)).saturating_sub(opened.elapsed()),
    );
    let (id, source) = account(n + 1);
    store.create(Index::Accounts, &id, source).await.unwrap();
    assert!(!transaction_open(&store), "committed with that group");
    assert!(store.committer.recent.is_empty());
    assert!(read_doc(&store.db, Index::Accounts, &id).unwrap().is_some());
}
