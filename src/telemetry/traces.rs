//! OpenTelemetry traces: the service's `tracing` spans exported by OTLP over HTTP/protobuf to a
//! collector (Jaeger, the OpenTelemetry Collector, a vendor's agent), configured by the
//! standard `OTEL_*` variables (`docs/operations.md`, "Tracing").
//!
//! **Off unless asked for.** Without `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (or `OTEL_TRACES_EXPORTER=otlp`) nothing is installed:
//! no layer, no task, no span with an OpenTelemetry context, and the spans only tracing adds
//! ([`crate::trace_context::TARGET`], at `debug`) are disabled at their call sites.
//!
//! **A transfer never waits for a span.** A finished span goes into a bounded queue
//! ([`QUEUE`]); when the queue is full (the collector is slow or down and the exports behind
//! it time out) the span is dropped and counted (`trace_spans_dropped_total{reason}`), never
//! waited for. One task drains the queue in batches and exports each with a deadline; a
//! batch the collector refused or did not take in time is dropped and counted too. Nothing is
//! retried: a trace may lose spans, a transfer loses nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::Context;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::metrics::trace_spans;

/// Finished spans waiting for the exporter, at most. About 2 s of a busy instance's spans
/// (some 25 spans a transfer at 200 transfers/s): a collector that stalls longer than that
/// costs spans, not memory or latency.
pub const QUEUE: usize = 8_192;
/// Spans in one export request, at most.
const BATCH: usize = 512;
/// How long a batch waits to fill before it is sent.
const BATCH_DELAY: Duration = Duration::from_millis(500);
/// How long one export may take before its spans are given up (`OTEL_EXPORTER_OTLP_TIMEOUT`
/// bounds the request itself; this bounds everything, connecting included).
const EXPORT_DEADLINE: Duration = Duration::from_secs(10);
/// How long a shutdown waits for the spans still queued.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

/// The service's name in traces when neither `OTEL_SERVICE_NAME` nor
/// `OTEL_RESOURCE_ATTRIBUTES` names one.
const SERVICE_NAME: &str = "transfer-service";

/// Traces being exported; [`Traces::shutdown`] sends what is queued and stops.
pub struct Traces {
    provider: SdkTracerProvider,
    closing: watch::Sender<bool>,
    export: JoinHandle<()>,
    /// The queue's sending side, to count what a shutdown leaves in it.
    queue: mpsc::Sender<SpanData>,
    /// Spans of the export being sent, counted as dropped if a shutdown cuts it off.
    sending: Arc<AtomicUsize>,
}

/// Whether the environment asks for traces, and where to.
fn requested() -> Result<bool, String> {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    if std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    let exporter = std::env::var("OTEL_TRACES_EXPORTER").unwrap_or_default();
    match exporter.trim() {
        "none" => return Ok(false),
        "" | "otlp" => {}
        other => {
            return Err(format!(
                "OTEL_TRACES_EXPORTER={other} is not supported: `otlp` or `none`"
            ))
        }
    }
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default();
    if !matches!(protocol.trim(), "" | "http/protobuf") {
        return Err(format!(
            "OTLP protocol {protocol} is not supported: this service sends http/protobuf"
        ));
    }
    for name in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        // The exporter's client speaks plain HTTP: an https collector would refuse every
        // export. Said at start rather than counted as failed exports forever.
        if std::env::var(name).is_ok_and(|v| v.trim().to_ascii_lowercase().starts_with("https:")) {
            return Err(format!(
                "{name} is https: this service exports by plain HTTP (a local collector or \
                 agent in front of a TLS endpoint)"
            ));
        }
    }
    Ok(exporter.trim() == "otlp"
        || set("OTEL_EXPORTER_OTLP_ENDPOINT")
        || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The resource every span carries: the service's name (unless the environment names it) and
/// `OTEL_RESOURCE_ATTRIBUTES`.
fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name(SERVICE_NAME).build()
    }
}

