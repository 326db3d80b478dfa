//! What only a real Elasticsearch cluster can show (`tools/es-cluster/run`, clusters of these
//! tests' own): a primary failing over under load, the whole cluster restarting under the
//! service, and a cluster that rejects writes (429) under load. Each ends with the invariants
//! of the kill -9 runs: every accepted transfer terminal, balances exact through the API,
//! pending lists empty, `transfer-service audit` clean. And accounts opened while their index
//! moves between nodes: each created, none answered `500`.
//!
//! They skip, saying why, where no cluster can run (no `java`/`mvn`), except under `CI=true`.

use super::*;
use support::cluster::{Cluster, ClusterSpec};

/// One of these tests at a time: each starts a cluster of its own (up to three nodes) beside
/// two service processes, on a machine of two cores.
pub(super) static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Three nodes: an index's primary and replica can be moved, or stopped, with a node to spare.
fn three_nodes() -> ClusterSpec {
    ClusterSpec {
        nodes: 3,
        ..ClusterSpec::default()
    }
}

/// The environment of a service on `cluster`, on the indices of `prefix` (of the tests'
/// shard count, `support::cluster::shards`).
pub(super) fn on_cluster(cluster: &Cluster, prefix: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ELASTICSEARCH_URL", cluster.url.clone()),
        ("INDEX_PREFIX", prefix.to_owned()),
        (
            "ELASTICSEARCH_SHARDS",
            support::cluster::shards().to_string(),
        ),
    ]
}

/// The accounts index of a service on `prefix` (`migrations/0001_accounts.json`).
fn accounts_index(prefix: &str) -> String {
    format!("{prefix}accounts")
}

/// A GET on the cluster, as JSON.
async fn cluster_get(url: &str, path: &str) -> Value {
    let answer = reqwest::get(format!("{url}{path}")).await.expect(path);
    answer.json().await.expect("a JSON answer")
}

/// The name of the node holding `index`'s started primary shard (`_cat/shards`), if one is.
async fn primary_node(url: &str, index: &str) -> Option<String> {
    let shards = cluster_get(url, &format!("/_cat/shards/{index}?format=json")).await;
    let primary = shards
        .as_array()?
        .iter()
        .find(|s| s["prirep"] == "p" && s["state"] == "STARTED")?;
    primary["node"].as_str().map(str::to_owned)
}

/// `index`'s primary term (shard 0), from the cluster state.
async fn primary_term(url: &str, index: &str) -> u64 {
    let state = cluster_get(url, &format!("/_cluster/state/metadata/{index}")).await;
    state["metadata"]["indices"][index]["primary_terms"]["0"]
        .as_u64()
        .unwrap_or_else(|| panic!("no primary term for {index}: {state}"))
}

/// Waits until `index` has a started primary and a started replica again.
async fn until_green(url: &str, index: &str) {
    let path = format!("/_cluster/health/{index}?wait_for_status=green&timeout=1s");
    support::wait::eventually_within(Duration::from_secs(120), "the index green", || async {
        cluster_get(url, &path).await["status"] == "green"
    })
    .await;
}

/// Keeps `index`'s copies off node 0, which the services talk to, so that the node holding
/// its primary can be stopped while they keep their connection.
async fn keep_off_node_0(url: &str, index: &str) {
    let client = reqwest::Client::new();
    let answer = client
        .put(format!("{url}/{index}/_settings"))
        .json(&json!({"index.routing.allocation.exclude._name": "node-0"}))
        .send()
        .await
        .expect("settings");
    assert!(answer.status().is_success(), "{:?}", answer.text().await);
    // Green is not moved: a copy relocating off node 0 leaves the index green while it is
    // still there (seen with 3 shards on OpenSearch). Wait until every copy is elsewhere.
    let path = format!("/_cat/shards/{index}?format=json");
    support::wait::eventually_within(
        Duration::from_secs(120),
        "the copies off node 0",
        || async {
            let shards = cluster_get(url, &path).await;
            shards.as_array().is_some_and(|copies| {
                copies
                    .iter()
                    .all(|s| s["node"] != "node-0" && s["state"] == "STARTED")
            })
        },
    )
    .await;
    until_green(url, index).await;
}

/// The sum of `store_requests_total` with `outcome` across `bases`.
async fn store_requests(bases: &[&str], outcome: &str) -> f64 {
    let mut total = 0.0;
    for base in bases {
        let exposition = scrape(base).await;
        let samples = exposition.named("store_requests_total");
        total += samples
            .iter()
            .filter(|s| s.labels.get("outcome").is_some_and(|o| o == outcome))
            .map(|s| s.value)
            .sum::<f64>();
    }
    total
}

