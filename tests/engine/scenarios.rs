//! The engine against real storage (embedded redb), without HTTP: conflict and retry
//! branches, unknown write outcomes, and a property test of random transfers, replays and
//! cancels driven by concurrent workers of two "instances" with short leases and random
//! delays, ending with the invariants of `docs/design.md §4`; and a second one that mixes
//! holds (captured whole or in part, cancelled, expiring), multi-leg transactions (some of
//! them holds) and currency-mismatched transfers into such schedules.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokio::sync::Semaphore;
use transfer_service::store::{DynStore, Index, Source};
use transfer_service::transfer::documents::decode;
use transfer_service::transfer::lease::PARKED;
use transfer_service::transfer::model::{AccountDoc, Leg, Legs, RollbackReason, TransferState};
use transfer_service::transfer::operations::{Created, ServiceError};
use transfer_service::transfer::protocol::Retention;
use transfer_service::transfer::recovery::RecoveryReport;
use transfer_service::transfer::requests::{Movement, NewTransfer};
use transfer_service::transfer::EngineConfig;

use crate::support::engine::*;
use crate::support::faulty::{Fault, Matcher};

/// The two ways a write's answer is lost once it was applied: an error (a timeout, a dropped
/// connection) or a refusal (409, as from a retried request). Each lost-answer test runs with
/// both.
const LOST_ANSWERS: [Fault; 2] = [Fault::FailAfter, Fault::ConflictAfter];

/// An instance with timers scaled to `lease`.
fn instance(w: &World, store: DynStore, lease: Duration) -> Instance {
    w.instance(store, EngineConfig::with_lease(lease))
}

/// [`instance`] running the two-phase protocol even on a store with transactions.
fn two_phase_instance(w: &World, store: DynStore, lease: Duration) -> Instance {
    let mut config = EngineConfig::with_lease(lease);
    config.one_transaction = false;
    w.instance(store, config)
}

/// A world (seeded, without jitter) and one instance on its fault injector, with timers scaled
/// to `lease`.
fn one_instance(seed: u64, lease: Duration) -> (World, Instance) {
    let w = world(seed, Duration::ZERO);
    let e = instance(&w, w.faulty.clone(), lease);
    (w, e)
}

/// [`one_instance`] with `a` (100) and `b` (0) open.
async fn a_and_b_on_one_instance(seed: u64, lease: Duration) -> (World, Instance) {
    let (w, e) = one_instance(seed, lease);
    open_a_and_b(&e).await;
    (w, e)
}

/// Holds the next write of account `b` for `stall` before it reaches the store: a transfer
/// from `a` to `b` stays `pending` there.
fn stall_the_write_of_b(w: &World, stall: Duration) {
    w.faulty.inject(
        Matcher::writes(Index::Accounts).of_doc("b"),
        Fault::StallBefore(stall),
        1,
    );
}

/// One recovery sweep of `e` over the transfers untouched since `modified_before`.
async fn sweep(e: &Instance, modified_before: i64) -> RecoveryReport {
    let permits = Arc::new(Semaphore::new(4));
    e.recovery()
        .recover_once(modified_before, &permits)
        .await
        .unwrap()
}

/// Drives recovery (as another instance would) until every transfer is terminal.
async fn quiesce(w: &World, recoverer: &Instance, limit: Duration) {
    recover_until_quiescent(w, recoverer, || 0, limit).await;
}

#[tokio::test(start_paused = true)]
async fn a_write_applied_but_unacknowledged_is_not_applied_twice() {
    for fault in LOST_ANSWERS {
        let (w, e) = a_and_b_on_one_instance(1, Duration::from_secs(5)).await;
        // Each account write is applied but answered with an error once: the worker retries the
        // same conditional write, which conflicts, re-reads and finds the step done.
        w.faulty.inject(Matcher::writes(Index::Accounts), fault, 4);
        start_transfer(&e, "t1", "a", "b", 30).await;
        quiesce(&w, &e, Duration::from_secs(20)).await;
        assert_eq!(w.faulty.fired.load(std::sync::atomic::Ordering::SeqCst), 4);
        assert_eq!(state(&e, "t1").await, TransferState::Finished);
        assert_eq!(balances_of_a_and_b(&e).await, (70, 30));
        assert_invariants(&w.base).await;
    }
}

#[tokio::test(start_paused = true)]
async fn state_writes_applied_but_unacknowledged_are_recovered() {
    for fault in LOST_ANSWERS {
        let (w, e) = a_and_b_on_one_instance(2, Duration::from_millis(300)).await;
        w.faulty
            .inject(Matcher::writes(Index::Transactions), fault, 3);
        start_transfer(&e, "t1", "a", "b", 30).await;
        quiesce(&w, &e, Duration::from_secs(20)).await;
        assert_eq!(balances_of_a_and_b(&e).await, (70, 30));
        assert_invariants(&w.base).await;
    }
}

/// A state write applied but answered with a conflict (a retry of a write whose first
/// attempt was applied unanswered, or Elasticsearch's own retry, elastic/elasticsearch#9967)
/// is the worker's own write: read back, it is taken as written and counted as the
/// transition it is, and the transfer goes on.
#[tokio::test(start_paused = true)]
async fn a_state_write_applied_but_answered_as_a_conflict_is_taken_as_written() {
    let w = world(10, Duration::ZERO);
    let e = two_phase_instance(&w, w.faulty.clone(), Duration::from_secs(5));
    open_a_and_b(&e).await;
    let pending_write = Matcher::writes(Index::Transactions).moving_to("pending");
    w.faulty.inject(pending_write, Fault::ConflictAfter, 1);
    start_transfer(&e, "t1", "a", "b", 30).await;
    assert_ends_by_itself(&e, "t1", TransferState::Finished).await;
    assert_eq!(w.faulty.fired.load(std::sync::atomic::Ordering::SeqCst), 1);
    let counted = |from, to| {
        e.metrics
            .transfer_state_transitions_total
            .with_label_values(&[from, to])
            .get()
    };
    assert_eq!(
        counted("created", "pending"),
        1,
        "the pending write counted"
    );
    assert_eq!(counted("pending", "committed"), 1);
    assert_eq!(balances_of_a_and_b(&e).await, (70, 30));
    assert_invariants(&w.base).await;
}

