//! The benchmark's report: what one run measured, as an aligned table or `--json`.

use super::*;

/// Everything one run measured; the table and `--json` print this.
#[derive(Serialize)]
pub struct Report {
    store: String,
    accounts: u32,
    clients: usize,
    /// Whether `clients` are `--connections` (the overload scenario).
    overload: bool,
    /// The requests a second the clients were paced at (`--rate`); `None`: as fast as answered.
    paced_rate: Option<u32>,
    batch: Option<u32>,
    posting_s: f64,
    /// `ELASTICSEARCH_SHARDS` given to the service (`--shards`).
    shards: Option<u32>,
    /// The primary shards the engine reports for the data indices, by index.
    index_shards: Vec<(String, Option<usize>)>,
    /// es-emulator's capacity model: what one shard operation costs (`--shard-op-cost`).
    shard_op_cost_us: Option<f64>,
    /// In the capacity model, how busy the data indices' shards were on average: operations
    /// served × cost, over the transfer phase's wall time × their shards.
    pub shard_busy: Option<f64>,
    /// The emulator's requests in flight on average over the transfer phase.
    pub engine_requests_in_flight: Option<f64>,
    /// Transfers that reached a terminal state, over posting plus draining time.
    pub transfers_per_s: f64,
    finished: f64,
    rolled_back: f64,
    /// Transfers the service accepted per second of posting.
    accepted_transfers_per_s: f64,
    accepted_posts_per_s: f64,
    shed_per_s: f64,
    /// Share of the 503s that carried `Retry-After` (absent when there were none).
    shed_with_retry_after: Option<f64>,
    /// Whether the clients waited as each 503's `Retry-After` asked.
    clients_honour_retry_after: bool,
    shed_items: u64,
    pub failed: u64,
    first_failure: Option<String>,
    pub post_latency_ms: Percentiles,
    /// The same POSTs as the service timed them (`http_request_duration_seconds` of the
    /// accepted status, over the process's life): from the request's arrival at the router to
    /// its response, without the time in the sockets and the clients.
    service_post_latency_ms: Percentiles,
    /// The service's `transfer_duration_seconds` over the process's life, interpolated.
    created_to_terminal_ms: Percentiles,
    /// From the end of posting until every accepted transfer was terminal.
    drain_s: f64,
    pub service_cpu_us_per_transfer: Option<f64>,
    /// This process's CPU a transfer: the clients, and with --emulator the emulator.
    pub bench_cpu_us_per_transfer: Option<f64>,
    /// The whole machine's busy cores over the transfer phase (every process's CPU over its
    /// wall time): with the service's and this process's, what else was running.
    pub machine_cores: Option<f64>,
    /// The real cluster's CPU a transfer (`--elasticsearch`; it shares the machine's cores).
    elasticsearch_cpu_us_per_transfer: Option<f64>,
    /// Documents the real cluster indexed a transfer (`_stats/indexing`, primaries).
    engine_writes_per_transfer: Option<f64>,
    /// Shard refreshes a transfer (`_stats/refresh`, every copy, periodic ones included).
    engine_refreshes_per_transfer: Option<f64>,
    /// Bytes of document sources the service sent a transfer (`store_bytes_sent_total`).
    source_bytes_sent_per_transfer: Option<f64>,
    /// The account documents' `_source` at the end (`--elasticsearch`).
    account_documents: Option<crate::DocumentSizes>,
    healthz_per_s: f64,
    ratio_to_healthz: f64,
    store_requests_per_transfer: Option<f64>,
    conflicts_per_transfer: Option<f64>,
    pub es_http_requests_per_transfer: Option<f64>,
    /// The same by kind of request (`bulk`, `get`, `search`, ...), the kinds received only.
    es_http_requests_by_kind: Option<BTreeMap<String, f64>>,
    peak_rss_mib: Option<f64>,
    /// With `--preload`: what the store held before the run.
    preloaded: Option<crate::preload::Preloaded>,
    /// The embedded store's files once the service stopped, a transfer they hold (the
    /// preloaded and this run's terminal ones).
    store_bytes_per_transfer: Option<f64>,
    /// With `--follow-events`: what the feed consumer saw.
    events: Option<EventsFollowed>,
    /// With `--webhook`: what the receiver got.
    webhooks: Option<WebhooksReceived>,
}

