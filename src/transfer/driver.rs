//! The worker that drives one transfer through the protocol: read, decide (in
//! [`super::protocol`]), conditional write; on a conflict, read again and decide
//! again. One worker holds the transfer's lease at a time; it stops writing before the lease
//! runs out and stops at a step boundary when the process shuts down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::{debug, info, warn, Instrument};

use super::accounts::{StepRequest, StepResult};
use super::model::{RollbackReason, TransferDoc, TransferState};
use super::protocol::{self, plan, timeout_transition, AccountOp, Now, Refusal, Side, Step};
use super::retry::retry;
use super::Engine;
use crate::store::{format_millis, parse_millis, Index, StoreError, Version, WriteOutcome};

/// A transfer document with the version it was read or written at.
#[derive(Debug, Clone)]
pub struct Held {
    pub doc: TransferDoc,
    pub version: Version,
    /// When this worker must stop acting on the transfer: the moment the write that gave it
    /// the lease was *sent*, plus the lease, minus the clock-skew margin. Measured on the
    /// monotonic clock, so neither this host's wall clock nor the stored `lease_expires_at`
    /// (written with it) can stretch it. In the past for documents merely read.
    pub deadline: Instant,
}

/// How a worker ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriveOutcome {
    /// The transfer is terminal (whoever finished it).
    Terminal(TransferState),
    /// The worker stopped; the transfer is left to its lease holder or to recovery.
    Stopped(StopReason),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// Another worker holds the lease, or ours ran out.
    LeaseLost,
    /// The process is shutting down; the lease was released.
    Shutdown,
    /// The store kept failing with retryable errors.
    StoreUnavailable,
    /// Conditional writes on an account kept conflicting.
    Contention,
    /// Something only a person can fix (a corrupt document, a broken store request).
    Permanent(String),
    /// The transfer document does not exist.
    NotFound,
}

/// Why a step did not complete.
enum Interrupt {
    /// The transfer document changed under us (a cancel, a takeover): read it and decide again.
    Reread,
    /// The transfer must roll back for this reason.
    Rollback(RollbackReason),
    Stop(StopReason),
}

impl From<StopReason> for Interrupt {
    fn from(reason: StopReason) -> Self {
        Interrupt::Stop(reason)
    }
}

/// Parses a stored transfer document; a document we cannot read is a permanent problem.
pub fn parse_transfer(source: Value) -> Result<TransferDoc, StopReason> {
    serde_json::from_value(source)
        .map_err(|e| StopReason::Permanent(format!("unreadable transfer document: {e}")))
}

fn to_source<T: serde::Serialize>(doc: &T) -> Value {
    serde_json::to_value(doc).expect("documents serialize")
}

impl Engine {
    /// Spawns a tracked task that drives `held` (whose lease `owner` holds) to the end.
    pub fn spawn_driver(self: &Arc<Self>, owner: String, held: Held) {
        let engine = self.clone();
        let span = tracing::info_span!("transfer", transfer_id = %held.doc.transaction_id);
        self.tasks.spawn(
            async move {
                let outcome = engine.drive(&owner, held).await;
                debug!(?outcome, "worker done");
            }
            .instrument(span),
        );
    }

    /// Drives a transfer whose lease `owner` holds until it is terminal or the worker must
    /// stop. Never panics on store answers; every exit leaves the transfer resumable.
    pub async fn drive(&self, owner: &str, mut held: Held) -> DriveOutcome {
        self.metrics.transfers_in_flight.inc();
        let outcome = self.drive_inner(owner, &mut held).await;
        self.metrics.transfers_in_flight.dec();
        // Shutting down: whatever stopped this worker, give the lease back so the next
        // process (or another instance) resumes the transfer at once.
        if matches!(outcome, DriveOutcome::Stopped(_)) && self.shutdown.is_cancelled() {
            self.release_lease(owner, &held).await;
        }
        match &outcome {
            DriveOutcome::Stopped(StopReason::Permanent(why)) => {
                tracing::error!(%why, "transfer needs attention; left for recovery")
            }
            DriveOutcome::Stopped(reason) => debug!(?reason, "worker stopped"),
            DriveOutcome::Terminal(_) => {}
        }
        outcome
    }

