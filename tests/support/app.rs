//! The application under test: the real `Application` on port 0 on a chosen backend, with a
//! client whose helpers read like the HTTP contract (`open_account`, `transfer`, `settled`).
//!
//! Every reach into the engine (its store, its shutdown signal, building one by hand) is in
//! this file, so a change of the engine's interface is adapted here once.

use std::sync::Arc;
use std::time::Duration;

use es_emulator::RunningEmulator;
use serde_json::{json, Value};
use transfer_service::app::{open_store, Application, MigrationMode};
use transfer_service::config::Config;
use transfer_service::http::auth::Auth;
use transfer_service::http::{self, AppState};
use transfer_service::metrics::Metrics;
use transfer_service::store::DynStore;
use transfer_service::transfer::Engine;

use super::metrics::Exposition;
use super::{logs, stores, wait};

/// Where the application keeps its documents.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    /// The embedded store in a temp dir.
    Embedded,
    /// The Elasticsearch backend against the in-process emulator (a test double).
    Emulator,
    /// The Elasticsearch backend against a real cluster (`super::cluster`), with an index
    /// prefix of its own per test.
    RealEs,
}

/// An Elasticsearch that several applications share and that outlives them: a fresh emulator,
/// or the real cluster (`super::cluster`) on an index prefix of its own. Each app on it is
/// started as on the embedded store, then pointed at it by [`SharedElasticsearch::configure`].
pub struct SharedElasticsearch {
    pub url: String,
    pub prefix: String,
    _emulator: Option<RunningEmulator>,
}

impl SharedElasticsearch {
    /// On the emulator or the real cluster; `None` (said why) where no real cluster can run.
    pub async fn on(backend: Backend) -> Option<SharedElasticsearch> {
        let (url, emulator) = match backend {
            Backend::Emulator => {
                let emulator = stores::emulator().await;
                (emulator.url.clone(), Some(emulator))
            }
            Backend::RealEs => (stores::real_cluster()?, None),
            Backend::Embedded => panic!("the embedded store is not shared between processes"),
        };
        Some(SharedElasticsearch {
            url,
            prefix: stores::unique_prefix("shared"),
            _emulator: emulator,
        })
    }

    /// Points `config` at this Elasticsearch and prefix.
    pub fn configure(&self, config: &mut Config) {
        config.elasticsearch_url = Some(self.url.clone());
        config.index_prefix = self.prefix.clone();
        config.elasticsearch_shards = super::cluster::shards();
    }
}

