//! The differential test (issue 27, item 4): the same sequence of raw HTTP requests — the
//! subset of `docs/elasticsearch.md` the Elasticsearch backend sends — goes to a real
//! Elasticsearch cluster (`crate::support::cluster::shared`) and to a fresh `es-emulator` (the
//! TEST DOUBLE), each on index names of its own, and the answers must agree on what the
//! backend reads: status codes, the `X-elastic-product` header, error types (and the 409
//! reasons the backend tells apart), `_seq_no`/`_primary_term`/`_version`/`result`, bulk items
//! in order, `found`/`_source`, search hits with their `sort` values and `hits.total`.
//!
//! Each area is a table of [`Step`]s: a request (with `${alias}` for an index name and
//! `${label:/json/pointer}` for a value an earlier step of the same engine answered, so a
//! compare-and-set uses the `_seq_no` that engine gave) and the fields to compare. The table
//! runs on Elasticsearch first, then on the emulator; every difference of every step is
//! listed in one failure, named by its step. Each step also names the status it is meant to
//! provoke, checked on both engines, so a table that stopped testing what it says fails too.
//!
//! What is normalized, and why:
//! - index names: each engine works on `<unique prefix><alias>`; names in values and keys are
//!   read back as `${alias}`;
//! - nothing else is compared unless a step names it: `took`, uuids, node names and the exact
//!   wording of most reasons legitimately differ and the backend reads none of them;
//! - `_seq_no` is compared as an absolute value: every index here is created by the table
//!   itself, and each shard's sequence numbers start at 0 and rise by one per operation
//!   applied on it (§11), so the same requests give the same numbers on any correct engine
//!   that routes each id to the same shard. An off-by-one start would be a real difference
//!   (reasons quote seq_nos too), and so would a document on another shard.
//!
//! `TEST_LOG=1` prints both answers of every step. When no cluster can run here (no
//! `java`/`mvn`), every test returns at once after the harness said so loudly (a failure
//! under `CI=true`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use reqwest::Method;
use serde_json::{json, Value};
use transfer_service::store::elasticsearch::migrations_index_body;
use transfer_service::time::format_millis;

use crate::support::{cluster, stores};

/// The indices a table may name (`${alias}`), each `<engine's prefix><alias>`. `missing` is
/// never created; `BadName` is not a valid index name; `shards3`, `shards5` and `routed6` are
/// the indices of several shards.
const ALIASES: [&str; 10] = [
    "accounts",
    "transactions",
    "migrations",
    "webhooks",
    "scratch",
    "missing",
    "BadName",
    "shards3",
    "shards5",
    "routed6",
];

const MIGRATION_ACCOUNTS: &str = include_str!("../../migrations/0001_accounts.json");
const MIGRATION_TRANSACTIONS: &str = include_str!("../../migrations/0002_transactions.json");
const MIGRATION_ATTENTION: &str = include_str!("../../migrations/0003_transactions_attention.json");
const MIGRATION_METADATA: &str = include_str!("../../migrations/0004_transactions_metadata.json");
const MIGRATION_ACCOUNTS_FIELD: &str =
    include_str!("../../migrations/0005_transactions_accounts.json");
const MIGRATION_ENTRIES: &str = include_str!("../../migrations/0007_transactions_entries.json");
const MIGRATION_WEBHOOKS: &str = include_str!("../../migrations/0006_webhooks.json");

/// The `body` of a migration file: what the backend sends to create an index or add fields.
fn migration_body(file: &str) -> String {
    let step: Value = serde_json::from_str(file).expect("a migration file is JSON");
    step["body"].to_string()
}

// Field patterns: `/`-separated keys; `*` is every element of an array (its length is
// compared too) or every key of an object (the key names are compared too).

/// A write answer (§0).
const WRITE: &[&str] = &[
    "_index",
    "_id",
    "_version",
    "result",
    "_seq_no",
    "_primary_term",
    "_shards",
    "forced_refresh",
];
/// An error envelope (§0); `error/type` is compared on every step anyway.
const ERROR: &[&str] = &["status", "error/root_cause/*/type"];
/// The reason of a 409, which the backend reads to tell the conflicts apart (reply.rs).
const REASON: &[&str] = &["error/reason"];
/// A realtime GET (§2).
const GOT: &[&str] = &[
    "_index",
    "_id",
    "_version",
    "_seq_no",
    "_primary_term",
    "found",
    "_source",
];
/// A `_bulk` answer (§6): every item, in order, under its action's name.
const BULK: &[&str] = &[
    "errors",
    "items/*/*/_index",
    "items/*/*/_id",
    "items/*/*/status",
    "items/*/*/result",
    "items/*/*/_version",
    "items/*/*/_seq_no",
    "items/*/*/_primary_term",
    "items/*/*/error/type",
];
/// The reasons of failed bulk items: the backend reads those of 409s (reply.rs tells
/// "document already exists" from "but no document was found" from a CAS mismatch).
const ITEM_REASONS: &[&str] = &["items/*/*/error/reason"];
/// A search answer (§7), as `hits_of`/`page_of`/`doc_of`/`sort_key_of` read it.
const HITS: &[&str] = &[
    "timed_out",
    "_shards/failed",
    "hits/total",
    "hits/max_score",
    "hits/hits/*/_index",
    "hits/hits/*/_id",
    "hits/hits/*/_seq_no",
    "hits/hits/*/_primary_term",
    "hits/hits/*/_version",
    "hits/hits/*/_score",
    "hits/hits/*/_source",
    "hits/hits/*/sort",
];
/// An index creation or a mapping update (§8).
const ACKNOWLEDGED: &[&str] = &["acknowledged", "shards_acknowledged", "index"];
/// A refresh (§7): the backend reads `_shards.failed`.
const SHARDS: &[&str] = &["_shards"];

/// One request of a table and what to compare of its answers.
struct Step {
    name: &'static str,
    method: Method,
    /// Path and query, with `${…}` placeholders.
    path: String,
    /// `(content type, body)`, with `${…}` placeholders.
    body: Option<(&'static str, String)>,
    /// The status the step is meant to provoke (on both engines).
    status: u16,
    compare: Vec<&'static str>,
    /// Keeps the answer for later steps' `${label:/pointer}`.
    save: Option<&'static str>,
}

impl Step {
    fn new(name: &'static str, method: Method, path: impl Into<String>) -> Self {
        Step {
            name,
            method,
            path: path.into(),
            body: None,
            status: 200,
            compare: Vec::new(),
            save: None,
        }
    }

    fn get(name: &'static str, path: impl Into<String>) -> Self {
        Self::new(name, Method::GET, path)
    }

    fn head(name: &'static str, path: impl Into<String>) -> Self {
        Self::new(name, Method::HEAD, path)
    }

    fn put(name: &'static str, path: impl Into<String>, json: impl Into<String>) -> Self {
        Self::new(name, Method::PUT, path).body("application/json", json)
    }

    fn post(name: &'static str, path: impl Into<String>, json: impl Into<String>) -> Self {
        Self::new(name, Method::POST, path).body("application/json", json)
    }

