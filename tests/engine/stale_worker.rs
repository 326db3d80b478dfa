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

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use transfer_service::store::{DynStore, Index};
use transfer_service::transfer::model::TransferState;
use transfer_service::transfer::protocol::Retention;
use transfer_service::transfer::service::{NewAccount, NewTransfer};
use transfer_service::transfer::EngineConfig;

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
    let seeds: u64 = std::env::var("STALE_WORKER_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let w = world(7, Duration::from_millis(1));
    let (base, faulty): (DynStore, _) = (w.base.clone(), w.faulty.clone());
    let a = w.instance(faulty.clone(), config(tombstones));
    let b = w.instance(base.clone(), config(tombstones));

    for seed in 0..seeds {
        for (account, balance) in [("a", 100), ("b", 0)] {
            a.create_account(NewAccount {
                id: format!("s{seed}-{account}"),
                balance,
                floor: 0,
                ..Default::default()
            })
            .await
            .unwrap();
        }
        let (matcher, fault, _) = stall_point(seed);
        faulty.inject(matcher, fault, 1);
    }
    for seed in 0..seeds {
        a.create_transfer(NewTransfer {
            id: format!("s{seed}-t"),
            from: format!("s{seed}-a"),
            to: format!("s{seed}-b"),
            amount: 10,
            ..Default::default()
        })
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
