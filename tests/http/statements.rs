//! Account statements (`docs/api.md`, "Statements"; `docs/design.md §12`):
//! `GET /accounts/{id}/entries` and `GET /accounts/{id}/balance?at=`, on every backend.
//!
//! The statement of every account a mixed history touched must add up exactly: `seq` 1 to n
//! with no gap, each entry's balance the one before plus its amount, the newest the balance
//! now, and each transfer's entries on an account summing to what it left there. A dropped
//! entry breaks the first, a doubled one the others.

use std::collections::BTreeMap;

use crate::support::app::{Backend, TestApp};
use crate::support::wait;
use serde_json::{json, Value};
use transfer_service::audit::{audit, ViolationKind};

/// Every entry of `account`, oldest first, read newest first `page` at a time.
async fn statement(app: &TestApp, account: &str, page: usize) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut path = format!("/accounts/{account}/entries?limit={page}");
    loop {
        let (status, body) = app.get(&path).await;
        assert_eq!(status, 200, "{path}: {body}");
        let items = body["items"].as_array().expect("items");
        assert!(items.len() <= page, "{body}");
        entries.extend(items.iter().cloned());
        match body["next_cursor"].as_str() {
            Some(cursor) => {
                path = format!("/accounts/{account}/entries?limit={page}&cursor={cursor}")
            }
            None => break,
        }
    }
    entries.reverse();
    entries
}

/// The statement's promises (module docs); answers each transfer's net on the account.
fn assert_exact(
    account: &str,
    entries: &[Value],
    opening: i64,
    balance: i64,
) -> BTreeMap<String, i64> {
    let mut running = opening;
    let mut by_transfer = BTreeMap::new();
    for (i, entry) in entries.iter().enumerate() {
        assert_eq!(
            entry["seq"],
            i as u64 + 1,
            "{account}: a gap or a repeat at {entry}"
        );
        let amount = entry["amount"].as_i64().expect("amount");
        assert_ne!(amount, 0, "{account}: an entry that moves nothing: {entry}");
        running += amount;
        assert_eq!(
            entry["balance_after"], running,
            "{account}: the running sum breaks at {entry}"
        );
        let transfer = entry["transfer_id"]
            .as_str()
            .expect("transfer_id")
            .to_owned();
        *by_transfer.entry(transfer).or_default() += amount;
    }
    assert_eq!(
        running, balance,
        "{account}: the newest entry is not the balance"
    );
    by_transfer
}

/// The `seq`s of one page of entries.
async fn seqs_of(app: &TestApp, path: &str) -> Vec<u64> {
    let (status, page) = app.get(path).await;
    assert_eq!(status, 200, "{path}: {page}");
    let items = page["items"].as_array().expect("items");
    items.iter().filter_map(|e| e["seq"].as_u64()).collect()
}

async fn settled(app: &TestApp, id: &str, state: &str) {
    let done = app.settled(id).await;
    assert_eq!(done["state"], state, "{done}");
}

async fn hold(app: &TestApp, id: &str, from: &str, to: &str, amount: i64, expires_in: &str) {
    let body = json!({"id": id, "from": from, "to": to, "amount": amount, "hold": true,
        "hold_expires_in": expires_in});
    let (status, body) = app.post("/transfers", body).await;
    assert_eq!(status, 201, "{body}");
    wait::until_some(&format!("{id} to wait for its capture"), || async {
        let (status, body) = app.get(&format!("/transfers/{id}?wait=5s")).await;
        (status == 200 && body["state"] == "pending").then_some(())
    })
    .await;
}

mod cases {
    use super::*;

