//! Wiring: open the store, build the engine, bind the listener, serve until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};

use crate::auth::{ApiKeys, KeyFileError};
use crate::config::{Config, Protocol};
use crate::http::auth::Auth;
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::store::coalescer::WriteCoalescer;
use crate::store::elasticsearch::{ElasticsearchStore, EsConfig, EsCredentials, SearchEngine};
use crate::store::embedded::{EmbeddedStore, ReadOnlyEmbeddedStore};
use crate::store::instrumented::InstrumentedStore;
use crate::store::{DynStore, StoreError};
use crate::transfer::{self, Engine, EngineConfig};
use crate::webhooks::{WebhookSettings, Webhooks};

/// How long shutdown waits for drivers to reach a step boundary.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(8);

/// Most ops the Elasticsearch write coalescer puts in one `_bulk`.
const MAX_BULK_OPS: usize = 512;

/// What one `_bulk` may carry, well under Elasticsearch's default `http.max_content_length`
/// (100 MB).
const MAX_BULK_BYTES: usize = 32 * 1024 * 1024;

/// Ops per `_bulk` such that even batches of the largest account documents (every tombstone
/// kept, up to ~160 bytes each with 128-character ids, plus ~2 KB for the rest) stay under
/// [`MAX_BULK_BYTES`].
fn bulk_ops_limit(settled_max: usize) -> usize {
    let largest_doc = 2048 + settled_max * 160;
    (MAX_BULK_BYTES / largest_doc).clamp(1, MAX_BULK_OPS)
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    ApiKeys(#[from] KeyFileError),
    #[error("METRICS_REQUIRE_AUTH needs API_KEYS_FILE: without keys nobody could scrape /metrics")]
    MetricsAuthWithoutKeys,
    /// A webhook setting is wrong; the message names it (and never quotes the secret).
    #[error("{0}")]
    Webhooks(String),
}

/// The webhooks `config` asks for, checked.
fn webhooks_from_config(config: &Config) -> Result<Option<WebhookSettings>, StartError> {
    WebhookSettings::from_args(&config.webhooks, config.lease_duration)
        .map_err(StartError::Webhooks)
}

/// The authentication `config` asks for: the keys of `API_KEYS_FILE`, read now (a file that
/// cannot be read or parsed stops the start), or none, said in a WARN line.
pub fn auth_from_config(config: &Config, metrics: &Arc<Metrics>) -> Result<Auth, StartError> {
    match &config.api_keys_file {
        Some(path) => {
            let keys = ApiKeys::load(path, metrics.clone())?;
            Ok(Auth::with_keys(Arc::new(keys), config.metrics_require_auth))
        }
        None if config.metrics_require_auth => Err(StartError::MetricsAuthWithoutKeys),
        None => {
            tracing::warn!(
                "no API keys (API_KEYS_FILE is unset): the API is open to anyone who can reach \
                 this port; set API_KEYS_FILE to require keys"
            );
            Ok(Auth::open())
        }
    }
}

/// What opening a store does about migrations, which also says who opens it (and so which
/// timeouts apply; see [`open_store`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationMode {
    /// Apply them (retried in the background until the cluster answers), creating the store
    /// if there is none: the service.
    Apply,
    /// Only check they were applied, writing nothing; fail otherwise: the auditor. The
    /// embedded store is opened read-only (`ReadOnlyEmbeddedStore`): an error where there is
    /// no store, never a new one.
    Verify,
}

/// `(request timeout, page timeout)` of an Elasticsearch store. The service's requests fit
/// in a quarter lease (a worker writes on their answers); the pages of its recovery and
/// late-apply sweeps get `RECOVERY_PAGE_TIMEOUT` instead, whatever the lease. The auditor
/// holds no lease: `STORE_TIMEOUT` whole, and `AUDIT_PAGE_TIMEOUT` for its pages.
fn es_timeouts(config: &Config, migrations: MigrationMode) -> (Duration, Duration) {
    match migrations {
        MigrationMode::Apply => (
            engine_config(config).request_timeout,
            config.recovery_page_timeout,
        ),
        MigrationMode::Verify => (config.store_timeout, config.audit_page_timeout),
    }
}

