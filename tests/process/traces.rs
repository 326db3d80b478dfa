//! Traces in a real backend (Jaeger, `support::jaeger`): a transfer posted with a caller's
//! `traceparent` is one trace, from the caller's span through the HTTP span, every protocol
//! step in order with its store calls, to the webhook delivery, whose request carries the
//! trace on; on the embedded store (its two-phase path, where every step exists) and on a real
//! cluster. And a collector that goes away costs spans, counted, not transfers.

use super::*;
use support::jaeger::{Jaeger, Span, SPANS_ARRIVE_WITHIN};

/// The steps of a one-leg transfer from `a` to `b`, in the order the protocol takes them.
const STEPS: [&str; 8] = [
    "create",
    "pending",
    "apply a",
    "apply b",
    "committed",
    "settle a",
    "settle b",
    "finished",
];

/// A trace id and a caller's span id of our own, as a caller's tracer would make them.
fn callers_traceparent() -> (String, String, String) {
    let trace_id = format!("{:032x}", rand::random::<u128>() | 1);
    let span_id = format!("{:016x}", rand::random::<u64>() | 1);
    let traceparent = format!("00-{trace_id}-{span_id}-01");
    (trace_id, span_id, traceparent)
}

/// The service exporting its spans to `jaeger`.
fn exporting_to(jaeger: &Jaeger) -> Vec<(&'static str, String)> {
    vec![("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp.clone())]
}

/// The service exporting its spans to `jaeger`, and delivering webhooks to `receiver`.
fn traced_env(
    jaeger: &Jaeger,
    receiver: &support::receiver::Receiver,
) -> Vec<(&'static str, String)> {
    let mut env = exporting_to(jaeger);
    env.push(("OTEL_SERVICE_NAME", "transfer-service-test".to_owned()));
    env.extend(webhook_env(receiver));
    env
}

/// The service with `env` on an embedded store of its own, ready, after the store's
/// directory (bound in this order, the service is stopped before its directory goes).
async fn on_the_embedded_store(
    mut env: Vec<(&'static str, String)>,
) -> (tempfile::TempDir, Service) {
    let data = tempfile::tempdir().unwrap();
    env.push(("DATA_DIR", data.path().display().to_string()));
    let service = Service::start_ready(&env).await;
    (data, service)
}

/// Opens each of `ids` with `balance`.
async fn open(base: &str, ids: &[&str], balance: i64) {
    let client = reqwest::Client::new();
    for id in ids {
        let body = json!({"id": id, "balance": balance});
        let (status, answer) = post_answered(&client, base, "/accounts", &body, &[]).await;
        assert_eq!(status, 201, "{answer}");
    }
}

/// Opens `a` and `b`, posts a transfer from `a` to `b` with a caller's `traceparent` (again
/// after a `503`, as a caller does, with the same `traceparent`), waits until it is finished,
/// and returns its id, the trace id and the caller's span id.
async fn post_traced_transfer(base: &str) -> (String, String, String) {
    let client = reqwest::Client::new();
    open(base, &["a", "b"], 100).await;
    let (trace_id, caller_span, traceparent) = callers_traceparent();
    let id = format!("traced-{trace_id}");
    let body = json!({"id": id, "from": "a", "to": "b", "amount": 5});
    let headers = [("traceparent", traceparent.as_str())];
    let (status, answer) = post_answered(&client, base, "/transfers", &body, &headers).await;
    // 200: an earlier attempt answered 503 had created it after all.
    assert!(status == 201 || status == 200, "{status} {answer}");
    support::wait::eventually("the transfer finished", || async {
        get_ok(&client, base, &format!("/transfers/{id}")).await["state"] == "finished"
    })
    .await;
    (id, trace_id, caller_span)
}

/// Waits until Jaeger holds the whole trace: the steps, and a webhook delivery answered 2xx.
async fn whole_trace(jaeger: &Jaeger, trace_id: &str) -> Vec<Span> {
    trace_once(jaeger, trace_id, |spans| {
        let steps_there = STEPS
            .iter()
            .all(|step| spans.iter().any(|s| s.name == *step));
        let delivered = spans
            .iter()
            .any(|s| s.name == "POST webhook" && answered_2xx(s));
        steps_there && delivered
    })
    .await
}

/// The spans of trace `trace_id` once Jaeger holds what `complete` looks for.
async fn trace_once(
    jaeger: &Jaeger,
    trace_id: &str,
    complete: impl Fn(&[Span]) -> bool,
) -> Vec<Span> {
    let deadline = std::time::Instant::now() + SPANS_ARRIVE_WITHIN;
    loop {
        let spans = jaeger.spans(trace_id).await;
        if complete(&spans) {
            return spans;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the whole trace never reached Jaeger; it holds {:#?}",
            spans.iter().map(|s| (&s.name, &s.tags)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether a delivery's span records a 2xx answer.
fn answered_2xx(span: &Span) -> bool {
    span.tag("http.response.status_code")
        .is_some_and(|status| status.starts_with('2') && status.len() == 3)
}

fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name:?} in {:#?}", names(spans)))
}

/// The last span named `name`: of a step run more than once, the attempt that went through.
fn last_named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    spans
        .iter()
        .rfind(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name:?} in {:#?}", names(spans)))
}

/// The phase of the protocol a step belongs to (`apply a` and `apply b` are one phase).
fn phase(step: &str) -> usize {
    let phase = step.split(' ').next().unwrap_or(step);
    [
        "create",
        "pending",
        "apply",
        "committed",
        "settle",
        "finished",
    ]
    .iter()
    .position(|p| *p == phase)
    .unwrap_or_else(|| panic!("{step:?} is no step of the protocol"))
}

/// Every step of the protocol, below the request, in the protocol's order, each gone through. A step may run more than once: when one is cut off (a write answered with a
/// conflict, as a loaded cluster of several nodes does to a write of its own that it
/// retried, or a store that kept failing), the worker reads the transfer again and runs its
/// state's steps again, each attempt a span of its own. So a repeat is allowed only after an
/// attempt that says why it was cut off, and never goes back to an earlier phase.
fn assert_steps_in_the_protocols_order(spans: &[Span], request: &Span) {
    let steps: Vec<&Span> = spans
        .iter()
        .filter(|s| STEPS.contains(&s.name.as_str()))
        .collect();
    let order: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    let mut first_attempts = order.clone();
    let mut seen = std::collections::HashSet::new();
    first_attempts.retain(|name| seen.insert(*name));
    assert_eq!(first_attempts, STEPS, "the steps in order: {order:?}");
    assert!(
        order.windows(2).all(|w| phase(w[0]) <= phase(w[1])),
        "a step went back to an earlier phase: {order:?}"
    );
    let cut_off: Vec<&&Span> = steps
        .iter()
        .filter(|s| s.tag("outcome").as_deref() != Some("ok"))
        .collect();
    for step in &cut_off {
        assert!(
            matches!(
                step.tag("outcome").as_deref(),
                Some("conflict" | "unavailable")
            ),
            "a step cut off for no reason a retry follows: {step:?}"
        );
    }
    assert!(
        order.len() == STEPS.len() || !cut_off.is_empty(),
        "a step ran again though none was cut off: {order:?}"
    );
    // The last attempt of each step went through, or the transfer was found past it when
    // read again: a state write answered with a conflict because an earlier try of the same
    // write had landed (the cluster's answer lost, the client's retry refused) is a cut-off
    // attempt followed by the next phase's steps, or, for the last write, by nothing (the
    // caller saw the transfer finished before reading its trace).
    for name in STEPS {
        let last = steps
            .iter()
            .rposition(|s| s.name == name)
            .expect("every step ran");
        let outcome = steps[last].tag("outcome");
        let went_on = if name == STEPS[STEPS.len() - 1] {
            outcome.as_deref() == Some("conflict")
        } else {
            steps[last + 1..]
                .iter()
                .any(|s| phase(&s.name) > phase(name) && s.tag("outcome").as_deref() == Some("ok"))
        };
        assert!(
            outcome.as_deref() == Some("ok") || went_on,
            "{name} never went through: {:?}",
            steps[last]
        );
    }
    for step in &steps {
        assert!(
            descends_from(spans, step, request),
            "{} under the request",
            step.name
        );
    }
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

/// Whether `span` descends from `ancestor` in `spans`.
fn descends_from(spans: &[Span], span: &Span, ancestor: &Span) -> bool {
    let mut parent = span.parent.clone();
    while let Some(id) = parent {
        if id == ancestor.id {
            return true;
        }
        parent = spans
            .iter()
            .find(|s| s.id == id)
            .and_then(|s| s.parent.clone());
    }
    false
}

/// What the trace of one transfer must show, whatever the store (`db_system`).
fn assert_one_trace_from_request_to_webhook(
    spans: &[Span],
    caller_span: &str,
    db_system: &str,
    delivered: &support::receiver::Received,
    trace_id: &str,
) {
    // The caller's POSTs: one, or more when a loaded store made the service answer 503 and
    // the caller asked again. Each is a server span, a child of the caller's span.
    let requests: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "POST /transfers")
        .collect();
    for request in &requests {
        assert_eq!(
            request.parent.as_deref(),
            Some(caller_span),
            "the caller's span is the parent"
        );
        assert_eq!(request.tag("span.kind").as_deref(), Some("server"));
        assert_eq!(request.tag("http.route").as_deref(), Some("/transfers"));
    }
    let answered: Vec<String> = requests
        .iter()
        .filter_map(|r| r.tag("http.response.status_code"))
        .collect();
    assert!(
        answered
            .iter()
            .any(|status| status == "201" || status == "200")
            && answered
                .iter()
                .all(|s| ["201", "200", "503"].contains(&s.as_str())),
        "the POSTs answered {answered:?}"
    );
    // The request that made the transfer, whose context the transfer records: its steps are
    // under it.
    let finished = last_named(spans, "finished");
    let request = requests
        .iter()
        .copied()
        .find(|r| descends_from(spans, finished, r))
        .unwrap_or_else(|| panic!("the steps under no POST: {:#?}", names(spans)));
    assert_steps_in_the_protocols_order(spans, request);
    if finished.tag("outcome").as_deref() == Some("ok") {
        assert_eq!(finished.tag("state").as_deref(), Some("finished"));
    }
    // The state writes' store calls, as client spans of the store, inside their steps.
    for state in ["pending", "committed", "finished"] {
        let step = last_named(spans, state);
        let call = spans
            .iter()
            .find(|s| s.parent.as_deref() == Some(step.id.as_str()))
            .unwrap_or_else(|| panic!("no store call under {state}: {:#?}", names(spans)));
        assert_eq!(call.tag("span.kind").as_deref(), Some("client"));
        assert_eq!(call.tag("db.system.name").as_deref(), Some(db_system));
        assert_eq!(
            call.tag("db.collection.name").as_deref(),
            Some("transactions")
        );
    }
    // Each account step's store requests (a batch of one step here) are inside it.
    for step in ["apply a", "apply b", "settle a", "settle b"] {
        let step = last_named(spans, step);
        assert!(
            spans.iter().any(|s| descends_from(spans, s, step)
                && s.tag("db.collection.name").as_deref() == Some("accounts")
                && s.tag("db.system.name").as_deref() == Some(db_system)),
            "no accounts request under {}: {:#?}",
            step.name,
            names(spans)
        );
    }
    // The webhook: a client span of the trace, whose context the receiver got.
    let webhook = spans
        .iter()
        .find(|s| s.name == "POST webhook" && answered_2xx(s))
        .expect("a delivered webhook span");
    assert!(
        descends_from(spans, webhook, request),
        "the delivery under the request"
    );
    let carried: Vec<&str> = delivered.traceparent.split('-').collect();
    assert_eq!(
        carried.get(1).copied(),
        Some(trace_id),
        "{}",
        delivered.traceparent
    );
    assert!(
        spans
            .iter()
            .any(|s| s.name == "POST webhook" && carried.get(2).copied() == Some(s.id.as_str())),
        "the delivery's traceparent names a webhook span: {}",
        delivered.traceparent
    );
}

/// The log line that ends the caller's request names the trace and the request's span as
/// Jaeger holds them: a line in the logs leads to its trace.
async fn assert_request_logged_in_its_trace(service: &Service, spans: &[Span], trace_id: &str) {
    let line = support::wait::until_some("the request's log line in its trace", || async {
        service.lines_in_trace(trace_id).into_iter().find(|line| {
            line["message"] == "request finished" && line["span"]["route"] == "/transfers"
        })
    })
    .await;
    let span_id = line["span_id"].as_str().unwrap_or_default();
    assert!(
        spans
            .iter()
            .any(|s| s.name == "POST /transfers" && s.id == span_id),
        "the line names no request span of the trace: {line}"
    );
}

/// The delivery of `transfer`'s terminal event, once it is there.
async fn delivery_of(
    receiver: &support::receiver::Receiver,
    transfer: &str,
) -> support::receiver::Received {
    support::wait::until_some("the terminal event delivered", || async {
        receiver
            .delivered()
            .into_iter()
            .find(|r| r.transfer() == transfer)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_is_one_trace_from_the_callers_request_to_the_webhook() {
    let Some(jaeger) = Jaeger::start().await else {
        return;
    };
    let receiver = support::receiver::Receiver::start().await;
    let mut env = traced_env(&jaeger, &receiver);
    // The two-phase path, where every step of the protocol is a write of its own.
    env.push(("PROTOCOL", "two-phase".to_owned()));
    let (_data, service) = on_the_embedded_store(env).await;
    let (id, trace_id, caller_span) = post_traced_transfer(&service.base).await;
    let delivered = delivery_of(&receiver, &id).await;
    let spans = whole_trace(&jaeger, &trace_id).await;
    assert_one_trace_from_request_to_webhook(&spans, &caller_span, "redb", &delivered, &trace_id);
    assert_request_logged_in_its_trace(&service, &spans, &trace_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_in_one_transaction_a_transfer_is_the_callers_request_and_its_transaction() {
    let Some(jaeger) = Jaeger::start().await else {
        return;
    };
    // The default protocol: the request settles the transfer in one store transaction, and
    // its trace is just that: the request, naming the transfer, and the transaction in it.
    let (_data, service) = on_the_embedded_store(exporting_to(&jaeger)).await;
    let (id, trace_id, caller_span) = post_traced_transfer(&service.base).await;
    let spans = trace_once(&jaeger, &trace_id, |spans| {
        spans.iter().any(|s| s.name == "POST /transfers")
            && spans.iter().any(|s| s.name == "transact")
    })
    .await;
    let request = named(&spans, "POST /transfers");
    assert_eq!(request.parent.as_deref(), Some(caller_span.as_str()));
    assert_eq!(
        request.tag("http.response.status_code").as_deref(),
        Some("201")
    );
    assert_eq!(request.tag("transfer.id").as_deref(), Some(id.as_str()));
    let transact = named(&spans, "transact");
    assert_eq!(
        transact.parent.as_deref(),
        Some(request.id.as_str()),
        "the transaction in its request: {:#?}",
        names(&spans)
    );
    assert_eq!(transact.tag("span.kind").as_deref(), Some("client"));
    assert_eq!(transact.tag("db.system.name").as_deref(), Some("redb"));
    assert_eq!(transact.tag("outcome").as_deref(), Some("ok"));
    // Nothing else: the transfer's own span is the log lines' (they still name the trace).
    assert_eq!(names(&spans).len(), 2, "{:#?}", names(&spans));
    assert_request_logged_in_its_trace(&service, &spans, &trace_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_real_elasticsearch_a_transfer_is_one_trace_from_the_callers_request_to_the_webhook() {
    let Some(url) = support::cluster::shared() else {
        return;
    };
    let Some(jaeger) = Jaeger::start().await else {
        return;
    };
    let receiver = support::receiver::Receiver::start().await;
    let mut env = traced_env(&jaeger, &receiver);
    env.push(("ELASTICSEARCH_URL", url));
    env.push(("INDEX_PREFIX", support::stores::unique_prefix("traces")));
    env.push((
        "ELASTICSEARCH_SHARDS",
        support::cluster::shards().to_string(),
    ));
    let service = Service::start_ready(&env).await;
    let (id, trace_id, caller_span) = post_traced_transfer(&service.base).await;
    let delivered = delivery_of(&receiver, &id).await;
    let spans = whole_trace(&jaeger, &trace_id).await;
    let engine = if support::cluster::engine().starts_with("opensearch") {
        "opensearch"
    } else {
        "elasticsearch"
    };
    assert_one_trace_from_request_to_webhook(&spans, &caller_span, engine, &delivered, &trace_id);
    assert_request_logged_in_its_trace(&service, &spans, &trace_id).await;
}

/// The trace carries on into the engine: the emulator keeps the `traceparent` headers it
/// receives, as an engine's own tracing would read them, and a traced transfer's requests to
/// it carry the transfer's trace, each naming as its parent one of the service's store calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_to_the_engine_carry_the_transfers_trace() {
    let Some(jaeger) = Jaeger::start().await else {
        return;
    };
    let emulator = support::stores::emulator().await;
    let mut env = exporting_to(&jaeger);
    env.push(("ELASTICSEARCH_URL", emulator.url.clone()));
    env.push(("INDEX_PREFIX", support::stores::unique_prefix("traced")));
    let service = Service::start_ready(&env).await;
    let (_, trace_id, _) = post_traced_transfer(&service.base).await;
    // `00-<trace id>-<parent span id>-<flags>`: the parent of each request in the trace.
    let parents: Vec<String> = emulator
        .traceparents()
        .iter()
        .filter_map(
            |traceparent| match traceparent.split('-').collect::<Vec<_>>()[..] {
                ["00", trace, parent, _] if trace == trace_id => Some(parent.to_owned()),
                _ => None,
            },
        )
        .collect();
    assert!(
        !parents.is_empty(),
        "no request to the engine carried the trace"
    );
    let spans = trace_once(&jaeger, &trace_id, |spans| {
        parents
            .iter()
            .all(|parent| spans.iter().any(|s| s.id == *parent))
    })
    .await;
    for parent in &parents {
        let span = spans.iter().find(|s| s.id == *parent).expect("waited for");
        assert_eq!(span.tag("span.kind").as_deref(), Some("client"), "{span:?}");
        assert_eq!(
            span.tag("db.system.name").as_deref(),
            Some("elasticsearch"),
            "{span:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_recovery_does_to_a_transfer_is_in_its_creating_requests_trace() {
    let Some(jaeger) = Jaeger::start().await else {
        return;
    };
    let (_data, service) = on_the_embedded_store(exporting_to(&jaeger)).await;
    let client = reqwest::Client::new();
    open(&service.base, &["a", "b"], 100).await;
    // A hold left to expire: its worker parks it, and recovery rolls it back at its expiry.
    let (trace_id, _, traceparent) = callers_traceparent();
    let body = json!({"id": "held", "from": "a", "to": "b", "amount": 5, "hold": true, "hold_expires_in": "1s"});
    let answer = client
        .post(format!("{}/transfers", service.base))
        .header("traceparent", &traceparent)
        .json(&body)
        .send()
        .await
        .expect("POST /transfers");
    assert_eq!(answer.status(), 201);
    support::wait::eventually("the hold rolled back at its expiry", || async {
        get_ok(&client, &service.base, "/transfers/held").await["state"] == "rolled-back"
    })
    .await;
    let deadline = std::time::Instant::now() + SPANS_ARRIVE_WITHIN;
    loop {
        let spans = jaeger.spans(&trace_id).await;
        let request = spans.iter().find(|s| s.name == "POST /transfers");
        let recovered = spans.iter().find(|s| {
            s.name.starts_with("transfer ") && s.tag("recovered").as_deref() == Some("true")
        });
        let rolled_back = spans.iter().find(|s| s.name == "rolled-back");
        if let (Some(request), Some(recovered), Some(rolled_back)) =
            (request, recovered, rolled_back)
        {
            assert!(
                descends_from(&spans, recovered, request),
                "recovery's run under the request"
            );
            assert!(
                descends_from(&spans, rolled_back, recovered),
                "its steps under recovery's run"
            );
            assert_eq!(rolled_back.tag("outcome").as_deref(), Some("ok"));
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "recovery's spans never reached the request's trace: {:#?}",
            spans.iter().map(|s| (&s.name, &s.tags)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_stops_costs_spans_counted_not_transfers() {
    let Some(mut jaeger) = Jaeger::start().await else {
        return;
    };
    let mut env = exporting_to(&jaeger);
    env.push(("PROTOCOL", "two-phase".to_owned()));
    let (_data, service) = on_the_embedded_store(env).await;
    let client = reqwest::Client::new();
    open(&service.base, &["acct0", "acct1"], 1000).await;
    let transfer =
        |n: usize| json!({"id": format!("t{n}"), "from": "acct0", "to": "acct1", "amount": 1});
    // Some with the collector up, then the collector gone, and more.
    for n in 0..20 {
        let (status, body) = post(&client, &service.base, "/transfers", &transfer(n))
            .await
            .expect("POST");
        assert_eq!(status, 201, "{body}");
    }
    support::wait::eventually_within(SPANS_ARRIVE_WITHIN, "spans exported", || async {
        scrape(&service.base)
            .await
            .value("trace_spans_exported_total", &[])
            > 0.0
    })
    .await;
    jaeger.kill();
    for n in 20..100 {
        let (status, body) = post(&client, &service.base, "/transfers", &transfer(n))
            .await
            .expect("POST");
        assert_eq!(status, 201, "{body}");
    }
    // Every transfer finishes, as without tracing.
    for n in 0..100 {
        let done = get_ok(&client, &service.base, &format!("/transfers/t{n}?wait=10s")).await;
        assert_eq!(done["state"], "finished", "{done}");
    }
    assert_exact(&service.base, &[900, 1100]).await;
    // The spans the dead collector could not take are counted, not waited for.
    support::wait::eventually_within(SPANS_ARRIVE_WITHIN, "dropped spans counted", || async {
        scrape(&service.base)
            .await
            .value("trace_spans_dropped_total", &[("reason", "export_failed")])
            > 0.0
    })
    .await;
    let metrics = scrape(&service.base).await;
    assert!(
        metrics.value("trace_spans_exported_total", &[]) > 0.0,
        "spans went out before"
    );
}
