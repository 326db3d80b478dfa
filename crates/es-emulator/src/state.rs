//! The in-memory cluster: indices with their settings and mappings, live documents (what a
//! realtime GET sees), the searchable view (what the last refresh exposed), per-document
//! `_version`, delete tombstones, the refresh schedule, and each index's primary shards.
//!
//! An index has `number_of_shards` primaries (1 to 1,024); a document lives on the shard its
//! id routes to by the engines' own rule (`es_routing`). What Elasticsearch keeps per shard
//! is kept per shard: `_seq_no` (from 0, `docs/elasticsearch.md` §11), the primary term, the
//! checkpoints, the document count, and the shard's server of the capacity model
//! (`capacity`). The documents themselves are held per index: an id is on one shard only,
//! so one map by id is the union of the shards' maps, and searches, sorts and refreshes
//! read it as they read one shard. Ties in a search are broken by the index-wide order of
//! the writes, which on one shard is the `_seq_no` order, so that what a search answers
//! does not depend on the shard count (but for `_seq_no` itself).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use es_routing::Routing;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::capacity::{AnswerAt, Capacity, Server};
use crate::errors::EsError;
use crate::mapping::Mapping;

/// The most primary shards an index may have (`index.number_of_shards`).
pub const MAX_SHARDS: u64 = 1024;

/// One version of a document.
#[derive(Debug)]
pub struct Doc {
    pub id: String,
    /// The parsed source, for queries and sorts.
    pub source: Value,
    /// The source exactly as it was sent, returned as `_source`.
    pub raw: Box<RawValue>,
    pub version: u64,
    /// On its shard.
    pub seq_no: i64,
    pub primary_term: u64,
    /// The index-wide position of the write that made this version: searches break ties and
    /// sort `_doc` by it (on one shard it is the `_seq_no`).
    pub order: u64,
    /// The mapping generation it was indexed with: fields mapped later have no values in it
    /// (see `mapping.rs`).
    pub mapped_at: u64,
}

/// What a delete leaves behind, for `index.gc_deletes` (§5).
#[derive(Debug, Clone, Copy)]
struct Tombstone {
    version: u64,
    deleted_at: Instant,
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// `number_of_shards`: primaries.
    pub shards: u32,
    /// `number_of_routing_shards`, when given (else the engines' default, `es_routing`).
    pub routing_shards: Option<u32>,
    pub replicas: u64,
    /// `None`: not set on the index (the emulator's default applies); `Some(None)`: `-1`.
    pub refresh_interval: Option<Option<Duration>>,
    pub gc_deletes: Duration,
    pub max_result_window: usize,
    /// Every setting as given, keys without the `index.` prefix (for `GET /{index}`).
    pub given: Map<String, Value>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            shards: 1,
            routing_shards: None,
            replicas: 1,
            refresh_interval: None,
            gc_deletes: Duration::from_secs(60),
            max_result_window: 10_000,
            given: Map::new(),
        }
    }
}

/// A write that was applied.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub result: &'static str,
    pub status: u16,
    pub version: u64,
    pub seq_no: i64,
    pub primary_term: u64,
    /// Its index-wide order ([`Doc::order`]), for `refresh=wait_for`.
    pub order: u64,
}

/// The kind of a document write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    Index,
    Create,
    Delete,
}

/// One document write, already validated as a request.
pub struct WriteRequest {
    pub kind: WriteKind,
    pub id: String,
    /// The source of index/create: parsed and as sent.
    pub source: Option<(Value, Box<RawValue>)>,
    pub if_seq_no: Option<i64>,
    pub if_primary_term: Option<u64>,
}

#[derive(Debug)]
struct Pending {
    at: Instant,
    order: u64,
    id: String,
    doc: Option<Arc<Doc>>,
}

/// One primary shard: what Elasticsearch keeps per shard.
#[derive(Debug)]
struct Shard {
    /// The `_seq_no` of its next operation (§11: from 0, +1 per applied operation).
    next_seq_no: i64,
    primary_term: u64,
    /// Live documents routed here (`docs.count` of `_stats`).
    docs: u64,
    /// Its server in the capacity model.
    server: Server,
}

impl Shard {
    fn new() -> Self {
        Shard {
            next_seq_no: 0,
            primary_term: 1,
            docs: 0,
            server: Server::default(),
        }
    }

