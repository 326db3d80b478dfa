//! A webhook receiver on loopback (port 0): records every request, can answer 500 for a
//! while, answer 500 every k-th time, or hang (never answer) for a number of requests; checks
//! each delivery's Standard Webhooks signature with its own HMAC (not the service's code).
//! Also the checks the webhook suites share: every expected event delivered, duplicates only
//! by id, order per transfer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;

/// The secret tests configure (`WEBHOOK_SECRET`).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
    pub content_type: String,
    pub body: Vec<u8>,
    /// The status answered (0: hung, never answered).
    pub status: u16,
    /// The W3C `traceparent` the delivery carried (empty: none).
    pub traceparent: String,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// The event's transfer id (the part of `webhook-id` before the `/`).
    pub fn transfer(&self) -> &str {
        self.id
            .rsplit_once('/')
            .map_or("", |(transfer, _)| transfer)
    }

    /// Whether the signature is the HMAC-SHA256 of `id.timestamp.body` under [`SECRET`].
    pub fn signature_is_valid(&self) -> bool {
        let key = STANDARD
            .decode(SECRET.strip_prefix("whsec_").unwrap())
            .unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
        mac.update(format!("{}.{}.", self.id, self.timestamp).as_bytes());
        mac.update(&self.body);
        let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
        self.signature.split(' ').any(|sig| sig == expected)
    }
}

#[derive(Default)]
struct Behaviour {
    /// Answer 500 to this many more requests.
    fail_next: AtomicUsize,
    /// Never answer this many more requests.
    hang_next: AtomicUsize,
    /// Answer 500 to every k-th request (0: never).
    fail_every: AtomicUsize,
    seen: AtomicUsize,
}

#[derive(Clone, Default)]
struct Shared {
    behaviour: Arc<Behaviour>,
    log: Arc<Mutex<Vec<Received>>>,
}

/// The running receiver; stops when dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    shared: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn receive(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let mut received = Received {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        content_type: header("content-type"),
        body: body.to_vec(),
        status: 0,
        traceparent: header("traceparent"),
    };
    let behaviour = &shared.behaviour;
    let n = behaviour.seen.fetch_add(1, Ordering::SeqCst) + 1;
    let take = |counter: &AtomicUsize| {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok()
    };
    if take(&behaviour.hang_next) {
        shared.log.lock().unwrap().push(received);
        // Until the client gives up (the handler is dropped with the connection).
        tokio::time::sleep(Duration::from_secs(3600)).await;
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    let every = behaviour.fail_every.load(Ordering::SeqCst);
    let status = if take(&behaviour.fail_next) || (every > 0 && n % every == 0) {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::NO_CONTENT
    };
    received.status = status.as_u16();
    shared.log.lock().unwrap().push(received);
    status
}

impl Receiver {
    pub async fn start() -> Receiver {
        let shared = Shared::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        let addr = listener.local_addr().expect("address");
        let router = Router::new()
            .route("/hook", post(receive))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Receiver {
            addr,
            shared,
            server,
        }
    }

    /// The URL to configure as `WEBHOOK_URL`.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Answer 500 to the next `n` requests.
    pub fn fail_next(&self, n: usize) {
        self.shared.behaviour.fail_next.store(n, Ordering::SeqCst);
    }

    /// Never answer the next `n` requests.
    pub fn hang_next(&self, n: usize) {
        self.shared.behaviour.hang_next.store(n, Ordering::SeqCst);
    }

    /// Answer 500 to every `k`-th request (0: stop).
    pub fn fail_every(&self, k: usize) {
        self.shared.behaviour.fail_every.store(k, Ordering::SeqCst);
    }

    /// Every request so far, in the order received.
    pub fn requests(&self) -> Vec<Received> {
        self.shared.log.lock().unwrap().clone()
    }

    /// The requests answered 2xx, in order.
    pub fn delivered(&self) -> Vec<Received> {
        self.requests()
            .into_iter()
            .filter(|r| (200..300).contains(&r.status))
            .collect()
    }

    /// The ids delivered (2xx) at least once.
    pub fn delivered_ids(&self) -> BTreeSet<String> {
        self.delivered().into_iter().map(|r| r.id).collect()
    }
}

/// The events a consumer of `GET /events` sees, deduplicated, per transfer in feed order:
/// `(transfer id, [event ids])`, restricted to `types`.
pub fn expected_per_transfer(events: &[Value], types: &[&str]) -> BTreeMap<String, Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for event in events {
        let id = event["id"].as_str().unwrap().to_owned();
        let kind = event["type"].as_str().unwrap();
        if !types.contains(&kind) || !seen.insert(id.clone()) {
            continue;
        }
        let transfer = event["transfer"]["id"].as_str().unwrap().to_owned();
        out.entry(transfer).or_default().push(id);
    }
    out
}

/// Checks the receiver's deliveries against the expected events: every expected event was
/// delivered, nothing else was, every request (delivered or not) is well formed and signed,
/// every repeat of an id carries the same event, and per transfer the first deliveries
/// come in the expected order. Returns (deliveries, distinct ids).
pub fn check_deliveries(
    receiver: &Receiver,
    expected: &BTreeMap<String, Vec<String>>,
) -> (usize, usize) {
    let requests = receiver.requests();
    for request in &requests {
        assert_eq!(request.content_type, "application/json", "{request:?}");
        assert!(request.signature_is_valid(), "bad signature: {request:?}");
        let timestamp: i64 = request.timestamp.parse().expect("unix seconds");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!((now - timestamp).abs() < 600, "{request:?}");
        let body = request.json();
        assert_eq!(body["id"], request.id.as_str(), "{body}");
        assert_eq!(
            request.id,
            format!(
                "{}/{}",
                body["transfer"]["id"].as_str().unwrap(),
                body["type"].as_str().unwrap()
            )
        );
        assert!(body["at"].is_string(), "{body}");
    }
    let delivered = receiver.delivered();
    // Repeats only by id: the same event (id, type, at) each time.
    let mut by_id: HashMap<&str, (&Value, &Value)> = HashMap::new();
    let bodies: Vec<Value> = delivered.iter().map(Received::json).collect();
    for body in &bodies {
        let id = body["id"].as_str().unwrap();
        let first = by_id.entry(id).or_insert((&body["type"], &body["at"]));
        assert_eq!(
            *first,
            (&body["type"], &body["at"]),
            "{id} repeated differently"
        );
    }
    // Per transfer, first deliveries in the expected order.
    let mut first_seen = BTreeSet::new();
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for request in &delivered {
        if first_seen.insert(request.id.clone()) {
            got.entry(request.transfer().to_owned())
                .or_default()
                .push(request.id.clone());
        }
    }
    let missing: Vec<&String> = expected
        .values()
        .flatten()
        .filter(|id| !first_seen.contains(*id))
        .collect();
    assert!(missing.is_empty(), "not delivered: {missing:?}");
    let unexpected: Vec<&String> = first_seen
        .iter()
        .filter(|id| !expected.values().flatten().any(|e| e == *id))
        .collect();
    assert!(
        unexpected.is_empty(),
        "delivered but not expected: {unexpected:?}"
    );
    assert_eq!(&got, expected, "order per transfer");
    (delivered.len(), first_seen.len())
}
