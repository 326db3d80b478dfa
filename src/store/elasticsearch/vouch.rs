//! Vouching for a read ([`Store::vouch`](crate::store::Store::vouch); `docs/design.md` §9,
//! "Partitions").
//!
//! A realtime GET answers from whichever copy of the shard the contacted node picks, as that
//! copy is now. Under a network partition that is not always a state the cluster keeps:
//!
//! - **Dirty.** A primary cut off from the others keeps indexing what it is sent until it
//!   learns it was replaced (about 30 s with `unresponsive` links). Its GET shows those writes,
//!   which no replica has and which are rolled back when it rejoins, while the majority's new
//!   primary writes other operations at the **same `_seq_no`** under a higher primary term.
//! - **Stale.** A copy the master has already failed (it missed acknowledged writes) still
//!   answers on a node that has not heard so: "no such document" for one that exists.
//!
//! Elasticsearch calls an operation committed once its `_seq_no` is at or below the shard's
//! **global checkpoint**, the highest `_seq_no` every in-sync copy has processed: every later
//! primary is promoted from an in-sync copy, so it keeps that operation. The global checkpoint
//! of the primary of term `t` covers only term `t`'s history (another term may hold another
//! operation at the same `_seq_no`), and the pair `(_seq_no, _primary_term)` names one
//! operation: only the primary of that term makes operations stamped with it.
//!
//! Every vouch waits for one `_stats` request of the index **sent after the read**, which
//! must reach every assigned copy of the shard (`_shards.failed` 0) and find exactly one
//! started primary. On the minority side of a partition that request fails (links refused)
//! or hangs until the request timeout (links black-holed): the read is not answered, neither
//! "not found" from a copy that missed writes nor an older state than a client was already
//! told elsewhere. Reads waiting together share one request.
//!
//! A document read at `(s, t)` is then vouched for once a started primary of term `t` has
//! reported a global checkpoint `>= s` (a write still replicating is asked about again for
//! up to half the request timeout).
//! Each report is remembered per index and term (checkpoints only grow). A document last
//! written under an older term than the primary's is read again after the report: the same
//! `(s, t)` again, with every copy answering and one primary, is the operation the current
//! primary kept.
//!
//! What this leaves: a node that heals in the milliseconds between its read and the `_stats`
//! request; a copy the master failed while the contacted node, which reaches every other
//! node, has not applied that cluster state yet (a partial partition, bounded by the cluster
//! state's publication); and OpenSearch 2.19.6, whose cut-off node, as the partition heals,
//! has answered `_stats` with its stale copy as the only primary and a checkpoint past writes
//! it acknowledged there and then lost (`docs/design.md` §9, "What OpenSearch loses").

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use elasticsearch::indices::IndicesStatsParts;
use elasticsearch::params::Level;
use serde_json::Value;

use super::ElasticsearchStore;
use crate::store::{Index, StoreError, StoreResult, Version};

/// What `_stats` asks for: the totals, and each copy's routing, checkpoints and term.
const STATS_ANSWER: &[&str] = &[
    "_shards",
    "indices.*.shards.*.routing.state",
    "indices.*.shards.*.routing.primary",
    "indices.*.shards.*.seq_no.global_checkpoint",
    "indices.*.shards.*.seq_no.local_checkpoint",
    "indices.*.shards.*.retention_leases.primary_term",
];

/// A read above the primary's global checkpoint asks again after this pause, for at most
/// half the request timeout: an acknowledged write is below it at once or within a
/// replication round trip (the checkpoint is contiguous, so writes still in flight before it
/// hold it back a little); a write still in flight gets that long to be acknowledged before
/// the read is refused.
const CHECKPOINT_PAUSE: Duration = Duration::from_millis(10);

/// The one started primary copy of an index's shard, as one `_stats` answer reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Primary {
    pub term: u64,
    /// `-1` while the shard holds no operation.
    pub global_checkpoint: i64,
    /// A copy listed as started has processed less than the primary's global checkpoint.
    /// Every in-sync copy has processed at least that much (the checkpoint is their
    /// minimum), so such a copy is one the cluster has dropped from its in-sync set, listed
    /// by a node that has not yet applied that: a read it served may be missing acknowledged
    /// writes ("not found" for a transfer that exists). The copies' figures are gathered a
    /// moment apart, so under writes this can also show for an instant: asked again.
    pub copy_behind: bool,
}

