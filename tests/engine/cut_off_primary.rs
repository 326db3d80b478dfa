//! A primary cut off from its replicas (`support::cut_off`, the test double of what
//! `tests/process/partitions.rs` makes a real cluster do): it shows writes it accepted and
//! will roll back. Whatever the engine answers or goes on from must not rest on such a read
//! (`docs/design.md` §9, "Partitions"). Each test fails without [`Store::vouch`] at the place
//! it names.
//!
//! [`Store::vouch`]: transfer_service::store::Store::vouch

use std::sync::Arc;
use std::time::Duration;

use transfer_service::store::Index;
use transfer_service::transfer::EngineConfig;

use crate::support::cut_off::CutOff;
use crate::support::engine::*;

const LEASE: Duration = Duration::from_secs(1);

fn config() -> EngineConfig {
    EngineConfig {
        max_store_attempts: 2,
        ..EngineConfig::with_lease(LEASE)
    }
}

/// A world with accounts `src` (100) and `dest` (0), and an instance that sees its store
/// through a primary the test may cut off.
async fn seen_through_a_primary(seed: u64) -> (World, Arc<CutOff>, Instance) {
    let w = world(seed, Duration::ZERO);
    let cut = Arc::new(CutOff::new(w.faulty.clone()));
    let a = w.instance(cut.clone(), config());
    open_account(&a, "src", 100).await;
    open_account(&a, "dest", 0).await;
    (w, cut, a)
}

/// The worker's account writes reach only the cut-off primary and fail; read again through
/// it, each step looks done. Taken as done (`AccountSteps` answering a step found done
/// without a vouched read), the transfer finished while no unit moved once the primary
/// rejoined.
#[tokio::test(start_paused = true)]
async fn an_account_step_seen_done_only_on_a_cut_off_primary_is_not_taken_as_done() {
    let (w, cut, a) = seen_through_a_primary(7).await;
    cut.cut(Index::Accounts);
    start_transfer(&a, "t", "src", "dest", 10).await;
    tokio::time::sleep(LEASE * 3).await;
    assert!(cut.accepted_dirty_writes(), "the worker wrote no account");
    cut.heal();
    let b = w.instance(w.faulty.clone(), config());
    recover_until_quiescent(&w, &b, || a.running_tasks(), Duration::from_secs(60)).await;
    assert_invariants(&w.base).await;
    let moved = match state(&b, "t").await {
        transfer_service::transfer::model::TransferState::Finished => 10,
        _ => 0,
    };
    assert_eq!(balance(&b, "src").await, 100 - moved);
    assert_eq!(balance(&b, "dest").await, moved);
}

/// The create reaches only the cut-off primary and fails; the claim reads it back through
/// that primary and finds its own token. Answered as created (a claim won on an unvouched
/// read), the client was told `201` for a transfer that was gone once the primary rejoined.
#[tokio::test(start_paused = true)]
async fn a_create_seen_only_on_a_cut_off_primary_is_not_answered_created() {
    let (_world, cut, a) = seen_through_a_primary(8).await;
    cut.cut(Index::Transactions);
    let created = a.create_transfer(transfer("t", "src", "dest", 10)).await;
    assert!(cut.accepted_dirty_writes(), "the create was not written");
    cut.heal();
    let exists = a.get_transfer("t").await.expect("read").is_some();
    assert!(
        created.is_err() || exists,
        "answered {created:?}, then gone once the primary rejoined"
    );
    assert!(!exists, "nothing was acknowledged, so nothing is kept");
}

/// Through the cut-off primary, `GET` would show the transfer it accepted: never answered.
#[tokio::test(start_paused = true)]
async fn a_get_is_not_answered_from_a_write_no_replica_has() {
    let (_world, cut, a) = seen_through_a_primary(9).await;
    cut.cut(Index::Transactions);
    let _ = a.create_transfer(transfer("t", "src", "dest", 10)).await;
    let read = a.get_transfer("t").await;
    assert!(
        read.is_err(),
        "answered {read:?} from a write no replica has"
    );
}
