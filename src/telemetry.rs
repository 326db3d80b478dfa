//! Logging: `tracing` with `RUST_LOG` filtering (default `info`) and `LOG_FORMAT=json|pretty`.
//!
//! Every line carries the spans it happened in: `request{method, route, request_id}` for
//! HTTP requests (see [`crate::http::router`]) and `transfer{transfer_id}` for every step a
//! worker or recovery takes on a transfer. In JSON, the innermost span's fields are under
//! `span` and every enclosing span is listed under `spans`, outermost first; the event's own
//! fields (`message`, `status`, `latency_us`, `from`, `to`, ...) are at the top level.
//!
//! Traces ([`traces`]): with an OTLP endpoint configured, the same spans are exported as
//! OpenTelemetry spans, and the request and transfer spans carry `trace_id` and `span_id`.

use std::io::IsTerminal;

pub mod traces;

/// How log lines are written (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

use opentelemetry_sdk::trace::SdkTracer;
use tracing::Subscriber;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
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
        LogFormat::Json => Box::new(
            registry.with(
                lines
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(true)
                    .with_filter(filter),
            ),
        ),
        LogFormat::Pretty => Box::new(registry.with(lines.with_filter(filter))),
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
