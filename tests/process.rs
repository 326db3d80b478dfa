//! Real processes: the `transfer-service` binary is started, loaded by concurrent clients,
//! killed with SIGKILL and restarted; afterwards every accepted transfer must be terminal,
//! balances exact, pending lists empty, and `transfer-service audit` clean. One of them runs
//! two instances with one wall clock seconds ahead (libfaketime, see `support::faketime`). One
//! reloads its API keys on SIGHUP. The single-process kill -9 run mixes holds (captured whole
//! or in part, cancelled, left to expire in 2 s), multi-leg transactions of 2 to 4 legs (some
//! of them holds, captured whole), transfers the currency rule refuses and metadata into its
//! plain transfers; each ends as its request allows.
//!
//! Lengths are kept short for `cargo test`; the acceptance runs of docs/testing.md set
//! `CRASH_SECONDS`, `CRASH_CLIENTS` and `CRASH_KILLS` (e.g. 20, 16, 10), and `SKEW_SECONDS`
//! and `SKEW_SETTLED_RETENTION` for the skewed run.
//!
//! A binary of its own: folded into the HTTP binary it saved nothing, and the long runs
//! below keep their own `--test process`. Its five tests take about 40 s on 2 cores.

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use transfer_service::store::embedded::EmbeddedStore;
use transfer_service::store::{Index, Store};

use support::feed::{histories_in, FeedReader};

#[path = "process/real_cluster.rs"]
mod real_cluster;

#[path = "process/partitions.rs"]
mod partitions;

#[path = "process/rolling_upgrade.rs"]
mod rolling_upgrade;

#[path = "process/embedded_upgrade.rs"]
mod embedded_upgrade;

#[path = "process/grow_shards.rs"]
mod grow_shards;

#[path = "process/traces.rs"]
mod traces;

const BIN: &str = env!("CARGO_BIN_EXE_transfer-service");

/// The accounts `acct0`… the clients move units between, each opened with `opening`.
#[derive(Debug, Clone, Copy)]
struct Ledger {
    accounts: usize,
    opening: i64,
    /// Whether the clients mix holds, currencies and metadata into the plain transfers
    /// ([`new_request`]); the first half of the accounts is then in USD, the rest has no
    /// currency.
    mixed: bool,
}

/// Twenty accounts of 1,000: contention spread over many accounts.
const SPREAD: Ledger = Ledger {
    accounts: 20,
    opening: 1_000,
    mixed: false,
};

/// [`SPREAD`] with holds, currencies and metadata mixed in, and more to spend (holds keep
/// units reserved while they wait).
const MIXED: Ledger = Ledger {
    opening: 3_000,
    mixed: true,
    ..SPREAD
};

/// How long the holds the clients leave to expire wait.
const SHORT_HOLD: &str = "2s";

/// What the sweep logs (WARN) for each late apply it undoes.
const LATE_APPLY_UNDONE: &str = "a late apply of a terminal transfer was undone";

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
    /// Late applies the sweep undid, counted from the process's log (WARN lines), which,
    /// unlike `/metrics`, outlive a `kill -9`.
    late_applies_undone: Arc<AtomicUsize>,
    /// The messages of the process's log lines, in order.
    messages: Arc<Mutex<Vec<String>>>,
    /// Its last ERROR lines whole (but the `503`s, which tests provoke), shown when a test
    /// fails: a `500` the test saw is explained there.
    errors: Arc<Mutex<std::collections::VecDeque<String>>>,
    /// Its log lines that name a trace (`trace_id`), whole: only a traced service logs them.
    traced: Arc<Mutex<Vec<Value>>>,
}

/// How many of a service's last ERROR lines a failing test shows.
const ERRORS_SHOWN: usize = 20;

/// A service whose test ends (or fails) is stopped with it: a `Child` left running would
/// outlive the test binary, holding ports and CPU on the machine (the real-cluster tests'
/// services did, until this).
impl Drop for Service {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
            for line in errors.iter() {
                eprintln!("{} logged: {line}", self.base);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    /// Starts the binary on port 0 and waits for the address it logs when serving.
    fn start(env: &[(&str, String)]) -> Service {
        Service::start_binary(Path::new(BIN), env)
    }

    /// [`Service::start`] of another build of the service (an older version).
    fn start_binary(bin: &Path, env: &[(&str, String)]) -> Service {
        let mut command = Command::new(bin);
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
        let late_applies_undone = Arc::new(AtomicUsize::new(0));
        let undone = late_applies_undone.clone();
        let messages: Arc<Mutex<Vec<String>>> = Arc::default();
        let logged = messages.clone();
        let errors: Arc<Mutex<std::collections::VecDeque<String>>> = Arc::default();
        let logged_errors = errors.clone();
        let traced: Arc<Mutex<Vec<Value>>> = Arc::default();
        let logged_traced = traced.clone();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if v["level"] == "ERROR" && v["status"] != 503 {
                        let mut errors = logged_errors.lock().unwrap();
                        if errors.len() == ERRORS_SHOWN {
                            errors.pop_front();
                        }
                        errors.push_back(line.clone());
                    }
                    if let Some(message) = v["message"].as_str() {
                        logged.lock().unwrap().push(message.to_owned());
                    }
                    if !sent && v["message"] == "serving" {
                        let _ = tx.send(v["addr"].as_str().unwrap_or_default().to_owned());
                        sent = true;
                    }
                    if v["message"] == LATE_APPLY_UNDONE {
                        undone.fetch_add(1, Ordering::Relaxed);
                    }
                    if line.contains("\"trace_id\"") {
                        logged_traced.lock().unwrap().push(v);
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
            late_applies_undone,
            messages,
            errors,
            traced,
        }
    }

    /// Its log lines so far in trace `trace_id`.
    fn lines_in_trace(&self, trace_id: &str) -> Vec<Value> {
        let traced = self.traced.lock().unwrap();
        traced
            .iter()
            .filter(|line| line["trace_id"] == trace_id)
            .cloned()
            .collect()
    }

    /// Waits until `/readyz` answers 200: on Elasticsearch the process serves before its
    /// migrations are applied (they retry in the background), and refuses writes until then.
    async fn until_ready(&self) {
        let client = reqwest::Client::new();
        let url = format!("{}/readyz", self.base);
        support::wait::eventually("the service to be ready", || async {
            let answer = client.get(&url).send().await;
            answer.is_ok_and(|r| r.status() == 200)
        })
        .await;
    }

    /// Starts the binary and waits until it is ready ([`Service::until_ready`]).
    async fn start_ready(env: &[(&str, String)]) -> Service {
        Service::start_binary_ready(Path::new(BIN), env).await
    }

    /// [`Service::start_ready`] of another build of the service.
    async fn start_binary_ready(bin: &Path, env: &[(&str, String)]) -> Service {
        let service = Service::start_binary(bin, env);
        service.until_ready().await;
        service
    }

    /// Whether the process has logged a line whose message starts with `prefix`.
    fn logged(&self, prefix: &str) -> bool {
        self.messages
            .lock()
            .unwrap()
            .iter()
            .any(|m| m.starts_with(prefix))
    }

    fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().unwrap();
    }

