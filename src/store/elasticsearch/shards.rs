//! Growing the data indices to more primary shards: `transfer-service shards --to N`
//! (`docs/operations.md`, "Growing to more shards").
//!
//! Each data index is split (`_split`, the engine copies its segments into an index of `N`
//! shards, documents re-routed by id) and its name moved onto the copy, in four steps:
//!
//! 1. **Write block** on the index: from here until step 4 every write the service sends is
//!    refused with `cluster_block_exception`, which it retries as `Unavailable` (nothing was
//!    applied); reads go on. A transfer's steps wait, as on a failover.
//! 2. **Split** into `<name>-<N>shards`, which the engine builds from the blocked index (so
//!    it holds every acknowledged write), and wait until its primaries are started.
//! 3. **Check**: after a refresh, both hold the same number of documents.
//! 4. **Swap**, one atomic request to the engine: the old index is deleted and its name
//!    becomes an alias of the copy. Every later request by that name goes to the copy.
//!
//! A failure before step 4 lifts the write block and leaves the old index as it was (the copy
//! is deleted by the next run). Feed cursors and webhook progress hold positions
//! `(modification time, id)` that the copy keeps, and the store's identity, which cursors
//! carry, is kept across the split in the transactions mapping's `_meta` (`store_identity`),
//! so cursors issued before the split are read after it as before.

use elasticsearch::cluster::ClusterHealthParts;
use elasticsearch::indices::{
    IndicesDeleteParts, IndicesExistsParts, IndicesGetParts, IndicesPutMappingParts,
    IndicesPutSettingsParts, IndicesRefreshParts, IndicesSplitParts,
};
use elasticsearch::params::WaitForStatus;
use elasticsearch::CountParts;
use es_routing::Routing;
use serde_json::{json, Value};

use super::ElasticsearchStore;
use crate::store::{Index, StoreError, StoreResult};

/// The key of the transactions mapping's `_meta` that keeps the store's identity across
/// splits ([`crate::store::Store::identity`]).
pub(super) const IDENTITY_META: &str = "store_identity";

/// How long the split copy's primaries may take to start.
const START_TIMEOUT: &str = "120s";

/// One data index as the engine describes it.
#[derive(Debug, Clone)]
pub(super) struct Described {
    /// The index that holds the documents (the name may be an alias of it).
    pub concrete: String,
    pub routing: Routing,
    pub uuid: String,
    /// `_meta.store_identity` of its mapping, once a split has set it.
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

impl ElasticsearchStore {
    /// Splits the accounts and transactions indices into `to` shards each (see the module
    /// docs); with `dry_run`, only says what it would do. The store must be migrated.
    pub async fn grow_shards(&self, to: u32, dry_run: bool) -> StoreResult<Vec<Growth>> {
        let mut plan = Vec::new();
        for index in [Index::Accounts, Index::Transactions] {
            let name = self.index_name(index);
            let described = self.describe_index(&name).await?;
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
                if index == Index::Transactions {
                    self.keep_identity(&described).await?;
                }
                self.split(&name, &described.concrete, &copy, to).await?;
            }
            done.push(growth);
        }
        Ok(done)
    }

    /// `GET /{name}`: the index behind the name, its routing, uuid and kept identity.
    pub(super) async fn describe_index(&self, name: &str) -> StoreResult<Described> {
        let op = "describe index";
        let sent = self
            .client
            .indices()
            .get(IndicesGetParts::Index(&[name]))
            .send()
            .await;
        let reply = self.successful(op, sent).await?;
        described_in(&reply.body)
            .map_err(|why| StoreError::Permanent(format!("{op} {name}: {why}")))
    }

    /// Records the store's identity in the transactions mapping, so that the copy keeps it.
    async fn keep_identity(&self, described: &Described) -> StoreResult<()> {
        if described.kept_identity.is_some() {
            return Ok(());
        }
        let op = "shards: keep the store identity";
        let sent = self
            .client
            .indices()
            .put_mapping(IndicesPutMappingParts::Index(&[&described.concrete]))
            .body(json!({"_meta": {IDENTITY_META: described.uuid}}))
            .send()
            .await;
        self.expect_success(op, sent).await
    }

    /// Steps 1 to 4 of the module docs for one index.
    async fn split(&self, name: &str, concrete: &str, copy: &str, to: u32) -> StoreResult<()> {
        self.delete_if_present(copy).await?;
        self.set_write_block(concrete, true).await?;
        let copied = self.split_copy(concrete, copy, to).await;
        if let Err(error) = copied {
            // Leave the index as it was: writes go on, the copy is deleted by the next run.
            let _ = self.set_write_block(concrete, false).await;
            return Err(error);
        }
        let op = "shards: move the name onto the copy";
        let sent = self
            .client
            .indices()
            .update_aliases()
            .body(json!({"actions": [
                {"add": {"index": copy, "alias": name}},
                {"remove_index": {"index": concrete}},
            ]}))
            .send()
            .await;
        self.expect_success(op, sent).await
    }