/// Two instances debit one hot account concurrently. Within an instance the steps for the
/// account are merged into fewer writes; between instances the merged writes conflict and
/// are read, decided and written again. The result is exact.
#[tokio::test(start_paused = true)]
async fn concurrent_transfers_on_one_account_merge_conflict_and_retry_to_an_exact_result() {
    let w = world(3, Duration::from_millis(2));
    let a = instance(&w, w.faulty.clone(), Duration::from_secs(5));
    let b = instance(&w, w.faulty.clone(), Duration::from_secs(5));
    open_account(&a, "hot", 1_000).await;
    for i in 0..8 {
        open_account(&a, &format!("c{i}"), 0).await;
    }
    let ids: Vec<String> = (0..60).map(|i| format!("t{i}")).collect();
    let mut starts = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let e = if i % 2 == 0 { a.clone() } else { b.clone() };
        let id = id.clone();
        starts.push(tokio::spawn(async move {
            start_transfer(&e, &id, "hot", &format!("c{}", i % 8), 10).await;
        }));
    }
    for s in starts {
        s.await.unwrap();
    }
    quiesce(&w, &a, Duration::from_secs(60)).await;
    assert_eq!(balance(&a, "hot").await, 400);
    let conflicts =
        a.store_requests("replace", "conflict") + b.store_requests("replace", "conflict");
    let writes = a.store_requests("replace", "ok") + b.store_requests("replace", "ok");
    eprintln!("{writes} conditional writes, {conflicts} conflicts");
    assert!(
        conflicts > 0,
        "two instances on one account must have conflicted"
    );
    // Unmerged: 3 transfer writes + 4 account writes per transfer.
    assert!(
        writes < 60 * 7,
        "account steps were merged: {writes} writes"
    );
    assert_invariants(&w.base).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancel_during_pending_makes_the_worker_roll_back() {
    let (w, e) = a_and_b_on_one_instance(4, Duration::from_secs(5)).await;
    // Hold the destination apply so the cancel lands while the transfer is pending (its
    // write: the account, opened by this instance, is remembered and not read).
    stall_the_write_of_b(&w, Duration::from_millis(1500));
    start_transfer(&e, "t1", "a", "b", 30).await;
    until_state(&e, "t1", TransferState::Pending, Duration::from_secs(10)).await;
    let cancelled = e.cancel_transfer("t1").await.unwrap();
    assert_eq!(cancelled.transaction_state, TransferState::Terminating);
    quiesce(&w, &e, Duration::from_secs(20)).await;
    let t = e.get_transfer("t1").await.unwrap().unwrap();
    assert_eq!(t.transaction_state, TransferState::RolledBack);
    assert_eq!(balances_of_a_and_b(&e).await, (100, 0));
    assert_invariants(&w.base).await;
}

#[tokio::test(start_paused = true)]
async fn transfers_older_than_the_timeout_roll_back_unless_committed() {
    let w = world(5, Duration::ZERO);
    let mut cfg = EngineConfig::with_lease(Duration::from_millis(200));
    cfg.transfer_timeout = Duration::ZERO;
    let e = w.instance(w.faulty.clone(), cfg);
    open_a_and_b(&e).await;
    // A zero timeout: every transfer is past it, so the worker rolls it back instead of
    // starting.
    start_transfer(&e, "t1", "a", "b", 30).await;
    quiesce(&w, &e, Duration::from_secs(20)).await;
    let t = e.get_transfer("t1").await.unwrap().unwrap();
    assert_eq!(t.transaction_state, TransferState::RolledBack);
    assert_eq!(t.reason.map(|r| r.as_str()), Some("timed_out"));
    assert_eq!(balance(&e, "a").await, 100);
    assert_invariants(&w.base).await;
}

/// The property tests' settings: `PROPTEST_CASES` cases (16 unless set), no failure files.
fn proptest_config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Runs `schedule` to its end on a runtime of its own, on tokio's paused time.
fn on_paused_time(schedule: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(schedule);
}

#[derive(Debug, Clone)]
enum Op {
    Transfer { from: usize, to: usize, amount: i64 },
    Replay(usize),
    Cancel(usize),
    Recover,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..4, 0usize..4, 1i64..80)
            .prop_filter("from ≠ to", |(f, t, _)| f != t)
            .prop_map(|(from, to, amount)| Op::Transfer { from, to, amount }),
        2 => (0usize..64).prop_map(Op::Replay),
        2 => (0usize..64).prop_map(Op::Cancel),
        1 => Just(Op::Recover),
    ]
}

/// A transfer request of the schedule: id, from, to, amount.
type Request = (String, usize, usize, i64);

type OpTask = tokio::task::JoinHandle<Result<(), ServiceError>>;

