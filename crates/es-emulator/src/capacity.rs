//! The capacity model ([`crate::RunningEmulator::set_shard_op_cost`], `--shard-op-cost`):
//! every primary shard is a server of bounded capacity. Each operation on a shard (a bulk
//! item, a single-document index, create, get or delete; one unit per shard for a search,
//! `_count`, refresh or `_stats` request) occupies that shard for the set cost. Operations
//! on one shard are served one after another, different shards in parallel, and a request
//! answers when the last of its operations has been served. So one shard serves at most
//! `1 / cost` operations a second, and N shards N times that: a model of per-shard
//! serialization, for measuring how a client scales with the shard count, not of what a
//! real engine's operations cost (they are applied at once, in memory, as without it).
//!
//! It costs no CPU: a shard keeps when its server is next free, an operation reserves
//! `start = max(now, free)` and moves it to `start + cost`, and the request sleeps until
//! its last reservation ends. The reservations are exact, so a saturated shard serves
//! `1 / cost` a second; the answers are released by an [`Alarm`], one thread parked until
//! the earliest one is due, within about a tenth of a millisecond (tokio's own timer fires
//! on the millisecond, and on this 2-core machine under load 1.2 ms late on average, as long
//! as the operations it would time). The operation takes effect when it is reserved; only
//! its answer waits, as a write on a real primary is visible to a realtime GET before it is
//! acknowledged. A zero cost (the default) turns the model off: nothing is reserved and
//! nothing waits.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long one operation occupies its shard; zero is off.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    op_cost: Duration,
}

impl Capacity {
    pub fn new(op_cost: Duration) -> Self {
        Capacity { op_cost }
    }

    /// Occupies `server` for one operation from now (or from when it is next free) and
    /// makes the request answer no earlier than the operation's end.
    pub fn occupy(&self, server: &mut Server, answer: &AnswerAt) {
        if self.op_cost.is_zero() {
            return;
        }
        answer.not_before(server.reserve(Instant::now(), self.op_cost));
    }
}

/// One shard's server: when it is next free.
#[derive(Debug, Default, Clone, Copy)]
pub struct Server {
    /// `None` until its first operation.
    free_at: Option<Instant>,
}

impl Server {
    /// Reserves the server for `cost` from `now`, or from when it is next free if that is
    /// later; returns when the reservation ends.
    pub fn reserve(&mut self, now: Instant, cost: Duration) -> Instant {
        let start = self.free_at.map_or(now, |free| free.max(now));
        let end = start + cost;
        self.free_at = Some(end);
        end
    }
}

/// When a request may answer: the end of the last operation it reserved.
#[derive(Debug, Default)]
pub struct AnswerAt(Mutex<Reserved>);

#[derive(Debug, Default, Clone, Copy)]
struct Reserved {
    until: Option<Instant>,
    operations: u64,
}

impl AnswerAt {
    pub fn not_before(&self, end: Instant) {
        let mut reserved = self.0.lock().unwrap_or_else(|e| e.into_inner());
        reserved.until = Some(reserved.until.map_or(end, |before| before.max(end)));
        reserved.operations += 1;
    }

    /// The shard operations the request reserved.
    pub fn operations(&self) -> u64 {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).operations
    }

    /// Sleeps until then (at once when nothing was reserved, or when the emulator stops).
    pub async fn wait(&self, wake: &Wake, cancel: &CancellationToken) {
        let at = self.0.lock().unwrap_or_else(|e| e.into_inner()).until;
        if let Some(at) = at {
            tokio::select! {
                _ = wake.at(at) => {}
                _ = cancel.cancelled() => {}
            }
        }
    }
}

/// How a request sleeps until its answer is due.
#[derive(Debug)]
pub enum Wake {
    /// tokio's timer: on the millisecond; on paused time (the tests below) exact.
    Tokio,
    /// An [`Alarm`], started with the first wait.
    Precise(OnceLock<Arc<Alarm>>),
}

impl Default for Wake {
    fn default() -> Self {
        Wake::Precise(OnceLock::new())
    }
}

impl Wake {
    async fn at(&self, at: Instant) {
        match self {
            Wake::Tokio => tokio::time::sleep_until(at).await,
            Wake::Precise(alarm) => alarm.get_or_init(Alarm::start).at(at.into_std()).await,
        }
    }
}

/// Wakes sleepers at their instants, never before, usually within a tenth of a millisecond
/// after: one thread, parked until the earliest instant due (or until a new, earlier one
/// arrives). It ends once the alarm is dropped.
#[derive(Debug)]
pub struct Alarm {
    due: Mutex<BinaryHeap<Reverse<Due>>>,
    thread: std::thread::Thread,
}

/// A sleeper: when, and how to wake it.
#[derive(Debug)]
struct Due {
    at: std::time::Instant,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at.cmp(&other.at)
    }
}

