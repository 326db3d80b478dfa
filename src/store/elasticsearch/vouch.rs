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
//! Each shard of an index has its own primary, terms, `_seq_no`s and checkpoints; a
//! document lives on the one shard its id routes to (`es-routing`, the engines' own rule,
//! from the index's shard count), and everything below is about that shard.
//!
//! Every vouch waits for one `_stats` request of the index **sent after the read**, which
//! must reach every assigned copy of its shards (`_shards.failed` 0) and find exactly one
//! started primary of the document's shard (of every shard, for a vouch of the index). On the minority side of a partition that request fails (links refused)
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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use elasticsearch::indices::IndicesStatsParts;
use elasticsearch::params::Level;
use elasticsearch::GetParts;
use es_routing::Routing;
use serde_json::Value;

use super::bodies::doc_of;
use super::check_addressable;
use super::connection::{traced, Connection};
use super::shards::Described;
use crate::store::{Doc, Index, StoreError, StoreResult, Version, CHANGED_SINCE_READ};

/// What `_stats` asks for: the totals, and each copy's routing, checkpoints and term.
const STATS_ANSWER: &[&str] = &[
    "_shards",
    "indices.*.shards.*.routing.state",
    "indices.*.shards.*.routing.primary",
    "indices.*.shards.*.routing.node",
    "indices.*.uuid",
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

/// What one answer says of a read.
enum Judged {
    Vouched,
    /// Not by this answer; why (the vouch's error if no later answer vouches for it).
    Not(String),
}

/// One `_stats` answer about an index: the index that answered (the name asked may be an
/// alias) and the one started primary of each shard that has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Report {
    pub index: String,
    /// `false`: the index does not exist (before the migrations ran).
    pub exists: bool,
    pub primaries: BTreeMap<u32, Primary>,
    /// The index's uuid and every copy listed, as `(shard, node, primary, state)`, sorted:
    /// what the contacted node routes reads by (see [`Layouts`]).
    pub layout: Listing,
}

/// An index's uuid (another index under the same name is another listing) and its copies.
type Listing = (String, Vec<(u32, String, bool, String)>);

impl Report {
    /// The answer about an index that does not exist: no shard, nothing to vouch against.
    fn missing(name: &str) -> Report {
        Report {
            index: name.to_owned(),
            exists: false,
            primaries: BTreeMap::new(),
            layout: Listing::default(),
        }
    }

    /// The started primary of `shard`, or why the shard cannot vouch for anything now.
    fn primary(&self, shard: u32) -> Result<Primary, String> {
        self.primaries.get(&shard).copied().ok_or_else(|| {
            format!(
                "shard {shard} of {} has no started primary that answered",
                self.index
            )
        })
    }
}

/// What the vouch knows of how the contacted node routes reads: per index, the answers
/// applied so far and the answer at which the copies listed last changed.
///
/// The rule it serves: a read is vouched for by an answer sent after it only if the copies
/// listed did not change between the last answer applied **before the read was sent** and
/// that one. A node applies cluster states in order; under one state it routes a read to a
/// copy that state lists as started, and an answer under a later state that still lists the
/// same copies lists that copy (whose lag the answer then shows, see [`Primary::copy_behind`]).
/// Without it, a node that had been cut off, and routed a read to its copy the cluster had
/// dropped, could apply the state that drops it between the read and the answer, and the
/// answer would vouch for a read it no longer describes (seen on OpenSearch 3.9: "not found",
/// a second after a heal, for a transfer acknowledged through another node). A read the rule
/// cannot vouch for is made again, and vouched for if it finds the same.
#[derive(Debug, Default)]
struct Layouts {
    by_index: HashMap<String, Layout>,
    /// Reads sent and not yet vouched for: the answers applied when each was sent.
    reads: HashMap<(String, String), u64>,
}

#[derive(Debug, Default)]
struct Layout {
    applied: u64,
    changed_at: u64,
    copies: Option<Listing>,
}

