//! Observability: `/metrics` after real transfers, route labels, request ids, the log lines
//! (JSON, spans, exactly one error line per 5xx), the committed OpenAPI document, and the
//! Swagger UI served from the binary with no network.
//!
//! Every test starts the real application on port 0 with the embedded store in a temp dir
//! (the timeout test, the service's router with a short request timeout). Logs of every app
//! in this binary go, as JSON, to one in-memory buffer; each test finds its own lines by
//! request id or transfer id.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tracing_subscriber::EnvFilter;
use transfer_service::app::{open_store, Application, Migrations};
use transfer_service::config::{Config, LogFormat};
use transfer_service::http::{self, openapi, AppState};
use transfer_service::metrics::Metrics;
use transfer_service::store::{format_millis, Index};
use transfer_service::telemetry;
use transfer_service::transfer::clock::{Clock, SystemClock};
use transfer_service::transfer::{Engine, EngineConfig};

const DEADLINE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The application under test

struct App {
    base: String,
    client: reqwest::Client,
    engine: Arc<Engine>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

/// The real application on port 0, embedded store in a temp dir, ready.
async fn spawn_app() -> App {
    let app = spawn_app_with(|_| {}).await;
    let a = &app;
    eventually("the app to be ready", || async move {
        a.get("/readyz").await.0 == 200
    })
    .await;
    app
}

/// The real application with a tweaked configuration; not waited on.
async fn spawn_app_with(tweak: impl FnOnce(&mut Config)) -> App {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::for_tests(dir.path().join("data"));
    tweak(&mut config);
    let app = Application::build(config).await.expect("build app");
    let base = format!("http://{}", app.addr());
    let engine = app.engine().clone();
    let server = tokio::spawn(app.run_until(std::future::pending()));
    App {
        base,
        client: reqwest::Client::new(),
        engine,
        server,
        _dir: dir,
    }
}

impl App {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let response = self.client.get(self.url(path)).send().await.expect("GET");
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    async fn get_text(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.expect("GET")
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("POST");
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    async fn open_account(&self, id: &str, balance: i64) {
        let (status, body) = self
            .post("/accounts", json!({"id": id, "balance": balance}))
            .await;
        assert_eq!(status, 201, "open {id}: {body}");
    }

    async fn transfer(&self, id: &str, from: &str, to: &str, amount: i64) {
        let (status, body) = self
            .post(
                "/transfers",
                json!({"id": id, "from": from, "to": to, "amount": amount}),
            )
            .await;
        assert_eq!(status, 201, "transfer {id}: {body}");
        assert_eq!(body["state"], "created", "{body}");
    }

    /// Long-polls until the transfer is terminal; returns it.
    async fn settled(&self, id: &str) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let (status, body) = self.get(&format!("/transfers/{id}?wait=5s")).await;
            assert_eq!(status, 200, "{body}");
            let state = body["state"].as_str().expect("a state");
            if state == "finished" || state == "rolled-back" {
                return body;
            }
            assert!(Instant::now() < deadline, "transfer {id} stuck in {state}");
        }
    }

    async fn scrape(&self) -> Exposition {
        let response = self.get_text("/metrics").await;
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap();
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{content_type}"
        );
        Exposition::parse(&response.text().await.expect("metrics body"))
    }

    async fn shutdown(self) {
        self.engine.shut_down();
        let _ = tokio::time::timeout(Duration::from_secs(15), self.server).await;
    }
}

