//! The OpenAPI document against the server: what the document says is valid, the server
//! accepts, and what it says is invalid, the server refuses, for every constraint it states.
//!
//! The patterns are read from the served document (equal to the committed one) and used as
//! a schema-driven fuzzer would: strings generated from each pattern (proptest's regex
//! strategy, seeded) must be accepted; strings generated near it (other characters, one too
//! many, `.` and `..`, signs, spaces) must be accepted exactly when the pattern matches them
//! (the `regex` crate decides). Ranges, enums and the constraints only a description can
//! state (`floor` ≤ `balance`, `from` ≠ `to`) are checked at their edges. The security the
//! document declares is checked against `support::routes`. One app on the embedded store.

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use regex::Regex;
use serde_json::{json, Value};

use crate::support::app::{Backend, TestApp};
use crate::support::routes::{Access, ROUTES};

/// Generated strings per pattern, of each kind.
const SAMPLES: usize = 48;

/// `count` strings generated from `regex` (no anchors), seeded.
fn generate(regex: &str, count: usize) -> Vec<String> {
    let strategy = proptest::string::string_regex(regex)
        .unwrap_or_else(|e| panic!("cannot generate from {regex}: {e}"));
    let mut runner = TestRunner::deterministic();
    (0..count)
        .map(|_| strategy.new_tree(&mut runner).expect("a value").current())
        .collect()
}

/// A component schema of the document.
fn schema<'d>(doc: &'d Value, name: &str) -> &'d Value {
    let schema = &doc["components"]["schemas"][name];
    assert!(schema.is_object(), "no schema {name}");
    schema
}

/// The pattern of a component schema, compiled, and its body without the anchors (what a
/// generator takes).
fn pattern(doc: &Value, name: &str) -> (Regex, String) {
    let text = schema(doc, name)["pattern"]
        .as_str()
        .unwrap_or_else(|| panic!("{name} has no pattern"));
    let body = text
        .strip_prefix('^')
        .and_then(|t| t.strip_suffix('$'))
        .unwrap_or_else(|| panic!("{name}'s pattern is not anchored: {text}"));
    (Regex::new(text).expect("a valid pattern"), body.to_owned())
}

/// Checks `accepted(value) == pattern matches value` for values generated from the pattern
/// (all must match) and from `near` (some match, some not).
async fn assert_pattern_is_the_rule<F, Fut>(
    doc: &Value,
    name: &str,
    near: &str,
    edges: &[&str],
    accepted: F,
) where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let (regex, body) = pattern(doc, name);
    let valid = generate(&body, SAMPLES);
    for value in &valid {
        assert!(
            regex.is_match(value),
            "{name}: generated {value:?} does not match"
        );
    }
    let candidates = generate(near, SAMPLES * 2)
        .into_iter()
        .chain(edges.iter().map(|e| e.to_string()));
    let mut refused = 0;
    for value in valid.into_iter().chain(candidates) {
        let expected = regex.is_match(&value);
        refused += usize::from(!expected);
        assert_eq!(
            accepted(value.clone()).await,
            expected,
            "{name}: {value:?} is {} by the document's pattern",
            if expected { "valid" } else { "invalid" }
        );
    }
    assert!(
        refused >= 10,
        "{name}: only {refused} invalid values were tried"
    );
}

/// The status of `GET /transfers` with one query parameter.
async fn list_status(app: &TestApp, name: &str, value: &str) -> u16 {
    app.client
        .get(app.url("/transfers"))
        .query(&[(name, value)])
        .send()
        .await
        .expect("GET")
        .status()
        .as_u16()
}

/// The status of `POST <path>` with an `Idempotency-Key` header.
async fn keyed_post(app: &TestApp, path: &str, key: &str, body: Value) -> u16 {
    app.client
        .post(app.url(path))
        .header("idempotency-key", key)
        .json(&body)
        .send()
        .await
        .expect("POST")
        .status()
        .as_u16()
}

