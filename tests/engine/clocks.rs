//! Safety that does not depend on clocks: two instances on one store whose clocks disagree —
//! one wall clock several leases ahead, or one clock that stood still while its VM was
//! suspended — over a few hot accounts. The lease fence then fails by construction: the
//! instance whose clock is ahead takes over leases the other still holds, and the stalled
//! holder applies late. What must hold anyway, once the late applies are given back (by a
//! settle that finds a mark other than the commit's, or by the late-apply sweep):
//! conservation, per-account exactness, no pending entry, no balance below its floor, every
//! transfer terminal.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use transfer_service::audit::audit;
use transfer_service::store::Index;
use transfer_service::transfer::protocol::Retention;
use transfer_service::transfer::{Engine, EngineConfig};

use crate::support::engine::*;
use crate::support::faulty::{Fault, Matcher};

const LEASE: Duration = Duration::from_millis(300);
const ACCOUNTS: usize = 4;
const TRANSFERS: usize = 120;
const SEEDS: u64 = 3;

fn config(sweep: bool) -> EngineConfig {
    EngineConfig {
        max_conflicts: 500,
        recovery_interval: Duration::from_millis(10),
        recovery_page: 200,
        // No bound on pending entries: nothing is refused as busy.
        retention: Retention::NONE,
        sweep_pages_per_tick: if sweep { 10 } else { 0 },
        ..EngineConfig::with_lease(LEASE)
    }
}

/// How instance A's clock misbehaves.
#[derive(Debug, Clone, Copy)]
enum Clocks {
    /// B's wall clock runs this many leases ahead of A's.
    BAhead(u32),
    /// A's clock stands still for this many leases while A is stalled (a suspended VM whose
    /// clocks did not count the suspension).
    AFrozen(u32),
}

/// What a run ended with.
struct Outcome {
    clean: bool,
    report: String,
    compensated: u64,
}

async fn run(seed: u64, clocks: Clocks, sweep: bool) -> Outcome {
    run_in(world(seed, Duration::from_millis(2)), seed, clocks, sweep).await
}

async fn run_in(w: World, seed: u64, clocks: Clocks, sweep: bool) -> Outcome {
    let b_clock = match clocks {
        Clocks::BAhead(leases) => w.clock.skewed((LEASE * leases).as_millis() as i64),
        Clocks::AFrozen(_) => w.clock.skewed(0),
    };
    let a = w.instance(w.faulty.clone(), config(sweep));
    let b = w.instance_with_clock(w.base.clone(), config(sweep), b_clock);
    for i in 0..ACCOUNTS {
        open_account(&a, &format!("hot{i}"), 1_000).await;
    }
    inject_stalls(&w, seed, clocks);
    b.recovery().spawn_loop();
    if let Clocks::AFrozen(leases) = clocks {
        freeze_for(&w, LEASE * leases);
    }
    start_random_transfers(&a, seed).await;
    let quiet = wait_until_quiescent(&w, &a, &b).await;
    let report = audit(w.base.as_ref(), i64::MAX).await.expect("audit");
    b.shut_down();
    eprintln!(
        "seed {seed} {clocks:?}: {} stalls fired, {} late applies undone",
        w.faulty.fired.load(std::sync::atomic::Ordering::SeqCst),
        late_applies_given_back(&a, &b)
    );
    Outcome {
        clean: quiet && report.is_clean() && report.is_quiescent(),
        report: report.to_string(),
        compensated: late_applies_given_back(&a, &b),
    }
}

/// Late applies given back, by B's sweep or by a settle of either instance that found one
/// (`docs/design.md` §9, "The fence").
fn late_applies_given_back(a: &Instance, b: &Instance) -> u64 {
    a.metrics.late_applies_compensated_total.get() + b.metrics.late_applies_compensated_total.get()
}

/// A's account reads and writes stall, one each: long enough for B to take the transfer
/// over and finish it while A still believes it holds the lease. With B's clock ahead, B
/// takes over at once, so a stall shorter than A's own lease does it; with A's clock frozen,
/// A's lease never ends in its own eyes, so stalls of several leases do.
fn inject_stalls(w: &World, seed: u64, clocks: Clocks) {
    let mut rng = StdRng::seed_from_u64(seed);
    // With B ahead, what lets A apply late is a read or write of the account that B settles
    // while A's request waits; with A frozen, any long stall does.
    let (stalls, shortest, longest, before_only) = match clocks {
        Clocks::BAhead(_) => (100, LEASE / 10, LEASE / 3, true),
        // Fewer: stalls on one account queue behind each other, and only those that end
        // while A's clock stands still let it act late.
        Clocks::AFrozen(_) => (40, LEASE * 2, LEASE * 5, false),
    };
    for _ in 0..stalls {
        let stall = rng.random_range(shortest..longest);
        let fault = if before_only || rng.random_bool(0.5) {
            Fault::StallBefore(stall)
        } else {
            Fault::StallAfter(stall)
        };
        let op = if rng.random_bool(0.5) {
            "get"
        } else {
            "replace"
        };
        let matcher = Matcher {
            op: Some(op),
            index: Some(Index::Accounts),
            ..Matcher::default()
        };
        w.faulty.inject(matcher, fault, 1);
    }
}