/// Whether the copies listed went from `before` to `after` only by copies starting: a copy
/// that appears initializing, or goes from initializing to started, where every other copy is
/// listed as it was. A read is routed to started copies only, and a copy that started has
/// recovered everything acknowledged (its lag, if any, shows in the answer), so such a change
/// around a read leaves nothing to read again. Any other change does (a copy gone or failed,
/// a primary moved): the common change in a young index (its replicas starting) then costs
/// no read.
fn only_copies_starting(
    before: &[(u32, String, bool, String)],
    after: &[(u32, String, bool, String)],
) -> bool {
    let find = |copies: &[(u32, String, bool, String)], shard: u32, node: &str| {
        copies
            .iter()
            .find(|(s, n, _, _)| *s == shard && n == node)
            .map(|(_, _, primary, state)| (*primary, state.clone()))
    };
    let kept = before.iter().all(
        |(shard, node, primary, state)| match find(after, *shard, node) {
            Some((now_primary, now)) => {
                now_primary == *primary
                    && (now == *state || (state == "INITIALIZING" && now == "STARTED"))
            }
            None => false,
        },
    );
    let new_ones_initialize = after
        .iter()
        .filter(|(shard, node, _, _)| find(before, *shard, node).is_none())
        .all(|(_, _, _, state)| state == "INITIALIZING");
    kept && new_ones_initialize
}

/// Reads remembered for their vouch at most; past it all are forgotten (and each vouched for
/// by a read made again).
const READS_REMEMBERED: usize = 4096;

impl Layouts {
    fn applied(&mut self, index: &str, copies: Option<Listing>) {
        let layout = self.by_index.entry(index.to_owned()).or_default();
        layout.applied += 1;
        // An answer that lists no copies (a failed request) counts as a change: what the
        // node routed by meanwhile is unknown.
        let benign = match (&layout.copies, &copies) {
            (Some((uuid, before)), Some((now, after))) => {
                uuid == now && only_copies_starting(before, after)
            }
            _ => false,
        };
        if !benign {
            layout.changed_at = layout.applied;
        }
        layout.copies = copies;
    }

    fn applied_so_far(&self, index: &str) -> u64 {
        self.by_index.get(index).map_or(0, |layout| layout.applied)
    }

    /// Two reads of one id may be in flight at once (a long-poll beside a worker's read):
    /// the entry keeps the earlier one's count, so either read's vouch looks at every change
    /// since the earlier was sent (more reads made again, never a change missed). A read
    /// that is never vouched for (a worker's before a conditional write) leaves its entry
    /// until a vouch of that id or the cap: a later read of the id is then judged from the
    /// older count, which again can only ask for a read more.
    fn read_sent(&mut self, index: &str, id: &str, applied: u64) {
        if self.reads.len() >= READS_REMEMBERED {
            // Forgotten reads are vouched for by a read made again (no entry: no vouch).
            self.reads.clear();
        }
        let entry = self.reads.entry((index.to_owned(), id.to_owned()));
        let earliest = entry.or_insert(applied);
        *earliest = (*earliest).min(applied);
    }

    /// Whether the copies listed are the same in the last answer applied before the read of
    /// `id` was sent and in every answer since; forgets the read.
    fn unchanged_since_read(&mut self, index: &str, id: &str) -> bool {
        let sent_after = self.reads.remove(&(index.to_owned(), id.to_owned()));
        let layout = self.by_index.get(index);
        match (sent_after, layout) {
            (Some(before), Some(layout)) => before >= 1 && layout.changed_at <= before,
            _ => false,
        }
    }
}

/// The highest global checkpoint reported for each shard and primary term; the last `_stats`
/// answer of each index with when it was sent; each index's routing; one `_stats` request at
/// a time (the reads waiting share its answer).
#[derive(Debug, Default)]
struct Checkpoints {
    reported: Mutex<HashMap<(String, u32, u64), i64>>,
    last: Mutex<HashMap<String, (Instant, StoreResult<Report>)>>,
    routing: Mutex<HashMap<String, Routing>>,
    layouts: Mutex<Layouts>,
    asking: tokio::sync::Mutex<()>,
}

