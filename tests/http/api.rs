//! The HTTP contract of `docs/design.md` §5, one test per row and per bad-input class, run
//! against the embedded store (`embedded::*`), the Elasticsearch backend on the emulator
//! (`emulator::*`, a test double of the Elasticsearch REST subset), and the same backend on the
//! real cluster (`real_es::*`, from `tools/es-cluster/run`; they say they skipped, and why, where no
//! cluster can run).

use crate::support::app::{item_ids as ids, Backend, TestApp};
use crate::support::problems::{assert_answer_is_problem, assert_problem};
use serde_json::{json, Value};
use transfer_service::store::Index;
use transfer_service::time::format_millis;
use transfer_service::transfer::clock::{Clock, SystemClock};

/// Writes a transfer document straight into the store, as a crashed or live worker would
/// have left it.
async fn plant_transfer(
    app: &TestApp,
    id: &str,
    state: &str,
    lease_owner: Option<&str>,
    lease_ms: i64,
) {
    let now = SystemClock.wall_millis();
    let mut doc = json!({
        "transaction_id": id, "src_acct": "a", "dest_acct": "b", "amount": 10,
        "transaction_state": state,
        "creation_time": format_millis(now), "modification_time": format_millis(now),
    });
    if let Some(owner) = lease_owner {
        doc["lease_owner"] = json!(owner);
        doc["lease_expires_at"] = json!(format_millis(now + lease_ms));
    }
    app.store()
        .create(Index::Transactions, id, doc.into())
        .await
        .unwrap();
}

/// Writes a transfer document flagged for a person (`attention`), as the engine leaves one
/// whose documents contradict each other, created `age_ms` ago and held by a live lease.
async fn plant_flagged_transfer(
    app: &TestApp,
    id: &str,
    state: &str,
    route: (&str, &str),
    age_ms: i64,
) {
    let now = SystemClock.wall_millis();
    let doc = json!({
        "transaction_id": id, "src_acct": route.0, "dest_acct": route.1, "amount": 10,
        "transaction_state": state,
        "creation_time": format_millis(now - age_ms), "modification_time": format_millis(now),
        "lease_owner": "someone-else", "lease_expires_at": format_millis(now + 60_000),
        "attention": format!("{id}: its documents contradict each other"),
    });
    app.store()
        .create(Index::Transactions, id, doc.into())
        .await
        .unwrap();
}

mod cases {
    use super::*;

