//! Multi-leg transactions over HTTP (docs/design.md §5): `legs` instead of `from`/`to`/
//! `amount`, 422 rows saying which leg and why, responses that always carry `legs`, the
//! refused account named, capture whole only, the replay comparison, batches, and the
//! listing by account finding a transaction under each of its accounts. Run on the embedded
//! store, the Elasticsearch backend on the emulator (a test double of Elasticsearch) and the
//! real cluster (`tools/es-cluster/run`; skipped, saying why, where none can run).

use serde_json::{json, Value};

use crate::support::app::{item_ids, Backend, TestApp};
use crate::support::problems::assert_422_saying;

fn leg(from: &str, to: &str, amount: i64) -> Value {
    json!({"from": from, "to": to, "amount": amount})
}

async fn listed(app: &TestApp, query: &str) -> Vec<String> {
    app.store().refresh().await.unwrap();
    let (status, body) = app.get(&format!("/transfers?{query}")).await;
    assert_eq!(status, 200, "{body}");
    item_ids(&body)
}

mod cases {
    use super::*;

    pub async fn legs_move_all_or_nothing_and_are_shown(b: Backend) {
        let app = TestApp::spawn(b).await;
        for (id, balance) in [("a", 100), ("b", 0), ("c", 0), ("poor", 1)] {
            app.open_account(id, balance).await;
        }
        let body =
            json!({"id": "m", "legs": [leg("a", "b", 10), leg("a", "c", 5), leg("b", "c", 3)]});
        let (status, created) = app.post("/transfers", body.clone()).await;
        assert_eq!(status, 201, "{created}");
        assert_eq!(created["legs"], body["legs"], "{created}");
        for field in ["from", "to", "amount"] {
            assert!(
                created.get(field).is_none(),
                "{field} on a multi-leg: {created}"
            );
        }
        let settled = app.settled("m").await;
        assert_eq!(settled["state"], "finished", "{settled}");
        assert_eq!(app.balances(["a", "b", "c"]).await, [85, 7, 8]);
        // An identical replay is 200; other legs are 409.
        let (status, _) = app.post("/transfers", body).await;
        assert_eq!(status, 200);
        let other = json!({"id": "m", "legs": [leg("a", "b", 10), leg("a", "c", 5)]});
        let (status, answer) = app.post("/transfers", other).await;
        assert_eq!(status, 409, "{answer}");
        // One leg refused: nothing moves, the account is named, the reason unchanged.
        let refused = json!({"id": "r", "legs": [leg("a", "b", 10), leg("poor", "c", 2)]});
        let (status, _) = app.post("/transfers", refused).await;
        assert_eq!(status, 201);
        let settled = app.settled("r").await;
        assert_eq!(
            (
                &settled["state"],
                &settled["reason"],
                &settled["failed_account"]
            ),
            (
                &json!("rolled-back"),
                &json!("insufficient_funds"),
                &json!("poor")
            ),
            "{settled}"
        );
        assert_eq!(app.balances(["a", "b", "poor"]).await, [85, 7, 1]);
    }

    pub async fn one_leg_is_a_plain_transfer_and_plain_transfers_show_their_leg(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        let (status, one) = app
            .post(
                "/transfers",
                json!({"id": "one", "legs": [leg("a", "b", 7)]}),
            )
            .await;
        assert_eq!(status, 201, "{one}");
        assert_eq!(
            (&one["from"], &one["to"], &one["amount"], &one["legs"]),
            (
                &json!("a"),
                &json!("b"),
                &json!(7),
                &json!([leg("a", "b", 7)])
            ),
            "{one}"
        );
        // It is the same request as from/to/amount: a replay either way.
        let (status, _) = app
            .post(
                "/transfers",
                json!({"id": "one", "from": "a", "to": "b", "amount": 7}),
            )
            .await;
        assert_eq!(status, 200);
        let (status, plain) = app.transfer("plain", "a", "b", 3).await;
        assert_eq!(status, 201);
        assert_eq!(plain["legs"], json!([leg("a", "b", 3)]), "{plain}");
        // Stored exactly as before legs existed.
        let doc = app
            .store()
            .get(transfer_service::store::Index::Transactions, "plain")
            .await
            .unwrap()
            .unwrap();
        let source: Value = doc.source.to_value().unwrap();
        for absent in ["legs", "accounts", "failed_account"] {
            assert!(source.get(absent).is_none(), "{absent}: {source}");
        }
        app.settled("one").await;
        app.settled("plain").await;
    }