    /// The one copy's `_stats` at shard level, as far as this double keeps it: started,
    /// primary, every operation processed and so below the global checkpoint (no replica
    /// lags behind), and the primary term (§11 of `docs/elasticsearch.md`).
    fn stats(&self) -> Value {
        let last = self.next_seq_no - 1;
        json!({
            "routing": {"state": "STARTED", "primary": true, "node": "emulator", "relocating_node": null},
            "docs": {"count": self.docs, "deleted": 0},
            "seq_no": {"max_seq_no": last, "local_checkpoint": last, "global_checkpoint": last},
            "retention_leases": {"primary_term": self.primary_term, "version": 1, "leases": []},
        })
    }
}

#[derive(Debug)]
pub struct IndexState {
    pub name: String,
    pub uuid: String,
    pub creation_date: i64,
    pub settings: Settings,
    pub mapping: Mapping,
    routing: Routing,
    /// `number_of_shards` of them, by number.
    shards: Vec<Shard>,
    /// The order the next write gets ([`Doc::order`]).
    next_order: u64,
    live: HashMap<String, Arc<Doc>>,
    tombstones: HashMap<String, Tombstone>,
    searchable: HashMap<String, Arc<Doc>>,
    pending: VecDeque<Pending>,
    /// The last scheduled refresh (the schedule runs from the creation of the index).
    anchor: Instant,
}

/// A random id in Elasticsearch's style (URL-safe base64).
pub fn random_id(len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    (0..len)
        .map(|_| ALPHABET[rand::random::<u8>() as usize % 64] as char)
        .collect()
}

impl IndexState {
    /// A new index of `settings`, which [`parse_settings`] checked.
    pub fn new(name: &str, settings: Settings, mapping: Mapping, now: Instant) -> Self {
        let routing = Routing::of(settings.shards, settings.routing_shards)
            .expect("parse_settings refuses shard counts without a routing");
        IndexState {
            name: name.to_owned(),
            uuid: random_id(22),
            creation_date: crate::dates::now_millis(),
            shards: (0..settings.shards).map(|_| Shard::new()).collect(),
            settings,
            mapping,
            routing,
            next_order: 0,
            live: HashMap::new(),
            tombstones: HashMap::new(),
            searchable: HashMap::new(),
            pending: VecDeque::new(),
            anchor: now,
        }
    }

    /// `_stats` at shard level: each shard's one copy, under its number.
    pub fn shard_stats(&self) -> Value {
        let by_number: Map<String, Value> = (self.shards.iter().enumerate())
            .map(|(number, shard)| (number.to_string(), json!([shard.stats()])))
            .collect();
        Value::Object(by_number)
    }

    /// `_shards` of a write: its shard's primary and `number_of_replicas` unassigned copies.
    pub fn shards(&self) -> Value {
        json!({"total": 1 + self.settings.replicas, "successful": 1, "failed": 0})
    }

    /// Primary shards.
    pub fn shard_count(&self) -> u64 {
        self.shards.len() as u64
    }

    /// Every copy of every shard, assigned or not (`_shards.total` of a refresh or `_stats`).
    pub fn copies(&self) -> u64 {
        self.shard_count() * (1 + self.settings.replicas)
    }

    /// A custom `routing` of a read or delete picks another shard than the id's when the
    /// index has several; the emulator does not model that (on one shard it changes nothing).
    pub fn refuse_custom_routing(&self, routing: Option<&str>) -> Result<(), EsError> {
        match routing {
            Some(value) if !value.is_empty() && self.shards.len() > 1 => {
                Err(EsError::unsupported(&format!(
                    "routing [{value}] on index [{}] of several shards",
                    self.name
                )))
            }
            _ => Ok(()),
        }
    }

    /// The number of the shard that holds `id`.
    pub fn shard_of(&self, id: &str) -> usize {
        self.routing.shard_of(id) as usize
    }

    /// One operation on the shard that holds `id`, in the capacity model.
    pub fn occupy_shard_of(&mut self, id: &str, capacity: Capacity, answer: &AnswerAt) {
        let shard = self.shard_of(id);
        capacity.occupy(&mut self.shards[shard].server, answer);
    }

    /// One operation on every shard (a search, refresh or `_stats`), in the capacity model.
    pub fn occupy_every_shard(&mut self, capacity: Capacity, answer: &AnswerAt) {
        for shard in &mut self.shards {
            capacity.occupy(&mut shard.server, answer);
        }
    }