    /// `POST /_bulk` as the backend sends it: NDJSON, every line (the last one included)
    /// ended by `\n`, with the server-side `timeout`, asking for only what it reads of each
    /// item (`filter_path`, so the fields it does not read compare as absent on both).
    fn bulk(name: &'static str, lines: &[&str]) -> Self {
        Self::bulk_at(
            name,
            "/_bulk?timeout=5000ms&filter_path=items.*.status,items.*._seq_no,\
             items.*._primary_term,items.*.error",
            lines,
        )
    }

    /// [`Step::bulk`] with the whole answer: every field of every item.
    fn bulk_unfiltered(name: &'static str, lines: &[&str]) -> Self {
        Self::bulk_at(name, "/_bulk?timeout=5000ms", lines)
    }

    fn bulk_at(name: &'static str, path: &'static str, lines: &[&str]) -> Self {
        let mut body = String::new();
        for line in lines {
            body.push_str(line);
            body.push('\n');
        }
        Self::new(name, Method::POST, path)
            .body("application/x-ndjson", body)
            .compare(BULK)
    }

    fn body(mut self, content_type: &'static str, body: impl Into<String>) -> Self {
        self.body = Some((content_type, body.into()));
        self
    }

    fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    fn compare(mut self, fields: &[&'static str]) -> Self {
        self.compare.extend_from_slice(fields);
        self
    }

    /// Answered `status` with an error: the status and the root causes' types are compared.
    fn refused(self, status: u16) -> Self {
        self.status(status).compare(ERROR)
    }

    /// A get that finds nothing (404): the answers must say so alike.
    fn finds_nothing(self) -> Self {
        self.status(404).compare(GOT)
    }

    /// A write that creates its document (201): the write answers are compared.
    fn created(self) -> Self {
        self.status(201).compare(WRITE)
    }

    fn save(mut self, label: &'static str) -> Self {
        self.save = Some(label);
        self
    }
}

/// What an engine answered to one step, reduced to the compared fields.
#[derive(Debug, PartialEq)]
struct Answer {
    status: u16,
    /// `X-elastic-product`; the backend refuses answers without it.
    product: Option<String>,
    /// Compared field → value (`"<absent>"` when the field is not there).
    fields: BTreeMap<String, Value>,
}

/// One engine's run of a table.
struct Run {
    url: String,
    /// `alias` → the physical index name on this engine.
    names: Vec<(&'static str, String)>,
    saved: BTreeMap<&'static str, Value>,
    client: reqwest::Client,
}

impl Run {
    fn new(url: &str, what: &str) -> Self {
        let prefix = stores::unique_prefix(what);
        Run {
            url: url.trim_end_matches('/').to_owned(),
            names: ALIASES
                .iter()
                .map(|a| (*a, format!("{prefix}{a}")))
                .collect(),
            saved: BTreeMap::new(),
            client: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("an HTTP client"),
        }
    }

    /// Replaces `${alias}` by this engine's index name and `${label:/pointer}` by the value
    /// this engine answered (a string as it is, anything else as JSON).
    fn expand(&self, step: &str, template: &str) -> String {
        let mut out = String::new();
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..]
                .find('}')
                .unwrap_or_else(|| panic!("step `{step}`: unclosed ${{ in {template}"))
                + start;
            let key = &rest[start + 2..end];
            match key.split_once(':') {
                Some((label, pointer)) => {
                    let value = self
                        .saved
                        .get(label)
                        .and_then(|body| body.pointer(pointer))
                        .unwrap_or_else(|| {
                            panic!("step `{step}`: no {pointer} in the answer saved as {label}")
                        });
                    match value {
                        Value::String(text) => out.push_str(text),
                        other => out.push_str(&other.to_string()),
                    }
                }
                None => out.push_str(self.name(key)),
            }
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }

    fn name(&self, alias: &str) -> &str {
        self.names
            .iter()
            .find(|(a, _)| *a == alias)
            .map(|(_, name)| name.as_str())
            .unwrap_or_else(|| panic!("unknown index alias {alias}"))
    }

    /// Index names read back as `${alias}` (the longest first, though no name contains
    /// another).
    fn normalize(&self, value: Value) -> Value {
        match value {
            Value::String(text) => Value::String(self.normalize_text(&text)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.normalize(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| (self.normalize_text(&k), self.normalize(v)))
                    .collect(),
            ),
            other => other,
        }
    }

    fn normalize_text(&self, text: &str) -> String {
        let mut names: Vec<&(&str, String)> = self.names.iter().collect();
        names.sort_by_key(|(_, name)| std::cmp::Reverse(name.len()));
        names.iter().fold(text.to_owned(), |text, (alias, name)| {
            text.replace(name.as_str(), &format!("${{{alias}}}"))
        })
    }

    async fn send(&mut self, step: &Step) -> Answer {
        let url = format!("{}{}", self.url, self.expand(step.name, &step.path));
        let mut request = self.client.request(step.method.clone(), &url);
        if let Some((content_type, body)) = &step.body {
            request = request
                .header("content-type", *content_type)
                .body(self.expand(step.name, body));
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("step `{}`: {url}: {e}", step.name));
        let status = response.status().as_u16();
        let product = response
            .headers()
            .get("x-elastic-product")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = response.bytes().await.expect("the answer's body");
        let body = if bytes.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                Value::String(format!(
                    "<not JSON> {}",
                    String::from_utf8_lossy(&bytes).trim()
                ))
            })
        };
        if let Some(label) = step.save {
            self.saved.insert(label, body.clone());
        }
        let body = self.normalize(body);
        let mut fields = BTreeMap::new();
        if step.method == Method::HEAD {
            fields.insert("<body>".to_owned(), body.clone());
        }
        if body.is_string() {
            fields.insert("<body>".to_owned(), body.clone());
        }
        for pattern in step.compare.iter().chain(&["error/type"]) {
            let segments: Vec<&str> = pattern.split('/').collect();
            select(&body, &segments, String::new(), &mut fields);
        }
        Answer {
            status,
            product,
            fields,
        }
    }
}

/// Puts into `out` the values of `body` at `pattern` (see the pattern notes above).
fn select(body: &Value, pattern: &[&str], at: String, out: &mut BTreeMap<String, Value>) {
    let Some((first, rest)) = pattern.split_first() else {
        out.insert(at, body.clone());
        return;
    };
    match (*first, body) {
        ("*", Value::Array(items)) => {
            out.insert(format!("{at}/#len"), json!(items.len()));
            for (i, item) in items.iter().enumerate() {
                select(item, rest, format!("{at}/{i}"), out);
            }
        }
        ("*", Value::Object(map)) => {
            for (key, value) in map {
                select(value, rest, format!("{at}/{key}"), out);
            }
        }
        ("*", _) => {
            out.insert(format!("{at}/*"), json!("<absent>"));
        }
        (key, value) => match value.get(key) {
            Some(inner) => select(inner, rest, format!("{at}/{key}"), out),
            None => {
                out.insert(format!("{at}/{key}"), json!("<absent>"));
            }
        },
    }
}

