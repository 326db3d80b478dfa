//! Growing the data indices to more primary shards: `transfer-service shards --to N`
//! (`docs/operations.md`, "Growing to more shards").
//!
//! Each data index is split (`_split`, the engine copies its segments into an index of `N`
//! shards, documents re-routed by id) and its name moved onto the copy, in four steps:
//!
//! 1. **Write block** on the index (`PUT /{index}/_block/write`, which returns once every
//!    write in flight on its shards has finished, so none lands after the copy is taken):
//!    from here until step 4 every write the service sends is refused with
//!    `cluster_block_exception`, which it retries as `Unavailable` (nothing was applied);
//!    reads go on. A transfer's steps wait, as on a failover.
//! 2. **Split** into `<name>-<N>shards`, which the engine builds from the blocked index (so
//!    it holds every acknowledged write), and wait until its primaries are started.
//! 3. **Check**: after a refresh, both hold the same number of documents.
//! 4. **Swap**, one atomic request to the engine: the old index is deleted and its name
//!    becomes an alias of the copy. Every later request by that name goes to the copy.
//!
//! A failure before step 4, or of step 4 when the name still names the old index, lifts the
//! write block and leaves the old index as it was; a copy left behind is never deleted by
//! the command (another run may be making it): it refuses, naming the copy to delete. Feed
//! cursors and webhook progress hold positions `(modification time, id)` that the copy
//! keeps, and the store's identity, which cursors carry, is written on the transactions
//! copy's mapping (`_meta`: `store_identity`, with the copy's own uuid in `for_uuid`) before
//! the swap, so cursors issued before the split are read after it as before, while a
//! restored snapshot of it (a new uuid) is another store again.

use std::sync::Arc;

use elasticsearch::cluster::ClusterHealthParts;
use elasticsearch::indices::{
    IndicesAddBlockParts, IndicesGetParts, IndicesPutMappingParts, IndicesPutSettingsParts,
    IndicesSplitParts,
};
use elasticsearch::params::WaitForStatus;
use elasticsearch::CountParts;
use es_routing::Routing;
use serde_json::{json, Value};

use super::connection::Connection;
use crate::store::{Index, StoreError, StoreResult};

/// The key of the transactions mapping's `_meta` that keeps the store's identity across
/// splits ([`crate::store::Store::identity`]), and the key naming the one index it is for.
pub(super) const IDENTITY_META: &str = "store_identity";
const IDENTITY_FOR: &str = "for_uuid";

/// How long the split copy's primaries may take to start.
const START_TIMEOUT: &str = "120s";

/// The client's limit for one request of the command (the split, the wait for its
/// primaries), past [`START_TIMEOUT`].
const COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(150);

/// One data index as the engine describes it.
#[derive(Debug, Clone)]
pub(super) struct Described {
    /// The index that holds the documents (the name may be an alias of it).
    pub concrete: String,
    pub routing: Routing,
    pub uuid: String,
    /// `_meta.store_identity` of its mapping, once a split has set it for this index (its
    /// `for_uuid` is this index's uuid).
    pub kept_identity: Option<String>,
}

/// What `shards --to N` does to one index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Growth {
    /// It has `N` shards already.
    Already { index: String },
    /// It will be (or was) split from `from` shards into `copy`.
    Split {
        index: String,
        from: u32,
        to: u32,
        copy: String,
    },
}

impl std::fmt::Display for Growth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Growth::Already { index } => write!(f, "{index}: has that many shards already"),
            Growth::Split {
                index,
                from,
                to,
                copy,
            } => write!(f, "{index}: {from} -> {to} shards, into {copy}"),
        }
    }
}

