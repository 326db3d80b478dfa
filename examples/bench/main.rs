//! Load generator and benchmark for transfer-service (`docs/design.md` §6).
//!
//! ```sh
//! cargo build --release --bin transfer-service --example bench
//! target/release/examples/bench                          # 64 clients, 1000 accounts, 10 s
//! target/release/examples/bench --batch 100              # POST /transfers/batch, 100 items
//! target/release/examples/bench --connections 2000       # the overload scenario
//! target/release/examples/bench --connections 2000 --ignore-retry-after   # ... as a flood
//! target/release/examples/bench --emulator               # on es-emulator (a TEST DOUBLE)
//! target/release/examples/bench --follow-events          # ... with a GET /events consumer
//! target/release/examples/bench --webhook                # ... delivering to a receiver
//! target/release/examples/bench --emulator --webhook --second-instance 21s   # ... from an
//!                                               # instance without the receiver's lease
//! target/release/examples/bench --elasticsearch http://127.0.0.1:9200 --json
//! target/release/examples/bench --emulator --shard-op-cost 400us --shards 4   # shards as
//!                                               # servers of bounded capacity (es-emulator's
//!                                               # capacity model), ELASTICSEARCH_SHARDS=4
//! target/release/examples/bench --emulator --shard-op-cost 400us --shard-series 1,2,4,8 --runs 3
//! ```
//!
//! Without `--url` it starts `target/release/transfer-service` itself (embedded store in a
//! temp dir, `--elasticsearch URL`, or `--emulator`: es-emulator, the Elasticsearch TEST
//! DOUBLE, inside this process), so it can read the service process's CPU time and peak
//! memory from `/proc`. It opens `--accounts` accounts with balances no transfer can
//! exhaust, then:
//! 1. **transfer phase**: `--clients` clients (or `--connections`) post transfers between
//!    random accounts for `--duration` (one per `POST /transfers`, or `--batch N` per
//!    `POST /transfers/batch`), then it waits until every accepted transfer is terminal;
//! 2. **healthz phase**: the same number of clients `GET /healthz` for `--healthz-duration`,
//!    the ceiling of the HTTP stack on this machine, to which the transfer rate is compared.
//!
//! It prints an aligned table (or `--json`) of: transfers/s to a terminal state (accepted →
//! finished or rolled back, end to end: terminal transfers over posting plus draining time),
//! the service's CPU time per terminal transfer (utime+stime of the child over the transfer
//! phase), peak RSS (`VmHWM`), POST latency percentiles (accepted requests, measured by the
//! clients, in an HDR histogram; and as the service timed them, from its
//! `http_request_duration_seconds`), 503s (with `Retry-After`) and how long the backlog took
//! to drain, the ratio to `/healthz` req/s, store requests per transfer, and on the
//! emulator the HTTP requests it received per transfer. With `--follow-events` a consumer
//! follows `GET /events` through the transfer phase ([`feed`]), and the report adds the
//! events it saw and how long after each terminal write it saw it; with `--webhook` the
//! service delivers its terminal events to a receiver in the benchmark ([`receiver`]), and
//! the report adds the deliveries and their lag.
//!
//! `--shards N` starts the service with `ELASTICSEARCH_SHARDS=N` (the primaries of its data
//! indices), and the report reads back how many the indices have. `--shard-op-cost` turns on
//! es-emulator's capacity model (each shard a server on which every operation takes that
//! long, one at a time, shards in parallel), and `--shard-series 1,2,4,8` runs the whole
//! benchmark at each shard count (`--runs` times each, interleaved) and ends with a table of
//! the rates against the one-shard rate and what the service's CPU did ([`series`]).

mod connection;
mod feed;
mod preload;
mod receiver;
mod report;
mod series;

use connection::{Answer, Connection};

