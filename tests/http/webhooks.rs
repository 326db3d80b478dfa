//! Webhooks (docs/api.md "Webhooks", docs/design.md §11 "Webhooks"): a loopback receiver
//! (`tests/support/receiver.rs`) gets every selected event of a mixed load, signed, in order
//! per transfer, also when it answers 500 or hangs for a while; events are given up after
//! the retry period; transfers never wait on a receiver; two instances on one store share a
//! receiver's lease. On the embedded store, the Elasticsearch backend on the emulator (a test
//! double of Elasticsearch) and a real cluster (`tools/es-cluster/run`).

use std::time::Duration;

use serde_json::{json, Value};
use transfer_service::config::Config;
use transfer_service::store::elasticsearch::Secret;
use transfer_service::store::embedded::EmbeddedStore;

use crate::support::app::{Backend, SharedElasticsearch, TestApp};
use crate::support::feed::FeedReader;
use crate::support::receiver::{check_deliveries, expected_per_transfer, Receiver, SECRET};
use crate::support::{logs, wait};

/// Every event type.
const ALL_TYPES: [&str; 7] = [
    "transfer.created",
    "transfer.pending",
    "transfer.committed",
    "transfer.finished",
    "transfer.terminating",
    "transfer.rolled-back",
    "transfer.captured",
];
const TERMINAL: [&str; 2] = ["transfer.finished", "transfer.rolled-back"];

/// Webhooks to `receiver` for `types`, with timers for tests: attempts time out after
/// 300 ms, retries wait up to 20 ms × 2^n, at most 200 ms.
fn hooks(receiver: &Receiver, types: &[&str]) -> impl FnOnce(&mut Config) {
    let url = receiver.url();
    let types: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    move |config: &mut Config| {
        config.webhooks.webhook_url = vec![url];
        config.webhooks.webhook_secret = Some(Secret::new(SECRET));
        config.webhooks.webhook_events = types;
        config.webhooks.webhook_timeout = Duration::from_millis(300);
        config.webhooks.webhook_backoff_min = Duration::from_millis(20);
        config.webhooks.webhook_backoff_max = Duration::from_millis(200);
    }
}