impl Checkpoints {
    /// Whether a primary of the read's term on `shard` has reported a global checkpoint at
    /// or above it.
    fn cover(&self, index: &str, shard: u32, read: Version) -> bool {
        let reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        reported
            .get(&(index.to_owned(), shard, read.primary_term))
            .is_some_and(|&checkpoint| checkpoint >= read.seq_no as i64)
    }

    fn remember(&self, index: &str, shard: u32, primary: Primary) {
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        let checkpoint = reported
            .entry((index.to_owned(), shard, primary.term))
            .or_insert(primary.global_checkpoint);
        *checkpoint = (*checkpoint).max(primary.global_checkpoint);
    }

    /// The last answer about `index` whose request was sent at or after `after`.
    fn answered_since(&self, index: &str, after: Instant) -> Option<StoreResult<Report>> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let (sent, answer) = last.get(index)?;
        (*sent >= after).then(|| answer.clone())
    }

    fn answered(&self, index: &str, sent: Instant, answer: &StoreResult<Report>) {
        if let Ok(report) = answer {
            for (&shard, &primary) in &report.primaries {
                self.remember(&report.index, shard, primary);
            }
        }
        let copies = answer.as_ref().ok().map(|report| report.layout.clone());
        self.layouts().applied(index, copies);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.insert(index.to_owned(), (sent, answer.clone()));
    }

    /// The routing last read for `index`, unless `report` names a shard past its count (the
    /// index was split since).
    fn routing_for(&self, report: &Report) -> Option<Routing> {
        let routing = self.routing.lock().unwrap_or_else(|e| e.into_inner());
        let known = *routing.get(&report.index)?;
        let last_shard = report.primaries.keys().next_back().copied().unwrap_or(0);
        (last_shard < known.shards).then_some(known)
    }

    fn layouts(&self) -> std::sync::MutexGuard<'_, Layouts> {
        self.layouts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A read of `id` in `index` is about to be sent (see [`Layouts`]).
    fn sending(&self, index: &str, id: &str) {
        let mut layouts = self.layouts();
        let applied = layouts.applied_so_far(index);
        layouts.read_sent(index, id, applied);
    }

    fn learned(&self, index: &str, routing: Routing) {
        let mut known = self.routing.lock().unwrap_or_else(|e| e.into_inner());
        known.insert(index.to_owned(), routing);
    }
}

/// Vouches for reads (see the module docs): the connection it asks `_stats` on, what the
/// answers reported so far, and how long it waits for a write to be committed.
pub(super) struct Vouch {
    connection: Arc<Connection>,
    /// The global checkpoints reads are vouched for against.
    checkpoints: Checkpoints,
    /// How long a vouch waits for a write it read to be committed (half the request timeout).
    patience: Duration,
}

impl Vouch {
    pub(super) fn new(connection: Arc<Connection>, patience: Duration) -> Vouch {
        Vouch {
            connection,
            checkpoints: Checkpoints::default(),
            patience,
        }
    }