/// Polls `check` every 20 ms until it holds; panics after [`DEADLINE`].
async fn eventually<F, Fut>(what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The Prometheus text exposition format, parsed

#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Debug, Default)]
struct Exposition {
    /// `# TYPE name kind`
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Exposition {
    /// Parses every line; panics on one that is not a comment, blank, or
    /// `name[{label="value",...}] value [timestamp]`.
    fn parse(text: &str) -> Self {
        let mut exposition = Exposition::default();
        for (number, line) in text.lines().enumerate() {
            let fail = |why: &str| -> ! { bad_line(number, line, why) };
            if line.trim().is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                let mut words = comment.split_whitespace();
                if words.next() == Some("TYPE") {
                    let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                        fail("a TYPE line needs a name and a type");
                    };
                    exposition.types.insert(name.into(), kind.into());
                }
                continue;
            }
            let name_end = line
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(line.len());
            let name = &line[..name_end];
            if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
                fail("no metric name");
            }
            let mut rest = &line[name_end..];
            let mut labels = BTreeMap::new();
            if let Some(after_brace) = rest.strip_prefix('{') {
                rest = parse_labels(after_brace, &mut labels).unwrap_or_else(|why| fail(&why));
            }
            let mut fields = rest.split_whitespace();
            let value = match fields.next() {
                Some("+Inf") => f64::INFINITY,
                Some("-Inf") => f64::NEG_INFINITY,
                Some(v) => v.parse::<f64>().unwrap_or_else(|_| fail("bad value")),
                None => fail("no value"),
            };
            if let Some(timestamp) = fields.next() {
                timestamp
                    .parse::<i64>()
                    .unwrap_or_else(|_| fail("bad timestamp"));
            }
            if fields.next().is_some() {
                fail("trailing text");
            }
            exposition.samples.push(Sample {
                name: name.into(),
                labels,
                value,
            });
        }
        exposition
    }

    /// The value of the one sample with exactly these labels; panics if there is none.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?}; have {:#?}", self.named(name)))
    }

    fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut found = self
            .samples
            .iter()
            .filter(|s| s.name == name && s.labels == wanted);
        let sample = found.next()?;
        assert!(found.next().is_none(), "{name}{labels:?} appears twice");
        Some(sample.value)
    }

    fn named(&self, name: &str) -> Vec<&Sample> {
        self.samples.iter().filter(|s| s.name == name).collect()
    }

    /// The sum over every sample of `name` (every label set).
    fn sum(&self, name: &str) -> f64 {
        self.named(name).iter().map(|s| s.value).sum()
    }
}

fn bad_line(number: usize, line: &str, why: &str) -> ! {
    panic!("/metrics line {}: {why}: {line:?}", number + 1)
}

/// Parses `key="value",...}` (after the `{`), unescaping `\\`, `\"` and `\n`; returns the
/// text after the `}`.
fn parse_labels<'a>(
    mut text: &'a str,
    labels: &mut BTreeMap<String, String>,
) -> Result<&'a str, String> {
    loop {
        text = text.trim_start();
        if let Some(rest) = text.strip_prefix('}') {
            return Ok(rest);
        }
        let eq = text.find('=').ok_or("a label without `=`")?;
        let key = text[..eq].trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad label name {key:?}"));
        }
        let mut chars = text[eq + 1..]
            .strip_prefix('"')
            .ok_or("a label value must be quoted")?
            .char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next().ok_or("unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                    'n' => value.push('\n'),
                    c @ ('\\' | '"') => value.push(c),
                    c => return Err(format!("bad escape \\{c}")),
                },
                (_, c) => value.push(c),
            }
        };
        if labels.insert(key.to_owned(), value).is_some() {
            return Err(format!("label {key} twice"));
        }
        text = &text[eq + 1..][1 + end + 1..];
        text = text.trim_start();
        text = text.strip_prefix(',').unwrap_or(text);
    }
}

#[test]
fn the_exposition_parser_reads_labels_escapes_and_special_values() {
    let text = "# HELP a_total Help.\n# TYPE a_total counter\n\
        a_total{x=\"1\",y=\"q\\\"uo\\\\te\\n\"} 3\n\
        b 4.5 1700000000000\n\
        c_bucket{le=\"+Inf\"} +Inf\n\
        d{z=\"a,b}c\",} 0\n";
    let e = Exposition::parse(text);
    assert_eq!(e.types["a_total"], "counter");
    assert_eq!(e.value("a_total", &[("x", "1"), ("y", "q\"uo\\te\n")]), 3.0);
    assert_eq!(e.value("b", &[]), 4.5);
    assert_eq!(e.value("c_bucket", &[("le", "+Inf")]), f64::INFINITY);
    assert_eq!(e.value("d", &[("z", "a,b}c")]), 0.0);
    assert_eq!(e.find("a_total", &[("x", "1")]), None);
}

// ---------------------------------------------------------------------------------------------
// Logs: every app in this process logs JSON into one buffer

#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs_buffer() -> &'static LogBuffer {
    static LOGS: OnceLock<LogBuffer> = OnceLock::new();
    LOGS.get_or_init(LogBuffer::default)
}

