//! Logging: `tracing` with `RUST_LOG` filtering (default `info`) and `LOG_FORMAT=json|pretty`.
//!
//! Every line carries the spans it happened in: `request{method, route, request_id}` for
//! HTTP requests (see [`crate::http::router`]) and `transfer{transfer_id}` for every step a
//! worker or recovery takes on a transfer. In JSON, the innermost span's fields are under
//! `span` and every enclosing span is listed under `spans`, outermost first; the event's own
//! fields (`message`, `status`, `latency_us`, `from`, `to`, ...) are at the top level.

use std::io::IsTerminal;

/// How log lines are written (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

use tracing::Subscriber;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// The filter when `RUST_LOG` is unset or invalid.
pub const DEFAULT_FILTER: &str = "info";

/// Installs the global subscriber, writing to stdout; a second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    let filter = match EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(error) => {
            if std::env::var_os(EnvFilter::DEFAULT_ENV).is_some() {
                eprintln!("RUST_LOG is invalid ({error}); logging at `{DEFAULT_FILTER}`");
            }
            EnvFilter::new(DEFAULT_FILTER)
        }
    };
    let ansi = format == LogFormat::Pretty && std::io::stdout().is_terminal();
    let _ = subscriber(format, filter, std::io::stdout, ansi).try_init();
}

/// The subscriber [`init`] installs, writing to `writer` (tests capture logs with it).
/// `ansi` colours the pretty format; JSON never has colours.
pub fn subscriber<W>(
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