/// A's clock stands still from now for `frozen` (the faults keep its workers asleep
/// meanwhile), then runs on, behind.
fn freeze_for(w: &World, frozen: Duration) {
    let clock = w.clock.clone();
    clock.freeze();
    tokio::spawn(async move {
        tokio::time::sleep(frozen).await;
        clock.thaw();
    });
}

/// Transfers between the hot accounts, accepted by A a few at a time.
async fn start_random_transfers(a: &Arc<Engine>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    for n in 0..TRANSFERS {
        let from = rng.random_range(0..ACCOUNTS);
        let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
        let new = transfer(
            &format!("t{n}"),
            &format!("hot{from}"),
            &format!("hot{to}"),
            rng.random_range(1..60),
        );
        a.create_transfer(new).await.expect("accepted");
        if n % 8 == 0 {
            tokio::time::sleep(LEASE / 4).await;
        }
    }
}

/// Waits until nothing is in flight, no worker runs, and (when the sweep runs) no pending
/// entry is left. `false` if that never happened within a minute of virtual time.
async fn wait_until_quiescent(w: &World, a: &Instance, b: &Instance) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let idle = a.running_tasks() == 0 && b.metrics.transfers_in_flight.get() == 0;
        if idle {
            let report = audit(w.base.as_ref(), i64::MAX).await.expect("audit");
            if report.in_flight == 0 && report.pending_entries == 0 {
                return true;
            }
            if report.in_flight == 0 && b.config.sweep_pages_per_tick == 0 {
                return true;
            }
        }
        tokio::time::sleep(LEASE).await;
    }
    false
}

/// Runs every seed with `clocks` and the sweep, each ending exact: the late applies the sweep
/// undid, over all of them.
async fn late_applies_undone_by_the_sweep(clocks: Clocks) -> u64 {
    let mut compensated = 0;
    for seed in 0..SEEDS {
        let outcome = run(seed, clocks, true).await;
        assert!(outcome.clean, "seed {seed}: {}", outcome.report);
        compensated += outcome.compensated;
    }
    compensated
}

#[tokio::test(start_paused = true)]
async fn instances_whose_wall_clocks_are_leases_apart_end_exact_after_the_sweep() {
    let compensated = late_applies_undone_by_the_sweep(Clocks::BAhead(3)).await;
    eprintln!("wall clocks apart: {compensated} late applies undone by the sweep");
    assert!(compensated > 0, "the skew must have caused late applies");
}

#[tokio::test(start_paused = true)]
async fn an_instance_whose_clock_stood_still_ends_exact_after_the_sweep() {
    let compensated = late_applies_undone_by_the_sweep(Clocks::AFrozen(40)).await;
    eprintln!("a clock stood still: {compensated} late applies undone by the sweep");
    assert!(
        compensated > 0,
        "the frozen clock must have caused late applies"
    );
}

/// The control: the same runs without the sweep are not exact, so it is the sweep (and not
/// luck) that makes the two tests above pass.
#[tokio::test(start_paused = true)]
async fn without_the_sweep_the_same_runs_leave_late_applies_behind() {
    let mut broken = 0;
    for seed in 0..SEEDS {
        for clocks in [Clocks::BAhead(3), Clocks::AFrozen(40)] {
            if !run(seed, clocks, false).await.clean {
                broken += 1;
            }
        }
    }
    assert!(
        broken > 0,
        "no run left a late apply: the scenario tests nothing"
    );
}

/// The same on the Elasticsearch backend (on the emulator, a test double), in real time:
/// near-real-time search delays recovery and the sweep, and changes nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_elasticsearch_clocks_apart_or_standing_still_end_exact_after_the_sweep() {
    let mut compensated = 0;
    for (seed, clocks) in [(0, Clocks::BAhead(3)), (1, Clocks::AFrozen(40))] {
        let w = world_on_emulator(seed, Duration::from_millis(2)).await;
        compensated += clocks_apart_end_exact_after_the_sweep(w, seed, clocks).await;
    }
    eprintln!("on Elasticsearch: {compensated} late applies undone by the sweep");
    assert!(compensated > 0, "the clocks must have caused late applies");
}

/// The same on the real cluster, with its real refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_real_elasticsearch_clocks_apart_or_standing_still_end_exact_after_the_sweep() {
    let mut compensated = 0;
    for (seed, clocks) in [(0, Clocks::BAhead(3)), (1, Clocks::AFrozen(40))] {
        let Some(w) = world_on_real_cluster(seed, Duration::from_millis(2)).await else {
            return;
        };
        compensated += clocks_apart_end_exact_after_the_sweep(w, seed, clocks).await;
    }
    eprintln!("on real Elasticsearch: {compensated} late applies undone by the sweep");
    assert!(compensated > 0, "the clocks must have caused late applies");
}

/// One run in `w`, which must end exact; the late applies the sweep undid.
async fn clocks_apart_end_exact_after_the_sweep(w: World, seed: u64, clocks: Clocks) -> u64 {
    let outcome = run_in(w, seed, clocks, true).await;
    assert!(outcome.clean, "seed {seed} {clocks:?}: {}", outcome.report);
    outcome.compensated
}
