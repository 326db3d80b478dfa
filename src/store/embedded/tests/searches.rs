//! The searches over the secondary indexes: undecodable documents skipped, recovery entries,
//! account entries.

use super::*;

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
        create_transfer(&store, &id, state, 1_000 + i).await;
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
        create_transfer(&store, &id, state, 1_000 + i).await;
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
        create_transfer(&store, &id, "created", 1_000 + i).await;
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

/// The recovery index's entries, as (state, id).
fn recovery_entries(store: &EmbeddedStore) -> Vec<(String, String)> {
    entries_by_state(store, TX_BY_STATE_MODIFIED)
}

/// The entries of an index by `(state, time, id)`, as (state, id).
fn entries_by_state(
    store: &EmbeddedStore,
    index: TableDefinition<'static, (&'static str, i64, &'static str), ()>,
) -> Vec<(String, String)> {
    let rows = index_rows(store, index).into_iter();
    rows.map(|(state, _, id)| (state, id)).collect()
}

#[tokio::test]
async fn only_in_flight_transfers_have_recovery_entries() {
    let (_dir, store) = open();
    let created = create_transfer(&store, "t1", "created", 1).await;
    create_transfer(&store, "t2", "rolled-back", 1).await;
    let entry = |state: &str, id: &str| (state.to_owned(), id.to_owned());
    assert_eq!(recovery_entries(&store), [entry("created", "t1")]);
    let WriteOutcome::Written(version) = created else {
        panic!("t1: {created:?}");
    };
    move_transfer(&store, "t1", "finished", 2, version).await;
    assert_eq!(recovery_entries(&store), []);
}

#[tokio::test]
async fn finished_transfers_have_no_state_entries_and_are_listed_from_the_creation_index() {
    let (_dir, store) = open();
    create_transfer(&store, "t1", "finished", 1).await;
    let source = transfer("t2", "created", 2).into();
    let created = store.create(Index::Transactions, "t2", source).await;
    create_transfer(&store, "t3", "finished", 3).await;
    create_transfer(&store, "t4", "rolled-back", 4).await;
    let entry = |state: &str, id: &str| (state.to_owned(), id.to_owned());
    assert_eq!(
        entries_by_state(&store, TX_BY_STATE_CREATED),
        [entry("created", "t2"), entry("rolled-back", "t4")]
    );
    let Ok(WriteOutcome::Written(version)) = created else {
        panic!("t2: {created:?}");
    };
    move_transfer(&store, "t2", "finished", 5, version).await;
    assert_eq!(
        entries_by_state(&store, TX_BY_STATE_CREATED),
        [entry("rolled-back", "t4")]
    );

    for limit in [1, 2, 10] {
        assert_eq!(
            list_all(&store, "finished", limit).await,
            ["t2", "t3", "t1"],
            "limit {limit}"
        );
    }
    assert_eq!(list_all(&store, "rolled-back", 1).await, ["t4"]);
    let of_account = TransferFilter {
        account: Some("a".into()),
        state: Some("finished".into()),
        limit: 10,
        ..TransferFilter::default()
    };
    let page = store.list_transfers(&of_account).await.unwrap();
    let ids: Vec<_> = page.docs.into_iter().map(|doc| doc.id).collect();
    assert_eq!(ids, ["t2", "t3", "t1"], "with the account filter too");
}

/// Every transfer listed in `state`, newest first, paging `limit` at a time.
async fn list_all(store: &EmbeddedStore, state: &str, limit: usize) -> Vec<String> {
    let mut filter = TransferFilter {
        state: Some(state.to_owned()),
        limit,
        ..TransferFilter::default()
    };
    let mut ids = Vec::new();
    for _ in 0..10 {
        let page = store.list_transfers(&filter).await.unwrap();
        ids.extend(page.docs.into_iter().map(|doc| doc.id));
        match page.next {
            Some(next) => filter.after = Some(next),
            None => return ids,
        }
    }
    panic!("paging does not end: {ids:?}");
}

/// A transfer `id` whose `entries` are `entries`.
fn with_entries(id: &str, entries: Value) -> Value {
    let mut doc = transfer(id, "finished", 1);
    doc[fields::ENTRIES] = entries;
    doc
}

#[tokio::test]
async fn account_entries_skip_malformed_values_and_undecodable_documents() {
    let (_dir, store) = open();
    let seq = |n: u64| format!("a/{n:020}/1/-1/0/d");
    let docs = [
        // Values that are not entries are skipped; the write and the well-formed one stand.
        (
            "t1",
            json!([42, null, {"a": 1}, "garbage", "a/1/x", "a/00000000000000000007", seq(7)]),
        ),
        ("t2", json!("a/00000000000000000007/not-an-array")),
        ("t3", json!({"a": seq(8)})),
        ("t4", json!([seq(8)])),
        ("t5", json!([seq(9)])),
    ];
    for (id, entries) in docs {
        let written = store
            .create(Index::Transactions, id, with_entries(id, entries).into())
            .await
            .unwrap();
        assert!(written.written().is_some(), "{id}: {written:?}");
    }
    let t = |id: &str, seq| ("a".to_owned(), seq, id.to_owned());
    assert_eq!(entry_rows(&store), [t("t1", 7), t("t4", 8), t("t5", 9)]);
    break_doc(&store, Index::Transactions, "t4");
    assert_eq!(filing_entries_of(&store, "a").await, ["t1", "t5"]);
}

