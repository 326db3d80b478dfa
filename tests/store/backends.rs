//! One store test suite, run with the same test names against every backend:
//! `embedded::*` (redb in a temp dir), `emulator::*` (the Elasticsearch backend against the
//! in-process emulator, a test double of the REST subset), and `real_es::*` (the
//! Elasticsearch backend against a real cluster (`tools/es-cluster/run`); each of those tests
//! says it skipped, and why, where no cluster can run).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use transfer_service::time::format_millis;

use serde_json::{json, Value};
use transfer_service::store::{
    entries, ChangesQuery, DynStore, EntriesQuery, FeedPosition, Index, Page, SortKey, Source,
    StaleQuery, Store, StoreError, TransferFilter, TxnOutcome, Version, WriteOp, WriteOutcome,
};

use crate::support::stores::{self, create_op, replace_op};

fn transfer(id: &str, state: &str, src: &str, dest: &str, created: i64, modified: i64) -> Value {
    json!({
        "transaction_id": id,
        "src_acct": src,
        "dest_acct": dest,
        "amount": 1,
        "transaction_state": state,
        "creation_time": format_millis(created),
        "modification_time": format_millis(modified),
        // Held by a worker, as a transfer in flight is (a released one is a candidate at once).
        "lease_owner": "worker",
        "lease_expires_at": format_millis(modified + 30_000),
    })
}

fn replace(index: Index, id: &str, source: Value, expected: Version) -> WriteOp {
    WriteOp::ReplaceIf {
        index,
        id: id.to_owned(),
        source: source.into(),
        expected,
    }
}

fn written(outcome: WriteOutcome) -> Version {
    match outcome {
        WriteOutcome::Written(v) => v,
        other => panic!("expected a write, got {other:?}"),
    }
}

/// Creates `id`, which must be new: its version.
async fn create_new(s: &dyn Store, index: Index, id: &str, source: impl Into<Source>) -> Version {
    written(s.create(index, id, source.into()).await.unwrap())
}

/// Replaces `id`, whose version must be `v`: its new version.
async fn replace_current(
    s: &dyn Store,
    index: Index,
    id: &str,
    source: impl Into<Source>,
    v: Version,
) -> Version {
    written(s.replace_if(index, id, source.into(), v).await.unwrap())
}

/// The ids of a page, in order.
fn ids(page: &Page) -> Vec<String> {
    page.docs.iter().map(|d| d.id.clone()).collect()
}

/// A listing's filter: `account`'s and in `state` (when given), flagged ones only where
/// `attention`, after `after`, `limit` a page.
fn listing(
    account: Option<&str>,
    state: Option<&str>,
    attention: bool,
    after: Option<SortKey>,
    limit: usize,
) -> TransferFilter {
    TransferFilter {
        account: account.map(String::from),
        state: state.map(String::from),
        attention,
        metadata: Vec::new(),
        after,
        limit,
    }
}

/// The entries a transfer files, `(account, seq)` each.
type Filed<'a> = &'a [(&'a str, u64)];

/// A transfer filing `filed` as its `entries`, or no `entries` at all where `filed` is `None`.
fn filing(id: &str, created: i64, filed: Option<Filed<'_>>) -> Value {
    let mut doc = transfer(id, "finished", "x", "y", created, created);
    if let Some(filed) = filed {
        let values: Vec<String> = filed
            .iter()
            .map(|&(account, seq)| {
                format!("{}/1764371234567/-100/900/d", entries::bound(account, seq))
            })
            .collect();
        doc["entries"] = json!(values);
    }
    doc
}

/// The ids of the transfers filing entries of `account` in `seqs`, at most `limit`, sorted
/// (the store answers them in no particular order). Each must be what a `get` answers.
async fn filing_ids(
    s: &dyn Store,
    account: &str,
    seqs: std::ops::Range<u64>,
    limit: usize,
) -> Vec<String> {
    let query = EntriesQuery {
        account: account.to_owned(),
        seqs,
        limit,
    };
    let docs = s.account_entries(&query).await.unwrap();
    assert!(docs.len() <= limit, "{query:?}: {docs:?}");
    for doc in &docs {
        let got = s.get(Index::Transactions, &doc.id).await.unwrap();
        assert_eq!(Some(doc), got.as_ref(), "{query:?}");
    }
    let mut ids: Vec<String> = docs.into_iter().map(|d| d.id).collect();
    ids.sort();
    let len = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), len, "{query:?}: a transfer answered twice");
    ids
}

/// Asserts what each listing (`account`, `state`, ids wanted in order) shows on one page of
/// 10, flagged transfers only where `attention`.
async fn assert_listings(
    s: &dyn Store,
    attention: bool,
    listings: &[(Option<&str>, Option<&str>, &[&str])],
) {
    for &(account, state, want) in listings {
        let page = s
            .list_transfers(&listing(account, state, attention, None, 10))
            .await;
        assert_eq!(ids(&page.unwrap()), want, "{account:?} {state:?}");
    }
}

/// Every id `filter` lists, following the cursor from its first page to its last;
/// `check(page, ids seen so far)` runs on each page.
async fn every_page(
    s: &dyn Store,
    mut filter: TransferFilter,
    check: impl Fn(&Page, &[String]),
) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let page = s.list_transfers(&filter).await.unwrap();
        seen.extend(ids(&page));
        check(&page, &seen);
        match page.next {
            Some(next) => filter.after = Some(next),
            None => return seen,
        }
    }
}

