//! The transfer engine: the protocol of Elastic's post as pure decisions ([`protocol`]), the
//! worker that drives one transfer through it ([`driver`]), the lease that says which worker
//! may act ([`lease`]), the settlement chosen once when the engine is built ([`settlement`]:
//! two-phase, [`two_phase`], or in one store transaction, [`one_transaction`]), account steps
//! merged per account ([`accounts`]), the recovery loop that resumes what a crash left
//! ([`recovery`]), and the operations the HTTP API calls ([`operations`]). The engine is given its clock ([`clock`]) and reads and writes documents
//! only through [`documents`].
//!
//! # Why it is safe (`docs/design.md §9`)
//! - Every write is conditional on the version that was read (`if_seq_no`/`if_primary_term`),
//!   so two workers can never both succeed on the same read.
//! - Only the holder of a transfer's lease writes its accounts. Leases are taken and renewed by
//!   conditional writes on the transfer document, with a fresh owner token per worker.
//! - A holder acts on an account copy only if the copy was observed before its deadline: the
//!   moment it *sent* the write that gave it the lease, plus the lease, minus the skew margin,
//!   on the monotonic clock. Another worker takes over only once `lease_expires_at` plus the
//!   margin has passed on its own clock, and every settle or undo it performs writes the
//!   account, so the stale holder's conditional write then fails, however long it stalled.
//! - Tombstones of settled ids on the account make a late re-read refuse as well: a second
//!   line of defence, bounded by `SETTLED_RETENTION` and `SETTLED_MAX`.
//!
//! # What it assumes
//! Wall clocks of instances sharing a store differ by less than twice the skew margin
//! (`min(LEASE_DURATION / 10, 1 s)` each side), as NTP keeps them, and the monotonic clock
//! counts while the process is suspended. Beyond that, a takeover can start while a stalled
//! holder still believes its lease is live; the tombstones still refuse that holder's late
//! apply unless more than `SETTLED_MAX` other transfers settled on the account meanwhile.
//! The bound of the protection is therefore: any stall, under the clock assumption;
//! otherwise `SETTLED_RETENTION` and the last `SETTLED_MAX` settlements per account.

pub mod accounts;
pub mod admission;
pub mod clock;
pub mod documents;
pub mod driver;
pub mod entries;
pub mod feed;
pub mod history;
pub mod lease;
pub mod model;
pub mod one_transaction;
pub mod operations;
pub mod protocol;
pub mod recovery;
pub mod requests;
pub mod retry;
pub mod settlement;
pub mod statements;
pub mod sweep;
pub mod tombstones;
pub mod two_phase;
pub mod validated;
pub mod view;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::store::DynStore;
use clock::{DynClock, SystemClock};
use documents::Documents;
use lease::{LeaseTimes, Leases};
use protocol::Retention;

/// The engine's timers and bounds.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How long a worker owns a transfer after each write of it.
    pub lease: Duration,
    /// The longest one store request may take; a worker renews its lease rather than start a
    /// step with less than twice this (plus the skew margin) left.
    pub request_timeout: Duration,
    /// Clock skew tolerated between instances: a worker treats its lease as over this much
    /// before it expires.
    pub skew_margin: Duration,
    /// `created`/`pending` transfers older than this roll back with `timed_out` (not holds:
    /// a hold has its own expiry).
    pub transfer_timeout: Duration,
    /// How long a hold waits for its capture unless its request says (`HOLD_TIMEOUT`).
    pub hold_timeout: Duration,
    /// How long and how many settled ids an account remembers.
    pub retention: Retention,
    /// Conditional writes retried on one account step before the worker gives up and leaves
    /// the transfer to recovery.
    pub max_conflicts: u32,
    /// Attempts of one store request that fails with a retryable error.
    pub max_store_attempts: u32,
    pub recovery_interval: Duration,
    pub recovery_stale_after: Duration,
    /// Transfers recovery fetches per page (and accounts the late-apply sweep reads).
    pub recovery_page: usize,
    /// Pages of accounts the late-apply sweep reads per recovery tick; 0 turns it off
    /// (tests of the other defences alone).
    pub sweep_pages_per_tick: usize,
    /// Transfers created here and not yet driven to the end, at most (`MAX_IN_FLIGHT`; see
    /// [`admission`]).
    pub max_in_flight: usize,
    /// How long a create waits in line for room before it is refused (`ADMISSION_WAIT`).
    pub admission_wait: Duration,
    /// Settle a new transfer in one store transaction where the store has them
    /// (`PROTOCOL=auto`, `docs/design.md §3` "In one transaction"); `false`: always by the
    /// two-phase protocol.
    pub one_transaction: bool,
}

/// The clock-skew margin: a quarter of the lease on each side, so instance wall clocks may
/// differ by up to half a lease (15 s with the default 30 s lease). It scales with the lease:
/// a longer lease buys more tolerance. A holder then acts for three quarters of its lease.
pub fn skew_margin(lease: Duration) -> Duration {
    lease / 4
}

