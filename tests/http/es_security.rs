//! Elasticsearch with security on (docs/elasticsearch.md §12), against the emulator (a TEST
//! DOUBLE of Elasticsearch) configured with API keys, privileges and HTTPS: the minimal role
//! of docs/configuration.md is enough to run; a wrong key, a missing privilege, an untrusted or
//! mismatched CA are clear start-up errors; a key revoked or a privilege withdrawn while
//! running makes `/readyz` and the API say why, is counted, and is not retried.

use es_emulator::{ApiKey, EmulatorConfig, Grant, RunningEmulator, SecurityConfig, TlsConfig};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use transfer_service::app::Application;
use transfer_service::config::Config;
use transfer_service::store::elasticsearch::{
    ElasticsearchStore, EsConfig, EsSecurity, EsSecuritySettings, Secret,
};
use transfer_service::store::StoreError;

use crate::support::app::{Backend, TestApp};
use crate::support::{logs, wait};

const PREFIX: &str = "secured-";
const KEY_ID: &str = "svc-key";
const KEY_SECRET: &str = "ui2lp2axTNmsyakw9tvNnw";

/// The minimal role of docs/configuration.md: no cluster privilege, and on the service's
/// indices `read`, `index`, `create_index`, `view_index_metadata`, `maintenance`, `monitor`
/// and the mapping action.
fn minimal_role() -> Grant {
    Grant::indices(
        &["secured-*"],
        &[
            "read",
            "index",
            "create_index",
            "view_index_metadata",
            "maintenance",
            "monitor",
            "indices:admin/mapping/put",
        ],
    )
}

fn service_key(grant: Grant) -> ApiKey {
    ApiKey::new(KEY_ID, KEY_SECRET, grant)
}

async fn secured_emulator(grant: Grant, tls: Option<TlsConfig>) -> RunningEmulator {
    es_emulator::spawn(EmulatorConfig {
        refresh_interval: None,
        security: Some(SecurityConfig {
            api_keys: vec![service_key(grant)],
            users: Vec::new(),
        }),
        tls,
    })
    .await
}

/// The service's configuration for `emulator`, authenticating with `api_key`.
fn point_at(config: &mut Config, emulator: &RunningEmulator, api_key: &str) {
    config.elasticsearch_url = Some(emulator.url.clone());
    config.index_prefix = PREFIX.into();
    config.elasticsearch_security.elasticsearch_api_key = Some(Secret::new(api_key));
}

/// The error `Application::build` fails with on this configuration.
async fn startup_error(tweak: impl FnOnce(&mut Config)) -> String {
    logs::capture();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::for_tests(dir.path().join("data"));
    tweak(&mut config);
    match Application::build(config).await {
        Ok(_) => panic!("the service started"),
        Err(error) => error.to_string(),
    }
}

