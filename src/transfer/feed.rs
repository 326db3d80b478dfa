//! The change feed (`docs/design.md §11`): every transition of every transfer, read from the
//! transfer documents in the order of their latest writes. Each document carries its own
//! history (`super::history`), written in the same write as the transition, so the feed has
//! no store of its own to lose or to keep in step.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::clock::DynClock;
use super::documents::{decode, Documents};
use super::history::EventKind;
use super::model::TransferDoc;
use super::operations::ServiceError;
use crate::metrics::Metrics;
use crate::store::{ChangesQuery, DynStore, FeedPosition, SortKey};

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

impl FeedEvent {
    /// Every event of `transfer` so far, in order, as the feed serves them.
    pub fn all_of(transfer: &Arc<TransferDoc>) -> impl Iterator<Item = FeedEvent> + '_ {
        transfer.events().into_iter().map(|event| FeedEvent {
            id: event.id(&transfer.transaction_id),
            kind: event.kind,
            at: event.at,
            transfer: transfer.clone(),
        })
    }
}

/// A page of the feed and where to continue.
#[derive(Debug, Clone)]
pub struct EventsPage {
    pub items: Vec<FeedEvent>,
    /// The position to pass as `after` next: the last document read, or the position asked
    /// for when nothing new was there (`None` only when the feed is still empty).
    pub next: Option<FeedPosition>,
}

/// Why a feed cursor (`GET /events?after=`, a webhook receiver's saved progress) is not
/// read: each says what was received, why it is not a position of this feed, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CursorRefused {
    /// Not of the form this backend issues.
    #[error(
        "`{0}` is not a cursor this service issued: pass the `next_cursor` of a page \
         (such as `{1}`), `now` for the end of the feed, or no cursor to start at the beginning"
    )]
    NotACursor(String, &'static str),
    /// Issued by another store (another instance's, or before a restore).
    #[error(
        "cursor `{cursor}` was issued by another store ({theirs}; this one is {ours}): a \
         cursor is only valid on the store that issued it. Start again at the beginning \
         (no cursor) and skip the event ids already processed, or at `now`"
    )]
    OtherStore {
        cursor: String,
        theirs: String,
        ours: String,
    },
    /// Past the newest position of this feed: no write of this store is that late.
    #[error(
        "cursor `{cursor}` is past the end of this feed ({end}): this store never issued it \
         (a store restored from an older backup, or another one's cursor). Start again at the \
         beginning (no cursor) and skip the event ids already processed, or at `now`"
    )]
    PastTheEnd { cursor: String, end: String },
    /// The store could not be asked.
    #[error(transparent)]
    Store(#[from] ServiceError),
}

/// At most 64 characters of a client's text, for a message.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// The identity part of a cursor, `<identity>~<position>`: up to 63 digits, then a letter,
/// `_` or `-`, then up to 64 letters, digits, `_` or `-` (the OpenAPI `FeedCursor` pattern).
/// A position alone, as cursors were before they carried an identity, has only digits up to
/// its first `~`.
fn split_identity(text: &str) -> (Option<&str>, &str) {
    let Some((identity, position)) = text.split_once('~') else {
        return (None, text);
    };
    let digits = identity.bytes().take_while(u8::is_ascii_digit).count();
    let rest = &identity.as_bytes()[digits..];
    let word = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-';
    let valid = digits <= 63
        && rest.first().is_some_and(|b| !b.is_ascii_digit() && word(b))
        && rest.len() <= 65
        && rest.iter().all(word);
    if valid {
        (Some(identity), position)
    } else {
        (None, text)
    }
}

/// Terminal writes kept for a fast-path receiver that has not read them yet
/// ([`Feed::terminal_writes`]): a second of the most a 2-core machine settles, and more.
pub const TERMINAL_WRITES_KEPT: usize = 16_384;

/// The change feed of one store, as this process serves it (`GET /events`, the webhooks):
/// its pages and cursors, and the transfers this process writes terminal, announced as soon
/// as their writes are acknowledged (the webhooks' fast path). Built once by the engine; the
/// webhooks depend on it, not on the engine.
pub struct Feed {
    store: DynStore,
    docs: Documents,
    clock: DynClock,
    metrics: Arc<Metrics>,
    /// The engine's: a waiting read ends when it is cancelled.
    shutdown: CancellationToken,
    /// This process's name in lease owners (`super::lease`).
    instance: String,
    /// [`Feed::delay`], fixed when built.
    delay: Duration,
    /// The store's identity once read (`Store::identity`), which cursors carry.
    store_identity: OnceLock<String>,
    /// Every transfer this process wrote terminal, as written, once the store acknowledged
    /// it. A receiver that falls behind misses some (the feed still serves them).
    terminal_writes: broadcast::Sender<Arc<TransferDoc>>,
}