    /// SIGKILL, then a new process started with `env` in its place.
    fn kill9_and_restart(&mut self, env: &[(&str, String)]) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().unwrap();
        *self = Service::start(env);
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

/// What a client means to do with a transfer once created.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Plan {
    /// A plain transfer between accounts of one currency (or none).
    Plain,
    /// A plain transfer the currency rule refuses (accounts of two currencies, or a stated
    /// currency they do not have): it must never finish.
    Mismatch,
    /// A hold (expiring in an hour) the client captures, for `n` units.
    Capture(i64),
    /// A hold (expiring in an hour) the client cancels.
    Cancel,
    /// A hold left to expire ([`SHORT_HOLD`]).
    Expire,
}

/// One transfer the clients asked for.
#[derive(Debug, Clone)]
struct Request {
    /// What it moves, `(from, to, amount)` by account index: the one leg of a plain
    /// `from`/`to`/`amount` body, or each of the body's `legs`.
    legs: Vec<(usize, usize, i64)>,
    /// Its one leg's amount, or the sum of its legs.
    amount: i64,
    /// Whether the body states `legs` (a multi-leg transaction).
    multi_leg: bool,
    plan: Plan,
    /// What is posted, and re-posted as an identical replay.
    body: Value,
    /// False while no POST of that id got a 200/201 answer.
    answered: bool,
}

/// What the clients asked for, by transfer id.
type Requests = Arc<Mutex<HashMap<String, Request>>>;

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

/// POSTs `body` to `{base}{path}` with `headers` until it is answered with something other
/// than a `503` (the store did not answer in time, which a loaded cluster does), as the HTTP
/// contract asks of a client: the same body again, whose id makes the replay safe. A lost
/// answer is asked again too, for up to [`support::wait::DEADLINE`].
async fn post_answered(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let deadline = Instant::now() + support::wait::DEADLINE;
    loop {
        let mut request = client.post(format!("{base}{path}")).json(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let answer = match request.timeout(Duration::from_secs(5)).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                Some((status, response.json().await.unwrap_or(Value::Null)))
            }
            Err(_) => None,
        };
        match answer {
            Some((503, problem)) if Instant::now() < deadline => {
                // Shown if the test fails: why the service could not answer.
                eprintln!("POST {path} answered 503, asking again: {problem}");
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            None if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Some(answered) => return answered,
            None => panic!(
                "POST {path}: no answer within {:?}",
                support::wait::DEADLINE
            ),
        }
    }
}

/// `GET {base}{path}`'s `200` body. A `503` (the store did not answer in time, which a
/// loaded machine sees) or no answer is retried, as the HTTP contract asks, for up to 30 s;
/// any other status fails the test.
async fn get_ok(client: &reqwest::Client, base: &str, path: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = match client.get(format!("{base}{path}")).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                Some((status, response.json().await.unwrap_or(Value::Null)))
            }
            Err(_) => None,
        };
        match answer {
            Some((200, body)) => return body,
            Some((503, _)) | None if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("GET {path}: {other:?}"),
        }
    }
}

async fn open_accounts(client: &reqwest::Client, base: &str, ledger: Ledger) {
    for i in 0..ledger.accounts {
        let mut body = json!({"id": format!("acct{i}"), "balance": ledger.opening});
        if ledger.mixed {
            body["metadata"] = json!({"owner": format!("owner-{}", i % 3)});
            if let Some(currency) = currency_of(ledger, i) {
                body["currency"] = json!(currency);
            }
        }
        // Asked again after a 503, as a caller does: 200 if the first try had opened it.
        let (status, body) = post_answered(client, base, "/accounts", &body, &[]).await;
        assert!(status == 201 || status == 200, "{status} {body}");
    }
}

/// An account's currency in a mixed ledger: USD for the first half, none for the rest.
fn currency_of(ledger: Ledger, account: usize) -> Option<&'static str> {
    (ledger.mixed && account < ledger.accounts / 2).then_some("USD")
}

/// Adds what the plan and the draw ask of a transfer body: a stated currency, the hold and
/// its expiry, and (one in three) metadata.
fn decorate(body: &mut Value, plan: Plan, stated: Option<&str>, rng: &mut impl Rng) {
    let id = body["id"].as_str().unwrap_or_default().to_owned();
    if let Some(currency) = stated {
        body["currency"] = json!(currency);
    }
    match plan {
        Plan::Capture(_) | Plan::Cancel => {
            body["hold"] = json!(true);
            body["hold_expires_in"] = json!("1h");
        }
        Plan::Expire => {
            body["hold"] = json!(true);
            body["hold_expires_in"] = json!(SHORT_HOLD);
        }
        Plan::Plain | Plan::Mismatch => {}
    }
    if rng.random_range(0..3) == 0 {
        body["metadata"] = json!({"order_id": format!("order-{id}"), "channel": "process-test"});
    }
}

/// A new transfer `id` of a client: in a plain ledger, between any two accounts; in a mixed
/// one, mostly between accounts of one currency, with metadata on a third of them, and
/// often a hold (captured whole or in part, cancelled, or left to expire) or a transfer the
/// currency rule refuses; a fifth of them multi-leg ([`multi_leg_request`]).
fn new_request(rng: &mut StdRng, id: &str, ledger: Ledger) -> Request {
    let accounts = ledger.accounts;
    let amount = rng.random_range(1..200);
    let from = rng.random_range(0..accounts);
    if !ledger.mixed {
        let to = (from + rng.random_range(1..accounts)) % accounts;
        let body = json!({"id": id, "from": format!("acct{from}"), "to": format!("acct{to}"), "amount": amount});
        return Request {
            legs: vec![(from, to, amount)],
            amount,
            multi_leg: false,
            plan: Plan::Plain,
            body,
            answered: false,
        };
    }
    // Two halves of one currency each: `to` in `from`'s half, or (a mismatch) the other.
    let half = accounts / 2;
    let same_half =
        |rng: &mut StdRng| from / half * half + (from % half + rng.random_range(1..half)) % half;
    if rng.random_range(0..5) == 0 {
        return multi_leg_request(rng, id, ledger, from);
    }
    let plan = match rng.random_range(0..20) {
        0 | 1 => Plan::Capture(amount),
        2 => Plan::Capture(rng.random_range(1..=amount)),
        3 => Plan::Cancel,
        4 | 5 => Plan::Expire,
        6 => Plan::Mismatch,
        _ => Plan::Plain,
    };
    let (to, stated) = match plan {
        Plan::Mismatch if rng.random_bool(0.5) => ((from + half) % accounts, None),
        Plan::Mismatch => (same_half(rng), Some("EUR")),
        _ => (
            same_half(rng),
            currency_of(ledger, from).filter(|_| rng.random_bool(0.3)),
        ),
    };
    let mut body = json!({"id": id, "from": format!("acct{from}"), "to": format!("acct{to}"), "amount": amount});
    decorate(&mut body, plan, stated, rng);
    Request {
        legs: vec![(from, to, amount)],
        amount,
        multi_leg: false,
        plan,
        body,
        answered: false,
    }
}