use report::Report;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::{PrometheusType, PrometheusValue};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Parser, Debug, Clone)]
#[command(about = "Benchmark transfer-service")]
struct Args {
    /// A running service; if absent, the benchmark starts one (and only then can it read the
    /// service's CPU time and memory).
    #[arg(long)]
    url: Option<String>,
    /// The binary to start when no --url is given.
    #[arg(long, default_value = "target/release/transfer-service")]
    binary: String,
    /// Start the service on this Elasticsearch (or emulator) instead of the embedded store.
    #[arg(long, conflicts_with = "emulator")]
    elasticsearch: Option<String>,
    /// Start es-emulator (an in-memory TEST DOUBLE of Elasticsearch) inside the benchmark and
    /// run the service on it; the emulator counts the HTTP requests it receives.
    #[arg(long, conflicts_with = "url")]
    emulator: bool,
    /// Concurrent clients, each posting its next request when the last one is answered.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// The overload scenario: this many connections posting as fast as they can (instead
    /// of --clients); the report's 503 and drain figures are the ones to read.
    #[arg(long, conflicts_with = "clients")]
    connections: Option<usize>,
    /// Clients post again at once after a 503 instead of waiting as its `Retry-After` asks
    /// (a flood from misbehaving clients rather than a crowd of well-behaved ones).
    #[arg(long)]
    ignore_retry_after: bool,
    /// Post at this many requests a second in all, the clients taking turns on a fixed
    /// schedule (an open load), instead of each posting its next request as soon as the last
    /// is answered. Two builds compared at one rate do the same work a second and group their
    /// writes alike, so their CPU a transfer compares; at full speed the faster one also
    /// batches more. A client behind its schedule posts at once; the report's rate shows
    /// whether the service kept up.
    #[arg(long, conflicts_with = "connections", value_parser = clap::value_parser!(u32).range(1..))]
    rate: Option<u32>,
    /// How long the clients post.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// How long the same clients then GET /healthz, for the ratio.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    healthz_duration: Duration,
    /// Accounts the transfers move money between (at least 2; 2 makes them hot).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(2..))]
    accounts: u32,
    /// Post batches of N transfers to POST /transfers/batch instead of single transfers.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch: Option<u32>,
    /// Follow `GET /events` during the transfer phase, as a feed consumer would.
    #[arg(long)]
    follow_events: bool,
    /// Start the service with a webhook (`WEBHOOK_URL`) to a receiver in the benchmark that
    /// answers 204 (needs the service to start it: no --url).
    #[arg(long, conflicts_with = "url")]
    webhook: bool,
    /// With --webhook on Elasticsearch (or --emulator): start a second service on the same
    /// indices once the first holds the receiver's delivery lease, and post to the second
    /// only, so every event comes by the fast path of an instance without the lease; the
    /// report then waits out the feed's horizon (`Engine::feed_delay`, this long), so that
    /// its repeats count what the holder's feed delivered again.
    #[arg(long, requires = "webhook", value_parser = humantime::parse_duration)]
    second_instance: Option<Duration>,
    /// Start the service on an embedded store that already holds this many transfers, made
    /// by the engine in this process before the service starts (see `preload.rs`).
    #[arg(long, conflicts_with_all = ["url", "elasticsearch", "emulator"])]
    preload: Option<u64>,
    /// The embedded store's directory, kept after the run (default: a temp dir, deleted). A
    /// store preloaded there once is used again by later runs with the same --preload, which
    /// then skip making it.
    #[arg(long, conflicts_with_all = ["url", "elasticsearch", "emulator"])]
    data_dir: Option<std::path::PathBuf>,
    /// Start the service with `ELASTICSEARCH_SHARDS` set to this: the primary shards of the
    /// accounts and transactions indices it creates (with --emulator or --elasticsearch).
    #[arg(long, conflicts_with = "url", value_parser = clap::value_parser!(u32).range(1..=1024))]
    shards: Option<u32>,
    /// With --emulator: es-emulator's capacity model, each shard a server on which every
    /// operation (a bulk item, a document write or get; one per shard for a search, refresh
    /// or stats request) takes this long, one at a time, shards in parallel (e.g. `400us`).
    #[arg(long, requires = "emulator", value_parser = humantime::parse_duration)]
    shard_op_cost: Option<Duration>,
    /// With --emulator: run the benchmark at each of these shard counts (a fresh emulator
    /// and service each time, `ELASTICSEARCH_SHARDS` set to the count), then print each
    /// count's rate against the first's.
    #[arg(long, requires = "emulator", conflicts_with = "shards", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    shard_series: Option<Vec<u32>>,
    /// With --shard-series: runs at each shard count (interleaved: the whole series, then
    /// again), of which the table shows the median, min and max.
    #[arg(long, default_value_t = 1, requires = "shard_series")]
    runs: usize,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

impl Args {
    /// Whether the service runs on Elasticsearch or the emulator (for `--shards`).
    fn on_engine(&self) -> bool {
        self.emulator || self.elasticsearch.is_some()
    }

    fn clients(&self) -> usize {
        self.connections.unwrap_or(self.clients)
    }

    fn store(&self) -> String {
        match (&self.url, &self.elasticsearch, self.emulator) {
            (Some(_), _, _) => "running service".into(),
            (_, Some(es), _) => format!("elasticsearch {es}"),
            (_, _, true) => "es-emulator (test double)".into(),
            _ => "embedded".into(),
        }
    }
}

// ---- setup --------------------------------------------------------------------------------

/// The service process the benchmark started.
struct Service {
    child: Child,
    base: String,
    dir: preload::DataDir,
    preloaded: Option<preload::Preloaded>,
}

impl Service {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

fn start_service(args: &Args, elasticsearch: Option<&str>, webhook: Option<&str>) -> Service {
    let dir = preload::DataDir::new(args.data_dir.as_deref());
    let preloaded = args.preload.map(|n| {
        let preloaded = preload::preload_once(dir.path(), n);
        eprintln!("preloaded: {preloaded:?}");
        preloaded
    });
    let mut command = Command::new(&args.binary);
    command
        .env("LISTEN_ADDR", "127.0.0.1:0")
        .env("DATA_DIR", dir.path())
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "warn,transfer_service::app=info")
        .env("INDEX_PREFIX", index_prefix())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(es) = elasticsearch {
        command.env("ELASTICSEARCH_URL", es);
    }
    if let Some(shards) = args.shards {
        command.env("ELASTICSEARCH_SHARDS", shards.to_string());
    }
    if let Some(url) = webhook {
        command
            .env("WEBHOOK_URL", url)
            .env("WEBHOOK_SECRET", receiver::SECRET);
    }
    let mut child = command.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot start {} ({e}); run `cargo build --release` first",
            args.binary
        )
    });
    let addr = serving_addr(child.stdout.take().unwrap());
    Service {
        child,
        base: format!("http://{addr}"),
        dir,
        preloaded,
    }
}

/// The `INDEX_PREFIX` of the services this benchmark starts.
fn index_prefix() -> String {
    format!("bench-{}-", std::process::id())
}

/// Reads the service's JSON log until its "serving" line, and returns the address in it;
/// keeps draining the log afterwards so the service never blocks on a full pipe.
fn serving_addr(stdout: std::process::ChildStdout) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v["message"] == "serving" {
                    let _ = tx.send(v["addr"].as_str().unwrap_or_default().to_owned());
                }
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("service did not start")
}

/// es-emulator (the Elasticsearch TEST DOUBLE) on a runtime of its own, so that the load's
/// clients do not share its worker threads.
struct Emulator {
    running: Option<es_emulator::RunningEmulator>,
    runtime: tokio::runtime::Runtime,
}

impl Emulator {
    /// With `shard_op_cost`, in the capacity model (es-emulator's `capacity` module).
    fn start(shard_op_cost: Option<Duration>) -> Emulator {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("emulator runtime");
        let running = runtime.block_on(es_emulator::spawn(es_emulator::EmulatorConfig::default()));
        running.set_shard_op_cost(shard_op_cost.unwrap_or_default());
        Emulator {
            running: Some(running),
            runtime,
        }
    }

    fn url(&self) -> String {
        self.running.as_ref().expect("running").url.clone()
    }

    /// Shard operations its capacity model served so far, and its requests' times added up.
    fn load(&self) -> (u64, Duration) {
        let running = self.running.as_ref().expect("running");
        (running.shard_operations(), running.request_time())
    }