/// The tests, one function each, shared by every backend.
mod suite {
    use super::*;

    pub async fn get_missing_returns_none(s: &dyn Store) {
        assert_eq!(s.get(Index::Accounts, "nobody").await.unwrap(), None);
    }

    pub async fn create_then_get_returns_source_and_version(s: &dyn Store) {
        let v = create_new(s, Index::Accounts, "a1", json!({"balance": 5})).await;
        let doc = s.get(Index::Accounts, "a1").await.unwrap().expect("found");
        assert_eq!(doc.id, "a1");
        assert_eq!(doc.source, json!({"balance": 5}));
        assert_eq!(doc.version, v);
        assert!(v.primary_term >= 1);
    }

    pub async fn create_existing_is_already_exists_and_changes_nothing(s: &dyn Store) {
        let v = create_new(s, Index::Accounts, "a1", json!({"n": 1})).await;
        let again = s
            .create(Index::Accounts, "a1", json!({"n": 2}).into())
            .await
            .unwrap();
        assert_eq!(again, WriteOutcome::AlreadyExists);
        let doc = s.get(Index::Accounts, "a1").await.unwrap().unwrap();
        assert_eq!(doc.source, json!({"n": 1}));
        assert_eq!(doc.version, v);
    }

    pub async fn replace_if_matching_version_writes_and_bumps_seq_no(s: &dyn Store) {
        let v1 = create_new(s, Index::Accounts, "a1", json!({"n": 1})).await;
        let v2 = replace_current(s, Index::Accounts, "a1", json!({"n": 2}), v1).await;
        assert!(v2.seq_no > v1.seq_no, "{v2:?} after {v1:?}");
        let doc = s.get(Index::Accounts, "a1").await.unwrap().unwrap();
        assert_eq!(
            (doc.source.to_value().unwrap(), doc.version),
            (json!({"n": 2}), v2)
        );
    }

    pub async fn replace_if_stale_version_conflicts_and_changes_nothing(s: &dyn Store) {
        let v1 = create_new(s, Index::Accounts, "a1", json!({"n": 1})).await;
        let v2 = replace_current(s, Index::Accounts, "a1", json!({"n": 2}), v1).await;
        let stale = s
            .replace_if(Index::Accounts, "a1", json!({"n": 3}).into(), v1)
            .await
            .unwrap();
        assert_eq!(stale, WriteOutcome::Conflict);
        let wrong_term = Version {
            seq_no: v2.seq_no,
            primary_term: v2.primary_term + 1,
        };
        let stale = s
            .replace_if(Index::Accounts, "a1", json!({"n": 4}).into(), wrong_term)
            .await
            .unwrap();
        assert_eq!(stale, WriteOutcome::Conflict);
        let doc = s.get(Index::Accounts, "a1").await.unwrap().unwrap();
        assert_eq!(
            (doc.source.to_value().unwrap(), doc.version),
            (json!({"n": 2}), v2)
        );
    }

    pub async fn replace_if_missing_doc_is_not_found(s: &dyn Store) {
        let v = create_new(s, Index::Accounts, "a1", json!({})).await;
        let outcome = s
            .replace_if(Index::Accounts, "ghost", json!({"n": 1}).into(), v)
            .await
            .unwrap();
        assert_eq!(outcome, WriteOutcome::NotFound);
        assert_eq!(s.get(Index::Accounts, "ghost").await.unwrap(), None);
    }

    /// Across the documents of one shard: on Elasticsearch each shard numbers its own
    /// operations (`ELASTICSEARCH_SHARDS`), so the ids are ones that route to one shard.
    pub async fn seq_no_increases_on_every_write_across_documents(s: &dyn Store) {
        let routing = es_routing::Routing::of(crate::support::cluster::shards(), None).unwrap();
        let same_shard = (0..)
            .map(|i| format!("a{i}"))
            .filter(|id| routing.shard_of(id) == routing.shard_of("a0"));
        let mut last = None;
        for id in same_shard.take(5) {
            let v = create_new(s, Index::Accounts, &id, json!({})).await;
            if let Some(prev) = last {
                assert!(v.seq_no > prev, "seq_no {} after {prev}", v.seq_no);
            }
            last = Some(v.seq_no);
        }
    }

    pub async fn bulk_reports_each_item_in_order(s: &dyn Store) {
        let v = create_new(s, Index::Accounts, "x", json!({"n": 0})).await;
        let stale = Version {
            seq_no: v.seq_no + 100,
            primary_term: v.primary_term,
        };
        let ops = vec![
            create_op(Index::Accounts, "new", json!({"n": 1})),
            create_op(Index::Accounts, "x", json!({"n": 9})),
            replace_op(Index::Accounts, "x", json!({"n": 9}), stale),
            replace_op(Index::Accounts, "missing", json!({"n": 9}), v),
            replace_op(Index::Accounts, "x", json!({"n": 2}), v),
            WriteOp::Create {
                index: Index::Transactions,
                id: "t".into(),
                source: transfer("t", "created", "new", "x", 1, 1).into(),
            },
        ];
        let results = s.bulk(ops).await.unwrap();
        let outcomes: Vec<_> = results.into_iter().map(Result::unwrap).collect();
        assert_eq!(outcomes.len(), 6);
        assert!(matches!(outcomes[0], WriteOutcome::Written(_)));
        assert_eq!(outcomes[1], WriteOutcome::AlreadyExists);
        assert_eq!(outcomes[2], WriteOutcome::Conflict);
        assert_eq!(outcomes[3], WriteOutcome::NotFound);
        assert!(matches!(outcomes[4], WriteOutcome::Written(_)));
        assert!(matches!(outcomes[5], WriteOutcome::Written(_)));
        let x = s.get(Index::Accounts, "x").await.unwrap().unwrap();
        assert_eq!(x.source, json!({"n": 2}));
        assert_eq!(
            s.get(Index::Accounts, "new").await.unwrap().unwrap().source,
            json!({"n": 1})
        );
    }

