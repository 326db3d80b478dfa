//! Real processes: the `transfer-service` binary is started, loaded by concurrent clients,
//! killed with SIGKILL and restarted; afterwards every accepted transfer must be terminal,
//! balances exact, pending lists empty, and `transfer-service audit` clean.
//!
//! Lengths are kept short for `cargo test`; the acceptance runs of the README set
//! `CRASH_SECONDS`, `CRASH_CLIENTS` and `CRASH_KILLS` (e.g. 20, 16, 10).
//!
//! A binary of its own: folded into the HTTP binary it saved nothing (its three tests take
//! about 20 s either way), and the long runs below keep their own `--test process`.

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use transfer_service::store::embedded::EmbeddedStore;
use transfer_service::store::{Index, Store};

const BIN: &str = env!("CARGO_BIN_EXE_transfer-service");
const ACCOUNTS: usize = 20;
const OPENING: i64 = 1_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A running service process.
struct Service {
    child: Child,
    base: String,
}

impl Service {
    /// Starts the binary on port 0 and waits for the address it logs when serving.
    fn start(env: &[(&str, String)]) -> Service {
        let mut command = Command::new(BIN);
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("LISTEN_ADDR", "127.0.0.1:0")
            .env("LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .env("RECOVERY_INTERVAL", "200ms")
            .env("RECOVERY_STALE_AFTER", "1s")
            .env("LEASE_DURATION", "1s")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("start transfer-service");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if !sent {
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        if v["message"] == "serving" {
                            let _ = tx.send(v["addr"].as_str().unwrap_or_default().to_owned());
                            sent = true;
                        }
                    }
                }
                if std::env::var("TEST_LOG").is_ok() {
                    eprintln!("{line}");
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("service did not start serving");
        Service {
            child,
            base: format!("http://{addr}"),
        }
    }

    fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().unwrap();
    }

    /// SIGTERM, then the exit status and how long it took.
    fn terminate(mut self) -> (std::process::ExitStatus, Duration) {
        let started = Instant::now();
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, started.elapsed());
            }
            assert!(Instant::now() < deadline, "no exit 30 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn audit(env: &[(&str, String)]) -> (bool, String) {
    let mut command = Command::new(BIN);
    command.arg("audit").env("RUST_LOG", "warn");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().expect("run audit");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// What the clients asked for, by transfer id: (from, to, amount, answered). `answered` is
/// false while no POST of that id got a 200/201 answer.
type Requests = Arc<Mutex<HashMap<String, (usize, usize, i64, bool)>>>;

async fn post(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    body: &Value,
) -> Option<(u16, Value)> {
    let response = client
        .post(format!("{base}{path}"))
        .json(body)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.json().await.unwrap_or(Value::Null)))
}

async fn open_accounts(client: &reqwest::Client, base: &str) {
    for i in 0..ACCOUNTS {
        let (status, body) = post(
            client,
            base,
            "/accounts",
            &json!({"id": format!("acct{i}"), "balance": OPENING}),
        )
        .await
        .expect("open account");
        assert!(status == 201 || status == 200, "{status} {body}");
    }
}

