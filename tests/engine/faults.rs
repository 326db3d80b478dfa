//! Faults at every step boundary of the protocol and of the rollback.
//!
//! For each step (listed in [`STEPS`]) and each fault — an error before the write, an error
//! after it was applied, a crash before it, a crash after it (the worker's "process" dies:
//! its store never answers again), a stall longer than the lease — a worker of instance A
//! drives one transfer into the fault, then instance B's recovery takes over. Every transfer
//! must end terminal in the state its path calls for, with exact balances and empty pending
//! lists, and the audit must be clean.
//!
//! The commit path moves 10 from `src` to `dest`. The rollback path sends 10 to an account
//! one unit below overflow, so the destination apply refuses and the transfer rolls back.

use std::time::Duration;

use std::sync::Arc;

use transfer_service::store::Index;
use transfer_service::transfer::model::TransferState;
use transfer_service::transfer::service::NewAccount;
use transfer_service::transfer::{Engine, EngineConfig};

use crate::support::engine::*;
use crate::support::faulty::{Fault, FaultyStore, Matcher};

const LEASE: Duration = Duration::from_secs(1);

fn config() -> EngineConfig {
    EngineConfig {
        max_store_attempts: 3,
        recovery_page: 200,
        ..EngineConfig::with_lease(LEASE)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    Commit,
    Rollback,
}

/// Every step boundary: (name, path, what the write looks like).
const STEPS: &[(&str, Path, Step)] = &[
    ("create", Path::Commit, Step::Create),
    ("core 1: → pending", Path::Commit, Step::State("pending")),
    (
        "core 2: apply to source",
        Path::Commit,
        Step::Account(Side::Src, 1),
    ),
    (
        "core 3: apply to destination",
        Path::Commit,
        Step::Account(Side::Dest, 1),
    ),
    (
        "core 4: → committed",
        Path::Commit,
        Step::State("committed"),
    ),
    (
        "core 5: remove from source",
        Path::Commit,
        Step::Account(Side::Src, 0),
    ),
    (
        "core 6: remove from destination",
        Path::Commit,
        Step::Account(Side::Dest, 0),
    ),
    ("core 7: → finished", Path::Commit, Step::State("finished")),
    (
        "rollback 1: → terminating",
        Path::Rollback,
        Step::State("terminating"),
    ),
    (
        "rollback 2: undo source",
        Path::Rollback,
        Step::Account(Side::Src, 0),
    ),
    (
        "rollback 3: undo destination",
        Path::Rollback,
        Step::Account(Side::Dest, 0),
    ),
    (
        "rollback 4: → rolled-back",
        Path::Rollback,
        Step::State("rolled-back"),
    ),
];

#[derive(Debug, Clone, Copy)]
enum Side {
    Src,
    Dest,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Create,
    State(&'static str),
    /// An account write leaving this many pending ids.
    Account(Side, usize),
}

const FAULTS: &[(&str, Fault)] = &[
    ("error before", Fault::FailBefore),
    ("error after", Fault::FailAfter),
    ("crash before", Fault::Crash { applied: false }),
    ("crash after", Fault::Crash { applied: true }),
    (
        "stall beyond the lease",
        Fault::StallBefore(Duration::from_millis(3000)),
    ),
];

fn matcher(case: &str, step: Step) -> Matcher {
    match step {
        Step::Create => Matcher::creates(Index::Transactions),
        Step::State(state) => Matcher::writes(Index::Transactions).moving_to(state),
        Step::Account(side, pending) => Matcher {
            op: Some("replace"),
            index: Some(Index::Accounts),
            id: Some(match side {
                Side::Src => format!("{case}-src"),
                Side::Dest => format!("{case}-dest"),
            }),
            pending_len: Some(pending),
            ..Matcher::default()
        },
    }
}

/// One step boundary under one fault: its accounts, and instance A whose store injects it.
struct Case {
    name: String,
    step: &'static str,
    fault: &'static str,
    path: Path,
    worker: Arc<Engine>,
    faulty: Arc<FaultyStore>,
}

#[tokio::test(start_paused = true)]
async fn every_step_survives_errors_crashes_and_stalls() {
    let w = world(0, Duration::ZERO);
    let recoverer = w.instance(w.base.clone(), config());
    let cases = arrange_cases(&w, &recoverer).await;
    start_every_case(&cases).await;
    // Workers whose store crashed never answer again: they are dead processes, not busy ones.
    let live_workers = || {
        cases
            .iter()
            .filter(|c| !c.faulty.is_dead() && c.worker.running_tasks() > 0)
            .count()
    };
    recover_until_quiescent(&w, &recoverer, live_workers, Duration::from_secs(60)).await;

    assert_invariants(&w.base).await;
    for case in &cases {
        assert_case_ended_as_its_path_says(&recoverer, case).await;
    }
    eprintln!(
        "{} step boundaries × {} faults: all terminal, exact, audit clean",
        STEPS.len(),
        FAULTS.len()
    );
}

/// Every step × every fault, each on its own accounts with its own instance A, whose store
/// can die alone.
async fn arrange_cases(w: &World, recoverer: &Engine) -> Vec<Case> {
    let mut cases = Vec::new();
    for (s, (step_name, path, step)) in STEPS.iter().enumerate() {
        for (f, (fault_name, fault)) in FAULTS.iter().enumerate() {
            let name = format!("c{s}-{f}");
            let dest_balance = match path {
                Path::Commit => 0,
                Path::Rollback => i64::MAX - 5,
            };
            for (account, balance) in [("src", 100), ("dest", dest_balance)] {
                recoverer
                    .create_account(NewAccount {
                        id: format!("{name}-{account}"),
                        balance,
                        floor: 0,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
            }
            let faulty = FaultyStore::new(w.base.clone(), s as u64 * 10 + f as u64, Duration::ZERO);
            faulty.inject(matcher(&name, *step), *fault, 1);
            let worker = w.instance(faulty.clone(), config()).engine;
            cases.push(Case {
                name,
                step: step_name,
                fault: fault_name,
                path: *path,
                worker,
                faulty,
            });
        }
    }
    cases
}

/// Each case's instance A accepts its transfer (all at once). A create that fails is answered
/// 503 and leaves nothing, or (applied, then failed or crashed) leaves a transfer recovery
/// must finish.
async fn start_every_case(cases: &[Case]) {
    let mut creates = Vec::new();
    for case in cases {
        let worker = case.worker.clone();
        let new = transfer(
            &format!("{}-t", case.name),
            &format!("{}-src", case.name),
            &format!("{}-dest", case.name),
            10,
        );
        creates.push(tokio::spawn(async move {
            let _ =
                tokio::time::timeout(Duration::from_secs(10), worker.create_transfer(new)).await;
        }));
    }
    for create in creates {
        create.await.unwrap();
    }
}

/// The fault fired, the transfer ended as its path says, the balances are exact and the
/// pending lists empty.
async fn assert_case_ended_as_its_path_says(recoverer: &Engine, case: &Case) {
    let (step, fault) = (case.step, case.fault);
    let fired = case.faulty.fired.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(fired, 1, "{step} / {fault}: the fault did not fire");
    let t = recoverer
        .get_transfer(&format!("{}-t", case.name))
        .await
        .unwrap();
    let src = recoverer
        .get_account(&format!("{}-src", case.name))
        .await
        .unwrap()
        .unwrap();
    let dest = recoverer
        .get_account(&format!("{}-dest", case.name))
        .await
        .unwrap()
        .unwrap();
    let moved = match (&t, case.path) {
        // Only a create that never reached the store leaves no transfer (the client got no
        // answer and would retry with the same id).
        (None, _) => {
            assert_eq!(
                (step, fault),
                ("create", "crash before"),
                "transfer missing"
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
        (Some(t), Path::Rollback) => {
            assert_eq!(
                t.transaction_state,
                TransferState::RolledBack,
                "{step} / {fault}"
            );
            assert_eq!(t.reason.map(|r| r.as_str()), Some("balance_overflow"));
            false
        }
    };
    let dest_opening = dest.opening_balance;
    let want = if moved {
        (90, dest_opening + 10)
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
