//! Multi-leg transactions in the protocol (`docs/design.md §3`, "Multi-leg transactions"):
//! all legs apply or none; one pending entry per account carries its net change, so an
//! account in several legs is applied, settled and undone once and its floor is checked on
//! its net debit; a refusal names the account; every step boundary survives errors, crashes
//! and stalls; a stalled worker never applies one twice; the late-apply sweep undoes a late
//! entry by the account's net change.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use transfer_service::transfer::entries::EntryKind;
use transfer_service::transfer::lease::PARKED;
use transfer_service::transfer::model::{AccountDoc, Legs, RollbackReason, TransferState};
use transfer_service::transfer::operations::{Created, ServiceError};
use transfer_service::transfer::requests::{NewAccount, NewTransfer};
use transfer_service::transfer::{Engine, EngineConfig};

use crate::support::engine::*;
use crate::support::faulty::{Fault, FaultyStore, StepWrite, STEP_FAULTS};
use crate::support::step_faults::*;

/// A world (seeded, without jitter) with one instance of `config` straight on its store.
fn on_the_store(seed: u64, config: EngineConfig) -> (World, Instance) {
    let w = world(seed, Duration::ZERO);
    let e = w.instance(w.base.clone(), config);
    (w, e)
}

/// [`step_fault_config`], settling in one store transaction if `one_transaction`, else by the
/// two-phase protocol.
fn settling(one_transaction: bool) -> EngineConfig {
    EngineConfig {
        one_transaction,
        ..step_fault_config()
    }
}

/// Opens `a`, `b` and `c` with 100 each.
async fn open_a_b_and_c(e: &Engine) {
    for id in ["a", "b", "c"] {
        open_account(e, id, 100).await;
    }
}

async fn open_with_floor(e: &Engine, id: &str, balance: i64, floor: i64) {
    let created = e
        .create_account(
            NewAccount::open(account_id(id), balance, floor)
                .expect("a balance at or above the floor"),
        )
        .await
        .expect("account opens");
    assert!(matches!(created, Created::New(_)), "{id} existed");
}

async fn account(e: &Engine, id: &str) -> AccountDoc {
    e.get_account(id).await.unwrap().unwrap()
}

async fn balances(e: &Engine, ids: &[&str]) -> Vec<i64> {
    let mut out = Vec::new();
    for id in ids {
        out.push(balance(e, id).await);
    }
    out
}

async fn run(e: &Arc<Engine>, new: NewTransfer) -> TransferState {
    let id = new.id().to_string();
    let created = e.create_transfer(new).await.expect("accepted");
    assert!(matches!(created, Created::New(_)), "{id} existed");
    terminal_without_recovery(e, &id).await
}

#[tokio::test(start_paused = true)]
async fn two_and_sixteen_legs_commit_with_every_account_exact() {
    let w = world(1, Duration::from_millis(2));
    let e = w.instance(w.base.clone(), step_fault_config());
    open_a_b_and_c(&e).await;
    let two = legs("two", &[("a", "b", 10), ("b", "c", 4)]);
    assert_eq!(run(&e, two).await, TransferState::Finished);
    assert_eq!(balances(&e, &["a", "b", "c"]).await, [90, 106, 104]);

    // 16 legs over 17 accounts: h0 pays each of h1..h16.
    for i in 0..=16 {
        open_account(&e, &format!("h{i}"), 1_000).await;
    }
    let names: Vec<String> = (1..=16).map(|i| format!("h{i}")).collect();
    let sixteen: Vec<(&str, &str, i64)> = names.iter().map(|n| ("h0", n.as_str(), 5)).collect();
    assert_eq!(
        run(&e, legs("sixteen", &sixteen)).await,
        TransferState::Finished
    );
    assert_eq!(balance(&e, "h0").await, 1_000 - 80);
    for n in &names {
        assert_eq!(balance(&e, n).await, 1_005, "{n}");
        assert!(account(&e, n).await.pending_transactions.is_empty());
    }
    let t = transfer_doc(&e, "sixteen").await;
    let Legs::MultiLeg {
        legs,
        accounts,
        amount,
    } = &t.legs
    else {
        panic!("sixteen legs make a multi-leg transaction: {t:?}");
    };
    assert_eq!((*amount, legs.len(), accounts.len()), (80, 16, 17));
    assert_invariants(&w.base).await;
}