/// Runs `steps` on the shared real cluster and on a fresh emulator and fails with every
/// difference, named by its step. Returns at once where no cluster can run.
async fn differential(area: &str, steps: Vec<Step>) {
    let Some(real_url) = cluster::shared() else {
        return;
    };
    let emulator = stores::manual_emulator().await;
    let mut real = Run::new(&real_url, "diff-es");
    let mut emulated = Run::new(&emulator.url, "diff-emu");

    let mut real_answers = Vec::with_capacity(steps.len());
    for step in &steps {
        real_answers.push(real.send(step).await);
    }
    let mut emulated_answers = Vec::with_capacity(steps.len());
    for step in &steps {
        emulated_answers.push(emulated.send(step).await);
    }

    let on_opensearch = cluster::engine().starts_with("opensearch");
    let mut report = String::new();
    for ((step, es), emu) in steps.iter().zip(&real_answers).zip(&emulated_answers) {
        let name = step.name;
        if std::env::var_os("TEST_LOG").is_some() {
            eprintln!("{area} / {name}:\n  Elasticsearch {es:?}\n  emulator      {emu:?}");
        }
        if es.status != step.status {
            let _ = writeln!(
                report,
                "step `{name}`: meant to answer {}, Elasticsearch answered {} ({:?})",
                step.status, es.status, es.fields
            );
        }
        if es.status != emu.status {
            let _ = writeln!(
                report,
                "step `{name}`: status: Elasticsearch {} / emulator {}",
                es.status, emu.status
            );
        }
        // OpenSearch sends no `X-elastic-product` (the service knows it by its `GET /`).
        if es.product != emu.product && !on_opensearch {
            let _ = writeln!(
                report,
                "step `{name}`: X-elastic-product: Elasticsearch {:?} / emulator {:?}",
                es.product, emu.product
            );
        }
        let absent = json!("<field not compared on this side>");
        for key in es.fields.keys().chain(emu.fields.keys()) {
            let (a, b) = (
                es.fields.get(key).unwrap_or(&absent),
                emu.fields.get(key).unwrap_or(&absent),
            );
            if a != b && !report.contains(&format!("step `{name}`: {key}:")) {
                let _ = writeln!(
                    report,
                    "step `{name}`: {key}: Elasticsearch {a} / emulator {b}"
                );
            }
        }
    }
    assert!(
        report.is_empty(),
        "{area}: the emulator and Elasticsearch answer differently \
         (Elasticsearch is right):\n{report}"
    );
}

/// Creates the backend's data indices with the migrations' own bodies, as steps.
fn create_indices() -> Vec<Step> {
    vec![
        Step::put(
            "create accounts (migration 0001)",
            "/${accounts}",
            migration_body(MIGRATION_ACCOUNTS),
        )
        .compare(ACKNOWLEDGED),
        Step::put(
            "create transactions (migration 0002)",
            "/${transactions}",
            migration_body(MIGRATION_TRANSACTIONS),
        )
        .compare(ACKNOWLEDGED),
        Step::put(
            "map attention (migration 0003)",
            "/${transactions}/_mapping",
            migration_body(MIGRATION_ATTENTION),
        )
        .compare(ACKNOWLEDGED),
        Step::put(
            "map metadata (migration 0004)",
            "/${transactions}/_mapping",
            migration_body(MIGRATION_METADATA),
        )
        .compare(ACKNOWLEDGED),
        Step::put(
            "map accounts (migration 0005)",
            "/${transactions}/_mapping",
            migration_body(MIGRATION_ACCOUNTS_FIELD),
        )
        .compare(ACKNOWLEDGED),
        Step::put(
            "map entries (migration 0007)",
            "/${transactions}/_mapping",
            migration_body(MIGRATION_ENTRIES),
        )
        .compare(ACKNOWLEDGED),
    ]
}

fn account(id: &str, balance: i64) -> String {
    json!({
        "account_id": id,
        "balance": balance,
        "floor": 0,
        "opening_balance": balance,
        "pending_transactions": ["t-pending"],
        "pending_applied_at": [1_767_225_600_000_i64],
        "pending_credits": 0,
        "pending_debits": 5,
        "settled_transactions": [{"id": "t-old", "at": 1}],
        "creation_time": "2026-01-01T00:00:00.000Z",
        "modification_time": "2026-01-01T00:00:00.000Z",
    })
    .to_string()
}

/// An entry value of `account` at `seq` (`transfer_service::store::entries`).
fn entry(account: &str, seq: u64) -> String {
    format!("{account}/{seq:020}/1764371234567/-1/9/d")
}

/// A transfer document as the engine writes it; `extra` adds or replaces fields.
fn transfer(id: &str, state: &str, created_ms: i64, modified_ms: i64, extra: Value) -> String {
    let mut doc = json!({
        "transaction_id": id,
        "src_acct": "a1",
        "dest_acct": "a2",
        "amount": 5,
        "transaction_state": state,
        "lease_owner": "worker-1",
        "lease_expires_at": format_millis(modified_ms + 30_000),
        "request_fingerprint": "f00d",
        "creation_time": format_millis(created_ms),
        "modification_time": format_millis(modified_ms),
    });
    for (key, value) in extra.as_object().expect("extra fields are an object") {
        if value.is_null() {
            doc.as_object_mut().unwrap().remove(key);
        } else {
            doc[key] = value.clone();
        }
    }
    doc.to_string()
}

/// Index creation, `HEAD`, mapping additions and the migration records (§8, §1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_creation_and_mapping_additions_match_elasticsearch() {
    let mut steps = vec![
        // On the launcher's nodes `GET /` is a small plugin of the launcher answering with
        // the server's own build values (docs/elasticsearch.md), so only those are compared.
        Step::get("cluster info", "/").compare(&["version/number", "version/lucene_version"]),
        Step::head("HEAD of an index not created yet", "/${accounts}").status(404),
        Step::put(
            "create the migrations index",
            "/${migrations}",
            migrations_index_body().to_string(),
        )
        .compare(ACKNOWLEDGED),
    ];
    steps.extend(create_indices());
    steps.extend([
        Step::head("HEAD of a created index", "/${accounts}"),
        Step::put(
            "create an index that exists",
            "/${accounts}",
            migration_body(MIGRATION_ACCOUNTS),
        )
        .refused(400),
        Step::put(
            "create webhooks (migration 0006)",
            "/${webhooks}",
            migration_body(MIGRATION_WEBHOOKS),
        )
        .compare(ACKNOWLEDGED),
        Step::get("read the accounts mapping", "/${accounts}/_mapping").compare(&["*"]),
        Step::get("read the transactions mapping", "/${transactions}/_mapping").compare(&["*"]),
        Step::put(
            "map attention again (a restart's migration)",
            "/${transactions}/_mapping",
            migration_body(MIGRATION_ATTENTION),
        )
        .compare(ACKNOWLEDGED),
        Step::put(
            "change a mapped field's type",
            "/${transactions}/_mapping",
            r#"{"properties":{"attention":{"type":"long"}}}"#,
        )
        .refused(400)
        .compare(REASON),
        Step::get(
            "the refused change left the mapping as it was",
            "/${transactions}/_mapping",
        )
        .compare(&["*"]),
        Step::put(
            "map a field on a missing index",
            "/${missing}/_mapping",
            migration_body(MIGRATION_ATTENTION),
        )
        .refused(404),
        Step::get(
            "read the mapping of a missing index",
            "/${missing}/_mapping",
        )
        .refused(404),
        Step::head("HEAD of a missing index", "/${missing}").status(404),
        Step::put(
            "create an index with an invalid name",
            "/${BadName}",
            migration_body(MIGRATION_ACCOUNTS),
        )
        .refused(400),
        Step::put(
            "record migration 0001",
            "/${migrations}/_create/0001_accounts",
            r#"{"description":"accounts","applied_at":"2026-01-01T00:00:00.000Z"}"#,
        )
        .created(),
        Step::put(
            "record migration 0001 again (another instance)",
            "/${migrations}/_create/0001_accounts",
            r#"{"description":"accounts","applied_at":"2026-01-01T00:00:01.000Z"}"#,
        )
        .refused(409)
        .compare(REASON),
        Step::get(
            "read the record",
            "/${migrations}/_doc/0001_accounts?realtime=true",
        )
        .compare(GOT),
        Step::get(
            "read a record not written",
            "/${migrations}/_doc/0006_webhooks?realtime=true",
        )
        .finds_nothing(),
    ]);
    differential("index creation and mapping additions", steps).await;
}

