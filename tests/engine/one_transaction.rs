//! Transfers settled in one store transaction, the embedded store's path (`docs/design.md §3`,
//! "In one transaction"). Faults at that transaction are in `faults` (its step boundary
//! "one transaction"); the two-phase protocol's own tests run it on stores that hide their
//! transactions.

use std::time::Duration;

use transfer_service::store::{DynStore, Index, Version};
use transfer_service::transfer::lease::PARKED;
use transfer_service::transfer::model::TransferState;
use transfer_service::transfer::operations::Created;
use transfer_service::transfer::EngineConfig;

use crate::support::engine::*;
use crate::support::faulty::{Fault, Matcher};

async fn version_of(store: &DynStore, id: &str) -> Version {
    let doc = store.get(Index::Accounts, id).await.unwrap();
    doc.expect("account exists").version
}

async fn event_types(e: &Instance, id: &str) -> Vec<&'static str> {
    let t = transfer_doc(e, id).await;
    t.events().iter().map(|e| e.kind.type_name()).collect()
}

/// Opens `a` (100) and `b` (0) and moves 30 from `a` to `b` as transfer `t`, to the end.
async fn thirty_from_a_to_b(e: &Instance) {
    open_account(e, "a", 100).await;
    open_account(e, "b", 0).await;
    start_transfer(e, "t", "a", "b", 30).await;
    assert_eq!(
        terminal_without_recovery(e, "t").await,
        TransferState::Finished
    );
}