/// Installs the service's JSON subscriber, writing into [`logs_buffer`], once per process.
fn capture_logs() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let buffer = logs_buffer().clone();
        let subscriber = telemetry::subscriber(
            LogFormat::Json,
            EnvFilter::new("info"),
            move || buffer.clone(),
            false,
        );
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
    });
}

/// Every log line so far, parsed (each line must be one JSON object).
fn log_lines() -> Vec<Value> {
    let bytes = logs_buffer().0.lock().unwrap().clone();
    String::from_utf8(bytes)
        .expect("UTF-8 logs")
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// The lines logged inside the request span with this request id (at any depth).
fn lines_of_request(request_id: &str) -> Vec<Value> {
    log_lines()
        .into_iter()
        .filter(|line| {
            line["spans"]
                .as_array()
                .is_some_and(|spans| spans.iter().any(|s| s["request_id"] == request_id))
        })
        .collect()
}

/// Waits for the response line of a request (`request finished` / `request failed`).
async fn response_line(request_id: &str) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(line) = lines_of_request(request_id).into_iter().find(|l| {
            l["span"]["name"] == "request"
                && l["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("request f"))
        }) {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "no response line for request {request_id}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Metrics

/// Every series of DESIGN §8 with its type.
const SERIES: &[(&str, &str)] = &[
    ("transfers_created_total", "counter"),
    ("transfers_completed_total", "counter"),
    ("transfer_state_transitions_total", "counter"),
    ("transfers_in_flight", "gauge"),
    ("transfer_duration_seconds", "histogram"),
    ("recovery_runs_total", "counter"),
    ("transfers_recovered_total", "counter"),
    ("store_requests_total", "counter"),
    ("store_request_duration_seconds", "histogram"),
    ("http_requests_total", "counter"),
    ("http_request_duration_seconds", "histogram"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_every_transfer_transition_and_request() {
    let app = spawn_app().await;
    app.open_account("alice", 1_000).await;
    app.open_account("bob", 0).await;
    app.open_account("carol", 5).await;

    // 7 transfers that must finish, 3 overdrafts that must roll back, whatever the order.
    const FINISHING: usize = 7;
    const OVERDRAFTS: usize = 3;
    let mut ids = Vec::new();
    for i in 0..FINISHING {
        let id = format!("ok-{i}");
        app.transfer(&id, "alice", "bob", 10).await;
        ids.push((id, "finished"));
    }
    for i in 0..OVERDRAFTS {
        let id = format!("overdraft-{i}");
        app.transfer(&id, "carol", "bob", 100).await;
        ids.push((id, "rolled-back"));
    }
    for (id, expected) in &ids {
        let transfer = app.settled(id).await;
        assert_eq!(transfer["state"], *expected, "{transfer}");
        if *expected == "rolled-back" {
            assert_eq!(transfer["reason"], "insufficient_funds", "{transfer}");
        }
    }
    // A worker updates its metrics right after its terminal write, which a GET may see first.
    let a = &app;
    eventually(
        "every transfer counted as completed, none in flight",
        || async move {
            let m = a.scrape().await;
            m.sum("transfers_completed_total") == 10.0
                && m.value("transfers_in_flight", &[]) == 0.0
                && m.value("recovery_runs_total", &[]) >= 1.0
        },
    )
    .await;

    // Route labels are templates; every unknown path is one `unmatched` label.
    for path in ["/transfers/abc", "/transfers/xyz", "/no/such/path"] {
        assert_eq!(app.get(path).await.0, 404, "{path}");
    }

    let m = app.scrape().await;
    for (name, kind) in SERIES {
        assert_eq!(
            m.types.get(*name).map(String::as_str),
            Some(*kind),
            "# TYPE of {name}"
        );
    }

    let finished = FINISHING as f64;
    let rolled_back = OVERDRAFTS as f64;
    assert_eq!(m.value("transfers_created_total", &[]), 10.0);
    assert_eq!(
        m.value("transfers_completed_total", &[("outcome", "finished")]),
        finished
    );
    assert_eq!(
        m.value("transfers_completed_total", &[("outcome", "rolled-back")]),
        rolled_back
    );
    let transition = |from: &str, to: &str| {
        m.value(
            "transfer_state_transitions_total",
            &[("from", from), ("to", to)],
        )
    };
    assert_eq!(transition("created", "pending"), 10.0);
    assert_eq!(transition("pending", "committed"), finished);
    assert_eq!(transition("committed", "finished"), finished);
    assert_eq!(transition("pending", "terminating"), rolled_back);
    assert_eq!(transition("terminating", "rolled-back"), rolled_back);
    assert_eq!(transition("created", "rolled-back"), 0.0);
    assert_eq!(
        m.sum("transfer_state_transitions_total"),
        10.0 + 2.0 * finished + 2.0 * rolled_back,
        "no other transition: {:#?}",
        m.named("transfer_state_transitions_total")
    );
    assert_eq!(m.value("transfers_in_flight", &[]), 0.0);
    assert_eq!(m.value("transfer_duration_seconds_count", &[]), 10.0);
    assert_eq!(
        m.value("transfer_duration_seconds_bucket", &[("le", "+Inf")]),
        10.0
    );
    assert!(m.value("transfer_duration_seconds_sum", &[]) > 0.0);
    // Recovery ran and found nothing of its own to take over in every state it can.
    assert!(m.value("recovery_runs_total", &[]) >= 1.0);
    for state in ["created", "pending", "committed", "terminating"] {
        m.value("transfers_recovered_total", &[("state", state)]);
    }

    // HTTP: by method, route template and status.
    let http = |method: &str, route: &str, status: &str| {
        m.find(
            "http_requests_total",
            &[("method", method), ("route", route), ("status", status)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(http("POST", "/transfers", "201"), 10.0);
    assert_eq!(http("POST", "/accounts", "201"), 3.0);
    assert_eq!(http("GET", "/transfers/{id}", "404"), 2.0);
    assert!(http("GET", "/transfers/{id}", "200") >= 10.0);
    assert_eq!(http("GET", "unmatched", "404"), 1.0);
    assert_eq!(
        m.value(
            "http_request_duration_seconds_count",
            &[("method", "POST"), ("route", "/transfers")]
        ),
        10.0
    );
    let known_routes = [
        "/accounts",
        "/accounts/{id}",
        "/transfers",
        "/transfers/{id}",
        "/transfers/{id}/cancel",
        "/healthz",
        "/readyz",
        "/metrics",
        "unmatched",
    ];
    for sample in m
        .samples
        .iter()
        .filter(|s| s.name.starts_with("http_request"))
    {
        let route = sample.labels["route"].as_str();
        assert!(
            known_routes.contains(&route),
            "raw path as a label: {sample:?}"
        );
    }

    // The store: creates of 3 accounts and 10 transfers, and realtime gets, all timed.
    assert!(
        m.value(
            "store_requests_total",
            &[("op", "create"), ("outcome", "ok")]
        ) >= 13.0
    );
    assert!(m.value("store_requests_total", &[("op", "get"), ("outcome", "ok")]) > 0.0);
    assert!(
        m.value(
            "store_requests_total",
            &[("op", "replace"), ("outcome", "ok")]
        ) > 0.0
    );
    assert!(m.value("store_request_duration_seconds_count", &[("op", "get")]) > 0.0);
    let ops = [
        "get",
        "create",
        "replace",
        "find_stale",
        "list",
        "scan",
        "ready",
        "refresh",
    ];
    let outcomes = [
        "ok",
        "conflict",
        "exists",
        "not_found",
        "unavailable",
        "error",
    ];
    for sample in m.named("store_requests_total") {
        assert!(ops.contains(&sample.labels["op"].as_str()), "{sample:?}");
        assert!(
            outcomes.contains(&sample.labels["outcome"].as_str()),
            "{sample:?}"
        );
    }

    app.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Request ids and logs

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_propagated_or_generated_and_logged() {
    let app = spawn_app().await;

    let given = app
        .client
        .get(app.url("/healthz"))
        .header("x-request-id", "abc")
        .send()
        .await
        .expect("GET");
    assert_eq!(given.status(), 200);
    assert_eq!(given.headers()["x-request-id"], "abc");

    let mut generated = Vec::new();
    for _ in 0..2 {
        let response = app.get_text("/healthz").await;
        assert_eq!(response.status(), 200);
        let id = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        uuid::Uuid::parse_str(&id).unwrap_or_else(|e| panic!("generated id {id:?}: {e}"));
        generated.push(id);
    }
    assert_ne!(generated[0], generated[1], "each request gets its own id");

    // The generated id is the one the request's log lines carry.
    let line = response_line(&generated[0]).await;
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["message"], "request finished", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert!(line["latency_us"].is_u64(), "{line}");
    assert_eq!(line["span"]["method"], "GET", "{line}");
    assert_eq!(line["span"]["route"], "/healthz", "{line}");
    assert_eq!(line["span"]["request_id"], generated[0].as_str(), "{line}");

    // The route is the template, never the raw path.
    let response = app
        .client
        .get(app.url("/accounts/nobody-obs"))
        .header("x-request-id", "obs-template")
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), 404);
    let line = response_line("obs-template").await;
    assert_eq!(line["span"]["route"], "/accounts/{id}", "{line}");
    assert_eq!(line["status"], 404, "{line}");
    assert_eq!(line["level"], "INFO", "{line}");

    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_transfer_id_on_every_step() {
    let app = spawn_app().await;
    app.open_account("obs-log-a", 100).await;
    app.open_account("obs-log-b", 0).await;
    let response = app
        .client
        .post(app.url("/transfers"))
        .header("x-request-id", "obs-create-transfer")
        .json(&json!({"id": "obs-log-t", "from": "obs-log-a", "to": "obs-log-b", "amount": 7}))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 201);
    assert_eq!(app.settled("obs-log-t").await["state"], "finished");

    let steps = |lines: &[Value]| -> Vec<(String, String)> {
        lines
            .iter()
            .filter(|l| l["message"] == "state" && l["span"]["transfer_id"] == "obs-log-t")
            .map(|l| {
                (
                    l["from"].as_str().unwrap_or_default().to_owned(),
                    l["to"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    eventually("the three state lines of the transfer", || async move {
        steps(&log_lines()).len() == 3
    })
    .await;
    let lines = log_lines();
    assert_eq!(
        steps(&lines),
        [
            ("created", "pending"),
            ("pending", "committed"),
            ("committed", "finished")
        ]
        .map(|(f, t)| (f.to_owned(), t.to_owned()))
    );
    // Every line logged by the worker is in the transfer span, under the request that
    // created it.
    let worker_lines: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["transfer_id"] == "obs-log-t")
        .collect();
    assert!(worker_lines.len() >= 3);
    for line in &worker_lines {
        assert_eq!(line["span"]["name"], "transfer", "{line}");
        let spans = line["spans"].as_array().expect("a span list");
        // (Or, if this worker stalled past its lease, the recovery that took over.)
        let under_request = spans
            .iter()
            .any(|s| s["name"] == "request" && s["request_id"] == "obs-create-transfer");
        assert!(under_request || line["span"]["recovered"] == true, "{line}");
    }
    let created = response_line("obs-create-transfer").await;
    assert_eq!(created["span"]["route"], "/transfers", "{created}");
    assert_eq!(created["span"]["method"], "POST", "{created}");
    assert_eq!(created["status"], 201, "{created}");

    app.shutdown().await;
}

/// The ERROR lines logged inside a request's span.
fn error_lines(request_id: &str) -> Vec<Value> {
    lines_of_request(request_id)
        .into_iter()
        .filter(|l| l["level"] == "ERROR")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_internal_error_is_logged_once_with_its_detail() {
    let app = spawn_app().await;
    // An account document the service cannot read: a fault of ours, answered 500.
    app.engine
        .store()
        .create(
            Index::Accounts,
            "obs-corrupt",
            json!({"balance": "not a number"}),
        )
        .await
        .expect("store write");
    let response = app
        .client
        .get(app.url("/accounts/obs-corrupt"))
        .header("x-request-id", "obs-500")
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), 500);
    let body: Value = response.json().await.expect("problem");
    assert_eq!(body["type"], "/problems/internal", "{body}");

    let line = response_line("obs-500").await;
    assert_eq!(line["status"], 500, "{line}");
    let errors = error_lines("obs-500");
    assert_eq!(errors.len(), 1, "exactly one ERROR line: {errors:#?}");
    assert_eq!(errors[0]["message"], "internal error", "{:#}", errors[0]);
    assert!(errors[0]["detail"].is_string(), "{:#}", errors[0]);
    assert_eq!(
        errors[0]["span"]["route"], "/accounts/{id}",
        "{:#}",
        errors[0]
    );

    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_store_is_logged_once_per_request() {
    // A "cluster" that accepts connections and closes them at once.
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    let dead_task = tokio::spawn(async move {
        while let Ok((stream, _)) = dead.accept().await {
            drop(stream);
        }
    });
    let app = spawn_app_with(|config| config.elasticsearch_url = Some(dead_url)).await;

    for (path, request_id) in [
        ("/accounts/obs-any", "obs-503-account"),
        ("/readyz", "obs-503-ready"),
    ] {
        let response = app
            .client
            .get(app.url(path))
            .header("x-request-id", request_id)
            .send()
            .await
            .expect("GET");
        assert_eq!(response.status(), 503, "{path}");
        let line = response_line(request_id).await;
        assert_eq!(line["level"], "ERROR", "{line}");
        assert_eq!(line["status"], 503, "{line}");
        let errors = error_lines(request_id);
        assert_eq!(errors.len(), 1, "exactly one ERROR line: {errors:#?}");
    }
    let m = app.scrape().await;
    assert!(
        m.value(
            "store_requests_total",
            &[("op", "get"), ("outcome", "unavailable")]
        ) >= 1.0
    );
    assert_eq!(
        m.value(
            "http_requests_total",
            &[("method", "GET"), ("route", "/readyz"), ("status", "503")]
        ),
        1.0
    );

    app.shutdown().await;
    dead_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_off_by_the_timeout_is_counted_and_logged_once() {
    // The service's router with a 300 ms request timeout instead of 45 s: same layers, same
    // order, served like the application serves it.
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config::for_tests(dir.path().join("data"));
    let metrics = Metrics::new();
    let store = open_store(&config, &metrics, Migrations::Apply)
        .await
        .expect("open store");
    let engine = Engine::new(store, EngineConfig::from_config(&config), metrics.clone());
    let router = http::router_with_timeout(
        AppState {
            engine: engine.clone(),
            metrics,
        },
        Duration::from_millis(300),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let app = App {
        base,
        client: reqwest::Client::new(),
        engine,
        server,
        _dir: dir,
    };

    // A pending transfer whose (live) worker is elsewhere: a long-poll on it waits its whole
    // `wait`, longer than the timeout.
    let now = SystemClock.wall_millis();
    app.engine
        .store()
        .create(
            Index::Transactions,
            "obs-held",
            json!({
                "transaction_id": "obs-held", "src_acct": "a", "dest_acct": "b", "amount": 1,
                "transaction_state": "pending",
                "creation_time": format_millis(now), "modification_time": format_millis(now),
                "lease_owner": "a-live-worker", "lease_expires_at": format_millis(now + 60_000),
            }),
        )
        .await
        .expect("store write");
    let started = Instant::now();
    let response = app
        .client
        .get(app.url("/transfers/obs-held?wait=10s"))
        .header("x-request-id", "obs-timeout")
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), 503);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered by the timeout, not the wait: {:?}",
        started.elapsed()
    );
    assert_eq!(response.headers()["x-request-id"], "obs-timeout");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = response.json().await.expect("problem");
    assert_eq!(problem["type"], "/problems/timeout", "{problem}");
    assert_eq!(problem["status"], 503, "{problem}");

    // Counted, by its route template, with its status.
    let m = app.scrape().await;
    assert_eq!(
        m.value(
            "http_requests_total",
            &[
                ("method", "GET"),
                ("route", "/transfers/{id}"),
                ("status", "503")
            ]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "http_request_duration_seconds_count",
            &[("method", "GET"), ("route", "/transfers/{id}")]
        ),
        1.0
    );

    // Logged: one response line, at ERROR, and no other ERROR line.
    let line = response_line("obs-timeout").await;
    assert_eq!(line["level"], "ERROR", "{line}");
    assert_eq!(line["message"], "request failed", "{line}");
    assert_eq!(line["status"], 503, "{line}");
    assert_eq!(line["span"]["route"], "/transfers/{id}", "{line}");
    let errors = error_lines("obs-timeout");
    assert_eq!(errors.len(), 1, "exactly one ERROR line: {errors:#?}");

    app.engine.shut_down();
    app.server.abort();
}

// ---------------------------------------------------------------------------------------------
// OpenAPI and Swagger UI

const COMMITTED_OPENAPI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");

fn committed_openapi() -> String {
    std::fs::read_to_string(COMMITTED_OPENAPI).unwrap_or_else(|e| {
        panic!(
            "cannot read {COMMITTED_OPENAPI} ({e}); create it with: {}",
            openapi::REGENERATE_COMMAND
        )
    })
}

/// Panics, naming the first differing line and the command that regenerates the file.
fn assert_same_document(what: &str, actual: &str, committed: &str) {
    if actual == committed {
        return;
    }
    let line = actual
        .lines()
        .zip(committed.lines())
        .position(|(a, c)| a != c)
        .unwrap_or_else(|| actual.lines().count().min(committed.lines().count()));
    panic!(
        "{what} differs from the committed openapi/openapi.json (first at line {}:\n  \
         committed: {:?}\n  now:       {:?}).\n\
         Regenerate it with:\n\n    {}\n",
        line + 1,
        committed.lines().nth(line).unwrap_or("<end of file>"),
        actual.lines().nth(line).unwrap_or("<end of file>"),
        openapi::REGENERATE_COMMAND,
    );
}

#[test]
fn the_generated_openapi_document_is_the_committed_one() {
    assert_same_document(
        "the OpenAPI document generated from the code",
        &openapi::document_json(),
        &committed_openapi(),
    );
}

#[test]
fn the_openapi_command_prints_the_committed_document() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_transfer-service"))
        .arg("openapi")
        .env_remove("RUST_LOG")
        .output()
        .expect("run transfer-service openapi");
    assert!(output.status.success(), "{output:?}");
    assert_same_document(
        "the output of `transfer-service openapi`",
        &String::from_utf8(output.stdout).expect("UTF-8"),
        &committed_openapi(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_openapi_document_is_the_committed_one() {
    let app = spawn_app().await;
    let (status, served) = app.get("/openapi.json").await;
    assert_eq!(status, 200);
    assert!(
        served["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1.")),
        "{}",
        served["openapi"]
    );
    let committed: Value = serde_json::from_str(&committed_openapi()).expect("JSON");
    if served != committed {
        let served = serde_json::to_string_pretty(&served).unwrap() + "\n";
        let committed = serde_json::to_string_pretty(&committed).unwrap() + "\n";
        assert_same_document("the document served at /openapi.json", &served, &committed);
    }
    // Every route of the API is documented.
    for path in [
        "/accounts",
        "/accounts/{id}",
        "/transfers",
        "/transfers/{id}",
        "/transfers/{id}/cancel",
        "/healthz",
        "/readyz",
        "/metrics",
    ] {
        assert!(
            served["paths"][path].is_object(),
            "{path} is not documented"
        );
    }
    app.shutdown().await;
}

/// The `src` of every `<script>` and `href` of every `<link>` of an HTML page.
fn page_assets(html: &str) -> Vec<String> {
    let mut assets = Vec::new();
    for attribute in ["src=\"", "href=\""] {
        let mut rest = html;
        while let Some(start) = rest.find(attribute) {
            rest = &rest[start + attribute.len()..];
            let end = rest.find('"').expect("closed attribute");
            assets.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    assets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swagger_ui_is_served_from_the_binary() {
    let app = spawn_app().await;
    let page = app.get_text("/docs/").await;
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let html = page.text().await.expect("page");
    assert!(html.contains("swagger-ui"), "{html}");

    // Every asset of the page is served by us (no CDN), and answers.
    let assets = page_assets(&html);
    assert!(
        assets.iter().any(|a| a.ends_with(".js")),
        "no script on the page: {html}"
    );
    for asset in &assets {
        assert!(
            !asset.contains("://") && !asset.starts_with("//"),
            "the page loads {asset} from the network"
        );
        let path = format!("/docs/{}", asset.trim_start_matches("./"));
        let response = app.get_text(&path).await;
        assert_eq!(response.status(), 200, "{path}");
        let body = response.bytes().await.expect("asset");
        assert!(!body.is_empty(), "{path} is empty");
    }
    let bundle = app.get_text("/docs/swagger-ui-bundle.js").await;
    assert_eq!(bundle.status(), 200);
    assert!(bundle.headers()["content-type"]
        .to_str()
        .unwrap()
        .contains("javascript"));
    assert!(bundle.bytes().await.unwrap().len() > 100_000);

    // The page is pointed at our document.
    let initializer = app.get_text("/docs/swagger-initializer.js").await;
    assert_eq!(initializer.status(), 200);
    assert!(initializer.text().await.unwrap().contains("/openapi.json"));

    app.shutdown().await;
}