/// Plain transfers, one refused for funds (rolled back), a hold captured, a hold cancelled
/// and a multi-leg transaction, each driven to its end; their ids. Accounts are `{tag}-a`...
async fn mixed_load(app: &TestApp, tag: &str) -> Vec<String> {
    let [a, b, c, poor] = ["a", "b", "c", "poor"].map(|x| format!("{tag}-{x}"));
    for (id, balance) in [(&a, 1000), (&b, 0), (&c, 0), (&poor, 1)] {
        app.open_account(id, balance).await;
    }
    let mut ids = Vec::new();
    for n in 0..4 {
        let id = format!("{tag}-p{n}");
        app.transfer_accepted(&id, &a, &b, 10).await;
        ids.push(id);
    }
    let id = format!("{tag}-refused");
    app.transfer_accepted(&id, &poor, &b, 5).await;
    ids.push(id);
    for (id, then) in [
        (format!("{tag}-h1"), "capture"),
        (format!("{tag}-h2"), "cancel"),
    ] {
        let (status, body) = app
            .post(
                "/transfers",
                json!({"id": id, "from": a, "to": b, "amount": 20, "hold": true}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        wait::eventually(&format!("{id} to wait for its capture"), || async {
            let (_, body) = app.get(&format!("/transfers/{id}?wait=5s")).await;
            body["state"] == "pending" && body["hold"] == true
        })
        .await;
        let (status, body) = app
            .post(&format!("/transfers/{id}/{then}"), json!({}))
            .await;
        assert_eq!(status, 200, "{then} {id}: {body}");
        ids.push(id);
    }
    let id = format!("{tag}-m");
    let legs = json!([{"from": a, "to": b, "amount": 3}, {"from": a, "to": c, "amount": 4}]);
    let (status, body) = app
        .post("/transfers", json!({"id": id, "legs": legs}))
        .await;
    assert_eq!(status, 201, "{body}");
    ids.push(id);
    for id in &ids {
        app.settled(id).await;
    }
    ids
}

/// Every event of `GET /events` from the start, once every transfer of `ids` shows its
/// terminal event there (on Elasticsearch the feed trails the present).
async fn feed_with(app: &TestApp, ids: &[String]) -> Vec<Value> {
    wait::until_some("the feed to show every terminal event", || async {
        let mut events = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let path = match &after {
                Some(cursor) => format!("/events?limit=1000&after={cursor}"),
                None => "/events?limit=1000".to_owned(),
            };
            let (status, page) = app.get(&path).await;
            assert_eq!(status, 200, "{page}");
            let items = page["items"].as_array().unwrap().clone();
            if items.is_empty() {
                break;
            }
            events.extend(items);
            after = page["next_cursor"].as_str().map(str::to_owned);
        }
        let terminal = |id: &String| {
            events.iter().any(|e| {
                e["transfer"]["id"] == id.as_str()
                    && TERMINAL.contains(&e["type"].as_str().unwrap())
            })
        };
        ids.iter().all(terminal).then_some(events)
    })
    .await
}

/// Waits until `receiver` has every expected id, then checks every delivery.
async fn all_delivered(
    receiver: &Receiver,
    expected: &std::collections::BTreeMap<String, Vec<String>>,
) -> (usize, usize) {
    let want: Vec<&String> = expected.values().flatten().collect();
    wait::eventually_within(
        Duration::from_secs(60),
        "every event to be delivered",
        || async {
            let got = receiver.delivered_ids();
            want.iter().all(|id| got.contains(*id))
        },
    )
    .await;
    check_deliveries(receiver, expected)
}

mod cases {
    use super::*;

    pub async fn every_event_of_a_mixed_load_is_delivered_signed_and_in_order_despite_500s_and_hangs(
        b: Backend,
    ) {
        let receiver = Receiver::start().await;
        // The first attempts fail: three 500s, then two that hang past WEBHOOK_TIMEOUT, then
        // every fifth answer is a 500.
        receiver.fail_next(3);
        receiver.hang_next(2);
        receiver.fail_every(5);
        let app = TestApp::spawn_with(b, hooks(&receiver, &ALL_TYPES)).await;
        let ids = mixed_load(&app, "mix").await;
        let events = feed_with(&app, &ids).await;
        let expected = expected_per_transfer(&events, &ALL_TYPES);
        assert_eq!(expected.len(), ids.len());
        // Each kind of transfer brought its events.
        let kinds: Vec<&str> = expected
            .values()
            .flatten()
            .map(|id| id.rsplit_once('/').unwrap().1)
            .collect();
        for kind in ALL_TYPES {
            assert!(kinds.contains(&kind), "no {kind} in {expected:?}");
        }
        let (deliveries, distinct) = all_delivered(&receiver, &expected).await;
        assert_eq!(distinct, expected.values().flatten().count());
        let requests = receiver.requests();
        assert!(requests.iter().filter(|r| r.status == 500).count() >= 3);
        assert_eq!(
            requests.iter().filter(|r| r.status == 0).count(),
            2,
            "two hung"
        );
        // The receiver counts a delivery when it answers, the dispatcher a moment later.
        wait::eventually("the dispatcher to count every delivery", || async {
            let metrics = app.scrape().await;
            metrics.value("webhook_deliveries_total", &[("outcome", "delivered")])
                >= deliveries as f64
                && metrics.sum("webhook_delivery_lag_seconds_count") >= deliveries as f64
        })
        .await;
        let metrics = app.scrape().await;
        assert!(metrics.value("webhook_deliveries_total", &[("outcome", "failed")]) >= 5.0);
        assert_eq!(
            metrics.value("webhook_deliveries_total", &[("outcome", "given_up")]),
            0.0
        );
        app.shutdown().await;
    }

    pub async fn only_the_terminal_events_are_delivered_by_default(b: Backend) {
        let receiver = Receiver::start().await;
        let app = TestApp::spawn_with(b, |config| {
            hooks(&receiver, &ALL_TYPES)(config);
            config.webhooks.webhook_events =
                transfer_service::webhooks::WebhookArgs::default().webhook_events;
        })
        .await;
        let ids = mixed_load(&app, "term").await;
        let events = feed_with(&app, &ids).await;
        let expected = expected_per_transfer(&events, &TERMINAL);
        assert_eq!(expected.values().flatten().count(), ids.len());
        all_delivered(&receiver, &expected).await;
        let rolled_back = receiver
            .delivered_ids()
            .iter()
            .filter(|id| id.ends_with("/transfer.rolled-back"))
            .count();
        assert_eq!(
            rolled_back, 2,
            "the refused transfer and the cancelled hold"
        );
        app.shutdown().await;
    }

    pub async fn an_event_is_given_up_after_the_retry_period_and_the_next_ones_flow(b: Backend) {
        let receiver = Receiver::start().await;
        receiver.fail_next(usize::MAX / 2);
        let app = TestApp::spawn_with(b, |config| {
            hooks(&receiver, &TERMINAL)(config);
            // Longer than the feed's delay on Elasticsearch (about 2 s with the test timers),
            // so the event is retried before it is given up.
            config.webhooks.webhook_retry_period = Duration::from_secs(5);
        })
        .await;
        app.open_accounts([("a", 100), ("b", 0)]).await;
        // Ids of their own per backend: the log lines of every test of this binary are shared.
        let lost = format!("lost-{b:?}");
        let lost_event = format!("{lost}/transfer.finished");
        let kept = format!("kept-{b:?}");
        app.transfer_accepted(&lost, "a", "b", 1).await;
        app.settled(&lost).await;
        wait::eventually_within(
            Duration::from_secs(60),
            "the event to be given up",
            || async {
                app.scrape()
                    .await
                    .value("webhook_deliveries_total", &[("outcome", "given_up")])
                    == 1.0
            },
        )
        .await;
        let metrics = app.scrape().await;
        assert!(metrics.value("webhook_deliveries_total", &[("outcome", "failed")]) >= 1.0);
        assert!(receiver.requests().iter().all(|r| r.id == lost_event));
        assert!(logs::lines().iter().any(|line| {
            line["level"] == "WARN"
                && line["id"] == lost_event.as_str()
                && line["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("giving up"))
        }));
        // The receiver is back: later events are delivered, the given-up one is not retried.
        receiver.fail_next(0);
        app.transfer_accepted(&kept, "a", "b", 1).await;
        app.settled(&kept).await;
        wait::eventually_within(
            Duration::from_secs(60),
            "the next event to be delivered",
            || async {
                receiver
                    .delivered_ids()
                    .contains(&format!("{kept}/transfer.finished"))
            },
        )
        .await;
        assert!(!receiver.delivered_ids().contains(&lost_event));
        app.shutdown().await;
    }

    pub async fn transfers_never_wait_on_a_receiver_that_hangs(b: Backend) {
        let receiver = Receiver::start().await;
        receiver.hang_next(usize::MAX / 2);
        let app = TestApp::spawn_with(b, |config| {
            hooks(&receiver, &ALL_TYPES)(config);
            // Far longer than the whole test: every attempt hangs until the end.
            config.webhooks.webhook_timeout = Duration::from_secs(3600);
        })
        .await;
        app.open_accounts([("a", 1000), ("b", 0)]).await;
        let ids: Vec<String> = (0..40).map(|n| format!("t{n}")).collect();
        let items: Vec<Value> = ids
            .iter()
            .map(|id| json!({"id": id, "from": "a", "to": "b", "amount": 1}))
            .collect();
        let (status, body) = app.batch(items).await;
        assert_eq!(status, 200, "{body}");
        for id in &ids {
            app.settled(id).await;
        }
        assert_eq!(app.balance("b").await, 40);
        // The receiver got requests (and answered none): the dispatcher was at work.
        wait::eventually("the receiver to be asked", || async {
            !receiver.requests().is_empty()
        })
        .await;
        assert!(receiver.delivered().is_empty());
        wait::eventually("the oldest undelivered event to be reported", || async {
            app.scrape().await.sum("webhook_oldest_undelivered_seconds") >= 1.0
        })
        .await;
        app.abort();
    }
}

on_every_backend!(
    every_event_of_a_mixed_load_is_delivered_signed_and_in_order_despite_500s_and_hangs,
    only_the_terminal_events_are_delivered_by_default,
    an_event_is_given_up_after_the_retry_period_and_the_next_ones_flow,
    transfers_never_wait_on_a_receiver_that_hangs,
);

/// Webhook settings refused at start-up, each with a message naming what is wrong.
#[tokio::test]
async fn wrong_webhook_settings_stop_the_start_with_a_clear_message() {
    let error = TestApp::start_error(|config| {
        config.webhooks.webhook_url = vec!["http://127.0.0.1:9/hook".into()];
    })
    .await;
    assert!(error.contains("WEBHOOK_SECRET is required"), "{error}");
    let error = TestApp::start_error(|config| {
        config.webhooks.webhook_url = vec!["http://127.0.0.1:9/hook".into()];
        config.webhooks.webhook_secret = Some(Secret::new(SECRET));
        config.webhooks.webhook_events = vec!["transfer.done".into()];
    })
    .await;
    assert!(
        error.contains("unknown event type `transfer.done`"),
        "{error}"
    );
}

/// The deliveries `app` counted by `path` (`fast` or `feed`).
async fn lag_count(app: &TestApp, path: &str) -> f64 {
    app.scrape()
        .await
        .find("webhook_delivery_lag_seconds_count", &[("path", path)])
        .unwrap_or(0.0)
}

/// Whether each instance holds the receiver's delivery lease, by its `webhook_lease_held`.
async fn lease_held(apps: &[&TestApp]) -> Vec<bool> {
    let mut held = Vec::new();
    for app in apps {
        held.push(app.scrape().await.sum("webhook_lease_held") >= 1.0);
    }
    held
}

/// On Elasticsearch the feed trails by its horizon; a transfer this instance writes terminal
/// reaches the receiver by the fast path long before the feed could serve it (docs/design.md
/// §11 "Webhooks").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_emulator_a_terminal_event_comes_by_the_fast_path_before_the_feeds_horizon() {
    a_terminal_event_comes_by_the_fast_path_before_the_feeds_horizon(Backend::Emulator).await;
}

/// The same on the real cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_real_elasticsearch_a_terminal_event_comes_by_the_fast_path_before_the_horizon() {
    if crate::support::stores::real_cluster().is_none() {
        return;
    }
    a_terminal_event_comes_by_the_fast_path_before_the_feeds_horizon(Backend::RealEs).await;
}