/// `one_transaction`: the store offers its transactions, so new transfers are settled in one
/// (`docs/design.md §3`, "In one transaction"); otherwise every transfer takes the two-phase
/// protocol.
async fn run_random_schedule(seed: u64, ops: Vec<Op>, one_transaction: bool) {
    let w = world(seed, Duration::from_millis(3));
    if one_transaction {
        w.faulty.forward_transactions();
    }
    // Two instances on one store; leases short enough to expire mid-transfer, so workers go
    // stale and get taken over while they still run.
    let lease = Duration::from_millis(40);
    let a = instance(&w, w.faulty.clone(), lease);
    let b = instance(&w, w.faulty.clone(), lease);
    for i in 0..4 {
        open_account(&a, &format!("acct{i}"), 100).await;
    }
    let mut requests: Vec<Request> = Vec::new();
    let mut tasks = Vec::new();
    let permits = Arc::new(Semaphore::new(64));
    for (n, op) in ops.into_iter().enumerate() {
        tasks.extend(spawn_op(n, op, &mut requests, &a, &b, &permits));
        if n % 3 == 0 {
            tokio::task::yield_now().await;
        }
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    quiesce(&w, &b, Duration::from_secs(60)).await;
    assert_invariants(&w.base).await;
    assert_each_id_is_one_transfer_as_requested(&a, &requests).await;
}

/// Starts one operation of the schedule: transfers on instance A, replays, cancels and
/// recovery sweeps on instance B.
fn spawn_op(
    n: usize,
    op: Op,
    requests: &mut Vec<Request>,
    a: &Instance,
    b: &Instance,
    permits: &Arc<Semaphore>,
) -> Option<OpTask> {
    let account = |i: usize| format!("acct{i}");
    let b = b.engine.clone();
    Some(match op {
        Op::Transfer { from, to, amount } => {
            let id = format!("t{n}");
            requests.push((id.clone(), from, to, amount));
            let (a, new) = (
                a.engine.clone(),
                transfer(&id, &account(from), &account(to), amount),
            );
            tokio::spawn(async move { a.create_transfer(new).await.map(|_| ()) })
        }
        Op::Replay(i) if !requests.is_empty() => {
            let (id, from, to, amount) = requests[i % requests.len()].clone();
            let new = transfer(&id, &account(from), &account(to), amount);
            // The original may still be in flight: a replay can race it.
            tokio::spawn(async move { b.create_transfer(new).await.map(|_| ()) })
        }
        Op::Cancel(i) if !requests.is_empty() => {
            let id = requests[i % requests.len()].0.clone();
            tokio::spawn(async move {
                match b.cancel_transfer(&id).await {
                    Ok(_) | Err(ServiceError::Conflict(_)) | Err(ServiceError::NotFound) => Ok(()),
                    Err(e) => Err(e),
                }
            })
        }
        Op::Recover => {
            let permits = permits.clone();
            tokio::spawn(async move {
                let now = b.clock().wall_millis();
                b.recovery()
                    .recover_once(now, &permits)
                    .await
                    .map(|_| ())
                    .map_err(ServiceError::from)
            })
        }
        _ => return None,
    })
}

/// Each id is one transfer with the request it was created with.
async fn assert_each_id_is_one_transfer_as_requested(a: &Instance, requests: &[Request]) {
    let mut seen = HashMap::new();
    for (id, from, to, amount) in requests {
        let t = transfer_doc(a, id).await;
        let requested = Leg {
            from: format!("acct{from}"),
            to: format!("acct{to}"),
            amount: *amount,
        };
        assert_eq!(t.legs, Legs::OneLeg(requested));
        assert!(seen.insert(id.clone(), t.transaction_state).is_none());
    }
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn random_transfers_replays_and_cancels_keep_every_invariant(
        seed in any::<u64>(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        for one_transaction in [false, true] {
            eprintln!("seed {seed}, {} ops, one transaction: {one_transaction}", ops.len());
            on_paused_time(run_random_schedule(seed, ops.clone(), one_transaction));
        }
    }
}

/// Review finding: an instance must not settle a transfer on its remembered copy of an
/// account when nothing would be written (nothing would check the copy). Instance A caches
/// both accounts; instance B commits `t` and dies before cleaning the accounts; A recovers
/// `t` and must really remove the pending ids.
#[tokio::test(start_paused = true)]
async fn recovery_does_not_trust_a_remembered_account_copy_without_writing() {
    let w = world(6, Duration::ZERO);
    // The remembered copies are the two-phase protocol's: a store's transactions need none.
    let a = two_phase_instance(&w, w.base.clone(), Duration::from_millis(300));
    open_a_and_b(&a).await;
    start_transfer(&a, "warm", "a", "b", 1).await;
    assert_ends_by_itself(&a, "warm", TransferState::Finished).await;
    // Instance B crashes right before core step 5 (remove from the source).
    let b = instance(&w, w.faulty.clone(), Duration::from_millis(300));
    w.faulty.inject(
        Matcher::writes(Index::Accounts)
            .of_doc("a")
            .leaving_pending(0),
        Fault::Crash { applied: false },
        1,
    );
    start_transfer(&b, "t", "a", "b", 10).await;
    until(
        "B to reach core step 5",
        Duration::from_secs(10),
        || async { w.faulty.is_dead() },
    )
    .await;
    quiesce(&w, &a, Duration::from_secs(20)).await;
    assert_eq!(state(&a, "t").await, TransferState::Finished);
    assert_invariants(&w.base).await;
}

/// Review finding: a debit refused on a remembered copy that another instance has since
/// credited must be decided again on a fresh read.
#[tokio::test(start_paused = true)]
async fn a_refusal_is_never_decided_on_a_stale_remembered_copy() {
    let w = world(7, Duration::ZERO);
    // The remembered copies are the two-phase protocol's: a store's transactions need none.
    let a = two_phase_instance(&w, w.base.clone(), Duration::from_secs(5));
    let b = two_phase_instance(&w, w.base.clone(), Duration::from_secs(5));
    open_account(&a, "poor", 0).await;
    open_account(&a, "rich", 100).await;
    open_account(&a, "other", 0).await;
    // A remembers `poor` at balance 0 after crediting it once and spending it.
    start_transfer(&a, "in", "rich", "poor", 5).await;
    terminal_without_recovery(&a, "in").await;
    start_transfer(&a, "out", "poor", "other", 5).await;
    terminal_without_recovery(&a, "out").await;
    // B credits `poor` with 50; A then debits 5 from it.
    start_transfer(&b, "credit", "rich", "poor", 50).await;
    terminal_without_recovery(&b, "credit").await;
    start_transfer(&a, "debit", "poor", "other", 5).await;
    assert_ends_by_itself(&a, "debit", TransferState::Finished).await;
    assert_eq!(balance(&a, "poor").await, 45);
    assert_invariants(&w.base).await;
}

/// Review finding: when the answer to the create is lost but the write happened, the retry
/// finds our own document: it is a new transfer (201) and this request's worker drives it at
/// once, instead of leaving it to recovery minutes later.
#[tokio::test(start_paused = true)]
async fn a_create_whose_answer_was_lost_is_still_driven_at_once() {
    for fault in LOST_ANSWERS {
        let (w, e) = a_and_b_on_one_instance(8, Duration::from_secs(30)).await;
        w.faulty
            .inject(Matcher::creates(Index::Transactions), fault, 1);
        let created = e
            .create_transfer(transfer("t", "a", "b", 10))
            .await
            .unwrap();
        assert!(matches!(created, Created::New(_)), "{created:?}");
        assert_ends_by_itself(&e, "t", TransferState::Finished).await;
        assert_invariants(&w.base).await;
    }
}

/// Accounts `a` (100) and `b` (0), and a transfer `t` of 10 left `pending` by a worker that
/// died a minute ago (its lease ran out), with nothing applied yet.
async fn abandoned_pending_transfer(e: &Instance, store: &DynStore) {
    open_account(e, "a", 100).await;
    open_account(e, "b", 0).await;
    let now = e.clock().wall_millis();
    plant_abandoned_pending(store, "t", ("a", "b", 10), now).await;
}

/// Review finding: a takeover write whose answer is lost but which was applied leaves our
/// lease in the transfer; recovery must drive it then, not leave it for a lease period.
#[tokio::test(start_paused = true)]
async fn a_takeover_whose_answer_was_lost_is_driven_at_once() {
    for fault in LOST_ANSWERS {
        let (w, e) = one_instance(9, Duration::from_secs(30));
        abandoned_pending_transfer(&e, &w.base).await;
        w.faulty
            .inject(Matcher::writes(Index::Transactions).of_doc("t"), fault, 1);
        let report = sweep(&e, e.clock().wall_millis()).await;
        assert_eq!(report.resumed, 1, "{report:?}");
        assert_ends_by_itself(&e, "t", TransferState::Finished).await;
        assert_invariants(&w.base).await;
    }
}

/// Review finding: a cancel whose answer is lost but which was applied (and took the lease
/// for a worker of its own) drives the rollback at once.
#[tokio::test(start_paused = true)]
async fn a_cancel_whose_answer_was_lost_is_driven_at_once() {
    for fault in LOST_ANSWERS {
        let (w, e) = one_instance(10, Duration::from_secs(30));
        abandoned_pending_transfer(&e, &w.base).await;
        w.faulty.inject(
            Matcher::writes(Index::Transactions)
                .of_doc("t")
                .moving_to("terminating"),
            fault,
            1,
        );
        let cancelled = e.cancel_transfer("t").await.unwrap();
        assert_eq!(cancelled.transaction_state, TransferState::Terminating);
        assert_ends_by_itself(&e, "t", TransferState::RolledBack).await;
        assert_eq!(balances_of_a_and_b(&e).await, (100, 0));
        assert_invariants(&w.base).await;
    }
}

/// Review finding (R1): an account create whose answer was lost but which was applied is the
/// new account (201), not a replay (200): the retry finds the create's own token in it.
#[tokio::test(start_paused = true)]
async fn an_account_create_whose_answer_was_lost_is_new() {
    for fault in LOST_ANSWERS {
        let (w, e) = one_instance(11, Duration::from_secs(30));
        w.faulty.inject(Matcher::creates(Index::Accounts), fault, 1);
        let created = e.create_account(new_account("a", 100)).await.unwrap();
        assert!(matches!(created, Created::New(_)), "{fault:?}: {created:?}");
        let replay = e.create_account(new_account("a", 100)).await.unwrap();
        assert!(
            matches!(replay, Created::Replayed(_)),
            "{fault:?}: {replay:?}"
        );
    }
}

/// An instance whose accounts hold at most two pending entries (`SETTLED_MAX`; with them,
/// tombstones an older version left, which this one only ages out). It runs the two-phase
/// protocol, whose applies leave the entries (a transfer settled in one store transaction
/// leaves none).
fn two_pending_at_most(w: &World) -> Instance {
    let mut config = EngineConfig::with_lease(Duration::from_secs(5));
    config.one_transaction = false;
    config.retention = Retention {
        millis: 3_600_000,
        max_entries: 2,
    };
    w.instance(w.base.clone(), config)
}

/// Two holds parked on `a` fill it: their entries stay until each is captured or cancelled.
async fn two_holds_parked_on_a(e: &Instance) {
    open_account(e, "a", 100).await;
    open_account(e, "b", 0).await;
    for id in ["h1", "h2"] {
        let created = e
            .create_transfer(hold(id, "a", "b", 10, Duration::from_secs(3600)))
            .await
            .expect("hold accepted");
        assert!(matches!(created, Created::New(_)), "{created:?}");
        until(&format!("{id} parked"), Duration::from_secs(10), || async {
            transfer_doc(e, id).await.lease_owner.as_deref() == Some(PARKED)
        })
        .await;
    }
}

/// A world whose account `a` is full of two parked holds (`h1`, `h2`, 10 each to `b`) when
/// transfer `t3` (10 from `a` to `b`) starts.
async fn t3_behind_two_parked_holds(seed: u64) -> (World, Instance) {
    let w = world(seed, Duration::ZERO);
    let e = two_pending_at_most(&w);
    two_holds_parked_on_a(&e).await;
    start_transfer(&e, "t3", "a", "b", 10).await;
    (w, e)
}

#[tokio::test(start_paused = true)]
async fn an_account_full_of_pending_entries_backs_off_then_sheds() {
    let (w, e) = t3_behind_two_parked_holds(12).await;
    terminal_without_recovery(&e, "t3").await;
    let shed = transfer_doc(&e, "t3").await;
    assert_eq!(shed.transaction_state, TransferState::RolledBack);
    assert_eq!(shed.reason.map(|r| r.as_str()), Some("account_busy"));
    let a = e.get_account("a").await.unwrap().unwrap();
    assert_eq!(a.pending_transactions, ["h1", "h2"]);
    assert_eq!(balances_of_a_and_b(&e).await, (80, 20));
    release_holds(&e, &["h1", "h2"]).await;
    assert_eq!(balances_of_a_and_b(&e).await, (100, 0));
    assert_invariants(&w.base).await;
}

/// Cancels each hold and waits until it has rolled back.
async fn release_holds(e: &Instance, ids: &[&str]) {
    for id in ids {
        e.cancel_transfer(id).await.expect("cancelled");
        assert_ends_by_itself(e, id, TransferState::RolledBack).await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_apply_that_backs_off_goes_through_once_an_entry_settles() {
    let (w, e) = t3_behind_two_parked_holds(13).await;
    e.capture_transfer("h1", None).await.expect("captured");
    assert_ends_by_itself(&e, "t3", TransferState::Finished).await;
    release_holds(&e, &["h2"]).await;
    assert_eq!(balances_of_a_and_b(&e).await, (80, 20));
    assert_invariants(&w.base).await;
}

/// A contradiction (`pending`, yet the source already holds the transfer's settled
/// tombstone: what a lost acknowledged write leaves) is flagged for a person and left alone:
/// no apply, no takeover, no timeout rollback, no cancel; the gauge counts it.
#[tokio::test(start_paused = true)]
async fn a_transfer_whose_documents_contradict_each_other_is_flagged_and_left_alone() {
    let w = world(14, Duration::ZERO);
    let mut config = EngineConfig::with_lease(Duration::from_secs(1));
    config.transfer_timeout = Duration::from_secs(10);
    let e = w.instance(w.base.clone(), config);
    open_a_and_b(&e).await;
    tombstone_on(&w, "a", "t").await;
    start_transfer(&e, "t", "a", "b", 10).await;
    until("t to be flagged", Duration::from_secs(10), || async {
        transfer_doc(&e, "t").await.attention.is_some()
    })
    .await;
    let t = transfer_doc(&e, "t").await;
    assert_eq!(t.transaction_state, TransferState::Pending);
    assert_eq!(t.lease_owner, None, "nobody holds it");
    // Past the lease and the transfer timeout, recovery neither takes it nor rolls it back.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let report = sweep(&e, w.now_millis()).await;
    assert_eq!(
        (report.resumed, report.needs_attention),
        (0, 1),
        "{report:?}"
    );
    assert_eq!(e.metrics.transfers_needing_attention.get(), 1);
    assert_eq!(state(&e, "t").await, TransferState::Pending);
    assert!(matches!(
        e.cancel_transfer("t").await,
        Err(ServiceError::Conflict(_))
    ));
    assert_eq!(balances_of_a_and_b(&e).await, (100, 0));
    let report = transfer_service::audit::audit(w.base.as_ref(), i64::MAX)
        .await
        .unwrap();
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.kind == transfer_service::audit::ViolationKind::NeedsAttention),
        "the audit reports it: {report}"
    );
}

/// Plants `transfer_id`'s settled tombstone on `account`, as a settlement whose transfer
/// write was later lost would leave it.
async fn tombstone_on(w: &World, account: &str, transfer_id: &str) {
    let current = w.base.get(Index::Accounts, account).await.unwrap().unwrap();
    let mut doc = decode::<AccountDoc>(current).unwrap();
    doc.doc.settled.push(transfer_id, w.now_millis());
    let source = Source::encode(&doc.doc).unwrap();
    let written = w
        .base
        .replace_if(Index::Accounts, account, source, doc.version)
        .await
        .unwrap();
    assert!(written.written().is_some());
}

/// Review finding (R4): a transfer whose lease was released at shutdown is a recovery
/// candidate at once for every other instance, not after `RECOVERY_STALE_AFTER`.
#[tokio::test(start_paused = true)]
async fn a_transfer_released_at_shutdown_is_resumed_by_another_instance_at_once() {
    let w = world(15, Duration::ZERO);
    let a = instance(&w, w.faulty.clone(), Duration::from_secs(30));
    let b = instance(&w, w.base.clone(), Duration::from_secs(30));
    open_a_and_b(&a).await;
    // A's worker is in the middle of the destination apply (its write) when A shuts down.
    stall_the_write_of_b(&w, Duration::from_secs(1));
    start_transfer(&a, "t", "a", "b", 10).await;
    until_state(&a, "t", TransferState::Pending, Duration::from_secs(5)).await;
    a.shut_down();
    until("A's worker to stop", Duration::from_secs(10), || async {
        a.running_tasks() == 0
    })
    .await;
    assert_eq!(transfer_doc(&b, "t").await.lease_owner, None, "released");
    // B's recovery looks only at transfers untouched for two minutes, yet resumes t now.
    let two_minutes_ago = w.now_millis() - 120_000;
    let report = sweep(&b, two_minutes_ago).await;
    assert_eq!(report.resumed, 1, "{report:?}");
    assert_ends_by_itself(&b, "t", TransferState::Finished).await;
    assert_invariants(&w.base).await;
}

// Holds, multi-leg transactions and currencies in the property test: plain transfers (some
// stating a currency, some between accounts of different currencies), multi-leg transactions
// of 2 to 4 legs (an account possibly in several) and holds of either kind, captured whole or
// (one-leg only) in part, cancelled, replayed or left to expire, on paused time with `TRANSFER_TIMEOUT` far shorter
// than many holds wait. At the end every transfer is terminal or a hold legitimately waiting
// (parked, uncaptured, not yet expired); those are then captured, cancelled or left to
// expire, and the world must end quiescent, clean and exact.

/// The currency of each account of the holds schedule: four have none, two are in USD, one
/// in EUR, so a random pair often disagrees.
const CURRENCIES: [Option<&str>; 7] = [
    None,
    None,
    None,
    None,
    Some("USD"),
    Some("USD"),
    Some("EUR"),
];

/// How much each account of the holds schedule opens with.
const OPENING: i64 = 100;

#[derive(Debug, Clone)]
enum HoldOp {
    /// A plain transfer, stating `currency` or not.
    Transfer {
        from: usize,
        to: usize,
        amount: i64,
        currency: Option<&'static str>,
    },
    /// A hold that waits `expires_ms` for its capture.
    Hold {
        from: usize,
        to: usize,
        amount: i64,
        currency: Option<&'static str>,
        expires_ms: u64,
    },
    /// A multi-leg transaction of 2 to 4 `(from, to, amount)` legs, a hold waiting
    /// `expires_ms` if that is given.
    Legs {
        legs: Vec<(usize, usize, i64)>,
        currency: Option<&'static str>,
        expires_ms: Option<u64>,
    },
    /// A capture of the i-th request (plain or hold): the whole amount, or `percent` of it.
    Capture {
        i: usize,
        percent: Option<u8>,
    },
    Cancel(usize),
    /// An identical replay of the i-th request.
    Replay(usize),
    Recover,
    /// The schedule waits this long (virtual time) before its next operation.
    Sleep(u64),
}

/// Mostly pairs that share a currency (none, or USD), sometimes any two accounts.
fn account_pair() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![
        6 => (0usize..4, 1usize..4).prop_map(|(f, d)| (f, (f + d) % 4)),
        2 => prop::bool::ANY.prop_map(|b| if b { (4, 5) } else { (5, 4) }),
        2 => (0usize..7, 1usize..7).prop_map(|(f, d)| (f, (f + d) % 7)),
    ]
}

/// 2 to 4 legs, mostly among accounts that share a currency (none, or USD), sometimes among
/// any; an account may be in several legs.
fn leg_list() -> impl Strategy<Value = Vec<(usize, usize, i64)>> {
    let within = |first: usize, n: usize| {
        prop::collection::vec((0..n, 1..n, 1i64..30), 2..=4).prop_map(move |legs| {
            legs.into_iter()
                .map(|(f, d, amount)| (first + f, first + (f + d) % n, amount))
                .collect()
        })
    };
    prop_oneof![6 => within(0, 4), 2 => within(4, 2), 2 => within(0, 7)]
}

fn stated_currency() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![8 => Just(None), 1 => Just(Some("USD")), 1 => Just(Some("EUR"))]
}