    pub async fn a_mixed_history_leaves_every_account_an_exact_statement(b: Backend) {
        let app = TestApp::spawn(b).await;
        let opening = [("a", 1000), ("b", 0), ("c", 0), ("d", 50)];
        for (id, balance) in opening {
            app.open_account(id, balance).await;
        }
        // A transfer, a multi-leg transaction (b in two legs), a refused one.
        app.transfer_accepted("t1", "a", "b", 100).await;
        settled(&app, "t1", "finished").await;
        let legs = json!({"id": "m1", "legs": [
            {"from": "a", "to": "b", "amount": 30}, {"from": "a", "to": "c", "amount": 20},
            {"from": "b", "to": "c", "amount": 5}]});
        assert_eq!(app.post("/transfers", legs).await.0, 201);
        settled(&app, "m1", "finished").await;
        app.transfer_accepted("t2", "d", "a", 100).await;
        settled(&app, "t2", "rolled-back").await;
        // A multi-leg transaction refused by its last account: on Elasticsearch the accounts
        // before it were applied and are taken back.
        let refused = json!({"id": "m2", "legs": [
            {"from": "b", "to": "c", "amount": 1}, {"from": "d", "to": "c", "amount": 1000}]});
        assert_eq!(app.post("/transfers", refused).await.0, 201);
        settled(&app, "m2", "rolled-back").await;
        // Holds: captured in part, cancelled, expired.
        hold(&app, "h1", "a", "c", 40, "10m").await;
        let (status, body) = app
            .post("/transfers/h1/capture", json!({"amount": 15}))
            .await;
        assert_eq!(status, 200, "{body}");
        settled(&app, "h1", "finished").await;
        hold(&app, "h2", "a", "b", 10, "10m").await;
        assert_eq!(app.post("/transfers/h2/cancel", json!({})).await.0, 200);
        settled(&app, "h2", "rolled-back").await;
        hold(&app, "h3", "c", "d", 5, "1s").await;
        settled(&app, "h3", "rolled-back").await;

        // What each transfer left on each account, as the balances say.
        let left: BTreeMap<(&str, &str), i64> = [
            (("a", "t1"), -100),
            (("b", "t1"), 100),
            (("a", "m1"), -50),
            (("b", "m1"), 25),
            (("c", "m1"), 25),
            (("a", "h1"), -15),
            (("c", "h1"), 15),
        ]
        .into_iter()
        .collect();
        for (account, opened) in opening {
            let entries = statement(&app, account, 3).await;
            let by_transfer = assert_exact(account, &entries, opened, app.balance(account).await);
            for (transfer, net) in by_transfer {
                let want = left
                    .get(&(account, transfer.as_str()))
                    .copied()
                    .unwrap_or(0);
                assert_eq!(net, want, "{account}: {transfer} left {net}, not {want}");
            }
            let kinds: Vec<&str> = entries.iter().filter_map(|e| e["kind"].as_str()).collect();
            if account == "a" {
                // h1 reserved 40 and released 25; h2 reserved 10 and released all of it.
                assert!(
                    kinds.contains(&"hold") && kinds.contains(&"release"),
                    "{kinds:?}"
                );
            }
        }
        // The auditor finds the same: every statement adds up.
        let report = audit(app.store().as_ref(), i64::MAX).await.expect("audit");
        assert!(report.is_clean(), "{report}");
        app.shutdown().await;
    }

    pub async fn the_balance_at_an_instant_is_the_one_a_client_read_then(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        let mut seen = Vec::new();
        for (i, amount) in [10, 20, 30].into_iter().enumerate() {
            let id = format!("t{i}");
            app.transfer_accepted(&id, "a", "b", amount).await;
            settled(&app, &id, "finished").await;
            // A read between two transfers, and the instant it was made at.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let at = transfer_service::time::format_millis(now_millis());
            seen.push((at, app.balance("a").await));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(
            seen.iter().map(|(_, b)| *b).collect::<Vec<_>>(),
            [90, 70, 40]
        );
        for (at, balance) in &seen {
            let (status, body) = app.get(&format!("/accounts/a/balance?at={at}")).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["balance"], *balance, "at {at}: {body}");
        }
        // Before the account was opened: refused; not an instant: refused.
        let (status, body) = app.get("/accounts/a/balance?at=2000-01-01T00:00:00Z").await;
        assert_eq!(status, 422, "{body}");
        let (status, body) = app.get("/accounts/a/balance?at=yesterday").await;
        assert_eq!(status, 422, "{body}");
        // The first two entries, by time.
        let before = format!("/accounts/a/entries?before={}", seen[1].0);
        assert_eq!(seqs_of(&app, &before).await, [2, 1]);
        let after = format!("/accounts/a/entries?after={}", seen[0].0);
        assert_eq!(seqs_of(&app, &after).await, [3, 2]);
        app.shutdown().await;
    }