/// How far behind the wall clock the feed reads on a store that cannot order writes
/// exactly: a write is searchable one refresh after it is applied, it is applied within
/// the longest a request may take (`STORE_TIMEOUT`) of its stamp or its writer stamps it
/// again (`super::lease`), and the reader's wall clock may differ from the writer's by
/// twice the skew margin (the clock assumption of `docs/design.md §9`: holders stop a
/// margin early and takers wait a margin late). Zero on a store that orders writes exactly.
fn delay(exact: bool, request_timeout: Duration, skew_margin: Duration) -> Duration {
    if exact {
        return Duration::ZERO;
    }
    REFRESH_INTERVAL + request_timeout + 2 * skew_margin
}

/// What the feed is built from (all of it the engine's).
pub(super) struct FeedParts {
    pub store: DynStore,
    pub docs: Documents,
    pub clock: DynClock,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    pub instance: String,
    /// `STORE_TIMEOUT` and the clocks' skew margin, which bound how late a write is applied
    /// after its stamp (see [`Feed::delay`]).
    pub request_timeout: Duration,
    pub skew_margin: Duration,
}

impl Feed {
    pub(super) fn new(parts: FeedParts) -> Self {
        let exact = parts.store.backend() == "embedded";
        Self {
            delay: delay(exact, parts.request_timeout, parts.skew_margin),
            store: parts.store,
            docs: parts.docs,
            clock: parts.clock,
            metrics: parts.metrics,
            shutdown: parts.shutdown,
            instance: parts.instance,
            store_identity: OnceLock::new(),
            terminal_writes: broadcast::channel(TERMINAL_WRITES_KEPT).0,
        }
    }

    /// The store the feed reads, for what its readers keep there (a webhook receiver's
    /// progress).
    pub fn store(&self) -> &DynStore {
        &self.store
    }

    /// The clock its horizon is read on.
    pub fn clock(&self) -> &DynClock {
        &self.clock
    }

    /// Cancelled when the engine shuts down: readers of the feed stop with it.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// This process's name in lease owners and in `settled_by` (`super::lease`).
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The transfers this process writes terminal from now on, each once its write is
    /// acknowledged (at most [`TERMINAL_WRITES_KEPT`] not yet received are kept for a
    /// receiver; beyond, it is told how many it missed).
    pub fn terminal_writes(&self) -> broadcast::Receiver<Arc<TransferDoc>> {
        self.terminal_writes.subscribe()
    }

    /// Announces a terminal write the store acknowledged (the driver, after the write).
    pub(super) fn announce_terminal(&self, doc: &TransferDoc) {
        if self.terminal_writes.receiver_count() > 0 {
            // An error only means every receiver went away since.
            let _ = self.terminal_writes.send(Arc::new(doc.clone()));
        }
    }

    /// The store's identity (`Store::identity`), read once; `None` for a store without one.
    pub async fn store_identity(&self) -> Result<Option<String>, ServiceError> {
        if let Some(identity) = self.store_identity.get() {
            return Ok(Some(identity.clone()));
        }
        let identity = self.store.identity().await?;
        if let Some(identity) = &identity {
            let _ = self.store_identity.set(identity.clone());
        }
        Ok(identity)
    }

    /// The cursor text of `position`: `<store identity>~<position>` once the identity was
    /// read ([`Engine::store_identity`], which every reader of the feed asks first), else the
    /// position alone.
    pub fn cursor(&self, position: &FeedPosition) -> String {
        match self.store_identity.get() {
            Some(identity) => format!("{identity}~{}", position.encode()),
            None => position.encode(),
        }
    }

