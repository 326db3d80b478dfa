//! The change feed over HTTP (`docs/design.md §11`): `GET /events` on the embedded store, the
//! Elasticsearch backend on the emulator (a test double of the Elasticsearch REST subset) and
//! a real cluster (`tools/es-cluster/run`); and two instances writing to one emulator.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::app::{Backend, SharedElasticsearch, TestApp};
use crate::support::feed::{histories, FeedReader};

/// A mixed load on `app` (accounts `a`, `b`, `c`, `empty`): plain transfers, a rollback, a
/// hold captured in part, a hold cancelled, a multi-leg transaction; the ids, once all are
/// terminal.
async fn mixed_load(app: &TestApp, tag: &str) -> Vec<String> {
    let ids: Vec<String> = ["plain", "refused", "held", "cancelled", "legs"]
        .iter()
        .map(|kind| format!("{tag}-{kind}"))
        .collect();
    let bodies = [
        json!({"from": "a", "to": "b", "amount": 3}),
        json!({"from": "empty", "to": "b", "amount": 3}),
        json!({"from": "a", "to": "c", "amount": 5, "hold": true}),
        json!({"from": "b", "to": "c", "amount": 2, "hold": true}),
        json!({"legs": [{"from": "a", "to": "b", "amount": 1}, {"from": "b", "to": "c", "amount": 1}]}),
    ];
    for (id, mut body) in ids.iter().zip(bodies) {
        body["id"] = json!(id);
        let (status, created) = app.post("/transfers", body).await;
        assert_eq!(status, 201, "{created}");
    }
    for (id, action) in [(&ids[2], "capture"), (&ids[3], "cancel")] {
        let (status, body) = app.get(&format!("/transfers/{id}?wait=10s")).await;
        assert_eq!(
            (status, body["state"].as_str()),
            (200, Some("pending")),
            "{body}"
        );
        let body = if action == "capture" {
            json!({"amount": 4})
        } else {
            json!({})
        };
        let (status, answer) = app.post(&format!("/transfers/{id}/{action}"), body).await;
        assert_eq!(status, 200, "{answer}");
    }
    for id in &ids {
        app.settled(id).await;
    }
    ids
}

async fn open_accounts(app: &TestApp) {
    for (id, balance) in [("a", 100), ("b", 100), ("c", 0), ("empty", 0)] {
        app.open_account(id, balance).await;
    }
}

mod cases {
    use super::*;

    pub async fn a_consumer_from_the_start_sees_every_event_of_a_mixed_load_in_order(b: Backend) {
        let app = TestApp::spawn(b).await;
        open_accounts(&app).await;
        let ids = mixed_load(&app, "m").await;
        let expected = histories(&app, &ids).await;
        assert_eq!(
            expected["m-held"],
            [
                "transfer.created",
                "transfer.pending",
                "transfer.captured",
                "transfer.committed",
                "transfer.finished"
            ]
        );
        assert_eq!(
            expected["m-refused"].last().unwrap(),
            "transfer.rolled-back"
        );
        let mut reader = FeedReader::new(2);
        reader.read_until_complete(&app, &expected).await;
    }