/// `op_type=create`, `_create`, and index with `if_seq_no`/`if_primary_term` (§1, §3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_compare_and_set_match_elasticsearch() {
    let mut steps = create_indices();
    steps.extend([
        Step::put(
            "create a new id with op_type=create",
            "/${accounts}/_doc/a1?op_type=create",
            account("a1", 100),
        )
        .created()
        .save("a1"),
        Step::put(
            "create an existing id with op_type=create",
            "/${accounts}/_doc/a1?op_type=create",
            account("a1", 999),
        )
        .refused(409)
        .compare(REASON),
        Step::put(
            "create a new id with _create",
            "/${accounts}/_create/a2",
            account("a2", 50),
        )
        .created()
        .save("a2"),
        Step::post(
            "create an existing id with POST _create",
            "/${accounts}/_create/a2",
            account("a2", 1),
        )
        .refused(409)
        .compare(REASON),
        Step::put(
            "index with the current seq_no and term",
            "/${accounts}/_doc/a1?if_seq_no=${a1:/_seq_no}&if_primary_term=${a1:/_primary_term}",
            account("a1", 90),
        )
        .compare(WRITE)
        .save("a1v2"),
        Step::put(
            "index with a stale seq_no",
            "/${accounts}/_doc/a1?if_seq_no=${a1:/_seq_no}&if_primary_term=${a1:/_primary_term}",
            account("a1", 80),
        )
        .refused(409)
        .compare(REASON),
        Step::put(
            "index with the current seq_no and another term",
            "/${accounts}/_doc/a1?if_seq_no=${a1v2:/_seq_no}&if_primary_term=7",
            account("a1", 80),
        )
        .refused(409)
        .compare(REASON),
        Step::put(
            "index a missing document with a seq_no and term",
            "/${accounts}/_doc/ghost?if_seq_no=${a1v2:/_seq_no}&if_primary_term=1",
            account("ghost", 1),
        )
        .refused(409)
        .compare(REASON),
        Step::get(
            "the missing document stays missing",
            "/${accounts}/_doc/ghost",
        )
        .finds_nothing(),
        Step::put(
            "index with if_seq_no and no term",
            "/${accounts}/_doc/a1?if_seq_no=${a1v2:/_seq_no}",
            account("a1", 70),
        )
        .refused(400)
        .compare(REASON),
        Step::put(
            "index with a term and no if_seq_no",
            "/${accounts}/_doc/a1?if_primary_term=1",
            account("a1", 70),
        )
        .refused(400)
        .compare(REASON),
        Step::put(
            "create with a seq_no and term",
            "/${accounts}/_create/a3?if_seq_no=0&if_primary_term=1",
            account("a3", 1),
        )
        .refused(400),
        Step::put(
            "index with a negative seq_no",
            "/${accounts}/_doc/a1?if_seq_no=-5&if_primary_term=1",
            account("a1", 70),
        )
        .refused(400),
        Step::put(
            "index an existing id without a condition",
            "/${accounts}/_doc/a2",
            account("a2", 40),
        )
        .compare(WRITE),
        Step::put(
            "index the same source again",
            "/${accounts}/_doc/a2",
            account("a2", 40),
        )
        .compare(WRITE),
        Step::put(
            "index with refresh=true",
            "/${accounts}/_doc/a4?refresh=true",
            account("a4", 4),
        )
        .created(),
        Step::get(
            "read the conditionally indexed document",
            "/${accounts}/_doc/a1",
        )
        .compare(GOT),
        Step::put(
            "create in a missing index (auto-created)",
            "/${scratch}/_doc/x?op_type=create",
            r#"{"note":"auto-created"}"#,
        )
        .created(),
    ]);
    differential("create and compare-and-set", steps).await;
}