#[tokio::test(start_paused = true)]
async fn an_account_in_several_legs_holds_one_entry_and_is_checked_on_its_net_debit() {
    // By the two-phase protocol (one pending entry per account), and in one transaction.
    for one_transaction in [false, true] {
        let (w, e) = on_the_store(2, settling(one_transaction));
        open_with_floor(&e, "a", 100, 20).await;
        open_account(&e, "b", 0).await;
        open_account(&e, "c", 50).await;
        // `a` pays 60 and 50 and receives 30: its net debit of 80 leaves exactly its floor,
        // though its debits sum to 110 (more than its balance).
        let net = legs("net", &[("a", "b", 60), ("a", "b", 50), ("c", "a", 30)]);
        e.create_transfer(net).await.unwrap();
        assert_ends_by_itself(&e, "net", TransferState::Finished).await;
        assert_eq!(balances(&e, &["a", "b", "c"]).await, [20, 110, 20]);
        // One more unit of net debit is refused, and the refusal names `a`.
        let over = legs("over", &[("a", "b", 31), ("c", "a", 30)]);
        assert_eq!(run(&e, over).await, TransferState::RolledBack);
        let t = transfer_doc(&e, "over").await;
        assert_eq!(t.reason, Some(RollbackReason::InsufficientFunds));
        assert_eq!(t.failed_account.as_deref(), Some("a"));
        assert_eq!(balances(&e, &["a", "b", "c"]).await, [20, 110, 20]);
        // Legs that cancel out on an account: it is applied with no change, and passes even at
        // its floor.
        let round = legs("round", &[("a", "b", 5), ("b", "a", 5), ("c", "b", 1)]);
        assert_eq!(run(&e, round).await, TransferState::Finished);
        assert_eq!(balances(&e, &["a", "b", "c"]).await, [20, 111, 19]);
        assert_invariants(&w.base).await;
    }
}

#[tokio::test(start_paused = true)]
async fn one_refused_leg_rolls_every_leg_back_and_names_the_account() {
    // By the two-phase protocol (one pending entry per account), and in one transaction.
    for one_transaction in [false, true] {
        let (w, e) = on_the_store(3, settling(one_transaction));
        open_account(&e, "a", 100).await;
        open_account(&e, "b", 100).await;
        open_account(&e, "poor", 5).await;
        open_account(&e, "full", i64::MAX - 5).await;
        // The last account refuses after the others were applied: they are undone.
        let cases = [
            (
                "funds",
                vec![("a", "b", 10), ("b", "a", 3), ("poor", "b", 6)],
                RollbackReason::InsufficientFunds,
                "poor",
            ),
            (
                "missing",
                vec![("a", "b", 10), ("b", "ghost", 1)],
                RollbackReason::AccountNotFound,
                "ghost",
            ),
            (
                "overflow",
                vec![("a", "b", 10), ("b", "full", 6)],
                RollbackReason::BalanceOverflow,
                "full",
            ),
        ];
        for (id, given, reason, account) in cases {
            assert_eq!(
                run(&e, legs(id, &given)).await,
                TransferState::RolledBack,
                "{id}"
            );
            let t = transfer_doc(&e, id).await;
            assert_eq!(
                (t.reason, t.failed_account.as_deref()),
                (Some(reason), Some(account)),
                "{id}"
            );
            assert_eq!(
                balances(&e, &["a", "b", "poor", "full"]).await,
                [100, 100, 5, i64::MAX - 5],
                "{id}"
            );
        }
        // A one-leg transfer names its account too.
        assert_eq!(
            run(&e, transfer_doc_new("plain", "poor", "a", 6)).await,
            TransferState::RolledBack
        );
        assert_eq!(
            transfer_doc(&e, "plain").await.failed_account.as_deref(),
            Some("poor")
        );
        for id in ["a", "b", "poor", "full"] {
            let a = account(&e, id).await;
            assert!(
                a.pending_transactions.is_empty()
                    && a.pending_credits == 0
                    && a.pending_debits == 0,
                "{id}"
            );
        }
        assert_invariants(&w.base).await;
    }
}

fn transfer_doc_new(id: &str, from: &str, to: &str, amount: i64) -> NewTransfer {
    transfer(id, from, to, amount)
}

