//! Indexes added by later versions, built from the documents when an older store is opened.

use redb::TableHandle;

use super::*;

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
        create_transfer(&store, "t1", "pending", 1).await;
        store
            .create(Index::Transactions, "t2", flagged().into())
            .await
            .unwrap();
        // As an older version left it: no index of flagged transfers, no marker.
        as_before_the_index(&store, TX_ATTENTION, ATTENTION_BUILT);
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
    let entries = |store: &EmbeddedStore| index_rows(store, TX_METADATA);
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
        as_before_the_index(&store, TX_METADATA, METADATA_BUILT);
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

#[tokio::test]
async fn a_store_holding_entries_without_their_index_gets_it_built_when_opened() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let store = EmbeddedStore::open(dir.path()).unwrap();
        for (id, doc) in [
            ("t1", filing("t1", json!([seq("a", 1), seq("b", 1)]))),
            ("t2", transfer("t2", "finished", 2)),
            ("t3", filing("t3", json!([seq("a", 2)]))),
        ] {
            store
                .create(Index::Transactions, id, doc.into())
                .await
                .unwrap();
        }
        // As a version without the table (or one that opened the store in between) left it:
        // transfers with entries, no rows, no marker.
        as_before_the_index(&store, TX_ENTRIES, ENTRIES_BUILT);
    }
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(filing_entries_of(&store, "a").await, ["t1", "t3"]);
    assert_eq!(filing_entries_of(&store, "b").await, ["t1"]);
    let built = entry_rows(&store);
    let row = |account: &str, n, id: &str| (account.to_owned(), n, id.to_owned());
    assert_eq!(
        built,
        [row("a", 1, "t1"), row("a", 2, "t3"), row("b", 1, "t1")]
    );
    // Built once: opening again neither duplicates nor loses it.
    drop(store);
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(entry_rows(&store), built);
}

#[tokio::test]
async fn a_store_holding_the_tuple_keyed_statement_index_is_opened_and_its_index_rebuilt() {
    // As a version up to 6df5583 left it after this one had built the index: it filed t2's
    // entries only in its own table, keyed by the tuple, under its own marker.
    let file_as_before = |txn: &redb::WriteTransaction, number: u64| {
        (txn.open_table(TUPLE_KEYED_ENTRIES).unwrap())
            .insert(("a", 2, number), ())
            .unwrap();
        TUPLE_KEYED_ENTRIES_BUILT
    };
    an_older_statement_index_is_forgotten_and_rebuilt("tx_entries", file_as_before).await;
}

#[tokio::test]
async fn a_store_holding_the_row_keyed_statement_index_is_opened_and_its_index_rebuilt() {
    // As a version up to 8173fe6 left it after this one had built the index: it filed t2's
    // entries only in its own table, a row per entry, under its own marker.
    let file_as_before = |txn: &redb::WriteTransaction, number: u64| {
        (txn.open_table(ROW_KEYED_ENTRIES).unwrap())
            .insert(EntryKey::new("a", 2, number).as_bytes(), ())
            .unwrap();
        ROW_KEYED_ENTRIES_BUILT
    };
    an_older_statement_index_is_forgotten_and_rebuilt("statement_entries", file_as_before).await;
}

/// Two transfers file entries of account `a`; then, as an older version left the store, the
/// second's entry is missing from this version's index and filed instead (by
/// `file_as_before`, which answers its marker) in the older one's table `old_table`. Opened
/// again, the store answers both, holds no `old_table` and no marker of it (so that older
/// version, opened again, builds its own from the documents).
async fn an_older_statement_index_is_forgotten_and_rebuilt(
    old_table: &str,
    file_as_before: impl Fn(&redb::WriteTransaction, u64) -> &'static str,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = {
        let store = EmbeddedStore::open(dir.path()).unwrap();
        for (id, n) in [("t1", 1), ("t2", 2)] {
            let doc = filing(id, json!([seq("a", n)]));
            store
                .create(Index::Transactions, id, doc.into())
                .await
                .unwrap();
        }
        settle(&store);
        let txn = store.db.begin_write().unwrap();
        let number = number_of(&txn, "t2");
        let t2 = EntryKey::new("a", 2, number);
        statement_index::remove(&mut txn.open_table(TX_ENTRIES).unwrap(), &t2).unwrap();
        let marker = file_as_before(&txn, number);
        txn.open_table(META).unwrap().insert(marker, 1).unwrap();
        txn.commit().unwrap();
        marker
    };
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(filing_entries_of(&store, "a").await, ["t1", "t2"]);
    let row = |n, id: &str| ("a".to_owned(), n, id.to_owned());
    assert_eq!(entry_rows(&store), [row(1, "t1"), row(2, "t2")]);
    let txn = store.db.begin_read().unwrap();
    let names: Vec<String> = txn
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_owned())
        .collect();
    assert!(!names.contains(&old_table.to_owned()), "{names:?}");
    let meta = txn.open_table(META).unwrap();
    assert!(meta.get(marker).unwrap().is_none());
}

/// Transfer `id`, finished, filing the account entries `values`.
fn filing(id: &str, values: Value) -> Value {
    let mut doc = transfer(id, "finished", 1);
    doc[fields::ENTRIES] = values;
    doc
}

/// The filed form of `account`'s entry `n` (a debit of 1 leaving 0).
fn seq(account: &str, n: u64) -> String {
    format!("{account}/{n:020}/1/-1/0/d")
}

/// The number of transfer `id` ([`TX_IDS`]).
fn number_of(txn: &redb::WriteTransaction, id: &str) -> u64 {
    let ids = txn.open_table(TX_IDS).unwrap();
    let number = ids
        .iter()
        .unwrap()
        .map(Result::unwrap)
        .find(|(_, v)| v.value() == id)
        .map(|(number, _)| number.value());
    number.expect("numbered")
}

