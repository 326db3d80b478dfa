//! The engine without HTTP, on real storage (embedded redb in a temp dir) behind a
//! fault-injecting wrapper, on a [`TestClock`]: tests run on tokio's paused time
//! (`#[tokio::test(start_paused = true)]`), so leases, timeouts and recovery cost no real
//! waiting and a "minute" is a minute of virtual time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use transfer_service::audit::{audit, AuditReport};
use transfer_service::metrics::Metrics;
use transfer_service::store::coalescer::WriteCoalescer;
use transfer_service::store::embedded::EmbeddedStore;
use transfer_service::store::instrumented::InstrumentedStore;
use transfer_service::store::{DynStore, Index};
use transfer_service::time::format_millis;
use transfer_service::transfer::clock::{Clock, TestClock};
use transfer_service::transfer::model::{Leg, TransferDoc, TransferState};
use transfer_service::transfer::operations::Created;
use transfer_service::transfer::requests::{Hold, Movement, NewAccount, NewTransfer};
use transfer_service::transfer::validated::{AccountId, Currency, TransferId};
use transfer_service::transfer::{Engine, EngineConfig};

use super::faulty::FaultyStore;

/// One store, seen directly (`base`) and through a fault injector (`faulty`), and the
/// timeline every instance's clock follows.
pub struct World {
    pub base: DynStore,
    pub faulty: Arc<FaultyStore>,
    pub clock: Arc<TestClock>,
    /// What keeps the store alive (a temp dir, an emulator).
    _guard: Box<dyn std::any::Any + Send>,
}

/// A world whose fault injector delays every request by up to `jitter` (seeded).
pub fn world(seed: u64, jitter: Duration) -> World {
    let dir = tempfile::tempdir().expect("temp dir");
    let base: DynStore = Arc::new(EmbeddedStore::open(dir.path()).expect("open store"));
    let faulty = FaultyStore::new(base.clone(), seed, jitter);
    World {
        base,
        faulty,
        clock: TestClock::new(),
        _guard: Box::new(dir),
    }
}

/// A world on the Elasticsearch backend, against the emulator (the `es-emulator` crate, a
/// TEST DOUBLE of Elasticsearch) in this process, with writes coalesced into `_bulk` as the
/// service does. Its requests go over sockets, so tests on it run in real time, not paused.
pub async fn world_on_emulator(seed: u64, jitter: Duration) -> World {
    let emulator = super::stores::emulator().await;
    world_on_elasticsearch(&emulator.url.clone(), Box::new(emulator), seed, jitter).await
}

/// The same on the real cluster the test binary shares (`super::cluster`), on indices of its
/// own; `None` (said why) where no cluster can run.
pub async fn world_on_real_cluster(seed: u64, jitter: Duration) -> Option<World> {
    let url = super::cluster::shared()?;
    Some(world_on_elasticsearch(&url, Box::new(()), seed, jitter).await)
}

async fn world_on_elasticsearch(
    url: &str,
    guard: Box<dyn std::any::Any + Send>,
    seed: u64,
    jitter: Duration,
) -> World {
    let store = Arc::new(super::stores::migrated_es_store(url).await);
    // As many bulks in flight as the service keeps by default, so the fault and property
    // tests see the writes of concurrent bulks interleave as production does.
    let base: DynStore = Arc::new(WriteCoalescer::with_in_flight(store, 512, 8));
    let faulty = FaultyStore::new(base.clone(), seed, jitter);
    World {
        base,
        faulty,
        clock: TestClock::new(),
        _guard: guard,
    }
}

/// An engine: one simulated service instance, with its own metrics.
pub struct Instance {
    pub engine: Arc<Engine>,
    pub metrics: Arc<Metrics>,
    /// The settings the engine was built with.
    pub config: EngineConfig,
}

impl std::ops::Deref for Instance {
    type Target = Arc<Engine>;
    fn deref(&self) -> &Arc<Engine> {
        &self.engine
    }
}

impl World {
    /// An instance on the base store, with a lease of 5 s and this world's clock.
    pub fn instance_on_base(&self) -> Instance {
        let config = EngineConfig::with_lease(Duration::from_secs(5));
        self.instance(self.base.clone(), config)
    }

