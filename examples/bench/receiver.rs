//! `--webhook`: a webhook receiver inside the benchmark, on loopback, answering `204` to
//! every delivery, so the report shows what delivering events costs the service and how far
//! behind the transfers the deliveries run.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use hdrhistogram::Histogram;

/// The secret the benchmark gives the service (`WEBHOOK_SECRET`): any key will do, the
/// receiver does not check signatures (the tests do).
pub const SECRET: &str = "whsec_YmVuY2htYXJrLXNlY3JldC1rZXktMzItYnl0ZXMhIQ==";

/// What the receiver got.
#[derive(Default, Clone)]
pub struct Received {
    /// Distinct `webhook-id`s.
    pub ids: HashSet<String>,
    /// Deliveries, repeats included.
    pub deliveries: u64,
    /// From the event's `at` to its first delivery, in microseconds.
    pub lag_us: Option<Histogram<u64>>,
}

pub type Shared = Arc<Mutex<Received>>;

/// Starts the receiver on `127.0.0.1:0`; returns its URL and what it records.
pub async fn start() -> (String, Shared) {
    let shared: Shared = Arc::default();
    let app = Router::new()
        .route("/hook", post(receive))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let url = format!("http://{}/hook", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, shared)
}

async fn receive(State(shared): State<Shared>, headers: HeaderMap, body: String) -> StatusCode {
    let received = SystemTime::now();
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let at = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|event| humantime::parse_rfc3339(event["at"].as_str()?).ok());
    let mut r = shared.lock().expect("receiver state");
    r.deliveries += 1;
    if r.ids.insert(id) {
        if let Some(lag) = at.and_then(|at| received.duration_since(at).ok()) {
            let histogram = r
                .lag_us
                .get_or_insert_with(|| Histogram::new(3).expect("histogram"));
            let _ = histogram.record(lag.as_micros() as u64);
        }
    }
    StatusCode::NO_CONTENT
}

/// Waits until `want` distinct events arrived, or `give_up_after`.
pub async fn wait_for(shared: &Shared, want: u64, give_up_after: Duration) {
    let deadline = tokio::time::Instant::now() + give_up_after;
    loop {
        let got = shared.lock().expect("receiver state").ids.len() as u64;
        if got >= want {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            eprintln!("the webhook receiver gave up with {got} of {want} events");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
