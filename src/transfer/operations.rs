//! The operations behind the HTTP API: accounts, idempotent transfer creation, cancel,
//! long-poll and listing. Requests never wait for the protocol: a created transfer is handed
//! to a spawned worker that already holds its lease.

use std::sync::Arc;
use std::time::Duration;

use super::admission::{Admitted, Overloaded};
use super::documents::{decode, Versioned};
use super::lease::{Claim, ClaimWrite, Leased, Leases};
use super::model::{AccountDoc, RollbackReason, TransferDoc, TransferState};
use super::protocol;
use super::requests::{NewAccount, NewTransfer};
use super::retry::retry;
use super::settlement::Creation;
use super::Engine;
use crate::store::{SortKey, StoreError, TransferFilter, WriteOutcome};
use crate::time::Timestamp;

/// Failures the API maps to answers.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// 409: the id exists with other data, or the transfer can no longer be cancelled.
    #[error("{0}")]
    Conflict(String),
    /// 404.
    #[error("not found")]
    NotFound,
    /// 422: a value only the stored transfer can judge (a capture above the held amount).
    #[error("{0}")]
    Invalid(String),
    /// 503 with `Retry-After`: admission control refused the create; nothing was written.
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
    /// 503 (retryable) or 500.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether a create made something new or replayed what exists.
#[derive(Debug, Clone)]
pub enum Created<T> {
    New(T),
    Replayed(T),
}

/// What a create finds stored under its id from another request: a replay of the same
/// request (`replay`), answered as it is now, or a conflict saying what may differ.
fn replay_or_conflict<T>(
    replay: bool,
    existing: T,
    what_differs: impl FnOnce() -> String,
) -> Result<Created<T>, ServiceError> {
    if replay {
        Ok(Created::Replayed(existing))
    } else {
        Err(ServiceError::Conflict(what_differs()))
    }
}

const CREATE_ATTEMPTS: u32 = 3;

/// How long a capture waits for the hold to commit before it answers with the transfer as
/// it is (a capture recorded on a `created` hold commits once its accounts are applied).
pub const CAPTURE_WAIT: Duration = Duration::from_secs(10);

/// What a capture does to a hold in the state it was read in.
enum CapturePlan {
    /// Nothing to write: an identical capture was recorded before.
    Answer,
    /// Record the capture (`captured_amount`).
    Record,
    /// The hold expired before any capture: write its rollback (reason `expired`) and refuse.
    Expire(TransferState),
}

/// What a cancel does to a transfer in the state it was read in.
enum CancelPlan {
    /// Nothing to write: answer with the transfer as it is.
    Answer,
    /// Write this state.
    Move(TransferState),
}

impl Engine {
    pub async fn create_account(
        &self,
        new: NewAccount,
    ) -> Result<Created<AccountDoc>, ServiceError> {
        let now = self.clock.now();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let doc = new.document(&now, token.clone());
        let created = retry(CREATE_ATTEMPTS, || true, || self.docs.create(&doc)).await?;
        if let WriteOutcome::Written(version) = created {
            self.accounts.remember_created(&doc, version);
            return Ok(Created::New(doc));
        }
        let existing = self.get_account(new.id()).await?.ok_or_else(|| {
            StoreError::Unavailable("account exists but cannot be read yet".into())
        })?;
        if existing.created_by.as_deref() == Some(token.as_str()) {
            // Our own create, whose answer was lost (the retry found it): it is new.
            return Ok(Created::New(existing));
        }
        replay_or_conflict(new.is_replay_of(&existing), existing, || {
            format!(
                "account {} exists with another opening balance, floor, currency or metadata",
                **new.id()
            )
        })
    }

    pub async fn get_account(&self, id: &str) -> Result<Option<AccountDoc>, ServiceError> {
        self.vouched(id).await
    }

    /// The document `id` as a client may be answered it: vouched for
    /// ([`super::documents::Documents::get_vouched`]).
    async fn vouched<T: super::documents::Document>(
        &self,
        id: &str,
    ) -> Result<Option<T>, ServiceError> {
        Ok(self.docs.get_vouched::<T>(id).await?.map(|v| v.doc))
    }

    /// Persists the transfer in `created` with a lease for a new worker, spawns that worker,
    /// and returns at once. The same id with the same request replays the transfer as it is
    /// now; with another request it is a conflict. Transfers are never deleted, so this holds
    /// forever. Admitted first: beyond `MAX_IN_FLIGHT` it is refused, having written nothing.
    pub async fn create_transfer(
        self: &Arc<Self>,
        new: NewTransfer,
    ) -> Result<Created<TransferDoc>, ServiceError> {
        let admitted = self.admit(1).await?;
        self.create_admitted(new, admitted).await
    }