    pub fn refresh_interval(&self, default: Option<Duration>) -> Option<Duration> {
        self.settings.refresh_interval.unwrap_or(default)
    }

    /// The realtime view (GET).
    pub fn live(&self, id: &str) -> Option<&Arc<Doc>> {
        self.live.get(id)
    }

    /// The refreshed view (search, `realtime=false`).
    pub fn searchable(&self, id: &str) -> Option<&Arc<Doc>> {
        self.searchable.get(id)
    }

    pub fn searchable_docs(&self) -> impl Iterator<Item = &Arc<Doc>> {
        self.searchable.values()
    }

    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    fn conflict(&self, reason: String, id: &str) -> EsError {
        EsError::conflict(reason, &self.name, &self.uuid, self.shard_of(id))
    }

    /// Applies one write (§1, §3, §5, §11) on the shard its id routes to. Conflicts and
    /// mapping errors consume no seq_no.
    pub fn apply(&mut self, request: WriteRequest, now: Instant) -> Result<Written, EsError> {
        let id = request.id;
        let added = match &request.source {
            Some((Value::Object(source), _)) => self.mapping.check_document(&id, source)?,
            Some(_) => {
                return Err(EsError::new(
                    400,
                    "document_parsing_exception",
                    "failed to parse, document is empty or not an object",
                ))
            }
            None => Vec::new(),
        };
        let current = self.live.get(&id).cloned();
        if request.kind == WriteKind::Create {
            if let Some(doc) = &current {
                return Err(self.conflict(
                    format!(
                        "[{id}]: version conflict, document already exists (current version [{}])",
                        doc.version
                    ),
                    &id,
                ));
            }
        }
        if let Some(seq) = request.if_seq_no {
            let term = request.if_primary_term.unwrap_or(0);
            match &current {
                Some(doc) if doc.seq_no != seq || doc.primary_term != term => {
                    return Err(self.conflict(format!(
                        "[{id}]: version conflict, required seqNo [{seq}], primary term [{term}]. current document has seqNo [{}] and primary term [{}]",
                        doc.seq_no, doc.primary_term
                    ), &id));
                }
                Some(_) => {}
                None => {
                    return Err(self.conflict(format!(
                        "[{id}]: version conflict, required seqNo [{seq}], primary term [{term}]. but no document was found"
                    ), &id));
                }
            }
        }
        let previous = current
            .as_ref()
            .map(|doc| doc.version)
            .or_else(|| self.tombstones.get(&id).map(|t| t.version));
        let version = previous.map_or(1, |v| v + 1);
        let shard = self.shard_of(&id);
        let on_shard = &mut self.shards[shard];
        let seq_no = on_shard.next_seq_no;
        on_shard.next_seq_no += 1;
        let primary_term = on_shard.primary_term;
        let order = self.next_order;
        self.next_order += 1;

        let (result, status, doc) = match (request.kind, request.source) {
            (WriteKind::Delete, _) | (_, None) => {
                self.live.remove(&id);
                self.tombstones.insert(
                    id.clone(),
                    Tombstone {
                        version,
                        deleted_at: now,
                    },
                );
                if current.is_some() {
                    self.shards[shard].docs -= 1;
                    ("deleted", 200, None)
                } else {
                    ("not_found", 404, None)
                }
            }
            (_, Some((source, raw))) => {
                let doc = Arc::new(Doc {
                    id: id.clone(),
                    source,
                    raw,
                    version,
                    seq_no,
                    primary_term,
                    order,
                    mapped_at: self.mapping.generation,
                });
                self.live.insert(id.clone(), doc.clone());
                self.tombstones.remove(&id);
                self.mapping.add_dynamic(&added);
                if current.is_some() {
                    ("updated", 200, Some(doc))
                } else {
                    self.shards[shard].docs += 1;
                    ("created", 201, Some(doc))
                }
            }
        };
        self.pending.push_back(Pending {
            at: now,
            order,
            id,
            doc,
        });
        debug_assert_eq!(
            self.shards.iter().map(|s| s.docs).sum::<u64>(),
            self.live.len() as u64,
            "the shards' document counts add up to the live documents"
        );
        Ok(Written {
            result,
            status,
            version,
            seq_no,
            primary_term,
            order,
        })
    }

