//! The two-phase settlement (`docs/design.md §3`, the post's protocol): a new transfer is
//! created `created` with a lease for a worker of this process, which the driver then takes
//! through the protocol's states. Resuming needs nothing of its own: the driver runs the
//! protocol.

use std::sync::Arc;

use futures_util::future::{self, BoxFuture, FutureExt};
use tracing::Instrument;

use super::admission::Admitted;
use super::driver::Worker;
use super::lease::{Claim, ClaimWrite, Leased};
use super::model::{TransferDoc, TransferState};
use super::settlement::{Creation, Resumed, Settlement};
use super::step_span;
use crate::store::StoreError;

/// Settles every transfer by the two-phase protocol.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TwoPhase;

impl TwoPhase {
    /// Creates `transfer` with its lease and spawns the driver that holds it (and the
    /// permit). A create whose answer was lost is still ours (the claim finds our token): it
    /// is new, and ours to drive.
    async fn create_claimed(
        worker: &Arc<Worker>,
        transfer: TransferDoc,
        admitted: Admitted,
    ) -> Result<Creation, StoreError> {
        // A state only moves forward from where every transfer starts.
        debug_assert_eq!(transfer.transaction_state, TransferState::Created);
        let shared = &worker.shared;
        let span = step_span("create", None);
        let claimed = shared
            .leases
            .claim(transfer, ClaimWrite::Create)
            .instrument(span.clone())
            .await;
        if !span.is_disabled() {
            let outcome = match &claimed {
                Ok(Claim::Won(_)) => "ok",
                Ok(Claim::Lost(_)) => "exists",
                Err(_) => "unavailable",
            };
            span.record("outcome", outcome);
            span.record("state", TransferState::Created.as_str());
        }
        match claimed? {
            Claim::Won(leased) => {
                shared.metrics.transfers_created_total.inc();
                let shown = leased.doc.clone();
                worker.spawn_driver(leased, Some(admitted));
                Ok(Creation::New(shown))
            }
            Claim::Lost(existing) => Ok(Creation::Taken(existing)),
        }
    }
}

impl Settlement for TwoPhase {
    fn create<'a>(
        &'a self,
        worker: &'a Arc<Worker>,
        transfer: TransferDoc,
        admitted: Admitted,
    ) -> BoxFuture<'a, Result<Creation, StoreError>> {
        Self::create_claimed(worker, transfer, admitted).boxed()
    }

    fn resume<'a>(
        &'a self,
        _worker: &'a Worker,
        _leased: &'a mut Leased,
    ) -> BoxFuture<'a, Result<Resumed, StoreError>> {
        future::ready(Ok(Resumed::TwoPhase)).boxed()
    }

    fn in_one_transaction(&self) -> bool {
        false
    }
}
