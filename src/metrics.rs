//! Prometheus metrics (docs/design.md §8). Names and labels are part of the contract. Every series
//! is updated where the event happens; a scrape only encodes, it never scans the store.
//! Labels have bounded cardinality: states, outcomes, store ops, route templates.

use std::sync::Arc;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every series the service exports, in its own registry (tests run several apps at once).
pub struct Metrics {
    registry: Registry,
    pub transfers_created_total: IntCounter,
    /// `outcome` = `finished` | `rolled-back`.
    pub transfers_completed_total: IntCounterVec,
    /// `from`, `to` = transfer states.
    pub transfer_state_transitions_total: IntCounterVec,
    /// `outcome` = `captured` | `expired` | `cancelled`: holds this process settled so.
    pub holds_completed_total: IntCounterVec,
    /// Transfers this process is driving right now.
    pub transfers_in_flight: IntGauge,
    /// Transfers created here and not yet driven to the end: the count `MAX_IN_FLIGHT`
    /// bounds (admission control).
    pub transfers_admitted_in_flight: IntGauge,
    pub transfers_waiting_admission: IntGauge,
    /// Transfer writes written again with a fresh `modification_time` because their answer
    /// came late (the change feed's second line, `docs/design.md §11`).
    pub transfers_restamped_total: IntCounter,
    /// Events `GET /events` served (repeats included: the feed is at-least-once).
    pub events_served_total: IntCounter,
    /// From `creation_time` to the terminal write.
    pub transfer_duration_seconds: Histogram,
    pub recovery_runs_total: IntCounter,
    /// `state` = the state recovery found the transfer in.
    pub transfers_recovered_total: IntCounterVec,
    /// `op` = get | create | replace | find_stale | list | account_entries | scan | ready |
    /// refresh | vouch (a `_bulk` counts once per item, as `create` or `replace`); `outcome` =
    /// ok | conflict | exists | not_found | unavailable | error | denied (the store refused the
    /// credentials: 401/403).
    pub store_requests_total: IntCounterVec,
    pub store_request_duration_seconds: HistogramVec,
    /// Bytes of document sources sent in writes (`index` = accounts | transactions |
    /// webhooks, `op` = create | replace; each `_bulk` item once, whatever its outcome):
    /// what the engine parses, indexes, logs and replicates for them. Writes inside a store
    /// transaction (the embedded store) are not counted.
    pub store_bytes_sent_total: IntCounterVec,
    /// Transfers flagged for a person (contradicting documents), as of the last complete
    /// recovery sweep (which sees a flagged transfer once it is `RECOVERY_STALE_AFTER` old).
    pub transfers_needing_attention: IntGauge,
    /// Steps of this host's wall clock (each one fences the leases this instance holds).
    pub clock_jumps_total: IntCounter,
    /// Account entries of terminal transfers (late applies) found and undone by the sweep.
    pub late_applies_compensated_total: IntCounter,
    /// `route` is the matched template (`/transfers/{id}`), never the raw path; `client` is
    /// the name of the API key that authenticated the request (names come from
    /// `API_KEYS_FILE`), `anonymous` when none was needed, `unauthenticated` for a 401.
    pub http_requests_total: IntCounterVec,
    pub http_request_duration_seconds: HistogramVec,
    /// Create requests answered 503 by admission control, having created nothing; `route`
    /// = `/transfers` | `/transfers/batch`.
    pub requests_shed_total: IntCounterVec,
    /// Keys in force from `API_KEYS_FILE` (0 when it is unset or empty).
    pub api_keys_loaded: IntGauge,
    /// Reloads of `API_KEYS_FILE` (SIGHUP or a change), by `outcome` = `ok` | `error` (the
    /// file could not be read or parsed; the keys in force stayed).
    pub api_keys_reloads_total: IntCounterVec,
    /// Webhook delivery attempts by `outcome` = `delivered` | `failed` (will be retried) |
    /// `given_up` (the last attempt of an event older than `WEBHOOK_RETRY_PERIOD`).
    pub webhook_deliveries_total: IntCounterVec,
    /// From an event's `at` to its delivery.
    pub webhook_delivery_lag_seconds: HistogramVec,
    /// Age of the oldest event this instance holds and has not delivered, per `receiver` (the
    /// URL without user info or query); 0 when it holds none or does not deliver.
    pub webhook_oldest_undelivered_seconds: IntGaugeVec,
    /// 1 while this instance holds the delivery lease of `receiver`.
    pub webhook_lease_held: IntGaugeVec,
    /// 1, labelled by the search engine behind the store and its version
    /// (`engine` = `elasticsearch` | `opensearch`), once the engine has answered; absent on
    /// the embedded store.
    pub store_info: IntGaugeVec,
}