    async fn drive_inner(&self, owner: &str, held: &mut Held) -> DriveOutcome {
        let mut rereads_without_change = 0u32;
        let mut next_interrupt: Option<Interrupt> = None;
        loop {
            let interrupt = match next_interrupt.take() {
                Some(interrupt) => interrupt,
                None => {
                    let state = held.doc.transaction_state;
                    if state.is_terminal() {
                        return DriveOutcome::Terminal(state);
                    }
                    match self.run_state(owner, held).await {
                        Ok(()) => continue,
                        Err(interrupt) => interrupt,
                    }
                }
            };
            match interrupt {
                Interrupt::Stop(reason) => return DriveOutcome::Stopped(reason),
                Interrupt::Rollback(reason) => {
                    // An apply was refused (only in `pending`): rollback step 1.
                    let result = self
                        .write_state(owner, held, TransferState::Terminating, Some(reason))
                        .await;
                    next_interrupt = result.err();
                }
                Interrupt::Reread => {
                    let before = held.version;
                    if let Err(outcome) = self.reload(owner, held).await {
                        return outcome;
                    }
                    if held.version == before {
                        rereads_without_change += 1;
                        if rereads_without_change > 3 {
                            return DriveOutcome::Stopped(StopReason::Permanent(
                                "an account says the transfer is settled but the transfer is not"
                                    .into(),
                            ));
                        }
                    } else {
                        rereads_without_change = 0;
                    }
                }
            }
        }
    }

    /// Runs the remaining steps of the current state, ending with its state write.
    async fn run_state(&self, owner: &str, held: &mut Held) -> Result<(), Interrupt> {
        let now = Now::system();
        let created = parse_millis(&held.doc.creation_time).unwrap_or(now.millis);
        let timeout = self.config.transfer_timeout.as_millis() as i64;
        if let Some(to) = timeout_transition(&held.doc, created, now.millis, timeout) {
            info!(to = %to, "transfer timed out before committing; rolling back");
            return self
                .write_state(owner, held, to, Some(RollbackReason::TimedOut))
                .await;
        }
        for step in plan(held.doc.transaction_state) {
            if self.shutdown.is_cancelled() {
                return Err(StopReason::Shutdown.into());
            }
            match *step {
                Step::Account(op, side) => self.account_step(owner, held, op, side).await?,
                Step::SetState(to) => self.write_state(owner, held, to, None).await?,
            }
        }
        Ok(())
    }

    /// One account step (core 2/3/5/6, rollback 2/3), merged with the other steps waiting
    /// for the same account (see [`super::accounts`]).
    async fn account_step(
        &self,
        owner: &str,
        held: &mut Held,
        op: AccountOp,
        side: Side,
    ) -> Result<(), Interrupt> {
        let account_id = side.account(&held.doc).to_owned();
        for _ in 0..self.config.max_conflicts {
            self.ensure_lease(owner, held).await?;
            let request = StepRequest {
                transfer_id: held.doc.transaction_id.clone(),
                amount: held.doc.amount,
                side,
                op,
                deadline: held.deadline,
            };
            match self.accounts.run(&account_id, request).await {
                StepResult::Done => {
                    debug!(account = %account_id, ?op, side = side.as_str(), "account step done");
                    return Ok(());
                }
                StepResult::Missing => {
                    return match op {
                        AccountOp::Apply => {
                            Err(Interrupt::Rollback(RollbackReason::AccountNotFound))
                        }
                        // Nothing was applied to an account that does not exist.
                        AccountOp::Remove | AccountOp::Undo => Ok(()),
                    };
                }
                StepResult::Refused(Refusal::AlreadySettled) => {
                    warn!(account = %account_id, "account has already settled this transfer; re-reading it");
                    return Err(Interrupt::Reread);
                }
                StepResult::Refused(refusal) => {
                    return match (op, refusal.rollback_reason()) {
                        (AccountOp::Apply, Some(reason)) => Err(Interrupt::Rollback(reason)),
                        _ => Err(StopReason::Permanent(format!(
                            "{op:?} on {account_id} refused: {refusal:?}"
                        ))
                        .into()),
                    };
                }
                // Renew (or find out we lost it) and try again.
                StepResult::LeaseExpired => continue,
                StepResult::Contention => return Err(StopReason::Contention.into()),
                StepResult::Failed(StoreError::Unavailable(e)) => {
                    warn!(error = %e, "store unavailable; leaving the transfer to recovery");
                    return Err(StopReason::StoreUnavailable.into());
                }
                StepResult::Failed(StoreError::Permanent(e)) => {
                    return Err(StopReason::Permanent(e).into())
                }
            }
        }
        Err(StopReason::Contention.into())
    }

