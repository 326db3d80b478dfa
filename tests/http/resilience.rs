//! Store outages seen from the API, on the Elasticsearch backend and the emulator (a test
//! double whose `set_unavailable` answers every request with 503, like a cluster without a
//! primary, and `fail_next` with 429 rejections):
//! - `/readyz` answers 503 while the store is unreachable and 200 again when it is back;
//! - requests during the outage get a 503 problem, never a 500, and change nothing;
//! - a transfer whose steps keep failing is left for recovery and finished after the outage;
//! - rejected (429) requests are retried with backoff and the transfer still finishes.

use std::time::Duration;

use serde_json::{json, Value};
use transfer_service::http::error::UNAVAILABLE_DETAIL;

use crate::support::app::{header, Backend, TestApp};
use crate::support::wait;

/// The application on the emulator with short leases and a fast recovery loop.
async fn spawn() -> TestApp {
    TestApp::spawn_with(Backend::Emulator, |config| {
        config.lease_duration = Duration::from_millis(500);
        config.recovery_interval = Duration::from_millis(100);
        config.recovery_stale_after = Duration::from_millis(300);
    })
    .await
}

/// Opens `a` and `b` with 100 each.
async fn open_a_and_b(app: &TestApp) {
    for id in ["a", "b"] {
        app.open_account(id, 100).await;
    }
}

/// `POST /transfers` of `t1`: `amount` from `a` to `b`.
async fn post_t1(app: &TestApp, amount: i64) -> (u16, Value) {
    let t1 = json!({"id": "t1", "from": "a", "to": "b", "amount": amount});
    app.post("/transfers", t1).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_store_and_outages_answer_503() {
    let app = spawn().await;
    open_a_and_b(&app).await;
    app.emulator().set_unavailable(true);
    wait::eventually("readyz 503", || async {
        app.status("/readyz").await == 503
    })
    .await;
    assert_eq!(
        app.status("/livez").await,
        200,
        "liveness depends on no store"
    );
    let (_, readiness) = app.get("/readyz").await;
    let detail = readiness["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("unreachable") && !detail.contains("127.0.0.1"),
        "a general reason, not the store's words: {readiness}"
    );
    let response = app
        .post_response(
            "/transfers",
            json!({"id": "t1", "from": "a", "to": "b", "amount": 5}),
        )
        .await;
    let status = response.status().as_u16();
    let content_type = header(&response, "content-type");
    let problem: Value = response.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 503, "{problem}");
    assert_eq!(content_type, "application/problem+json");
    assert_eq!(problem["status"], 503);
    assert_eq!(problem["detail"], UNAVAILABLE_DETAIL, "{problem}");
    assert_eq!(app.get("/accounts/a").await.0, 503);
    app.emulator().set_unavailable(false);
    wait::eventually("readyz 200", || async {
        app.status("/readyz").await == 200
    })
    .await;
    // The refused request changed nothing; the client's retry creates the transfer once.
    let (status, _) = post_t1(&app, 5).await;
    assert!(status == 201 || status == 200, "{status}");
    app.until_state("t1", "finished").await;
    let (_, a) = app.get("/accounts/a").await;
    assert_eq!(a["balance"], 95);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_caught_in_an_outage_is_finished_by_recovery_afterwards() {
    let app = spawn().await;
    open_a_and_b(&app).await;
    // Accept the transfer, then take the store away before its worker can finish.
    let (status, _) = post_t1(&app, 30).await;
    assert_eq!(status, 201);
    app.emulator().set_unavailable(true);
    // The outage lasts until the worker has spent its retries and left the transfer to
    // recovery: nothing in flight any more (a scrape never reads the store).
    wait::eventually("the worker to leave t1 to recovery", || async {
        app.scrape().await.value("transfers_in_flight", &[]) == 0.0
    })
    .await;
    app.emulator().set_unavailable(false);
    app.until_state("t1", "finished").await;
    let (_, a) = app.get("/accounts/a").await;
    let (_, b) = app.get("/accounts/b").await;
    assert_eq!(
        (a["balance"].as_i64(), b["balance"].as_i64()),
        (Some(70), Some(130))
    );
    assert_eq!(a["pending_transactions"], json!([]));
    assert_eq!(b["pending_transactions"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_requests_are_retried_and_the_transfer_finishes() {
    let app = spawn().await;
    open_a_and_b(&app).await;
    let before = app.emulator().request_count();
    // Two rejections: the create is retried (three attempts) and succeeds.
    app.emulator().fail_next(429, 2);
    let (status, _) = post_t1(&app, 30).await;
    assert_eq!(status, 201);
    // More rejections for whatever the worker sends next.
    app.emulator().fail_next(503, 4);
    app.until_state("t1", "finished").await;
    assert!(app.emulator().request_count() > before + 3);
    let (_, a) = app.get("/accounts/a").await;
    assert_eq!(a["balance"], 70);
}
