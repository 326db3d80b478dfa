//! Configuration: every setting is a command-line flag that is also read from the
//! environment (docs/design.md §7). Durations are humantime (`500ms`, `2m`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::store::elasticsearch::{EsSecuritySettings, Secret};
use crate::telemetry::LogFormat;
use crate::time::DurationSetting;
use crate::webhooks::WebhookArgs;

/// transfer-service: moves units between accounts atomically, in its embedded store (the
/// default) or in Elasticsearch by two-phase commit.
#[derive(Debug, Clone, Parser)]
#[command(name = "transfer-service", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The settings `audit` reads (the store's, the two that say when a transfer is stuck, and the
/// log's), by their ids: its `--help` lists these and no other.
pub const AUDIT_SETTINGS: [&str; 17] = [
    "data_dir",
    "embedded_cache_mib",
    "elasticsearch_url",
    "elasticsearch_api_key",
    "elasticsearch_api_key_file",
    "elasticsearch_username",
    "elasticsearch_username_file",
    "elasticsearch_password",
    "elasticsearch_password_file",
    "elasticsearch_ca_cert",
    "elasticsearch_ca_fingerprint",
    "index_prefix",
    "store_timeout",
    "audit_page_timeout",
    "transfer_timeout",
    "recovery_stale_after",
    "log_format",
];

impl Cli {
    /// The command line as the binary reads it: every setting is global, so it is accepted
    /// after the subcommand as well as before it (`audit --data-dir X`). `audit --help` lists
    /// only [`AUDIT_SETTINGS`]: the others are still taken after `audit` (a service's
    /// environment may hold them), hidden there.
    pub fn command_line() -> clap::Command {
        use clap::CommandFactory;
        let command = Self::command().mut_args(|arg| arg.global(true));
        let not_audits: Vec<clap::Arg> = command
            .get_arguments()
            .filter(|arg| !AUDIT_SETTINGS.contains(&arg.get_id().as_str()))
            .map(|arg| arg.clone().hide(true))
            .collect();
        command.mut_subcommand("audit", |audit| audit.args(not_audits))
    }

    /// Parses `args` (the program name first) as [`Cli::command_line`] reads them.
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::FromArgMatches;
        let mut matches = Self::command_line().try_get_matches_from(args)?;
        Self::from_arg_matches_mut(&mut matches)
    }

    /// The process's command line ([`Cli::try_parse_args`]); exits with clap's message on
    /// an error, and after printing `--help` or `--version`.
    pub fn parse_args() -> Self {
        Self::try_parse_args(std::env::args_os()).unwrap_or_else(|error| error.exit())
    }
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Serve HTTP (the default when no command is given).
    Serve,
    /// Check every invariant of docs/design.md §4 on the configured store; exit 1 on a
    /// violation, 2 when the store cannot be read. Reads only: the embedded store is opened
    /// read-only (a DATA_DIR without one is an error), Elasticsearch's indices must exist.
    Audit,
    /// Grow the accounts and transactions indices to more primary shards (Elasticsearch and
    /// OpenSearch): each is split into a copy of that many shards, its writes blocked for
    /// the moment that takes, and its name moved onto the copy (docs/operations.md,
    /// "Growing to more shards"). Running instances keep serving; exit 1 on a failure.
    Shards {
        /// The number of primary shards to grow to: from one, any number up to 512; from
        /// more, a multiple the index's routing allows.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=512))]
        to: u32,
        /// Say what would be done, and do nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the OpenAPI document served at `/openapi.json` and exit (regenerates the
    /// committed `openapi/openapi.json`).
    #[command(hide = true)]
    Openapi,
}