    /// [`Engine::create_transfer`] with a permit already taken (a batch takes its permits
    /// together). The permit goes to the new transfer's driver; a replay, a conflict or a
    /// failure gives it back.
    pub async fn create_admitted(
        self: &Arc<Self>,
        new: NewTransfer,
        admitted: Admitted,
    ) -> Result<Created<TransferDoc>, ServiceError> {
        let doc = new.document(&self.clock.now(), self.config.hold_timeout);
        let settlement = &self.worker.settlement;
        let existing = match settlement.create(&self.worker, doc, admitted).await? {
            Creation::New(shown) => return Ok(Created::New(shown)),
            Creation::Taken(existing) => existing,
        };
        let existing = existing
            .ok_or_else(|| {
                StoreError::Unavailable("transfer exists but cannot be read yet".into())
            })?
            .doc;
        let replay = new.is_replay_of(&existing, self.config.hold_timeout);
        replay_or_conflict(replay, existing, || {
            format!(
                "transfer {} exists with another from, to, amount, legs, hold, hold_expires_in, currency or metadata",
                **new.id()
            )
        })
    }

    pub async fn get_transfer(&self, id: &str) -> Result<Option<TransferDoc>, ServiceError> {
        self.vouched(id).await
    }

    /// The transfer as soon as it is terminal, or as it is when `wait` ends. Wakes on this
    /// process's terminal writes and re-reads at least every 250 ms (another instance may be
    /// the one driving it).
    /// A hold answers as soon as it waits for its capture (or is terminal).
    pub async fn wait_transfer(
        &self,
        id: &str,
        wait: Duration,
    ) -> Result<Option<TransferDoc>, ServiceError> {
        self.wait_until(id, wait, |t| {
            t.transaction_state.is_terminal() || Leases::is_parked(t)
        })
        .await
    }