    fn expose_until(&mut self, until: Option<Instant>) {
        while let Some(front) = self.pending.front() {
            if until.is_some_and(|limit| front.at > limit) {
                break;
            }
            let Some(op) = self.pending.pop_front() else {
                break;
            };
            match op.doc {
                Some(doc) => {
                    self.searchable.insert(op.id, doc);
                }
                None => {
                    self.searchable.remove(&op.id);
                }
            }
        }
    }

    /// Tombstones are pruned on refresh, once `gc_deletes` has passed.
    fn prune_tombstones(&mut self, at: Instant) {
        let keep = self.settings.gc_deletes;
        self.tombstones
            .retain(|_, t| at.saturating_duration_since(t.deleted_at) < keep);
    }

    /// An explicit refresh: everything written so far becomes searchable.
    pub fn refresh(&mut self, now: Instant) {
        self.expose_until(None);
        self.prune_tombstones(now);
    }

    /// Runs the scheduled refreshes that are due by `now` (lazily: each as of its own tick,
    /// so writes made after a tick stay invisible until the next one).
    pub fn catch_up(&mut self, now: Instant, default: Option<Duration>) {
        let Some(interval) = self.refresh_interval(default) else {
            return;
        };
        if interval.is_zero() {
            self.refresh(now);
            self.anchor = now;
            return;
        }
        let elapsed = now.saturating_duration_since(self.anchor);
        if elapsed < interval {
            return;
        }
        let ticks = (elapsed.as_nanos() / interval.as_nanos()) as u32;
        let tick = self.anchor + interval * ticks;
        self.expose_until(Some(tick));
        self.prune_tombstones(tick);
        self.anchor = tick;
    }

    /// When the next scheduled refresh happens (`None` when refreshes are disabled).
    pub fn next_refresh(&self, default: Option<Duration>) -> Option<Instant> {
        self.refresh_interval(default).map(|i| self.anchor + i)
    }

    /// Whether the write of index-wide `order` ([`Written::order`]) is searchable.
    pub fn is_visible(&self, order: u64) -> bool {
        self.pending.front().is_none_or(|p| p.order > order)
    }

    /// `GET /{index}`.
    pub fn describe(&self) -> Value {
        let mut index = Map::new();
        // `number_of_routing_shards` is a private setting: Elasticsearch does not show it.
        let shown =
            (self.settings.given.iter()).filter(|(key, _)| *key != "number_of_routing_shards");
        for (key, value) in shown {
            index.insert(
                key.clone(),
                match value {
                    Value::String(_) | Value::Object(_) | Value::Array(_) => value.clone(),
                    other => Value::String(other.to_string()),
                },
            );
        }
        index.insert(
            "number_of_shards".into(),
            json!(self.settings.shards.to_string()),
        );
        index.insert(
            "number_of_replicas".into(),
            json!(self.settings.replicas.to_string()),
        );
        index.insert("uuid".into(), json!(self.uuid));
        index.insert("provided_name".into(), json!(self.name));
        index.insert(
            "creation_date".into(),
            json!(self.creation_date.to_string()),
        );
        index.insert("version".into(), json!({"created": "8521000"}));
        json!({ &self.name: {
            "aliases": {},
            "mappings": self.mapping.shown(),
            "settings": {"index": index},
        }})
    }
}

/// The whole cluster.
#[derive(Debug)]
pub struct Cluster {
    pub indices: BTreeMap<String, IndexState>,
    /// `refresh_interval` of indices that do not set one (`None`: `-1`).
    pub default_refresh: Option<Duration>,
    pub uuid: String,
    /// The capacity model's cost of one shard operation (off by default).
    pub capacity: Capacity,
}

/// Elasticsearch's index-name rules (§8); `Err` holds the `why` of the error.
pub fn check_index_name(name: &str) -> Result<(), EsError> {
    let why = if name.contains([' ', '"', '*', ',', '/', '<', '>', '?', '\\', '|']) {
        Some(
            r#"must not contain the following characters [' ','"','*',',','/','<','>','?','\','|']"#,
        )
    } else if name.contains('#') {
        Some("must not contain '#'")
    } else if name.contains(':') {
        Some("must not contain ':'")
    } else if name.starts_with(['_', '-', '+']) {
        Some("must not start with '_', '-', or '+'")
    } else if name.chars().any(char::is_uppercase) {
        Some("must be lowercase")
    } else if name == "." || name == ".." {
        Some("must not be '.' or '..'")
    } else {
        None
    };
    if let Some(why) = why {
        return Err(EsError::invalid_index_name(name, why));
    }
    if name.len() > 255 {
        return Err(EsError::invalid_index_name(
            name,
            &format!("index name is too long, ({} > 255)", name.len()),
        ));
    }
    Ok(())
}