    pub async fn invalid_legs_are_422_saying_why(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        let many: Vec<Value> = (0..17).map(|_| leg("a", "b", 1)).collect();
        let rows = [
            (json!({"legs": []}), "1 to 16 legs, not 0"),
            (json!({"legs": many}), "1 to 16 legs, not 17"),
            (json!({"legs": "a->b"}), "`legs` must be an array"),
            (
                json!({"legs": [leg("a", "b", 1), 5]}),
                "`legs[1]` must be an object",
            ),
            (
                json!({"legs": [leg("a", "b", 1), {"to": "b", "amount": 1}]}),
                "`legs[1].from` is required",
            ),
            (
                json!({"legs": [leg("a", "b", 1), leg("a", "a", 1)]}),
                "`legs[1].from` and `legs[1].to` must differ",
            ),
            (
                json!({"legs": [leg("a", "b", 0)]}),
                "`legs[0].amount` must be positive",
            ),
            (
                json!({"legs": [leg("a", "b", 1), {"from": "a", "to": "b", "amount": 1.5}]}),
                "`legs[1].amount` must be an integer",
            ),
            (
                json!({"legs": [leg("a", "b", 1), leg("a", "b/c", 1)]}),
                "`legs[1].to` must be 1–128",
            ),
            (
                json!({"legs": [leg("a", "b", i64::MAX), leg("b", "a", 1)]}),
                "sum to at most",
            ),
            (
                json!({"legs": [leg("a", "b", 1)], "from": "a"}),
                "either `legs` or `from`, `to` and `amount`",
            ),
            (
                json!({"legs": [leg("a", "b", 1)], "amount": 1}),
                "either `legs` or `from`, `to` and `amount`",
            ),
        ];
        for (body, says) in rows {
            let (status, answer) = app.post("/transfers", body.clone()).await;
            assert_422_saying(status, &answer, says);
            // A batch item carries the same problem.
            let (status, answer) = app.batch(vec![body]).await;
            assert_eq!(status, 200, "{answer}");
            assert_eq!(answer["items"][0]["status"], 422, "{answer}");
            let detail = answer["items"][0]["problem"]["detail"].as_str().unwrap();
            assert!(detail.contains(says), "{detail}");
        }
        assert_eq!(app.balance("a").await, 100);
    }

    pub async fn a_multi_leg_hold_is_captured_whole(b: Backend) {
        let app = TestApp::spawn(b).await;
        for (id, balance) in [("a", 100), ("b", 0), ("c", 0)] {
            app.open_account(id, balance).await;
        }
        let body = json!({"id": "h", "hold": true, "legs": [leg("a", "b", 10), leg("a", "c", 5)]});
        let (status, created) = app.post("/transfers", body).await;
        assert_eq!(status, 201, "{created}");
        assert_eq!(created["hold"], true, "{created}");
        let (status, waiting) = app.get("/transfers/h?wait=10s").await;
        assert_eq!(
            (status, &waiting["state"]),
            (200, &json!("pending")),
            "{waiting}"
        );
        let (status, problem) = app
            .post("/transfers/h/capture", json!({"amount": 10}))
            .await;
        assert_422_saying(status, &problem, "captured whole");
        let (status, captured) = app.post("/transfers/h/capture", json!({})).await;
        assert_eq!(status, 200, "{captured}");
        assert_eq!(captured["captured_amount"], 15, "{captured}");
        assert_eq!(app.settled("h").await["state"], "finished");
        assert_eq!(app.balances(["a", "b", "c"]).await, [85, 10, 5]);
    }

    pub async fn the_listing_by_account_finds_a_transaction_under_each_account(b: Backend) {
        let app = TestApp::spawn(b).await;
        for id in ["a", "b", "c", "d", "e"] {
            app.open_account(id, 100).await;
        }
        // Apart in time, so newest first is p2, m1, p1 whatever the ids.
        let apart = || tokio::time::sleep(std::time::Duration::from_millis(5));
        app.transfer_accepted("p1", "a", "b", 1).await;
        apart().await;
        let (status, _) = app
            .post(
                "/transfers",
                json!({"id": "m1", "legs": [leg("a", "c", 1), leg("c", "d", 1)]}),
            )
            .await;
        assert_eq!(status, 201);
        apart().await;
        app.transfer_accepted("p2", "d", "e", 1).await;
        for id in ["p1", "m1", "p2"] {
            app.settled(id).await;
        }
        assert_eq!(listed(&app, "account=a").await, ["m1", "p1"]);
        assert_eq!(listed(&app, "account=b").await, ["p1"]);
        assert_eq!(listed(&app, "account=c").await, ["m1"]);
        assert_eq!(listed(&app, "account=d").await, ["p2", "m1"]);
        assert_eq!(listed(&app, "account=e").await, ["p2"]);
        assert_eq!(listed(&app, "account=d&state=finished").await, ["p2", "m1"]);
        // Paging by account walks past it once.
        let (_, first) = app.get("/transfers?account=d&limit=1").await;
        assert_eq!(first["items"][0]["id"], "p2", "{first}");
        let cursor = first["next_cursor"].as_str().unwrap().to_owned();
        let (_, second) = app
            .get(&format!("/transfers?account=d&limit=1&cursor={cursor}"))
            .await;
        assert_eq!(second["items"][0]["id"], "m1", "{second}");
    }
}

on_every_backend!(
    legs_move_all_or_nothing_and_are_shown,
    one_leg_is_a_plain_transfer_and_plain_transfers_show_their_leg,
    invalid_legs_are_422_saying_why,
    a_multi_leg_hold_is_captured_whole,
    the_listing_by_account_finds_a_transaction_under_each_account,
);
