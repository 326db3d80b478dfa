//! Account steps, merged per account (`docs/design.md §6`).
//!
//! Every account step of every worker in this process goes through here. Steps waiting for
//! the same account are decided one after the other on one copy of the account and written
//! with **one** conditional write, instead of each worker reading, writing and conflicting
//! with the others. The version of the last write is remembered, so the next batch for a busy
//! account is written without reading it first; a conflict (another instance wrote it)
//! drops the remembered copy and the batch is read and decided again.
//!
//! # Self-fencing, per step
//! Each step carries the moment its worker's lease stops being safe to act on
//! (`lease_expires_at` minus the clock-skew margin). A step is decided only if the account
//! copy it is decided on was observed before that moment: the copy was read (or our own
//! write of it was acknowledged) at or before "now", and the step's deadline is after "now".
//! A worker that takes the transfer over can only act after that deadline, and it writes the
//! account when it settles or undoes the transfer, so the merged conditional write fails if
//! it raced ahead of us — the batch is then re-read, and the late step finds its deadline
//! passed. That is why a stall of any length cannot apply a transfer twice (see `transfer`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::clock::{BootTime, Clock, DynClock};
use super::documents::{Documents, Versioned};
use super::model::AccountDoc;
use super::protocol::{
    decide_account, AccountDecision, AccountOp, AccountStep, CurrencyRule, Refusal, Retention, Side,
};
use super::retry::{backoff, retry};
use crate::store::{StoreError, TxnOutcome, Version, WriteOutcome};

/// One account step of one transfer, owned.
#[derive(Debug, Clone)]
pub struct StepRequest {
    pub transfer_id: String,
    pub amount: i64,
    /// What a remove leaves on the balance (see [`AccountStep::settle_amount`]).
    pub settle_amount: i64,
    pub side: Side,
    pub op: AccountOp,
    /// What an apply needs of the account's currency.
    pub currency: CurrencyRule,
    /// Answer the account's currency once the step is done (the first account's apply: the
    /// other accounts' applies need it, [`CurrencyRule::for_destination`]).
    pub report_currency: bool,
    /// The worker's lease deadline (monotonic): after it, this step must not be decided.
    pub deadline: BootTime,
    /// A remove: the mark the commit recorded. An undo: the entry to give back, or `None`
    /// for any ([`AccountStep::mark`]). An apply: unused; each decision makes its own.
    pub mark: Option<String>,
    /// The transfer is a hold ([`AccountStep::hold`]).
    pub hold: bool,
    /// A settle or undo: what the transfer's written document filed of this account's
    /// entries ([`AccountStep::filed`]).
    pub filed: Vec<u64>,
}

/// The marks of this process's apply decisions (`AccountDoc::pending_marks`,
/// `docs/design.md §9`, "The fence"): `<instance>.<n>`, a 48-bit random name for the process
/// and a counter in hex. Every decision takes a new one, a decision made again after a
/// conflict too: an apply decided again on a copy read after its first write was settled
/// is a late apply, and must not carry the mark the commit counted.
#[derive(Debug)]
pub struct Marks {
    instance: String,
    made: AtomicU64,
}

impl Marks {
    fn new() -> Self {
        Self {
            instance: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
            made: AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let n = self.made.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}.{n:x}", self.instance)
    }
}

/// What became of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepResult {
    /// Written.
    Done,
    /// Nothing to write: it was done before.
    AlreadyDone,
    /// The account does not exist.
    Missing,
    Refused(Refusal),
    /// The worker's lease was too close to its end when the account was observed.
    LeaseExpired,
    /// Conditional writes kept conflicting.
    Contention,
    /// The store failed (after retries for retryable errors), or a document was unreadable.
    Failed(StoreError),
}

/// What a step saw of the account besides its result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// A source's apply done (now or before) with `report_currency`: the account's currency,
    /// which the destination's apply needs ([`CurrencyRule::for_destination`]).
    pub currency: Option<String>,
    /// An apply done (now or before): the mark of the transfer's pending entry, which the
    /// commit records.
    pub mark: Option<String>,
    /// A settle found a late apply of the transfer and gave it back
    /// ([`AccountDecision::UndoLate`]).
    pub undid_late_apply: bool,
    /// An apply done (now or before): the entries the transfer's next write files
    /// ([`super::entries::to_file`]).
    pub to_file: Vec<String>,
}

/// A step's result and what it saw.
type StepReply = (StepResult, Observed);

struct QueuedStep {
    request: StepRequest,
    reply: oneshot::Sender<StepReply>,
    /// The worker's step span when traces are exported (else none): the batch's store
    /// requests are spans of the first traced step it serves.
    span: Option<tracing::Span>,
}

