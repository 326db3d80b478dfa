//! Runs **es-emulator**, a TEST DOUBLE of the Elasticsearch 8.x REST subset the service's
//! Elasticsearch backend uses (the library of this crate; behaviour documented in the
//! service's `docs/elasticsearch.md`), in its own process, in memory, until killed. It is not
//! Elasticsearch: use it for tests and local development only.
//!
//! ```text
//! cargo run -p es-emulator -- --listen 127.0.0.1:9200 [--refresh-interval 1s|-1]
//! ```
//!
//! `--refresh-interval` is the `index.refresh_interval` of indices that do not set one
//! (default `1s`; `-1`: only explicit refreshes make writes searchable).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

/// es-emulator: an in-memory TEST DOUBLE of a subset of the Elasticsearch 8.x REST API.
#[derive(Debug, Parser)]
#[command(name = "es-emulator")]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:9200")]
    listen: SocketAddr,
    /// Default refresh interval of indices that do not set one: a duration such as `1s` or
    /// `500ms`, or `-1` for explicit refreshes only.
    #[arg(long, default_value = "1s", allow_hyphen_values = true, value_parser = parse_interval)]
    refresh_interval: Interval,
}

#[derive(Debug, Clone, Copy)]
struct Interval(Option<Duration>);

fn parse_interval(text: &str) -> Result<Interval, String> {
    if text == "-1" {
        return Ok(Interval(None));
    }
    humantime::parse_duration(text)
        .map(|d| Interval(Some(d)))
        .map_err(|e| format!("not a duration or -1: {e}"))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    println!("es-emulator (test double) listening on http://{addr}");
    let config = es_emulator::EmulatorConfig {
        refresh_interval: args.refresh_interval.0,
    };
    es_emulator::serve(listener, config).await
}