/// The highest global checkpoint reported for each index and primary term; the last `_stats`
/// answer of each index with when it was sent; one `_stats` request at a time (the reads
/// waiting share its answer).
#[derive(Debug, Default)]
pub(super) struct Checkpoints {
    reported: Mutex<HashMap<(String, u64), i64>>,
    last: Mutex<HashMap<String, (Instant, StoreResult<Primary>)>>,
    asking: tokio::sync::Mutex<()>,
}

impl Checkpoints {
    /// Whether a primary of the read's term has reported a global checkpoint at or above it.
    fn cover(&self, index: &str, read: Version) -> bool {
        let reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        reported
            .get(&(index.to_owned(), read.primary_term))
            .is_some_and(|&checkpoint| checkpoint >= read.seq_no as i64)
    }

    fn remember(&self, index: &str, primary: Primary) {
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        let checkpoint = reported
            .entry((index.to_owned(), primary.term))
            .or_insert(primary.global_checkpoint);
        *checkpoint = (*checkpoint).max(primary.global_checkpoint);
    }

    /// The last answer about `index` whose request was sent at or after `after`.
    fn answered_since(&self, index: &str, after: Instant) -> Option<StoreResult<Primary>> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let (sent, answer) = last.get(index)?;
        (*sent >= after).then(|| answer.clone())
    }

    fn answered(&self, index: &str, sent: Instant, answer: &StoreResult<Primary>) {
        if let Ok(primary) = answer {
            self.remember(index, *primary);
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.insert(index.to_owned(), (sent, answer.clone()));
    }
}

impl ElasticsearchStore {
    /// See the module docs. Called after the read: the `_stats` it waits for is sent after it.
    pub(super) async fn vouch_for(
        &self,
        index: Index,
        id: &str,
        read: Option<Version>,
    ) -> StoreResult<()> {
        let name = self.index_name(index);
        let mut primary = self.contact(&name, Instant::now()).await?;
        let give_up = Instant::now() + self.vouch_patience;
        loop {
            if !primary.copy_behind {
                let Some(read) = read else {
                    return Ok(());
                };
                if self.checkpoints.cover(&name, read) {
                    tracing::debug!(%id, ?read, ?primary, "vouched: below a checkpoint of its term");
                    return Ok(());
                }
                if primary.term > read.primary_term {
                    let again = self.read_again_under(index, id, read, primary).await;
                    tracing::debug!(%id, ?read, ?primary, ok = again.is_ok(), "vouched by a re-read");
                    return again;
                }
            }
            if Instant::now() >= give_up {
                break;
            }
            tokio::time::sleep(CHECKPOINT_PAUSE).await;
            primary = self.contact(&name, Instant::now()).await?;
        }
        Err(StoreError::Unavailable(match read {
            _ if primary.copy_behind => format!(
                "vouch: {name}/{id}: a copy listed as started is behind the primary's global \
                 checkpoint (a node that has not yet applied the cluster's dropping it): \
                 not answered on what it served"
            ),
            Some(read) => format!(
                "vouch: {name}/{id} was read at _seq_no {} of primary term {}, which the \
                 primary has not reported committed (a write not yet acknowledged, or one \
                 a cut-off primary accepted): not answered on it",
                read.seq_no, read.primary_term
            ),
            None => format!("vouch: {name}/{id}: not vouched for in time"),
        }))
    }

    /// The answer of a `_stats` of `name` sent at or after `after` (a read's end): the one
    /// another read already waited for if it was sent late enough, else a new one. One is in
    /// flight at a time, so reads arriving together share one request, and on a node cut
    /// off from the others (where it hangs until the request timeout) they wait for one
    /// timeout, not one each.
    async fn contact(&self, name: &str, after: Instant) -> StoreResult<Primary> {
        let _turn = self.checkpoints.asking.lock().await;
        if let Some(answer) = self.checkpoints.answered_since(name, after) {
            return answer;
        }
        let sent = Instant::now();
        let answer = self.primary_of(name).await;
        self.checkpoints.answered(name, sent, &answer);
        answer
    }