    pub async fn bulk_two_writes_on_one_version_only_first_wins(s: &dyn Store) {
        let v = create_new(s, Index::Accounts, "x", json!({"n": 0})).await;
        let op = |n: i64| replace_op(Index::Accounts, "x", json!({ "n": n }), v);
        let results = s.bulk(vec![op(1), op(2)]).await.unwrap();
        assert!(matches!(results[0], Ok(WriteOutcome::Written(_))));
        assert_eq!(results[1].clone().unwrap(), WriteOutcome::Conflict);
        let x = s.get(Index::Accounts, "x").await.unwrap().unwrap();
        assert_eq!(x.source, json!({"n": 1}));
    }

    pub async fn bulk_of_nothing_answers_nothing(s: &dyn Store) {
        assert!(s.bulk(Vec::new()).await.unwrap().is_empty());
    }

    pub async fn find_stale_filters_state_and_time_oldest_first(s: &dyn Store) {
        let docs = [
            ("t1", "pending", 300),
            ("t2", "finished", 100),
            ("t3", "created", 200),
            ("t4", "committed", 5_000),
            ("t5", "terminating", 100),
            ("t6", "rolled-back", 50),
        ];
        for (id, state, modified) in docs {
            s.create(
                Index::Transactions,
                id,
                transfer(id, state, "a", "b", 1, modified).into(),
            )
            .await
            .unwrap();
        }
        s.refresh().await.unwrap();
        let page = s
            .find_stale(&StaleQuery {
                states: ["created", "pending", "committed", "terminating"]
                    .map(String::from)
                    .to_vec(),
                modified_before: 1_000,
                after: None,
                limit: 10,
            })
            .await
            .unwrap();
        let ids: Vec<_> = page.docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["t5", "t3", "t1"]);
        assert_eq!(page.next, None);
        assert!(page.docs.iter().all(|d| d.version.primary_term >= 1));
    }

    pub async fn find_stale_includes_a_released_transfer_however_recent(s: &dyn Store) {
        let mut released = transfer("released", "pending", "a", "b", 1, 5_000);
        released["lease_owner"] = Value::Null;
        let mut no_owner_field = transfer("absent", "terminating", "a", "b", 1, 6_000);
        no_owner_field
            .as_object_mut()
            .unwrap()
            .remove("lease_owner");
        let mut done = transfer("done", "finished", "a", "b", 1, 7_000);
        done.as_object_mut().unwrap().remove("lease_owner");
        let docs = [
            ("held", transfer("held", "pending", "a", "b", 1, 5_000)),
            ("stale", transfer("stale", "pending", "a", "b", 1, 500)),
            ("released", released),
            ("absent", no_owner_field),
            ("done", done),
        ];
        for (id, source) in docs {
            s.create(Index::Transactions, id, source.into())
                .await
                .unwrap();
        }
        s.refresh().await.unwrap();
        let query = |after| StaleQuery {
            states: ["created", "pending", "committed", "terminating"]
                .map(String::from)
                .to_vec(),
            modified_before: 1_000,
            after,
            limit: 2,
        };
        let first = s.find_stale(&query(None)).await.unwrap();
        let mut ids: Vec<_> = first.docs.iter().map(|d| d.id.clone()).collect();
        let next = first.next.clone().expect("a second page");
        let second = s.find_stale(&query(Some(next))).await.unwrap();
        ids.extend(second.docs.iter().map(|d| d.id.clone()));
        assert_eq!(
            ids,
            ["stale", "released", "absent"],
            "oldest first, released included"
        );
    }

    pub async fn find_stale_pages_through_more_than_100(s: &dyn Store) {
        let ops: Vec<_> = (0..250)
            .map(|i| {
                let id = format!("t{i:03}");
                WriteOp::Create {
                    index: Index::Transactions,
                    source: transfer(&id, "pending", "a", "b", 1, 1_000 + i / 3).into(),
                    id,
                }
            })
            .collect();
        for result in s.bulk(ops).await.unwrap() {
            assert!(matches!(result, Ok(WriteOutcome::Written(_))));
        }
        s.refresh().await.unwrap();
        let mut seen = Vec::new();
        let mut after: Option<SortKey> = None;
        loop {
            let page = s
                .find_stale(&StaleQuery {
                    states: vec!["pending".into()],
                    modified_before: 10_000,
                    after: after.clone(),
                    limit: 100,
                })
                .await
                .unwrap();
            assert!(page.docs.len() <= 100);
            seen.extend(page.docs.iter().map(|d| d.id.clone()));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let want: Vec<_> = (0..250).map(|i| format!("t{i:03}")).collect();
        assert_eq!(seen, want, "every stale transfer once, oldest first");
    }

    pub async fn list_transfers_filters_and_pages_newest_first(s: &dyn Store) {
        let docs = [
            ("t1", "finished", "a", "b", 10),
            ("t2", "pending", "b", "c", 20),
            ("t3", "finished", "c", "a", 30),
            ("t4", "rolled-back", "a", "c", 40),
            ("t5", "finished", "b", "c", 50),
        ];
        for (id, state, src, dest, created) in docs {
            s.create(
                Index::Transactions,
                id,
                transfer(id, state, src, dest, created, created).into(),
            )
            .await
            .unwrap();
        }
        s.refresh().await.unwrap();
        let list = |account, state, after, limit| listing(account, state, false, after, limit);
        assert_listings(
            s,
            false,
            &[
                (None, None, &["t5", "t4", "t3", "t2", "t1"]),
                (Some("a"), None, &["t4", "t3", "t1"]),
                (None, Some("finished"), &["t5", "t3", "t1"]),
                (Some("a"), Some("finished"), &["t3", "t1"]),
            ],
        )
        .await;
        // Pages of two, following the cursor.
        let seen = every_page(s, list(None, None, None, 2), |_, _| {}).await;
        assert_eq!(seen, ["t5", "t4", "t3", "t2", "t1"]);
    }

    /// Transfers created in one millisecond list by id (the listing's order is creation time,
    /// then id, newest first), whatever order they were written in, and a page cut among
    /// them neither skips nor repeats one.
    pub async fn list_transfers_orders_one_millisecond_by_id_across_pages(s: &dyn Store) {
        for id in ["t3", "t5", "t1", "t4", "t2"] {
            let source = transfer(id, "finished", "a", "b", 50, 50);
            s.create(Index::Transactions, id, source.into())
                .await
                .unwrap();
        }
        let older = transfer("t0", "finished", "a", "b", 40, 40);
        s.create(Index::Transactions, "t0", older.into())
            .await
            .unwrap();
        s.refresh().await.unwrap();
        for account in [None, Some("a")] {
            for limit in [1, 2, 10] {
                let filter = TransferFilter {
                    account: account.map(String::from),
                    state: None,
                    attention: false,
                    metadata: Vec::new(),
                    after: None,
                    limit,
                };
                let seen = every_page(s, filter, |_, seen| {
                    assert!(seen.len() <= 6, "{account:?} by {limit}: {seen:?}")
                })
                .await;
                assert_eq!(
                    seen,
                    ["t5", "t4", "t3", "t2", "t1", "t0"],
                    "{account:?}, pages of {limit}"
                );
            }
        }
    }

    /// `attention` is written on a transfer that is already stored (the engine flags a
    /// transfer it finds contradicted), so most flags arrive by a conditional replace.
    pub async fn list_transfers_of_flagged_transfers_combines_with_the_other_filters(
        s: &dyn Store,
    ) {
        let docs = [
            ("t1", "pending", "a", "b", 10, true),
            ("t2", "pending", "b", "c", 20, false),
            ("t3", "committed", "c", "a", 30, true),
            ("t4", "pending", "a", "c", 40, true),
            ("t5", "finished", "b", "c", 50, false),
            ("t6", "pending", "c", "b", 60, true),
            ("t7", "pending", "a", "b", 70, false),
        ];
        for (id, state, src, dest, created, flagged) in docs {
            let plain = transfer(id, state, src, dest, created, created);
            let v = create_new(s, Index::Transactions, id, Source::from(&plain)).await;
            if flagged {
                let mut doc = plain;
                doc["attention"] = json!(format!("{id}: pending with a settled tombstone"));
                s.replace_if(Index::Transactions, id, doc.into(), v)
                    .await
                    .unwrap();
            }
        }
        // Flagged, then cleared by a person (the field removed): listed no more.
        let mut cleared = transfer("t8", "pending", "a", "b", 80, 80);
        cleared["attention"] = json!("was flagged");
        let v = create_new(s, Index::Transactions, "t8", cleared).await;
        let plain = transfer("t8", "pending", "a", "b", 80, 80);
        s.replace_if(Index::Transactions, "t8", plain.into(), v)
            .await
            .unwrap();
        // A null `attention` is no flag (Elasticsearch does not index a null).
        let mut null = transfer("t9", "pending", "a", "b", 90, 90);
        null["attention"] = Value::Null;
        s.create(Index::Transactions, "t9", null.into())
            .await
            .unwrap();
        s.refresh().await.unwrap();

        let list = |account, state, after, limit| listing(account, state, true, after, limit);
        let flagged = s.list_transfers(&list(None, None, None, 10)).await.unwrap();
        assert_eq!(ids(&flagged), ["t6", "t4", "t3", "t1"]);
        assert!(flagged
            .docs
            .iter()
            .all(|d| d.source.to_value().unwrap()["attention"].is_string()));
        assert_listings(
            s,
            true,
            &[
                (Some("a"), None, &["t4", "t3", "t1"]),
                (None, Some("pending"), &["t6", "t4", "t1"]),
                (Some("b"), Some("pending"), &["t6", "t1"]),
            ],
        )
        .await;
        let none = s
            .list_transfers(&list(None, Some("finished"), None, 10))
            .await
            .unwrap();
        assert!(none.docs.is_empty() && none.next.is_none());
        // Pages of one, following the cursor; with a filter, a page may end early but the
        // cursor never skips a match.
        for (account, want) in [
            (None, vec!["t6", "t4", "t3", "t1"]),
            (Some("a"), vec!["t4", "t3", "t1"]),
        ] {
            let filter = list(account, None, None, 1);
            let seen = every_page(s, filter, |page, _| assert!(page.docs.len() <= 1)).await;
            assert_eq!(seen, want, "{account:?}");
        }
    }

    /// Metadata is written with the transfer and kept by every state write; filters on it
    /// combine (all pairs, and the other filters) and page with the cursor.
    pub async fn list_transfers_by_metadata_combines_and_pages(s: &dyn Store) {
        // (id, state, src, created, metadata)
        #[rustfmt::skip]
        let docs = [
            ("t1", "finished", "a", 10, json!({"order": "1", "shop": "x"})),
            ("t2", "pending", "b", 20, json!({"order": "1"})),
            ("t3", "finished", "a", 30, json!({"order": "2", "shop": "x"})),
            ("t4", "finished", "b", 40, Value::Null),
            ("t5", "rolled-back", "a", 50, json!({"order": "1", "shop": "y"})),
            ("t6", "finished", "b", 60, json!({"order": "1", "shop": "x"})),
            ("t7", "finished", "a", 70, json!({"shop": "x", "order.line": "1"})),
        ];
        for (id, state, src, created, metadata) in docs {
            let mut doc = transfer(id, "created", src, "z", created, created);
            if !metadata.is_null() {
                doc["metadata"] = metadata;
            }
            let v = create_new(s, Index::Transactions, id, Source::from(&doc)).await;
            // The engine's state write keeps the metadata as it is.
            doc["transaction_state"] = json!(state);
            s.replace_if(Index::Transactions, id, doc.into(), v)
                .await
                .unwrap();
        }
        // Metadata removed by a write (only a person could do that): no longer found by it.
        let mut gone = transfer("t8", "finished", "a", "z", 80, 80);
        gone["metadata"] = json!({"order": "1"});
        let v = create_new(s, Index::Transactions, "t8", gone).await;
        let plain = transfer("t8", "finished", "a", "z", 80, 80);
        s.replace_if(Index::Transactions, "t8", plain.into(), v)
            .await
            .unwrap();
        s.refresh().await.unwrap();

        let list =
            |pairs: &[(&str, &str)], account: Option<&str>, state: Option<&str>, after, limit| {
                TransferFilter {
                    account: account.map(String::from),
                    state: state.map(String::from),
                    attention: false,
                    metadata: pairs
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    after,
                    limit,
                }
            };
        type Case<'a> = (
            &'a [(&'a str, &'a str)],
            Option<&'a str>,
            Option<&'a str>,
            &'a [&'a str],
        );
        let cases: [Case; 8] = [
            (&[("order", "1")], None, None, &["t6", "t5", "t2", "t1"]),
            (&[("order", "1"), ("shop", "x")], None, None, &["t6", "t1"]),
            (&[("shop", "x")], Some("a"), None, &["t7", "t3", "t1"]),
            (&[("order", "1")], None, Some("finished"), &["t6", "t1"]),
            (&[("order", "1")], Some("b"), Some("pending"), &["t2"]),
            // A dotted key is one key, not a path into another.
            (&[("order.line", "1")], None, None, &["t7"]),
            // Exact values only.
            (&[("order", "")], None, None, &[]),
            (&[("nothing", "1")], None, None, &[]),
        ];
        for (pairs, account, state, want) in cases {
            let page = s
                .list_transfers(&list(pairs, account, state, None, 10))
                .await
                .unwrap();
            assert_eq!(ids(&page), want, "{pairs:?} {account:?} {state:?}");
            // Pages of one, following the cursor: a page may end early, never skip a match.
            let filter = list(pairs, account, state, None, 1);
            let seen = every_page(s, filter, |page, _| assert!(page.docs.len() <= 1)).await;
            assert_eq!(seen, want, "paged: {pairs:?} {account:?} {state:?}");
        }
    }

    pub async fn scan_pages_every_document_in_id_order(s: &dyn Store) {
        for i in (0..25).rev() {
            let id = format!("acct-{i:02}");
            s.create(Index::Accounts, &id, json!({ "account_id": id }).into())
                .await
                .unwrap();
        }
        s.create(
            Index::Transactions,
            "t",
            transfer("t", "created", "a", "b", 1, 1).into(),
        )
        .await
        .unwrap();
        s.refresh().await.unwrap();
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = s.scan(Index::Accounts, after.as_deref(), 10).await.unwrap();
            assert!(page.docs.len() <= 10);
            seen.extend(page.docs.into_iter().map(|d| d.id));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let want: Vec<_> = (0..25).map(|i| format!("acct-{i:02}")).collect();
        assert_eq!(seen, want);
    }

    /// 32 tasks each add 1 ten times by read → conditional write, retrying on conflicts.
    pub async fn concurrent_increments_are_exact_and_conflicts_are_seen(store: DynStore) {
        store
            .create(Index::Accounts, "counter", json!({"n": 0}).into())
            .await
            .unwrap();
        let conflicts = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let store = store.clone();
            let conflicts = conflicts.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    loop {
                        let doc = store
                            .get(Index::Accounts, "counter")
                            .await
                            .unwrap()
                            .unwrap();
                        let n = doc.source.to_value().unwrap()["n"].as_i64().unwrap();
                        match store
                            .replace_if(
                                Index::Accounts,
                                "counter",
                                json!({ "n": n + 1 }).into(),
                                doc.version,
                            )
                            .await
                            .unwrap()
                        {
                            WriteOutcome::Written(_) => break,
                            WriteOutcome::Conflict => {
                                conflicts.fetch_add(1, Ordering::Relaxed);
                                tokio::task::yield_now().await;
                            }
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let doc = store
            .get(Index::Accounts, "counter")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            doc.source.to_value().unwrap()["n"],
            320,
            "every increment exactly once"
        );
        let conflicts = conflicts.load(Ordering::Relaxed);
        eprintln!("conflicts seen: {conflicts}");
        assert!(conflicts > 0, "32 concurrent writers must have conflicted");
    }

    /// The positions a backend hands out are of its own kind.
    fn is_exact(s: &dyn Store) -> bool {
        s.backend() == "embedded"
    }

    /// Every page of the feed from the start, with `limit` per page.
    async fn follow_changes(s: &dyn Store, limit: usize, horizon: i64) -> Vec<String> {
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let query = ChangesQuery {
                after: after.clone(),
                horizon,
                limit,
                newest: false,
            };
            let page = s.changes(&query).await.unwrap();
            assert!(page.docs.len() <= limit);
            let Some((last, _)) = page.docs.last() else {
                return seen;
            };
            after = Some(last.clone());
            seen.extend(page.docs.into_iter().map(|(_, doc)| doc.id));
        }
    }

    pub async fn changes_serve_transfers_in_the_order_of_their_latest_writes(s: &dyn Store) {
        let mut versions = Vec::new();
        for (n, id) in ["t1", "t2", "t3"].into_iter().enumerate() {
            let stamp = 1_000 * (n as i64 + 1);
            let doc = transfer(id, "created", "a", "b", stamp, stamp);
            versions.push(create_new(s, Index::Transactions, id, doc).await);
        }
        s.create(Index::Accounts, "a", json!({"account_id": "a"}).into())
            .await
            .unwrap();
        // t1 written again, later than the others: it moves to the end.
        let again = transfer("t1", "pending", "a", "b", 1_000, 4_000);
        replace_current(s, Index::Transactions, "t1", again, versions[0]).await;
        s.refresh().await.unwrap();
        let horizon = 10_000;
        assert_eq!(follow_changes(s, 2, horizon).await, ["t2", "t3", "t1"]);
        // Pages of 10 up to the horizon, from `after`; `newest`: the end of the feed.
        let changes = |after, newest| ChangesQuery {
            after,
            horizon,
            limit: 10,
            newest,
        };
        // The end of the feed: the newest write's document and position.
        let newest = s.changes(&changes(None, true)).await.unwrap();
        let ends: Vec<&str> = newest.docs.iter().map(|(_, d)| d.id.as_str()).collect();
        assert_eq!(ends, ["t1"]);
        let after_end = changes(Some(newest.docs[0].0.clone()), false);
        assert!(s.changes(&after_end).await.unwrap().docs.is_empty());
        assert_eq!(follow_changes(s, 100, horizon).await, ["t2", "t3", "t1"]);
        // The page holds the documents as they are now.
        let page = s.changes(&changes(None, false)).await.unwrap();
        let (_, t1) = page.docs.last().unwrap();
        assert_eq!(
            t1.source.to_value().unwrap()["transaction_state"],
            "pending"
        );
        // A position of the other backend's kind is refused.
        let foreign = if is_exact(s) {
            FeedPosition::Time(SortKey {
                millis: 1,
                id: "t1".into(),
            })
        } else {
            FeedPosition::Seq(1)
        };
        let query = ChangesQuery {
            after: Some(foreign),
            horizon,
            limit: 10,
            newest: false,
        };
        assert!(s.changes(&query).await.is_err());
    }

    pub async fn changes_stay_below_the_horizon_where_writes_are_not_ordered(s: &dyn Store) {
        let doc = transfer("t", "created", "a", "b", 5_000, 5_000);
        s.create(Index::Transactions, "t", doc.into())
            .await
            .unwrap();
        s.refresh().await.unwrap();
        let served = |horizon| async move { follow_changes(s, 10, horizon).await };
        assert_eq!(served(5_001).await, ["t"]);
        let newest_below = |horizon| async move {
            let query = ChangesQuery {
                after: None,
                horizon,
                limit: 1,
                newest: true,
            };
            s.changes(&query).await.unwrap().docs.len()
        };
        assert_eq!(newest_below(5_001).await, 1);
        if is_exact(s) {
            // The embedded store orders writes exactly: no horizon.
            assert_eq!(served(5_000).await, ["t"]);
        } else {
            assert!(served(5_000).await.is_empty(), "stamped at the horizon");
            assert_eq!(newest_below(5_000).await, 0, "nothing below the horizon");
        }
    }

    /// A store without transactions says so and refuses one, writing nothing; one with them
    /// makes every write of a transaction or none.
    pub async fn a_transaction_writes_all_of_its_documents_or_none(s: &dyn Store) {
        let v1 = create_new(s, Index::Accounts, "a1", json!({"n": 1})).await;
        let v2 = create_new(s, Index::Accounts, "a2", json!({"n": 2})).await;
        let both = |first: Version, second: Version, n: i64| -> transfer_service::store::TxnWork {
            Box::new(move |_| {
                vec![
                    replace(Index::Accounts, "a1", json!({ "n": n }), first),
                    replace(Index::Accounts, "a2", json!({ "n": n }), second),
                ]
            })
        };
        if !s.transactions() {
            let refused = s.transact(both(v1, v2, 9)).await;
            assert!(
                matches!(refused, Err(StoreError::Permanent(_))),
                "{refused:?}"
            );
            assert_eq!(
                s.get(Index::Accounts, "a1").await.unwrap().unwrap().version,
                v1
            );
            return;
        }
        let TxnOutcome::Committed(versions) = s.transact(both(v1, v2, 3)).await.unwrap() else {
            panic!("a transaction on the live versions was refused");
        };
        for (id, version) in [("a1", versions[0]), ("a2", versions[1])] {
            let doc = s.get(Index::Accounts, id).await.unwrap().unwrap();
            assert_eq!(
                (doc.source, doc.version),
                (Source::from(json!({"n": 3})), version)
            );
        }
        // The second write's version is stale: the first is not made either.
        let refused = s.transact(both(versions[0], v2, 4)).await.unwrap();
        assert_eq!(refused, TxnOutcome::Refused);
        assert_eq!(
            s.get(Index::Accounts, "a1").await.unwrap().unwrap().version,
            versions[0]
        );
    }

    /// Transactions that each read a counter and write it plus one lose no increment: the
    /// reads of each see the writes of those before it, conflicts cannot happen.
    /// Only for a store with transactions (a store without them refuses one: see
    /// [`a_transaction_writes_all_of_its_documents_or_none`]).
    pub async fn concurrent_transactions_read_each_others_writes(s: DynStore) {
        assert!(
            s.transactions(),
            "the {} store has no transactions",
            s.backend()
        );
        s.create(Index::Accounts, "counter", json!({"n": 0}).into())
            .await
            .unwrap();
        let increments = (0..40).map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                s.transact(Box::new(|reads| {
                    let doc = reads.get(Index::Accounts, "counter").unwrap().unwrap();
                    let n = doc.source.to_value().unwrap()["n"].as_i64().unwrap();
                    vec![replace(
                        Index::Accounts,
                        "counter",
                        json!({ "n": n + 1 }),
                        doc.version,
                    )]
                }))
                .await
                .unwrap()
            })
        });
        for outcome in futures_util::future::join_all(increments).await {
            assert!(matches!(outcome.unwrap(), TxnOutcome::Committed(_)));
        }
        let counter = s.get(Index::Accounts, "counter").await.unwrap().unwrap();
        assert_eq!(counter.source, json!({"n": 40}));
    }

    pub async fn account_entries_find_the_transfers_of_one_account_in_a_range_of_seqs(
        s: &dyn Store,
    ) {
        let all = 0..u64::MAX;
        let docs: [(&str, Option<Filed<'_>>); 6] = [
            // Two accounts, and two entries of one of them.
            ("t1", Some(&[("a", 1), ("a.b", 1), ("a", 2)])),
            ("t2", Some(&[("a0", 1), ("a", 3)])),
            // Accounts whose ids start with `a`, on both sides of `/` in byte order.
            ("t3", Some(&[("ab", 1), ("a-b", 1), ("a:b", 1), ("a", 5)])),
            ("t4", None),
            ("t5", Some(&[("a", 4)])),
            ("t6", Some(&[])),
        ];
        let ops = docs
            .iter()
            .enumerate()
            .map(|(i, &(id, filed))| {
                create_op(Index::Transactions, id, filing(id, i as i64, filed))
            })
            .collect();
        for item in s.bulk(ops).await.unwrap() {
            written(item.unwrap());
        }
        s.refresh().await.unwrap();
        let find =
            |account: &'static str, seqs: std::ops::Range<u64>| filing_ids(s, account, seqs, 10);
        // From inclusive, to exclusive.
        assert_eq!(find("a", 1..2).await, ["t1"]);
        assert_eq!(find("a", 2..4).await, ["t1", "t2"]);
        assert_eq!(find("a", 3..5).await, ["t2", "t5"]);
        assert_eq!(find("a", 5..6).await, ["t3"]);
        assert_eq!(find("a", 6..1_000).await, Vec::<String>::new());
        assert_eq!(find("a", 4..4).await, Vec::<String>::new());
        assert_eq!(find("a", all.clone()).await, ["t1", "t2", "t3", "t5"]);
        // Each account's own entries only, whatever ids start alike.
        for (account, want) in [
            ("a.b", "t1"),
            ("a0", "t2"),
            ("ab", "t3"),
            ("a-b", "t3"),
            ("a:b", "t3"),
        ] {
            assert_eq!(find(account, all.clone()).await, [want], "{account}");
            assert_eq!(find(account, 1..2).await, [want], "{account}");
            assert_eq!(
                find(account, 2..10).await,
                Vec::<String>::new(),
                "{account}"
            );
        }
        for account in ["b", "a.", "a/", "A", "a.b.c"] {
            assert_eq!(
                find(account, all.clone()).await,
                Vec::<String>::new(),
                "{account}"
            );
        }
        // At most `limit`, each once, whatever the number of entries each files.
        let some = filing_ids(s, "a", all.clone(), 2).await;
        assert_eq!(some.len(), 2, "{some:?}");
        assert!(some
            .iter()
            .all(|id| ["t1", "t2", "t3", "t5"].contains(&id.as_str())));
        assert_eq!(filing_ids(s, "a", all, 0).await, Vec::<String>::new());
    }

    pub async fn account_entries_follow_the_writes_of_a_transfer(s: &dyn Store) {
        let all = 0..u64::MAX;
        let v = create_new(s, Index::Transactions, "t1", filing("t1", 1, None)).await;
        let v2 = create_new(
            s,
            Index::Transactions,
            "t2",
            filing("t2", 2, Some(&[("a", 1)])),
        )
        .await;
        s.refresh().await.unwrap();
        assert_eq!(filing_ids(s, "a", all.clone(), 10).await, ["t2"]);
        // A transfer without entries gains some; another one gains one more.
        let v = replace_current(
            s,
            Index::Transactions,
            "t1",
            filing("t1", 1, Some(&[("a", 2)])),
            v,
        )
        .await;
        let v2 = replace_current(
            s,
            Index::Transactions,
            "t2",
            filing("t2", 2, Some(&[("a", 1), ("b", 1), ("a", 3)])),
            v2,
        )
        .await;
        s.refresh().await.unwrap();
        assert_eq!(filing_ids(s, "a", 2..3, 10).await, ["t1"]);
        assert_eq!(filing_ids(s, "a", 3..4, 10).await, ["t2"]);
        assert_eq!(filing_ids(s, "a", 1..2, 10).await, ["t2"]);
        assert_eq!(filing_ids(s, "b", all.clone(), 10).await, ["t2"]);
        // A write that drops values (the engine never does) leaves them behind: only what the
        // document files now is found.
        replace_current(s, Index::Transactions, "t1", filing("t1", 1, None), v).await;
        replace_current(
            s,
            Index::Transactions,
            "t2",
            filing("t2", 2, Some(&[("a", 3)])),
            v2,
        )
        .await;
        s.refresh().await.unwrap();
        assert_eq!(filing_ids(s, "a", all.clone(), 10).await, ["t2"]);
        assert_eq!(filing_ids(s, "a", 1..3, 10).await, Vec::<String>::new());
        assert_eq!(filing_ids(s, "b", all, 10).await, Vec::<String>::new());
    }

    pub async fn ready_answers_ok(s: &dyn Store) {
        s.ready().await.unwrap();
    }
}

