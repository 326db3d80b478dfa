//! The committer's transaction open across groups: what `get` and the searches see before it
//! commits, and when it commits.

use super::*;

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

/// Only a checkpoint, a search or many writes commit the open transaction: not the time
/// since it opened (committing every tenth of the interval cost CPU and tail latency).
#[tokio::test]
async fn the_open_transaction_outlives_the_groups_until_a_checkpoint_is_due() {
    let dir = tempfile::tempdir().expect("temp dir");
    let interval = Duration::from_secs(5);
    let store = EmbeddedStore::open_with(dir.path(), DEFAULT_CACHE_MIB, interval).unwrap();
    let account = |n: u32| (format!("a{n}"), Source::from(json!({ "n": n })));
    let (id, source) = account(1);
    store.create(Index::Accounts, &id, source).await.unwrap();
    committer_idle(&store);
    assert!(transaction_open(&store));
    // Past a tenth of the interval, far from all of it.
    std::thread::sleep(interval / 10 + Duration::from_millis(100));
    let (id, source) = account(2);
    store.create(Index::Accounts, &id, source).await.unwrap();
    committer_idle(&store);
    assert!(transaction_open(&store), "still open: no checkpoint is due");
    assert_eq!(read_doc(&store.db, Index::Accounts, "a1").unwrap(), None);
    assert!(store.get(Index::Accounts, "a1").await.unwrap().is_some());
}

/// Accounts are not written into the open transaction as groups change them: the recent
/// writes hold them until it commits, and later groups read and check them there.
#[tokio::test]
async fn an_account_rewritten_by_later_groups_reaches_the_tables_once_at_the_commit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    let created = create_numbered(&store, "a1", 1).await.unwrap();
    let v1 = version(created);
    // The tables hold the first version, the recent writes the second.
    settle(&store);
    let replaced = store
        .replace_if(Index::Accounts, "a1", json!({ "n": 2 }).into(), v1)
        .await
        .unwrap();
    let v2 = version(replaced);
    assert!(transaction_open(&store));
    let in_tables = in_open_transaction(&store, Index::Accounts, "a1").expect("a1 committed");
    let (seq_no, _) = split_stored("a1", &in_tables).unwrap();
    assert_eq!(seq_no, v1.seq_no, "the second version is not in the tables");

    // Later groups find the latest write, as they would in the tables.
    let stale = store
        .replace_if(Index::Accounts, "a1", json!({ "n": 3 }).into(), v1)
        .await;
    assert_eq!(stale.unwrap(), WriteOutcome::Conflict);
    let again = create_numbered(&store, "a1", 3).await;
    assert_eq!(again.unwrap(), WriteOutcome::AlreadyExists);
    let outcome = store
        .transact(Box::new(|reads| {
            let a1 = reads.get(Index::Accounts, "a1").unwrap().expect("a1 read");
            assert_eq!(a1.source.decode::<Value>().unwrap()["n"], 2);
            vec![WriteOp::ReplaceIf {
                index: Index::Accounts,
                id: "a1".into(),
                source: json!({ "n": 4 }).into(),
                expected: a1.version,
            }]
        }))
        .await
        .unwrap();
    let TxnOutcome::Committed(versions) = outcome else {
        panic!("refused: {outcome:?}");
    };
    assert_eq!(versions[0].seq_no, v2.seq_no + 1);

    settle(&store);
    let stored = read_doc(&store.db, Index::Accounts, "a1").unwrap();
    let stored = stored.expect("written at the commit");
    assert_eq!(stored.version, versions[0]);
    assert_eq!(stored.source.decode::<Value>().unwrap()["n"], 4);
}

fn version(outcome: WriteOutcome) -> Version {
    match outcome {
        WriteOutcome::Written(version) => version,
        other => panic!("not written: {other:?}"),
    }
}

/// The stored value of a document in the committer's open transaction (not in the recent
/// writes), once its turn is over.
fn in_open_transaction(store: &EmbeddedStore, index: Index, id: &str) -> Option<Vec<u8>> {
    committer_idle(store);
    let open = lock(&store.committer.open);
    let txn = &open.as_ref().expect("a transaction is open").txn;
    let docs = txn.open_table(DOCS).unwrap();
    let stored = docs.get((index.name(), id)).unwrap();
    stored.map(|bytes| bytes.value().to_vec())
}
