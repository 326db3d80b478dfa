//! Write coalescing (docs/design.md §6): concurrent [`Store::bulk`] calls share inner `bulk`s.
//!
//! Every caller hands its ops to a single flusher task through a channel and waits for its
//! own answer on a oneshot. The flusher keeps at most `in_flight` inner `bulk`s running;
//! whatever queues up while they are all busy goes out together in the next one (up to
//! `max_batch` ops). An idle store therefore adds no latency (the first write goes out at
//! once), and a busy one turns N concurrent writes into a few round trips (Elasticsearch:
//! `_bulk`s; embedded: redb commits).
//!
//! Guarantees:
//! - **At most `in_flight` inner `bulk`s at a time** (the service wraps only Elasticsearch in
//!   a coalescer: `ELASTICSEARCH_BULKS_IN_FLIGHT`). On a sharded index one bulk in flight is what binds the rate: a
//!   `_bulk` is answered when its busiest shard has served its items, so the other shards
//!   idle meanwhile. With one bulk in flight per shard they stay busy (`docs/benchmark.md`,
//!   "Shards on the capacity model").
//! - **No order between callers is promised, and none is needed**: two submissions in
//!   different batches in flight at once may be applied in either order, exactly as two
//!   instances' writes may. A caller has at most one submission outstanding (it waits for
//!   its answer), so its own writes keep their order; the protocol orders writes to one
//!   document by their conditions (`if_seq_no`, `create`), never by arrival.
//! - **Each caller gets exactly its own results, in order**: a batch is the concatenation of
//!   whole submissions, and the inner results are cut back by the submissions' lengths.
//!   A submission is never split, so one larger than `max_batch` goes out alone.
//! - **A whole-request error reaches every caller of that batch** (and only them). An inner
//!   answer with the wrong number of items, or a panic inside the inner store, is a
//!   `Permanent` error for that batch; the flusher carries on with the next.
//! - **No lost wakeups**: a submission is in the channel before its caller waits, and the
//!   flusher only blocks on the channel when it holds a free slot and no submission; every
//!   submission taken off the channel is answered (or its caller is gone).
//! - **The flusher ends with the store**: it owns the only receiver; dropping the store drops
//!   the only sender, and the flusher returns once the queue is drained (batches still in
//!   flight finish on their own tasks). Callers borrow the store, so none can be waiting at
//!   that point.
//!
//! A caller that stops waiting (its future is dropped, e.g. on a timeout) does not withdraw
//! its ops: they may still be written, exactly like a `_bulk` whose answer was lost. The
//! store contract already says so for `Unavailable`: re-read before deciding again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use super::{DynStore, Store, StoreError, StoreResult, WriteOp, WriteOutcome};
use crate::trace_context;

type BulkResult = StoreResult<Vec<StoreResult<WriteOutcome>>>;

/// One caller's ops and where its answer goes.
struct Submission {
    ops: Vec<WriteOp>,
    reply: oneshot::Sender<BulkResult>,
    /// The caller's span when traces are exported (else none): the batch's request carries
    /// the trace context of its first traced submission.
    span: Option<tracing::Span>,
}

/// A [`Store`] that coalesces concurrent writes into batches on an inner store; reads,
/// searches, `scan`, `ready` and `refresh` go straight to the inner store.
pub struct WriteCoalescer {
    inner: DynStore,
    /// Upper bound of ops per inner `bulk` (a single larger submission still goes whole).
    max_batch: usize,
    /// Upper bound of inner `bulk`s running at once.
    in_flight: usize,
    /// The flusher's queue, created with the flusher on the first write so that `new` works
    /// outside a Tokio runtime.
    queue: OnceLock<mpsc::UnboundedSender<Submission>>,
    /// Ops submitted and not yet taken into a batch (see [`WriteCoalescer::queued_ops`]).
    queued_ops: Arc<AtomicUsize>,
}

impl WriteCoalescer {
    /// Wraps `inner` with one inner call in flight; `max_batch` is the largest number of ops
    /// merged into one inner call (0 is treated as 1).
    pub fn new(inner: DynStore, max_batch: usize) -> Self {
        Self::with_in_flight(inner, max_batch, 1)
    }

