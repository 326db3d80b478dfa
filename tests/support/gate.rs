//! A [`Store`] wrapper (a test double around a real store) that holds every conditional
//! account write while its gate is closed, so transfers stay in flight for as long as a test
//! needs, with no sleeps: a driver reaches its first account step and waits there until the
//! test calls [`AccountGate::open`]. Everything else (reads, creates, transfer writes,
//! searches) passes through at once.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;
use transfer_service::store::{DynStore, Index, Store, StoreResult, WriteOp, WriteOutcome};

pub struct AccountGate {
    inner: DynStore,
    open: watch::Sender<bool>,
}

impl AccountGate {
    /// `inner` behind a closed gate.
    pub fn closed(inner: DynStore) -> Arc<Self> {
        Arc::new(Self {
            inner,
            open: watch::channel(false).0,
        })
    }

    /// Lets every held and later account write through.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Holds account writes from now on (those already through are not undone).
    pub fn close(&self) {
        self.open.send_replace(false);
    }

    async fn pass(&self) {
        let mut open = self.open.subscribe();
        // The sender lives as long as `self`, so waiting cannot fail.
        let _ = open.wait_for(|open| *open).await;
    }
}

#[async_trait]
impl transfer_service::store::Forwarding for AccountGate {
    fn inner(&self) -> &dyn Store {
        self.inner.as_ref()
    }

    /// Account writes are held where `bulk` makes them: transactions are not offered, so
    /// that every transfer takes the two-phase path through the gate.
    fn transactions(&self) -> bool {
        false
    }

    async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        let holds = ops.iter().any(|op| {
            matches!(
                op,
                WriteOp::ReplaceIf {
                    index: Index::Accounts,
                    ..
                }
            )
        });
        if holds {
            self.pass().await;
        }
        self.inner.bulk(ops).await
    }
}
