//! Logs: every app of a test binary logs JSON, through the service's own subscriber, into one
//! in-memory buffer; each test finds its own lines by request id or transfer id. With
//! `TEST_LOG` set, the lines are also written to stderr.
//!
//! The subscriber is the process's global one, installed once by the first app that starts;
//! nothing else in a test binary may install another.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;
use tracing_subscriber::EnvFilter;
use transfer_service::telemetry;
use transfer_service::telemetry::LogFormat;

use super::wait;

#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        if std::env::var_os("TEST_LOG").is_some() {
            std::io::stderr().write_all(bytes)?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn buffer() -> &'static LogBuffer {
    static LOGS: OnceLock<LogBuffer> = OnceLock::new();
    LOGS.get_or_init(LogBuffer::default)
}

/// Installs the service's JSON subscriber, writing into the buffer, once per process.
pub fn capture() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let buffer = buffer().clone();
        let subscriber = telemetry::subscriber(
            LogFormat::Json,
            EnvFilter::new("info"),
            move || buffer.clone(),
            false,
            None,
        );
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
    });
}

/// Every log line so far, parsed (each line must be one JSON object).
pub fn lines() -> Vec<Value> {
    let bytes = buffer().0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    String::from_utf8(bytes)
        .expect("UTF-8 logs")
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// The lines logged inside the request span with this request id (at any depth).
pub fn of_request(request_id: &str) -> Vec<Value> {
    lines()
        .into_iter()
        .filter(|line| {
            line["spans"]
                .as_array()
                .is_some_and(|spans| spans.iter().any(|s| s["request_id"] == request_id))
        })
        .collect()
}

/// The ERROR lines logged inside a request's span.
pub fn errors_of_request(request_id: &str) -> Vec<Value> {
    of_request(request_id)
        .into_iter()
        .filter(|l| l["level"] == "ERROR")
        .collect()
}

/// Waits for the response line of a request (`request finished` / `request failed`).
pub async fn response_line(request_id: &str) -> Value {
    let what = format!("the response line of request {request_id}");
    wait::until_some(&what, || async {
        of_request(request_id).into_iter().find(|l| {
            l["span"]["name"] == "request"
                && l["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("request f"))
        })
    })
    .await
}
