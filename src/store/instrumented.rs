//! A [`Store`] wrapper that counts and times every request for `/metrics`
//! (`store_requests_total{op,outcome}`, `store_request_duration_seconds{op}`) and, when
//! traces are exported, makes each request of a traced operation a client span
//! (`db.system.name`, `db.operation.name`, `db.collection.name`, its outcome).
//!
//! The spans are made only inside a trace: a request made where no traced span runs (start-up,
//! a background loop between transfers) has no trace to join, and would start one of its own
//! for each request.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use tracing::Instrument;

use super::{
    Doc, DynStore, EntriesQuery, Index, Page, ScanPage, StaleQuery, Store, StoreError, StoreResult,
    TransferFilter, TxnOutcome, TxnWork, Version, WriteOp, WriteOutcome,
};
use crate::metrics::Metrics;
use crate::trace_context;

pub struct InstrumentedStore {
    inner: DynStore,
    metrics: Arc<Metrics>,
}

impl InstrumentedStore {
    pub fn new(inner: DynStore, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    /// Runs `request` (`op` on `index`) in its client span, then counts, times and records
    /// it by its error, if any.
    async fn measured<T>(
        &self,
        op: &'static str,
        index: Option<Index>,
        request: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let started = Instant::now();
        let span = self.span(op, index);
        let result = request.instrument(span.clone()).await;
        let outcome = error_outcome(result.as_ref().err());
        self.metrics.store_request(op, outcome, started.elapsed());
        finish(&span, outcome);
        result
    }

    /// The client span of one request (`op` on `index`), or a disabled span outside a trace.
    fn span(&self, op: &'static str, index: Option<Index>) -> tracing::Span {
        if !trace_context::in_trace() {
            return tracing::Span::none();
        }
        let system = match (self.inner.backend(), self.inner.engine()) {
            ("embedded", _) => "redb",
            (_, Some(super::elasticsearch::SearchEngine::OpenSearch { .. })) => "opensearch",
            (backend, _) => backend,
        };
        let collection = index.map(Index::name).unwrap_or("");
        tracing::debug_span!(
            target: trace_context::TARGET,
            "store",
            otel.name = %SpanName { op, collection },
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            db.system.name = system,
            db.operation.name = op,
            db.collection.name = collection,
            outcome = tracing::field::Empty,
        )
    }
}

/// A store request's span name: the operation and the index it is on (`get accounts`), or the
/// operation alone when it spans indices (`transact`, `bulk`).
struct SpanName<'a> {
    op: &'a str,
    collection: &'a str,
}

impl std::fmt::Display for SpanName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.collection {
            "" => f.write_str(self.op),
            collection => write!(f, "{} {collection}", self.op),
        }
    }
}

/// Records a request's outcome on its span; anything but a plain answer marks it an error.
fn finish(span: &tracing::Span, outcome: &str) {
    if span.is_disabled() {
        return;
    }
    span.record("outcome", outcome);
    if matches!(outcome, "unavailable" | "error" | "denied") {
        span.record("otel.status_code", "ERROR");
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
        let span = self.span("get", Some(index));
        let result = self.inner.get(index, id).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(None) => "not_found",
            other => error_outcome(other.as_ref().err()),
        };
        self.metrics
            .store_request("get", outcome, started.elapsed());
        finish(&span, outcome);
        result
    }

    async fn vouch(&self, index: Index, id: &str, read: Option<Version>) -> StoreResult<()> {
        self.measured("vouch", Some(index), self.inner.vouch(index, id, read))
            .await
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
        let span = match ops.first() {
            Some(WriteOp::Create { index, .. }) if ops.len() == 1 => {
                self.span("create", Some(*index))
            }
            Some(WriteOp::ReplaceIf { index, .. }) if ops.len() == 1 => {
                self.span("replace_if", Some(*index))
            }
            _ => self.span("bulk", None),
        };
        let result = self.inner.bulk(ops).instrument(span.clone()).await;
        let elapsed = started.elapsed();
        match &result {
            Ok(items) if items.len() == 1 => finish(&span, write_outcome(&items[0])),
            other => finish(&span, error_outcome(other.as_ref().err())),
        }
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
        let span = self.span("transact", None);
        let result = self.inner.transact(work).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(TxnOutcome::Committed(_)) => "ok",
            Ok(TxnOutcome::Refused) => "conflict",
            Err(e) => error_outcome(Some(e)),
        };
        self.metrics
            .store_request("transact", outcome, started.elapsed());
        finish(&span, outcome);
        result
    }

    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page> {
        self.measured(
            "find_stale",
            Some(Index::Transactions),
            self.inner.find_stale(query),
        )
        .await
    }

    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page> {
        self.measured(
            "list",
            Some(Index::Transactions),
            self.inner.list_transfers(filter),
        )
        .await
    }

    async fn account_entries(&self, query: &EntriesQuery) -> StoreResult<Vec<Doc>> {
        self.measured(
            "account_entries",
            Some(Index::Transactions),
            self.inner.account_entries(query),
        )
        .await
    }

    async fn scan(&self, index: Index, after: Option<&str>, limit: usize) -> StoreResult<ScanPage> {
        self.measured("scan", Some(index), self.inner.scan(index, after, limit))
            .await
    }

    async fn ready(&self) -> StoreResult<()> {
        self.measured("ready", None, self.inner.ready()).await
    }

    async fn changes(&self, query: &super::ChangesQuery) -> StoreResult<super::ChangesPage> {
        self.measured(
            "changes",
            Some(Index::Transactions),
            self.inner.changes(query),
        )
        .await
    }

    async fn identity(&self) -> StoreResult<Option<String>> {
        self.inner.identity().await
    }

    async fn refresh(&self) -> StoreResult<()> {
        self.measured("refresh", None, self.inner.refresh()).await
    }
}