/// Opens the configured backend: Elasticsearch when `ELASTICSEARCH_URL` is set, else the
/// embedded store (whose reads are local and have no timeout).
pub async fn open_store(
    config: &Config,
    metrics: &Arc<Metrics>,
    migrations: MigrationMode,
) -> Result<DynStore, StoreError> {
    let backend: DynStore = match &config.elasticsearch_url {
        Some(url) => {
            let store = Arc::new(connect_elasticsearch(config, url, migrations).await?);
            if migrations == MigrationMode::Verify {
                store.verify_migrated().await?;
            } else if let Err(error) = store.migrate().await {
                // Refused credentials or privileges will not fix themselves: say so and stop,
                // rather than retry in the background as for a cluster that is not up yet.
                if matches!(error, StoreError::Denied { .. }) {
                    return Err(error);
                }
                tracing::warn!(%error, "migrations not applied yet; retrying in the background");
                let retry = store.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        match retry.migrate().await {
                            Ok(()) => {
                                tracing::info!("migrations applied");
                                break;
                            }
                            Err(error) => tracing::warn!(%error, "migrations still failing"),
                        }
                    }
                });
            }
            Arc::new(WriteCoalescer::with_in_flight(
                store,
                bulk_ops_limit(config.settled_max),
                bulks_in_flight(config),
            ))
        }
        None if migrations == MigrationMode::Verify => Arc::new(ReadOnlyEmbeddedStore::open(
            &config.data_dir,
            config.embedded_cache_mib,
        )?),
        None => Arc::new(EmbeddedStore::open_with(
            &config.data_dir,
            config.embedded_cache_mib,
            config.embedded_checkpoint_interval,
        )?),
    };
    Ok(Arc::new(InstrumentedStore::new(backend, metrics.clone())))
}

/// `_bulk`s in flight at once when `ELASTICSEARCH_BULKS_IN_FLIGHT` is unset, unless the shards
/// ask for more: measured on one node, 8 gave a third more transfers a second than 1 for
/// less engine CPU each (`docs/benchmark.md`, "Bulks in flight").
const DEFAULT_BULKS_IN_FLIGHT: u32 = 8;

/// `_bulk`s in flight at once: as set, else the default or one per shard of the indices this
/// instance creates, whichever is more (at most 64).
fn bulks_in_flight(config: &Config) -> usize {
    let bulks = config.elasticsearch_bulks_in_flight.unwrap_or(
        DEFAULT_BULKS_IN_FLIGHT
            .max(config.elasticsearch_shards)
            .min(64),
    );
    usize::try_from(bulks).unwrap_or(1)
}

/// The Elasticsearch backend as configured, its engine checked (an engine the service does not
/// support will not become one: refuse to start, naming what answered; one not up yet is
/// waited for by the caller).
pub async fn connect_elasticsearch(
    config: &Config,
    url: &str,
    migrations: MigrationMode,
) -> Result<ElasticsearchStore, StoreError> {
    let (request_timeout, page_timeout) = es_timeouts(config, migrations);
    let security = config.elasticsearch_security.settings().load()?;
    let api_key = matches!(security.credentials, Some(EsCredentials::ApiKey(_)));
    tracing::info!(
        credentials = security.describe(),
        ca = ?config.elasticsearch_security.elasticsearch_ca_cert,
        "Elasticsearch client"
    );
    let store = ElasticsearchStore::connect_secured(
        EsConfig {
            url: url.to_owned(),
            index_prefix: config.index_prefix.clone(),
            request_timeout,
            shards: config.elasticsearch_shards,
        },
        security,
    )
    .await?
    .with_page_timeout(page_timeout);
    match store.detect_engine().await {
        Err(error @ StoreError::Permanent(_)) => Err(error),
        Ok(SearchEngine::OpenSearch(_)) if api_key => Err(StoreError::Permanent(
            "ELASTICSEARCH_API_KEY is an Elasticsearch API key, and ELASTICSEARCH_URL \
             points at OpenSearch, which has none: give its security plugin's user \
             with ELASTICSEARCH_USERNAME and ELASTICSEARCH_PASSWORD"
                .into(),
        )),
        _ => Ok(store),
    }
}