async fn a_terminal_event_comes_by_the_fast_path_before_the_feeds_horizon(backend: Backend) {
    let receiver = Receiver::start().await;
    // The defaults' horizon: 1 s (refresh) + 5 s (STORE_TIMEOUT) + 2 × 7.5 s (the skew
    // margins, a quarter of LEASE_DURATION each): 21 s.
    let app = TestApp::spawn_with(backend, |config| {
        hooks(&receiver, &TERMINAL)(config);
        config.lease_duration = Duration::from_secs(30);
        config.store_timeout = Duration::from_secs(5);
    })
    .await;
    let horizon = Duration::from_secs(21);
    wait::eventually("this instance to hold the receiver's lease", || async {
        lease_held(&[&app]).await == [true]
    })
    .await;
    app.open_accounts([("fast-a", 100), ("fast-b", 0)]).await;
    app.transfer_accepted("fast-t", "fast-a", "fast-b", 10)
        .await;
    assert_eq!(app.settled("fast-t").await["state"], "finished");
    let terminal = std::time::Instant::now();
    wait::eventually_within(
        horizon / 2,
        "the terminal event, by the fast path",
        || async {
            receiver
                .delivered_ids()
                .iter()
                .any(|id| id == "fast-t/transfer.finished")
        },
    )
    .await;
    assert!(terminal.elapsed() < horizon / 2, "{:?}", terminal.elapsed());
    // The receiver counts the delivery when it answers; the dispatcher records its lag a
    // moment later, when the answer reaches it.
    let lag_counts = || async {
        let metrics = app.scrape().await;
        let by_path = |path| metrics.find("webhook_delivery_lag_seconds_count", &[("path", path)]);
        (by_path("fast"), by_path("feed"))
    };
    wait::eventually("the dispatcher to record the delivery", || async {
        lag_counts().await.0.is_some()
    })
    .await;
    assert_eq!(lag_counts().await, (Some(1.0), None));
    app.shutdown().await;
}