/// Settings shared by every command.
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// HTTP listen address: an IP address and a port (`0.0.0.0:8080` for every interface).
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8080", value_parser = parse_listen_addr)]
    pub listen_addr: SocketAddr,

    /// Use the Elasticsearch backend at this URL; unset: the embedded store in DATA_DIR.
    #[arg(long, env = "ELASTICSEARCH_URL")]
    pub elasticsearch_url: Option<String>,

    /// Directory of the embedded store.
    #[arg(long, env = "DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,

    /// The embedded store's page cache, in MiB: what of the file it keeps in memory.
    #[arg(long, env = "EMBEDDED_CACHE_MIB", default_value_t = crate::store::embedded::DEFAULT_CACHE_MIB)]
    pub embedded_cache_mib: usize,

    /// The longest time between the embedded store's checkpoints under load (its writes made
    /// durable in its file too, its write-ahead log emptied); a twentieth of it when many
    /// writers wait. Only latency, CPU and replay time depend on it: every acknowledged write
    /// is in the log until then.
    /// From 10ms to 1h.
    #[arg(long, env = "EMBEDDED_CHECKPOINT_INTERVAL", default_value = "1s", value_parser = EMBEDDED_CHECKPOINT_INTERVAL.parser())]
    pub embedded_checkpoint_interval: Duration,

    /// Credentials and CA of the Elasticsearch client.
    #[command(flatten)]
    pub elasticsearch_security: ElasticsearchSecurityArgs,

    /// Prefix of every Elasticsearch index the service owns.
    #[arg(long, env = "INDEX_PREFIX", default_value = "transfer-service-")]
    pub index_prefix: String,

    /// Primary shards of the accounts and transactions indices, set when the service creates
    /// them (an index that exists keeps its own count; `transfer-service shards` grows one).
    /// Each shard is a writer of its own on the cluster's nodes: more shards, more nodes' CPU.
    /// From 1 to 512.
    #[arg(long, env = "ELASTICSEARCH_SHARDS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=512))]
    pub elasticsearch_shards: u32,

    /// `_bulk` requests one instance keeps in flight at once (its writes are coalesced into
    /// them). Unset: 8, or one per shard (`ELASTICSEARCH_SHARDS`) if that is more, at most
    /// 64, so the engine has bulks to serve while the service handles the answer of another.
    /// Each bulk holds at most 32 MiB, so this bounds the bulk bytes in flight too.
    /// From 1 to 64.
    #[arg(long, env = "ELASTICSEARCH_BULKS_IN_FLIGHT", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub elasticsearch_bulks_in_flight: Option<u32>,

    /// How often the recovery loop looks for stale transfers.
    /// From 10ms to 1h.
    #[arg(long, env = "RECOVERY_INTERVAL", default_value = "1m", value_parser = RECOVERY_INTERVAL.parser())]
    pub recovery_interval: Duration,

    /// A transfer untouched this long is stale and recovery looks at it.
    /// From 100ms to 1day.
    #[arg(long, env = "RECOVERY_STALE_AFTER", default_value = "2m", value_parser = RECOVERY_STALE_AFTER.parser())]
    pub recovery_stale_after: Duration,

    /// How long a worker owns a transfer before others may take it over. A worker stops
    /// writing before its lease runs out (self-fencing), so this bounds how long a transfer
    /// waits after its worker died.
    /// From 100ms to 1h.
    #[arg(long, env = "LEASE_DURATION", default_value = "30s", value_parser = LEASE_DURATION.parser())]
    pub lease_duration: Duration,

    /// Age after which a transfer that has not committed is rolled back (`timed_out`).
    /// From 1s to 30days.
    #[arg(long, env = "TRANSFER_TIMEOUT", default_value = "1h", value_parser = TRANSFER_TIMEOUT.parser())]
    pub transfer_timeout: Duration,

    /// How long a hold (`"hold": true`) waits for its capture when the request gives no
    /// `hold_expires_in`; then it rolls back with `expired`. From 1s to 30days.
    #[arg(long, env = "HOLD_TIMEOUT", default_value = "24h", value_parser = HOLD_TIMEOUT.parser())]
    pub hold_timeout: Duration,

    /// Timeout of one store request (Elasticsearch HTTP call). Part of the self-fencing
    /// margin: a worker starts a write only if its lease outlives the request.
    /// From 10ms to 5m.
    #[arg(long, env = "STORE_TIMEOUT", default_value = "5s", value_parser = STORE_TIMEOUT.parser())]
    pub store_timeout: Duration,

    /// Time limit of one page of recovery's search for stale transfers and of the late-apply
    /// sweep's scan of accounts. Independent of the lease: these searches only find
    /// candidates (each is re-read before anything is written), so a slow page delays a sweep
    /// and endangers nothing, whereas a lease-bound timeout fails them once the store is large.
    /// From 100ms to 1h.
    #[arg(long, env = "RECOVERY_PAGE_TIMEOUT", default_value = "30s", value_parser = RECOVERY_PAGE_TIMEOUT.parser())]
    pub recovery_page_timeout: Duration,

    /// Time limit of one page the `audit` command reads. A page that runs out of it (or
    /// fails otherwise transiently) is asked again, smaller, rather than failing the audit.
    /// From 100ms to 1h.
    #[arg(long, env = "AUDIT_PAGE_TIMEOUT", default_value = "30s", value_parser = AUDIT_PAGE_TIMEOUT.parser())]
    pub audit_page_timeout: Duration,

    /// How long an account keeps the settled transfer ids (tombstones) that versions before
    /// marks wrote. This version writes none: a late apply is told apart by its mark and
    /// given back (`docs/design.md` §9, "The fence"); it still refuses an apply of an id it
    /// finds tombstoned, and drops each tombstone once this old, so an upgraded account's
    /// document sheds them on its first write after that.
    /// From 0s to 1day.
    #[arg(long, env = "SETTLED_RETENTION", default_value = "1s", value_parser = SETTLED_RETENTION.parser())]
    pub settled_retention: Duration,

    /// The most pending entries (plus young tombstones an older version left) an account
    /// holds: a hard bound on the account document, 70–190 bytes an entry by id length. An
    /// apply beyond it backs off until some settle, then rolls back with `account_busy`.
    #[arg(long, env = "SETTLED_MAX", default_value_t = 10_000, value_parser = parse_settled_max)]
    pub settled_max: usize,

    /// Transfers this instance accepts and has not yet driven to the end, at most; beyond it
    /// a create waits in line for room (`ADMISSION_WAIT`), then `POST /transfers` and
    /// `POST /transfers/batch` answer 503 with `Retry-After`, creating nothing. The default
    /// is about a tenth of a second of work on 2 cores (see `transfer::admission`). A batch
    /// larger than this is refused (422).
    #[arg(long, env = "MAX_IN_FLIGHT", default_value_t = crate::transfer::admission::DEFAULT_MAX_IN_FLIGHT, value_parser = parse_max_in_flight)]
    pub max_in_flight: usize,

    /// How long a create that finds `MAX_IN_FLIGHT` reached waits in line (first come, first
    /// served) for room before it is answered 503 with `Retry-After`. From 0s to 10s (`0s`:
    /// refused at once).
    #[arg(long, env = "ADMISSION_WAIT", default_value = "100ms", value_parser = ADMISSION_WAIT.parser())]
    pub admission_wait: Duration,

    /// How a transfer is settled. `auto`: in one store transaction where the store has them
    /// (the embedded store: one write of the transfer and its accounts together), by the
    /// two-phase protocol where it has not (Elasticsearch). `two-phase`: by the protocol on
    /// every store (to compare, or to run the embedded store exactly as Elasticsearch is run).
    #[arg(long, env = "PROTOCOL", value_enum, default_value_t = Protocol::Auto)]
    pub protocol: Protocol,

    /// File of API keys, one a line: `<name> <sha256 of the key, hex> <scopes>` (scopes
    /// `read`, `write`, comma-separated; `#` starts a comment). Set: `/accounts`,
    /// `/transfers` and `/events` need `Authorization: Bearer <key>` (`GET` the `read` scope, other methods
    /// `write`). Unset: the API is open to anyone who can reach it (a WARN line says so).
    /// Reloaded on SIGHUP and when its content changes.
    #[arg(long, env = "API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,

    /// How often `API_KEYS_FILE` is read to see whether it changed (SIGHUP reloads at once).
    /// From 100ms to 1day.
    #[arg(long, env = "API_KEYS_RELOAD_INTERVAL", default_value = "5s", value_parser = API_KEYS_RELOAD_INTERVAL.parser())]
    pub api_keys_reload_interval: Duration,

    /// `/metrics` needs a key with the `read` scope too (it is open otherwise, like the
    /// probes). Needs `API_KEYS_FILE`.
    #[arg(long, env = "METRICS_REQUIRE_AUTH")]
    pub metrics_require_auth: bool,

    /// Log format: `pretty` for people, `json` for log pipelines.
    #[arg(long, env = "LOG_FORMAT", default_value = "pretty")]
    pub log_format: LogFormat,

    /// Webhooks: where events are POSTed, signed (`crate::webhooks`).
    #[command(flatten)]
    pub webhooks: WebhookArgs,
}