    /// The HTTP requests received so far, by kind (`_bulk`, document `GET`, `_search`, ...).
    fn request_counts(&self) -> BTreeMap<String, u64> {
        let running = self.running.as_ref().expect("running");
        es_emulator::KINDS
            .iter()
            .map(|&kind| (kind.to_owned(), running.request_count_of(kind)))
            .collect()
    }

    fn stop(mut self) {
        if let Some(running) = self.running.take() {
            self.runtime.block_on(running.shutdown());
        }
    }
}

/// What a real cluster (`--elasticsearch`) counts of itself, from `_nodes/stats`: the HTTP
/// requests it received by route (Elasticsearch 8.x keeps them per route; OpenSearch does
/// not: `None`), and its processes' CPU time. Summed over the nodes; a cluster from
/// `tools/es-cluster/run` is one process, so its CPU is read from one node.
#[derive(Debug, Clone, Default)]
struct ClusterStats {
    requests: Option<BTreeMap<String, u64>>,
    cpu: Duration,
    /// Documents indexed into primaries (`_stats/indexing`: every create and replace the
    /// engine applied; conflicts are not counted).
    writes: u64,
    /// Refreshes of every shard copy (`_stats/refresh`, periodic ones included).
    refreshes: u64,
}

impl ClusterStats {
    async fn take(client: &reqwest::Client, url: &str) -> Option<ClusterStats> {
        let stats = get_json(client, format!("{url}/_nodes/stats/http,process")).await?;
        let nodes = stats["nodes"].as_object()?;
        let mut taken = ClusterStats::default();
        for node in nodes.values() {
            let Some(routes) = node["http"]["routes"].as_object() else {
                continue;
            };
            let requests = taken.requests.get_or_insert_with(BTreeMap::new);
            for (route, counts) in routes {
                let n = counts["requests"]["count"].as_u64().unwrap_or(0);
                *requests.entry(route_kind(route).to_owned()).or_default() += n;
            }
        }
        let cpu_ms = nodes.values().next()?["process"]["cpu"]["total_in_millis"].as_u64()?;
        taken.cpu = Duration::from_millis(cpu_ms);
        let indices = get_json(client, format!("{url}/_stats/indexing,refresh")).await?;
        taken.writes = indices["_all"]["primaries"]["indexing"]["index_total"].as_u64()?;
        taken.refreshes = indices["_all"]["total"]["refresh"]["total"].as_u64()?;
        Some(taken)
    }

    fn since(&self, before: &ClusterStats) -> ClusterStats {
        let requests = self.requests.as_ref().map(|requests| {
            let earlier =
                |kind: &String| (before.requests.as_ref()).and_then(|b| b.get(kind).copied());
            (requests.iter())
                .map(|(kind, n)| (kind.clone(), n - earlier(kind).unwrap_or(0)))
                .collect()
        });
        ClusterStats {
            requests,
            cpu: self.cpu.saturating_sub(before.cpu),
            writes: self.writes.saturating_sub(before.writes),
            refreshes: self.refreshes.saturating_sub(before.refreshes),
        }
    }
}

/// `GET url` as JSON; `None` when it cannot be had.
async fn get_json(client: &reqwest::Client, url: String) -> Option<serde_json::Value> {
    client.get(url).send().await.ok()?.json().await.ok()
}

/// The emulator's kind of a request to an Elasticsearch route template.
fn route_kind(route: &str) -> &'static str {
    match route {
        r if r.contains("_bulk") => "bulk",
        r if r.contains("_search") => "search",
        r if r.contains("_refresh") => "refresh",
        r if r.contains("_create") => "create",
        r if r.contains("/_doc/") => "get",
        "/{index}" => "indices",
        _ => "other",
    }
}

/// Waits until the service answers `/readyz` with a success, for up to a minute.
async fn wait_ready(client: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .map(|r| !r.status().is_success())
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "service not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Opens `bench-{run}-0` … with balances no transfer of the run can exhaust, 16 at a time.
async fn open_accounts(client: &reqwest::Client, base: &str, run: &str, accounts: u32) {
    const OPENERS: u32 = 16;
    let openers: Vec<_> = (0..OPENERS)
        .map(|k| {
            let (client, base, run) = (client.clone(), base.to_owned(), run.to_owned());
            tokio::spawn(async move {
                for i in (k..accounts).step_by(OPENERS as usize) {
                    open_account(&client, &base, &account_id(&run, i)).await;
                }
            })
        })
        .collect();
    for opener in openers {
        opener.await.expect("opener");
    }
}

async fn open_account(client: &reqwest::Client, base: &str, id: &str) {
    let response = client
        .post(format!("{base}/accounts"))
        .json(&serde_json::json!({"id": id, "balance": 1_000_000_000_000i64}))
        .send()
        .await
        .expect("open account");
    assert!(
        response.status().is_success(),
        "open account: {}",
        response.status()
    );
}

fn account_id(run: &str, i: u32) -> String {
    format!("bench-{run}-{i}")
}

// ---- load ---------------------------------------------------------------------------------

/// What clients saw while posting (one client's, or all of them added up).
struct Tally {
    /// Latency in µs of every accepted POST (201, or a batch with an accepted item).
    latency_us: Histogram<u64>,
    accepted_posts: u64,
    /// Transfers the service accepted (201 or 200 replay; batch items likewise).
    accepted_transfers: u64,
    /// Requests answered 503.
    shed: u64,
    /// Of those, the ones that carried `Retry-After`.
    shed_with_retry_after: u64,
    /// Batch items answered 503 inside a 200.
    shed_items: u64,
    /// Anything else: transport errors, other statuses, items refused with 409/422.
    failed: u64,
    /// What the first failure was, to say why a run failed.
    first_failure: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency_us: Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds"),
            accepted_posts: 0,
            accepted_transfers: 0,
            shed: 0,
            shed_with_retry_after: 0,
            shed_items: 0,
            failed: 0,
            first_failure: None,
        }
    }

    fn add(&mut self, other: &Tally) {
        self.latency_us.add(&other.latency_us).expect("same bounds");
        self.accepted_posts += other.accepted_posts;
        self.accepted_transfers += other.accepted_transfers;
        self.shed += other.shed;
        self.shed_with_retry_after += other.shed_with_retry_after;
        self.shed_items += other.shed_items;
        self.failed += other.failed;
        if self.first_failure.is_none() {
            self.first_failure.clone_from(&other.first_failure);
        }
    }

    fn count(&mut self, outcome: Outcome, latency: Duration) {
        match outcome {
            Outcome::Answered {
                accepted,
                shed,
                refused,
            } => {
                if accepted > 0 {
                    self.accepted_posts += 1;
                    self.latency_us
                        .saturating_record(latency.as_micros() as u64);
                }
                self.accepted_transfers += accepted;
                self.shed_items += shed;
                self.failed += refused;
                if refused > 0 {
                    self.note_failure("a batch item refused with 409 or 422".into());
                }
            }
            Outcome::Shed { retry_after } => {
                self.shed += 1;
                self.shed_with_retry_after += u64::from(retry_after.is_some());
            }
            Outcome::Failed(why) => {
                self.failed += 1;
                self.note_failure(why);
            }
        }
    }

    fn note_failure(&mut self, why: String) {
        self.first_failure.get_or_insert(why);
    }
}