/// Two instances under load on a three-node cluster whose indices have one replica; twice the
/// node holding the accounts index's primary is stopped mid-run (its replica is promoted, the
/// primary term changes while conditional writes are in flight) and started again. Nothing is
/// lost, nothing doubled, nothing stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_failing_over_under_load_loses_and_doubles_nothing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = Cluster::start(&three_nodes()) else {
        return;
    };
    let seconds = env_or("FAILOVER_SECONDS", 12);
    let clients = env_or("CRASH_CLIENTS", 16) as usize;
    let seed = env_or("CRASH_SEED", rand::random::<u32>() as u64);
    eprintln!("seed {seed} (CRASH_SEED to repeat), {seconds} s, {clients} clients");
    let prefix = support::stores::unique_prefix("failover");
    let env = on_cluster(&cluster, &prefix);
    let first = Service::start_ready(&env).await;
    let second = Service::start_ready(&env).await;
    let accounts = accounts_index(&prefix);
    keep_off_node_0(&cluster.url, &accounts).await;
    open_accounts(&reqwest::Client::new(), &first.base, SPREAD).await;

    let bases = Arc::new(RwLock::new(vec![first.base.clone(), second.base.clone()]));
    let requests: Requests = Arc::default();
    let until = Instant::now() + Duration::from_secs(seconds);
    let load = tokio::spawn(run_clients(
        clients,
        until,
        bases,
        requests.clone(),
        seed,
        SPREAD,
    ));
    let mut terms = vec![primary_term(&cluster.url, &accounts).await];
    let failovers = 2;
    for _ in 0..failovers {
        tokio::time::sleep(Duration::from_secs(seconds) / (failovers + 2)).await;
        let holder = primary_node(&cluster.url, &accounts)
            .await
            .expect("a started primary");
        let i: usize = holder["node-".len()..].parse().expect("node-<i>");
        cluster.stop_node(i);
        support::wait::until_some("the replica to become the primary", || async {
            let promoted = primary_node(&cluster.url, &accounts).await?;
            (promoted != holder).then_some(promoted)
        })
        .await;
        terms.push(primary_term(&cluster.url, &accounts).await);
        cluster.start_node(i);
        until_green(&cluster.url, &accounts).await;
    }
    load.await.unwrap();
    assert!(
        terms.windows(2).all(|t| t[0] < t[1]),
        "each failover raised the primary term: {terms:?}"
    );
    wait_until_nothing_in_flight(&first.base, Duration::from_secs(120)).await;
    settle_and_check(&first.base, &requests, SPREAD).await;
    let (clean, report) = audit(&env);
    assert!(clean, "audit found violations:\n{report}");
    let unavailable = store_requests(&[&first.base, &second.base], "unavailable").await;
    let conflicts = store_requests(&[&first.base, &second.base], "conflict").await;
    eprintln!(
        "{failovers} failovers of {accounts}, primary terms {terms:?}; store requests \
         unavailable (retried) {unavailable}, conflicts {conflicts}"
    );
}

/// Accounts opened while their index moves from node to node are all created. A write
/// waits for its shard only up to the bulk `timeout` (half the store timeout, here 20 ms);
/// a node whose last shard of the index has just moved away then answers the item "no such
/// index" with a 404 (OpenSearch 2.19.6; Elasticsearch 8.19.21 was not seen to), which is a
/// shard not available now: retried, never a `500`. Without that rule this test failed in
/// each of two runs on OpenSearch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_opened_while_their_index_moves_between_nodes_are_all_created() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = Cluster::start(&three_nodes()) else {
        return;
    };
    let prefix = support::stores::unique_prefix("moving");
    let mut env = on_cluster(&cluster, &prefix);
    env.push(("STORE_TIMEOUT", "40ms".into()));
    let service = Service::start_ready(&env).await;
    let accounts = accounts_index(&prefix);
    let client = reqwest::Client::new();
    let (mut opened, mut unavailable) = (Vec::new(), 0);
    for move_ in 0..6 {
        move_off(&cluster.url, &accounts, &format!("node-{}", move_ % 3)).await;
        let sixteen_at_a_time = Arc::new(tokio::sync::Semaphore::new(16));
        let mut creates = tokio::task::JoinSet::new();
        for i in 0..200 {
            let (client, base) = (client.clone(), service.base.clone());
            let turn = sixteen_at_a_time.clone();
            creates.spawn(async move {
                let _turn = turn.acquire_owned().await.expect("open semaphore");
                let id = format!("m{move_}-{i}");
                let retried = open_until_answered(&client, &base, &id).await;
                (id, retried)
            });
        }
        while let Some(created) = creates.join_next().await {
            let (id, retried) =
                created.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
            unavailable += retried;
            opened.push(id);
        }
    }
    for id in &opened {
        let account = get_ok(&client, &service.base, &format!("/accounts/{id}")).await;
        assert_eq!(account["balance"], 10, "{account}");
    }
    eprintln!(
        "{} accounts opened over 6 moves; 503s retried {unavailable}",
        opened.len()
    );
}

/// Moves `index`'s copies off `node` (and back onto the others), without waiting.
async fn move_off(url: &str, index: &str, node: &str) {
    let answer = reqwest::Client::new()
        .put(format!("{url}/{index}/_settings"))
        .json(&json!({"index.routing.allocation.exclude._name": node}))
        .send()
        .await
        .expect("settings");
    assert!(answer.status().is_success(), "{:?}", answer.text().await);
}