fn hold_op() -> impl Strategy<Value = HoldOp> {
    prop_oneof![
        4 => (account_pair(), 1i64..40, stated_currency()).prop_map(
            |((from, to), amount, currency)| HoldOp::Transfer { from, to, amount, currency }
        ),
        4 => (account_pair(), 1i64..40, stated_currency(), 20u64..3_000).prop_map(
            |((from, to), amount, currency, expires_ms)| HoldOp::Hold {
                from, to, amount, currency, expires_ms,
            }
        ),
        3 => (leg_list(), stated_currency(), prop::option::of(20u64..3_000)).prop_map(
            |(legs, currency, expires_ms)| HoldOp::Legs { legs, currency, expires_ms }
        ),
        3 => (0usize..64, prop::option::of(1u8..=100))
            .prop_map(|(i, percent)| HoldOp::Capture { i, percent }),
        2 => (0usize..64).prop_map(HoldOp::Cancel),
        1 => (0usize..64).prop_map(HoldOp::Replay),
        1 => Just(HoldOp::Recover),
        1 => (10u64..1_500).prop_map(HoldOp::Sleep),
    ]
}

/// Whether the currency rule refuses a transfer touching `accounts` stating `stated`: they
/// do not all share one currency (or all have none), or the stated one is not theirs.
fn currency_mismatch(accounts: &[usize], stated: Option<&str>) -> bool {
    let first = CURRENCIES[accounts[0]];
    accounts.iter().any(|&a| CURRENCIES[a] != first) || stated.is_some_and(|s| Some(s) != first)
}