/// As a version before numbers left the store: listing and feed entries by id, in tables of
/// their own (given an entry each here, to see them go), and no transfer numbered.
fn unnumber(store: &EmbeddedStore) {
    settle(store);
    let txn = store.db.begin_write().unwrap();
    txn.delete_table(TX_IDS).unwrap();
    txn.delete_table(TX_CHANGES).unwrap();
    txn.delete_table(TX_BY_CREATED).unwrap();
    txn.delete_table(TX_BY_ACCOUNT).unwrap();
    for name in BY_ID_TABLES {
        let old: TableDefinition<&str, ()> = TableDefinition::new(name);
        txn.open_table(old).unwrap().insert("t1", ()).unwrap();
    }
    txn.open_table(META).unwrap().remove(NUMBERED).unwrap();
    txn.commit().unwrap();
}

fn by_account(account: &str) -> TransferFilter {
    TransferFilter {
        account: Some(account.to_owned()),
        ..TransferFilter::default()
    }
}

/// Every transfer, then those of `a` and those of `b`.
async fn listings(store: &EmbeddedStore) -> [Vec<String>; 3] {
    [
        listed(store, TransferFilter::default()).await,
        listed(store, by_account("a")).await,
        listed(store, by_account("b")).await,
    ]
}

/// Writes transfer `id` (created at 7) again, `pending` and modified at `modified`.
async fn move_on(store: &EmbeddedStore, id: &str, modified: i64) {
    let stored = store.get(Index::Transactions, id).await.unwrap();
    let mut doc = transfer(id, "pending", 7);
    doc[fields::MODIFIED] = json!(format_millis(modified));
    let version = stored.expect("stored").version;
    store
        .replace_if(Index::Transactions, id, doc.into(), version)
        .await
        .unwrap();
}

fn table_names(store: &EmbeddedStore) -> Vec<String> {
    let txn = store.db.begin_read().unwrap();
    let names = txn.list_tables().unwrap();
    names.map(|table| table.name().to_owned()).collect()
}

#[tokio::test]
async fn a_store_written_before_numbers_gets_its_transfers_numbered_when_opened() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_without_checkpoints(dir.path());
    // Created in one millisecond, in an order that is not their ids'.
    for id in ["t2", "t3", "t1"] {
        create_transfer(&store, id, "created", 7).await;
    }
    // t3's latest write is not its first.
    move_on(&store, "t3", 8).await;
    assert_eq!(listed(&store, by_account("a")).await, ["t3", "t2", "t1"]);
    unnumber(&store);
    // Written after, in the log only: its replay finds t1's number in the feed just built.
    move_on(&store, "t1", 9).await;
    let image = super::durability::crash_image(dir.path(), true);
    drop(store);

    let store = EmbeddedStore::open(image.path()).unwrap();
    let numbered = listings(&store).await;
    assert_eq!(numbered, [["t3", "t2", "t1"]; 3], "ties by id");
    let by_latest_write = [
        (FeedPosition::Seq(0), "t2".to_owned()),
        (FeedPosition::Seq(3), "t3".to_owned()),
        (FeedPosition::Seq(4), "t1".to_owned()),
    ];
    assert_eq!(feed(&store).await, by_latest_write);
    let tables = table_names(&store);
    for old in BY_ID_TABLES {
        assert!(!tables.iter().any(|t| t == old), "{old} in {tables:?}");
    }
    // Numbered once: opening again changes nothing, and new transfers take later numbers.
    drop(store);
    let store = EmbeddedStore::open(image.path()).unwrap();
    assert_eq!(listings(&store).await, numbered);
    create_transfer(&store, "t0", "created", 7).await;
    assert_eq!(
        listed(&store, by_account("b")).await,
        ["t3", "t2", "t1", "t0"]
    );
    assert_eq!(feed(&store).await.len(), 4);
}

#[tokio::test]
async fn terminal_transfers_are_stored_compressed_and_plain_ones_of_older_versions_still_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let finished = |id: &str| transfer(id, "finished", 3);
    {
        let store = EmbeddedStore::open(dir.path()).unwrap();
        create_transfer(&store, "in-flight", "pending", 1).await;
        create_transfer(&store, "done", "finished", 2).await;
        // As an older version left it: a finished transfer stored plain.
        settle(&store);
        let txn = store.db.begin_write().unwrap();
        {
            let mut docs = txn.open_table(DOCS).unwrap();
            let mut plain = 9u64.to_le_bytes().to_vec();
            plain.extend_from_slice(&serde_json::to_vec(&finished("old")).unwrap());
            docs.insert((Index::Transactions.name(), "old"), plain.as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
        let body = |id| raw(&store, Index::Transactions, id).unwrap()[8];
        assert_eq!(
            body("in-flight"),
            b'{',
            "an in-flight transfer is stored plain"
        );
        assert_ne!(
            body("done"),
            b'{',
            "a terminal transfer is stored compressed"
        );
    }
    // Reopened (the log replayed): every document reads as it was written.
    let store = EmbeddedStore::open(dir.path()).unwrap();
    for (id, expected) in [
        ("in-flight", transfer("in-flight", "pending", 1)),
        ("done", transfer("done", "finished", 2)),
        ("old", finished("old")),
    ] {
        let doc = store.get(Index::Transactions, id).await.unwrap().unwrap();
        assert_eq!(doc.source.to_value().unwrap(), expected, "{id}");
    }
    let scanned = store.scan(Index::Transactions, None, 10).await.unwrap();
    assert_eq!(scanned.docs.len(), 3);
}
