//! The lease on a transfer: which worker may act on it, and until when. This module is the
//! only place that writes a transfer's lease fields (`lease_owner`, `lease_expires_at`) and
//! the only place that writes transfer documents at all.
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
//! - **A lost answer.** When a claiming write's answer is lost (a timeout, a dropped
//!   connection, Elasticsearch retrying a request the coordinator already applied), the
//!   claim reads the transfer: our owner token in it proves the write was applied, because no
//!   one else ever writes that token.

use std::time::Duration;

use tokio::time::Instant;

use super::clock::{DynClock, Now};
use super::documents::{Documents, Versioned};
use super::model::{TransferDoc, TransferState};
use super::retry::retry;
use crate::store::{format_millis, parse_millis, StoreResult, Version, WriteOutcome};

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
pub struct Held {
    pub doc: TransferDoc,
    pub version: Version,
    owner: Owner,
    /// When this worker must stop acting on the transfer (monotonic).
    deadline: Instant,
}

impl Held {
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    pub fn deadline(&self) -> Instant {
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
    Won(Held),
    /// Someone else wrote first. The transfer as it is now, when the claim read it.
    Lost(Option<Versioned<TransferDoc>>),
}

/// What re-reading a held transfer found.
#[derive(Debug)]
pub enum Reread {
    /// Still ours; `held` now carries the document as read (a cancel keeps a live holder's
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
    /// This process's name in owner tokens.
    instance: String,
}

impl Leases {
    pub fn new(times: LeaseTimes, clock: DynClock, docs: Documents) -> Self {
        let instance = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        Self {
            times,
            clock,
            docs,
            instance,
        }
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
                .as_deref()
                .and_then(parse_millis)
                .is_some_and(|expires| expires + margin > now)
    }

    /// What is left of a held lease before its deadline (`None`: it is over).
    pub fn left(&self, held: &Held) -> Option<Duration> {
        held.deadline
            .checked_duration_since(self.clock.instant())
            .filter(|left| !left.is_zero())
    }

    /// Whether a held lease has more than `need` left.
    pub fn has_left(&self, held: &Held, need: Duration) -> bool {
        self.left(held).is_some_and(|left| left > need)
    }

    /// Takes the lease for a new worker by writing `doc` (with our lease in it) as `write`
    /// says, retrying retryable failures. A write whose answer was lost is recognised by our
    /// owner token in the document as read, and continues from that document.
    pub async fn claim(&self, mut doc: TransferDoc, write: ClaimWrite) -> StoreResult<Claim> {
        let owner = self.new_owner();
        self.grant(&mut doc, &owner, &self.clock.now());
        let sent = self.clock.instant();
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
        if let Ok(WriteOutcome::Written(version)) = written {
            return Ok(Claim::Won(self.held(doc, version, owner, sent)));
        }
        // Refused, or the answer is unknown (and a retry of an applied write is refused too):
        // the document as it is now says whether the write was ours.
        let current = self.docs.get::<TransferDoc>(&doc.transaction_id).await?;
        match (current, written) {
            (Some(now), _) if owner.holds(&now.doc) => {
                Ok(Claim::Won(self.held(now.doc, now.version, owner, sent)))
            }
            (_, Err(error)) => Err(error),
            (current, Ok(_)) => Ok(Claim::Lost(current)),
        }
    }

    /// The holder's state write: `next` (already moved along an arrow) with the lease renewed,
    /// or released when `next` is terminal, written conditionally on the held version.
    /// Retryable failures are retried while `go_on()` holds and the lease has room for one
    /// more request: a write whose outcome is unknown is simply sent again, and if the first
    /// one was applied the retry conflicts. `Ok(false)`: someone else wrote the transfer (or
    /// we did, unacknowledged); read it again.
    pub async fn write(
        &self,
        held: &mut Held,
        mut next: TransferDoc,
        go_on: impl Fn() -> bool,
    ) -> StoreResult<bool> {
        if next.transaction_state.is_terminal() {
            release(&mut next);
        } else {
            let owner = held.owner.clone();
            self.grant(&mut next, &owner, &self.clock.now());
        }
        let sent = self.clock.instant();
        let version = held.version;
        let room = || go_on() && self.has_left(held, self.times.request_timeout);
        let outcome = retry(self.times.attempts, room, || {
            self.docs.replace_if(&next, version)
        })
        .await?;
        Ok(self.update(held, next, outcome, sent))
    }