struct FlushGuard<'a> {
    steps: &'a AccountSteps,
    account: &'a str,
    armed: bool,
}

impl Drop for FlushGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut queues = self.steps.queues.lock().unwrap_or_else(|e| e.into_inner());
            queues.remove(self.account);
            self.steps
                .cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(self.account);
        }
    }
}

/// Most accounts whose last written copy is remembered.
const CACHE_LIMIT: usize = 10_000;

/// The per-account combiner. One flusher task per busy account; idle accounts cost nothing
/// but their remembered copy.
pub struct AccountSteps {
    docs: Documents,
    clock: DynClock,
    retention: Retention,
    max_conflicts: u32,
    max_store_attempts: u32,
    /// Batches are settled inside store transactions (see the module docs).
    in_transactions: bool,
    queues: Mutex<HashMap<String, Vec<QueuedStep>>>,
    /// The last copy of each account this process wrote, with its version.
    cache: Mutex<HashMap<String, Versioned<AccountDoc>>>,
    marks: Arc<Marks>,
    /// The engine's tasks: a flusher is one of them, so a shutdown waits for the batch it is
    /// writing, and the store is no longer in use once the engine is idle.
    tasks: TaskTracker,
}

impl AccountSteps {
    pub fn new(
        docs: Documents,
        clock: DynClock,
        retention: Retention,
        (max_conflicts, max_store_attempts): (u32, u32),
        in_transactions: bool,
        tasks: TaskTracker,
    ) -> Arc<Self> {
        Arc::new(Self {
            in_transactions: in_transactions && docs.has_transactions(),
            docs,
            clock,
            retention,
            max_conflicts,
            max_store_attempts,
            queues: Mutex::new(HashMap::new()),
            cache: Mutex::new(HashMap::new()),
            marks: Arc::new(Marks::new()),
            tasks,
        })
    }

    /// Queues a step on `account` and waits for its result.
    pub async fn run(self: &Arc<Self>, account: &str, request: StepRequest) -> StepResult {
        self.run_observing(account, request).await.0
    }

    /// [`AccountSteps::run`], also answering what the step saw ([`Observed`]).
    pub async fn run_observing(
        self: &Arc<Self>,
        account: &str,
        request: StepRequest,
    ) -> (StepResult, Observed) {
        let (reply, result) = oneshot::channel();
        let span = crate::trace_context::in_trace().then(tracing::Span::current);
        let step = QueuedStep {
            request,
            reply,
            span,
        };
        let start_flusher = {
            let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            match queues.get_mut(account) {
                Some(queue) => {
                    queue.push(step);
                    false
                }
                None => {
                    queues.insert(account.to_owned(), vec![step]);
                    true
                }
            }
        };
        if start_flusher {
            let this = self.clone();
            let account = account.to_owned();
            // Its own task, so a worker that stops waiting cannot strand the queue; tracked, so
            // that the engine is idle only once the queue is served.
            self.tasks.spawn(async move { this.flush(account).await });
        }
        result.await.unwrap_or_else(|_| {
            (
                StepResult::Failed(StoreError::Permanent("account step was dropped".into())),
                Observed::default(),
            )
        })
    }

    /// Serves the account's queue until it is empty.
    async fn flush(&self, account: String) {
        // Should this task panic, the guard removes the account's queue (failing the steps in
        // it: their workers see a dropped reply), so the next step starts a new flusher
        // instead of waiting forever behind a dead one.
        let mut guard = FlushGuard {
            steps: self,
            account: &account,
            armed: true,
        };
        loop {
            let batch = {
                let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
                let queue = queues
                    .get_mut(&account)
                    .expect("queue exists while flushing");
                if queue.is_empty() {
                    queues.remove(&account);
                    guard.armed = false;
                    return;
                }
                std::mem::take(queue)
            };
            // One batch serves many steps: its store requests join the first traced one's.
            let span = batch
                .iter()
                .find_map(|step| step.span.clone())
                .unwrap_or_else(tracing::Span::none);
            let results = self.settle_batch(&account, &batch).instrument(span).await;
            for (waiting, result) in batch.into_iter().zip(results) {
                let _ = waiting.reply.send(result);
            }
        }
    }

