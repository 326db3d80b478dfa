//! Holds over HTTP (`docs/design.md §5`): `"hold": true` on `POST /transfers`,
//! `POST /transfers/{id}/capture` and `.../cancel`, every success and error row, on the
//! embedded store, the Elasticsearch backend on the emulator (a test double of the
//! Elasticsearch REST subset) and a real cluster (`tools/es-cluster/run`).

use crate::support::app::{Backend, TestApp};
use crate::support::problems::{assert_answer_is_problem, assert_problem};
use crate::support::wait;
use serde_json::{json, Value};

async fn hold(app: &TestApp, id: &str, amount: i64, expires_in: Option<&str>) -> Value {
    let mut body = json!({"id": id, "from": "a", "to": "b", "amount": amount, "hold": true});
    if let Some(expires_in) = expires_in {
        body["hold_expires_in"] = json!(expires_in);
    }
    let (status, body) = app.post("/transfers", body).await;
    assert_eq!(status, 201, "{body}");
    body
}

/// Long-polls until the hold waits for its capture (`?wait` answers then).
async fn waiting(app: &TestApp, id: &str) -> Value {
    wait::until_some(&format!("{id} to wait"), || async {
        let (status, body) = app.get(&format!("/transfers/{id}?wait=5s")).await;
        assert_eq!(status, 200, "{body}");
        (body["state"] == "pending" && app.balance("b").await > 0).then_some(body)
    })
    .await
}

mod cases {
    use super::*;

    pub async fn a_hold_waits_in_pending_and_a_partial_capture_moves_only_that(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        let created = hold(&app, "h1", 30, Some("10m")).await;
        assert_eq!(
            (created["state"].as_str(), created["hold"].as_bool()),
            (Some("created"), Some(true)),
            "{created}"
        );
        assert!(created["hold_expires_at"].is_string(), "{created}");
        assert!(created.get("captured_amount").is_none(), "{created}");
        let pending = waiting(&app, "h1").await;
        assert_eq!(pending["hold"], true, "{pending}");
        // Debited, credited, not spendable.
        let (_, b_account) = app.get("/accounts/b").await;
        assert_eq!(
            (
                b_account["balance"].as_i64(),
                b_account["available"].as_i64()
            ),
            (Some(30), Some(0))
        );
        let (status, captured) = app
            .post("/transfers/h1/capture", json!({"amount": 12}))
            .await;
        assert_eq!(status, 200, "{captured}");
        assert!(
            ["committed", "finished"].contains(&captured["state"].as_str().unwrap()),
            "{captured}"
        );
        assert_eq!(captured["captured_amount"], 12, "{captured}");
        let done = app.settled("h1").await;
        assert_eq!(
            (done["state"].as_str(), done["captured_amount"].as_i64()),
            (Some("finished"), Some(12))
        );
        assert_eq!((app.balance("a").await, app.balance("b").await), (88, 12));
        // An identical repeat is 200; another amount, or a cancel, is 409.
        let (status, again) = app
            .post("/transfers/h1/capture", json!({"amount": 12}))
            .await;
        assert_eq!(
            (status, again["state"].as_str()),
            (200, Some("finished")),
            "{again}"
        );
        assert_answer_is_problem(
            app.post("/transfers/h1/capture", json!({"amount": 13}))
                .await,
            409,
        );
        assert_answer_is_problem(app.post("/transfers/h1/capture", json!({})).await, 409);
        assert_answer_is_problem(app.post("/transfers/h1/cancel", json!({})).await, 409);
        app.shutdown().await;
    }

    pub async fn an_empty_capture_takes_all_of_it(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        hold(&app, "h2", 30, None).await;
        waiting(&app, "h2").await;
        let response = app
            .post_raw("/transfers/h2/capture", None, Vec::new())
            .await;
        assert_eq!(response.status().as_u16(), 200);
        let captured: Value = response.json().await.unwrap();
        assert_eq!(captured["captured_amount"], 30, "{captured}");
        app.settled("h2").await;
        assert_eq!((app.balance("a").await, app.balance("b").await), (70, 30));
        app.shutdown().await;
    }