/// Whether an index routed by `routing` can be split into `to` shards, as the engines allow:
/// from one shard into any count, else into a multiple whose factor divides the routing
/// shards.
pub(super) fn splits_into(routing: Routing, to: u32) -> Result<(), String> {
    let from = routing.shards;
    if to < from {
        return Err(format!(
            "{to} shards is fewer than its {from}: shards are only added"
        ));
    }
    if from > 1 && !(to.is_multiple_of(from) && routing.routing_shards.is_multiple_of(to)) {
        return Err(format!(
            "{from} shards split only into a multiple of {from} that divides its {} routing \
             shards",
            routing.routing_shards
        ));
    }
    Ok(())
}

/// Grows the data indices to more shards (the module docs), over the store's connection.
pub(super) struct ShardGrowth {
    connection: Arc<Connection>,
}

impl ShardGrowth {
    pub(super) fn new(connection: Arc<Connection>) -> ShardGrowth {
        ShardGrowth { connection }
    }

    /// Splits the accounts and transactions indices into `to` shards each (see the module
    /// docs); with `dry_run`, only says what it would do. The store must be migrated.
    pub(super) async fn grow(&self, to: u32, dry_run: bool) -> StoreResult<Vec<Growth>> {
        let mut plan = Vec::new();
        for index in [Index::Accounts, Index::Transactions] {
            let name = self.connection.index_name(index);
            let described = Described::of(&self.connection, &name).await?;
            plan.push((index, name, described));
        }
        let mut done = Vec::new();
        for (index, name, described) in plan {
            let from = described.routing.shards;
            if from == to {
                done.push(Growth::Already { index: name });
                continue;
            }
            splits_into(described.routing, to)
                .map_err(|why| StoreError::Permanent(format!("shards: {name}: {why}")))?;
            let copy = format!("{name}-{to}shards");
            let growth = Growth::Split {
                index: name.clone(),
                from,
                to,
                copy: copy.clone(),
            };
            if !dry_run {
                // The identity feed cursors carry goes onto the copy with it.
                let identity = (index == Index::Transactions).then(|| {
                    described
                        .kept_identity
                        .clone()
                        .unwrap_or(described.uuid.clone())
                });
                self.split(&name, &described.concrete, &copy, to, identity)
                    .await?;
            }
            done.push(growth);
        }
        Ok(done)
    }

    /// Writes the store's `identity` on the copy's mapping, for the copy alone.
    async fn keep_identity(&self, copy: &str, identity: &str) -> StoreResult<()> {
        let uuid = Described::of(&self.connection, copy).await?.uuid;
        let op = "shards: keep the store identity";
        let sent = self
            .connection
            .client
            .indices()
            .put_mapping(IndicesPutMappingParts::Index(&[copy]))
            .body(json!({"_meta": {IDENTITY_META: identity, IDENTITY_FOR: uuid}}))
            .request_timeout(COMMAND_TIMEOUT)
            .send()
            .await;
        self.expect_success(op, sent).await
    }

    /// Steps 1 to 4 of the module docs for one index.
    async fn split(
        &self,
        name: &str,
        concrete: &str,
        copy: &str,
        to: u32,
        identity: Option<String>,
    ) -> StoreResult<()> {
        self.refuse_a_copy_left(copy).await?;
        self.block_writes(concrete).await?;
        let mut copied = self.split_copy(concrete, copy, to).await;
        if let (Ok(()), Some(identity)) = (&copied, &identity) {
            copied = self.keep_identity(copy, identity).await;
        }
        if let Err(error) = copied {
            // Leave the index as it was: writes go on; the copy is left for the operator.
            let _ = self.allow_writes(concrete).await;
            return Err(error);
        }
        let op = "shards: move the name onto the copy";
        let sent = self
            .connection
            .client
            .indices()
            .update_aliases()
            .body(json!({"actions": [
                {"add": {"index": copy, "alias": name}},
                {"remove_index": {"index": concrete}},
            ]}))
            .request_timeout(COMMAND_TIMEOUT)
            .send()
            .await;
        let swapped = self.expect_success(op, sent).await;
        if swapped.is_err() {
            // Unanswered or refused: if the name still names the old index, it takes writes
            // again; if it names the copy, the swap was applied.
            if let Ok(now) = Described::of(&self.connection, name).await {
                if now.concrete == concrete {
                    let _ = self.allow_writes(concrete).await;
                } else {
                    return Ok(());
                }
            }
        }
        swapped
    }