fn accepted(status: u16) -> bool {
    match status {
        200 | 201 => true,
        422 => false,
        other => panic!("neither accepted nor refused: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_openapi_document_allows_the_server_accepts_and_nothing_else() {
    let owned = TestApp::spawn(Backend::Embedded).await;
    let app = &owned;
    let (status, doc) = app.get("/openapi.json").await;
    assert_eq!(status, 200);
    app.open_accounts([("A", 1_000_000), ("B", 0)]).await;
    app.transfer_accepted("t-1", "A", "B", 1).await;
    app.settled("t-1").await;
    let long = |n: usize| "a".repeat(n);

    // Ids, as `POST /accounts` reads them (and `from`, `to`, `id` of a transfer).
    let edges = [
        ".",
        "..",
        "...",
        ".a",
        "..a",
        "a.",
        "",
        &long(128),
        &long(129),
    ];
    assert_pattern_is_the_rule(
        &doc,
        "AccountId",
        r"\.{1,3}|[a-z.~ /]{0,4}|[a-z.]{126,130}",
        &edges,
        |id| async move {
            let (status, body) = app.post("/accounts", json!({"id": id, "balance": 0})).await;
            assert!(status != 409, "{body}");
            accepted(status)
        },
    )
    .await;
    // ... and as `?account=`.
    assert_pattern_is_the_rule(
        &doc,
        "AccountId",
        r"\.{1,3}|[a-z:~%]{0,4}",
        &edges,
        |id| async move { accepted(list_status(app, "account", &id).await) },
    )
    .await;
    // Transfer ids, as `POST /transfers` reads them (a transfer of one unit for each).
    assert_pattern_is_the_rule(
        &doc,
        "TransferId",
        r"\.{1,3}|[a-z.~ /]{0,4}|[a-z.]{126,130}",
        &edges,
        |id| async move {
            let body = json!({"id": id, "from": "A", "to": "B", "amount": 1});
            let (status, body) = app.post("/transfers", body).await;
            assert!(status != 409, "{body}");
            accepted(status)
        },
    )
    .await;

    // Currencies, as `POST /accounts` reads them (a new account for each value).
    let opened = std::sync::atomic::AtomicUsize::new(0);
    let (sixteen, seventeen) = ("A".repeat(16), "A".repeat(17));
    assert_pattern_is_the_rule(
        &doc,
        "Currency",
        r"[A-Za-z0-9_ .€-]{0,18}",
        &["", "A", "usd", "US D", &sixteen, &seventeen],
        |currency| {
            let id = format!(
                "cur-{}",
                opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            );
            async move {
                let body = json!({"id": id, "balance": 0, "currency": currency});
                let (status, body) = app.post("/accounts", body).await;
                assert!(status != 409, "{body}");
                accepted(status)
            }
        },
    )
    .await;

    // Metadata filters, as `?metadata=` reads them (the listing's array parameter).
    let (forty, forty_one) = ("k".repeat(40), "k".repeat(41));
    let (longest, too_long) = (
        format!("k:{}", "é".repeat(256)),
        format!("k:{}", "v".repeat(257)),
    );
    assert_pattern_is_the_rule(
        &doc,
        "MetadataFilter",
        r"[a-zA-Z0-9_. :-]{0,3}:?[a-z: ]{0,3}|[a-z]{38,42}:[a-z]?",
        &[
            "",
            "k",
            ":v",
            "k:",
            "k::",
            "K:v",
            "a b:v",
            "a.b-c_d:x y",
            &format!("{forty}:v"),
            &format!("{forty_one}:v"),
            &longest,
            &too_long,
        ],
        |filter| async move { accepted(list_status(app, "metadata", &filter).await) },
    )
    .await;

    // `?wait=` on a settled transfer answers at once whatever the wait.
    let edges = [
        "",
        "5",
        "s",
        "1m30s",
        "1ms",
        "1mss",
        " 5s",
        "5s ",
        "-1s",
        "99999999999999999999999h",
    ];
    assert_pattern_is_the_rule(
        &doc,
        "Wait",
        r"[0-9]{0,3}(ns|us|ms|s|m|h|d|sec| s|S|)([0-9]{1,2}(ms|s|x))?",
        &edges,
        |wait| async move {
            let response = app
                .client
                .get(app.url("/transfers/t-1"))
                .query(&[("wait", wait.as_str())])
                .send()
                .await
                .expect("GET");
            accepted(response.status().as_u16())
        },
    )
    .await;

    let edges = [
        "0~t-1",
        "~t-1",
        "1~",
        "1~.",
        "1~..",
        "-1~a",
        "+1~a",
        "1.5~a",
        "1~a~b",
        "99999999999999999999~a",
    ];
    assert_pattern_is_the_rule(
        &doc,
        "Cursor",
        r"(-|\+)?[0-9]{0,3}(\.[0-9])?~(\.{1,2}|[a-z.~]{0,3})",
        &edges,
        |cursor| async move { accepted(list_status(app, "cursor", &cursor).await) },
    )
    .await;

    // `Idempotency-Key` without a body id: the transfer's id.
    let edges = [
        ".",
        "..",
        "\".\"",
        "\"a",
        "a\"",
        "\"\"",
        "\"a\"",
        &long(128),
        &long(129),
    ];
    assert_pattern_is_the_rule(
        &doc,
        "IdempotencyKey",
        r#""?(\.{1,3}|[a-z.~ /]{0,3}|[a-z]{127,129})"?"#,
        &edges,
        |key| async move {
            let body = json!({"from": "A", "to": "B", "amount": 1});
            accepted(keyed_post(app, "/transfers", &key, body).await)
        },
    )
    .await;
    let edges = ["..", "\"b\"", &long(124), &long(125)];
    assert_pattern_is_the_rule(
        &doc,
        "BatchIdempotencyKey",
        r#""?(\.{1,3}|[a-z.~]{0,3}|[a-z]{123,126})"?"#,
        &edges,
        |key| async move {
            let body = json!({"transfers": [{"from": "A", "to": "B", "amount": 1}]});
            accepted(keyed_post(app, "/transfers/batch", &key, body).await)
        },
    )
    .await;

    // Enums: every value accepted, nothing else.
    assert_eq!(schema(&doc, "Attention")["enum"], json!(["true"]));
    for (value, ok) in [
        ("true", true),
        ("false", false),
        ("True", false),
        ("1", false),
    ] {
        assert_eq!(
            accepted(list_status(app, "attention", value).await),
            ok,
            "{value}"
        );
    }
    let states = schema(&doc, "TransferState")["enum"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(states.len(), 6);
    for state in states {
        assert!(
            accepted(list_status(app, "state", state.as_str().unwrap()).await),
            "{state}"
        );
    }
    assert!(!accepted(list_status(app, "state", "done").await));

    // Ranges, at their edges.
    let list = &doc["paths"]["/transfers"]["get"]["parameters"];
    let limit = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .expect("limit");
    let (min, max) = (
        limit["schema"]["minimum"].as_i64().unwrap(),
        limit["schema"]["maximum"].as_i64().unwrap(),
    );
    assert_eq!((min, max), (1, 1000));
    for (value, ok) in [(min - 1, false), (min, true), (max, true), (max + 1, false)] {
        assert_eq!(
            accepted(list_status(app, "limit", &value.to_string()).await),
            ok,
            "limit={value}"
        );
    }
    // The one-leg shape of `CreateTransfer` (a `oneOf` of it and the multi-leg shape).
    let transfer = schema(&doc, "OneLegTransfer");
    assert_eq!(transfer["properties"]["amount"]["minimum"], 1);
    assert_eq!(transfer["properties"]["amount"]["format"], "int64");
    for (amount, ok) in [
        (json!(0), false),
        (json!(1), true),
        (json!(i64::MAX), true),
        (json!(-1), false),
        (json!(u64::MAX), false),
    ] {
        let (status, body) = app
            .post(
                "/transfers",
                json!({"from": "A", "to": "B", "amount": amount}),
            )
            .await;
        assert_eq!(accepted(status), ok, "amount {amount}: {body}");
    }
    let batch = schema(&doc, "CreateBatch");
    let (min, max) = (
        batch["properties"]["transfers"]["minItems"]
            .as_u64()
            .unwrap(),
        batch["properties"]["transfers"]["maxItems"]
            .as_u64()
            .unwrap(),
    );
    assert_eq!((min, max), (1, 1000));
    for (count, ok) in [(min - 1, false), (min, true), (max + 1, false)] {
        let items: Vec<Value> = (0..count)
            .map(|_| json!({"from": "A", "to": "B", "amount": 1}))
            .collect();
        let (status, body) = app.batch(items).await;
        assert_eq!(accepted(status), ok, "{count} items: {body}");
    }

    // What only a description can say, as it says it.
    let to = transfer["properties"]["to"]["description"]
        .as_str()
        .unwrap();
    assert!(to.contains("must differ from `from`"), "{to}");
    let (status, body) = app
        .post("/transfers", json!({"from": "A", "to": "A", "amount": 1}))
        .await;
    assert_eq!(status, 422, "{body}");
    let account = schema(&doc, "CreateAccount");
    let balance = account["properties"]["balance"]["description"]
        .as_str()
        .unwrap();
    assert!(
        balance.contains("at least `floor` (so at least 0 when `floor`"),
        "{balance}"
    );
    for (body, ok) in [
        (json!({"id": "f-1", "balance": -1}), false),
        (json!({"id": "f-2", "balance": 0}), true),
        (json!({"id": "f-3", "balance": -5, "floor": -5}), true),
        (json!({"id": "f-4", "balance": 5, "floor": 6}), false),
        (json!({"id": "f-5", "balance": 5, "floor": null}), true),
    ] {
        let (status, answer) = app.post("/accounts", body.clone()).await;
        assert_eq!(accepted(status), ok, "{body}: {answer}");
    }
    let key = doc["paths"]["/transfers"]["post"]["parameters"][0]["description"]
        .as_str()
        .unwrap();
    assert!(
        key.contains("with a body `id` it must be the same"),
        "{key}"
    );
    let status = keyed_post(
        app,
        "/transfers",
        "k-x",
        json!({"id": "k-y", "from": "A", "to": "B", "amount": 1}),
    )
    .await;
    assert_eq!(status, 422);
    let (status, _) = app.get("/transfers?colour=red").await;
    assert_eq!(
        status, 422,
        "an unknown parameter, as the listing's description says"
    );
    let listing = doc["paths"]["/transfers"]["get"]["description"]
        .as_str()
        .unwrap();
    assert!(
        listing.contains("a parameter not listed here, or\none given twice, is a 422"),
        "{listing}"
    );

    owned.shutdown().await;
}

/// The status of `GET /events?after=<cursor>` (no wait).
async fn events_status(app: &TestApp, cursor: &str) -> u16 {
    app.client
        .get(app.url("/events"))
        .query(&[("after", cursor)])
        .send()
        .await
        .expect("GET")
        .status()
        .as_u16()
}

/// `FeedCursor` is the union of the two backends' cursors, each after an optional store
/// identity, and each backend accepts its own half as the schema's description says: every
/// value generated from the pattern, and from near it, is accepted exactly when it matches
/// the pattern, is of the backend's form, carries no identity or this store's, and is not
/// past the end of the feed (`now` is the end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_backend_accepts_exactly_its_half_of_the_feed_cursor_pattern() {
    let doc: Value =
        serde_json::from_str(&transfer_service::http::openapi::document_json()).unwrap();
    let (regex, body) = pattern(&doc, "FeedCursor");
    let seq_form = Regex::new("^[0-9]+$").unwrap();
    let with_identity = Regex::new("^([0-9]{0,63}[A-Za-z_-][A-Za-z0-9_-]{0,64})~(.*)$").unwrap();
    let near = r"([a-z0-9]{0,3}~)?(-|\+)?[0-9]{0,22}(~(\.{1,2}|[a-z.~ ]{0,3}))?";
    let generated: Vec<String> = generate(&body, SAMPLES)
        .into_iter()
        .chain(generate(near, SAMPLES * 2))
        .collect();
    for backend in [Backend::Embedded, Backend::Emulator] {
        let app = TestApp::spawn_with_accounts(backend, [("A", 10), ("B", 0)]).await;
        app.transfer_accepted("t-1", "A", "B", 1).await;
        app.settled("t-1").await;
        let end = crate::support::wait::until_some("the end of the feed", || async {
            let (_, page) = app.get("/events?limit=1000&wait=1s").await;
            page["next_cursor"].as_str().map(str::to_owned)
        })
        .await;
        let (identity, end_position) = end.split_once('~').unwrap();
        let end_seq: u64 = end_position.parse().unwrap_or(0);
        let edges = [
            "".to_owned(),
            "~a".into(),
            "0".into(),
            "18446744073709551616".into(),
            "1~a".into(),
            "0000".into(),
            "123456789012345~x".into(),
            "now".into(),
            end.clone(),
            format!("{identity}~0"),
            format!("{identity}~1~a"),
            format!("x{identity}~0"),
            format!("{identity}~{end_position}0"),
            format!("{identity}~1"),
            format!("{identity}~{end_position}"),
            "1".into(),
            end_position.into(),
            format!("{identity}~5~b"),
            "7~c".into(),
            format!("{identity}~9~d"),
            format!("{identity}~1000~e"),
        ];
        let (mut accepted_count, mut refused_count) = (0, 0);
        for value in generated.iter().chain(edges.iter()) {
            let (theirs, position) = match with_identity.captures(value) {
                Some(c) => (Some(c[1].to_owned()), c[2].to_owned()),
                None => (None, value.clone()),
            };
            let embedded = matches!(backend, Backend::Embedded);
            let of_this_backend = seq_form.is_match(&position) == embedded;
            let of_this_store = theirs.as_deref().is_none_or(|theirs| theirs == identity);
            let past_the_end = if embedded {
                position.parse::<u64>().map_or(true, |seq| seq > end_seq)
            } else {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis();
                let millis = position.split('~').next().unwrap();
                millis.parse::<u128>().map_or(true, |millis| millis > now)
            };
            let expected = regex.is_match(value)
                && (value == "now" || (of_this_backend && of_this_store && !past_the_end));
            let got = accepted(events_status(&app, value).await);
            assert_eq!(got, expected, "{backend:?}: after={value:?}");
            if got {
                accepted_count += 1;
            } else {
                refused_count += 1;
            }
        }
        assert!(
            accepted_count >= 10 && refused_count >= 10,
            "{backend:?}: {accepted_count} accepted, {refused_count} refused"
        );
        app.shutdown().await;
    }
}

#[test]
fn the_document_declares_the_security_the_server_applies() {
    let doc: Value =
        serde_json::from_str(&transfer_service::http::openapi::document_json()).unwrap();
    let scheme = &doc["components"]["securitySchemes"]["bearer"];
    assert_eq!(scheme["type"], "http", "{scheme}");
    assert_eq!(scheme["scheme"], "bearer", "{scheme}");
    assert!(
        doc.get("security").is_none(),
        "no document-wide requirement: {}",
        doc["security"]
    );
    for route in ROUTES.iter().filter(|r| r.documented) {
        let what = format!("{} {}", route.method, route.template);
        let operation = &doc["paths"][route.template][route.method.to_ascii_lowercase()];
        let security = &operation["security"];
        let responses = &operation["responses"];
        match route.access {
            Access::Read | Access::Write => {
                let scope = if route.access == Access::Read {
                    "read"
                } else {
                    "write"
                };
                // No key, or a key with the scope: the service is open until it has keys.
                assert_eq!(security, &json!([{}, {"bearer": [scope]}]), "{what}");
                for status in ["401", "403"] {
                    let response = &responses[status];
                    assert!(
                        response["headers"]["WWW-Authenticate"].is_object(),
                        "{what} {status}: {response}"
                    );
                    assert_eq!(
                        response["content"]["application/problem+json"]["schema"]["$ref"],
                        "#/components/schemas/Problem",
                        "{what} {status}"
                    );
                }
                assert!(
                    responses["403"]["description"]
                        .as_str()
                        .unwrap()
                        .contains(scope),
                    "{what}"
                );
            }
            Access::Open if route.template == "/metrics" => {
                assert_eq!(security, &json!([{}, {"bearer": ["read"]}]), "{what}");
                assert!(responses["401"]["description"]
                    .as_str()
                    .unwrap()
                    .contains("METRICS_REQUIRE_AUTH"));
            }
            Access::Open => {
                assert!(security.is_null(), "{what}: {security}");
                assert!(responses.get("401").is_none(), "{what}");
            }
        }
    }
}