/// The `outcome`s of `webhook_deliveries_total`.
pub const WEBHOOK_OUTCOMES: [&str; 3] = ["delivered", "failed", "given_up"];

/// The `outcome`s of `holds_completed_total`.
pub const HOLD_OUTCOMES: [&str; 3] = ["captured", "expired", "cancelled"];

/// The routes admission control may shed (`requests_shed_total{route}`).
pub const SHED_ROUTES: [&str; 2] = ["/transfers", "/transfers/batch"];

/// Latency buckets (seconds). Denser from 50 ms to 1 s, where a loaded instance's requests
/// and transfers land and where the overload target (accepted creates within 250 ms) lies:
/// a quantile is interpolated within its bucket, so wide buckets there would blur it.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 10.0,
];
const WEBHOOK_LAG_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0,
    86400.0,
];
const TRANSFER_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

/// Registers a collector; its definition must be valid and its name unique in the registry.
fn register<C: Collector + Clone + 'static>(
    registry: &Registry,
    collector: prometheus::Result<C>,
) -> C {
    let collector = collector.expect("valid metric");
    registry
        .register(Box::new(collector.clone()))
        .expect("unique");
    collector
}

/// What became of the spans this process finished (`docs/operations.md`, "Tracing"). One
/// exporter serves the whole process, so these are process-wide, and every [`Metrics`]
/// registry exports them.
#[derive(Clone)]
pub struct TraceSpanCounters {
    /// Spans handed to the collector (accepted by it).
    pub exported: IntCounter,
    /// Spans let go instead of slowing a transfer: by `reason`, `queue_full` (the bounded
    /// queue to the exporter was full) or `export_failed` (the collector refused them, did not
    /// answer in time or could not be reached).
    pub dropped: IntCounterVec,
}

/// Why a span is let go ([`TraceSpanCounters::dropped`]).
pub const SPAN_DROP_REASONS: [&str; 2] = ["queue_full", "export_failed"];

