//! The stale-worker race of `docs/design.md §3`, seeded and repeated (1,000 seeds; set
//! `STALE_WORKER_SEEDS` for more).
//!
//! For each seed, a worker of instance A starts a transfer and stalls for several lease
//! periods at a point the seed picks (before or after a read or a write of either account or
//! of the transfer). Its lease runs out, instance B's recovery takes the transfer over and
//! drives it to the end, and then the stalled worker wakes up and carries on. Whatever it
//! does then, no balance may change a second time: every account must end exact and every
//! pending list empty.
//!
//! All seeds run at once on one embedded store, each on its own pair of accounts.
//!
//! The same race for holds (300 seeds; `STALE_WORKER_HOLD_SEEDS` for more): captured whole,
//! captured in part, or left to expire, with the stall at the apply, the park, the capture's
//! commit, the remove that gives `amount − n` back, or the expiry's rollback.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use transfer_service::store::{DynStore, Index};
use transfer_service::transfer::lease::PARKED;
use transfer_service::transfer::model::{RollbackReason, TransferState};
use transfer_service::transfer::operations::ServiceError;
use transfer_service::transfer::protocol::Retention;
use transfer_service::transfer::{Engine, EngineConfig};

use crate::support::engine::*;
use crate::support::faulty::{Fault, Matcher};

const LEASE: Duration = Duration::from_millis(80);

fn config(tombstones: usize) -> EngineConfig {
    let mut config = EngineConfig {
        max_conflicts: 500,
        recovery_interval: Duration::from_millis(20),
        recovery_page: 200,
        ..EngineConfig::with_lease(LEASE)
    };
    if tombstones == 0 {
        config.retention = Retention::NONE;
    } else {
        config.retention.max_entries = tombstones;
    }
    config
}

/// Where the seed makes the first worker stall.
fn stall_point(seed: u64) -> (Matcher, Fault, &'static str) {
    let mut rng = StdRng::seed_from_u64(seed);
    let stall = LEASE * rng.random_range(2..6);
    let account = if rng.random_bool(0.5) { "a" } else { "b" };
    let id = format!("s{seed}-{account}");
    let fault = if rng.random_bool(0.5) {
        Fault::StallBefore(stall)
    } else {
        Fault::StallAfter(stall)
    };
    match rng.random_range(0..3) {
        0 => (
            Matcher::reads(Index::Accounts).of_doc(id),
            fault,
            "account read",
        ),
        1 => (
            Matcher::writes(Index::Accounts).of_doc(id),
            fault,
            "account write",
        ),
        _ => {
            let state = ["pending", "committed", "finished"][rng.random_range(0..3)];
            (
                Matcher::writes(Index::Transactions)
                    .of_doc(format!("s{seed}-t"))
                    .moving_to(state),
                fault,
                "transfer write",
            )
        }
    }
}

/// The production defence: lease-fenced conditional writes, and tombstones.
#[tokio::test(start_paused = true)]
async fn a_stalled_worker_never_applies_a_transfer_twice() {
    run_seeds(1000).await;
}

/// The lease fence alone, with tombstones switched off (`Retention::NONE`): what protects a
/// busy account whose tombstones have been pruned, and what fails if the fence is broken.
#[tokio::test(start_paused = true)]
async fn the_lease_fence_alone_prevents_double_applies() {
    run_seeds(0).await;
}

async fn run_seeds(tombstones: usize) {
    let seeds = seeds_from_env("STALE_WORKER_SEEDS", 1000);
    let w = world(7, Duration::from_millis(1));
    let (base, faulty): (DynStore, _) = (w.base.clone(), w.faulty.clone());
    let a = w.instance(faulty.clone(), config(tombstones));
    let b = w.instance(base.clone(), config(tombstones));

    for seed in 0..seeds {
        // Opened by B: A remembers no copy of them, so A's first step on each reads it (the
        // "account read" stall points need that read).
        for (account, balance) in [("a", 100), ("b", 0)] {
            b.create_account(new_account(&format!("s{seed}-{account}"), balance))
                .await
                .unwrap();
        }
        let (matcher, fault, _) = stall_point(seed);
        faulty.inject(matcher, fault, 1);
    }
    for seed in 0..seeds {
        a.create_transfer(transfer(
            &format!("s{seed}-t"),
            &format!("s{seed}-a"),
            &format!("s{seed}-b"),
            10,
        ))
        .await
        .unwrap();
    }

    // Instance B recovers until everything is terminal and every stalled worker of A has
    // woken up and stopped.
    recover_until_quiescent(&w, &b, || a.running_tasks(), Duration::from_secs(240)).await;

    let fired = faulty.fired.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("{seeds} seeds, {fired} stalls fired");
    assert_invariants(&base).await;
    for seed in 0..seeds {
        let t = b
            .get_transfer(&format!("s{seed}-t"))
            .await
            .unwrap()
            .unwrap();
        let src = b.get_account(&format!("s{seed}-a")).await.unwrap().unwrap();
        let dest = b.get_account(&format!("s{seed}-b")).await.unwrap().unwrap();
        let want = match t.transaction_state {
            TransferState::Finished => (90, 10),
            TransferState::RolledBack => (100, 0),
            other => panic!("seed {seed}: transfer left {other}"),
        };
        let (_, _, point) = stall_point(seed);
        assert_eq!(
            (src.balance, dest.balance),
            want,
            "seed {seed} (stall at {point}): transfer {} but balances {} / {}",
            t.transaction_state,
            src.balance,
            dest.balance
        );
        assert!(src.pending_transactions.is_empty() && dest.pending_transactions.is_empty());
    }
    assert!(
        fired > seeds / 2,
        "most stalls must fire ({fired} of {seeds})"
    );
}