#[tokio::test(start_paused = true)]
async fn every_account_must_share_the_currency() {
    let (w, e) = on_the_store(4, step_fault_config());
    for (id, currency) in [
        ("u1", Some("USD")),
        ("u2", Some("USD")),
        ("u3", Some("USD")),
        ("e", Some("EUR")),
    ] {
        e.create_account(
            new_account(id, 100).with_currency(currency.map(crate::support::engine::currency)),
        )
        .await
        .unwrap();
    }
    let same = legs("same", &[("u1", "u2", 10), ("u2", "u3", 5)]);
    assert_eq!(run(&e, same).await, TransferState::Finished);
    // The third account differs: the first two are undone.
    let mixed = legs("mixed", &[("u1", "u2", 10), ("u2", "e", 5)]);
    assert_eq!(run(&e, mixed).await, TransferState::RolledBack);
    let t = transfer_doc(&e, "mixed").await;
    assert_eq!(
        (t.reason, t.failed_account.as_deref()),
        (Some(RollbackReason::CurrencyMismatch), Some("e"))
    );
    // A stated currency the first account lacks.
    let stated =
        legs("stated", &[("u1", "u2", 1), ("u2", "u3", 1)]).with_currency(Some(currency("EUR")));
    assert_eq!(run(&e, stated).await, TransferState::RolledBack);
    assert_eq!(
        transfer_doc(&e, "stated").await.failed_account.as_deref(),
        Some("u1")
    );
    assert_eq!(
        balances(&e, &["u1", "u2", "u3", "e"]).await,
        [90, 105, 105, 100]
    );
    assert_invariants(&w.base).await;
}

#[tokio::test(start_paused = true)]
async fn a_multi_leg_hold_parks_and_is_captured_whole_or_cancelled() {
    let (w, e) = on_the_store(5, step_fault_config());
    open_a_b_and_c(&e).await;
    let held = |id: &str| {
        legs(id, &[("a", "b", 10), ("a", "c", 5)]).with_hold(hold_for(Duration::from_secs(600)))
    };
    e.create_transfer(held("h1")).await.unwrap();
    e.create_transfer(held("h2")).await.unwrap();
    for id in ["h1", "h2"] {
        until("parked", Duration::from_secs(5), || async {
            transfer_doc(&e, id).await.lease_owner.as_deref() == Some(PARKED)
        })
        .await;
    }
    // Both debited, credits not spendable.
    assert_eq!(balances(&e, &["a", "b", "c"]).await, [70, 120, 110]);
    assert_eq!(account(&e, "b").await.pending_credits, 20);
    // A partial capture is refused, saying why; the hold is unchanged.
    match e.capture_transfer("h1", Some(10)).await {
        Err(ServiceError::Invalid(why)) => assert!(why.contains("captured whole"), "{why}"),
        other => panic!("partial capture of a multi-leg hold: {other:?}"),
    }
    assert_eq!(transfer_doc(&e, "h1").await.captured_amount, None);
    // Whole: without an amount, or with the sum of the legs (an identical repeat).
    let t = e.capture_transfer("h1", None).await.unwrap();
    assert_eq!(t.captured_amount, Some(15));
    e.capture_transfer("h1", Some(15)).await.unwrap();
    assert_ends_by_itself(&e, "h1", TransferState::Finished).await;
    e.cancel_transfer("h2").await.unwrap();
    assert_ends_by_itself(&e, "h2", TransferState::RolledBack).await;
    assert_eq!(balances(&e, &["a", "b", "c"]).await, [85, 110, 105]);
    assert_invariants(&w.base).await;
}

#[tokio::test(start_paused = true)]
async fn a_replay_compares_the_legs() {
    let (_w, e) = on_the_store(6, step_fault_config());
    open_a_b_and_c(&e).await;
    let first = legs("r", &[("a", "b", 10), ("a", "c", 5)]);
    e.create_transfer(first.clone()).await.unwrap();
    assert!(matches!(
        e.create_transfer(first).await,
        Ok(Created::Replayed(_))
    ));
    // Same sum, other legs; and the legs in another order.
    for other in [
        legs("r", &[("a", "b", 5), ("a", "c", 10)]),
        legs("r", &[("a", "c", 5), ("a", "b", 10)]),
    ] {
        assert!(matches!(
            e.create_transfer(other).await,
            Err(ServiceError::Conflict(_))
        ));
    }
    terminal_without_recovery(&e, "r").await;
}

