//! A [`Store`] wrapper that counts and times every request for `/metrics`
//! (`store_requests_total{op,outcome}`, `store_request_duration_seconds{op}`).

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use super::{
    Doc, DynStore, Index, Page, ScanPage, StaleQuery, Store, StoreError, StoreResult,
    TransferFilter, TxnOutcome, TxnWork, Version, WriteOp, WriteOutcome,
};
use crate::metrics::Metrics;

pub struct InstrumentedStore {
    inner: DynStore,
    metrics: Arc<Metrics>,
}

impl InstrumentedStore {
    pub fn new(inner: DynStore, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    fn record<T>(&self, op: &str, started: Instant, result: &StoreResult<T>) {
        self.metrics
            .store_request(op, error_outcome(result.as_ref().err()), started.elapsed());
    }
}

fn error_outcome(error: Option<&StoreError>) -> &'static str {
    match error {
        None => "ok",
        Some(StoreError::Unavailable(_)) => "unavailable",
        Some(StoreError::Permanent(_)) => "error",
        Some(StoreError::Denied { .. }) => "denied",
    }
}

fn write_outcome(result: &StoreResult<WriteOutcome>) -> &'static str {
    match result {
        Ok(WriteOutcome::Written(_)) => "ok",
        Ok(WriteOutcome::Conflict) => "conflict",
        Ok(WriteOutcome::AlreadyExists) => "exists",
        Ok(WriteOutcome::NotFound) => "not_found",
        Err(e) => error_outcome(Some(e)),
    }
}

#[async_trait]
impl Store for InstrumentedStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        let started = Instant::now();
        let result = self.inner.get(index, id).await;
        let outcome = match &result {
            Ok(None) => "not_found",
            other => error_outcome(other.as_ref().err()),
        };
        self.metrics
            .store_request("get", outcome, started.elapsed());
        result
    }

    async fn vouch(&self, index: Index, id: &str, read: Option<Version>) -> StoreResult<()> {
        let started = Instant::now();
        let result = self.inner.vouch(index, id, read).await;
        self.metrics.store_request(
            "vouch",
            error_outcome(result.as_ref().err()),
            started.elapsed(),
        );
        result
    }

    async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        let started = Instant::now();
        let kinds: Vec<&'static str> = ops
            .iter()
            .map(|op| {
                let (kind, index, source) = match op {
                    WriteOp::Create { index, source, .. } => ("create", index, source),
                    WriteOp::ReplaceIf { index, source, .. } => ("replace", index, source),
                };
                self.metrics
                    .store_bytes_sent_total
                    .with_label_values(&[index.name(), kind])
                    .inc_by(source.as_bytes().len() as u64);
                kind
            })
            .collect();
        let result = self.inner.bulk(ops).await;
        let elapsed = started.elapsed();
        match &result {
            Ok(items) => {
                // One series per item kind, so conflicts are visible per operation.
                for (kind, item) in kinds.iter().zip(items) {
                    self.metrics
                        .store_request(kind, write_outcome(item), elapsed);
                }
            }
            Err(e) => {
                for kind in kinds {
                    self.metrics
                        .store_request(kind, error_outcome(Some(e)), elapsed);
                }
            }
        }
        result
    }

    fn engine(&self) -> Option<super::elasticsearch::SearchEngine> {
        self.inner.engine()
    }

    fn transactions(&self) -> bool {
        self.inner.transactions()
    }

    async fn transact(&self, work: TxnWork) -> StoreResult<TxnOutcome> {
        let started = Instant::now();
        let result = self.inner.transact(work).await;
        let outcome = match &result {
            Ok(TxnOutcome::Committed(_)) => "ok",
            Ok(TxnOutcome::Refused) => "conflict",
            Err(e) => error_outcome(Some(e)),
        };
        self.metrics
            .store_request("transact", outcome, started.elapsed());
        result
    }

    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page> {
        let started = Instant::now();
        let result = self.inner.find_stale(query).await;
        self.record("find_stale", started, &result);
        result
    }

    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page> {
        let started = Instant::now();
        let result = self.inner.list_transfers(filter).await;
        self.record("list", started, &result);
        result
    }

    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<ScanPage> {
        let started = Instant::now();
        let result = self.inner.scan(index, after, limit).await;
        self.record("scan", started, &result);
        result
    }

    async fn ready(&self) -> StoreResult<()> {
        let started = Instant::now();
        let result = self.inner.ready().await;
        self.record("ready", started, &result);
        result
    }

    async fn changes(&self, query: &super::ChangesQuery) -> StoreResult<super::ChangesPage> {
        let started = Instant::now();
        let result = self.inner.changes(query).await;
        self.record("changes", started, &result);
        result
    }

    async fn identity(&self) -> StoreResult<Option<String>> {
        self.inner.identity().await
    }

    async fn refresh(&self) -> StoreResult<()> {
        let started = Instant::now();
        let result = self.inner.refresh().await;
        self.record("refresh", started, &result);
        result
    }
}