/// A running application and what keeps it alive.
pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub config: Config,
    engine: Arc<Engine>,
    emulator: Option<RunningEmulator>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl TestApp {
    /// Whether this app creates and settles a new transfer (not a hold) in one store
    /// transaction before answering (a store with transactions, the embedded one, and
    /// `PROTOCOL=auto`): its `201` shows the transfer as stored, already terminal.
    pub fn settles_in_one_transaction(&self) -> bool {
        self.engine.uses_transactions()
    }

    /// The application on `backend`, ready (`/readyz` answers 200).
    pub async fn spawn(backend: Backend) -> TestApp {
        Self::spawn_with(backend, |_| {}).await
    }

    /// [`TestApp::spawn`], with these accounts opened (each with its balance, in order).
    pub async fn spawn_with_accounts<const N: usize>(
        backend: Backend,
        accounts: [(&str, i64); N],
    ) -> TestApp {
        let app = TestApp::spawn(backend).await;
        app.open_accounts(accounts).await;
        app
    }

    /// The application on `backend` with a tweaked configuration, ready.
    pub async fn spawn_with(backend: Backend, tweak: impl FnOnce(&mut Config)) -> TestApp {
        let app = Self::start(backend, tweak).await;
        app.until_ready().await;
        app
    }

    /// The application on `backend` with a tweaked configuration, not waited on (for a store
    /// that is not there).
    pub async fn start(backend: Backend, tweak: impl FnOnce(&mut Config)) -> TestApp {
        let (dir, config, emulator) = configure(backend, tweak).await;
        let app = Application::build(config.clone()).await.expect("build app");
        serve(app, dir, config, emulator)
    }

    /// Why the application refuses to start with this configuration (on the embedded store);
    /// panics if it starts.
    pub async fn start_error(tweak: impl FnOnce(&mut Config)) -> String {
        let (_dir, config, _emulator) = configure(Backend::Embedded, tweak).await;
        match Application::build(config).await {
            Ok(_) => panic!("the application started"),
            Err(error) => error.to_string(),
        }
    }

    /// The application on `backend` with a tweaked configuration, its store wrapped by
    /// `wrap` (a test double such as [`super::gate::AccountGate`] or
    /// [`super::faulty::FaultyStore`] around the real store), ready.
    pub async fn spawn_wrapped(
        backend: Backend,
        tweak: impl FnOnce(&mut Config),
        wrap: impl FnOnce(DynStore) -> DynStore,
    ) -> TestApp {
        let (dir, config, emulator) = configure(backend, tweak).await;
        let metrics = Metrics::new();
        let store = open_store(&config, &metrics, MigrationMode::Apply)
            .await
            .expect("open store");
        let app = Application::build_with_store(config.clone(), wrap(store), metrics)
            .await
            .expect("build app");
        let app = serve(app, dir, config, emulator);
        app.until_ready().await;
        app
    }

    /// The service's router with a short request timeout instead of the configured one, on
    /// the embedded store: the same layers in the same order, served as the application
    /// serves it. Not waited on.
    pub async fn spawn_with_request_timeout(timeout: Duration) -> TestApp {
        logs::capture();
        let dir = tempfile::tempdir().expect("temp dir");
        let config = Config::for_tests(dir.path().join("data"));
        let metrics = Metrics::new();
        let store = open_store(&config, &metrics, MigrationMode::Apply)
            .await
            .expect("open store");
        let engine = Engine::new(
            store,
            transfer_service::app::engine_config(&config),
            metrics.clone(),
        );
        let router = http::router_with_timeout(
            AppState {
                engine: engine.clone(),
                metrics,
                auth: Arc::new(Auth::open()),
            },
            timeout,
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let server = tokio::spawn(async move { axum::serve(listener, router).await });
        TestApp {
            base,
            client: reqwest::Client::new(),
            config,
            engine,
            emulator: None,
            server,
            _dir: dir,
        }
    }

    async fn until_ready(&self) {
        wait::eventually("the app to be ready", || async {
            self.status("/readyz").await == 200
        })
        .await;
    }

    /// The application's store, for planting documents as another worker would have left
    /// them and for checks the API does not expose.
    pub fn store(&self) -> &DynStore {
        self.engine.store()
    }

    /// The emulator under the application; panics on another backend.
    pub fn emulator(&self) -> &RunningEmulator {
        self.emulator.as_ref().expect("an app on the emulator")
    }

    /// Stops the workers and the server, waiting up to 15 s.
    pub async fn shutdown(self) {
        self.engine.shut_down();
        let _ = tokio::time::timeout(Duration::from_secs(15), self.server).await;
    }

    /// Stops the workers and aborts the server at once.
    pub fn abort(self) {
        self.engine.shut_down();
        self.server.abort();
    }

    // ---- requests -----------------------------------------------------------------------

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self.client.get(self.url(path)).send().await.expect("GET");
        read(response).await
    }

    /// The raw response of a GET (headers, non-JSON bodies).
    pub async fn get_response(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.expect("GET")
    }

    /// The raw response of a GET sending the header `name: value`.
    pub async fn get_with_header(&self, path: &str, name: &str, value: &str) -> reqwest::Response {
        let request = self.client.get(self.url(path)).header(name, value);
        request.send().await.expect("GET")
    }

    /// The status of a GET, or 0 when the request got no answer.
    pub async fn status(&self, path: &str) -> u16 {
        match self.client.get(self.url(path)).send().await {
            Ok(response) => response.status().as_u16(),
            Err(_) => 0,
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        read(self.post_response(path, body).await).await
    }

    /// The raw response of a JSON POST.
    pub async fn post_response(&self, path: &str, body: Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("POST")
    }

    /// `<method> <path>` with `Authorization: Bearer <key>` when a key is given, a JSON body
    /// when one is given, and `x-request-id: <request_id>`.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
        request_id: &str,
    ) -> reqwest::Response {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut request = self
            .client
            .request(method, self.url(path))
            .header("x-request-id", request_id);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        request.send().await.expect("request")
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

    // ---- the API in its own words -------------------------------------------------------

    pub async fn open_account(&self, id: &str, balance: i64) {
        let (status, body) = self
            .post("/accounts", json!({"id": id, "balance": balance}))
            .await;
        assert_eq!(status, 201, "open {id}: {body}");
    }

    /// Opens each of these accounts with its balance, in order.
    pub async fn open_accounts<const N: usize>(&self, accounts: [(&str, i64); N]) {
        for (id, balance) in accounts {
            self.open_account(id, balance).await;
        }
    }

    pub async fn balance(&self, id: &str) -> i64 {
        let (status, body) = self.get(&format!("/accounts/{id}")).await;
        assert_eq!(status, 200, "{body}");
        body["balance"].as_i64().unwrap()
    }

    /// Asserts that `POST /accounts` of `account` with its `field` set to each of `others`
    /// instead is a 409 (the id exists with another request).
    pub async fn assert_account_replays_conflict(
        &self,
        account: &Value,
        field: &str,
        others: &[Value],
    ) {
        for other in others {
            let mut changed = account.clone();
            changed[field] = other.clone();
            let (status, body) = self.post("/accounts", changed).await;
            assert_eq!(status, 409, "{other}: {body}");
        }
    }

    /// The balances of these accounts, in their order.
    pub async fn balances<const N: usize>(&self, ids: [&str; N]) -> [i64; N] {
        let mut balances = [0; N];
        for (balance, id) in balances.iter_mut().zip(ids) {
            *balance = self.balance(id).await;
        }
        balances
    }

    pub async fn transfer(&self, id: &str, from: &str, to: &str, amount: i64) -> (u16, Value) {
        self.post(
            "/transfers",
            json!({"id": id, "from": from, "to": to, "amount": amount}),
        )
        .await
    }

    /// Posts a transfer that must be accepted: `201`, showing it as stored (settled already
    /// where one transaction does it all, see [`TestApp::settles_in_one_transaction`];
    /// `created` where a worker drives it).
    pub async fn transfer_accepted(&self, id: &str, from: &str, to: &str, amount: i64) {
        let (status, body) = self.transfer(id, from, to, amount).await;
        assert_eq!(status, 201, "transfer {id}: {body}");
        self.assert_answered_as_stored(&body).await;
    }

    /// `transfer`, the body of a `201`, is the transfer as stored: what `GET` returns right
    /// after where one transaction settled it, else `created`.
    pub async fn assert_answered_as_stored(&self, transfer: &Value) {
        match self.settles_in_one_transaction() {
            true => {
                let id = transfer["id"].as_str().expect("an id");
                let (_, stored) = self.get(&format!("/transfers/{id}")).await;
                assert_eq!(transfer, &stored, "the 201 and the GET right after");
            }
            false => assert_eq!(transfer["state"], "created", "{transfer}"),
        }
    }

    /// The state of a transfer as `GET /transfers/{id}` answers it (`""` if none).
    pub async fn state(&self, id: &str) -> String {
        let (_, transfer) = self.get(&format!("/transfers/{id}")).await;
        transfer["state"].as_str().unwrap_or("").to_owned()
    }

    /// Polls until the transfer is in `state`; panics after [`wait::DEADLINE`].
    pub async fn until_state(&self, id: &str, state: &str) {
        let what = format!("{id} {state}");
        wait::eventually(&what, || async { self.state(id).await == state }).await;
    }

    /// Waits (long-polling) until the transfer is terminal; panics after [`wait::DEADLINE`].
    /// A `503` is asked again, as a client would: on Elasticsearch a read the store could not
    /// vouch for in time (a loaded machine, a cluster between states) is answered so.
    pub async fn settled(&self, id: &str) -> Value {
        let what = format!("transfer {id} to settle");
        wait::until_some(&what, || async {
            let (status, body) = self.get(&format!("/transfers/{id}?wait=5s")).await;
            if status == 503 {
                return None;
            }
            assert_eq!(status, 200, "{body}");
            let state = body["state"].as_str().expect("a state");
            (state == "finished" || state == "rolled-back").then_some(body)
        })
        .await
    }

    /// `POST /transfers/batch` with these items.
    pub async fn batch(&self, items: Vec<Value>) -> (u16, Value) {
        self.post("/transfers/batch", json!({ "transfers": items }))
            .await
    }

    /// A JSON POST whose body is larger than the service reads (over `MAX_BODY_BYTES`): the
    /// service answers `413` before reading all of it and closes the connection, and a client
    /// still sending may see the connection reset before it reads that answer (a transport
    /// race, not an answer). Sent again, up to three times, until the answer is read.
    pub async fn post_oversized(&self, path: &str, body: Value) -> (u16, Value) {
        let body = serde_json::to_vec(&body).expect("JSON");
        // A connection of its own, never pooled: the server answers before reading the whole
        // body and then closes it, so a pooled one could be handed to the test's next request
        // just as it closes (a reset that is no answer of the service's).
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("an HTTP client");
        for _ in 0..3 {
            let sent = client
                .post(self.url(path))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            if let Ok(response) = sent {
                return read(response).await;
            }
        }
        panic!("POST {path}: the connection was reset three times before an answer");
    }

    /// Every page of the transfer listing `query` (`""`: unfiltered) with pages of `limit`,
    /// following `next_cursor` to the end; each page answered 200.
    pub async fn transfer_pages(&self, query: &str, limit: usize) -> Vec<Value> {
        let first = match query {
            "" => format!("/transfers?limit={limit}"),
            _ => format!("/transfers?{query}&limit={limit}"),
        };
        let mut pages = Vec::new();
        let mut path = first.clone();
        loop {
            let (status, page) = self.get(&path).await;
            assert_eq!(status, 200, "{path}: {page}");
            let next = page["next_cursor"]
                .as_str()
                .map(|c| format!("{first}&cursor={c}"));
            pages.push(page);
            match next {
                Some(next) => path = next,
                None => return pages,
            }
        }
    }

    /// The ids [`Self::transfer_pages`] lists, page after page.
    pub async fn every_listed_id(&self, query: &str, limit: usize) -> Vec<String> {
        let pages = self.transfer_pages(query, limit).await;
        pages.iter().flat_map(item_ids).collect()
    }

    /// `GET /metrics`, checked to be the Prometheus text format, parsed.
    pub async fn scrape(&self) -> Exposition {
        let response = self.get_response("/metrics").await;
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap();
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{content_type}"
        );
        Exposition::parse(&response.text().await.expect("metrics body"))
    }
}

