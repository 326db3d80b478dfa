//! Metadata over HTTP (docs/design.md §5): string labels on accounts and transfers, stored,
//! returned, part of the replay comparison, validated (422 saying why), and filterable with
//! `GET /transfers?metadata.<key>=<value>` (ANDed, with the other filters and the cursor).
//! Run on the embedded store, the Elasticsearch backend on the emulator (a test double of
//! Elasticsearch) and a real cluster (`tools/es-cluster/run`; skipped, saying why, where none can run).

use serde_json::{json, Value};

use crate::support::app::{item_ids as ids, Backend, TestApp};
use crate::support::problems::assert_422_saying;

/// Every id of the listing `query`, following the cursor with pages of `limit`.
async fn all_pages(app: &TestApp, query: &str, limit: usize) -> Vec<String> {
    let pages = app.transfer_pages(query, limit).await;
    for page in &pages {
        assert!(ids(page).len() <= limit);
    }
    pages.iter().flat_map(ids).collect()
}

/// Creates the transfer `id` (1 from `D` to `A`) with the metadata `note`, and asserts that
/// `GET /transfers?<query>` lists it alone.
async fn assert_listed_alone(app: &TestApp, (id, note): (&str, &str), query: &str) {
    let transfer = json!({"id": id, "from": "D", "to": "A", "amount": 1,
        "metadata": {"note": note}});
    let (status, body) = app.post("/transfers", transfer).await;
    assert_eq!(status, 201, "{body}");
    app.store().refresh().await.unwrap();
    let (status, page) = app.get(&format!("/transfers?{query}")).await;
    assert_eq!((status, ids(&page)), (200, vec![id.to_owned()]), "{page}");
}

/// Seventeen metadata filters, one more than a listing takes: `filter(i)` for each `i`,
/// joined with `&`.
fn seventeen_filters(filter: impl Fn(usize) -> String) -> String {
    (0..17).map(filter).collect::<Vec<_>>().join("&")
}

mod cases {
    use super::*;

    pub async fn metadata_is_stored_returned_and_compared_on_replay(b: Backend) {
        let app = TestApp::spawn(b).await;
        let owner = json!({"owner": "team-7", "cost.center": ""});
        let account = json!({"id": "a", "balance": 100, "metadata": owner});
        let (status, body) = app.post("/accounts", account.clone()).await;
        assert_eq!((status, &body["metadata"]), (201, &owner), "{body}");
        let (_, body) = app.get("/accounts/a").await;
        assert_eq!(body["metadata"], owner, "{body}");
        let (status, _) = app.post("/accounts", account.clone()).await;
        assert_eq!(status, 200);
        let others = [json!({"owner": "team-8", "cost.center": ""}), Value::Null];
        app.assert_account_replays_conflict(&account, "metadata", &others)
            .await;
        app.open_account("b", 0).await;
        let (_, body) = app.get("/accounts/b").await;
        assert!(body.get("metadata").is_none(), "{body}");

        let order = json!({"order_id": "123"});
        let transfer = json!({"id": "t", "from": "a", "to": "b", "amount": 5, "metadata": order});
        let (status, body) = app.post("/transfers", transfer.clone()).await;
        assert_eq!((status, &body["metadata"]), (201, &order), "{body}");
        let settled = app.settled("t").await;
        assert_eq!(
            (&settled["state"], &settled["metadata"]),
            (&json!("finished"), &order),
            "{settled}"
        );
        let (status, body) = app.post("/transfers", transfer).await;
        assert_eq!((status, &body["metadata"]), (200, &order), "{body}");
        for other in [json!({"order_id": "124"}), json!({}), Value::Null] {
            let mut changed = json!({"id": "t", "from": "a", "to": "b", "amount": 5});
            changed["metadata"] = other.clone();
            let (status, body) = app.post("/transfers", changed).await;
            assert_eq!(status, 409, "{other}: {body}");
        }
        // A transfer without metadata shows none, and `{}` is the same as none.
        app.transfer_accepted("plain", "a", "b", 1).await;
        let (_, body) = app.get("/transfers/plain").await;
        assert!(body.get("metadata").is_none(), "{body}");
        let empty = json!({"id": "plain", "from": "a", "to": "b", "amount": 1, "metadata": {}});
        let (status, body) = app.post("/transfers", empty).await;
        assert_eq!(status, 200, "{body}");
    }

