//! The recovery loop of Elastic's post, with leases: every `RECOVERY_INTERVAL` it pages through all
//! transfers in `created|pending|committed|terminating` last modified before
//! `now - RECOVERY_STALE_AFTER`, oldest first, and resumes each whose lease has run out at the
//! step its state calls for (the driver's plan is the post's recovery table: `created` → core
//! 1, `pending` → core 2, `committed` → core 5, `terminating` → rollback 2).
//!
//! A hold waiting for its capture is `pending` with a parked lease that runs until the hold
//! expires ([`super::lease::PARKED`]). Once it is older than `RECOVERY_STALE_AFTER` it is a
//! search hit on every sweep; the hit alone shows its lease is live, so it is skipped with no
//! read and no write (one decoded hit per waiting hold per sweep). Once expired (plus the
//! skew margin) it is taken over like any run-out lease, and the worker rolls it back with
//! `expired`.
//!
//! Search is near-real-time, so a hit is only a candidate: the decision is made on a realtime
//! GET, and the takeover is a conditional write of the lease, so of several instances (or a
//! live worker renewing) exactly one wins.

use std::ops::ControlFlow;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tracing::{info, warn, Instrument};

use super::documents::decode;
use super::driver::Worker;
use super::lease::{Claim, ClaimWrite, Leased, Leases};
use super::model::{TransferDoc, TransferState};
use super::Shared;
use crate::store::{Doc, DynStore, SortKey, StaleQuery, StoreResult};

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Stale candidates the search returned (over all pages).
    pub candidates: usize,
    /// Transfers this sweep took over and resumed.
    pub resumed: usize,
    /// Candidates it could not take over because of a store error (retried next sweep).
    pub errors: usize,
    /// Candidates flagged as needing a person, left alone.
    pub needs_attention: usize,
    /// Candidates that are holds waiting for their capture (not expired), left alone.
    pub waiting_holds: usize,
}

/// Most transfers recovery drives at once in this process.
const MAX_CONCURRENT_RECOVERIES: usize = 64;

/// Recovery and the sweep (`super::sweep`): finds what a crash or a late worker left and
/// hands it to the worker, or gives a late apply back. Built once by the engine.
pub struct Recovery {
    pub(super) shared: Shared,
    pub(super) store: DynStore,
    /// Drives what recovery takes over.
    pub(super) worker: Arc<Worker>,
}

impl Recovery {
    /// Starts the recovery loop: a sweep at once, then one every `RECOVERY_INTERVAL`, until
    /// shutdown. For one lease period after start it treats every in-flight transfer as a
    /// candidate (not only those stale for `RECOVERY_STALE_AFTER`), so what a crashed process
    /// left is resumed as soon as its leases run out rather than minutes later.
    pub fn spawn_loop(self: &Arc<Self>) {
        let recovery = self.clone();
        let started = self.shared.clock.boot_time();
        let permits = Arc::new(Semaphore::new(MAX_CONCURRENT_RECOVERIES));
        self.shared.tasks.spawn(
            async move {
                let startup =
                    recovery.shared.config.lease + recovery.shared.config.recovery_interval;
                let mut sweep_cursor: Option<String> = None;
                loop {
                    let now = recovery.shared.clock.wall_millis();
                    let since_start = recovery
                        .shared
                        .clock
                        .boot_time()
                        .saturating_duration_since(started);
                    let bound = if since_start < startup {
                        now
                    } else {
                        now - recovery.shared.config.recovery_stale_after.as_millis() as i64
                    };
                    match recovery.recover_once(bound, &permits).await {
                        Ok(report) if report.resumed > 0 => info!(?report, "recovery sweep"),
                        Ok(_) => {}
                        Err(error) => warn!(%error, "recovery sweep failed; next interval retries"),
                    }
                    let pages = recovery.shared.config.sweep_pages_per_tick;
                    if pages > 0 {
                        sweep_cursor = recovery.sweep_some(sweep_cursor.take(), pages).await.0;
                    }
                    tokio::select! {
                        _ = recovery.shared.shutdown.cancelled() => break,
                        _ = tokio::time::sleep(recovery.shared.config.recovery_interval) => {}
                    }
                }
            }
            .instrument(tracing::info_span!("recovery")),
        );
    }