/// A CA, and a server certificate it signed for `127.0.0.1` and `localhost`.
struct Pki {
    ca_pem: String,
    ca_der: Vec<u8>,
    server: TlsConfig,
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test HTTP CA");
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().expect("server key");
        let server_params =
            CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).expect("params");
        let server = server_params
            .signed_by(&server_key, &issuer)
            .expect("server certificate");
        Pki {
            ca_pem: ca.pem(),
            ca_der: ca.der().to_vec(),
            server: TlsConfig {
                cert_chain_pem: server.pem(),
                key_pem: server_key.serialize_pem(),
            },
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// The CA written to a file, as ELASTICSEARCH_CA_CERT names it.
    fn ca_file(&self) -> std::path::PathBuf {
        let path = self.dir.path().join("http_ca.crt");
        std::fs::write(&path, &self.ca_pem).expect("write CA");
        path
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_with_the_minimal_role_runs_the_service() {
    let emulator = secured_emulator(minimal_role(), None).await;
    let key = service_key(minimal_role()).encoded();

    // Security is really on: without credentials, Elasticsearch's 401 and its challenges.
    let anonymous = reqwest::get(&emulator.url).await.expect("GET /");
    assert_eq!(anonymous.status(), 401);
    assert_eq!(
        anonymous
            .headers()
            .get_all("www-authenticate")
            .iter()
            .count(),
        3
    );

    let app = TestApp::spawn_with(Backend::Embedded, |c| point_at(c, &emulator, &key)).await;
    assert_eq!(app.store().backend(), "elasticsearch");
    // The minimal role may not read `GET /` (it needs `monitor`): the product header of its
    // 403 says Elasticsearch, of a version left unread.
    let (status, ready) = app.get("/readyz").await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(
        ready["engine"], "Elasticsearch (its version needs the monitor privilege)",
        "{ready}"
    );
    app.open_accounts([("alice", 100), ("bob", 0)]).await;
    app.transfer_accepted("t-1", "alice", "bob", 30).await;
    assert_eq!(app.settled("t-1").await["state"], "finished");
    app.store().refresh().await.expect("refresh (maintenance)");
    let (status, listed) = app.get("/transfers?account=alice").await;
    assert_eq!(status, 200, "{listed}");

    let logged = serde_json::to_string(&logs::lines()).expect("logs");
    assert!(
        !logged.contains(KEY_SECRET),
        "a log line carries the API key's secret"
    );
    assert!(
        !logged.contains(&key),
        "a log line carries the encoded API key"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_api_key_is_a_clear_startup_error() {
    let emulator = secured_emulator(minimal_role(), None).await;
    let wrong = ApiKey::new(KEY_ID, "not-the-secret", Grant::default()).encoded();
    let error = startup_error(|c| point_at(c, &emulator, &wrong)).await;
    assert!(error.contains("authentication failed"), "{error}");
    assert!(error.contains("ELASTICSEARCH_API_KEY"), "{error}");
    assert!(
        !error.contains("not-the-secret") && !error.contains(&wrong),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_privilege_is_named_at_startup() {
    // Without create_index: the indices cannot be created.
    let no_create = Grant::indices(&["secured-*"], &["read", "index", "view_index_metadata"]);
    let emulator = secured_emulator(no_create.clone(), None).await;
    let key = service_key(no_create).encoded();
    let error = startup_error(|c| point_at(c, &emulator, &key)).await;
    assert!(
        error.contains(
            "action [indices:admin/create] needs one of the index privileges \
             [create_index,manage,all]"
        ),
        "{error}"
    );

    // Without view_index_metadata the very first request, a HEAD, is refused with no body:
    // the service asks again with GET to name the privilege.
    let no_metadata = Grant::indices(&["secured-*"], &["read", "index", "create_index"]);
    let emulator = secured_emulator(no_metadata.clone(), None).await;
    let key = service_key(no_metadata).encoded();
    let error = startup_error(|c| point_at(c, &emulator, &key)).await;
    assert!(
        error.contains("action [indices:admin/get] needs one of the index privileges [view_index_metadata,manage,all]"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_signed_endpoint_is_trusted_through_elasticsearch_ca_cert_only() {
    let pki = Pki::new();
    let emulator = secured_emulator(minimal_role(), Some(pki.server.clone())).await;
    assert!(emulator.url.starts_with("https://"), "{}", emulator.url);
    let key = service_key(minimal_role()).encoded();
    let store_trusting = |ca: Option<std::path::PathBuf>| {
        let settings = EsSecuritySettings {
            api_key: Some(Secret::new(key.clone())),
            ca_cert: ca,
            ..EsSecuritySettings::default()
        };
        let config = EsConfig {
            url: emulator.url.clone(),
            index_prefix: PREFIX.into(),
            request_timeout: std::time::Duration::from_secs(10),
            shards: 1,
        };
        async move {
            let security: EsSecurity = settings.load().expect("settings");
            ElasticsearchStore::connect_secured(config, security)
                .await
                .expect("client")
        }
    };

    // Without the CA the handshake fails: nothing reaches the cluster.
    let untrusting = store_trusting(None).await;
    let refused = untrusting
        .migrate()
        .await
        .expect_err("an untrusted certificate");
    assert!(matches!(refused, StoreError::Unavailable(_)), "{refused}");
    assert!(refused.to_string().contains("certificate"), "{refused}");
    assert_eq!(emulator.request_count(), 0, "a request got through TLS");

    // Trusting the CA: migrated, and the service runs on it.
    let trusting = store_trusting(Some(pki.ca_file())).await;
    trusting.migrate().await.expect("migrations over HTTPS");
    assert!(emulator.request_count() > 0);

    let ca_file = pki.ca_file();
    let fingerprint = transfer_service::store::elasticsearch::sha256_hex(&pki.ca_der);
    let app = TestApp::spawn_with(Backend::Embedded, |c| {
        point_at(c, &emulator, &key);
        c.elasticsearch_security.elasticsearch_ca_cert = Some(ca_file.clone());
        // As Elasticsearch prints it, with colons and in upper case, works too.
        c.elasticsearch_security.elasticsearch_ca_fingerprint = Some(
            fingerprint
                .as_bytes()
                .chunks(2)
                .map(|pair| std::str::from_utf8(pair).unwrap().to_uppercase())
                .collect::<Vec<_>>()
                .join(":"),
        );
    })
    .await;
    app.open_account("alice", 5).await;
    app.shutdown().await;

    // A fingerprint that is not the file's CA: the file is not the cluster's CA.
    let error = startup_error(|c| {
        point_at(c, &emulator, &key);
        c.elasticsearch_security.elasticsearch_ca_cert = Some(ca_file.clone());
        c.elasticsearch_security.elasticsearch_ca_fingerprint = Some("ab".repeat(32));
    })
    .await;
    assert!(error.contains("not the cluster's CA"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_revoked_while_running_fails_readyz_with_the_reason_and_is_not_retried() {
    let emulator = secured_emulator(minimal_role(), None).await;
    let key = service_key(minimal_role()).encoded();
    let app = TestApp::spawn_with(Backend::Embedded, |c| point_at(c, &emulator, &key)).await;
    app.open_account("alice", 100).await;

    emulator.invalidate_api_key(KEY_ID);

    let (status, ready) = app.get("/readyz").await;
    assert_eq!(status, 503, "{ready}");
    let detail = ready["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("authentication failed"), "{ready}");
    assert!(!detail.contains(PREFIX), "index names in /readyz: {ready}");

    // One request, no retries: an outage would be retried with backoff.
    let gets_before = emulator.request_count_of("get");
    let (status, problem) = app.get("/accounts/alice").await;
    assert_eq!(status, 503, "{problem}");
    assert_eq!(emulator.request_count_of("get") - gets_before, 1);

    let metrics = app.scrape().await;
    assert!(metrics.store_requests("ready", "denied") >= 1.0);
    assert!(metrics.store_requests("get", "denied") >= 1.0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_privilege_withdrawn_while_running_is_counted_and_named_in_the_log() {
    let emulator = secured_emulator(minimal_role(), None).await;
    let key = service_key(minimal_role()).encoded();
    let app = TestApp::spawn_with(Backend::Embedded, |c| point_at(c, &emulator, &key)).await;

    // The role's write privilege moves to other indices: the `_bulk` as a whole is allowed,
    // each of its items on our indices is refused with 403.
    let mut moved = Grant::indices(&["secured-*"], &["read", "view_index_metadata", "monitor"]);
    moved
        .indices
        .extend(Grant::indices(&["elsewhere-*"], &["index"]).indices);
    emulator.set_api_key_grant(KEY_ID, moved);
    let (status, problem) = app
        .post(
            "/accounts",
            serde_json::json!({"id": "carol", "balance": 1}),
        )
        .await;
    assert_eq!(status, 503, "{problem}");
    let metrics = app.scrape().await;
    assert!(metrics.store_requests("create", "denied") >= 1.0);
    wait::eventually("the refusal to be logged with the privilege", || async {
        serde_json::to_string(&logs::lines())
            .unwrap_or_default()
            .contains(
            "action [indices:data/write/index:op_type/create] needs one of the index privileges",
        )
    })
    .await;
    // Reads still work: /readyz needs no write.
    assert_eq!(app.status("/readyz").await, 200);
    app.shutdown().await;
}
