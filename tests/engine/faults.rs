//! Faults at every step boundary of the protocol and of the rollback.
//!
//! For each step (listed in [`STEPS`]; the two-phase protocol's, and the one store
//! transaction that settles a transfer where the store has them) and each fault — an error before the write, an error
//! after it was applied, a crash before it, a crash after it (the worker's "process" dies:
//! its store never answers again), a stall longer than the lease — a worker of instance A
//! drives one transfer into the fault, then instance B's recovery takes over. Every transfer
//! must end terminal in the state its path calls for, with exact balances and empty pending
//! lists, and the audit must be clean.
//!
//! The commit path moves 10 from `src` to `dest`. The rollback path sends 10 to an account
//! one unit below overflow, so the destination apply refuses and the transfer rolls back.
//! The capture path holds 10, waits (parked), and is captured for 4 through instance A (or,
//! when A is dead, through B): the removes give 6 back. The expiry path holds 10 for 1 s;
//! A's capture after it writes the expiry and rolls the hold back (or B's recovery does).

use std::time::Duration;

use std::sync::Arc;

use transfer_service::transfer::model::TransferState;
use transfer_service::transfer::requests::NewTransfer;
use transfer_service::transfer::Engine;

use crate::support::engine::*;
use crate::support::faulty::{StepWrite, STEP_FAULTS};
use crate::support::step_faults::*;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    Commit,
    Rollback,
    /// A hold captured for [`CAPTURED`] of 10.
    Capture,
    /// A hold that expires before its capture.
    Expire,
}

/// What the capture path captures of its hold of 10.
const CAPTURED: i64 = 4;

/// Every step boundary: (name, path, what the write looks like).
#[rustfmt::skip]
const STEPS: &[(&str, Path, StepWrite)] = &[
    ("create", Path::Commit, StepWrite::Create),
    ("one transaction: create and settle", Path::Commit, StepWrite::Transaction),
    ("one transaction: create and roll back", Path::Rollback, StepWrite::Transaction),
    ("core 1: → pending", Path::Commit, StepWrite::State("pending")),
    ("core 2: apply to source", Path::Commit, StepWrite::Account("src", 1)),
    ("core 3: apply to destination", Path::Commit, StepWrite::Account("dest", 1)),
    ("core 4: → committed", Path::Commit, StepWrite::State("committed")),
    ("core 5: remove from source", Path::Commit, StepWrite::Account("src", 0)),
    ("core 6: remove from destination", Path::Commit, StepWrite::Account("dest", 0)),
    ("core 7: → finished", Path::Commit, StepWrite::State("finished")),
    ("rollback 1: → terminating", Path::Rollback, StepWrite::State("terminating")),
    ("rollback 2: undo source", Path::Rollback, StepWrite::Account("src", 0)),
    ("rollback 3: undo destination", Path::Rollback, StepWrite::Account("dest", 0)),
    ("rollback 4: → rolled-back", Path::Rollback, StepWrite::State("rolled-back")),
    ("hold: create", Path::Capture, StepWrite::Create),
    ("hold: park", Path::Capture, StepWrite::Park),
    ("capture: record", Path::Capture, StepWrite::Capture),
    ("capture core 4: → committed", Path::Capture, StepWrite::State("committed")),
    ("capture core 5: remove from source, 6 back", Path::Capture, StepWrite::Account("src", 0)),
    ("capture core 6: remove from destination, 6 off", Path::Capture, StepWrite::Account("dest", 0)),
    ("capture core 7: → finished", Path::Capture, StepWrite::State("finished")),
    ("expiry: → terminating", Path::Expire, StepWrite::State("terminating")),
    ("expiry: undo source", Path::Expire, StepWrite::Account("src", 0)),
    ("expiry: undo destination", Path::Expire, StepWrite::Account("dest", 0)),
    ("expiry: → rolled-back", Path::Expire, StepWrite::State("rolled-back")),
];

type Case = StepCase<Path>;

#[tokio::test(start_paused = true)]
async fn every_step_survives_errors_crashes_and_stalls() {
    let w = world(0, Duration::ZERO);
    let recoverer = w.instance(w.base.clone(), step_fault_config());
    let cases = arrange_cases(&w, &recoverer).await;
    create_every_transfer(&cases, new_transfer).await;
    capture_every_hold(&cases, &recoverer).await;
    recover_every_case(&w, &recoverer, &cases).await;

    assert_invariants(&w.base).await;
    for case in &cases {
        assert_case_ended_as_its_path_says(&recoverer, case).await;
    }
    eprintln!(
        "{} step boundaries × {} faults: all terminal, exact, audit clean",
        STEPS.len(),
        STEP_FAULTS.len()
    );
}

