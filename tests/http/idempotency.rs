//! The `Idempotency-Key` header (draft-ietf-httpapi-idempotency-key-header) on
//! `POST /transfers` and `POST /transfers/batch` (docs/design.md §5): without a body `id` the
//! key is the transfer's id; a key that is not a valid id, or that differs from the body's
//! `id`, is a 422 that says why; a batch's key derives the ids of its items without one. Run
//! on the embedded store, the Elasticsearch backend on the emulator (a test double of
//! Elasticsearch) and a real cluster (`tools/es-cluster/run`; skipped, saying why, where none can run).

use serde_json::{json, Value};

use crate::support::app::{header, item_statuses, Backend, TestApp};
use crate::support::problems::assert_422_saying;

/// `POST <path>` with these `Idempotency-Key` header values (none, one, or several).
async fn post_keyed(app: &TestApp, path: &str, keys: &[&str], body: Value) -> (u16, Value, String) {
    let mut request = app.client.post(app.url(path)).json(&body);
    for key in keys {
        request = request.header("idempotency-key", *key);
    }
    let response = request.send().await.expect("POST");
    let status = response.status().as_u16();
    let location = header(&response, "location");
    (status, response.json().await.expect("JSON"), location)
}

/// `POST /transfers/batch` of one item without an id (1 from `A` to `B`) under the batch key
/// `key`.
async fn post_one_under_batch_key(app: &TestApp, key: &str) -> (u16, Value, String) {
    let batch = json!({"transfers": [unkeyed("A", "B", 1)]});
    post_keyed(app, "/transfers/batch", &[key], batch).await
}

fn unkeyed(from: &str, to: &str, amount: i64) -> Value {
    json!({"from": from, "to": to, "amount": amount})
}

mod cases {
    use super::*;

    pub async fn the_key_is_the_transfers_id_and_a_retry_replays_it(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;

        let (status, first, location) =
            post_keyed(&app, "/transfers", &["idem-1"], unkeyed("A", "B", 10)).await;
        assert_eq!(status, 201, "{first}");
        assert_eq!(first["id"], "idem-1", "{first}");
        assert_eq!(location, "/transfers/idem-1");

        // The retry: 200, the same transfer (as it is now), nothing new moved.
        let (status, replay, _) =
            post_keyed(&app, "/transfers", &["idem-1"], unkeyed("A", "B", 10)).await;
        assert_eq!(status, 200, "{replay}");
        assert_eq!(replay["id"], "idem-1");
        assert_eq!(replay["created_at"], first["created_at"], "{replay}");
        // The draft's form, a quoted Structured Field string, names the same key.
        let (status, quoted, _) =
            post_keyed(&app, "/transfers", &["\"idem-1\""], unkeyed("A", "B", 10)).await;
        assert_eq!(status, 200, "{quoted}");
        assert_eq!(quoted["created_at"], first["created_at"], "{quoted}");
        // The body's id, the same as the key: the same transfer.
        let body = json!({"id": "idem-1", "from": "A", "to": "B", "amount": 10});
        let (status, same, _) = post_keyed(&app, "/transfers", &["idem-1"], body).await;
        assert_eq!(status, 200, "{same}");
        // The key with another request: the id's conflict.
        let (status, conflict, _) =
            post_keyed(&app, "/transfers", &["idem-1"], unkeyed("A", "B", 11)).await;
        assert_eq!(status, 409, "{conflict}");

        assert_eq!(app.settled("idem-1").await["state"], "finished");
        assert_eq!((app.balance("A").await, app.balance("B").await), (90, 10));

        // A body id with the same key, first time: created under that id.
        let body = json!({"id": "idem-2", "from": "A", "to": "B", "amount": 1});
        let (status, created, _) = post_keyed(&app, "/transfers", &["idem-2"], body).await;
        assert_eq!(status, 201, "{created}");
        assert_eq!(created["id"], "idem-2");
        app.shutdown().await;
    }

    pub async fn a_key_that_differs_from_the_body_id_or_is_no_id_is_422(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;

        let body = json!({"id": "body-id", "from": "A", "to": "B", "amount": 1});
        let (status, problem, _) = post_keyed(&app, "/transfers", &["header-key"], body).await;
        assert_422_saying(status, &problem, "differ");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("body-id") && detail.contains("header-key"),
            "{detail}"
        );