/// A request's legs as `(from, to, amount)` account indices: its one leg, or its legs.
fn requested_legs(new: &NewTransfer) -> Vec<(usize, usize, i64)> {
    new.movement()
        .leg_list()
        .iter()
        .map(|l| (account_of(&l.from), account_of(&l.to), l.amount))
        .collect()
}

/// Whether a request is a multi-leg transaction (else a one-leg transfer).
fn is_multi_leg(new: &NewTransfer) -> bool {
    new.movement().leg_list().len() > 1
}

fn account_name(i: usize) -> String {
    format!("acct{i}")
}

fn account_of(name: &str) -> usize {
    name.trim_start_matches("acct").parse().unwrap()
}

/// What a client was told, by transfer id: each capture answered `200` with the amount it
/// asked for and the state shown, each cancel answered `200` with the state shown.
#[derive(Debug, Default)]
struct Answers {
    captured: HashMap<String, Vec<(i64, TransferState)>>,
    cancelled: HashMap<String, Vec<TransferState>>,
}

type SharedAnswers = Arc<std::sync::Mutex<Answers>>;

/// The engine's timers for the holds schedule: leases short enough to expire mid-transfer,
/// and a transfer timeout (1 s) shorter than many holds wait (up to 3 s).
fn holds_config() -> EngineConfig {
    EngineConfig {
        transfer_timeout: Duration::from_secs(1),
        ..EngineConfig::with_lease(Duration::from_millis(40))
    }
}

