//! The lease on a transfer: which worker may act on it, and until when. This module is the
//! only place that writes a transfer's lease fields (`lease_owner`, `lease_expires_at`) and
//! the only place that writes transfer documents at all, but for the settle in one store
//! transaction (`super::one_transaction`), whose terminal document is sealed here ([`seal_terminal`]).
//!
//! # The rules
//! - **Grant.** A worker gets a lease by a conditional write of the transfer that puts a
//!   fresh owner token (`<instance>/<uuid>`, never reused) and an expiry one lease from now
//!   into it: the create of a new transfer, a cancel that needs a worker, or a takeover by
//!   recovery. All three go through [`Leases::claim`].
//! - **Renew.** Every state write of the holder renews the lease (it carries a new expiry);
//!   [`Leases::renew`] renews it between writes. Both are conditional on the version the
//!   holder last saw, so a renewal fails once anyone else has written the transfer.
//! - **Release.** A terminal state write clears the lease; a worker that stops for shutdown
//!   clears it explicitly ([`Leases::release`]) so the next process resumes at once.
//! - **The holder's deadline** is local and monotonic: the moment the write that granted or
//!   renewed the lease was *sent*, plus the lease, minus the skew margin. Neither this host's
//!   wall clock nor the stored expiry can stretch it; the holder acts on nothing observed
//!   after it.
//! - **Another worker may take over** only when the stored expiry plus the skew margin has
//!   passed on *its* wall clock ([`Leases::may_be_live`]). With holders stopping a margin early
//!   and takers waiting a margin late, instance wall clocks may differ by up to twice the
//!   margin (`docs/design.md §9` states this assumption and what guards beyond it).
//! - **Parked holds.** A hold waiting for its capture has no worker. Its lease is given to
//!   the hold itself ([`Leases::park`]): owner [`PARKED`] (no worker's token), expiring when
//!   the hold does. So recovery, which takes over only leases that have run out, leaves a
//!   waiting hold alone until it expires, and a capture or cancel, which needs a worker at
//!   once, claims a parked lease without waiting ([`Leases::is_parked`]). No worker acts on
//!   a parked hold, so claiming it cannot race a live holder's account writes.
//! - **The stamp and late answers** (the change feed's line that does not depend on time,
//!   `docs/design.md §11`). Every write stamps `modification_time` after it starts timing
//!   itself, so its stamp is never older than its send. A write acknowledged more than
//!   `STORE_TIMEOUT` after it was sent (on the monotonic clock) may have been applied after a
//!   feed reader's horizon passed its stamp, so it is written again with a fresh stamp and
//!   nothing else changed ([`Leases::restamp_if_late`]); so is a terminal transfer a holder
//!   finds on a re-read after an unanswered write, when its stamp is that old.
//! - **A lost answer.** When a claiming write's answer is lost (a timeout, a dropped
//!   connection, Elasticsearch retrying a request the coordinator already applied), the
//!   claim reads the transfer: our owner token in it proves the write was applied, because no
//!   one else ever writes that token. Applied is not yet kept: under a partition a cut-off
//!   primary shows a write it accepted and will roll back (`docs/design.md` §9,
//!   "Partitions"), so that read, like every re-read a holder goes on from, is vouched for
//!   by the store ([`Documents::get_vouched`]) before anything follows from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use super::clock::{BootTime, DynClock, JumpDetector};
use super::documents::{Documents, Versioned};
use super::model::{TransferDoc, TransferState};
use super::retry::retry;
use crate::metrics::Metrics;
use crate::store::{StoreResult, Version, WriteOutcome};
use crate::time::Timestamp;

/// The owner of a parked hold's lease: the hold itself, not a worker (no worker token lacks
/// the `/`). The stored token is [`PARKED_OWNER`](super::model::PARKED_OWNER).
pub const PARKED: &str = super::model::PARKED_OWNER;

/// A lease owner token: `<instance>/<worker>`, unique per worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner(String);

impl Owner {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn holds(&self, doc: &TransferDoc) -> bool {
        doc.lease_owner.as_deref() == Some(self.0.as_str())
    }
}

/// A transfer whose lease this worker holds (or held: see [`Leases::left`]), with the
/// version it last read or wrote.
#[derive(Debug, Clone)]
pub struct Leased {
    pub doc: TransferDoc,
    pub version: Version,
    owner: Owner,
    /// When this worker must stop acting on the transfer (boot time).
    deadline: BootTime,
    /// The clock epoch the lease was timed in: a wall-clock jump since then fences it.
    epoch: u64,
}