impl Alarm {
    fn start() -> Arc<Alarm> {
        let (handing, handed) = std::sync::mpsc::channel::<Weak<Alarm>>();
        let thread = std::thread::Builder::new()
            .name("es-emulator-alarm".into())
            .spawn(move || {
                if let Ok(alarm) = handed.recv() {
                    ring(&alarm);
                }
            })
            .expect("es-emulator: the capacity model's alarm thread");
        let alarm = Arc::new(Alarm {
            due: Mutex::new(BinaryHeap::new()),
            thread: thread.thread().clone(),
        });
        // The thread holds the alarm weakly, so that dropping the emulator ends it.
        let _ = handing.send(Arc::downgrade(&alarm));
        alarm
    }

    async fn at(&self, at: std::time::Instant) {
        let (wake, woken) = oneshot::channel();
        {
            let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
            due.push(Reverse(Due { at, wake }));
        }
        self.thread.unpark();
        let _ = woken.await;
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        self.thread.unpark();
    }
}

/// The alarm's thread: wakes every sleeper that is due, parks until the next one.
fn ring(alarm: &Weak<Alarm>) {
    loop {
        let next = {
            let Some(alarm) = alarm.upgrade() else { return };
            let now = std::time::Instant::now();
            let mut due = alarm.due.lock().unwrap_or_else(|e| e.into_inner());
            while due.peek().is_some_and(|Reverse(first)| first.at <= now) {
                if let Some(Reverse(first)) = due.pop() {
                    // A sleeper that stopped waiting is gone: nothing to wake.
                    let _ = first.wake.send(());
                }
            }
            due.peek().map(|Reverse(first)| first.at)
        };
        match next {
            Some(at) => {
                std::thread::park_timeout(at.saturating_duration_since(std::time::Instant::now()))
            }
            None => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The whole request path (routes, handlers, the cluster), without sockets, on paused
    //! time: the clock moves only when every request is asleep, so the durations are
    //! exact, however loaded the machine (but for the timer's millisecond).

    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::Request;
    use axum::Router;
    use serde_json::{json, Value};
    use tower::ServiceExt;

    use std::sync::atomic::Ordering;

    use super::*;
    use crate::{routes, EmulatorConfig, Shared};

    const COST: Duration = Duration::from_millis(10);
    /// How late the timer may fire: it rounds a deadline up to its next millisecond.
    const TIMER: Duration = Duration::from_millis(1);

    fn emulator(cost: Duration) -> Router {
        emulator_and_state(cost).0
    }

    fn emulator_and_state(cost: Duration) -> (Router, Arc<Shared>) {
        let config = EmulatorConfig {
            refresh_interval: None,
            ..EmulatorConfig::default()
        };
        let mut shared = Shared::new(&config, CancellationToken::new());
        // Paused time: tokio's timer, which the clock it moves drives.
        shared.wake = Wake::Tokio;
        shared.cluster().capacity = Capacity::new(cost);
        let shared = Arc::new(shared);
        (routes::router(shared.clone()), shared)
    }

    async fn send(router: &Router, method: &str, path: &str, body: String) -> (u16, Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("a request");
        let response = router.clone().oneshot(request).await.expect("an answer");
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("a body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// An index of `shards` shards, made before the clock starts (index creation occupies
    /// no shard).
    async fn index_of(router: &Router, shards: u32) {
        let body = json!({"settings": {"number_of_shards": shards}}).to_string();
        assert_eq!(send(router, "PUT", "/i", body).await.0, 200);
    }

    /// `count` ids, each on the next shard of an index of `shards` (round robin).
    fn ids_on_shards(shards: u32, count: usize) -> Vec<String> {
        let routing = es_routing::Routing::of(shards, None).expect("a shard count");
        let mut found = Vec::new();
        for n in 0.. {
            let id = format!("doc-{n}");
            if routing.shard_of(&id) as usize == found.len() % shards as usize {
                found.push(id);
                if found.len() == count {
                    return found;
                }
            }
        }
        unreachable!()
    }

    /// Sends every request at once; how long after the start each was answered, in the
    /// order of the requests.
    async fn answered_after(
        router: &Router,
        requests: Vec<(&'static str, String, String)>,
    ) -> Vec<Duration> {
        let start = Instant::now();
        let tasks: Vec<_> = requests
            .into_iter()
            .map(|(method, path, body)| {
                let router = router.clone();
                tokio::spawn(async move {
                    let (status, answer) = send(&router, method, &path, body).await;
                    assert!(status < 300, "{method} {path}: {status} {answer}");
                    start.elapsed()
                })
            })
            .collect();
        let mut times = Vec::new();
        for task in tasks {
            times.push(task.await.expect("a request"));
        }
        times
    }

    fn writes_of(ids: &[String]) -> Vec<(&'static str, String, String)> {
        (ids.iter())
            .map(|id| ("PUT", format!("/i/_doc/{id}"), "{}".to_owned()))
            .collect()
    }

    fn assert_about(took: Duration, expected: Duration) {
        assert!(
            took >= expected && took <= expected + TIMER,
            "took {took:?}, expected {expected:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn operations_on_one_shard_are_served_one_after_another() {
        let router = emulator(COST);
        index_of(&router, 1).await;
        let ids: Vec<String> = (0..8).map(|n| format!("doc-{n}")).collect();
        let mut times = answered_after(&router, writes_of(&ids)).await;
        times.sort();
        for (k, took) in times.into_iter().enumerate() {
            assert_about(took, COST * (k as u32 + 1));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn operations_spread_over_shards_are_served_in_parallel() {
        let router = emulator(COST);
        index_of(&router, 8).await;
        let ids = ids_on_shards(8, 8);
        for took in answered_after(&router, writes_of(&ids)).await {
            assert_about(took, COST);
        }
        // Twice as many: two on each shard, served in two rounds.
        let ids = ids_on_shards(8, 16);
        let mut times = answered_after(&router, writes_of(&ids)).await;
        times.sort();
        for (k, took) in times.into_iter().enumerate() {
            assert_about(took, COST * (k as u32 / 8 + 1));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_bulk_answers_when_the_last_of_its_items_is_served() {
        let router = emulator(COST);
        index_of(&router, 4).await;
        let bulk = |ids: &[String]| {
            let mut body = String::new();
            for id in ids {
                body.push_str(&format!(
                    "{{\"index\":{{\"_index\":\"i\",\"_id\":\"{id}\"}}}}\n{{}}\n"
                ));
            }
            vec![("POST", "/_bulk".to_owned(), body)]
        };
        // Four items on four shards: one round.
        assert_about(
            answered_after(&router, bulk(&ids_on_shards(4, 4))).await[0],
            COST,
        );
        // Eight items, two on each shard: two rounds.
        assert_about(
            answered_after(&router, bulk(&ids_on_shards(4, 8))).await[0],
            COST * 2,
        );
        // Four items on one shard: four rounds.
        let on_shard_0: Vec<String> = ids_on_shards(4, 16).into_iter().step_by(4).collect();
        assert_about(
            answered_after(&router, bulk(&on_shard_0)).await[0],
            COST * 4,
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_search_a_refresh_and_stats_occupy_every_shard_once() {
        let router = emulator(COST);
        index_of(&router, 4).await;
        let whole =
            |method: &'static str, path: &str| vec![(method, path.to_owned(), String::new())];
        assert_about(
            answered_after(&router, whole("POST", "/i/_search")).await[0],
            COST,
        );
        assert_about(
            answered_after(&router, whole("POST", "/i/_refresh")).await[0],
            COST,
        );
        assert_about(
            answered_after(&router, whole("GET", "/i/_stats?level=shards")).await[0],
            COST,
        );
        // A write after a search waits for its shard, whichever it is.
        let mut requests = whole("POST", "/i/_search");
        requests.extend(writes_of(&ids_on_shards(4, 4)[3..]));
        let times = answered_after(&router, requests).await;
        assert_about(times[0], COST);
        assert_about(times[1], COST * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_get_occupies_the_shard_of_its_document() {
        let router = emulator(COST);
        index_of(&router, 2).await;
        let ids = ids_on_shards(2, 2);
        answered_after(&router, writes_of(&ids)).await;
        let get = |id: &String| ("GET", format!("/i/_doc/{id}"), String::new());
        // One on each shard: in parallel.
        for took in answered_after(&router, ids.iter().map(get).collect()).await {
            assert_about(took, COST);
        }
        // Both on one shard: one after the other.
        let mut times = answered_after(&router, vec![get(&ids[0]), get(&ids[0])]).await;
        times.sort();
        assert_about(times[0], COST);
        assert_about(times[1], COST * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_operations_served_are_counted() {
        let (router, shared) = emulator_and_state(COST);
        index_of(&router, 4).await;
        let served = || shared.shard_operations.load(Ordering::Relaxed);
        assert_eq!(served(), 0, "creating an index occupies no shard");
        answered_after(&router, writes_of(&ids_on_shards(4, 6))).await;
        assert_eq!(served(), 6);
        let search = vec![("POST", "/i/_search".to_owned(), String::new())];
        answered_after(&router, search).await;
        assert_eq!(served(), 6 + 4, "a search is one operation on every shard");
    }

    /// On the wall clock: the alarm never wakes a sleeper before its instant (how late it
    /// may be depends on the machine; `docs/benchmark.md` says what was seen).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_alarm_never_wakes_a_sleeper_early() {
        let alarm = Alarm::start();
        let start = std::time::Instant::now();
        let sleepers: Vec<_> = (0..64u64)
            .map(|n| {
                let alarm = alarm.clone();
                // Spread over 3 ms, out of order.
                let at = start + Duration::from_micros((n * 7919) % 3000);
                tokio::spawn(async move {
                    alarm.at(at).await;
                    std::time::Instant::now() >= at
                })
            })
            .collect();
        for sleeper in sleepers {
            assert!(sleeper.await.expect("a sleeper"), "woken early");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_cost_nothing_waits() {
        let router = emulator(Duration::ZERO);
        index_of(&router, 1).await;
        let ids: Vec<String> = (0..8).map(|n| format!("doc-{n}")).collect();
        for took in answered_after(&router, writes_of(&ids)).await {
            assert_eq!(took, Duration::ZERO);
        }
    }
}
