//! The worker that drives one transfer through the protocol: read, decide (in
//! [`super::protocol`]), conditional write; on a conflict, read again and decide
//! again. One worker holds the transfer's lease at a time; it stops writing before the lease
//! runs out and stops at a step boundary when the process shuts down.

use std::sync::Arc;

use tokio::sync::watch;
use tracing::{debug, info, warn, Instrument};

use super::accounts::{Observed, StepRequest, StepResult};
use super::admission::Admitted;
use super::entries::{file, filed_seqs};
use super::feed::Feed;
use super::lease::{Leased, Reread};
use super::model::{RollbackReason, TransferDoc, TransferState};
use super::protocol::{
    self, currency_rule, deadline_transition, plan_for, AccountOp, CurrencyRule, Refusal, Side,
    Step,
};
use super::retry::backoff;
use super::settlement::{Resumed, Settlement};
use super::{step_span, transfer_span, Shared};
use crate::store::StoreError;

/// Back-offs of an apply refused because its account is full of young tombstones, before it
/// gives up (about 4 s in all).
const BUSY_RETRIES: u32 = 8;

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
    /// Its documents contradict each other; it was flagged for a person and is left alone.
    NeedsAttention(String),
    /// A hold is applied and parked, waiting for a capture, a cancel or its expiry; no
    /// worker drives it meanwhile (`docs/design.md §3`, "Holds").
    HoldWaiting,
}

/// Why a step did not complete.
pub(super) enum Interrupt {
    /// The transfer document changed under us (a cancel, a takeover): read it and decide again.
    Reread,
    /// The transfer must roll back for this reason, caused by this account's apply.
    Rollback(RollbackReason, String),
    Stop(StopReason),
}

impl From<StopReason> for Interrupt {
    fn from(reason: StopReason) -> Self {
        Interrupt::Stop(reason)
    }
}

impl From<StoreError> for StopReason {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(e) => {
                warn!(error = %e, "store unavailable; leaving the transfer to recovery");
                StopReason::StoreUnavailable
            }
            StoreError::Permanent(e) => StopReason::Permanent(e),
            denied @ StoreError::Denied { .. } => StopReason::Permanent(denied.to_string()),
        }
    }
}

impl From<StoreError> for Interrupt {
    fn from(error: StoreError) -> Self {
        Interrupt::Stop(error.into())
    }
}

/// The worker: drives each transfer it holds the lease of through the protocol's states
/// (here), after its settlement had its say (`super::settlement`: one store transaction
/// settles a `created` transfer where the store has them). Built once by the engine; the
/// API's operations start it on a new or cancelled transfer, recovery on one it took over.
pub struct Worker {
    pub(super) shared: Shared,
    /// How transfers are settled, chosen once by the engine ([`super::settlement::chosen`]).
    pub(super) settlement: Arc<dyn Settlement>,
    /// Bumped whenever a transfer this process drives reaches a terminal state; long-polls
    /// wait on it.
    pub(super) terminal_events: watch::Sender<u64>,
    /// Told of every terminal write (the webhooks' fast path).
    pub(super) feed: Arc<Feed>,
}

impl Worker {
    /// Wakes on every terminal state this process's workers reach (long-polls).
    pub(super) fn terminal_events(&self) -> watch::Receiver<u64> {
        self.terminal_events.subscribe()
    }

    /// Spawns a tracked task that drives `leased` (whose lease it holds) to the end. The
    /// permit of a new transfer (`admitted`) is given back when the task ends.
    pub(crate) fn spawn_driver(self: &Arc<Self>, leased: Leased, admitted: Option<Admitted>) {
        let worker = self.clone();
        let span = transfer_span(&leased.doc);
        self.shared.tasks.spawn(
            async move {
                let outcome = worker.drive(leased).await;
                drop(admitted);
                debug!(?outcome, "worker done");
            }
            .instrument(span),
        );
    }

