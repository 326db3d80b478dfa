//! Tests of **es-emulator** itself, the Elasticsearch TEST DOUBLE of this crate: each test
//! sends real HTTP requests to an in-process emulator on a free port and checks statuses and
//! bodies against the service's `docs/elasticsearch.md` (§n below).
//! Near-real-time tests use `refresh_interval: None` and explicit refreshes, except one that
//! waits (with a deadline) for a short scheduled interval.

use std::fmt;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use es_emulator::{EmulatorConfig, RunningEmulator};

struct Es {
    emulator: RunningEmulator,
    client: reqwest::Client,
}

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    text: String,
    body: Value,
}

/// One request to the emulator: built by `get`, `put`, `bulk`… so that tables of cases can
/// hold them, and shown when a row of such a table fails.
struct Request {
    method: Method,
    path: String,
    body: Body,
}

enum Body {
    Empty,
    Json(Value),
    /// A `_bulk` body, sent as `application/x-ndjson`.
    Ndjson(String),
    /// Text sent as `application/json` as it is, to send what is not JSON.
    Raw(String),
}

fn get(path: &str) -> Request {
    request(Method::GET, path, Body::Empty)
}

fn put(path: &str, body: Value) -> Request {
    request(Method::PUT, path, Body::Json(body))
}

fn post(path: &str, body: Value) -> Request {
    request(Method::POST, path, Body::Json(body))
}

fn delete(path: &str) -> Request {
    request(Method::DELETE, path, Body::Empty)
}

/// A `_bulk` request of NDJSON `lines`, each ended by a newline.
fn bulk(path: &str, lines: &[&str]) -> Request {
    let body = lines.iter().map(|line| format!("{line}\n")).collect();
    request(Method::POST, path, Body::Ndjson(body))
}

/// A `_bulk` request whose body is `text` exactly, newlines and all.
fn bulk_text(path: &str, text: &str) -> Request {
    request(Method::POST, path, Body::Ndjson(text.to_owned()))
}

fn raw(method: Method, path: &str, text: &str) -> Request {
    request(method, path, Body::Raw(text.to_owned()))
}

fn request(method: Method, path: &str, body: Body) -> Request {
    Request {
        method,
        path: path.to_owned(),
        body,
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        match &self.body {
            Body::Empty => Ok(()),
            Body::Json(body) => write!(f, " {body}"),
            Body::Ndjson(text) | Body::Raw(text) => write!(f, " {text:?}"),
        }
    }
}

impl Es {
    /// An emulator that refreshes only when asked.
    async fn manual() -> Self {
        Self::with(EmulatorConfig {
            refresh_interval: None,
            ..EmulatorConfig::default()
        })
        .await
    }

    /// An emulator that refreshes only when asked, holding one document: `{}` at `/i/_doc/1`.
    async fn holding_one_document() -> Self {
        let es = Self::manual().await;
        let written = es.put("/i/_doc/1", json!({})).await;
        assert_eq!(written.status, 201, "{}", written.text);
        es
    }

    async fn with(config: EmulatorConfig) -> Self {
        Es {
            emulator: es_emulator::spawn(config).await,
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
        }
    }

    async fn send_request(&self, request: &Request) -> Reply {
        let url = format!("{}{}", self.emulator.url, request.path);
        let sent = self.client.request(request.method.clone(), url);
        let sent = match &request.body {
            Body::Empty => sent,
            Body::Json(body) => sent.json(body),
            Body::Ndjson(text) => sent
                .header("content-type", "application/x-ndjson")
                .body(text.clone()),
            Body::Raw(text) => sent
                .header("content-type", "application/json")
                .body(text.clone()),
        };
        Self::reply(sent.send().await.expect("the emulator answers")).await
    }

    async fn reply(response: reqwest::Response) -> Reply {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            text,
            body,
        }
    }

    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        let body = body.map_or(Body::Empty, Body::Json);
        self.send_request(&request(method, path, body)).await
    }
    async fn get(&self, path: &str) -> Reply {
        self.send_request(&get(path)).await
    }
    async fn put(&self, path: &str, body: Value) -> Reply {
        self.send_request(&put(path, body)).await
    }
    async fn post(&self, path: &str, body: Value) -> Reply {
        self.send_request(&post(path, body)).await
    }
    async fn delete(&self, path: &str) -> Reply {
        self.send_request(&delete(path)).await
    }
    async fn raw(&self, method: Method, path: &str, text: &str) -> Reply {
        self.send_request(&raw(method, path, text)).await
    }
    async fn ndjson(&self, path: &str, body: &str) -> Reply {
        self.send_request(&bulk_text(path, body)).await
    }
    async fn bulk(&self, path: &str, lines: &[&str]) -> Reply {
        self.send_request(&bulk(path, lines)).await
    }
    async fn refresh(&self, index: &str) {
        let reply = self
            .send(Method::POST, &format!("/{index}/_refresh"), None)
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text);
    }
    /// Creates `index` with `shards` primary shards.
    async fn index_of_shards(&self, index: &str, shards: u32) {
        let settings = json!({"settings": {"number_of_shards": shards}});
        let reply = self.put(&format!("/{index}"), settings).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
    }
    async fn search(&self, index: &str, body: Value) -> Reply {
        self.post(&format!("/{index}/_search"), body).await
    }
    /// The ids of a search's hits, in order.
    async fn ids(&self, index: &str, body: Value) -> Vec<String> {
        let reply = self.search(index, body).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        hit_ids(&reply.body)
    }
}

impl Reply {
    /// The status and one field of the body, to compare both at once.
    fn status_and(&self, field: &str) -> (u16, Value) {
        (self.status, self.body[field].clone())
    }

    /// Where a write's answer puts its document: `_version` and `_seq_no`.
    fn version_and_seq_no(&self) -> (Value, Value) {
        (self.body["_version"].clone(), self.body["_seq_no"].clone())
    }
}

fn hit_ids(body: &Value) -> Vec<String> {
    body["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["_id"].as_str().unwrap().to_owned())
        .collect()
}

fn shards(total: u64) -> Value {
    json!({"total": total, "successful": 1, "failed": 0})
}

/// Asserts an error envelope (§0): status, `error.type`, `error.reason`, and a matching
/// `root_cause`.
fn assert_error(reply: &Reply, status: u16, kind: &str, reason: &str) {
    assert_error_of("", reply, status, kind, reason);
}

/// `assert_error`, naming in its messages the `request` that was answered.
fn assert_error_of(request: &str, reply: &Reply, status: u16, kind: &str, reason: &str) {
    assert_eq!(reply.status, status, "{request} {}", reply.text);
    assert_eq!(reply.body["status"], status, "{request} {}", reply.text);
    assert_eq!(
        reply.body["error"]["type"], kind,
        "{request} {}",
        reply.text
    );
    assert_eq!(
        reply.body["error"]["reason"], reason,
        "{request} {}",
        reply.text
    );
    let root = &reply.body["error"]["root_cause"][0];
    assert!(
        root["type"].is_string() && root["reason"].is_string(),
        "{request} {}",
        reply.text
    );
}

/// Sends each row's request in order and asserts the error envelope (§0) that refuses it:
/// `status` and `kind` for every row, and the row's own `error.reason`.
async fn assert_refused(es: &Es, status: u16, kind: &str, rows: &[(Request, &str)]) {
    for (request, reason) in rows {
        let reply = es.send_request(request).await;
        assert_error_of(&request.to_string(), &reply, status, kind, reason);
    }
}

/// Asserts the status and `error.type` of an error envelope whose reason is not pinned.
fn assert_error_type(reply: &Reply, status: u16, kind: &str) {
    assert_eq!(reply.status, status, "{}", reply.text);
    assert_eq!(reply.body["error"]["type"], kind, "{}", reply.text);
}

/// Asserts a reply's status and its whole body.
fn assert_reply(reply: &Reply, status: u16, body: Value) {
    assert_eq!(reply.status, status, "{}", reply.text);
    assert_eq!(reply.body, body);
}

fn assert_no_such_index(reply: &Reply, index: &str) {
    let reason = format!("no such index [{index}]");
    assert_error(reply, 404, "index_not_found_exception", &reason);
}

/// Asserts a search refused as a whole (400 `search_phase_execution_exception`), and gives
/// its root cause.
fn failed_search_root_cause(reply: &Reply) -> &Value {
    assert_error_type(reply, 400, "search_phase_execution_exception");
    &reply.body["error"]["root_cause"][0]
}

/// The items of a `_bulk` answered 200, after checking its `errors` flag.
fn bulk_items(reply: &Reply, errors: bool) -> &[Value] {
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.body["errors"], errors, "{}", reply.text);
    reply.body["items"].as_array().unwrap()
}

/// Asserts the 400 that refuses what this test double does not model, naming it.
fn assert_not_modelled(request: &Request, reply: &Reply) {
    assert_eq!(reply.status, 400, "{request}: {}", reply.text);
    assert!(
        reason(reply).contains("is not implemented by es-emulator"),
        "{request}: {}",
        reply.text
    );
}

