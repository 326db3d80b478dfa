//! Observability: `/metrics` after real transfers, route labels, request ids, the log lines
//! (JSON, spans, exactly one error line per 5xx), the committed OpenAPI document, and the
//! Swagger UI served from the binary with no network.
//!
//! Every test starts the real application on port 0 with the embedded store in a temp dir
//! (the timeout test, the service's router with a short request timeout). Logs of every app
//! in this binary go, as JSON, to one in-memory buffer; each test finds its own lines by
//! request id or transfer id.

use std::time::{Duration, Instant};
use transfer_service::time::format_millis;

use serde_json::{json, Value};
use transfer_service::http::error::UNAVAILABLE_DETAIL;
use transfer_service::http::openapi;
use transfer_service::store::Index;
use transfer_service::transfer::clock::{Clock, SystemClock};

use crate::support::app::{header, Backend, TestApp};
use crate::support::metrics::Exposition;
use crate::support::routes::{self, ROUTES};
use crate::support::{logs, wait};

// ---------------------------------------------------------------------------------------------
// Metrics

#[test]
fn the_exposition_parser_reads_labels_escapes_and_special_values() {
    let text = "# HELP a_total Help.\n# TYPE a_total counter\n\
        a_total{x=\"1\",y=\"q\\\"uo\\\\te\\n\"} 3\n\
        # TYPE b gauge\nb 4.5 1700000000000\n\
        # TYPE c histogram\nc_bucket{le=\"0.5\"} 1\nc_bucket{le=\"+Inf\"} +Inf\n\
        c_sum 2\nc_count 3\n\
        # TYPE d untyped\nd{z=\"a,b}c\",} 0\n\
        # TYPE e gauge\ne{route=\"/accounts/{id}\"} NaN\n";
    let e = Exposition::parse(text);
    assert_eq!(e.types["a_total"], "counter");
    assert_eq!(e.types["c"], "histogram");
    assert_eq!(e.value("a_total", &[("x", "1"), ("y", "q\"uo\\te\n")]), 3.0);
    assert_eq!(e.value("b", &[]), 4.5);
    assert_eq!(e.value("c_bucket", &[("le", "+Inf")]), f64::INFINITY);
    assert_eq!(e.value("c_bucket", &[("le", "0.5")]), 1.0);
    assert_eq!((e.value("c_sum", &[]), e.value("c_count", &[])), (2.0, 3.0));
    assert_eq!(e.value("d", &[("z", "a,b}c")]), 0.0);
    assert!(e.value("e", &[("route", "/accounts/{id}")]).is_nan());
    assert_eq!(e.find("a_total", &[("x", "1")]), None);
}

#[test]
#[should_panic(expected = "is not the text format")]
fn the_exposition_parser_refuses_a_malformed_line() {
    Exposition::parse("# TYPE a counter\na{x=\"1\" 3\n");
}

/// Every series of `docs/design.md` §8 with its type.
const SERIES: &[(&str, &str)] = &[
    ("transfers_created_total", "counter"),
    ("transfers_completed_total", "counter"),
    ("transfer_state_transitions_total", "counter"),
    ("transfers_in_flight", "gauge"),
    ("transfers_admitted_in_flight", "gauge"),
    ("requests_shed_total", "counter"),
    ("transfer_duration_seconds", "histogram"),
    ("recovery_runs_total", "counter"),
    ("transfers_recovered_total", "counter"),
    ("store_requests_total", "counter"),
    ("store_request_duration_seconds", "histogram"),
    ("store_bytes_sent_total", "counter"),
    ("http_requests_total", "counter"),
    ("http_request_duration_seconds", "histogram"),
    ("api_keys_loaded", "gauge"),
    ("api_keys_reloads_total", "counter"),
];

case_on_backends!(metrics_count_every_transfer_transition_and_request:
    metrics_count_every_transfer_transition_and_request_on_the_embedded_store => Embedded,
    metrics_count_every_transfer_transition_and_request_on_elasticsearch => Emulator,
);