    /// Drives a transfer whose lease `leased` holds until it is terminal or the worker must
    /// stop. Never panics on store answers; every exit leaves the transfer resumable.
    pub async fn drive(&self, mut leased: Leased) -> DriveOutcome {
        self.shared.metrics.transfers_in_flight.inc();
        let outcome = self.drive_inner(&mut leased).await;
        self.shared.metrics.transfers_in_flight.dec();
        // Shutting down: whatever stopped this worker, give the lease back so the next
        // process (or another instance) resumes the transfer at once.
        if matches!(outcome, DriveOutcome::Stopped(_)) && self.shared.shutdown.is_cancelled() {
            self.shared.leases.release(&leased).await;
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

    async fn drive_inner(&self, leased: &mut Leased) -> DriveOutcome {
        let mut rereads_without_change = 0u32;
        let mut next_interrupt: Option<Interrupt> = None;
        loop {
            let interrupt = match next_interrupt.take() {
                Some(interrupt) => interrupt,
                None => {
                    let state = leased.doc.transaction_state;
                    if state.is_terminal() {
                        return DriveOutcome::Terminal(state);
                    }
                    match self.run_state(leased).await {
                        Ok(()) => continue,
                        Err(interrupt) => interrupt,
                    }
                }
            };
            match interrupt {
                Interrupt::Stop(reason) => return DriveOutcome::Stopped(reason),
                Interrupt::Rollback(reason, account) => {
                    // An apply was refused (only in `pending`): rollback step 1, naming the
                    // account.
                    let result = self
                        .write_state_naming(
                            leased,
                            TransferState::Terminating,
                            Some(reason),
                            Some(account),
                        )
                        .await;
                    next_interrupt = result.err();
                }
                Interrupt::Reread => {
                    let before = leased.version;
                    if let Err(outcome) = self.reread(leased).await {
                        return outcome;
                    }
                    if leased.version == before {
                        rereads_without_change += 1;
                        if rereads_without_change > 3 {
                            return self.flag_contradiction(leased).await;
                        }
                    } else {
                        rereads_without_change = 0;
                    }
                }
            }
        }
    }

    /// The transfer is ours and unchanged, yet an account holds its settled tombstone: its
    /// documents contradict each other (only a lost acknowledged write can do that). Guessing
    /// which is right could move money twice or not at all, so it is flagged for a person.
    async fn flag_contradiction(&self, leased: &mut Leased) -> DriveOutcome {
        let why = format!(
            "{} but an account already holds its settled tombstone",
            leased.doc.transaction_state
        );
        tracing::error!(%why, "contradiction: the transfer needs attention and is left alone");
        match self
            .shared
            .leases
            .flag_for_attention(leased, why.clone())
            .await
        {
            Ok(true) => DriveOutcome::Stopped(StopReason::NeedsAttention(why)),
            // Someone else wrote it meanwhile: decide again from what it is now.
            Ok(false) => DriveOutcome::Stopped(StopReason::LeaseLost),
            Err(error) => DriveOutcome::Stopped(error.into()),
        }
    }

    /// Runs the remaining steps of the current state, ending with its state write.
    async fn run_state(&self, leased: &mut Leased) -> Result<(), Interrupt> {
        let now = self.shared.clock.wall_millis();
        let created = leased.doc.creation_time.millis();
        let timeout = self.shared.config.transfer_timeout.as_millis() as i64;
        if let Some((to, reason)) = deadline_transition(&leased.doc, created, now, timeout) {
            info!(to = %to, reason = reason.as_str(), "transfer ran out of time before committing; rolling back");
            return self.write_state(leased, to, Some(reason)).await;
        }
        // The settlement may finish a `created` transfer at once (in one transaction).
        match self.settlement.resume(self, leased).await? {
            Resumed::Settled => return Ok(()),
            Resumed::Changed => return Err(Interrupt::Reread),
            Resumed::TwoPhase => {}
        }
        // The first account's currency, as its apply (done now or before) read it: the other
        // accounts' applies, later in the same plan, must match it.
        let mut first_currency = None;
        // The marks of the entries the applies of this run found or made, by posting: what
        // the commit records.
        let mut marks = Vec::new();
        for step in plan_for(&leased.doc) {
            if self.shared.shutdown.is_cancelled() {
                return Err(StopReason::Shutdown.into());
            }
            match *step {
                Step::Account(op, side) => {
                    let index = match side {
                        Side::Source => 0,
                        Side::Destination => 1,
                    };
                    self.traced_posting_step(leased, op, index, (&mut first_currency, &mut marks))
                        .await?;
                }
                Step::EachAccount(op) => {
                    for index in 0..leased.doc.postings().len() {
                        if index > 0 && self.shared.shutdown.is_cancelled() {
                            return Err(StopReason::Shutdown.into());
                        }
                        self.traced_posting_step(
                            leased,
                            op,
                            index,
                            (&mut first_currency, &mut marks),
                        )
                        .await?;
                    }
                }
                Step::SetState(TransferState::Committed) => {
                    let marks = std::mem::take(&mut marks);
                    let span = step_span(TransferState::Committed.as_str(), None);
                    let written = self
                        .write_state_with(leased, TransferState::Committed, (None, None), marks)
                        .instrument(span.clone())
                        .await;
                    end_step(&span, &written, leased);
                    written?
                }
                Step::SetState(to) => {
                    let span = step_span(to.as_str(), None);
                    let written = self
                        .write_state(leased, to, None)
                        .instrument(span.clone())
                        .await;
                    end_step(&span, &written, leased);
                    written?
                }
                Step::Park => return self.park(leased).await,
            }
        }
        Ok(())
    }

    /// [`Worker::posting_step`] in a span of its own.
    async fn traced_posting_step(
        &self,
        leased: &mut Leased,
        op: AccountOp,
        index: usize,
        found: (&mut Option<Option<String>>, &mut Vec<String>),
    ) -> Result<(), Interrupt> {
        // Traced only: finding the posting's account costs a multi-leg transfer its postings.
        let span = if crate::trace_context::in_trace() {
            leased
                .doc
                .posting(index)
                .map_or_else(tracing::Span::none, |posting| {
                    step_span(op.step_name(), Some(posting.account))
                })
        } else {
            tracing::Span::none()
        };
        let done = self
            .posting_step(leased, op, index, found)
            .instrument(span.clone())
            .await;
        end_step(&span, &done, leased);
        done
    }

    /// `op` on the transfer's `index`-th account ([`TransferDoc::postings`]), with the
    /// currency rule of its place: the first account's apply records the currency the others
    /// must have in `first_currency`; every apply records its entry's mark in `marks`.
    async fn posting_step(
        &self,
        leased: &mut Leased,
        op: AccountOp,
        index: usize,
        (first_currency, marks): (&mut Option<Option<String>>, &mut Vec<String>),
    ) -> Result<(), Interrupt> {
        let (account, side, amount, settle_amount) = {
            let Some(p) = leased.doc.posting(index) else {
                return Err(
                    StopReason::Permanent(format!("no account {index} in its legs")).into(),
                );
            };
            (p.account.to_owned(), p.side, p.amount, p.settle_amount)
        };
        let currency = currency_rule(&leased.doc.currency, op, index, first_currency);
        let report = op == AccountOp::Apply && index == 0;
        // A remove settles the entry the commit counted (none recorded: a transfer committed
        // before marks, whose remove takes whatever entry there is).
        let expected = match op {
            AccountOp::Remove => leased.doc.applied_marks.get(index).cloned(),
            AccountOp::Apply | AccountOp::Undo => None,
        };
        // A settle or undo drops from the account what the written transfer filed.
        let filed = match op {
            AccountOp::Apply => Vec::new(),
            AccountOp::Remove | AccountOp::Undo => filed_seqs(&leased.doc.entries, &account),
        };
        let observed = self
            .account_step(
                leased,
                (op, expected, filed),
                &account,
                (side, amount, settle_amount),
                currency,
                report,
            )
            .await?;
        if report {
            *first_currency = Some(observed.currency);
        }
        if op == AccountOp::Apply {
            marks.resize(marks.len().max(index + 1), String::new());
            marks[index] = observed.mark.unwrap_or_default();
            // Filed by the transfer's next write, whichever it is (commit, park,
            // `terminating`): it is written from this document.
            file(&mut leased.doc.entries, observed.to_file);
        }
        Ok(())
    }

    /// Parks an applied hold until its capture, cancel or expiry, and stops. A conflict (a
    /// capture or cancel wrote it first) re-reads and decides again.
    async fn park(&self, leased: &mut Leased) -> Result<(), Interrupt> {
        if self.shared.leases.park(leased).await? {
            debug!(expires = ?leased.doc.hold_expires_at, "hold applied; waiting for its capture");
            self.terminal_events.send_modify(|n| *n += 1);
            Err(StopReason::HoldWaiting.into())
        } else {
            Err(Interrupt::Reread)
        }
    }

    /// One account step (core 2/3/5/6, rollback 2/3), merged with the other steps waiting
    /// for the same account (see [`super::accounts`]). `change` is the account's side, the
    /// amount applied and the amount that stays when it settles; `expected`, a remove's
    /// mark as the commit recorded it. Answers what the step saw (the account's currency
    /// when `report_currency`, an apply's mark).
    async fn account_step(
        &self,
        leased: &mut Leased,
        (op, expected, filed): (AccountOp, Option<String>, Vec<u64>),
        account_id: &str,
        (side, amount, settle_amount): (Side, i64, i64),
        currency: CurrencyRule,
        report_currency: bool,
    ) -> Result<Observed, Interrupt> {
        let mut busy = 0;
        for _ in 0..self.shared.config.max_conflicts {
            self.ensure_lease(leased).await?;
            let request = StepRequest {
                transfer_id: leased.doc.transaction_id.clone(),
                amount,
                settle_amount,
                side,
                op,
                currency: currency.clone(),
                report_currency,
                deadline: leased.deadline(),
                mark: expected.clone(),
                hold: leased.doc.is_hold(),
                filed: filed.clone(),
            };
            let (result, observed) = self
                .shared
                .accounts
                .run_observing(account_id, request)
                .await;
            if observed.undid_late_apply {
                self.shared.metrics.late_applies_compensated_total.inc();
                warn!(
                    account = %account_id,
                    side = side.as_str(),
                    amount,
                    "a late apply of this committed transfer was given back as it settled"
                );
            }
            match result {
                // Renew (or find out we lost it) and try again.
                StepResult::LeaseExpired => continue,
                // Wait for the account's oldest tombstones to age out; then give up (the
                // refusal rolls the transfer back with `account_busy`).
                StepResult::Refused(Refusal::AccountBusy) if busy < BUSY_RETRIES => {
                    busy += 1;
                    tokio::time::sleep(backoff(busy + 2)).await;
                }
                result => return step_outcome(result, op, side, account_id).map(|()| observed),
            }
        }
        Err(StopReason::Contention.into())
    }

    /// A conditional write of the transfer to `to` (renewing the lease, or releasing it when
    /// terminal). On a conflict the caller re-reads.
    async fn write_state(
        &self,
        leased: &mut Leased,
        to: TransferState,
        reason: Option<RollbackReason>,
    ) -> Result<(), Interrupt> {
        self.write_state_naming(leased, to, reason, None).await
    }

    /// [`Engine::write_state`], recording the account whose refused apply caused a rollback
    /// (`failed_account`).
    async fn write_state_naming(
        &self,
        leased: &mut Leased,
        to: TransferState,
        reason: Option<RollbackReason>,
        failed_account: Option<String>,
    ) -> Result<(), Interrupt> {
        self.write_state_with(leased, to, (reason, failed_account), Vec::new())
            .await
    }

    /// [`Engine::write_state_naming`], recording with a commit the marks of the entries it
    /// was decided on (`applied_marks`).
    async fn write_state_with(
        &self,
        leased: &mut Leased,
        to: TransferState,
        (reason, failed_account): (Option<RollbackReason>, Option<String>),
        applied_marks: Vec<String>,
    ) -> Result<(), Interrupt> {
        let from = leased.doc.transaction_state;
        let now = self.shared.clock.now();
        let Some(mut next) = protocol::transition(&leased.doc, to, reason, &now) else {
            return Err(StopReason::Permanent(format!("illegal transition {from} → {to}")).into());
        };
        if failed_account.is_some() {
            next.failed_account = failed_account;
        }
        if !applied_marks.is_empty() {
            next.applied_marks = applied_marks;
        }
        let going = || !self.shared.shutdown.is_cancelled();
        if !self.shared.leases.write(leased, next, going).await? {
            return Err(Interrupt::Reread);
        }
        self.record_transition(&leased.doc, (from, to), now.millis, None);
        Ok(())
    }

    /// Metrics and long-poll wake-ups for a state write that succeeded.
    ///
    /// `took`: how long the transfer took, when its taker timed it (a transfer created and
    /// settled by one transaction, in well under the millisecond the documents' timestamps
    /// resolve); otherwise from `creation_time` to `now_millis`.
    pub(crate) fn record_transition(
        &self,
        doc: &TransferDoc,
        (from, to): (TransferState, TransferState),
        now_millis: i64,
        took: Option<std::time::Duration>,
    ) {
        self.shared
            .metrics
            .transfer_state_transitions_total
            .with_label_values(&[from.as_str(), to.as_str()])
            .inc();
        info!(from = %from, to = %to, reason = doc.reason.map(|r| r.as_str()), "state");
        if doc.is_hold() {
            self.record_hold(doc, from, to);
        }
        if to.is_terminal() {
            self.shared
                .metrics
                .transfers_completed_total
                .with_label_values(&[to.as_str()])
                .inc();
            let secs = match took {
                Some(took) => Some(took.as_secs_f64()),
                None => {
                    let created = doc.creation_time.millis();
                    Some((now_millis - created).max(0) as f64 / 1000.0)
                }
            };
            if let Some(secs) = secs {
                self.shared.metrics.transfer_duration_seconds.observe(secs);
            }
            self.terminal_events.send_modify(|n| *n += 1);
            self.feed.announce_terminal(doc);
        }
    }

    /// `holds_completed_total`: a hold is captured when it commits, expired or cancelled when
    /// it starts to roll back for that reason (each arrow is taken once per transfer).
    fn record_hold(&self, doc: &TransferDoc, from: TransferState, to: TransferState) {
        let outcome = match (to, doc.reason) {
            (TransferState::Committed, _) => "captured",
            (TransferState::Terminating, Some(RollbackReason::Expired)) => "expired",
            (TransferState::Terminating, Some(RollbackReason::Cancelled)) => "cancelled",
            (TransferState::RolledBack, Some(RollbackReason::Expired))
                if from == TransferState::Created =>
            {
                "expired"
            }
            (TransferState::RolledBack, Some(RollbackReason::Cancelled))
                if from == TransferState::Created =>
            {
                "cancelled"
            }
            _ => return,
        };
        self.shared
            .metrics
            .holds_completed_total
            .with_label_values(&[outcome])
            .inc();
        if to == TransferState::Committed {
            // A capture waits for its commit (not a terminal state).
            self.terminal_events.send_modify(|n| *n += 1);
        }
    }

    /// Reads the transfer again after a conflict; keeps going only if we still hold it. If
    /// our deadline is near, the next step renews the lease by a conditional write, which
    /// fails if anyone else has written the transfer since this read.
    async fn reread(&self, leased: &mut Leased) -> Result<(), DriveOutcome> {
        match self.shared.leases.reread(leased).await {
            Ok(Reread::StillHeld) => Ok(()),
            Ok(Reread::Terminal(state)) => Err(DriveOutcome::Terminal(state)),
            Ok(Reread::Lost) => Err(DriveOutcome::Stopped(StopReason::LeaseLost)),
            Ok(Reread::NotFound) => Err(DriveOutcome::Stopped(StopReason::NotFound)),
            Err(error) => Err(DriveOutcome::Stopped(error.into())),
        }
    }

    /// Renews the lease unless it has room for a whole step (two requests).
    async fn ensure_lease(&self, leased: &mut Leased) -> Result<(), Interrupt> {
        if self
            .shared
            .leases
            .has_left(leased, self.shared.config.request_timeout * 2)
        {
            return Ok(());
        }
        if self.shared.leases.renew(leased).await? {
            Ok(())
        } else {
            Err(Interrupt::Reread)
        }
    }
}

/// What an account step's result means for the worker.
fn step_outcome(
    result: StepResult,
    op: AccountOp,
    side: Side,
    account_id: &str,
) -> Result<(), Interrupt> {
    match result {
        StepResult::Done | StepResult::AlreadyDone => {
            debug!(account = %account_id, ?op, side = side.as_str(), "account step done");
            Ok(())
        }
        StepResult::Missing => match op {
            AccountOp::Apply => Err(Interrupt::Rollback(
                RollbackReason::AccountNotFound,
                account_id.to_owned(),
            )),
            // Nothing was applied to an account that does not exist.
            AccountOp::Remove | AccountOp::Undo => Ok(()),
        },
        StepResult::Refused(Refusal::AlreadySettled) => {
            warn!(account = %account_id, "account has already settled this transfer; re-reading it");
            Err(Interrupt::Reread)
        }
        StepResult::Refused(refusal) => match (op, refusal.rollback_reason()) {
            (AccountOp::Apply, Some(reason)) => {
                Err(Interrupt::Rollback(reason, account_id.to_owned()))
            }
            _ => Err(
                StopReason::Permanent(format!("{op:?} on {account_id} refused: {refusal:?}"))
                    .into(),
            ),
        },
        StepResult::LeaseExpired | StepResult::Contention => Err(StopReason::Contention.into()),
        StepResult::Failed(error) => Err(error.into()),
    }
}

/// Records on a step's span the transfer's state after it and how it ended: `ok`, `conflict`
/// (the transfer changed under it: read again), `refused` (an account refused the apply: the
/// transfer rolls back), `unavailable` (the store kept failing) or `stopped`.
fn end_step(span: &tracing::Span, result: &Result<(), Interrupt>, leased: &Leased) {
    if span.is_disabled() {
        return;
    }
    span.record("state", leased.doc.transaction_state.as_str());
    let outcome = match result {
        Ok(()) => "ok",
        Err(Interrupt::Reread) => "conflict",
        Err(Interrupt::Rollback(..)) => "refused",
        Err(Interrupt::Stop(StopReason::StoreUnavailable)) => "unavailable",
        Err(Interrupt::Stop(_)) => "stopped",
    };
    span.record("outcome", outcome);
    if matches!(outcome, "unavailable" | "stopped") {
        span.record("otel.status_code", "ERROR");
    }
}
