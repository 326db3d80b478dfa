//! Tests of the Elasticsearch backend that only make sense for it: migrations, HTTP error
//! mapping, bulk item outcomes, paging through many hits, index prefixes.
//!
//! They run against the Elasticsearch **emulator** (the `es-emulator` workspace crate), a test
//! double of the REST subset the backend uses (`docs/elasticsearch.md`), not a real
//! cluster. The store suite every backend runs (`backends.rs`) runs against a real cluster as well.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use transfer_service::time::{format_millis, parse_millis};

use serde_json::{json, Value};
use transfer_service::store::elasticsearch::{ElasticsearchStore, EsConfig};
use transfer_service::store::{
    fields, Index, SortKey, StaleQuery, Store, StoreError, TransferFilter, Version, WriteOp,
    WriteOutcome,
};

use es_emulator::RunningEmulator;

use crate::support::stores::{self, create_op, replace_op};

fn unique_prefix() -> String {
    stores::unique_prefix("es-backend")
}

async fn migrated_store(emulator: &RunningEmulator) -> ElasticsearchStore {
    let store = stores::es_store_at(&emulator.url, &unique_prefix()).await;
    store.migrate().await.expect("migrate");
    store
}

fn transfer(id: &str, state: &str, from: &str, to: &str, created: i64, modified: i64) -> Value {
    json!({
        fields::ID: id,
        fields::SRC: from,
        fields::DEST: to,
        "amount": 1,
        fields::STATE: state,
        fields::CREATED: format_millis(created),
        fields::MODIFIED: format_millis(modified),
        // Held by a worker, as a transfer in flight is (a released one is a candidate at once).
        fields::LEASE_OWNER: "worker",
    })
}

fn assert_unavailable<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    match result {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

fn assert_permanent<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    match result {
        Err(StoreError::Permanent(_)) => {}
        other => panic!("expected Permanent, got {other:?}"),
    }
}

