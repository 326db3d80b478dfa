//! What a change-feed consumer saw (`GET /events` or `Feed::page`), and the check
//! every feed suite ends with: each transfer's events all there, in the order its history
//! records them, repeated only under the same id.

use std::collections::{BTreeMap, HashMap};

/// The events seen, in the order they came.
#[derive(Debug, Default)]
pub struct FeedLog {
    /// Per transfer, each event type the first time it came, in that order.
    first_seen: HashMap<String, Vec<String>>,
    /// Every event as it came (repeats included).
    pub received: usize,
}

impl FeedLog {
    /// Records one event of `transfer`. Its id must be `<transfer>/<type>`: the id is what
    /// consumers dedupe on, so it must not depend on when or how often the event is served.
    pub fn record(&mut self, id: &str, event_type: &str, transfer: &str) {
        assert_eq!(
            id,
            format!("{transfer}/{event_type}"),
            "an event id names its transfer and type"
        );
        self.received += 1;
        let seen = self.first_seen.entry(transfer.to_owned()).or_default();
        if !seen.iter().any(|t| t == event_type) {
            seen.push(event_type.to_owned());
        }
    }

    /// Records every item of a `GET /events` page.
    pub fn record_page(&mut self, page: &serde_json::Value) {
        for item in page["items"].as_array().expect("items") {
            self.record(
                item["id"].as_str().expect("id"),
                item["type"].as_str().expect("type"),
                item["transfer"]["id"].as_str().expect("transfer id"),
            );
        }
    }

    /// Distinct events seen.
    pub fn distinct(&self) -> usize {
        self.first_seen.values().map(Vec::len).sum()
    }

    /// Whether every transfer of `expected` has all its events.
    pub fn has_all(&self, expected: &BTreeMap<String, Vec<String>>) -> bool {
        expected
            .iter()
            .all(|(id, types)| self.first_seen.get(id).map(Vec::len) == Some(types.len()))
    }

    /// Each transfer's events, first occurrences in order, equal its history: nothing
    /// missing, nothing out of order, nothing a transfer did not do; and no transfer seen
    /// that `expected` does not know.
    pub fn assert_complete(&self, expected: &BTreeMap<String, Vec<String>>) {
        for (id, types) in expected {
            let seen = self.first_seen.get(id).cloned().unwrap_or_default();
            assert_eq!(&seen, types, "the events of transfer {id}, in order");
        }
        for id in self.first_seen.keys() {
            assert!(
                expected.contains_key(id),
                "an event of unknown transfer {id}"
            );
        }
    }
}

/// A consumer of `GET /events` on one application, following `next_cursor`.
pub struct FeedReader {
    pub log: FeedLog,
    pub cursor: Option<String>,
    limit: usize,
}

impl FeedReader {
    /// A reader from the start, reading `limit` transfers a page.
    pub fn new(limit: usize) -> Self {
        Self {
            log: FeedLog::default(),
            cursor: None,
            limit,
        }
    }

    /// Reads one page (long-polling up to `wait`), records it and moves the cursor; returns
    /// how many events it held.
    pub async fn read_page(&mut self, app: &super::app::TestApp, wait: &str) -> usize {
        self.try_read_page(&app.client, &app.base, wait)
            .await
            .expect("GET /events answers")
    }

    /// [`FeedReader::read_page`] on the service at `base`; `None` when it did not answer
    /// 200 (it is down or restarting: the cursor stays where it was).
    pub async fn try_read_page(
        &mut self,
        client: &reqwest::Client,
        base: &str,
        wait: &str,
    ) -> Option<usize> {
        let mut url = format!("{base}/events?limit={}&wait={wait}", self.limit);
        if let Some(cursor) = &self.cursor {
            url.push_str(&format!("&after={cursor}"));
        }
        let response = client.get(url).send().await.ok()?;
        if response.status() != 200 {
            return None;
        }
        let page: serde_json::Value = response.json().await.ok()?;
        self.log.record_page(&page);
        if let Some(next) = page["next_cursor"].as_str() {
            self.cursor = Some(next.to_owned());
        }
        Some(page["items"].as_array().map_or(0, Vec::len))
    }

    /// Reads pages until every transfer of `expected` has all its events (deadline: 60 s),
    /// then checks they came in order.
    pub async fn read_until_complete(
        &mut self,
        app: &super::app::TestApp,
        expected: &BTreeMap<String, Vec<String>>,
    ) {
        self.read_until_complete_at(&app.client, &app.base, expected)
            .await
    }

    /// [`FeedReader::read_until_complete`] on the service at `base`.
    pub async fn read_until_complete_at(
        &mut self,
        client: &reqwest::Client,
        base: &str,
        expected: &BTreeMap<String, Vec<String>>,
    ) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while !self.log.has_all(expected) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the feed did not deliver every event within 60 s: {:?}",
                self.log
            );
            self.try_read_page(client, base, "1s").await;
        }
        self.log.assert_complete(expected);
    }

    /// Reads until a page comes back empty: with nothing in flight, the end of the feed
    /// (deadline: 60 s).
    pub async fn read_to_the_end(&mut self, client: &reqwest::Client, base: &str) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.try_read_page(client, base, "1s").await != Some(0) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the feed did not end within 60 s"
            );
        }
    }
}

/// The event types of each transfer of `ids`, from its document in the application's store:
/// what a complete feed must have delivered for it (the API does not show the history).
pub async fn histories(app: &super::app::TestApp, ids: &[String]) -> BTreeMap<String, Vec<String>> {
    histories_in(app.store().as_ref(), ids).await
}

/// [`histories`] read from `store`.
pub async fn histories_in(
    store: &dyn transfer_service::store::Store,
    ids: &[String],
) -> BTreeMap<String, Vec<String>> {
    let mut expected = BTreeMap::new();
    for id in ids {
        let doc = store
            .get(transfer_service::store::Index::Transactions, id)
            .await
            .expect("read")
            .expect("the transfer exists");
        let doc: transfer_service::transfer::model::TransferDoc =
            doc.source.decode().expect("a transfer document");
        let types = doc
            .events()
            .iter()
            .map(|e| e.kind.type_name().to_owned())
            .collect();
        expected.insert(id.clone(), types);
    }
    expected
}