/// The process's [`TraceSpanCounters`].
pub fn trace_spans() -> &'static TraceSpanCounters {
    static COUNTERS: std::sync::OnceLock<TraceSpanCounters> = std::sync::OnceLock::new();
    COUNTERS.get_or_init(|| {
        let counters = TraceSpanCounters {
            exported: IntCounter::new(
                "trace_spans_exported_total",
                "Spans this process exported to the OpenTelemetry collector",
            )
            .expect("valid metric"),
            dropped: IntCounterVec::new(
                Opts::new(
                    "trace_spans_dropped_total",
                    "Spans this process dropped rather than slow a transfer, by reason",
                ),
                &["reason"],
            )
            .expect("valid metric"),
        };
        for reason in SPAN_DROP_REASONS {
            counters.dropped.with_label_values(&[reason]);
        }
        counters
    })
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let registry = Registry::new();
        let spans = trace_spans();
        register(&registry, Ok(spans.exported.clone()));
        register(&registry, Ok(spans.dropped.clone()));
        let counter = |name: &str, help: &str| register(&registry, IntCounter::new(name, help));
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            register(&registry, IntCounterVec::new(Opts::new(name, help), labels))
        };
        let gauge = |name: &str, help: &str| register(&registry, IntGauge::new(name, help));
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            register(&registry, IntGaugeVec::new(Opts::new(name, help), labels))
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
            register(&registry, Histogram::with_opts(opts))
        };
        let histogram_vec = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
            register(&registry, HistogramVec::new(opts, labels))
        };
        let metrics = Self {
            transfers_created_total: counter(
                "transfers_created_total",
                "Transfers accepted with 201",
            ),
            transfers_completed_total: counter_vec(
                "transfers_completed_total",
                "Transfers that reached a terminal state, by outcome",
                &["outcome"],
            ),
            holds_completed_total: counter_vec(
                "holds_completed_total",
                "Holds captured (committed), expired or cancelled (rolling back), by outcome",
                &["outcome"],
            ),
            transfer_state_transitions_total: counter_vec(
                "transfer_state_transitions_total",
                "State writes of transfers, by from and to state",
                &["from", "to"],
            ),
            transfers_in_flight: gauge(
                "transfers_in_flight",
                "Transfers this process is driving now",
            ),
            transfers_admitted_in_flight: gauge(
                "transfers_admitted_in_flight",
                "Transfers created here and not yet driven to the end (bounded by MAX_IN_FLIGHT)",
            ),
            transfers_waiting_admission: gauge(
                "transfers_waiting_admission",
                "Transfers of creates waiting in line for room under MAX_IN_FLIGHT (at most ADMISSION_WAIT each)",
            ),
            transfers_restamped_total: counter(
                "transfers_restamped_total",
                "Transfer writes written again with a fresh stamp because their answer came late",
            ),
            events_served_total: counter(
                "events_served_total",
                "Events served by GET /events, repeats included",
            ),
            transfer_duration_seconds: histogram(
                "transfer_duration_seconds",
                "Time from a transfer's creation to its terminal state",
                TRANSFER_BUCKETS,
            ),
            recovery_runs_total: counter("recovery_runs_total", "Recovery sweeps run"),
            transfers_recovered_total: counter_vec(
                "transfers_recovered_total",
                "Stale transfers recovery took over, by the state it found them in",
                &["state"],
            ),
            store_requests_total: counter_vec(
                "store_requests_total",
                "Store requests, by operation and outcome",
                &["op", "outcome"],
            ),
            store_request_duration_seconds: histogram_vec(
                "store_request_duration_seconds",
                "Store request latency, by operation",
                &["op"],
                LATENCY_BUCKETS,
            ),
            store_bytes_sent_total: counter_vec(
                "store_bytes_sent_total",
                "Bytes of document sources sent to the store in writes, by index and operation",
                &["index", "op"],
            ),
            transfers_needing_attention: gauge(
                "transfers_needing_attention",
                "Transfers whose documents contradict each other, left for a person",
            ),
            clock_jumps_total: counter(
                "clock_jumps_total",
                "Steps of the wall clock detected; each fences this instance's leases",
            ),
            late_applies_compensated_total: counter(
                "late_applies_compensated_total",
                "Pending entries of terminal transfers (late applies) undone by the sweep",
            ),
            http_requests_total: counter_vec(
                "http_requests_total",
                "HTTP requests, by method, route template, status and client (API key name)",
                &["method", "route", "status", "client"],
            ),
            http_request_duration_seconds: histogram_vec(
                "http_request_duration_seconds",
                "HTTP request latency, by method, route template and status",
                &["method", "route", "status"],
                LATENCY_BUCKETS,
            ),
            requests_shed_total: counter_vec(
                "requests_shed_total",
                "Create requests refused with 503 by admission control, by route template",
                &["route"],
            ),
            api_keys_loaded: gauge("api_keys_loaded", "API keys in force from API_KEYS_FILE"),
            api_keys_reloads_total: counter_vec(
                "api_keys_reloads_total",
                "Reloads of API_KEYS_FILE, by outcome (error: the keys in force stayed)",
                &["outcome"],
            ),
            webhook_deliveries_total: counter_vec(
                "webhook_deliveries_total",
                "Webhook delivery attempts, by outcome (delivered, failed and retried, given up)",
                &["outcome"],
            ),
            webhook_delivery_lag_seconds: histogram_vec(
                "webhook_delivery_lag_seconds",
                "Time from an event to its webhook delivery, by path (fast: queued by the instance that wrote it; feed: read from the change feed)",
                &["path"],
                WEBHOOK_LAG_BUCKETS,
            ),
            webhook_oldest_undelivered_seconds: gauge_vec(
                "webhook_oldest_undelivered_seconds",
                "Age of the oldest event held and not yet delivered, per webhook receiver",
                &["receiver"],
            ),
            webhook_lease_held: gauge_vec(
                "webhook_lease_held",
                "1 while this instance holds the delivery lease of the webhook receiver",
                &["receiver"],
            ),
            store_info: gauge_vec(
                "store_info",
                "1, by the search engine behind the store and its version",
                &["engine", "version"],
            ),
            registry,
        };
        metrics.initialize_known_series();
        Arc::new(metrics)
    }

    /// Exports the series of every outcome at 0 from the start, so `rate()`/`increase()` see
    /// their first event and alerts on them have data. (Those labelled by transfer state,
    /// the engine's own: [`crate::transfer::Engine::new`].)
    fn initialize_known_series(&self) {
        for outcome in HOLD_OUTCOMES {
            self.holds_completed_total.with_label_values(&[outcome]);
        }
        for route in SHED_ROUTES {
            self.requests_shed_total.with_label_values(&[route]);
        }
        for outcome in ["ok", "error"] {
            self.api_keys_reloads_total.with_label_values(&[outcome]);
        }
        for outcome in WEBHOOK_OUTCOMES {
            self.webhook_deliveries_total.with_label_values(&[outcome]);
        }
    }

    /// The Prometheus text exposition of every series.
    pub fn encode(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = encoder.encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }

    pub fn store_request(&self, op: &str, outcome: &str, elapsed: Duration) {
        self.store_requests_total
            .with_label_values(&[op, outcome])
            .inc();
        self.store_request_duration_seconds
            .with_label_values(&[op])
            .observe(elapsed.as_secs_f64());
    }
}