/// Raw JSON from the emulator, for checks the store API does not expose.
async fn raw(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = client.request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("emulator answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

// ---------------------------------------------------------------------------------------
// Migrations

#[tokio::test]
async fn migrations_apply_once_when_two_instances_start_together() {
    let emulator = stores::manual_emulator().await;
    let prefix = unique_prefix();
    let first = stores::es_store_at(&emulator.url, &prefix).await;
    let second = stores::es_store_at(&emulator.url, &prefix).await;
    assert_unavailable(first.ready().await);

    let (a, b) = within("both migrations", async {
        tokio::join!(first.migrate(), second.migrate())
    })
    .await;
    a.expect("first instance migrates");
    b.expect("second instance migrates");

    // One record per migration file, however many instances ran them.
    let records = format!("{}/{prefix}migrations", emulator.url);
    raw(reqwest::Method::POST, format!("{records}/_refresh"), None).await;
    let (status, found) = raw(
        reqwest::Method::POST,
        format!("{records}/_search"),
        Some(json!({"size": 100})),
    )
    .await;
    assert_eq!(status, 200, "{found}");
    let ids: Vec<&str> = found["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| hit["_id"].as_str().unwrap())
        .collect();
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len(), "duplicate records: {ids:?}");
    assert_eq!(
        unique.into_iter().collect::<Vec<_>>(),
        [
            "0001_accounts",
            "0002_transactions",
            "0003_transactions_attention",
            "0004_transactions_metadata",
            "0005_transactions_accounts",
            "0006_webhooks",
            "0007_transactions_entries"
        ]
    );
    // The mapping steps ran (perhaps twice, at once): `attention`, `accounts` and `entries`
    // are keywords, `metadata` flattened.
    let mapping = transactions_mapping(&emulator.url, &first).await;
    assert_eq!(mapping["attention"], json!({"type": "keyword"}));
    assert_eq!(mapping["metadata"], json!({"type": "flattened"}));
    assert_eq!(mapping["accounts"], json!({"type": "keyword"}));
    assert_eq!(mapping["entries"], json!({"type": "keyword"}));

    // Both indices exist under the prefix, with the mappings of the migrations.
    for index in [Index::Accounts, Index::Transactions] {
        assert_eq!(first.index_name(index), format!("{prefix}{index}"));
    }
    first.ready().await.expect("first ready");
    second.ready().await.expect("second ready");
}

/// The `properties` of the transactions index, as `GET /{index}/_mapping` shows them.
async fn transactions_mapping(url: &str, store: &ElasticsearchStore) -> Value {
    let index = store.index_name(Index::Transactions);
    let (status, body) = raw(
        reqwest::Method::GET,
        format!("{url}/{index}/_mapping"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body[&index]["mappings"]["properties"].clone()
}

fn flagged_transfer(id: &str, created: i64) -> Value {
    let mut doc = transfer(id, "pending", "a", "b", created, created);
    doc[fields::ATTENTION] = json!("pending with a settled tombstone");
    doc
}

fn flagged_only() -> TransferFilter {
    TransferFilter {
        attention: true,
        limit: 10,
        ..TransferFilter::default()
    }
}

/// A cluster migrated by a version that knew only `0001` and `0002` (no `attention` in the
/// mapping) is upgraded by the next start: `0003` adds the field, once, and from then on a
/// flagged transfer is listed. One stored before is not (Elasticsearch does not index
/// existing documents for a newly mapped field; the service never writes `attention` before
/// its migrations ran, so no such document exists outside this test).
#[tokio::test]
async fn an_existing_cluster_gains_the_attention_mapping_at_the_next_start() {
    let emulator = stores::manual_emulator().await;
    let prefix = unique_prefix();
    let url = &emulator.url;
    for (stem, index, file) in [
        (
            "0001_accounts",
            "accounts",
            include_str!("../../migrations/0001_accounts.json"),
        ),
        (
            "0002_transactions",
            "transactions",
            include_str!("../../migrations/0002_transactions.json"),
        ),
    ] {
        let step: Value = serde_json::from_str(file).unwrap();
        let (status, body) = raw(
            reqwest::Method::PUT,
            format!("{url}/{prefix}{index}"),
            Some(step["body"].clone()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = raw(
            reqwest::Method::PUT,
            format!("{url}/{prefix}migrations/_create/{stem}"),
            Some(json!({"description": step["description"]})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = raw(
        reqwest::Method::PUT,
        format!("{url}/{prefix}transactions/_doc/before"),
        Some(flagged_transfer("before", 1_000)),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    let store = stores::es_store_at(url, &prefix).await;
    assert!(store.ready().await.is_err(), "0003 is not recorded yet");
    store.migrate().await.expect("migrate");
    store.ready().await.expect("ready");
    assert_eq!(
        transactions_mapping(url, &store).await["attention"],
        json!({"type": "keyword"})
    );

    store
        .create(
            Index::Transactions,
            "after",
            flagged_transfer("after", 2_000).into(),
        )
        .await
        .unwrap();
    store.refresh().await.unwrap();
    let page = store.list_transfers(&flagged_only()).await.unwrap();
    let ids: Vec<&str> = page.docs.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["after"]);

    // A second start finds the step applied and recorded, and changes nothing.
    let restarted = stores::es_store_at(url, &prefix).await;
    restarted.migrate().await.expect("second migrate");
    restarted.ready().await.expect("ready again");
    let page = restarted.list_transfers(&flagged_only()).await.unwrap();
    assert_eq!(page.docs.len(), 1);
}

/// A mapping that conflicts with the step (someone mapped `attention` otherwise) stops the
/// migration loudly instead of being skipped: the listing would be wrong for good.
#[tokio::test]
async fn a_conflicting_attention_mapping_fails_the_migration() {
    let emulator = stores::manual_emulator().await;
    let prefix = unique_prefix();
    let file: Value =
        serde_json::from_str(include_str!("../../migrations/0002_transactions.json")).unwrap();
    let mut body = file["body"].clone();
    body["mappings"]["properties"]["attention"] = json!({"type": "long"});
    let (status, reply) = raw(
        reqwest::Method::PUT,
        format!("{}/{prefix}transactions", emulator.url),
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let store = stores::es_store_at(&emulator.url, &prefix).await;
    let error = store.migrate().await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("mapper [attention] cannot be changed from type [long] to [keyword]"),
        "{error}"
    );
    assert!(store.ready().await.is_err());
}

#[tokio::test]
async fn migrating_again_changes_nothing() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    let written = store
        .create(Index::Accounts, "a", json!({"balance": 5}).into())
        .await
        .unwrap();
    assert!(matches!(written, WriteOutcome::Written(_)));

    // A restart: a new instance with the same prefix migrates again.
    let prefix = store.index_name(Index::Accounts).replace("accounts", "");
    let restarted = stores::es_store_at(&emulator.url, &prefix).await;
    restarted.migrate().await.expect("second migrate");
    restarted.ready().await.unwrap();
    let doc = restarted.get(Index::Accounts, "a").await.unwrap().unwrap();
    assert_eq!(doc.source.to_value().unwrap()["balance"], 5);
    assert_eq!(Some(doc.version), written.written());
}

// ---------------------------------------------------------------------------------------
// Error mapping

#[tokio::test]
async fn rejected_and_unavailable_answers_are_unavailable() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;

    emulator.fail_next(429, 1);
    assert_unavailable(store.get(Index::Accounts, "a").await);
    emulator.fail_next(503, 1);
    assert_unavailable(
        store
            .bulk(vec![create_op(Index::Accounts, "a", json!({}))])
            .await,
    );
    emulator.fail_next(502, 1);
    assert_unavailable(store.refresh().await);
    emulator.fail_next(504, 1);
    assert_unavailable(
        store
            .find_stale(&StaleQuery {
                states: vec!["pending".into()],
                modified_before: 1,
                after: None,
                limit: 10,
            })
            .await,
    );

    emulator.set_unavailable(true);
    assert_unavailable(store.ready().await);
    emulator.set_unavailable(false);
    store.ready().await.expect("ready again");
    // The 503 bulk above may or may not have been applied; the item is there or not, but
    // the store works normally again.
    store.get(Index::Accounts, "a").await.unwrap();
}

#[tokio::test]
async fn a_500_is_unavailable_other_error_statuses_are_permanent() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    emulator.fail_next(500, 1);
    assert!(matches!(
        store.get(Index::Accounts, "a").await,
        Err(StoreError::Unavailable(_))
    ));
    emulator.fail_next(400, 1);
    assert_permanent(
        store
            .bulk(vec![create_op(Index::Accounts, "a", json!({}))])
            .await,
    );
}

#[tokio::test]
async fn a_closed_port_is_unavailable() {
    // Bind and drop a listener: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = stores::es_store_at(&format!("http://127.0.0.1:{port}"), &unique_prefix()).await;
    assert_unavailable(store.get(Index::Accounts, "a").await);
    assert_unavailable(store.ready().await);
    assert_unavailable(store.migrate().await);
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_as_unavailable() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Accept connections and hold them open without a word.
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let store = ElasticsearchStore::connect(EsConfig {
        url,
        index_prefix: unique_prefix(),
        request_timeout: Duration::from_millis(200),
        shards: 1,
    })
    .await
    .unwrap();
    assert_unavailable(within("a timeout", store.get(Index::Accounts, "a")).await);
    silent.abort();
}

#[tokio::test]
async fn answers_not_from_elasticsearch_are_refused() {
    // An HTTP server that answers like Elasticsearch but without `X-elastic-product`, as a
    // misconfigured URL (another service, a proxy page) would.
    let app = axum::Router::new().fallback(|| async {
        (
            [("content-type", "application/json")],
            r#"{"_index":"x","_id":"a","found":false}"#,
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let store = stores::es_store_at(&url, &unique_prefix()).await;
    assert_permanent(store.get(Index::Accounts, "a").await);
    assert_permanent(store.refresh().await);
    server.abort();
}

/// A stand-in for Elasticsearch (it sends the product header) that answers `_bulk` with
/// `status` and `body` and keeps the bulk requests it received; anything else gets a 200
/// that tells `migrate` all is done. For answers the emulator does not produce on demand,
/// such as bulk items rejected one by one.
async fn canned_server(
    status: u16,
    body: Value,
) -> (
    String,
    Arc<Mutex<Vec<(String, String)>>>,
    tokio::task::JoinHandle<()>,
) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let seen = received.clone();
    let app = axum::Router::new().fallback(
        move |uri: axum::http::Uri, headers: axum::http::HeaderMap, text: String| {
            let seen = seen.clone();
            let body = body.clone();
            async move {
                let (status, body) = if uri.path() == "/_bulk" {
                    let content_type = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    seen.lock().unwrap().push((content_type, text));
                    (status, body)
                } else if uri.path() == "/" {
                    (200, json!({"version": {"number": "8.19.21"}}))
                } else {
                    // Index creation acknowledged; migration records found.
                    (200, json!({"acknowledged": true, "found": true}))
                };
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    [
                        ("content-type", "application/json"),
                        ("x-elastic-product", "Elasticsearch"),
                    ],
                    body.to_string(),
                )
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, received, server)
}

// ---------------------------------------------------------------------------------------
// Bulk

#[tokio::test]
async fn a_bulk_reports_each_items_own_outcome() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    let v1 = store
        .create(Index::Accounts, "a", json!({"balance": 1}).into())
        .await
        .unwrap()
        .written()
        .unwrap();
    let before = emulator.request_count();

    let results = store
        .bulk(vec![
            // 0: a new document.
            create_op(Index::Accounts, "b", json!({"balance": 2})),
            // 1: an id that exists.
            create_op(Index::Accounts, "a", json!({"balance": 9})),
            // 2: the right version.
            replace_op(Index::Accounts, "a", json!({"balance": 3}), v1),
            // 3: the same version again, now stale (items apply in order).
            replace_op(Index::Accounts, "a", json!({"balance": 4}), v1),
            // 4: a document that does not exist.
            replace_op(Index::Accounts, "missing", json!({}), v1),
            // 5: an id no URL can address: refused in place, not sent.
            create_op(Index::Transactions, "..", json!({})),
            // 6: the other index.
            create_op(Index::Transactions, "t", json!({fields::ID: "t"})),
        ])
        .await
        .expect("the bulk as a whole succeeds");

    assert_eq!(
        emulator.request_count() - before,
        1,
        "one _bulk request for all items"
    );
    assert_eq!(results.len(), 7);
    let outcome = |i: usize| results[i].as_ref().map(|o| *o).map_err(|e| e.clone());
    let b = outcome(0).unwrap().written().expect("b created");
    assert_eq!(outcome(1).unwrap(), WriteOutcome::AlreadyExists);
    let v2 = outcome(2).unwrap().written().expect("a replaced");
    assert_eq!(outcome(3).unwrap(), WriteOutcome::Conflict);
    assert_eq!(outcome(4).unwrap(), WriteOutcome::NotFound);
    assert_permanent(outcome(5));
    assert!(outcome(6).unwrap().written().is_some());

    // seq_no grows with every applied write of the (single-shard) index.
    assert!(
        v1.seq_no < b.seq_no && b.seq_no < v2.seq_no,
        "{v1:?} {b:?} {v2:?}"
    );
    let a = store.get(Index::Accounts, "a").await.unwrap().unwrap();
    assert_eq!(a.source.to_value().unwrap()["balance"], 3);
    assert_eq!(a.version, v2);
    assert!(store
        .get(Index::Accounts, "missing")
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn bulk_items_rejected_one_by_one_are_errors_of_their_own_kind() {
    // HTTP 200 with `errors:true`: each item's status decides, as on a real cluster under
    // indexing pressure (429 items) or with an unassigned primary (503 items); and a node
    // whose last shard of the index moved away while the item waited for it answers "no such
    // index" (404, seen on OpenSearch 2.19.6 during a relocation): retried too.
    let item_error = |action: &str, status: u16, kind: &str| {
        json!({action: {"_index": "x", "_id": "i", "status": status,
            "error": {"type": kind, "reason": "injected"}}})
    };
    let answer = json!({"took": 1, "errors": true, "items": [
        item_error("create", 429, "es_rejected_execution_exception"),
        item_error("index", 503, "unavailable_shards_exception"),
        item_error("create", 400, "document_parsing_exception"),
        {"create": {"_index": "x", "_id": "ok", "_version": 1, "result": "created",
            "_seq_no": 12, "_primary_term": 3, "status": 201}},
        item_error("create", 404, "index_not_found_exception"),
    ]});
    let (url, received, server) = canned_server(200, answer).await;
    let store = stores::es_store_at(&url, "canned-").await;
    store.migrate().await.unwrap();
    let version = Version {
        seq_no: 1,
        primary_term: 1,
    };
    let results = store
        .bulk(vec![
            create_op(Index::Accounts, "r", json!({})),
            replace_op(Index::Accounts, "u", json!({}), version),
            create_op(Index::Accounts, "p", json!({})),
            create_op(Index::Accounts, "ok", json!({"n": 1})),
            create_op(Index::Accounts, "moved", json!({})),
        ])
        .await
        .expect("HTTP 200");
    assert!(matches!(results[0], Err(StoreError::Unavailable(_))));
    assert!(matches!(results[1], Err(StoreError::Unavailable(_))));
    assert!(matches!(results[2], Err(StoreError::Permanent(_))));
    assert_eq!(
        results[3].as_ref().unwrap(),
        &WriteOutcome::Written(Version {
            seq_no: 12,
            primary_term: 3
        })
    );
    assert!(matches!(results[4], Err(StoreError::Unavailable(_))));

    // What went over the wire: one NDJSON body, newline-terminated, `create` actions for
    // creates and `index` actions with the CAS pair for conditional replaces.
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    let (content_type, body) = &received[0];
    assert_eq!(content_type, "application/x-ndjson");
    assert!(body.ends_with('\n'), "{body:?}");
    let lines: Vec<Value> = body
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 10);
    assert_eq!(
        lines[0],
        json!({"create": {"_index": "canned-accounts", "_id": "r"}})
    );
    assert_eq!(
        lines[2],
        json!({"index": {"_index": "canned-accounts", "_id": "u", "if_seq_no": 1, "if_primary_term": 1}})
    );
    assert_eq!(lines[7], json!({"n": 1}));
    server.abort();
}

#[tokio::test]
async fn a_bulk_answered_with_fewer_items_than_sent_is_permanent() {
    let answer = json!({"took": 1, "errors": false, "items": []});
    let (url, _received, server) = canned_server(200, answer).await;
    let store = stores::es_store_at(&url, "canned-").await;
    store.migrate().await.unwrap();
    assert_permanent(
        store
            .bulk(vec![create_op(Index::Accounts, "a", json!({}))])
            .await,
    );
    server.abort();
}

#[tokio::test]
async fn an_empty_bulk_sends_nothing() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    let before = emulator.request_count();
    assert!(store.bulk(Vec::new()).await.unwrap().is_empty());
    assert_eq!(emulator.request_count(), before);
}

#[tokio::test]
async fn a_failed_item_does_not_stop_the_rest_of_the_bulk() {
    // Bulk is not atomic: a conditional replace on a document that was never written fails
    // on its own, and the item after it still applies. (Items failing with 429/5xx are
    // covered by the unit tests of the mapping in `store/elasticsearch/reply.rs`.)
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    let results = store
        .bulk(vec![
            WriteOp::ReplaceIf {
                index: Index::Accounts,
                id: "x".into(),
                source: json!({}).into(),
                expected: Version {
                    seq_no: 0,
                    primary_term: 7,
                },
            },
            create_op(Index::Accounts, "y", json!({})),
        ])
        .await
        .unwrap();
    assert_eq!(results[0].as_ref().unwrap(), &WriteOutcome::NotFound);
    assert!(results[1].as_ref().unwrap().written().is_some());
}

// ---------------------------------------------------------------------------------------
// Searches

#[tokio::test]
async fn recovery_pages_through_more_than_a_hundred_stale_transfers() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    let now = 1_700_000_000_000_i64;

    // 250 stale transfers in two states, 10 per millisecond (ties broken by id), plus
    // transfers that must not show: too recent, or in another state.
    let mut ops = Vec::new();
    let mut expected = Vec::new();
    for n in 0..250 {
        let id = format!("t{n:04}");
        let modified = now - 60_000 + (n / 10);
        let state = if n % 2 == 0 { "pending" } else { "committed" };
        ops.push(create_op(
            Index::Transactions,
            &id,
            transfer(&id, state, "a", "b", modified, modified),
        ));
        expected.push(SortKey {
            millis: modified,
            id,
        });
    }
    for n in 0..20 {
        let id = format!("fresh{n}");
        ops.push(create_op(
            Index::Transactions,
            &id,
            transfer(&id, "pending", "a", "b", now, now),
        ));
        let id = format!("done{n}");
        ops.push(create_op(
            Index::Transactions,
            &id,
            transfer(&id, "finished", "a", "b", now - 90_000, now - 90_000),
        ));
    }
    for result in store.bulk(ops).await.unwrap() {
        assert!(result.unwrap().written().is_some());
    }
    store.refresh().await.unwrap();

    let mut query = StaleQuery {
        states: vec!["pending".into(), "committed".into()],
        modified_before: now - 1_000,
        after: None,
        limit: 100,
    };
    let mut seen = Vec::new();
    let mut page_sizes = Vec::new();
    loop {
        let page = store.find_stale(&query).await.unwrap();
        page_sizes.push(page.docs.len());
        for doc in &page.docs {
            let millis = parse_millis(
                doc.source.to_value().unwrap()[fields::MODIFIED]
                    .as_str()
                    .unwrap(),
            )
            .unwrap();
            seen.push(SortKey {
                millis,
                id: doc.id.clone(),
            });
        }
        match page.next {
            Some(next) => query.after = Some(next),
            None => break,
        }
    }
    assert_eq!(page_sizes, [100, 100, 50]);
    // Every stale transfer exactly once, oldest first, ties by id.
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn listing_filters_by_account_and_state_newest_first() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    let mut ops = Vec::new();
    for n in 0..30_i64 {
        let id = format!("l{n:02}");
        let (from, to) = match n % 3 {
            0 => ("alice", "bob"),
            1 => ("bob", "alice"),
            _ => ("carol", "dave"),
        };
        let state = if n % 2 == 0 {
            "finished"
        } else {
            "rolled-back"
        };
        ops.push(create_op(
            Index::Transactions,
            &id,
            transfer(&id, state, from, to, 1_000 + n, 1_000 + n),
        ));
    }
    store.bulk(ops).await.unwrap();
    store.refresh().await.unwrap();

    let mut filter = TransferFilter {
        account: Some("alice".into()),
        state: Some("finished".into()),
        attention: false,
        metadata: Vec::new(),
        after: None,
        limit: 4,
    };
    let mut ids = Vec::new();
    loop {
        let page = store.list_transfers(&filter).await.unwrap();
        ids.extend(page.docs.iter().map(|d| d.id.clone()));
        match page.next {
            Some(next) => filter.after = Some(next),
            None => break,
        }
    }
    let expected: Vec<String> = (0..30_i64)
        .rev()
        .filter(|n| n % 3 != 2 && n % 2 == 0)
        .map(|n| format!("l{n:02}"))
        .collect();
    assert_eq!(ids, expected);

    let everything = store
        .list_transfers(&TransferFilter {
            limit: 100,
            ..TransferFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(everything.docs.len(), 30);
    assert!(everything.next.is_none());
    assert_eq!(everything.docs[0].id, "l29");
}

// ---------------------------------------------------------------------------------------
// Prefixes and missing indices

#[tokio::test]
async fn each_prefix_is_a_separate_store() {
    let emulator = stores::manual_emulator().await;
    let first = migrated_store(&emulator).await;
    let second = migrated_store(&emulator).await;
    first
        .create(
            Index::Accounts,
            "shared-id",
            json!({"owner": "first"}).into(),
        )
        .await
        .unwrap();

    assert!(second
        .get(Index::Accounts, "shared-id")
        .await
        .unwrap()
        .is_none());
    let (status, body) = raw(
        reqwest::Method::GET,
        format!(
            "{}/{}/_doc/shared-id",
            emulator.url,
            first.index_name(Index::Accounts)
        ),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["_source"]["owner"], "first");
}

#[tokio::test]
async fn before_migrations_writes_are_refused_so_no_index_gets_dynamic_mappings() {
    let emulator = stores::manual_emulator().await;
    let store = stores::es_store_at(&emulator.url, &unique_prefix()).await;
    assert_unavailable(
        store
            .create(
                Index::Transactions,
                "t",
                json!({fields::STATE: "pending"}).into(),
            )
            .await,
    );
    // Nothing was sent, so nothing was auto-created.
    let (status, _) = raw(
        reqwest::Method::GET,
        format!(
            "{}/{}/_doc/t",
            emulator.url,
            store.index_name(Index::Transactions)
        ),
        None,
    )
    .await;
    assert_eq!(status, 404);
    store.migrate().await.unwrap();
    assert!(store
        .create(
            Index::Transactions,
            "t",
            json!({fields::STATE: "pending"}).into()
        )
        .await
        .unwrap()
        .written()
        .is_some());
}

#[tokio::test]
async fn before_migrations_a_missing_index_reads_as_empty() {
    let emulator = stores::manual_emulator().await;
    let store = stores::es_store_at(&emulator.url, &unique_prefix()).await;
    assert!(store.get(Index::Accounts, "a").await.unwrap().is_none());
    let page = store
        .list_transfers(&TransferFilter {
            limit: 10,
            ..TransferFilter::default()
        })
        .await
        .unwrap();
    assert!(page.docs.is_empty() && page.next.is_none());
    store.refresh().await.unwrap();
}

#[tokio::test]
async fn after_migrations_a_missing_index_is_an_error_not_an_empty_store() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    let accounts = store.index_name(Index::Accounts);
    let transactions = store.index_name(Index::Transactions);
    for index in [&accounts, &transactions] {
        let (status, body) = raw(
            reqwest::Method::DELETE,
            format!("{}/{index}", emulator.url),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }

    // "No such account" would make the protocol roll transfers back for the wrong reason.
    assert_permanent(store.get(Index::Accounts, "a").await);
    assert_permanent(
        store
            .list_transfers(&TransferFilter {
                limit: 10,
                ..TransferFilter::default()
            })
            .await,
    );
    assert_permanent(store.scan(Index::Accounts, None, 10).await);
    assert_permanent(store.refresh().await);
    // Readiness sees it too, although the migration records are still there ...
    assert!(store.ready().await.is_err());
    // ... and migrating again re-creates the index with its mappings, those added by later
    // steps included (the steps are recorded, yet each one is checked again).
    store.migrate().await.unwrap();
    store.ready().await.unwrap();
    assert_eq!(
        transactions_mapping(&emulator.url, &store).await["attention"],
        json!({"type": "keyword"})
    );
    assert!(store.scan(Index::Accounts, None, 10).await.is_ok());
}

#[tokio::test]
async fn scan_pages_accounts_by_their_id_field() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    let ops = (0..15)
        .rev()
        .map(|n| {
            let id = format!("acct-{n:02}");
            create_op(Index::Accounts, &id, json!({fields::ACCOUNT_ID: id}))
        })
        .collect();
    store.bulk(ops).await.unwrap();
    store.refresh().await.unwrap();

    let first = store.scan(Index::Accounts, None, 10).await.unwrap();
    let rest = store
        .scan(Index::Accounts, first.next.as_deref(), 10)
        .await
        .unwrap();
    assert_eq!(rest.next, None);
    let ids: Vec<String> = first
        .docs
        .iter()
        .chain(&rest.docs)
        .map(|d| d.id.clone())
        .collect();
    let want: Vec<String> = (0..15).map(|n| format!("acct-{n:02}")).collect();
    assert_eq!(ids, want);
    assert!(first.docs.iter().all(|d| d.version.primary_term >= 1));
}

/// The scan's cursor is the sort value, so a document whose repeated id differs from its
/// `_id` (corruption the auditor must report) neither loops the scan nor hides others.
#[tokio::test]
async fn scan_pages_past_a_document_whose_id_field_differs_from_its_id() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    let mut ops: Vec<_> = (0..11)
        .map(|n| {
            let id = format!("acct-{n:02}");
            create_op(Index::Accounts, &id, json!({fields::ACCOUNT_ID: id}))
        })
        .collect();
    // Sorts as "acct-04a" (the fifth place), but its `_id` sorts last.
    ops.push(create_op(
        Index::Accounts,
        "zz",
        json!({fields::ACCOUNT_ID: "acct-04a"}),
    ));
    store.bulk(ops).await.unwrap();
    store.refresh().await.unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let page = store
            .scan(Index::Accounts, after.as_deref(), 5)
            .await
            .unwrap();
        seen.extend(page.docs.into_iter().map(|d| d.id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    seen.sort();
    let mut want: Vec<String> = (0..11).map(|n| format!("acct-{n:02}")).collect();
    want.push("zz".into());
    assert_eq!(seen, want, "every document exactly once");
}

#[tokio::test]
async fn scan_refuses_a_document_without_its_id_field() {
    let emulator = stores::manual_emulator().await;
    let store = migrated_store(&emulator).await;
    store
        .create(
            Index::Accounts,
            "a",
            json!({fields::ACCOUNT_ID: "a"}).into(),
        )
        .await
        .unwrap();
    store
        .create(Index::Accounts, "b", json!({"balance": 1}).into())
        .await
        .unwrap();
    store.refresh().await.unwrap();
    assert_permanent(store.scan(Index::Accounts, None, 10).await);
}

/// Readiness means this instance can write: an instance whose migration attempt failed is
/// not ready even though another instance recorded every migration.
#[tokio::test]
async fn an_instance_that_has_not_migrated_is_not_ready() {
    let emulator = stores::manual_emulator().await;
    let first = migrated_store(&emulator).await;
    first.ready().await.unwrap();
    let second = ElasticsearchStore::connect(EsConfig {
        url: emulator.url.clone(),
        index_prefix: first
            .index_name(Index::Accounts)
            .trim_end_matches("accounts")
            .to_owned(),
        request_timeout: Duration::from_secs(5),
        shards: 1,
    })
    .await
    .unwrap();
    emulator.fail_next(500, 1);
    assert!(second.migrate().await.is_err());
    assert!(
        second.ready().await.is_err(),
        "not ready before its migrate succeeded"
    );
    assert!(second
        .bulk(vec![create_op(Index::Accounts, "x", json!({}))])
        .await
        .is_err());
    second.migrate().await.unwrap();
    second.ready().await.unwrap();
}
