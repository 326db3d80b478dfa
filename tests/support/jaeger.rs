//! Jaeger, a real trace backend, for the tracing tests: built by `tools/jaeger/build` (the
//! version `tools/jaeger/go.mod` pins; `.ci/run` builds it first), started per test on ports
//! of its own with in-memory storage, taking OTLP over HTTP and answering its query API.
//! Without Go (and no binary built) the tests skip, except under CI ([`super::skip`]).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

/// A running Jaeger; killed when dropped.
pub struct Jaeger {
    child: Child,
    /// Where the service sends its spans (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub otlp: String,
    /// Jaeger's query API.
    query: String,
    _dir: tempfile::TempDir,
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary, built once per test process; `None` (said loudly) where it cannot be.
fn binary() -> Option<PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/jaeger");
            let bin = tools.join("bin/jaeger");
            if !super::skip::on_path("go") && !bin.is_file() {
                super::skip::or_fail_under_ci(
                    "the tracing tests",
                    "Go is not installed to build Jaeger (tools/jaeger/build)",
                );
                return None;
            }
            if super::skip::on_path("go") {
                let built = Command::new(tools.join("build")).status();
                if !built.is_ok_and(|status| status.success()) {
                    super::skip::or_fail_under_ci(
                        "the tracing tests",
                        "tools/jaeger/build failed (Go 1.26 and the Go module proxy are needed)",
                    );
                    return None;
                }
            }
            Some(bin)
        })
        .clone()
}

/// A free port on loopback (bound and let go: Jaeger binds it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Jaeger's configuration: OTLP/HTTP in, spans kept in memory, the query API; nothing else
/// listens (its own metrics off), so tests running at once do not collide.
fn config(otlp: u16, query_http: u16, query_grpc: u16) -> String {
    format!(
        r#"service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memory
    http:
      endpoint: 127.0.0.1:{query_http}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memory:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memory
"#
    )
}

impl Jaeger {
    /// Starts Jaeger and waits until its query API answers and its OTLP port takes
    /// connections; `None` where it cannot run. Its ports are picked free a moment before it
    /// binds them: should another process take one first, Jaeger exits, and it is started
    /// again on others.
    pub async fn start() -> Option<Jaeger> {
        let bin = binary()?;
        for _ in 0..3 {
            if let Some(jaeger) = Jaeger::start_once(&bin).await {
                return Some(jaeger);
            }
        }
        panic!("Jaeger exited three times at start (TEST_LOG=1 shows why)");
    }

    /// One start on ports picked now; `None` if it exits before it answers.
    async fn start_once(bin: &Path) -> Option<Jaeger> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (otlp, query_http, query_grpc) = (free_port(), free_port(), free_port());
        let path = dir.path().join("jaeger.yaml");
        std::fs::write(&path, config(otlp, query_http, query_grpc)).expect("write the config");
        let child = Command::new(bin)
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(if std::env::var("TEST_LOG").is_ok() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("start jaeger");
        let mut jaeger = Jaeger {
            child,
            otlp: format!("http://127.0.0.1:{otlp}"),
            query: format!("http://127.0.0.1:{query_http}"),
            _dir: dir,
        };
        let services = format!("{}/api/services", jaeger.query);
        let deadline = std::time::Instant::now() + super::wait::DEADLINE;
        loop {
            if jaeger.child.try_wait().ok().flatten().is_some() {
                return None;
            }
            let answers = reqwest::get(&services)
                .await
                .is_ok_and(|answer| answer.status() == 200);
            let takes_spans = tokio::net::TcpStream::connect(("127.0.0.1", otlp))
                .await
                .is_ok();
            if answers && takes_spans {
                return Some(jaeger);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "Jaeger never answered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The spans of trace `trace_id` as Jaeger holds them now (none if it has none yet).
    pub async fn spans(&self, trace_id: &str) -> Vec<Span> {
        let url = format!("{}/api/traces/{trace_id}", self.query);
        let Ok(answer) = reqwest::get(&url).await else {
            return Vec::new();
        };
        let body: Value = answer.json().await.unwrap_or_default();
        let mut spans: Vec<Span> = body["data"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|trace| trace["spans"].as_array().cloned().unwrap_or_default())
            .map(Span::from)
            .collect();
        spans.sort_by_key(|span| span.start);
        spans
    }

    /// Stops it (the collector going away under a running service).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One span as Jaeger's query API shows it.
#[derive(Debug, Clone)]
pub struct Span {
    pub id: String,
    pub parent: Option<String>,
    pub name: String,
    /// Start, in microseconds since the epoch.
    pub start: u64,
    pub tags: serde_json::Map<String, Value>,
}

impl Span {
    /// A tag's value as text (numbers and booleans too).
    pub fn tag(&self, key: &str) -> Option<String> {
        self.tags.get(key).map(|value| match value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        })
    }
}

impl From<Value> for Span {
    fn from(span: Value) -> Span {
        let tags = span["tags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|tag| Some((tag["key"].as_str()?.to_owned(), tag["value"].clone())))
            .collect();
        Span {
            id: span["spanID"].as_str().unwrap_or_default().to_owned(),
            parent: span["references"]
                .as_array()
                .and_then(|refs| refs.first())
                .and_then(|reference| reference["spanID"].as_str())
                .map(str::to_owned),
            name: span["operationName"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            start: span["startTime"].as_u64().unwrap_or_default(),
            tags,
        }
    }
}

/// How long a test waits for spans to reach Jaeger (the service sends within half a second;
/// a loaded machine may take longer).
pub const SPANS_ARRIVE_WITHIN: Duration = Duration::from_secs(30);