// Holds: the same race for a hold captured whole, a hold captured in part and a hold left to
// expire. The stalled worker may be the one that applies and parks the hold, or the one a
// capture (on the stalling instance) starts to commit and settle it, or one rolling it back;
// whatever it does when it wakes, the hold ends once, with `n` moved and `amount − n` given
// back (captures), or nothing moved (expiry).

/// What happens to a seed's hold of 10 (from `h{seed}-a`, 100, to `h{seed}-b`, 0).
#[derive(Debug, Clone, Copy, PartialEq)]
enum HoldEnd {
    /// Captured (the whole 10, or 3 of it), after `delay` and through the stalling instance
    /// A or the other one; the hold expires `expires_in` after its creation, soon after the
    /// capture, so a stalled commit runs past the expiry (a recorded capture must still win).
    Captured {
        n: Option<i64>,
        delay: Duration,
        on_a: bool,
        expires_in: Duration,
    },
    /// Never captured: it expires `expires_in` after its creation.
    Expires { expires_in: Duration },
}

/// The seed's hold, and where its first matching request stalls.
fn hold_plan(seed: u64) -> (HoldEnd, Matcher, Fault, &'static str) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x401d);
    let end = match seed % 3 {
        2 => HoldEnd::Expires {
            expires_in: LEASE * rng.random_range(1..8),
        },
        kind => {
            let delay = LEASE * rng.random_range(0..8);
            HoldEnd::Captured {
                n: (kind == 1).then_some(3),
                delay,
                on_a: rng.random_bool(0.7),
                expires_in: delay + LEASE * rng.random_range(1..4),
            }
        }
    };
    let stall = LEASE * rng.random_range(2..6);
    let fault = if rng.random_bool(0.5) {
        Fault::StallBefore(stall)
    } else {
        Fault::StallAfter(stall)
    };
    let account = format!("h{seed}-{}", if rng.random_bool(0.5) { "a" } else { "b" });
    let transfer = format!("h{seed}-t");
    let (matcher, point) = match rng.random_range(0..5) {
        0 => (
            Matcher::reads(Index::Accounts).of_doc(account),
            "account read",
        ),
        // The first write of an account: the apply.
        1 => (Matcher::writes(Index::Accounts).of_doc(account), "apply"),
        // The write that empties its pending list: the remove (with a capture's give-back)
        // or the undo.
        2 => (
            Matcher::writes(Index::Accounts)
                .of_doc(account)
                .leaving_pending(0),
            "remove or undo",
        ),
        3 => (
            Matcher::writes(Index::Transactions)
                .of_doc(transfer)
                .with_field("lease_owner", Some(serde_json::json!(PARKED))),
            "park",
        ),
        _ => {
            let states = [
                "pending",
                "committed",
                "finished",
                "terminating",
                "rolled-back",
            ];
            let state = states[rng.random_range(0..states.len())];
            (
                Matcher::writes(Index::Transactions)
                    .of_doc(transfer)
                    .moving_to(state),
                "transfer write",
            )
        }
    };
    (end, matcher, fault, point)
}

/// Holds under the production defences (lease fence and tombstones).
#[tokio::test(start_paused = true)]
async fn a_stalled_worker_never_double_applies_or_mis_settles_a_hold() {
    run_hold_seeds(1000).await;
}

/// Holds under the lease fence alone (tombstones off).
#[tokio::test(start_paused = true)]
async fn the_lease_fence_alone_keeps_holds_exact() {
    run_hold_seeds(0).await;
}