    /// The transfer as soon as `done` holds for it, or as it is when `wait` ends.
    async fn wait_until(
        &self,
        id: &str,
        wait: Duration,
        done: impl Fn(&TransferDoc) -> bool,
    ) -> Result<Option<TransferDoc>, ServiceError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut events = self.worker.terminal_events();
        loop {
            let current = self.get_transfer(id).await?;
            match &current {
                None => return Ok(None),
                Some(t) if done(t) => return Ok(current),
                Some(_) if tokio::time::Instant::now() >= deadline => return Ok(current),
                Some(_) => {}
            }
            let tick = (tokio::time::Instant::now() + Duration::from_millis(250)).min(deadline);
            tokio::select! {
                _ = events.changed() => {}
                _ = tokio::time::sleep_until(tick) => {}
                _ = self.shutdown.cancelled() => return Ok(current),
            }
        }
    }

    /// Cancels a transfer: `created` → `rolled-back`, `pending` → `terminating` (the lease
    /// holder, or a new worker if none is alive, then undoes the accounts). `terminating` and
    /// `rolled-back` answer as they are; `committed` and `finished` are a conflict.
    pub async fn cancel_transfer(self: &Arc<Self>, id: &str) -> Result<TransferDoc, ServiceError> {
        let mut read = self.docs.get_vouched::<TransferDoc>(id).await?;
        loop {
            let Some(current) = read else {
                return Err(ServiceError::NotFound);
            };
            let to = match cancel_plan(&current.doc)? {
                CancelPlan::Answer => return Ok(current.doc),
                CancelPlan::Move(to) => to,
            };
            match self.cancel_once(current, to).await? {
                Ok(done) => return Ok(done),
                // The transfer moved meanwhile: decide again on what it is now.
                Err(now) => read = now,
            }
        }
    }

    /// One attempt at moving `current` to `to` with reason `cancelled`. `Err` carries the
    /// transfer as it is now, when the attempt lost a race.
    async fn cancel_once(
        self: &Arc<Self>,
        current: Versioned<TransferDoc>,
        to: TransferState,
    ) -> Result<Result<TransferDoc, Option<Versioned<TransferDoc>>>, ServiceError> {
        self.rollback_for_client(current, to, RollbackReason::Cancelled)
            .await
    }

    /// One attempt at moving `current` to `to` (a rollback) with `reason`, for a client's
    /// request (a cancel, or a capture that found its hold expired).
    async fn rollback_for_client(
        self: &Arc<Self>,
        current: Versioned<TransferDoc>,
        to: TransferState,
        reason: RollbackReason,
    ) -> Result<Result<TransferDoc, Option<Versioned<TransferDoc>>>, ServiceError> {
        let from = current.doc.transaction_state;
        let now = self.clock.now();
        let Some(next) = protocol::transition(&current.doc, to, Some(reason), &now) else {
            // The plans only move along arrows: this is a bug, not a race.
            return Err(StoreError::Permanent(format!("cannot roll back: {from} → {to}")).into());
        };
        self.write_for_client(current, next, Some(to)).await
    }

    /// Writes `next` (the transfer read as `current`, changed by a client's request; `to`:
    /// the state it moves to, if any). A live holder keeps its lease (it sees the change at
    /// its next write); otherwise (no live worker, or a parked hold) the lease is claimed for
    /// a worker of our own, which drives the transfer on. `Err` carries the transfer as it is
    /// now, when the write lost a race.
    async fn write_for_client(
        self: &Arc<Self>,
        current: Versioned<TransferDoc>,
        next: TransferDoc,
        to: Option<TransferState>,
    ) -> Result<Result<TransferDoc, Option<Versioned<TransferDoc>>>, ServiceError> {
        let from = current.doc.transaction_state;
        // A state only moves along an arrow (or stays, for a capture's write).
        debug_assert!(
            to.is_none_or(|to| from.can_move_to(to))
                && next.transaction_state == to.unwrap_or(from),
            "{}: {from} → {} is not an arrow",
            next.transaction_id,
            next.transaction_state
        );
        let live = self.leases.may_be_live(&current.doc) && !Leases::is_parked(&current.doc);
        if live || to.is_some_and(TransferState::is_terminal) {
            let outcome = self
                .leases
                .write_keeping_lease(next.clone(), current.version)
                .await?;
            return Ok(match outcome {
                WriteOutcome::Written(_) => {
                    if let Some(to) = to {
                        self.worker.record_transition(
                            &next,
                            (from, to),
                            self.clock.wall_millis(),
                            None,
                        );
                    }
                    Ok(next)
                }
                _ => Err(self
                    .docs
                    .get_vouched::<TransferDoc>(&next.transaction_id)
                    .await?),
            });
        }
        match self
            .leases
            .claim(next, ClaimWrite::ReplaceAt(current.version))
            .await?
        {
            Claim::Won(leased) => Ok(Ok(self.start_claimed(leased, from, to))),
            Claim::Lost(now) => Ok(Err(now)),
        }
    }

    /// Records a client's write that took the lease and spawns the worker that drives the
    /// transfer on.
    fn start_claimed(
        self: &Arc<Self>,
        leased: Leased,
        from: TransferState,
        to: Option<TransferState>,
    ) -> TransferDoc {
        if let Some(to) = to {
            self.worker
                .record_transition(&leased.doc, (from, to), self.clock.wall_millis(), None);
        }
        let shown = leased.doc.clone();
        self.worker.spawn_driver(leased, None);
        shown
    }

    /// Captures a hold: records `amount` (default: all of it) as what moves, and waits up to
    /// [`CAPTURE_WAIT`] for the commit. An identical repeat answers the same; a capture of a
    /// transfer that is not a hold, rolls back, expired, or was captured with another amount is
    /// a conflict. Of a capture and a cancel (or the expiry) racing, exactly one wins: each is
    /// a conditional write of the transfer, and each refuses what the other wrote.
    pub async fn capture_transfer(
        self: &Arc<Self>,
        id: &str,
        amount: Option<i64>,
    ) -> Result<TransferDoc, ServiceError> {
        let mut read = self.docs.get_vouched::<TransferDoc>(id).await?;
        loop {
            let Some(current) = read else {
                return Err(ServiceError::NotFound);
            };
            let n = amount.unwrap_or(current.doc.amount());
            let lost = match capture_plan(&current.doc, n, self.clock.wall_millis())? {
                CapturePlan::Answer => break,
                CapturePlan::Record => {
                    let mut next = current.doc.clone();
                    next.captured_amount = Some(n);
                    next.modification_time = self.clock.timestamp();
                    match self.write_for_client(current, next, None).await? {
                        Ok(_) => break,
                        Err(now) => now,
                    }
                }
                CapturePlan::Expire(to) => {
                    let expires = current.doc.hold_expires_at.map(|at| at.to_string());
                    let expires = expires.unwrap_or_default();
                    match self
                        .rollback_for_client(current, to, RollbackReason::Expired)
                        .await?
                    {
                        Ok(_) => {
                            return Err(ServiceError::Conflict(format!(
                                "transfer {id} is a hold that expired at {expires}; it rolls back"
                            )))
                        }
                        Err(now) => now,
                    }
                }
            };
            // The transfer moved meanwhile (a cancel, an expiry, another capture, its worker):
            // decide again on what it is now.
            read = lost;
        }
        let settled = self
            .wait_until(id, CAPTURE_WAIT, |t| {
                t.transaction_state != TransferState::Created
                    && t.transaction_state != TransferState::Pending
            })
            .await?
            .ok_or(ServiceError::NotFound)?;
        match settled.transaction_state {
            TransferState::Terminating | TransferState::RolledBack => {
                Err(ServiceError::Conflict(format!(
                    "transfer {id} was captured but rolled back ({})",
                    settled.reason.map_or("no reason", |r| r.as_str())
                )))
            }
            _ => Ok(settled),
        }
    }

    /// One page of the listing, newest first, and the key to continue after.
    pub async fn list_transfers(
        &self,
        filter: TransferFilter,
    ) -> Result<(Vec<TransferDoc>, Option<SortKey>), ServiceError> {
        let page = self.store.list_transfers(&filter).await?;
        let items = page
            .docs
            .into_iter()
            .map(|doc| decode::<TransferDoc>(doc).map(|v| v.doc))
            .collect::<Result<_, _>>()?;
        Ok((items, page.next))
    }
}