        let too_long = "k".repeat(129);
        for key in [
            ".",
            "..",
            "a/b",
            "a b",
            "\"unclosed",
            "\"\"",
            too_long.as_str(),
        ] {
            let (status, problem, _) =
                post_keyed(&app, "/transfers", &[key], unkeyed("A", "B", 1)).await;
            assert_422_saying(status, &problem, "the transfer's id");
            assert_422_saying(status, &problem, "Idempotency-Key");
        }
        let (status, problem, _) =
            post_keyed(&app, "/transfers", &["k-1", "k-2"], unkeyed("A", "B", 1)).await;
        assert_422_saying(status, &problem, "more than once");

        // None of them created anything.
        for id in ["body-id", "header-key", "k-1", "k-2"] {
            assert_eq!(app.get(&format!("/transfers/{id}")).await.0, 404, "{id}");
        }
        let (_, page) = app.get("/transfers?account=A").await;
        assert_eq!(page["items"], json!([]), "{page}");
        assert_eq!(app.balance("A").await, 100);
        app.shutdown().await;
    }

    /// A batch's key derives `<key>:<index>` for each item without an `id`: resending the
    /// batch with the key replays every item.
    pub async fn a_batch_key_names_its_items_without_an_id(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("A", 100), ("B", 0)]).await;
        let items = json!({"transfers": [
            unkeyed("A", "B", 1),
            {"id": "own-id", "from": "A", "to": "B", "amount": 2},
            unkeyed("A", "B", 3),
            unkeyed("A", "A", 4),
        ]});

        let (status, first, _) =
            post_keyed(&app, "/transfers/batch", &["batch-7"], items.clone()).await;
        assert_eq!(status, 200, "{first}");
        let ids: Vec<&Value> = first["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| &i["transfer"]["id"])
            .collect();
        assert_eq!(
            ids,
            [
                &json!("batch-7:0"),
                &json!("own-id"),
                &json!("batch-7:2"),
                &Value::Null
            ],
            "{first}"
        );
        let statuses = item_statuses(&first);
        assert_eq!(statuses, [201, 201, 201, 422]);

        // The same batch, the same key (the draft's quoted form): every item replays.
        let (status, again, _) =
            post_keyed(&app, "/transfers/batch", &["\"batch-7\""], items.clone()).await;
        assert_eq!(status, 200, "{again}");
        for (index, item) in again["items"].as_array().unwrap().iter().enumerate() {
            let want = if index == 3 { 422 } else { 200 };
            assert_eq!(item["status"], want, "{again}");
        }
        for id in ["batch-7:0", "own-id", "batch-7:2"] {
            assert_eq!(app.settled(id).await["state"], "finished", "{id}");
        }
        assert_eq!(app.balances(["A", "B"]).await, [94, 6]);

        // Without the key the same items are new transfers (ids made by the server).
        let unkeyed_batch = json!({"transfers": [unkeyed("A", "B", 1)]});
        let (status, fresh) = app.post("/transfers/batch", unkeyed_batch).await;
        assert_eq!(status, 200, "{fresh}");
        let made = fresh["items"][0]["transfer"]["id"].as_str().unwrap();
        assert!(!made.starts_with("batch-7"), "{made}");

        // The key with items in another order: the derived ids name other transfers; an
        // item whose derived id exists with another request is that id's 409.
        let reordered = json!({"transfers": [
            unkeyed("A", "B", 3),
            {"id": "own-id", "from": "A", "to": "B", "amount": 2},
            unkeyed("A", "B", 1),
        ]});
        let (status, swapped, _) =
            post_keyed(&app, "/transfers/batch", &["batch-7"], reordered).await;
        assert_eq!(status, 200, "{swapped}");
        let statuses = item_statuses(&swapped);
        assert_eq!(statuses, [409, 200, 409], "{swapped}");

        // A batch key leaves room for `:<index>`: at most 124 characters.
        let (status, problem, _) = post_one_under_batch_key(&app, &"k".repeat(125)).await;
        assert_422_saying(status, &problem, "1–124 characters");
        let (status, ok, _) = post_one_under_batch_key(&app, &"k".repeat(124)).await;
        assert_eq!(status, 200, "{ok}");
        assert_eq!(
            ok["items"][0]["transfer"]["id"],
            format!("{}:0", "k".repeat(124))
        );
        app.shutdown().await;
    }
}

on_every_backend!(
    the_key_is_the_transfers_id_and_a_retry_replays_it,
    a_key_that_differs_from_the_body_id_or_is_no_id_is_422,
    a_batch_key_names_its_items_without_an_id,
);