fn time_setting(key: &str, value: &Value) -> Result<Option<Duration>, EsError> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    };
    if text == "-1" {
        return Ok(None);
    }
    if text == "0" {
        return Ok(Some(Duration::ZERO));
    }
    humantime::parse_duration(&text).map(Some).map_err(|_| {
        EsError::illegal_argument(format!(
            "failed to parse setting [index.{key}] with value [{text}] as a time value: unit is missing or unrecognized"
        ))
    })
}

fn count_setting(key: &str, value: &Value) -> Result<u64, EsError> {
    let parsed = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| {
        EsError::illegal_argument(format!(
            "Failed to parse value [{value}] for setting [index.{key}] must be >= 0"
        ))
    })
}

/// `settings` flattened to dotted keys without the `index.` prefix.
fn flatten_settings(value: &Value, prefix: &str, out: &mut Map<String, Value>) {
    if let Value::Object(map) = value {
        for (key, inner) in map {
            let path = format!("{prefix}{key}");
            if inner.is_object() {
                flatten_settings(inner, &format!("{path}."), out);
            } else {
                let key = path.strip_prefix("index.").unwrap_or(&path).to_owned();
                out.insert(key, inner.clone());
            }
        }
    }
}

/// Reads the `settings` of an index creation request.
pub fn parse_settings(value: Option<&Value>) -> Result<Settings, EsError> {
    let mut settings = Settings::default();
    let Some(value) = value else {
        return Ok(settings);
    };
    if !value.is_object() {
        return Err(EsError::illegal_argument(
            "malformed [settings] section, expected an object",
        ));
    }
    let mut flat = Map::new();
    flatten_settings(value, "", &mut flat);
    for (key, v) in &flat {
        match key.as_str() {
            "number_of_shards" => settings.shards = shard_setting(key, v, MAX_SHARDS)?,
            "number_of_routing_shards" => {
                settings.routing_shards = Some(shard_setting(key, v, i32::MAX as u64)?);
            }
            "number_of_replicas" => settings.replicas = count_setting(key, v)?,
            "refresh_interval" => settings.refresh_interval = Some(time_setting(key, v)?),
            "gc_deletes" => {
                settings.gc_deletes = time_setting(key, v)?.unwrap_or(Duration::ZERO);
            }
            "max_result_window" => settings.max_result_window = count_setting(key, v)? as usize,
            "default_pipeline" | "final_pipeline" if v == "_none" => {}
            "codec" | "search.idle.after" | "routing_partition_size" | "priority" => {}
            "auto_expand_replicas" | "hidden" if v == "false" || v == &Value::Bool(false) => {}
            k if k.starts_with("blocks.") && (v == "false" || v == &Value::Bool(false)) => {}
            // Index blocks, hidden indices and replicas that follow the node count change
            // what the emulator answers; it does not model them.
            k if k == "auto_expand_replicas" || k == "hidden" || k.starts_with("blocks.") => {
                return Err(EsError::unsupported(&format!("index.{k} [{v}]")))
            }
            k if k.starts_with("mapping.") || k.starts_with("analysis.") || k.starts_with("routing.") => {}
            k if k.starts_with("translog.") || k.starts_with("merge.") => {}
            "default_pipeline" | "final_pipeline" => {
                return Err(EsError::illegal_argument(format!(
                    "pipeline with id [{}] does not exist",
                    v.as_str().unwrap_or_default()
                )))
            }
            other => {
                return Err(EsError::illegal_argument(format!(
                    "unknown setting [index.{other}] please check that any required plugins are installed, or check the breaking changes documentation for removed settings"
                )))
            }
        }
    }
    check_routing(settings.shards, settings.routing_shards)?;
    settings.given = flat;
    Ok(settings)
}

/// A count of shards from 1 to `max`, refused in Elasticsearch's words (8.19.21).
fn shard_setting(key: &str, value: &Value, max: u64) -> Result<u32, EsError> {
    let text = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let Ok(count) = text.parse::<i64>() else {
        return Err(EsError::illegal_argument(format!(
            "Failed to parse value [{text}] for setting [index.{key}]"
        )));
    };
    let bound = |relation: &str, limit: u64| {
        EsError::illegal_argument(format!(
            "Failed to parse value [{text}] for setting [index.{key}] must be {relation} {limit}"
        ))
    };
    if count < 1 {
        return Err(bound(">=", 1));
    }
    u32::try_from(count)
        .ok()
        .filter(|&c| u64::from(c) <= max)
        .ok_or_else(|| bound("<=", max))
}