/// The `--webhook` receiver's figures.
#[derive(Serialize)]
struct WebhooksReceived {
    /// Distinct events delivered per terminal transfer (1 with the default `WEBHOOK_EVENTS`).
    per_transfer: f64,
    deliveries_per_event: f64,
    /// From an event's `at` to its first delivery.
    lag_ms: Percentiles,
}

/// The `--follow-events` consumer's figures.
#[derive(Serialize)]
struct EventsFollowed {
    /// Distinct events per terminal transfer (4 for a plain transfer).
    per_transfer: f64,
    /// Deliveries per distinct event (at-least-once: above 1 when a consumer keeps up and
    /// sees a transfer again after each of its writes).
    deliveries_per_event: f64,
    /// From a terminal event's `at` to its first receipt by the consumer.
    terminal_lag_ms: Percentiles,
}

#[derive(Serialize)]
pub struct Percentiles {
    pub p50: Option<f64>,
    p90: Option<f64>,
    p99: Option<f64>,
    max: Option<f64>,
}

impl Percentiles {
    fn of_client_latency(histogram: &Histogram<u64>) -> Percentiles {
        let ms = |us: u64| (!histogram.is_empty()).then(|| us as f64 / 1000.0);
        Percentiles {
            p50: ms(histogram.value_at_quantile(0.5)),
            p90: ms(histogram.value_at_quantile(0.9)),
            p99: ms(histogram.value_at_quantile(0.99)),
            max: ms(histogram.max()),
        }
    }

    fn of_service_histogram(
        scrape: &Scrape,
        name: &str,
        keep: impl Fn(&Labels) -> bool,
    ) -> Percentiles {
        let ms = |q| {
            scrape
                .histogram_quantile(name, &keep, q)
                .map(|s| s * 1000.0)
        };
        Percentiles {
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            max: None,
        }
    }
}

impl std::fmt::Display for Percentiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        write!(
            f,
            "p50 {}  p90 {}  p99 {}  max {}",
            show(self.p50),
            show(self.p90),
            show(self.p99),
            show(self.max)
        )
    }
}