/// `_bulk` as the backend sends it: `create` and conditional `index` items, mixed outcomes,
/// and the requests refused as a whole (§6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_with_mixed_outcomes_matches_elasticsearch() {
    let mut steps = create_indices();
    let a1 = account("a1", 100);
    let a2 = account("a2", 100);
    let t1 = transfer("t1", "pending", 1_000, 1_000, json!({}));
    let t2 = transfer("t2", "pending", 2_000, 2_000, json!({}));
    let a1_debited = account("a1", 95);
    let a2_credited = account("a2", 105);
    let t1_committed = transfer("t1", "committed", 1_000, 3_000, json!({}));
    steps.extend([
        Step::bulk_unfiltered(
            "bulk: three creates",
            &[
                r#"{"create":{"_index":"${accounts}","_id":"a1"}}"#,
                &a1,
                r#"{"create":{"_index":"${transactions}","_id":"t1"}}"#,
                &t1,
                r#"{"create":{"_index":"${accounts}","_id":"a2"}}"#,
                &a2,
            ],
        )
        .save("b1"),
        Step::bulk(
            "bulk: mixed outcomes, a conflict in the middle",
            &[
                r#"{"index":{"_index":"${accounts}","_id":"a1","if_seq_no":${b1:/items/0/create/_seq_no},"if_primary_term":${b1:/items/0/create/_primary_term}}}"#,
                &a1_debited,
                r#"{"create":{"_index":"${transactions}","_id":"t1"}}"#,
                &t1,
                r#"{"index":{"_index":"${accounts}","_id":"a2","if_seq_no":${b1:/items/0/create/_seq_no},"if_primary_term":1}}"#,
                &a2_credited,
                r#"{"create":{"_index":"${transactions}","_id":"t2"}}"#,
                &t2,
                r#"{"index":{"_index":"${accounts}","_id":"ghost","if_seq_no":0,"if_primary_term":1}}"#,
                &a2,
                r#"{"index":{"_index":"${transactions}","_id":"t1","if_seq_no":${b1:/items/1/create/_seq_no},"if_primary_term":${b1:/items/1/create/_primary_term}}}"#,
                &t1_committed,
                r#"{"index":{"_index":"${accounts}","_id":"a2","if_seq_no":${b1:/items/2/create/_seq_no},"if_primary_term":${b1:/items/2/create/_primary_term}}}"#,
                &a2_credited,
            ],
        )
        .compare(ITEM_REASONS)
        .save("b2"),
        Step::get("a1 after the bulk", "/${accounts}/_doc/a1?realtime=true").compare(GOT),
        Step::get("a2 after the bulk", "/${accounts}/_doc/a2?realtime=true").compare(GOT),
        Step::get("t1 after the bulk", "/${transactions}/_doc/t1?realtime=true").compare(GOT),
        Step::get(
            "the CAS on a missing id created nothing",
            "/${accounts}/_doc/ghost?realtime=true",
        )
        .finds_nothing(),
        Step::bulk(
            "bulk: the same CAS twice in one request",
            &[
                r#"{"index":{"_index":"${transactions}","_id":"t2","if_seq_no":${b2:/items/3/create/_seq_no},"if_primary_term":1}}"#,
                &t2,
                r#"{"index":{"_index":"${transactions}","_id":"t2","if_seq_no":${b2:/items/3/create/_seq_no},"if_primary_term":1}}"#,
                &t2,
            ],
        )
        .compare(ITEM_REASONS),
        Step::bulk(
            "bulk: a source that does not fit the mapping fails its item alone",
            &[
                r#"{"create":{"_index":"${accounts}","_id":"a5"}}"#,
                r#"{"account_id":"a5","balance":"not a number"}"#,
                r#"{"create":{"_index":"${accounts}","_id":"a6"}}"#,
                &account("a6", 6),
            ],
        ),
        Step::bulk(
            "bulk: a create with a seq_no fails the whole request",
            &[
                r#"{"create":{"_index":"${accounts}","_id":"a7"}}"#,
                &account("a7", 7),
                r#"{"create":{"_index":"${accounts}","_id":"a8","if_seq_no":1,"if_primary_term":1}}"#,
                &account("a8", 8),
            ],
        )
        .refused(400),
        Step::get(
            "nothing of a refused bulk was applied",
            "/${accounts}/_doc/a7?realtime=true",
        )
        .finds_nothing(),
        Step::post(
            "bulk: no final newline",
            "/_bulk",
            format!(
                "{}\n{}",
                r#"{"create":{"_index":"${accounts}","_id":"a9"}}"#,
                account("a9", 9)
            ),
        )
        .refused(400),
        Step::post(
            "bulk: an action line cut short (EOF)",
            "/_bulk",
            "{\"create\":{\"_index\":\"${accounts}\",\"_id\":\n{}\n",
        )
        .refused(400),
        Step::post(
            "bulk: an unknown action",
            "/_bulk",
            "{\"upsert\":{\"_index\":\"${accounts}\",\"_id\":\"x\"}}\n{}\n",
        )
        .refused(400),
        Step::post("bulk: an empty body", "/_bulk", "").refused(400),
        Step::bulk(
            "bulk: an unconditional index, an auto-created index, an empty id",
            &[
                r#"{"index":{"_index":"${accounts}","_id":"a1"}}"#,
                &a1,
                r#"{"create":{"_index":"${scratch}","_id":"s1"}}"#,
                r#"{"note":"auto-created"}"#,
                r#"{"create":{"_index":"${accounts}","_id":""}}"#,
                &a1,
            ],
        )
        .compare(ITEM_REASONS),
        Step::bulk_unfiltered(
            "bulk, whole answers: a create of an existing id and a stale compare-and-set",
            &[
                r#"{"create":{"_index":"${accounts}","_id":"a1"}}"#,
                &a1,
                r#"{"index":{"_index":"${accounts}","_id":"a1","if_seq_no":0,"if_primary_term":1}}"#,
                &a1,
            ],
        )
        .compare(ITEM_REASONS),
        Step::bulk(
            "bulk: half a compare-and-set pair fails the whole request",
            &[
                r#"{"create":{"_index":"${accounts}","_id":"a10"}}"#,
                &account("a10", 10),
                r#"{"index":{"_index":"${accounts}","_id":"a1","if_seq_no":1}}"#,
                &a1,
            ],
        )
        .refused(400)
        .compare(REASON),
        Step::bulk(
            "bulk: an id over 512 bytes fails the whole request",
            &[
                r#"{"create":{"_index":"${accounts}","_id":"a11"}}"#,
                &account("a11", 11),
                &format!(
                    r#"{{"create":{{"_index":"${{accounts}}","_id":"{}"}}}}"#,
                    "x".repeat(513)
                ),
                &account("long", 1),
            ],
        )
        .refused(400),
        Step::get(
            "nothing of those refused bulks was applied",
            "/${accounts}/_doc/a10?realtime=true",
        )
        .finds_nothing(),
    ]);
    differential("bulk", steps).await;
}

/// Realtime gets: found before any refresh, absent document, missing index (§2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realtime_gets_match_elasticsearch() {
    let mut steps = create_indices();
    let a1 = account("a1", 100);
    steps.extend([
        Step::bulk(
            "bulk: create a1 (not refreshed)",
            &[r#"{"create":{"_index":"${accounts}","_id":"a1"}}"#, &a1],
        ),
        Step::get(
            "get a document written and not refreshed",
            "/${accounts}/_doc/a1?realtime=true",
        )
        .compare(GOT),
        Step::get("get with the default realtime", "/${accounts}/_doc/a1").compare(GOT),
        Step::get(
            "get an absent document",
            "/${accounts}/_doc/absent?realtime=true",
        )
        .finds_nothing(),
        Step::get(
            "get from a missing index",
            "/${missing}/_doc/a1?realtime=true",
        )
        .refused(404)
        .compare(&["error/reason", "error/index", "error/resource.id"]),
        Step::head("HEAD of a document", "/${accounts}/_doc/a1"),
        Step::head("HEAD of an absent document", "/${accounts}/_doc/absent").status(404),
    ]);
    differential("realtime get", steps).await;
}

