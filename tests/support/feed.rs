//! What a change-feed consumer saw (`GET /events` or `Engine::events_page`), and the check
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
        let mut path = format!("/events?limit={}&wait={wait}", self.limit);
        if let Some(cursor) = &self.cursor {
            path.push_str(&format!("&after={cursor}"));
        }
        let (status, page) = app.get(&path).await;
        assert_eq!(status, 200, "{page}");
        self.log.record_page(&page);
        if let Some(next) = page["next_cursor"].as_str() {
            self.cursor = Some(next.to_owned());
        }
        page["items"].as_array().map_or(0, Vec::len)
    }

    /// Reads pages until every transfer of `expected` has all its events (deadline: 60 s).
    pub async fn read_until_complete(
        &mut self,
        app: &super::app::TestApp,
        expected: &BTreeMap<String, Vec<String>>,
    ) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while !self.log.has_all(expected) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the feed did not deliver every event within 60 s: {:?}",
                self.log
            );
            self.read_page(app, "1s").await;
        }
        self.log.assert_complete(expected);
    }
}

/// The event types of each transfer of `ids` as the API shows its history: what a complete
/// feed must have delivered for it. Read from the transfer documents (`GET` does not show the
/// history), through the application's store.
pub async fn histories(app: &super::app::TestApp, ids: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut expected = BTreeMap::new();
    for id in ids {
        let doc = app
            .store()
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
