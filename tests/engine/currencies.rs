//! Currencies in the protocol (`docs/design.md §3`): every account of a transfer shares one
//! currency (or all have none) and the transfer's own when it states one; otherwise the
//! transfer rolls back with `currency_mismatch` and no unit moves, whoever drives it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use transfer_service::store::{DynStore, Index};
use transfer_service::transfer::model::{AccountDoc, RollbackReason, TransferState};
use transfer_service::transfer::operations::{Created, ServiceError};
use transfer_service::transfer::requests::NewTransfer;

use crate::support::engine::*;

async fn open(e: &Instance, id: &str, balance: i64, currency: Option<&str>) {
    let created = e
        .create_account(
            new_account(id, balance).with_currency(currency.map(crate::support::engine::currency)),
        )
        .await
        .expect("account opens");
    assert!(matches!(created, Created::New(_)), "{id} existed");
}

fn in_currency(id: &str, from: &str, to: &str, currency: Option<&str>) -> NewTransfer {
    transfer(id, from, to, 10).with_currency(currency.map(crate::support::engine::currency))
}

#[tokio::test(start_paused = true)]
async fn a_transfer_between_currencies_rolls_back_and_moves_nothing() {
    let w = world(41, Duration::ZERO);
    let e = w.instance_on_base();
    open(&e, "usd1", 100, Some("USD")).await;
    open(&e, "usd2", 100, Some("USD")).await;
    open(&e, "eur", 100, Some("EUR")).await;
    open(&e, "none1", 100, None).await;
    open(&e, "none2", 100, None).await;
    // (id, from, to, stated currency, finishes)
    let cases = [
        ("usd-usd", "usd1", "usd2", None, true),
        ("usd-usd-stated", "usd1", "usd2", Some("USD"), true),
        ("none-none", "none1", "none2", None, true),
        ("usd-eur", "usd1", "eur", None, false),
        ("eur-usd-stated", "eur", "usd1", Some("EUR"), false),
        ("usd-none", "usd1", "none1", None, false),
        ("none-usd", "none1", "usd1", None, false),
        ("usd-usd-stated-eur", "usd1", "usd2", Some("EUR"), false),
        ("none-none-stated", "none1", "none2", Some("USD"), false),
    ];
    for (id, from, to, currency, _) in cases {
        let created = e.create_transfer(in_currency(id, from, to, currency)).await;
        assert!(matches!(created, Ok(Created::New(_))), "{id}: {created:?}");
    }
    for (id, _, _, currency, finishes) in cases {
        let state = terminal_without_recovery(&e, id).await;
        let doc = transfer_doc(&e, id).await;
        assert_eq!(doc.currency.as_deref(), currency, "{id}");
        if finishes {
            assert_eq!((state, doc.reason), (TransferState::Finished, None), "{id}");
        } else {
            assert_eq!(
                (state, doc.reason),
                (
                    TransferState::RolledBack,
                    Some(RollbackReason::CurrencyMismatch)
                ),
                "{id}"
            );
        }
    }
    // Only the three that finished moved anything: usd1 → usd2 twice, none1 → none2.
    let balances = [
        ("usd1", 80),
        ("usd2", 120),
        ("eur", 100),
        ("none1", 90),
        ("none2", 110),
    ];
    for (id, expected) in balances {
        assert_eq!(balance(&e, id).await, expected, "{id}");
    }
    assert_invariants(&w.base).await;
}

/// A worker applied the source and died; the destination has another currency. Recovery
/// takes the transfer over, finds the source applied (its currency is read all the same),
/// refuses the destination and undoes the source.
#[tokio::test(start_paused = true)]
async fn a_mismatch_found_after_the_source_was_applied_is_undone_by_recovery() {
    let w = world(42, Duration::ZERO);
    let e = w.instance_on_base();
    open(&e, "usd", 100, Some("USD")).await;
    open(&e, "eur", 0, Some("EUR")).await;
    let store: &DynStore = &w.base;
    let now = e.clock().wall_millis();
    let source = store.get(Index::Accounts, "usd").await.unwrap().unwrap();
    let mut applied: AccountDoc = source.source.decode().unwrap();
    applied.balance -= 10;
    applied.pending_debits = 10;
    applied.add_pending("t", now - 60_000, "", None);
    let written = store
        .replace_if(
            Index::Accounts,
            "usd",
            transfer_service::store::Source::encode(&applied).unwrap(),
            source.version,
        )
        .await
        .unwrap();
    assert!(written.written().is_some());
    plant_abandoned_pending(store, "t", ("usd", "eur", 10), now).await;
    e.recovery()
        .recover_once(now, &Arc::new(Semaphore::new(4)))
        .await
        .unwrap();
    let state = terminal_without_recovery(&e, "t").await;
    let doc = transfer_doc(&e, "t").await;
    assert_eq!(
        (state, doc.reason),
        (
            TransferState::RolledBack,
            Some(RollbackReason::CurrencyMismatch)
        )
    );
    assert_eq!(
        (balance(&e, "usd").await, balance(&e, "eur").await),
        (100, 0)
    );
    assert_invariants(&w.base).await;
}

#[tokio::test(start_paused = true)]
async fn currencies_are_part_of_the_replay_comparison() {
    let w = world(43, Duration::ZERO);
    let e = w.instance_on_base();
    open(&e, "a", 100, Some("USD")).await;
    open(&e, "b", 0, Some("USD")).await;
    let again = |code: Option<&str>| new_account("a", 100).with_currency(code.map(currency));
    let replay = e.create_account(again(Some("USD"))).await.unwrap();
    assert!(matches!(replay, Created::Replayed(_)), "{replay:?}");
    for other in [None, Some("EUR")] {
        let conflict = e.create_account(again(other)).await;
        assert!(
            matches!(conflict, Err(ServiceError::Conflict(_))),
            "{other:?}: {conflict:?}"
        );
    }
    e.create_transfer(in_currency("t", "a", "b", Some("USD")))
        .await
        .unwrap();
    let replay = e
        .create_transfer(in_currency("t", "a", "b", Some("USD")))
        .await
        .unwrap();
    assert!(matches!(replay, Created::Replayed(_)), "{replay:?}");
    for other in [None, Some("EUR")] {
        let conflict = e.create_transfer(in_currency("t", "a", "b", other)).await;
        assert!(
            matches!(conflict, Err(ServiceError::Conflict(_))),
            "{other:?}: {conflict:?}"
        );
    }
    assert_eq!(
        terminal_without_recovery(&e, "t").await,
        TransferState::Finished
    );
}