/// A table row: label and value.
type Row = (&'static str, String);

/// `v` with `digits` decimals, or `-` when absent.
fn shown(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

impl Report {
    pub fn print_table(&self) {
        let rows = [self.setup_rows(), self.load_rows(), self.cost_rows()].concat();
        let width = rows.iter().map(|(k, _)| k.chars().count()).max();
        let width = width.unwrap_or(0);
        for (label, value) in rows {
            println!("{label:<width$}  {value}");
        }
    }

    fn setup_rows(&self) -> Vec<Row> {
        let shape = format!("{} / {}", self.accounts, self.clients);
        let batch = self.batch.unwrap_or(1).to_string();
        vec![
            ("store", self.store.clone()),
            ("shards (ELASTICSEARCH_SHARDS)", self.shards_shown()),
            ("shard op cost (µs)", shown(self.shard_op_cost_us, 0)),
            (
                "shards busy / engine requests in flight",
                format!(
                    "{} / {}",
                    shown(self.shard_busy.map(|b| b * 100.0), 0) + " %",
                    shown(self.engine_requests_in_flight, 2)
                ),
            ),
            (self.clients_label(), shape),
            (
                "requests paced at (/s)",
                self.paced_rate
                    .map_or("- (as answered)".into(), |r| r.to_string()),
            ),
            ("transfers per POST", batch),
            ("posting (s)", format!("{:.1}", self.posting_s)),
        ]
    }

    /// `accounts 4, transactions 4 (4)`: the engine's counts, then what the service was told.
    fn shards_shown(&self) -> String {
        let told = self.shards.map_or("-".into(), |n| n.to_string());
        if self.index_shards.is_empty() {
            return told;
        }
        let counted: Vec<String> = (self.index_shards.iter())
            .map(|(index, n)| format!("{index} {}", n.map_or("?".into(), |n| n.to_string())))
            .collect();
        format!("{} ({told})", counted.join(", "))
    }

    /// The primaries the engine reports for the data indices, if it reported them all.
    pub fn index_shard_counts(&self) -> Option<Vec<usize>> {
        self.index_shards.iter().map(|(_, n)| *n).collect()
    }

    fn clients_label(&self) -> &'static str {
        if self.overload {
            "accounts / connections"
        } else {
            "accounts / clients"
        }
    }

    /// Throughput, latency and the overload figures.
    fn load_rows(&self) -> Vec<Row> {
        let terminal = format!("{} / {}", self.finished, self.rolled_back);
        let shed = match self.shed_with_retry_after {
            None => format!("{:.0}", self.shed_per_s),
            Some(share) => format!(
                "{:.0} ({:.0}% with Retry-After; clients {} it)",
                self.shed_per_s,
                share * 100.0,
                if self.clients_honour_retry_after {
                    "honour"
                } else {
                    "ignore"
                }
            ),
        };
        let other = match &self.first_failure {
            None => format!("{} / {}", self.shed_items, self.failed),
            Some(why) => format!("{} / {} (first: {why})", self.shed_items, self.failed),
        };
        vec![
            (
                "transfers/s to terminal",
                format!("{:.0}", self.transfers_per_s),
            ),
            ("  finished / rolled back", terminal),
            (
                "accepted transfers/s",
                format!("{:.0}", self.accepted_transfers_per_s),
            ),
            (
                "accepted POSTs/s",
                format!("{:.0}", self.accepted_posts_per_s),
            ),
            ("503s/s", shed),
            ("items 503 / failed", other),
            ("POST latency (ms)", self.post_latency_ms.to_string()),
            (
                "  in the service (ms)",
                self.service_post_latency_ms.to_string(),
            ),
            (
                "created → terminal (ms)",
                self.created_to_terminal_ms.to_string(),
            ),
            ("drain after posting (s)", format!("{:.2}", self.drain_s)),
        ]
    }

    /// The emulator's requests per transfer by kind, as `bulk 0.40, get 0.06` (`-` without
    /// the emulator).
    fn es_requests_by_kind(&self) -> String {
        match &self.es_http_requests_by_kind {
            Some(kinds) => kinds
                .iter()
                .map(|(kind, n)| format!("{kind} {n:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            None => "-".into(),
        }
    }

    /// What a transfer costs the service, and the comparison with /healthz.
    fn cost_rows(&self) -> Vec<Row> {
        let store = format!(
            "{} (conflicts {})",
            shown(self.store_requests_per_transfer, 2),
            shown(self.conflicts_per_transfer, 2)
        );
        let mut rows = vec![
            (
                "service CPU/transfer (µs)",
                shown(self.service_cpu_us_per_transfer, 0),
            ),
            (
                "benchmark process CPU/transfer (µs)",
                shown(self.bench_cpu_us_per_transfer, 0),
            ),
            ("machine cores busy", shown(self.machine_cores, 2)),
            (
                "Elasticsearch CPU/transfer (µs)",
                shown(self.elasticsearch_cpu_us_per_transfer, 0),
            ),
            ("/healthz req/s", format!("{:.0}", self.healthz_per_s)),
            (
                "ratio transfers/healthz",
                format!("{:.3}", self.ratio_to_healthz),
            ),
            ("store requests/transfer", store),
            (
                "source bytes sent/transfer",
                shown(self.source_bytes_sent_per_transfer, 0),
            ),
            (
                "engine writes / refreshes a transfer",
                format!(
                    "{} / {}",
                    shown(self.engine_writes_per_transfer, 2),
                    shown(self.engine_refreshes_per_transfer, 3)
                ),
            ),
            (
                "account document (bytes)",
                self.account_documents.as_ref().map_or("-".into(), |d| {
                    format!(
                        "mean {:.0}, max {} ({} accounts)",
                        d.mean_bytes, d.max_bytes, d.count
                    )
                }),
            ),
            (
                "ES HTTP requests/transfer",
                shown(self.es_http_requests_per_transfer, 2),
            ),
            ("  by kind", self.es_requests_by_kind()),
            ("peak RSS (MiB)", shown(self.peak_rss_mib, 0)),
            (
                "preloaded transfers",
                self.preloaded.as_ref().map_or("-".into(), |p| {
                    format!(
                        "{} ({:.0}/s, a document {} bytes)",
                        p.transfers, p.per_s, p.document_bytes
                    )
                }),
            ),
            (
                "store bytes/transfer",
                shown(self.store_bytes_per_transfer, 0),
            ),
            ("  by table (preloaded)", self.bytes_by_table()),
        ];
        if let Some(events) = &self.events {
            rows.extend([
                (
                    "events/transfer (deliveries/event)",
                    format!(
                        "{:.2} ({:.2})",
                        events.per_transfer, events.deliveries_per_event
                    ),
                ),
                (
                    "terminal write → consumer (ms)",
                    events.terminal_lag_ms.to_string(),
                ),
            ]);
        }
        if let Some(webhooks) = &self.webhooks {
            rows.extend([
                (
                    "webhook events/transfer (deliveries/event)",
                    format!(
                        "{:.2} ({:.2})",
                        webhooks.per_transfer, webhooks.deliveries_per_event
                    ),
                ),
                (
                    "event → webhook delivered (ms)",
                    webhooks.lag_ms.to_string(),
                ),
            ]);
        }
        rows
    }
}

impl Report {
    /// Each table's bytes a preloaded transfer, in its pages (its keys and values alone).
    fn bytes_by_table(&self) -> String {
        let Some(preloaded) = &self.preloaded else {
            return "-".into();
        };
        preloaded
            .tables
            .iter()
            .filter(|t| t.in_pages_per_transfer >= 1.0)
            .map(|t| {
                format!(
                    "{} {:.0} ({:.0})",
                    t.table, t.in_pages_per_transfer, t.stored_per_transfer
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Transfers of this run that reached a terminal state.
    pub fn terminal(&self) -> u64 {
        (self.finished + self.rolled_back) as u64
    }

    /// Records the embedded store's size after the run, `bytes`, a transfer it holds (the
    /// preloaded ones, those of earlier runs on a kept store, and this run's).
    pub fn add_store_size(&mut self, preloaded: Option<crate::preload::Preloaded>, bytes: u64) {
        let before = preloaded.as_ref().map_or(0, |p| p.held_before_run);
        let held = before as f64 + self.finished + self.rolled_back;
        self.store_bytes_per_transfer = (held > 0.0).then(|| bytes as f64 / held);
        self.preloaded = preloaded;
    }

    pub fn new(
        args: &Args,
        phase: &TransferPhase,
        healthz_per_s: f64,
        peak_rss_kib: Option<u64>,
    ) -> Report {
        let terminal = phase.counted.terminal();
        // Per-transfer figures are absent when nothing reached a terminal state.
        let per_transfer = |v: f64| (terminal > 0.0).then(|| v / terminal);
        let posting_s = phase.posting.as_secs_f64();
        let transfers_per_s = terminal / (phase.posting + phase.drain).as_secs_f64();
        let tally = &phase.tally;
        Report {
            store: args.store(),
            shards: args.shards,
            index_shards: phase.index_shards.clone(),
            shard_op_cost_us: args.shard_op_cost.map(|c| c.as_secs_f64() * 1e6),
            shard_busy: shard_busy(args, phase),
            engine_requests_in_flight: phase
                .emulator_load
                .map(|(_, time)| time.as_secs_f64() / (phase.posting + phase.drain).as_secs_f64()),
            accounts: args.accounts,
            clients: args.clients(),
            overload: args.connections.is_some(),
            paced_rate: args.rate,
            batch: args.batch,
            posting_s,
            transfers_per_s,
            finished: phase.counted.finished,
            rolled_back: phase.counted.rolled_back,
            accepted_transfers_per_s: tally.accepted_transfers as f64 / posting_s,
            accepted_posts_per_s: tally.accepted_posts as f64 / posting_s,
            shed_per_s: tally.shed as f64 / posting_s,
            shed_with_retry_after: (tally.shed > 0)
                .then(|| tally.shed_with_retry_after as f64 / tally.shed as f64),
            clients_honour_retry_after: !args.ignore_retry_after,
            shed_items: tally.shed_items,
            failed: tally.failed,
            first_failure: tally.first_failure.clone(),
            post_latency_ms: Percentiles::of_client_latency(&tally.latency_us),
            service_post_latency_ms: Percentiles::of_service_histogram(
                &phase.after,
                "http_request_duration_seconds",
                |labels| accepted_post(args, labels),
            ),
            created_to_terminal_ms: Percentiles::of_service_histogram(
                &phase.after,
                "transfer_duration_seconds",
                all,
            ),
            drain_s: phase.drain.as_secs_f64(),
            service_cpu_us_per_transfer: phase
                .service_cpu
                .and_then(|cpu| per_transfer(cpu.as_secs_f64() * 1e6)),
            bench_cpu_us_per_transfer: phase
                .bench_cpu
                .and_then(|cpu| per_transfer(cpu.as_secs_f64() * 1e6)),
            machine_cores: phase
                .machine_cpu
                .map(|cpu| cpu.as_secs_f64() / (phase.posting + phase.drain).as_secs_f64()),
            elasticsearch_cpu_us_per_transfer: (phase.cluster.as_ref())
                .and_then(|c| per_transfer(c.cpu.as_secs_f64() * 1e6)),
            engine_writes_per_transfer: (phase.cluster.as_ref())
                .and_then(|c| per_transfer(c.writes as f64)),
            engine_refreshes_per_transfer: (phase.cluster.as_ref())
                .and_then(|c| per_transfer(c.refreshes as f64)),
            source_bytes_sent_per_transfer: per_transfer(phase.counted.bytes_sent),
            account_documents: phase.account_documents.clone(),
            healthz_per_s,
            ratio_to_healthz: transfers_per_s / healthz_per_s,
            store_requests_per_transfer: per_transfer(phase.counted.store_requests),
            conflicts_per_transfer: per_transfer(phase.counted.conflicts),
            es_http_requests_per_transfer: (phase.es_requests.as_ref())
                .and_then(|kinds| per_transfer(kinds.values().sum::<u64>() as f64)),
            es_http_requests_by_kind: phase.es_requests.as_ref().map(|kinds| {
                kinds
                    .iter()
                    .filter(|&(_, &n)| n > 0)
                    .filter_map(|(kind, &n)| Some((kind.to_string(), per_transfer(n as f64)?)))
                    .collect()
            }),
            peak_rss_mib: peak_rss_kib.map(|kib| kib as f64 / 1024.0),
            preloaded: None,
            store_bytes_per_transfer: None,
            events: phase.followed.as_ref().map(|f| EventsFollowed {
                per_transfer: f.events as f64 / terminal.max(1.0),
                deliveries_per_event: f.deliveries as f64 / (f.events.max(1) as f64),
                terminal_lag_ms: Percentiles::of_client_latency(&f.terminal_lag_us),
            }),
            webhooks: phase.webhooks.as_ref().map(|r| WebhooksReceived {
                per_transfer: r.ids.len() as f64 / terminal.max(1.0),
                deliveries_per_event: r.deliveries as f64 / (r.ids.len().max(1) as f64),
                lag_ms: Percentiles::of_client_latency(
                    &r.lag_us
                        .clone()
                        .unwrap_or_else(|| Histogram::new(3).expect("histogram")),
                ),
            }),
        }
    }
}

/// How busy the data indices' shards were in the capacity model, on average.
fn shard_busy(args: &Args, phase: &TransferPhase) -> Option<f64> {
    let (operations, _) = phase.emulator_load?;
    let cost = args.shard_op_cost?;
    let shards: usize = (phase.index_shards.iter())
        .map(|(_, n)| *n)
        .sum::<Option<usize>>()?;
    let wall = (phase.posting + phase.drain).as_secs_f64();
    Some(operations as f64 * cost.as_secs_f64() / (wall * shards as f64))
}

/// Whether a sample of `http_request_duration_seconds` is of the POSTs the clients make that
/// were accepted: `201` from `POST /transfers`, or `200` from `POST /transfers/batch`.
fn accepted_post(args: &Args, labels: &Labels) -> bool {
    let (route, status) = match args.batch {
        Some(_) => ("/transfers/batch", "200"),
        None => ("/transfers", "201"),
    };
    labels.get("method") == Some(&"POST")
        && labels.get("route") == Some(&route)
        && labels.get("status") == Some(&status)
}