async fn capture_and_record(e: &Instance, id: &str, n: Option<i64>, answers: &SharedAnswers) {
    let asked = match n {
        Some(n) => n,
        None => match e.get_transfer(id).await.expect("read") {
            Some(t) => t.amount(),
            None => return,
        },
    };
    match e.capture_transfer(id, n).await {
        Ok(t) => answers
            .lock()
            .unwrap()
            .captured
            .entry(id.to_owned())
            .or_default()
            .push((asked, t.transaction_state)),
        Err(ServiceError::Conflict(_)) | Err(ServiceError::NotFound) => {}
        Err(e) => panic!("capture {id}: {e:?}"),
    }
}

async fn cancel_and_record(e: &Instance, id: &str, answers: &SharedAnswers) {
    match e.cancel_transfer(id).await {
        Ok(t) => answers
            .lock()
            .unwrap()
            .cancelled
            .entry(id.to_owned())
            .or_default()
            .push(t.transaction_state),
        Err(ServiceError::Conflict(_)) | Err(ServiceError::NotFound) => {}
        Err(e) => panic!("cancel {id}: {e:?}"),
    }
}

/// Starts the create of `new` on `e`, which must succeed.
fn spawn_create(e: &Arc<Instance>, new: NewTransfer) -> tokio::task::JoinHandle<()> {
    let e = e.clone();
    tokio::spawn(async move { e.create_transfer(new).await.map(|_| ()).unwrap() })
}