    /// Wraps `inner` with up to `in_flight` inner calls running at once (0 is treated as 1,
    /// more than a semaphore holds as that most).
    pub fn with_in_flight(inner: DynStore, max_batch: usize, in_flight: usize) -> Self {
        Self {
            inner,
            max_batch: max_batch.max(1),
            in_flight: in_flight.clamp(1, Semaphore::MAX_PERMITS),
            queue: OnceLock::new(),
            queued_ops: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Ops waiting for the next batch (the batch in flight not included). A gauge for
    /// metrics, and what tests wait on to know that callers have queued up.
    pub fn queued_ops(&self) -> usize {
        self.queued_ops.load(Ordering::Acquire)
    }

    fn queue(&self) -> &mpsc::UnboundedSender<Submission> {
        self.queue.get_or_init(|| {
            // Unbounded is bounded in practice: each caller has at most one submission
            // queued and waits for its answer, so the queue never outgrows the callers.
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(flush_loop(
                self.inner.clone(),
                Limits {
                    max_batch: self.max_batch,
                    in_flight: self.in_flight,
                },
                receiver,
                self.queued_ops.clone(),
            ));
            sender
        })
    }
}

impl std::fmt::Debug for WriteCoalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteCoalescer")
            .field("backend", &self.inner.backend())
            .field("max_batch", &self.max_batch)
            .field("in_flight", &self.in_flight)
            .field("queued_ops", &self.queued_ops())
            .finish()
    }
}

/// How big a batch may be, and how many may be written at once.
#[derive(Clone, Copy)]
struct Limits {
    max_batch: usize,
    in_flight: usize,
}

/// The flusher: waits for a free slot, takes the oldest submission, adds whatever else is
/// queued while the batch stays within `max_batch`, writes the batch on its own task (which
/// answers and frees the slot), repeats. Ends when the store (the only sender) is gone and
/// the queue is empty.
async fn flush_loop(
    inner: DynStore,
    limits: Limits,
    mut receiver: mpsc::UnboundedReceiver<Submission>,
    queued_ops: Arc<AtomicUsize>,
) {
    let slots = Arc::new(Semaphore::new(limits.in_flight));
    // A submission that did not fit into the previous batch; it opens the next one.
    let mut carried: Option<Submission> = None;
    loop {
        // The slot is taken before the queue is read, so that while every slot is busy the
        // submissions pile up and go out together in the next batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return; // never closed
        };
        let first = match carried.take() {
            Some(submission) => submission,
            None => match receiver.recv().await {
                Some(submission) => submission,
                None => return,
            },
        };
        let (batch, next) = gather(first, &mut receiver, limits.max_batch);
        carried = next;
        let size = batch.iter().map(|s| s.ops.len()).sum();
        queued_ops.fetch_sub(size, Ordering::AcqRel);
        tokio::spawn(flush(inner.clone(), batch, slot));
    }
}

/// `first` and whatever queued after it that fits within `max_batch`, and the submission
/// that did not fit (it opens the next batch).
fn gather(
    first: Submission,
    receiver: &mut mpsc::UnboundedReceiver<Submission>,
    max_batch: usize,
) -> (Vec<Submission>, Option<Submission>) {
    let mut size = first.ops.len();
    let mut batch = vec![first];
    while size < max_batch {
        match receiver.try_recv() {
            Ok(next) if size + next.ops.len() <= max_batch => {
                size += next.ops.len();
                batch.push(next);
            }
            Ok(next) => return (batch, Some(next)),
            // Empty, or closed: either way this batch is complete.
            Err(_) => break,
        }
    }
    (batch, None)
}

