//! `POST /transfers/batch` (docs/design.md §5): every item answered as `POST /transfers`
//! would answer it, in request order; only the envelope fails the whole request. Run on the
//! embedded store, the Elasticsearch backend on the emulator (a test double of Elasticsearch)
//! and a real cluster (`tools/es-cluster/run`; skipped, saying why, where none can run).

use std::time::Duration;

use crate::support::app::{Backend, TestApp};
use crate::support::faulty::{Fault, FaultyStore, Matcher};
use crate::support::problems::{assert_answer_is_problem, assert_problem};
use serde_json::{json, Value};
use transfer_service::store::DynStore;

fn transfer(id: &str, from: &str, to: &str, amount: i64) -> Value {
    json!({"id": id, "from": from, "to": to, "amount": amount})
}

/// The `items` of a 200 answer, one per item sent.
fn items(status: u16, body: &Value, sent: usize) -> Vec<Value> {
    assert_eq!(status, 200, "{body}");
    let items = body["items"].as_array().expect("items").clone();
    assert_eq!(items.len(), sent, "{body}");
    items
}

mod cases {
    use super::*;

    pub async fn batch_answers_every_item_in_request_order(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;
        let sent = vec![
            transfer("t-3", "A", "B", 30),
            transfer("t-1", "A", "B", 10),
            json!({"from": "A", "to": "B", "amount": 5}),
            transfer("t-2", "B", "A", 1_000),
        ];
        let (status, body) = app.batch(sent).await;
        let items = items(status, &body, 4);
        for (item, id) in items.iter().zip(["t-3", "t-1", "", "t-2"]) {
            assert_eq!(item["status"], 201, "{item}");
            if app.settles_in_one_transaction() {
                // Each item as stored, settled already: t-2 rolled back, B held nothing.
                let (_, stored) = app
                    .get(&format!(
                        "/transfers/{}",
                        item["transfer"]["id"].as_str().unwrap()
                    ))
                    .await;
                assert_eq!(item["transfer"], stored, "{item}");
            } else {
                assert_eq!(item["transfer"]["state"], "created", "{item}");
            }
            assert!(item.get("problem").is_none(), "{item}");
            if !id.is_empty() {
                assert_eq!(item["transfer"]["id"], id, "{item}");
            }
        }
        assert_eq!(items[0]["transfer"]["amount"], 30);
        let made = items[2]["transfer"]["id"].as_str().unwrap().to_owned();
        assert_eq!(uuid::Uuid::parse_str(&made).unwrap().get_version_num(), 7);
        for id in ["t-3", "t-1", made.as_str()] {
            assert_eq!(app.settled(id).await["state"], "finished", "{id}");
        }
        let overdraft = app.settled("t-2").await;
        assert_eq!(overdraft["reason"], "insufficient_funds", "{overdraft}");
        assert_eq!(app.balances(["A", "B"]).await, [55, 45]);
        app.shutdown().await;
    }

    /// Replays and conflicts, against transfers that exist and within the batch: items with
    /// one id behave as sequential single requests, in request order.
    pub async fn replays_and_conflicts_are_answered_per_item(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;
        app.transfer_accepted("old", "A", "B", 10).await;
        let (_, single_conflict) = app.transfer("old", "A", "B", 11).await;
        let sent = vec![
            transfer("old", "A", "B", 10),
            transfer("old", "A", "B", 11),
            transfer("twice", "A", "B", 1),
            transfer("twice", "A", "B", 1),
            transfer("clash", "A", "B", 2),
            transfer("clash", "A", "B", 3),
        ];
        let (status, body) = app.batch(sent).await;
        let items = items(status, &body, 6);
        let statuses: Vec<&Value> = items.iter().map(|i| &i["status"]).collect();
        assert_eq!(statuses, [200, 409, 201, 200, 201, 409], "{body}");
        assert_eq!(items[0]["transfer"]["id"], "old");
        assert_eq!(
            items[1]["problem"], single_conflict,
            "same problem as alone"
        );
        assert_eq!(items[3]["transfer"]["id"], "twice");
        assert_eq!(items[4]["transfer"]["amount"], 2, "the first clash wins");
        assert_eq!(items[5]["problem"]["status"], 409);
        assert_eq!(app.settled("clash").await["amount"], 2);
        app.settled("twice").await;
        app.settled("old").await;
        assert_eq!(app.balances(["A", "B"]).await, [87, 13]);
        app.shutdown().await;
    }