/// How the service answered one POST.
enum Outcome {
    /// Transfers accepted, shed (batch items answered 503) and refused (409/422 items).
    Answered {
        accepted: u64,
        shed: u64,
        refused: u64,
    },
    /// 503, with the wait its `Retry-After` asked for (in seconds), if any.
    Shed { retry_after: Option<Duration> },
    /// A transport error or any other status, and which.
    Failed(String),
}

/// The body of `POST /transfers`, and of each batch item.
#[derive(Serialize)]
struct TransferBody {
    id: String,
    from: String,
    to: String,
    amount: u64,
}

#[derive(Serialize)]
struct BatchBody {
    transfers: Vec<TransferBody>,
}

#[derive(Deserialize)]
struct BatchAnswer {
    items: Vec<BatchItem>,
}

#[derive(Deserialize)]
struct BatchItem {
    status: u16,
}

/// Runs `args.clients()` clients posting until the duration is over. Each first opens its
/// connection (a `GET /healthz`, not counted) and all start posting together, so that the
/// latencies are those of requests, not of thousands of connections being set up at once.
async fn run_load(args: &Args, base: &str, run: &str) -> Tally {
    let ready = Arc::new(tokio::sync::Barrier::new(args.clients()));
    let tasks: Vec<_> = (0..args.clients())
        .map(|c| {
            let mut poster = Poster {
                connection: Connection::to(base).expect("the base URL was checked"),
                run: run.to_owned(),
                accounts: args.accounts,
                batch: args.batch,
                client_number: c,
            };
            let (ready, duration) = (ready.clone(), args.duration);
            let honour = !args.ignore_retry_after;
            let (rate, clients) = (args.rate, args.clients());
            tokio::spawn(async move {
                let _ = poster.connection.get("/healthz").await;
                ready.wait().await;
                let pace = rate.map(|rate| Pace::of_client(c, clients, rate));
                poster
                    .post_until(Instant::now() + duration, honour, pace)
                    .await
            })
        })
        .collect();
    let mut total = Tally::new();
    for task in tasks {
        total.add(&task.await.expect("poster"));
    }
    total
}

/// One client of the load.
struct Poster {
    connection: Connection,
    run: String,
    accounts: u32,
    /// Items per `POST /transfers/batch`; `None` posts single transfers.
    batch: Option<u32>,
    client_number: usize,
}

impl Poster {
    /// Posts until `until`, one request at a time, each as soon as the last is answered or,
    /// with a `pace`, at its time on the schedule (at once when behind it). A client that
    /// honours `Retry-After` waits as long as a 503 asks (cut at `until`) before its next
    /// request; one that does not posts again at once.
    async fn post_until(
        mut self,
        until: Instant,
        honour_retry_after: bool,
        mut pace: Option<Pace>,
    ) -> Tally {
        let mut tally = Tally::new();
        let mut n = 0u64;
        while Instant::now() < until {
            if let Some(pace) = pace.as_mut() {
                tokio::time::sleep_until(pace.next().min(until).into()).await;
                if Instant::now() >= until {
                    break;
                }
            }
            let sent = Instant::now();
            let outcome = match self.batch {
                None => self.post_single(&mut n).await,
                Some(size) => self.post_batch(&mut n, size).await,
            };
            let pause = match outcome {
                Outcome::Shed {
                    retry_after: Some(wait),
                } if honour_retry_after => Some(wait),
                _ => None,
            };
            let failed = matches!(outcome, Outcome::Failed(_));
            tally.count(outcome, sent.elapsed());
            if failed {
                // A service that is gone or refusing connections is not hammered in a loop.
                tokio::time::sleep(PAUSE_AFTER_FAILURE).await;
            }
            if let Some(wait) = pause {
                tokio::time::sleep(wait.min(until.saturating_duration_since(Instant::now()))).await;
            }
        }
        tally
    }

    async fn post_single(&mut self, n: &mut u64) -> Outcome {
        let body = serde_json::to_vec(&self.transfer(n)).expect("a transfer encodes");
        match self.connection.post_json("/transfers", body).await {
            Ok(a) if matches!(a.status, 200 | 201) => Outcome::Answered {
                accepted: 1,
                shed: 0,
                refused: 0,
            },
            Ok(a) => outcome_of_refusal(&a, "/transfers"),
            Err(e) => Outcome::Failed(e),
        }
    }

    async fn post_batch(&mut self, n: &mut u64, size: u32) -> Outcome {
        let body = BatchBody {
            transfers: (0..size).map(|_| self.transfer(n)).collect(),
        };
        let body = serde_json::to_vec(&body).expect("a batch encodes");
        match self.connection.post_json("/transfers/batch", body).await {
            Ok(a) if a.status == 200 => match serde_json::from_slice::<BatchAnswer>(&a.body) {
                Ok(answer) => outcome_of_items(&answer.items),
                Err(e) => Outcome::Failed(format!("batch answer: {e}")),
            },
            Ok(a) => outcome_of_refusal(&a, "/transfers/batch"),
            Err(e) => Outcome::Failed(e),
        }
    }