/// What a cancel does to a transfer in its current state.
fn cancel_plan(doc: &TransferDoc) -> Result<CancelPlan, ServiceError> {
    let state = doc.transaction_state;
    if let Some(why) = &doc.attention {
        return Err(ServiceError::Conflict(format!(
            "transfer {} needs attention ({why}); it is left as it is for a person",
            doc.transaction_id
        )));
    }
    if let (Some(captured), TransferState::Created | TransferState::Pending) =
        (doc.captured_amount, state)
    {
        return Err(ServiceError::Conflict(format!(
            "transfer {} is a hold captured for {captured}; it commits and cannot be cancelled",
            doc.transaction_id
        )));
    }
    match state {
        TransferState::Created => Ok(CancelPlan::Move(TransferState::RolledBack)),
        TransferState::Pending => Ok(CancelPlan::Move(TransferState::Terminating)),
        TransferState::Terminating | TransferState::RolledBack => Ok(CancelPlan::Answer),
        TransferState::Committed | TransferState::Finished => Err(ServiceError::Conflict(format!(
            "transfer {} is {state}; a committed transfer cannot be cancelled",
            doc.transaction_id
        ))),
    }
}

/// What a capture of `n` units does to a transfer in its current state, at `now_millis`.
fn capture_plan(doc: &TransferDoc, n: i64, now_millis: i64) -> Result<CapturePlan, ServiceError> {
    let id = &doc.transaction_id;
    let state = doc.transaction_state;
    if let Some(why) = &doc.attention {
        return Err(ServiceError::Conflict(format!(
            "transfer {id} needs attention ({why}); it is left as it is for a person"
        )));
    }
    let Some(expires) = doc.hold_expires_at.map(Timestamp::millis) else {
        return Err(ServiceError::Conflict(format!(
            "transfer {id} is not a hold; only a hold can be captured"
        )));
    };
    if doc.is_multi_leg() && n != doc.amount() {
        return Err(ServiceError::Invalid(format!(
            "transfer {id} is a multi-leg hold: it is captured whole (send no `amount`, or \
             the sum of its legs, {})",
            doc.amount()
        )));
    }
    if n <= 0 || n > doc.amount() {
        return Err(ServiceError::Invalid(format!(
            "`amount` must be from 1 to the held amount {}",
            doc.amount()
        )));
    }
    match doc.captured_amount {
        Some(captured) if captured == n => return Ok(CapturePlan::Answer),
        Some(captured) => {
            return Err(ServiceError::Conflict(format!(
                "transfer {id} was captured for {captured}, not {n}"
            )))
        }
        None => {}
    }
    match state {
        TransferState::Created | TransferState::Pending if now_millis >= expires => Ok(
            CapturePlan::Expire(protocol::rollback_from(state).expect("created or pending")),
        ),
        TransferState::Created | TransferState::Pending => Ok(CapturePlan::Record),
        TransferState::Terminating | TransferState::RolledBack => {
            Err(ServiceError::Conflict(format!(
                "transfer {id} is {state} ({}); it can no longer be captured",
                doc.reason.map_or("no reason", |r| r.as_str())
            )))
        }
        TransferState::Committed | TransferState::Finished => Err(ServiceError::Conflict(format!(
            "transfer {id} is {state} without a capture; it cannot be captured"
        ))),
    }
}
