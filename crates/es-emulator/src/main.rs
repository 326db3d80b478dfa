//! Runs **es-emulator**, a TEST DOUBLE of the Elasticsearch 8.x REST subset the service's
//! Elasticsearch backend uses (the library of this crate; behaviour documented in the
//! service's `docs/elasticsearch.md`), in its own process, in memory, until killed. It is not
//! Elasticsearch: use it for tests and local development only.
//!
//! ```text
//! cargo run -p es-emulator -- --listen 127.0.0.1:9200 [--refresh-interval 1s|-1]
//!     [--api-key ID:SECRET]... [--user NAME:PASSWORD]... [--tls-cert FILE --tls-key FILE]
//!     [--shard-op-cost 300us]
//! ```
//!
//! `--refresh-interval` is the `index.refresh_interval` of indices that do not set one
//! (default `1s`; `-1`: only explicit refreshes make writes searchable). With `--api-key` or
//! `--user`, security is on and only those credentials are accepted, each with every
//! privilege (the key's encoded form is printed). `--tls-cert` (PEM chain, leaf first) and
//! `--tls-key` (PEM) serve HTTPS. `--shard-op-cost` turns the capacity model on: every
//! shard serves its operations one at a time, each taking that long (the library's
//! `capacity` module; default `0`, off).

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
    /// An API key `ID:SECRET` to accept (security on); repeatable.
    #[arg(long = "api-key")]
    api_keys: Vec<String>,
    /// A user `NAME:PASSWORD` to accept with basic authentication (security on); repeatable.
    #[arg(long = "user")]
    users: Vec<String>,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); needs `--tls-key`.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// The capacity model: how long one operation occupies its shard (a bulk item, a
    /// document write or get; one per shard for a search, refresh or stats request), each
    /// shard serving one at a time, such as `300us`. `0` is off.
    #[arg(long, default_value = "0", value_parser = parse_cost)]
    shard_op_cost: Duration,
}

/// `ID:SECRET` or `NAME:PASSWORD`.
fn pair(text: &str, what: &str) -> std::io::Result<(String, String)> {
    text.split_once(':')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{what}: expected A:B"),
            )
        })
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

fn parse_cost(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(text).map_err(|e| format!("not a duration: {e}"))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let mut security = es_emulator::SecurityConfig::default();
    for key in &args.api_keys {
        let (id, secret) = pair(key, "--api-key")?;
        let key = es_emulator::ApiKey::new(&id, &secret, es_emulator::Grant::superuser());
        println!("es-emulator: API key {id} (encoded: {})", key.encoded());
        security.api_keys.push(key);
    }
    for user in &args.users {
        let (name, password) = pair(user, "--user")?;
        security.users.push(es_emulator::User {
            name,
            password,
            roles: vec!["superuser".into()],
            grant: es_emulator::Grant::superuser(),
        });
    }
    let secured = !security.api_keys.is_empty() || !security.users.is_empty();
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(es_emulator::TlsConfig {
            cert_chain_pem: std::fs::read_to_string(cert)?,
            key_pem: std::fs::read_to_string(key)?,
        }),
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("es-emulator (test double) listening on {scheme}://{addr}");
    if !args.shard_op_cost.is_zero() {
        println!(
            "es-emulator: capacity model on, {:?} per shard operation",
            args.shard_op_cost
        );
    }
    let config = es_emulator::EmulatorConfig {
        refresh_interval: args.refresh_interval.0,
        security: secured.then_some(security),
        tls,
    };
    es_emulator::serve_with_shard_op_cost(listener, config, args.shard_op_cost).await
}