    /// One sweep over every page of stale transfers modified before `modified_before`.
    pub async fn recover_once(
        self: &Arc<Self>,
        modified_before: i64,
        permits: &Arc<Semaphore>,
    ) -> StoreResult<RecoveryReport> {
        self.shared.metrics.recovery_runs_total.inc();
        let mut report = RecoveryReport::default();
        let mut after: Option<SortKey> = None;
        loop {
            let query = StaleQuery {
                states: TransferState::IN_FLIGHT
                    .iter()
                    .map(|s| s.as_str().to_owned())
                    .collect(),
                modified_before,
                after: after.clone(),
                limit: self.shared.config.recovery_page,
            };
            let page = self.store.find_stale(&query).await?;
            for doc in &page.docs {
                if self.recover(doc, permits, &mut report).await.is_break() {
                    return Ok(report);
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => {
                    // A complete sweep has seen every stale transfer that needs a person.
                    self.shared
                        .metrics
                        .transfers_needing_attention
                        .set(report.needs_attention as i64);
                    return Ok(report);
                }
            }
        }
    }

    /// Recovers one candidate of a sweep, counting what became of it: skipped (it needs a
    /// person, or it is a hold waiting for its capture), taken over and driven by a spawned
    /// worker, or left for the next sweep. `Break`: the engine is shutting down.
    async fn recover(
        self: &Arc<Self>,
        doc: &Doc,
        permits: &Arc<Semaphore>,
        report: &mut RecoveryReport,
    ) -> ControlFlow<()> {
        if self.shared.shutdown.is_cancelled() {
            return ControlFlow::Break(());
        }
        report.candidates += 1;
        let hit = decode::<TransferDoc>(doc.clone()).ok().map(|t| t.doc);
        if hit.as_ref().is_some_and(|t| t.attention.is_some()) {
            report.needs_attention += 1;
            return ControlFlow::Continue(());
        }
        // A hold waiting for its capture: its lease (the hold's own) runs until it expires,
        // so nothing to take over yet; skipped on the hit, with no read.
        if hit
            .as_ref()
            .is_some_and(|t| Leases::is_parked(t) && self.shared.leases.may_be_live(t))
        {
            report.waiting_holds += 1;
            return ControlFlow::Continue(());
        }
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return ControlFlow::Break(());
        };
        let leased = match self.take_over(&doc.id).await {
            Ok(Some(leased)) => leased,
            Ok(None) => return ControlFlow::Continue(()),
            Err(error) => {
                // One candidate's failure must not end the sweep for the others.
                warn!(transfer_id = %doc.id, %error, "cannot take the transfer over; next sweep retries");
                report.errors += 1;
                return ControlFlow::Continue(());
            }
        };
        report.resumed += 1;
        self.shared
            .metrics
            .transfers_recovered_total
            .with_label_values(&[leased.doc.transaction_state.as_str()])
            .inc();
        let worker = self.worker.clone();
        let span = super::transfer_span(&leased.doc);
        span.record("recovered", true);
        self.shared.tasks.spawn(
            async move {
                let _permit = permit;
                worker.drive(leased).await;
            }
            .instrument(span),
        );
        ControlFlow::Continue(())
    }

    /// Takes the lease of a transfer whose lease has run out (or was released), by a
    /// conditional write decided on a realtime GET. `None` if it is terminal, leased by a
    /// live worker, or someone else won the race. A takeover whose answer was lost but which
    /// was applied continues from the document as read (a cancel may have changed it since).
    pub async fn take_over(&self, id: &str) -> StoreResult<Option<Leased>> {
        let Some(current) = self.shared.docs.get::<TransferDoc>(id).await? else {
            return Ok(None);
        };
        if current.doc.transaction_state.is_terminal()
            || current.doc.attention.is_some()
            || self.shared.leases.may_be_live(&current.doc)
        {
            return Ok(None);
        }
        let mut next = current.doc;
        next.modification_time = self.shared.clock.timestamp();
        match self
            .shared
            .leases
            .claim(next, ClaimWrite::ReplaceAt(current.version))
            .await?
        {
            Claim::Won(leased) => Ok(Some(leased)),
            Claim::Lost(_) => Ok(None),
        }
    }
}
