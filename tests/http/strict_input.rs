//! Strict input: a typo never moves money. A body field the API does not have is a 422 that
//! names it (and the field meant), on every request body, at every depth; the request
//! changes nothing.

use serde_json::{json, Value};

use crate::support::app::{header, Backend, TestApp};
use crate::support::routes::{Route, ROUTES};
use crate::support::wait;

/// One step from an object to a value inside it.
#[derive(Debug, Clone)]
enum Step {
    Field(String),
    Item,
}

/// Every object schema (one with `properties`) reachable from `schema`, with the steps from
/// the body's root to it. Open maps (`Metadata`: labels, not fields) have no `properties`.
fn object_schemas<'d>(
    doc: &'d Value,
    schema: &'d Value,
    at: Vec<Step>,
) -> Vec<(Vec<Step>, &'d Value)> {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("a component reference: {reference}"));
        return object_schemas(doc, &doc["components"]["schemas"][name], at);
    }
    let mut found = Vec::new();
    for member in schema["oneOf"].as_array().into_iter().flatten() {
        found.extend(object_schemas(doc, member, at.clone()));
    }
    if schema["items"].is_object() {
        let mut inner = at.clone();
        inner.push(Step::Item);
        found.extend(object_schemas(doc, &schema["items"], inner));
    }
    if let Some(properties) = schema["properties"].as_object() {
        found.push((at.clone(), schema));
        for (name, property) in properties {
            let mut inner = at.clone();
            inner.push(Step::Field(name.clone()));
            found.extend(object_schemas(doc, property, inner));
        }
    }
    found
}

/// The object at `steps` inside `body` (the first item of each array).
fn object_at<'b>(body: &'b mut Value, steps: &[Step]) -> &'b mut serde_json::Map<String, Value> {
    let mut value = body;
    for step in steps {
        value = match step {
            Step::Field(name) => &mut value[name.as_str()],
            Step::Item => &mut value[0],
        };
    }
    value
        .as_object_mut()
        .unwrap_or_else(|| panic!("the valid body has an object at {steps:?}"))
}

/// A body of `operation` the server accepts, with objects at every depth its schema has,
/// made unique by `n` so that a refused one can be told from an accepted one.
fn valid_body(operation: &str, n: usize) -> Value {
    match operation {
        "post /accounts" => json!({"id": format!("acct-{n}"), "balance": 5, "floor": 0,
            "currency": "EUR", "metadata": {"k": "v"}}),
        "post /transfers" => json!({"id": format!("t-{n}"),
            "legs": [{"from": "A", "to": "B", "amount": 1}], "currency": "EUR",
            "metadata": {"k": "v"}}),
        "post /transfers/batch" => json!({"transfers": [{"id": format!("t-{n}"),
            "legs": [{"from": "A", "to": "B", "amount": 1}]}]}),
        "post /transfers/{id}/capture" => json!({"amount": 1}),
        other => panic!("no valid body for {other}: add one"),
    }
}

/// What one request changed: the transfer or account it would have made, or the hold it
/// would have captured.
async fn made(app: &TestApp, operation: &str, n: usize) -> bool {
    match operation {
        "post /accounts" => app.status(&format!("/accounts/acct-{n}")).await == 200,
        "post /transfers" | "post /transfers/batch" => {
            app.status(&format!("/transfers/t-{n}")).await == 200
        }
        "post /transfers/{id}/capture" => {
            let (_, hold) = app.get(&format!("/transfers/hold-{n}")).await;
            hold.get("captured_amount").is_some()
        }
        other => panic!("{other}"),
    }
}

