//! Ops and transactions applied together in one group: each fails alone, reads what came before it.

use super::*;

#[tokio::test]
async fn an_op_on_an_undecodable_document_fails_alone_and_writes_nothing() {
    let (_dir, store) = open();
    create_transfer(&store, "bad", "created", 1_000).await;
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
