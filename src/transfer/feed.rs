//! The change feed (`docs/design.md §11`): every transition of every transfer, read from the
//! transfer documents in the order of their latest writes. Each document carries its own
//! history (`super::history`), written in the same write as the transition, so the feed has
//! no store of its own to lose or to keep in step.

use std::sync::Arc;
use std::time::Duration;

use super::documents::decode;
use super::history::EventKind;
use super::model::TransferDoc;
use super::service::ServiceError;
use super::Engine;
use crate::store::{ChangesQuery, FeedPosition, SortKey};

/// The delay of a search after a write is applied on Elasticsearch: its default refresh
/// interval (`docs/elasticsearch.md §7`; the service does not change it).
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// How often a waiting read looks again when no write of this process woke it (another
/// instance may have written, or the horizon moved on).
const WAIT_POLL: Duration = Duration::from_millis(500);

/// One event as the feed serves it.
#[derive(Debug, Clone)]
pub struct FeedEvent {
    /// `<transfer id>/<type>`: the same each time the event is served.
    pub id: String,
    pub kind: EventKind,
    /// Epoch milliseconds of the write that recorded it.
    pub at: i64,
    /// The transfer as it was when the page was read (it may have moved on since the event).
    pub transfer: Arc<TransferDoc>,
}

/// A page of the feed and where to continue.
#[derive(Debug, Clone)]
pub struct EventsPage {
    pub items: Vec<FeedEvent>,
    /// The position to pass as `after` next: the last document read, or the position asked
    /// for when nothing new was there (`None` only when the feed is still empty).
    pub next: Option<FeedPosition>,
}

impl Engine {
    /// Reads a cursor of this backend's form (`FeedPosition::encode`); `None` if it is not
    /// one. Every cursor of the form is accepted, as the OpenAPI document says: a `seq_no`
    /// past the largest one reads as that (no write is later).
    pub fn parse_feed_cursor(&self, text: &str) -> Option<FeedPosition> {
        // 1 to `max_len` digits, no sign, no spaces.
        let digits = |text: &str, max_len: usize| {
            !text.is_empty() && text.len() <= max_len && text.bytes().all(|b| b.is_ascii_digit())
        };
        if self.feed_is_exact() {
            let seq_no = text.parse::<u64>().unwrap_or(u64::MAX);
            return digits(text, 20).then_some(FeedPosition::Seq(seq_no));
        }
        let (millis, id) = text.split_once('~')?;
        (digits(millis, 15) && crate::transfer::model::valid_id(id)).then(|| {
            FeedPosition::Time(SortKey {
                millis: millis.parse().expect("at most 15 digits"),
                id: id.to_owned(),
            })
        })
    }

    /// Whether the store orders writes exactly (the embedded store) or the feed must stay
    /// below a horizon (Elasticsearch).
    fn feed_is_exact(&self) -> bool {
        self.store.backend() == "embedded"
    }

    /// How far behind the wall clock the feed reads on a store that cannot order writes
    /// exactly: a write is searchable one refresh after it is applied, it is applied within
    /// the longest a request may take (`STORE_TIMEOUT`) of its stamp or its writer stamps it
    /// again (`super::lease`), and the reader's wall clock may differ from the writer's by
    /// twice the skew margin (the clock assumption of `docs/design.md §9`: holders stop a
    /// margin early and takers wait a margin late). Zero on the embedded store.
    pub fn feed_delay(&self) -> Duration {
        if self.feed_is_exact() {
            return Duration::ZERO;
        }
        REFRESH_INTERVAL + self.config.request_timeout + 2 * self.config.skew_margin
    }

    /// Up to `limit` transfers' events after `after`; when there are none and `wait` is not
    /// zero, waits up to `wait` for some.
    pub async fn events_page(
        &self,
        after: Option<FeedPosition>,
        limit: usize,
        wait: Duration,
    ) -> Result<EventsPage, ServiceError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before the read, so a write between the read and the wait wakes it.
            let written = self.docs.transfers_written().notified();
            tokio::pin!(written);
            written.as_mut().enable();
            let page = self.read_events(after.clone(), limit).await?;
            let now = tokio::time::Instant::now();
            if !page.items.is_empty() || now >= deadline {
                return Ok(page);
            }
            let tick = (now + WAIT_POLL).min(deadline);
            // Behind a horizon a write that just happened is not served yet: waking on it
            // would only search again for nothing, so there only the poll wakes the reader.
            let woken_by_writes = self.feed_is_exact();
            tokio::select! {
                _ = written, if woken_by_writes => {}
                _ = tokio::time::sleep_until(tick) => {}
                _ = self.shutdown.cancelled() => return Ok(page),
            }
        }
    }

    /// Where the feed ends now: the position of the newest transfer write it serves (`None`
    /// while it serves none). Reading on `after` it sees only later writes.
    pub async fn feed_end(&self) -> Result<Option<FeedPosition>, ServiceError> {
        let query = ChangesQuery {
            after: None,
            horizon: self.feed_horizon(),
            limit: 1,
            newest: true,
        };
        let page = self.store.changes(&query).await?;
        Ok(page.docs.into_iter().last().map(|(position, _)| position))
    }

    /// Epoch milliseconds below which the feed serves writes ([`Engine::feed_delay`] ago).
    fn feed_horizon(&self) -> i64 {
        self.clock.wall_millis() - self.feed_delay().as_millis() as i64
    }

    async fn read_events(
        &self,
        after: Option<FeedPosition>,
        limit: usize,
    ) -> Result<EventsPage, ServiceError> {
        let horizon = self.feed_horizon();
        let query = ChangesQuery {
            after: after.clone(),
            horizon,
            limit,
            newest: false,
        };
        let page = self.store.changes(&query).await?;
        let next = page
            .docs
            .last()
            .map(|(position, _)| position.clone())
            .or(after);
        let mut items = Vec::new();
        for (_, doc) in page.docs {
            // A document that does not decode is left to the auditor; the cursor moves past it.
            let transfer = match decode::<TransferDoc>(doc) {
                Ok(versioned) => Arc::new(versioned.doc),
                Err(error) => {
                    tracing::warn!(%error, "change feed: skipping a transfer that does not decode");
                    continue;
                }
            };
            for event in transfer.events() {
                items.push(FeedEvent {
                    id: event.id(&transfer.transaction_id),
                    kind: event.kind,
                    at: event.at,
                    transfer: transfer.clone(),
                });
            }
        }
        self.metrics.events_served_total.inc_by(items.len() as u64);
        Ok(EventsPage { items, next })
    }
}