/// Writes one batch and gives every submission its own slice of the results; the slot is
/// freed when the answers are out.
async fn flush(inner: DynStore, batch: Vec<Submission>, _slot: OwnedSemaphorePermit) {
    let mut ops = Vec::with_capacity(batch.iter().map(|s| s.ops.len()).sum());
    let mut waiters = Vec::with_capacity(batch.len());
    // One request serves many transfers: it joins the trace of the first that has one.
    let span = batch
        .iter()
        .find_map(|submission| submission.span.clone())
        .unwrap_or_else(tracing::Span::none);
    for submission in batch {
        waiters.push((submission.ops.len(), submission.reply));
        ops.extend(submission.ops);
    }
    let sent = ops.len();

    // Run the inner call as its own task so that a panic in the inner store fails this
    // batch instead of ending this task unanswered.
    let result = tokio::spawn(async move { inner.bulk(ops).instrument(span).await })
        .await
        .unwrap_or_else(|e| Err(StoreError::Permanent(format!("store write failed: {e}"))));

    match result {
        Ok(results) if results.len() == sent => {
            let mut results = results.into_iter();
            for (count, reply) in waiters {
                // A closed oneshot means the caller stopped waiting; nothing to do.
                let _ = reply.send(Ok(results.by_ref().take(count).collect()));
            }
        }
        Ok(results) => {
            let error = StoreError::Permanent(format!(
                "bulk answered {} items for {sent} sent",
                results.len()
            ));
            for (_, reply) in waiters {
                let _ = reply.send(Err(error.clone()));
            }
        }
        Err(error) => {
            for (_, reply) in waiters {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

/// Everything but `bulk` goes straight to the inner store.
#[async_trait]
impl crate::store::Forwarding for WriteCoalescer {
    fn inner(&self) -> &dyn Store {
        self.inner.as_ref()
    }

    async fn bulk(&self, ops: Vec<WriteOp>) -> BulkResult {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        let count = ops.len();
        // Counted before sending, so the flusher's decrement can never come first.
        self.queued_ops.fetch_add(count, Ordering::AcqRel);
        let span = trace_context::in_trace().then(tracing::Span::current);
        let submission = Submission { ops, reply, span };
        if self.queue().send(submission).is_err() {
            self.queued_ops.fetch_sub(count, Ordering::AcqRel);
            return Err(StoreError::Permanent(
                "write coalescer stopped (its runtime shut down)".into(),
            ));
        }
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::Permanent(
                "write coalescer stopped before answering".into(),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use serde_json::json;
    use tokio::sync::Semaphore;
    use tokio::time::timeout;

    use super::*;
    use crate::store::{Doc, Index, Page, ScanPage, StaleQuery, TransferFilter, Version};

    const DEADLINE: Duration = Duration::from_secs(10);

    /// A fake inner store: answers each op from its id (`"<n>"` → `Written(seq_no n)`,
    /// `"exists-<n>"` → `AlreadyExists`), records every call's ops, can hold calls at a gate,
    /// fail chosen calls and panic on an op named `"panic"`.
    struct FakeStore {
        calls: Mutex<Vec<Vec<String>>>,
        /// Each call takes one permit before answering; `None` = no gate.
        gate: Option<Semaphore>,
        /// Tells the test a call has started (with its number of ops).
        started: mpsc::UnboundedSender<usize>,
        /// 1-based call numbers that fail as a whole.
        failing_calls: Vec<usize>,
    }

    impl FakeStore {
        fn new(
            gated: bool,
            failing_calls: Vec<usize>,
        ) -> (Arc<Self>, mpsc::UnboundedReceiver<usize>) {
            let (started, started_rx) = mpsc::unbounded_channel();
            let fake = Arc::new(Self {
                calls: Mutex::new(Vec::new()),
                gate: gated.then(|| Semaphore::new(0)),
                started,
                failing_calls,
            });
            (fake, started_rx)
        }

        fn release(&self, calls: usize) {
            self.gate.as_ref().expect("gated fake").add_permits(calls);
        }

        fn batch_sizes(&self) -> Vec<usize> {
            self.calls.lock().unwrap().iter().map(Vec::len).collect()
        }
    }

    #[async_trait]
    impl Store for FakeStore {
        fn backend(&self) -> &'static str {
            "fake"
        }

        async fn get(&self, _: Index, _: &str) -> StoreResult<Option<Doc>> {
            Ok(None)
        }

        async fn bulk(&self, ops: Vec<WriteOp>) -> BulkResult {
            let ids: Vec<String> = ops.iter().map(|op| op.id().to_owned()).collect();
            let call = {
                let mut calls = self.calls.lock().unwrap();
                calls.push(ids.clone());
                calls.len()
            };
            let _ = self.started.send(ids.len());
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            assert!(!ids.iter().any(|id| id == "panic"), "fake store panics");
            if self.failing_calls.contains(&call) {
                return Err(StoreError::Unavailable("fake: 429".into()));
            }
            Ok(ids.iter().map(|id| Ok(expected_outcome(id))).collect())
        }

        async fn find_stale(&self, _: &StaleQuery) -> StoreResult<Page> {
            Ok(Page {
                docs: Vec::new(),
                next: None,
            })
        }

        async fn list_transfers(&self, _: &TransferFilter) -> StoreResult<Page> {
            self.find_stale(&StaleQuery {
                states: Vec::new(),
                modified_before: 0,
                after: None,
                limit: 0,
            })
            .await
        }

        async fn account_entries(&self, _: &super::super::EntriesQuery) -> StoreResult<Vec<Doc>> {
            Ok(Vec::new())
        }

        async fn scan(&self, _: Index, _: Option<&str>, _: usize) -> StoreResult<ScanPage> {
            Ok(ScanPage {
                docs: Vec::new(),
                next: None,
            })
        }

        async fn ready(&self) -> StoreResult<()> {
            Ok(())
        }

        async fn changes(
            &self,
            _: &super::super::ChangesQuery,
        ) -> StoreResult<super::super::ChangesPage> {
            Ok(super::super::ChangesPage { docs: Vec::new() })
        }

        async fn refresh(&self) -> StoreResult<()> {
            Ok(())
        }
    }

    fn expected_outcome(id: &str) -> WriteOutcome {
        match id.strip_prefix("exists-") {
            Some(_) => WriteOutcome::AlreadyExists,
            None => WriteOutcome::Written(Version {
                seq_no: id.parse().unwrap(),
                primary_term: 1,
            }),
        }
    }

    /// The outcomes of a bulk that must have succeeded item by item.
    fn outcomes(result: BulkResult) -> Vec<WriteOutcome> {
        result
            .expect("the batch succeeded")
            .into_iter()
            .map(|item| item.expect("the item succeeded"))
            .collect()
    }

    fn expected(ids: &[String]) -> Vec<WriteOutcome> {
        ids.iter().map(|id| expected_outcome(id)).collect()
    }

    fn creates(ids: &[String]) -> Vec<WriteOp> {
        ids.iter()
            .map(|id| WriteOp::Create {
                index: Index::Transactions,
                id: id.clone(),
                source: json!({}).into(),
            })
            .collect()
    }

    fn coalescer(fake: &Arc<FakeStore>, max_batch: usize) -> Arc<WriteCoalescer> {
        Arc::new(WriteCoalescer::new(fake.clone(), max_batch))
    }

    /// Waits until `condition` holds, failing the test after [`DEADLINE`].
    async fn eventually(what: &str, condition: impl Fn() -> bool) {
        let wait = async {
            while !condition() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        timeout(DEADLINE, wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
    }

    async fn next_call(started: &mut mpsc::UnboundedReceiver<usize>) -> usize {
        timeout(DEADLINE, started.recv())
            .await
            .expect("an inner call in time")
            .expect("fake alive")
    }

    /// Spawns one caller writing `ids`.
    fn spawn_caller(
        store: &Arc<WriteCoalescer>,
        ids: Vec<String>,
    ) -> tokio::task::JoinHandle<(Vec<String>, BulkResult)> {
        let store = store.clone();
        tokio::spawn(async move {
            let result = store.bulk(creates(&ids)).await;
            (ids, result)
        })
    }

    /// One caller of one op for each of `numbers`, in order.
    fn spawn_one_op_callers(
        store: &Arc<WriteCoalescer>,
        numbers: std::ops::Range<u64>,
    ) -> Vec<tokio::task::JoinHandle<(Vec<String>, BulkResult)>> {
        numbers
            .map(|n| spawn_caller(store, vec![n.to_string()]))
            .collect()
    }

    /// Waits for every caller and checks that each got exactly its own outcomes.
    async fn each_gets_its_own_results(
        handles: impl IntoIterator<Item = tokio::task::JoinHandle<(Vec<String>, BulkResult)>>,
    ) {
        for handle in handles {
            let (ids, result) = join(handle).await;
            assert_eq!(outcomes(result), expected(&ids), "caller with ops {ids:?}");
        }
    }

    async fn join(
        handle: tokio::task::JoinHandle<(Vec<String>, BulkResult)>,
    ) -> (Vec<String>, BulkResult) {
        timeout(DEADLINE, handle)
            .await
            .expect("caller in time")
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_callers_get_exactly_their_own_results() {
        let (fake, _started) = FakeStore::new(false, vec![]);
        let store = coalescer(&fake, 64);

        let handles: Vec<_> = (0..50u64)
            .map(|caller| {
                // Callers write 1 to 3 ops, some of which "already exist".
                let ids = (0..=caller % 3)
                    .map(|i| match (caller + i) % 4 {
                        0 => format!("exists-{caller}-{i}"),
                        _ => (caller * 10 + i).to_string(),
                    })
                    .collect();
                spawn_caller(&store, ids)
            })
            .collect();

        let mut total = 0;
        for handle in handles {
            let (ids, result) = join(handle).await;
            assert_eq!(outcomes(result), expected(&ids), "caller with ops {ids:?}");
            total += ids.len();
        }
        assert_eq!(fake.batch_sizes().iter().sum::<usize>(), total);
        assert!(fake.batch_sizes().iter().all(|&n| n <= 64));
    }

    #[tokio::test]
    async fn writes_queued_behind_an_inner_call_go_out_together() {
        let (fake, mut started) = FakeStore::new(true, vec![]);
        let store = coalescer(&fake, 64);

        let first = spawn_caller(&store, vec!["1".into()]);
        assert_eq!(next_call(&mut started).await, 1);
        let queued = spawn_one_op_callers(&store, 2..7);
        eventually("five queued ops", || store.queued_ops() == 5).await;
        fake.release(2);

        let (_, result) = join(first).await;
        assert_eq!(outcomes(result), vec![expected_outcome("1")]);
        each_gets_its_own_results(queued).await;
        // Six callers, two inner calls: the first alone, the other five together.
        assert_eq!(fake.batch_sizes(), vec![1, 5]);
        assert_eq!(store.queued_ops(), 0);
    }

    #[tokio::test]
    async fn with_two_in_flight_a_second_batch_starts_before_the_first_is_answered() {
        let (fake, mut started) = FakeStore::new(true, vec![]);
        let store = Arc::new(WriteCoalescer::with_in_flight(fake.clone(), 64, 2));

        let first = spawn_caller(&store, vec!["1".into()]);
        assert_eq!(next_call(&mut started).await, 1);
        let second = spawn_caller(&store, vec!["2".into()]);
        // The first call is still held at the gate: the second goes out beside it.
        assert_eq!(next_call(&mut started).await, 1);
        let queued = spawn_one_op_callers(&store, 3..7);
        eventually("four queued ops", || store.queued_ops() == 4).await;
        fake.release(3);

        each_gets_its_own_results([first, second].into_iter().chain(queued)).await;
        // Both slots busy while the last four queued: they went out together.
        assert_eq!(fake.batch_sizes(), vec![1, 1, 4]);
        assert_eq!(store.queued_ops(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn with_several_in_flight_concurrent_callers_still_get_their_own_results() {
        let (fake, _started) = FakeStore::new(false, vec![]);
        let store = Arc::new(WriteCoalescer::with_in_flight(fake.clone(), 8, 4));

        let handles: Vec<_> = (0..60u64)
            .map(|caller| {
                spawn_caller(
                    &store,
                    vec![caller.to_string(), (caller + 1000).to_string()],
                )
            })
            .collect();
        each_gets_its_own_results(handles).await;
        assert_eq!(fake.batch_sizes().iter().sum::<usize>(), 120);
    }

    #[tokio::test]
    async fn batches_stay_within_max_batch_without_splitting_a_caller() {
        let (fake, mut started) = FakeStore::new(true, vec![]);
        let store = coalescer(&fake, 2);

        let first = spawn_caller(&store, vec!["1".into()]);
        next_call(&mut started).await;
        let mut handles = vec![first];
        for n in 2..7 {
            handles.push(spawn_caller(&store, vec![n.to_string()]));
            // One at a time, so the queue order (and the batch sizes) are known.
            eventually("the caller queued", || store.queued_ops() == n - 1).await;
        }
        let big: Vec<String> = (10..15).map(|n| n.to_string()).collect();
        handles.push(spawn_caller(&store, big));
        eventually("the big caller queued", || store.queued_ops() == 10).await;
        fake.release(10);

        for handle in handles {
            let (ids, result) = join(handle).await;
            assert_eq!(outcomes(result), expected(&ids));
        }
        // 1 in flight; then 2+3, 4+5, 6 (the big one does not fit next to it), and the
        // 5-op caller alone although it exceeds max_batch.
        assert_eq!(fake.batch_sizes(), vec![1, 2, 2, 1, 5]);
    }

    #[tokio::test]
    async fn an_inner_error_reaches_every_caller_of_that_batch_and_only_them() {
        // The second inner call fails as a whole.
        let (fake, mut started) = FakeStore::new(true, vec![2]);
        let store = coalescer(&fake, 64);

        let first = spawn_caller(&store, vec!["1".into()]);
        next_call(&mut started).await;
        let failing: Vec<_> = (2..6)
            .map(|n| spawn_caller(&store, vec![n.to_string(), (n * 100).to_string()]))
            .collect();
        eventually("eight queued ops", || store.queued_ops() == 8).await;
        fake.release(3);

        assert!(join(first).await.1.is_ok());
        for handle in failing {
            let (_, result) = join(handle).await;
            assert!(result.unwrap_err().is_retryable());
        }
        // The coalescer carries on after a failed batch.
        let (_, after) = join(spawn_caller(&store, vec!["7".into()])).await;
        assert_eq!(outcomes(after), vec![expected_outcome("7")]);
        assert_eq!(fake.batch_sizes(), vec![1, 8, 1]);
    }

    #[tokio::test]
    async fn a_panicking_inner_store_fails_only_its_batch() {
        let (fake, _started) = FakeStore::new(false, vec![]);
        let store = coalescer(&fake, 64);

        let (_, result) = join(spawn_caller(&store, vec!["panic".into()])).await;
        assert!(!result.unwrap_err().is_retryable());
        let (_, result) = join(spawn_caller(&store, vec!["3".into()])).await;
        assert_eq!(outcomes(result), vec![expected_outcome("3")]);
    }

    #[tokio::test]
    async fn empty_writes_and_reads_do_not_go_through_the_queue() {
        let (fake, _started) = FakeStore::new(false, vec![]);
        let store = coalescer(&fake, 64);

        assert!(outcomes(store.bulk(Vec::new()).await).is_empty());
        assert_eq!(store.get(Index::Accounts, "a").await.unwrap(), None);
        store.ready().await.unwrap();
        assert_eq!(store.backend(), "fake");
        assert!(fake.batch_sizes().is_empty());
        // Single-document helpers go through bulk.
        let outcome = store
            .create(Index::Accounts, "42", json!({}).into())
            .await
            .unwrap();
        assert_eq!(outcome, expected_outcome("42"));
    }

    #[tokio::test]
    async fn the_flusher_ends_when_the_store_is_dropped() {
        let (fake, _started) = FakeStore::new(false, vec![]);
        let store = coalescer(&fake, 64);
        let (_, result) = join(spawn_caller(&store, vec!["1".into()])).await;
        result.unwrap();
        // The test, the coalescer and the flusher each hold the fake.
        eventually("the batch task to let go", || Arc::strong_count(&fake) == 3).await;

        drop(store);
        eventually("the flusher to let go of the inner store", || {
            Arc::strong_count(&fake) == 1
        })
        .await;
    }
}