    /// A document last written under an older term than the primary's: read again now that
    /// every copy answered with one primary; the same operation again is the one it kept.
    async fn read_again_under(
        &self,
        index: Index,
        id: &str,
        read: Version,
        primary: Primary,
    ) -> StoreResult<()> {
        match crate::store::Store::get(self, index, id).await? {
            Some(again) if again.version == read => Ok(()),
            _ => Err(StoreError::Unavailable(format!(
                "vouch: {id} changed since it was read at primary term {} (the primary's is \
                 now {}): read it again",
                read.primary_term, primary.term
            ))),
        }
    }

    /// One `_stats` request for `name`'s shard copies (see [`primary_in`]).
    async fn primary_of(&self, name: &str) -> StoreResult<Primary> {
        let op = "vouch";
        let sent = self
            .client
            .indices()
            .stats(IndicesStatsParts::IndexMetric(&[name], &["docs"]))
            .level(Level::Shards)
            .filter_path(STATS_ANSWER)
            .send()
            .await;
        let reply = self.read(op, sent).await?;
        if reply.status == 404 && reply.error_type() == Some("index_not_found_exception") {
            // No index, no document: nothing to vouch against (see "A missing index").
            self.missing_index(op, reply)?;
            return Ok(Primary {
                term: 0,
                global_checkpoint: -1,
                copy_behind: false,
            });
        }
        if !reply.is_success() {
            return Err(reply.into_error(op));
        }
        primary_in(&reply.body, name).map_err(|why| {
            StoreError::Unavailable(format!("vouch: {name}: {why}; not answered on this node"))
        })
    }
}