    /// Reads a cursor this store issued: of this backend's form, of this store (a cursor
    /// without an identity, as issued before cursors carried one, is taken as this store's),
    /// and not past the end of the feed. `now`: where the feed ends now.
    pub async fn check_cursor(&self, text: &str) -> Result<Option<FeedPosition>, CursorRefused> {
        let ours = self.store_identity().await?;
        if text == "now" {
            return Ok(self.end().await?);
        }
        let shown = shorten(text);
        let (theirs, position_text) = split_identity(text);
        let example = if self.is_exact() {
            "e3f1a2b4c5d6e7f8~42"
        } else {
            "Vq3xQ1rTQbqKc0mS4vD6Hg~1764000000000~t-1"
        };
        let position = self
            .parse_cursor(position_text)
            .ok_or_else(|| CursorRefused::NotACursor(shown.clone(), example))?;
        if let Some(theirs) = theirs {
            if ours.as_deref() != Some(theirs) {
                return Err(CursorRefused::OtherStore {
                    cursor: shown,
                    theirs: shorten(theirs),
                    ours: ours.unwrap_or_else(|| "one without an identity".into()),
                });
            }
        }
        let past = |end: String| CursorRefused::PastTheEnd {
            cursor: shown.clone(),
            end,
        };
        match &position {
            FeedPosition::Seq(seq_no) => match self.end().await? {
                Some(FeedPosition::Seq(end)) if *seq_no <= end => {}
                Some(end) => return Err(past(format!("it ends at {}", self.cursor(&end)))),
                None => return Err(past("it has no events yet".into())),
            },
            // Every instance serves only writes older than its horizon, at least two skew
            // margins behind its wall clock: no cursor is later than this clock's now.
            FeedPosition::Time(key) => {
                let now = self.clock.wall_millis();
                if key.millis > now {
                    return Err(past(format!(
                        "it ends before now, {}",
                        crate::time::format_millis(now)
                    )));
                }
            }
        }
        Ok(Some(position))
    }

    /// Reads a cursor of this backend's form (`FeedPosition::encode`); `None` if it is not
    /// one. Every cursor of the form is accepted, as the OpenAPI document says: a `seq_no`
    /// past the largest one reads as that (no write is later).
    pub fn parse_cursor(&self, text: &str) -> Option<FeedPosition> {
        // 1 to `max_len` digits, no sign, no spaces.
        let digits = |text: &str, max_len: usize| {
            !text.is_empty() && text.len() <= max_len && text.bytes().all(|b| b.is_ascii_digit())
        };
        if self.is_exact() {
            let seq_no = text.parse::<u64>().unwrap_or(u64::MAX);
            return digits(text, 20).then_some(FeedPosition::Seq(seq_no));
        }
        let (millis, id) = text.split_once('~')?;
        (digits(millis, 15) && crate::transfer::validated::valid_id(id)).then(|| {
            FeedPosition::Time(SortKey {
                millis: millis.parse().expect("at most 15 digits"),
                id: id.to_owned(),
            })
        })
    }

    /// Whether the store orders writes exactly (the embedded store) or the feed must stay
    /// below a horizon (Elasticsearch).
    fn is_exact(&self) -> bool {
        self.store.backend() == "embedded"
    }

    /// How far behind the wall clock the feed reads ([`delay`]); zero on the embedded store.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Up to `limit` transfers' events after `after`; when there are none and `wait` is not
    /// zero, waits up to `wait` for some.
    pub async fn page(
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
            let woken_by_writes = self.is_exact();
            tokio::select! {
                _ = written, if woken_by_writes => {}
                _ = tokio::time::sleep_until(tick) => {}
                _ = self.shutdown.cancelled() => return Ok(page),
            }
        }
    }

    /// Where the feed ends now: the position of the newest transfer write it serves (`None`
    /// while it serves none). Reading on `after` it sees only later writes.
    pub async fn end(&self) -> Result<Option<FeedPosition>, ServiceError> {
        let query = ChangesQuery {
            after: None,
            horizon: self.horizon(),
            limit: 1,
            newest: true,
        };
        let page = self.store.changes(&query).await?;
        Ok(page.docs.into_iter().last().map(|(position, _)| position))
    }

    /// Epoch milliseconds below which the feed serves writes ([`Feed::delay`] ago).
    fn horizon(&self) -> i64 {
        self.clock.wall_millis() - self.delay().as_millis() as i64
    }

    async fn read_events(
        &self,
        after: Option<FeedPosition>,
        limit: usize,
    ) -> Result<EventsPage, ServiceError> {
        let horizon = self.horizon();
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
            items.extend(FeedEvent::all_of(&transfer));
        }
        self.metrics.events_served_total.inc_by(items.len() as u64);
        Ok(EventsPage { items, next })
    }
}