    pub async fn create_account_returns_201_and_the_account(b: Backend) {
        let app = TestApp::spawn(b).await;
        let (status, body) = app
            .post("/accounts", json!({"id": "A", "balance": 500}))
            .await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["id"], "A");
        assert_eq!(body["balance"], 500);
        assert_eq!(body["pending_transactions"], json!([]));
        let (status, body) = app.get("/accounts/A").await;
        assert_eq!((status, body["balance"].as_i64()), (200, Some(500)));
        app.shutdown().await;
    }

    pub async fn identical_account_replay_returns_200_and_other_data_409(b: Backend) {
        let app = TestApp::spawn(b).await;
        app.open_account("A", 500).await;
        let (status, body) = app
            .post("/accounts", json!({"id": "A", "balance": 500}))
            .await;
        assert_eq!((status, body["balance"].as_i64()), (200, Some(500)));
        assert_answer_is_problem(
            app.post("/accounts", json!({"id": "A", "balance": 501}))
                .await,
            409,
        );
        assert_eq!(app.balance("A").await, 500);
        app.shutdown().await;
    }

    pub async fn invalid_account_input_is_4xx_and_changes_nothing(b: Backend) {
        let app = TestApp::spawn(b).await;
        for body in [
            json!({"balance": 5}),
            json!({"id": "A"}),
            json!({"id": "bad id", "balance": 5}),
            json!({"id": "", "balance": 5}),
            json!({"id": "x".repeat(129), "balance": 5}),
            json!({"id": "A", "balance": 1.5}),
            json!({"id": "A", "balance": "5"}),
            json!({"id": "A", "balance": 9_223_372_036_854_775_808u64}),
            json!({"id": "A", "balance": 5, "floor": 6}),
            json!([1, 2]),
        ] {
            let (status, problem) = app.post("/accounts", body.clone()).await;
            assert_problem(status, &problem, 422);
        }
        let response = app
            .post_raw("/accounts", Some("application/json"), b"{\"id\":".to_vec())
            .await;
        assert_eq!(response.status(), 400);
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        assert_eq!(app.get("/accounts/A").await.0, 404);
        app.shutdown().await;
    }

    pub async fn unknown_account_is_404(b: Backend) {
        let app = TestApp::spawn(b).await;
        assert_answer_is_problem(app.get("/accounts/nobody").await, 404);
        assert_answer_is_problem(app.get("/accounts/not%20valid").await, 404);
        app.shutdown().await;
    }

    pub async fn transfer_is_answered_as_stored_then_finishes(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 500), ("B", 500)]).await;
        let response = app
            .client
            .post(app.url("/transfers"))
            .json(&json!({"id": "t1", "from": "A", "to": "B", "amount": 100}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["location"], "/transfers/t1");
        let body: Value = response.json().await.unwrap();
        // The 201 says what is stored: settled already where one transaction did it all
        // (what a `GET` right after returns), accepted as `created` where a worker drives it.
        app.assert_answered_as_stored(&body).await;
        assert_eq!(
            (body["from"].as_str(), body["to"].as_str()),
            (Some("A"), Some("B"))
        );
        let done = app.settled("t1").await;
        assert_eq!(done["state"], "finished");
        assert!(done.get("reason").is_none());
        assert_eq!((app.balance("A").await, app.balance("B").await), (400, 600));
        let (_, a) = app.get("/accounts/A").await;
        assert_eq!(a["pending_transactions"], json!([]));
        app.shutdown().await;
    }

    pub async fn overdraft_rolls_back_with_insufficient_funds(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 50), ("B", 0)]).await;
        assert_eq!(app.transfer("t1", "A", "B", 51).await.0, 201);
        let done = app.settled("t1").await;
        assert_eq!(
            (done["state"].as_str(), done["reason"].as_str()),
            (Some("rolled-back"), Some("insufficient_funds"))
        );
        assert_eq!((app.balance("A").await, app.balance("B").await), (50, 0));
        app.shutdown().await;
    }

    pub async fn unknown_account_rolls_back_with_account_not_found(b: Backend) {
        let app = TestApp::spawn(b).await;
        app.open_account("A", 50).await;
        assert_eq!(app.transfer("t1", "A", "ghost", 10).await.0, 201);
        assert_eq!(app.transfer("t2", "ghost", "A", 10).await.0, 201);
        for id in ["t1", "t2"] {
            let done = app.settled(id).await;
            assert_eq!(done["reason"], "account_not_found", "{done}");
        }
        assert_eq!(app.balance("A").await, 50, "no balance touched");
        app.shutdown().await;
    }

    pub async fn overflow_rolls_back_never_wraps(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 10), ("RICH", i64::MAX)]).await;
        assert_eq!(app.transfer("t1", "A", "RICH", 1).await.0, 201);
        let done = app.settled("t1").await;
        assert_eq!(done["reason"], "balance_overflow", "{done}");
        assert_eq!(
            (app.balance("A").await, app.balance("RICH").await),
            (10, i64::MAX)
        );
        app.shutdown().await;
    }

    pub async fn identical_transfer_replay_returns_200_with_current_state(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 500), ("B", 0)]).await;
        assert_eq!(app.transfer("t1", "A", "B", 100).await.0, 201);
        app.settled("t1").await;
        let (status, body) = app.transfer("t1", "A", "B", 100).await;
        assert_eq!((status, body["state"].as_str()), (200, Some("finished")));
        assert_eq!(
            (app.balance("A").await, app.balance("B").await),
            (400, 100),
            "applied once"
        );
        app.shutdown().await;
    }

    pub async fn same_transfer_id_with_another_body_is_409(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 500), ("B", 0), ("C", 0)]).await;
        assert_eq!(app.transfer("t1", "A", "B", 100).await.0, 201);
        for (from, to, amount) in [("A", "B", 101), ("A", "C", 100), ("B", "A", 100)] {
            assert_answer_is_problem(app.transfer("t1", from, to, amount).await, 409);
        }
        app.settled("t1").await;
        assert_eq!(
            (
                app.balance("A").await,
                app.balance("B").await,
                app.balance("C").await
            ),
            (400, 100, 0)
        );
        app.shutdown().await;
    }

    pub async fn transfer_without_id_gets_a_uuid_v7(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 5), ("B", 5)]).await;
        let (status, body) = app
            .post("/transfers", json!({"from": "A", "to": "B", "amount": 1}))
            .await;
        assert_eq!(status, 201, "{body}");
        let id = body["id"].as_str().unwrap();
        assert_eq!(uuid::Uuid::parse_str(id).unwrap().get_version_num(), 7);
        assert_eq!(app.settled(id).await["state"], "finished");
        app.shutdown().await;
    }

    pub async fn invalid_transfer_fields_are_422_and_change_nothing(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 500), ("B", 0)]).await;
        for body in [
            json!({"id": "x1", "from": "A", "to": "B", "amount": 0}),
            json!({"id": "x2", "from": "A", "to": "B", "amount": -5}),
            json!({"id": "x3", "from": "A", "to": "B", "amount": 1.5}),
            json!({"id": "x4", "from": "A", "to": "B", "amount": "10"}),
            json!({"id": "x5", "from": "A", "to": "B", "amount": 9_223_372_036_854_775_808u64}),
            json!({"id": "x6", "from": "A", "to": "B", "amount": 1e30}),
            json!({"id": "x7", "from": "A", "to": "A", "amount": 1}),
            json!({"id": "bad id", "from": "A", "to": "B", "amount": 1}),
            json!({"id": "x".repeat(129), "from": "A", "to": "B", "amount": 1}),
            json!({"id": 7, "from": "A", "to": "B", "amount": 1}),
            json!({"id": "x8", "to": "B", "amount": 1}),
            json!({"id": "x9", "from": "A", "amount": 1}),
            json!({"id": "x10", "from": "A", "to": "B"}),
            json!({"id": "x11", "from": "A/..", "to": "B", "amount": 1}),
            json!({"id": "..", "from": "A", "to": "B", "amount": 1}),
            json!({"id": ".", "from": "A", "to": "B", "amount": 1}),
            json!("a string"),
        ] {
            let (status, problem) = app.post("/transfers", body.clone()).await;
            assert_problem(status, &problem, 422);
        }
        assert_eq!((app.balance("A").await, app.balance("B").await), (500, 0));
        app.store().refresh().await.unwrap();
        let (_, page) = app.get("/transfers").await;
        assert_eq!(page["items"], json!([]), "no transfer was created");
        app.shutdown().await;
    }

    pub async fn malformed_json_is_400_wrong_type_415_too_large_413(b: Backend) {
        let app = TestApp::spawn(b).await;
        let cases: Vec<(Option<&str>, Vec<u8>, u16)> = vec![
            (Some("application/json"), b"{\"from\": \"A\",".to_vec(), 400),
            (Some("application/json"), b"".to_vec(), 400),
            (Some("application/json"), b"\xff\xfe".to_vec(), 400),
            (Some("text/plain"), b"{}".to_vec(), 415),
            (None, b"{}".to_vec(), 415),
            (
                Some("application/json"),
                format!("{{\"pad\":\"{}\"}}", "a".repeat(1_100_000)).into_bytes(),
                413,
            ),
        ];
        for (content_type, body, want) in cases {
            let response = app.post_raw("/transfers", content_type, body).await;
            assert_eq!(response.status().as_u16(), want);
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json"
            );
            let problem: Value = response.json().await.unwrap();
            assert_problem(want, &problem, want);
        }
        app.shutdown().await;
    }

    pub async fn unknown_routes_and_transfers_are_404_problems(b: Backend) {
        let app = TestApp::spawn(b).await;
        for path in [
            "/nope",
            "/transfers/nobody",
            "/transfers/a%20b",
            "/accounts",
        ] {
            let (status, body) = app.get(path).await;
            if path == "/accounts" {
                assert_problem(status, &body, 405);
                continue;
            }
            assert_problem(status, &body, 404);
        }
        assert_answer_is_problem(app.post("/transfers/nobody/cancel", json!({})).await, 404);
        app.shutdown().await;
    }

    pub async fn wait_answers_when_terminal_and_rejects_bad_durations(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 5), ("B", 5)]).await;
        app.transfer("t1", "A", "B", 5).await;
        let (status, body) = app.get("/transfers/t1?wait=10s").await;
        assert_eq!((status, body["state"].as_str()), (200, Some("finished")));
        assert_answer_is_problem(app.get("/transfers/t1?wait=soon").await, 422);
        // A transfer that stays in flight: the wait ends with its current state.
        plant_transfer(&app, "held", "pending", Some("someone-else"), 60_000).await;
        let started = std::time::Instant::now();
        let (status, body) = app.get("/transfers/held?wait=300ms").await;
        assert_eq!((status, body["state"].as_str()), (200, Some("pending")));
        assert!(started.elapsed() >= std::time::Duration::from_millis(300));
        app.shutdown().await;
    }

    pub async fn cancel_created_rolls_back_at_once(b: Backend) {
        let app = TestApp::spawn(b).await;
        plant_transfer(&app, "c1", "created", Some("a-live-worker"), 60_000).await;
        let (status, body) = app.post("/transfers/c1/cancel", json!({})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            (body["state"].as_str(), body["reason"].as_str()),
            (Some("rolled-back"), Some("cancelled"))
        );
        let (status, body) = app.post("/transfers/c1/cancel", json!({})).await;
        assert_eq!(
            (status, body["state"].as_str()),
            (200, Some("rolled-back")),
            "cancel is idempotent"
        );
        app.shutdown().await;
    }

    pub async fn cancel_pending_undoes_the_accounts(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        // A pending transfer whose worker died: its lease has run out.
        plant_transfer(&app, "p1", "pending", Some("dead-worker"), -1).await;
        let (status, body) = app.post("/transfers/p1/cancel", json!({})).await;
        assert_eq!(status, 200, "{body}");
        assert!(
            ["terminating", "rolled-back"].contains(&body["state"].as_str().unwrap()),
            "{body}"
        );
        let done = app.settled("p1").await;
        assert_eq!(
            (done["state"].as_str(), done["reason"].as_str()),
            (Some("rolled-back"), Some("cancelled"))
        );
        assert_eq!((app.balance("a").await, app.balance("b").await), (100, 0));
        app.shutdown().await;
    }

    pub async fn cancel_after_commit_is_409(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 5), ("B", 5)]).await;
        app.transfer("t1", "A", "B", 5).await;
        app.settled("t1").await;
        assert_answer_is_problem(app.post("/transfers/t1/cancel", json!({})).await, 409);
        plant_transfer(&app, "k1", "committed", Some("a-live-worker"), 60_000).await;
        assert_answer_is_problem(app.post("/transfers/k1/cancel", json!({})).await, 409);
        app.shutdown().await;
    }

    pub async fn list_filters_by_account_and_state_with_a_cursor(b: Backend) {
        let app = TestApp::spawn(b).await;
        for id in ["A", "B", "C"] {
            app.open_account(id, 100).await;
        }
        let plan = [
            ("t1", "A", "B", 10),
            ("t2", "B", "C", 10),
            ("t3", "C", "A", 10),
            ("t4", "A", "C", 1000),
        ];
        for (id, from, to, amount) in plan {
            assert_eq!(app.transfer(id, from, to, amount).await.0, 201);
            app.settled(id).await;
        }
        app.store().refresh().await.unwrap();
        let (status, page) = app.get("/transfers?account=A").await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(ids(&page), ["t4", "t3", "t1"]);
        let (_, page) = app.get("/transfers?account=A&state=finished").await;
        assert_eq!(ids(&page), ["t3", "t1"]);
        let (_, page) = app.get("/transfers?state=rolled-back").await;
        assert_eq!(ids(&page), ["t4"]);
        let seen = app.every_listed_id("", 3).await;
        assert_eq!(seen, ["t4", "t3", "t2", "t1"]);
        for bad in [
            "limit=0",
            "limit=1001",
            "limit=x",
            "state=done",
            "cursor=garbage",
            "account=a%20b",
            "color=red",
        ] {
            assert_answer_is_problem(app.get(&format!("/transfers?{bad}")).await, 422);
        }
        app.shutdown().await;
    }

    pub async fn list_only_flagged_transfers_with_attention_true(b: Backend) {
        let app = TestApp::spawn(b).await;
        for id in ["A", "B", "C"] {
            app.open_account(id, 100).await;
        }
        assert_eq!(app.transfer("t1", "A", "B", 10).await.0, 201);
        app.settled("t1").await;
        plant_flagged_transfer(&app, "f1", "pending", ("A", "C"), 3_000).await;
        plant_flagged_transfer(&app, "f2", "committed", ("B", "C"), 2_000).await;
        app.store().refresh().await.unwrap();
        let (status, page) = app.get("/transfers?attention=true").await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(ids(&page), ["f2", "f1"]);
        assert_eq!(
            page["items"][1]["attention"],
            "f1: its documents contradict each other"
        );
        let (_, page) = app.get("/transfers?attention=true&account=A").await;
        assert_eq!(ids(&page), ["f1"]);
        let (_, page) = app.get("/transfers?state=committed&attention=true").await;
        assert_eq!(ids(&page), ["f2"]);
        let (_, page) = app
            .get("/transfers?attention=true&account=C&state=pending")
            .await;
        assert_eq!(ids(&page), ["f1"]);
        let (_, page) = app
            .get("/transfers?attention=true&account=B&state=pending")
            .await;
        assert_eq!(ids(&page), Vec::<String>::new());
        // Without the filter, every transfer.
        let (_, page) = app.get("/transfers").await;
        let mut all = ids(&page);
        all.sort();
        assert_eq!(all, ["f1", "f2", "t1"]);
        // Pages of one, with the cursor.
        let seen = app.every_listed_id("attention=true", 1).await;
        assert_eq!(seen, ["f2", "f1"]);
        // Only `true` is a value of this filter.
        for bad in [
            "attention=false",
            "attention=",
            "attention=1",
            "attention=TRUE",
            "attention=yes",
            "attention=true&attention=true",
        ] {
            assert_answer_is_problem(app.get(&format!("/transfers?{bad}")).await, 422);
        }
        app.shutdown().await;
    }

    /// Path ids that cannot be ids (dot segments, encoded slashes, bytes that are not UTF-8,
    /// control characters, too long) are 404 problems on every route that takes an id, and
    /// never reach the store.
    pub async fn odd_path_ids_are_404_problems(b: Backend) {
        let app = TestApp::spawn(b).await;
        let mut ids: Vec<String> = [
            ".",
            "..",
            "%2E",
            "%2e%2E",
            "a%2Fb",
            "%2F",
            "%FF",
            "%C3%28",
            "%00",
            "a%0Ab",
            "%C3%A9",
            "a%20b",
            "%25",
            "%",
            "%ZZ",
            "a;b",
            "*",
            "~",
            "%E2%80%AE",
            "a%3Fwait=1s",
        ]
        .map(String::from)
        .to_vec();
        ids.push("x".repeat(129));
        ids.push("y".repeat(20_000));
        let routes = [
            ("GET", "/accounts/{}"),
            ("GET", "/transfers/{}"),
            ("GET", "/transfers/{}?wait=5s"),
            ("POST", "/transfers/{}/cancel"),
        ];
        for id in &ids {
            for (method, route) in routes {
                let target = route.replace("{}", id);
                let (status, content_type, body) = app.raw(method, target.as_bytes()).await;
                let problem: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                assert_eq!(status, 404, "{method} {target}: {problem}");
                assert_eq!(
                    content_type, "application/problem+json",
                    "{method} {target}"
                );
                assert_problem(status, &problem, 404);
            }
        }
        // Raw bytes a URL may not hold are refused by the HTTP parser, never with a 5xx.
        for target in [
            &b"/accounts/\xff"[..],
            b"/transfers/a\x7fb",
            b"/transfers/a b",
        ] {
            let (status, _, _) = app.raw("GET", target).await;
            assert!((400..500).contains(&status), "{target:?}: {status}");
        }
        app.shutdown().await;
    }

    /// Ids that are valid but look like path syntax or Elasticsearch endpoints work end to end
    /// on every backend: accounts, transfers, long-polls, listing, cancelling.
    pub async fn unusual_valid_ids_work_end_to_end(b: Backend) {
        let app = TestApp::spawn(b).await;
        let long = "x".repeat(128);
        let ids = [
            "_",
            "-",
            ":",
            "...",
            "a..b",
            "..a",
            "_doc",
            "_search",
            "_bulk",
            "_create",
            ".kibana",
            "A:B.C-D_E",
            long.as_str(),
        ];
        for id in ids {
            app.open_account(id, 100).await;
        }
        for pair in ids.windows(2) {
            let (from, to) = (pair[0], pair[1]);
            let (status, body) = app.transfer(from, from, to, 10).await;
            assert_eq!(status, 201, "{from} -> {to}: {body}");
            assert_eq!(body["id"], from, "the transfer id is the one given: {body}");
        }
        for pair in ids.windows(2) {
            let done = app.settled(pair[0]).await;
            assert_eq!(done["state"], "finished", "{done}");
            assert_answer_is_problem(
                app.post(&format!("/transfers/{}/cancel", pair[0]), json!({}))
                    .await,
                409,
            );
        }
        // Every account but the ends sent 10 and received 10.
        assert_eq!(app.balance(ids[0]).await, 90);
        assert_eq!(app.balance(ids[ids.len() - 1]).await, 110);
        for id in &ids[1..ids.len() - 1] {
            let (status, body) = app.get(&format!("/accounts/{id}")).await;
            assert_eq!(status, 200, "{id}: {body}");
            assert_eq!(body["id"], *id);
            assert_eq!(body["balance"], 100, "{id}: {body}");
        }
        app.store().refresh().await.unwrap();
        let (status, page) = app.get("/transfers?account=_search").await;
        assert_eq!(status, 200, "{page}");
        let listed: Vec<&str> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap())
            .collect();
        let mut listed_sorted = listed.clone();
        listed_sorted.sort_unstable();
        assert_eq!(listed_sorted, ["_doc", "_search"], "{page}");
        app.shutdown().await;
    }

    /// `?wait=` edge values: zero answers at once, huge values (even past any clock) are
    /// capped at 30 s, anything that is not `<digits><unit>`... (or is given twice) is 422.
    pub async fn wait_edge_values_are_capped_or_422(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 5), ("B", 5)]).await;
        app.transfer("t1", "A", "B", 5).await;
        app.settled("t1").await;
        plant_transfer(&app, "held", "pending", Some("someone-else"), 60_000).await;
        for wait in [
            "0s",
            "0ms",
            "1ns",
            "1m30s",
            "99999999999999s",
            "18446744073709551615s",
            "18446744073709551616s",
            "99999999999999999999999s",
        ] {
            let path = format!("/transfers/t1?wait={}", wait.replace(' ', "%20"));
            let (status, body) = app.get(&path).await;
            assert_eq!(
                (status, body["state"].as_str()),
                (200, Some("finished")),
                "{path}"
            );
        }
        let started = std::time::Instant::now();
        let (status, body) = app.get("/transfers/held?wait=0s").await;
        assert_eq!((status, body["state"].as_str()), (200, Some("pending")));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        for wait in [
            "",
            "-1s",
            "-0s",
            "5",
            "1e3s",
            "5 parsecs",
            "%20%202ms",
            "5%20s",
            "5sec",
            "1d",
            "%FF",
            "5s%00",
            "5s&wait=6s",
            "x".repeat(10_000).as_str(),
        ] {
            let path = format!("/transfers/held?wait={wait}");
            assert_answer_is_problem(app.get(&path).await, 422);
        }
        // An unknown or impossible id with a valid wait is 404 at once.
        assert_answer_is_problem(app.get("/transfers/nobody?wait=10s").await, 404);
        app.shutdown().await;
    }

    /// Listing parameters that are repeated, not UTF-8, out of range, or cursors not of the
    /// form `<digits>~<id>` are 422, never a 5xx.
    pub async fn odd_list_queries_are_422(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;
        assert_eq!(app.transfer("t1", "A", "B", 10).await.0, 201);
        app.settled("t1").await;
        app.store().refresh().await.unwrap();
        let long = "z".repeat(30_000);
        let bad: Vec<String> = [
            "limit=1&limit=2",
            "state=finished&state=pending",
            "account=A&account=B",
            "limit=18446744073709551616",
            "limit=-1",
            "limit=",
            "state=",
            "state=%FF",
            "account=",
            "account=%FF",
            "account=.",
            "account=..",
            "account=a%2Fb",
            "%FF=1",
            "cursor=",
            "cursor=~",
            "cursor=1~",
            "cursor=~t1",
            "cursor=1~a~b",
            "cursor=-1~t1",
            "cursor=-9223372036854775808~t1",
            "cursor=%2B1~t1",
            "cursor=1.5~t1",
            "cursor=1~..",
            "cursor=%FF~t1",
        ]
        .map(String::from)
        .into_iter()
        .chain([format!("color={long}"), format!("account={long}")])
        .collect();
        for query in &bad {
            let (status, body) = app.get(&format!("/transfers?{query}")).await;
            assert_problem(status, &body, 422);
        }
        // Odd but valid: empty pages or the one transfer.
        for (query, count) in [
            ("cursor=0~t1", 0),
            ("cursor=253402300799999~zzz", 1),
            // Past the last date an RFC 3339 time can hold: read as that date.
            ("cursor=253402300800000~t1", 1),
            ("cursor=9223372036854775807~t1", 1),
            ("cursor=99999999999999999999~t1", 1),
            ("limit=%2B1", 1),
            ("limit=1000&state=finished&account=A", 1),
            ("account=_search", 0),
            ("", 1),
            ("&&", 1),
        ] {
            let (status, page) = app.get(&format!("/transfers?{query}")).await;
            assert_eq!(status, 200, "{query}: {page}");
            assert_eq!(
                page["items"].as_array().map(Vec::len),
                Some(count),
                "{query}: {page}"
            );
        }
        app.shutdown().await;
    }

    /// Bodies built to trip a parser: deep nesting, lone surrogates, numbers out of range,
    /// NUL bytes in ids, duplicate keys. 4xx, never a 5xx, and nothing is created.
    pub async fn hostile_bodies_are_4xx(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let deep_object = format!(
            "{{\"id\":\"d\",\"from\":\"A\",\"to\":\"B\",\"amount\":1,\"x\":{}1{}}}",
            "{\"a\":".repeat(10_000),
            "}".repeat(10_000)
        );
        let cases: Vec<(&str, Vec<u8>, u16)> = vec![
            ("/transfers", deep.clone().into_bytes(), 400),
            ("/accounts", deep.into_bytes(), 400),
            ("/transfers", deep_object.into_bytes(), 400),
            (
                "/transfers",
                br#"{"id":"\ud800","from":"A","to":"B","amount":1}"#.to_vec(),
                400,
            ),
            (
                "/transfers",
                br#"{"id":"n1","from":"A","to":"B","amount":1e400}"#.to_vec(),
                400,
            ),
            (
                "/transfers",
                br#"{"id":"n2","from":"A","to":"B","amount":-0}"#.to_vec(),
                422,
            ),
            (
                "/transfers",
                br#"{"id":"n3","from":"A","to":"B","amount":1.0}"#.to_vec(),
                422,
            ),
            (
                "/transfers",
                br#"{"id":"n4","from":"A","to":"B","amount":1,"amount":-1}"#.to_vec(),
                422,
            ),
            (
                "/transfers",
                br#"{"id":"a\u0000b","from":"A","to":"B","amount":1}"#.to_vec(),
                422,
            ),
            (
                "/transfers",
                br#"{"id":"n5","from":"A\n","to":"B","amount":1}"#.to_vec(),
                422,
            ),
            (
                "/transfers",
                "{\"id\":\"é\",\"from\":\"A\",\"to\":\"B\",\"amount\":1}".into(),
                422,
            ),
            ("/transfers", b"\xef\xbb\xbf{}".to_vec(), 400),
            ("/transfers", b"null".to_vec(), 422),
            (
                "/accounts",
                br#"{"id":"C","balance":1,"floor":-9223372036854775809}"#.to_vec(),
                422,
            ),
            ("/accounts", br#"{"id":"%2E","balance":1}"#.to_vec(), 422),
        ];
        for (path, body, want) in cases {
            let response = app.post_raw(path, Some("application/json"), body).await;
            let status = response.status().as_u16();
            let problem: Value = response.json().await.unwrap_or(Value::Null);
            assert_problem(status, &problem, want);
        }
        assert_eq!((app.balance("A").await, app.balance("B").await), (100, 0));
        app.store().refresh().await.unwrap();
        let (_, page) = app.get("/transfers").await;
        assert_eq!(page["items"], json!([]), "no transfer was created");
        app.shutdown().await;
    }

    pub async fn health_and_readiness_answer_200(b: Backend) {
        let app = TestApp::spawn(b).await;
        assert_eq!(app.get("/livez").await.0, 200);
        assert_eq!(app.get("/healthz").await.0, 200);
        let (status, body) = app.get("/readyz").await;
        assert_eq!((status, body["status"].as_str()), (200, Some("ready")));
        app.shutdown().await;
    }
}