case_on_backends!(two_instances_share_a_receiver_and_hand_over:
    /// Two instances on one emulator (a test double of Elasticsearch), one index prefix, one
    /// receiver: one instance delivers at a time; when it stops, the other takes the lease over
    /// from the saved cursor; every event reaches the receiver, repeats only by id and few.
    two_instances_share_a_receiver_one_lease_at_a_time_and_hand_over => Emulator,
    /// The same on the real cluster.
    on_real_elasticsearch_two_instances_share_a_receiver_and_hand_over => RealEs,
);

async fn two_instances_share_a_receiver_and_hand_over(backend: Backend) {
    // The store outlives both instances.
    let Some(shared) = SharedElasticsearch::on(backend).await else {
        return;
    };
    let receiver = Receiver::start().await;
    receiver.fail_every(4);
    // A lease well above a loaded machine's stalls: in this test the holder never loses it
    // to a stall, so "one at a time" is exact (a stall would cost duplicates, not a gap).
    let lease = Duration::from_secs(6);
    let on_shared = |config: &mut Config| {
        hooks(&receiver, &ALL_TYPES)(config);
        config.lease_duration = lease;
        shared.configure(config);
    };
    let first = TestApp::spawn_with(Backend::Embedded, on_shared).await;
    let second = TestApp::spawn_with(Backend::Embedded, on_shared).await;
    for app in [&first, &second] {
        assert_eq!(app.store().backend(), "elasticsearch");
    }
    let held = wait::until_some("one instance to hold the lease", || async {
        let held = lease_held(&[&first, &second]).await;
        held.contains(&true).then_some(held)
    })
    .await;
    assert_eq!(held.iter().filter(|h| **h).count(), 1, "{held:?}");
    // Load on both; meanwhile the lease stays with one of them.
    let sampling = async {
        let mut samples = 0;
        for _ in 0..20 {
            let held = lease_held(&[&first, &second]).await;
            assert!(
                held.iter().filter(|h| **h).count() <= 1,
                "both hold it: {held:?}"
            );
            samples += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        samples
    };
    let (one, two, samples) = tokio::join!(
        mixed_load(&first, "one"),
        mixed_load(&second, "two"),
        sampling
    );
    assert_eq!(samples, 20);
    let held = lease_held(&[&first, &second]).await;
    assert_eq!(held.iter().filter(|h| **h).count(), 1, "{held:?}");
    // The holder stops (saving its cursor, releasing the lease); the other takes over.
    let (holder, survivor) = if held[0] {
        (first, second)
    } else {
        (second, first)
    };
    holder.shutdown().await;
    wait::eventually("the other instance to take the lease over", || async {
        lease_held(&[&survivor]).await == [true]
    })
    .await;
    let three = mixed_load(&survivor, "three").await;
    let ids: Vec<String> = one.into_iter().chain(two).chain(three).collect();
    let events = feed_with(&survivor, &ids).await;
    let expected = expected_per_transfer(&events, &ALL_TYPES);
    let (deliveries, distinct) = all_delivered(&receiver, &expected).await;
    assert!(
        deliveries <= distinct * 2,
        "{deliveries} deliveries of {distinct} events: too many repeats"
    );
    survivor.shutdown().await;
}

case_on_backends!(each_instance_delivers_its_writes_fast_and_the_holder_only_the_rest:
    /// Two instances behind one receiver on the emulator: the one without the receiver's lease
    /// delivers what it writes by its own fast path, and the holder, reading the feed a horizon
    /// later, does not deliver it again; a transfer whose writer dies before its fast delivery
    /// succeeds is delivered by the holder from the feed (docs/design.md §11 "Webhooks").
    on_the_emulator_each_instance_delivers_its_writes_fast_and_the_holder_only_the_rest => Emulator,
    /// The same on the real cluster.
    on_real_elasticsearch_each_instance_delivers_its_writes_fast_and_the_holder_only_the_rest
        => RealEs,
);

async fn each_instance_delivers_its_writes_fast_and_the_holder_only_the_rest(backend: Backend) {
    let Some(shared) = SharedElasticsearch::on(backend).await else {
        return;
    };
    let receiver = Receiver::start().await;
    let on_shared = |config: &mut Config| {
        hooks(&receiver, &TERMINAL)(config);
        // Long enough that the holder keeps the lease on a loaded machine.
        config.lease_duration = Duration::from_secs(6);
        shared.configure(config);
    };
    let holder = TestApp::spawn_with(Backend::Embedded, on_shared).await;
    wait::eventually(
        "the first instance to hold the receiver's lease",
        || async { lease_held(&[&holder]).await == [true] },
    )
    .await;
    let writer = TestApp::spawn_with(Backend::Embedded, on_shared).await;
    writer.open_accounts([("w-a", 100), ("w-b", 0)]).await;
    let ids: Vec<String> = (0..10).map(|n| format!("w-{n}")).collect();
    for id in &ids {
        writer.transfer_accepted(id, "w-a", "w-b", 1).await;
    }
    wait::eventually("the writer's fast path to deliver its ten", || async {
        lag_count(&writer, "fast").await == 10.0
    })
    .await;

    // The last transfer's writer stops while the receiver refuses its fast delivery.
    receiver.fail_next(usize::MAX / 2);
    writer.transfer_accepted("w-last", "w-a", "w-b", 1).await;
    assert_eq!(writer.settled("w-last").await["state"], "finished");
    wait::eventually("the writer's fast path to try it", || async {
        receiver
            .requests()
            .iter()
            .any(|r| r.id == "w-last/transfer.finished")
    })
    .await;
    // Stopped, not aborted: an aborted server's tasks run on in this process until they see
    // the shutdown, and a retry of theirs could reach the receiver once it accepts again,
    // a second delivery that a dead process could not make.
    writer.shutdown().await;
    receiver.fail_next(0);
    wait::eventually_within(
        Duration::from_secs(60),
        "the holder to deliver it from the feed",
        || async {
            receiver
                .delivered_ids()
                .contains("w-last/transfer.finished")
        },
    )
    .await;
    wait::eventually("the holder to record that delivery", || async {
        lag_count(&holder, "feed").await >= 1.0
    })
    .await;
    // The feed served the ten before the last: the holder delivered none of them again.
    assert_eq!(lag_count(&holder, "feed").await, 1.0);
    let delivered = receiver.delivered();
    for id in ids.iter().chain([&"w-last".to_owned()]) {
        let event = format!("{id}/transfer.finished");
        let times = delivered.iter().filter(|r| r.id == event).count();
        assert_eq!(times, 1, "{event} delivered {times} times");
    }
    holder.shutdown().await;
}

/// The Python verifier of the API guide's "Webhooks" section, taken from docs/api.md itself so
/// the two cannot drift, accepts a real delivery and refuses it tampered or under another key.
/// Needs `python3` (`.ci/run` installs it): without it the test fails under CI and skips
/// loudly elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_guides_python_verifier_accepts_a_real_delivery_and_refuses_a_forged_one() {
    if !crate::support::skip::on_path("python3") {
        crate::support::skip::or_fail_under_ci(
            "the API guide's Python verifier test",
            "python3 is not installed (apt-get install python3)",
        );
        return;
    }
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md"))
        .expect("docs/api.md");
    let section = &guide[guide
        .find("**Verifying a signature**")
        .expect("docs/api.md: the section \"Verifying a signature\"")..];
    let start = section.find("```python\n").expect("a python block") + "```python\n".len();
    let verifier = &section[start..start + section[start..].find("```").expect("its end")];

    let receiver = Receiver::start().await;
    let app = TestApp::spawn_with(Backend::Embedded, hooks(&receiver, &TERMINAL)).await;
    app.open_accounts([("a", 10), ("b", 0)]).await;
    app.transfer_accepted("t1", "a", "b", 3).await;
    let delivery = wait::until_some("a delivery", || async {
        receiver.delivered().into_iter().next()
    })
    .await;

    let check = |secret: &str, body: &[u8]| {
        let script = format!(
            "{verifier}\nimport json, sys\nd = json.load(sys.stdin)\n\
             print(verify(d['secret'], d['headers'], bytes.fromhex(d['body'])))\n"
        );
        let input = json!({
            "secret": secret,
            "headers": {
                "webhook-id": delivery.id,
                "webhook-timestamp": delivery.timestamp,
                "webhook-signature": delivery.signature,
            },
            "body": body.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        });
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().expect("python3 ran");
        assert!(out.status.success(), "the verifier failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(check(SECRET, &delivery.body), "True");
    let mut forged = delivery.body.clone();
    forged.extend_from_slice(b" ");
    assert_eq!(check(SECRET, &forged), "False", "a changed body");
    let other_key = "whsec_b3RoZXIta2V5LW9mLXNpeHRlZW4tYnl0ZXM=";
    assert_eq!(check(other_key, &delivery.body), "False", "another key");
    app.shutdown().await;
}

/// While the change feed cannot be read (the store answers 503), the oldest-undelivered
/// gauge grows from the last read that answered instead of reading 0, so the
/// `WebhookDeliveriesBehind` alert can fire; it falls back once reads answer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_undelivered_age_grows_while_the_feed_cannot_be_read() {
    let receiver = Receiver::start().await;
    let hooks = hooks(&receiver, &TERMINAL);
    // A lease long enough to outlast the outage: the holder keeps it and keeps trying.
    let app = TestApp::spawn_with(Backend::Emulator, |c| {
        hooks(c);
        c.lease_duration = Duration::from_secs(60);
    })
    .await;
    let age = || async { app.scrape().await.sum("webhook_oldest_undelivered_seconds") };
    wait::eventually("the delivery lease held", || async {
        app.scrape().await.sum("webhook_lease_held") == 1.0
    })
    .await;
    app.emulator().set_unavailable(true);
    wait::eventually("the age to grow during the outage", || async {
        age().await >= 2.0
    })
    .await;
    app.emulator().set_unavailable(false);
    wait::eventually("the age back to 0 once the feed answers", || async {
        age().await == 0.0
    })
    .await;
    app.shutdown().await;
}

/// `WEBHOOK_START`: a URL seen for the first time gets the store's history by default
/// (`beginning`), and only what happens after the service started with `now`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_url_starts_at_the_beginning_or_with_webhook_start_now_at_the_end() {
    let first = TestApp::spawn(Backend::Emulator).await;
    let url = first.emulator().url.clone();
    first.open_accounts([("a", 100), ("b", 0)]).await;
    for id in ["old-1", "old-2"] {
        first.transfer_accepted(id, "a", "b", 1).await;
        first.settled(id).await;
    }
    // The history is served (below the feed's horizon) before the receivers are added.
    let mut reader = FeedReader::new(100);
    let old = crate::support::feed::histories(&first, &["old-1".into(), "old-2".into()]).await;
    reader.read_until_complete(&first, &old).await;

    let from_start = Receiver::start().await;
    let from_now = Receiver::start().await;
    let with = |receiver: &Receiver, start: &str| {
        let hooks = hooks(receiver, &TERMINAL);
        let (url, start) = (url.clone(), start.to_owned());
        move |c: &mut Config| {
            hooks(c);
            c.elasticsearch_url = Some(url);
            c.webhooks.webhook_start = start;
        }
    };
    let beginning = TestApp::spawn_with(Backend::Embedded, with(&from_start, "beginning")).await;
    let now = TestApp::spawn_with(Backend::Embedded, with(&from_now, "now")).await;
    first.transfer_accepted("new-1", "a", "b", 1).await;
    first.settled("new-1").await;
    let ids = |r: &Receiver| -> Vec<String> { r.delivered_ids().into_iter().collect() };
    wait::eventually("every event delivered from the beginning", || async {
        ids(&from_start).len() == 3
    })
    .await;
    wait::eventually("the new event delivered from now", || async {
        !ids(&from_now).is_empty()
    })
    .await;
    assert_eq!(ids(&from_now), ["new-1/transfer.finished"]);
    for app in [beginning, now, first] {
        app.shutdown().await;
    }
}

