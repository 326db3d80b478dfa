//! The recovery loop of seed 003, with leases: every `RECOVERY_INTERVAL` it pages through all
//! transfers in `created|pending|committed|terminating` last modified before
//! `now - RECOVERY_STALE_AFTER`, oldest first, and resumes each whose lease has run out at the
//! step its state calls for (the driver's plan is the post's recovery table: `created` → core
//! 1, `pending` → core 2, `committed` → core 5, `terminating` → rollback 2).
//!
//! Search is near-real-time, so a hit is only a candidate: the decision is made on a realtime
//! GET, and the takeover is a conditional write of the lease, so of several instances (or a
//! live worker renewing) exactly one wins.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tracing::{info, warn, Instrument};

use super::driver::{parse_transfer, Held};
use super::model::{TransferDoc, TransferState};
use super::protocol::{now_millis, Now};
use super::Engine;
use crate::store::{format_millis, parse_millis, Index, SortKey, StaleQuery, StoreResult};

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Stale candidates the search returned (over all pages).
    pub candidates: usize,
    /// Transfers this sweep took over and resumed.
    pub resumed: usize,
    /// Candidates it could not take over because of a store error (retried next sweep).
    pub errors: usize,
}

/// Most transfers recovery drives at once in this process.
const MAX_CONCURRENT_RECOVERIES: usize = 64;

impl Engine {
    /// Starts the recovery loop: a sweep at once, then one every `RECOVERY_INTERVAL`, until
    /// shutdown. For one lease period after start it treats every in-flight transfer as a
    /// candidate (not only those stale for `RECOVERY_STALE_AFTER`), so what a crashed process
    /// left is resumed as soon as its leases run out rather than minutes later.
    pub fn spawn_recovery_loop(self: &Arc<Self>) {
        let engine = self.clone();
        let started = Instant::now();
        let permits = Arc::new(Semaphore::new(MAX_CONCURRENT_RECOVERIES));
        self.tasks.spawn(
            async move {
                let startup = engine.config.lease + engine.config.recovery_interval;
                loop {
                    let bound = if started.elapsed() < startup {
                        now_millis()
                    } else {
                        now_millis() - engine.config.recovery_stale_after.as_millis() as i64
                    };
                    match engine.recover_once(bound, &permits).await {
                        Ok(report) if report.resumed > 0 => info!(?report, "recovery sweep"),
                        Ok(_) => {}
                        Err(error) => warn!(%error, "recovery sweep failed; next interval retries"),
                    }
                    tokio::select! {
                        _ = engine.shutdown.cancelled() => break,
                        _ = tokio::time::sleep(engine.config.recovery_interval) => {}
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
        self.metrics.recovery_runs_total.inc();
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
                limit: self.config.recovery_page,
            };
            let page = self.store.find_stale(&query).await?;
            for doc in &page.docs {
                if self.shutdown.is_cancelled() {
                    return Ok(report);
                }
                report.candidates += 1;
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return Ok(report);
                };
                let taken = match self.take_over(&doc.id).await {
                    Ok(taken) => taken,
                    Err(error) => {
                        // One candidate's failure must not end the sweep for the others.
                        warn!(transfer_id = %doc.id, %error, "cannot take the transfer over; next sweep retries");
                        report.errors += 1;
                        continue;
                    }
                };
                if let Some((owner, held)) = taken {
                    report.resumed += 1;
                    self.metrics
                        .transfers_recovered_total
                        .with_label_values(&[held.doc.transaction_state.as_str()])
                        .inc();
                    let engine = self.clone();
                    let span = tracing::info_span!("transfer", transfer_id = %held.doc.transaction_id, recovered = true);
                    self.tasks.spawn(
                        async move {
                            let _permit = permit;
                            engine.drive(&owner, held).await;
                        }
                        .instrument(span),
                    );
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(report),
            }
        }
    }

    /// Takes the lease of a transfer whose lease has run out (or was released), by a
    /// conditional write decided on a realtime GET. `None` if it is terminal, leased by a
    /// live worker, or someone else won the race.
    pub async fn take_over(&self, id: &str) -> StoreResult<Option<(String, Held)>> {
        let Some(doc) = self.store.get(Index::Transactions, id).await? else {
            return Ok(None);
        };
        let transfer = match parse_transfer(doc.source) {
            Ok(t) => t,
            Err(reason) => {
                warn!(
                    transfer_id = id,
                    ?reason,
                    "cannot recover an unreadable transfer"
                );
                return Ok(None);
            }
        };
        if transfer.transaction_state.is_terminal() {
            return Ok(None);
        }
        let now = Now::system();
        if self.lease_may_be_live(&transfer, now.millis) {
            return Ok(None);
        }
        let owner = self.new_owner();
        let mut next = transfer;
        next.lease_owner = Some(owner.clone());
        next.lease_expires_at = Some(format_millis(
            now.millis + self.config.lease.as_millis() as i64,
        ));
        next.modification_time = now.text;
        let source = serde_json::to_value(&next).expect("documents serialize");
        let sent = Instant::now();
        let taken = match self
            .store
            .replace_if(Index::Transactions, id, source, doc.version)
            .await
        {
            Ok(outcome) => outcome.written().map(|version| (next, version)),
            // The outcome is unknown: if our lease is in the document now, the write was
            // applied and the transfer is ours to drive (otherwise it would sit until the
            // lease and the stale period ran out). Continue from the document as read, not
            // as we meant to write it: a cancel may have changed it since.
            Err(error) if error.is_retryable() => {
                let Some(now_doc) = self.store.get(Index::Transactions, id).await? else {
                    return Err(error);
                };
                match parse_transfer(now_doc.source) {
                    Ok(t) if t.lease_owner.as_deref() == Some(owner.as_str()) => {
                        Some((t, now_doc.version))
                    }
                    _ => return Err(error),
                }
            }
            Err(error) => return Err(error),
        };
        Ok(taken.map(|(doc, version)| {
            (
                owner,
                Held {
                    doc,
                    version,
                    deadline: self.lease_deadline(sent),
                },
            )
        }))
    }

    /// Whether a transfer's lease may still be held: it names an owner and its expiry, plus
    /// the clock-skew margin, is not yet past on this host's clock. Taking over only after
    /// the margin, while holders stop a margin before their own deadline, tolerates clock
    /// differences between instances of up to twice the margin.
    pub(crate) fn lease_may_be_live(&self, transfer: &TransferDoc, now_millis: i64) -> bool {
        let margin = self.config.skew_margin.as_millis() as i64;
        transfer.lease_owner.is_some()
            && transfer
                .lease_expires_at
                .as_deref()
                .and_then(parse_millis)
                .is_some_and(|expires| expires + margin > now_millis)
    }

    /// Waits until every driver and the recovery loop have stopped, at most `limit`.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }
}
