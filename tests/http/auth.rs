//! API keys: the whole matrix (no key, another scheme, an unknown key, a key without the
//! scope, keys with it, a key revoked by a reload) on every protected route of
//! `support::routes`, the open routes, `/metrics` with `METRICS_REQUIRE_AUTH`, a bad file on
//! reload, the `client` label and span field, and keys never reaching the log.
//!
//! Each app runs on the embedded store with an `API_KEYS_FILE` of its own, checked for
//! changes every 100 ms (the SIGHUP reload is tested on a real process in `tests/process.rs`).

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::support::app::{header, Backend, TestApp};
use crate::support::keys::{Key, KeyFile};
use crate::support::metrics::Exposition;
use crate::support::routes::{self, Access, Route};
use crate::support::{logs, wait};

const ADMIN: Key = Key {
    name: "admin",
    secret: "auth-suite-admin-Zk3q9",
    scopes: "read,write",
};
const READER: Key = Key {
    name: "reader",
    secret: "auth-suite-reader-Pw81x",
    scopes: "read",
};
const WRITER: Key = Key {
    name: "writer",
    secret: "auth-suite-writer-Hy26m",
    scopes: "write",
};
/// `billing`'s key before rotation...
const BILLING_OLD: Key = Key {
    name: "billing",
    secret: "auth-suite-billing-old-Qe5t",
    scopes: "read,write",
};
/// ...and after.
const BILLING_NEW: Key = Key {
    name: "billing",
    secret: "auth-suite-billing-new-Vb7n",
    scopes: "read,write",
};
/// Configured nowhere.
const UNKNOWN_SECRET: &str = "auth-suite-unknown-Lm40c";

const EVERY_SECRET: [&str; 6] = [
    ADMIN.secret,
    READER.secret,
    WRITER.secret,
    BILLING_OLD.secret,
    BILLING_NEW.secret,
    UNKNOWN_SECRET,
];

/// The accounts and the transfer every authorized request can find.
async fn seed(app: &TestApp) {
    for (id, balance) in [("auth-a", 1_000), ("auth-b", 0)] {
        let body = json!({"id": id, "balance": balance});
        let response = app
            .send("POST", "/accounts", Some(ADMIN.secret), Some(&body), "seed")
            .await;
        assert_eq!(response.status(), 201);
    }
    let body = json!({"id": "auth-t", "from": "auth-a", "to": "auth-b", "amount": 1});
    let response = app
        .send(
            "POST",
            "/transfers",
            Some(ADMIN.secret),
            Some(&body),
            "seed",
        )
        .await;
    assert_eq!(response.status(), 201);
}

/// A request on `route` (ids made with `tag`, so a refused write can be looked for
/// afterwards), and the statuses its handler answers once authorized.
fn request_on(route: &Route, tag: &str) -> (String, Option<Value>, &'static [u16]) {
    let transfer = |id: String| json!({"id": id, "from": "auth-a", "to": "auth-b", "amount": 1});
    match (route.method, route.template) {
        ("POST", "/accounts") => (
            "/accounts".into(),
            Some(json!({"id": format!("acct-{tag}"), "balance": 0})),
            &[201, 200],
        ),
        ("GET", "/accounts/{id}") => ("/accounts/auth-a".into(), None, &[200]),
        ("GET", "/accounts/{id}/entries") => ("/accounts/auth-a/entries".into(), None, &[200]),
        ("GET", "/accounts/{id}/balance") => (
            "/accounts/auth-a/balance?at=2100-01-01T00:00:00Z".into(),
            None,
            &[200],
        ),
        ("POST", "/transfers") => (
            "/transfers".into(),
            Some(transfer(format!("one-{tag}"))),
            &[201, 200],
        ),
        ("GET", "/transfers") => ("/transfers?account=auth-a".into(), None, &[200]),
        ("POST", "/transfers/batch") => (
            "/transfers/batch".into(),
            Some(json!({"transfers": [transfer(format!("batch-{tag}"))]})),
            &[200],
        ),
        // No transfer is named `batch`: the handler's 404.
        ("GET", "/transfers/batch") => ("/transfers/batch".into(), None, &[404]),
        ("GET", "/transfers/{id}") => ("/transfers/auth-t".into(), None, &[200]),
        // No such transfer: the handler's 404 (a cancel of `auth-t` would change it).
        ("POST", "/transfers/{id}/cancel") => ("/transfers/auth-none/cancel".into(), None, &[404]),
        // Likewise for a capture.
        ("POST", "/transfers/{id}/capture") => {
            ("/transfers/auth-none/capture".into(), None, &[404])
        }
        ("GET", "/events") => ("/events?limit=1".into(), None, &[200]),
        (method, template) => {
            panic!("no request for {method} {template} in the auth suite: add one to `request_on`")
        }
    }
}