    /// The next transfer of this client, between two distinct random accounts.
    fn transfer(&self, n: &mut u64) -> TransferBody {
        *n += 1;
        let mut rng = rand::rng();
        let from = rng.random_range(0..self.accounts);
        let to = (from + rng.random_range(1..self.accounts)) % self.accounts;
        TransferBody {
            id: format!("bench-{}-{}-{n}", self.run, self.client_number),
            from: account_id(&self.run, from),
            to: account_id(&self.run, to),
            amount: 1 + *n % 100,
        }
    }
}

fn outcome_of_refusal(answer: &Answer, path: &str) -> Outcome {
    if answer.status == 503 {
        Outcome::Shed {
            retry_after: answer.retry_after,
        }
    } else {
        Outcome::Failed(format!("{} {path}", answer.status))
    }
}

fn outcome_of_items(items: &[BatchItem]) -> Outcome {
    let with = |statuses: &[u16]| {
        items
            .iter()
            .filter(|i| statuses.contains(&i.status))
            .count() as u64
    };
    let (accepted, shed) = (with(&[200, 201]), with(&[503]));
    Outcome::Answered {
        accepted,
        shed,
        refused: items.len() as u64 - accepted - shed,
    }
}

/// One client's turns on the schedule of `--rate`: every `clients / rate` seconds from when
/// the clients start together, the clients' turns spread evenly over that interval.
struct Pace {
    next: Instant,
    every: Duration,
}

impl Pace {
    fn of_client(client: usize, clients: usize, rate: u32) -> Self {
        let every = Duration::from_secs_f64(clients as f64 / f64::from(rate));
        Pace {
            next: Instant::now() + every.mul_f64(client as f64 / clients as f64),
            every,
        }
    }

    /// The time of the next turn; the one after is a turn later.
    fn next(&mut self) -> Instant {
        let turn = self.next;
        self.next += self.every;
        turn
    }
}

/// How long a client pauses after a failed request before its next one.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(50);

/// `GET /healthz` from `clients` clients for `duration`; answers per second. Like the load,
/// each client opens its connection first (one request, not counted) and all start together.
async fn healthz_rate(base: &str, clients: usize, duration: Duration) -> f64 {
    let ready = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let mut connection = Connection::to(base).expect("the base URL was checked");
            let ready = ready.clone();
            tokio::spawn(async move {
                let _ = connection.get("/healthz").await;
                ready.wait().await;
                let until = Instant::now() + duration;
                let mut ok = 0u64;
                while Instant::now() < until {
                    match connection.get("/healthz").await {
                        Ok(answer) => ok += u64::from((200..300).contains(&answer.status)),
                        Err(_) => tokio::time::sleep(PAUSE_AFTER_FAILURE).await,
                    }
                }
                ok
            })
        })
        .collect();
    // Every connection is open: the clock starts for all at once.
    ready.wait().await;
    let started = Instant::now();
    let mut ok = 0;
    for task in tasks {
        ok += task.await.expect("healthz client");
    }
    ok as f64 / started.elapsed().as_secs_f64()
}

// ---- measure ------------------------------------------------------------------------------

/// One scrape of `/metrics`, parsed by `openmetrics-parser`.
struct Scrape(openmetrics_parser::MetricsExposition<PrometheusType, PrometheusValue>);

impl Scrape {
    async fn take(client: &reqwest::Client, base: &str) -> Scrape {
        let text = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .unwrap();
        Scrape(parse_prometheus(&text).expect("/metrics is the Prometheus text format"))
    }

    /// The sum of the counter or gauge `name` over the samples whose labels pass `keep`.
    fn sum(&self, name: &str, keep: impl Fn(&Labels) -> bool) -> f64 {
        let Some(family) = self.0.families.get(name) else {
            return 0.0;
        };
        family
            .iter_samples()
            .filter(|sample| {
                let labels = sample.get_labelset().expect("labels");
                keep(
                    &labels
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect(),
                )
            })
            .map(|sample| match &sample.value {
                PrometheusValue::Counter(c) => c.value.as_f64(),
                PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
                other => panic!("{name} is not a counter or gauge: {other:?}"),
            })
            .sum()
    }

    /// A quantile of the histogram `name` over the label sets `keep` passes (their buckets
    /// added up), linear within a bucket.
    fn histogram_quantile(
        &self,
        name: &str,
        keep: impl Fn(&Labels) -> bool,
        q: f64,
    ) -> Option<f64> {
        let mut counts: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        let mut bounds: Option<Vec<u64>> = None;
        for sample in self.0.families.get(name)?.iter_samples() {
            let labels = sample.get_labelset().expect("labels");
            let labels: Labels = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            if !keep(&labels) {
                continue;
            }
            let PrometheusValue::Histogram(histogram) = &sample.value else {
                panic!("{name} is not a histogram");
            };
            // Buckets add up only if every label set has the same bounds (one histogram's
            // label sets do).
            let these: Vec<u64> = histogram
                .buckets
                .iter()
                .map(|b| b.upper_bound.to_bits())
                .collect();
            let first = bounds.get_or_insert_with(|| these.clone());
            assert_eq!(first, &these, "{name}: label sets with other bucket bounds");
            for bucket in &histogram.buckets {
                let entry = counts
                    .entry(bucket.upper_bound.to_bits())
                    .or_insert((bucket.upper_bound, 0.0));
                entry.1 += bucket.count.as_f64();
            }
        }
        let mut buckets: Vec<(f64, f64)> = counts.into_values().collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        quantile_of_buckets(&buckets, q)
    }
}

/// A quantile from cumulative `(upper bound, count)` buckets, sorted by bound.
fn quantile_of_buckets(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                return Some(prev.0);
            }
            let within = if count > prev.1 {
                (rank - prev.1) / (count - prev.1)
            } else {
                1.0
            };
            return Some(prev.0 + (bound - prev.0) * within);
        }
        prev = (bound, count);
    }
    None
}

/// A sample's labels, by name.
type Labels<'a> = BTreeMap<&'a str, &'a str>;

fn all(_: &Labels) -> bool {
    true
}

