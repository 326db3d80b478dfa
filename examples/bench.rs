//! Load generator and benchmark for transfer-service (`docs/design.md` §6).
//!
//! ```sh
//! cargo build --release
//! cargo run --release --example bench -- --clients 64 --duration 30s
//! cargo run --release --example bench -- --url http://127.0.0.1:8080      # a running service
//! cargo run --release --example bench -- --elasticsearch http://127.0.0.1:9200
//! ```
//!
//! Without `--url` it starts `target/release/transfer-service` itself (embedded store in a
//! temp dir, or `--elasticsearch`), so it can also read the process's peak memory. It opens
//! `--accounts` accounts with balances large enough that no transfer fails for funds, runs
//! `--clients` concurrent clients posting transfers between random accounts for
//! `--duration`, waits until every accepted transfer is terminal, and prints:
//! - throughput: transfers that reached a terminal state per second (created → finished);
//! - POST latency percentiles measured by the clients;
//! - created → terminal latency percentiles, from the service's `transfer_duration_seconds`
//!   histogram (interpolated within buckets);
//! - store requests per transfer, from `store_requests_total`;
//! - the service's peak and final resident memory (when it started the service).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::{PrometheusType, PrometheusValue};
use rand::Rng;
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(about = "Benchmark transfer-service")]
struct Args {
    /// A running service; if absent, the benchmark starts one.
    #[arg(long)]
    url: Option<String>,
    /// The binary to start when no --url is given.
    #[arg(long, default_value = "target/release/transfer-service")]
    binary: String,
    /// Start the service on this Elasticsearch (or emulator) instead of the embedded store.
    #[arg(long)]
    elasticsearch: Option<String>,
    #[arg(long, default_value_t = 64)]
    clients: usize,
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    #[arg(long, default_value_t = 100)]
    accounts: usize,
}

// ---- setup --------------------------------------------------------------------------------