#[tokio::test]
async fn a_write_moves_only_the_account_entries_that_changed() {
    let (_dir, store) = open();
    let seq = |account: &str, n: u64| format!("{account}/{n:020}/1/-1/0/d");
    let v = store
        .create(
            Index::Transactions,
            "t1",
            transfer("t1", "pending", 1).into(),
        )
        .await
        .unwrap();
    assert!(entry_rows(&store).is_empty(), "no entries, no rows");
    let mut seq_no = v.written().unwrap().seq_no;
    for (entries, rows) in [
        (vec![seq("a", 1), seq("b", 1)], vec![("a", 1), ("b", 1)]),
        (
            vec![seq("a", 1), seq("b", 1), seq("a", 2)],
            vec![("a", 1), ("a", 2), ("b", 1)],
        ),
        // The same entry twice is one row.
        (
            vec![seq("a", 1), seq("a", 1), seq("a", 2)],
            vec![("a", 1), ("a", 2)],
        ),
        (vec![], vec![]),
    ] {
        let doc = with_entries("t1", json!(entries));
        let outcome = store.bulk(vec![replace("t1", doc, seq_no)]).await.unwrap();
        seq_no = written(&outcome[0]);
        let want: Vec<(String, u64, String)> = rows
            .into_iter()
            .map(|(account, n)| (account.to_owned(), n, "t1".to_owned()))
            .collect();
        assert_eq!(entry_rows(&store), want, "{entries:?}");
    }
}

#[test]
fn entry_keys_sort_as_their_account_seq_and_number() {
    // Accounts that start one another, and seqs and numbers that differ in their high bytes.
    let mut tuples = Vec::new();
    for account in ["a", "a-b", "a.b", "a0", "a:b", "ab", "b"] {
        for seq in [0, 1, 255, 256, u64::MAX] {
            for number in [0, 7, 1 << 40] {
                tuples.push((account, seq, number));
            }
        }
    }
    let mut keys: Vec<EntryKey> = tuples
        .iter()
        .map(|&(account, seq, number)| EntryKey::new(account, seq, number))
        .collect();
    keys.sort();
    tuples.sort();
    let parsed: Vec<_> = keys
        .iter()
        .map(|key| EntryKey::parse(key.as_bytes()).expect("an entry key"))
        .collect();
    assert_eq!(parsed, tuples);
    assert_eq!(EntryKey::parse(b"a\x01too short"), None);
}

#[tokio::test]
async fn account_entries_of_an_account_holding_a_zero_are_none() {
    let (_dir, store) = open();
    let doc = with_entries("t1", json!([format!("a/{:020}/1/-1/0/d", 1)]));
    store
        .create(Index::Transactions, "t1", doc.into())
        .await
        .unwrap();
    let query = |account: &str| EntriesQuery {
        account: account.to_owned(),
        seqs: 0..u64::MAX,
        limit: 10,
    };
    assert_eq!(store.account_entries(&query("a")).await.unwrap().len(), 1);
    assert!(store
        .account_entries(&query("a\0"))
        .await
        .unwrap()
        .is_empty());
}

/// A redb table of the statement index's layout in a fresh database, for `work`.
fn with_statement_index(work: impl FnOnce(&mut redb::Table<'_, &'static [u8], &'static [u8]>)) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = redb::Database::create(dir.path().join("index.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    work(&mut txn.open_table(TX_ENTRIES).unwrap());
    txn.commit().unwrap();
}

#[test]
fn the_statement_index_finds_each_filed_entry_once_across_blocks_and_chunks() {
    use redb::ReadableTableMetadata as _;
    use statement_index::{add, all_rows, numbers_filing, remove, BLOCK_SEQS};
    let b = BLOCK_SEQS;
    // Account "a": seqs around two block boundaries, seq b filed by two transfers (7 and 8);
    // "a-b" starts with "a" and must stay apart; added in two chunks, one repeated.
    let key = |account, seq, number| EntryKey::new(account, seq, number);
    let mut first = vec![
        key("a", 1, 1),
        key("a", b - 1, 2),
        key("a", b, 7),
        key("a-b", 3, 9),
    ];
    let mut second = vec![key("a", b, 8), key("a", 2 * b, 3), key("a", b, 7)];
    first.sort();
    second.sort();
    with_statement_index(|table| {
        add(table, &first).unwrap();
        add(table, &second).unwrap();
        add(table, &first).unwrap();
        let row = |account: &str, seq, number| (account.to_owned(), seq, number);
        assert_eq!(
            all_rows(table),
            [
                row("a", 1, 1),
                row("a", b - 1, 2),
                row("a", b, 7),
                row("a", b, 8),
                row("a", 2 * b, 3),
                row("a-b", 3, 9),
            ]
        );
        let find = |table: &redb::Table<'_, &'static [u8], &'static [u8]>, seqs| {
            numbers_filing(table, "a", &seqs).unwrap()
        };
        assert_eq!(
            find(table, 0..u64::MAX),
            [(1, 1), (b - 1, 2), (b, 7), (b, 8), (2 * b, 3)]
        );
        // Ranges that start and end inside blocks and on their edges.
        assert_eq!(find(table, b - 1..b + 1), [(b - 1, 2), (b, 7), (b, 8)]);
        assert_eq!(find(table, b..2 * b), [(b, 7), (b, 8)]);
        assert_eq!(find(table, 2..b - 1), []);
        assert_eq!(find(table, 5..5), []);
        assert_eq!(numbers_filing(table, "a-b", &(0..10)).unwrap(), [(3, 9)]);
        assert_eq!(numbers_filing(table, "b", &(0..10)).unwrap(), []);
        // A removal takes that transfer's entry only; the block's last takes the row.
        remove(table, &key("a", b, 7)).unwrap();
        assert_eq!(find(table, b..b + 1), [(b, 8)]);
        remove(table, &key("a", 2 * b, 3)).unwrap();
        remove(table, &key("a", 2 * b, 3)).unwrap();
        assert_eq!(find(table, 2 * b..3 * b), []);
        assert_eq!(table.len().unwrap(), 3, "blocks a/0, a/1 and a-b/0");
    });
}