    /// A conditional write of the transfer to `to` (renewing the lease, or releasing it when
    /// terminal). On a conflict the caller re-reads.
    async fn write_state(
        &self,
        owner: &str,
        held: &mut Held,
        to: TransferState,
        reason: Option<RollbackReason>,
    ) -> Result<(), Interrupt> {
        let from = held.doc.transaction_state;
        let now = Now::system();
        let expires = format_millis(now.millis + self.config.lease.as_millis() as i64);
        let Some(next) = protocol::transition(&held.doc, to, reason, &now, Some((owner, &expires)))
        else {
            return Err(StopReason::Permanent(format!("illegal transition {from} → {to}")).into());
        };
        let source = to_source(&next);
        let id = held.doc.transaction_id.clone();
        let version = held.version;
        let sent = Instant::now();
        let outcome = self
            .with_retries(held, || {
                self.store
                    .replace_if(Index::Transactions, &id, source.clone(), version)
            })
            .await?;
        match outcome {
            WriteOutcome::Written(version) => {
                self.record_transition(&next, from, to, now.millis);
                *held = Held {
                    doc: next,
                    version,
                    deadline: self.lease_deadline(sent),
                };
                Ok(())
            }
            _ => Err(Interrupt::Reread),
        }
    }

    /// Metrics and long-poll wake-ups for a state write that succeeded.
    pub(crate) fn record_transition(
        &self,
        doc: &TransferDoc,
        from: TransferState,
        to: TransferState,
        now_millis: i64,
    ) {
        self.metrics
            .transfer_state_transitions_total
            .with_label_values(&[from.as_str(), to.as_str()])
            .inc();
        info!(from = %from, to = %to, reason = doc.reason.map(|r| r.as_str()), "state");
        if to.is_terminal() {
            self.metrics
                .transfers_completed_total
                .with_label_values(&[to.as_str()])
                .inc();
            if let Some(created) = parse_millis(&doc.creation_time) {
                let secs = (now_millis - created).max(0) as f64 / 1000.0;
                self.metrics.transfer_duration_seconds.observe(secs);
            }
            self.terminal_events.send_modify(|n| *n += 1);
        }
    }

    /// Reads the transfer again after a conflict; keeps going only if we still hold it.
    async fn reload(&self, owner: &str, held: &mut Held) -> Result<(), DriveOutcome> {
        let id = held.doc.transaction_id.clone();
        let read = retry(
            self.config.max_store_attempts,
            || true,
            || self.store.get(Index::Transactions, &id),
        )
        .await;
        let doc = match read {
            Ok(Some(doc)) => doc,
            Ok(None) => return Err(DriveOutcome::Stopped(StopReason::NotFound)),
            Err(_) => return Err(DriveOutcome::Stopped(StopReason::StoreUnavailable)),
        };
        let transfer = parse_transfer(doc.source).map_err(DriveOutcome::Stopped)?;
        if transfer.transaction_state.is_terminal() {
            return Err(DriveOutcome::Terminal(transfer.transaction_state));
        }
        if transfer.lease_owner.as_deref() != Some(owner) {
            return Err(DriveOutcome::Stopped(StopReason::LeaseLost));
        }
        // Still ours (a cancel keeps a live holder's lease). Our deadline is unchanged: we did
        // not write. If it is near, the next step renews the lease by a conditional write,
        // which fails if anyone else has written the transfer since this read.
        *held = Held {
            doc: transfer,
            version: doc.version,
            deadline: held.deadline,
        };
        Ok(())
    }

