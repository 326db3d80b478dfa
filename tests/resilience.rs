//! Store outages seen from the API, on the Elasticsearch backend and the emulator (a test
//! double whose `set_unavailable` answers every request with 503, like a cluster without a
//! primary, and `fail_next` with 429 rejections):
//! - `/readyz` answers 503 while the store is unreachable and 200 again when it is back;
//! - requests during the outage get a 503 problem, never a 500, and change nothing;
//! - a transfer whose steps keep failing is left for recovery and finished after the outage;
//! - rejected (429) requests are retried with backoff and the transfer still finishes.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use transfer_service::app::Application;
use transfer_service::config::Config;

struct App {
    base: String,
    client: reqwest::Client,
    emulator: es_emulator::RunningEmulator,
    _dir: tempfile::TempDir,
}

async fn spawn() -> App {
    let emulator = es_emulator::spawn(es_emulator::EmulatorConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::for_tests(dir.path().to_path_buf());
    config.elasticsearch_url = Some(emulator.url.clone());
    config.lease_duration = Duration::from_millis(500);
    config.recovery_interval = Duration::from_millis(100);
    config.recovery_stale_after = Duration::from_millis(300);
    let app = Application::build(config).await.unwrap();
    let base = format!("http://{}", app.addr());
    tokio::spawn(app.run_until(std::future::pending()));
    let app = App {
        base,
        client: reqwest::Client::new(),
        emulator,
        _dir: dir,
    };
    app.until(|| async { app.status("/readyz").await == 200 }, "ready")
        .await;
    app
}

impl App {
    async fn status(&self, path: &str) -> u16 {
        match self.client.get(format!("{}{path}", self.base)).send().await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        }
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value, String) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let content_type = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (
            r.status().as_u16(),
            r.json().await.unwrap_or(Value::Null),
            content_type,
        )
    }

    async fn until<F, Fut>(&self, check: F, what: &str)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !check().await {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn state(&self, id: &str) -> String {
        let (_, t) = self.get(&format!("/transfers/{id}")).await;
        t["state"].as_str().unwrap_or("").to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_store_and_outages_answer_503() {
    let app = spawn().await;
    for id in ["a", "b"] {
        let (status, _, _) = app
            .post("/accounts", json!({"id": id, "balance": 100}))
            .await;
        assert_eq!(status, 201);
    }
    app.emulator.set_unavailable(true);
    app.until(
        || async { app.status("/readyz").await == 503 },
        "readyz 503",
    )
    .await;
    let (status, problem, content_type) = app
        .post(
            "/transfers",
            json!({"id": "t1", "from": "a", "to": "b", "amount": 5}),
        )
        .await;
    assert_eq!(status, 503, "{problem}");
    assert_eq!(content_type, "application/problem+json");
    assert_eq!(problem["status"], 503);
    assert_eq!(app.get("/accounts/a").await.0, 503);
    app.emulator.set_unavailable(false);
    app.until(
        || async { app.status("/readyz").await == 200 },
        "readyz 200",
    )
    .await;
    // The refused request changed nothing; the client's retry creates the transfer once.
    let (status, _, _) = app
        .post(
            "/transfers",
            json!({"id": "t1", "from": "a", "to": "b", "amount": 5}),
        )
        .await;
    assert!(status == 201 || status == 200, "{status}");
    app.until(
        || async { app.state("t1").await == "finished" },
        "t1 finished",
    )
    .await;
    let (_, a) = app.get("/accounts/a").await;
    assert_eq!(a["balance"], 95);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_caught_in_an_outage_is_finished_by_recovery_afterwards() {
    let app = spawn().await;
    for id in ["a", "b"] {
        app.post("/accounts", json!({"id": id, "balance": 100}))
            .await;
    }
    // Accept the transfer, then take the store away before its worker can finish.
    let (status, _, _) = app
        .post(
            "/transfers",
            json!({"id": "t1", "from": "a", "to": "b", "amount": 30}),
        )
        .await;
    assert_eq!(status, 201);
    app.emulator.set_unavailable(true);
    tokio::time::sleep(Duration::from_millis(1500)).await; // longer than the worker's retries
    app.emulator.set_unavailable(false);
    app.until(
        || async { app.state("t1").await == "finished" },
        "t1 finished after the outage",
    )
    .await;
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
    for id in ["a", "b"] {
        app.post("/accounts", json!({"id": id, "balance": 100}))
            .await;
    }
    let before = app.emulator.request_count();
    // Two rejections: the create is retried (three attempts) and succeeds.
    app.emulator.fail_next(429, 2);
    let (status, _, _) = app
        .post(
            "/transfers",
            json!({"id": "t1", "from": "a", "to": "b", "amount": 30}),
        )
        .await;
    assert_eq!(status, 201);
    // More rejections for whatever the worker sends next.
    app.emulator.fail_next(503, 4);
    app.until(
        || async { app.state("t1").await == "finished" },
        "t1 finished",
    )
    .await;
    assert!(app.emulator.request_count() > before + 3);
    let (_, a) = app.get("/accounts/a").await;
    assert_eq!(a["balance"], 70);
}