/// A built service: store open, listener bound, not yet serving.
pub struct Application {
    listener: TcpListener,
    addr: SocketAddr,
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    auth: Arc<Auth>,
    api_keys_reload_interval: Duration,
    webhooks: Option<WebhookSettings>,
}

impl Application {
    pub async fn build(config: Config) -> Result<Self, StartError> {
        // Checked before the store is opened: a wrong setting stops the start at once.
        webhooks_from_config(&config)?;
        let metrics = Metrics::new();
        let store = open_store(&config, &metrics, MigrationMode::Apply).await?;
        Self::build_with_store(config, store, metrics).await
    }

    /// Builds on a given store (tests wrap stores to inject faults).
    pub async fn build_with_store(
        config: Config,
        store: DynStore,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StartError> {
        let auth = Arc::new(auth_from_config(&config, &metrics)?);
        let webhooks = webhooks_from_config(&config)?;
        let engine = Engine::new(store, engine_config(&config), metrics.clone());
        let listener = listen(config.listen_addr).map_err(|source| StartError::Listen {
            addr: config.listen_addr,
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| StartError::Listen {
            addr: config.listen_addr,
            source,
        })?;
        Ok(Self {
            listener,
            addr,
            engine,
            metrics,
            auth,
            api_keys_reload_interval: config.api_keys_reload_interval,
            webhooks,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Serves until `signal` resolves, then shuts down gracefully: stop accepting, let
    /// drivers reach a step boundary and release their leases and account flushers write the
    /// batch they hold, stop recovery.
    pub async fn run_until(
        self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let engine = self.engine.clone();
        engine.recovery().spawn_loop();
        // Tasks of their own: transfers never wait on a receiver.
        let webhooks = self.webhooks.map(|settings| {
            tracing::info!(
                receivers = ?settings.receivers.iter().map(|r| r.label.as_str()).collect::<Vec<_>>(),
                events = ?settings.events.iter().map(|e| e.type_name()).collect::<Vec<_>>(),
                "webhooks on"
            );
            Webhooks::spawn(engine.feed().clone(), settings, self.metrics.clone())
        });
        let shutdown = engine.shutdown_token();
        if let Some(keys) = self.auth.keys() {
            keys.spawn_watcher(self.api_keys_reload_interval, shutdown.clone());
        }
        let state = AppState {
            engine: engine.clone(),
            metrics: self.metrics.clone(),
            auth: self.auth.clone(),
        };
        tracing::info!(addr = %self.addr, store = engine.store().backend(), "serving");
        let serve =
            axum::serve(self.listener, http::router(state)).with_graceful_shutdown(async move {
                tokio::select! {
                    _ = signal => {}
                    _ = shutdown.cancelled() => {}
                }
                shutdown.cancel();
            });
        let result = serve.await;
        engine.shut_down();
        if !engine.wait_idle(SHUTDOWN_GRACE).await {
            tracing::warn!("workers still running after the grace period; recovery resumes them");
        }
        if let Some(webhooks) = webhooks {
            // They save their progress and release their leases on the engine's shutdown.
            webhooks.stopped(SHUTDOWN_GRACE).await;
        }
        result
    }
}

/// Resolves on SIGTERM or ctrl-c.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
    tracing::info!("shutdown signal received");
}

/// `transfer-service` / `transfer-service serve`: serve until SIGTERM or ctrl-c.
pub async fn serve(config: Config) -> std::process::ExitCode {
    let app = match Application::build(config).await {
        Ok(app) => app,
        Err(error) => {
            tracing::error!(%error, "cannot start");
            return std::process::ExitCode::FAILURE;
        }
    };
    match app.run_until(shutdown_signal()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "server failed");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Connections the kernel may queue before the service accepts them. tokio's default (1,024)
/// overflows when a few thousand clients connect at once, and a refused SYN is retried only
/// after a second; the kernel caps this at `net.core.somaxconn` (4,096 on current Linux).
const LISTEN_BACKLOG: u32 = 4096;

/// The listening socket (with `SO_REUSEADDR`, as `TcpListener::bind` sets it on Unix).
fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The `audit` command: opens the store as configured, verifying its migrations and changing
/// nothing, and audits it (`crate::audit`); exit 2 if it cannot be opened.
pub async fn audit(config: Config) -> std::process::ExitCode {
    let metrics = Metrics::new();
    let store = match open_store(&config, &metrics, MigrationMode::Verify).await {
        Ok(store) => store,
        Err(error) => {
            eprintln!("audit: cannot open the store: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    // In flight past its timeout and two recovery periods: stuck.
    let stuck = config.transfer_timeout + config.recovery_stale_after * 2;
    crate::audit::run(store, stuck.as_millis() as i64).await
}

/// `transfer-service shards --to N [--dry-run]`: exit 0 when every data index has (or, on a
/// dry run, can be grown to) `to` shards; 1 on a refusal or failure; 2 without Elasticsearch.
pub async fn grow_shards(config: Config, to: u32, dry_run: bool) -> std::process::ExitCode {
    let Some(url) = config.elasticsearch_url.clone() else {
        eprintln!("shards: ELASTICSEARCH_URL is not set: the embedded store has no shards");
        return std::process::ExitCode::from(2);
    };
    let grown = async {
        let store = connect_elasticsearch(&config, &url, MigrationMode::Verify).await?;
        store.verify_migrated().await?;
        store.grow_shards(to, dry_run).await
    };
    match grown.await {
        Ok(growths) => {
            let verb = if dry_run { "would grow" } else { "grown" };
            for growth in growths {
                println!("shards: {verb}: {growth}");
            }
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("shards: {error}");
            std::process::ExitCode::from(1)
        }
    }
}

/// The engine's settings from the service's: a request fits in the lease with room to spare
/// (at most a quarter of it), the skew margin scales with the lease, and `PROTOCOL=auto`
/// settles in one transaction where the store has them.
pub fn engine_config(config: &Config) -> EngineConfig {
    let lease = config.lease_duration;
    // A request must fit in the lease with room to spare: cap it at a quarter lease.
    let request_timeout = config.store_timeout.min(lease / 4);
    EngineConfig {
        lease,
        request_timeout,
        skew_margin: transfer::skew_margin(lease),
        transfer_timeout: config.transfer_timeout,
        hold_timeout: config.hold_timeout,
        retention: transfer::protocol::Retention {
            millis: config.settled_retention.as_millis() as i64,
            max_entries: config.settled_max,
        },
        max_conflicts: 200,
        max_store_attempts: 6,
        recovery_interval: config.recovery_interval,
        recovery_stale_after: config.recovery_stale_after,
        recovery_page: 100,
        sweep_pages_per_tick: 10,
        max_in_flight: config.max_in_flight,
        admission_wait: config.admission_wait,
        one_transaction: config.protocol == Protocol::Auto,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_pages_have_timeouts_of_their_own_whatever_the_lease() {
        let mut config = Config::for_tests("unused".into());
        config.lease_duration = Duration::from_millis(200);
        config.store_timeout = Duration::from_secs(5);
        config.recovery_page_timeout = Duration::from_secs(20);
        config.audit_page_timeout = Duration::from_secs(40);
        assert_eq!(
            es_timeouts(&config, MigrationMode::Apply),
            (Duration::from_millis(50), Duration::from_secs(20))
        );
        assert_eq!(
            es_timeouts(&config, MigrationMode::Verify),
            (Duration::from_secs(5), Duration::from_secs(40))
        );
    }

    #[test]
    fn bulk_batches_stay_under_the_size_limit_whatever_the_tombstones() {
        assert_eq!(bulk_ops_limit(100), MAX_BULK_OPS);
        for settled_max in [0, 100, 1_000, 10_000] {
            let ops = bulk_ops_limit(settled_max);
            assert!(ops >= 1);
            assert!(
                ops * (2048 + settled_max * 160) <= MAX_BULK_BYTES,
                "{settled_max}"
            );
        }
    }
}