/// `clients` tasks post random transfers (with replays and cancels) to whichever service
/// `bases` names, until `until`. Every id attempted is recorded, answered or not.
async fn run_clients(
    clients: usize,
    until: Instant,
    bases: Arc<RwLock<Vec<String>>>,
    requests: Requests,
    seed: u64,
) {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let bases = bases.clone();
        let requests = requests.clone();
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut rng = StdRng::seed_from_u64(seed ^ (c as u64) << 32);
            let mut mine: Vec<String> = Vec::new();
            let mut n = 0;
            while Instant::now() < until {
                let base = {
                    let bases = bases.read().unwrap();
                    bases[rng.random_range(0..bases.len())].clone()
                };
                let roll = rng.random_range(0..10);
                if roll == 0 && !mine.is_empty() {
                    let id = mine[rng.random_range(0..mine.len())].clone();
                    let _ = post(&client, &base, &format!("/transfers/{id}/cancel"), &json!({})).await;
                    continue;
                }
                let (id, from, to, amount) = if roll == 1 && !mine.is_empty() {
                    let id = mine[rng.random_range(0..mine.len())].clone();
                    let (f, t, a, _) = requests.lock().unwrap()[&id];
                    (id, f, t, a)
                } else {
                    n += 1;
                    let from = rng.random_range(0..ACCOUNTS);
                    let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
                    (format!("c{c}-{n}"), from, to, rng.random_range(1..200))
                };
                requests
                    .lock()
                    .unwrap()
                    .entry(id.clone())
                    .or_insert((from, to, amount, false));
                if !mine.contains(&id) {
                    mine.push(id.clone());
                }
                let body = json!({"id": id, "from": format!("acct{from}"), "to": format!("acct{to}"), "amount": amount});
                match post(&client, &base, "/transfers", &body).await {
                    Some((201 | 200, _)) => {
                        requests.lock().unwrap().get_mut(&id).unwrap().3 = true;
                    }
                    // No answer (the process died) or 503: the outcome is unknown. Back off a
                    // little rather than spin while the service is down.
                    None | Some((503, _)) => tokio::time::sleep(Duration::from_millis(20)).await,
                    Some((status, body)) => panic!("unexpected answer {status}: {body}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Waits until no transfer is in flight, as the service lists them; returns how long it took.
async fn wait_until_nothing_in_flight(base: &str, limit: Duration) -> Duration {
    let client = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let mut in_flight = 0;
        for state in ["created", "pending", "committed", "terminating"] {
            let page: Value = match client
                .get(format!("{base}/transfers?state={state}&limit=10"))
                .send()
                .await
            {
                Ok(r) => r.json().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            };
            in_flight += page["items"].as_array().map_or(1, Vec::len);
        }
        if in_flight == 0 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "transfers still in flight after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// After the chaos: re-post every id whose POST got no answer (an identical replay answers
/// 200 with the transfer; 201 means it was never created and is created now), wait for every
/// transfer to be terminal, and check exact balances and empty pending lists through the API.
async fn settle_and_check(base: &str, requests: &Requests) {
    let client = reqwest::Client::new();
    let requests = requests.lock().unwrap().clone();
    let unanswered = requests.values().filter(|r| !r.3).count();
    for (id, (from, to, amount, answered)) in &requests {
        if *answered {
            continue;
        }
        let body = json!({"id": id, "from": format!("acct{from}"), "to": format!("acct{to}"), "amount": amount});
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match post(&client, base, "/transfers", &body).await {
                Some((200 | 201, _)) => break,
                other => {
                    assert!(Instant::now() < deadline, "cannot re-post {id}: {other:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    let mut expected = [OPENING; ACCOUNTS];
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut finished, mut rolled_back) = (0, 0);
    let mut reasons: HashMap<String, usize> = HashMap::new();
    for (id, (from, to, amount, _)) in &requests {
        let transfer = loop {
            let t: Value = client
                .get(format!("{base}/transfers/{id}?wait=5s"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let state = t["state"].as_str().unwrap().to_owned();
            if state == "finished" || state == "rolled-back" {
                break t;
            }
            assert!(Instant::now() < deadline, "transfer {id} stuck in {state}");
        };
        if transfer["state"] == "finished" {
            finished += 1;
            expected[*from] -= amount;
            expected[*to] += amount;
        } else {
            rolled_back += 1;
            *reasons
                .entry(transfer["reason"].as_str().unwrap_or("?").to_owned())
                .or_default() += 1;
        }
    }
    for (i, want) in expected.iter().enumerate() {
        let account: Value = client
            .get(format!("{base}/accounts/acct{i}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            account["balance"].as_i64(),
            Some(*want),
            "acct{i}: {account}"
        );
        assert_eq!(account["pending_transactions"], json!([]), "acct{i}");
    }
    assert_eq!(expected.iter().sum::<i64>(), OPENING * ACCOUNTS as i64);
    eprintln!(
        "{} transfers ({unanswered} unanswered during the run, re-posted): {finished} finished, \
         {rolled_back} rolled back {reasons:?}; balances exact, pending lists empty",
        requests.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_and_restart_keep_every_invariant() {
    let seconds = env_or("CRASH_SECONDS", 6);
    let clients = env_or("CRASH_CLIENTS", 16) as usize;
    let kills = env_or("CRASH_KILLS", 3);
    let seed = env_or("CRASH_SEED", rand::random::<u32>() as u64);
    eprintln!("seed {seed} (CRASH_SEED to repeat), {seconds} s, {clients} clients, {kills} kills");
    let dir = tempfile::tempdir().unwrap();
    let env = vec![("DATA_DIR", dir.path().display().to_string())];
    let service = Service::start(&env);
    open_accounts(&reqwest::Client::new(), &service.base).await;
    let bases = Arc::new(RwLock::new(vec![service.base.clone()]));
    let requests: Requests = Arc::default();
    let until = Instant::now() + Duration::from_secs(seconds);
    let load = tokio::spawn(run_clients(
        clients,
        until,
        bases.clone(),
        requests.clone(),
        seed,
    ));

    let mut rng = StdRng::seed_from_u64(seed);
    let mut service = Some(service);
    let gap = Duration::from_millis(seconds * 1000 / (kills + 1));
    for _ in 0..kills {
        tokio::time::sleep(gap.mul_f64(rng.random_range(0.5..1.5))).await;
        service.take().unwrap().kill9();
        let next = Service::start(&env);
        *bases.write().unwrap() = vec![next.base.clone()];
        service = Some(next);
    }
    let last_restart = Instant::now();
    load.await.unwrap();
    let service = service.unwrap();
    let took = wait_until_nothing_in_flight(&service.base, Duration::from_secs(60)).await;
    eprintln!(
        "nothing in flight {:?} after the load ended, {:?} after the last restart",
        took,
        last_restart.elapsed()
    );
    settle_and_check(&service.base, &requests).await;
    let (status, took) = service.terminate();
    assert!(status.success(), "graceful exit: {status:?}");
    assert!(took < Duration::from_secs(10), "exit took {took:?}");
    let (clean, report) = audit(&env);
    assert!(clean, "audit found violations:\n{report}");
    assert!(report.contains("in flight 0"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_elasticsearch_share_work_and_survive_one_kill() {
    let seconds = env_or("CRASH_SECONDS", 6);
    let clients = env_or("CRASH_CLIENTS", 16) as usize;
    let seed = env_or("CRASH_SEED", rand::random::<u32>() as u64);
    eprintln!("seed {seed} (CRASH_SEED to repeat)");
    // The emulator (a test double of Elasticsearch) runs in this process and keeps its state
    // while the service processes die.
    let emulator = support::stores::emulator().await;
    let env = vec![
        ("ELASTICSEARCH_URL", emulator.url.clone()),
        ("INDEX_PREFIX", "two-instances-".to_owned()),
    ];
    let first = Service::start(&env);
    let second = Service::start(&env);
    open_accounts(&reqwest::Client::new(), &first.base).await;
    let bases = Arc::new(RwLock::new(vec![first.base.clone(), second.base.clone()]));
    let requests: Requests = Arc::default();
    let until = Instant::now() + Duration::from_secs(seconds);
    let load = tokio::spawn(run_clients(
        clients,
        until,
        bases.clone(),
        requests.clone(),
        seed,
    ));
    tokio::time::sleep(Duration::from_secs(seconds) / 2).await;
    // One instance dies mid-run; the other takes over its transfers once their leases expire.
    first.kill9();
    *bases.write().unwrap() = vec![second.base.clone()];
    load.await.unwrap();
    wait_until_nothing_in_flight(&second.base, Duration::from_secs(60)).await;
    settle_and_check(&second.base, &requests).await;
    let (clean, report) = audit(&env);
    assert!(clean, "audit found violations:\n{report}");
    let (status, _) = second.terminate();
    assert!(status.success());
}

/// SIGTERM under load: the process stops accepting, lets its workers reach a step boundary,
/// releases their leases and exits within 10 s. With 30 s leases, the next process resumes
/// the interrupted transfers at once only because those leases were released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_promptly_and_releases_leases() {
    let dir = tempfile::tempdir().unwrap();
    let env = vec![
        ("DATA_DIR", dir.path().display().to_string()),
        ("LEASE_DURATION", "30s".to_owned()),
        ("RECOVERY_STALE_AFTER", "60s".to_owned()),
    ];
    let service = Service::start(&env);
    let client = reqwest::Client::new();
    open_accounts(&client, &service.base).await;
    let requests: Requests = Arc::default();
    let bases = Arc::new(RwLock::new(vec![service.base.clone()]));
    let until = Instant::now() + Duration::from_millis(1500);
    let load = tokio::spawn(run_clients(16, until, bases, requests.clone(), 7));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (status, took) = service.terminate();
    assert!(status.success(), "exit status {status:?}");
    assert!(took < Duration::from_secs(10), "exit took {took:?}");
    load.await.unwrap();
    // Every transfer the stopped process left in flight has its lease released.
    let in_flight = {
        let store = EmbeddedStore::open(dir.path()).expect("open the store after exit");
        let mut in_flight = 0;
        let mut after: Option<String> = None;
        loop {
            let page = store
                .scan(Index::Transactions, after.as_deref(), 500)
                .await
                .unwrap();
            for doc in page.docs {
                let state = doc.source["transaction_state"].as_str().unwrap_or("");
                if !["finished", "rolled-back"].contains(&state) {
                    in_flight += 1;
                    assert!(
                        doc.source.get("lease_owner").is_none(),
                        "{} left in {state} with its lease held: {}",
                        doc.id,
                        doc.source
                    );
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break in_flight,
            }
        }
    };
    let service = Service::start(&env);
    // Far less than the 30 s lease: only released leases can be resumed this fast.
    let resumed = wait_until_nothing_in_flight(&service.base, Duration::from_secs(10)).await;
    eprintln!(
        "exit {took:?} after SIGTERM; {in_flight} transfers left in flight, leases released, \
         resumed within {resumed:?} of the restart"
    );
    settle_and_check(&service.base, &requests).await;
    service.terminate();
}