/// A hold of 5 from A to B, waiting for its capture.
async fn hold(app: &TestApp, id: &str) {
    let (status, answer) = app
        .post(
            "/transfers",
            json!({"id": id, "from": "A", "to": "B", "amount": 5, "hold": true}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    wait::eventually("the hold to wait in pending", || async {
        app.state(id).await == "pending"
    })
    .await;
}

/// The problem of a refused body: the whole request's, or its one batch item's.
fn problem_of(operation: &str, status: u16, answer: &Value) -> (u64, Value) {
    if operation == "post /transfers/batch" && status == 200 {
        let item = &answer["items"][0];
        return (item["status"].as_u64().unwrap(), item["problem"].clone());
    }
    (u64::from(status), answer.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_body_schema_refuses_a_field_it_does_not_have() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let (status, doc) = app.get("/openapi.json").await;
    assert_eq!(status, 200);
    app.post(
        "/accounts",
        json!({"id": "A", "balance": 1000, "currency": "EUR"}),
    )
    .await;
    app.post(
        "/accounts",
        json!({"id": "B", "balance": 0, "currency": "EUR"}),
    )
    .await;
    let mut n = 0;
    let mut checked = Vec::new();
    for (path, operations) in doc["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            let Some(schema) =
                operation["requestBody"]["content"]["application/json"].get("schema")
            else {
                continue;
            };
            let name = format!("{method} {path}");
            for (steps, object) in object_schemas(&doc, schema, Vec::new()) {
                let what = format!("{name} at {steps:?}");
                assert_eq!(object["additionalProperties"], false, "{what}: {object}");
                let first = object["properties"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .next()
                    .unwrap();
                // A field in other case (names are case-sensitive) and one like no field.
                let capitalized = format!("{}{}", first[..1].to_uppercase(), &first[1..]);
                for (extra, meant) in [(capitalized.as_str(), Some(first.as_str())), ("zzz", None)]
                {
                    n += 1;
                    let target = path.replace("{id}", &format!("hold-{n}"));
                    if path.contains("{id}") {
                        hold(&app, &format!("hold-{n}")).await;
                    }
                    let mut body = valid_body(&name, n);
                    object_at(&mut body, &steps).insert(extra.into(), json!(1));
                    let (status, answer) = app.post(&target, body).await;
                    let (status, problem) = problem_of(&name, status, &answer);
                    assert_eq!(status, 422, "{what} with `{extra}`: {answer}");
                    let detail = problem["detail"].as_str().unwrap();
                    assert!(
                        detail.contains(&format!("{extra}` is not a field of")),
                        "{what}: {detail}"
                    );
                    match meant {
                        Some(meant) => assert!(
                            detail.contains(&format!("did you mean `{meant}`?")),
                            "{what}: {detail}"
                        ),
                        None => assert!(!detail.contains("did you mean"), "{what}: {detail}"),
                    }
                    assert!(
                        !made(&app, &name, n).await,
                        "{what} with `{extra}` changed something"
                    );
                }
                // The same body without the extra field is accepted: the refusal was the field's.
                n += 1;
                let target = path.replace("{id}", &format!("hold-{n}"));
                if path.contains("{id}") {
                    hold(&app, &format!("hold-{n}")).await;
                }
                let (status, answer) = app.post(&target, valid_body(&name, n)).await;
                let (status, _) = problem_of(&name, status, &answer);
                assert!(status < 300, "{what} without the extra field: {answer}");
                assert!(
                    made(&app, &name, n).await,
                    "{what}: the valid body made nothing"
                );
                checked.push(what);
            }
        }
    }
    // Every body, and every object inside one: account, transfer (of one leg, of several
    // legs, and its legs), the batch and its items (the same three), the capture.
    assert_eq!(checked.len(), 9, "{checked:#?}");
    app.shutdown().await;
}

/// Posts `body` to `path` and asserts a 422 whose detail is exactly `says`.
async fn assert_post_refused_saying(app: &TestApp, path: &str, body: Value, says: &str) {
    let (status, problem) = app.post(path, body).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["detail"], says, "{problem}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typos_of_the_issue_are_refused_and_move_nothing() {
    let app = TestApp::spawn_with_accounts(Backend::Embedded, [("alice", 500), ("bob", 0)]).await;

    // `amt` on a capture would have captured the whole hold.
    let (status, _) = app
        .post(
            "/transfers",
            json!({"id": "auth-1", "from": "alice", "to": "bob",
            "amount": 50, "hold": true}),
        )
        .await;
    assert_eq!(status, 201);
    // Held: pending, and applied to both accounts.
    wait::eventually("the hold to be applied", || async {
        app.state("auth-1").await == "pending" && app.balance("bob").await == 50
    })
    .await;
    let before = (app.balance("alice").await, app.balance("bob").await);
    let (status, problem) = app
        .post("/transfers/auth-1/capture", json!({"amt": 10}))
        .await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["type"], "/problems/invalid-field");
    assert_eq!(
        problem["detail"],
        "`amt` is not a field of a capture; did you mean `amount`?"
    );
    let (_, hold) = app.get("/transfers/auth-1").await;
    assert_eq!(hold["state"], "pending", "{hold}");
    assert!(hold.get("captured_amount").is_none(), "{hold}");

    // `Hold` would have made an ordinary transfer that moved the money at once.
    let ordinary = json!({"id": "t-1", "from": "alice", "to": "bob", "amount": 100, "Hold": true});
    let says = "`Hold` is not a field of a transfer; did you mean `hold`?";
    assert_post_refused_saying(&app, "/transfers", ordinary, says).await;
    assert_eq!(app.status("/transfers/t-1").await, 404);
    let after = (app.balance("alice").await, app.balance("bob").await);
    assert_eq!(after, before, "nothing moved");

    // `flor` and `curency` would have opened the account without them.
    for (field, meant) in [("flor", "floor"), ("curency", "currency")] {
        let account = json!({"id": "carol", "balance": 0, field: "x"});
        let says = format!("`{field}` is not a field of an account; did you mean `{meant}`?");
        assert_post_refused_saying(&app, "/accounts", account, &says).await;
        assert_eq!(app.status("/accounts/carol").await, 404);
    }

    // A leg's typo names the leg; a field like none names the fields there are.
    let legs = json!({"id": "t-2", "legs": [{"from": "alice", "to": "bob", "amount": 1},
        {"from": "alice", "to": "bob", "amonut": 1}]});
    let says = "`legs[1].amonut` is not a field of a leg; did you mean `amount`?";
    assert_post_refused_saying(&app, "/transfers", legs, says).await;
    let batch = json!({"transfers": [], "colour": "red"});
    let says = "`colour` is not a field of a batch; its fields are `transfers`";
    assert_post_refused_saying(&app, "/transfers/batch", batch, says).await;
    assert_eq!(app.status("/transfers/t-2").await, 404);
    app.shutdown().await;
}

/// A parameter `route` takes, with a value it accepts (`None`: it takes none).
fn a_parameter_of(route: &Route) -> Option<(&'static str, &'static str)> {
    match (route.method, route.template) {
        ("GET", "/transfers/{id}" | "/transfers/batch") => Some(("wait", "0s")),
        ("GET", "/transfers" | "/events" | "/accounts/{id}/entries") => Some(("limit", "5")),
        ("GET", "/accounts/{id}/balance") => Some(("at", "2100-01-01T00:00:00Z")),
        _ => None,
    }
}

/// A request of `route` the server accepts, on resources of its own (`n`), and whether it
/// changed what it would change: the account or transfer it creates, the hold it cancels or
/// captures.
struct Request {
    path: String,
    body: Option<Value>,
}

async fn request_of(app: &TestApp, route: &Route, n: usize) -> Request {
    let id = format!("q-{n}");
    if let Some(rest) = route.template.strip_prefix("/accounts/{id}") {
        return Request {
            path: format!("/accounts/A{rest}"),
            body: None,
        };
    }
    if route.template.contains("{id}") {
        hold(app, &id).await;
    }
    let body = match (route.method, route.template) {
        ("POST", "/accounts") => Some(json!({"id": id, "balance": 1})),
        ("POST", "/transfers") => Some(json!({"id": id, "from": "A", "to": "B", "amount": 1})),
        ("POST", "/transfers/batch") => {
            Some(json!({"transfers": [{"id": id, "from": "A", "to": "B", "amount": 1}]}))
        }
        ("POST", "/transfers/{id}/capture") => Some(json!({"amount": 2})),
        ("POST", "/transfers/{id}/cancel") => None,
        ("POST", other) => panic!("no request for POST {other}: add one"),
        _ => None,
    };
    Request {
        path: route.template.replace("{id}", &id),
        body,
    }
}

/// Whether the request of `route` on `n` was carried out.
async fn carried_out(app: &TestApp, route: &Route, n: usize) -> Option<bool> {
    let id = format!("q-{n}");
    Some(match (route.method, route.template) {
        ("POST", "/accounts") => app.status(&format!("/accounts/{id}")).await == 200,
        ("POST", "/transfers" | "/transfers/batch") => {
            app.status(&format!("/transfers/{id}")).await == 200
        }
        ("POST", "/transfers/{id}/cancel") => app.state(&id).await != "pending",
        ("POST", "/transfers/{id}/capture") => {
            let (_, hold) = app.get(&format!("/transfers/{id}")).await;
            hold.get("captured_amount").is_some()
        }
        _ => return None,
    })
}

async fn send(app: &TestApp, route: &Route, request: &Request, query: &str) -> (u16, Value) {
    let response = app
        .send(
            route.method,
            &format!("{}{query}", request.path),
            None,
            request.body.as_ref(),
            "strict-query",
        )
        .await;
    let status = response.status().as_u16();
    let content_type = header(&response, "content-type");
    let bytes = response.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status == 422 {
        assert_eq!(content_type, "application/problem+json");
    }
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_an_unknown_or_repeated_query_parameter() {
    let app = TestApp::spawn_with_accounts(Backend::Embedded, [("A", 1_000_000), ("B", 0)]).await;
    // `GET /transfers/batch` reads the transfer named `batch`.
    app.transfer_accepted("batch", "A", "B", 1).await;
    let mut n = 0;
    for route in ROUTES {
        let what = format!("{} {}", route.method, route.template);
        let mut refused = vec![("foo=1".to_owned(), "foo".to_owned(), None)];
        if let Some((name, value)) = a_parameter_of(route) {
            // Names are case-sensitive: `WAIT` is not `wait` (it would turn the long-poll off).
            let upper = name.to_uppercase();
            refused.push((format!("{upper}={value}"), upper, Some(name)));
            refused.push((
                format!("{name}={value}&{name}={value}"),
                name.to_owned(),
                None,
            ));
        }
        for (query, named, meant) in refused {
            n += 1;
            let request = request_of(&app, route, n).await;
            let (status, problem) = send(&app, route, &request, &format!("?{query}")).await;
            assert_eq!(status, 422, "{what}?{query}: {problem}");
            let detail = problem["detail"].as_str().unwrap();
            assert!(
                detail.contains(&format!("`{named}`")),
                "{what}?{query}: {detail}"
            );
            if let Some(meant) = meant {
                assert!(
                    detail.contains(&format!("did you mean `{meant}`?")),
                    "{detail}"
                );
            }
            if let Some(done) = carried_out(&app, route, n).await {
                assert!(!done, "{what}?{query} was carried out");
            }
        }
        // Without the bad parameter the same request is carried out: the 422 was its.
        n += 1;
        let request = request_of(&app, route, n).await;
        let query = a_parameter_of(route)
            .map(|(name, value)| format!("?{name}={value}"))
            .unwrap_or_default();
        let (status, answer) = send(&app, route, &request, &query).await;
        assert!(
            (200..300).contains(&status),
            "{what}{query}: {status} {answer}"
        );
        if let Some(done) = carried_out(&app, route, n).await {
            assert!(done, "{what} was not carried out");
        }
    }
    let (status, problem) = app.get("/transfers/q-1?WAIT=5s").await;
    assert_eq!(status, 422);
    assert_eq!(
        problem["detail"],
        "unknown parameter `WAIT` (did you mean `wait`?): GET /transfers/{id} takes `wait`, \
         such as `?wait=5s`"
    );
    let (_, problem) = app.get("/accounts/A?foo=1").await;
    assert_eq!(
        problem["detail"],
        "unknown parameter `foo`: GET /accounts/{id} takes no query parameters"
    );
    app.shutdown().await;
}

/// Each refusal says what was received, what is accepted, and an example.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_say_what_was_received_and_what_is_accepted() {
    let app = TestApp::spawn_with_accounts(Backend::Embedded, [("A", 100), ("B", 0)]).await;
    let hold = |expires: &str| json!({"from": "A", "to": "B", "amount": 5, "hold": true, "hold_expires_in": expires});
    for (body, expected) in [
        (
            hold("forever"),
            "`hold_expires_in` must be a duration from 1s to 30days, such as \"10m\", \
             \"1h30m\" or \"2days\" (received \"forever\")",
        ),
        (
            hold("31days"),
            "`hold_expires_in` must be a duration from 1s to 30days, such as \"10m\", \
             \"1h30m\" or \"2days\" (received \"31days\")",
        ),
        (
            json!({"from": "A", "to": "B", "amount": 1.5}),
            "`amount` must be an integer from 1 to 2^63-1, such as 100 (received a fraction, \
             an exponent or a number beyond 2^63-1)",
        ),
        (
            json!({"from": "A", "to": "B", "amount": -3}),
            "`amount` must be positive: a whole number of units from 1 to 2^63-1, such as 100 \
             (received -3)",
        ),
    ] {
        let (status, problem) = app.post("/transfers", body.clone()).await;
        assert_eq!(status, 422, "{body}: {problem}");
        assert_eq!(problem["detail"], expected, "{body}");
    }
    for action in ["cancel", "capture"] {
        let (status, problem) = app
            .post(&format!("/transfers/nope/{action}"), json!({}))
            .await;
        assert_eq!(status, 404, "{problem}");
        assert_eq!(problem["detail"], "no transfer nope", "{action}");
    }
    let (status, problem) = app.get("/transfers?state=rolled_back").await;
    assert_eq!(status, 422);
    assert_eq!(
        problem["detail"],
        "unknown state `rolled_back`: `state` is one of created, pending, committed, finished, \
         terminating, rolled-back, such as `state=rolled-back`"
    );
    app.shutdown().await;
}

/// `.` and `..` fit "1–128 characters of A-Z a-z 0-9 . _ : -": a refusal of one names the
/// exception, wherever an id is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_of_dots_is_refused_naming_the_exception() {
    let app = TestApp::spawn_with_accounts(Backend::Embedded, [("A", 10), ("B", 0)]).await;
    let exception = "not `.` or `..`";
    for (path, body) in [
        ("/accounts", json!({"id": "..", "balance": 0})),
        (
            "/transfers",
            json!({"id": ".", "from": "A", "to": "B", "amount": 1}),
        ),
        ("/transfers", json!({"from": "..", "to": "B", "amount": 1})),
        (
            "/transfers",
            json!({"legs": [{"from": "A", "to": "..", "amount": 1}]}),
        ),
    ] {
        let (status, problem) = app.post(path, body.clone()).await;
        assert_eq!(status, 422, "{body}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(exception), "{body}: {detail}");
    }
    let (status, problem) = app.get("/transfers?account=..").await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains(exception),
        "{problem}"
    );
    app.shutdown().await;
}
