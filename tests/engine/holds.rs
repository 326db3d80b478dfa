//! Holds on the engine, on paused time: a hold waits in `pending` past the transfer timeout
//! and rolls back on its own expiry; captures (whole and partial) settle exactly; a capture
//! recorded while `created` is applied once pending; capture, cancel and expiry racing end
//! with exactly one winner; recovery leaves a waiting hold alone without reading it, and
//! finishes or rolls back what a crash left.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use transfer_service::transfer::lease::PARKED;
use transfer_service::transfer::model::{RollbackReason, TransferState};
use transfer_service::transfer::operations::{Created, ServiceError};
use transfer_service::transfer::{Engine, EngineConfig};

use crate::support::engine::*;

const LEASE: Duration = Duration::from_secs(2);

fn config() -> EngineConfig {
    EngineConfig {
        // Far shorter than the holds below: a waiting hold must outlive it.
        transfer_timeout: Duration::from_secs(5),
        ..EngineConfig::with_lease(LEASE)
    }
}

/// A world (seeded, without jitter) with `a` (100) and `b` (0) open on one instance of
/// [`config`], straight on its store.
async fn a_and_b_world(seed: u64) -> (World, Instance) {
    let w = world(seed, Duration::ZERO);
    let e = w.instance(w.base.clone(), config());
    open_a_and_b(&e).await;
    (w, e)
}

/// How many holds `e` counted completed `how` (`captured`, `cancelled`, `expired`).
fn holds_completed(e: &Instance, how: &str) -> u64 {
    e.metrics
        .holds_completed_total
        .with_label_values(&[how])
        .get()
}

async fn start_hold(e: &Arc<Engine>, id: &str, amount: i64, expires_in: Duration) {
    let created = e
        .create_transfer(hold(id, "a", "b", amount, expires_in))
        .await
        .expect("hold accepted");
    assert!(matches!(created, Created::New(_)), "{created:?}");
}

/// Waits until the hold is applied and parked (its worker gone).
async fn until_waiting(e: &Engine, id: &str) {
    until(
        &format!("{id} to wait"),
        Duration::from_secs(10),
        || async { transfer_doc(e, id).await.lease_owner.as_deref() == Some(PARKED) },
    )
    .await;
    until("its worker to end", Duration::from_secs(10), || async {
        e.running_tasks() == 0
    })
    .await;
}

async fn accounts(e: &Engine) -> (i64, i64) {
    (balance(e, "a").await, balance(e, "b").await)
}