    /// Decides and writes one batch, retrying on conflicts; one result per step.
    async fn settle_batch(&self, account: &str, batch: &[QueuedStep]) -> Vec<StepReply> {
        if self.in_transactions {
            return self.settle_batch_in_transaction(account, batch).await;
        }
        let mut use_cache = true;
        for attempt in 0..self.max_conflicts {
            if attempt > 1 {
                tokio::time::sleep(backoff(attempt.min(6))).await;
            }
            // Taken out of the cache, not cloned: this flusher is the only one for the
            // account, and it puts back whatever it ends up holding.
            let cached = if use_cache {
                self.take_remembered(account)
            } else {
                None
            };
            let from_cache = cached.is_some();
            let copy = match cached {
                Some(copy) => Some(copy),
                None => match self.read(account).await {
                    Ok(copy) => copy,
                    Err(result) => return vec![(result, Observed::default()); batch.len()],
                },
            };
            let Some(copy) = copy else {
                return self.vouched(account, None, self.missing(batch)).await;
            };
            let version = copy.version;
            let (results, current, changed) = self.decide_batch(copy.doc, batch);
            if !changed {
                if from_cache {
                    // Nothing to write means nothing would check the remembered copy against
                    // the store (another instance may have changed the account): decide
                    // again on a fresh read. The copy stays remembered, as it was.
                    self.remember(
                        account,
                        Versioned {
                            doc: current,
                            version,
                        },
                    );
                    use_cache = false;
                    continue;
                }
                return self.vouched(account, Some(version), results).await;
            }
            let next = current;
            match self.write(&next, version).await {
                Ok(WriteOutcome::Written(version)) => {
                    self.remember(account, Versioned { doc: next, version });
                    return results;
                }
                Ok(_) => {
                    // Someone else wrote the account: our copy is gone (taken above, not put
                    // back); read it again.
                    use_cache = false;
                }
                Err(result) => {
                    // The outcome is unknown: the next decision must start from a fresh read
                    // (the copy was taken above and is not put back).
                    return vec![(result, Observed::default()); batch.len()];
                }
            }
        }
        vec![(StepResult::Contention, Observed::default()); batch.len()]
    }

    /// [`AccountSteps::settle_batch`] inside one store transaction: read, decide and write
    /// together. A failure whose outcome is unknown is retried: every step is idempotent, so
    /// one applied the first time is `AlreadyDone` the second.
    async fn settle_batch_in_transaction(
        &self,
        account: &str,
        batch: &[QueuedStep],
    ) -> Vec<StepReply> {
        let requests: Arc<Vec<StepRequest>> =
            Arc::new(batch.iter().map(|w| w.request.clone()).collect());
        let failed = |result: StepResult| vec![(result, Observed::default()); batch.len()];
        let settled = self
            .retrying(|| {
                let (requests, clock) = (requests.clone(), self.clock.clone());
                let (retention, id) = (self.retention, account.to_owned());
                let marks = self.marks.clone();
                self.docs.transact(move |txn| {
                    let copy = match txn.get::<AccountDoc>(&id) {
                        Ok(Some(copy)) => copy,
                        Ok(None) => return missing(clock.as_ref(), requests.iter()),
                        Err(e) => {
                            return vec![
                                (StepResult::Failed(e), Observed::default());
                                requests.len()
                            ]
                        }
                    };
                    let (results, next, changed) = decide_steps(
                        (clock.as_ref(), retention, &marks),
                        copy.doc,
                        requests.iter(),
                    );
                    match changed.then(|| txn.replace_if(&next, copy.version)) {
                        Some(Err(e)) => {
                            vec![(StepResult::Failed(e), Observed::default()); requests.len()]
                        }
                        _ => results,
                    }
                })
            })
            .await;
        match settled {
            Ok((results, TxnOutcome::Committed(_))) => results,
            Ok((_, TxnOutcome::Refused)) => failed(StepResult::Contention),
            Err(result) => failed(result),
        }
    }

    /// Decides every step of the batch (see [`decide_steps`]).
    fn decide_batch(
        &self,
        current: AccountDoc,
        batch: &[QueuedStep],
    ) -> (Vec<StepReply>, AccountDoc, bool) {
        let requests = batch.iter().map(|w| &w.request);
        let rules = (self.clock.as_ref(), self.retention, self.marks.as_ref());
        decide_steps(rules, current, requests)
    }

    /// `results`, decided on a read of `account` (at `read`, or not found) without a write
    /// of their own, once the store vouches for that read ([`Documents::vouch`]); else every
    /// step failed, to be tried again. A write would vouch for the copy it is conditional on;
    /// without one, a step found done on a write that a cut-off primary accepted, and rolls
    /// back when it rejoins, would let its worker go on as if the units had moved
    /// (`docs/design.md` §9, "Partitions").
    async fn vouched(
        &self,
        account: &str,
        read: Option<Version>,
        results: Vec<StepReply>,
    ) -> Vec<StepReply> {
        match self.docs.vouch::<AccountDoc>(account, read).await {
            Ok(()) => results,
            Err(error) => vec![(StepResult::Failed(error), Observed::default()); results.len()],
        }
    }