/// How the service authenticates to Elasticsearch and which CA it trusts (docs/elasticsearch.md
/// §12). Secret values never print: `--help` hides their environment values and `Debug` shows
/// `***`. Prefer the environment or a `_FILE` to a flag, which other users of the host can
/// see in the process list.
#[derive(Debug, Clone, Default, Args)]
pub struct ElasticsearchSecurityArgs {
    /// API key, in the encoded form Elasticsearch and Kibana print (base64 of `id:api_key`);
    /// sent as `Authorization: ApiKey`.
    #[arg(long, env = "ELASTICSEARCH_API_KEY", hide_env_values = true)]
    pub elasticsearch_api_key: Option<Secret>,
    /// A file holding ELASTICSEARCH_API_KEY (a mounted secret).
    #[arg(long, env = "ELASTICSEARCH_API_KEY_FILE")]
    pub elasticsearch_api_key_file: Option<PathBuf>,
    /// User for basic authentication (with ELASTICSEARCH_PASSWORD).
    #[arg(long, env = "ELASTICSEARCH_USERNAME")]
    pub elasticsearch_username: Option<String>,
    /// A file holding ELASTICSEARCH_USERNAME.
    #[arg(long, env = "ELASTICSEARCH_USERNAME_FILE")]
    pub elasticsearch_username_file: Option<PathBuf>,
    /// Password of ELASTICSEARCH_USERNAME.
    #[arg(long, env = "ELASTICSEARCH_PASSWORD", hide_env_values = true)]
    pub elasticsearch_password: Option<Secret>,
    /// A file holding ELASTICSEARCH_PASSWORD (a mounted secret).
    #[arg(long, env = "ELASTICSEARCH_PASSWORD_FILE")]
    pub elasticsearch_password_file: Option<PathBuf>,
    /// PEM file of the CA that signed the cluster's HTTP certificate (Elasticsearch 8:
    /// `config/certs/http_ca.crt`), trusted besides the public roots.
    #[arg(long, env = "ELASTICSEARCH_CA_CERT")]
    pub elasticsearch_ca_cert: Option<PathBuf>,
    /// SHA-256 fingerprint of that CA, as Elasticsearch prints it at its first start (hex,
    /// `:` allowed): the service refuses to start if ELASTICSEARCH_CA_CERT holds no
    /// certificate with it.
    #[arg(long, env = "ELASTICSEARCH_CA_FINGERPRINT")]
    pub elasticsearch_ca_fingerprint: Option<String>,
}