#[tokio::test(start_paused = true)]
async fn a_transfer_is_created_and_settled_by_one_store_transaction() {
    let w = world(40, Duration::ZERO);
    let e = w.instance_on_base();
    thirty_from_a_to_b(&e).await;

    assert_eq!(e.store_requests("transact", "ok"), 1);
    assert_eq!(
        e.store_requests("replace", "ok"),
        0,
        "no single-document write"
    );
    assert_eq!(
        event_types(&e, "t").await,
        [
            "transfer.created",
            "transfer.pending",
            "transfer.committed",
            "transfer.finished"
        ],
        "the feed shows every state it passed"
    );
    assert_eq!(transfer_doc(&e, "t").await.lease_owner, None);
    for (id, want) in [("a", 70), ("b", 30)] {
        let account = e.get_account(id).await.unwrap().unwrap();
        assert_eq!(account.balance, want, "{id}");
        assert!(account.pending_transactions.is_empty(), "{id}");
        assert!(account.settled.is_empty(), "{id}: no tombstone is needed");
    }
    assert_invariants(&w.base).await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_transfer_rolls_back_in_its_one_write_and_no_account_changes() {
    let w = world(41, Duration::ZERO);
    let e = w.instance_on_base();
    open_account(&e, "a", 5).await;
    open_account(&e, "b", 0).await;
    let before = (
        version_of(&w.base, "a").await,
        version_of(&w.base, "b").await,
    );

    start_transfer(&e, "short", "a", "b", 10).await;
    start_transfer(&e, "nowhere", "a", "nobody", 1).await;
    for (id, reason, account) in [
        ("short", "insufficient_funds", "a"),
        ("nowhere", "account_not_found", "nobody"),
    ] {
        assert_eq!(
            terminal_without_recovery(&e, id).await,
            TransferState::RolledBack
        );
        let t = transfer_doc(&e, id).await;
        assert_eq!(t.reason.map(|r| r.as_str()), Some(reason), "{id}");
        assert_eq!(t.failed_account.as_deref(), Some(account), "{id}");
        assert_eq!(
            event_types(&e, id).await,
            ["transfer.created", "transfer.rolled-back"],
            "{id}"
        );
    }
    let after = (
        version_of(&w.base, "a").await,
        version_of(&w.base, "b").await,
    );
    assert_eq!(before, after, "no account was written");
    assert_eq!(e.store_requests("transact", "ok"), 2);
    assert_invariants(&w.base).await;
}

/// Two hot accounts, many transfers at once both ways (some refused for want of funds) and
/// multi-leg ones through a third account: each transaction reads the accounts as the ones
/// committed before it left them, so nothing conflicts and every balance is exact.
#[tokio::test(start_paused = true)]
async fn concurrent_transfers_on_hot_accounts_settle_exactly() {
    let w = world(42, Duration::ZERO);
    let e = w.instance_on_base();
    for id in ["a", "b", "c"] {
        open_account(&e, id, 50).await;
    }
    let mut starts = Vec::new();
    for i in 0..120 {
        let engine = e.engine.clone();
        let new = match i % 3 {
            0 => transfer(&format!("t{i}"), "a", "b", 1 + i % 7),
            1 => transfer(&format!("t{i}"), "b", "a", 1 + i % 11),
            _ => legs(&format!("t{i}"), &[("a", "c", 2), ("c", "b", 3)]),
        };
        starts.push(tokio::spawn(async move {
            engine.create_transfer(new).await.expect("accepted");
        }));
    }
    for start in starts {
        start.await.unwrap();
    }
    until("every transfer to end", Duration::from_secs(30), || async {
        e.running_tasks() == 0
    })
    .await;
    let report = assert_invariants(&w.base).await;
    assert_eq!(report.in_flight, 0);
    assert_eq!(
        e.store_requests("transact", "ok"),
        120,
        "each in one transaction"
    );
    assert_eq!(e.store_requests("replace", "ok"), 0);
    let total: i64 = [
        balance(&e, "a").await,
        balance(&e, "b").await,
        balance(&e, "c").await,
    ]
    .iter()
    .sum();
    assert_eq!(total, 150, "no unit created or destroyed");
    assert_eq!(
        e.store_requests("transact", "conflict"),
        0,
        "a transaction never conflicts"
    );
}

/// Review finding: a hold (two-phase: it parks in `pending`) on accounts that transfers
/// settled in one transaction keep writing. Its account steps run inside transactions too, so
/// they line up with the others instead of reading, then losing every conditional write.
#[tokio::test(start_paused = true)]
async fn a_hold_on_hot_accounts_is_applied_among_one_transaction_settles_without_conflicts() {
    let w = world(44, Duration::ZERO);
    let e = w.instance_on_base();
    open_account(&e, "a", 1_000).await;
    open_account(&e, "b", 1_000).await;
    let mut load = Vec::new();
    for client in 0..32 {
        let engine = e.engine.clone();
        load.push(tokio::spawn(async move {
            for n in 0..20 {
                let (from, to) = if (client + n) % 2 == 0 {
                    ("a", "b")
                } else {
                    ("b", "a")
                };
                let id = format!("load-{client}-{n}");
                engine
                    .create_transfer(transfer(&id, from, to, 1))
                    .await
                    .expect("accepted");
            }
        }));
    }
    tokio::task::yield_now().await;
    e.create_transfer(hold("h", "a", "b", 10, Duration::from_secs(600)))
        .await
        .expect("accepted");
    until(
        "the hold to be applied and parked",
        Duration::from_secs(5),
        || async { transfer_doc(&e, "h").await.lease_owner.as_deref() == Some(PARKED) },
    )
    .await;
    for task in load {
        task.await.unwrap();
    }
    assert_eq!(
        e.store_requests("replace", "conflict"),
        0,
        "no account write lost a race"
    );
    assert_eq!(e.store_requests("transact", "conflict"), 0);
    e.cancel_transfer("h").await.expect("cancelled");
    until("every transfer to end", Duration::from_secs(30), || async {
        e.running_tasks() == 0
    })
    .await;
    assert_invariants(&w.base).await;
}

/// `PROTOCOL=two-phase`: the embedded store runs the protocol as Elasticsearch does.
#[tokio::test(start_paused = true)]
async fn the_two_phase_protocol_can_be_asked_for_on_a_store_with_transactions() {
    let w = world(43, Duration::ZERO);
    let mut config = EngineConfig::with_lease(Duration::from_secs(5));
    config.one_transaction = false;
    let e = w.instance(w.base.clone(), config);
    thirty_from_a_to_b(&e).await;
    assert_eq!(e.store_requests("transact", "ok"), 0);
    assert_eq!(
        e.store_requests("replace", "ok"),
        7,
        "three state writes and four account writes"
    );
    assert_invariants(&w.base).await;
}

/// An account document that does not decode fails no request: the transfer is created and
/// left to the two-phase path, which stops at that account for a person, as it always has.
#[tokio::test(start_paused = true)]
async fn an_unreadable_account_leaves_the_transfer_to_the_two_phase_path() {
    let w = world(45, Duration::ZERO);
    let e = w.instance_on_base();
    open_account(&e, "a", 100).await;
    let unreadable = serde_json::json!({"account_id": "broken", "balance": "not a number"});
    w.base
        .create(Index::Accounts, "broken", unreadable.into())
        .await
        .unwrap();
    let created = e.create_transfer(transfer("t", "a", "broken", 10)).await;
    assert!(matches!(created, Ok(Created::New(_))), "{created:?}");
    until("its worker to stop", Duration::from_secs(5), || async {
        e.running_tasks() == 0
    })
    .await;
    // The two-phase path ran: `t` is pending, stopped at the account it cannot read.
    assert_eq!(
        state(&e, "t").await,
        TransferState::Pending,
        "left for a person"
    );
}

/// Review finding: a create whose transaction was committed but whose answer was lost is
/// retried, finds its own token, and is answered as new (`201`) with its metrics, not as a
/// replay of someone else's.
#[tokio::test(start_paused = true)]
async fn a_create_whose_answer_was_lost_is_still_answered_as_new() {
    let w = world(46, Duration::ZERO);
    w.faulty.forward_transactions();
    w.faulty
        .inject(Matcher::transactions(), Fault::FailAfter, 1);
    let e = w.instance(
        w.faulty.clone(),
        EngineConfig::with_lease(Duration::from_secs(5)),
    );
    open_a_and_b(&e).await;
    let created = e.create_transfer(transfer("t", "a", "b", 10)).await;
    assert!(matches!(created, Ok(Created::New(_))), "{created:?}");
    assert_eq!(w.faulty.fired.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(state(&e, "t").await, TransferState::Finished);
    assert_eq!(e.metrics.transfers_created_total.get(), 1);
    let finished = e
        .metrics
        .transfers_completed_total
        .with_label_values(&["finished"]);
    assert_eq!(finished.get(), 1);
    // Another request with the same body is a replay.
    let again = e.create_transfer(transfer("t", "a", "b", 10)).await;
    assert!(matches!(again, Ok(Created::Replayed(_))), "{again:?}");
    assert_invariants(&w.base).await;
}