/// A multi-leg transaction `id` of 2 to 4 legs starting at `from`, each leg within one
/// currency half (an account may be in several legs): plain, a hold captured whole,
/// cancelled or left to expire, or (a mismatch) with one leg into the other half or a
/// stated currency its accounts do not have.
fn multi_leg_request(rng: &mut StdRng, id: &str, ledger: Ledger, from: usize) -> Request {
    let accounts = ledger.accounts;
    let half = accounts / 2;
    let partner = |rng: &mut StdRng, a: usize| {
        a / half * half + (a % half + rng.random_range(1..half)) % half
    };
    let plan = match rng.random_range(0..10) {
        0 | 1 => Plan::Capture(0),
        2 => Plan::Cancel,
        3 => Plan::Expire,
        4 => Plan::Mismatch,
        _ => Plan::Plain,
    };
    let mut legs = Vec::new();
    for i in 0..rng.random_range(2..=4) {
        // The first leg leaves `from`; the others leave `from` again or any account of its
        // half.
        let f = if i == 0 || rng.random_bool(0.3) {
            from
        } else {
            partner(rng, from)
        };
        legs.push((f, partner(rng, f), rng.random_range(1..100)));
    }
    let mut stated = currency_of(ledger, from).filter(|_| rng.random_bool(0.3));
    if plan == Plan::Mismatch {
        if rng.random_bool(0.5) {
            let last = legs.last_mut().unwrap();
            last.1 = (last.0 + half) % accounts;
        } else {
            stated = Some("EUR");
        }
    }
    let amount: i64 = legs.iter().map(|l| l.2).sum();
    let plan = match plan {
        Plan::Capture(_) => Plan::Capture(amount),
        other => other,
    };
    let body_legs: Vec<Value> = legs
        .iter()
        .map(|(f, t, n)| json!({"from": format!("acct{f}"), "to": format!("acct{t}"), "amount": n}))
        .collect();
    let mut body = json!({"id": id, "legs": body_legs});
    decorate(&mut body, plan, stated, rng);
    Request {
        legs,
        amount,
        multi_leg: true,
        plan,
        body,
        answered: false,
    }
}

/// What a client's capture (its planned amount) or cancel of a hold posts.
fn resolution(id: &str, request: &Request) -> Option<(String, Value)> {
    match request.plan {
        Plan::Capture(n) if n == request.amount => {
            Some((format!("/transfers/{id}/capture"), json!({})))
        }
        Plan::Capture(n) => Some((format!("/transfers/{id}/capture"), json!({"amount": n}))),
        Plan::Cancel => Some((format!("/transfers/{id}/cancel"), json!({}))),
        _ => None,
    }
}

/// [`run_clients`] in the background, recording into requests of its own: the requests and
/// the load's task.
fn start_load(
    clients: usize,
    until: Instant,
    bases: &Arc<RwLock<Vec<String>>>,
    seed: u64,
    ledger: Ledger,
) -> (Requests, tokio::task::JoinHandle<()>) {
    let requests: Requests = Arc::default();
    let load = tokio::spawn(run_clients(
        clients,
        until,
        bases.clone(),
        requests.clone(),
        seed,
        ledger,
    ));
    (requests, load)
}