impl ElasticsearchSecurityArgs {
    /// The settings as the store reads them.
    pub fn settings(&self) -> EsSecuritySettings {
        EsSecuritySettings {
            api_key: self.elasticsearch_api_key.clone(),
            api_key_file: self.elasticsearch_api_key_file.clone(),
            username: self.elasticsearch_username.clone(),
            username_file: self.elasticsearch_username_file.clone(),
            password: self.elasticsearch_password.clone(),
            password_file: self.elasticsearch_password_file.clone(),
            ca_cert: self.elasticsearch_ca_cert.clone(),
            ca_fingerprint: self.elasticsearch_ca_fingerprint.clone(),
        }
    }
}

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

/// Zero would checkpoint without pause.
pub const EMBEDDED_CHECKPOINT_INTERVAL: DurationSetting =
    DurationSetting::new("EMBEDDED_CHECKPOINT_INTERVAL", 10, HOUR, "1s");
/// Zero would search without pause.
pub const RECOVERY_INTERVAL: DurationSetting =
    DurationSetting::new("RECOVERY_INTERVAL", 10, HOUR, "1m");
/// Zero would take every transfer in flight for stale.
pub const RECOVERY_STALE_AFTER: DurationSetting =
    DurationSetting::new("RECOVERY_STALE_AFTER", 100, DAY, "2m");
/// Zero leaves a worker no time to write (it stops before its lease runs out): a hold's
/// capture then waits its whole 10 s and every step logs a warning.
pub const LEASE_DURATION: DurationSetting =
    DurationSetting::new("LEASE_DURATION", 100, HOUR, "30s");
pub const TRANSFER_TIMEOUT: DurationSetting =
    DurationSetting::new("TRANSFER_TIMEOUT", 1_000, 30 * DAY, "1h");