async fn run_holds_schedule(seed: u64, ops: Vec<HoldOp>) {
    let w = world(seed, Duration::from_millis(3));
    let a = Arc::new(w.instance(w.faulty.clone(), holds_config()));
    let b = Arc::new(w.instance(w.faulty.clone(), holds_config()));
    for (i, currency) in CURRENCIES.iter().enumerate() {
        let created = a
            .create_account(
                new_account(&account_name(i), OPENING)
                    .with_currency(currency.map(crate::support::engine::currency)),
            )
            .await
            .expect("account opens");
        assert!(matches!(created, Created::New(_)));
    }
    let answers = SharedAnswers::default();
    let mut requests: Vec<NewTransfer> = Vec::new();
    let mut tasks = Vec::new();
    let permits = Arc::new(Semaphore::new(64));
    for (n, op) in ops.into_iter().enumerate() {
        let pick = |i: usize| requests[i % requests.len()].clone();
        let task = match op {
            HoldOp::Transfer {
                from,
                to,
                amount,
                currency,
            } => {
                let new = transfer(
                    &format!("t{n}"),
                    &account_name(from),
                    &account_name(to),
                    amount,
                )
                .with_currency(currency.map(crate::support::engine::currency));
                requests.push(new.clone());
                spawn_create(&a, new)
            }
            HoldOp::Hold {
                from,
                to,
                amount,
                currency,
                expires_ms,
            } => {
                let new = hold(
                    &format!("h{n}"),
                    &account_name(from),
                    &account_name(to),
                    amount,
                    Duration::from_millis(expires_ms),
                )
                .with_currency(currency.map(crate::support::engine::currency));
                requests.push(new.clone());
                spawn_create(&a, new)
            }
            HoldOp::Legs {
                legs,
                currency,
                expires_ms,
            } => {
                let legs: Vec<Leg> = legs
                    .into_iter()
                    .map(|(from, to, amount)| Leg {
                        from: account_name(from),
                        to: account_name(to),
                        amount,
                    })
                    .collect();
                let id = format!("{}{n}", if expires_ms.is_some() { "lh" } else { "l" });
                let new =
                    NewTransfer::new(transfer_id(&id), Movement::legs(legs).expect("valid legs"))
                        .with_hold(expires_ms.and_then(|ms| hold_for(Duration::from_millis(ms))))
                        .with_currency(currency.map(crate::support::engine::currency));
                requests.push(new.clone());
                spawn_create(&a, new)
            }
            HoldOp::Replay(i) if !requests.is_empty() => {
                // The original may still be in flight: a replay can race it.
                spawn_create(&b, pick(i))
            }
            HoldOp::Capture { i, percent } if !requests.is_empty() => {
                let new = pick(i);
                let n = percent.map(|p| (new.movement().amount() * i64::from(p) / 100).max(1));
                let (b, answers) = (b.clone(), answers.clone());
                match n {
                    // A multi-leg hold is captured whole only: a part is refused (422) and
                    // changes nothing; a multi-leg transfer that is not a hold is refused as
                    // any such (409); one still being created is not found.
                    Some(part) if is_multi_leg(&new) && part != new.movement().amount() => {
                        tokio::spawn(async move {
                            let refused = b.capture_transfer(new.id(), Some(part)).await;
                            let hold = new.hold().is_some();
                            assert!(
                                matches!(
                                    (&refused, hold),
                                    (Err(ServiceError::Invalid(_)), true)
                                        | (Err(ServiceError::Conflict(_)), false)
                                        | (Err(ServiceError::NotFound), _)
                                ),
                                "{}: a capture of {part} of {}: {refused:?}",
                                **new.id(),
                                new.movement().amount()
                            );
                        })
                    }
                    _ => {
                        tokio::spawn(
                            async move { capture_and_record(&b, new.id(), n, &answers).await },
                        )
                    }
                }
            }
            HoldOp::Cancel(i) if !requests.is_empty() => {
                let id = pick(i).id().clone();
                let (b, answers) = (b.clone(), answers.clone());
                tokio::spawn(async move { cancel_and_record(&b, &id, &answers).await })
            }
            HoldOp::Recover => {
                let (b, permits) = (b.clone(), permits.clone());
                tokio::spawn(async move {
                    let now = b.clock().wall_millis();
                    b.recovery()
                        .recover_once(now, &permits)
                        .await
                        .expect("recovery sweep");
                })
            }
            HoldOp::Sleep(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                continue;
            }
            _ => continue,
        };
        tasks.push(task);
        if n % 3 == 0 {
            tokio::task::yield_now().await;
        }
    }
    for task in tasks {
        task.await.unwrap();
    }

    // Everything is terminal or a hold legitimately waiting; resolve those in turn.
    let waiting = settle_to_waiting_holds(&w, &a, &b, &requests).await;
    eprintln!(
        "seed {seed}: {} requests, {} holds waiting at the end",
        requests.len(),
        waiting.len()
    );
    for (k, id) in waiting.iter().enumerate() {
        match (seed as usize + k) % 4 {
            0 => capture_and_record(&b, id, None, &answers).await,
            // A multi-leg hold is captured whole only.
            1 if transfer_doc(&b, id).await.is_multi_leg() => {
                capture_and_record(&b, id, None, &answers).await
            }
            1 => {
                let half = (transfer_doc(&b, id).await.amount() / 2).max(1);
                capture_and_record(&b, id, Some(half), &answers).await
            }
            2 => cancel_and_record(&b, id, &answers).await,
            // Left to expire.
            _ => {}
        }
    }
    // Past every hold's expiry (at most 3 s after its creation).
    tokio::time::sleep(Duration::from_secs(4)).await;
    recover_until_quiescent(&w, &b, || a.running_tasks(), Duration::from_secs(60)).await;
    assert_invariants(&w.base).await;
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    assert_holds_outcomes(&b, &requests, &waiting, &answers).await;
}