/// The step boundaries of a transaction of three accounts (`a` pays in two legs, `b` both
/// receives and pays, `c` receives twice): each account write, each state write, the park and
/// the capture of a hold.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    Commit,
    /// `c` is one unit short of overflow: its apply refuses after `a` and `b` were applied.
    Rollback,
    /// A hold captured whole.
    Capture,
}

#[rustfmt::skip]
const STEPS: &[(&str, Path, StepWrite)] = &[
    ("create", Path::Commit, StepWrite::Create),
    ("→ pending", Path::Commit, StepWrite::State("pending")),
    ("apply a", Path::Commit, StepWrite::Account("a", 1)),
    ("apply b", Path::Commit, StepWrite::Account("b", 1)),
    ("apply c", Path::Commit, StepWrite::Account("c", 1)),
    ("→ committed", Path::Commit, StepWrite::State("committed")),
    ("remove a", Path::Commit, StepWrite::Account("a", 0)),
    ("remove b", Path::Commit, StepWrite::Account("b", 0)),
    ("remove c", Path::Commit, StepWrite::Account("c", 0)),
    ("→ finished", Path::Commit, StepWrite::State("finished")),
    ("rollback: apply b", Path::Rollback, StepWrite::Account("b", 1)),
    ("rollback: → terminating", Path::Rollback, StepWrite::State("terminating")),
    ("rollback: undo a", Path::Rollback, StepWrite::Account("a", 0)),
    ("rollback: undo b", Path::Rollback, StepWrite::Account("b", 0)),
    ("rollback: undo c", Path::Rollback, StepWrite::Account("c", 0)),
    ("rollback: → rolled-back", Path::Rollback, StepWrite::State("rolled-back")),
    ("hold: apply c", Path::Capture, StepWrite::Account("c", 1)),
    ("hold: park", Path::Capture, StepWrite::Park),
    ("capture: record", Path::Capture, StepWrite::Capture),
    ("capture: → committed", Path::Capture, StepWrite::State("committed")),
    ("capture: remove b", Path::Capture, StepWrite::Account("b", 0)),
    ("capture: → finished", Path::Capture, StepWrite::State("finished")),
];

type Case = StepCase<Path>;

/// Opening balances of `a`, `b`, `c`; the legs: a→b 10, a→c 5, b→c 3 (nets −15, +7, +8).
const OPENING: [i64; 3] = [100, 100, 0];
const NETS: [i64; 3] = [-15, 7, 8];

/// The transaction of case `n`: `n-a` pays `n-b` 10 and `n-c` 5, `n-b` pays `n-c` 3.
fn three_legs(n: &str) -> NewTransfer {
    let (a, b, c) = (format!("{n}-a"), format!("{n}-b"), format!("{n}-c"));
    legs(&format!("{n}-t"), &[(&a, &b, 10), (&a, &c, 5), (&b, &c, 3)])
}