    pub async fn invalid_metadata_is_422_saying_why(b: Backend) {
        let app = TestApp::spawn_with_accounts(b, [("a", 10), ("b", 0)]).await;
        let seventeen: serde_json::Map<String, Value> =
            (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        let sixteen: serde_json::Map<String, Value> =
            (0..16).map(|i| (format!("k{i}"), json!("v"))).collect();
        let cases = [
            (json!("order=1"), "must be an object of string values"),
            (json!(["a"]), "must be an object of string values"),
            (json!({"n": 1}), "values must be strings"),
            (json!({"n": null}), "values must be strings"),
            (json!({"n": {"deeper": "x"}}), "values must be strings"),
            (json!({"Order": "1"}), "keys must be 1–40 characters"),
            (json!({"": "1"}), "keys must be 1–40 characters"),
            (json!({"a b": "1"}), "keys must be 1–40 characters"),
            (json!({"a=b": "1"}), "keys must be 1–40 characters"),
            (json!({"k".repeat(41): "1"}), "keys must be 1–40 characters"),
            (json!({"k": "é".repeat(257)}), "at most 256 characters"),
            (Value::Object(seventeen), "at most 16"),
        ];
        for (bad, says) in &cases {
            let (status, body) = app
                .post(
                    "/accounts",
                    json!({"id": "x", "balance": 1, "metadata": bad}),
                )
                .await;
            assert_422_saying(status, &body, says);
            let transfer = json!({"from": "a", "to": "b", "amount": 1, "metadata": bad});
            let (status, body) = app.post("/transfers", transfer).await;
            assert_422_saying(status, &body, says);
        }
        assert_eq!(app.status("/accounts/x").await, 404);
        // The limits themselves are accepted.
        let edge = json!({"k".repeat(40): "é".repeat(256)});
        for ok in [Value::Object(sixteen), edge] {
            let transfer = json!({"from": "a", "to": "b", "amount": 1, "metadata": ok});
            let (status, body) = app.post("/transfers", transfer).await;
            assert_eq!(status, 201, "{body}");
        }
        // Filters: a valid key and a value a transfer can hold, at most 16 of them.
        let long = "v".repeat(257);
        let query_cases = [
            (
                "metadata.Order=1".to_owned(),
                "metadata keys are 1–40 characters",
            ),
            (
                "metadata.=1".to_owned(),
                "metadata keys are 1–40 characters",
            ),
            (
                format!("metadata.{}=1", "k".repeat(41)),
                "metadata keys are 1–40",
            ),
            (format!("metadata.k={long}"), "at most 256 characters"),
            ("metadatax=1".to_owned(), "unknown parameter"),
            ("metadata.k=1&metadata.k=2".to_owned(), "more than once"),
            (
                seventeen_filters(|i| format!("metadata.k{i}=v")),
                "at most 16",
            ),
            // The same rules in the form the OpenAPI document declares, `metadata=<key>:<value>`.
            (
                "metadata=Order:1".to_owned(),
                "`metadata`: metadata keys are 1–40 characters of a-z 0-9 _ . - (received `Order`)",
            ),
            (
                "metadata=:1".to_owned(),
                "metadata keys are 1–40 characters",
            ),
            (
                "metadata=order_id".to_owned(),
                "a metadata filter is `<key>:<value>`, such as `metadata=order_id:123`",
            ),
            (
                "metadata=".to_owned(),
                "a metadata filter is `<key>:<value>`",
            ),
            (format!("metadata=k:{long}"), "at most 256 characters"),
            (
                "metadata=k:1&metadata=k:2".to_owned(),
                "`k` is filtered more than once",
            ),
            (
                "metadata=k:1&metadata.k=1".to_owned(),
                "`k` is filtered more than once",
            ),
            ("metadata[k]=1".to_owned(), "unknown parameter"),
            (
                seventeen_filters(|i| format!("metadata=k{i}:v")),
                "at most 16",
            ),
            (
                (0..17)
                    .map(|i| match i % 2 {
                        0 => format!("metadata=k{i}:v"),
                        _ => format!("metadata.k{i}=v"),
                    })
                    .collect::<Vec<_>>()
                    .join("&"),
                "at most 16",
            ),
        ];
        for (query, says) in query_cases {
            let (status, body) = app.get(&format!("/transfers?{query}")).await;
            assert_422_saying(status, &body, says);
        }
    }

    pub async fn the_listing_filters_by_metadata_with_the_other_filters_and_pages(b: Backend) {
        let app = TestApp::spawn(b).await;
        for id in ["A", "B", "C"] {
            app.open_account(id, 1_000).await;
        }
        // (id, from, to, amount, metadata); `big` rolls back (insufficient funds).
        let transfers = [
            ("t1", "A", "B", 1, json!({"order_id": "123", "shop": "x"})),
            ("t2", "B", "C", 1, json!({"order_id": "123"})),
            ("t3", "A", "C", 1, json!({"order_id": "999", "shop": "x"})),
            ("t4", "C", "A", 1, Value::Null),
            (
                "big",
                "A",
                "B",
                1_000_000,
                json!({"order_id": "123", "shop": "x"}),
            ),
            ("t5", "C", "B", 1, json!({"order_id": "123", "shop": "x"})),
        ];
        for (id, from, to, amount, metadata) in &transfers {
            let mut body = json!({"id": id, "from": from, "to": to, "amount": amount});
            if !metadata.is_null() {
                body["metadata"] = metadata.clone();
            }
            let (status, created) = app.post("/transfers", body).await;
            assert_eq!(status, 201, "{created}");
            app.settled(id).await;
        }
        app.store().refresh().await.unwrap();
        // Both forms: `metadata=<key>:<value>` (the OpenAPI document's, repeated for several
        // keys) and `metadata.<key>=<value>` (the first form), alone or together.
        let cases: [(&str, &[&str]); 12] = [
            ("metadata.order_id=123", &["t5", "big", "t2", "t1"]),
            ("metadata=order_id:123", &["t5", "big", "t2", "t1"]),
            (
                "metadata.order_id=123&metadata.shop=x",
                &["t5", "big", "t1"],
            ),
            (
                "metadata=order_id:123&metadata=shop:x",
                &["t5", "big", "t1"],
            ),
            (
                "metadata=order_id:123&metadata.shop=x",
                &["t5", "big", "t1"],
            ),
            ("metadata=shop:x&account=A", &["big", "t3", "t1"]),
            ("metadata=order_id:12", &[]),
            ("metadata.shop=x&account=A", &["big", "t3", "t1"]),
            ("metadata.order_id=123&state=finished", &["t5", "t2", "t1"]),
            (
                "metadata.order_id=123&state=rolled-back&account=B",
                &["big"],
            ),
            ("metadata.order_id=12", &[]),
            ("metadata.none=123", &[]),
        ];
        for (query, want) in cases {
            let (status, page) = app.get(&format!("/transfers?{query}")).await;
            assert_eq!(status, 200, "{query}: {page}");
            assert_eq!(ids(&page), want, "{query}");
            for limit in [1, 2] {
                assert_eq!(
                    all_pages(&app, query, limit).await,
                    want,
                    "{query} by {limit}"
                );
            }
        }
        // The value is percent-decoded like any parameter: exact text, spaces included.
        app.open_account("D", 10).await;
        assert_listed_alone(&app, ("t6", "a b&c=d"), "metadata.note=a%20b%26c%3Dd").await;
        // After the key, the value is everything up to the end, colons included.
        assert_listed_alone(&app, ("t7", "a:b"), "metadata=note%3Aa%3Ab").await;
    }
}

on_every_backend!(
    metadata_is_stored_returned_and_compared_on_replay,
    invalid_metadata_is_422_saying_why,
    the_listing_filters_by_metadata_with_the_other_filters_and_pages,
);