/// `POST /accounts` for `id` with a balance of 10 until it is created (201, or 200 when an
/// earlier try that was answered 503 had created it), retrying a 503 as the contract asks,
/// for up to 60 s; any other answer fails the test. Returns how many 503s it retried.
async fn open_until_answered(client: &reqwest::Client, base: &str, id: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = json!({"id": id, "balance": 10});
    let mut retried = 0;
    loop {
        match post(client, base, "/accounts", &body).await {
            Some((201 | 200, _)) => return retried,
            Some((503, _)) | None if Instant::now() < deadline => retried += 1,
            other => panic!("POST /accounts {id}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The whole cluster stops under a running service: `/readyz` answers 503 saying the store is
/// unreachable, writes are refused (503, nothing half done), and once the cluster is back the
/// service is ready again by itself and every accepted transfer ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_restart_is_waited_out_and_loses_nothing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = Cluster::start(&ClusterSpec::default()) else {
        return;
    };
    let seed = env_or("CRASH_SEED", rand::random::<u32>() as u64);
    eprintln!("seed {seed} (CRASH_SEED to repeat)");
    let env = on_cluster(&cluster, &support::stores::unique_prefix("restart"));
    let service = Service::start_ready(&env).await;
    open_accounts(&reqwest::Client::new(), &service.base, SPREAD).await;
    let bases = Arc::new(RwLock::new(vec![service.base.clone()]));
    let requests: Requests = Arc::default();
    let load = tokio::spawn(run_clients(
        8,
        Instant::now() + Duration::from_secs(8),
        bases,
        requests.clone(),
        seed,
        SPREAD,
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.stop_node(0);
    let client = reqwest::Client::new();
    let readyz = format!("{}/readyz", service.base);
    let reason = support::wait::until_some("/readyz to say not ready", || async {
        let answer = client.get(&readyz).send().await.ok()?;
        (answer.status() == 503).then_some(())?;
        answer.json::<Value>().await.ok()
    })
    .await;
    assert_eq!(reason["status"], "not ready", "{reason}");
    assert!(
        reason["detail"]
            .as_str()
            .is_some_and(|d| d.contains("unreachable")),
        "{reason}"
    );
    cluster.start_node(0);
    service.until_ready().await;
    load.await.unwrap();
    wait_until_nothing_in_flight(&service.base, Duration::from_secs(120)).await;
    settle_and_check(&service.base, &requests, SPREAD).await;
    let (clean, report) = audit(&env);
    assert!(clean, "audit found violations:\n{report}");
}

/// A cluster that rejects writes (a write thread pool of one thread and a queue of one answers
/// `es_rejected_execution_exception` with 429): the service retries with backoff, the
/// rejections show in `store_requests_total{outcome="unavailable"}`, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_rejecting_writes_is_retried_and_loses_nothing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let spec = ClusterSpec {
        nodes: 1,
        settings: vec![
            "thread_pool.write.size=1".into(),
            "thread_pool.write.queue_size=1".into(),
        ],
    };
    let Some(cluster) = Cluster::start(&spec) else {
        return;
    };
    let seed = env_or("CRASH_SEED", rand::random::<u32>() as u64);
    eprintln!("seed {seed} (CRASH_SEED to repeat)");
    let env = on_cluster(&cluster, &support::stores::unique_prefix("rejecting"));
    let first = Service::start_ready(&env).await;
    let second = Service::start_ready(&env).await;
    open_accounts(&reqwest::Client::new(), &first.base, SPREAD).await;
    let bases = Arc::new(RwLock::new(vec![first.base.clone(), second.base.clone()]));
    let requests: Requests = Arc::default();
    run_clients(
        32,
        Instant::now() + Duration::from_secs(6),
        bases,
        requests.clone(),
        seed,
        SPREAD,
    )
    .await;
    wait_until_nothing_in_flight(&first.base, Duration::from_secs(120)).await;
    settle_and_check(&first.base, &requests, SPREAD).await;
    let (clean, report) = audit(&env);
    assert!(clean, "audit found violations:\n{report}");
    let rejected = cluster_get(&cluster.url, "/_nodes/stats/thread_pool").await;
    let rejected: u64 = rejected["nodes"]
        .as_object()
        .unwrap_or_else(|| panic!("no nodes in {rejected}"))
        .values()
        .map(|n| n["thread_pool"]["write"]["rejected"].as_u64().unwrap_or(0))
        .sum();
    let unavailable = store_requests(&[&first.base, &second.base], "unavailable").await;
    eprintln!("the cluster rejected {rejected} writes; the service saw {unavailable} unavailable");
    assert!(
        rejected > 0,
        "the cluster rejected nothing: the test tests nothing"
    );
    assert!(
        unavailable > 0.0,
        "the rejections do not show in the metrics"
    );
}