fn reason(reply: &Reply) -> String {
    reply.body["error"]["reason"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// Creates `index` with keyword `s`, long `n`, date `ts`.
async fn typed_index(es: &Es, index: &str) {
    let reply = es
        .put(
            &format!("/{index}"),
            json!({
                "settings": {"number_of_shards": 1},
                "mappings": {"dynamic": false, "properties": {
                    "s": {"type": "keyword"},
                    "n": {"type": "long"},
                    "ts": {"type": "date"},
                }},
            }),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
}

// ---- §0 conventions ----------------------------------------------------------------------

#[tokio::test]
async fn every_response_carries_the_product_header() {
    let es = Es::manual().await;
    let mut replies = vec![
        es.get("/").await,
        es.send(Method::HEAD, "/", None).await,
        es.get("/missing/_doc/1").await,
        es.put("/Bad", json!({})).await,
        es.send(Method::PATCH, "/x/_doc/1", None).await,
        es.get("/_nothing_here").await,
        es.raw(Method::POST, "/x/_search", "{not json").await,
    ];
    es.emulator.fail_next(429, 1);
    replies.push(es.get("/").await);
    es.emulator.set_unavailable(true);
    replies.push(es.get("/").await);
    for reply in replies {
        assert_eq!(
            reply
                .headers
                .get("x-elastic-product")
                .map(|v| v.to_str().unwrap()),
            Some("Elasticsearch"),
            "status {} {}",
            reply.status,
            reply.text
        );
    }
}

#[tokio::test]
async fn cluster_info_head_and_health() {
    let es = Es::manual().await;
    let info = es.get("/").await;
    assert_eq!(info.status, 200);
    assert_eq!(info.body["version"]["number"], "8.19.21");
    assert_eq!(info.body["tagline"], "You Know, for Search");
    let head = es.send(Method::HEAD, "/", None).await;
    assert_eq!((head.status, head.text.as_str()), (200, ""));

    let health = es.get("/_cluster/health").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.body["status"], "green");
    assert_eq!(health.body["timed_out"], false);
    // One node cannot assign replicas: an index with the default replica makes it yellow.
    es.put("/with-replica", json!({})).await;
    assert_eq!(es.get("/_cluster/health").await.body["status"], "yellow");
}

// ---- §8 indices --------------------------------------------------------------------------

#[tokio::test]
async fn create_index_is_acknowledged_once() {
    let es = Es::manual().await;
    let keyword_t = json!({"properties": {"t": {"type": "keyword"}}});
    let settings = json!({"settings": {"number_of_shards": 1}, "mappings": keyword_t});
    assert_reply(
        &es.put("/books", settings).await,
        200,
        json!({"acknowledged": true, "shards_acknowledged": true, "index": "books"}),
    );

    let again = es.put("/books", json!({})).await;
    assert_error_type(&again, 400, "resource_already_exists_exception");
    let uuid = again.body["error"]["index_uuid"].as_str().unwrap();
    assert_eq!(
        reason(&again),
        format!("index [books/{uuid}] already exists")
    );
    assert_eq!(again.body["error"]["index"], "books");
}

#[tokio::test]
async fn invalid_index_names_are_refused() {
    let es = Es::manual().await;
    assert_error(
        &es.put("/Books", json!({})).await,
        400,
        "invalid_index_name_exception",
        "Invalid index name [Books], must be lowercase",
    );
    // A leading `-`, a `*`, and (writes cannot auto-create it either) an upper-case letter.
    for path in ["/-x", "/a%2Ab", "/Upper/_doc/1"] {
        let reply = es.put(path, json!({})).await;
        assert_eq!(
            reply.body["error"]["type"], "invalid_index_name_exception",
            "{path}: {}",
            reply.text
        );
    }
}

#[tokio::test]
async fn head_index_is_200_or_404_without_a_body() {
    let es = Es::manual().await;
    es.put("/present", json!({})).await;
    let found = es.send(Method::HEAD, "/present", None).await;
    assert_eq!((found.status, found.text.as_str()), (200, ""));
    let missing = es.send(Method::HEAD, "/absent", None).await;
    assert_eq!((missing.status, missing.text.as_str()), (404, ""));
}

#[tokio::test]
async fn shards_total_follows_number_of_replicas() {
    let es = Es::manual().await;
    es.put(
        "/one",
        json!({"settings": {"index": {"number_of_replicas": 0}}}),
    )
    .await;
    let zero = es.put("/one/_doc/1", json!({})).await;
    assert_eq!(zero.body["_shards"], shards(1));
    let default = es.put("/two/_doc/1", json!({})).await;
    assert_eq!(default.body["_shards"], shards(2));
    let refreshed = es.post("/one,two/_refresh", json!({})).await;
    assert_eq!(
        refreshed.body,
        json!({"_shards": {"total": 3, "successful": 2, "failed": 0}})
    );
}

#[tokio::test]
async fn unknown_settings_and_impossible_shard_counts_are_refused() {
    let es = Es::manual().await;
    let unknown = es
        .put("/x", json!({"settings": {"index.nonsense": 1}}))
        .await;
    assert_error_type(&unknown, 400, "illegal_argument_exception");
    assert!(es.send(Method::HEAD, "/x", None).await.status == 404);
    // Elasticsearch 8.19.21's reasons, each a 400 `illegal_argument_exception`.
    let refused = [
        (
            json!({"number_of_shards": 0}),
            "Failed to parse value [0] for setting [index.number_of_shards] must be >= 1",
        ),
        (
            json!({"number_of_shards": -1}),
            "Failed to parse value [-1] for setting [index.number_of_shards] must be >= 1",
        ),
        (
            json!({"number_of_shards": 1025}),
            "Failed to parse value [1025] for setting [index.number_of_shards] must be <= 1024",
        ),
        (
            json!({"number_of_shards": "x"}),
            "Failed to parse value [x] for setting [index.number_of_shards]",
        ),
        (
            json!({"number_of_shards": 3, "number_of_routing_shards": 0}),
            "Failed to parse value [0] for setting [index.number_of_routing_shards] must be >= 1",
        ),
        (
            json!({"number_of_shards": 3, "number_of_routing_shards": 2}),
            "index.number_of_routing_shards [2] must be >= index.number_of_shards [3]",
        ),
        (
            json!({"number_of_shards": 3, "number_of_routing_shards": 1024}),
            "the number of source shards [3] must be a factor of [1024]",
        ),
    ];
    for (settings, reason) in refused {
        let reply = es.put("/y", json!({ "settings": settings })).await;
        assert_error(&reply, 400, "illegal_argument_exception", reason);
    }
    assert_eq!(es.send(Method::HEAD, "/y", None).await.status, 404);
    let accepted = [
        json!({"number_of_shards": 1024}),
        json!({"index": {"number_of_shards": "4"}}),
        json!({"number_of_shards": 3, "number_of_routing_shards": 6}),
        json!({"number_of_shards": 2, "number_of_routing_shards": 2048}),
        json!({"number_of_routing_shards": 5}),
    ];
    for (n, settings) in accepted.into_iter().enumerate() {
        let reply = es
            .put(&format!("/ok-{n}"), json!({ "settings": settings }))
            .await;
        assert_eq!(reply.status, 200, "{settings}: {}", reply.text);
    }
    // The count is shown as a string; the routing shards, a private setting, are not.
    let shown = es.get("/ok-2").await;
    assert_eq!(
        shown.body["ok-2"]["settings"]["index"]["number_of_shards"],
        "3"
    );
    assert!(shown.body["ok-2"]["settings"]["index"]
        .get("number_of_routing_shards")
        .is_none());
}

/// Lines of a `_bulk` body, each ended by a newline.
fn ndjson(lines: &[Value]) -> String {
    lines.iter().map(|line| format!("{line}\n")).collect()
}

/// Ids Elasticsearch 8.19.21 placed on an index of 3 shards and one of 5 (`es-routing`'s own
/// test names where each was found), and `zz`, deleted without existing, on shard 2 of 3.
const PLACED: [(&str, usize, usize); 7] = [
    ("a", 0, 1),
    ("b", 2, 0),
    ("t-1", 1, 1),
    ("t-2", 0, 2),
    ("acct-42", 0, 4),
    ("x.y:z_1", 1, 1),
    ("0b8f3c1e-9a52-4d8e-b7a1-2f4c6d8e0a13", 2, 2),
];

/// `_stats` at shard level: `(shard, docs.count, global checkpoint)` of every shard, in order,
/// after checking that each shard has one started primary copy whose checkpoints agree.
async fn per_shard(es: &Es, index: &str) -> Vec<(String, u64, i64)> {
    let stats = es.get(&format!("/{index}/_stats?level=shards")).await;
    assert_eq!(stats.status, 200, "{}", stats.text);
    let shards = stats.body["indices"][index]["shards"].as_object().unwrap();
    let mut out: Vec<(String, u64, i64)> = shards
        .iter()
        .map(|(number, copies)| {
            let [copy] = copies.as_array().unwrap().as_slice() else {
                panic!("one copy per shard: {copies}");
            };
            assert_eq!(copy["routing"]["state"], "STARTED");
            assert_eq!(copy["routing"]["primary"], true);
            assert_eq!(copy["retention_leases"]["primary_term"], 1);
            let seq_no = &copy["seq_no"];
            assert_eq!(seq_no["local_checkpoint"], seq_no["global_checkpoint"]);
            assert_eq!(seq_no["max_seq_no"], seq_no["global_checkpoint"]);
            (
                number.clone(),
                copy["docs"]["count"].as_u64().unwrap(),
                seq_no["global_checkpoint"].as_i64().unwrap(),
            )
        })
        .collect();
    out.sort_by_key(|(number, _, _)| number.parse::<u32>().unwrap());
    out
}

#[tokio::test]
async fn documents_live_on_the_shards_elasticsearch_puts_them_on() {
    let es = Es::manual().await;
    es.index_of_shards("three", 3).await;
    es.index_of_shards("five", 5).await;
    // `_seq_no` counts per shard: the n-th write on a shard gets n - 1.
    let mut written = [0i64; 3];
    for (id, on_three, _) in PLACED {
        let reply = es.put(&format!("/three/_doc/{id}"), json!({})).await;
        assert_eq!(reply.body["_seq_no"], written[on_three], "{id}");
        assert_eq!(reply.body["_shards"], shards(2), "one shard's copies");
        written[on_three] += 1;
    }
    let absent = es.delete("/three/_doc/zz").await;
    assert_eq!(absent.status_and("_seq_no"), (404, json!(2)));
    let counts = [3, 2, 2];
    let expected: Vec<(String, u64, i64)> = (0..3)
        .map(|shard| {
            let ops = written[shard] + i64::from(shard == 2);
            (shard.to_string(), counts[shard], ops - 1)
        })
        .collect();
    assert_eq!(per_shard(&es, "three").await, expected);
    let stats = es.get("/three/_stats/docs?level=shards").await;
    assert_eq!(
        stats.body["_shards"],
        json!({"total": 6, "successful": 3, "failed": 0})
    );
    // A conflict names the shard of its document.
    let conflict = es.put("/three/_create/b", json!({})).await;
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.body["error"]["shard"], "2");

    let lines: String = PLACED
        .iter()
        .map(|(id, _, _)| ndjson(&[json!({"create": {"_index": "five", "_id": id}}), json!({})]))
        .collect();
    assert_eq!(es.ndjson("/_bulk", &lines).await.body["errors"], false);
    let mut on_five = [0u64; 5];
    for (_, _, shard) in PLACED {
        on_five[shard] += 1;
    }
    let counts: Vec<u64> = per_shard(&es, "five").await.iter().map(|s| s.1).collect();
    assert_eq!(counts, on_five);
}

#[tokio::test]
async fn shards_are_counted_as_elasticsearch_counts_them() {
    let es = Es::manual().await;
    es.index_of_shards("three", 3).await;
    es.put(
        "/two",
        json!({"settings": {"number_of_shards": 2, "number_of_replicas": 0}}),
    )
    .await;
    es.put("/three/_doc/a", json!({})).await;
    // A refresh and `_stats` count every copy in `total`, the started ones in `successful`.
    let refreshed = es.post("/three,two/_refresh", json!({})).await;
    assert_eq!(
        refreshed.body["_shards"],
        json!({"total": 8, "successful": 5, "failed": 0})
    );
    // A search and `_count` ask every primary.
    let searched = es.search("three,two", json!({})).await;
    assert_eq!(
        searched.body["_shards"],
        json!({"total": 5, "successful": 5, "skipped": 0, "failed": 0})
    );
    let counted = es.get("/three/_count").await;
    assert_eq!(counted.body["_shards"]["total"], 3);
    assert_eq!(counted.body["count"], 1);
    let health = es.get("/_cluster/health").await;
    assert_eq!(health.body["active_primary_shards"], 5);
    assert_eq!(health.body["unassigned_shards"], 3);
    assert_eq!(health.body["status"], "yellow");
}

#[tokio::test]
async fn a_custom_routing_is_refused_only_where_it_would_pick_another_shard() {
    let es = Es::manual().await;
    es.index_of_shards("one", 1).await;
    es.index_of_shards("three", 3).await;
    for index in ["one", "three"] {
        es.put(&format!("/{index}/_doc/a"), json!({})).await;
    }
    assert_eq!(es.get("/one/_doc/a?routing=x").await.status, 200);
    for request in [
        get("/three/_doc/a?routing=x"),
        delete("/three/_doc/a?routing=x"),
        post("/three/_search?routing=x", json!({})),
    ] {
        assert_not_modelled(&request, &es.send_request(&request).await);
    }
    let bulk = es
        .ndjson(
            "/_bulk",
            &ndjson(&[
                json!({"delete": {"_index": "one", "_id": "a", "routing": "x"}}),
                json!({"delete": {"_index": "three", "_id": "a", "routing": "x"}}),
            ]),
        )
        .await;
    assert_eq!(bulk.body["items"][0]["delete"]["status"], 200);
    assert_eq!(bulk.body["items"][1]["delete"]["status"], 400);
    assert_eq!(es.get("/three/_doc/a").await.body["found"], true);
}

/// The same documents, written the same way, into indices of 1 and of 5 shards.
async fn the_same_documents_on_1_and_5_shards(es: &Es) {
    for (index, shards) in [("one", 1), ("five", 5)] {
        let reply = es
            .put(
                &format!("/{index}"),
                json!({
                    "settings": {"number_of_shards": shards},
                    "mappings": {"properties": {
                        "k": {"type": "keyword"},
                        "s": {"type": "keyword"},
                        "n": {"type": "long"},
                    }},
                }),
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        let mut lines = String::new();
        let write = |id: &str| json!({"index": {"_index": index, "_id": id}});
        for n in 0..90 {
            let id = format!("d-{n}");
            let s = ["a", "b", "c"][n % 3];
            lines += &ndjson(&[write(&id), json!({"k": id, "s": s, "n": n % 7})]);
        }
        // Some deleted, some written again.
        for n in (0..90).step_by(11) {
            let id = format!("d-{n}");
            lines += &ndjson(&[json!({"delete": {"_index": index, "_id": id}})]);
        }
        for n in (5..90).step_by(13) {
            let id = format!("d-{n}");
            lines += &ndjson(&[write(&id), json!({"k": id, "s": "b", "n": 3})]);
        }
        let bulk = es.ndjson("/_bulk", &lines).await;
        assert_eq!(bulk.body["errors"], false, "{}", bulk.text);
        es.refresh(index).await;
    }
}

/// A search's hits as a client reads them, but for `_seq_no` (per shard) and `_index`.
fn hits_without_seq_no(body: &Value) -> Value {
    let mut hits = body["hits"].clone();
    for hit in hits["hits"].as_array_mut().unwrap() {
        let hit = hit.as_object_mut().unwrap();
        hit.remove("_seq_no");
        hit.remove("_index");
    }
    hits
}

#[tokio::test]
async fn searches_answer_the_same_on_any_shard_count() {
    let es = Es::manual().await;
    the_same_documents_on_1_and_5_shards(&es).await;
    let searches = [
        json!({"size": 100}),
        json!({"size": 100, "sort": [{"n": "asc"}], "seq_no_primary_term": true, "version": true}),
        json!({"size": 20, "sort": [{"n": "desc"}, {"s": "asc"}]}),
        json!({"size": 100, "sort": ["_doc"]}),
        json!({"query": {"term": {"s": "b"}}, "sort": [{"n": "asc"}], "size": 100}),
        json!({"query": {"range": {"n": {"gte": 5}}}, "from": 3, "size": 10, "sort": [{"k": "asc"}]}),
        json!({"query": {"bool": {"should": [{"term": {"s": "a"}}, {"term": {"n": 2}}]}}, "size": 100}),
    ];
    for search in searches {
        let one = es.search("one", search.clone()).await;
        let five = es.search("five", search.clone()).await;
        assert_eq!(one.status, 200, "{}", one.text);
        assert_eq!(
            hits_without_seq_no(&one.body),
            hits_without_seq_no(&five.body),
            "{search}"
        );
    }
    // A scan by `search_after`, as the service pages: the same pages, every document once.
    let mut after: [Option<Value>; 2] = [None, None];
    let mut seen = 0;
    loop {
        let mut pages = Vec::new();
        for (index, after) in ["one", "five"].into_iter().zip(after.iter_mut()) {
            let mut body = json!({"size": 7, "sort": [{"n": "asc"}, {"k": "asc"}]});
            if let Some(last) = after.take() {
                body["search_after"] = last;
            }
            let page = es.search(index, body).await;
            *after = page.body["hits"]["hits"]
                .as_array()
                .unwrap()
                .last()
                .map(|hit| hit["sort"].clone());
            pages.push(hits_without_seq_no(&page.body));
        }
        assert_eq!(pages[0], pages[1]);
        let on_page = pages[0]["hits"].as_array().unwrap().len();
        if on_page == 0 {
            break;
        }
        seen += on_page;
    }
    // Ninety written, nine deleted, d-44 among them written again.
    assert_eq!(seen, 82);
    let counts: Vec<u64> = per_shard(&es, "five").await.iter().map(|s| s.1).collect();
    assert_eq!(counts.iter().sum::<u64>(), 82);
    assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
}

#[tokio::test]
async fn the_capacity_model_serves_one_shard_one_operation_at_a_time() {
    // Over real sockets and the wall clock: only the lower bound is certain on a loaded
    // machine (the exact figures are the `capacity` module's own tests, on paused time).
    let es = Es::manual().await;
    es.index_of_shards("i", 1).await;
    let cost = Duration::from_millis(20);
    es.emulator.set_shard_op_cost(cost);
    let started = std::time::Instant::now();
    let writes: Vec<_> = (0..5)
        .map(|n| {
            let request = es
                .client
                .put(format!("{}/i/_doc/{n}", es.emulator.url))
                .json(&json!({}));
            tokio::spawn(async move { request.send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    for write in writes {
        assert_eq!(write.await.unwrap().unwrap(), 201);
    }
    assert!(started.elapsed() >= cost * 5, "{:?}", started.elapsed());
    assert_eq!(es.emulator.shard_operations(), 5);
    // Each request waited at least its own operation.
    let waited = es.emulator.request_time();
    assert!(waited >= cost * 5, "{waited:?}");
    es.emulator.set_shard_op_cost(Duration::ZERO);
    let started = std::time::Instant::now();
    assert_eq!(es.put("/i/_doc/again", json!({})).await.status, 201);
    assert!(started.elapsed() < cost * 5, "{:?}", started.elapsed());
}

// ---- §1 create ---------------------------------------------------------------------------

#[tokio::test]
async fn create_is_201_then_409_with_the_current_version() {
    let es = Es::manual().await;
    assert_reply(
        &es.put("/i/_create/1", json!({"a": 1})).await,
        201,
        json!({"_index": "i", "_id": "1", "_version": 1, "result": "created",
               "_shards": shards(2), "_seq_no": 0, "_primary_term": 1}),
    );
    let conflict = es.post("/i/_create/1", json!({"a": 2})).await;
    assert_error(
        &conflict,
        409,
        "version_conflict_engine_exception",
        "[1]: version conflict, document already exists (current version [1])",
    );
    assert_eq!(conflict.body["error"]["shard"], "0");
    assert_eq!(conflict.body["error"]["index"], "i");
    assert!(conflict.body["error"]["index_uuid"].is_string());
    // Nothing was written.
    assert_eq!(es.get("/i/_doc/1").await.body["_source"], json!({"a": 1}));
}

#[tokio::test]
async fn op_type_create_conflicts_and_op_type_index_then_updates() {
    let es = Es::manual().await;
    assert_eq!(
        es.put("/i/_doc/1?op_type=create", json!({"f": 1}))
            .await
            .status,
        201
    );
    let conflict = es.put("/i/_doc/1?op_type=create", json!({"f": 1})).await;
    assert_eq!(conflict.status, 409);
    let index = es.put("/i/_doc/1?op_type=index", json!({"f": 1})).await;
    assert_eq!(index.status, 200);
    assert_eq!(index.body["_version"], 2);
    assert_eq!(index.body["result"], "updated");
}

#[tokio::test]
async fn invalid_create_combinations_are_400() {
    let es = Es::manual().await;
    let compare_and_set = es
        .put("/i/_create/1?if_seq_no=0&if_primary_term=1", json!({}))
        .await;
    assert_error(
        &compare_and_set,
        400,
        "action_request_validation_exception",
        "Validation Failed: 1: create operations do not support compare and set. use index instead;",
    );
    let as_index = es.put("/i/_create/1?op_type=index", json!({})).await;
    assert_error(
        &as_index,
        400,
        "illegal_argument_exception",
        "opType must be 'create', found: [index]",
    );
    let no_body = es.raw(Method::PUT, "/i/_doc/1", "").await;
    assert_error(&no_body, 400, "parse_exception", "request body is required");
    let long_id = "x".repeat(513);
    let too_long = es.put(&format!("/i/_doc/{long_id}"), json!({})).await;
    assert_error_type(&too_long, 400, "action_request_validation_exception");
}

#[tokio::test]
async fn a_missing_index_is_auto_created_by_writes() {
    let es = Es::manual().await;
    assert_eq!(es.send(Method::HEAD, "/auto", None).await.status, 404);
    assert_eq!(es.put("/auto/_doc/1", json!({"x": 1})).await.status, 201);
    assert_eq!(es.send(Method::HEAD, "/auto", None).await.status, 200);
    assert_eq!(
        es.post("/auto2/_create/1", json!({"x": 1})).await.status,
        201
    );
    let auto_id = es.post("/auto3/_doc", json!({"x": 1})).await;
    assert_eq!(auto_id.status, 201);
    assert_eq!(auto_id.body["_id"].as_str().unwrap().len(), 20);
}

#[tokio::test]
async fn ids_are_url_decoded() {
    let es = Es::manual().await;
    let id = "a/b c+ü?#";
    let encoded = "a%2Fb%20c%2B%C3%BC%3F%23";
    let created = es.put(&format!("/i/_create/{encoded}"), json!({})).await;
    assert_eq!(created.status, 201);
    assert_eq!(created.body["_id"], id);
    let found = es.get(&format!("/i/_doc/{encoded}")).await;
    assert_eq!(found.body["_id"], id);
    assert_eq!(found.body["found"], true);
}

// ---- §2 get ------------------------------------------------------------------------------

#[tokio::test]
async fn get_found_missing_doc_and_missing_index() {
    let es = Es::manual().await;
    es.put("/i/_doc/1", json!({"k": "v"})).await;
    assert_reply(
        &es.get("/i/_doc/1").await,
        200,
        json!({"_index": "i", "_id": "1", "_version": 1, "_seq_no": 0, "_primary_term": 1,
               "found": true, "_source": {"k": "v"}}),
    );
    assert_reply(
        &es.get("/i/_doc/2").await,
        404,
        json!({"_index": "i", "_id": "2", "found": false}),
    );

    let no_index = es.get("/nope/_doc/1").await;
    assert_no_such_index(&no_index, "nope");
    let error = &no_index.body["error"];
    assert_eq!(error["resource.type"], "index_or_alias");
    assert_eq!(error["resource.id"], "nope");
    assert_eq!(error["index_uuid"], "_na_");
    assert_eq!(error["index"], "nope");
}

#[tokio::test]
async fn get_is_realtime_unless_realtime_false() {
    let es = Es::manual().await;
    es.put("/i", json!({"settings": {"refresh_interval": "-1"}}))
        .await;
    es.put("/i/_doc/1", json!({"foo": "bar"})).await;
    assert_eq!(es.get("/i/_doc/1?realtime=false").await.status, 404);
    assert_eq!(es.get("/i/_doc/1?realtime=true").await.status, 200);
    let refreshed = es.get("/i/_doc/1?realtime=false&refresh=true").await;
    assert_eq!(refreshed.status_and("found"), (200, json!(true)));
}

#[tokio::test]
async fn get_returns_the_source_as_sent_and_filters_it() {
    let es = Es::manual().await;
    let source = r#"{"z": 1,  "a": {"b": 2, "c": 3}}"#;
    es.raw(Method::PUT, "/i/_doc/1", source).await;
    assert_carries_source_as_sent(&es.get("/i/_doc/1").await, source);
    let filtered = es.get("/i/_doc/1?_source_includes=a.b").await;
    assert_eq!(filtered.body["_source"], json!({"a": {"b": 2}}));
    let none = es.get("/i/_doc/1?_source=false").await;
    assert!(none.body.get("_source").is_none());
}

#[tokio::test]
async fn get_with_a_version_is_a_precondition() {
    let es = Es::holding_one_document().await;
    es.put("/i/_doc/1", json!({})).await;
    assert_eq!(es.get("/i/_doc/1?version=2").await.status, 200);
    assert_eq!(es.get("/i/_doc/1?version=1").await.status, 409);
}

// ---- §3 index and compare-and-set --------------------------------------------------------

#[tokio::test]
async fn index_creates_then_updates_even_with_the_same_body() {
    let es = Es::manual().await;
    let first = es.put("/i/_doc/1", json!({"a": 1})).await;
    assert_eq!(first.status_and("result"), (201, json!("created")));
    let second = es.put("/i/_doc/1", json!({"a": 1})).await;
    assert_eq!(second.status_and("result"), (200, json!("updated")));
    assert_eq!(second.version_and_seq_no(), (json!(2), json!(1)));
}

#[tokio::test]
async fn cas_match_mismatch_and_missing() {
    let es = Es::manual().await;
    es.put("/i/_doc/1", json!({"v": 1})).await;
    let ok = es
        .put("/i/_doc/1?if_seq_no=0&if_primary_term=1", json!({"v": 2}))
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    assert_eq!(ok.version_and_seq_no(), (json!(2), json!(1)));

    assert_refused(
        &es,
        409,
        "version_conflict_engine_exception",
        &[
            (
                put("/i/_doc/1?if_seq_no=0&if_primary_term=1", json!({"v": 3})),
                "[1]: version conflict, required seqNo [0], primary term [1]. current document has seqNo [1] and primary term [1]",
            ),
            (
                put("/i/_doc/1?if_seq_no=1&if_primary_term=2", json!({"v": 3})),
                "[1]: version conflict, required seqNo [1], primary term [2]. current document has seqNo [1] and primary term [1]",
            ),
            (
                put("/i/_doc/2?if_seq_no=1&if_primary_term=1", json!({})),
                "[2]: version conflict, required seqNo [1], primary term [1]. but no document was found",
            ),
        ],
    )
    .await;
    // Conflicts consume no seq_no.
    assert_eq!(es.put("/i/_doc/3", json!({})).await.body["_seq_no"], 2);
}

#[tokio::test]
async fn cas_parameters_are_validated() {
    let es = Es::holding_one_document().await;
    assert_refused(
        &es,
        400,
        "action_request_validation_exception",
        &[
            (
                put("/i/_doc/1?if_seq_no=0", json!({})),
                "Validation Failed: 1: ifSeqNo is set, but primary term is [0];",
            ),
            (
                put("/i/_doc/1?if_seq_no=0&if_primary_term=0", json!({})),
                "Validation Failed: 1: ifSeqNo is set, but primary term is [0];",
            ),
            (
                put("/i/_doc/1?if_primary_term=1", json!({})),
                "Validation Failed: 1: ifSeqNo is unassigned, but primary term is [1];",
            ),
        ],
    )
    .await;
    let negative = put("/i/_doc/1?if_seq_no=-1&if_primary_term=1", json!({}));
    let reason = "sequence numbers must be non negative. got [-1].";
    assert_refused(
        &es,
        400,
        "illegal_argument_exception",
        &[(negative, reason)],
    )
    .await;
}

// ---- §5 delete ---------------------------------------------------------------------------

#[tokio::test]
async fn delete_existing_absent_and_missing_index() {
    let es = Es::holding_one_document().await;
    assert_reply(
        &es.delete("/i/_doc/1").await,
        200,
        json!({"_index": "i", "_id": "1", "_version": 2, "result": "deleted",
               "_shards": shards(2), "_seq_no": 1, "_primary_term": 1}),
    );
    assert_reply(
        &es.delete("/i/_doc/never").await,
        404,
        json!({"_index": "i", "_id": "never", "_version": 1, "result": "not_found",
               "_shards": shards(2), "_seq_no": 2, "_primary_term": 1}),
    );
    assert_eq!(es.get("/i/_doc/1").await.status, 404);

    assert_no_such_index(&es.delete("/nope/_doc/1").await, "nope");
    assert_eq!(es.send(Method::HEAD, "/nope", None).await.status, 404);
}

#[tokio::test]
async fn delete_with_cas() {
    let es = Es::holding_one_document().await;
    let conflict = "version_conflict_engine_exception";
    let stale = delete("/i/_doc/1?if_seq_no=2&if_primary_term=1");
    let changed = "[1]: version conflict, required seqNo [2], primary term [1]. current document has seqNo [0] and primary term [1]";
    assert_refused(&es, 409, conflict, &[(stale, changed)]).await;
    let ok = es.delete("/i/_doc/1?if_seq_no=0&if_primary_term=1").await;
    assert_eq!(ok.status_and("_seq_no"), (200, json!(1)));
    let once_deleted = delete("/i/_doc/1?if_seq_no=1&if_primary_term=1");
    let gone =
        "[1]: version conflict, required seqNo [1], primary term [1]. but no document was found";
    assert_refused(&es, 409, conflict, &[(once_deleted, gone)]).await;
}

#[tokio::test]
async fn a_tombstone_continues_the_version_until_pruned() {
    let es = Es::manual().await;
    es.put("/i/_create/1", json!({})).await;
    assert_versions_of_delete_then_create(&es, 2, 3).await;

    // With gc_deletes 0s the tombstone goes at the next refresh.
    es.put("/g", json!({"settings": {"index.gc_deletes": "0s"}}))
        .await;
    es.put("/g/_doc/1", json!({})).await;
    es.delete("/g/_doc/1").await;
    es.refresh("g").await;
    assert_eq!(es.put("/g/_doc/1", json!({})).await.body["_version"], 1);
}

#[tokio::test]
async fn a_delete_of_an_absent_id_also_leaves_a_tombstone() {
    let es = Es::manual().await;
    es.put("/i", json!({})).await;
    assert_versions_of_delete_then_create(&es, 1, 2).await;
}

/// Deletes `/i/_doc/1` and creates it again, asserting the `_version` each answers with.
async fn assert_versions_of_delete_then_create(es: &Es, deleted: u64, created: u64) {
    assert_eq!(es.delete("/i/_doc/1").await.body["_version"], deleted);
    let again = es.put("/i/_create/1", json!({})).await;
    assert_eq!(again.status_and("_version"), (201, json!(created)));
}

// ---- §11 seq_no, primary term, version -------------------------------------------------

#[tokio::test]
async fn seq_no_is_per_index_and_counts_every_applied_op() {
    let es = Es::manual().await;
    let seq = |r: &Reply| r.body["_seq_no"].as_i64().unwrap();
    assert_eq!(seq(&es.put("/a/_doc/1", json!({})).await), 0);
    assert_eq!(seq(&es.put("/b/_doc/1", json!({})).await), 0);
    assert_eq!(seq(&es.put("/a/_doc/2", json!({})).await), 1);
    assert_eq!(seq(&es.delete("/a/_doc/absent").await), 2);
    assert_eq!(es.put("/a/_create/1", json!({})).await.status, 409);
    assert_eq!(seq(&es.put("/a/_doc/1", json!({})).await), 3);
    let doc = es.get("/a/_doc/1").await;
    assert_eq!(doc.body["_version"], 2);
    assert_eq!(doc.body["_primary_term"], 1);
}

// ---- §6 bulk -----------------------------------------------------------------------------

#[tokio::test]
async fn bulk_answers_every_item_in_order() {
    let es = Es::manual().await;
    es.put("/i/_doc/a", json!({"n": 1})).await;
    let lines = [
        r#"{"create":{"_index":"i","_id":"b"}}"#,
        r#"{"n":2}"#,
        r#"{"create":{"_index":"i","_id":"a"}}"#,
        r#"{"n":9}"#,
        r#"{"index":{"_index":"i","_id":"a","if_seq_no":0,"if_primary_term":1}}"#,
        r#"{"n":3}"#,
        r#"{"index":{"_index":"i","_id":"a","if_seq_no":0,"if_primary_term":1}}"#,
        r#"{"n":4}"#,
        r#"{"index":{"_index":"i","_id":"m","if_seq_no":0,"if_primary_term":1}}"#,
        "{}",
        r#"{"delete":{"_index":"i","_id":"gone"}}"#,
        r#"{"update":{"_index":"i","_id":"a"}}"#,
        r#"{"doc":{"n":5}}"#,
        r#"{"index":{"_index":"other","_id":"x"}}"#,
        "{}",
    ];
    let reply = es.bulk("/_bulk", &lines).await;
    let items = bulk_items(&reply, true);
    assert!(reply.body["took"].is_u64());
    assert_eq!(items.len(), 8);
    assert_eq!(
        items[0],
        json!({"create": {"_index": "i", "_id": "b", "_version": 1, "result": "created",
            "_shards": shards(2), "_seq_no": 1, "_primary_term": 1, "status": 201}})
    );
    let already_exists = &items[1]["create"];
    assert_eq!(already_exists["status"], 409);
    let error = &already_exists["error"];
    assert_eq!(
        error["reason"],
        "[a]: version conflict, document already exists (current version [1])"
    );
    assert_eq!(error["type"], "version_conflict_engine_exception");
    assert_eq!(error["shard"], "0");
    let compared_and_set = &items[2]["index"];
    assert_eq!(compared_and_set["status"], 200);
    assert_eq!(compared_and_set["_seq_no"], 2);
    assert_eq!(compared_and_set["_version"], 2);
    // The same compare-and-set again, then one on a document that does not exist.
    let stale = &items[3]["index"]["error"]["reason"];
    assert_eq!(
        stale,
        "[a]: version conflict, required seqNo [0], primary term [1]. current document has seqNo [2] and primary term [1]"
    );
    let missing = &items[4]["index"]["error"]["reason"];
    assert_eq!(
        missing,
        "[m]: version conflict, required seqNo [0], primary term [1]. but no document was found"
    );
    let absent = &items[5]["delete"];
    assert_eq!(absent["status"], 404);
    assert_eq!(absent["result"], "not_found");
    assert_eq!(absent["_seq_no"], 3);
    assert!(absent.get("error").is_none());
    assert_eq!(items[6]["update"]["status"], 400);
    assert_eq!(items[7]["index"]["status"], 201);
    assert_eq!(items[7]["index"]["_index"], "other");
    assert_eq!(es.get("/i/_doc/a").await.body["_source"], json!({"n": 3}));
}

#[tokio::test]
async fn bulk_without_failures_has_errors_false() {
    let es = Es::manual().await;
    let lines = [
        r#"{"index":{"_id":"1"}}"#,
        "{}",
        r#"{"delete":{"_id":"nope"}}"#,
    ];
    let reply = es.bulk("/i/_bulk", &lines).await;
    assert_eq!(bulk_items(&reply, false)[0]["index"]["_index"], "i");
}

#[tokio::test]
async fn bulk_request_level_errors() {
    let es = Es::manual().await;
    assert_refused(
        &es,
        400,
        "illegal_argument_exception",
        &[
            (
                bulk_text("/_bulk", "{\"index\":{\"_index\":\"i\"}}\n{}"),
                "The bulk request must be terminated by a newline [\\n]",
            ),
            (
                bulk("/_bulk", &[r#"{"index":{"_index":"i"}}"#, "{}", "{}"]),
                "Malformed action/metadata line [3], expected FIELD_NAME but found [END_OBJECT]",
            ),
            (
                bulk(
                    "/_bulk",
                    &[
                        r#"{"index":{"_index":"i","_id":"1","if_primary_term":-1}}"#,
                        "{}",
                    ],
                ),
                "primary term must be non negative. got [-1]",
            ),
            (
                bulk("/_bulk", &[r#"{"index":{"_index":"i","_type":"t"}}"#, "{}"]),
                "Action/metadata line [1] contains an unknown parameter [_type]",
            ),
        ],
    )
    .await;
    let bad_json = es.ndjson("/_bulk", "{nope\n").await;
    assert_eq!(bad_json.status, 400);
    // Nothing of a refused request is applied.
    assert_eq!(es.send(Method::HEAD, "/i", None).await.status, 404);
}

/// `rest-api-spec` `bulk/10_basic.yml`, "Empty _id" and "Empty _id with op_type create": the
/// item with `_id: ""` fails alone (400 `illegal_argument_exception`), the others are applied.
#[tokio::test]
async fn bulk_an_empty_id_fails_its_item_alone() {
    let es = Es::manual().await;
    let lines = [
        r#"{"index":{"_index":"test","_id":""}}"#,
        r#"{"f":1}"#,
        r#"{"index":{"_index":"test","_id":"id"}}"#,
        r#"{"f":2}"#,
        r#"{"index":{"_index":"test"}}"#,
        r#"{"f":3}"#,
        r#"{"create":{"_index":"test"}}"#,
        r#"{"f":4}"#,
        r#"{"index":{"_index":"test","op_type":"create"}}"#,
        r#"{"f":5}"#,
        r#"{"create":{"_index":"test","_id":""}}"#,
        r#"{"f":6}"#,
    ];
    let reply = es.bulk("/_bulk?refresh=true", &lines).await;
    let items = bulk_items(&reply, true);
    assert_eq!(items.len(), 6);
    for (item, action) in [(&items[0], "index"), (&items[5], "create")] {
        assert_eq!(
            item[action],
            json!({"_index": "test", "_id": "", "status": 400, "error": {
                "type": "illegal_argument_exception",
                "reason": "if _id is specified it must not be empty"}}),
            "{item}"
        );
    }
    assert_eq!(items[1]["index"]["result"], "created");
    assert_eq!(items[1]["index"]["_id"], "id");
    assert_eq!(items[2]["index"]["result"], "created");
    assert_eq!(items[3]["create"]["result"], "created");
    assert_eq!(items[4]["create"]["result"], "created");
    // A failed item consumes no seq_no: the four applied ones are 0..=3.
    let seq_nos: Vec<&Value> = items[1..5]
        .iter()
        .map(|i| {
            &i[if i.get("index").is_some() {
                "index"
            } else {
                "create"
            }]["_seq_no"]
        })
        .collect();
    assert_eq!(seq_nos, [&json!(0), &json!(1), &json!(2), &json!(3)]);
    let count = es.get("/test/_count").await;
    assert_eq!(count.body["count"], 4, "{}", count.text);
}

/// An empty id is an item error even when the item's index did not exist: the index is
/// auto-created first, as Elasticsearch creates missing indices before routing items.
#[tokio::test]
async fn bulk_an_empty_id_alone_still_creates_its_index() {
    let es = Es::manual().await;
    let empty_id = [r#"{"index":{"_index":"fresh","_id":""}}"#, "{}"];
    let reply = es.bulk("/_bulk", &empty_id).await;
    assert_eq!(bulk_items(&reply, true)[0]["index"]["status"], 400);
    assert_eq!(es.send(Method::HEAD, "/fresh", None).await.status, 200);
}

/// What `BulkRequest.validate()` collects from its items' own `validate()` fails the whole
/// request, every message numbered, and nothing of it is applied, not even its valid items:
/// an id over 512 bytes, compare-and-set on `create`, `if_seq_no` without `if_primary_term`
/// and the reverse, a delete without an id.
#[tokio::test]
async fn bulk_item_validation_failures_refuse_the_whole_request() {
    let es = Es::manual().await;
    let long_id = "x".repeat(513);
    let long_id_item = format!(r#"{{"index":{{"_index":"i","_id":"{long_id}"}}}}"#);
    let too_long = format!(
        "Validation Failed: 1: id [{long_id}] is too long, must be no longer than 512 bytes but \
         was: 513;"
    );
    let compare_and_set =
        "Validation Failed: 1: create operations do not support compare and set. use index instead;";
    let no_id = "Validation Failed: 1: id is missing;";
    let kind = "action_request_validation_exception";
    let cases: [(&[&str], &str); 7] = [
        (&[&long_id_item, "{}"], &too_long),
        (
            &[
                r#"{"create":{"_index":"i","_id":"1","if_seq_no":0,"if_primary_term":1}}"#,
                "{}",
            ],
            compare_and_set,
        ),
        (
            &[r#"{"create":{"_index":"i","_id":"1","if_seq_no":0}}"#, "{}"],
            compare_and_set,
        ),
        (
            &[r#"{"index":{"_index":"i","_id":"1","if_seq_no":0}}"#, "{}"],
            "Validation Failed: 1: ifSeqNo is set, but primary term is [0];",
        ),
        (
            &[r#"{"delete":{"_index":"i","_id":"1","if_primary_term":2}}"#],
            "Validation Failed: 1: ifSeqNo is unassigned, but primary term is [2];",
        ),
        (&[r#"{"delete":{"_index":"i","_id":""}}"#], no_id),
        (&[r#"{"delete":{"_index":"i"}}"#], no_id),
    ];
    let valid_item = [r#"{"index":{"_index":"i","_id":"ok"}}"#, "{}"];
    for (bad_item, reason) in cases {
        // A valid item before the bad one: refused with it.
        let request = bulk("/_bulk", &[&valid_item, bad_item].concat());
        let reply = es.send_request(&request).await;
        assert_error_of(&request.to_string(), &reply, 400, kind, reason);
        let head = es.send(Method::HEAD, "/i", None).await;
        assert_eq!(head.status, 404, "{request}");
    }
    // Messages of several items add up, numbered in request order.
    let lines = [
        r#"{"index":{"_index":"i","_id":"1","if_seq_no":3}}"#,
        "{}",
        r#"{"delete":{"_index":"i"}}"#,
    ];
    let both = "Validation Failed: 1: ifSeqNo is set, but primary term is [0];2: id is missing;";
    assert_refused(&es, 400, kind, &[(bulk("/_bulk", &lines), both)]).await;
}

/// Parameters and settings that would change the answer in ways this test double does not
/// model are refused, naming what is not implemented, instead of being silently ignored.
#[tokio::test]
async fn what_the_emulator_does_not_model_is_refused_as_not_implemented() {
    let es = Es::manual().await;
    es.put("/i", json!({})).await;
    let item = [r#"{"index":{"_index":"i","_id":"1"}}"#, "{}"];
    let with_metadata = |metadata: &str| {
        let action = format!(r#"{{"index":{{"_index":"i","_id":"1",{metadata}}}}}"#);
        bulk("/_bulk", &[&action, "{}"])
    };
    let refused = [
        with_metadata(r#""routing":"r""#),
        with_metadata(r#""require_alias":true"#),
        with_metadata(r#""dynamic_templates":{"f":"t"}"#),
        with_metadata(r#""require_data_stream":true"#),
        with_metadata(r#""list_executed_pipelines":true"#),
        bulk("/_bulk?routing=r", &item),
        bulk("/_bulk?require_alias=true", &item),
        bulk("/_bulk?wait_for_active_shards=all", &item),
        put("/i/_doc/1?routing=r", json!({})),
        put("/i/_doc/1?require_alias=true", json!({})),
        put("/i/_doc/1?wait_for_active_shards=2", json!({})),
        delete("/i/_doc/1?wait_for_active_shards=all"),
        get("/i/_doc/1?stored_fields=f"),
        get("/i/_doc/1?version=1&version_type=external"),
        get("/i?flat_settings=true"),
        get("/i?include_defaults=true"),
        get("/i?features=mappings"),
        get("/i/_search?explain=true"),
        get("/i/_search?expand_wildcards=closed"),
        get("/_cluster/health?level=indices"),
        get("/_cluster/health?wait_for_nodes=2"),
        put("/j", json!({"mappings": {"_source": {"enabled": false}}})),
        put("/j", json!({"mappings": {"_routing": {"required": true}}})),
        put("/j", json!({"mappings": {"numeric_detection": true}})),
        put("/j", json!({"mappings": {"subobjects": false}})),
        put(
            "/j",
            json!({"mappings": {"dynamic_date_formats": ["yyyy"]}}),
        ),
        put(
            "/j",
            json!({"settings": {"index": {"blocks": {"write": true}}}}),
        ),
        put("/j", json!({"settings": {"hidden": true}})),
        put("/j", json!({"settings": {"auto_expand_replicas": "0-1"}})),
        put("/j?wait_for_active_shards=all", json!({})),
    ];
    for request in &refused {
        let reply = es.send_request(request).await;
        assert_not_modelled(request, &reply);
        assert_eq!(
            reply.body["error"]["type"], "illegal_argument_exception",
            "{request}: {}",
            reply.text
        );
    }
    // Nothing refused was applied.
    assert_eq!(es.get("/i/_doc/1").await.status, 404);
    assert_eq!(es.send(Method::HEAD, "/j", None).await.status, 404);
    // The same parameters with values that change nothing are accepted.
    let accepted = [
        bulk(
            "/_bulk?require_alias=false&wait_for_active_shards=1",
            &[
                r#"{"index":{"_index":"i","_id":"1","require_alias":false}}"#,
                "{}",
                r#"{"delete":{"_index":"i","_id":"1","routing":"r"}}"#,
            ],
        ),
        put("/i/_doc/2?wait_for_active_shards=1", json!({})),
        get("/i/_search?expand_wildcards=open,hidden&explain=false"),
        get("/_cluster/health?level=cluster&wait_for_nodes=1"),
        put(
            "/j",
            json!({"settings": {"hidden": false, "blocks.write": false},
                   "mappings": {"_source": {"enabled": true}, "numeric_detection": false}}),
        ),
    ];
    for request in &accepted {
        let reply = es.send_request(request).await;
        assert!(reply.status < 300, "{request}: {}", reply.text);
        assert!(reply.body["errors"] != true, "{request}: {}", reply.text);
    }
}

#[tokio::test]
async fn bulk_refresh_true_makes_items_searchable() {
    let es = Es::manual().await;
    let item = [r#"{"index":{"_index":"i","_id":"1"}}"#, "{}"];
    let reply = es.bulk("/_bulk?refresh=true", &item).await;
    assert_eq!(reply.body["items"][0]["index"]["forced_refresh"], true);
    assert_eq!(es.ids("i", json!({})).await, ["1"]);
}

// ---- §7 near-real-time search ------------------------------------------------------------

#[tokio::test]
async fn search_sees_writes_only_after_a_refresh() {
    let es = Es::manual().await;
    es.put("/a/_doc/1", json!({})).await;
    es.put("/b/_doc/1", json!({})).await;
    assert!(es.ids("a", json!({})).await.is_empty());
    es.refresh("a").await;
    assert_eq!(es.ids("a", json!({})).await, ["1"]);
    assert!(es.ids("b", json!({})).await.is_empty());
    let all = es.post("/_refresh", json!({})).await;
    assert_eq!(all.status, 200);
    assert_eq!(es.ids("b", json!({})).await, ["1"]);
    // A delete is not visible before the next refresh either.
    es.delete("/a/_doc/1").await;
    assert_eq!(es.ids("a", json!({})).await, ["1"]);
    es.refresh("a").await;
    assert!(es.ids("a", json!({})).await.is_empty());
}

#[tokio::test]
async fn refresh_of_a_missing_index_is_404_unless_ignored() {
    let es = Es::manual().await;
    es.put("/a", json!({})).await;
    post_where_nope_is_missing(&es, "/a,nope/_refresh").await;
}

/// Posts `{}` to `path`, which names the missing index `nope`: 404 naming it, but 200 with
/// `ignore_unavailable`, whose reply this gives.
async fn post_where_nope_is_missing(es: &Es, path: &str) -> Reply {
    assert_no_such_index(&es.post(path, json!({})).await, "nope");
    let ignoring = format!("{path}?ignore_unavailable=true");
    let ignored = es.post(&ignoring, json!({})).await;
    assert_eq!(ignored.status, 200, "{}", ignored.text);
    ignored
}

#[tokio::test]
async fn a_write_with_refresh_true_is_searchable_at_once() {
    let es = Es::manual().await;
    let written = es.put("/i/_doc/1?refresh=true", json!({})).await;
    assert_eq!(written.body["forced_refresh"], true);
    let plain = es.put("/i/_doc/2", json!({})).await;
    assert!(plain.body.get("forced_refresh").is_none());
    assert_eq!(es.ids("i", json!({})).await, ["1"]);
    let deleted = es.delete("/i/_doc/1?refresh=true").await;
    assert_eq!(deleted.body["forced_refresh"], true);
    assert_eq!(es.ids("i", json!({})).await, ["2"]);
}

#[tokio::test]
async fn refresh_wait_for_returns_once_a_refresh_shows_the_write() {
    let es = Es::manual().await;
    es.put("/i", json!({})).await;
    let url = format!("{}/i/_doc/1?refresh=wait_for", es.emulator.url);
    let client = es.client.clone();
    let write = tokio::spawn(async move { client.put(url).json(&json!({})).send().await });
    // The write is applied (a realtime GET sees it) but does not answer before a refresh.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while es.get("/i/_doc/1").await.status != 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "write never applied"
        );
        tokio::task::yield_now().await;
    }
    assert!(!write.is_finished());
    es.refresh("i").await;
    let answer = tokio::time::timeout(Duration::from_secs(10), write)
        .await
        .expect("wait_for answers after the refresh")
        .unwrap()
        .unwrap();
    assert_eq!(answer.status().as_u16(), 201);
    let body: Value = answer.json().await.unwrap();
    assert!(body.get("forced_refresh").is_none(), "{body}");
    assert_eq!(es.ids("i", json!({})).await, ["1"]);
}

#[tokio::test]
async fn scheduled_refreshes_make_writes_searchable() {
    let es = Es::with(EmulatorConfig {
        refresh_interval: Some(Duration::from_millis(50)),
        ..EmulatorConfig::default()
    })
    .await;
    es.put("/i/_doc/1", json!({})).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if es.ids("i", json!({})).await == ["1"] {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never refreshed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // An index that disables refreshes keeps its writes invisible.
    es.put(
        "/off",
        json!({"settings": {"index": {"refresh_interval": "-1"}}}),
    )
    .await;
    es.put("/off/_doc/1", json!({})).await;
    es.put("/i/_doc/2", json!({})).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while es.ids("i", json!({})).await.len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "never refreshed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(es.ids("off", json!({})).await.is_empty());
}

// ---- §7 search request and response ------------------------------------------------------

#[tokio::test]
async fn search_response_shape() {
    let es = Es::manual().await;
    es.put("/i/_doc/1?refresh=true", json!({"s": "x"})).await;
    let all = es.search("i", json!({})).await;
    assert_eq!(all.status, 200);
    assert!(all.body["took"].is_u64());
    assert_eq!(all.body["timed_out"], false);
    assert_eq!(
        all.body["_shards"],
        json!({"total": 1, "successful": 1, "skipped": 0, "failed": 0})
    );
    assert_eq!(
        all.body["hits"]["total"],
        json!({"value": 1, "relation": "eq"})
    );
    assert_eq!(all.body["hits"]["max_score"], 1.0);
    let hit = &all.body["hits"]["hits"][0];
    assert_eq!(
        hit,
        &json!({"_index": "i", "_id": "1", "_score": 1.0, "_source": {"s": "x"}})
    );
    // Filter-only queries score 0.0.
    let filtered = es
        .search(
            "i",
            json!({"query": {"bool": {"filter": [{"match_all": {}}]}}}),
        )
        .await;
    assert_eq!(filtered.body["hits"]["hits"][0]["_score"], 0.0);
    assert_eq!(filtered.body["hits"]["max_score"], 0.0);
}

#[tokio::test]
async fn term_terms_ids_and_bool_queries() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    for (id, s, n) in [("1", "a", 1), ("2", "b", 2), ("3", "c", 3), ("4", "a", 4)] {
        es.put(&format!("/i/_doc/{id}"), json!({"s": s, "n": n}))
            .await;
    }
    es.refresh("i").await;
    let sorted = |query: Value| json!({"query": query, "sort": ["n"]});
    assert_eq!(
        es.ids("i", sorted(json!({"term": {"s": "a"}}))).await,
        ["1", "4"]
    );
    assert_eq!(
        es.ids("i", sorted(json!({"term": {"s": {"value": "b"}}})))
            .await,
        ["2"]
    );
    assert_eq!(
        es.ids("i", sorted(json!({"term": {"n": "3"}}))).await,
        ["3"]
    );
    assert_eq!(
        es.ids("i", sorted(json!({"terms": {"s": ["b", "c"]}})))
            .await,
        ["2", "3"]
    );
    assert_eq!(
        es.ids("i", sorted(json!({"ids": {"values": ["4", "2", "9"]}})))
            .await,
        ["2", "4"]
    );
    let bool_query = json!({"bool": {
        "filter": [{"terms": {"s": ["a", "b"]}}],
        "must_not": [{"term": {"n": 4}}],
    }});
    assert_eq!(es.ids("i", sorted(bool_query)).await, ["1", "2"]);
    // should-only: at least one must match.
    let should = json!({"bool": {"should": [{"term": {"s": "c"}}, {"term": {"n": 1}}]}});
    assert_eq!(es.ids("i", sorted(should)).await, ["1", "3"]);
    // With a filter, should clauses are optional unless minimum_should_match says otherwise.
    let optional = json!({"bool": {"filter": [{"range": {"n": {"gte": 2}}}],
        "should": [{"term": {"s": "c"}}]}});
    assert_eq!(es.ids("i", sorted(optional)).await, ["2", "3", "4"]);
    let required = json!({"bool": {"filter": [{"range": {"n": {"gte": 2}}}],
        "should": [{"term": {"s": "c"}}, {"term": {"s": "a"}}], "minimum_should_match": 1}});
    assert_eq!(es.ids("i", sorted(required)).await, ["3", "4"]);
    // An unmapped field matches nothing.
    assert!(es
        .ids("i", sorted(json!({"term": {"nowhere": "a"}})))
        .await
        .is_empty());
}

#[tokio::test]
async fn range_on_longs_and_dates() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    let now = es_emulator::dates::now_millis();
    let docs = [
        ("old", "2020-01-01T00:00:00Z".to_owned(), 10),
        ("millis", "1600000000000".to_owned(), 20),
        ("recent", es_emulator::dates::format_iso(now - 30_000), 30),
        (
            "hour",
            es_emulator::dates::format_iso(now - 2 * 3_600_000),
            40,
        ),
    ];
    for (id, ts, n) in &docs {
        es.put(&format!("/i/_doc/{id}"), json!({"ts": ts, "n": n}))
            .await;
    }
    es.refresh("i").await;
    let find = |range: Value| json!({"query": {"range": range}, "sort": [{"n": "asc"}]});
    assert_eq!(
        es.ids("i", find(json!({"n": {"gt": 10, "lte": 30}}))).await,
        ["millis", "recent"]
    );
    assert_eq!(
        es.ids("i", find(json!({"ts": {"gte": "now-2m"}}))).await,
        ["recent"]
    );
    assert_eq!(
        es.ids("i", find(json!({"ts": {"lt": "now-1h"}}))).await,
        ["old", "millis", "hour"]
    );
    assert_eq!(
        es.ids(
            "i",
            find(json!({"ts": {"lt": 1_600_000_000_001_i64, "format": "epoch_millis"}}))
        )
        .await,
        ["old", "millis"]
    );
    assert_eq!(
        es.ids(
            "i",
            find(json!({"ts": {"lt": "1600000000000", "format": "epoch_millis"}}))
        )
        .await,
        ["old"]
    );
    assert_eq!(
        es.ids(
            "i",
            find(json!({"ts": {"gte": "2020-01-01T00:00:00.000Z", "lt": "2021-01-01"}}))
        )
        .await,
        ["old", "millis"]
    );
    // lte on a date without time includes that whole day.
    assert_eq!(
        es.ids("i", find(json!({"ts": {"lte": "2020-01-01"}})))
            .await,
        ["old"]
    );
    let bad = es
        .search("i", find(json!({"ts": {"gte": "yesterday"}})))
        .await;
    assert_error_type(&bad, 400, "search_phase_execution_exception");
}

#[tokio::test]
async fn sort_by_several_keys_with_missing_values_last() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    let docs = [
        ("a", json!({"ts": "2024-01-01T00:00:01Z", "s": "b"})),
        ("b", json!({"ts": "2024-01-01T00:00:01Z", "s": "a"})),
        ("c", json!({"ts": "2024-01-01T00:00:00Z", "s": "z"})),
        ("d", json!({"s": "m"})),
    ];
    for (id, doc) in &docs {
        es.put(&format!("/i/_doc/{id}"), doc.clone()).await;
    }
    es.refresh("i").await;
    let asc = es
        .search(
            "i",
            json!({"sort": [{"ts": {"order": "asc"}}, {"s": "asc"}]}),
        )
        .await;
    assert_eq!(hit_ids(&asc.body), ["c", "b", "a", "d"]);
    assert_eq!(asc.body["hits"]["max_score"], Value::Null);
    let first = &asc.body["hits"]["hits"][0];
    assert_eq!(first["_score"], Value::Null);
    assert_eq!(first["sort"], json!([1_704_067_200_000_i64, "z"]));
    assert_eq!(asc.body["hits"]["hits"][3]["sort"], json!([i64::MAX, "m"]));
    let desc = es.search("i", json!({"sort": [{"ts": "desc"}, "s"]})).await;
    assert_eq!(hit_ids(&desc.body), ["b", "a", "c", "d"]);
    assert_eq!(desc.body["hits"]["hits"][3]["sort"][0], i64::MIN);
    let keyword_desc = es
        .search("i", json!({"sort": [{"s": {"order": "desc"}}]}))
        .await;
    assert_eq!(hit_ids(&keyword_desc.body), ["c", "d", "a", "b"]);
}

#[tokio::test]
async fn sorting_on_unmapped_text_or_id_fields_is_400() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    es.put("/dyn/_doc/1", json!({"title": "some text"})).await;
    let unmapped = es.search("i", json!({"sort": ["nowhere"]})).await;
    assert_eq!(
        failed_search_root_cause(&unmapped)["reason"],
        "No mapping found for [nowhere] in order to sort on"
    );
    let tolerated = es
        .search(
            "i",
            json!({"sort": [{"nowhere": {"unmapped_type": "long"}}]}),
        )
        .await;
    assert_eq!(tolerated.status, 200);
    assert_eq!(
        es.search("dyn", json!({"sort": ["title"]})).await.status,
        400
    );
    assert_eq!(
        es.search("dyn", json!({"sort": ["title.keyword"]}))
            .await
            .status,
        200
    );
    assert_eq!(es.search("i", json!({"sort": ["_id"]})).await.status, 400);
}

#[tokio::test]
async fn search_after_pages_through_ties() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    for n in 0..7 {
        es.put(
            &format!("/i/_doc/t{n}"),
            json!({"ts": 1_000 + n / 3, "s": format!("t{n}")}),
        )
        .await;
    }
    es.refresh("i").await;
    let mut after: Option<Value> = None;
    let mut seen = Vec::new();
    loop {
        let mut body = json!({"size": 3, "sort": [{"ts": "asc"}, {"s": "asc"}]});
        if let Some(after) = &after {
            body["search_after"] = after.clone();
        }
        let page = es.search("i", body).await;
        assert_eq!(page.status, 200, "{}", page.text);
        let hits = page.body["hits"]["hits"].as_array().unwrap().clone();
        if hits.is_empty() {
            break;
        }
        seen.extend(hit_ids(&page.body));
        after = Some(hits.last().unwrap()["sort"].clone());
    }
    assert_eq!(seen, ["t0", "t1", "t2", "t3", "t4", "t5", "t6"]);
    let wrong = es
        .search("i", json!({"sort": ["ts", "s"], "search_after": [1]}))
        .await;
    assert_eq!(wrong.status, 400);
    let with_from = es
        .search("i", json!({"from": 1, "sort": ["ts"], "search_after": [1]}))
        .await;
    assert_eq!(with_from.status, 400);
}

#[tokio::test]
async fn seq_no_primary_term_and_version_in_hits() {
    let es = Es::holding_one_document().await;
    es.put("/i/_doc/1?refresh=true", json!({})).await;
    let plain = es.search("i", json!({})).await;
    let hit = &plain.body["hits"]["hits"][0];
    assert!(hit.get("_seq_no").is_none() && hit.get("_version").is_none());
    let body = es
        .search("i", json!({"seq_no_primary_term": true, "version": true}))
        .await;
    let hit = &body.body["hits"]["hits"][0];
    assert_eq!(
        (&hit["_seq_no"], &hit["_primary_term"], &hit["_version"]),
        (&json!(1), &json!(1), &json!(2))
    );
    let url = es
        .post("/i/_search?seq_no_primary_term=true", json!({}))
        .await;
    assert_eq!(url.body["hits"]["hits"][0]["_seq_no"], 1);
}

#[tokio::test]
async fn track_total_hits_and_size_limits() {
    let es = Es::manual().await;
    for n in 0..5 {
        es.put(&format!("/i/_doc/{n}"), json!({})).await;
    }
    es.refresh("i").await;
    let off = es.search("i", json!({"track_total_hits": false})).await;
    assert!(off.body["hits"].get("total").is_none(), "{}", off.text);
    let capped = es.search("i", json!({"track_total_hits": 3})).await;
    assert_eq!(
        capped.body["hits"]["total"],
        json!({"value": 3, "relation": "gte"})
    );
    let exact = es
        .search("i", json!({"track_total_hits": true, "size": 2}))
        .await;
    assert_eq!(exact.body["hits"]["total"]["value"], 5);
    assert_eq!(exact.body["hits"]["hits"].as_array().unwrap().len(), 2);
    let default_size = es.search("i", json!({"from": 3})).await;
    assert_eq!(
        default_size.body["hits"]["hits"].as_array().unwrap().len(),
        2
    );

    let window = es.search("i", json!({"from": 9_990, "size": 11})).await;
    assert!(
        failed_search_root_cause(&window)["reason"]
            .as_str()
            .unwrap()
            .starts_with("Result window is too large, from + size must be less than or equal to: [10000] but was [10001]"),
        "{}",
        window.text
    );
    assert_eq!(
        es.search("i", json!({"from": 9_990, "size": 10}))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn source_filtering_in_hits() {
    let es = Es::manual().await;
    es.put(
        "/i/_doc/1?refresh=true",
        json!({"a": 1, "b": {"c": 2, "d": 3}}),
    )
    .await;
    let source = |body: Value| async {
        let reply = es.search("i", body).await;
        reply.body["hits"]["hits"][0].get("_source").cloned()
    };
    assert_eq!(source(json!({"_source": false})).await, None);
    assert_eq!(
        source(json!({"_source": ["b.c"]})).await,
        Some(json!({"b": {"c": 2}}))
    );
    assert_eq!(
        source(json!({"_source": {"excludes": ["b"]}})).await,
        Some(json!({"a": 1}))
    );
}

#[tokio::test]
async fn searching_several_or_missing_indices() {
    let es = Es::manual().await;
    es.put("/logs-a/_doc/1?refresh=true", json!({})).await;
    es.put("/logs-b/_doc/2?refresh=true", json!({})).await;
    let both = es.search("logs-a,logs-b", json!({})).await;
    assert_eq!(both.body["hits"]["total"]["value"], 2);
    assert_eq!(both.body["_shards"]["total"], 2);
    assert_eq!(
        es.search("logs-*", json!({})).await.body["hits"]["total"]["value"],
        2
    );
    let ignored = post_where_nope_is_missing(&es, "/logs-a,nope/_search").await;
    assert_eq!(ignored.body["hits"]["total"]["value"], 1);
    let get = es.get("/logs-a/_search").await;
    assert_eq!(get.status, 200);
}

#[tokio::test]
async fn count_counts_searchable_matches() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    es.put("/i/_doc/1", json!({"s": "a"})).await;
    es.put("/i/_doc/2", json!({"s": "b"})).await;
    es.refresh("i").await;
    let count = es
        .post("/i/_count", json!({"query": {"term": {"s": "a"}}}))
        .await;
    assert_eq!(count.status, 200);
    assert_eq!(count.body["count"], 1);
}

// ---- mappings ----------------------------------------------------------------------------

#[tokio::test]
async fn documents_are_checked_against_the_mapping() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    let bad_long = es.put("/i/_doc/1", json!({"n": "abc"})).await;
    assert_error_type(&bad_long, 400, "document_parsing_exception");
    let bad_date = es.put("/i/_doc/1", json!({"ts": "not a date"})).await;
    assert_eq!(bad_date.status, 400);
    // dynamic:false stores unmapped fields without indexing them.
    assert_eq!(
        es.put("/i/_doc/1", json!({"other": {"x": 1}})).await.status,
        201
    );
    es.refresh("i").await;
    assert!(es
        .ids("i", json!({"query": {"term": {"other.x": 1}}}))
        .await
        .is_empty());

    es.put(
        "/strict",
        json!({"mappings": {"dynamic": "strict", "properties": {"a": {"type": "keyword"}}}}),
    )
    .await;
    let strict = es.put("/strict/_doc/1", json!({"b": 1})).await;
    assert_error_type(&strict, 400, "strict_dynamic_mapping_exception");
}

#[tokio::test]
async fn dynamic_mapping_infers_types() {
    let es = Es::manual().await;
    es.put(
        "/d/_doc/1?refresh=true",
        json!({"when": "2024-05-01T10:00:00Z", "name": "Hello World", "n": 5}),
    )
    .await;
    let mapping = es.get("/d").await;
    let properties = &mapping.body["d"]["mappings"]["properties"];
    assert_eq!(properties["when"]["type"], "date");
    assert_eq!(properties["name"]["type"], "text");
    assert_eq!(properties["name"]["fields"]["keyword"]["type"], "keyword");
    assert_eq!(properties["n"]["type"], "long");
    assert_eq!(
        es.ids(
            "d",
            json!({"query": {"term": {"name.keyword": "Hello World"}}})
        )
        .await,
        ["1"]
    );
    assert_eq!(
        es.ids("d", json!({"query": {"term": {"name": "hello"}}}))
            .await,
        ["1"]
    );
    assert_eq!(
        es.ids(
            "d",
            json!({"query": {"range": {"when": {"gte": "2024-05-01"}}}})
        )
        .await,
        ["1"]
    );
}

#[tokio::test]
async fn put_mapping_adds_fields_and_is_idempotent() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    let body = json!({"properties": {"flag": {"type": "keyword"}, "o": {"properties": {"x": {"type": "long"}}}}});
    let put = es.put("/i/_mapping", body.clone()).await;
    assert_eq!(put.status, 200, "{}", put.text);
    assert_eq!(put.body, json!({"acknowledged": true}));
    // The same addition again (another instance migrating) changes nothing and is fine.
    let again = es.put("/i/_mapping", body).await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.body, json!({"acknowledged": true}));

    let mapping = es.get("/i/_mapping").await;
    assert_eq!(mapping.status, 200, "{}", mapping.text);
    let properties = &mapping.body["i"]["mappings"]["properties"];
    assert_eq!(properties["flag"], json!({"type": "keyword"}));
    assert_eq!(properties["o"]["properties"]["x"], json!({"type": "long"}));
    // What was there stays, and `GET /{index}` shows the same mapping.
    assert_eq!(properties["s"], json!({"type": "keyword"}));
    // Elasticsearch shows `dynamic` as a string however it was sent (8.19.21).
    assert_eq!(mapping.body["i"]["mappings"]["dynamic"], "false");
    assert_eq!(
        es.get("/i").await.body["i"]["mappings"],
        mapping.body["i"]["mappings"]
    );
}

#[tokio::test]
async fn put_mapping_on_a_missing_index_is_404() {
    let es = Es::manual().await;
    let keyword_f = json!({"properties": {"f": {"type": "keyword"}}});
    assert_no_such_index(&es.put("/nope/_mapping", keyword_f).await, "nope");
    // Unlike a document write, it does not create the index.
    assert_eq!(es.send(Method::HEAD, "/nope", None).await.status, 404);
    assert_no_such_index(&es.get("/nope/_mapping").await, "nope");
}

#[tokio::test]
async fn put_mapping_cannot_change_a_fields_type() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    let s_as_long = json!({"properties": {"added": {"type": "keyword"}, "s": {"type": "long"}}});
    assert_error(
        &es.put("/i/_mapping", s_as_long).await,
        400,
        "illegal_argument_exception",
        "mapper [s] cannot be changed from type [keyword] to [long]",
    );
    // Refused as a whole: the other field of the request was not added either.
    let properties = &es.get("/i/_mapping").await.body["i"]["mappings"]["properties"];
    assert_eq!(properties["s"]["type"], "keyword");
    assert!(properties.get("added").is_none(), "{properties}");
    // Bad declarations get the errors of index creation.
    let nonsense_type = json!({"properties": {"f": {"type": "nonsense"}}});
    let unknown = es.put("/i/_mapping", nonsense_type).await;
    assert_error_type(&unknown, 400, "mapper_parsing_exception");
    let no_body = es.send(Method::PUT, "/i/_mapping", None).await;
    assert_eq!(no_body.status, 400, "{}", no_body.text);
}

#[tokio::test]
async fn a_newly_mapped_field_is_searchable_only_in_documents_written_after() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    // Stored while `flag` is unmapped (dynamic:false): kept in _source, not indexed.
    es.put("/i/_doc/old", json!({"s": "a", "flag": "x"})).await;
    es.put("/i/_doc/rewritten", json!({"s": "a", "flag": "x"}))
        .await;
    let keyword_flag = json!({"properties": {"flag": {"type": "keyword"}}});
    let put = es.put("/i/_mapping", keyword_flag).await;
    assert_eq!(put.status, 200, "{}", put.text);
    es.put("/i/_doc/new", json!({"s": "a", "flag": "x"})).await;
    // Written again after the mapping change: indexed with the new mapping.
    es.put("/i/_doc/rewritten", json!({"s": "a", "flag": "x"}))
        .await;
    es.refresh("i").await;

    let mut flagged = es
        .ids("i", json!({"query": {"exists": {"field": "flag"}}}))
        .await;
    flagged.sort();
    assert_eq!(flagged, ["new", "rewritten"]);
    let mut by_term = es.ids("i", json!({"query": {"term": {"flag": "x"}}})).await;
    by_term.sort();
    assert_eq!(by_term, ["new", "rewritten"]);
    // The old document is still there, with its source, and matches on older fields.
    let old = es.get("/i/_doc/old").await;
    assert_eq!(old.body["_source"]["flag"], "x");
    let mut all = es.ids("i", json!({"query": {"term": {"s": "a"}}})).await;
    all.sort();
    assert_eq!(all, ["new", "old", "rewritten"]);
}

#[tokio::test]
async fn put_mapping_refuses_what_it_does_not_model() {
    let es = Es::manual().await;
    typed_index(&es, "i").await;
    for body in [
        json!({"dynamic": true}),
        json!({"_meta": {"v": 1}}),
        json!({"runtime": {"r": {"type": "keyword"}}}),
        json!({"properties": {"ts": {"type": "date", "format": "epoch_millis"}}}),
        json!({"properties": {"s": {"properties": {"x": {"type": "long"}}}}}),
    ] {
        let request = put("/i/_mapping", body);
        assert_not_modelled(&request, &es.send_request(&request).await);
    }
    let wrong = es.send(Method::DELETE, "/i/_mapping", None).await;
    assert_eq!(wrong.status, 405, "{}", wrong.text);
    let param = es
        .put(
            "/i/_mapping?write_index_only=true",
            json!({"properties": {}}),
        )
        .await;
    assert_eq!(param.status, 400, "{}", param.text);
}

// ---- errors ------------------------------------------------------------------------------

#[tokio::test]
async fn malformed_json_is_400() {
    let es = Es::manual().await;
    // A body cut short is an end-of-file error, anything else a parse error (8.19.21).
    let search = es.raw(Method::POST, "/i/_search", "{\"query\":").await;
    assert_error_type(&search, 400, "x_content_e_o_f_exception");
    assert_eq!(
        search.body["error"]["caused_by"]["type"],
        "json_e_o_f_exception"
    );
    let garbled = es.raw(Method::POST, "/i/_search", "{\"query\" {}}").await;
    assert_eq!(garbled.body["error"]["type"], "x_content_parse_exception");
    assert_eq!(
        garbled.body["error"]["root_cause"][0]["type"],
        "x_content_parse_exception"
    );
    let index = es.raw(Method::PUT, "/x", "{oops").await;
    assert_eq!(index.body["error"]["type"], "x_content_parse_exception");
    let doc = es.raw(Method::PUT, "/i/_doc/1", "{\"a\":").await;
    assert_error_type(&doc, 400, "document_parsing_exception");
    let unknown_query = es.search("i", json!({"query": {"nonsense": {}}})).await;
    assert_eq!(unknown_query.body["error"]["type"], "parsing_exception");
}

/// `root_cause` is the deepest Elasticsearch exception of the chain, not a Java or XContent
/// exception under it (observed on 8.19.21 by the service's differential test).
#[tokio::test]
async fn root_causes_stop_above_exceptions_that_are_not_elasticsearch_ones() {
    let es = Es::manual().await;
    es.put(
        "/i",
        json!({"mappings": {"properties": {"ts": {"type": "date"}, "n": {"type": "long"}}}}),
    )
    .await;
    es.put("/i/_doc/1?refresh=true", json!({"ts": 1, "n": 1}))
        .await;

    let unknown_query = es.search("i", json!({"query": {"nonsense": {}}})).await;
    assert_eq!(unknown_query.body["error"]["type"], "parsing_exception");
    assert_eq!(
        unknown_query.body["error"]["root_cause"][0]["type"],
        "parsing_exception"
    );
    let unfit = es.put("/i/_doc/2", json!({"n": "lots"})).await;
    assert_eq!(unfit.body["error"]["type"], "document_parsing_exception");
    assert_eq!(
        unfit.body["error"]["root_cause"][0]["type"],
        "document_parsing_exception"
    );
    // A date sort's search_after is parsed as a date: parse_exception, not a bare
    // illegal_argument_exception.
    let not_a_date = es
        .search("i", json!({"sort": ["ts"], "search_after": ["yesterday"]}))
        .await;
    assert_eq!(
        failed_search_root_cause(&not_a_date)["type"],
        "parse_exception"
    );
}

#[tokio::test]
async fn unknown_paths_methods_and_parameters() {
    let es = Es::manual().await;
    // No handler: a plain-string `error` and no `status` (8.19.21).
    let nonsense = es.get("/i/_doc/1/nonsense").await;
    assert_eq!(nonsense.status, 400);
    assert_eq!(
        nonsense.body,
        json!({"error": "no handler found for uri [/i/_doc/1/nonsense] and method [GET]"})
    );
    // A first segment starting with `_` that is no API is an index name, and refused as one.
    assert_error(
        &es.get("/_nonsense").await,
        400,
        "invalid_index_name_exception",
        "Invalid index name [_nonsense], must not start with '_'.",
    );
    let wrong = es.send(Method::PATCH, "/i/_doc/1", None).await;
    assert_eq!(wrong.status, 405);
    assert!(wrong.body["error"]
        .as_str()
        .unwrap()
        .starts_with("Incorrect HTTP method for uri [/i/_doc/1] and method [PATCH]"));
    assert!(wrong.headers.get("allow").is_some());
    let param = es.get("/i/_doc/1?bogus=1").await;
    assert_error(
        &param,
        400,
        "illegal_argument_exception",
        "request [/i/_doc/1] contains unrecognized parameter: [bogus]",
    );
    let unsupported = es.post("/i/_update/1", json!({"doc": {}})).await;
    assert_eq!(unsupported.status, 400);
    assert!(reason(&unsupported).contains("es-emulator"));
}

#[tokio::test]
async fn bodies_larger_than_axum_defaults_are_accepted() {
    let es = Es::manual().await;
    let big = "x".repeat(3 * 1024 * 1024);
    let body = format!("{{\"index\":{{\"_index\":\"i\",\"_id\":\"1\"}}}}\n{{\"big\":\"{big}\"}}\n");
    let reply = es.ndjson("/_bulk", &body).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        &reply.text[..200.min(reply.text.len())]
    );
    assert_eq!(reply.body["errors"], false);
}

#[tokio::test]
async fn hits_carry_the_source_as_sent() {
    let es = Es::manual().await;
    let source = r#"{"zeta":1,"alpha":{"y":2,"b":3}}"#;
    es.raw(Method::PUT, "/i/_doc/1?refresh=true", source).await;
    assert_carries_source_as_sent(&es.search("i", json!({})).await, source);
}

/// Asserts that `reply` holds `source` byte for byte, not re-encoded.
fn assert_carries_source_as_sent(reply: &Reply, source: &str) {
    assert!(reply.text.contains(source), "{}", reply.text);
}

// ---- failure injection, counters, lifecycle ----------------------------------------------

#[tokio::test]
async fn injected_failures_are_not_applied() {
    let es = Es::manual().await;
    es.emulator.fail_next(429, 2);
    let rejected = es.put("/i/_doc/1", json!({})).await;
    assert_error_type(&rejected, 429, "es_rejected_execution_exception");
    assert_eq!(es.get("/").await.status, 429);
    assert_eq!(es.get("/").await.status, 200);
    assert_eq!(es.send(Method::HEAD, "/i", None).await.status, 404);

    es.emulator.fail_next(503, 1);
    let unavailable = es.put("/i/_doc/1", json!({})).await;
    assert_error_type(&unavailable, 503, "unavailable_shards_exception");
    es.emulator.fail_next(500, 1);
    let generic = es.get("/").await;
    assert_eq!(generic.status, 500);
    assert_eq!(generic.body["status"], 500);

    es.emulator.set_unavailable(true);
    assert_eq!(es.get("/").await.status, 503);
    assert_eq!(es.put("/i/_doc/1", json!({})).await.status, 503);
    es.emulator.set_unavailable(false);
    assert_eq!(es.get("/i/_doc/1").await.status, 404);
    assert_eq!(es.put("/i/_doc/1", json!({})).await.body["_version"], 1);
}

#[tokio::test]
async fn requests_are_counted_by_kind() {
    let es = Es::manual().await;
    es.get("/").await;
    es.put("/i", json!({})).await;
    es.put("/i/_doc/1", json!({})).await;
    es.put("/i/_doc/2?op_type=create", json!({})).await;
    es.put("/i/_create/3", json!({})).await;
    es.get("/i/_doc/1").await;
    es.delete("/i/_doc/1").await;
    es.ndjson("/_bulk", "{\"delete\":{\"_index\":\"i\",\"_id\":\"2\"}}\n")
        .await;
    es.refresh("i").await;
    es.search("i", json!({})).await;
    es.get("/i/_doc/1/nonsense").await;
    let count = |kind| es.emulator.request_count_of(kind);
    assert_eq!(
        [
            count("info"),
            count("indices"),
            count("index"),
            count("create"),
            count("get"),
            count("delete"),
            count("bulk"),
            count("refresh"),
            count("search"),
            count("other"),
        ],
        [1, 1, 1, 2, 1, 1, 1, 1, 1, 1]
    );
    assert_eq!(es.emulator.request_count(), 11);
    assert_eq!(count("no such kind"), 0);
}

#[tokio::test]
async fn shutdown_and_drop_stop_serving() {
    let es = Es::manual().await;
    let url = es.emulator.url.clone();
    let client = es.client.clone();
    assert!(client.get(&url).send().await.is_ok());
    es.emulator.shutdown().await;
    assert!(client.get(&url).send().await.is_err());

    let dropped = es_emulator::spawn(EmulatorConfig::default()).await;
    let url = dropped.url.clone();
    drop(dropped);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while client.get(&url).send().await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still serving after drop"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn serve_runs_on_a_given_listener() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(es_emulator::serve(listener, EmulatorConfig::default()));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let info = client.get(&url).send().await.unwrap();
    assert_eq!(info.status().as_u16(), 200);
    server.abort();
}

// ---- dates -------------------------------------------------------------------------------

#[test]
fn date_parsing_and_math() {
    use es_emulator::dates::{eval_math, format_iso, parse_with};
    assert_eq!(format_iso(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(parse_with("1970-01-02", None, false), Ok(86_400_000));
    assert_eq!(parse_with("1970-01-02", None, true), Ok(2 * 86_400_000 - 1));
    assert_eq!(parse_with("1970-01-01T01:00:00+01:00", None, false), Ok(0));
    assert_eq!(
        parse_with("2024-02-29T12:00:00.5Z", None, false),
        Ok(1_709_208_000_500)
    );
    assert_eq!(parse_with("1234", Some("epoch_millis"), false), Ok(1234));
    assert!(parse_with("2023-02-29", None, false).is_err());
    let minute = 60_000;
    assert_eq!(eval_math("now-1m", 2 * minute, None, false), Ok(minute));
    assert_eq!(eval_math("now/m", 90_000, None, false), Ok(minute));
    assert_eq!(eval_math("now/m", 90_000, None, true), Ok(2 * minute - 1));
    assert_eq!(
        eval_math("2024-01-31||+1M", 0, None, false),
        parse_with("2024-02-29", None, false)
    );
    assert_eq!(
        eval_math("now-1h", 3 * 3_600_000, None, false),
        Ok(2 * 3_600_000)
    );
}

// ---- §12 security (optional) ---------------------------------------------------------------

/// An emulator with security on: the API key `k1` (read on `ro-*`, everything on `rw-*`) and
/// the user `svc`; `client` sends `authorization` when given.
async fn secured(authorization: Option<String>) -> Es {
    use es_emulator::{ApiKey, Grant, SecurityConfig, User};
    let mut grant = Grant::indices(&["ro-*"], &["read"]);
    grant
        .indices
        .extend(Grant::indices(&["rw-*"], &["all"]).indices);
    let config = EmulatorConfig {
        refresh_interval: None,
        security: Some(SecurityConfig {
            api_keys: vec![ApiKey::new("k1", "s3cret", grant)],
            users: vec![User {
                name: "svc".into(),
                password: "pw".into(),
                roles: vec!["svc_role".into()],
                grant: Grant::indices(&["rw-*"], &["all"]),
            }],
        }),
        tls: None,
    };
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(value) = authorization {
        headers.insert("authorization", value.parse().unwrap());
    }
    Es {
        emulator: es_emulator::spawn(config).await,
        client: reqwest::Client::builder()
            .no_proxy()
            .default_headers(headers)
            .build()
            .unwrap(),
    }
}

fn api_key(id: &str, secret: &str) -> String {
    format!(
        "ApiKey {}",
        es_emulator::ApiKey::new(id, secret, es_emulator::Grant::default()).encoded()
    )
}

#[tokio::test]
async fn security_without_credentials_answers_401_with_the_challenges() {
    let es = secured(None).await;
    let reply = es.get("/rw-a/_doc/1?realtime=true").await;
    assert_eq!(reply.status, 401, "{}", reply.text);
    let challenges: Vec<&str> = reply
        .headers
        .get_all("www-authenticate")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(
        challenges,
        [
            "Basic realm=\"security\", charset=\"UTF-8\"",
            "Bearer realm=\"security\"",
            "ApiKey"
        ]
    );
    assert_eq!(reply.body["status"], 401);
    assert_eq!(reply.body["error"]["type"], "security_exception");
    assert_eq!(
        reply.body["error"]["reason"],
        "missing authentication credentials for REST request [/rw-a/_doc/1?realtime=true]"
    );
    assert_eq!(
        reply.body["error"]["header"]["WWW-Authenticate"],
        json!(challenges)
    );
    assert_eq!(
        reply.body["error"]["root_cause"][0]["type"],
        "security_exception"
    );
}

#[tokio::test]
async fn security_refuses_wrong_invalidated_and_unknown_credentials() {
    let wrong = secured(Some(api_key("k1", "nope"))).await;
    let reply = wrong.get("/").await;
    assert_eq!(reply.status, 401);
    assert_eq!(
        reply.body["error"]["reason"],
        "unable to authenticate with provided credentials and anonymous access is not allowed \
         for this request"
    );
    assert!(reply.body["error"]["additional_unsuccessful_credentials"]
        .as_str()
        .unwrap()
        .starts_with("API key: "));

    let right = secured(Some(api_key("k1", "s3cret"))).await;
    assert_eq!(right.put("/rw-a/_doc/1", json!({"a": 1})).await.status, 201);
    right.emulator.invalidate_api_key("k1");
    let reply = right.get("/rw-a/_doc/1").await;
    assert_eq!(reply.status, 401);
    assert_eq!(
        reply.body["error"]["additional_unsuccessful_credentials"],
        "API key: api key [k1] has been invalidated"
    );

    let basic = |user: &str, password: &str| {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    };
    let user = secured(Some(basic("svc", "pw"))).await;
    assert_eq!(user.put("/rw-a/_doc/1", json!({"a": 1})).await.status, 201);
    let bad = secured(Some(basic("svc", "wrong"))).await;
    let reply = bad.get("/rw-a/_doc/1").await;
    assert_eq!(reply.status, 401);
    assert_eq!(
        reply.body["error"]["reason"],
        "unable to authenticate user [svc] for REST request [/rw-a/_doc/1]"
    );
}

#[tokio::test]
async fn security_answers_403_naming_the_action_and_the_privileges() {
    let es = secured(Some(api_key("k1", "s3cret"))).await;
    let reply = es.put("/ro-a", json!({})).await;
    assert_eq!(reply.status, 403, "{}", reply.text);
    assert_eq!(reply.body["error"]["type"], "security_exception");
    assert_eq!(
        reply.body["error"]["reason"],
        "action [indices:admin/create] is unauthorized for API key id [k1] of user \
         [transfer-service-admin] on indices [ro-a], this action is granted by the index \
         privileges [create_index,manage,all]"
    );
    let reply = es.get("/").await;
    assert_eq!(reply.status, 403);
    assert!(reply.body["error"]["reason"]
        .as_str()
        .unwrap()
        .ends_with("this action is granted by the cluster privileges [monitor,manage,all]"));
    // HEAD carries no body, only the status; `read` does not grant index metadata.
    let reply = es.send(Method::HEAD, "/rw-a", None).await;
    assert_eq!(reply.status, 404);
    let reply = es.send(Method::HEAD, "/ro-a", None).await;
    assert_eq!((reply.status, reply.text.as_str()), (403, ""));
}

#[tokio::test]
async fn security_refuses_bulk_items_one_by_one() {
    let es = secured(Some(api_key("k1", "s3cret"))).await;
    let body = "{\"create\":{\"_index\":\"rw-a\",\"_id\":\"1\"}}\n{\"a\":1}\n\
                {\"create\":{\"_index\":\"ro-a\",\"_id\":\"1\"}}\n{\"a\":1}\n";
    let reply = es.ndjson("/_bulk", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.body["errors"], true);
    assert_eq!(reply.body["items"][0]["create"]["status"], 201);
    let refused = &reply.body["items"][1]["create"];
    assert_eq!(refused["status"], 403);
    assert_eq!(refused["error"]["type"], "security_exception");
    assert!(refused["error"]["reason"]
        .as_str()
        .unwrap()
        .contains("action [indices:data/write/index:op_type/create]"));

    // A key that may write nowhere is refused the whole `_bulk`.
    es.emulator
        .set_api_key_grant("k1", es_emulator::Grant::indices(&["*"], &["read"]));
    let reply = es.ndjson("/_bulk", body).await;
    assert_eq!(reply.status, 403, "{}", reply.text);
    assert!(reply.body["error"]["reason"]
        .as_str()
        .unwrap()
        .starts_with("action [indices:data/write/bulk] is unauthorized"));
}

/// `flattened` (docs/elasticsearch.md §8): a `term` on a keyed sub-field matches the leaf at
/// that dotted key path exactly; everything else on a flattened field is refused as not
/// implemented by this test double rather than answered wrongly.
#[tokio::test]
async fn flattened_fields_answer_keyed_terms_and_refuse_the_rest() {
    let es = Es::manual().await;
    let mapping =
        json!({"mappings": {"dynamic": false, "properties": {"labels": {"type": "flattened"}}}});
    let reply = es.send(Method::PUT, "/f", Some(mapping)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    for (id, labels) in [
        ("1", json!({"order": "1", "shop": "x"})),
        ("2", json!({"order": "2", "order.line": "1"})),
        ("3", json!({"order": {"line": "1"}})),
    ] {
        let reply = es
            .send(
                Method::PUT,
                &format!("/f/_doc/{id}"),
                Some(json!({"labels": labels})),
            )
            .await;
        assert_eq!(reply.status, 201, "{}", reply.text);
    }
    es.send(Method::POST, "/f/_refresh", None).await;
    let search = |query: Value| {
        let es = &es;
        async move {
            es.send(Method::POST, "/f/_search", Some(json!({"query": query})))
                .await
        }
    };
    let found = search(json!({"term": {"labels.order": "1"}})).await;
    assert_eq!(hit_ids(&found.body), ["1"], "{}", found.text);
    // A dotted key and the same path through an object are one keyed field.
    let mut found = hit_ids(
        &search(json!({"term": {"labels.order.line": "1"}}))
            .await
            .body,
    );
    found.sort();
    assert_eq!(found, ["2", "3"]);
    let none = search(json!({"term": {"labels.order": "3"}})).await;
    assert!(hit_ids(&none.body).is_empty(), "{}", none.text);
    for refused in [
        json!({"term": {"labels": "1"}}),
        json!({"range": {"labels.order": {"gte": "1"}}}),
        json!({"exists": {"field": "labels.order"}}),
        json!({"term": {"labels.order": 1}}),
    ] {
        let reply = search(refused.clone()).await;
        assert_eq!(reply.status, 400, "{refused}: {}", reply.text);
        assert!(
            reply.text.contains("not implemented by es-emulator"),
            "{}",
            reply.text
        );
    }
    let with_param = json!({"properties": {"other": {"type": "flattened", "depth_limit": 2}}});
    let reply = es.send(Method::PUT, "/f/_mapping", Some(with_param)).await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert!(
        reply.text.contains("not implemented by es-emulator"),
        "{}",
        reply.text
    );
}