    /// Renews the lease without changing anything else. Conditional like every write, so it
    /// fails (`Ok(false)`) if anyone took the transfer over or changed it, and is therefore
    /// safe even when our lease already ran out.
    pub async fn renew(&self, held: &mut Held) -> StoreResult<bool> {
        let now = self.clock.now();
        let mut next = held.doc.clone();
        let owner = held.owner.clone();
        self.grant(&mut next, &owner, &now);
        next.modification_time = now.text;
        let sent = self.clock.instant();
        let outcome = self.docs.replace_if(&next, held.version).await?;
        Ok(self.update(held, next, outcome, sent))
    }

    /// Reads the held transfer again after a conflict; it stays held only if our token is
    /// still in it.
    pub async fn reread(&self, held: &mut Held) -> StoreResult<Reread> {
        let id = held.id().to_owned();
        let read = retry(
            self.times.attempts,
            || true,
            || self.docs.get::<TransferDoc>(&id),
        );
        let Some(now) = read.await? else {
            return Ok(Reread::NotFound);
        };
        let state = now.doc.transaction_state;
        if state.is_terminal() {
            return Ok(Reread::Terminal(state));
        }
        if !held.owner.holds(&now.doc) {
            return Ok(Reread::Lost);
        }
        held.doc = now.doc;
        held.version = now.version;
        Ok(Reread::StillHeld)
    }

    /// Gives the lease up (at shutdown), so another instance or the next start resumes the
    /// transfer at once instead of after the lease. Best effort: if it fails, the lease
    /// simply runs out.
    pub async fn release(&self, held: &Held) {
        let mut current = held.clone();
        // A cancel may have written the transfer (keeping our lease) since we last did: on a
        // conflict, read it again and release it if it is still ours.
        for _ in 0..3 {
            if !current.owner.holds(&current.doc) || current.doc.transaction_state.is_terminal() {
                return;
            }
            let mut next = current.doc.clone();
            release(&mut next);
            match self.docs.replace_if(&next, current.version).await {
                Ok(WriteOutcome::Conflict) => match self.docs.get::<TransferDoc>(held.id()).await {
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

    /// A plain conditional write of a transfer that leaves its lease as it is (a cancel that
    /// keeps a live holder's lease), or clears it when the transfer is terminal.
    pub async fn write_keeping_lease(
        &self,
        mut next: TransferDoc,
        version: Version,
    ) -> StoreResult<WriteOutcome> {
        if next.transaction_state.is_terminal() {
            release(&mut next);
        }
        self.docs.replace_if(&next, version).await
    }

    /// The deadline of a lease whose granting write was sent at `sent`.
    fn deadline(&self, sent: Instant) -> Instant {
        (sent + self.times.duration)
            .checked_sub(self.times.skew_margin)
            .unwrap_or(sent)
    }

    fn grant(&self, doc: &mut TransferDoc, owner: &Owner, now: &Now) {
        doc.lease_owner = Some(owner.0.clone());
        doc.lease_expires_at = Some(format_millis(
            now.millis + self.times.duration.as_millis() as i64,
        ));
    }

    fn held(&self, doc: TransferDoc, version: Version, owner: Owner, sent: Instant) -> Held {
        Held {
            doc,
            version,
            owner,
            deadline: self.deadline(sent),
        }
    }

    /// After a holder's write: on success the held copy becomes what was written, with the
    /// deadline the write earned.
    fn update(
        &self,
        held: &mut Held,
        next: TransferDoc,
        outcome: WriteOutcome,
        sent: Instant,
    ) -> bool {
        match outcome {
            WriteOutcome::Written(version) => {
                held.doc = next;
                held.version = version;
                held.deadline = self.deadline(sent);
                true
            }
            _ => false,
        }
    }
}

fn release(doc: &mut TransferDoc) {
    doc.lease_owner = None;
    doc.lease_expires_at = None;
}