/// Every step × every fault, each on its own accounts with its own instance A, whose store
/// can die alone.
async fn arrange_cases(w: &World, recoverer: &Engine) -> Vec<Case> {
    let mut cases = Vec::new();
    for (s, f, step, fault) in every_step_under_every_fault(STEPS) {
        let name = format!("c{s}-{f}");
        let dest_balance = match step.1 {
            Path::Commit | Path::Capture | Path::Expire => 0,
            Path::Rollback => i64::MAX - 5,
        };
        for (account, balance) in [("src", 100), ("dest", dest_balance)] {
            recoverer
                .create_account(new_account(&format!("{name}-{account}"), balance))
                .await
                .unwrap();
        }
        let seed = s as u64 * 10 + f as u64;
        cases.push(Case::new(w, step_fault_config(), name, seed, step, fault));
    }
    cases
}

/// What each case's instance A is asked to create (all at once).
fn new_transfer(case: &Case) -> NewTransfer {
    let (id, src, dest) = (case.id("t"), case.id("src"), case.id("dest"));
    match case.path {
        Path::Commit | Path::Rollback => transfer(&id, &src, &dest, 10),
        Path::Capture => hold(&id, &src, &dest, 10, Duration::from_secs(600)),
        Path::Expire => hold(&id, &src, &dest, 10, Duration::from_secs(1)),
    }
}

/// Two seconds on (every hold parked, or its fault under way, and the expiring ones
/// expired), each hold case's instance A captures it: for [`CAPTURED`] on the capture path
/// (again through the recoverer if A's answer is lost: an identical capture is a replay), in
/// full on the expiry path, where it must lose and roll the hold back (or, A dead, the
/// recoverer's recovery does).
async fn capture_every_hold(cases: &[Case], recoverer: &Arc<Engine>) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut captures = Vec::new();
    for case in cases {
        let (worker, id) = (case.worker.clone(), case.id("t"));
        captures.push(match case.path {
            Path::Capture => tokio::spawn(capture_through_a_else_recoverer(
                worker,
                recoverer.clone(),
                id,
                Some(CAPTURED),
            )),
            Path::Expire => tokio::spawn(async move {
                let by_a = tokio::time::timeout(CAPTURE_LIMIT, worker.capture_transfer(&id, None));
                if let Ok(Ok(t)) = by_a.await {
                    panic!("{id}: an expired hold was captured: {t:?}");
                }
            }),
            Path::Commit | Path::Rollback => continue,
        });
    }
    for capture in captures {
        capture.await.unwrap();
    }
}

/// The fault fired, the transfer ended as its path says, the balances are exact and the
/// pending lists empty.
async fn assert_case_ended_as_its_path_says(recoverer: &Engine, case: &Case) {
    let (step, fault) = (case.step, case.fault);
    case.assert_fault_fired();
    let t = case.transfer(recoverer).await;
    let src = recoverer
        .get_account(&case.id("src"))
        .await
        .unwrap()
        .unwrap();
    let dest = recoverer
        .get_account(&case.id("dest"))
        .await
        .unwrap()
        .unwrap();
    let moved = match (&t, case.path) {
        // Only a create that never reached the store leaves no transfer (the client got no
        // answer and would retry with the same id); on a store with transactions the one
        // transaction is the create.
        (None, _) => {
            let creates =
                matches!(step, "create" | "hold: create") || step.starts_with("one transaction");
            assert!(
                creates && fault == "crash before",
                "{step} / {fault}: transfer missing"
            );
            false
        }
        (Some(t), Path::Commit) => {
            assert_eq!(
                t.transaction_state,
                TransferState::Finished,
                "{step} / {fault}"
            );
            true
        }
        (Some(t), Path::Rollback | Path::Expire) => {
            assert_eq!(
                t.transaction_state,
                TransferState::RolledBack,
                "{step} / {fault}"
            );
            let reason = match case.path {
                Path::Expire => "expired",
                _ => "balance_overflow",
            };
            assert_eq!(
                t.reason.map(|r| r.as_str()),
                Some(reason),
                "{step} / {fault}"
            );
            false
        }
        (Some(t), Path::Capture) => {
            assert_eq!(
                (t.transaction_state, t.captured_amount),
                (TransferState::Finished, Some(CAPTURED)),
                "{step} / {fault}"
            );
            true
        }
    };
    let dest_opening = dest.opening_balance;
    let moves = match case.path {
        Path::Capture => CAPTURED,
        _ => 10,
    };
    let want = if moved {
        (100 - moves, dest_opening + moves)
    } else {
        (100, dest_opening)
    };
    assert_eq!(
        (src.balance, dest.balance),
        want,
        "{step} / {fault}: balances"
    );
    assert!(src.pending_transactions.is_empty(), "{step} / {fault}");
    assert!(dest.pending_transactions.is_empty(), "{step} / {fault}");
}
