//! Logging: `tracing` with `RUST_LOG` filtering (default `info`) and `LOG_FORMAT=json|pretty`.
//!
//! Every line carries the spans it happened in: `request{method, route, request_id}` for
//! HTTP requests (see [`crate::http::router`]) and `transfer{transfer_id}` for every step a
//! worker or recovery takes on a transfer. In JSON, the innermost span's fields are under
//! `span` and every enclosing span is listed under `spans`, outermost first; the event's own
//! fields (`message`, `status`, `latency_us`, `from`, `to`, ...) are at the top level.
//!
//! Traces ([`traces`]): with an OTLP endpoint configured, the same spans are exported as
//! OpenTelemetry spans, and a JSON line written inside an exported span carries that span's
//! `trace_id` and `span_id` at its top level ([`WithTraceIds`]).

use std::io::IsTerminal;

pub mod traces;

/// How log lines are written (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::trace::SdkTracer;
use tracing::Subscriber;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::trace_context;
use traces::Traces;

/// The filter when `RUST_LOG` is unset or invalid.
pub const DEFAULT_FILTER: &str = "info";

/// Installs the global subscriber, writing to stdout, and starts exporting traces when the
/// environment asks for it ([`traces`]); a second call (tests) is a no-op. The handle that
/// stops the export, when it runs.
pub fn init(format: LogFormat) -> Option<Traces> {
    let filter = match EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(error) => {
            if std::env::var_os(EnvFilter::DEFAULT_ENV).is_some() {
                eprintln!("RUST_LOG is invalid ({error}); logging at `{DEFAULT_FILTER}`");
            }
            EnvFilter::new(DEFAULT_FILTER)
        }
    };
    // A configuration tracing cannot follow turns tracing off, not the service.
    let (tracer, traces, refused) = match Traces::start() {
        Ok(Some((tracer, traces))) => (Some(tracer), Some(traces), None),
        Ok(None) => (None, None, None),
        Err(why) => (None, None, Some(why)),
    };
    let ansi = format == LogFormat::Pretty && std::io::stdout().is_terminal();
    let exporting = tracer.is_some();
    if subscriber(format, filter, std::io::stdout, ansi, tracer)
        .try_init()
        .is_ok()
        && exporting
    {
        trace_context::turn_on();
    }
    if let Some(why) = refused {
        tracing::warn!(reason = %why, "traces are not exported");
    }
    traces
}

/// The subscriber [`init`] installs, writing to `writer` (tests capture logs with it).
/// `ansi` colours the pretty format; JSON never has colours. With a `tracer`, spans are also
/// exported ([`traces`]): those of the service at `info`, and those only tracing needs
/// ([`trace_context::TARGET`]) at every level, whatever `RUST_LOG` says of the log lines.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
    tracer: Option<SdkTracer>,
) -> Box<dyn Subscriber + Send + Sync + 'static>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let Some(tracer) = tracer else {
        return logs_only(format, filter, writer, ansi);
    };
    // What a span costs is what the trace is for: no source locations, thread names or
    // busy/idle timing (a clock read at every poll of every span), and of the log events
    // only warnings and errors, which mark what went wrong in the trace.
    // The recovery loop's span lasts as long as the process: exported, it would be one trace
    // holding every search of every pass. Each transfer it resumes is a trace's span of its
    // own (`crate::transfer::transfer_span`).
    let spans = Targets::new()
        .with_target(trace_context::TARGET, tracing::Level::TRACE)
        .with_target("transfer_service::transfer::recovery", tracing::Level::WARN)
        .with_target(trace_context::IN_REQUEST, tracing::Level::WARN)
        .with_default(tracing::Level::INFO);
    let exported = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_threads(false)
        .with_location(false)
        .with_tracked_inactivity(false)
        .with_filter(tracing_subscriber::filter::filter_fn(move |meta| {
            if meta.is_event() {
                *meta.level() <= tracing::Level::WARN
            } else {
                spans.would_enable(meta.target(), meta.level())
            }
        }));
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi && format == LogFormat::Pretty);
    let registry = tracing_subscriber::registry().with(exported);
    match format {
        LogFormat::Json => {
            let json = tracing_subscriber::fmt::format()
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(true);
            Box::new(
                registry.with(
                    lines
                        .fmt_fields(JsonFields::new())
                        .event_format(WithTraceIds(json))
                        .with_filter(filter),
                ),
            )
        }
        LogFormat::Pretty => Box::new(registry.with(lines.with_filter(filter))),
    }
}

/// A JSON line with the ids of the trace it belongs to, `trace_id` and `span_id` at its top
/// level, when it is written inside an exported span: read, as the line is written, from
/// OpenTelemetry's current context (the innermost exported span entered, which the layer
/// sets as it is entered: context activation, its default), so that no span records them.
/// A line outside any trace is written as the JSON format writes it.
struct WithTraceIds<F>(F);

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let ids = opentelemetry::Context::map_current(|context| {
            let span = context.span();
            let ids = span.span_context();
            ids.is_valid().then(|| (ids.trace_id(), ids.span_id()))
        });
        let Some((trace_id, span_id)) = ids else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        // One JSON object and its newline: the ids go in before the object's last brace.
        let Some(end) = line.rfind('}') else {
            return writer.write_str(&line);
        };
        let (object, rest) = line.split_at(end);
        write!(
            writer,
            "{object},\"trace_id\":\"{trace_id:032x}\",\"span_id\":\"{span_id:016x}\"{rest}"
        )
    }
}

/// The subscriber without traces: log lines only, filtered once for every span and event.
fn logs_only<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn Subscriber + Send + Sync + 'static>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi && format == LogFormat::Pretty);
    match format {
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(true)
                .finish(),
        ),
        LogFormat::Pretty => Box::new(builder.finish()),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn is_hex_id(value: &serde_json::Value, digits: usize) -> bool {
        value.as_str().is_some_and(|id| {
            id.len() == digits
                && id
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                && id.bytes().any(|b| b != b'0')
        })
    }

    #[test]
    fn a_json_line_inside_an_exported_span_names_its_trace_and_one_outside_names_none() {
        let captured = Captured::default();
        let writer = captured.clone();
        let tracer = SdkTracerProvider::builder().build().tracer("test");
        let subscriber = subscriber(
            LogFormat::Json,
            EnvFilter::new("info"),
            move || writer.clone(),
            false,
            Some(tracer),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside");
            let span = tracing::info_span!("request", route = "/transfers");
            let _in = span.enter();
            // A brace and a quote in a field: the ids still go after the object's own fields.
            tracing::info!(detail = "a } and a \"", "inside");
        });
        let bytes = captured.0.lock().unwrap().clone();
        let lines: Vec<serde_json::Value> = String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0]["message"], "outside");
        assert!(lines[0].get("trace_id").is_none(), "{}", lines[0]);
        let inside = &lines[1];
        assert_eq!(inside["message"], "inside");
        assert_eq!(inside["detail"], "a } and a \"");
        assert_eq!(inside["span"]["route"], "/transfers");
        assert!(is_hex_id(&inside["trace_id"], 32), "{inside}");
        assert!(is_hex_id(&inside["span_id"], 16), "{inside}");
    }
}
