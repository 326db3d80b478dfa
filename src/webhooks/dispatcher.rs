//! One receiver's dispatcher: holds the receiver's delivery lease, reads the change feed from
//! the durable cursor, and POSTs each selected event, signed. What it remembers meanwhile
//! (queues, dedupe, the cursor) is the [`Ledger`]'s.
//!
//! - **Dedupe**: the feed serves an event again after each write of its transfer; the ledger
//!   skips ids it has queued or finished. Across restarts and lease changes an event may be
//!   delivered again (at least once; receivers dedupe on `webhook-id`).
//! - **Order per transfer**: only a transfer's head event is being delivered; the next starts
//!   when the head is delivered or given up. Transfers are delivered concurrently (at most
//!   `max_concurrent` requests at once).
//! - **Retries**: a non-2xx answer, an error or a timeout is retried after an exponential
//!   backoff with full jitter, until the event is older than `WEBHOOK_RETRY_PERIOD` (from its
//!   `at`, so the period holds across restarts): then it is given up, logged and counted.
//! - **Durable cursor**: the ledger's cursor is saved with the lease renewal (at least every
//!   second while it moves). A crash re-delivers from the saved cursor: duplicates, never a
//!   gap.
//! - **Backpressure**: at most `max_pending` events are held; beyond, the feed is not read
//!   until deliveries finish.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{broadcast, Semaphore};
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::fast::{self, DeliveredElsewhere, FastPath};
use super::ledger::{Item, Ledger};
use super::progress::{Progress, ProgressClaim};
use super::{Endpoint, WebhookSettings};
use crate::metrics::Metrics;
use crate::store::FeedPosition;
use crate::trace_context;
use crate::transfer::feed::CursorRefused;
use crate::transfer::feed::Feed;
use crate::transfer::feed::{EventsPage, FeedEvent};
use crate::transfer::model::TransferDoc;
use crate::transfer::operations::ServiceError;
use crate::transfer::view::Event;

/// Transfer documents read per page of the feed.
const PAGE: usize = 100;
/// How long one read of the feed waits for news.
const LONG_POLL: Duration = Duration::from_secs(5);
/// A moved cursor is saved at least this often (besides every lease renewal).
const SAVE_EVERY: Duration = Duration::from_secs(1);
/// Wait after a failed read of the feed or of the progress document.
const STORE_RETRY: Duration = Duration::from_secs(1);
/// Once caught up (a page shorter than [`PAGE`]), the next read starts no sooner than this
/// after the last one: a transfer is written four times or more within milliseconds, and the
/// feed serves it after each write; reading a little later reads it once, at its latest
/// write, instead of once per write (it is the feed's cost, not the receiver's, that
/// dominates what webhooks cost a transfer). It delays a webhook by at most this much.
const CAUGHT_UP_PAUSE: Duration = Duration::from_millis(100);

/// How an event's delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    GivenUp,
}

/// What one attempt needs, shared by the delivery tasks.
pub(super) struct Deliverer {
    pub(super) feed: Arc<Feed>,
    pub(super) settings: Arc<WebhookSettings>,
    pub(super) receiver: Endpoint,
    client: reqwest::Client,
    metrics: Arc<Metrics>,
    slots: Semaphore,
    /// [`Progress::deliver_until`] as of the last claim or save: no attempt is sent after it
    /// (a holder that lost its lease unawares stops delivering before another takes over).
    fence: std::sync::atomic::AtomicI64,
}

pub struct Dispatcher {
    sender: Arc<Deliverer>,
    /// Whether this instance holds the receiver's lease (its [`FastPath`] then stands aside).
    leased_here: Arc<AtomicBool>,
}

/// A read of the feed, with what other instances' fast paths delivered of it.
type Read =
    Pin<Box<dyn Future<Output = Result<(EventsPage, DeliveredElsewhere), ServiceError>> + Send>>;