#[tokio::test(start_paused = true)]
async fn every_step_of_a_multi_leg_transaction_survives_errors_crashes_and_stalls() {
    let w = world(7, Duration::ZERO);
    let recoverer = w.instance(w.base.clone(), step_fault_config());
    let mut cases = Vec::new();
    for (s, f, step, fault) in every_step_under_every_fault(STEPS) {
        let name = format!("m{s}-{f}");
        for (account, opening) in ["a", "b", "c"].into_iter().zip(OPENING) {
            let opening = match (step.1, account) {
                (Path::Rollback, "c") => i64::MAX - 7,
                _ => opening,
            };
            open_account(&recoverer, &format!("{name}-{account}"), opening).await;
        }
        let seed = s as u64 * 10 + f as u64;
        cases.push(Case::new(&w, step_fault_config(), name, seed, step, fault));
    }
    create_every_transfer(&cases, |case| {
        let new = three_legs(&case.name);
        if case.path == Path::Capture {
            new.with_hold(hold_for(Duration::from_secs(600)))
        } else {
            new
        }
    })
    .await;
    // Capture every hold whole, through A, else through the recoverer.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut captures = Vec::new();
    for case in cases.iter().filter(|c| c.path == Path::Capture) {
        let (worker, recoverer) = (case.worker.clone(), recoverer.engine.clone());
        let capture = capture_through_a_else_recoverer(worker, recoverer, case.id("t"), None);
        captures.push(tokio::spawn(capture));
    }
    for capture in captures {
        capture.await.unwrap();
    }
    recover_every_case(&w, &recoverer, &cases).await;
    assert_invariants(&w.base).await;
    for case in &cases {
        let (step, fault) = (case.step, case.fault);
        case.assert_fault_fired();
        let moved = match (&case.transfer(&recoverer).await, case.path) {
            (None, _) => {
                assert!(
                    step == "create" && fault == "crash before",
                    "{step} / {fault}: missing"
                );
                false
            }
            (Some(t), Path::Commit | Path::Capture) => {
                assert_eq!(
                    t.transaction_state,
                    TransferState::Finished,
                    "{step} / {fault}"
                );
                true
            }
            (Some(t), Path::Rollback) => {
                assert_eq!(
                    t.transaction_state,
                    TransferState::RolledBack,
                    "{step} / {fault}"
                );
                assert_eq!(
                    (t.reason, t.failed_account.clone()),
                    (Some(RollbackReason::BalanceOverflow), Some(case.id("c"))),
                    "{step} / {fault}"
                );
                false
            }
        };
        for (i, account) in ["a", "b", "c"].into_iter().enumerate() {
            let doc = account_of(&recoverer, &case.id(account)).await;
            let want = doc.opening_balance + if moved { NETS[i] } else { 0 };
            assert_eq!(doc.balance, want, "{step} / {fault}: {account}");
            assert!(
                doc.pending_transactions.is_empty(),
                "{step} / {fault}: {account}"
            );
        }
    }
    eprintln!(
        "{} step boundaries × {} faults: all terminal, exact, audit clean",
        STEPS.len(),
        STEP_FAULTS.len()
    );
}

/// The widest transaction, 16 legs over 17 accounts (`h0` pays each of `h1`..`h16`), under
/// every fault at its widest boundaries: the apply of the last account (every other one
/// already applied), the commit, and the remove of an account in the middle.
#[tokio::test(start_paused = true)]
async fn a_sixteen_leg_transaction_survives_every_fault_at_its_widest_steps() {
    #[rustfmt::skip]
    const WIDEST: &[(&str, Path, StepWrite)] = &[
        ("apply h16", Path::Commit, StepWrite::Account("h16", 1)),
        ("→ committed", Path::Commit, StepWrite::State("committed")),
        ("remove h8", Path::Commit, StepWrite::Account("h8", 0)),
    ];
    let w = world(8, Duration::ZERO);
    let recoverer = w.instance(w.base.clone(), step_fault_config());
    let mut cases = Vec::new();
    for (s, f, step, fault) in every_step_under_every_fault(WIDEST) {
        let name = format!("w{s}-{f}");
        for i in 0..=16 {
            open_account(&recoverer, &format!("{name}-h{i}"), 1_000).await;
        }
        let seed = 100 + s as u64 * 10 + f as u64;
        let case = Case::new(&w, step_fault_config(), name, seed, step, fault);
        let payees: Vec<String> = (1..=16).map(|i| case.id(&format!("h{i}"))).collect();
        let payer = case.id("h0");
        let sixteen: Vec<(&str, &str, i64)> = payees
            .iter()
            .map(|p| (payer.as_str(), p.as_str(), 5))
            .collect();
        let new = legs(&case.id("t"), &sixteen);
        tokio::spawn(try_create(case.worker.clone(), new))
            .await
            .unwrap();
        cases.push(case);
    }
    recover_every_case(&w, &recoverer, &cases).await;
    assert_invariants(&w.base).await;
    for case in &cases {
        let (step, fault) = (case.step, case.fault);
        case.assert_fault_fired();
        let t = transfer_doc(&recoverer, &case.id("t")).await;
        assert_eq!(
            t.transaction_state,
            TransferState::Finished,
            "{step} / {fault}"
        );
        for i in 0..=16 {
            let doc = account_of(&recoverer, &case.id(&format!("h{i}"))).await;
            let want = if i == 0 { 1_000 - 80 } else { 1_005 };
            assert_eq!(doc.balance, want, "{step} / {fault}: h{i}");
            assert!(
                doc.pending_transactions.is_empty(),
                "{step} / {fault}: h{i}"
            );
        }
    }
}