/// Runs recovery until no worker runs and every transfer is terminal or a hold waiting for
/// its capture: parked, uncaptured, `pending`, before its expiry. Returns those holds.
async fn settle_to_waiting_holds(
    w: &World,
    a: &Instance,
    b: &Instance,
    requests: &[NewTransfer],
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let permits = Arc::new(Semaphore::new(64));
    loop {
        b.recovery()
            .recover_once(w.now_millis() + 1, &permits)
            .await
            .expect("recovery sweep");
        let mut waiting = Vec::new();
        let mut busy = Vec::new();
        if a.running_tasks() + b.running_tasks() == 0 {
            for new in requests {
                let t = transfer_doc(b, new.id()).await;
                if t.transaction_state.is_terminal() {
                    continue;
                }
                let legitimately_waiting = t.is_hold()
                    && t.transaction_state == TransferState::Pending
                    && t.captured_amount.is_none()
                    && t.lease_owner.as_deref() == Some(transfer_service::transfer::lease::PARKED)
                    && t.hold_expires_at.unwrap().millis() > w.now_millis();
                if legitimately_waiting {
                    waiting.push(t.transaction_id);
                } else {
                    busy.push(format!("{} {:?}", t.transaction_id, t));
                }
            }
            if busy.is_empty() {
                waiting.dedup();
                return waiting;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "neither terminal nor a hold waiting: {busy:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each request's transfer ended as its rules say, and the balances follow exactly from the
/// transfers that finished.
async fn assert_holds_outcomes(
    e: &Instance,
    requests: &[NewTransfer],
    waiting: &[String],
    answers: &Answers,
) {
    let mut expected = [OPENING; CURRENCIES.len()];
    let mut seen = HashMap::new();
    let mut outcomes: std::collections::BTreeMap<String, usize> = Default::default();
    for new in requests {
        if seen.insert(new.id().to_string(), ()).is_some() {
            continue;
        }
        let t = transfer_doc(e, new.id()).await;
        let id: &String = new.id();
        assert_eq!(
            (
                t.leg_list(),
                t.is_multi_leg(),
                t.amount(),
                t.currency.as_deref(),
                t.is_hold()
            ),
            (
                new.movement().leg_list().to_vec(),
                is_multi_leg(new),
                new.movement().amount(),
                new.currency().map(|c| c.as_str()),
                new.hold().is_some()
            ),
            "{id}: the transfer as requested"
        );
        let legs = requested_legs(new);
        let touched: Vec<usize> = legs.iter().flat_map(|&(f, d, _)| [f, d]).collect();
        let mismatch = currency_mismatch(&touched, new.currency().map(|c| c.as_str()));
        let state = t.transaction_state;
        assert!(state.is_terminal(), "{id} left {state}");
        // The currency rule: a mismatch never moves a unit; only a mismatch rolls back so.
        if mismatch {
            assert_eq!(state, TransferState::RolledBack, "{id}: between currencies");
        }
        if t.reason == Some(RollbackReason::CurrencyMismatch) {
            assert!(mismatch, "{id}: currency_mismatch between one currency");
        }
        let captures = answers.captured.get(id).cloned().unwrap_or_default();
        let cancels = answers.cancelled.get(id).cloned().unwrap_or_default();
        let capture_won = captures
            .iter()
            .any(|(_, shown)| matches!(shown, TransferState::Committed | TransferState::Finished));
        if new.hold().is_some() {
            assert_ne!(
                t.reason,
                Some(RollbackReason::TimedOut),
                "{id}: TRANSFER_TIMEOUT applied to a hold"
            );
            if state == TransferState::Finished {
                let n = t.captured_amount.expect("a finished hold was captured");
                assert!(
                    0 < n && n <= t.amount(),
                    "{id}: captured {n} of {}",
                    t.amount()
                );
                if is_multi_leg(new) {
                    assert_eq!(n, t.amount(), "{id}: a multi-leg hold captured in part");
                }
                for (asked, _) in &captures {
                    assert_eq!(*asked, n, "{id}: a capture of another amount answered 200");
                }
            }
            if capture_won {
                assert_eq!(
                    state,
                    TransferState::Finished,
                    "{id}: captured, then {state}"
                );
            }
            if !cancels.is_empty() {
                assert_eq!(
                    state,
                    TransferState::RolledBack,
                    "{id}: cancelled, then {state}"
                );
            }
            // A recorded capture wins over a cancel and the expiry: only a refused apply
            // (funds, currency) rolls a captured hold back.
            if let (Some(n), TransferState::RolledBack) = (t.captured_amount, state) {
                assert!(
                    !matches!(
                        t.reason,
                        Some(RollbackReason::Cancelled | RollbackReason::Expired)
                    ),
                    "{id}: captured for {n}, then rolled back with {:?}",
                    t.reason
                );
            }
            if t.reason == Some(RollbackReason::Expired) {
                assert!(!capture_won, "{id}: captured and expired");
                assert!(
                    t.modification_time >= *t.hold_expires_at.as_ref().unwrap(),
                    "{id}: expired before its time"
                );
            }
            if waiting.contains(id) && state == TransferState::RolledBack {
                assert!(
                    matches!(
                        t.reason,
                        Some(RollbackReason::Cancelled | RollbackReason::Expired)
                    ),
                    "{id}: a waiting hold rolled back with {:?}",
                    t.reason
                );
            }
        } else {
            assert_eq!(t.captured_amount, None, "{id}: a plain transfer captured");
            assert!(
                captures.is_empty(),
                "{id}: a capture of a plain transfer answered 200"
            );
            assert_ne!(t.reason, Some(RollbackReason::Expired), "{id}");
        }
        // What the request asked for, leg by leg (a captured one-leg hold moves the captured
        // amount); an account in several legs gets their sum.
        if state == TransferState::Finished {
            for (from, to, amount) in legs {
                let moved = if !is_multi_leg(new) {
                    t.captured_amount.unwrap_or(amount)
                } else {
                    amount
                };
                expected[from] -= moved;
                expected[to] += moved;
            }
        }
        let shape = if is_multi_leg(new) { "legs " } else { "" };
        let kind = match (new.hold().is_some(), t.captured_amount, t.reason) {
            (true, Some(n), _) if n < t.amount() => format!("{shape}hold captured in part"),
            (true, Some(_), _) => format!("{shape}hold captured whole"),
            (hold, _, reason) => format!(
                "{shape}{} {state} {}",
                if hold { "hold" } else { "plain" },
                reason.map_or("", |r| r.as_str())
            ),
        };
        *outcomes.entry(kind).or_insert(0) += 1;
    }
    eprintln!("outcomes: {outcomes:?}");
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(
            balance(e, &account_name(i)).await,
            *want,
            "{}",
            account_name(i)
        );
    }
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn random_transfers_holds_captures_cancels_expiries_and_currencies_keep_every_invariant(
        seed in any::<u64>(),
        ops in prop::collection::vec(hold_op(), 1..40),
    ) {
        eprintln!("seed {seed}, {} ops", ops.len());
        on_paused_time(run_holds_schedule(seed, ops));
    }
}