on_every_backend!(
    create_account_returns_201_and_the_account,
    identical_account_replay_returns_200_and_other_data_409,
    invalid_account_input_is_4xx_and_changes_nothing,
    unknown_account_is_404,
    transfer_is_answered_as_stored_then_finishes,
    overdraft_rolls_back_with_insufficient_funds,
    unknown_account_rolls_back_with_account_not_found,
    overflow_rolls_back_never_wraps,
    identical_transfer_replay_returns_200_with_current_state,
    same_transfer_id_with_another_body_is_409,
    transfer_without_id_gets_a_uuid_v7,
    invalid_transfer_fields_are_422_and_change_nothing,
    malformed_json_is_400_wrong_type_415_too_large_413,
    unknown_routes_and_transfers_are_404_problems,
    wait_answers_when_terminal_and_rejects_bad_durations,
    cancel_created_rolls_back_at_once,
    cancel_pending_undoes_the_accounts,
    cancel_after_commit_is_409,
    list_filters_by_account_and_state_with_a_cursor,
    list_only_flagged_transfers_with_attention_true,
    odd_path_ids_are_404_problems,
    unusual_valid_ids_work_end_to_end,
    wait_edge_values_are_capped_or_422,
    odd_list_queries_are_422,
    hostile_bodies_are_4xx,
    health_and_readiness_answer_200,
);
