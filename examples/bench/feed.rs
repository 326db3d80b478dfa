//! `--follow-events`: a consumer of `GET /events` during the transfer phase, as a caller
//! following the change feed would be, so the report shows what the feed costs the service
//! and how far behind the transfers it runs.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use hdrhistogram::Histogram;
use serde::Deserialize;
use tokio::sync::watch;

#[derive(Deserialize)]
struct Page {
    items: Vec<Item>,
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct Item {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    at: String,
}

/// What the consumer saw.
pub struct Followed {
    /// Distinct event ids.
    pub events: u64,
    /// Events received, repeats included (the feed is at-least-once).
    pub deliveries: u64,
    /// Distinct terminal events (`transfer.finished`, `transfer.rolled-back`).
    pub terminal: u64,
    /// From a terminal event's `at` to its first receipt, in microseconds.
    pub terminal_lag_us: Histogram<u64>,
}

/// Follows the feed from its current end until told how many terminal events to expect (by
/// `expected`, after the transfer phase drained) and has seen them, or `give_up_after` past
/// that. Returns what it saw.
pub async fn follow(
    client: reqwest::Client,
    base: String,
    mut expected: watch::Receiver<Option<u64>>,
    give_up_after: Duration,
) -> Followed {
    let mut followed = Followed {
        events: 0,
        deliveries: 0,
        terminal: 0,
        terminal_lag_us: Histogram::new(3).expect("histogram"),
    };
    let mut seen = HashSet::new();
    let mut cursor = end_of_feed(&client, &base).await;
    let mut deadline = None;
    loop {
        if let Some(want) = *expected.borrow_and_update() {
            if followed.terminal >= want {
                return followed;
            }
            let deadline =
                *deadline.get_or_insert_with(|| tokio::time::Instant::now() + give_up_after);
            if tokio::time::Instant::now() >= deadline {
                eprintln!(
                    "the feed consumer gave up with {} of {want} terminal events",
                    followed.terminal
                );
                return followed;
            }
        }
        let mut url = format!("{base}/events?limit=1000&wait=1s");
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&after={cursor}"));
        }
        let Some(page) = read_page(&client, &url).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let received = SystemTime::now();
        for item in page.items {
            followed.deliveries += 1;
            if !seen.insert(item.id) {
                continue;
            }
            followed.events += 1;
            if item.kind == "transfer.finished" || item.kind == "transfer.rolled-back" {
                followed.terminal += 1;
                if let Some(lag) = humantime::parse_rfc3339(&item.at)
                    .ok()
                    .and_then(|at| received.duration_since(at).ok())
                {
                    let _ = followed.terminal_lag_us.record(lag.as_micros() as u64);
                }
            }
        }
        cursor = page.next_cursor.or(cursor);
    }
}

/// The cursor at the end of the feed as it is now (the accounts' setup wrote no transfer, so
/// on a fresh service this is the beginning).
async fn end_of_feed(client: &reqwest::Client, base: &str) -> Option<String> {
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{base}/events?limit=1000");
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&after={cursor}"));
        }
        let page = read_page(client, &url).await.expect("GET /events answers");
        if page.items.is_empty() {
            return page.next_cursor.or(cursor);
        }
        cursor = page.next_cursor;
    }
}

async fn read_page(client: &reqwest::Client, url: &str) -> Option<Page> {
    let response = client.get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}