    pub async fn statements_refuse_what_they_do_not_know_and_speak_csv(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        app.transfer_accepted("t1", "a", "b", 7).await;
        settled(&app, "t1", "finished").await;
        for path in [
            "/accounts/a/entries?limit=0",
            "/accounts/a/entries?cursor=x",
            "/accounts/a/entries?sort=asc",
            "/accounts/a/entries?after=soon",
            "/accounts/a/balance",
        ] {
            let (status, body) = app.get(path).await;
            assert_eq!(status, 422, "{path}: {body}");
        }
        assert_eq!(app.get("/accounts/nobody/entries").await.0, 404);
        let response = app
            .get_with_header("/accounts/b/entries", "accept", "text/csv")
            .await;
        assert_eq!(response.status(), 200);
        let csv = response.text().await.expect("text");
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0], "seq,transfer_id,amount,kind,balance_after,at",
            "{csv}"
        );
        assert!(lines[1].starts_with("1,t1,7,credit,7,"), "{csv}");
        app.shutdown().await;
    }
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// A statement the auditor checks: dropping one filed entry is a gap it reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_reports_a_dropped_or_doubled_entry() {
    use transfer_service::store::{Index, Source, WriteOp};
    let app = TestApp::spawn_with_accounts(Backend::Embedded, [("a", 100), ("b", 0)]).await;
    app.transfer_accepted("t1", "a", "b", 7).await;
    settled(&app, "t1", "finished").await;
    app.transfer_accepted("t2", "a", "b", 5).await;
    settled(&app, "t2", "finished").await;
    let store = app.store().clone();
    let clean = audit(store.as_ref(), i64::MAX).await.expect("audit");
    assert!(clean.is_clean(), "{clean}");
    let doc = store.get(Index::Transactions, "t1").await.unwrap().unwrap();
    let transfer: Value = doc.source.to_value().unwrap();
    let version = std::cell::Cell::new(doc.version);
    let filed = transfer["entries"].as_array().unwrap().clone();
    assert_eq!(filed.len(), 2, "{transfer}");
    let rewrite = |entries: Vec<Value>| {
        let mut t = transfer.clone();
        t["entries"] = json!(entries);
        WriteOp::ReplaceIf {
            index: Index::Transactions,
            id: "t1".into(),
            source: Source::from(&t),
            expected: version.get(),
        }
    };
    let write = |op| async {
        let written = store.bulk(vec![op]).await.unwrap().remove(0).unwrap();
        version.set(written.written().expect("written"));
    };
    // Dropped: b's entry of t1.
    let dropped: Vec<Value> = filed
        .iter()
        .filter(|e| !e.as_str().unwrap().starts_with("b/"))
        .cloned()
        .collect();
    write(rewrite(dropped)).await;
    let report = audit(store.as_ref(), i64::MAX).await.expect("audit");
    assert!(report.has(ViolationKind::StatementMismatch), "{report}");
    // Doubled: b's entry of t1 again as a later entry of b.
    let doubled = filed[1]
        .as_str()
        .unwrap()
        .replace("/00000000000000000001/", "/00000000000000000003/");
    let mut with_double = filed.clone();
    with_double.push(json!(doubled));
    write(rewrite(with_double)).await;
    let report = audit(store.as_ref(), i64::MAX).await.expect("audit");
    assert!(report.has(ViolationKind::StatementMismatch), "{report}");
    app.shutdown().await;
}

on_every_backend!(
    a_mixed_history_leaves_every_account_an_exact_statement,
    the_balance_at_an_instant_is_the_one_a_client_read_then,
    statements_refuse_what_they_do_not_know_and_speak_csv,
);