    /// An instance on `store` (`base` or `faulty`) with this world's clock.
    pub fn instance(&self, store: DynStore, config: EngineConfig) -> Instance {
        self.instance_with_clock(store, config, self.clock.clone())
    }

    /// An instance with a clock of its own (e.g. [`TestClock::skewed`]).
    pub fn instance_with_clock(
        &self,
        store: DynStore,
        config: EngineConfig,
        clock: Arc<TestClock>,
    ) -> Instance {
        let metrics = Metrics::new();
        let store = Arc::new(InstrumentedStore::new(store, metrics.clone()));
        let engine = Engine::with_clock(store, config.clone(), metrics.clone(), clock);
        Instance {
            engine,
            metrics,
            config,
        }
    }

    /// Wall-clock milliseconds on this world's timeline.
    pub fn now_millis(&self) -> i64 {
        self.clock.wall_millis()
    }
}

impl Instance {
    /// How many store requests of `op` ended with `outcome`.
    pub fn store_requests(&self, op: &str, outcome: &str) -> u64 {
        self.metrics
            .store_requests_total
            .with_label_values(&[op, outcome])
            .get()
    }
}

pub async fn open_account(engine: &Engine, id: &str, balance: i64) {
    let created = engine
        .create_account(new_account(id, balance))
        .await
        .expect("account opens");
    assert!(matches!(created, Created::New(_)), "{id} already existed");
}

/// Opens `a` with 100 and `b` empty: the two accounts most scenarios move units between.
pub async fn open_a_and_b(engine: &Engine) {
    open_account(engine, "a", 100).await;
    open_account(engine, "b", 0).await;
}

/// The balances of `a` and `b`.
pub async fn balances_of_a_and_b(engine: &Engine) -> (i64, i64) {
    (balance(engine, "a").await, balance(engine, "b").await)
}

/// An account id the test knows to be valid.
pub fn account_id(id: &str) -> AccountId {
    AccountId::parse(id.into()).unwrap_or_else(|| panic!("{id:?} is not a valid account id"))
}

/// A transfer id the test knows to be valid.
pub fn transfer_id(id: &str) -> TransferId {
    TransferId::parse(id.into()).unwrap_or_else(|| panic!("{id:?} is not a valid transfer id"))
}

/// A currency code the test knows to be valid.
pub fn currency(code: &str) -> Currency {
    Currency::parse(code.into()).unwrap_or_else(|| panic!("{code:?} is not a currency code"))
}

/// The request to open `id` with `balance`: floor 0, no currency, no labels.
pub fn new_account(id: &str, balance: i64) -> NewAccount {
    NewAccount::new(account_id(id), balance).expect("an opening balance at or above 0")
}

/// The terms of a hold that waits `expires_in` for its capture.
pub fn hold_for(expires_in: Duration) -> Option<Hold> {
    Some(Hold {
        expires_in: Some(expires_in),
    })
}

pub fn transfer(id: &str, from: &str, to: &str, amount: i64) -> NewTransfer {
    let movement = Movement::one_leg(account_id(from), account_id(to), amount)
        .expect("a valid one-leg transfer");
    NewTransfer::new(transfer_id(id), movement)
}

/// A hold of `amount` from `from` to `to` that waits `expires_in` for its capture.
pub fn hold(id: &str, from: &str, to: &str, amount: i64, expires_in: Duration) -> NewTransfer {
    transfer(id, from, to, amount).with_hold(hold_for(expires_in))
}

pub async fn start_transfer(engine: &Arc<Engine>, id: &str, from: &str, to: &str, amount: i64) {
    let created = engine
        .create_transfer(transfer(id, from, to, amount))
        .await
        .expect("transfer accepted");
    assert!(matches!(created, Created::New(_)), "{id} already existed");
}

pub async fn balance(engine: &Engine, id: &str) -> i64 {
    engine
        .get_account(id)
        .await
        .expect("read")
        .expect("account exists")
        .balance
}