/// The bounds of a hold's own `hold_expires_in`.
pub const HOLD_TIMEOUT: DurationSetting = DurationSetting {
    name: "HOLD_TIMEOUT",
    min: crate::transfer::validated::MIN_HOLD,
    max: crate::transfer::validated::MAX_HOLD,
    example: "24h",
};
pub const STORE_TIMEOUT: DurationSetting = DurationSetting::new("STORE_TIMEOUT", 10, 5 * 60, "5s");
pub const RECOVERY_PAGE_TIMEOUT: DurationSetting =
    DurationSetting::new("RECOVERY_PAGE_TIMEOUT", 100, HOUR, "30s");
pub const AUDIT_PAGE_TIMEOUT: DurationSetting =
    DurationSetting::new("AUDIT_PAGE_TIMEOUT", 100, HOUR, "30s");
/// Zero drops an older version's tombstones at this version's first write of the account.
pub const SETTLED_RETENTION: DurationSetting =
    DurationSetting::new("SETTLED_RETENTION", 0, DAY, "1s");
/// Zero refuses at once; beyond 10 s a wait in line is better spent by the client retrying.
pub const ADMISSION_WAIT: DurationSetting = DurationSetting::new("ADMISSION_WAIT", 0, 10, "100ms");
pub const API_KEYS_RELOAD_INTERVAL: DurationSetting =
    DurationSetting::new("API_KEYS_RELOAD_INTERVAL", 100, DAY, "5s");

/// Every duration setting, with the webhooks' ([`crate::webhooks::DURATION_SETTINGS`]).
pub fn duration_settings() -> Vec<DurationSetting> {
    [
        EMBEDDED_CHECKPOINT_INTERVAL,
        RECOVERY_INTERVAL,
        RECOVERY_STALE_AFTER,
        LEASE_DURATION,
        TRANSFER_TIMEOUT,
        HOLD_TIMEOUT,
        STORE_TIMEOUT,
        RECOVERY_PAGE_TIMEOUT,
        AUDIT_PAGE_TIMEOUT,
        SETTLED_RETENTION,
        ADMISSION_WAIT,
        API_KEYS_RELOAD_INTERVAL,
    ]
    .into_iter()
    .chain(crate::webhooks::DURATION_SETTINGS)
    .collect()
}

/// `IP:port`; a host name is refused rather than resolved (which of its addresses would be
/// bound is a guess).
fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| {
        format!(
            "`{text}` is not an IP address and a port: LISTEN_ADDR is `IP:port`, such as \
             `127.0.0.1:8080`, `0.0.0.0:8080` or `[::]:8080` (a host name such as `localhost` \
             is not resolved)"
        )
    })
}

/// At most 10,000 tombstones per account (about 600 KB rewritten with every account write).
fn parse_settled_max(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
        _ => Err("a whole number from 1 to 10000".into()),
    }
}

/// At least 1: a bound of 0 would refuse every transfer.
fn parse_max_in_flight(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("a whole number of at least 1".into()),
    }
}

/// `PROTOCOL`: see [`Config::protocol`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    Auto,
    TwoPhase,
}