fn completed(scrape: &Scrape, outcome: Option<&str>) -> f64 {
    scrape.sum("transfers_completed_total", |labels| {
        outcome.is_none_or(|o| labels.get("outcome") == Some(&o))
    })
}

/// Store requests a transfer causes: every op but readiness probes, refreshes and scans.
fn store_requests(scrape: &Scrape) -> f64 {
    scrape.sum("store_requests_total", |labels| {
        !matches!(labels.get("op"), Some(&("ready" | "refresh" | "scan")))
    })
}

fn replace_conflicts(scrape: &Scrape) -> f64 {
    scrape.sum("store_requests_total", |labels| {
        labels.get("op") == Some(&"replace") && labels.get("outcome") == Some(&"conflict")
    })
}

/// Polls `/metrics` until every transfer created since `before` is terminal (10 minutes at
/// most); returns the last scrape.
async fn wait_drained(client: &reqwest::Client, base: &str, before: &Scrape) -> Scrape {
    let created_before = before.sum("transfers_created_total", all);
    let done_before = completed(before, None);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let now = Scrape::take(client, base).await;
        let created = now.sum("transfers_created_total", all) - created_before;
        if completed(&now, None) - done_before >= created {
            return now;
        }
        assert!(Instant::now() < deadline, "transfers did not drain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the service counted between two scrapes.
struct Counted {
    finished: f64,
    rolled_back: f64,
    store_requests: f64,
    conflicts: f64,
    /// Bytes of document sources the service sent in writes (`store_bytes_sent_total`).
    bytes_sent: f64,
}

impl Counted {
    fn between(before: &Scrape, after: &Scrape) -> Counted {
        let delta = |f: &dyn Fn(&Scrape) -> f64| f(after) - f(before);
        Counted {
            finished: delta(&|s| completed(s, Some("finished"))),
            rolled_back: delta(&|s| completed(s, Some("rolled-back"))),
            store_requests: delta(&store_requests),
            conflicts: delta(&replace_conflicts),
            bytes_sent: delta(&|s| s.sum("store_bytes_sent_total", all)),
        }
    }

    fn terminal(&self) -> f64 {
        self.finished + self.rolled_back
    }
}

/// CPU time (user + system, all threads) the process `pid` has used so far.
fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = cpu_ticks(&stat)?;
    (per_second > 0).then(|| Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// utime + stime (fields 14 and 15 of `/proc/<pid>/stat`), in clock ticks.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces and parentheses:
    // count from after the last `)`, where field 3 starts.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// CPU time the whole machine has spent busy so far, every core and process (`/proc/stat`).
fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = busy_ticks(stat.lines().next()?)?;
    (per_second > 0).then(|| Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// The busy clock ticks of `/proc/stat`'s `cpu` line: every field but idle and iowait (the
/// 4th and 5th), and but guest time, which user time already counts (the 9th and 10th).
fn busy_ticks(line: &str) -> Option<u64> {
    let fields: Vec<u64> = (line.strip_prefix("cpu ")?.split_whitespace())
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let counted = fields.iter().take(8).enumerate();
    Some(
        counted
            .filter(|(i, _)| !matches!(i, 3 | 4))
            .map(|(_, n)| n)
            .sum(),
    )
}

/// A `/proc/<pid>/status` memory line (`VmHWM:`, `VmRSS:`) in KiB.
fn memory_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

// ---- run ----------------------------------------------------------------------------------

/// The transfer phase: what the clients saw, what the service counted and what it cost.
struct TransferPhase {
    tally: Tally,
    posting: Duration,
    /// From the end of posting until every accepted transfer was terminal.
    drain: Duration,
    counted: Counted,
    after: Scrape,
    /// The service's utime+stime over posting and draining.
    service_cpu: Option<Duration>,
    /// This process's own over the same time: the clients, and with --emulator the
    /// emulator (they share the machine's cores with the service).
    bench_cpu: Option<Duration>,
    /// The whole machine's busy CPU time over the same time, every process's.
    machine_cpu: Option<Duration>,
    /// The primary shards of the service's data indices as the engine reports them, by
    /// index (`accounts`, `transactions`), when it runs on one.
    index_shards: Vec<(String, Option<usize>)>,
    /// On the emulator: the shard operations its capacity model served over posting and
    /// draining, and its requests' times added up over the same time.
    emulator_load: Option<(u64, Duration)>,
    /// HTTP requests es-emulator or the real cluster received over posting and draining, by
    /// kind.
    es_requests: Option<BTreeMap<String, u64>>,
    /// The real cluster's own counts over posting and draining (`--elasticsearch`).
    cluster: Option<ClusterStats>,
    /// The account documents' sizes in the real cluster at the end (`--elasticsearch`).
    account_documents: Option<DocumentSizes>,
    /// What the `--follow-events` consumer saw.
    followed: Option<feed::Followed>,
    /// What the `--webhook` receiver got, once it had every terminal event.
    webhooks: Option<receiver::Received>,
}

/// Where the benchmark looks while it loads the service.
struct Target<'a> {
    client: reqwest::Client,
    base: String,
    /// The service process, when the benchmark started it.
    pid: Option<u32>,
    emulator: Option<&'a Emulator>,
    /// The real cluster's URL (`--elasticsearch`), read for its own counts.
    cluster: Option<String>,
    /// The engine's URL, the emulator's or the real cluster's.
    engine: Option<String>,
    /// The service's `INDEX_PREFIX`.
    index_prefix: String,
    /// What the `--webhook` receiver got.
    webhook: Option<receiver::Shared>,
}

async fn transfer_phase(args: &Args, target: &Target<'_>, run: &str) -> TransferPhase {
    let (client, base) = (&target.client, target.base.as_str());
    let before = Scrape::take(client, base).await;
    let cpu_before = target.pid.and_then(cpu_time);
    let bench_cpu_before = cpu_time(std::process::id());
    let machine_before = machine_busy();
    let es_before = target.emulator.map(Emulator::request_counts);
    let load_before = target.emulator.map(Emulator::load);
    let cluster_before = match &target.cluster {
        Some(url) => ClusterStats::take(client, url).await,
        None => None,
    };
    let (expected_terminal, expected) = tokio::sync::watch::channel(None);
    let follower = args.follow_events.then(|| {
        let give_up_after = Duration::from_secs(60);
        tokio::spawn(feed::follow(
            client.clone(),
            base.to_owned(),
            expected,
            give_up_after,
        ))
    });
    let started = Instant::now();
    let tally = run_load(args, base, run).await;
    let posting = started.elapsed();
    let after = wait_drained(client, base, &before).await;
    let drain = started.elapsed() - posting;
    let counted = Counted::between(&before, &after);
    let _ = expected_terminal.send(Some(counted.terminal() as u64));
    let followed = match follower {
        Some(task) => Some(task.await.expect("the feed consumer")),
        None => None,
    };
    if let Some(received) = &target.webhook {
        receiver::wait_for(received, counted.terminal() as u64, Duration::from_secs(60)).await;
    }
    // After the consumer caught up: its reads are part of what the feed costs.
    let cpu_after = target.pid.and_then(cpu_time);
    let bench_cpu_after = cpu_time(std::process::id());
    let machine_after = machine_busy();
    let load_after = target.emulator.map(Emulator::load);
    let cluster = match (&target.cluster, cluster_before) {
        (Some(url), Some(before)) => {
            let after = ClusterStats::take(client, url).await;
            after.map(|after| after.since(&before))
        }
        _ => None,
    };
    let webhooks =
        (target.webhook.as_ref()).map(|received| received.lock().expect("receiver state").clone());
    let account_documents = match &target.cluster {
        Some(url) => DocumentSizes::of_accounts(client, url, &target.index_prefix).await,
        None => None,
    };
    TransferPhase {
        followed,
        webhooks,
        tally,
        posting,
        drain,
        counted,
        after,
        service_cpu: cpu_before.zip(cpu_after).map(|(b, a)| a - b),
        bench_cpu: bench_cpu_before.zip(bench_cpu_after).map(|(b, a)| a - b),
        machine_cpu: machine_before.zip(machine_after).map(|(b, a)| a - b),
        emulator_load: load_before
            .zip(load_after)
            .map(|((ops, time), (ops_after, time_after))| (ops_after - ops, time_after - time)),
        index_shards: match &target.engine {
            Some(url) => index_shards(client, url, &target.index_prefix).await,
            None => Vec::new(),
        },
        account_documents,
        es_requests: es_before
            .zip(target.emulator)
            .map(|(before, e)| {
                let after = e.request_counts();
                after
                    .into_iter()
                    .map(|(kind, n)| {
                        let since = n - before.get(&kind).copied().unwrap_or(0);
                        (kind, since)
                    })
                    .collect()
            })
            .or(cluster.as_ref().and_then(|c| c.requests.clone())),
        cluster,
    }
}

/// The primary shards of the service's accounts and transactions indices, as the engine's
/// `_stats` lists them (`None` where it could not be read).
async fn index_shards(
    client: &reqwest::Client,
    url: &str,
    prefix: &str,
) -> Vec<(String, Option<usize>)> {
    let mut out = Vec::new();
    for index in ["accounts", "transactions"] {
        let name = format!("{prefix}{index}");
        let stats = get_json(
            client,
            format!("{url}/{name}/_stats/docs?level=shards&filter_path=indices.*.shards.*.routing.primary"),
        )
        .await;
        let count = stats
            .as_ref()
            .and_then(|s| s["indices"][&name]["shards"].as_object())
            .map(|shards| shards.len());
        out.push((index.to_owned(), count));
    }
    out
}

/// The sizes of the account documents' `_source` in a real cluster, as JSON text.
#[derive(Debug, Clone, Serialize)]
struct DocumentSizes {
    count: usize,
    mean_bytes: f64,
    max_bytes: usize,
}

impl DocumentSizes {
    /// Every account of the service's indices (the benchmark opens at most 10,000 here).
    async fn of_accounts(client: &reqwest::Client, url: &str, prefix: &str) -> Option<Self> {
        let body = serde_json::json!({"size": 10_000, "query": {"match_all": {}}});
        let answer: serde_json::Value = client
            .post(format!("{url}/{prefix}accounts/_search"))
            .json(&body)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let sizes: Vec<usize> = answer["hits"]["hits"]
            .as_array()?
            .iter()
            .map(|hit| hit["_source"].to_string().len())
            .collect();
        let count = sizes.len();
        (count > 0).then(|| DocumentSizes {
            count,
            mean_bytes: sizes.iter().sum::<usize>() as f64 / count as f64,
            max_bytes: sizes.iter().copied().max().unwrap_or(0),
        })
    }
}

/// Sets up, runs the transfer phase and then the healthz phase, and stops the service.
async fn run(args: &Args, emulator: Option<&Emulator>) -> Report {
    let elasticsearch = emulator.map(Emulator::url).or(args.elasticsearch.clone());
    let webhook = match args.webhook {
        true => Some(receiver::start().await),
        false => None,
    };
    let webhook_url = webhook.as_ref().map(|(url, _)| url.as_str());
    let service = args
        .url
        .is_none()
        .then(|| start_service(args, elasticsearch.as_deref(), webhook_url));
    let (holder, service) = match (args.second_instance, service) {
        (Some(_), Some(first)) => {
            assert!(
                elasticsearch.is_some(),
                "--second-instance needs Elasticsearch"
            );
            wait_for_the_lease(&first.base).await;
            let second = start_service(args, elasticsearch.as_deref(), webhook_url);
            (Some(first), Some(second))
        }
        (_, service) => (None, service),
    };
    let target = Target {
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("http client"),
        base: args
            .url
            .clone()
            .unwrap_or_else(|| service.as_ref().expect("started").base.clone()),
        pid: service.as_ref().map(Service::pid),
        emulator,
        cluster: args.elasticsearch.clone(),
        engine: elasticsearch.clone(),
        index_prefix: index_prefix(),
        webhook: webhook.map(|(_, received)| received),
    };
    wait_ready(&target.client, &target.base).await;
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    open_accounts(&target.client, &target.base, &run, args.accounts).await;

    let mut phase = transfer_phase(args, &target, &run).await;
    if let (Some(horizon), Some(received)) = (args.second_instance, &target.webhook) {
        // The holder's feed reaches the last events a horizon after they were written.
        tokio::time::sleep(horizon + Duration::from_secs(2)).await;
        phase.webhooks = Some(received.lock().expect("receiver state").clone());
    }
    let healthz = healthz_rate(&target.base, args.clients(), args.healthz_duration).await;
    let peak_rss_kib = target.pid.and_then(|pid| memory_kib(pid, "VmHWM:"));
    let mut report = Report::new(args, &phase, healthz, peak_rss_kib);
    if let Some(holder) = holder {
        stop_service(holder);
    }
    if let Some(service) = service {
        let embedded = elasticsearch.is_none();
        let preloaded = service.preloaded.clone();
        let dir = service.dir.path().to_owned();
        let bytes = stop_service(service);
        if embedded {
            report.add_store_size(preloaded, bytes);
            preload::count_run(&dir, report.terminal());
        }
    }
    report
}

/// Waits until the service at `base` holds its receiver's delivery lease.
async fn wait_for_the_lease(base: &str) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let scrape = Scrape::take(&client, base).await;
        if scrape.sum("webhook_lease_held", all) >= 1.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the first service did not take the receiver's lease within 60 s");
}

/// Stops the service with SIGTERM and waits for it; returns the size of its data directory
/// then (the embedded store checkpoints as it closes).
fn stop_service(mut service: Service) -> u64 {
    let _ = Command::new("kill")
        .args(["-TERM", &service.pid().to_string()])
        .status();
    let _ = service.child.wait();
    preload::dir_bytes(service.dir.path())
}

/// One run of the benchmark as `args` say: the emulator (if asked for), the service, the
/// load; stopped again after.
fn measure(args: &Args) -> Report {
    let emulator = args.emulator.then(|| Emulator::start(args.shard_op_cost));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let report = runtime.block_on(run(args, emulator.as_ref()));
    drop(runtime);
    if let Some(emulator) = emulator {
        emulator.stop();
    }
    report
}

fn main() {
    let args = Args::parse();
    if let Some(url) = &args.url {
        if let Err(error) = Connection::to(url) {
            eprintln!("--url: {error}");
            std::process::exit(2);
        }
    }
    if args.shards.is_some() && !args.on_engine() {
        eprintln!("--shards: needs --emulator or --elasticsearch");
        std::process::exit(2);
    }
    if let Some(counts) = &args.shard_series {
        series::run(&args, counts);
        return;
    }
    let report = measure(&args);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report as JSON")
        );
    } else {
        report.print_table();
    }
}

