//! Index migrations: the numbered JSON files in `migrations/`, embedded in the binary and
//! applied in order at start-up by [`ElasticsearchStore::migrate`](super::ElasticsearchStore::migrate)
//! through [`Migrations`].
//!
//! Each file is one step, recorded once applied as the document
//! `{prefix}migrations/_doc/{file stem}`. Two kinds:
//! - `{"description": "...", "create_index": "<logical name>", "body": {"settings": {...},
//!   "mappings": {...}}}` creates an index (`PUT /{index}`);
//! - `{"description": "...", "put_mapping": "<logical name>", "body": {"properties": {...}}}`
//!   adds fields to an existing index's mapping (`PUT /{index}/_mapping`). Documents stored
//!   before are not indexed for the new fields (Elasticsearch does not reindex them;
//!   `docs/elasticsearch.md §8`), so a step like this only maps fields that nothing has
//!   written yet: the service writes nothing before its migrations ran.
//!
//! # Several instances migrating at the same moment
//!
//! Nothing here takes a lock; every step is safe to run any number of times, concurrently:
//! - Creating an index is atomic in the cluster state: exactly one `PUT /{index}` creates it,
//!   every other one gets `400 resource_already_exists_exception`, which we count as done.
//!   Both ran the same embedded file, so the index that exists has the body we wanted
//!   (applied files are never edited: a change is a new file).
//! - The record is written with `op_type=create` *after* the step succeeded, so a record
//!   implies an applied step. Two instances may both apply a step (the second is a no-op)
//!   and both try to record it: one gets 201, the other 409, and there is one record.
//! - A crash between applying and recording leaves no record; the next start applies the
//!   step again (a no-op) and records it. That is why every step must be idempotent.
//! - Putting a mapping that only adds fields is a merge in the cluster state: the same body
//!   put twice, or by two instances at once, answers 200 both times and leaves one mapping.
//!   Changing the type of a mapped field is refused (400 `illegal_argument_exception`), and
//!   so is such a step: applied files are never edited.
//! - Each instance walks the list in order and only moves to step N+1 once step N is applied
//!   and recorded (by itself or by someone else). So the record of the *last* step implies
//!   all steps are applied, which is what [`Store::ready`](crate::store::Store::ready) checks.
//!
//! Adding a migration: add `NNNN_name.json` and a line to [`MIGRATIONS`]; a unit test checks
//! that the list and the directory agree. A new kind of step needs a new field in [`MigrationStep`]
//! and must be idempotent too.

use std::sync::Arc;

use elasticsearch::indices::{IndicesCreateParts, IndicesGetMappingParts, IndicesPutMappingParts};
use elasticsearch::{CreateParts, GetParts};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connection::Connection;
use super::reply::Reply;
use crate::store::{StoreError, StoreResult};

/// One embedded migration file.
pub(super) struct Migration {
    /// The file stem; also the id of its record in the migrations index.
    pub id: &'static str,
    pub json: &'static str,
}

macro_rules! migration {
    ($stem:literal) => {
        Migration {
            id: $stem,
            json: include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/migrations/",
                $stem,
                ".json"
            )),
        }
    };
}

/// Every migration, in the order they are applied. Never reorder, edit or remove an entry
/// that has shipped.
pub(super) const MIGRATIONS: &[Migration] = &[
    migration!("0001_accounts"),
    migration!("0002_transactions"),
    migration!("0003_transactions_attention"),
    migration!("0004_transactions_metadata"),
    migration!("0005_transactions_accounts"),
    migration!("0006_webhooks"),
    migration!("0007_transactions_entries"),
];

/// The client's limit for a request that changes an index (create, put mapping), longer than
/// `STORE_TIMEOUT`: the master publishes the change to every node holding a shard before it
/// answers, which on a cluster of several nodes and shards takes longer than a document
/// write (a test's 40 ms store timeout never created a 3-shard index). Both are retried
/// until they hold, and only at start-up.
const CHANGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The logical name of the index holding one record per applied migration.
pub(super) const MIGRATIONS_INDEX: &str = "migrations";

/// The migrations index itself is created by code, not by a migration (the records of the
/// migrations live in it). Same choices as the data indices: one shard, nothing dynamic.
pub fn migrations_index_body() -> Value {
    json!({
        "settings": { "number_of_shards": 1 },
        "mappings": {
            "dynamic": false,
            "properties": {
                "description": { "type": "text" },
                "applied_at": { "type": "date" }
            }
        }
    })
}

