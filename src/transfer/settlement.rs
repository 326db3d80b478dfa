//! How a transfer is settled, chosen once when the engine is built ([`chosen`]): by the
//! two-phase protocol of Elastic's post ([`super::two_phase`]), or in one store transaction
//! where the store has them ([`super::one_transaction`], `docs/design.md §3` "In one
//! transaction"). Each is a [`Settlement`]: how a new transfer is created, and how a
//! `created` transfer a worker holds is resumed. The driver only runs the two-phase protocol;
//! it asks the settlement first whether there is anything left to run.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::admission::Admitted;
use super::documents::{Documents, Versioned};
use super::driver::Worker;
use super::lease::Leased;
use super::model::TransferDoc;
use super::one_transaction::OneTransaction;
use super::two_phase::TwoPhase;
use super::EngineConfig;
use crate::store::StoreError;

/// What became of a new transfer's create.
#[derive(Debug)]
pub(crate) enum Creation {
    /// Persisted by this request (or by its own earlier attempt whose answer was lost): the
    /// transfer as its creator is shown it, settled or handed to a driver.
    New(TransferDoc),
    /// The id is taken by another request: the transfer stored under it (`None`: not
    /// readable yet).
    Taken(Option<Versioned<TransferDoc>>),
}

/// What resuming a `created` transfer a worker holds came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resumed {
    /// It is terminal: the worker's `Leased` carries it as written.
    Settled,
    /// Nothing was done: the two-phase protocol runs the transfer's steps.
    TwoPhase,
    /// The transfer is no longer as the worker holds it (a cancel, a takeover): read it
    /// again and decide again.
    Changed,
}

/// How transfers are settled: one implementation per engine, chosen by [`chosen`].
pub(crate) trait Settlement: Send + Sync {
    /// Persists `transfer` (a new one, as accepted: `created`, no lease) with its admission
    /// permit, which goes to whatever still works on the transfer once this returns, or is
    /// given back.
    fn create<'a>(
        &'a self,
        worker: &'a Arc<Worker>,
        transfer: TransferDoc,
        admitted: Admitted,
    ) -> BoxFuture<'a, Result<Creation, StoreError>>;

    /// Resumes the transfer `leased` holds before the worker runs the steps of its state.
    fn resume<'a>(
        &'a self,
        worker: &'a Worker,
        leased: &'a mut Leased,
    ) -> BoxFuture<'a, Result<Resumed, StoreError>>;

    /// Whether new transfers are settled in one store transaction.
    fn in_one_transaction(&self) -> bool;
}

/// The settlement of an engine with `config` over `docs`: in one transaction where the
/// store has transactions and `PROTOCOL` is `auto`, else two-phase. The one place that
/// chooses; a store's transactions are offered or not from its start.
pub(crate) fn chosen(config: &EngineConfig, docs: &Documents) -> Arc<dyn Settlement> {
    if config.one_transaction && docs.has_transactions() {
        Arc::new(OneTransaction::new(TwoPhase))
    } else {
        Arc::new(TwoPhase)
    }
}