impl Leased {
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    pub fn deadline(&self) -> BootTime {
        self.deadline
    }

    pub fn id(&self) -> &str {
        &self.doc.transaction_id
    }
}

/// How a claiming write is sent.
#[derive(Debug, Clone, Copy)]
pub enum ClaimWrite {
    /// The transfer is new: create it (`op_type=create`).
    Create,
    /// Replace the transfer read at this version.
    ReplaceAt(Version),
}

/// What a claim came to.
#[derive(Debug)]
pub enum Claim {
    /// The write was applied (acknowledged, or proven by our token): the lease is ours.
    Won(Leased),
    /// Someone else wrote first. The transfer as it is now, when the claim read it.
    Lost(Option<Versioned<TransferDoc>>),
}

/// What re-reading a held transfer found.
#[derive(Debug)]
pub enum Reread {
    /// Still ours; `leased` now carries the document as read (a cancel keeps a live holder's
    /// lease and only changes the state). The deadline is unchanged: we did not write.
    StillHeld,
    /// Someone finished it.
    Terminal(TransferState),
    /// Another worker holds it, or nobody does: ours ran out and was taken or released.
    Lost,
    NotFound,
}

/// The lease's timers.
#[derive(Debug, Clone, Copy)]
pub struct LeaseTimes {
    /// How long a lease lasts after each write that grants or renews it.
    pub duration: Duration,
    /// Clock skew tolerated between instances (see the module doc).
    pub skew_margin: Duration,
    /// The longest one store request may take: a holder retries a write only while its
    /// lease has room for one more.
    pub request_timeout: Duration,
    /// Attempts of one holder's request that fails with a retryable error.
    pub attempts: u32,
}

/// Attempts of a claiming write (create, takeover, cancel) that fails with a retryable error.
const CLAIM_ATTEMPTS: u32 = 3;

/// Grants, renews, releases and checks leases, and performs every transfer write.
pub struct Leases {
    times: LeaseTimes,
    clock: DynClock,
    docs: Documents,
    metrics: Arc<Metrics>,
    /// This process's name in owner tokens.
    instance: String,
    /// The terminal writes this process has numbered ([`Leases::seal`]).
    sealed: AtomicU64,
    /// Bumped when the wall clock jumps: leases granted in an earlier epoch are over.
    epoch: AtomicU64,
    jumps: JumpDetector,
}

impl Leases {
    pub fn new(times: LeaseTimes, clock: DynClock, docs: Documents, metrics: Arc<Metrics>) -> Self {
        let instance = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        Self {
            times,
            clock,
            docs,
            metrics,
            instance,
            sealed: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            // Half the margin: a step smaller than that is within what the margin absorbs.
            jumps: JumpDetector::new(times.skew_margin / 2),
        }
    }

    /// The current clock epoch, after checking the wall clock for a jump. A jump fences
    /// every lease this instance holds: each holder must renew (a conditional write, which
    /// fails if anyone else took the transfer) before its next step, and the renewal stamps
    /// an expiry read from the wall clock as it is now.
    fn epoch(&self) -> u64 {
        if let Some(jump_millis) = self.jumps.check(self.clock.as_ref()) {
            self.metrics.clock_jumps_total.inc();
            warn!(
                jump_millis,
                "the wall clock jumped; every lease of this instance must be renewed"
            );
            return self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        }
        self.epoch.load(Ordering::SeqCst)
    }

    /// This process's name in owner tokens and in `settled_by`.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Releases the lease of a transfer about to be written terminal and numbers the write
    /// (`TransferDoc::settled_by`). A write sent again keeps its number; a number whose write
    /// never lands is simply never delivered by the fast path.
    fn seal(&self, next: &mut TransferDoc) {
        release(next);
        let n = self.sealed.fetch_add(1, Ordering::Relaxed) + 1;
        next.settled_by = Some(format!("{}/{n}", self.instance));
    }

    /// A fresh owner token for one worker.
    pub fn new_owner(&self) -> Owner {
        Owner(format!(
            "{}/{}",
            self.instance,
            uuid::Uuid::new_v4().simple()
        ))
    }

