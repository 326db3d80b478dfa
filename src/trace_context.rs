//! W3C Trace Context (`traceparent`, `tracestate`): what joins a caller's trace to the spans
//! of this service, and this service's spans to the engine's and a webhook receiver's.
//!
//! A context travels in three forms here: in HTTP headers (an incoming request, a request to
//! Elasticsearch, a webhook delivery), and in a transfer's document, where the create records
//! the `traceparent` of the request that made it (`docs/design.md` §2), so that the worker,
//! recovery and the webhook dispatcher, in this process or another, later or after a restart,
//! put their spans in the same trace as children of that request's span.
//!
//! Everything here works on `tracing` spans through `tracing-opentelemetry`. When tracing is
//! off (no exporter configured, `docs/operations.md`, "Tracing") no span has an OpenTelemetry
//! context: [`current_traceparent`] answers `None`, [`continue_from`] does nothing, and no
//! header is written.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of the spans only tracing needs (a protocol step, a store call): at `debug`,
/// so that without tracing they are disabled where they are written and cost nothing, and
/// exported whatever the log filter when tracing is on (`crate::telemetry::traces`).
pub const TARGET: &str = "transfer_service::traces";

/// The target of the spans only the log lines need (a transfer settled inside its request,
/// `crate::transfer::transfer_span_in_request`): never exported, whatever the level. A span
/// made inside one joins the exported span it is in ([`in_trace`]).
pub const IN_REQUEST: &str = "transfer_service::transfer::in_request";

/// Whether this process exports traces (set once at start by `crate::telemetry`).
static ON: AtomicBool = AtomicBool::new(false);

/// Records that spans are exported from now on: the helpers here stop answering "not traced"
/// at once.
pub fn turn_on() {
    ON.store(true, Ordering::Relaxed);
}

/// Whether spans are exported. Off, every helper here returns at once.
pub fn is_on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The header that carries a trace's id and the parent span's id.
pub const TRACEPARENT: &str = "traceparent";
/// The header that carries vendors' state along with `traceparent`.
pub const TRACESTATE: &str = "tracestate";

/// The longest `traceparent` kept from a request or a document (version 00 is 55 bytes; later
/// versions may append fields). A longer one is ignored, as the W3C text allows.
const LONGEST_TRACEPARENT: usize = 256;

/// The `traceparent` that makes the exported span the code runs in (the innermost one
/// entered, as [`in_trace`] reads it) the parent of whatever continues from here: a request
/// to the engine, a transfer's later spans. `None` outside a trace (tracing off, or not
/// sampled and not recorded).
pub fn current_traceparent() -> Option<String> {
    if !is_on() {
        return None;
    }
    opentelemetry::Context::map_current(|context| {
        let span = context.span();
        let span_context = span.span_context();
        span_context.is_valid().then(|| traceparent(span_context))
    })
}

/// `span_context` as a version-00 `traceparent`, as the propagator writes it
/// ([`inject_into_headers`]) but without its map of headers: this runs for every transfer.
fn traceparent(span_context: &SpanContext) -> String {
    format!(
        "00-{:032x}-{:016x}-{:02x}",
        span_context.trace_id(),
        span_context.span_id(),
        span_context.trace_flags() & TraceFlags::SAMPLED
    )
}

/// Makes `span` a child of the span `traceparent` names (stored in a transfer's document).
/// Call it before `span` is first entered: a span's parent is fixed when it starts. An
/// absent, malformed or overlong `traceparent` leaves `span` where it is.
pub fn continue_from(span: &tracing::Span, traceparent: Option<&str>) {
    if !is_on() {
        return;
    }
    let Some(traceparent) = traceparent.filter(|t| t.len() <= LONGEST_TRACEPARENT) else {
        return;
    };
    continue_from_carrier(span, &StoredTraceparent(traceparent));
}

/// Makes `span` a child of the caller's span named by the request's `traceparent` and
/// `tracestate` headers; without them (or malformed), `span` starts a trace of its own.
pub fn continue_from_headers(span: &tracing::Span, headers: &http::HeaderMap) {
    if !is_on() {
        return;
    }
    continue_from_carrier(span, &HeaderCarrier(headers));
}