/// The backend's searches (listing, recovery, the feed, scans) with `search_after` paging,
/// after an explicit refresh (§7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_with_search_after_match_elasticsearch() {
    let mut steps = create_indices();
    let t = |id, state, created, modified, extra| transfer(id, state, created, modified, extra);
    let docs = [
        t(
            "t1",
            "committed",
            1_000,
            9_000,
            json!({"entries": [entry("a", 1), entry("a.b", 1), entry("a", 2)]}),
        ),
        t(
            "t2",
            "pending",
            2_000,
            2_000,
            json!({"lease_owner": null, "entries": [entry("a0", 1), entry("a", 3)]}),
        ),
        t(
            "t3",
            "pending",
            3_000,
            3_000,
            json!({"attention": "legs disagree"}),
        ),
        t(
            "t4",
            "committed",
            4_000,
            4_000,
            json!({"metadata": {"order": "o-1", "desk": "fx"}}),
        ),
        t(
            "t5",
            "rolled_back",
            5_000,
            5_000,
            json!({"src_acct": "b1", "dest_acct": "b2", "accounts": ["b1", "a1", "b2"]}),
        ),
        // Same creation time as t5: the id breaks the tie.
        t(
            "t6",
            "pending",
            5_000,
            6_000,
            json!({"src_acct": "b3", "dest_acct": "a1"}),
        ),
    ];
    let mut bulk_lines: Vec<String> = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        bulk_lines.push(format!(
            r#"{{"create":{{"_index":"${{transactions}}","_id":"t{}"}}}}"#,
            i + 1
        ));
        bulk_lines.push(doc.clone());
    }
    for id in ["a3", "a1", "a2"] {
        bulk_lines.push(format!(
            r#"{{"create":{{"_index":"${{accounts}}","_id":"{id}"}}}}"#
        ));
        bulk_lines.push(account(id, 10));
    }
    // An account without the repeated id: its sort value is what the backend's scan checks.
    bulk_lines.push(r#"{"create":{"_index":"${accounts}","_id":"corrupt"}}"#.to_owned());
    bulk_lines.push(r#"{"balance":1}"#.to_owned());
    let lines: Vec<&str> = bulk_lines.iter().map(String::as_str).collect();
    let list_by_account = |after: Option<&str>| {
        let mut body = json!({
            "size": 2,
            "seq_no_primary_term": true,
            "track_total_hits": false,
            "query": {"bool": {"filter": [], "should": [
                {"term": {"src_acct": "a1"}},
                {"term": {"dest_acct": "a1"}},
                {"term": {"accounts": "a1"}},
            ], "minimum_should_match": 1}},
            "sort": [{"creation_time": "desc"}, {"transaction_id": "desc"}],
        })
        .to_string();
        if let Some(after) = after {
            body = body.replacen('{', &format!(r#"{{"search_after":{after},"#), 1);
        }
        body
    };
    let filtered = |clause: Value| {
        json!({
            "size": 10,
            "seq_no_primary_term": true,
            "track_total_hits": false,
            "query": {"bool": {"filter": [clause]}},
            "sort": [{"creation_time": "desc"}, {"transaction_id": "desc"}],
        })
        .to_string()
    };
    let scan = |after: Option<&str>| {
        let mut body = json!({
            "size": 2,
            "seq_no_primary_term": true,
            "track_total_hits": false,
            "query": {"match_all": {}},
            "sort": [{"account_id": "asc"}],
            "timeout": "5000ms",
        });
        if let Some(after) = after {
            body["search_after"] = json!([after]);
        }
        body.to_string()
    };
    // Recovery's search for stale transfers (`pending` or `rolled_back`, modified before 4.5 s
    // or without a lease), with `extra` fields.
    let find_stale = |extra: Value| {
        let mut body = json!({
            "size": 10,
            "seq_no_primary_term": true,
            "track_total_hits": false,
            "query": {"bool": {
                "filter": [{"terms": {"transaction_state": ["pending", "rolled_back"]}}],
                "should": [
                    {"range": {"modification_time": {"lt": 4_500, "format": "epoch_millis"}}},
                    {"bool": {"must_not": {"exists": {"field": "lease_owner"}}}},
                ],
                "minimum_should_match": 1,
            }},
            "sort": [{"modification_time": "asc"}, {"transaction_id": "asc"}],
        });
        for (key, value) in extra.as_object().expect("fields") {
            body[key] = value.clone();
        }
        body.to_string()
    };
    // A page of the change feed: `size` entries modified before `below`, in `order`.
    let feed = |size: u64, below: u64, order: &str| {
        json!({
            "size": size,
            "seq_no_primary_term": true,
            "track_total_hits": false,
            "query": {"bool": {"filter": [
                {"range": {"modification_time": {"lt": below, "format": "epoch_millis"}}}
            ]}},
            "sort": [{"modification_time": order}, {"transaction_id": order}],
        })
        .to_string()
    };
    // An account's entries in a range of sequence numbers (`Store::account_entries`).
    let entries_of = |account: &str, from: u64, to: u64| {
        json!({
            "size": 10,
            "seq_no_primary_term": true,
            "track_total_hits": false,
            "query": {"bool": {"filter": [{"range": {"entries": {
                "gte": format!("{account}/{from:020}"),
                "lt": format!("{account}/{to:020}"),
            }}}]}},
            "sort": [{"transaction_id": "asc"}],
        })
        .to_string()
    };
    steps.extend([
        Step::bulk("bulk: six transfers and three accounts", &lines),
        Step::new(
            "refresh both indices",
            Method::POST,
            "/${accounts},${transactions}/_refresh",
        )
        .compare(SHARDS),
        Step::post(
            "list by account: page 1",
            "/${transactions}/_search",
            list_by_account(None),
        )
        .compare(HITS)
        .save("p1"),
        Step::post(
            "list by account: page 2 (search_after)",
            "/${transactions}/_search",
            list_by_account(Some("${p1:/hits/hits/1/sort}")),
        )
        .compare(HITS)
        .save("p2"),
        Step::post(
            "list by account: page 3 (past the end)",
            "/${transactions}/_search",
            list_by_account(Some("${p2:/hits/hits/1/sort}")),
        )
        .compare(HITS),
        Step::post(
            "list by state",
            "/${transactions}/_search",
            filtered(json!({"term": {"transaction_state": "pending"}})),
        )
        .compare(HITS),
        Step::post(
            "list those needing attention (exists)",
            "/${transactions}/_search",
            filtered(json!({"exists": {"field": "attention"}})),
        )
        .compare(HITS),
        Step::post(
            "list by a metadata key (flattened)",
            "/${transactions}/_search",
            filtered(json!({"term": {"metadata.order": "o-1"}})),
        )
        .compare(HITS),
        Step::post(
            "find stale (terms, range, must_not exists)",
            "/${transactions}/_search",
            find_stale(json!({"timeout": "5000ms"})),
        )
        .compare(HITS)
        .save("stale"),
        Step::post(
            "find stale: after the first hit",
            "/${transactions}/_search",
            find_stale(json!({"search_after": "${stale:/hits/hits/0/sort}"}))
                .replace(r#""${stale:/hits/hits/0/sort}""#, "${stale:/hits/hits/0/sort}"),
        )
        .compare(HITS),
        Step::post(
            "the change feed below a horizon",
            "/${transactions}/_search",
            feed(3, 6_000, "asc"),
        )
        .compare(HITS),
        Step::post(
            "the change feed's newest entry",
            "/${transactions}/_search",
            feed(1, 100_000, "desc"),
        )
        .compare(HITS),
        Step::post(
            "account entries: a range on a multi-valued keyword",
            "/${transactions}/_search",
            entries_of("a", 2, 4),
        )
        .compare(HITS),
        Step::post(
            "account entries: an account another one's id starts with",
            "/${transactions}/_search",
            entries_of("a", 0, u64::MAX),
        )
        .compare(HITS),
        Step::post("scan accounts: page 1", "/${accounts}/_search", scan(None))
            .compare(HITS)
            .save("s1"),
        Step::post(
            "scan accounts: page 2, the account without an id last",
            "/${accounts}/_search",
            scan(Some("${s1:/hits/hits/1/sort/0}")),
        )
        .compare(HITS),
        Step::post(
            "a range with date math",
            "/${transactions}/_search",
            filtered(json!({"range": {"creation_time": {
                "gte": "1970-01-01T00:00:02.500Z||/s",
                "lt": "now-1d/d",
            }}})),
        )
        .compare(HITS),
        Step::post(
            "search_after of the wrong type for a date sort",
            "/${transactions}/_search",
            list_by_account(Some(r#"["yesterday","t1"]"#)),
        )
        .refused(400),
        Step::post(
            "a search body that is an array",
            "/${transactions}/_search",
            "[1]",
        )
        .refused(400),
        Step::post(
            "a search counting hits (the default track_total_hits)",
            "/${transactions}/_search",
            r#"{"query":{"term":{"transaction_state":"pending"}},"sort":[{"transaction_id":"asc"}]}"#,
        )
        .compare(HITS),
        Step::post(
            "a search without a sort (scores)",
            "/${transactions}/_search",
            r#"{"query":{"bool":{"filter":[{"term":{"transaction_state":"committed"}}]}},"track_total_hits":true}"#,
        )
        .compare(&["hits/total", "hits/max_score", "hits/hits/*/_score"]),
        Step::post(
            "search a missing index",
            "/${missing}/_search",
            r#"{"query":{"match_all":{}}}"#,
        )
        .refused(404),
        Step::new(
            "refresh an existing and a missing index",
            Method::POST,
            "/${accounts},${missing}/_refresh",
        )
        .refused(404),
        Step::new("refresh a missing index", Method::POST, "/${missing}/_refresh").refused(404),
        Step::new("refresh one index", Method::POST, "/${transactions}/_refresh").compare(SHARDS),
    ]);
    differential("search and refresh", steps).await;
}

/// Requests the cluster refuses: malformed JSON, bad queries, unknown parameters and
/// indices (§10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_match_elasticsearch() {
    let mut steps = create_indices();
    let t1 = transfer("t1", "pending", 1_000, 1_000, json!({}));
    steps.extend([
        // A shard with no value for a field rewrites a range on it to "match none" before
        // parsing its bounds, so the index gets a document first.
        Step::bulk(
            "bulk: one transfer",
            &[r#"{"create":{"_index":"${transactions}","_id":"t1"}}"#, &t1],
        ),
        Step::new("refresh", Method::POST, "/${transactions}/_refresh").compare(SHARDS),
        Step::post(
            "search with a body cut short",
            "/${transactions}/_search",
            r#"{"query": {"match_all": {}"#,
        )
        .refused(400),
        Step::post(
            "search with an unexpected character",
            "/${transactions}/_search",
            r#"{"query" {}}"#,
        )
        .refused(400),
        Step::post(
            "search with an unknown query type",
            "/${transactions}/_search",
            r#"{"query":{"no_such_query":{"f":1}}}"#,
        )
        .refused(400),
        Step::post(
            "search with an unknown top-level key",
            "/${transactions}/_search",
            r#"{"querry":{"match_all":{}}}"#,
        )
        .refused(400),
        Step::post(
            "sort on an unmapped field",
            "/${transactions}/_search",
            r#"{"query":{"match_all":{}},"sort":[{"no_such_field":"asc"}]}"#,
        )
        .refused(400),
        Step::post(
            "search_after with the wrong number of values",
            "/${transactions}/_search",
            r#"{"query":{"match_all":{}},"sort":[{"creation_time":"asc"},{"transaction_id":"asc"}],"search_after":[1]}"#,
        )
        .refused(400),
        Step::post(
            "a range on a date with a bad value",
            "/${transactions}/_search",
            r#"{"query":{"range":{"creation_time":{"lt":"not a date"}}}}"#,
        )
        .refused(400),
        Step::post(
            "from + size beyond the result window",
            "/${transactions}/_search",
            r#"{"from":9999,"size":2,"query":{"match_all":{}}}"#,
        )
        .refused(400),
        Step::put(
            "a document that is malformed JSON",
            "/${accounts}/_doc/a1",
            r#"{"account_id": "a1", "balance": "#,
        )
        .refused(400),
        Step::put(
            "a document that does not fit the mapping",
            "/${accounts}/_doc/a1",
            r#"{"account_id":"a1","balance":"lots"}"#,
        )
        .refused(400),
        Step::put(
            "create an index with malformed JSON",
            "/${scratch}",
            r#"{"mappings": "#,
        )
        .refused(400),
        Step::put(
            "create an index with an unknown field type",
            "/${scratch}",
            r#"{"mappings":{"properties":{"f":{"type":"no_such_type"}}}}"#,
        )
        .refused(400),
        Step::get(
            "an unknown URL parameter",
            "/${accounts}/_doc/a1?no_such_parameter=1",
        )
        .refused(400),
        Step::new("a wrong method on _bulk", Method::DELETE, "/_bulk")
            .status(405)
            .compare(&["error", "status"]),
        Step::get("an index name starting with _", "/_no_such_endpoint")
            .status(400)
            .compare(&["error", "status"]),
        Step::head("HEAD of an index name starting with _", "/_no_such_endpoint").status(400),
        Step::get("a path no handler matches", "/${accounts}/_doc/a1/extra")
            .status(400)
            .compare(&["error", "status"]),
        Step::post(
            "bulk: an action line with an unexpected character",
            "/_bulk",
            "{\"create\" {}}\n{}\n",
        )
        .refused(400),
        Step::post(
            "search an unknown index",
            "/${missing}/_search",
            r#"{"query":{"match_all":{}}}"#,
        )
        .refused(404)
        .compare(&["error/index", "error/resource.type", "error/resource.id"]),
    ]);
    differential("refused requests", steps).await;
}

/// Document ids as the official client puts them in a URL (every byte but `[A-Za-z0-9_.,*-]`
/// percent-encoded), and the id limits (§1, §2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_ids_in_urls_match_elasticsearch() {
    let mut steps = create_indices();
    let ids = [
        "x/y",
        "sp ace",
        "a+b",
        "a,b",
        "st*r",
        "\u{e9}t\u{e9}",
        "per%cent",
        "q?u#e",
    ];
    let mut lines = Vec::new();
    for id in ids {
        lines.push(json!({"create": {"_index": "${accounts}", "_id": id}}).to_string());
        lines.push(account(id, 1));
    }
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    steps.extend([
        Step::bulk("bulk: ids with characters a URL must encode", &lines),
        Step::get("get x/y", "/${accounts}/_doc/x%2Fy").compare(GOT),
        Step::get("get an id with a space", "/${accounts}/_doc/sp%20ace").compare(GOT),
        Step::get("get a+b, encoded", "/${accounts}/_doc/a%2Bb").compare(GOT),
        Step::get("get a+b, not encoded", "/${accounts}/_doc/a+b").compare(GOT),
        Step::get("get a,b", "/${accounts}/_doc/a,b").compare(GOT),
        Step::get("get st*r", "/${accounts}/_doc/st*r").compare(GOT),
        Step::get("get a non-ASCII id", "/${accounts}/_doc/%C3%A9t%C3%A9").compare(GOT),
        Step::get("get per%cent", "/${accounts}/_doc/per%25cent").compare(GOT),
        Step::get("get q?u#e", "/${accounts}/_doc/q%3Fu%23e").compare(GOT),
        Step::put(
            "_create with an encoded slash",
            "/${accounts}/_create/x%2Fz",
            account("x/z", 1),
        )
        .created(),
        Step::put(
            "an id of 512 bytes",
            format!("/${{accounts}}/_doc/{}", "i".repeat(512)),
            account("long", 1),
        )
        .created(),
        Step::put(
            "an id of 513 bytes",
            format!("/${{accounts}}/_doc/{}", "i".repeat(513)),
            account("long", 1),
        )
        .refused(400),
    ]);
    differential("document ids", steps).await;
}

/// What the vouch reads (`src/store/elasticsearch/vouch.rs`): a shard's copies in `_stats` at
/// shard level (which answered, which is the started primary, its global checkpoint and
/// term, each copy's local checkpoint) after two acknowledged writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shard_stats_the_vouch_reads_match_elasticsearch() {
    let mut steps = create_indices();
    let (a1, a2) = (account("a1", 100), account("a2", 5));
    steps.extend([
        Step::bulk(
            "bulk: create a1 and a2",
            &[
                r#"{"create":{"_index":"${accounts}","_id":"a1"}}"#,
                &a1,
                r#"{"create":{"_index":"${accounts}","_id":"a2"}}"#,
                &a2,
            ],
        ),
        Step::get(
            "shard stats as the vouch asks for them",
            "/${accounts}/_stats/docs?level=shards&filter_path=_shards,\
             indices.*.shards.*.routing.state,indices.*.shards.*.routing.primary,\
             indices.*.shards.*.seq_no.global_checkpoint,\
             indices.*.shards.*.seq_no.local_checkpoint,\
             indices.*.shards.*.retention_leases.primary_term",
        )
        .compare(&[
            "_shards/total",
            "_shards/successful",
            "_shards/failed",
            "indices/*/shards/*/*/routing/state",
            "indices/*/shards/*/*/routing/primary",
            "indices/*/shards/*/*/seq_no/global_checkpoint",
            "indices/*/shards/*/*/seq_no/local_checkpoint",
            "indices/*/shards/*/*/retention_leases/primary_term",
        ]),
    ]);
    differential("vouch", steps).await;
}

/// `count` document ids of many shapes: the service's own (`t-…`, UUIDs, account names), and
/// others a router must hash the same way (non-ASCII, punctuation, long ones), all distinct.
fn varied_ids(count: u64) -> Vec<String> {
    (0..count)
        .map(|n| {
            let mix = n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            match n % 6 {
                0 => format!("t-{n}"),
                1 => format!(
                    "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
                    mix >> 32,
                    (mix >> 16) & 0xffff,
                    (mix >> 4) & 0xfff,
                    mix & 0xfff,
                    n
                ),
                2 => format!("acct-{}-{n}", mix % 1000),
                3 => format!("\u{fc}\u{20ac}-{n}-\u{540d}\u{524d}"),
                4 => format!("x.y:z_{n}/{}", mix % 7),
                _ => format!("{}{n}", "long-".repeat(1 + (mix % 40) as usize)),
            }
        })
        .collect()
}

/// A `_bulk` that creates every id of `ids` in `alias`, then deletes every seventh of them
/// and two ids that were never written (each still takes a `_seq_no` on its shard).
fn create_all(name: &'static str, alias: &str, ids: &[String]) -> Step {
    let mut lines = Vec::new();
    for id in ids {
        lines.push(json!({"create": {"_index": format!("${{{alias}}}"), "_id": id}}).to_string());
        lines.push(json!({"id": id}).to_string());
    }
    let deleted = ids.iter().step_by(7).map(String::as_str);
    for id in deleted.chain(["never-written", "\u{e9}t\u{e9}-absent"]) {
        lines.push(json!({"delete": {"_index": format!("${{{alias}}}"), "_id": id}}).to_string());
    }
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    Step::bulk(name, &lines)
}

/// Per-shard counts of `_stats` at shard level: which shard holds how many documents and
/// how many operations it applied.
fn shard_counts(name: &'static str, alias: &str) -> Step {
    Step::get(
        name,
        format!(
            "/${{{alias}}}/_stats/docs?level=shards&filter_path=_shards,\
             indices.*.shards.*.docs.count,indices.*.shards.*.seq_no.max_seq_no,\
             indices.*.shards.*.seq_no.global_checkpoint"
        ),
    )
    .compare(&[
        "_shards/total",
        "_shards/successful",
        "_shards/failed",
        "indices/*/shards/*/*/docs/count",
        "indices/*/shards/*/*/seq_no/max_seq_no",
        "indices/*/shards/*/*/seq_no/global_checkpoint",
    ])
}

/// Documents on indices of 3 and 5 shards, and of 3 shards over 6 routing shards: each id
/// must land on the shard the engine puts it on (`es-routing`'s rule), which the per-shard
/// `_seq_no` of every bulk item and the per-shard counts of `_stats` show; and `_shards`
/// counts every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_land_on_the_shards_the_engine_puts_them_on() {
    let ids = varied_ids(300);
    let steps = vec![
        Step::put(
            "create an index of 3 shards",
            "/${shards3}",
            r#"{"settings":{"number_of_shards":3}}"#,
        )
        .compare(ACKNOWLEDGED),
        Step::put(
            "create an index of 5 shards",
            "/${shards5}",
            r#"{"settings":{"index":{"number_of_shards":"5"}}}"#,
        )
        .compare(ACKNOWLEDGED),
        Step::put(
            "create an index of 3 shards over 6 routing shards",
            "/${routed6}",
            r#"{"settings":{"number_of_shards":3,"number_of_routing_shards":6}}"#,
        )
        .compare(ACKNOWLEDGED),
        create_all("bulk: 300 ids into 3 shards", "shards3", &ids),
        create_all("bulk: 300 ids into 5 shards", "shards5", &ids),
        create_all("bulk: 300 ids into 3 of 6 routing shards", "routed6", &ids),
        Step::put(
            "a create that conflicts names its document's shard",
            format!("/${{shards5}}/_create/{}", ids[1]),
            "{}",
        )
        .refused(409)
        .compare(REASON)
        .compare(&["error/shard"]),
        Step::new(
            "refresh all three",
            Method::POST,
            "/${shards3},${shards5},${routed6}/_refresh",
        )
        .compare(SHARDS),
        shard_counts("the 3 shards' counts", "shards3"),
        shard_counts("the 5 shards' counts", "shards5"),
        shard_counts("the 3 of 6 routing shards' counts", "routed6"),
        Step::post(
            "a search asks every shard",
            "/${shards3},${shards5}/_search?size=0",
            "{}",
        )
        .compare(&["_shards", "hits/total"]),
    ];
    differential("shards", steps).await;
}

/// Shard counts an index cannot have, refused in the engine's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_shard_counts_are_refused_as_elasticsearch_refuses_them() {
    let refused = [
        ("no shard", r#"{"number_of_shards":0}"#),
        ("more than 1024 shards", r#"{"number_of_shards":1025}"#),
        (
            "a shard count that is no number",
            r#"{"number_of_shards":"x"}"#,
        ),
        (
            "no routing shard",
            r#"{"number_of_shards":3,"number_of_routing_shards":0}"#,
        ),
        (
            "fewer routing shards than shards",
            r#"{"number_of_shards":3,"number_of_routing_shards":2}"#,
        ),
        (
            "routing shards that are no multiple of the shards",
            r#"{"number_of_shards":3,"number_of_routing_shards":1024}"#,
        ),
    ];
    let mut steps: Vec<Step> = refused
        .into_iter()
        .map(|(name, settings)| {
            Step::put(name, "/${scratch}", format!(r#"{{"settings":{settings}}}"#))
                .refused(400)
                .compare(REASON)
        })
        .collect();
    steps.push(Step::head("nothing was created", "/${scratch}").status(404));
    differential("shard counts", steps).await;
}