    /// Steps 2 and 3: the copy, started, writable, holding what the blocked index holds.
    async fn split_copy(&self, concrete: &str, copy: &str, to: u32) -> StoreResult<()> {
        let op = "shards: split";
        let sent = self
            .connection
            .client
            .indices()
            .split(IndicesSplitParts::IndexTarget(concrete, copy))
            .body(json!({"settings": {"index.number_of_shards": to}}))
            .request_timeout(COMMAND_TIMEOUT)
            .send()
            .await;
        self.expect_success(op, sent).await?;
        let op = "shards: wait for the copy's primaries";
        let sent = self
            .connection
            .client
            .cluster()
            .health(ClusterHealthParts::Index(&[copy]))
            .wait_for_status(WaitForStatus::Yellow)
            .timeout(START_TIMEOUT)
            .request_timeout(COMMAND_TIMEOUT)
            .send()
            .await;
        let reply = self.connection.read(op, sent).await?;
        if !reply.is_success() || reply.body["timed_out"] == Value::Bool(true) {
            return Err(StoreError::Unavailable(format!(
                "{op}: {copy} not started in {START_TIMEOUT}: {}",
                reply.body
            )));
        }
        self.allow_writes(copy).await?;
        let (before, after) = (self.count_all(concrete).await?, self.count_all(copy).await?);
        if before != after {
            return Err(StoreError::Permanent(format!(
                "shards: {copy} holds {after} documents, {concrete} {before}: not swapped"
            )));
        }
        Ok(())
    }

    /// `PUT /{index}/_block/write`: answered once every write in flight on the index's
    /// shards has finished.
    async fn block_writes(&self, index: &str) -> StoreResult<()> {
        let op = "shards: write block";
        let sent = self
            .connection
            .client
            .indices()
            .add_block(IndicesAddBlockParts::IndexBlock(&[index], "write"))
            .request_timeout(COMMAND_TIMEOUT)
            .send()
            .await;
        let reply = self.connection.successful(op, sent).await?;
        if reply.body["acknowledged"] != Value::Bool(true) {
            return Err(StoreError::Unavailable(format!(
                "{op}: {index}: not acknowledged: {}",
                reply.body
            )));
        }
        Ok(())
    }

    async fn allow_writes(&self, index: &str) -> StoreResult<()> {
        let op = "shards: lift the write block";
        let sent = self
            .connection
            .client
            .indices()
            .put_settings(IndicesPutSettingsParts::Index(&[index]))
            .body(json!({"index.blocks.write": false}))
            .request_timeout(COMMAND_TIMEOUT)
            .send()
            .await;
        self.expect_success(op, sent).await
    }

    async fn count_all(&self, index: &str) -> StoreResult<u64> {
        let op = "shards: count";
        let refreshed = self.connection.refresh(op, &[index]).await?;
        if !refreshed.is_success() {
            return Err(refreshed.into_error(op));
        }
        let sent = self
            .connection
            .client
            .count(CountParts::Index(&[index]))
            .send()
            .await;
        let reply = self.connection.successful(op, sent).await?;
        reply.body["count"]
            .as_u64()
            .ok_or_else(|| StoreError::Permanent(format!("{op}: {index}: {}", reply.body)))
    }

    /// A copy already there is another run's, going on or given up: never touched.
    async fn refuse_a_copy_left(&self, copy: &str) -> StoreResult<()> {
        if !self.connection.index_exists(copy).await? {
            return Ok(());
        }
        Err(StoreError::Permanent(format!(
            "shards: {copy} exists already: another run is making it, or one failed before \
             its swap; when none is running, delete it (DELETE /{copy}) and run again"
        )))
    }