    pub async fn hold_fields_are_validated_and_part_of_the_replay(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        let base = json!({"from": "a", "to": "b", "amount": 5});
        for (extra, why) in [
            (json!({"hold": "yes"}), "hold not a boolean"),
            (json!({"hold_expires_in": "10m"}), "expiry without a hold"),
            (
                json!({"hold": false, "hold_expires_in": "10m"}),
                "expiry on a plain transfer",
            ),
            (json!({"hold": true, "hold_expires_in": "0s"}), "below 1 s"),
            (
                json!({"hold": true, "hold_expires_in": "999ms"}),
                "below 1 s",
            ),
            (
                json!({"hold": true, "hold_expires_in": "31days"}),
                "above 30 days",
            ),
            (
                json!({"hold": true, "hold_expires_in": "soon"}),
                "not a duration",
            ),
            (
                json!({"hold": true, "hold_expires_in": 600}),
                "not a string",
            ),
        ] {
            let mut body = base.clone();
            body["id"] = json!("bad");
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let (status, problem) = app.post("/transfers", body).await;
            assert_problem(status, &problem, 422);
            assert!(
                problem["detail"].as_str().unwrap().contains("hold"),
                "{why}: {problem}"
            );
        }
        assert_eq!(
            app.get("/transfers/bad").await.0,
            404,
            "a refused hold left a transfer"
        );
        // The bounds themselves are accepted.
        hold(&app, "h-min", 1, Some("1s")).await;
        hold(&app, "h-max", 1, Some("30days")).await;
        // Replays compare the hold and its duration.
        hold(&app, "h3", 5, Some("10m")).await;
        let same = json!({"id": "h3", "from": "a", "to": "b", "amount": 5, "hold": true, "hold_expires_in": "600s"});
        assert_eq!(app.post("/transfers", same).await.0, 200);
        for other in [
            json!({"id": "h3", "from": "a", "to": "b", "amount": 5}),
            json!({"id": "h3", "from": "a", "to": "b", "amount": 5, "hold": true}),
            json!({"id": "h3", "from": "a", "to": "b", "amount": 5, "hold": true, "hold_expires_in": "11m"}),
        ] {
            let (status, problem) = app.post("/transfers", other).await;
            assert_problem(status, &problem, 409);
        }
        let (status, plain) = app.transfer("p3", "a", "b", 5).await;
        assert_eq!(status, 201);
        assert!(
            plain.get("hold").is_none() && plain.get("hold_expires_at").is_none(),
            "{plain}"
        );
        let held = json!({"id": "p3", "from": "a", "to": "b", "amount": 5, "hold": true});
        let (status, problem) = app.post("/transfers", held).await;
        assert_problem(status, &problem, 409);
        app.shutdown().await;
    }

    pub async fn capture_errors_are_problems(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        assert_answer_is_problem(app.post("/transfers/nope/capture", json!({})).await, 404);
        app.transfer("plain", "a", "b", 5).await;
        assert_answer_is_problem(app.post("/transfers/plain/capture", json!({})).await, 409);
        hold(&app, "h4", 10, None).await;
        for amount in [json!(0), json!(-1), json!(11), json!("5"), json!(1.5)] {
            let (status, body) = app
                .post("/transfers/h4/capture", json!({"amount": amount}))
                .await;
            assert_problem(status, &body, 422);
        }
        let malformed = app
            .post_raw(
                "/transfers/h4/capture",
                Some("application/json"),
                b"{".to_vec(),
            )
            .await;
        assert_eq!(malformed.status().as_u16(), 400);
        let not_json = app
            .post_raw(
                "/transfers/h4/capture",
                Some("text/plain"),
                b"amount=1".to_vec(),
            )
            .await;
        assert_eq!(not_json.status().as_u16(), 415);
        let array = app.post("/transfers/h4/capture", json!([1])).await;
        assert_problem(array.0, &array.1, 422);
        // Nothing above captured it.
        let (_, h4) = app.get("/transfers/h4").await;
        assert!(h4.get("captured_amount").is_none(), "{h4}");
        app.shutdown().await;
    }

    pub async fn a_cancelled_hold_is_released_and_cannot_be_captured(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        hold(&app, "h5", 30, None).await;
        waiting(&app, "h5").await;
        let (status, body) = app.post("/transfers/h5/cancel", json!({})).await;
        assert_eq!(status, 200, "{body}");
        let done = app.settled("h5").await;
        assert_eq!(
            (done["state"].as_str(), done["reason"].as_str()),
            (Some("rolled-back"), Some("cancelled"))
        );
        assert_eq!((app.balance("a").await, app.balance("b").await), (100, 0));
        assert_answer_is_problem(app.post("/transfers/h5/capture", json!({})).await, 409);
        app.shutdown().await;
    }

    pub async fn an_expired_hold_rolls_back_and_cannot_be_captured(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        hold(&app, "h6", 30, Some("1s")).await;
        let done = app.settled("h6").await;
        assert_eq!(
            (done["state"].as_str(), done["reason"].as_str()),
            (Some("rolled-back"), Some("expired"))
        );
        assert_eq!((app.balance("a").await, app.balance("b").await), (100, 0));
        assert_answer_is_problem(app.post("/transfers/h6/capture", json!({})).await, 409);
        // Counted right after the terminal write, which the GET above may see first.
        wait::eventually("the expired hold to be counted", || async {
            let metrics = app.scrape().await;
            metrics.value("holds_completed_total", &[("outcome", "expired")]) == 1.0
        })
        .await;
        app.shutdown().await;
    }
}

on_every_backend!(
    a_hold_waits_in_pending_and_a_partial_capture_moves_only_that,
    an_empty_capture_takes_all_of_it,
    hold_fields_are_validated_and_part_of_the_replay,
    capture_errors_are_problems,
    a_cancelled_hold_is_released_and_cannot_be_captured,
    an_expired_hold_rolls_back_and_cannot_be_captured,
);