pub async fn transfer_doc(engine: &Engine, id: &str) -> TransferDoc {
    engine
        .get_transfer(id)
        .await
        .expect("read")
        .expect("transfer exists")
}

pub async fn state(engine: &Engine, id: &str) -> TransferState {
    transfer_doc(engine, id).await.transaction_state
}

/// Waits (in virtual time, polling) until `check` holds; fails with `what` after `limit`.
pub async fn until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (in virtual time) until transfer `id` is in state `want`; fails after `limit`.
pub async fn until_state(engine: &Engine, id: &str, want: TransferState, limit: Duration) {
    let what = format!("{id} to be {want:?}");
    until(&what, limit, || async { state(engine, id).await == want }).await;
}

/// Waits for a transfer to be terminal without running recovery (its own worker drives it).
pub async fn terminal_without_recovery(engine: &Engine, id: &str) -> TransferState {
    until(
        &format!("{id} to end by its own worker"),
        Duration::from_secs(10),
        || async { state(engine, id).await.is_terminal() },
    )
    .await;
    state(engine, id).await
}

/// Asserts that transfer `id` ends in `want`, driven by its own worker (no recovery runs).
pub async fn assert_ends_by_itself(engine: &Engine, id: &str, want: TransferState) {
    assert_eq!(terminal_without_recovery(engine, id).await, want);
}

/// Runs `recoverer`'s recovery (acting on any expired lease) until the store holds nothing
/// in flight, `recoverer` has no worker left and `busy_elsewhere()` (workers of the other
/// instances) is zero, at most `limit`.
pub async fn recover_until_quiescent(
    world: &World,
    recoverer: &Arc<Engine>,
    busy_elsewhere: impl Fn() -> usize,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    let permits = Arc::new(Semaphore::new(128));
    loop {
        recoverer
            .recovery()
            .recover_once(world.now_millis() + 1, &permits)
            .await
            .expect("recovery sweep");
        let busy = busy_elsewhere() + recoverer.running_tasks();
        // The audit reads every document: only worth it once no worker is running.
        let in_flight = if busy == 0 {
            let report = audit(world.base.as_ref(), i64::MAX).await.expect("audit");
            if report.in_flight == 0 {
                return;
            }
            report.in_flight
        } else {
            0
        };
        assert!(
            Instant::now() < deadline,
            "not quiescent: {busy} workers running, {in_flight} transfers in flight"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes transfer `id` (`amount` from `from` to `to`) straight into `store` as a worker that
/// died a minute before `now` left it: `pending`, its lease (owner `dead`) run out then. What
/// it applied, if anything, the caller writes.
pub async fn plant_abandoned_pending(
    store: &DynStore,
    id: &str,
    (from, to, amount): (&str, &str, i64),
    now: i64,
) {
    let long_ago = format_millis(now - 60_000);
    let doc = serde_json::json!({
        "transaction_id": id, "src_acct": from, "dest_acct": to, "amount": amount,
        "transaction_state": "pending",
        "creation_time": format_millis(now),
        "modification_time": long_ago,
        "lease_owner": "dead", "lease_expires_at": long_ago,
    });
    store
        .create(Index::Transactions, id, doc.into())
        .await
        .unwrap();
}

/// The invariants of `docs/design.md §4`, at a quiescent point.
pub async fn assert_invariants(store: &DynStore) -> AuditReport {
    let report = audit(store.as_ref(), i64::MAX).await.expect("audit");
    assert!(report.is_clean(), "{report}");
    assert!(report.is_quiescent(), "{report}");
    report
}

/// Legs from `(from, to, amount)` triples.
pub fn leg_list(legs: &[(&str, &str, i64)]) -> Vec<Leg> {
    legs.iter()
        .map(|(from, to, amount)| Leg {
            from: (*from).into(),
            to: (*to).into(),
            amount: *amount,
        })
        .collect()
}

/// A multi-leg transaction.
pub fn legs(id: &str, legs: &[(&str, &str, i64)]) -> NewTransfer {
    let movement = Movement::legs(leg_list(legs)).expect("valid legs");
    NewTransfer::new(transfer_id(id), movement)
}
