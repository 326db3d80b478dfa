//! The change feed's outbox (`docs/design.md §11`): every transition is recorded in the
//! transfer document by the write that makes it, so a worker that dies right after a
//! transition leaves its event in the store, and recovery finishes the transfer with every
//! event, once each, in order.

use std::time::Duration;

use transfer_service::store::Index;
use transfer_service::transfer::model::TransferDoc;
use transfer_service::transfer::service::NewAccount;
use transfer_service::transfer::EngineConfig;

use crate::support::engine::*;
use crate::support::faulty::{Fault, FaultyStore, Matcher};

const LEASE: Duration = Duration::from_secs(2);

fn config() -> EngineConfig {
    EngineConfig {
        max_store_attempts: 3,
        ..EngineConfig::with_lease(LEASE)
    }
}

fn event_types(doc: &TransferDoc) -> Vec<&'static str> {
    doc.events().iter().map(|e| e.kind.type_name()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_dies_after_a_transition_leaves_its_event_and_recovery_emits_the_rest() {
    let w = world(0, Duration::ZERO);
    let recoverer = w.instance(w.base.clone(), config());
    let cases = [
        ("pending", 100, 0),
        ("committed", 100, 0),
        ("finished", 100, 0),
        // The destination cannot take the credit: the transfer rolls back through terminating.
        ("terminating", 100, i64::MAX - 5),
        ("rolled-back", 100, i64::MAX - 5),
    ];
    let mut workers = Vec::new();
    for (n, (state, src, dest)) in cases.iter().enumerate() {
        for (account, balance) in [("src", *src), ("dest", *dest)] {
            recoverer
                .create_account(NewAccount {
                    id: format!("e{n}-{account}"),
                    balance,
                    floor: 0,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        let faulty = FaultyStore::new(w.base.clone(), n as u64, Duration::ZERO);
        faulty.inject(
            Matcher::writes(Index::Transactions)
                .of_doc(format!("e{n}-t"))
                .moving_to(state),
            Fault::Crash { applied: true },
            1,
        );
        let worker = w.instance(faulty.clone(), config()).engine;
        let new = transfer(
            &format!("e{n}-t"),
            &format!("e{n}-src"),
            &format!("e{n}-dest"),
            10,
        );
        let started = worker.clone();
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(Duration::from_secs(10), started.create_transfer(new)).await;
        });
        workers.push((faulty, worker));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (faulty, _) in &workers {
        assert!(faulty.is_dead(), "every worker died after its transition");
    }
    let live = || {
        workers
            .iter()
            .filter(|(f, e)| !f.is_dead() && e.running_tasks() > 0)
            .count()
    };
    recover_until_quiescent(&w, &recoverer, live, Duration::from_secs(60)).await;
    assert_invariants(&w.base).await;

    let commit = [
        "transfer.created",
        "transfer.pending",
        "transfer.committed",
        "transfer.finished",
    ];
    let rollback = [
        "transfer.created",
        "transfer.pending",
        "transfer.terminating",
        "transfer.rolled-back",
    ];
    for (n, (state, _, _)) in cases.iter().enumerate() {
        let doc = transfer_doc(&recoverer, &format!("e{n}-t")).await;
        let expected: &[&str] = if *state == "terminating" || *state == "rolled-back" {
            &rollback
        } else {
            &commit
        };
        assert_eq!(event_types(&doc), expected, "crash after {state}");
        let events = doc.events();
        assert!(
            events.windows(2).all(|p| p[0].at <= p[1].at),
            "crash after {state}: times out of order {events:?}"
        );
    }
}
