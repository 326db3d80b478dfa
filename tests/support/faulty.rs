//! A fault-injecting [`Store`] wrapper (a test double around a real store).
//!
//! - **Jitter**: every request is delayed by a random time from a seeded RNG, which makes
//!   concurrent workers interleave differently for each seed.
//! - **Rules**: a request matching a [`Matcher`] gets a [`Fault`]: an error before it is
//!   applied, an error after it was applied (the outcome is unknown to the caller), a stall
//!   before or after it is applied, or a crash (the request never answers and the store goes
//!   dead: every later request fails, as if the process had died mid-request).
//! - **Transactions** of the store inside ([`Store::transact`]) are hidden unless
//!   [`FaultyStore::forward_transactions`] is called, so the fault suites' step boundaries
//!   (single-document writes) stay where they are; forwarded, a transaction is one request
//!   ([`Matcher::transactions`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use transfer_service::store::{
    Doc, DynStore, Index, Page, StaleQuery, Store, StoreError, StoreResult, TransferFilter,
    TxnOutcome, TxnWork, WriteOp, WriteOutcome,
};

/// Which requests a rule applies to.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    /// `"get"`, `"create"`, `"replace"`; `None`: any.
    pub op: Option<&'static str>,
    pub index: Option<Index>,
    /// Writes whose new source has this `transaction_state`.
    pub new_state: Option<&'static str>,
    /// Writes whose new source lists this many `pending_transactions` (on an account with
    /// nothing else in flight: 1 after an apply, 0 after a remove or an undo).
    pub pending_len: Option<usize>,
    /// Requests on this document id.
    pub id: Option<String>,
    /// Writes whose new source has this top-level field, with this value (`None`: any).
    pub field: Option<(&'static str, Option<Value>)>,
}

impl Matcher {
    /// Transactions ([`Store::transact`]), once forwarded.
    pub fn transactions() -> Self {
        Self {
            op: Some("transact"),
            ..Self::default()
        }
    }

    /// Reads (`get`) of documents in `index`.
    pub fn reads(index: Index) -> Self {
        Self::of("get", index)
    }

    /// Creates in `index`.
    pub fn creates(index: Index) -> Self {
        Self::of("create", index)
    }

    /// Conditional writes (`replace`) in `index`.
    pub fn writes(index: Index) -> Self {
        Self::of("replace", index)
    }

    /// Only requests on document `id`.
    pub fn of_doc(self, id: impl Into<String>) -> Self {
        Self {
            id: Some(id.into()),
            ..self
        }
    }

    /// Only writes whose new source has this `transaction_state`.
    pub fn moving_to(self, state: &'static str) -> Self {
        Self {
            new_state: Some(state),
            ..self
        }
    }

    /// Only writes whose new source has `field` (equal to `value`, if given).
    pub fn with_field(self, field: &'static str, value: Option<Value>) -> Self {
        Self {
            field: Some((field, value)),
            ..self
        }
    }

    /// Only writes whose new source lists this many `pending_transactions`.
    pub fn leaving_pending(self, count: usize) -> Self {
        Self {
            pending_len: Some(count),
            ..self
        }
    }

