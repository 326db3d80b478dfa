//! The fault suites' cases (`tests/engine/faults.rs`, `tests/engine/legs.rs`): one step
//! boundary ([`StepWrite`]) under one fault of [`STEP_FAULTS`], on accounts of its own
//! (`<case>-<account>`), driven by an instance A whose store injects that fault once; an
//! instance B (the recoverer) then takes over what A left.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use transfer_service::transfer::model::TransferDoc;
use transfer_service::transfer::operations::ServiceError;
use transfer_service::transfer::requests::NewTransfer;
use transfer_service::transfer::{Engine, EngineConfig};

use super::engine::{recover_until_quiescent, World};
use super::faulty::{Fault, FaultyStore, StepWrite, STEP_FAULTS};

/// How long instance A may take over a create before the test moves on (its answer lost,
/// the transfer left to recovery).
const CREATE_LIMIT: Duration = Duration::from_secs(10);

/// How long a capture may take, through A and then through the recoverer.
pub const CAPTURE_LIMIT: Duration = Duration::from_secs(15);

/// The lease of every instance in the fault suites (the stall of [`STEP_FAULTS`] outlasts it).
pub const LEASE: Duration = Duration::from_secs(1);

/// The fault suites' engine settings: a one-second [`LEASE`], three store attempts per step,
/// recovery pages of 200.
pub fn step_fault_config() -> EngineConfig {
    EngineConfig {
        max_store_attempts: 3,
        recovery_page: 200,
        ..EngineConfig::with_lease(LEASE)
    }
}

/// One step boundary under one fault: its accounts, and instance A whose store injects it.
pub struct StepCase<P> {
    /// The prefix of its accounts and transfer (`<name>-t`).
    pub name: String,
    pub step: &'static str,
    pub fault: &'static str,
    /// Which way the transfer must end (each suite has its own paths).
    pub path: P,
    pub worker: Arc<Engine>,
    pub faulty: Arc<FaultyStore>,
}

/// Every step of `steps` (`(name, path, write)`) under every fault of [`STEP_FAULTS`], with
/// their indices (which seed each case's store).
pub fn every_step_under_every_fault<P: Copy>(
    steps: &'static [(&'static str, P, StepWrite)],
) -> impl Iterator<
    Item = (
        usize,
        usize,
        (&'static str, P, StepWrite),
        (&'static str, Fault),
    ),
> {
    steps.iter().enumerate().flat_map(|(s, step)| {
        STEP_FAULTS
            .iter()
            .enumerate()
            .map(move |(f, fault)| (s, f, *step, *fault))
    })
}

impl<P> StepCase<P> {
    /// Case `name`'s instance A, on a store of `w` (its jitter seeded with `seed`) that
    /// injects `fault` once at `write` (forwarding transactions only where the step is the
    /// one transaction).
    pub fn new(
        w: &World,
        config: EngineConfig,
        name: String,
        seed: u64,
        (step, path, write): (&'static str, P, StepWrite),
        (fault_name, fault): (&'static str, Fault),
    ) -> Self {
        let faulty = FaultyStore::new(w.base.clone(), seed, Duration::ZERO);
        if matches!(write, StepWrite::Transaction) {
            faulty.forward_transactions();
        }
        faulty.inject(write.matcher(&name), fault, 1);
        let worker = w.instance(faulty.clone(), config).engine;
        StepCase {
            name,
            step,
            fault: fault_name,
            path,
            worker,
            faulty,
        }
    }

    /// The id of this case's account `account`, or of its transfer (`"t"`).
    pub fn id(&self, what: &str) -> String {
        format!("{}-{what}", self.name)
    }

    /// The fault fired, exactly once.
    pub fn assert_fault_fired(&self) {
        let fired = self.faulty.fired.load(Ordering::SeqCst);
        assert_eq!(
            fired, 1,
            "{} / {}: the fault did not fire",
            self.step, self.fault
        );
    }

    /// This case's transfer as the recoverer reads it (`None`: its create never reached the
    /// store).
    pub async fn transfer(&self, recoverer: &Engine) -> Option<TransferDoc> {
        recoverer.get_transfer(&self.id("t")).await.unwrap()
    }
}

/// `worker` creates `new`, its answer given up after [`CREATE_LIMIT`]: a create that
/// fails is answered 503 and leaves nothing, or (applied, then failed or crashed) leaves a
/// transfer recovery must finish.
pub async fn try_create(worker: Arc<Engine>, new: NewTransfer) {
    let _ = tokio::time::timeout(CREATE_LIMIT, worker.create_transfer(new)).await;
}

/// Each case's instance A creates its transfer (`new(case)`), all at once.
pub async fn create_every_transfer<P>(
    cases: &[StepCase<P>],
    new: impl Fn(&StepCase<P>) -> NewTransfer,
) {
    let creates: Vec<_> = cases
        .iter()
        .map(|case| tokio::spawn(try_create(case.worker.clone(), new(case))))
        .collect();
    for create in creates {
        create.await.unwrap();
    }
}

/// Captures hold `id` (`amount`, or whole) through `worker`, else (its answer lost) again
/// through `recoverer`: an identical capture is a replay. The recoverer must answer; a
/// `NotFound` is a create that never reached the store (each suite checks it at the end).
pub async fn capture_through_a_else_recoverer(
    worker: Arc<Engine>,
    recoverer: Arc<Engine>,
    id: String,
    amount: Option<i64>,
) {
    let by_a = tokio::time::timeout(CAPTURE_LIMIT, worker.capture_transfer(&id, amount)).await;
    if let Ok(Ok(_)) = by_a {
        return;
    }
    let by_b = tokio::time::timeout(CAPTURE_LIMIT, recoverer.capture_transfer(&id, amount));
    let by_b = by_b.await.expect("the recoverer answers");
    assert!(
        matches!(by_b, Ok(_) | Err(ServiceError::NotFound)),
        "{id}: capture through the recoverer: {by_b:?}"
    );
}

/// Runs the recoverer until nothing is in flight and no case's instance A is still working
/// (at most a minute). Workers whose store crashed never answer again: they are dead
/// processes, not busy ones.
pub async fn recover_every_case<P>(w: &World, recoverer: &Arc<Engine>, cases: &[StepCase<P>]) {
    let live_workers = || {
        cases
            .iter()
            .filter(|c| !c.faulty.is_dead() && c.worker.running_tasks() > 0)
            .count()
    };
    recover_until_quiescent(w, recoverer, live_workers, Duration::from_secs(60)).await;
}