impl Dispatcher {
    pub fn new(
        feed: Arc<Feed>,
        settings: Arc<WebhookSettings>,
        receiver: Endpoint,
        client: reqwest::Client,
        metrics: Arc<Metrics>,
    ) -> Self {
        let slots = Semaphore::new(settings.max_concurrent.max(1));
        Self {
            sender: Arc::new(Deliverer {
                feed,
                settings,
                receiver,
                client,
                metrics,
                slots,
                fence: std::sync::atomic::AtomicI64::new(0),
            }),
            leased_here: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Where this receiver starts if it is new: the beginning of the feed, or with
    /// `WEBHOOK_START=now` its end as it is now (read again until the store answers). `None`:
    /// the engine shut down first.
    async fn start_position(&self, shutdown: &CancellationToken) -> Option<Option<String>> {
        if !self.sender.settings.start_now {
            return Some(None);
        }
        loop {
            let end = match self.sender.feed.store_identity().await {
                Ok(_) => self.sender.feed.end().await,
                Err(error) => Err(error),
            };
            match end {
                Ok(end) => return Some(end.map(|position| self.sender.feed.cursor(&position))),
                Err(error) => tracing::warn!(
                    receiver = self.sender.receiver.label.as_str(),
                    %error,
                    "webhooks: cannot read where the feed ends; retrying"
                ),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(STORE_RETRY) => {}
            }
        }
    }

    /// Delivers while this instance holds the receiver's lease, waits for it otherwise, until
    /// the engine shuts down. Meanwhile, on a store whose feed trails by a horizon, this
    /// instance's fast path delivers what it writes while another instance holds the lease
    /// ([`FastPath`]).
    pub async fn run(self) {
        let sender = &self.sender;
        let fast = fast::runs_for(sender)
            .then(|| tokio::spawn(FastPath::new(sender.clone(), self.leased_here.clone()).run()));
        self.lease_and_deliver().await;
        if let Some(fast) = fast {
            // It ends with the engine's shutdown too, saving what it delivered.
            let _ = fast.await;
        }
    }

    /// Claims the receiver's lease and delivers while it is held, until the engine shuts down.
    async fn lease_and_deliver(&self) {
        let sender = &self.sender;
        let feed = &sender.feed;
        let shutdown = feed.shutdown_token();
        let receiver = sender.receiver.label.as_str();
        let Some(start) = self.start_position(&shutdown).await else {
            return;
        };
        let mut progress = Progress::new(
            feed.store().clone(),
            feed.clock().clone(),
            sender.receiver.id.clone(),
            sender.settings.lease,
        )
        .starting_at(start);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let wait = match progress.claim().await {
                Ok(ProgressClaim::Leased { cursor }) => {
                    match self.start_of_feed(cursor.as_deref()).await {
                        Ok(start) => {
                            tracing::info!(receiver, owner = progress.owner(), cursor = ?cursor, "webhooks: delivering");
                            self.deliver_while_leased(&mut progress, start, &shutdown)
                                .await;
                            Duration::ZERO
                        }
                        Err(wait) => wait,
                    }
                }
                Ok(ProgressClaim::Busy { until }) => {
                    let left = (until - feed.clock().wall_millis()).max(0) as u64;
                    Duration::from_millis(left + 10).min(sender.settings.lease / 2)
                }
                Err(error) => {
                    tracing::warn!(receiver, %error, "webhooks: cannot read the delivery progress; retrying");
                    STORE_RETRY
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Where delivering starts: the saved `cursor`, checked to be a position of this store's
    /// feed, or the feed's beginning (with the store's identity read, so that every cursor
    /// saved carries it: `Feed::cursor`). `Err`: the store cannot answer; wait this
    /// long and claim again.
    async fn start_of_feed(&self, cursor: Option<&str>) -> Result<Option<FeedPosition>, Duration> {
        let feed = &self.sender.feed;
        let receiver = self.sender.receiver.label.as_str();
        let checked = match cursor {
            None => feed
                .store_identity()
                .await
                .map(|_| None)
                .map_err(CursorRefused::from),
            Some(text) => feed.check_cursor(text).await,
        };
        match checked {
            Ok(position) => Ok(position),
            Err(CursorRefused::Store(error)) => {
                tracing::warn!(receiver, %error, "webhooks: cannot read the store's identity or check the saved cursor; retrying");
                Err(STORE_RETRY)
            }
            // Delivering after it would skip every event up to it: deliver from the
            // beginning instead (receivers dedupe on `webhook-id`).
            Err(refused) => {
                tracing::error!(receiver, %refused,
                    "webhooks: the saved cursor is not a position of this store's feed; delivering from the start of the feed");
                Ok(None)
            }
        }
    }

    /// Delivers from `start` with the lease's gauge and fence set, and clears them when the
    /// lease is lost or the engine shuts down.
    async fn deliver_while_leased(
        &self,
        progress: &mut Progress,
        start: Option<FeedPosition>,
        shutdown: &CancellationToken,
    ) {
        let sender = &self.sender;
        let receiver = sender.receiver.label.as_str();
        let lease_held = sender
            .metrics
            .webhook_lease_held
            .with_label_values(&[receiver]);
        lease_held.set(1);
        self.leased_here.store(true, Ordering::Release);
        sender.set_fence(progress);
        self.deliver(progress, start, shutdown).await;
        sender.fence.store(0, Ordering::Release);
        self.leased_here.store(false, Ordering::Release);
        lease_held.set(0);
        sender
            .metrics
            .webhook_oldest_undelivered_seconds
            .with_label_values(&[receiver])
            .set(0);
    }

    /// Delivers from `start` until the lease is lost or the engine shuts down.
    async fn deliver(
        &self,
        progress: &mut Progress,
        start: Option<FeedPosition>,
        shutdown: &CancellationToken,
    ) {
        let mut session = Session::new(self.sender.clone(), start);
        let renew_every = (self.sender.settings.lease / 3).max(Duration::from_millis(10));
        let mut renew = tokio::time::interval(renew_every);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        renew.tick().await;
        let mut gauge = tokio::time::interval(Duration::from_secs(1));
        loop {
            session.read_if_due();
            let mut save = false;
            tokio::select! {
                _ = shutdown.cancelled() => {
                    session.stop_at_shutdown(progress).await;
                    return;
                }
                page = async { session.read.as_mut().expect("a read").await }, if session.read.is_some() => {
                    session.read = None;
                    session.read_answered(page);
                }
                _ = tokio::time::sleep_until(session.read_again_at), if session.read.is_none() && Instant::now() < session.read_again_at => {}
                Some(joined) = session.tasks.join_next_with_id(), if !session.tasks.is_empty() => {
                    session.delivery_ended(joined);
                }
                written = session.written.recv() => session.written_here(written),
                _ = renew.tick() => save = true,
                _ = gauge.tick() => session.update_oldest_gauge(),
            }
            if (save || session.save_is_due()) && !session.save(progress).await {
                return;
            }
        }
    }
}

/// One stint of delivering while the lease is held: the ledger, the deliveries running, the
/// read of the feed in flight and its timers.
struct Session {
    sender: Arc<Deliverer>,
    ledger: Ledger,
    tasks: JoinSet<(String, Outcome)>,
    /// The transfer each running delivery task works for.
    running: HashMap<Id, String>,
    read: Option<Read>,
    /// Transfers this process writes terminal, for the fast path.
    written: broadcast::Receiver<Arc<TransferDoc>>,
    read_again_at: Instant,
    last_read: Instant,
    last_save: Instant,
    /// Wall millis when the last read started.
    read_started: i64,
    /// While reads of the feed fail: wall millis of the start of the first failed read
    /// (right after the last one that answered). Whatever was written since is not known to
    /// be delivered, so the oldest undelivered event may be that old: the gauge must not read
    /// 0 while the feed cannot be read.
    unread_since: Option<i64>,
}

impl Session {
    fn new(sender: Arc<Deliverer>, start: Option<FeedPosition>) -> Self {
        let read_started = sender.feed.clock().wall_millis();
        let written = sender.feed.terminal_writes();
        Self {
            sender,
            written,
            ledger: Ledger::start(start),
            tasks: JoinSet::new(),
            running: HashMap::new(),
            read: None,
            read_again_at: Instant::now(),
            last_read: Instant::now(),
            last_save: Instant::now(),
            read_started,
            unread_since: None,
        }
    }

    fn receiver(&self) -> &str {
        self.sender.receiver.label.as_str()
    }

    /// Starts a read of the feed unless one is in flight, too many events are pending, or
    /// the pause after the last read has not passed.
    fn read_if_due(&mut self) {
        if self.read.is_some()
            || self.ledger.pending() >= self.sender.settings.max_pending
            || Instant::now() < self.read_again_at
        {
            return;
        }
        let feed = self.sender.feed.clone();
        let after = self.ledger.read_after();
        self.last_read = Instant::now();
        self.read_started = feed.clock().wall_millis();
        let receiver_id = self.sender.receiver.id.clone();
        let fast_paths = fast::runs_for(&self.sender);
        self.read = Some(Box::pin(async move {
            let page = feed.page(after, PAGE, LONG_POLL).await?;
            let elsewhere = match fast_paths {
                true => {
                    let transfers = page.items.iter().map(|event| event.transfer.as_ref());
                    DeliveredElsewhere::read(feed.store(), &receiver_id, transfers).await
                }
                false => DeliveredElsewhere::default(),
            };
            Ok((page, elsewhere))
        }));
    }

    /// A read of the feed answered: queue its events, and pause once caught up; or retry
    /// after a failure.
    fn read_answered(&mut self, page: Result<(EventsPage, DeliveredElsewhere), ServiceError>) {
        match page {
            Ok((page, elsewhere)) => {
                self.unread_since = None;
                if self.accept(page, &elsewhere) < PAGE {
                    self.read_again_at = self.last_read + CAUGHT_UP_PAUSE;
                }
            }
            Err(error) => {
                self.unread_since.get_or_insert(self.read_started);
                tracing::warn!(receiver = self.receiver(), %error, "webhooks: cannot read the change feed; retrying");
                self.read_again_at = Instant::now() + STORE_RETRY;
            }
        }
    }

    /// The fast path: a transfer this process wrote terminal. Its selected events not yet
    /// seen (its earlier ones too, so that they keep their order) are queued at once, with
    /// no wait for the feed's horizon. One this receiver missed (it fell behind the engine's
    /// buffer, or held `max_pending` events already) is left to the feed.
    fn written_here(&mut self, written: Result<Arc<TransferDoc>, broadcast::error::RecvError>) {
        let transfer = match written {
            Ok(transfer) => transfer,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::debug!(
                    receiver = self.receiver(),
                    missed,
                    "webhooks: the fast path fell behind; the feed delivers what it missed"
                );
                return;
            }
            Err(broadcast::error::RecvError::Closed) => {
                unreachable!("the feed, which sends them, outlives its dispatchers")
            }
        };
        // Backpressure as on the feed's path: beyond `max_pending`, the feed delivers it.
        if self.ledger.pending() >= self.sender.settings.max_pending {
            return;
        }
        let events = FeedEvent::all_of(&transfer).collect();
        let ledger = &self.ledger;
        let items = self
            .sender
            .selected_items(events, |event| ledger.is_new(&event.id));
        for transfer in self.ledger.record_written(items) {
            self.start_head(transfer);
        }
    }

    /// Queues the selected, unseen events of a page and starts the heads of idle transfers;
    /// returns how many transfer documents the page held.
    fn accept(&mut self, page: EventsPage, elsewhere: &DeliveredElsewhere) -> usize {
        // A page serves each of its documents' events together, so a new document starts
        // where the transfer changes.
        let documents = page
            .items
            .iter()
            .enumerate()
            .filter(|(i, event)| {
                *i == 0 || !Arc::ptr_eq(&page.items[i - 1].transfer, &event.transfer)
            })
            .count();
        // The events the ledger has not seen, and those the fast path queued and has not
        // delivered yet: the page must hold them (`Ledger::record_page`).
        // Skipped as well: what another instance's fast path delivered (`super::fast`).
        let ledger = &self.ledger;
        let items = self.sender.selected_items(page.items, |event| {
            (ledger.is_new(&event.id) && !elsewhere.delivered(&event.transfer))
                || ledger.is_undelivered_fast(&event.transfer.transaction_id, &event.id)
        });
        for transfer in self.ledger.record_page(items, page.next) {
            self.start_head(transfer);
        }
        documents
    }

    /// A delivery task ended: finish its event and start the transfer's next; a task that
    /// panicked is started again on the same event.
    fn delivery_ended(&mut self, joined: Result<(Id, (String, Outcome)), tokio::task::JoinError>) {
        match joined {
            Ok((id, (transfer, _outcome))) => {
                self.running.remove(&id);
                if self.ledger.finish_head(&transfer) {
                    self.start_head(transfer);
                }
            }
            Err(error) => {
                tracing::error!(receiver = self.receiver(), %error, "webhooks: a delivery task failed; retrying its event");
                if let Some(transfer) = self.running.remove(&error.id()) {
                    self.start_head(transfer);
                }
            }
        }
    }

    /// Spawns the delivery of `transfer`'s head event.
    fn start_head(&mut self, transfer: String) {
        let Some(item) = self.ledger.head(&transfer).cloned() else {
            return;
        };
        let sender = self.sender.clone();
        let handle = self.tasks.spawn({
            let transfer = transfer.clone();
            async move { (transfer, sender.deliver(item).await) }
        });
        self.running.insert(handle.id(), transfer);
    }

    /// Sets the age of the oldest event not delivered (or not known to be: see
    /// `unread_since`).
    fn update_oldest_gauge(&self) {
        let now = self.sender.feed.clock().wall_millis();
        let oldest = self
            .ledger
            .oldest()
            .into_iter()
            .chain(self.unread_since)
            .min();
        let age = oldest.map_or(0, |at| (now - at).max(0) / 1000);
        self.sender
            .metrics
            .webhook_oldest_undelivered_seconds
            .with_label_values(&[self.receiver()])
            .set(age);
    }

    /// Whether a moved cursor waits to be saved for [`SAVE_EVERY`] or longer.
    fn save_is_due(&self) -> bool {
        self.ledger.is_dirty() && self.last_save.elapsed() >= SAVE_EVERY
    }

    fn cursor(&self) -> Option<String> {
        (self.ledger.cursor()).map(|p| self.sender.feed.cursor(p))
    }

    /// Saves the cursor with a renewal of the lease. `false`: the lease is lost (taken over,
    /// or run out unrenewed); every delivery is stopped.
    async fn save(&mut self, progress: &mut Progress) -> bool {
        self.last_save = Instant::now();
        let saved = progress.save(self.cursor()).await;
        self.sender.set_fence(progress);
        let receiver = self.receiver();
        match saved {
            Ok(true) => {
                self.ledger.saved();
                return true;
            }
            Ok(false) => tracing::warn!(
                receiver,
                "webhooks: another instance took the delivery lease over; standing by"
            ),
            Err(error) => {
                tracing::warn!(receiver, %error, "webhooks: cannot save the delivery progress");
                if progress.holds() {
                    return true;
                }
                tracing::warn!(
                    receiver,
                    "webhooks: the delivery lease ran out unrenewed; standing by"
                );
            }
        }
        self.tasks.abort_all();
        false
    }

    /// Stops every delivery and gives the lease up with the cursor saved.
    async fn stop_at_shutdown(&mut self, progress: &mut Progress) {
        self.tasks.abort_all();
        if let Err(error) = progress.release(self.cursor()).await {
            tracing::warn!(receiver = self.receiver(), %error, "webhooks: could not save the progress at shutdown");
        }
    }
}

impl Deliverer {
    /// The events this receiver selected that are `wanted`, encoded, as `(transfer, item)`.
    fn selected_items(
        &self,
        events: Vec<FeedEvent>,
        wanted: impl Fn(&FeedEvent) -> bool,
    ) -> Vec<(String, Item)> {
        let settings = &self.settings;
        let selected: Vec<_> = events
            .into_iter()
            .filter(|event| settings.events.contains(&event.kind) && wanted(event))
            .collect();
        let meta: Vec<(String, i64, Option<String>)> = selected
            .iter()
            .map(|event| {
                let transfer = &event.transfer;
                // Untraced, a stored context is not even copied.
                let trace = trace_context::is_on()
                    .then(|| transfer.traceparent.clone())
                    .flatten();
                (transfer.transaction_id.clone(), event.at, trace)
            })
            .collect();
        Event::from_feed(selected)
            .into_iter()
            .zip(meta)
            .filter_map(|(view, (transfer, at, trace))| match serde_json::to_vec(&view) {
                Ok(body) => {
                    let item = Item::new(view.id, at, Bytes::from(body)).in_trace(trace.as_deref());
                    Some((transfer, item))
                }
                Err(error) => {
                    tracing::error!(%error, id = view.id, "webhooks: cannot encode an event; skipping it");
                    None
                }
            })
            .collect()
    }

    /// Every event of `transfer` this receiver selected, encoded.
    pub(super) fn items_of(&self, transfer: &Arc<TransferDoc>) -> Vec<(String, Item)> {
        self.selected_items(FeedEvent::all_of(transfer).collect(), |_| true)
    }

    /// Attempts `item` until it is delivered or older than the retry period.
    async fn deliver(&self, item: Item) -> Outcome {
        let settings = &self.settings;
        let receiver = self.receiver.label.as_str();
        let clock = self.feed.clock();
        let give_up_at = item.at + settings.retry_period.as_millis() as i64;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let result = {
                let _slot = self.slots.acquire().await.expect("never closed");
                self.wait_for_the_fence().await;
                self.attempt(&item).await
            };
            let now = clock.wall_millis();
            let why = match result {
                Ok(()) => {
                    self.count_delivered(&item, now);
                    return Outcome::Delivered;
                }
                Err(why) => why,
            };
            if now >= give_up_at {
                self.metrics
                    .webhook_deliveries_total
                    .with_label_values(&["given_up"])
                    .inc();
                tracing::warn!(
                    receiver,
                    id = item.id,
                    attempts = attempt,
                    last_error = why,
                    "webhooks: giving up on an event older than WEBHOOK_RETRY_PERIOD"
                );
                return Outcome::GivenUp;
            }
            self.metrics
                .webhook_deliveries_total
                .with_label_values(&["failed"])
                .inc();
            let wait = settings
                .backoff
                .delay(attempt)
                .min(Duration::from_millis((give_up_at - now).max(0) as u64));
            tracing::debug!(
                receiver,
                id = item.id,
                attempt,
                error = why,
                ?wait,
                "webhooks: delivery failed; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// The fast path of an instance that does not hold the lease ([`FastPath`]): attempts
    /// `item` until it is delivered (`true`) or `until` (wall millis) has passed, then leaves
    /// it to the holder, which reads it from the feed. Not fenced: no lease is involved, and
    /// the holder skips only what this delivered.
    pub(super) async fn deliver_fast(&self, item: Item, until: i64) -> bool {
        let clock = self.feed.clock();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let result = {
                let _slot = self.slots.acquire().await.expect("never closed");
                self.attempt(&item).await
            };
            let now = clock.wall_millis();
            match result {
                Ok(()) => {
                    self.count_delivered(&item, now);
                    return true;
                }
                Err(why) if now >= until => {
                    tracing::debug!(
                        receiver = self.receiver.label.as_str(),
                        id = item.id,
                        error = why,
                        "webhooks: the fast path leaves an event to the lease holder"
                    );
                    return false;
                }
                Err(_) => {}
            }
            self.metrics
                .webhook_deliveries_total
                .with_label_values(&["failed"])
                .inc();
            let wait = self.settings.backoff.delay(attempt);
            tokio::time::sleep(wait.min(Duration::from_millis((until - now).max(0) as u64))).await;
        }
    }

    fn count_delivered(&self, item: &Item, now: i64) {
        self.metrics
            .webhook_deliveries_total
            .with_label_values(&["delivered"])
            .inc();
        let path = if item.is_fast() { "fast" } else { "feed" };
        self.metrics
            .webhook_delivery_lag_seconds
            .with_label_values(&[path])
            .observe((now - item.at).max(0) as f64 / 1000.0);
    }

    /// Moves the fence to what `progress` now allows.
    fn set_fence(&self, progress: &Progress) {
        let until = progress.deliver_until();
        self.fence
            .store(until, std::sync::atomic::Ordering::Release);
    }

    /// Waits while the fence has passed: the lease is being renewed (or lost, and this task
    /// is about to be aborted).
    async fn wait_for_the_fence(&self) {
        use std::sync::atomic::Ordering;
        while self.feed.clock().wall_millis() >= self.fence.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One signed POST; `Err` says why it did not count as delivered. With traces exported,
    /// a client span of the transfer's trace, whose context the request carries.
    async fn attempt(&self, item: &Item) -> Result<(), String> {
        let span = self.attempt_span(item);
        let result = self.post(item, &span).instrument(span.clone()).await;
        if let Err(why) = &result {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", why.as_str());
        }
        result
    }

    /// The span of one delivery attempt: a child of the span that created the transfer.
    fn attempt_span(&self, item: &Item) -> tracing::Span {
        if !trace_context::is_on() || item.traceparent().is_none() {
            return tracing::Span::none();
        }
        let span = tracing::debug_span!(
            target: trace_context::TARGET,
            "webhook",
            otel.name = "POST webhook",
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            http.request.method = "POST",
            webhook.receiver = self.receiver.label.as_str(),
            webhook.id = item.id.as_str(),
            http.response.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        trace_context::continue_from(&span, item.traceparent());
        span
    }

    async fn post(&self, item: &Item, span: &tracing::Span) -> Result<(), String> {
        let timestamp = self.feed.clock().wall_millis().div_euclid(1000);
        let signature = self.settings.secret.sign(&item.id, timestamp, &item.body);
        let mut trace_headers = reqwest::header::HeaderMap::new();
        trace_context::inject_into_headers(span, &mut trace_headers);
        let response = self
            .client
            .post(self.receiver.url.clone())
            .headers(trace_headers)
            .header("webhook-id", &item.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(item.body.clone())
            .send()
            .await
            .map_err(|error| {
                if error.is_timeout() {
                    "timed out (WEBHOOK_TIMEOUT)".to_owned()
                } else {
                    format!("request failed: {}", error.without_url())
                }
            })?;
        let status = response.status();
        if !span.is_disabled() {
            span.record("http.response.status_code", i64::from(status.as_u16()));
        }
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("answered {status}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dispatcher for a receiver nobody listens on (its attempts fail and retry; these
    /// tests look only at its bookkeeping), selecting the terminal events.
    fn dispatcher(dir: &std::path::Path) -> Dispatcher {
        use crate::store::elasticsearch::Secret;
        use crate::webhooks::WebhookArgs;
        let store: crate::store::DynStore =
            Arc::new(crate::store::embedded::EmbeddedStore::open(dir).unwrap());
        let config = crate::transfer::EngineConfig::with_lease(Duration::from_secs(30));
        let engine = crate::transfer::Engine::new(store, config, Metrics::new());
        let args = WebhookArgs {
            webhook_url: vec!["http://127.0.0.1:1/hook".into()],
            webhook_secret: Some(Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")),
            ..WebhookArgs::default()
        };
        let settings = WebhookSettings::from_args(&args, Duration::from_secs(30))
            .unwrap()
            .unwrap();
        let receiver = settings.receivers[0].clone();
        Dispatcher::new(
            engine.feed().clone(),
            Arc::new(settings),
            receiver,
            reqwest::Client::new(),
            Metrics::new(),
        )
    }

    /// A page holding `transfer` (finished, so with its terminal event), ending at `next`.
    fn page(transfer: Option<&str>, next: u64) -> EventsPage {
        let items = transfer.into_iter().flat_map(|id| {
            let doc: crate::transfer::model::TransferDoc =
                serde_json::from_value(serde_json::json!({
                    "transaction_id": id, "src_acct": "a", "dest_acct": "b", "amount": 1,
                    "transaction_state": "finished", "history": "p1000 m1000 f1000",
                    "creation_time": "2026-01-01T00:00:00.000Z",
                    "modification_time": "2026-01-01T00:00:01.000Z",
                }))
                .unwrap();
            let doc = Arc::new(doc);
            doc.events()
                .into_iter()
                .map(move |event| crate::transfer::feed::FeedEvent {
                    id: event.id(id),
                    kind: event.kind,
                    at: event.at,
                    transfer: doc.clone(),
                })
        });
        EventsPage {
            items: items.collect(),
            next: Some(FeedPosition::Seq(next)),
        }
    }

    #[tokio::test]
    async fn a_page_that_serves_an_event_the_fast_path_is_still_delivering_waits_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let d = dispatcher(dir.path());
        let mut session = Session::new(d.sender.clone(), None);
        // t1 written here: its terminal event goes by the fast path (to a receiver nobody
        // listens on, so it stays undelivered).
        let written = page(Some("t1"), 0).items[0].transfer.clone();
        session.written_here(Ok(written));
        assert_eq!(session.ledger.pending(), 1);
        // The feed serves t1 while that delivery is still out: the cursor must not pass it
        // (a crash now would otherwise lose the event).
        session.accept(page(Some("t1"), 10), &DeliveredElsewhere::default());
        assert_eq!(session.ledger.pending(), 1, "not queued twice");
        assert_eq!(
            session.ledger.cursor(),
            None,
            "held back by the undelivered event"
        );
        session.tasks.abort_all();
    }

    #[tokio::test]
    async fn a_page_queues_its_selected_events_once_and_starts_their_transfers() {
        let dir = tempfile::tempdir().unwrap();
        let d = dispatcher(dir.path());
        let mut session = Session::new(d.sender.clone(), None);
        // t1's terminal event; then t1 again (its repeat), then a page with nothing.
        assert_eq!(
            session.accept(page(Some("t1"), 10), &DeliveredElsewhere::default()),
            1,
            "one document"
        );
        session.accept(page(Some("t1"), 11), &DeliveredElsewhere::default());
        session.accept(page(None, 12), &DeliveredElsewhere::default());
        assert_eq!(
            session.ledger.pending(),
            1,
            "the repeat is not queued again"
        );
        assert_eq!(
            session.running.values().collect::<Vec<_>>(),
            ["t1"],
            "t1's head is being delivered"
        );
        assert_eq!(
            session.ledger.cursor(),
            None,
            "blocked by t1's undelivered event"
        );
        session.tasks.abort_all();
    }
}