    /// Whether our lease has more than `need` left before its deadline.
    fn lease_left(&self, held: &Held, need: Duration) -> bool {
        held.deadline
            .checked_duration_since(Instant::now())
            .is_some_and(|left| left > need)
    }

    /// The deadline of a lease whose write was sent at `sent`.
    pub(crate) fn lease_deadline(&self, sent: Instant) -> Instant {
        (sent + self.config.lease)
            .checked_sub(self.config.skew_margin)
            .unwrap_or(sent)
    }

    /// Renews the lease unless it has room for a whole step (two requests).
    async fn ensure_lease(&self, owner: &str, held: &mut Held) -> Result<(), Interrupt> {
        if self.lease_left(held, self.config.request_timeout * 2) {
            return Ok(());
        }
        let now = Now::system();
        let mut next = held.doc.clone();
        next.lease_owner = Some(owner.to_owned());
        next.lease_expires_at = Some(format_millis(
            now.millis + self.config.lease.as_millis() as i64,
        ));
        next.modification_time = now.text;
        let source = to_source(&next);
        let id = held.doc.transaction_id.clone();
        let version = held.version;
        let sent = Instant::now();
        // A renewal is a conditional write on the transfer: it fails if anyone took the
        // transfer over or changed it, so it is safe even when our lease already ran out.
        let outcome = self
            .store
            .replace_if(Index::Transactions, &id, source, version)
            .await;
        match outcome {
            Ok(WriteOutcome::Written(version)) => {
                *held = Held {
                    doc: next,
                    version,
                    deadline: self.lease_deadline(sent),
                };
                Ok(())
            }
            Ok(_) => Err(Interrupt::Reread),
            Err(StoreError::Unavailable(e)) => {
                warn!(error = %e, "cannot renew the lease; leaving the transfer to recovery");
                Err(StopReason::StoreUnavailable.into())
            }
            Err(StoreError::Permanent(e)) => Err(StopReason::Permanent(e).into()),
        }
    }

    /// Runs a store request, retrying retryable failures with backoff and jitter while the
    /// lease lasts. A write whose outcome is unknown is simply sent again: it is conditional,
    /// so if the first one was applied the second conflicts and the caller re-reads.
    async fn with_retries<T, F, Fut>(&self, held: &Held, request: F) -> Result<T, Interrupt>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let go_on =
            || !self.shutdown.is_cancelled() && self.lease_left(held, self.config.request_timeout);
        match retry(self.config.max_store_attempts, go_on, request).await {
            Ok(value) => Ok(value),
            Err(StoreError::Permanent(e)) => Err(StopReason::Permanent(e).into()),
            Err(StoreError::Unavailable(e)) => {
                warn!(error = %e, "store unavailable; leaving the transfer to recovery");
                Err(StopReason::StoreUnavailable.into())
            }
        }
    }

    /// Gives the lease up (shutdown), so another instance or the next start resumes at once.
    async fn release_lease(&self, owner: &str, held: &Held) {
        let mut current = held.clone();
        // A cancel may have written the transfer (keeping our lease) since we last did: on a
        // conflict, read it again and release it if it is still ours.
        for _ in 0..3 {
            if current.doc.lease_owner.as_deref() != Some(owner)
                || current.doc.transaction_state.is_terminal()
            {
                return;
            }
            let mut next = current.doc.clone();
            next.lease_owner = None;
            next.lease_expires_at = None;
            let id = &current.doc.transaction_id;
            match self
                .store
                .replace_if(Index::Transactions, id, to_source(&next), current.version)
                .await
            {
                Ok(WriteOutcome::Conflict) => match self.store.get(Index::Transactions, id).await {
                    Ok(Some(doc)) => match parse_transfer(doc.source) {
                        Ok(doc_now) => {
                            current = Held {
                                doc: doc_now,
                                version: doc.version,
                                deadline: current.deadline,
                            }
                        }
                        Err(_) => return,
                    },
                    _ => return,
                },
                // Released, gone, or the store is down (the lease then simply runs out).
                _ => return,
            }
        }
    }
}