/// A saved cursor that is not a position of this store's feed is refused when delivery
/// starts: one of another store (a store moved to another cluster), or one past the feed's
/// end (a store restored from an older backup). Delivering after it would skip every event up
/// to it (past the end: t-3's event would never come); instead the receiver gets the feed from
/// the start again (repeats are by `webhook-id`), and an ERROR says why. The control: the
/// same restart with the cursor as saved logs no such ERROR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_cursor_not_of_this_stores_feed_is_refused_and_delivery_starts_over() {
    for tampering in [
        Tampering::None,
        Tampering::AnotherStore,
        Tampering::PastTheEnd,
    ] {
        // The embedded store, whose feed is exact: the saved cursor is at the last event.
        let dir = tempfile::tempdir().expect("temp dir");
        let receiver = Receiver::start().await;
        let on_dir = |config: &mut Config| {
            hooks(&receiver, &TERMINAL)(config);
            config.data_dir = dir.path().to_owned();
        };
        let first = TestApp::spawn_with(Backend::Embedded, on_dir).await;
        first.open_accounts([("a", 10), ("b", 0)]).await;
        for id in ["t-1", "t-2"] {
            first.transfer_accepted(id, "a", "b", 1).await;
            first.settled(id).await;
        }
        wait::eventually("both terminal events delivered", || async {
            receiver.delivered_ids().len() == 2
        })
        .await;
        first.shutdown().await;
        {
            // The stopped app's last tasks may still hold the store for a moment (the file's
            // lock goes with its last handle).
            let store = wait::until_some("the stopped app's store to open", || async {
                EmbeddedStore::open(dir.path()).ok()
            })
            .await;
            tamper_with_the_saved_cursor(&store, tampering).await;
        }
        let errors_before = cursor_refusals();
        let second = TestApp::spawn_with(Backend::Embedded, on_dir).await;
        second.transfer_accepted("t-3", "a", "b", 1).await;
        second.settled("t-3").await;
        wait::eventually("t-3's terminal event delivered", || async {
            receiver.delivered_ids().len() == 3
        })
        .await;
        let refused = cursor_refusals() > errors_before;
        assert_eq!(refused, tampering != Tampering::None, "{tampering:?}");
        second.shutdown().await;
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tampering {
    None,
    AnotherStore,
    PastTheEnd,
}

/// The ERROR lines so far that say a saved webhook cursor was refused.
fn cursor_refusals() -> usize {
    let refusal = "the saved cursor is not a position of this store";
    logs::lines()
        .iter()
        .filter(|line| line["level"] == "ERROR")
        .filter(|line| {
            line["message"]
                .as_str()
                .is_some_and(|m| m.contains(refusal))
        })
        .count()
}

/// Rewrites the one saved webhook cursor (`<store identity>~<seq_no>` on the embedded store)
/// as `tampering` says.
async fn tamper_with_the_saved_cursor(
    store: &dyn transfer_service::store::Store,
    tampering: Tampering,
) {
    use transfer_service::store::Index;
    let page = store.scan(Index::Webhooks, None, 10).await.expect("scan");
    let [doc] = page.docs.as_slice() else {
        panic!("one progress document, not {}", page.docs.len())
    };
    let mut progress: Value = doc.source.to_value().expect("JSON");
    let cursor = progress["cursor"]
        .as_str()
        .expect("a saved cursor")
        .to_owned();
    let (identity, seq_no) = cursor
        .split_once('~')
        .unwrap_or_else(|| panic!("not <identity>~<seq_no>: {cursor}"));
    let seq_no: u64 = seq_no.parse().expect("a seq_no");
    progress["cursor"] = json!(match tampering {
        Tampering::None => return,
        Tampering::AnotherStore => format!("another-store~{seq_no}"),
        Tampering::PastTheEnd => format!("{identity}~{}", seq_no + 1_000),
    });
    store
        .replace_if(Index::Webhooks, &doc.id, progress.into(), doc.version)
        .await
        .expect("rewrite the cursor");
}