/// The routing shards must be a multiple of the shards, as Elasticsearch checks them when an
/// index is created (its own reasons, 8.19.21).
fn check_routing(shards: u32, routing_shards: Option<u32>) -> Result<(), EsError> {
    if Routing::of(shards, routing_shards).is_some() {
        return Ok(());
    }
    let routing_shards = routing_shards.unwrap_or_default();
    Err(EsError::illegal_argument(if routing_shards < shards {
        format!(
            "index.number_of_routing_shards [{routing_shards}] must be >= index.number_of_shards [{shards}]"
        )
    } else {
        format!("the number of source shards [{shards}] must be a factor of [{routing_shards}]")
    }))
}

impl Cluster {
    pub fn new(default_refresh: Option<Duration>) -> Self {
        Cluster {
            indices: BTreeMap::new(),
            default_refresh,
            uuid: random_id(22),
            capacity: Capacity::default(),
        }
    }

    /// `PUT /{index}` (§8).
    pub fn create_index(
        &mut self,
        name: &str,
        body: &Value,
        now: Instant,
    ) -> Result<Value, EsError> {
        check_index_name(name)?;
        if let Some(existing) = self.indices.get(name) {
            return Err(EsError::already_exists(name, &existing.uuid));
        }
        let Value::Object(body) = body else {
            return Err(EsError::parse("request body must be an object"));
        };
        for key in body.keys() {
            if !matches!(key.as_str(), "settings" | "mappings" | "aliases") {
                return Err(EsError::parse(format!(
                    "unknown key [{key}] for create index"
                )));
            }
        }
        if body
            .get("aliases")
            .is_some_and(|a| a.as_object().is_none_or(|o| !o.is_empty()))
        {
            return Err(EsError::unsupported("aliases"));
        }
        let settings = parse_settings(body.get("settings"))?;
        let mapping = match body.get("mappings") {
            Some(m) => Mapping::parse(m)?,
            None => Mapping::empty(),
        };
        self.indices.insert(
            name.to_owned(),
            IndexState::new(name, settings, mapping, now),
        );
        Ok(json!({"acknowledged": true, "shards_acknowledged": true, "index": name}))
    }

    /// The index a write goes to, auto-created with default settings (§1).
    pub fn index_for_write(
        &mut self,
        name: &str,
        now: Instant,
    ) -> Result<&mut IndexState, EsError> {
        if !self.indices.contains_key(name) {
            check_index_name(name)?;
            self.indices.insert(
                name.to_owned(),
                IndexState::new(name, Settings::default(), Mapping::empty(), now),
            );
        }
        Ok(self.indices.get_mut(name).expect("just inserted"))
    }

    /// An existing index, brought up to date with its refresh schedule.
    pub fn index(&mut self, name: &str, now: Instant) -> Result<&mut IndexState, EsError> {
        let default = self.default_refresh;
        let index = self
            .indices
            .get_mut(name)
            .ok_or_else(|| EsError::index_not_found(name))?;
        index.catch_up(now, default);
        Ok(index)
    }

    /// The indices an expression names: comma-separated names, `*` patterns, `_all`.
    /// A missing concrete name is an error unless `ignore_unavailable`.
    pub fn resolve(
        &self,
        expression: &str,
        ignore_unavailable: bool,
    ) -> Result<Vec<String>, EsError> {
        let mut names = Vec::new();
        for part in expression.split(',').filter(|p| !p.is_empty()) {
            if part == "_all" || part.contains('*') {
                for name in self.indices.keys() {
                    if part == "_all" || glob(part, name) {
                        names.push(name.clone());
                    }
                }
            } else if part.starts_with('_') {
                // IndexNameExpressionResolver refuses a concrete name starting with `_`
                // (observed on 8.19.21: `GET /_x` → 400 with this reason).
                return Err(EsError::invalid_index_name(
                    part,
                    "must not start with '_'.",
                ));
            } else if self.indices.contains_key(part) {
                names.push(part.to_owned());
            } else if !ignore_unavailable {
                return Err(EsError::index_not_found(part));
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// `*` wildcard matching, as in index patterns.
pub fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}