/// Indices whose shard count `ELASTICSEARCH_SHARDS` sets when they are created: the data
/// indices. The others hold a handful of documents (a record per migration, a cursor per
/// webhook receiver) and keep one shard.
const SHARDED: [&str; 2] = ["accounts", "transactions"];

/// The create body of `logical` with its shard count: the migration file's (one) for the
/// small indices, `shards` for the data indices. Documents are routed by id (the default),
/// so an account or a transfer lives on one shard and a conditional write keeps its meaning
/// (`docs/design.md` §2, "Shards").
fn with_shards(mut body: Value, logical: &str, shards: u32) -> Value {
    if SHARDED.contains(&logical) {
        body["settings"]["number_of_shards"] = json!(shards);
    }
    body
}

/// The content of a migration file. Unknown keys are refused, so a file written for a step
/// kind this binary does not know fails loudly instead of being skipped.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MigrationStep {
    pub description: String,
    /// Logical index name (without the prefix) to create with `body`.
    #[serde(default)]
    pub create_index: Option<String>,
    /// Logical index name (without the prefix) whose mapping `body` extends.
    #[serde(default)]
    pub put_mapping: Option<String>,
    pub body: Value,
}

/// What a [`MigrationStep`] does, on which logical index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MigrationStepKind<'a> {
    CreateIndex(&'a str),
    PutMapping(&'a str),
}

impl MigrationStep {
    /// The step's kind; a file naming both kinds, or neither, is refused by [`Migration::step`].
    pub fn kind(&self) -> MigrationStepKind<'_> {
        match (&self.create_index, &self.put_mapping) {
            (Some(index), _) => MigrationStepKind::CreateIndex(index),
            (None, Some(index)) => MigrationStepKind::PutMapping(index),
            (None, None) => unreachable!("checked by Migration::step"),
        }
    }

    /// The logical index the step works on.
    pub fn index(&self) -> &str {
        match self.kind() {
            MigrationStepKind::CreateIndex(index) | MigrationStepKind::PutMapping(index) => index,
        }
    }
}

impl Migration {
    pub fn step(&self) -> StoreResult<MigrationStep> {
        let invalid = |e: &dyn std::fmt::Display| {
            StoreError::Permanent(format!("migration {} is not a valid step: {e}", self.id))
        };
        let step: MigrationStep = serde_json::from_str(self.json).map_err(|e| invalid(&e))?;
        if step.create_index.is_some() == step.put_mapping.is_some() {
            return Err(invalid(
                &"it needs exactly one of create_index and put_mapping",
            ));
        }
        Ok(step)
    }
}

/// The id of the last migration: its record means the store is fully migrated.
pub(super) fn last_id() -> &'static str {
    MIGRATIONS.last().map_or("", |m| m.id)
}

/// The migrations of one store, applied or verified over its connection.
pub(super) struct Migrations {
    connection: Arc<Connection>,
    /// Primary shards of the data indices this instance creates (`ELASTICSEARCH_SHARDS`).
    shards: u32,
}

impl Migrations {
    pub(super) fn new(connection: Arc<Connection>, shards: u32) -> Migrations {
        Migrations { connection, shards }
    }

    /// See the module docs for why this is safe to run concurrently from several instances.
    pub(super) async fn apply(&self) -> StoreResult<()> {
        // Parse everything first: a broken file must not leave a half-applied list behind.
        let steps = MIGRATIONS
            .iter()
            .map(|m| Ok((m, m.step()?)))
            .collect::<StoreResult<Vec<_>>>()?;

        let engine = self.connection.detect_engine().await?.clone();
        let records = self.connection.physical_name(MIGRATIONS_INDEX);
        self.create_index_if_absent(&records, migrations_index_body())
            .await?;

        for (migration, step) in steps {
            let index = self.connection.physical_name(step.index());
            // The files are written for Elasticsearch; OpenSearch names a type or two
            // differently (`flattened` is its `flat_object`), the layout is the same.
            let mut body = engine.mapping(&step.body);
            if let MigrationStepKind::CreateIndex(logical) = step.kind() {
                body = with_shards(body, logical, self.shards);
            }
            // Even when recorded, the step must hold: an index deleted after its migration
            // would otherwise be re-created by the first write with dynamic mappings, on which
            // searches and sorts fail for good, and re-created by the step before without the
            // fields a later step added. Both calls only ask (HEAD, GET) when the step holds,
            // so an instance without the rights to change indices still starts.
            match step.kind() {
                MigrationStepKind::CreateIndex(_) => {
                    self.create_index_if_absent(&index, body).await?
                }
                MigrationStepKind::PutMapping(_) => {
                    self.put_mapping_if_missing(&index, &body).await?
                }
            }
            if self.recorded(&records, migration.id).await? {
                tracing::debug!(migration = migration.id, "migration already applied");
                continue;
            }
            self.record(&records, migration.id, &step.description)
                .await?;
            tracing::info!(migration = migration.id, %index, "migration applied");
        }
        Ok(())
    }