/// Writes `traceparent` (and `tracestate`) for `span` into outgoing request headers, so the
/// receiver's spans become its children. Nothing is written when `span` is not traced.
pub fn inject_into_headers(span: &tracing::Span, headers: &mut http::HeaderMap) {
    if !is_on() {
        return;
    }
    let context = span.context();
    if context.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&context, &mut HeaderInjector(headers));
    }
}

/// Whether the code running now is inside an exported trace (what a store request or an
/// outgoing call joins); always `false` when tracing is off. It asks OpenTelemetry's current
/// context, which `tracing-opentelemetry` sets as an exported span is entered: the innermost
/// exported span entered, past any span the exporter does not see ([`IN_REQUEST`], the
/// recovery loop's), with no `tracing` span cloned or looked up.
pub fn in_trace() -> bool {
    is_on()
        && opentelemetry::Context::map_current(|context| context.span().span_context().is_valid())
}

fn continue_from_carrier(span: &tracing::Span, carrier: &dyn Extractor) {
    let parent = TraceContextPropagator::new().extract(carrier);
    if parent.span().span_context().is_valid() {
        // Refused only when tracing is off or the span already started: then it keeps the
        // parent it has, which is all a trace can lose (never a request or a transfer).
        let _ = span.set_parent(parent);
    }
}

/// A `traceparent` recorded in a document, read as a carrier of the trace context.
struct StoredTraceparent<'a>(&'a str);

impl Extractor for StoredTraceparent<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT).then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

/// Request headers read as a carrier of the trace context.
struct HeaderCarrier<'a>(&'a http::HeaderMap);

impl Extractor for HeaderCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .and_then(|value| value.to_str().ok())
            .filter(|value| value.len() <= LONGEST_TRACEPARENT)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

/// Outgoing request headers written as a carrier of the trace context.
struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let name = http::HeaderName::from_bytes(key.as_bytes());
        let value = http::HeaderValue::from_str(&value);
        if let (Ok(name), Ok(value)) = (name, value) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_untraced_span_has_no_traceparent_and_writes_no_header() {
        let span = tracing::info_span!("untraced");
        let _in = span.enter();
        assert_eq!(current_traceparent(), None);
        let mut headers = http::HeaderMap::new();
        inject_into_headers(&span, &mut headers);
        assert!(headers.is_empty());
    }

    #[test]
    fn a_recorded_traceparent_is_what_the_propagator_writes_and_reads_back() {
        use opentelemetry::trace::{SpanId, TraceId, TraceState};
        for flags in [TraceFlags::SAMPLED, TraceFlags::default()] {
            let span_context = SpanContext::new(
                TraceId::from(0x0af7651916cd43dd8448eb211c80319c),
                SpanId::from(0x00f067aa0ba902b7),
                flags,
                true,
                TraceState::default(),
            );
            let context =
                opentelemetry::Context::new().with_remote_span_context(span_context.clone());
            let mut written = std::collections::HashMap::new();
            TraceContextPropagator::new().inject_context(&context, &mut written);
            assert_eq!(Some(&traceparent(&span_context)), written.get(TRACEPARENT));
            let read = TraceContextPropagator::new()
                .extract(&StoredTraceparent(&traceparent(&span_context)));
            assert_eq!(read.span().span_context(), &span_context);
        }
    }

    #[test]
    fn a_malformed_or_overlong_traceparent_is_ignored_without_a_panic() {
        let span = tracing::info_span!("untraced");
        continue_from(&span, Some("not-a-traceparent"));
        continue_from(&span, Some(&"0".repeat(LONGEST_TRACEPARENT + 1)));
        continue_from(&span, None);
        let mut headers = http::HeaderMap::new();
        headers.insert(TRACEPARENT, http::HeaderValue::from_static("00-zz-zz-01"));
        continue_from_headers(&span, &headers);
    }
}