/// `clients` tasks post random transfers (with replays and cancels) between the accounts of
/// `ledger` to whichever service `bases` names, until `until`. Every id attempted is
/// recorded, answered or not.
async fn run_clients(
    clients: usize,
    until: Instant,
    bases: Arc<RwLock<Vec<String>>>,
    requests: Requests,
    seed: u64,
    ledger: Ledger,
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
                    let _ = post(
                        &client,
                        &base,
                        &format!("/transfers/{id}/cancel"),
                        &json!({}),
                    )
                    .await;
                    continue;
                }
                if roll == 2 && ledger.mixed && !mine.is_empty() {
                    // Capture or cancel a hold of ours as planned (a plain transfer's or an
                    // expiring hold's plan has none); 409 when it rolled back first.
                    let id = mine[rng.random_range(0..mine.len())].clone();
                    let planned = resolution(&id, &requests.lock().unwrap()[&id]);
                    if let Some((path, body)) = planned {
                        match post(&client, &base, &path, &body).await {
                            None | Some((200 | 404 | 409 | 503, _)) => {}
                            Some((status, body)) => panic!("{path}: {status} {body}"),
                        }
                    }
                    continue;
                }
                let id = if roll == 1 && !mine.is_empty() {
                    mine[rng.random_range(0..mine.len())].clone()
                } else {
                    n += 1;
                    let id = format!("c{c}-{n}");
                    let request = new_request(&mut rng, &id, ledger);
                    requests.lock().unwrap().insert(id.clone(), request);
                    mine.push(id.clone());
                    id
                };
                let body = requests.lock().unwrap()[&id].body.clone();
                match post(&client, &base, "/transfers", &body).await {
                    Some((201 | 200, _)) => {
                        requests.lock().unwrap().get_mut(&id).unwrap().answered = true;
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

/// Re-posts every id whose POST got no answer (an identical replay answers 200 with the
/// transfer; 201 means it was never created and is created now); returns how many.
async fn repost_unanswered(base: &str, requests: &Requests) -> usize {
    let client = reqwest::Client::new();
    let requests = requests.lock().unwrap().clone();
    let mut unanswered = 0;
    for (id, request) in &requests {
        if request.answered {
            continue;
        }
        unanswered += 1;
        let body = &request.body;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match post(&client, base, "/transfers", body).await {
                Some((200 | 201, _)) => break,
                other => {
                    assert!(Instant::now() < deadline, "cannot re-post {id}: {other:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    unanswered
}

/// Posts every planned capture and cancel of a hold (what a client does once it knows what
/// the hold was for), [`POLLERS`] at a time, until each is answered `200` or `409` (the hold
/// rolled back first: a client's cancel, insufficient funds); returns how many were posted.
/// A capture waits for the commit, so the holds a killed process left waiting are taken
/// over and committed first.
async fn resolve_holds(base: &str, requests: &Requests) -> usize {
    let planned: Vec<(String, Value)> = {
        let requests = requests.lock().unwrap();
        requests
            .iter()
            .filter_map(|(id, request)| resolution(id, request))
            .collect()
    };
    let count = planned.len();
    let mut tasks = Vec::new();
    for share in planned.chunks(count.div_ceil(POLLERS).max(1)) {
        let (base, share) = (base.to_owned(), share.to_vec());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            for (path, body) in share {
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    match post(&client, &base, &path, &body).await {
                        Some((200 | 409, _)) => break,
                        other => {
                            assert!(Instant::now() < deadline, "{path}: {other:?}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    count
}

/// What the transfers ended as, and the balances that follow from it.
struct Outcome {
    transfers: usize,
    finished: usize,
    rolled_back: usize,
    reasons: HashMap<String, usize>,
    /// Each account's opening balance moved by every `finished` transfer.
    expected: Vec<i64>,
    /// How the holds and the transfers the currency rule refuses ended, by plan.
    mixed: std::collections::BTreeMap<String, usize>,
}

/// A plan without its amount, for counting.
struct PlanKind(Plan);

impl std::fmt::Debug for PlanKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Plan::Plain => "plain",
            Plan::Mismatch => "between currencies",
            Plan::Capture(_) => "hold to capture",
            Plan::Cancel => "hold to cancel",
            Plan::Expire => "hold to expire",
        })
    }
}

/// A terminal transfer ended as its request allows: the currency rule (a transfer between
/// currencies never finishes, and only such a transfer rolls back with
/// `currency_mismatch`); a hold finishes only by the client's capture, with the amount
/// planned, never times out, and only an expiring one expires; currency and metadata are
/// the request's.
fn check_as_planned(id: &str, request: &Request, transfer: &Value) {
    let finished = transfer["state"] == "finished";
    let reason = transfer["reason"].as_str();
    let hold = request.body["hold"] == json!(true);
    assert_eq!(transfer["hold"] == json!(true), hold, "{id}: {transfer}");
    if reason == Some("currency_mismatch") {
        assert_eq!(
            request.plan,
            Plan::Mismatch,
            "{id}: in one currency: {transfer}"
        );
    }
    match request.plan {
        Plan::Mismatch => assert!(!finished, "{id} finished between currencies: {transfer}"),
        Plan::Capture(n) if finished => {
            assert_eq!(transfer["captured_amount"], json!(n), "{id}: {transfer}")
        }
        Plan::Cancel | Plan::Expire => assert!(!finished, "{id} finished uncaptured: {transfer}"),
        Plan::Plain | Plan::Capture(_) => {}
    }
    if hold {
        assert_ne!(
            reason,
            Some("timed_out"),
            "{id}: TRANSFER_TIMEOUT applied to a hold"
        );
    } else {
        assert!(
            transfer.get("captured_amount").is_none_or(Value::is_null),
            "{id}: {transfer}"
        );
    }
    if reason == Some("expired") {
        assert_eq!(
            request.plan,
            Plan::Expire,
            "{id} expired before its hour: {transfer}"
        );
    }
    let legs: Vec<Value> = request
        .legs
        .iter()
        .map(|(f, t, n)| json!({"from": format!("acct{f}"), "to": format!("acct{t}"), "amount": n}))
        .collect();
    assert_eq!(
        transfer["legs"],
        json!(legs),
        "{id}: legs as requested: {transfer}"
    );
    if request.multi_leg {
        if let Some(n) = transfer["captured_amount"].as_i64() {
            assert_eq!(n, request.amount, "{id}: a multi-leg hold captured in part");
        }
    }
    for field in ["currency", "metadata"] {
        let sent = request.body.get(field).filter(|v| !v.is_null());
        let shown = transfer
            .get(field)
            .filter(|v| !v.is_null() && **v != json!({}));
        assert_eq!(shown, sent, "{id}: {field} as requested: {transfer}");
    }
}

/// How many transfers [`final_states`] long-polls at once.
const POLLERS: usize = 8;

/// Waits (long-polling each transfer, [`POLLERS`] at a time) until every transfer is
/// terminal; returns the outcome.
async fn final_states(base: &str, requests: &Requests, ledger: Ledger) -> Outcome {
    let requests = requests.lock().unwrap().clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    let ids: Vec<String> = requests.keys().cloned().collect();
    let mut pollers = Vec::new();
    for share in ids.chunks(ids.len().div_ceil(POLLERS).max(1)) {
        let (base, share) = (base.to_owned(), share.to_vec());
        pollers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut terminal = Vec::new();
            for id in share {
                let transfer = loop {
                    let t = get_ok(&client, &base, &format!("/transfers/{id}?wait=5s")).await;
                    let state = t["state"].as_str().unwrap().to_owned();
                    if state == "finished" || state == "rolled-back" {
                        break t;
                    }
                    assert!(Instant::now() < deadline, "transfer {id} stuck in {state}");
                };
                terminal.push((id, transfer));
            }
            terminal
        }));
    }
    let mut outcome = Outcome {
        transfers: requests.len(),
        finished: 0,
        rolled_back: 0,
        reasons: HashMap::new(),
        expected: vec![ledger.opening; ledger.accounts],
        mixed: Default::default(),
    };
    for poller in pollers {
        for (id, transfer) in poller.await.unwrap() {
            let request = &requests[&id];
            check_as_planned(&id, request, &transfer);
            let shape = if request.multi_leg { "legs " } else { "" };
            if request.plan != Plan::Plain || request.multi_leg {
                let end = match (
                    transfer["state"].as_str(),
                    transfer["captured_amount"].as_i64(),
                ) {
                    (Some("finished"), Some(n)) if n < request.amount => "hold captured in part",
                    (Some("finished"), Some(_)) => "hold captured whole",
                    (Some("finished"), None) => "finished",
                    _ => transfer["reason"].as_str().unwrap_or("?"),
                };
                *outcome
                    .mixed
                    .entry(format!("{shape}{:?}: {end}", PlanKind(request.plan)))
                    .or_default() += 1;
            }
            if transfer["state"] == "finished" {
                // Each leg as requested; a captured one-leg hold moves its captured amount
                // (a multi-leg hold is captured whole, checked above).
                outcome.finished += 1;
                for &(from, to, amount) in &request.legs {
                    let moved = if request.multi_leg {
                        amount
                    } else {
                        transfer["captured_amount"].as_i64().unwrap_or(amount)
                    };
                    outcome.expected[from] -= moved;
                    outcome.expected[to] += moved;
                }
            } else {
                outcome.rolled_back += 1;
                *outcome
                    .reasons
                    .entry(transfer["reason"].as_str().unwrap_or("?").to_owned())
                    .or_default() += 1;
            }
        }
    }
    assert_eq!(
        outcome.expected.iter().sum::<i64>(),
        ledger.opening * ledger.accounts as i64,
        "units conserved"
    );
    outcome
}

/// Every account's balance, as the service at `base` answers it, is `expected`, and its
/// pending list is empty.
async fn assert_exact(base: &str, expected: &[i64]) {
    let client = reqwest::Client::new();
    for (i, want) in expected.iter().enumerate() {
        let account = get_ok(&client, base, &format!("/accounts/acct{i}")).await;
        assert_eq!(
            account["balance"].as_i64(),
            Some(*want),
            "acct{i}: {account}"
        );
        assert_eq!(account["pending_transactions"], json!([]), "acct{i}");
    }
}

/// `GET /transfers?metadata.order_id=…` finds, after the kills, the one transfer posted with
/// that order id (the first such request's).
async fn assert_metadata_filter_finds(base: &str, requests: &Requests) {
    let labelled = {
        let requests = requests.lock().unwrap();
        let mut ids: Vec<&String> = requests
            .iter()
            .filter(|(_, r)| r.body.get("metadata").is_some())
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        ids.first().map(|id| id.to_string())
    };
    let Some(id) = labelled else {
        return;
    };
    let client = reqwest::Client::new();
    let page = get_ok(
        &client,
        base,
        &format!("/transfers?metadata.order_id=order-{id}"),
    )
    .await;
    let found: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(found, [id.as_str()], "{page}");
}

/// Webhooks to `receiver` (which the test makes fail part of the time), with timers for
/// tests: attempts time out after 300 ms, retries wait up to 20 ms × 2^n, at most 200 ms.
fn webhook_env(receiver: &support::receiver::Receiver) -> Vec<(&'static str, String)> {
    vec![
        ("WEBHOOK_URL", receiver.url()),
        ("WEBHOOK_SECRET", support::receiver::SECRET.to_owned()),
        ("WEBHOOK_TIMEOUT", "300ms".to_owned()),
        ("WEBHOOK_BACKOFF_MIN", "20ms".to_owned()),
        ("WEBHOOK_BACKOFF_MAX", "200ms".to_owned()),
    ]
}

/// The receiver ends with the terminal event of every transfer the clients asked for (the
/// default `WEBHOOK_EVENTS`), as `GET /transfers/{id}` shows it, and nothing else; every
/// request it got is signed; repeats only by id. Returns (deliveries, distinct events).
async fn assert_every_terminal_event_delivered(
    base: &str,
    requests: &Requests,
    receiver: &support::receiver::Receiver,
) -> (usize, usize) {
    let ids: Vec<String> = requests.lock().unwrap().keys().cloned().collect();
    let client = reqwest::Client::new();
    let mut expected = std::collections::BTreeMap::new();
    for id in ids {
        let transfer = get_ok(&client, base, &format!("/transfers/{id}")).await;
        let state = transfer["state"].as_str().unwrap();
        assert!(state == "finished" || state == "rolled-back", "{transfer}");
        expected.insert(id.clone(), vec![format!("{id}/transfer.{state}")]);
    }
    let want: Vec<&String> = expected.values().flatten().collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = receiver.delivered_ids();
        let missing = want.iter().filter(|id| !got.contains(**id)).count();
        if missing == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} of {} terminal events not delivered",
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    support::receiver::check_deliveries(receiver, &expected)
}

/// After the chaos: re-post every id whose POST got no answer, wait for every transfer to be
/// terminal, and check exact balances and empty pending lists through the API.
/// A consumer of `GET /events` from the start, reading from whichever instance is up and
/// keeping its cursor across kills, until `stop` is set.
fn follow_feed(
    bases: Arc<RwLock<Vec<String>>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<FeedReader> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut reader = FeedReader::new(50);
        while !stop.load(Ordering::Relaxed) {
            let base = bases.read().unwrap()[0].clone();
            if reader
                .try_read_page(&client, &base, "500ms")
                .await
                .is_none()
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        reader
    })
}

/// Every transfer id the clients asked for.
fn requested_ids(requests: &Requests) -> Vec<String> {
    requests.lock().unwrap().keys().cloned().collect()
}

async fn settle_and_check(base: &str, requests: &Requests, ledger: Ledger) {
    let unanswered = repost_unanswered(base, requests).await;
    let outcome = final_states(base, requests, ledger).await;
    assert_exact(base, &outcome.expected).await;
    eprintln!(
        "{} transfers ({unanswered} unanswered during the run, re-posted): {} finished, \
         {} rolled back {:?}; holds and currencies {:?}; balances exact, pending lists empty",
        outcome.transfers, outcome.finished, outcome.rolled_back, outcome.reasons, outcome.mixed
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
    // A webhook receiver that fails one request in three, across every kill.
    let receiver = support::receiver::Receiver::start().await;
    receiver.fail_every(3);
    let mut env = vec![("DATA_DIR", dir.path().display().to_string())];
    env.extend(webhook_env(&receiver));
    // Every other instance never checkpoints on its own: everything it acknowledges is in
    // the write-ahead log only, and the next start must replay all of it. The others
    // checkpoint as by default, so a kill may also land in or between checkpoints.
    let checkpoints = |start: usize| {
        let interval = ["1h", "50ms"][start % 2];
        let mut env = env.clone();
        env.push(("EMBEDDED_CHECKPOINT_INTERVAL", interval.to_owned()));
        env
    };
    let service = Service::start(&checkpoints(0));
    open_accounts(&reqwest::Client::new(), &service.base, MIXED).await;
    let bases = Arc::new(RwLock::new(vec![service.base.clone()]));
    let until = Instant::now() + Duration::from_secs(seconds);
    let (requests, load) = start_load(clients, until, &bases, seed, MIXED);

    let stop_feed = Arc::new(AtomicBool::new(false));
    let feed = follow_feed(bases.clone(), stop_feed.clone());

    let mut rng = StdRng::seed_from_u64(seed);
    let mut service = Some(service);
    let gap = Duration::from_millis(seconds * 1000 / (kills + 1));
    for kill in 0..kills {
        tokio::time::sleep(gap.mul_f64(rng.random_range(0.5..1.5))).await;
        service.take().unwrap().kill9();
        let next = Service::start(&checkpoints(kill as usize + 1));
        if kill == 0 {
            // The first instance never checkpointed and always wrote (it opened the
            // accounts): what it acknowledged was in the log only. (A later "1h" instance
            // may start after the load ended and write nothing, so only this one is sure.)
            assert!(
                next.logged("embedded store: write-ahead log replayed"),
                "start {} did not replay the log",
                kill + 1
            );
        }
        *bases.write().unwrap() = vec![next.base.clone()];
        service = Some(next);
    }
    let last_restart = Instant::now();
    load.await.unwrap();
    let service = service.unwrap();
    // Every transfer exists; the holds still waiting are captured or cancelled as planned,
    // and those left to expire do (within SHORT_HOLD plus recovery).
    repost_unanswered(&service.base, &requests).await;
    let resolved = resolve_holds(&service.base, &requests).await;
    let took = wait_until_nothing_in_flight(&service.base, Duration::from_secs(60)).await;
    eprintln!(
        "{resolved} captures and cancels posted after the load; nothing in flight {:?} \
         later, {:?} after the last restart",
        took,
        last_restart.elapsed()
    );
    settle_and_check(&service.base, &requests, MIXED).await;
    assert_metadata_filter_finds(&service.base, &requests).await;
    stop_feed.store(true, Ordering::Relaxed);
    let mut feed = feed.await.unwrap();
    // Nothing is in flight: the end of the (exact) embedded feed is the end of every history.
    feed.read_to_the_end(&reqwest::Client::new(), &service.base)
        .await;
    let (deliveries, events) =
        assert_every_terminal_event_delivered(&service.base, &requests, &receiver).await;
    eprintln!(
        "webhooks: {events} terminal events delivered ({deliveries} deliveries, {} requests)",
        receiver.requests().len()
    );
    let (status, took) = service.terminate();
    assert!(status.success(), "graceful exit: {status:?}");
    assert!(took < Duration::from_secs(10), "exit took {took:?}");
    let (clean, report) = audit(&env);
    assert!(clean, "audit found violations:\n{report}");
    assert!(report.contains("in flight 0"), "{report}");
    let store = EmbeddedStore::open(dir.path()).expect("open the store after exit");
    let expected = histories_in(&store, &requested_ids(&requests)).await;
    feed.log.assert_complete(&expected);
    eprintln!(
        "the feed consumer, across {kills} kills, saw all {} events of {} transfers in order \
         ({} deliveries)",
        feed.log.distinct(),
        expected.len(),
        feed.log.received
    );
}

/// On the emulator (a test double of Elasticsearch), which runs in this process and keeps its
/// state while the service processes die.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_elasticsearch_share_work_and_survive_one_kill() {
    let emulator = support::stores::emulator().await;
    two_instances_share_work_and_survive_one_kill(&emulator.url, "two-instances-").await;
}

/// The same on a real Elasticsearch cluster (`tools/es-cluster/run`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_real_elasticsearch_share_work_and_survive_one_kill() {
    let Some(url) = support::cluster::shared() else {
        return;
    };
    let prefix = support::stores::unique_prefix("two-instances");
    two_instances_share_work_and_survive_one_kill(&url, &prefix).await;
}

async fn two_instances_share_work_and_survive_one_kill(url: &str, prefix: &str) {
    let seconds = env_or("CRASH_SECONDS", 6);
    let clients = env_or("CRASH_CLIENTS", 16) as usize;
    let seed = env_or("CRASH_SEED", rand::random::<u32>() as u64);
    eprintln!("seed {seed} (CRASH_SEED to repeat)");
    // One webhook receiver for both, failing one request in three.
    let receiver = support::receiver::Receiver::start().await;
    receiver.fail_every(3);
    let mut env = vec![
        ("ELASTICSEARCH_URL", url.to_owned()),
        ("INDEX_PREFIX", prefix.to_owned()),
        (
            "ELASTICSEARCH_SHARDS",
            support::cluster::shards().to_string(),
        ),
    ];
    env.extend(webhook_env(&receiver));
    let first = Service::start_ready(&env).await;
    let second = Service::start_ready(&env).await;
    open_accounts(&reqwest::Client::new(), &first.base, SPREAD).await;
    let bases = Arc::new(RwLock::new(vec![first.base.clone(), second.base.clone()]));
    // A feed consumer reads from the first instance until it dies, then from the second.
    let stop_feed = Arc::new(AtomicBool::new(false));
    let feed = follow_feed(bases.clone(), stop_feed.clone());
    let until = Instant::now() + Duration::from_secs(seconds);
    let (requests, load) = start_load(clients, until, &bases, seed, SPREAD);
    tokio::time::sleep(Duration::from_secs(seconds) / 2).await;
    // One instance dies mid-run; the other takes over its transfers once their leases expire.
    first.kill9();
    *bases.write().unwrap() = vec![second.base.clone()];
    load.await.unwrap();
    wait_until_nothing_in_flight(&second.base, Duration::from_secs(60)).await;
    settle_and_check(&second.base, &requests, SPREAD).await;
    // Every terminal event reached the receiver, whichever instance held its lease and
    // despite the kill of one of them (which may have held it).
    let (deliveries, events) =
        assert_every_terminal_event_delivered(&second.base, &requests, &receiver).await;
    eprintln!("webhooks: {events} terminal events delivered ({deliveries} deliveries)");
    let (clean, report) = audit(&env);
    assert!(clean, "audit found violations:\n{report}");
    stop_feed.store(true, Ordering::Relaxed);
    let mut feed = feed.await.unwrap();
    let store = support::stores::es_store_at(url, prefix).await;
    let expected = histories_in(&store, &requested_ids(&requests)).await;
    // Elasticsearch's feed trails by its horizon: read on until every event came.
    feed.read_until_complete_at(&reqwest::Client::new(), &second.base, &expected)
        .await;
    eprintln!(
        "the feed consumer saw all {} events of {} transfers in order ({} deliveries)",
        feed.log.distinct(),
        expected.len(),
        feed.log.received
    );
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
    open_accounts(&client, &service.base, SPREAD).await;
    let bases = Arc::new(RwLock::new(vec![service.base.clone()]));
    let until = Instant::now() + Duration::from_millis(1500);
    let (requests, load) = start_load(16, until, &bases, 7, SPREAD);
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
                let source = doc.source.to_value().unwrap();
                let state = source["transaction_state"].as_str().unwrap_or("");
                if !["finished", "rolled-back"].contains(&state) {
                    in_flight += 1;
                    assert!(
                        source.get("lease_owner").is_none(),
                        "{} left in {state} with its lease held: {}",
                        doc.id,
                        source
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
    settle_and_check(&service.base, &requests, SPREAD).await;
    service.terminate();
}

/// API keys on a real process: without `API_KEYS_FILE` it says at startup that it is open;
/// with one (and `METRICS_REQUIRE_AUTH=true` from the environment), SIGHUP reloads the file,
/// here with a check interval of an hour, so only the signal can have reloaded it, and the
/// process keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_api_keys() {
    let dir = tempfile::tempdir().unwrap();
    let open = Service::start(&[("DATA_DIR", dir.path().join("open").display().to_string())]);
    assert!(
        open.logged("no API keys (API_KEYS_FILE is unset)"),
        "no startup WARN about the open API"
    );
    // Serving requests: its SIGTERM handler is installed.
    get_ok(&reqwest::Client::new(), &open.base, "/livez").await;
    let (status, _) = open.terminate();
    assert!(status.success());

    let old = support::keys::Key {
        name: "ops",
        secret: "process-ops-old-Tq2",
        scopes: "read",
    };
    let new = support::keys::Key {
        name: "ops",
        secret: "process-ops-new-Jd8",
        scopes: "read",
    };
    let file = support::keys::KeyFile::new(&[old]);
    let service = Service::start(&[
        ("DATA_DIR", dir.path().join("keyed").display().to_string()),
        ("API_KEYS_FILE", file.path().display().to_string()),
        ("API_KEYS_RELOAD_INTERVAL", "1h".to_owned()),
        ("METRICS_REQUIRE_AUTH", "true".to_owned()),
    ]);
    assert!(!service.logged("no API keys"));
    let client = reqwest::Client::new();
    let metrics = |key: &'static str| {
        let request = client.get(format!("{}/metrics", service.base));
        async move {
            request
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(metrics(old.secret).await, 200);
    assert_eq!(metrics(new.secret).await, 401);
    let unauthenticated = client
        .get(format!("{}/metrics", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);

    file.replace(&[new]);
    Command::new("kill")
        .args(["-HUP", &service.child.id().to_string()])
        .status()
        .unwrap();
    support::wait::eventually("SIGHUP to reload the keys", || async {
        metrics(new.secret).await == 200
    })
    .await;
    assert_eq!(metrics(old.secret).await, 401);
    support::wait::eventually("the reload's log line", || async {
        service.logged("API keys reloaded")
    })
    .await;
    let (status, _) = service.terminate();
    assert!(status.success(), "{status:?}");
}

/// Four accounts of 10,000: every transfer contends with the others on the same documents.
const HOT: Ledger = Ledger {
    accounts: 4,
    opening: 10_000,
    mixed: false,
};

/// Opens an empty account `probe` through the service at `base` and returns how far ahead
/// of this process's wall clock the service stamped it, at least and at most (milliseconds).
/// A `503` or a lost answer is retried: the replay answers with the account as first stamped.
async fn wall_clock_offset_of(base: &str, probe: &str) -> (i64, i64) {
    let client = reqwest::Client::new();
    let body = json!({"id": probe, "balance": 0});
    let before = std::time::SystemTime::now();
    let account = match post_answered(&client, base, "/accounts", &body, &[]).await {
        (200 | 201, account) => account,
        other => panic!("cannot open the probe account {probe}: {other:?}"),
    };
    let after = std::time::SystemTime::now();
    support::faketime::offset_of(account["created_at"].as_str().unwrap(), before, after)
}

/// Asserts the service at `base` runs with its wall clock `offset` ahead of this process's
/// (to within 100 ms of rounding either way), as its own timestamps show.
async fn assert_wall_clock_offset(base: &str, probe: &str, offset: Duration) {
    let (at_least, at_most) = wall_clock_offset_of(base, probe).await;
    let want = offset.as_millis() as i64;
    assert!(
        at_least - 100 <= want && want <= at_most + 100,
        "{base} stamps {at_least}..{at_most} ms ahead, not {want} ms: is libfaketime working?"
    );
}

async fn scrape(base: &str) -> support::metrics::Exposition {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body");
    support::metrics::Exposition::parse(&text)
}

/// What keeps the two processes from being quiescent: workers running in either, or pending
/// entries on an account (with its balance next to the one the final states expect). `None`
/// when no worker runs and no account has a pending entry.
async fn not_quiescent(bases: &[String], expected: &[i64]) -> Option<String> {
    let mut busy = Vec::new();
    for base in bases {
        let running = scrape(base).await.value("transfers_in_flight", &[]);
        if running != 0.0 {
            busy.push(format!("{base} runs {running} workers"));
        }
    }
    let client = reqwest::Client::new();
    for (i, want) in expected.iter().enumerate() {
        let account: Value = match client
            .get(format!("{}/accounts/acct{i}", bases[0]))
            .send()
            .await
        {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        if account["pending_transactions"] != json!([]) {
            busy.push(format!(
                "acct{i}: balance {} (final states say {want}), pending {}",
                account["balance"], account["pending_transactions"]
            ));
        }
    }
    (!busy.is_empty()).then(|| busy.join("; "))
}

/// How long after every transfer was seen terminal a worker can still write an account: a
/// worker that claimed or renewed its lease before the transfer turned terminal acts until
/// its deadline, at most a lease (1 s here) later, and a write it started may land up to a
/// request timeout (a quarter lease) after that. Its task may also not have taken its first
/// step yet, which `transfers_in_flight` does not count. Two leases cover all of it.
const LATE_WRITES_END: Duration = Duration::from_secs(2);

/// Waits until, [`LATE_WRITES_END`] or more after `terminal_at` (when every transfer was
/// seen terminal), [`not_quiescent`] finds nothing; at most `limit`. Returns how long it
/// took from `terminal_at`.
async fn wait_until_quiescent(
    bases: &[String],
    expected: &[i64],
    terminal_at: Instant,
    limit: Duration,
) -> Duration {
    loop {
        let late_writes_over = terminal_at.elapsed() >= LATE_WRITES_END;
        match not_quiescent(bases, expected).await {
            None if late_writes_over => return terminal_at.elapsed(),
            None => {}
            Some(busy) => assert!(
                terminal_at.elapsed() < limit,
                "after {limit:?}, still not quiescent (has the late-apply sweep run?): {busy}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two instances on one Elasticsearch (the emulator, a test double), one of them with its
/// wall clock several leases ahead, for real (libfaketime; its lease deadlines, on
/// CLOCK_BOOTTIME, are not moved). The instance ahead judges the other's live leases expired
/// (in recovery and in the cancel handler) and settles transfers their holder is still
/// driving; the holder, inside its own deadline, may then apply late. Tombstones are at
/// their minimum (`SETTLED_RETENTION=0s`; `SKEW_SETTLED_RETENTION` sets another): a
/// tombstone is then kept only while its stamp is in the reader's future (written by the
/// clock ahead), so most late applies land instead of being refused, and this run exercises
/// the late-apply sweep, not the tombstones. Both instances are killed with SIGKILL and restarted in turn. Afterwards, once
/// every transfer is terminal, the stale workers' deadlines are over, no worker runs and the
/// sweep has emptied every pending list: exact balances through both APIs, a clean audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_one_wall_clock_seconds_ahead_end_exact_after_the_sweep() {
    let Some(faketime) = support::faketime::library_or_skip("the wall-clock skew test") else {
        return;
    };
    let test_started = Instant::now();
    let seconds = env_or("CRASH_SECONDS", 10);
    let clients = env_or("CRASH_CLIENTS", 16) as usize;
    let kills = env_or("CRASH_KILLS", 3).max(2);
    let offset = Duration::from_secs(env_or("SKEW_SECONDS", 4));
    let retention = std::env::var("SKEW_SETTLED_RETENTION").unwrap_or_else(|_| "0s".to_owned());
    let seed = env_or("CRASH_SEED", rand::random::<u32>() as u64);
    eprintln!(
        "seed {seed} (CRASH_SEED to repeat), {seconds} s, {clients} clients over {} accounts, \
         {kills} kills, one wall clock {offset:?} ahead (lease 1 s), SETTLED_RETENTION={retention}",
        HOT.accounts
    );
    let emulator = support::stores::emulator().await;
    let in_step = vec![
        ("ELASTICSEARCH_URL", emulator.url.clone()),
        ("INDEX_PREFIX", "skewed-".to_owned()),
        ("SETTLED_RETENTION", retention.clone()),
    ];
    let mut ahead = in_step.clone();
    ahead.extend(support::faketime::wall_clock_ahead(&faketime, offset));
    let envs = [in_step.clone(), ahead];

    // [0] in step with this process, [1] ahead; each checked by its own timestamps.
    let mut services = [Service::start(&envs[0]), Service::start(&envs[1])];
    let mut undone_counters: Vec<Arc<AtomicUsize>> = services
        .iter()
        .map(|s| s.late_applies_undone.clone())
        .collect();
    assert_wall_clock_offset(&services[0].base, "probe-in-step", Duration::ZERO).await;
    assert_wall_clock_offset(&services[1].base, "probe-ahead-0", offset).await;
    open_accounts(&reqwest::Client::new(), &services[0].base, HOT).await;

    let bases = Arc::new(RwLock::new(
        services.iter().map(|s| s.base.clone()).collect::<Vec<_>>(),
    ));
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let (requests, load) = start_load(clients, until, &bases, seed, HOT);
    // Kills spread over the load, alternating between the two, the first picked by the seed.
    let mut rng = StdRng::seed_from_u64(seed);
    let first = rng.random_range(0..2);
    let gap = Duration::from_millis(seconds * 1000 / (kills + 1));
    for k in 0..kills as usize {
        tokio::time::sleep(gap.mul_f64(rng.random_range(0.5..1.5))).await;
        let victim = (first + k) % 2;
        services[victim].kill9_and_restart(&envs[victim]);
        undone_counters.push(services[victim].late_applies_undone.clone());
        bases.write().unwrap()[victim] = services[victim].base.clone();
        if victim == 1 {
            let probe = format!("probe-ahead-{}", k + 1);
            assert_wall_clock_offset(&services[1].base, &probe, offset).await;
        }
    }
    load.await.unwrap();
    let (setup_took, load_took) = (started - test_started, started.elapsed());

    // Clients post faster than four hot accounts settle: both processes work through the
    // backlog after the load ends, so the final states take about as long as the load.
    let base = services[0].base.clone();
    let unanswered = repost_unanswered(&base, &requests).await;
    let outcome = final_states(&base, &requests, HOT).await;
    let terminal_at = Instant::now();
    let settle_took = terminal_at - (started + load_took);
    wait_until_nothing_in_flight(&base, Duration::from_secs(30)).await;
    // A late apply can land after its transfer is terminal, until its worker's deadline; the
    // sweep undoes it once it is a lease old. No worker starts on a terminal transfer, so
    // once the deadlines are over, none runs and every pending list is empty, nothing can
    // change the balances any more.
    let both: Vec<String> = services.iter().map(|s| s.base.clone()).collect();
    let limit = Duration::from_secs(30);
    let quiet_took = wait_until_quiescent(&both, &outcome.expected, terminal_at, limit).await;
    let checks_started = Instant::now();
    for base in &both {
        assert_exact(base, &outcome.expected).await;
    }
    let (clean, report) = audit(&in_step);
    assert!(clean, "audit found violations:\n{report}");
    assert!(report.contains("in flight 0"), "{report}");

    let mut compensated = Vec::new();
    for base in &both {
        let metrics = scrape(base).await;
        compensated.push(metrics.value("late_applies_compensated_total", &[]));
    }
    let checks_took = checks_started.elapsed();
    let shutdown_started = Instant::now();
    for service in services {
        let (status, _) = service.terminate();
        assert!(status.success(), "graceful exit: {status:?}");
    }
    let shutdown_took = shutdown_started.elapsed();
    let undone_logged: usize = undone_counters
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum();
    eprintln!(
        "seed {seed}: {} transfers in {load_took:?} ({unanswered} unanswered, re-posted): {} \
         finished, {} rolled back {:?}; late applies compensated: {undone_logged} over all \
         {} processes (their WARN lines), /metrics of the last two: in step {}, ahead {}; \
         quiet {quiet_took:?} after every transfer was terminal (at least {LATE_WRITES_END:?}); \
         balances exact through both APIs, pending lists empty, audit clean; {:?} in all \
         (setup {setup_took:?}, load {load_took:?}, re-posts and final states \
         {settle_took:?}, quiet {quiet_took:?}, checks and audit {checks_took:?}, shutdown \
         {shutdown_took:?})",
        outcome.transfers,
        outcome.finished,
        outcome.rolled_back,
        outcome.reasons,
        undone_counters.len(),
        compensated[0],
        compensated[1],
        test_started.elapsed(),
    );
}

/// The binary allocates with jemalloc, configured by the service (`src/main.rs`): asked to
/// confirm its configuration, jemalloc lists the service's settings as applied.
#[cfg(not(target_env = "msvc"))]
#[test]
fn the_allocator_is_jemalloc_with_the_services_settings() {
    let output = Command::new(BIN)
        .arg("--help")
        .env("_RJEM_MALLOC_CONF", "confirm_conf:true")
        .output()
        .unwrap();
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut settings = vec!["narenas:1", "dirty_decay_ms:1000", "muzzy_decay_ms:0"];
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        settings.push("background_thread:true");
    }
    for setting in settings {
        assert!(
            stderr.contains(&format!("Set conf value: {setting}\n")),
            "jemalloc did not apply {setting}:\n{stderr}"
        );
    }
}