    /// Whether every index the migrations create exists and the last migration is recorded:
    /// the store is migrated, without writing anything.
    pub(super) async fn verify(&self) -> StoreResult<()> {
        for migration in MIGRATIONS {
            let step = migration.step()?;
            let index = self.connection.physical_name(step.index());
            if !self.connection.index_exists(&index).await? {
                return Err(StoreError::Unavailable(format!(
                    "index {index} does not exist (not migrated, or wrong INDEX_PREFIX?)"
                )));
            }
        }
        let records = self.connection.physical_name(MIGRATIONS_INDEX);
        if !self.recorded(&records, last_id()).await? {
            return Err(StoreError::Unavailable(format!(
                "migration {} is not recorded yet",
                last_id()
            )));
        }
        Ok(())
    }

    /// `PUT /{index}` unless it exists; one that appears meanwhile counts as created.
    async fn create_index_if_absent(&self, index: &str, body: Value) -> StoreResult<()> {
        if self.connection.index_exists(index).await? {
            return Ok(());
        }
        let op = "migrate: create index";
        let sent = self
            .connection
            .client
            .indices()
            .create(IndicesCreateParts::Index(index))
            .body(body)
            .request_timeout(CHANGE_TIMEOUT)
            .send()
            .await;
        let reply = self.connection.read(op, sent).await?;
        match reply.status {
            200..=299 if reply.body["acknowledged"] == Value::Bool(false) => {
                // The master did not confirm in time: the index may or may not exist yet.
                // The next attempt either creates it or sees it exists.
                Err(StoreError::Unavailable(format!(
                    "{op} [{index}]: not acknowledged by the master in time"
                )))
            }
            200..=299 => Ok(()),
            400 if reply.error_type() == Some("resource_already_exists_exception") => Ok(()),
            _ => Err(reply.into_error(&format!("{op} [{index}]"))),
        }
    }

    /// `PUT /{index}/_mapping` with `body` unless every property it names is mapped already
    /// exactly so (`GET /{index}/_mapping`). Putting it again would be harmless (an addition
    /// merges into the same mapping); asking first keeps a restart read-only.
    async fn put_mapping_if_missing(&self, index: &str, body: &Value) -> StoreResult<()> {
        let op = "migrate: read mapping";
        let sent = self
            .connection
            .client
            .indices()
            .get_mapping(IndicesGetMappingParts::Index(&[index]))
            .send()
            .await;
        let reply = self.connection.read(op, sent).await?;
        if !(200..=299).contains(&reply.status) {
            return Err(reply.into_error(&format!("{op} [{index}]")));
        }
        // Keyed by the index behind the name, which a split made an alias (`shards.rs`).
        let behind = reply
            .body
            .as_object()
            .and_then(|indices| indices.values().next());
        let mapped = &behind.unwrap_or(&Value::Null)["mappings"]["properties"];
        let wanted = body["properties"].as_object().into_iter().flatten();
        if wanted.clone().all(|(field, def)| &mapped[field] == def) {
            return Ok(());
        }
        let op = "migrate: put mapping";
        let sent = self
            .connection
            .client
            .indices()
            .put_mapping(IndicesPutMappingParts::Index(&[index]))
            .body(body.clone())
            .request_timeout(CHANGE_TIMEOUT)
            .send()
            .await;
        let reply = self.connection.read(op, sent).await?;
        match reply.status {
            200..=299 if reply.body["acknowledged"] == Value::Bool(true) => Ok(()),
            // Not confirmed by the master in time: applied or not, the next attempt tells.
            200..=299 => Err(StoreError::Unavailable(format!(
                "{op} [{index}]: not acknowledged by the master in time"
            ))),
            _ => Err(reply.into_error(&format!("{op} [{index}]"))),
        }
    }

    /// Realtime GET of the record of migration `id`.
    async fn recorded(&self, records: &str, id: &str) -> StoreResult<bool> {
        let op = "migrate: read record";
        let sent = self
            .connection
            .client
            .get(GetParts::IndexId(records, id))
            .realtime(true)
            .send()
            .await;
        let reply: Reply = self.connection.read(op, sent).await?;
        match reply.status {
            200 => Ok(reply.body["found"] == Value::Bool(true)),
            404 if reply.body["found"] == Value::Bool(false) => Ok(false),
            404 if reply.error_type() == Some("index_not_found_exception") => Ok(false),
            _ => Err(reply.into_error(op)),
        }
    }

