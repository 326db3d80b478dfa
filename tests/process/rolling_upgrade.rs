//! A rolling upgrade on a real cluster (`docs/design.md` §9, "The fence"; docs/testing.md, "A
//! rolling upgrade"): the version this round started from, which keeps tombstones on every
//! account and no marks on its entries, runs alone, then beside this one on the same
//! indices, and is killed with transfers in flight, which this one finishes. What must hold:
//! every accepted transfer terminal, balances exact, pending lists empty, the audit clean; and
//! each account, once this version has written it after `SETTLED_RETENTION`, holds no
//! tombstone and at most 1 KB.

use super::*;

/// How long tombstones the older version wrote are kept (its own setting too).
const RETENTION: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_version_and_this_one_share_a_cluster_and_lose_nothing() {
    let Some(older) = support::old_version::binary(support::old_version::BEFORE_MARKS) else {
        return;
    };
    let Some(url) = support::cluster::shared() else {
        return;
    };
    let _one = real_cluster::ONE_AT_A_TIME.lock().await;
    let seed = env_or("CRASH_SEED", rand::random::<u32>() as u64);
    eprintln!("seed {seed} (CRASH_SEED to repeat)");
    let prefix = support::stores::unique_prefix("rolling-upgrade");
    let env = vec![
        ("ELASTICSEARCH_URL", url.clone()),
        ("INDEX_PREFIX", prefix.clone()),
        ("SETTLED_RETENTION", format!("{}s", RETENTION.as_secs())),
    ];
    let requests: Requests = Arc::default();

    // The older version alone: the accounts get its form (tombstones, unmarked entries).
    let old = Service::start_binary_ready(&older, &env).await;
    open_accounts(&reqwest::Client::new(), &old.base, SPREAD).await;
    let bases = Arc::new(RwLock::new(vec![old.base.clone()]));
    let until = Instant::now() + Duration::from_secs(9);
    let load = tokio::spawn(run_clients(
        12,
        until,
        bases.clone(),
        requests.clone(),
        seed,
        SPREAD,
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tombstoned = accounts_holding_tombstones(&url, &prefix).await;
    assert!(tombstoned > 0, "the older version left no tombstone");

    // Both at once, on the same accounts; then the older one dies with transfers in flight.
    let new = Service::start_ready(&env).await;
    *bases.write().unwrap() = vec![old.base.clone(), new.base.clone()];
    tokio::time::sleep(Duration::from_secs(4)).await;
    old.kill9();
    *bases.write().unwrap() = vec![new.base.clone()];
    load.await.unwrap();

    // This version alone finishes what the older one left.
    wait_until_nothing_in_flight(&new.base, Duration::from_secs(60)).await;
    settle_and_check(&new.base, &requests, SPREAD).await;
    let (clean, report) = audit(&env);
    assert!(clean, "audit found violations:\n{report}");

    // Past the retention, one write of every account by this version sheds the old form.
    tokio::time::sleep(RETENTION + Duration::from_millis(100)).await;
    write_every_account(&new.base).await;
    wait_until_nothing_in_flight(&new.base, Duration::from_secs(30)).await;
    let (clean, report) = audit(&env);
    assert!(clean, "audit found violations:\n{report}");
    let sizes = account_sources(&url, &prefix).await;
    for (id, source) in &sizes {
        assert!(
            source.get("settled").is_none() && source.get("settled_transactions").is_none(),
            "{id} still holds tombstones: {source}"
        );
        let bytes = source.to_string().len();
        assert!(bytes <= 1024, "{id} holds {bytes} bytes: {source}");
    }
    eprintln!(
        "{} transfers; {tombstoned} accounts held the older version's tombstones, none after \
         this version's writes; largest account {} bytes",
        requests.lock().unwrap().len(),
        sizes
            .iter()
            .map(|(_, s)| s.to_string().len())
            .max()
            .unwrap_or(0)
    );
}

/// One transfer of 1 from each account to the next, around the ring: each account is
/// written (applied, or undone when its apply is refused).
async fn write_every_account(base: &str) {
    let client = reqwest::Client::new();
    for i in 0..SPREAD.accounts {
        let body = json!({
            "id": format!("ring-{i}"),
            "from": format!("acct{i}"),
            "to": format!("acct{}", (i + 1) % SPREAD.accounts),
            "amount": 1,
        });
        let answer = client
            .post(format!("{base}/transfers"))
            .json(&body)
            .send()
            .await
            .expect("POST /transfers");
        assert_eq!(answer.status(), 201, "ring-{i}");
    }
}

/// Every account document's `_source`, by id, read from the cluster itself (after a
/// refresh: a search sees what the last refresh made visible).
async fn account_sources(url: &str, prefix: &str) -> Vec<(String, Value)> {
    let client = reqwest::Client::new();
    let refreshed = client
        .post(format!("{url}/{prefix}accounts/_refresh"))
        .send()
        .await
        .expect("refresh the accounts");
    assert!(
        refreshed.status().is_success(),
        "refresh: {}",
        refreshed.status()
    );
    let found: Value = client
        .post(format!("{url}/{prefix}accounts/_search"))
        .json(&json!({"size": 1000, "query": {"match_all": {}}}))
        .send()
        .await
        .expect("search the accounts")
        .json()
        .await
        .expect("a JSON answer");
    found["hits"]["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|hit| {
            (
                hit["_id"].as_str().unwrap().to_owned(),
                hit["_source"].clone(),
            )
        })
        .collect()
}

/// How many accounts hold tombstones (`settled`, or the form before it).
async fn accounts_holding_tombstones(url: &str, prefix: &str) -> usize {
    account_sources(url, prefix)
        .await
        .iter()
        .filter(|(_, s)| s.get("settled").is_some() || s.get("settled_transactions").is_some())
        .count()
}