    /// A realtime GET of `id` ([`Store::get`](crate::store::Store::get)). Every read of a
    /// document is sent from here: a vouch judges it by the answers applied before it was
    /// sent (see [`Layouts`]).
    pub(super) async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        let op = "get";
        check_addressable(op, id)?;
        let name = self.connection.index_name(index);
        self.checkpoints.sending(&name, id);
        let sent = traced!(self
            .connection
            .client
            .get(GetParts::IndexId(&name, id))
            .realtime(true))
        .send()
        .await;
        let reply = self.connection.read(op, sent).await?;
        match reply.status {
            200 if reply.body["found"] == Value::Bool(true) => doc_of(op, &reply.body).map(Some),
            404 if reply.body["found"] == Value::Bool(false) => Ok(None),
            404 if reply.error_type() == Some("index_not_found_exception") => self
                .connection
                .missing_index(op, reply)
                .await
                .map(|()| None),
            _ => Err(reply.into_error(op)),
        }
    }

    /// A search of `index` is about to be sent: what to pass to [`Self::found_by_search`].
    pub(super) fn searching(&self, index: &str) -> u64 {
        self.checkpoints.layouts().applied_so_far(index)
    }

    /// `id` came back from the search sent at `searching`'s answer.
    pub(super) fn found_by_search(&self, index: &str, id: &str, searching: u64) {
        self.checkpoints.layouts().read_sent(index, id, searching);
    }

    /// See the module docs. Called after the read: the `_stats` it waits for is sent after it.
    /// `id` empty: the index itself (every shard reachable, none with a copy behind).
    pub(super) async fn vouch_for(
        &self,
        index: Index,
        id: &str,
        read: Option<Version>,
    ) -> StoreResult<()> {
        let name = self.connection.index_name(index);
        let give_up = Instant::now() + self.patience;
        let mut report = self.contact(&name, Instant::now()).await?;
        let mut read_again_under_newer_term = false;
        loop {
            let why = match self
                .judge(index, id, read, &report, &mut read_again_under_newer_term)
                .await?
            {
                Judged::Vouched => return Ok(()),
                Judged::Not(why) => why,
            };
            if Instant::now() >= give_up {
                return Err(StoreError::Unavailable(format!(
                    "vouch: {name}/{id}: {why}"
                )));
            }
            tokio::time::sleep(CHECKPOINT_PAUSE).await;
            report = self.contact(&name, Instant::now()).await?;
        }
    }

    /// What one `_stats` answer, sent after the read, says of it (see the module docs).
    /// `read_again_under_newer_term`: whether a document last written under an older term
    /// than its primary's was read again already (once per vouch).
    async fn judge(
        &self,
        index: Index,
        id: &str,
        read: Option<Version>,
        report: &Report,
        read_again_under_newer_term: &mut bool,
    ) -> StoreResult<Judged> {
        let unavailable =
            |why: String| StoreError::Unavailable(format!("vouch: {}/{id}: {why}", report.index));
        if !report.exists {
            // No index, no document (see "A missing index"); nothing read from it either.
            return match read {
                None => Ok(Judged::Vouched),
                Some(_) => Err(unavailable("read from an index that is gone".into())),
            };
        }
        let routing = self.routing_of(report).await?;
        let shards: Vec<u32> = match id {
            "" => (0..routing.shards).collect(),
            id => vec![routing.shard_of(id)],
        };
        let primaries = shards
            .iter()
            .map(|&shard| report.primary(shard))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| unavailable(format!("{why}; not answered on this node")))?;
        if primaries.iter().any(|primary| primary.copy_behind) {
            return Ok(Judged::Not(
                "a copy listed as started is behind the primary's global checkpoint (a node \
                 that has not yet applied the cluster's dropping it): not answered on what it \
                 served"
                    .into(),
            ));
        }
        let (Some(read), [primary]) = (read, &primaries[..]) else {
            // The index itself (every shard), or "not found".
            return Ok(if id.is_empty() {
                Judged::Vouched
            } else {
                self.copies_unchanged(index, id, None).await?
            });
        };
        if self.checkpoints.cover(&report.index, shards[0], read) {
            return self.copies_unchanged(index, id, Some(read)).await;
        }
        if primary.term > read.primary_term {
            if *read_again_under_newer_term {
                return self.copies_unchanged(index, id, Some(read)).await;
            }
            // Last written under an older term: the same operation read again, now that
            // every copy answered with one primary, is one the current primary kept; the
            // next answer vouches for that read.
            self.read_again(index, id, Some(read)).await?;
            *read_again_under_newer_term = true;
            return Ok(Judged::Not("read again under a newer primary term".into()));
        }
        Ok(Judged::Not(format!(
            "read at _seq_no {} of primary term {}, which the primary has not reported \
             committed (a write not yet acknowledged, or one a cut-off primary accepted): not \
             answered on it",
            read.seq_no, read.primary_term
        )))
    }

    /// A read otherwise vouched for: vouched if the copies listed stayed the same around it
    /// ([`Layouts`]), else read again, for the next answer to vouch for.
    async fn copies_unchanged(
        &self,
        index: Index,
        id: &str,
        read: Option<Version>,
    ) -> StoreResult<Judged> {
        let name = self.connection.index_name(index);
        if self.checkpoints.layouts().unchanged_since_read(&name, id) {
            return Ok(Judged::Vouched);
        }
        self.read_again(index, id, read).await?;
        Ok(Judged::Not(
            "the copies listed changed around the read: read again".into(),
        ))
    }

    /// The routing of the index that answered `report`: known, or read from its settings
    /// (again after a split, which adds shards).
    async fn routing_of(&self, report: &Report) -> StoreResult<Routing> {
        if let Some(routing) = self.checkpoints.routing_for(report) {
            return Ok(routing);
        }
        let routing = Described::of(&self.connection, &report.index)
            .await?
            .routing;
        self.checkpoints.learned(&report.index, routing);
        Ok(routing)
    }

    /// The answer of a `_stats` of `name` sent at or after `after` (a read's end): the one
    /// another read already waited for if it was sent late enough, else a new one. One is in
    /// flight at a time, so reads arriving together share one request, and on a node cut
    /// off from the others (where it hangs until the request timeout) they wait for one
    /// timeout, not one each.
    async fn contact(&self, name: &str, after: Instant) -> StoreResult<Report> {
        let _turn = self.checkpoints.asking.lock().await;
        if let Some(answer) = self.checkpoints.answered_since(name, after) {
            return answer;
        }
        let sent = Instant::now();
        let answer = self.report_of(name).await;
        self.checkpoints.answered(name, sent, &answer);
        answer
    }

    /// Reads `id` again, now that an answer sent after the first read is in; the same
    /// outcome (the same operation, or not found again) is the one vouched for next.
    async fn read_again(&self, index: Index, id: &str, read: Option<Version>) -> StoreResult<()> {
        let again = self.get(index, id).await?;
        let again = again.map(|doc| doc.version);
        if again == read {
            return Ok(());
        }
        Err(StoreError::Unavailable(format!(
            "vouch: {id} {CHANGED_SINCE_READ} (at {read:?}, now at {again:?}): read it again"
        )))
    }

    /// One `_stats` request for `name`'s shard copies (see [`report_in`]).
    async fn report_of(&self, name: &str) -> StoreResult<Report> {
        let op = "vouch";
        let sent = self
            .connection
            .client
            .indices()
            .stats(IndicesStatsParts::IndexMetric(&[name], &["docs"]))
            .level(Level::Shards)
            .filter_path(STATS_ANSWER)
            .send()
            .await;
        let reply = self.connection.read(op, sent).await?;
        if reply.status == 404 && reply.error_type() == Some("index_not_found_exception") {
            // No index, no document: nothing to vouch against (see "A missing index").
            self.connection.missing_index(op, reply).await?;
            return Ok(Report::missing(name));
        }
        if !reply.is_success() {
            return Err(reply.into_error(op));
        }
        report_in(&reply.body).map_err(|why| {
            StoreError::Unavailable(format!("vouch: {name}: {why}; not answered on this node"))
        })
    }
}