    /// Steps 2 and 3: the copy, started, writable, holding what the blocked index holds.
    async fn split_copy(&self, concrete: &str, copy: &str, to: u32) -> StoreResult<()> {
        let op = "shards: split";
        let sent = self
            .client
            .indices()
            .split(IndicesSplitParts::IndexTarget(concrete, copy))
            .body(json!({"settings": {"index.number_of_shards": to}}))
            .send()
            .await;
        self.expect_success(op, sent).await?;
        let op = "shards: wait for the copy's primaries";
        let sent = self
            .client
            .cluster()
            .health(ClusterHealthParts::Index(&[copy]))
            .wait_for_status(WaitForStatus::Yellow)
            .timeout(START_TIMEOUT)
            .send()
            .await;
        let reply = self.read(op, sent).await?;
        if !reply.is_success() || reply.body["timed_out"] == Value::Bool(true) {
            return Err(StoreError::Unavailable(format!(
                "{op}: {copy} not started in {START_TIMEOUT}: {}",
                reply.body
            )));
        }
        self.set_write_block(copy, false).await?;
        let (before, after) = (self.count_all(concrete).await?, self.count_all(copy).await?);
        if before != after {
            return Err(StoreError::Permanent(format!(
                "shards: {copy} holds {after} documents, {concrete} {before}: not swapped"
            )));
        }
        Ok(())
    }

    async fn set_write_block(&self, index: &str, blocked: bool) -> StoreResult<()> {
        let op = "shards: write block";
        let sent = self
            .client
            .indices()
            .put_settings(IndicesPutSettingsParts::Index(&[index]))
            .body(json!({"index.blocks.write": blocked}))
            .send()
            .await;
        self.expect_success(op, sent).await
    }

    async fn count_all(&self, index: &str) -> StoreResult<u64> {
        let op = "shards: count";
        let sent = self
            .client
            .indices()
            .refresh(IndicesRefreshParts::Index(&[index]))
            .send()
            .await;
        self.expect_success(op, sent).await?;
        let sent = self.client.count(CountParts::Index(&[index])).send().await;
        let reply = self.successful(op, sent).await?;
        reply.body["count"]
            .as_u64()
            .ok_or_else(|| StoreError::Permanent(format!("{op}: {index}: {}", reply.body)))
    }

    /// Deletes a copy an earlier run left behind (the name is never the one in use: the
    /// swap moves the name onto the copy and deletes the old index in one request).
    async fn delete_if_present(&self, copy: &str) -> StoreResult<()> {
        let op = "shards: an earlier run's copy";
        let sent = self
            .client
            .indices()
            .exists(IndicesExistsParts::Index(&[copy]))
            .send()
            .await;
        if self.read(op, sent).await?.status == 404 {
            return Ok(());
        }
        let sent = self
            .client
            .indices()
            .delete(IndicesDeleteParts::Index(&[copy]))
            .send()
            .await;
        self.expect_success(op, sent).await
    }

    /// The answer to `sent` when it is a success, else the error it is.
    async fn successful(
        &self,
        op: &str,
        sent: Result<elasticsearch::http::response::Response, elasticsearch::Error>,
    ) -> StoreResult<super::reply::Reply> {
        let reply = self.read(op, sent).await?;
        if reply.is_success() {
            Ok(reply)
        } else {
            Err(reply.into_error(op))
        }
    }

    async fn expect_success(
        &self,
        op: &str,
        sent: Result<elasticsearch::http::response::Response, elasticsearch::Error>,
    ) -> StoreResult<()> {
        self.successful(op, sent).await.map(drop)
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
    let kept_identity = index["mappings"]["_meta"][IDENTITY_META]
        .as_str()
        .map(str::to_owned);
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
            "mappings": {"_meta": {"store_identity": "first-uuid"}, "properties": {}},
            "settings": {"index": {"number_of_shards": "3", "uuid": "copy-uuid"}},
        }});
        let described = described_in(&body).unwrap();
        assert_eq!(described.concrete, "ts-transactions-3shards");
        assert_eq!(described.routing, Routing::of(3, None).unwrap());
        assert_eq!(described.uuid, "copy-uuid");
        assert_eq!(described.kept_identity.as_deref(), Some("first-uuid"));
    }
}