    pub async fn an_event_carries_its_id_type_time_and_the_transfer(b: Backend) {
        let app = TestApp::spawn(b).await;
        open_accounts(&app).await;
        app.transfer_accepted("t1", "a", "b", 7).await;
        app.settled("t1").await;
        let mut reader = FeedReader::new(10);
        let expected = histories(&app, &["t1".to_owned()]).await;
        reader.read_until_complete(&app, &expected).await;
        // Read again from the start: the whole page, as a consumer gets it.
        let (status, page) = app.get("/events").await;
        assert_eq!(status, 200, "{page}");
        let finished = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "transfer.finished")
            .expect("the finished event");
        assert_eq!(finished["id"], "t1/transfer.finished");
        let at = finished["at"].as_str().unwrap();
        assert!(
            at.ends_with('Z') && at.len() == 24,
            "RFC 3339 with ms: {at}"
        );
        assert_eq!(finished["transfer"]["id"], "t1");
        assert_eq!(finished["transfer"]["amount"], 7);
        assert_eq!(finished["transfer"]["state"], "finished");
        assert!(page["next_cursor"].is_string(), "{page}");
    }

    pub async fn cursors_past_the_end_or_of_another_store_are_422_saying_what_to_do(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 100), ("b", 0)]).await;
        app.transfer_accepted("t1", "a", "b", 7).await;
        app.settled("t1").await;
        // The end of the feed, once it serves the transfer (on Elasticsearch, past its horizon).
        let cursor = crate::support::wait::until_some("a cursor", || async {
            let (status, page) = app.get("/events?limit=1000&wait=1s").await;
            assert_eq!(status, 200, "{page}");
            page["next_cursor"].as_str().map(str::to_owned)
        })
        .await;
        let (identity, position) = cursor.split_once('~').expect("<identity>~<position>");
        let (status, page) = app.get(&format!("/events?after={cursor}")).await;
        assert_eq!(status, 200, "the cursor it issued: {page}");
        let (status, page) = app.get("/events?after=now").await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["next_cursor"], cursor.as_str(), "`now` is the end");
        // A position as cursors were before they carried the store's identity.
        let (status, page) = app.get(&format!("/events?after={position}")).await;
        assert_eq!(status, 200, "{position}: {page}");

        let past = match b {
            Backend::Embedded => {
                let seq: u64 = position.parse().unwrap();
                format!("{identity}~{}", seq + 1000)
            }
            _ => {
                let hour_ahead = chrono_millis_now() + 3_600_000;
                format!("{identity}~{hour_ahead}~t1")
            }
        };
        let (status, problem) = app.get(&format!("/events?after={past}")).await;
        assert_eq!(status, 422, "{past}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("past the end of this feed"), "{detail}");
        assert!(detail.contains("at the beginning"), "{detail}");

        let foreign = format!("x{identity}~{position}");
        let (status, problem) = app.get(&format!("/events?after={foreign}")).await;
        assert_eq!(status, 422, "{foreign}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("issued by another store"), "{detail}");
        assert!(
            detail.contains(&format!("this one is {identity}")),
            "{detail}"
        );
        app.shutdown().await;
    }

    fn chrono_millis_now() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    }

    pub async fn a_long_poll_answers_when_a_transfer_is_written(b: Backend) {
        let app = TestApp::spawn(b).await;
        open_accounts(&app).await;
        let mut reader = FeedReader::new(100);
        // Nothing yet: an empty page answers when its wait ends.
        assert_eq!(reader.read_page(&app, "200ms").await, 0);
        let poll = async {
            let started = Instant::now();
            let mut events = 0;
            while events == 0 {
                events = reader.read_page(&app, "20s").await;
            }
            started.elapsed()
        };
        let write = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            app.transfer_accepted("t1", "a", "b", 1).await;
        };
        let (waited, ()) = tokio::join!(poll, write);
        assert!(
            waited < Duration::from_secs(15),
            "answered after {waited:?}"
        );
    }

    pub async fn bad_parameters_are_422_problems(b: Backend) {
        let app = TestApp::spawn(b).await;
        let foreign = match b {
            Backend::Embedded => "1700000000000~t-1",
            _ => "17",
        };
        for query in [
            "limit=0".to_owned(),
            "limit=1001".to_owned(),
            "limit=x".to_owned(),
            "after=".to_owned(),
            "after=-1".to_owned(),
            "after=%20".to_owned(),
            format!("after={foreign}"),
            "wait=5".to_owned(),
            "since=1".to_owned(),
            "limit=1&limit=2".to_owned(),
        ] {
            let (status, body) = app.get(&format!("/events?{query}")).await;
            assert_eq!(status, 422, "{query}: {body}");
            assert_eq!(body["status"], 422, "{query}: {body}");
        }
    }
}

on_every_backend!(
    a_consumer_from_the_start_sees_every_event_of_a_mixed_load_in_order,
    an_event_carries_its_id_type_time_and_the_transfer,
    a_long_poll_answers_when_a_transfer_is_written,
    bad_parameters_are_422_problems,
    cursors_past_the_end_or_of_another_store_are_422_saying_what_to_do,
);

// Two instances on one Elasticsearch, each taking half the load; a consumer on either sees
// every event of both. On the emulator (a test double) and on the real cluster.
case_on_backends!(with_two_instances_a_consumer_of_either_sees_every_event:
    with_two_instances_on_one_store_a_consumer_of_either_sees_every_event => Emulator,
    with_two_instances_on_real_elasticsearch_a_consumer_of_either_sees_every_event => RealEs,
);

async fn with_two_instances_a_consumer_of_either_sees_every_event(backend: Backend) {
    let Some(shared) = SharedElasticsearch::on(backend).await else {
        return;
    };
    let first = TestApp::spawn_with(Backend::Embedded, |c| shared.configure(c)).await;
    let second = TestApp::spawn_with(Backend::Embedded, |c| shared.configure(c)).await;
    open_accounts(&first).await;
    let (one, two) = tokio::join!(mixed_load(&first, "one"), mixed_load(&second, "two"));
    let ids: Vec<String> = one.into_iter().chain(two).collect();
    let expected = histories(&first, &ids).await;
    for app in [&first, &second] {
        let mut reader = FeedReader::new(3);
        reader.read_until_complete(app, &expected).await;
    }
}