/// On the embedded store a transfer is settled in one store transaction: an overdraft goes
/// from `created` straight to `rolled-back` (nothing was applied anywhere). On Elasticsearch
/// the two-phase protocol rolls it back through `terminating`.
async fn metrics_count_every_transfer_transition_and_request(backend: Backend) {
    let one_transaction = matches!(backend, Backend::Embedded);
    let app = TestApp::spawn(backend).await;
    app.open_accounts([("alice", 1_000), ("bob", 0), ("carol", 5)])
        .await;

    // 7 transfers that must finish, 3 overdrafts that must roll back, whatever the order.
    const FINISHING: usize = 7;
    const OVERDRAFTS: usize = 3;
    let mut ids = Vec::new();
    for i in 0..FINISHING {
        let id = format!("ok-{i}");
        app.transfer_accepted(&id, "alice", "bob", 10).await;
        ids.push((id, "finished"));
    }
    for i in 0..OVERDRAFTS {
        let id = format!("overdraft-{i}");
        app.transfer_accepted(&id, "carol", "bob", 100).await;
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
    wait::eventually(
        "every transfer counted as completed, none in flight",
        || async move {
            let m = a.scrape().await;
            m.sum("transfers_completed_total") == 10.0
                && m.value("transfers_in_flight", &[]) == 0.0
                && m.value("transfers_admitted_in_flight", &[]) == 0.0
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
    assert_eq!(transition("pending", "committed"), finished);
    assert_eq!(transition("committed", "finished"), finished);
    if one_transaction {
        assert_eq!(transition("created", "pending"), finished);
        assert_eq!(transition("created", "rolled-back"), rolled_back);
        assert_eq!(transition("pending", "terminating"), 0.0);
    } else {
        assert_eq!(transition("created", "pending"), 10.0);
        assert_eq!(transition("pending", "terminating"), rolled_back);
        assert_eq!(transition("terminating", "rolled-back"), rolled_back);
        assert_eq!(transition("created", "rolled-back"), 0.0);
    }
    let arrows_taken = if one_transaction {
        3.0 * finished + rolled_back
    } else {
        10.0 + 2.0 * finished + 2.0 * rolled_back
    };
    assert_eq!(
        m.sum("transfer_state_transitions_total"),
        arrows_taken,
        "no other transition: {:#?}",
        m.named("transfer_state_transitions_total")
    );
    assert_eq!(m.value("transfers_in_flight", &[]), 0.0);
    assert_eq!(m.value("transfers_admitted_in_flight", &[]), 0.0);
    for route in ["/transfers", "/transfers/batch"] {
        assert_eq!(
            m.value("requests_shed_total", &[("route", route)]),
            0.0,
            "{route}"
        );
    }
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
            &[
                ("method", method),
                ("route", route),
                ("status", status),
                ("client", "anonymous"),
            ],
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
            &[
                ("method", "POST"),
                ("route", "/transfers"),
                ("status", "201")
            ]
        ),
        10.0
    );
    let templates = routes::templates();
    for sample in m
        .samples
        .iter()
        .filter(|s| s.name.starts_with("http_request"))
    {
        let route = sample.labels["route"].as_str();
        assert!(
            (templates.contains(&route) || route == "unmatched"),
            "raw path as a label: {sample:?}"
        );
    }

    // The store: creates of 3 accounts and 10 transfers (on the embedded store, each transfer
    // created in its one transaction), and realtime gets, all timed.
    let creates = if one_transaction { 3.0 } else { 13.0 };
    assert!(m.store_requests("create", "ok") >= creates);
    assert!(m.store_requests("get", "ok") > 0.0);
    // Each transfer settled in one transaction, or by conditional replaces.
    let (settling, settled_by) = if one_transaction {
        ("transact", 10.0)
    } else {
        ("replace", 1.0)
    };
    assert!(m.store_requests(settling, "ok") >= settled_by);
    assert!(m.value("store_request_duration_seconds_count", &[("op", "get")]) > 0.0);
    let ops = [
        "get",
        "create",
        "replace",
        "transact",
        "find_stale",
        "list",
        "scan",
        "ready",
        "refresh",
        "vouch",
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
    let app = TestApp::spawn(Backend::Embedded).await;

    let given = app.get_with_header("/healthz", "x-request-id", "abc").await;
    assert_eq!(given.status(), 200);
    assert_eq!(given.headers()["x-request-id"], "abc");

    let mut generated = Vec::new();
    for _ in 0..2 {
        let response = app.get_response("/healthz").await;
        assert_eq!(response.status(), 200);
        let id = header(&response, "x-request-id");
        uuid::Uuid::parse_str(&id).unwrap_or_else(|e| panic!("generated id {id:?}: {e}"));
        generated.push(id);
    }
    assert_ne!(generated[0], generated[1], "each request gets its own id");

    // The generated id is the one the request's log lines carry.
    let line = logs::response_line(&generated[0]).await;
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["message"], "request finished", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert!(line["latency_us"].is_u64(), "{line}");
    assert_eq!(line["span"]["method"], "GET", "{line}");
    assert_eq!(line["span"]["route"], "/healthz", "{line}");
    assert_eq!(line["span"]["request_id"], generated[0].as_str(), "{line}");
    assert_eq!(line["span"]["client"], "anonymous", "{line}");

    // The route is the template, never the raw path.
    let response = app
        .get_with_header("/accounts/nobody-obs", "x-request-id", "obs-template")
        .await;
    assert_eq!(response.status(), 404);
    let line = logs::response_line("obs-template").await;
    assert_eq!(line["span"]["route"], "/accounts/{id}", "{line}");
    assert_eq!(line["status"], 404, "{line}");
    assert_eq!(line["level"], "INFO", "{line}");

    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_transfer_id_on_every_step() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.open_accounts([("obs-log-a", 100), ("obs-log-b", 0)])
        .await;
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
    wait::eventually("the three state lines of the transfer", || async move {
        steps(&logs::lines()).len() == 3
    })
    .await;
    let lines = logs::lines();
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
    let created = logs::response_line("obs-create-transfer").await;
    assert_eq!(created["span"]["route"], "/transfers", "{created}");
    assert_eq!(created["span"]["method"], "POST", "{created}");
    assert_eq!(created["status"], 201, "{created}");

    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_internal_error_is_logged_once_with_its_detail() {
    let app = TestApp::spawn(Backend::Embedded).await;
    // An account document the service cannot read: a fault of ours, answered 500.
    app.store()
        .create(
            Index::Accounts,
            "obs-corrupt",
            json!({"balance": "not a number"}).into(),
        )
        .await
        .expect("store write");
    let response = app
        .get_with_header("/accounts/obs-corrupt", "x-request-id", "obs-500")
        .await;
    assert_eq!(response.status(), 500);
    let body: Value = response.json().await.expect("problem");
    assert_eq!(body["type"], "/problems/internal", "{body}");

    let line = logs::response_line("obs-500").await;
    assert_eq!(line["status"], 500, "{line}");
    let errors = logs::errors_of_request("obs-500");
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
    let dead_addr = dead.local_addr().unwrap().to_string();
    let dead_url = format!("http://{dead_addr}");
    let dead_task = tokio::spawn(async move {
        while let Ok((stream, _)) = dead.accept().await {
            drop(stream);
        }
    });
    let app = TestApp::start(Backend::Embedded, |config| {
        config.elasticsearch_url = Some(dead_url)
    })
    .await;

    for (path, request_id) in [
        ("/accounts/obs-any", "obs-503-account"),
        ("/readyz", "obs-503-ready"),
    ] {
        let response = app.get_with_header(path, "x-request-id", request_id).await;
        assert_eq!(response.status(), 503, "{path}");
        let line = logs::response_line(request_id).await;
        assert_eq!(line["level"], "ERROR", "{line}");
        assert_eq!(line["status"], 503, "{line}");
        let errors = logs::errors_of_request(request_id);
        assert_eq!(errors.len(), 1, "exactly one ERROR line: {errors:#?}");
    }

    // The problem says to retry; the store's error text (which names the cluster's address)
    // is logged once at WARN inside the request span, never sent.
    let response = app
        .get_with_header("/accounts/obs-any", "x-request-id", "obs-503-detail")
        .await;
    assert_eq!(response.status(), 503);
    let body = response.text().await.expect("body");
    let problem: Value = serde_json::from_str(&body).expect("problem+json");
    assert_eq!(problem["type"], "/problems/store-unavailable", "{problem}");
    assert_eq!(problem["detail"], UNAVAILABLE_DETAIL, "{problem}");
    for internal in [dead_addr.as_str(), "get:", "error sending request"] {
        assert!(!body.contains(internal), "{internal:?} leaked: {body}");
    }
    logs::response_line("obs-503-detail").await;
    let warnings: Vec<Value> = logs::of_request("obs-503-detail")
        .into_iter()
        .filter(|l| l["level"] == "WARN" && l["message"] == "store unavailable")
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one WARN with the store error: {warnings:#?}"
    );
    let store_error = warnings[0]["store_error"].as_str().unwrap_or_default();
    assert!(store_error.contains(&dead_addr), "{:#}", warnings[0]);
    let m = app.scrape().await;
    assert!(m.store_requests("get", "unavailable") >= 1.0);
    assert_eq!(
        m.value(
            "http_requests_total",
            &[
                ("method", "GET"),
                ("route", "/readyz"),
                ("status", "503"),
                ("client", "anonymous")
            ]
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
    let app = TestApp::spawn_with_request_timeout(Duration::from_millis(300)).await;

    // A pending transfer whose (live) worker is elsewhere: a long-poll on it waits its whole
    // `wait`, longer than the timeout.
    let now = SystemClock.wall_millis();
    app.store()
        .create(
            Index::Transactions,
            "obs-held",
            json!({
                "transaction_id": "obs-held", "src_acct": "a", "dest_acct": "b", "amount": 1,
                "transaction_state": "pending",
                "creation_time": format_millis(now), "modification_time": format_millis(now),
                "lease_owner": "a-live-worker", "lease_expires_at": format_millis(now + 60_000),
            })
            .into(),
        )
        .await
        .expect("store write");
    let started = Instant::now();
    let response = app
        .get_with_header(
            "/transfers/obs-held?wait=10s",
            "x-request-id",
            "obs-timeout",
        )
        .await;
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
                ("status", "503"),
                ("client", "anonymous")
            ]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "http_request_duration_seconds_count",
            &[
                ("method", "GET"),
                ("route", "/transfers/{id}"),
                ("status", "503")
            ]
        ),
        1.0
    );

    // Logged: one response line, at ERROR, and no other ERROR line.
    let line = logs::response_line("obs-timeout").await;
    assert_eq!(line["level"], "ERROR", "{line}");
    assert_eq!(line["message"], "request failed", "{line}");
    assert_eq!(line["status"], 503, "{line}");
    assert_eq!(line["span"]["route"], "/transfers/{id}", "{line}");
    let errors = logs::errors_of_request("obs-timeout");
    assert_eq!(errors.len(), 1, "exactly one ERROR line: {errors:#?}");

    app.abort();
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
    let app = TestApp::spawn(Backend::Embedded).await;
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
    // Every route of the API is documented, and every operation documented is a route.
    for route in ROUTES.iter().filter(|r| r.documented) {
        let method = route.method.to_ascii_lowercase();
        assert!(
            served["paths"][route.template][&method].is_object(),
            "{} {} is not documented",
            route.method,
            route.template
        );
    }
    for (path, operations) in served["paths"].as_object().expect("paths") {
        for method in operations.as_object().expect("operations").keys() {
            assert!(
                ROUTES.iter().any(|r| r.documented
                    && r.template == path
                    && r.method.eq_ignore_ascii_case(method)),
                "{method} {path} is documented but not in tests/support/routes.rs"
            );
        }
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
    let app = TestApp::spawn(Backend::Embedded).await;
    let page = app.get_response("/docs/").await;
    assert_eq!(page.status(), 200);
    assert!(header(&page, "content-type").starts_with("text/html"));
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
        let response = app.get_response(&path).await;
        assert_eq!(response.status(), 200, "{path}");
        let body = response.bytes().await.expect("asset");
        assert!(!body.is_empty(), "{path} is empty");
    }
    let bundle = app.get_response("/docs/swagger-ui-bundle.js").await;
    assert_eq!(bundle.status(), 200);
    assert!(header(&bundle, "content-type").contains("javascript"));
    assert!(bundle.bytes().await.unwrap().len() > 100_000);

    // The page is pointed at our document.
    let initializer = app.get_response("/docs/swagger-initializer.js").await;
    assert_eq!(initializer.status(), 200);
    assert!(initializer.text().await.unwrap().contains("/openapi.json"));

    app.shutdown().await;
}