    /// `PUT /{records}/_create/{id}`: 201 we recorded it, 409 another instance did.
    async fn record(&self, records: &str, id: &str, description: &str) -> StoreResult<()> {
        let op = "migrate: record";
        let record = json!({
            "description": description,
            "applied_at": crate::time::format_millis(now_millis()),
        });
        let sent = self
            .connection
            .client
            .create(CreateParts::IndexId(records, id))
            .body(record)
            .send()
            .await;
        let reply = self.connection.read(op, sent).await?;
        match reply.status {
            200..=299 | 409 => Ok(()),
            _ => Err(reply.into_error(op)),
        }
    }
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_names_exactly_one_kind() {
        let step = |json: &'static str| Migration { id: "x", json }.step();
        assert!(step(r#"{"description": "d", "body": {}}"#).is_err());
        assert!(step(
            r#"{"description": "d", "create_index": "a", "put_mapping": "a", "body": {}}"#
        )
        .is_err());
        assert!(step(r#"{"description": "d", "put_index_template": "a", "body": {}}"#).is_err());
        let put = step(r#"{"description": "d", "put_mapping": "a", "body": {}}"#).unwrap();
        assert_eq!(put.kind(), MigrationStepKind::PutMapping("a"));
    }

    #[test]
    fn every_file_in_the_directory_is_listed_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let mut stems: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        stems.sort();
        let listed: Vec<&str> = MIGRATIONS.iter().map(|m| m.id).collect();
        assert_eq!(stems, listed);
        assert_eq!(last_id(), *listed.last().unwrap());
    }

    #[test]
    fn the_data_indices_get_the_configured_shards_and_the_others_keep_one() {
        for migration in MIGRATIONS {
            let step = migration.step().unwrap();
            let MigrationStepKind::CreateIndex(index) = step.kind() else {
                continue;
            };
            let shards =
                with_shards(step.body.clone(), index, 3)["settings"]["number_of_shards"].clone();
            let expected = if index == "webhooks" { 1 } else { 3 };
            assert_eq!(shards, expected, "{index}");
        }
    }

    #[test]
    fn every_migration_parses_and_creates_a_single_shard_non_dynamic_index() {
        for migration in MIGRATIONS {
            let step = migration.step().unwrap();
            assert!(!step.description.is_empty(), "{}", migration.id);
            if let MigrationStepKind::PutMapping(index) = step.kind() {
                // Only additions: a mapping step names properties and nothing else, on an
                // index an earlier step created.
                let keys: Vec<&String> = step.body.as_object().unwrap().keys().collect();
                assert_eq!(keys, ["properties"], "{}", migration.id);
                let created_before = MIGRATIONS
                    .iter()
                    .take_while(|m| m.id != migration.id)
                    .any(|m| m.step().unwrap().kind() == MigrationStepKind::CreateIndex(index));
                assert!(created_before, "{}", migration.id);
                continue;
            }
            assert_eq!(
                step.body["settings"]["number_of_shards"], 1,
                "{}",
                migration.id
            );
            assert_eq!(step.body["mappings"]["dynamic"], false, "{}", migration.id);
        }
    }

    #[test]
    fn the_searched_fields_are_mapped_as_keywords_and_dates() {
        use crate::store::fields;
        // What the transactions index maps once every step ran, creation and additions.
        let mut properties = serde_json::Map::new();
        for step in MIGRATIONS.iter().map(|m| m.step().unwrap()) {
            let added = match step.kind() {
                MigrationStepKind::CreateIndex("transactions") => {
                    &step.body["mappings"]["properties"]
                }
                MigrationStepKind::PutMapping("transactions") => &step.body["properties"],
                _ => continue,
            };
            for (field, def) in added.as_object().unwrap() {
                assert!(
                    properties.insert(field.clone(), def.clone()).is_none(),
                    "{field}"
                );
            }
        }
        let properties = Value::Object(properties);
        for field in [
            fields::STATE,
            fields::SRC,
            fields::DEST,
            fields::ID,
            fields::ATTENTION,
            fields::ACCOUNTS,
            fields::ENTRIES,
        ] {
            assert_eq!(properties[field]["type"], "keyword", "{field}");
        }
        for field in [fields::CREATED, fields::MODIFIED] {
            assert_eq!(properties[field]["type"], "date", "{field}");
        }
        assert_eq!(properties[fields::METADATA]["type"], "flattened");
    }
}
