//! Which search engine the service runs on (`docs/elasticsearch.md` §13): read from `GET /` at
//! the start, named by `/readyz` and `store_info`; anything but Elasticsearch 8+ and
//! OpenSearch 2.7+ stops the start with a message naming what answered. And what a transfer
//! asks of the engine.

use serde_json::{json, Value};

use transfer_service::store::elasticsearch::Secret;

use crate::support::app::{Backend, TestApp};
use crate::support::cluster;

/// An HTTP server on loopback that answers `GET /` with `body` (and `product` as the
/// `X-elastic-product` header, when given), and 404 to everything else; its URL.
async fn answering_root_with(product: Option<&'static str>, body: Value) -> String {
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let body = body.clone();
        async move {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert("content-type", "application/json".parse().unwrap());
            if let Some(product) = product {
                headers.insert("x-elastic-product", product.parse().unwrap());
            }
            let status = if uri.path() == "/" { 200 } else { 404 };
            let status = axum::http::StatusCode::from_u16(status).unwrap();
            (status, headers, body.to_string())
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test]
async fn a_server_that_is_neither_engine_stops_the_start_naming_what_answered() {
    let cases = [
        (
            None,
            json!({"version": {"distribution": "opensearch", "number": "1.3.19"}}),
            "points at opensearch 1.3.19",
        ),
        (
            Some("Elasticsearch"),
            json!({"version": {"number": "7.17.25"}}),
            "points at Elasticsearch 7.17.25",
        ),
        (
            None,
            json!({"status": "ok"}),
            "points at an answer to GET / without a version",
        ),
    ];
    for (product, root, named) in cases {
        let url = answering_root_with(product, root).await;
        let error = TestApp::start_error(|config| config.elasticsearch_url = Some(url)).await;
        assert!(error.contains(named), "{error}");
        assert!(
            error.contains("supported: Elasticsearch 8.x or later, OpenSearch 2.7 or later"),
            "{error}"
        );
    }
}

/// OpenSearch has no API keys: one configured for it stops the start, saying what to give.
#[tokio::test]
async fn an_elasticsearch_api_key_for_opensearch_stops_the_start() {
    let opensearch = json!({"version": {"distribution": "opensearch", "number": "2.19.6"}});
    let url = answering_root_with(None, opensearch).await;
    let error = TestApp::start_error(|config| {
        config.elasticsearch_url = Some(url);
        config.elasticsearch_security.elasticsearch_api_key = Some(Secret::new(
            "VnVhQ2ZHY0JDZGJrUW0tZTVhT3g6dWkybHAyYXhUTm1zeWFrdzl0dk5udw==",
        ));
    })
    .await;
    assert!(
        error.contains("points at OpenSearch, which has none"),
        "{error}"
    );
    assert!(error.contains("ELASTICSEARCH_USERNAME"), "{error}");
}

/// `/readyz`'s `engine` and the `store_info` gauge on `backend`: `expected` as
/// `(name, version, readyz text)`, or nothing on the embedded store.
async fn the_engine_is_named(backend: Backend, expected: Option<(&str, &str, &str)>) {
    let app = TestApp::spawn(backend).await;
    let (status, readiness) = app.get("/readyz").await;
    assert_eq!(status, 200, "{readiness}");
    let metrics = app.scrape().await;
    match expected {
        Some((name, version, text)) => {
            assert_eq!(readiness["engine"], text, "{readiness}");
            assert_eq!(
                metrics.find("store_info", &[("engine", name), ("version", version)]),
                Some(1.0)
            );
        }
        None => {
            assert!(readiness.get("engine").is_none(), "{readiness}");
            assert_eq!(metrics.sum("store_info"), 0.0);
        }
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_and_store_info_name_the_engine() {
    the_engine_is_named(Backend::Embedded, None).await;
    let emulated = ("elasticsearch", "8.19.21", "Elasticsearch 8.19.21");
    the_engine_is_named(Backend::Emulator, Some(emulated)).await;
}

/// On the real cluster: Elasticsearch 8.19.21, OpenSearch 2.19.6 with
/// `TEST_SEARCH_ENGINE=opensearch`, or OpenSearch 3.9.0 with `opensearch3`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_real_cluster_readyz_and_store_info_name_its_engine() {
    if crate::support::stores::real_cluster().is_none() {
        return;
    }
    let expected = match cluster::engine().as_str() {
        "opensearch" => ("opensearch", "2.19.6", "OpenSearch 2.19.6"),
        "opensearch3" => ("opensearch", "3.9.0", "OpenSearch 3.9.0"),
        _ => ("elasticsearch", "8.19.21", "Elasticsearch 8.19.21"),
    };
    the_engine_is_named(Backend::RealEs, Some(expected)).await;
}

/// An account this instance opened is remembered at the version its create answered: the
/// transfer's account steps write it without a realtime GET first (on Elasticsearch such a GET
/// of a document written since the last refresh makes the shard refresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_between_accounts_this_instance_opened_reads_neither() {
    let app = TestApp::spawn_with_accounts(Backend::Emulator, [("a", 100), ("b", 0)]).await;
    let gets_before = app.emulator().request_count_of("get");
    app.transfer_accepted("t", "a", "b", 10).await;
    crate::support::wait::eventually("the transfer to finish", || async {
        app.scrape()
            .await
            .find("transfers_completed_total", &[("outcome", "finished")])
            == Some(1.0)
    })
    .await;
    assert_eq!(app.emulator().request_count_of("get") - gets_before, 0);
    assert_eq!(app.balance("b").await, 10);
    app.shutdown().await;
}
