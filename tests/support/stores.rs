//! Stores under test, on every backend: the embedded store in a temp dir, the Elasticsearch
//! backend on the emulator (the `es-emulator` crate, a TEST DOUBLE of Elasticsearch, in this
//! process), and the Elasticsearch backend on a real cluster (`super::cluster`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use es_emulator::{EmulatorConfig, RunningEmulator};
use serde_json::Value;
use transfer_service::store::elasticsearch::{ElasticsearchStore, EsConfig};
use transfer_service::store::embedded::EmbeddedStore;
use transfer_service::store::{DynStore, Index, Version, WriteOp};

/// A store under test and whatever keeps it alive (a temp dir, an emulator).
pub struct StoreUnderTest {
    pub store: DynStore,
    _guard: Box<dyn std::any::Any + Send>,
}

/// The real cluster to test against: the binary's shared one (see [`super::cluster`]); `None`
/// where this machine cannot run one, said once, loudly.
pub fn real_cluster() -> Option<String> {
    super::cluster::shared()
}

static PREFIXES: AtomicU64 = AtomicU64::new(0);

/// An index prefix no other test of this process uses, so tests sharing one cluster stay
/// independent: `<what>-<pid>-<n>-`.
pub fn unique_prefix(what: &str) -> String {
    format!(
        "{what}-{}-{}-",
        std::process::id(),
        PREFIXES.fetch_add(1, Ordering::Relaxed)
    )
}

/// An emulator that refreshes only when asked, so searches see exactly what was refreshed.
pub async fn manual_emulator() -> RunningEmulator {
    es_emulator::spawn(EmulatorConfig {
        refresh_interval: None,
        ..EmulatorConfig::default()
    })
    .await
}

/// An emulator with Elasticsearch's default one-second refresh interval.
pub async fn emulator() -> RunningEmulator {
    es_emulator::spawn(EmulatorConfig::default()).await
}

/// The Elasticsearch backend at `url` with `prefix`, not migrated.
pub async fn es_store_at(url: &str, prefix: &str) -> ElasticsearchStore {
    ElasticsearchStore::connect(EsConfig {
        url: url.to_owned(),
        index_prefix: prefix.to_owned(),
        request_timeout: Duration::from_secs(10),
        shards: super::cluster::shards(),
    })
    .await
    .expect("connect")
}

/// The Elasticsearch backend at `url` on indices of its own, migrated.
pub async fn migrated_es_store(url: &str) -> ElasticsearchStore {
    let store = es_store_at(url, &unique_prefix("store-test")).await;
    store.migrate().await.expect("migrate");
    store
}

pub async fn embedded() -> Option<StoreUnderTest> {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(dir.path()).expect("open embedded store");
    Some(StoreUnderTest {
        store: Arc::new(store),
        _guard: Box::new(dir),
    })
}

pub async fn on_emulator() -> Option<StoreUnderTest> {
    let emulator = emulator().await;
    let store = migrated_es_store(&emulator.url).await;
    Some(StoreUnderTest {
        store: Arc::new(store),
        _guard: Box::new(emulator),
    })
}

pub async fn real_es() -> Option<StoreUnderTest> {
    let url = real_cluster()?;
    Some(StoreUnderTest {
        store: Arc::new(migrated_es_store(&url).await),
        _guard: Box::new(()),
    })
}

/// A bulk item creating `id` in `index`.
pub fn create_op(index: Index, id: &str, source: Value) -> WriteOp {
    WriteOp::Create {
        index,
        id: id.to_owned(),
        source: source.into(),
    }
}

/// A bulk item replacing `id` in `index` if it is still at version `expected`.
pub fn replace_op(index: Index, id: &str, source: Value, expected: Version) -> WriteOp {
    WriteOp::ReplaceIf {
        index,
        id: id.to_owned(),
        source: source.into(),
        expected,
    }
}
