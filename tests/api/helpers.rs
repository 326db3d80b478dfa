//! `spawn_app()`: the real application on port 0, on a chosen backend, with a client.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use transfer_service::app::Application;
use transfer_service::config::Config;
use transfer_service::transfer::Engine;

#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Embedded,
    /// The Elasticsearch backend against the in-process emulator (a test double).
    Emulator,
    /// The Elasticsearch backend against the cluster at `ELASTICSEARCH_URL`, with an index
    /// prefix of its own per test.
    RealEs,
}

/// The real cluster to test against, if any; says why a `real_es` test skips otherwise.
pub fn real_cluster() -> Option<String> {
    let url = std::env::var("ELASTICSEARCH_URL").ok();
    if url.is_none() {
        eprintln!("skipped: ELASTICSEARCH_URL is not set, so there is no real cluster to test");
    }
    url
}

static PREFIXES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub engine: Arc<Engine>,
    #[allow(dead_code)]
    pub config: Config,
    _dir: tempfile::TempDir,
    _emulator: Option<es_emulator::RunningEmulator>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |_| {}).await
}

pub async fn spawn_app_with(backend: Backend, tweak: impl FnOnce(&mut Config)) -> TestApp {
    if std::env::var("TEST_LOG").is_ok() {
        transfer_service::telemetry::init(transfer_service::config::LogFormat::Pretty);
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::for_tests(dir.path().join("data"));
    let emulator = match backend {
        Backend::Embedded => None,
        Backend::Emulator => {
            let emulator = es_emulator::spawn(es_emulator::EmulatorConfig::default()).await;
            config.elasticsearch_url = Some(emulator.url.clone());
            Some(emulator)
        }
        Backend::RealEs => {
            config.elasticsearch_url = real_cluster();
            config.index_prefix = format!(
                "api-test-{}-{}-",
                std::process::id(),
                PREFIXES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            None
        }
    };
    tweak(&mut config);
    let app = Application::build(config.clone()).await.expect("build app");
    let base = format!("http://{}", app.addr());
    let engine = app.engine().clone();
    let server = tokio::spawn(app.run_until(std::future::pending()));
    let test_app = TestApp {
        base,
        client: reqwest::Client::new(),
        engine,
        config,
        _dir: dir,
        _emulator: emulator,
        server,
    };
    eventually(Duration::from_secs(20), "ready", || async {
        test_app.get("/readyz").await.0 == 200
    })
    .await;
    test_app
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self.client.get(self.url(path)).send().await.expect("GET");
        read(response).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("POST");
        read(response).await
    }

    pub async fn post_raw(
        &self,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> reqwest::Response {
        let mut request = self.client.post(self.url(path)).body(body);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        request.send().await.expect("POST")
    }

    /// Sends `<method> <target>` with an empty body exactly as written (no URL
    /// normalisation: `.`, `..`, `%2E` and raw bytes reach the server as they are) over a
    /// fresh connection; returns the status, the `content-type` and the body.
    pub async fn raw(&self, method: &str, target: &[u8]) -> (u16, String, Vec<u8>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.base.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut request = format!("{method} ").into_bytes();
        request.extend_from_slice(target);
        request.extend_from_slice(
            b" HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        );
        stream.write_all(&request).await.expect("send");
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await.expect("read");
        let end = reply
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a complete head");
        let head = String::from_utf8_lossy(&reply[..end]).into_owned();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {head:?}"));
        let content_type = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-type")
                    .then(|| value.trim().to_owned())
            })
            .unwrap_or_default();
        (status, content_type, reply[end + 4..].to_vec())
    }

    pub async fn open_account(&self, id: &str, balance: i64) {
        let (status, body) = self
            .post("/accounts", json!({"id": id, "balance": balance}))
            .await;
        assert_eq!(status, 201, "{body}");
    }

    pub async fn balance(&self, id: &str) -> i64 {
        let (status, body) = self.get(&format!("/accounts/{id}")).await;
        assert_eq!(status, 200, "{body}");
        body["balance"].as_i64().unwrap()
    }

    pub async fn transfer(&self, id: &str, from: &str, to: &str, amount: i64) -> (u16, Value) {
        self.post(
            "/transfers",
            json!({"id": id, "from": from, "to": to, "amount": amount}),
        )
        .await
    }

    /// Waits (long-polling) until the transfer is terminal; panics after 30 s.
    pub async fn settled(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = self.get(&format!("/transfers/{id}?wait=5s")).await;
            assert_eq!(status, 200, "{body}");
            let state = body["state"].as_str().unwrap();
            if state == "finished" || state == "rolled-back" {
                return body;
            }
            assert!(Instant::now() < deadline, "transfer {id} stuck in {state}");
        }
    }

    pub async fn shutdown(self) {
        self.engine.shut_down();
        let _ = tokio::time::timeout(Duration::from_secs(15), self.server).await;
    }
}

/// Polls `check` until it holds; panics with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn read(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}