/// Each shard's one started primary in a `_stats?level=shards` answer about one index,
/// provided every copy asked answered; else why not. A shard without a started primary is
/// left out (a vouch on it fails); one with two is no answer at all.
pub(super) fn report_in(body: &Value) -> Result<Report, String> {
    // `total` counts unassigned copies too (a replica with no node to go to), which are no
    // sign of a partition; a copy asked that did not answer is `failed`.
    let shards = &body["_shards"];
    if shards["failed"].as_u64() != Some(0) || shards["successful"].as_u64().unwrap_or(0) == 0 {
        return Err(format!(
            "not every shard copy answered ({shards}), as on the minority side of a partition"
        ));
    }
    let indices = body["indices"].as_object();
    let Some((index, stats)) = indices
        .filter(|i| i.len() == 1)
        .and_then(|i| i.iter().next())
    else {
        return Err(format!(
            "an answer about one index expected: {}",
            body["indices"]
        ));
    };
    let Some(by_shard) = stats["shards"].as_object().filter(|s| !s.is_empty()) else {
        return Err("no shard copy answered".into());
    };
    let mut primaries = BTreeMap::new();
    let mut layout = Vec::new();
    for (shard, copies) in by_shard {
        let shard: u32 = shard
            .parse()
            .map_err(|_| format!("a shard named {shard:?}"))?;
        let copies = copies.as_array().map(Vec::as_slice).unwrap_or_default();
        layout.extend(copies.iter().map(|copy| {
            let routing = &copy["routing"];
            let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
            let primary = routing["primary"] == Value::Bool(true);
            (
                shard,
                text(&routing["node"]),
                primary,
                text(&routing["state"]),
            )
        }));
        if let Some(primary) =
            primary_among(copies).map_err(|why| format!("shard {shard}: {why}"))?
        {
            primaries.insert(shard, primary);
        }
    }
    layout.sort();
    let uuid = stats["uuid"].as_str().unwrap_or_default().to_owned();
    Ok(Report {
        index: index.clone(),
        exists: true,
        primaries,
        layout: (uuid, layout),
    })
}