async fn account_of(e: &Engine, id: &str) -> AccountDoc {
    account(e, id).await
}

/// A worker of instance A stalls just before each account write of a multi-leg
/// transaction, for longer than its lease; B's recovery takes it over and ends it. When A
/// wakes, its write is decided on a copy from before its deadline: refused by the fence (the
/// account's version moved) or by a tombstone, never applied a second time.
#[tokio::test(start_paused = true)]
async fn a_stalled_worker_never_applies_a_multi_leg_transaction_twice() {
    let w = world(8, Duration::ZERO);
    let recoverer = w.instance(w.base.clone(), step_fault_config());
    let permits = Arc::new(Semaphore::new(64));
    let mut stalled = Vec::new();
    for (k, (account, pending)) in [("a", 1usize), ("b", 1), ("c", 1), ("a", 0), ("c", 0)]
        .into_iter()
        .enumerate()
    {
        let name = format!("s{k}");
        for (id, opening) in ["a", "b", "c"].into_iter().zip(OPENING) {
            open_account(&recoverer, &format!("{name}-{id}"), opening).await;
        }
        let faulty = FaultyStore::new(w.base.clone(), 100 + k as u64, Duration::ZERO);
        faulty.inject(
            StepWrite::Account(account, pending).matcher(&name),
            Fault::StallBefore(Duration::from_secs(5)),
            1,
        );
        let worker = w.instance(faulty.clone(), step_fault_config()).engine;
        worker.create_transfer(three_legs(&name)).await.unwrap();
        stalled.push((name, worker, faulty));
    }
    // B takes every transaction over once its lease (plus the margin) has run out.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let busy = || {
        stalled
            .iter()
            .filter(|(_, w, _)| w.running_tasks() > 0)
            .count()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while busy() > 0 || recoverer.running_tasks() > 0 {
        recoverer
            .recovery()
            .recover_once(w.now_millis() + 1, &permits)
            .await
            .unwrap();
        assert!(
            tokio::time::Instant::now() < deadline,
            "workers still running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    recover_until_quiescent(&w, &recoverer, || 0, Duration::from_secs(30)).await;
    assert_invariants(&w.base).await;
    for (name, _, faulty) in &stalled {
        assert_eq!(
            faulty.fired.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "{name}"
        );
        let t = transfer_doc(&recoverer, &format!("{name}-t")).await;
        let moved = t.transaction_state == TransferState::Finished;
        assert!(t.transaction_state.is_terminal(), "{name}");
        for (i, account) in ["a", "b", "c"].into_iter().enumerate() {
            let want = OPENING[i] + if moved { NETS[i] } else { 0 };
            assert_eq!(
                balance(&recoverer, &format!("{name}-{account}")).await,
                want,
                "{name}-{account}"
            );
        }
    }
}

/// A pending entry of a multi-leg transaction that is terminal was applied late: the sweep
/// undoes it by the account's net change.
#[tokio::test(start_paused = true)]
async fn the_sweep_undoes_a_late_multi_leg_entry_by_its_net_change() {
    let (w, e) = on_the_store(9, step_fault_config());
    open_a_b_and_c(&e).await;
    let new = legs("late", &[("a", "b", 10), ("c", "a", 4)]);
    assert_eq!(run(&e, new).await, TransferState::Finished);
    // Forge what a late worker would have left on `a`: its net debit of 6 applied again
    // after the transaction finished, and its tombstone aged out.
    let mut a = account(&e, "a").await;
    a.balance -= 6;
    a.pending_debits += 6;
    a.settled = Default::default();
    // Its entry too, as every apply makes one (`docs/design.md §12`).
    let entry = a.record_entry(0, -6, EntryKind::Debit, "late");
    a.add_pending("late", 0, "", Some(&entry));
    let stored = transfer_service::transfer::documents::Documents::new(w.base.clone());
    let current = stored.get::<AccountDoc>("a").await.unwrap().unwrap();
    stored.replace_if(&a, current.version).await.unwrap();
    e.engine.forget_account_copies();
    assert_eq!(balance(&e, "a").await, 88);
    let page = e.recovery().sweep_late_applies(None).await.unwrap();
    assert_eq!(page.compensated, 1);
    assert_eq!(balances(&e, &["a", "b", "c"]).await, [94, 110, 96]);
    assert_invariants(&w.base).await;
}