async fn run_hold_seeds(tombstones: usize) {
    let seeds = seeds_from_env("STALE_WORKER_HOLD_SEEDS", 300);
    let w = world(8, Duration::from_millis(1));
    let (base, faulty): (DynStore, _) = (w.base.clone(), w.faulty.clone());
    let a = w.instance(faulty.clone(), config(tombstones));
    let b = w.instance(base.clone(), config(tombstones));

    for seed in 0..seeds {
        // Opened by B: A remembers no copy of them, so A's first step on each reads it (the
        // "account read" stall points need that read).
        for (account, balance) in [("a", 100), ("b", 0)] {
            b.create_account(new_account(&format!("h{seed}-{account}"), balance))
                .await
                .unwrap();
        }
        let (_, matcher, fault, _) = hold_plan(seed);
        faulty.inject(matcher, fault, 1);
    }
    let mut captures = Vec::new();
    for seed in 0..seeds {
        let (end, ..) = hold_plan(seed);
        let (HoldEnd::Expires { expires_in } | HoldEnd::Captured { expires_in, .. }) = end;
        let (id, from, to) = (
            format!("h{seed}-t"),
            format!("h{seed}-a"),
            format!("h{seed}-b"),
        );
        a.create_transfer(hold(&id, &from, &to, 10, expires_in))
            .await
            .unwrap();
        if let HoldEnd::Captured { n, delay, on_a, .. } = end {
            let e = if on_a {
                a.engine.clone()
            } else {
                b.engine.clone()
            };
            captures.push(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                (seed, capture_until_answered(&e, &id, n).await)
            }));
        }
    }
    let mut captured = HashMap::new();
    for capture in captures {
        let (seed, won) = capture.await.unwrap();
        captured.insert(seed, won);
    }

    recover_until_quiescent(&w, &b, || a.running_tasks(), Duration::from_secs(240)).await;

    let fired = faulty.fired.load(std::sync::atomic::Ordering::SeqCst);
    let won = captured.values().filter(|won| **won).count();
    eprintln!(
        "{seeds} holds, {fired} stalls fired; captures answered 200: {won}, 409 (expired \
         first): {}",
        captured.len() - won
    );
    assert_invariants(&base).await;
    for seed in 0..seeds {
        let t = b
            .get_transfer(&format!("h{seed}-t"))
            .await
            .unwrap()
            .unwrap();
        let src = b.get_account(&format!("h{seed}-a")).await.unwrap().unwrap();
        let dest = b.get_account(&format!("h{seed}-b")).await.unwrap().unwrap();
        let (end, _, fault, point) = hold_plan(seed);
        let what = format!("seed {seed} ({end:?}, {fault:?} at {point})");
        let want = match end {
            // Answered 200: it must finish, with n moved, whatever expiry follows.
            HoldEnd::Captured { n, .. } if captured[&seed] => {
                let n = n.unwrap_or(10);
                assert_eq!(
                    (t.transaction_state, t.captured_amount),
                    (TransferState::Finished, Some(n)),
                    "{what}"
                );
                (100 - n, n)
            }
            // Refused (the stall held the capture back past the expiry), or never captured.
            HoldEnd::Captured { .. } | HoldEnd::Expires { .. } => {
                assert_eq!(
                    (t.transaction_state, t.reason),
                    (TransferState::RolledBack, Some(RollbackReason::Expired)),
                    "{what}"
                );
                (100, 0)
            }
        };
        assert_eq!(
            (src.balance, dest.balance),
            want,
            "{what}: transfer {} but balances {} / {}",
            t.transaction_state,
            src.balance,
            dest.balance
        );
        assert!(
            src.pending_transactions.is_empty() && dest.pending_transactions.is_empty(),
            "{what}"
        );
    }
    assert!(
        fired > seeds / 2,
        "most stalls must fire ({fired} of {seeds})"
    );
}

/// Captures `id` (`n` or all of it) until a capture is answered: a capture whose store
/// request timed out behind a stall is repeated, as a client would (an identical capture is
/// answered the same). Whether it was answered `200` (`false`: `409`, the hold expired first).
async fn capture_until_answered(e: &Arc<Engine>, id: &str, n: Option<i64>) -> bool {
    for _ in 0..100 {
        match e.capture_transfer(id, n).await {
            Ok(_) => return true,
            Err(ServiceError::Conflict(_)) => return false,
            Err(ServiceError::Store(_)) => tokio::time::sleep(LEASE).await,
            Err(other) => panic!("capture of {id}: {other:?}"),
        }
    }
    panic!("capture of {id} never answered");
}

/// How many seeds to run: `name` from the environment (for long runs), else `default`.
fn seeds_from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