    /// An invalid item is a 422 in its slot with the problem `POST /transfers` gives for the
    /// same body; it creates nothing and the valid items around it go through.
    pub async fn invalid_items_are_422_slots(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;
        let invalid = vec![
            transfer("x1", "A", "B", 0),
            json!({"id": "x2", "from": "A", "to": "B", "amount": 1.5}),
            transfer("x3", "A", "A", 1),
            transfer("bad id", "A", "B", 1),
            json!({"id": "x4", "to": "B", "amount": 1}),
            json!("a string"),
            json!(null),
            json!([1]),
        ];
        let mut sent = vec![transfer("ok-1", "A", "B", 1)];
        sent.extend(invalid.iter().cloned());
        sent.push(transfer("ok-2", "A", "B", 2));
        let (status, body) = app.batch(sent).await;
        let items = items(status, &body, invalid.len() + 2);
        assert_eq!(items[0]["status"], 201, "{body}");
        assert_eq!(items[invalid.len() + 1]["status"], 201, "{body}");
        for (item, body) in items[1..=invalid.len()].iter().zip(&invalid) {
            let (single_status, single) = app.post("/transfers", body.clone()).await;
            assert_problem(single_status, &single, 422);
            assert_eq!(item["status"], 422, "{item}");
            assert_eq!(item["problem"], single, "{body}: same problem as alone");
            assert!(item.get("transfer").is_none(), "{item}");
        }
        for id in ["x1", "x2", "x3", "x4"] {
            assert_eq!(app.get(&format!("/transfers/{id}")).await.0, 404, "{id}");
        }
        app.settled("ok-1").await;
        app.settled("ok-2").await;
        assert_eq!(app.balance("B").await, 3);
        app.shutdown().await;
    }

    /// A field given twice is ambiguous (parsers disagree on which one counts): a 422 naming
    /// it, alone, in a batch item's slot (the items around it go through) and in a leg.
    pub async fn a_field_given_twice_is_422_and_creates_nothing(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;
        let twice = r#"{"id":"d1","from":"A","to":"B","amount":1,"amount":50}"#;
        let in_a_leg = r#"{"id":"d2","legs":[{"from":"A","to":"B","amount":1,"from":"B"}]}"#;
        for (body, detail) in [
            (twice, "`amount` is given more than once"),
            (in_a_leg, "`legs[0].from` is given more than once"),
        ] {
            let response = app
                .post_raw("/transfers", Some("application/json"), body.into())
                .await;
            let status = response.status().as_u16();
            let problem: Value = response.json().await.expect("problem+json");
            assert_problem(status, &problem, 422);
            assert_eq!(problem["detail"], detail, "{body}");
        }
        let batch = format!(
            r#"{{"transfers":[{},{twice},{}]}}"#,
            transfer("ok-1", "A", "B", 1),
            transfer("ok-2", "A", "B", 2)
        );
        let response = app
            .post_raw("/transfers/batch", Some("application/json"), batch.into())
            .await;
        let status = response.status().as_u16();
        let body: Value = response.json().await.expect("JSON");
        let items = items(status, &body, 3);
        assert_eq!(items[1]["status"], 422, "{body}");
        assert_eq!(
            items[1]["problem"]["detail"], "`amount` is given more than once",
            "{body}"
        );
        app.settled("ok-1").await;
        app.settled("ok-2").await;
        for id in ["d1", "d2"] {
            assert_eq!(app.get(&format!("/transfers/{id}")).await.0, 404, "{id}");
        }
        assert_eq!(app.balances(["A", "B"]).await, [97, 3]);
        app.shutdown().await;
    }