impl Traces {
    /// Starts exporting when the environment asks for it (on the current tokio runtime):
    /// the tracer for the `tracing` layer, and the handle that stops it. `Ok(None)`: off.
    pub fn start() -> Result<Option<(SdkTracer, Traces)>, String> {
        if !requested()? {
            return Ok(None);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()
            .map_err(|error| format!("the OTLP exporter cannot be built: {error}"))?;
        Ok(Some(Traces::exporting_to(exporter, QUEUE)))
    }

    /// Exports through `exporter` behind a queue of `capacity` spans.
    fn exporting_to(
        exporter: opentelemetry_otlp::SpanExporter,
        capacity: usize,
    ) -> (SdkTracer, Traces) {
        let (queue, queued) = mpsc::channel(capacity);
        let (closing, closed) = watch::channel(false);
        let resource = resource();
        let sending = Arc::new(AtomicUsize::new(0));
        let export = tokio::spawn(export_loop(
            exporter,
            resource.clone(),
            queued,
            closed,
            sending.clone(),
        ));
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_span_processor(BoundedQueue {
                queue: queue.clone(),
            })
            .build();
        let tracer = provider.tracer("transfer-service");
        let traces = Traces {
            provider,
            closing,
            export,
            queue,
            sending,
        };
        (tracer, traces)
    }

    /// Exports what is queued for at most [`SHUTDOWN_DEADLINE`] and stops; what is still
    /// queued or being sent then (a collector that does not answer) is dropped and counted.
    pub async fn shutdown(self) {
        let _ = self.closing.send(true);
        let mut export = self.export;
        if tokio::time::timeout(SHUTDOWN_DEADLINE, &mut export)
            .await
            .is_err()
        {
            export.abort();
            let left = self.queue.max_capacity() - self.queue.capacity()
                + self.sending.load(Ordering::Acquire);
            trace_spans()
                .dropped
                .with_label_values(&["export_failed"])
                .inc_by(left as u64);
        }
        let _ = self.provider.shutdown();
    }
}

/// The span processor: hands each finished, sampled span to the export task, or drops it
/// when the queue is full. It never blocks the thread that ends a span.
#[derive(Debug)]
struct BoundedQueue {
    queue: mpsc::Sender<SpanData>,
}

impl SpanProcessor for BoundedQueue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        // Closed: the export was shut down (the process is stopping); nothing is counted.
        if let Err(mpsc::error::TrySendError::Full(_)) = self.queue.try_send(span) {
            trace_spans()
                .dropped
                .with_label_values(&["queue_full"])
                .inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        // The export task sends within `BATCH_DELAY`; `Traces::shutdown` drains the rest.
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        if self.queue.is_closed() {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        Ok(())
    }
}

/// Drains the queue in batches of up to [`BATCH`] spans, each sent within [`BATCH_DELAY`] of
/// its first span; on closing, sends what is left and ends.
async fn export_loop(
    mut exporter: opentelemetry_otlp::SpanExporter,
    resource: Resource,
    mut queued: mpsc::Receiver<SpanData>,
    mut closed: watch::Receiver<bool>,
    sending: Arc<AtomicUsize>,
) {
    // The handle's `send(true)` is the only change it makes.
    exporter.set_resource(&resource);
    loop {
        let first = tokio::select! {
            span = queued.recv() => span,
            // Closing (or the handle gone): nothing more is taken; what is queued goes.
            _ = closed.changed() => {
                queued.close();
                queued.recv().await
            }
        };
        let Some(first) = first else { break };
        let mut batch = Vec::with_capacity(BATCH);
        batch.push(first);
        let closing = queued.is_closed();
        fill(&mut batch, &mut queued, closing).await;
        sending.store(batch.len(), Ordering::Release);
        export(&exporter, batch).await;
        sending.store(0, Ordering::Release);
    }
    let _ = exporter.shutdown();
}

/// Adds queued spans to `batch` until it is full or [`BATCH_DELAY`] has passed (at once when
/// closing).
async fn fill(batch: &mut Vec<SpanData>, queued: &mut mpsc::Receiver<SpanData>, closing: bool) {
    let delay = tokio::time::sleep(if closing { Duration::ZERO } else { BATCH_DELAY });
    tokio::pin!(delay);
    while batch.len() < BATCH {
        tokio::select! {
            biased;
            span = queued.recv() => match span {
                Some(span) => batch.push(span),
                None => return,
            },
            _ = &mut delay => {
                // What is already queued goes too, without waiting.
                while batch.len() < BATCH {
                    let Ok(span) = queued.try_recv() else { return };
                    batch.push(span);
                }
                return;
            }
        }
    }
}

/// Sends one batch; counts it exported or dropped.
async fn export(exporter: &opentelemetry_otlp::SpanExporter, batch: Vec<SpanData>) {
    let spans = batch.len() as u64;
    let counters = trace_spans();
    match tokio::time::timeout(EXPORT_DEADLINE, exporter.export(batch)).await {
        Ok(Ok(())) => counters.exported.inc_by(spans),
        Ok(Err(_)) | Err(_) => counters
            .dropped
            .with_label_values(&["export_failed"])
            .inc_by(spans),
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{Span as _, Tracer as _};
    use opentelemetry_otlp::WithExportConfig;

    use super::*;

    /// A collector that takes connections and never answers: every export waits until its
    /// deadline.
    async fn collector_that_never_answers() -> (tokio::net::TcpListener, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        (listener, url)
    }

    fn exporter(url: &str) -> opentelemetry_otlp::SpanExporter {
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .build()
            .unwrap()
    }

    fn dropped(reason: &str) -> u64 {
        trace_spans().dropped.with_label_values(&[reason]).get()
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_collector_costs_spans_counted_never_a_wait() {
        let (_listener, url) = collector_that_never_answers().await;
        let (tracer, traces) = Traces::exporting_to(exporter(&url), 4);
        let full_before = dropped("queue_full");
        // Far more spans than the queue holds, ended while the export hangs: each `end`
        // returns at once, and what does not fit is dropped and counted.
        let started = std::time::Instant::now();
        for n in 0..100 {
            tracer.start(format!("span {n}")).end();
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "ending spans waited"
        );
        assert!(dropped("queue_full") - full_before >= 90);
        // The shutdown gives up on the stalled export at its deadline, counting what it held.
        let failed_before = dropped("export_failed");
        traces.shutdown().await;
        assert!(dropped("export_failed") > failed_before);
    }
}
