//! A [`Store`] wrapper (a test double around a real store) that holds every conditional
//! account write while its gate is closed, so transfers stay in flight for as long as a test
//! needs, with no sleeps: a driver reaches its first account step and waits there until the
//! test calls [`AccountGate::open`]. Everything else (reads, creates, transfer writes,
//! searches) passes through at once.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;
use transfer_service::store::{
    Doc, DynStore, Index, Page, ScanPage, StaleQuery, Store, StoreResult, TransferFilter, WriteOp,
    WriteOutcome,
};

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
impl Store for AccountGate {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        self.inner.get(index, id).await
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

    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page> {
        self.inner.find_stale(query).await
    }

    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page> {
        self.inner.list_transfers(filter).await
    }

    async fn ready(&self) -> StoreResult<()> {
        self.inner.ready().await
    }

    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<ScanPage> {
        self.inner.scan(index, after, limit).await
    }

    async fn changes(
        &self,
        query: &transfer_service::store::ChangesQuery,
    ) -> StoreResult<transfer_service::store::ChangesPage> {
        self.inner.changes(query).await
    }

    async fn refresh(&self) -> StoreResult<()> {
        self.inner.refresh().await
    }
}
