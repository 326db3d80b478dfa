//! Load generator and benchmark for transfer-service (DESIGN §6).
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

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
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

/// `name{labels}` → value, for every sample of the exposition.
fn scrape(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn sum_of(samples: &HashMap<String, f64>, prefix: &str, exclude: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(k, _)| k.starts_with(prefix) && !exclude.iter().any(|e| k.contains(e)))
        .map(|(_, v)| v)
        .sum()
}

/// A quantile from a Prometheus histogram's cumulative buckets (linear within a bucket).
fn histogram_quantile(samples: &HashMap<String, f64>, name: &str, q: f64) -> Option<f64> {
    let mut buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|(k, v)| {
            let le = k.strip_prefix(&format!("{name}_bucket{{le=\""))?;
            let le = le.strip_suffix("\"}")?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, *v))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for (bound, count) in buckets {
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

async fn metrics(client: &reqwest::Client, base: &str) -> HashMap<String, f64> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .unwrap();
    scrape(&text)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let service = args.url.is_none().then(|| start_service(&args));
    let base = args
        .url
        .clone()
        .unwrap_or_else(|| service.as_ref().unwrap().base.clone());
    let client = reqwest::Client::new();
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
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    for i in 0..args.accounts {
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

    let before = metrics(&client, &base).await;
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(0u64));
    let started = Instant::now();
    let until = started + args.duration;
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let (client, base, run) = (client.clone(), base.clone(), run.clone());
        let (latencies, errors) = (latencies.clone(), errors.clone());
        let accounts = args.accounts;
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut mine = Vec::new();
            while Instant::now() < until {
                n += 1;
                let (from, to) = {
                    let mut rng = rand::rng();
                    let from = rng.random_range(0..accounts);
                    (from, (from + rng.random_range(1..accounts)) % accounts)
                };
                let body = json!({
                    "id": format!("bench-{run}-{c}-{n}"),
                    "from": format!("bench-{run}-{from}"),
                    "to": format!("bench-{run}-{to}"),
                    "amount": 1 + n % 100,
                });
                let sent = Instant::now();
                match client
                    .post(format!("{base}/transfers"))
                    .json(&body)
                    .send()
                    .await
                {
                    Ok(r) if r.status().as_u16() == 201 => mine.push(sent.elapsed()),
                    _ => *errors.lock().unwrap() += 1,
                }
            }
            latencies.lock().unwrap().extend(mine);
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let posting = started.elapsed();
    let accepted = latencies.lock().unwrap().len() as f64;
    // Wait until every accepted transfer is terminal.
    let created_before = before
        .get("transfers_created_total")
        .copied()
        .unwrap_or(0.0);
    let done_before = sum_of(&before, "transfers_completed_total", &[]);
    let drain_deadline = Instant::now() + Duration::from_secs(300);
    let after = loop {
        let now = metrics(&client, &base).await;
        let created = now.get("transfers_created_total").copied().unwrap_or(0.0) - created_before;
        let done = sum_of(&now, "transfers_completed_total", &[]) - done_before;
        if done >= created {
            break now;
        }
        assert!(Instant::now() < drain_deadline, "transfers did not drain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let elapsed = started.elapsed();
    let finished = sum_of(
        &after,
        "transfers_completed_total{outcome=\"finished\"",
        &[],
    ) - sum_of(
        &before,
        "transfers_completed_total{outcome=\"finished\"",
        &[],
    );
    let rolled_back = sum_of(
        &after,
        "transfers_completed_total{outcome=\"rolled-back\"",
        &[],
    ) - sum_of(
        &before,
        "transfers_completed_total{outcome=\"rolled-back\"",
        &[],
    );
    let store_ops = |m: &HashMap<String, f64>| {
        sum_of(
            m,
            "store_requests_total",
            &["op=\"ready\"", "op=\"refresh\"", "op=\"scan\""],
        )
    };
    let store_requests = store_ops(&after) - store_ops(&before);
    let conflicts = sum_of(
        &after,
        "store_requests_total{op=\"replace\",outcome=\"conflict\"",
        &[],
    ) - sum_of(
        &before,
        "store_requests_total{op=\"replace\",outcome=\"conflict\"",
        &[],
    );
    let mut sorted = latencies.lock().unwrap().clone();
    sorted.sort();

    println!("transfer-service benchmark");
    println!(
        "  setup: {} clients, {} accounts, {:?} of posting, store: {}",
        args.clients,
        args.accounts,
        args.duration,
        args.elasticsearch.as_deref().unwrap_or("embedded")
    );
    println!(
        "  accepted: {accepted} (errors {}), finished {finished}, rolled back {rolled_back}",
        errors.lock().unwrap()
    );
    println!(
        "  throughput: {:.0} transfers/s to a terminal state ({:.0}/s accepted while posting)",
        (finished + rolled_back) / elapsed.as_secs_f64(),
        accepted / posting.as_secs_f64()
    );
    println!(
        "  POST /transfers latency: p50 {:?}  p90 {:?}  p99 {:?}  max {:?}",
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.9),
        percentile(&sorted, 0.99),
        sorted.last().copied().unwrap_or_default()
    );
    let q = |p| {
        histogram_quantile(&after, "transfer_duration_seconds", p)
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
        store_requests / (finished + rolled_back).max(1.0),
        conflicts / (finished + rolled_back).max(1.0)
    );
    if let Some(service) = service {
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
}
