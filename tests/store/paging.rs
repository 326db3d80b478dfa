//! The audit and the recovery sweep on a store of ten thousand transfers, through the wiring
//! the service and the `audit` command use (`app::open_store`), with a short lease.
//!
//! They run against the Elasticsearch **emulator** (the `es-emulator` workspace crate), a test
//! double of Elasticsearch. It matches and sorts every document on every search (each answer
//! is still bounded by the page size), so one page takes time in proportion to the store: on
//! ten thousand transfers, about 100–250 ms in a debug build. The lease here (200 ms) makes a
//! lease-bound request (a quarter lease, 50 ms) shorter than that, which is where the service
//! stood on Elasticsearch once the store held ~9,000 transfers: every page inherited the
//! lease-bound timeout and `audit` exited 2 with "scan: timed out". Pages with a timeout of
//! their own (`AUDIT_PAGE_TIMEOUT`, `RECOVERY_PAGE_TIMEOUT`) go through, whatever the lease.

use std::process::ExitCode;
use std::time::{Duration, Instant};
use transfer_service::time::format_millis;

use serde_json::{json, Value};
use transfer_service::app::{open_store, MigrationMode};
use transfer_service::config::Config;
use transfer_service::metrics::Metrics;
use transfer_service::store::elasticsearch::ElasticsearchStore;
use transfer_service::store::{fields, Index, StaleQuery, Store, WriteOp};

use crate::support::stores;

/// Transfers in the store: above the ~9,000 where the lease-bound timeout gave out.
const TRANSFERS: usize = 10_000;
const ACCOUNTS: usize = 100;
const OPENING: i64 = 1_000;
/// Writes per `_bulk` while filling the store.
const FILL_BATCH: usize = 1_000;

/// A configuration on the emulator's indices under `prefix`, with a 200 ms lease: a
/// lease-bound store request may take a quarter of it, less than one page here.
fn config_on(url: &str, prefix: &str, data_dir: &std::path::Path) -> Config {
    let mut config = Config::for_tests(data_dir.to_owned());
    config.elasticsearch_url = Some(url.to_owned());
    config.index_prefix = prefix.to_owned();
    config.lease_duration = Duration::from_millis(200);
    config
}

fn account(id: &str, now: i64) -> Value {
    json!({
        fields::ACCOUNT_ID: id,
        "balance": OPENING,
        "opening_balance": OPENING,
        "creation_time": format_millis(now),
        "modification_time": format_millis(now),
    })
}

fn transfer(n: usize, state: &str, modified: i64) -> (String, Value) {
    let id = format!("t{n:06}");
    let source = json!({
        fields::ID: id,
        fields::SRC: format!("acct-{:03}", n % ACCOUNTS),
        fields::DEST: format!("acct-{:03}", (n + 1) % ACCOUNTS),
        "amount": 1,
        fields::STATE: state,
        fields::CREATED: format_millis(modified),
        fields::MODIFIED: format_millis(modified),
    });
    (id, source)
}

/// Fills the indices under `prefix` quickly, in large `_bulk`s: [`ACCOUNTS`] accounts and
/// [`TRANSFERS`] transfers in `state` around a ring of accounts, so that every account sends
/// and receives as many as it sends and a `finished` store is exact at the opening balances.
async fn fill(
    url: &str,
    prefix: &str,
    state_of: impl Fn(usize) -> &'static str,
    modified: i64,
) -> ElasticsearchStore {
    let store = stores::es_store_at(url, prefix).await;
    store.migrate().await.expect("migrate");
    let accounts = (0..ACCOUNTS).map(|n| {
        let id = format!("acct-{n:03}");
        WriteOp::Create {
            index: Index::Accounts,
            source: account(&id, modified).into(),
            id,
        }
    });
    let transfers = (0..TRANSFERS).map(|n| {
        let (id, source) = transfer(n, state_of(n), modified);
        WriteOp::Create {
            index: Index::Transactions,
            id,
            source: source.into(),
        }
    });
    let ops: Vec<WriteOp> = accounts.chain(transfers).collect();
    for batch in ops.chunks(FILL_BATCH) {
        for result in store.bulk(batch.to_vec()).await.expect("bulk") {
            assert!(result.expect("item").written().is_some());
        }
    }
    store.refresh().await.expect("refresh");
    store
}

#[tokio::test]
async fn the_audit_reads_ten_thousand_transfers_with_a_short_lease() {
    let emulator = stores::manual_emulator().await;
    let prefix = stores::unique_prefix("audit-paging");
    let now = 1_700_000_000_000;
    fill(&emulator.url, &prefix, |_| "finished", now).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config_on(&emulator.url, &prefix, dir.path());

    let started = Instant::now();
    let exit = transfer_service::app::audit(config).await;
    eprintln!("audit of {TRANSFERS} transfers: {:?}", started.elapsed());

    assert_eq!(
        exit,
        ExitCode::SUCCESS,
        "the audit must read the whole store"
    );
}

#[tokio::test]
async fn recovery_pages_through_a_store_of_ten_thousand_transfers_with_a_short_lease() {
    let emulator = stores::manual_emulator().await;
    let prefix = stores::unique_prefix("recovery-paging");
    let now = 1_700_000_000_000;
    // A tenth stale and in flight: every page still searches all ten thousand.
    let stale = |n: usize| {
        if n.is_multiple_of(10) {
            "pending"
        } else {
            "finished"
        }
    };
    fill(&emulator.url, &prefix, stale, now - 60_000).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config_on(&emulator.url, &prefix, dir.path());
    let store = open_store(&config, &Metrics::new(), MigrationMode::Apply)
        .await
        .expect("open the service's store");

    // What one recovery sweep asks, page after page.
    let mut query = StaleQuery {
        states: vec!["pending".into()],
        modified_before: now,
        after: None,
        limit: transfer_service::app::engine_config(&config).recovery_page,
    };
    let mut seen = 0;
    let started = Instant::now();
    loop {
        let page = store
            .find_stale(&query)
            .await
            .expect("a page of stale transfers");
        seen += page.docs.len();
        match page.next {
            Some(next) => query.after = Some(next),
            None => break,
        }
    }
    eprintln!(
        "recovery pages over {TRANSFERS} transfers: {:?}",
        started.elapsed()
    );
    assert_eq!(seen, TRANSFERS / 10);
}