    /// What is wrong with the envelope fails the whole request, and creates nothing: 400 not
    /// JSON, 415 not JSON by its type, 413 over the body limit, 422 anything else.
    pub async fn malformed_envelopes_are_problems_for_the_whole_request(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;
        let one = transfer("e-1", "A", "B", 1);
        let huge = format!(
            "{{\"transfers\":[{one}],\"pad\":\"{}\"}}",
            "a".repeat(1_100_000)
        );
        let cases: Vec<(Option<&str>, Vec<u8>, u16)> = vec![
            (Some("application/json"), b"{\"transfers\": [".to_vec(), 400),
            (Some("application/json"), b"".to_vec(), 400),
            (
                Some("text/plain"),
                json!({"transfers": [one]}).to_string().into(),
                415,
            ),
            (Some("application/json"), huge.into_bytes(), 413),
            (
                Some("application/json"),
                json!([one]).to_string().into(),
                422,
            ),
            (Some("application/json"), b"null".to_vec(), 422),
            (Some("application/json"), b"{}".to_vec(), 422),
            (
                Some("application/json"),
                br#"{"transfers":null}"#.to_vec(),
                422,
            ),
            (
                Some("application/json"),
                br#"{"transfers":{}}"#.to_vec(),
                422,
            ),
            (
                Some("application/json"),
                br#"{"transfers":"e-1"}"#.to_vec(),
                422,
            ),
            (
                Some("application/json"),
                br#"{"transfers":[]}"#.to_vec(),
                422,
            ),
            (
                Some("application/json"),
                json!({"transfer": [one]}).to_string().into(),
                422,
            ),
        ];
        for (content_type, body, want) in cases {
            let response = app.post_raw("/transfers/batch", content_type, body).await;
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json"
            );
            let status = response.status().as_u16();
            let problem: Value = response.json().await.unwrap();
            assert_problem(status, &problem, want);
        }
        assert_eq!(app.get("/transfers/e-1").await.0, 404);
        app.shutdown().await;
    }

    /// 1,000 items is a batch (here all invalid, so nothing is created and the test stays
    /// quick); 1,001 is refused whole, and creates nothing.
    pub async fn a_batch_holds_at_most_1000_items(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100_000), ("B", 0)]).await;
        let invalid: Vec<Value> = (0..1000)
            .map(|i| transfer(&format!("z-{i}"), "A", "B", 0))
            .collect();
        let (status, body) = app.batch(invalid).await;
        let items = items(status, &body, 1000);
        assert!(items.iter().all(|i| i["status"] == 422), "{body}");

        let valid: Vec<Value> = (0..1001)
            .map(|i| transfer(&format!("v-{i}"), "A", "B", 1))
            .collect();
        let (status, problem) = app.batch(valid).await;
        assert_problem(status, &problem, 422);
        assert!(
            problem["detail"].as_str().unwrap().contains("1000"),
            "{problem}"
        );
        for id in ["v-0", "v-1000"] {
            assert_eq!(app.get(&format!("/transfers/{id}")).await.0, 404, "{id}");
        }
        assert_eq!(app.balance("A").await, 100_000);
        app.shutdown().await;
    }

    /// Items carry metadata as single requests do: stored, shown, found by the metadata
    /// filter, and a bad label is a 422 slot of its own. A batch of 1,000 items each with
    /// maximal metadata (16 keys of 40 characters, values of 256) exceeds the 1 MiB body
    /// limit: 413 for the whole request, nothing created.
    pub async fn batch_items_carry_metadata_and_a_maximal_batch_is_413(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;
        let labelled = |id: &str, metadata: Value| {
            let mut item = transfer(id, "A", "B", 1);
            item["metadata"] = metadata;
            item
        };
        let (status, body) = app
            .batch(vec![
                labelled("m-1", json!({"order_id": "o-7", "channel": "batch"})),
                labelled("m-2", json!({"Bad Key": "x"})),
                labelled("m-3", json!({"order_id": "o-8"})),
            ])
            .await;
        let items = items(status, &body, 3);
        let statuses: Vec<&Value> = items.iter().map(|i| &i["status"]).collect();
        assert_eq!(statuses, [&json!(201), &json!(422), &json!(201)], "{body}");
        assert_eq!(
            items[0]["transfer"]["metadata"],
            json!({"order_id": "o-7", "channel": "batch"}),
            "{body}"
        );
        assert_eq!(app.get("/transfers/m-2").await.0, 404);
        // Listings search what the store has made visible (a refresh on Elasticsearch).
        app.store().refresh().await.unwrap();
        let (status, page) = app.get("/transfers?metadata.order_id=o-8").await;
        let found: Vec<&Value> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| &t["id"])
            .collect();
        assert_eq!((status, found), (200, vec![&json!("m-3")]), "{page}");

        let maximal: serde_json::Map<String, Value> = (0..16)
            .map(|k| (format!("{k:02}{}", "k".repeat(38)), json!("v".repeat(256))))
            .collect();
        let huge: Vec<Value> = (0..1000)
            .map(|i| labelled(&format!("x-{i}"), Value::Object(maximal.clone())))
            .collect();
        let (status, problem) = app
            .post_oversized("/transfers/batch", json!({ "transfers": huge }))
            .await;
        assert_problem(status, &problem, 413);
        assert_eq!(app.get("/transfers/x-0").await.0, 404);
        app.shutdown().await;
    }

    /// A store outage on one item is a 503 in its slot; the other items keep their outcome.
    pub async fn an_item_the_store_failed_is_a_503_slot(b: Backend) {
        let faulty = std::sync::OnceLock::new();
        let app = TestApp::spawn_wrapped(
            b,
            |_| {},
            |store| {
                let wrapped = FaultyStore::new(store, 1, Duration::ZERO);
                let _ = faulty.set(wrapped.clone());
                wrapped as DynStore
            },
        )
        .await;
        app.open_accounts([("A", 100), ("B", 0)]).await;
        let down = Matcher {
            op: Some("create"),
            id: Some("down".into()),
            ..Matcher::default()
        };
        faulty
            .get()
            .unwrap()
            .inject(down, Fault::FailBefore, usize::MAX);
        let sent = vec![
            transfer("up-1", "A", "B", 1),
            transfer("down", "A", "B", 2),
            transfer("up-2", "A", "B", 3),
        ];
        let (status, body) = app.batch(sent).await;
        let items = items(status, &body, 3);
        assert_eq!(items[0]["status"], 201, "{body}");
        assert_eq!(items[1]["status"], 503, "{body}");
        assert_problem(503, &items[1]["problem"], 503);
        assert_eq!(items[2]["status"], 201, "{body}");
        assert_eq!(app.get("/transfers/down").await.0, 404);
        app.settled("up-1").await;
        app.settled("up-2").await;
        assert_eq!(app.balance("B").await, 4);
        app.shutdown().await;
    }

    /// `/transfers/batch` is a route of its own; a transfer whose id is `batch` is still
    /// created, read and cancelled like any other.
    pub async fn a_transfer_named_batch_is_still_a_transfer(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;
        app.transfer_accepted("batch", "A", "B", 7).await;
        let (status, body) = app.get("/transfers/batch").await;
        assert_eq!((status, &body["id"]), (200, &json!("batch")), "{body}");
        assert_eq!(app.settled("batch").await["state"], "finished");
        assert_answer_is_problem(app.post("/transfers/batch/cancel", json!({})).await, 409);
        app.shutdown().await;
    }
}

on_every_backend!(
    batch_answers_every_item_in_request_order,
    replays_and_conflicts_are_answered_per_item,
    invalid_items_are_422_slots,
    a_field_given_twice_is_422_and_creates_nothing,
    malformed_envelopes_are_problems_for_the_whole_request,
    a_batch_holds_at_most_1000_items,
    an_item_the_store_failed_is_a_503_slot,
    a_transfer_named_batch_is_still_a_transfer,
    batch_items_carry_metadata_and_a_maximal_batch_is_413,
);