struct Service {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

fn start_service(args: &Args) -> Service {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = Command::new(&args.binary);
    command
        .env("LISTEN_ADDR", "127.0.0.1:0")
        .env("DATA_DIR", dir.path())
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "warn,transfer_service::app=info")
        .env("INDEX_PREFIX", format!("bench-{}-", std::process::id()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(es) = &args.elasticsearch {
        command.env("ELASTICSEARCH_URL", es);
    }
    let mut child = command.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot start {} ({e}); run `cargo build --release` first",
            args.binary
        )
    });
    let stdout = child.stdout.take().unwrap();
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
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("service did not start");
    Service {
        child,
        base: format!("http://{addr}"),
        _dir: dir,
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

/// Opens `bench-{run}-0` … with balances no transfer of the run can exhaust.
async fn open_accounts(client: &reqwest::Client, base: &str, run: &str, accounts: usize) {
    for i in 0..accounts {
        let response = client
            .post(format!("{base}/accounts"))
            .json(&json!({"id": format!("bench-{run}-{i}"), "balance": 1_000_000_000_000i64}))
            .send()
            .await
            .expect("open account");
        assert!(
            response.status().is_success(),
            "open account: {}",
            response.status()
        );
    }
}

// ---- load ---------------------------------------------------------------------------------

/// What the clients saw while posting.
struct Load {
    /// Latency of every accepted (201) POST, sorted.
    latencies: Vec<Duration>,
    /// POSTs that got no 201.
    errors: u64,
    /// How long the clients posted.
    posting: Duration,
}

/// Runs `args.clients` clients posting transfers between random accounts until `until`.
async fn run_load(args: &Args, client: &reqwest::Client, base: &str, run: &str) -> Load {
    let started = Instant::now();
    let until = started + args.duration;
    let tasks: Vec<_> = (0..args.clients)
        .map(|c| {
            let poster = Poster {
                client: client.clone(),
                base: base.to_owned(),
                run: run.to_owned(),
                accounts: args.accounts,
                client_number: c,
            };
            tokio::spawn(poster.post_until(until))
        })
        .collect();
    let mut load = Load {
        latencies: Vec::new(),
        errors: 0,
        posting: Duration::ZERO,
    };
    for task in tasks {
        let (latencies, errors) = task.await.unwrap();
        load.latencies.extend(latencies);
        load.errors += errors;
    }
    load.posting = started.elapsed();
    load.latencies.sort();
    load
}

/// One client of the load.
struct Poster {
    client: reqwest::Client,
    base: String,
    run: String,
    accounts: usize,
    client_number: usize,
}

impl Poster {
    /// Posts transfers until `until`; returns the accepted POSTs' latencies and the failures.
    async fn post_until(self, until: Instant) -> (Vec<Duration>, u64) {
        let (mut latencies, mut errors) = (Vec::new(), 0);
        let mut n = 0u64;
        while Instant::now() < until {
            n += 1;
            let sent = Instant::now();
            match self
                .client
                .post(format!("{}/transfers", self.base))
                .json(&self.transfer(n))
                .send()
                .await
            {
                Ok(r) if r.status().as_u16() == 201 => latencies.push(sent.elapsed()),
                _ => errors += 1,
            }
        }
        (latencies, errors)
    }

    /// The `n`th transfer of this client, between two distinct random accounts.
    fn transfer(&self, n: u64) -> Value {
        let (from, to) = {
            let mut rng = rand::rng();
            let from = rng.random_range(0..self.accounts);
            (
                from,
                (from + rng.random_range(1..self.accounts)) % self.accounts,
            )
        };
        let run = &self.run;
        json!({
            "id": format!("bench-{run}-{}-{n}", self.client_number),
            "from": format!("bench-{run}-{from}"),
            "to": format!("bench-{run}-{to}"),
            "amount": 1 + n % 100,
        })
    }
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

    /// A quantile of the histogram `name` (one label set), linear within a bucket.
    fn histogram_quantile(&self, name: &str, q: f64) -> Option<f64> {
        let sample = self.0.families.get(name)?.iter_samples().next()?;
        let PrometheusValue::Histogram(histogram) = &sample.value else {
            panic!("{name} is not a histogram");
        };
        let mut buckets: Vec<(f64, f64)> = histogram
            .buckets
            .iter()
            .map(|b| (b.upper_bound, b.count.as_f64()))
            .collect();
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

/// Polls `/metrics` until every transfer created since `before` is terminal (5 minutes at
/// most); returns the last scrape.
async fn wait_drained(client: &reqwest::Client, base: &str, before: &Scrape) -> Scrape {
    let created_before = before.sum("transfers_created_total", all);
    let done_before = completed(before, None);
    let deadline = Instant::now() + Duration::from_secs(300);
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
}

impl Counted {
    fn between(before: &Scrape, after: &Scrape) -> Counted {
        let delta = |f: &dyn Fn(&Scrape) -> f64| f(after) - f(before);
        Counted {
            finished: delta(&|s| completed(s, Some("finished"))),
            rolled_back: delta(&|s| completed(s, Some("rolled-back"))),
            store_requests: delta(&store_requests),
            conflicts: delta(&replace_conflicts),
        }
    }

    fn terminal(&self) -> f64 {
        self.finished + self.rolled_back
    }
}

// ---- report -------------------------------------------------------------------------------

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

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn report(args: &Args, load: &Load, counted: &Counted, after: &Scrape, elapsed: Duration) {
    let accepted = load.latencies.len() as f64;
    let sorted = &load.latencies;
    println!("transfer-service benchmark");
    println!(
        "  setup: {} clients, {} accounts, {:?} of posting, store: {}",
        args.clients,
        args.accounts,
        args.duration,
        args.elasticsearch.as_deref().unwrap_or("embedded")
    );
    println!(
        "  accepted: {accepted} (errors {}), finished {}, rolled back {}",
        load.errors, counted.finished, counted.rolled_back
    );
    println!(
        "  throughput: {:.0} transfers/s to a terminal state ({:.0}/s accepted while posting)",
        counted.terminal() / elapsed.as_secs_f64(),
        accepted / load.posting.as_secs_f64()
    );
    println!(
        "  POST /transfers latency: p50 {:?}  p90 {:?}  p99 {:?}  max {:?}",
        percentile(sorted, 0.5),
        percentile(sorted, 0.9),
        percentile(sorted, 0.99),
        sorted.last().copied().unwrap_or_default()
    );
    let q = |p| {
        after
            .histogram_quantile("transfer_duration_seconds", p)
            .map(|s| format!("{:.1} ms", s * 1000.0))
            .unwrap_or_else(|| "-".into())
    };
    println!(
        "  created → terminal (service histogram, whole run of the process): p50 {}  p90 {}  p99 {}",
        q(0.5),
        q(0.9),
        q(0.99)
    );
    println!(
        "  store requests per transfer: {:.2} (of which conflicts {:.2})",
        counted.store_requests / counted.terminal().max(1.0),
        counted.conflicts / counted.terminal().max(1.0)
    );
}

/// Prints the service's memory, then stops it with SIGTERM.
fn stop_service(service: Service) {
    let pid = service.child.id();
    println!(
        "  service memory: peak RSS {} MiB, RSS now {} MiB",
        memory_kib(pid, "VmHWM:").unwrap_or(0) / 1024,
        memory_kib(pid, "VmRSS:").unwrap_or(0) / 1024
    );
    let mut child = service.child;
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let service = args.url.is_none().then(|| start_service(&args));
    let base = match (&args.url, &service) {
        (Some(url), _) => url.clone(),
        (None, service) => service.as_ref().expect("started").base.clone(),
    };
    let client = reqwest::Client::new();
    wait_ready(&client, &base).await;
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    open_accounts(&client, &base, &run, args.accounts).await;

    let before = Scrape::take(&client, &base).await;
    let started = Instant::now();
    let load = run_load(&args, &client, &base, &run).await;
    let after = wait_drained(&client, &base, &before).await;
    let elapsed = started.elapsed();

    report(
        &args,
        &load,
        &Counted::between(&before, &after),
        &after,
        elapsed,
    );
    if let Some(service) = service {
        stop_service(service);
    }
}