impl Config {
    /// A configuration for tests: embedded store in `data_dir`, port 0, sub-second timers.
    pub fn for_tests(data_dir: PathBuf) -> Self {
        Self {
            listen_addr: "127.0.0.1:0".parse().expect("valid address"),
            elasticsearch_url: None,
            elasticsearch_security: ElasticsearchSecurityArgs::default(),
            data_dir,
            embedded_cache_mib: crate::store::embedded::DEFAULT_CACHE_MIB,
            embedded_checkpoint_interval: crate::store::embedded::CHECKPOINT_INTERVAL,
            index_prefix: "transfer-service-".into(),
            elasticsearch_shards: 1,
            elasticsearch_bulks_in_flight: None,
            recovery_interval: Duration::from_millis(200),
            recovery_stale_after: Duration::from_secs(1),
            lease_duration: Duration::from_secs(2),
            transfer_timeout: Duration::from_secs(3600),
            hold_timeout: Duration::from_secs(24 * 3600),
            store_timeout: Duration::from_millis(500),
            recovery_page_timeout: Duration::from_secs(10),
            audit_page_timeout: Duration::from_secs(10),
            settled_retention: Duration::from_secs(3600),
            settled_max: 1000,
            max_in_flight: crate::transfer::admission::DEFAULT_MAX_IN_FLIGHT,
            admission_wait: crate::transfer::admission::DEFAULT_ADMISSION_WAIT,
            protocol: Protocol::Auto,
            api_keys_file: None,
            api_keys_reload_interval: Duration::from_millis(100),
            metrics_require_auth: false,
            log_format: LogFormat::Pretty,
            webhooks: WebhookArgs::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn settings_are_taken_after_the_subcommand_too() {
        let after = Cli::try_parse_args(["transfer-service", "audit", "--data-dir", "/x"]).unwrap();
        assert!(matches!(after.command, Some(Command::Audit)));
        assert_eq!(after.config.data_dir, PathBuf::from("/x"));
        let before =
            Cli::try_parse_args(["transfer-service", "--data-dir", "/y", "audit"]).unwrap();
        assert_eq!(before.config.data_dir, PathBuf::from("/y"));
        let defaults = Cli::try_parse_args(["transfer-service", "audit"]).unwrap();
        assert_eq!(defaults.config.data_dir, PathBuf::from("./data"));
        let error = Cli::try_parse_args(["transfer-service", "audit", "--data-dri", "/x"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--data-dir"), "a suggestion: {error}");
    }

    #[test]
    fn help_says_what_the_service_is_and_audit_help_lists_the_settings() {
        let mut command = Cli::command_line();
        let help = command.render_help().to_string();
        let first = help.lines().next().unwrap();
        assert!(
            first.contains("embedded store") && first.contains("Elasticsearch"),
            "{first}"
        );
        command.build();
        let audit = command.find_subcommand_mut("audit").unwrap();
        let help = audit.render_long_help().to_string();
        for flag in ["--data-dir", "--elasticsearch-url", "--audit-page-timeout"] {
            assert!(help.contains(flag), "{flag} in:\n{help}");
        }
    }

    #[test]
    fn audit_help_lists_the_audits_settings_and_no_other() {
        let mut command = Cli::command_line();
        command.build();
        let every: Vec<String> = command
            .get_arguments()
            .filter(|arg| {
                arg.get_long()
                    .is_some_and(|l| l != "help" && l != "version")
            })
            .map(|arg| arg.get_id().to_string())
            .collect();
        let audit = command.find_subcommand_mut("audit").unwrap();
        let help = audit.render_long_help().to_string();
        for id in &every {
            let flag = format!("--{} ", id.replace('_', "-"));
            let listed = help.contains(&flag);
            let audits = AUDIT_SETTINGS.contains(&id.as_str());
            assert_eq!(
                listed, audits,
                "{flag} listed: {listed}, read by audit: {audits}"
            );
        }
        for serve_only in ["--listen-addr", "--webhook-url", "--max-in-flight"] {
            assert!(!help.contains(serve_only), "{serve_only} in:\n{help}");
        }
        // Still taken after `audit`, and before it.
        let cli = Cli::try_parse_args([
            "transfer-service",
            "audit",
            "--listen-addr",
            "127.0.0.1:1",
            "--data-dir",
            "/x",
        ])
        .unwrap();
        assert_eq!(cli.config.listen_addr, "127.0.0.1:1".parse().unwrap());
        assert_eq!(cli.config.data_dir, PathBuf::from("/x"));
        // The service's own help still lists everything.
        let help = Cli::command_line().render_long_help().to_string();
        assert!(
            help.contains("--listen-addr") && help.contains("--data-dir"),
            "{help}"
        );
    }

    #[test]
    fn secrets_are_neither_in_help_nor_in_debug() {
        // The process's environment is shared by the tests of this binary: clap reads these
        // names only here.
        std::env::set_var("ELASTICSEARCH_API_KEY", "c2VjcmV0LWtleS1pZDpzM2NyM3Q=");
        std::env::set_var("ELASTICSEARCH_PASSWORD", "pa55-w0rd");
        std::env::set_var("WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let help = Cli::command().render_long_help().to_string();
        let cli = Cli::try_parse_from(["transfer-service"]).unwrap();
        std::env::remove_var("ELASTICSEARCH_API_KEY");
        std::env::remove_var("ELASTICSEARCH_PASSWORD");
        std::env::remove_var("WEBHOOK_SECRET");
        assert!(help.contains("ELASTICSEARCH_API_KEY"), "{help}");
        assert!(help.contains("WEBHOOK_SECRET"), "{help}");
        let debug = format!("{cli:?}");
        for secret in [
            "c2VjcmV0LWtleS1pZDpzM2NyM3Q=",
            "pa55-w0rd",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        ] {
            assert!(!help.contains(secret), "help shows {secret}");
            assert!(!debug.contains(secret), "Debug shows {secret}: {debug}");
        }
        let security = &cli.config.elasticsearch_security;
        assert_eq!(
            security.elasticsearch_password.as_ref().map(Secret::expose),
            Some("pa55-w0rd")
        );
    }

    /// The `--help` text of the setting read from the environment variable `env`.
    fn help_of(env: &str) -> String {
        let command = Cli::command_line();
        let arg = command
            .get_arguments()
            .find(|arg| arg.get_env().is_some_and(|e| e == env))
            .unwrap_or_else(|| panic!("no setting {env}"));
        arg.get_help().expect("a help text").to_string()
    }

    /// The error of the command line with `--<flag> <value>`.
    fn refusal(env: &str, value: &str) -> String {
        let flag = format!("--{}", env.to_ascii_lowercase().replace('_', "-"));
        Cli::try_parse_args(["transfer-service", &flag, value])
            .map(|_| panic!("{flag} {value} accepted"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn every_duration_setting_states_its_range_and_refuses_what_is_out_of_it() {
        let all = duration_settings();
        assert_eq!(all.len(), 16);
        for setting in all {
            let name = setting.name;
            let help = help_of(name).to_lowercase();
            assert!(help.contains(&setting.range()), "{name}'s help: {help}");
            let flag = format!("--{}", name.to_ascii_lowercase().replace('_', "-"));
            let at = |value: &str| Cli::try_parse_args(["transfer-service", &flag, value]);
            let parsed = |value: &str| -> Duration {
                let cli = at(value).unwrap_or_else(|e| panic!("{name}={value}: {e}"));
                let config = cli.config;
                let webhooks = &config.webhooks;
                match name {
                    "EMBEDDED_CHECKPOINT_INTERVAL" => config.embedded_checkpoint_interval,
                    "RECOVERY_INTERVAL" => config.recovery_interval,
                    "RECOVERY_STALE_AFTER" => config.recovery_stale_after,
                    "LEASE_DURATION" => config.lease_duration,
                    "TRANSFER_TIMEOUT" => config.transfer_timeout,
                    "HOLD_TIMEOUT" => config.hold_timeout,
                    "STORE_TIMEOUT" => config.store_timeout,
                    "RECOVERY_PAGE_TIMEOUT" => config.recovery_page_timeout,
                    "AUDIT_PAGE_TIMEOUT" => config.audit_page_timeout,
                    "SETTLED_RETENTION" => config.settled_retention,
                    "ADMISSION_WAIT" => config.admission_wait,
                    "API_KEYS_RELOAD_INTERVAL" => config.api_keys_reload_interval,
                    "WEBHOOK_RETRY_PERIOD" => webhooks.webhook_retry_period,
                    "WEBHOOK_TIMEOUT" => webhooks.webhook_timeout,
                    "WEBHOOK_BACKOFF_MIN" => webhooks.webhook_backoff_min,
                    "WEBHOOK_BACKOFF_MAX" => webhooks.webhook_backoff_max,
                    other => panic!("{other} is not read here: add it"),
                }
            };
            // The edges are taken, as written in the help.
            let (min, max) = (
                humantime::format_duration(setting.min).to_string(),
                humantime::format_duration(setting.max).to_string(),
            );
            assert_eq!(parsed(&min), setting.min, "{name}");
            assert_eq!(parsed(&max), setting.max, "{name}");
            assert_eq!(
                parsed(setting.example),
                humantime::parse_duration(setting.example).unwrap()
            );
            // Zero only where it means something; past the end never.
            let beyond =
                humantime::format_duration(setting.max + Duration::from_millis(1)).to_string();
            let error = refusal(name, &beyond);
            assert!(
                error.contains("is above the range") && error.contains(name),
                "{error}"
            );
            if setting.min.is_zero() {
                assert_eq!(parsed("0s"), Duration::ZERO, "{name}");
            } else {
                let error = refusal(name, "0s");
                assert!(
                    error.contains(&format!(
                        "`0s` is below the range: {name} is {}",
                        setting.range()
                    )),
                    "{error}"
                );
            }
            // What is no duration says the setting, the value and an example.
            let error = refusal(name, "fast");
            assert!(
                error.contains("`fast` is not a duration")
                    && error.contains(name)
                    && error.contains(&format!("such as `{}`", setting.example)),
                "{error}"
            );
        }
    }

    #[test]
    fn every_duration_settings_default_is_in_its_range() {
        let command = Cli::command_line();
        for setting in duration_settings() {
            let arg = command
                .get_arguments()
                .find(|arg| arg.get_env().is_some_and(|e| e == setting.name))
                .unwrap();
            let default = arg.get_default_values()[0].to_str().unwrap();
            assert!(setting.parse(default).is_ok(), "{}={default}", setting.name);
        }
    }

    #[test]
    fn a_listen_address_that_is_not_ip_and_port_says_what_is_expected() {
        let error = refusal("LISTEN_ADDR", "localhost:8080");
        assert!(
            error.contains("`localhost:8080` is not an IP address and a port: LISTEN_ADDR is `IP:port`, such as `127.0.0.1:8080`"),
            "{error}"
        );
        assert!(!error.contains("invalid socket address syntax"), "{error}");
        let cli = Cli::try_parse_args(["transfer-service", "--listen-addr", "[::1]:9"]).unwrap();
        assert_eq!(cli.config.listen_addr, "[::1]:9".parse().unwrap());
    }

    #[test]
    fn max_in_flight_defaults_to_1024_and_refuses_0() {
        let cli = Cli::try_parse_from(["transfer-service"]).unwrap();
        assert_eq!(cli.config.max_in_flight, 1024);
        let cli = Cli::try_parse_from(["transfer-service", "--max-in-flight", "2"]).unwrap();
        assert_eq!(cli.config.max_in_flight, 2);
        for bad in ["0", "-1", "many"] {
            assert!(
                Cli::try_parse_from(["transfer-service", "--max-in-flight", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_embedded_checkpoint_interval_defaults_to_the_stores() {
        let cli = Cli::try_parse_from(["transfer-service"]).unwrap();
        assert_eq!(
            cli.config.embedded_checkpoint_interval,
            crate::store::embedded::CHECKPOINT_INTERVAL
        );
        let cli = Cli::try_parse_from([
            "transfer-service",
            "--embedded-checkpoint-interval",
            "200ms",
        ])
        .unwrap();
        assert_eq!(
            cli.config.embedded_checkpoint_interval,
            Duration::from_millis(200)
        );
    }

    #[test]
    fn api_keys_are_off_by_default_and_metrics_auth_is_a_flag() {
        let cli = Cli::try_parse_from(["transfer-service"]).unwrap();
        assert!(!cli.config.metrics_require_auth);
        assert_eq!(cli.config.api_keys_file, None);
        assert_eq!(cli.config.api_keys_reload_interval, Duration::from_secs(5));
        let cli = Cli::try_parse_from(["transfer-service", "--metrics-require-auth"]).unwrap();
        assert!(cli.config.metrics_require_auth);
    }

    #[test]
    fn webhook_lists_are_comma_separated_and_default_to_the_terminal_events() {
        let cli = Cli::try_parse_from(["transfer-service"]).unwrap();
        let hooks = &cli.config.webhooks;
        assert!(hooks.webhook_url.is_empty());
        assert_eq!(
            hooks.webhook_events,
            ["transfer.finished", "transfer.rolled-back"]
        );
        assert_eq!(hooks.webhook_retry_period, Duration::from_secs(24 * 3600));
        assert_eq!(hooks.webhook_timeout, Duration::from_secs(10));
        let cli = Cli::try_parse_from([
            "transfer-service",
            "--webhook-url",
            "http://a.test/h,https://b.test/h",
            "--webhook-events",
            "transfer.created,transfer.captured",
            "--webhook-retry-period",
            "2h",
        ])
        .unwrap();
        let hooks = &cli.config.webhooks;
        assert_eq!(hooks.webhook_url, ["http://a.test/h", "https://b.test/h"]);
        assert_eq!(
            hooks.webhook_events,
            ["transfer.created", "transfer.captured"]
        );
        assert_eq!(hooks.webhook_retry_period, Duration::from_secs(7200));
    }
}