    /// Whether a transfer's lease may still be held by someone: it names an owner and its
    /// expiry plus the skew margin is not yet past on this host's wall clock.
    pub fn may_be_live(&self, doc: &TransferDoc) -> bool {
        let margin = self.times.skew_margin.as_millis() as i64;
        let now = self.clock.wall_millis();
        doc.lease_owner.is_some()
            && doc
                .lease_expires_at
                .is_some_and(|expires| expires.millis() + margin > now)
    }

    /// Whether `doc` is a parked hold: its lease belongs to no worker, so a capture or a
    /// cancel may claim it at once.
    pub fn is_parked(doc: &TransferDoc) -> bool {
        doc.lease_owner.as_deref() == Some(PARKED)
    }

    /// Parks an applied hold (`pending`, both accounts applied, no capture): its lease passes
    /// to the hold until `hold_expires_at`, conditionally on the version this worker has. `Ok(false)`:
    /// someone wrote it first (a capture or a cancel); read it again. After `Ok(true)` the
    /// worker must stop: the lease is no longer its own.
    pub async fn park(&self, leased: &mut Leased) -> StoreResult<bool> {
        let mut next = leased.doc.clone();
        debug_assert!(next.is_hold() && next.captured_amount.is_none());
        next.lease_owner = Some(PARKED.to_owned());
        next.lease_expires_at = next.hold_expires_at;
        let sent = self.sent();
        let now = self.clock.timestamp();
        stamp(&mut next, now);
        let outcome = self.docs.replace_if(&next, leased.version).await?;
        match self.restamp_if_late(&mut next, outcome, sent).await {
            WriteOutcome::Written(version) => {
                leased.doc = next;
                leased.version = version;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// What is left of a held lease before its deadline (`None`: it is over, or a jump of the
    /// wall clock fenced it).
    pub fn left(&self, leased: &Leased) -> Option<Duration> {
        if leased.epoch != self.epoch() {
            return None;
        }
        self.clock.boot_time().until(leased.deadline)
    }

    /// Whether a held lease has more than `need` left.
    pub fn has_left(&self, leased: &Leased, need: Duration) -> bool {
        self.left(leased).is_some_and(|left| left > need)
    }

    /// Takes the lease for a new worker by writing `doc` (with our lease in it) as `write`
    /// says, retrying retryable failures. A write whose answer was lost is recognised by our
    /// owner token in the document as read, and continues from that document.
    pub async fn claim(&self, mut doc: TransferDoc, write: ClaimWrite) -> StoreResult<Claim> {
        let owner = self.new_owner();
        // The deadline is timed from before the expiry is stamped, so a pause between the two
        // can only shorten the lease we believe we hold, never stretch it.
        let sent = self.sent();
        let now = self.clock.timestamp();
        self.grant(&mut doc, &owner, now);
        stamp(&mut doc, now);
        let written = retry(
            CLAIM_ATTEMPTS,
            || true,
            || async {
                match write {
                    ClaimWrite::Create => self.docs.create(&doc).await,
                    ClaimWrite::ReplaceAt(version) => self.docs.replace_if(&doc, version).await,
                }
            },
        )
        .await;
        if let Ok(outcome @ WriteOutcome::Written(_)) = written {
            let outcome = self.restamp_if_late(&mut doc, outcome, sent).await;
            let version = outcome.written().expect("still written");
            return Ok(Claim::Won(self.leased(doc, version, owner, sent)));
        }
        // Refused, or the answer is unknown (and a retry of an applied write is refused too):
        // the document as it is now says whether the write was ours.
        let current = self
            .docs
            .get_vouched::<TransferDoc>(&doc.transaction_id)
            .await?;
        match (current, written) {
            (Some(now), _) if owner.holds(&now.doc) => {
                Ok(Claim::Won(self.leased(now.doc, now.version, owner, sent)))
            }
            (_, Err(error)) => Err(error),
            (current, Ok(_)) => Ok(Claim::Lost(current)),
        }
    }

    /// The holder's state write: `next` (already moved along an arrow) with the lease renewed,
    /// or released when `next` is terminal, written conditionally on the held version.
    /// Retryable failures are retried while `go_on()` holds and the lease has room for one
    /// more request: a write whose outcome is unknown is simply sent again, and if the first
    /// one was applied the retry conflicts, which a read then shows to be our own write
    /// ([`Leases::written_after_all`]). `Ok(false)`: someone else wrote the transfer; read it
    /// again.
    pub async fn write(
        &self,
        leased: &mut Leased,
        mut next: TransferDoc,
        go_on: impl Fn() -> bool,
    ) -> StoreResult<bool> {
        // Only the holder writes, and a state only moves along an arrow of the post (or stays,
        // for a write that changes something else).
        debug_assert!(
            leased.owner.holds(&leased.doc),
            "{} written by {} while the document names {:?}",
            leased.doc.transaction_id,
            leased.owner.0,
            leased.doc.lease_owner
        );
        debug_assert!(
            next.transaction_state == leased.doc.transaction_state
                || leased
                    .doc
                    .transaction_state
                    .can_move_to(next.transaction_state),
            "{}: {} → {} is not an arrow",
            leased.doc.transaction_id,
            leased.doc.transaction_state,
            next.transaction_state
        );
        let sent = self.sent();
        let now = self.clock.timestamp();
        if next.transaction_state.is_terminal() {
            self.seal(&mut next);
        } else {
            let owner = leased.owner.clone();
            self.grant(&mut next, &owner, now);
        }
        stamp(&mut next, now);
        let version = leased.version;
        let room = || go_on() && self.has_left(leased, self.times.request_timeout);
        let outcome = retry(self.times.attempts, room, || {
            self.docs.replace_if(&next, version)
        })
        .await;
        let outcome = match outcome {
            Ok(WriteOutcome::Conflict) => self.written_after_all(&next).await,
            Ok(outcome) => outcome,
            Err(error) => {
                self.restamp_if_applied_unanswered(&next).await;
                return Err(error);
            }
        };
        let outcome = self.restamp_if_late(&mut next, outcome, sent).await;
        Ok(self.update(leased, next, outcome, sent))
    }

    /// After a state write answered with a conflict: whether it was applied after all. A
    /// retry of a write whose first attempt was applied unanswered conflicts with it, and so
    /// does a request an Elasticsearch coordinator retried after its primary had applied it
    /// (elastic/elasticsearch#9967). If the transfer now holds exactly `sent` (our stamp, our
    /// lease token, the state we wrote), no one else wrote it: it is our write, at the version
    /// read (vouched for, as a re-read is). Otherwise, or if the read fails, a conflict: the
    /// caller reads the transfer again and decides again, as before.
    async fn written_after_all(&self, sent: &TransferDoc) -> WriteOutcome {
        match self
            .docs
            .get_vouched::<TransferDoc>(&sent.transaction_id)
            .await
        {
            Ok(Some(found)) if found.doc == *sent => WriteOutcome::Written(found.version),
            _ => WriteOutcome::Conflict,
        }
    }

    /// Renews the lease without changing anything else. Conditional like every write, so it
    /// fails (`Ok(false)`) if anyone took the transfer over or changed it, and is therefore
    /// safe even when our lease already ran out.
    pub async fn renew(&self, leased: &mut Leased) -> StoreResult<bool> {
        let sent = self.sent();
        let now = self.clock.timestamp();
        let mut next = leased.doc.clone();
        let owner = leased.owner.clone();
        self.grant(&mut next, &owner, now);
        stamp(&mut next, now);
        let outcome = self.docs.replace_if(&next, leased.version).await?;
        let outcome = self.restamp_if_late(&mut next, outcome, sent).await;
        Ok(self.update(leased, next, outcome, sent))
    }

    /// Reads the held transfer again after a conflict; it stays held only if our token is
    /// still in it.
    pub async fn reread(&self, leased: &mut Leased) -> StoreResult<Reread> {
        let id = leased.id().to_owned();
        let read = retry(
            self.times.attempts,
            || true,
            || self.docs.get_vouched::<TransferDoc>(&id),
        );
        let Some(now) = read.await? else {
            return Ok(Reread::NotFound);
        };
        let state = now.doc.transaction_state;
        if state.is_terminal() {
            self.restamp_if_old(now).await;
            return Ok(Reread::Terminal(state));
        }
        if !leased.owner.holds(&now.doc) {
            return Ok(Reread::Lost);
        }
        leased.doc = now.doc;
        leased.version = now.version;
        Ok(Reread::StillHeld)
    }

    /// Gives the lease up (at shutdown), so another instance or the next start resumes the
    /// transfer at once instead of after the lease. Best effort: if it fails, the lease
    /// simply runs out.
    pub async fn release(&self, leased: &Leased) {
        let mut current = leased.clone();
        // A cancel may have written the transfer (keeping our lease) since we last did: on a
        // conflict, read it again and release it if it is still ours.
        for _ in 0..3 {
            if !current.owner.holds(&current.doc) || current.doc.transaction_state.is_terminal() {
                return;
            }
            let mut next = current.doc.clone();
            release(&mut next);
            stamp(&mut next, self.clock.timestamp());
            match self.docs.replace_if(&next, current.version).await {
                Ok(WriteOutcome::Conflict) => match self.docs.get::<TransferDoc>(leased.id()).await
                {
                    Ok(Some(now)) => {
                        current.doc = now.doc;
                        current.version = now.version;
                    }
                    _ => return,
                },
                // Released, gone, or the store is down.
                _ => return,
            }
        }
    }

    /// Marks a held transfer as needing a person (`why`), leaving its state as it is and
    /// releasing the lease: from then on nothing acts on it. `Ok(false)`: someone else wrote
    /// it first.
    pub async fn flag_for_attention(&self, leased: &mut Leased, why: String) -> StoreResult<bool> {
        let sent = self.sent();
        let mut next = leased.doc.clone();
        next.attention = Some(why);
        let now = self.clock.timestamp();
        stamp(&mut next, now);
        release(&mut next);
        let outcome = self.docs.replace_if(&next, leased.version).await?;
        let outcome = self.restamp_if_late(&mut next, outcome, sent).await;
        Ok(self.update(leased, next, outcome, sent))
    }

    /// A plain conditional write of a transfer that leaves its lease as it is (a cancel that
    /// keeps a live holder's lease), or clears it when the transfer is terminal.
    pub async fn write_keeping_lease(
        &self,
        mut next: TransferDoc,
        version: Version,
    ) -> StoreResult<WriteOutcome> {
        if next.transaction_state.is_terminal() {
            self.seal(&mut next);
        }
        let sent = self.sent();
        stamp(&mut next, self.clock.timestamp());
        let outcome = self.docs.replace_if(&next, version).await?;
        Ok(self.restamp_if_late(&mut next, outcome, sent).await)
    }

    /// The change feed's second line (`docs/design.md §11`): a write acknowledged later than
    /// `STORE_TIMEOUT` after it was sent, on the monotonic clock, may have become searchable
    /// after a feed reader's horizon passed its stamp. Writing the transfer once more with a
    /// fresh stamp and nothing else changed moves it past any horizon. Conditional on the
    /// version just written: if someone wrote the transfer since, their write moved it
    /// already. Returns the outcome to go on with (the re-stamp's version when it was
    /// written; `next` then carries the new stamp).
    async fn restamp_if_late(
        &self,
        next: &mut TransferDoc,
        outcome: WriteOutcome,
        sent: Sent,
    ) -> WriteOutcome {
        let WriteOutcome::Written(version) = outcome else {
            return outcome;
        };
        let took = self.clock.boot_time().saturating_duration_since(sent.at);
        if took <= self.times.request_timeout {
            return outcome;
        }
        let late_stamp = std::mem::replace(&mut next.modification_time, self.clock.timestamp());
        match self.docs.replace_if(next, version).await {
            Ok(restamped @ WriteOutcome::Written(_)) => {
                self.metrics.transfers_restamped_total.inc();
                restamped
            }
            _ => {
                next.modification_time = late_stamp;
                outcome
            }
        }
    }

    /// After a state write whose answer never came (every attempt failed), the write may have
    /// been applied without an answer, later than `STORE_TIMEOUT` after it was sent: if the
    /// transfer now carries exactly what was sent (its stamp, state and owner), it is
    /// re-stamped like any late write. A write applied after this read is the case
    /// `docs/design.md §11` names as not covered.
    async fn restamp_if_applied_unanswered(&self, sent: &TransferDoc) {
        let Ok(Some(found)) = self.docs.get::<TransferDoc>(&sent.transaction_id).await else {
            return;
        };
        let ours = found.doc.modification_time == sent.modification_time
            && found.doc.transaction_state == sent.transaction_state
            && found.doc.lease_owner == sent.lease_owner;
        if !ours {
            return;
        }
        let mut next = found.doc;
        next.modification_time = self.clock.timestamp();
        if let Ok(WriteOutcome::Written(_)) = self.docs.replace_if(&next, found.version).await {
            self.metrics.transfers_restamped_total.inc();
        }
    }

    /// A terminal transfer a holder finds after a write it got no answer for may be its own
    /// write, applied at a time nobody knows. If its stamp is older than `STORE_TIMEOUT` on
    /// this host's wall clock it is re-stamped (see [`Leases::restamp_if_late`]); a younger
    /// stamp was applied (it is read) within that bound of its stamp already.
    async fn restamp_if_old(&self, found: Versioned<TransferDoc>) {
        let stamped = found.doc.modification_time.millis();
        let now = self.clock.timestamp();
        if now.millis() - stamped <= self.times.request_timeout.as_millis() as i64 {
            return;
        }
        let mut next = found.doc;
        next.modification_time = now;
        if let Ok(WriteOutcome::Written(_)) = self.docs.replace_if(&next, found.version).await {
            self.metrics.transfers_restamped_total.inc();
        }
    }

    /// When a granting write is sent: the boot time its deadline counts from, and the clock
    /// epoch it is timed in.
    fn sent(&self) -> Sent {
        Sent {
            epoch: self.epoch(),
            at: self.clock.boot_time(),
        }
    }

    /// The deadline of a lease whose granting write was sent at `sent`.
    fn deadline(&self, sent: BootTime) -> BootTime {
        sent + self.times.duration.saturating_sub(self.times.skew_margin)
    }

    fn grant(&self, doc: &mut TransferDoc, owner: &Owner, now: Timestamp) {
        doc.lease_owner = Some(owner.0.clone());
        doc.lease_expires_at = Some(now.plus_millis(self.times.duration.as_millis() as i64));
    }

    fn leased(&self, doc: TransferDoc, version: Version, owner: Owner, sent: Sent) -> Leased {
        Leased {
            doc,
            version,
            owner,
            deadline: self.deadline(sent.at),
            epoch: sent.epoch,
        }
    }

    /// After a holder's write: on success the held copy becomes what was written, with the
    /// deadline the write earned.
    fn update(
        &self,
        leased: &mut Leased,
        next: TransferDoc,
        outcome: WriteOutcome,
        sent: Sent,
    ) -> bool {
        match outcome {
            WriteOutcome::Written(version) => {
                leased.doc = next;
                leased.version = version;
                leased.deadline = self.deadline(sent.at);
                leased.epoch = sent.epoch;
                true
            }
            _ => false,
        }
    }
}

/// When a granting write was sent.
#[derive(Debug, Clone, Copy)]
struct Sent {
    epoch: u64,
    at: BootTime,
}

/// Stamps a transfer about to be written: `modification_time` now (after the write's send
/// time was taken, see the module docs) and any transition its history lacks.
fn stamp(doc: &mut TransferDoc, now: Timestamp) {
    doc.modification_time = now;
    doc.note_transitions(now.millis());
}

/// A terminal transfer about to be written in one store transaction (`super::one_transaction`): its
/// lease released and its stamp taken. That write needs no lease timing: it is conditional,
/// in the transaction, on the version the holder last wrote.
pub(super) fn seal_terminal(doc: &mut TransferDoc, now: Timestamp) {
    debug_assert!(doc.transaction_state.is_terminal());
    release(doc);
    stamp(doc, now);
}

fn release(doc: &mut TransferDoc) {
    doc.lease_owner = None;
    doc.lease_expires_at = None;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use async_trait::async_trait;

    use super::*;
    use crate::metrics::Metrics;
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{DynStore, Store, StoreError, WriteOp};
    use crate::transfer::clock::{Clock, TestClock};

    const LEASE: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(1);

    /// A store that applies the next `lose` writes and then answers them with an error, as
    /// a timeout or a dropped connection would.
    struct LosingAnswers {
        inner: DynStore,
        lose: AtomicUsize,
    }

    #[async_trait]
    impl crate::store::Forwarding for LosingAnswers {
        fn inner(&self) -> &dyn Store {
            self.inner.as_ref()
        }

        async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
            let answer = self.inner.bulk(ops).await;
            let lost = self
                .lose
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if lost {
                return Err(StoreError::Unavailable("answer lost".into()));
            }
            answer
        }
    }

    struct Fixture {
        leases: Leases,
        store: Arc<LosingAnswers>,
        clock: Arc<TestClock>,
        _dir: tempfile::TempDir,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let inner: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
        let store = Arc::new(LosingAnswers {
            inner,
            lose: AtomicUsize::new(0),
        });
        let clock = TestClock::new();
        let times = LeaseTimes {
            duration: LEASE,
            skew_margin: MARGIN,
            request_timeout: Duration::from_secs(2),
            attempts: 3,
        };
        let leases = Leases::new(
            times,
            clock.clone(),
            Documents::new(store.clone()),
            Metrics::new(),
        );
        Fixture {
            leases,
            store,
            clock,
            _dir: dir,
        }
    }

    fn created(f: &Fixture, id: &str) -> TransferDoc {
        TransferDoc::created(id, "a", "b", 1, f.clock.timestamp())
    }

    async fn claim_new(f: &Fixture, id: &str) -> Leased {
        match f
            .leases
            .claim(created(f, id), ClaimWrite::Create)
            .await
            .unwrap()
        {
            Claim::Won(leased) => leased,
            Claim::Lost(other) => panic!("lost to {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_stamps_a_fresh_owner_and_an_expiry_one_lease_ahead() {
        let f = fixture();
        let leased = claim_new(&f, "t").await;
        assert_eq!(
            leased.doc.lease_owner.as_deref(),
            Some(leased.owner().as_str())
        );
        let expires = leased.doc.lease_expires_at.unwrap().millis();
        assert_eq!(expires, f.clock.wall_millis() + LEASE.as_millis() as i64);
        assert_ne!(
            f.leases.new_owner(),
            f.leases.new_owner(),
            "tokens are unique"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_holder_stops_a_margin_before_the_lease_ends() {
        let f = fixture();
        let leased = claim_new(&f, "t").await;
        assert_eq!(leased.deadline(), f.clock.boot_time() + LEASE - MARGIN);
        assert!(f
            .leases
            .has_left(&leased, LEASE - MARGIN - Duration::from_millis(1)));
        tokio::time::sleep(LEASE - MARGIN).await;
        assert_eq!(f.leases.left(&leased), None);
        assert!(!f.leases.has_left(&leased, Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn another_worker_may_take_over_only_a_margin_after_the_expiry() {
        let f = fixture();
        let leased = claim_new(&f, "t").await;
        assert!(f.leases.may_be_live(&leased.doc));
        tokio::time::sleep(LEASE + MARGIN - Duration::from_millis(1)).await;
        assert!(f.leases.may_be_live(&leased.doc), "still within the margin");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!f.leases.may_be_live(&leased.doc));
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_ahead_by_more_than_the_margin_sees_a_live_lease_as_free() {
        // The assumption of `docs/design.md §9`, shown: within twice the margin the holder's
        // deadline comes before any taker's view of the expiry; beyond it, it does not.
        let f = fixture();
        let leased = claim_new(&f, "t").await;
        let skewed = f.clock.skewed(2 * MARGIN.as_millis() as i64 + 2);
        let taker = Leases::new(
            f.leases.times,
            skewed,
            Documents::new(f.store.clone()),
            Metrics::new(),
        );
        let in_step = f.clock.skewed(2 * MARGIN.as_millis() as i64);
        let careful = Leases::new(
            f.leases.times,
            in_step,
            Documents::new(f.store.clone()),
            Metrics::new(),
        );
        tokio::time::sleep(LEASE - MARGIN - Duration::from_millis(1)).await;
        assert!(
            careful.may_be_live(&leased.doc),
            "a skew of twice the margin is tolerated"
        );
        assert!(
            f.leases.has_left(&leased, Duration::ZERO),
            "the holder still acts"
        );
        assert!(
            !taker.may_be_live(&leased.doc),
            "and the skewed taker may take over"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wall_clock_jump_fences_a_held_lease_until_it_is_renewed() {
        let f = fixture();
        let mut leased = claim_new(&f, "t").await;
        assert!(f.leases.has_left(&leased, Duration::from_secs(1)));
        f.clock.set_skew_millis(5_000);
        assert_eq!(f.leases.left(&leased), None, "fenced by the jump");
        assert_eq!(f.leases.metrics.clock_jumps_total.get(), 1);
        assert!(f.leases.renew(&mut leased).await.unwrap());
        assert!(
            f.leases.has_left(&leased, Duration::from_secs(1)),
            "renewed"
        );
        let expires = leased.doc.lease_expires_at.unwrap().millis();
        assert_eq!(expires, f.clock.wall_millis() + LEASE.as_millis() as i64);
    }

    #[tokio::test(start_paused = true)]
    async fn a_transfer_without_an_owner_or_an_expiry_is_free() {
        let f = fixture();
        let mut doc = created(&f, "t");
        assert!(!f.leases.may_be_live(&doc));
        doc.lease_expires_at = Some(f.clock.timestamp().plus_millis(60_000));
        assert!(!f.leases.may_be_live(&doc), "an expiry without an owner");
        doc.lease_owner = Some("w".into());
        doc.lease_expires_at = None;
        assert!(!f.leases.may_be_live(&doc), "an owner without an expiry");
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_loses_to_an_existing_transfer_and_returns_it() {
        let f = fixture();
        let first = claim_new(&f, "t").await;
        match f
            .leases
            .claim(created(&f, "t"), ClaimWrite::Create)
            .await
            .unwrap()
        {
            Claim::Lost(Some(existing)) => assert_eq!(existing.doc, first.doc),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_whose_answer_was_lost_is_won_by_its_owner_token() {
        let f = fixture();
        f.store.lose.store(1, Ordering::SeqCst);
        let leased = claim_new(&f, "t").await;
        assert_eq!(
            leased.doc.lease_owner.as_deref(),
            Some(leased.owner().as_str())
        );
        // A takeover applied but answered with an error, then refused on the retry.
        tokio::time::sleep(LEASE + MARGIN * 2).await;
        f.store.lose.store(1, Ordering::SeqCst);
        let taken = f
            .leases
            .claim(leased.doc.clone(), ClaimWrite::ReplaceAt(leased.version))
            .await
            .unwrap();
        let Claim::Won(taken) = taken else {
            panic!("{taken:?}")
        };
        assert_ne!(taken.owner(), leased.owner());
    }

    #[tokio::test(start_paused = true)]
    async fn a_state_write_renews_the_lease_and_a_terminal_one_releases_it() {
        let f = fixture();
        let mut leased = claim_new(&f, "t").await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut next = leased.doc.clone();
        next.transaction_state = TransferState::Pending;
        assert!(f.leases.write(&mut leased, next, || true).await.unwrap());
        assert_eq!(
            leased.deadline(),
            f.clock.boot_time() + LEASE - MARGIN,
            "renewed"
        );
        let mut terminating = leased.doc.clone();
        terminating.transaction_state = TransferState::Terminating;
        assert!(f
            .leases
            .write(&mut leased, terminating, || true)
            .await
            .unwrap());
        let mut done = leased.doc.clone();
        done.transaction_state = TransferState::RolledBack;
        assert!(f.leases.write(&mut leased, done, || true).await.unwrap());
        assert_eq!(
            (leased.doc.lease_owner, leased.doc.lease_expires_at),
            (None, None)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_fails_once_anyone_else_wrote_the_transfer() {
        let f = fixture();
        let mut stale = claim_new(&f, "t").await;
        let mut other = stale.clone();
        assert!(f.leases.renew(&mut other).await.unwrap());
        assert!(!f.leases.renew(&mut stale).await.unwrap());
        assert!(matches!(
            f.leases.reread(&mut stale).await.unwrap(),
            Reread::StillHeld
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reread_tells_lost_from_still_held() {
        let f = fixture();
        let mut leased = claim_new(&f, "t").await;
        tokio::time::sleep(LEASE + MARGIN * 2).await;
        let taken = f
            .leases
            .claim(leased.doc.clone(), ClaimWrite::ReplaceAt(leased.version))
            .await
            .unwrap();
        assert!(matches!(taken, Claim::Won(_)));
        assert!(matches!(
            f.leases.reread(&mut leased).await.unwrap(),
            Reread::Lost
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn release_clears_our_lease_so_another_worker_can_take_over_at_once() {
        let f = fixture();
        let leased = claim_new(&f, "t").await;
        f.leases.release(&leased).await;
        let now = f
            .leases
            .docs
            .get::<TransferDoc>("t")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (now.doc.lease_owner.clone(), now.doc.lease_expires_at),
            (None, None)
        );
        assert!(!f.leases.may_be_live(&now.doc));
    }
}
