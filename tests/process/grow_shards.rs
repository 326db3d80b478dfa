//! `transfer-service shards --to N` on a real cluster holding data, with the service running
//! before, during and after (`docs/operations.md`, "Growing to more shards"): nothing lost,
//! nothing doubled, every event delivered, and a feed cursor issued before the split read on
//! after it.
//!
//! It skips, saying why, where no cluster can run (no `java`/`mvn`), except under `CI=true`.

use super::real_cluster::{on_cluster, ONE_AT_A_TIME};
use super::*;
use support::cluster::{Cluster, ClusterSpec};

/// Runs the command with the service's environment: its exit status and what it printed.
fn shards(env: &[(&str, String)], args: &[&str]) -> (bool, String) {
    let mut command = Command::new(BIN);
    command.arg("shards").args(args).env("RUST_LOG", "warn");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().expect("run shards");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

/// The primary shards of the index behind `name` (an index, or the alias a split left).
async fn shard_count(url: &str, name: &str) -> u64 {
    let answer = reqwest::get(format!("{url}/{name}/_settings"))
        .await
        .expect("settings");
    let settings: Value = answer.json().await.expect("JSON settings");
    let (_, index) = settings
        .as_object()
        .and_then(|indices| indices.iter().next())
        .unwrap_or_else(|| panic!("no index {name}: {settings}"));
    index["settings"]["index"]["number_of_shards"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no shard count: {settings}"))
}

/// A one-shard deployment under load, with a webhook receiver and a feed consumer, is grown
/// to three shards halfway through; a second instance started afterwards works on the grown
/// indices. The clients' transfers end exactly as in the kill -9 runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shard_deployment_grows_to_three_under_load_and_loses_nothing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = Cluster::start(&ClusterSpec {
        nodes: 3,
        ..ClusterSpec::default()
    }) else {
        return;
    };
    let seconds = env_or("GROW_SECONDS", 10);
    let seed = env_or("CRASH_SEED", rand::random::<u32>() as u64);
    eprintln!("seed {seed} (CRASH_SEED to repeat), {seconds} s");
    let receiver = support::receiver::Receiver::start().await;
    let prefix = support::stores::unique_prefix("grow");
    let mut env = on_cluster(&cluster, &prefix);
    env.retain(|(name, _)| *name != "ELASTICSEARCH_SHARDS");
    env.push(("ELASTICSEARCH_SHARDS", "1".to_owned()));
    env.extend(webhook_env(&receiver));
    let first = Service::start_ready(&env).await;
    open_accounts(&reqwest::Client::new(), &first.base, SPREAD).await;
    let (accounts, transactions) = (format!("{prefix}accounts"), format!("{prefix}transactions"));
    assert_eq!(shard_count(&cluster.url, &accounts).await, 1);

    let bases = Arc::new(RwLock::new(vec![first.base.clone()]));
    let stop_feed = Arc::new(AtomicBool::new(false));
    let feed = follow_feed(bases.clone(), stop_feed.clone());
    let requests: Requests = Arc::default();
    let until = Instant::now() + Duration::from_secs(seconds);
    let load = tokio::spawn(run_clients(
        16,
        until,
        bases.clone(),
        requests.clone(),
        seed,
        SPREAD,
    ));
    tokio::time::sleep(Duration::from_secs(seconds) / 3).await;

    let (ok, printed) = shards(&env, &["--to", "3", "--dry-run"]);
    assert!(ok, "{printed}");
    assert!(printed.contains("would grow"), "{printed}");
    assert_eq!(
        shard_count(&cluster.url, &transactions).await,
        1,
        "a dry run changes nothing"
    );
    let started = Instant::now();
    let (ok, printed) = shards(&env, &["--to", "3"]);
    assert!(ok, "{printed}");
    eprintln!("grown in {:?} under load:\n{printed}", started.elapsed());
    for index in [&accounts, &transactions] {
        assert_eq!(shard_count(&cluster.url, index).await, 3, "{index}");
    }
    let (ok, printed) = shards(&env, &["--to", "3"]);
    assert!(ok && printed.contains("already"), "run again: {printed}");

    // An instance started after the split works on the grown indices beside the first.
    let second = Service::start_ready(&env).await;
    bases.write().unwrap().push(second.base.clone());
    load.await.unwrap();
    wait_until_nothing_in_flight(&first.base, Duration::from_secs(60)).await;
    settle_and_check(&second.base, &requests, SPREAD).await;
    let (deliveries, events) =
        assert_every_terminal_event_delivered(&first.base, &requests, &receiver).await;
    eprintln!("webhooks: {events} terminal events delivered ({deliveries} deliveries)");
    let (clean, report) = audit(&env);
    assert!(clean, "audit found violations:\n{report}");

    // The consumer's cursor was issued before the split; it reads on to every event.
    stop_feed.store(true, Ordering::Relaxed);
    let mut feed = feed.await.unwrap();
    let store = support::stores::es_store_at(&cluster.url, &prefix).await;
    let expected = histories_in(&store, &requested_ids(&requests)).await;
    feed.read_until_complete_at(&reqwest::Client::new(), &first.base, &expected)
        .await;
    eprintln!(
        "the feed consumer saw all {} events of {} transfers in order across the split",
        feed.log.distinct(),
        expected.len()
    );
}