/// The value of header `name` of `response` (`""` if it has none).
pub fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// The `id` of every item of a listing page, in order.
pub fn item_ids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The `status` of every item of a `POST /transfers/batch` answer, in order.
pub fn item_statuses(answer: &Value) -> Vec<u64> {
    answer["items"]
        .as_array()
        .map(|items| items.iter().filter_map(|i| i["status"].as_u64()).collect())
        .unwrap_or_default()
}

async fn read(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

/// The test configuration on `backend` (a temp data dir, an emulator of its own, or indices of
/// their own on the real cluster), tweaked.
async fn configure(
    backend: Backend,
    tweak: impl FnOnce(&mut Config),
) -> (tempfile::TempDir, Config, Option<RunningEmulator>) {
    logs::capture();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::for_tests(dir.path().join("data"));
    config.elasticsearch_shards = super::cluster::shards();
    let emulator = match backend {
        Backend::Embedded => None,
        Backend::Emulator => {
            let emulator = stores::emulator().await;
            config.elasticsearch_url = Some(emulator.url.clone());
            Some(emulator)
        }
        Backend::RealEs => {
            config.elasticsearch_url = stores::real_cluster();
            config.index_prefix = stores::unique_prefix("api-test");
            None
        }
    };
    tweak(&mut config);
    (dir, config, emulator)
}

/// Serves a built application in the background.
fn serve(
    app: Application,
    dir: tempfile::TempDir,
    config: Config,
    emulator: Option<RunningEmulator>,
) -> TestApp {
    let base = format!("http://{}", app.addr());
    let engine = app.engine().clone();
    let server = tokio::spawn(app.run_until(std::future::pending()));
    TestApp {
        base,
        client: reqwest::Client::new(),
        config,
        engine,
        emulator,
        server,
        _dir: dir,
    }
}