    async fn expect_success(
        &self,
        op: &str,
        sent: Result<elasticsearch::http::response::Response, elasticsearch::Error>,
    ) -> StoreResult<()> {
        self.connection.successful(op, sent).await.map(drop)
    }
}

impl Described {
    /// `GET /{name}`: the index behind the name, its routing, uuid and kept identity.
    pub(super) async fn of(connection: &Connection, name: &str) -> StoreResult<Described> {
        let op = "describe index";
        let sent = connection
            .client
            .indices()
            .get(IndicesGetParts::Index(&[name]))
            .send()
            .await;
        let reply = connection.successful(op, sent).await?;
        described_in(&reply.body)
            .map_err(|why| StoreError::Permanent(format!("{op} {name}: {why}")))
    }
}

/// The one index of a `GET /{name}` answer (keyed by the index behind the name).
pub(super) fn described_in(body: &Value) -> Result<Described, String> {
    let indices = body.as_object().filter(|indices| indices.len() == 1);
    let Some((concrete, index)) = indices.and_then(|indices| indices.iter().next()) else {
        return Err(format!("one index expected: {body}"));
    };
    let settings = &index["settings"]["index"];
    let number = |key: &str| -> Option<u32> {
        let value = &settings[key];
        value
            .as_u64()
            .or_else(|| value.as_str()?.parse().ok())?
            .try_into()
            .ok()
    };
    let shards = number("number_of_shards").ok_or("no shard count")?;
    let routing = Routing::of(shards, number("number_of_routing_shards"))
        .ok_or_else(|| format!("a shard count the engines cannot hold: {settings}"))?;
    let uuid = settings["uuid"].as_str().ok_or("no uuid")?.to_owned();
    let meta = &index["mappings"]["_meta"];
    let kept_identity = (meta[IDENTITY_FOR] == uuid.as_str())
        .then(|| meta[IDENTITY_META].as_str().map(str::to_owned))
        .flatten();
    Ok(Described {
        concrete: concrete.clone(),
        routing,
        uuid,
        kept_identity,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_splits_into_any_count_and_more_only_by_a_factor_of_their_routing() {
        let one = Routing::of(1, None).unwrap();
        assert!(splits_into(one, 3).is_ok());
        assert!(splits_into(one, 7).is_ok());
        let three = Routing::of(3, None).unwrap(); // 768 routing shards
        assert!(splits_into(three, 6).is_ok());
        assert!(splits_into(three, 12).is_ok());
        assert!(splits_into(three, 9).is_err(), "9 does not divide 768");
        assert!(splits_into(three, 2).is_err(), "fewer");
    }

    #[test]
    fn an_alias_is_described_by_the_index_behind_it() {
        let body = json!({"ts-transactions-3shards": {
            "aliases": {"ts-transactions": {}},
            "mappings": {"_meta": {"store_identity": "first-uuid", "for_uuid": "copy-uuid"},
                "properties": {}},
            "settings": {"index": {"number_of_shards": "3", "uuid": "copy-uuid"}},
        }});
        let described = described_in(&body).unwrap();
        assert_eq!(described.concrete, "ts-transactions-3shards");
        assert_eq!(described.routing, Routing::of(3, None).unwrap());
        assert_eq!(described.uuid, "copy-uuid");
        assert_eq!(described.kept_identity.as_deref(), Some("first-uuid"));
    }

    /// A restored snapshot of a grown index keeps its mapping but gets a new uuid: it is
    /// another store, so its identity is its own uuid again.
    #[test]
    fn an_identity_kept_for_another_uuid_is_not_this_indexs() {
        let body = json!({"restored": {
            "mappings": {"_meta": {"store_identity": "first-uuid", "for_uuid": "copy-uuid"}},
            "settings": {"index": {"number_of_shards": "3", "uuid": "restored-uuid"}},
        }});
        assert_eq!(described_in(&body).unwrap().kept_identity, None);
    }
}