/// `cargo test --release --example bench`
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_add_utime_and_stime_after_a_command_name_with_spaces() {
        let stat = "4242 (transfer (x) svc) S 1 2 3 4 5 6 7 8 9 10 1500 250 11 12 20 0 9 0";
        assert_eq!(cpu_ticks(stat), Some(1750));
    }

    #[test]
    fn the_machine_is_busy_but_when_idle_or_waiting_for_io() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let line = "cpu  100 20 30 5000 40 1 2 3 7 8";
        assert_eq!(busy_ticks(line), Some(100 + 20 + 30 + 1 + 2 + 3));
        assert_eq!(busy_ticks("intr 1 2 3"), None);
        assert!(machine_busy().is_some());
    }

    #[test]
    fn cpu_time_of_this_process_is_readable() {
        assert!(cpu_time(std::process::id()).is_some());
    }

    #[test]
    fn batch_items_are_counted_as_accepted_shed_or_refused() {
        let items: Vec<BatchItem> = [201, 200, 409, 503, 422, 201]
            .into_iter()
            .map(|status| BatchItem { status })
            .collect();
        let Outcome::Answered {
            accepted,
            shed,
            refused,
        } = outcome_of_items(&items)
        else {
            panic!("a 200 with items is answered");
        };
        assert_eq!((accepted, shed, refused), (3, 1, 2));
    }

    #[test]
    fn quantiles_interpolate_within_a_bucket() {
        let buckets = [(0.1, 10.0), (0.2, 30.0), (f64::INFINITY, 30.0)];
        // The median is the 15th of 30: a quarter of the way through the (0.1, 0.2] bucket.
        let median = quantile_of_buckets(&buckets, 0.5).unwrap();
        assert!((median - 0.125).abs() < 1e-9, "{median}");
        assert_eq!(quantile_of_buckets(&[(1.0, 0.0)], 0.5), None);
    }

    #[test]
    fn a_histogram_quantile_adds_up_the_buckets_of_the_label_sets_it_keeps() {
        let text = "\
# TYPE latency histogram
latency_bucket{status=\"201\",le=\"0.1\"} 10
latency_bucket{status=\"201\",le=\"0.2\"} 10
latency_bucket{status=\"201\",le=\"+Inf\"} 10
latency_sum{status=\"201\"} 0.5
latency_count{status=\"201\"} 10
latency_bucket{status=\"202\",le=\"0.1\"} 0
latency_bucket{status=\"202\",le=\"0.2\"} 10
latency_bucket{status=\"202\",le=\"+Inf\"} 10
latency_sum{status=\"202\"} 1.5
latency_count{status=\"202\"} 10
latency_bucket{status=\"503\",le=\"0.1\"} 1000
latency_bucket{status=\"503\",le=\"0.2\"} 1000
latency_bucket{status=\"503\",le=\"+Inf\"} 1000
latency_sum{status=\"503\"} 1
latency_count{status=\"503\"} 1000
";
        let scrape = Scrape(parse_prometheus(text).unwrap());
        let accepted = |labels: &Labels| labels.get("status").is_some_and(|s| s.starts_with('2'));
        // 20 samples, 10 in each bucket: the median is the top of the first; the 503s, a
        // thousand at the bottom, do not count.
        let median = scrape.histogram_quantile("latency", accepted, 0.5).unwrap();
        assert!((median - 0.1).abs() < 1e-9, "{median}");
        let p90 = scrape.histogram_quantile("latency", accepted, 0.9).unwrap();
        assert!((p90 - 0.18).abs() < 1e-9, "{p90}");
        assert_eq!(scrape.histogram_quantile("latency", |_| false, 0.5), None);
    }
}