macro_rules! store_suite {
    ($backend:ident, $make:path, [$($test:ident),* $(,)?], [$($shared:ident),* $(,)?]) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(ctx) = $make().await else { return };
                    super::suite::$test(ctx.store.as_ref()).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $shared() {
                    let Some(ctx) = $make().await else { return };
                    super::suite::$shared(ctx.store.clone()).await;
                }
            )*
        }
    };
}

macro_rules! all_backends {
    ($($backend:ident => $make:path),*) => {
        $(
            store_suite!($backend, $make, [
                get_missing_returns_none,
                create_then_get_returns_source_and_version,
                create_existing_is_already_exists_and_changes_nothing,
                replace_if_matching_version_writes_and_bumps_seq_no,
                replace_if_stale_version_conflicts_and_changes_nothing,
                replace_if_missing_doc_is_not_found,
                seq_no_increases_on_every_write_across_documents,
                bulk_reports_each_item_in_order,
                bulk_two_writes_on_one_version_only_first_wins,
                bulk_of_nothing_answers_nothing,
                find_stale_filters_state_and_time_oldest_first,
                find_stale_includes_a_released_transfer_however_recent,
                find_stale_pages_through_more_than_100,
                list_transfers_filters_and_pages_newest_first,
                list_transfers_orders_one_millisecond_by_id_across_pages,
                list_transfers_of_flagged_transfers_combines_with_the_other_filters,
                list_transfers_by_metadata_combines_and_pages,
                scan_pages_every_document_in_id_order,
                account_entries_find_the_transfers_of_one_account_in_a_range_of_seqs,
                account_entries_follow_the_writes_of_a_transfer,
                changes_serve_transfers_in_the_order_of_their_latest_writes,
                changes_stay_below_the_horizon_where_writes_are_not_ordered,
                a_transaction_writes_all_of_its_documents_or_none,
                ready_answers_ok,
            ], [
                concurrent_increments_are_exact_and_conflicts_are_seen,
            ]);
        )*
    };
}

all_backends!(
    embedded => super::stores::embedded,
    emulator => super::stores::on_emulator,
    real_es => super::stores::real_es
);

/// What only a store with transactions (the embedded one) does; the Elasticsearch backend has
/// none and refuses a transaction, which the suite above checks on every backend.
mod with_transactions {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_transactions_read_each_others_writes() {
        let ctx = super::stores::embedded().await.expect("an embedded store");
        super::suite::concurrent_transactions_read_each_others_writes(ctx.store.clone()).await;
    }
}
