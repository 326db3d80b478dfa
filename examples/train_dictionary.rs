//! Makes a zstd dictionary for the embedded store's compressed transfers
//! (`src/store/embedded/at_rest.rs`) from documents the engine itself writes.
//!
//! ```sh
//! cargo run --release --example train_dictionary -- src/store/embedded/dictionary_2.zdict
//! ```
//!
//! The engine runs on an embedded store in a temporary directory and settles a mix of the
//! transfers callers make: one-leg transfers with the service's ids and with clients' ids,
//! account ids of several shapes, amounts of every size, refusals for want of funds, holds
//! captured or cancelled, multi-leg transactions, currencies and metadata. Their terminal
//! documents, as stored, are the samples; zstd trains a dictionary of [`DICTIONARY_BYTES`] on
//! them: the strings they share and the entropy tables of their bytes (with which a small
//! document needs no tables of its own). A dictionary, once a store holds documents made with
//! it, never changes: a new one comes with a new marker (see `at_rest.rs`).

use std::sync::Arc;
use std::time::Duration;

use transfer_service::metrics::Metrics;
use transfer_service::store::embedded::EmbeddedStore;
use transfer_service::store::{DynStore, Index};
use transfer_service::transfer::model::{Leg, Metadata};
use transfer_service::transfer::requests::{Hold, Movement, NewAccount, NewTransfer};
use transfer_service::transfer::validated::{AccountId, Currency, TransferId};
use transfer_service::transfer::{Engine, EngineConfig};

/// The dictionary's size: documents of a few hundred bytes gain nothing from more (4 KiB,
/// tried, stored the benchmark's preloaded transfers in 3 bytes more each, not fewer).
const DICTIONARY_BYTES: usize = 1024;

/// Transfers settled for samples.
const SAMPLES: u64 = 20_000;

/// Accounts, of several id shapes.
const ACCOUNTS: u64 = 400;

fn account(i: u64) -> AccountId {
    let id = match i % 4 {
        0 => format!("acct-{i}"),
        1 => format!("customer:{}", 100_000 + i * 7919),
        2 => format!("merchant_{i}.eu"),
        _ => format!(
            "wallet-{}",
            uuid::Uuid::from_u128(i as u128 * 0x9E37_79B9_7F4A_7C15)
        ),
    };
    AccountId::parse(id).expect("a valid account id")
}

/// The `n`th sample's id: mostly the service's own, else a client's.
fn transfer_id(n: u64) -> TransferId {
    match n % 5 {
        0 => TransferId::parse(format!("order-2026-{:06}", n)).expect("valid"),
        1 => TransferId::parse(format!("inv:{}", 880_000 + n)).expect("valid"),
        _ => TransferId::fresh(),
    }
}

/// The `n`th sample's request.
fn request(n: u64) -> NewTransfer {
    let from = n % ACCOUNTS;
    let to = (n * 7 + 1) % ACCOUNTS;
    let to = if to == from { (to + 1) % ACCOUNTS } else { to };
    // Amounts of every size: 1 to about 10^9.
    let amount = 1 + (n * 2_654_435_761) % 10u64.pow((n % 10) as u32);
    let movement = if n % 20 == 7 {
        let leg = |from: u64, to: u64, amount: i64| Leg {
            from: account(from).into(),
            to: account(to).into(),
            amount,
        };
        Movement::legs(vec![
            leg(from, to, amount as i64),
            leg(from, (to + 1) % ACCOUNTS, 3),
            leg((from + 2) % ACCOUNTS, to, 1),
        ])
    } else {
        Movement::one_leg(account(from), account(to), amount as i64)
    }
    .expect("a valid movement");
    let mut new = NewTransfer::new(transfer_id(n), movement);
    if n % 4 == 3 {
        let currency = ["USD", "EUR", "GBP"][(n % 3) as usize];
        new = new.with_currency(Some(Currency::parse(currency.to_owned()).expect("valid")));
    }
    if n % 6 == 5 {
        let labels = vec![
            ("order_id".into(), format!("ord-{}", 31_000 + n)),
            ("channel".into(), "web".into()),
        ];
        new = new.with_metadata(Metadata::parse(labels).expect("valid labels"));
    }
    if n % 25 == 11 {
        new = new.with_hold(Some(Hold {
            expires_in: Some(Duration::from_secs(600)),
        }));
    }
    new
}

#[tokio::main]
async fn main() {
    let out = std::env::args()
        .nth(1)
        .expect("usage: train_dictionary <output file>");
    let dir = tempfile::tempdir().expect("a temp dir");
    let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).expect("open the store"));
    // Half of the samples by each protocol: the two-phase one writes more of a transfer's
    // history and who settled it.
    let half = SAMPLES / 2;
    for (one_transaction, samples) in [(true, 0..half), (false, half..SAMPLES)] {
        let config = EngineConfig {
            one_transaction,
            ..EngineConfig::with_lease(Duration::from_secs(30))
        };
        let engine = Engine::new(store.clone(), config, Metrics::new());
        if one_transaction {
            open_accounts(&engine).await;
        }
        settle(&engine, samples).await;
        engine.shut_down();
    }
    let samples = terminal_documents(&store).await;
    let dictionary = zstd::dict::from_samples(&samples, DICTIONARY_BYTES).expect("trained");
    std::fs::write(&out, &dictionary).expect("write the dictionary");
    eprintln!(
        "{} samples, {} bytes of dictionary written to {out}",
        samples.len(),
        dictionary.len()
    );
}

async fn open_accounts(engine: &Arc<Engine>) {
    for i in 0..ACCOUNTS {
        // A few accounts can pay little: their transfers are refused for want of funds.
        let balance = if i % 50 == 3 { 10 } else { i64::MAX / 4 };
        let opening = NewAccount::new(account(i), balance).expect("a positive balance");
        engine.create_account(opening).await.expect("account opens");
    }
}

/// Makes the transfers `samples` and waits until each has ended (holds: captured or
/// cancelled).
async fn settle(engine: &Arc<Engine>, samples: std::ops::Range<u64>) {
    let mut ids = Vec::new();
    for n in samples {
        let new = request(n);
        ids.push((new.id().to_string(), new.hold().is_some()));
        engine.create_transfer(new).await.expect("accepted");
    }
    let waited = |id: String| {
        let engine = engine.clone();
        async move {
            let waited = engine.wait_transfer(&id, Duration::from_secs(30)).await;
            waited.expect("read").expect("stored");
        }
    };
    for (n, (id, hold)) in ids.into_iter().enumerate() {
        waited(id.clone()).await;
        if hold {
            let ended = match n % 2 {
                0 => engine.capture_transfer(&id, None).await,
                _ => engine.cancel_transfer(&id).await,
            };
            ended.expect("a hold ends");
            waited(id).await;
        }
    }
}

/// The sources of the store's terminal transfers, as stored.
async fn terminal_documents(store: &DynStore) -> Vec<Vec<u8>> {
    let mut samples = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .scan(Index::Transactions, after.as_deref(), 1000)
            .await
            .expect("scan");
        for doc in &page.docs {
            let source = doc.source.to_value().expect("JSON");
            let state = source["transaction_state"].as_str().unwrap_or_default();
            if matches!(state, "finished" | "rolled-back" | "voided" | "expired") {
                samples.push(doc.source.as_bytes().to_vec());
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return samples,
        }
    }
}
