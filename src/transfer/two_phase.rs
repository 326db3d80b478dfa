//! The two-phase settlement (`docs/design.md §3`, the post's protocol): a new transfer is
//! created `created` with a lease for a worker of this process, which the driver then takes
//! through the protocol's states. Resuming needs nothing of its own: the driver runs the
//! protocol.

use std::sync::Arc;

use futures_util::future::{self, BoxFuture, FutureExt};

use super::admission::Admitted;
use super::driver::Worker;
use super::lease::{Claim, ClaimWrite, Leased};
use super::model::{TransferDoc, TransferState};
use super::settlement::{Creation, Resumed, Settlement};
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
        match shared.leases.claim(transfer, ClaimWrite::Create).await? {
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