/// The one started primary of `name`'s shard in a `_stats?level=shards` answer, provided
/// every copy asked answered; else why not.
pub(super) fn primary_in(body: &Value, name: &str) -> Result<Primary, String> {
    // `total` counts unassigned copies too (a replica with no node to go to), which are no
    // sign of a partition; a copy asked that did not answer is `failed`.
    let shards = &body["_shards"];
    if shards["failed"].as_u64() != Some(0) || shards["successful"].as_u64().unwrap_or(0) == 0 {
        return Err(format!(
            "not every shard copy answered ({shards}), as on the minority side of a partition"
        ));
    }
    let Some(by_shard) = body["indices"][name]["shards"].as_object() else {
        return Err("no shard copy answered".into());
    };
    if by_shard.len() != 1 {
        return Err(format!(
            "{} shards; a read is vouched for on an index of one shard",
            by_shard.len()
        ));
    }
    let copies = by_shard.values().next().and_then(Value::as_array);
    let primaries: Vec<&Value> = copies
        .into_iter()
        .flatten()
        .filter(|copy| copy["routing"]["primary"] == Value::Bool(true))
        .collect();
    let [primary] = primaries[..] else {
        return Err(format!(
            "{} copies call themselves the primary",
            primaries.len()
        ));
    };
    if primary["routing"]["state"] != "STARTED" {
        return Err(format!("the primary is {}", primary["routing"]["state"]));
    }
    let term = primary["retention_leases"]["primary_term"].as_u64();
    let global_checkpoint = primary["seq_no"]["global_checkpoint"].as_i64();
    match (term, global_checkpoint) {
        (Some(term), Some(global_checkpoint)) => Ok(Primary {
            term,
            global_checkpoint,
            copy_behind: copies
                .into_iter()
                .flatten()
                .filter(|copy| copy["routing"]["state"] == "STARTED")
                .filter_map(|copy| copy["seq_no"]["local_checkpoint"].as_i64())
                .any(|local| local < global_checkpoint),
        }),
        _ => Err(format!(
            "the primary's copy reports no term or checkpoint: {primary}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A copy that has processed everything up to its global `checkpoint`.
    fn copy(primary: bool, state: &str, term: u64, checkpoint: i64) -> Value {
        json!({
            "routing": {"state": state, "primary": primary},
            "seq_no": {"global_checkpoint": checkpoint, "local_checkpoint": checkpoint},
            "retention_leases": {"primary_term": term},
        })
    }

    fn answer(failed: u64, successful: u64, copies: Vec<Value>) -> Value {
        json!({
            "_shards": {"total": failed + successful, "successful": successful, "failed": failed},
            "indices": {"i": {"shards": {"0": copies}}},
        })
    }

    #[test]
    fn the_started_primary_reports_its_term_and_checkpoint() {
        let body = answer(
            0,
            2,
            vec![copy(false, "STARTED", 3, 9), copy(true, "STARTED", 3, 9)],
        );
        assert_eq!(
            primary_in(&body, "i"),
            Ok(Primary {
                term: 3,
                global_checkpoint: 9,
                copy_behind: false,
            })
        );
    }

    /// The partition test's finding on Elasticsearch: a node that had been cut off, as it
    /// reconnects and before it has applied the cluster state that dropped its copy, lists
    /// that copy as a started replica and serves reads from it ("not found" for a transfer
    /// acknowledged meanwhile). Its local checkpoint is behind the primary's global one.
    #[test]
    fn a_started_copy_behind_the_primarys_global_checkpoint_is_a_stale_view() {
        let in_sync = answer(
            0,
            2,
            vec![copy(false, "STARTED", 3, 9), copy(true, "STARTED", 3, 9)],
        );
        assert!(!primary_in(&in_sync, "i").unwrap().copy_behind);
        let mut dropped = in_sync.clone();
        dropped["indices"]["i"]["shards"]["0"][0]["seq_no"]["local_checkpoint"] = json!(4);
        assert!(primary_in(&dropped, "i").unwrap().copy_behind);
    }

    #[test]
    fn a_copy_that_did_not_answer_vouches_for_nothing() {
        let body = answer(1, 1, vec![copy(true, "STARTED", 1, 9)]);
        let why = primary_in(&body, "i").unwrap_err();
        assert!(why.contains("not every shard copy answered"), "{why}");
    }

    #[test]
    fn an_unassigned_replica_is_no_sign_of_a_partition() {
        let mut body = answer(0, 1, vec![copy(true, "STARTED", 1, 4)]);
        body["_shards"]["total"] = json!(2);
        assert!(primary_in(&body, "i").is_ok());
    }

    #[test]
    fn two_copies_calling_themselves_primary_vouch_for_nothing() {
        // A deposed primary that has not heard of its successor, beside the new one.
        let body = answer(
            0,
            2,
            vec![copy(true, "STARTED", 1, 9), copy(true, "STARTED", 2, 8)],
        );
        let why = primary_in(&body, "i").unwrap_err();
        assert!(
            why.contains("2 copies call themselves the primary"),
            "{why}"
        );
    }

    #[test]
    fn a_primary_not_started_vouches_for_nothing() {
        let body = answer(0, 1, vec![copy(true, "RELOCATING", 1, 9)]);
        assert!(primary_in(&body, "i").is_err());
    }

    #[test]
    fn a_checkpoint_covers_only_its_own_term() {
        let checkpoints = Checkpoints::default();
        checkpoints.remember(
            "i",
            Primary {
                term: 2,
                global_checkpoint: 10,
                copy_behind: false,
            },
        );
        let at = |seq_no, primary_term| Version {
            seq_no,
            primary_term,
        };
        assert!(checkpoints.cover("i", at(10, 2)));
        assert!(!checkpoints.cover("i", at(11, 2)), "above the checkpoint");
        // Term 1's primary may have written another operation at _seq_no 10 that term 2's
        // history does not hold.
        assert!(!checkpoints.cover("i", at(10, 1)), "another term");
        assert!(!checkpoints.cover("j", at(1, 2)), "another index");
        checkpoints.remember(
            "i",
            Primary {
                term: 2,
                global_checkpoint: 4,
                copy_behind: false,
            },
        );
        assert!(checkpoints.cover("i", at(10, 2)), "checkpoints only grow");
    }
}