impl EngineConfig {
    /// Timers scaled to `lease` (request timeout and skew margin a quarter), recovery
    /// every 50 ms acting on any transfer whose lease ran out, tombstones kept for an hour:
    /// what engine-level tests start from.
    pub fn with_lease(lease: Duration) -> Self {
        Self {
            lease,
            request_timeout: lease / 4,
            skew_margin: skew_margin(lease),
            transfer_timeout: Duration::from_secs(3600),
            hold_timeout: Duration::from_secs(24 * 3600),
            retention: Retention {
                millis: 3_600_000,
                max_entries: 1000,
            },
            max_conflicts: 200,
            max_store_attempts: 6,
            recovery_interval: Duration::from_millis(50),
            recovery_stale_after: Duration::ZERO,
            recovery_page: 100,
            sweep_pages_per_tick: 10,
            max_in_flight: admission::DEFAULT_MAX_IN_FLIGHT,
            admission_wait: admission::DEFAULT_ADMISSION_WAIT,
            one_transaction: true,
        }
    }
}

/// Exports the series labelled by transfer state at 0 from the start (every transition the
/// state machine allows, every terminal state, every in-flight state recovery may find), so
/// `rate()`/`increase()` see their first event and alerts on them have data.
fn export_state_series(metrics: &Metrics) {
    for from in model::TransferState::ALL {
        for to in model::TransferState::ALL
            .into_iter()
            .filter(|to| from.can_move_to(*to))
        {
            (metrics.transfer_state_transitions_total)
                .with_label_values(&[from.as_str(), to.as_str()]);
            if to.is_terminal() {
                metrics
                    .transfers_completed_total
                    .with_label_values(&[to.as_str()]);
            }
        }
    }
    for state in model::TransferState::IN_FLIGHT {
        metrics
            .transfers_recovered_total
            .with_label_values(&[state.as_str()]);
    }
}

/// The span of a transfer settled inside the request that creates it (one transaction, the
/// default protocol): for its log lines, a child of the request's span, whose `trace_id` and
/// `span_id` they carry with tracing on (`crate::telemetry`). Never exported
/// ([`crate::trace_context::IN_REQUEST`]): the request's span already names the transfer
/// (`transfer.id`), and the store's transaction is its child.
pub(crate) fn transfer_span_in_request(transfer: &model::TransferDoc) -> tracing::Span {
    tracing::info_span!(
        target: crate::trace_context::IN_REQUEST,
        "transfer",
        transfer_id = %transfer.transaction_id.as_str(),
        recovered = tracing::field::Empty,
    )
}

/// The span every line about one transfer's progress is logged in, when a worker or recovery
/// drives it.
pub(crate) fn transfer_span(transfer: &model::TransferDoc) -> tracing::Span {
    let transfer_id = transfer.transaction_id.as_str();
    if !crate::trace_context::is_on() {
        return tracing::info_span!(
            "transfer",
            transfer_id = %transfer_id,
            recovered = tracing::field::Empty,
        );
    }
    // Traced: a child of the request that created the transfer (its recorded `traceparent`),
    // whichever process or restart runs it, so the transfer's whole life is one trace. Not a
    // child of the current span in `tracing`'s own tree (`parent: None`): a worker outlives
    // the request that spawned it, and a request's span must end with its answer.
    let span = tracing::info_span!(
        parent: None,
        "transfer",
        transfer_id = %transfer_id,
        recovered = tracing::field::Empty,
        otel.name = %format_args!("transfer {}", transfer.transaction_state),
        transfer.id = %transfer_id,
    );
    crate::trace_context::continue_from(&span, transfer.traceparent.as_deref());
    span
}