/// The one started primary among one shard's copies: `None` when it is not started.
fn primary_among(copies: &[Value]) -> Result<Option<Primary>, String> {
    let primaries: Vec<&Value> = copies
        .iter()
        .filter(|copy| copy["routing"]["primary"] == Value::Bool(true))
        .collect();
    let [primary] = primaries[..] else {
        return Err(format!(
            "{} copies call themselves the primary",
            primaries.len()
        ));
    };
    if primary["routing"]["state"] != "STARTED" {
        return Ok(None);
    }
    let term = primary["retention_leases"]["primary_term"].as_u64();
    let global_checkpoint = primary["seq_no"]["global_checkpoint"].as_i64();
    match (term, global_checkpoint) {
        (Some(term), Some(global_checkpoint)) => Ok(Some(Primary {
            term,
            global_checkpoint,
            copy_behind: copies
                .iter()
                .filter(|copy| copy["routing"]["state"] == "STARTED")
                .filter_map(|copy| copy["seq_no"]["local_checkpoint"].as_i64())
                .any(|local| local < global_checkpoint),
        })),
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

    /// Shard 0's started primary in `body`, or why there is none.
    fn primary_in(body: &Value) -> Result<Primary, String> {
        report_in(body)?.primary(0)
    }

    #[test]
    fn the_started_primary_reports_its_term_and_checkpoint() {
        let body = answer(
            0,
            2,
            vec![copy(false, "STARTED", 3, 9), copy(true, "STARTED", 3, 9)],
        );
        assert_eq!(
            primary_in(&body),
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
        assert!(!primary_in(&in_sync).unwrap().copy_behind);
        let mut dropped = in_sync.clone();
        dropped["indices"]["i"]["shards"]["0"][0]["seq_no"]["local_checkpoint"] = json!(4);
        assert!(primary_in(&dropped).unwrap().copy_behind);
    }

    #[test]
    fn a_copy_that_did_not_answer_vouches_for_nothing() {
        let body = answer(1, 1, vec![copy(true, "STARTED", 1, 9)]);
        let why = primary_in(&body).unwrap_err();
        assert!(why.contains("not every shard copy answered"), "{why}");
    }

    #[test]
    fn an_unassigned_replica_is_no_sign_of_a_partition() {
        let mut body = answer(0, 1, vec![copy(true, "STARTED", 1, 4)]);
        body["_shards"]["total"] = json!(2);
        assert!(primary_in(&body).is_ok());
    }

    #[test]
    fn two_copies_calling_themselves_primary_vouch_for_nothing() {
        // A deposed primary that has not heard of its successor, beside the new one.
        let body = answer(
            0,
            2,
            vec![copy(true, "STARTED", 1, 9), copy(true, "STARTED", 2, 8)],
        );
        let why = primary_in(&body).unwrap_err();
        assert!(
            why.contains("2 copies call themselves the primary"),
            "{why}"
        );
    }

    #[test]
    fn a_primary_not_started_vouches_for_nothing() {
        let body = answer(0, 1, vec![copy(true, "RELOCATING", 1, 9)]);
        assert!(primary_in(&body).is_err());
    }

    #[test]
    fn a_checkpoint_covers_only_its_own_term() {
        let checkpoints = Checkpoints::default();
        checkpoints.remember(
            "i",
            0,
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
        assert!(checkpoints.cover("i", 0, at(10, 2)));
        assert!(
            !checkpoints.cover("i", 0, at(11, 2)),
            "above the checkpoint"
        );
        // Term 1's primary may have written another operation at _seq_no 10 that term 2's
        // history does not hold.
        assert!(!checkpoints.cover("i", 0, at(10, 1)), "another term");
        assert!(!checkpoints.cover("j", 0, at(1, 2)), "another index");
        // Each shard numbers its operations on its own.
        assert!(!checkpoints.cover("i", 1, at(1, 2)), "another shard");
        checkpoints.remember(
            "i",
            0,
            Primary {
                term: 2,
                global_checkpoint: 4,
                copy_behind: false,
            },
        );
        assert!(
            checkpoints.cover("i", 0, at(10, 2)),
            "checkpoints only grow"
        );
    }

    #[test]
    fn each_shard_reports_its_own_primary_and_one_not_started_vouches_for_nothing_of_its_own() {
        let body = json!({
            "_shards": {"total": 6, "successful": 5, "failed": 0},
            "indices": {"i-split": {"shards": {
                "0": [copy(true, "STARTED", 1, 40), copy(false, "STARTED", 1, 40)],
                "1": [copy(true, "STARTED", 3, 7), copy(false, "STARTED", 3, 7)],
                "2": [copy(true, "INITIALIZING", 1, -1)],
            }}},
        });
        let report = report_in(&body).unwrap();
        // The name asked for may be an alias: the report names the index that answered.
        assert_eq!(report.index, "i-split");
        assert_eq!(report.primary(0).unwrap().global_checkpoint, 40);
        assert_eq!(report.primary(1).unwrap().term, 3);
        let why = report.primary(2).unwrap_err();
        assert!(why.contains("shard 2"), "{why}");
    }

    #[test]
    fn a_copy_behind_on_one_shard_is_that_shards_alone() {
        let mut body = json!({
            "_shards": {"total": 4, "successful": 4, "failed": 0},
            "indices": {"i": {"shards": {
                "0": [copy(true, "STARTED", 1, 9), copy(false, "STARTED", 1, 9)],
                "1": [copy(true, "STARTED", 1, 9), copy(false, "STARTED", 1, 9)],
            }}},
        });
        body["indices"]["i"]["shards"]["1"][1]["seq_no"]["local_checkpoint"] = json!(3);
        let report = report_in(&body).unwrap();
        assert!(!report.primary(0).unwrap().copy_behind);
        assert!(report.primary(1).unwrap().copy_behind);
    }

    fn layout(nodes: &[&str]) -> Option<Listing> {
        let copies = nodes.iter().enumerate();
        let copies = copies.map(|(k, node)| (0, node.to_string(), k == 0, "STARTED".into()));
        Some(("u1".into(), copies.collect()))
    }

    #[test]
    fn a_read_is_vouched_for_only_if_the_copies_listed_stayed_the_same_around_it() {
        let mut layouts = Layouts::default();
        // Before any answer: nothing is known of what the read was routed by.
        layouts.read_sent("i", "t1", layouts.applied_so_far("i"));
        layouts.applied("i", layout(&["n0", "n1"]));
        assert!(
            !layouts.unchanged_since_read("i", "t1"),
            "no answer before the read"
        );

        layouts.read_sent("i", "t2", layouts.applied_so_far("i"));
        layouts.applied("i", layout(&["n0", "n1"]));
        assert!(
            layouts.unchanged_since_read("i", "t2"),
            "the same copies before and after"
        );
        assert!(
            !layouts.unchanged_since_read("i", "t2"),
            "a read is vouched for once"
        );

        // The node applies a state that drops n1's copy after routing a read to it.
        layouts.read_sent("i", "t3", layouts.applied_so_far("i"));
        layouts.applied("i", layout(&["n0"]));
        assert!(
            !layouts.unchanged_since_read("i", "t3"),
            "the copies changed after the read"
        );

        layouts.read_sent("i", "t4", layouts.applied_so_far("i"));
        layouts.applied("i", None);
        layouts.applied("i", layout(&["n0"]));
        assert!(
            !layouts.unchanged_since_read("i", "t4"),
            "a failed answer hides a change"
        );
        assert!(!layouts.unchanged_since_read("j", "t4"), "another index");

        // Two reads of one id in flight: the later does not hide a change after the earlier.
        layouts.read_sent("i", "t9", layouts.applied_so_far("i"));
        layouts.applied("i", layout(&["n1"]));
        layouts.read_sent("i", "t9", layouts.applied_so_far("i"));
        layouts.applied("i", layout(&["n1"]));
        assert!(
            !layouts.unchanged_since_read("i", "t9"),
            "the earlier read's change"
        );

        // A replica that starts around a read: it served nothing before it started.
        let replica = |state: &str| (0, "n1".to_owned(), false, state.to_owned());
        let with = |state: &str| {
            let (uuid, mut copies) = layout(&["n0"]).unwrap();
            copies.push(replica(state));
            Some((uuid, copies))
        };
        layouts.applied("i", with("INITIALIZING"));
        layouts.read_sent("i", "t5", layouts.applied_so_far("i"));
        layouts.applied("i", with("STARTED"));
        assert!(layouts.unchanged_since_read("i", "t5"), "a copy started");
        // The same copy failing again is a change.
        layouts.read_sent("i", "t6", layouts.applied_so_far("i"));
        layouts.applied("i", layout(&["n0"]));
        assert!(
            !layouts.unchanged_since_read("i", "t6"),
            "a started copy gone"
        );
        // A copy that appears initializing and is gone by the next answer: a change.
        layouts.read_sent("i", "t7", layouts.applied_so_far("i"));
        layouts.applied("i", with("INITIALIZING"));
        layouts.applied("i", layout(&["n0"]));
        assert!(
            !layouts.unchanged_since_read("i", "t7"),
            "an initializing copy gone"
        );
        // A primary that moved.
        layouts.read_sent("i", "t8", layouts.applied_so_far("i"));
        let demoted = vec![(0, "n0".into(), false, "STARTED".into())];
        layouts.applied("i", Some(("u1".into(), demoted)));
        assert!(
            !layouts.unchanged_since_read("i", "t8"),
            "the primary flag changed"
        );
        // The same copies of another index under the same name.
        layouts.applied("i", layout(&["n0"]));
        layouts.read_sent("i", "t10", layouts.applied_so_far("i"));
        layouts.applied("i", Some(("u2".into(), layout(&["n0"]).unwrap().1)));
        assert!(!layouts.unchanged_since_read("i", "t10"), "another index");
    }
}
