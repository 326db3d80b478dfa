//! Admission control (docs/design.md §5, §8): beyond `MAX_IN_FLIGHT` transfers in flight,
//! `POST /transfers` and `POST /transfers/batch` answer 503 with `Retry-After`, having
//! created nothing, until accepted work finishes. Transfers are held in flight by a store
//! wrapper that holds account writes until the test opens it (no sleeps). Run on the embedded
//! store, the Elasticsearch backend on the emulator (a test double of Elasticsearch) and the
//! real cluster (`tools/es-cluster/run`; skipped, saying why, where none can run).

use std::sync::Arc;

use crate::support::app::{item_statuses, Backend, TestApp};
use crate::support::gate::AccountGate;
use crate::support::wait;
use serde_json::{json, Value};
use transfer_service::store::DynStore;

fn transfer(id: &str, from: &str, to: &str, amount: i64) -> Value {
    json!({"id": id, "from": from, "to": to, "amount": amount})
}

/// `POST /transfers/batch` of three transfers from `A` to `B`, `<prefix>-<i>` of `i`.
async fn post_batch_of_three(app: &TestApp, prefix: &str) -> reqwest::Response {
    let three: Vec<Value> = (1..=3)
        .map(|i| transfer(&format!("{prefix}-{i}"), "A", "B", i))
        .collect();
    app.post_response("/transfers/batch", json!({ "transfers": three }))
        .await
}

/// The app with `MAX_IN_FLIGHT = max`, its account writes held by the returned gate.
async fn held_app(b: Backend, max: usize) -> (TestApp, Arc<AccountGate>) {
    let gate = std::sync::OnceLock::new();
    let app = TestApp::spawn_wrapped(
        b,
        |config| config.max_in_flight = max,
        |store| {
            let wrapped = AccountGate::closed(store);
            let _ = gate.set(wrapped.clone());
            wrapped as DynStore
        },
    )
    .await;
    let gate = gate.into_inner().expect("the store was wrapped");
    app.open_accounts([("A", 1_000), ("B", 0)]).await;
    (app, gate)
}

/// Asserts a response is the overload 503: problem+json of type `overloaded`, `Retry-After`.
async fn assert_shed(response: reqwest::Response) {
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/overloaded", "{problem}");
    assert_eq!(problem["status"], 503, "{problem}");
}

async fn gauge(app: &TestApp) -> f64 {
    app.scrape()
        .await
        .value("transfers_admitted_in_flight", &[])
}

async fn shed(app: &TestApp, route: &str) -> f64 {
    app.scrape()
        .await
        .value("requests_shed_total", &[("route", route)])
}

/// Waits until every admitted transfer's driver has ended (a GET may see a transfer
/// terminal just before its driver gives its permit back).
async fn until_nothing_admitted(app: &TestApp) {
    wait::eventually("no transfer admitted in flight", || async {
        gauge(app).await == 0.0
    })
    .await;
}

mod cases {
    use super::*;

    pub async fn beyond_the_bound_creates_are_503_until_work_finishes(b: Backend) {
        let (app, gate) = held_app(b, 2).await;
        assert_eq!(shed(&app, "/transfers").await, 0.0);
        assert_eq!(shed(&app, "/transfers/batch").await, 0.0);
        app.transfer_accepted("t-1", "A", "B", 10).await;
        app.transfer_accepted("t-2", "A", "B", 20).await;
        assert_eq!(gauge(&app).await, 2.0);

        // Over the bound: a new transfer, a replay (admission applies to every create) and a
        // batch are shed, and nothing is created.
        assert_shed(
            app.post_response("/transfers", transfer("t-3", "A", "B", 30))
                .await,
        )
        .await;
        assert_shed(
            app.post_response("/transfers", transfer("t-1", "A", "B", 10))
                .await,
        )
        .await;
        let batch = json!({"transfers": [transfer("t-4", "A", "B", 40)]});
        assert_shed(app.post_response("/transfers/batch", batch.clone()).await).await;
        for id in ["t-3", "t-4"] {
            assert_eq!(app.get(&format!("/transfers/{id}")).await.0, 404, "{id}");
        }
        assert_eq!(shed(&app, "/transfers").await, 2.0);
        assert_eq!(shed(&app, "/transfers/batch").await, 1.0);
        assert_eq!(gauge(&app).await, 2.0, "a shed request takes nothing");
        assert_eq!(
            app.scrape().await.value("transfers_created_total", &[]),
            2.0
        );

        // Accepted work is never dropped: once it finishes there is room again.
        gate.open();
        assert_eq!(app.settled("t-1").await["state"], "finished");
        assert_eq!(app.settled("t-2").await["state"], "finished");
        until_nothing_admitted(&app).await;
        app.transfer_accepted("t-3", "A", "B", 30).await;
        let (status, body) = app.post("/transfers/batch", batch).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["items"][0]["status"], 201, "{body}");
        app.settled("t-3").await;
        app.settled("t-4").await;
        until_nothing_admitted(&app).await;
        assert_eq!((app.balance("A").await, app.balance("B").await), (900, 100));
        let m = app.scrape().await;
        assert_eq!(m.value("transfers_created_total", &[]), 4.0);
        assert_eq!(
            m.value("requests_shed_total", &[("route", "/transfers")]),
            2.0
        );
        app.shutdown().await;
    }

    /// A batch takes a permit per valid item, all or none; invalid items take none.
    pub async fn a_batch_is_admitted_whole_or_not_at_all(b: Backend) {
        let (app, gate) = held_app(b, 3).await;
        app.transfer_accepted("held", "A", "B", 1).await;
        let response = post_batch_of_three(&app, "b").await;
        assert_shed(response).await;
        for i in 1..=3 {
            assert_eq!(app.get(&format!("/transfers/b-{i}")).await.0, 404);
        }
        assert_eq!(gauge(&app).await, 1.0);

        // Two valid items fit in the two permits left; the invalid one needs none.
        let (status, body) = app
            .batch(vec![
                transfer("b-1", "A", "B", 1),
                transfer("b-bad", "A", "B", 0),
                transfer("b-2", "A", "B", 2),
            ])
            .await;
        assert_eq!(status, 200, "{body}");
        let statuses = item_statuses(&body);
        assert_eq!(statuses, [201, 422, 201], "{body}");
        assert_eq!(gauge(&app).await, 3.0);
        assert_eq!(shed(&app, "/transfers/batch").await, 1.0);

        gate.open();
        for id in ["held", "b-1", "b-2"] {
            assert_eq!(app.settled(id).await["state"], "finished", "{id}");
        }
        until_nothing_admitted(&app).await;
        app.shutdown().await;
    }

    /// A batch larger than the bound could never be admitted: 422 (split it), not a 503
    /// that retrying cannot cure.
    pub async fn a_batch_larger_than_the_bound_is_422(b: Backend) {
        let (app, gate) = held_app(b, 2).await;
        gate.open();
        let response = post_batch_of_three(&app, "c").await;
        assert_eq!(response.status(), 422);
        assert!(response.headers().get("retry-after").is_none());
        let problem: Value = response.json().await.unwrap();
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("MAX_IN_FLIGHT"),
            "{problem}"
        );
        assert_eq!(app.get("/transfers/c-1").await.0, 404);
        assert_eq!(shed(&app, "/transfers/batch").await, 0.0);
        app.shutdown().await;
    }
}

on_every_backend!(
    beyond_the_bound_creates_are_503_until_work_finishes,
    a_batch_is_admitted_whole_or_not_at_all,
    a_batch_larger_than_the_bound_is_422,
);