/// The span of one protocol step of the current transfer (`docs/operations.md`, "Tracing"):
/// `step` (`create`, `apply`, `settle`, `undo`, or the state a write moves to) on `account`
/// when it is an account's. A disabled span outside a trace.
pub(crate) fn step_span(step: &str, account: Option<&str>) -> tracing::Span {
    if !crate::trace_context::in_trace() {
        return tracing::Span::none();
    }
    let account = account.unwrap_or("");
    tracing::debug_span!(
        target: crate::trace_context::TARGET,
        "step",
        otel.name = %format_args!("{step} {account}").to_string().trim_end(),
        otel.status_code = tracing::field::Empty,
        step,
        account,
        state = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// What the engine's services (the worker, recovery) share: handles to the same documents,
/// leases, account steps, settings, clock, metrics, shutdown and task tracker.
#[derive(Clone)]
pub(crate) struct Shared {
    docs: Documents,
    leases: Arc<Leases>,
    accounts: Arc<accounts::AccountSteps>,
    config: EngineConfig,
    clock: DynClock,
    metrics: Arc<Metrics>,
    /// Cancelled when the engine shuts down: workers stop at their next step boundary, the
    /// recovery loop at its next sweep.
    shutdown: CancellationToken,
    /// Every spawned worker and loop, so shutdown can wait for them.
    tasks: TaskTracker,
}

/// The service's transfers: the API's operations (`operations.rs`), recovery and the sweep,
/// over the services it builds once and owns: the worker ([`driver::Worker`]) and the change
/// feed ([`feed::Feed`]). Built once per process (tests build one per simulated instance).
pub struct Engine {
    store: DynStore,
    docs: Documents,
    leases: Arc<Leases>,
    config: EngineConfig,
    clock: DynClock,
    /// Stops drivers between steps, and the recovery loop.
    shutdown: CancellationToken,
    /// Every spawned worker and loop, so shutdown can wait for them.
    tasks: TaskTracker,
    /// Drives transfers through the protocol.
    worker: Arc<driver::Worker>,
    /// Resumes what a crash left, and gives late applies back.
    recovery: Arc<recovery::Recovery>,
    /// The change feed, which also announces this process's terminal writes (the webhooks'
    /// fast path).
    feed: Arc<feed::Feed>,
    /// Account steps, merged per account.
    accounts: Arc<accounts::AccountSteps>,
    /// The bound on transfers created here and still in flight.
    admission: Arc<admission::Admission>,
}

impl Engine {
    /// An engine on the host's clocks.
    pub fn new(store: DynStore, config: EngineConfig, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::with_clock(store, config, metrics, Arc::new(SystemClock))
    }

    /// An engine on a given clock (tests: a [`clock::TestClock`] on paused time).
    pub fn with_clock(
        store: DynStore,
        config: EngineConfig,
        metrics: Arc<Metrics>,
        clock: DynClock,
    ) -> Arc<Self> {
        export_state_series(&metrics);
        let docs = Documents::new(store.clone());
        let leases = Arc::new(Leases::new(
            LeaseTimes {
                duration: config.lease,
                skew_margin: config.skew_margin,
                request_timeout: config.request_timeout,
                attempts: config.max_store_attempts,
            },
            clock.clone(),
            docs.clone(),
            metrics.clone(),
        ));
        let tasks = TaskTracker::new();
        let accounts = accounts::AccountSteps::new(
            docs.clone(),
            clock.clone(),
            config.retention,
            (config.max_conflicts, config.max_store_attempts),
            config.one_transaction,
            tasks.clone(),
        );
        let admission = admission::Admission::new(
            config.max_in_flight,
            config.admission_wait,
            (
                metrics.transfers_admitted_in_flight.clone(),
                metrics.transfers_waiting_admission.clone(),
            ),
        );
        let shutdown = CancellationToken::new();
        let feed = Arc::new(feed::Feed::new(feed::FeedParts {
            store: store.clone(),
            docs: docs.clone(),
            clock: clock.clone(),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
            instance: leases.instance().to_owned(),
            request_timeout: config.request_timeout,
            skew_margin: config.skew_margin,
        }));
        let shared = Shared {
            docs: docs.clone(),
            leases: leases.clone(),
            accounts: accounts.clone(),
            config: config.clone(),
            clock: clock.clone(),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
        };
        let worker = Arc::new(driver::Worker {
            settlement: settlement::chosen(&config, &docs),
            shared: shared.clone(),
            terminal_events: watch::channel(0).0,
            feed: feed.clone(),
        });
        let recovery = Arc::new(recovery::Recovery {
            shared,
            store: store.clone(),
            worker: worker.clone(),
        });
        Arc::new(Self {
            store,
            docs,
            leases,
            accounts,
            config,
            clock,
            shutdown,
            tasks,
            worker,
            recovery,
            feed,
            admission,
        })
    }

    /// Whether transfers are settled in one store transaction (the embedded store unless
    /// `PROTOCOL=two-phase`), rather than by the two-phase protocol.
    pub fn uses_transactions(&self) -> bool {
        self.worker.settlement.in_one_transaction()
    }

    /// Recovery and the sweep (the loop is started by the app; tests run single sweeps).
    pub fn recovery(&self) -> &Arc<recovery::Recovery> {
        &self.recovery
    }

    /// The change feed (`GET /events`, the webhooks).
    pub fn feed(&self) -> &Arc<feed::Feed> {
        &self.feed
    }

    /// This process's name in lease owners and in `settled_by` (`super::lease`).
    pub fn instance(&self) -> &str {
        self.leases.instance()
    }

    /// The store, for what the engine does not cover (readiness, refreshes in tests).
    pub fn store(&self) -> &DynStore {
        &self.store
    }

    pub fn clock(&self) -> &DynClock {
        &self.clock
    }

    /// Asks every driver to stop at its next step boundary (releasing its lease) and the
    /// recovery loop to end.
    pub fn shut_down(&self) {
        self.shutdown.cancel();
    }

    /// The token [`Engine::shut_down`] cancels, for the HTTP server to stop with.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Waits until every worker, account flusher and the recovery loop have stopped, at most
    /// `limit`.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }

    /// Drivers, account flushers and loops running in this engine.
    pub fn running_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Forgets every remembered account copy (tests: as a restarted process would).
    pub fn forget_account_copies(&self) {
        self.accounts.forget();
    }
}