    fn of(op: &'static str, index: Index) -> Self {
        Self {
            op: Some(op),
            index: Some(index),
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Answer `Unavailable` without applying.
    FailBefore,
    /// Apply, then answer `Unavailable` (a timeout or a dropped connection: the caller cannot
    /// know it was applied).
    FailAfter,
    /// Apply, then answer as if the write had been refused: `409` (an Elasticsearch
    /// coordinator that retried a request its primary had already applied,
    /// elastic/elasticsearch#9967): `AlreadyExists` for a create, `Conflict` for a replace.
    ConflictAfter,
    /// Wait, then apply.
    StallBefore(Duration),
    /// Apply, then wait before answering.
    StallAfter(Duration),
    /// Apply or not (`applied`), then never answer; the store is dead from then on.
    Crash { applied: bool },
}

struct Rule {
    matcher: Matcher,
    fault: Fault,
    remaining: usize,
}

pub struct FaultyStore {
    inner: DynStore,
    rng: Mutex<StdRng>,
    max_jitter: Duration,
    rules: Mutex<Vec<Rule>>,
    dead: AtomicBool,
    /// Whether the inner store's transactions are offered.
    transactions: AtomicBool,
    /// Faults that fired.
    pub fired: AtomicU64,
}

impl FaultyStore {
    pub fn new(inner: DynStore, seed: u64, max_jitter: Duration) -> Arc<Self> {
        Arc::new(Self {
            inner,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            max_jitter,
            rules: Mutex::new(Vec::new()),
            dead: AtomicBool::new(false),
            transactions: AtomicBool::new(false),
            fired: AtomicU64::new(0),
        })
    }

    /// Adds a rule that fires on the next `times` matching requests.
    pub fn inject(&self, matcher: Matcher, fault: Fault, times: usize) {
        self.rules.lock().unwrap().push(Rule {
            matcher,
            fault,
            remaining: times,
        });
    }

    /// Offers the inner store's transactions (when it has them) from now on.
    pub fn forward_transactions(&self) {
        self.transactions.store(true, Ordering::SeqCst);
    }

    pub fn clear(&self) {
        self.rules.lock().unwrap().clear();
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    async fn jitter(&self) {
        if self.max_jitter.is_zero() {
            return;
        }
        let micros = {
            let mut rng = self.rng.lock().unwrap();
            rng.random_range(0..=self.max_jitter.as_micros() as u64)
        };
        tokio::time::sleep(Duration::from_micros(micros)).await;
    }

    fn take_fault(
        &self,
        op: &str,
        index: Index,
        id: &str,
        source: Option<&Value>,
    ) -> Option<Fault> {
        let mut rules = self.rules.lock().unwrap();
        for rule in rules.iter_mut() {
            if rule.remaining == 0 {
                continue;
            }
            let m = &rule.matcher;
            let state = source
                .and_then(|s| s.get("transaction_state"))
                .and_then(Value::as_str);
            let pending = source
                .and_then(|s| s.get("pending_transactions"))
                .and_then(Value::as_array)
                .map(Vec::len);
            let hit = m.op.is_none_or(|o| o == op)
                && m.index.is_none_or(|i| i == index)
                && m.id.as_deref().is_none_or(|i| i == id)
                && m.new_state.is_none_or(|s| Some(s) == state)
                && m.pending_len.is_none_or(|n| Some(n) == pending)
                && m.field.as_ref().is_none_or(|(name, want)| {
                    let found = source.and_then(|s| s.get(*name));
                    found.is_some() && want.as_ref().is_none_or(|w| Some(w) == found)
                });
            if hit {
                rule.remaining -= 1;
                self.fired.fetch_add(1, Ordering::SeqCst);
                return Some(rule.fault);
            }
        }
        None
    }

    fn check_alive(&self) -> StoreResult<()> {
        if self.is_dead() {
            Err(StoreError::Unavailable(
                "injected: the process is dead".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// Runs `request` under `fault`.
    async fn with_fault<T, Fut>(&self, fault: Option<Fault>, request: Fut) -> StoreResult<T>
    where
        Fut: std::future::Future<Output = StoreResult<T>>,
    {
        match fault {
            None => request.await,
            Some(Fault::FailBefore) => Err(StoreError::Unavailable("injected: before".into())),
            Some(Fault::FailAfter) => {
                let _ = request.await;
                Err(StoreError::Unavailable("injected: after".into()))
            }
            // Only writes can be refused after the fact (see `applied_then_refused`); a read
            // under this fault is simply answered.
            Some(Fault::ConflictAfter) => request.await,
            Some(Fault::StallBefore(d)) => {
                tokio::time::sleep(d).await;
                request.await
            }
            Some(Fault::StallAfter(d)) => {
                let result = request.await;
                tokio::time::sleep(d).await;
                result
            }
            Some(Fault::Crash { applied }) => {
                if applied {
                    let _ = request.await;
                }
                self.dead.store(true, Ordering::SeqCst);
                std::future::pending().await
            }
        }
    }
}

impl FaultyStore {
    /// Applies `ops`, then answers each one that was written with the refusal a retried
    /// request would get.
    async fn applied_then_refused(
        &self,
        ops: Vec<WriteOp>,
    ) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        let creates: Vec<bool> = ops
            .iter()
            .map(|op| matches!(op, WriteOp::Create { .. }))
            .collect();
        let results = self.inner.bulk(ops).await?;
        Ok(results
            .into_iter()
            .zip(creates)
            .map(|(result, create)| match result {
                Ok(WriteOutcome::Written(_)) if create => Ok(WriteOutcome::AlreadyExists),
                Ok(WriteOutcome::Written(_)) => Ok(WriteOutcome::Conflict),
                other => other,
            })
            .collect())
    }
}

#[async_trait]
impl transfer_service::store::Forwarding for FaultyStore {
    fn inner(&self) -> &dyn Store {
        self.inner.as_ref()
    }

    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        self.check_alive()?;
        self.jitter().await;
        let fault = self.take_fault("get", index, id, None);
        self.with_fault(fault, self.inner.get(index, id)).await
    }

    async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        self.check_alive()?;
        self.jitter().await;
        // Faults are per request: the first op that matches decides for the whole request.
        let fault = ops.iter().find_map(|op| {
            let (kind, source) = match op {
                WriteOp::Create { source, .. } => ("create", source),
                WriteOp::ReplaceIf { source, .. } => ("replace", source),
            };
            self.take_fault(kind, op.index(), op.id(), source.to_value().ok().as_ref())
        });
        if fault == Some(Fault::ConflictAfter) {
            return self.applied_then_refused(ops).await;
        }
        let result = self.with_fault(fault, self.inner.bulk(ops)).await;
        self.check_alive()?;
        result
    }

    fn transactions(&self) -> bool {
        self.transactions.load(Ordering::SeqCst) && self.inner.transactions()
    }

    async fn transact(&self, work: TxnWork) -> StoreResult<TxnOutcome> {
        if !Store::transactions(self) {
            return Err(StoreError::Permanent(
                "transactions are not forwarded".into(),
            ));
        }
        self.check_alive()?;
        self.jitter().await;
        let fault = self.take_fault("transact", Index::Transactions, "", None);
        let result = self.with_fault(fault, self.inner.transact(work)).await;
        self.check_alive()?;
        result
    }

    async fn find_stale(&self, query: &StaleQuery) -> StoreResult<Page> {
        self.check_alive()?;
        self.jitter().await;
        self.inner.find_stale(query).await
    }

    async fn list_transfers(&self, filter: &TransferFilter) -> StoreResult<Page> {
        self.check_alive()?;
        self.inner.list_transfers(filter).await
    }

    async fn account_entries(
        &self,
        query: &transfer_service::store::EntriesQuery,
    ) -> StoreResult<Vec<Doc>> {
        self.check_alive()?;
        self.inner.account_entries(query).await
    }

    async fn ready(&self) -> StoreResult<()> {
        self.check_alive()?;
        self.inner.ready().await
    }

    async fn changes(
        &self,
        query: &transfer_service::store::ChangesQuery,
    ) -> StoreResult<transfer_service::store::ChangesPage> {
        self.check_alive()?;
        self.inner.changes(query).await
    }
}

/// The writes at the step boundaries of the protocol, as the fault suites name them.
#[derive(Debug, Clone, Copy)]
pub enum StepWrite {
    Create,
    /// The transfer moving to this state.
    State(&'static str),
    /// A write of account `<case>-<name>` leaving this many pending ids.
    Account(&'static str, usize),
    /// The write that parks a hold.
    Park,
    /// The write that records a hold's capture.
    Capture,
    /// The one store transaction that settles a transfer where the store has them (the
    /// worker's faulty store forwards them for these cases only).
    Transaction,
}

/// Every fault each step boundary is tried with: an error before or after the write, a crash
/// before or after it, and a stall past a one-second lease.
pub const STEP_FAULTS: &[(&str, Fault)] = &[
    ("error before", Fault::FailBefore),
    ("error after", Fault::FailAfter),
    ("crash before", Fault::Crash { applied: false }),
    ("crash after", Fault::Crash { applied: true }),
    (
        "stall beyond the lease",
        Fault::StallBefore(Duration::from_millis(3000)),
    ),
];

impl StepWrite {
    /// The matcher that finds this write of case `case` (its accounts are `<case>-<name>`).
    pub fn matcher(self, case: &str) -> Matcher {
        match self {
            StepWrite::Create => Matcher::creates(Index::Transactions),
            StepWrite::State(state) => Matcher::writes(Index::Transactions).moving_to(state),
            StepWrite::Park => Matcher::writes(Index::Transactions).with_field(
                "lease_owner",
                Some(serde_json::json!(transfer_service::transfer::lease::PARKED)),
            ),
            StepWrite::Transaction => Matcher::transactions(),
            StepWrite::Capture => Matcher::writes(Index::Transactions)
                .moving_to("pending")
                .with_field("captured_amount", None),
            StepWrite::Account(account, pending) => Matcher {
                op: Some("replace"),
                index: Some(Index::Accounts),
                id: Some(format!("{case}-{account}")),
                pending_len: Some(pending),
                ..Matcher::default()
            },
        }
    }
}