/// The scope a protected route needs, as the challenge names it.
fn scope_of(route: &Route) -> &'static str {
    match route.access {
        Access::Read => "read",
        Access::Write => "write",
        Access::Open => unreachable!("an open route"),
    }
}

/// Sends the request of `route` with `key` (none: no header) and returns the status, the
/// `WWW-Authenticate` header and the body.
async fn attempt(
    app: &TestApp,
    route: &Route,
    key: Option<&str>,
    tag: &str,
    request_id: &str,
) -> (u16, String, Value) {
    let (path, body, _) = request_on(route, tag);
    let response = app
        .send(route.method, &path, key, body.as_ref(), request_id)
        .await;
    let status = response.status().as_u16();
    let challenge = header(&response, "www-authenticate");
    let content_type = header(&response, "content-type");
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status == 401 || status == 403 {
        assert_eq!(content_type, "application/problem+json", "{body}");
    }
    (status, challenge, body)
}

/// Every protected route refuses a request without a key, with another scheme or with an
/// unknown key (401), and with a key that lacks the scope (403); nothing is written.
async fn assert_refused_everywhere(app: &TestApp, revoked: &[&str]) {
    for route in routes::protected() {
        let what = format!("{} {}", route.method, route.template);

        let (status, challenge, body) = attempt(app, route, None, "refused", "auth-none").await;
        assert_eq!(status, 401, "{what} without a key: {body}");
        assert_eq!(challenge, r#"Bearer realm="transfer-service""#, "{what}");
        assert_eq!(body["type"], "/problems/unauthorized", "{what}: {body}");

        let (path, body, _) = request_on(route, "refused");
        let mut request = app
            .client
            .request(route.method.parse().unwrap(), app.url(&path))
            .basic_auth("admin", Some(ADMIN.secret));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "{what} with Basic");
        assert!(header(&response, "www-authenticate").starts_with("Bearer "));

        for secret in revoked.iter().chain([&UNKNOWN_SECRET]) {
            let (status, challenge, body) =
                attempt(app, route, Some(secret), "refused", "auth-unknown").await;
            assert_eq!(status, 401, "{what} with {secret}: {body}");
            assert!(
                challenge.starts_with(r#"Bearer realm="transfer-service", error="invalid_token""#),
                "{what}: {challenge}"
            );
            assert_eq!(body["type"], "/problems/unauthorized", "{what}: {body}");
        }

        let lacking = if route.access == Access::Read {
            WRITER
        } else {
            READER
        };
        let (status, challenge, body) =
            attempt(app, route, Some(lacking.secret), "refused", "auth-scope").await;
        assert_eq!(status, 403, "{what} with the {} key: {body}", lacking.name);
        assert_eq!(
            challenge,
            format!(
                r#"Bearer realm="transfer-service", error="insufficient_scope", scope="{}""#,
                scope_of(route)
            ),
            "{what}"
        );
        assert_eq!(body["type"], "/problems/forbidden", "{what}: {body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(lacking.name), "{detail}");
        assert!(detail.contains(scope_of(route)), "{detail}");
    }
}

/// Every protected route answers (its handler's status) each of `keys` whose scopes allow it.
async fn assert_allowed_everywhere(app: &TestApp, keys: &[Key]) {
    for route in routes::protected() {
        for key in keys {
            if !key.scopes.contains(scope_of(route)) {
                continue;
            }
            let tag = format!("ok-{}", key.name);
            let (_, _, expected) = request_on(route, &tag);
            let (status, _, body) =
                attempt(app, route, Some(key.secret), &tag, "auth-allowed").await;
            assert!(
                expected.contains(&status),
                "{} {} with the {} key: {status} {body}",
                route.method,
                route.template,
                key.name
            );
        }
    }
}

/// Nothing a refused request asked for was written.
async fn assert_nothing_refused_was_written(app: &TestApp) {
    for path in [
        "/accounts/acct-refused",
        "/transfers/one-refused",
        "/transfers/batch-refused",
    ] {
        let response = app
            .send("GET", path, Some(ADMIN.secret), None, "check")
            .await;
        assert_eq!(response.status(), 404, "{path} was written");
    }
}

/// Every log line so far, as text.
fn log_text() -> String {
    logs::lines()
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protected_route_needs_a_key_with_its_scope_and_a_revoked_key_is_refused() {
    let file = KeyFile::new(&[ADMIN, READER, WRITER, BILLING_OLD]);
    let path = file.path().to_owned();
    let app = TestApp::spawn_with(Backend::Embedded, |config| {
        config.api_keys_file = Some(path);
    })
    .await;
    seed(&app).await;

    assert_refused_everywhere(&app, &[]).await;
    assert_nothing_refused_was_written(&app).await;
    assert_allowed_everywhere(&app, &[ADMIN, READER, WRITER, BILLING_OLD]).await;

    // Rotation: billing's new key replaces the old one; the file is reloaded on its change.
    file.replace(&[ADMIN, READER, WRITER, BILLING_NEW]);
    wait::eventually("the new key to be in force", || async {
        app.send(
            "GET",
            "/transfers",
            Some(BILLING_NEW.secret),
            None,
            "rotate",
        )
        .await
        .status()
            == 200
    })
    .await;
    assert_refused_everywhere(&app, &[BILLING_OLD.secret]).await;
    assert_allowed_everywhere(&app, &[ADMIN, READER, WRITER, BILLING_NEW]).await;
    assert_nothing_refused_was_written(&app).await;

    let m = app.scrape().await;
    assert_eq!(m.value("api_keys_reloads_total", &[("outcome", "ok")]), 1.0);
    assert_eq!(
        m.value("api_keys_reloads_total", &[("outcome", "error")]),
        0.0
    );
    assert_eq!(m.value("api_keys_loaded", &[]), 4.0);

    // `client` is bounded: the keys' names and the two reserved ones, nothing else.
    let clients: BTreeSet<String> = m
        .named("http_requests_total")
        .iter()
        .map(|s| s.labels["client"].clone())
        .collect();
    let expected: BTreeSet<String> = [
        "admin",
        "reader",
        "writer",
        "billing",
        "anonymous",
        "unauthenticated",
    ]
    .map(String::from)
    .into();
    assert_eq!(clients, expected);
    let http = |method: &str, route: &str, status: &str, client: &str| {
        m.find(
            "http_requests_total",
            &[
                ("method", method),
                ("route", route),
                ("status", status),
                ("client", client),
            ],
        )
        .unwrap_or(0.0)
    };
    // Per route: no key, Basic, the unknown key (twice: before and after the rotation) and
    // the revoked key, all 401; the reader's writes, 403 (twice).
    assert_eq!(http("POST", "/transfers", "401", "unauthenticated"), 7.0);
    assert_eq!(http("POST", "/transfers", "403", "reader"), 2.0);
    assert_eq!(http("GET", "/accounts/{id}", "403", "writer"), 2.0);
    assert_eq!(http("GET", "/accounts/{id}", "200", "billing"), 2.0);
    assert_eq!(http("GET", "/metrics", "200", "anonymous"), 0.0);

    // No key ever reached the log.
    let text = log_text();
    for secret in EVERY_SECRET {
        assert!(!text.contains(secret), "{secret} was logged");
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_name_is_on_the_request_span() {
    let file = KeyFile::new(&[READER]);
    let path = file.path().to_owned();
    let app = TestApp::spawn_with(Backend::Embedded, |config| {
        config.api_keys_file = Some(path);
    })
    .await;
    for (key, request_id, status, client) in [
        (Some(READER.secret), "auth-span-reader", 404, "reader"),
        (
            Some(UNKNOWN_SECRET),
            "auth-span-unknown",
            401,
            "unauthenticated",
        ),
        (None, "auth-span-none", 401, "unauthenticated"),
    ] {
        let response = app
            .send("GET", "/accounts/nobody", key, None, request_id)
            .await;
        assert_eq!(response.status(), status, "{request_id}");
        let line = logs::response_line(request_id).await;
        assert_eq!(line["span"]["client"], client, "{line}");
        assert_eq!(line["status"], status, "{line}");
        assert_eq!(line["level"], "INFO", "{line}");
    }
    // An open route is anonymous, key or not.
    let response = app
        .send("GET", "/livez", Some(READER.secret), None, "auth-span-open")
        .await;
    assert_eq!(response.status(), 200);
    let line = logs::response_line("auth-span-open").await;
    assert_eq!(line["span"]["client"], "anonymous", "{line}");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_metrics_and_the_openapi_document_stay_open() {
    let file = KeyFile::new(&[READER]);
    let path = file.path().to_owned();
    let app = TestApp::spawn_with(Backend::Embedded, |config| {
        config.api_keys_file = Some(path);
    })
    .await;
    for route in routes::ROUTES.iter().filter(|r| r.access == Access::Open) {
        let response = app
            .send(route.method, route.template, None, None, "auth-open")
            .await;
        assert_eq!(response.status(), 200, "{}", route.template);
    }
    for path in ["/openapi.json", "/docs/"] {
        assert_eq!(app.status(path).await, 200, "{path}");
    }
    // Unknown paths outside the API are a plain 404, not a challenge.
    assert_eq!(app.status("/no/such/path").await, 404);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_read_key_when_metrics_require_auth() {
    let file = KeyFile::new(&[READER, WRITER]);
    let path = file.path().to_owned();
    let app = TestApp::spawn_with(Backend::Embedded, |config| {
        config.api_keys_file = Some(path);
        config.metrics_require_auth = true;
    })
    .await;
    let metrics = |key| app.send("GET", "/metrics", key, None, "auth-metrics");
    let refused = metrics(None).await;
    assert_eq!(refused.status(), 401);
    assert_eq!(
        refused.headers()["www-authenticate"],
        r#"Bearer realm="transfer-service""#
    );
    assert_eq!(metrics(Some(UNKNOWN_SECRET)).await.status(), 401);
    assert_eq!(metrics(Some(WRITER.secret)).await.status(), 403);
    let allowed = metrics(Some(READER.secret)).await;
    assert_eq!(allowed.status(), 200);
    let exposition = Exposition::parse(&allowed.text().await.unwrap());
    let refused_writer = exposition.value(
        "http_requests_total",
        &[
            ("method", "GET"),
            ("route", "/metrics"),
            ("status", "403"),
            ("client", "writer"),
        ],
    );
    assert_eq!(refused_writer, 1.0);
    // The probes stay open.
    for path in ["/livez", "/healthz", "/readyz"] {
        assert_eq!(app.status(path).await, 200, "{path}");
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_on_reload_keeps_the_keys_in_force() {
    let file = KeyFile::new(&[READER]);
    let path = file.path().to_owned();
    let app = TestApp::spawn_with(Backend::Embedded, |config| {
        config.api_keys_file = Some(path.clone());
    })
    .await;
    // The operator pasted a key where its digest belongs.
    let pasted = "auth-suite-pasted-secret-Rr93";
    file.replace_text(&format!("reader {pasted} read\n"));
    reloads_reach(&app, "error", 1.0, "the failed reload to be counted").await;
    assert_eq!(
        read_as(&app, Some(READER.secret), "auth-kept").await,
        404,
        "the reader's key is still in force"
    );
    let m = app.scrape().await;
    assert_eq!(m.value("api_keys_loaded", &[]), 1.0);
    assert_eq!(m.value("api_keys_reloads_total", &[("outcome", "ok")]), 0.0);

    // Logged once at ERROR, naming the file and the line, never quoting it.
    let path_text = path.display().to_string();
    let errors: Vec<Value> = logs::lines()
        .into_iter()
        .filter(|l| {
            l["level"] == "ERROR" && l["error"].as_str().is_some_and(|e| e.contains(&path_text))
        })
        .collect();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let error = errors[0]["error"].as_str().unwrap();
    assert!(error.contains("line 1"), "{error}");
    assert!(!log_text().contains(pasted), "the pasted key was logged");

    // Fixed: reloaded.
    file.replace(&[WRITER]);
    reloads_reach(&app, "ok", 1.0, "the fixed file to be reloaded").await;
    assert_eq!(read_as(&app, Some(READER.secret), "auth-gone").await, 401);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_with_no_key_refuses_every_api_request() {
    let file = KeyFile::new(&[]);
    let path = file.path().to_owned();
    let app = TestApp::spawn_with(Backend::Embedded, |config| {
        config.api_keys_file = Some(path);
    })
    .await;
    for route in routes::protected() {
        let (status, _, body) =
            attempt(&app, route, Some(READER.secret), "empty", "auth-empty").await;
        assert_eq!(status, 401, "{} {}: {body}", route.method, route.template);
    }
    assert_eq!(app.status("/readyz").await, 200);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_does_not_start_on_a_bad_key_file_or_metrics_auth_without_keys() {
    let file = KeyFile::new(&[READER]);
    file.replace_text("reader 1234 read\n");
    let path = file.path().to_owned();
    let error = TestApp::start_error(|config| config.api_keys_file = Some(path)).await;
    assert!(error.contains("line 1"), "{error}");
    assert!(error.contains("64 hexadecimal digits"), "{error}");

    let missing = file.path().with_extension("missing");
    let error = TestApp::start_error(|config| config.api_keys_file = Some(missing)).await;
    assert!(error.contains("cannot read API_KEYS_FILE"), "{error}");

    let error = TestApp::start_error(|config| config.metrics_require_auth = true).await;
    assert!(
        error.contains("METRICS_REQUIRE_AUTH needs API_KEYS_FILE"),
        "{error}"
    );
}

/// Waits until `api_keys_reloads_total{outcome}` reaches `count`.
async fn reloads_reach(app: &TestApp, outcome: &str, count: f64, what: &str) {
    wait::eventually(what, || async {
        app.scrape()
            .await
            .value("api_keys_reloads_total", &[("outcome", outcome)])
            == count
    })
    .await;
}

/// The status of `GET /accounts/nobody` sent with `key`: a read every scope check runs on.
async fn read_as(app: &TestApp, key: Option<&str>, request_id: &str) -> u16 {
    app.send("GET", "/accounts/nobody", key, None, request_id)
        .await
        .status()
        .as_u16()
}