/// Runs recovery sweeps (as the loop would) every 50 ms for `span` of virtual time.
async fn recover_for(w: &World, e: &Arc<Engine>, span: Duration) {
    let permits = Arc::new(Semaphore::new(64));
    let end = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < end {
        e.recovery()
            .recover_once(w.now_millis() + 1, &permits)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_hold_waits_past_the_transfer_timeout_and_rolls_back_when_it_expires() {
    let (w, e) = a_and_b_world(1).await;
    start_hold(&e, "h", 30, Duration::from_secs(60)).await;
    until_waiting(&e, "h").await;
    let t = transfer_doc(&e, "h").await;
    assert_eq!(t.transaction_state, TransferState::Pending);
    assert!(t.hold_expires_at.is_some());
    // Debited, credited, the credit not spendable.
    assert_eq!(accounts(&e).await, (70, 30));
    assert_eq!(e.get_account("b").await.unwrap().unwrap().available(), 0);

    // Well past TRANSFER_TIMEOUT (5 s), with recovery sweeping: still waiting, never read.
    let gets = e.store_requests("get", "ok");
    recover_for(&w, &e, Duration::from_secs(30)).await;
    assert_eq!(
        e.store_requests("get", "ok"),
        gets,
        "recovery read a waiting hold"
    );
    assert_eq!(state(&e, "h").await, TransferState::Pending);

    // Past its expiry (60 s) plus the skew margin: rolled back with `expired`.
    recover_until_quiescent(&w, &e, || 0, Duration::from_secs(60)).await;
    let t = transfer_doc(&e, "h").await;
    assert_eq!(t.transaction_state, TransferState::RolledBack);
    assert_eq!(t.reason, Some(RollbackReason::Expired));
    assert_eq!(accounts(&e).await, (100, 0));
    assert_eq!(holds_completed(&e, "expired"), 1);
    assert_invariants(&w.base).await;
}

#[tokio::test(start_paused = true)]
async fn whole_and_partial_captures_settle_exactly() {
    for (capture, want) in [(None, (70, 30)), (Some(30), (70, 30)), (Some(12), (88, 12))] {
        let (w, e) = a_and_b_world(2).await;
        start_hold(&e, "h", 30, Duration::from_secs(600)).await;
        until_waiting(&e, "h").await;
        let t = e.capture_transfer("h", capture).await.expect("captured");
        assert!(
            matches!(
                t.transaction_state,
                TransferState::Committed | TransferState::Finished
            ),
            "{t:?}"
        );
        assert_eq!(t.captured_amount, Some(capture.unwrap_or(30)));
        assert_ends_by_itself(&e, "h", TransferState::Finished).await;
        assert_eq!(accounts(&e).await, want, "capture {capture:?}");
        // An identical repeat answers the same; another amount is a conflict.
        let again = e.capture_transfer("h", capture).await.expect("repeat");
        assert_eq!(again.transaction_state, TransferState::Finished);
        let other = e.capture_transfer("h", Some(1)).await;
        assert!(matches!(other, Err(ServiceError::Conflict(_))), "{other:?}");
        assert!(matches!(
            e.cancel_transfer("h").await,
            Err(ServiceError::Conflict(_))
        ));
        assert_eq!(holds_completed(&e, "captured"), 1);
        assert_invariants(&w.base).await;
    }
}

#[tokio::test(start_paused = true)]
async fn captures_out_of_range_or_of_plain_transfers_are_refused() {
    let (_w, e) = a_and_b_world(3).await;
    start_hold(&e, "h", 30, Duration::from_secs(600)).await;
    for bad in [0, -1, 31] {
        let refused = e.capture_transfer("h", Some(bad)).await;
        assert!(
            matches!(refused, Err(ServiceError::Invalid(_))),
            "{bad}: {refused:?}"
        );
    }
    start_transfer(&e, "plain", "a", "b", 5).await;
    let refused = e.capture_transfer("plain", None).await;
    assert!(
        matches!(refused, Err(ServiceError::Conflict(_))),
        "{refused:?}"
    );
    let missing = e.capture_transfer("nope", None).await;
    assert!(
        matches!(missing, Err(ServiceError::NotFound)),
        "{missing:?}"
    );
    // A plain transfer never waits: it finishes as before.
    assert_ends_by_itself(&e, "plain", TransferState::Finished).await;
    let plain = transfer_doc(&e, "plain").await;
    assert_eq!((plain.hold_expires_at, plain.captured_amount), (None, None));
}

#[tokio::test(start_paused = true)]
async fn a_capture_recorded_while_created_is_applied_once_pending() {
    let (w, e) = a_and_b_world(4).await;
    // The worker is slowed so that the capture finds the hold still `created`.
    w.faulty.inject(
        crate::support::faulty::Matcher::writes(transfer_service::store::Index::Transactions)
            .moving_to("pending"),
        crate::support::faulty::Fault::StallBefore(Duration::from_millis(300)),
        1,
    );
    let slow = w.instance(w.faulty.clone(), config());
    slow.create_transfer(hold("h", "a", "b", 30, Duration::from_secs(600)))
        .await
        .unwrap();
    assert_eq!(state(&e, "h").await, TransferState::Created);
    let t = e.capture_transfer("h", Some(10)).await.expect("captured");
    assert_eq!(t.captured_amount, Some(10));
    assert_ends_by_itself(&e, "h", TransferState::Finished).await;
    assert_eq!(accounts(&e).await, (90, 10));
    assert_invariants(&w.base).await;
}

#[tokio::test(start_paused = true)]
async fn capture_and_cancel_racing_end_with_exactly_one_winner() {
    for seed in 0..20u64 {
        let w = world(seed, Duration::from_millis(5));
        let a = w.instance(w.faulty.clone(), config());
        let b = w.instance(w.faulty.clone(), config());
        open_a_and_b(&a).await;
        start_hold(&a, "h", 30, Duration::from_secs(600)).await;
        if seed % 2 == 0 {
            until_waiting(&a, "h").await;
        }
        let (capture, cancel) =
            tokio::join!(a.capture_transfer("h", Some(20)), b.cancel_transfer("h"));
        recover_until_quiescent(&w, &a, || b.running_tasks(), Duration::from_secs(60)).await;
        let t = transfer_doc(&a, "h").await;
        match (&capture, &cancel) {
            (Ok(_), Err(ServiceError::Conflict(_))) => {
                assert_eq!(t.transaction_state, TransferState::Finished, "seed {seed}");
                assert_eq!(accounts(&a).await, (80, 20), "seed {seed}");
            }
            (Err(ServiceError::Conflict(_)), Ok(_)) => {
                assert_eq!(
                    t.transaction_state,
                    TransferState::RolledBack,
                    "seed {seed}"
                );
                assert_eq!(t.reason, Some(RollbackReason::Cancelled));
                assert_eq!(accounts(&a).await, (100, 0), "seed {seed}");
            }
            other => panic!("seed {seed}: not exactly one winner: {other:?}"),
        }
        assert_invariants(&w.base).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_capture_after_the_expiry_loses_and_rolls_the_hold_back() {
    let (w, e) = a_and_b_world(5).await;
    start_hold(&e, "h", 30, Duration::from_secs(10)).await;
    until_waiting(&e, "h").await;
    // Expired, but recovery has not acted yet: the capture writes the expiry itself.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let late = e.capture_transfer("h", None).await;
    assert!(matches!(late, Err(ServiceError::Conflict(_))), "{late:?}");
    assert_ends_by_itself(&e, "h", TransferState::RolledBack).await;
    assert_eq!(
        transfer_doc(&e, "h").await.reason,
        Some(RollbackReason::Expired)
    );
    let again = e.capture_transfer("h", None).await;
    assert!(matches!(again, Err(ServiceError::Conflict(_))), "{again:?}");
    assert_eq!(accounts(&e).await, (100, 0));
    assert_invariants(&w.base).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_hold_is_released_and_counted() {
    let (w, e) = a_and_b_world(6).await;
    start_hold(&e, "h", 30, Duration::from_secs(600)).await;
    until_waiting(&e, "h").await;
    let t = e.cancel_transfer("h").await.expect("cancelled");
    assert_eq!(t.transaction_state, TransferState::Terminating);
    // Without recovery: the cancel claimed the parked lease and drives the rollback itself.
    assert_ends_by_itself(&e, "h", TransferState::RolledBack).await;
    assert_eq!(accounts(&e).await, (100, 0));
    let late = e.capture_transfer("h", None).await;
    assert!(matches!(late, Err(ServiceError::Conflict(_))), "{late:?}");
    assert_eq!(holds_completed(&e, "cancelled"), 1);
    assert_invariants(&w.base).await;
}

/// A capture recorded before the expiry wins, even when its worker dies at once and the
/// commit is left to recovery after the expiry has passed: the client was told "captured".
#[tokio::test(start_paused = true)]
async fn a_capture_recorded_before_the_expiry_is_finished_by_recovery_after_it() {
    use crate::support::faulty::{Fault, StepWrite};
    let (w, e) = a_and_b_world(6).await;
    start_hold(&e, "h", 30, Duration::from_secs(10)).await;
    until_waiting(&e, "h").await;
    // The capturing instance records the capture, then dies before committing.
    w.faulty.inject(
        StepWrite::Capture.matcher("h"),
        Fault::Crash { applied: true },
        1,
    );
    let dying = w.instance(w.faulty.clone(), config());
    // Its store never answers again: the capture request hangs like a dead process's.
    let hung = tokio::spawn(async move { dying.capture_transfer("h", Some(12)).await });
    until(
        "the capture to be recorded",
        Duration::from_secs(5),
        || async { transfer_doc(&e, "h").await.captured_amount == Some(12) },
    )
    .await;
    assert_eq!(state(&e, "h").await, TransferState::Pending);
    // Well past the expiry and the dead worker's lease: recovery commits, never expires it.
    tokio::time::sleep(Duration::from_secs(15)).await;
    recover_until_quiescent(&w, &e, || 0, Duration::from_secs(60)).await;
    hung.abort();
    let t = transfer_doc(&e, "h").await;
    assert_eq!(t.transaction_state, TransferState::Finished, "{t:?}");
    assert_eq!(accounts(&e).await, (88, 12));
    assert_invariants(&w.base).await;
}