    /// The results for a batch on an account that does not exist.
    fn missing(&self, batch: &[QueuedStep]) -> Vec<StepReply> {
        missing(self.clock.as_ref(), batch.iter().map(|w| &w.request))
    }

    /// The remembered copy of `account`, taken out of the cache.
    fn take_remembered(&self, account: &str) -> Option<Versioned<AccountDoc>> {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(account)
    }

    /// Remembers an account this process has just created, at the version its create
    /// answered: the first step on it is then written without reading it first (on
    /// Elasticsearch, a realtime GET fewer per account). Like every remembered copy it is
    /// only a guess that the conditional write checks: if anyone wrote the account since,
    /// the write conflicts and the batch is read and decided again.
    pub fn remember_created(&self, account: &AccountDoc, version: Version) {
        if self.in_transactions {
            // Settled inside store transactions, which read the account themselves.
            return;
        }
        let copy = Versioned {
            doc: account.clone(),
            version,
        };
        self.remember(&account.account_id, copy);
    }

    fn remember(&self, account: &str, copy: Versioned<AccountDoc>) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_LIMIT && !cache.contains_key(account) {
            cache.clear();
        }
        cache.insert(account.to_owned(), copy);
    }

    async fn read(&self, account: &str) -> Result<Option<Versioned<AccountDoc>>, StepResult> {
        self.retrying(|| self.docs.get::<AccountDoc>(account)).await
    }

    async fn write(&self, next: &AccountDoc, version: Version) -> Result<WriteOutcome, StepResult> {
        self.retrying(|| self.docs.replace_if(next, version)).await
    }

    async fn retrying<T, F, Fut>(&self, request: F) -> Result<T, StepResult>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        retry(self.max_store_attempts, || true, request)
            .await
            .map_err(StepResult::Failed)
    }

    /// Forgets every remembered copy (tests use it to simulate another process).
    pub fn forget(&self) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Decides every step, in order, on one copy of the account observed no later than now; a
/// step whose worker's deadline has passed is not decided. Returns the results, the account
/// as decided and whether any step changed it (then it is the account to write; else it is
/// the copy given, untouched).
fn decide_steps<'a>(
    (clock, retention, marks): (&dyn Clock, Retention, &Marks),
    mut current: AccountDoc,
    requests: impl Iterator<Item = &'a StepRequest>,
) -> (Vec<StepReply>, AccountDoc, bool) {
    let observed = clock.boot_time();
    let now = clock.now();
    let mut changed = false;
    let results = requests
        .map(|r| {
            if r.deadline <= observed {
                return (StepResult::LeaseExpired, Observed::default());
            }
            let new_mark = (r.op == AccountOp::Apply).then(|| marks.next());
            let step = AccountStep {
                transfer_id: &r.transfer_id,
                amount: r.amount,
                settle_amount: r.settle_amount,
                side: r.side,
                op: r.op,
                currency: r.currency.as_deref(),
                mark: new_mark.as_deref().or(r.mark.as_deref()),
                hold: r.hold,
                filed: &r.filed,
            };
            let mut seen = Observed::default();
            let result = match decide_account(&current, step, &now, retention) {
                AccountDecision::Write(next) => {
                    current = next;
                    changed = true;
                    StepResult::Done
                }
                AccountDecision::UndoLate(next) => {
                    current = next;
                    changed = true;
                    seen.undid_late_apply = true;
                    StepResult::Done
                }
                AccountDecision::AlreadyDone => StepResult::AlreadyDone,
                AccountDecision::Refuse(refusal) => {
                    return (StepResult::Refused(refusal), Observed::default())
                }
            };
            if r.op == AccountOp::Apply {
                seen.mark = current.pending_mark(&r.transfer_id).map(str::to_owned);
                seen.to_file = super::entries::to_file(&current, &r.transfer_id);
                // Only the first account's apply is asked for it (cloned only when there is one).
                seen.currency = r
                    .report_currency
                    .then(|| current.currency.clone())
                    .flatten();
            }
            (result, seen)
        })
        .collect();
    (results, current, changed)
}

/// The results of steps on an account that does not exist.
fn missing<'a>(
    clock: &dyn Clock,
    requests: impl Iterator<Item = &'a StepRequest>,
) -> Vec<StepReply> {
    let observed = clock.boot_time();
    requests
        .map(|r| {
            if r.deadline <= observed {
                (StepResult::LeaseExpired, Observed::default())
            } else {
                (StepResult::Missing, Observed::default())
            }
        })
        .collect()
}
