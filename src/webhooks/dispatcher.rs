//! One receiver's dispatcher: holds the receiver's delivery lease, reads the change feed from
//! the durable cursor, and POSTs each selected event, signed.
//!
//! - **Dedupe**: the feed serves an event again after each write of its transfer; ids this
//!   dispatcher has queued or finished are remembered (the last [`REMEMBERED`] finished ones)
//!   and skipped. Across restarts and lease changes an event may be delivered again
//!   (at least once; receivers dedupe on `webhook-id`).
//! - **Order per transfer**: each transfer has a queue; only its head is being delivered, the
//!   next starts when the head is delivered or given up. Transfers are delivered concurrently
//!   (at most `max_concurrent` requests at once).
//! - **Retries**: a non-2xx answer, an error or a timeout is retried after an exponential
//!   backoff with full jitter, until the event is older than `WEBHOOK_RETRY_PERIOD` (from its
//!   `at`, so the period holds across restarts): then it is given up, logged and counted.
//! - **Durable cursor**: each page read is a mark; the cursor moves to a page's end only once
//!   every selected event of that page and of every page before is finished, and is saved
//!   with the lease renewal (at least every second while it moves). A crash re-delivers from
//!   the saved cursor: duplicates, never a gap.
//! - **Backpressure**: at most `max_pending` events are held; beyond, the feed is not read
//!   until deliveries finish.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::progress::{Claim, Progress};
use super::{Receiver, WebhookSettings};
use crate::metrics::Metrics;
use crate::store::FeedPosition;
use crate::transfer::feed::CursorRefused;
use crate::transfer::feed::EventsPage;
use crate::transfer::service::ServiceError;
use crate::transfer::view::Event;
use crate::transfer::Engine;

/// Transfer documents read per page of the feed.
const PAGE: usize = 100;
/// How long one read of the feed waits for news.
const LONG_POLL: Duration = Duration::from_secs(5);
/// Finished event ids remembered to skip their repeats.
pub const REMEMBERED: usize = 100_000;
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

/// One selected event, queued or being delivered.
#[derive(Debug, Clone)]
struct Item {
    id: String,
    at: i64,
    body: Bytes,
    /// The page it was first read in.
    page: u64,
}

/// A page read: the position at its end and how many of its events are not finished.
#[derive(Debug)]
struct Mark {
    seq: u64,
    next: Option<FeedPosition>,
    outstanding: usize,
}

/// What one attempt needs, shared by the delivery tasks.
struct Sender {
    engine: Arc<Engine>,
    settings: Arc<WebhookSettings>,
    receiver: Receiver,
    client: reqwest::Client,
    metrics: Arc<Metrics>,
    slots: Semaphore,
    /// [`Progress::deliver_until`] as of the last claim or save: no attempt is sent after it
    /// (a holder that lost its lease unawares stops delivering before another takes over).
    fence: std::sync::atomic::AtomicI64,
}

pub struct Dispatcher {
    sender: Arc<Sender>,
}

type Read = Pin<Box<dyn Future<Output = Result<EventsPage, ServiceError>> + Send>>;

/// The dispatcher's memory while it holds the lease.
#[derive(Default)]
struct State {
    /// Per transfer, its events in order; the head is being delivered.
    queues: HashMap<String, VecDeque<Item>>,
    marks: VecDeque<Mark>,
    next_seq: u64,
    /// Ids queued or finished (the latter bounded by [`REMEMBERED`]).
    seen: HashSet<String>,
    finished: VecDeque<String>,
    pending: usize,
    /// Every selected event before it is finished.
    cursor: Option<FeedPosition>,
    /// Where the next read of the feed starts.
    read_after: Option<FeedPosition>,
    /// The cursor moved since it was last saved.
    dirty: bool,
    /// The transfer each running delivery task works for.
    running: HashMap<Id, String>,
}

impl State {
    fn start(cursor: Option<FeedPosition>) -> Self {
        Self {
            read_after: cursor.clone(),
            cursor,
            ..Self::default()
        }
    }

    /// Moves the cursor past every finished page at the front.
    fn advance(&mut self) {
        while self.marks.front().is_some_and(|mark| mark.outstanding == 0) {
            let mark = self.marks.pop_front().expect("front exists");
            if mark.next.is_some() && mark.next != self.cursor {
                self.cursor = mark.next;
                self.dirty = true;
            }
        }
    }

    fn remember_finished(&mut self, id: String) {
        self.finished.push_back(id);
        while self.finished.len() > REMEMBERED {
            if let Some(old) = self.finished.pop_front() {
                self.seen.remove(&old);
            }
        }
    }

    /// The `at` of the oldest event not finished (each transfer's head is its oldest).
    fn oldest(&self) -> Option<i64> {
        self.queues
            .values()
            .filter_map(|queue| queue.front().map(|item| item.at))
            .min()
    }
}

impl Dispatcher {
    pub fn new(
        engine: Arc<Engine>,
        settings: Arc<WebhookSettings>,
        receiver: Receiver,
        client: reqwest::Client,
        metrics: Arc<Metrics>,
    ) -> Self {
        let slots = Semaphore::new(settings.max_concurrent.max(1));
        Self {
            sender: Arc::new(Sender {
                engine,
                settings,
                receiver,
                client,
                metrics,
                slots,
                fence: std::sync::atomic::AtomicI64::new(0),
            }),
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
            let end = match self.sender.engine.store_identity().await {
                Ok(_) => self.sender.engine.feed_end().await,
                Err(error) => Err(error),
            };
            match end {
                Ok(end) => {
                    return Some(end.map(|position| self.sender.engine.feed_cursor(&position)))
                }
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
    /// the engine shuts down.
    pub async fn run(self) {
        let sender = &self.sender;
        let engine = &sender.engine;
        let shutdown = engine.shutdown_token();
        let receiver = sender.receiver.label.as_str();
        let Some(start) = self.start_position(&shutdown).await else {
            return;
        };
        let mut progress = Progress::new(
            engine.store().clone(),
            engine.clock().clone(),
            sender.receiver.id.clone(),
            sender.settings.lease,
        )
        .starting_at(start);
        let lease_held = sender
            .metrics
            .webhook_lease_held
            .with_label_values(&[receiver]);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let wait = match progress.claim().await {
                Ok(Claim::Held { cursor }) => {
                    // The store's identity is read first either way, so that every cursor
                    // this receiver saves carries it (`Engine::feed_cursor`).
                    let checked = match cursor.as_deref() {
                        None => engine
                            .store_identity()
                            .await
                            .map(|_| None)
                            .map_err(CursorRefused::from),
                        Some(text) => engine.check_feed_cursor(text).await,
                    };
                    let start = match checked {
                        Ok(position) => position,
                        Err(CursorRefused::Store(error)) => {
                            tracing::warn!(receiver, %error, "webhooks: cannot read the store's identity or check the saved cursor; retrying");
                            tokio::select! {
                                _ = shutdown.cancelled() => return,
                                _ = tokio::time::sleep(STORE_RETRY) => {}
                            }
                            continue;
                        }
                        // Delivering after it would skip every event up to it: deliver from
                        // the beginning instead (receivers dedupe on `webhook-id`).
                        Err(refused) => {
                            tracing::error!(receiver, %refused,
                                "webhooks: the saved cursor is not a position of this store's feed; delivering from the start of the feed");
                            None
                        }
                    };
                    tracing::info!(receiver, owner = progress.owner(), cursor = ?cursor, "webhooks: delivering");
                    lease_held.set(1);
                    sender.set_fence(&progress);
                    self.deliver(&mut progress, start, &shutdown).await;
                    sender.fence.store(0, std::sync::atomic::Ordering::Release);
                    lease_held.set(0);
                    sender
                        .metrics
                        .webhook_oldest_undelivered_seconds
                        .with_label_values(&[receiver])
                        .set(0);
                    Duration::ZERO
                }
                Ok(Claim::Busy { until }) => {
                    let left = (until - engine.clock().wall_millis()).max(0) as u64;
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

    /// Delivers from `start` until the lease is lost or the engine shuts down.
    async fn deliver(
        &self,
        progress: &mut Progress,
        start: Option<FeedPosition>,
        shutdown: &CancellationToken,
    ) {
        let sender = &self.sender;
        let receiver = sender.receiver.label.as_str();
        let oldest_gauge = sender
            .metrics
            .webhook_oldest_undelivered_seconds
            .with_label_values(&[receiver]);
        let mut state = State::start(start);
        let mut tasks: JoinSet<(String, Outcome)> = JoinSet::new();
        let mut read: Option<Read> = None;
        let mut read_again_at = Instant::now();
        let renew_every = (sender.settings.lease / 3).max(Duration::from_millis(10));
        let mut renew = tokio::time::interval(renew_every);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        renew.tick().await;
        let mut gauge = tokio::time::interval(Duration::from_secs(1));
        let mut last_save = Instant::now();
        let mut last_read = Instant::now();
        // While reads of the feed fail: wall millis of the start of the first failed read
        // (right after the last one that answered). Whatever was written since is not known
        // to be delivered, so the oldest undelivered event may be that old: the gauge must
        // not read 0 while the feed cannot be read.
        let mut unread_since: Option<i64> = None;
        let mut read_started = sender.engine.clock().wall_millis();
        loop {
            if read.is_none()
                && state.pending < sender.settings.max_pending
                && Instant::now() >= read_again_at
            {
                let engine = sender.engine.clone();
                let after = state.read_after.clone();
                last_read = Instant::now();
                read_started = sender.engine.clock().wall_millis();
                read = Some(Box::pin(async move {
                    engine.events_page(after, PAGE, LONG_POLL).await
                }));
            }
            let mut save = false;
            tokio::select! {
                _ = shutdown.cancelled() => {
                    tasks.abort_all();
                    let cursor = state.cursor.as_ref().map(|p| self.sender.engine.feed_cursor(p));
                    if let Err(error) = progress.release(cursor).await {
                        tracing::warn!(receiver, %error, "webhooks: could not save the progress at shutdown");
                    }
                    return;
                }
                page = async { read.as_mut().expect("a read").await }, if read.is_some() => {
                    read = None;
                    match page {
                        Ok(page) => {
                            unread_since = None;
                            if self.accept(page, &mut state, &mut tasks) < PAGE {
                                read_again_at = last_read + CAUGHT_UP_PAUSE;
                            }
                        }
                        Err(error) => {
                            unread_since.get_or_insert(read_started);
                            tracing::warn!(receiver, %error, "webhooks: cannot read the change feed; retrying");
                            read_again_at = Instant::now() + STORE_RETRY;
                        }
                    }
                }
                _ = tokio::time::sleep_until(read_again_at), if read.is_none() && Instant::now() < read_again_at => {}
                Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    match joined {
                        Ok((id, (transfer, outcome))) => {
                            state.running.remove(&id);
                            self.finish(&transfer, outcome, &mut state, &mut tasks);
                        }
                        Err(error) => {
                            // A delivery task panicked: deliver its event again.
                            tracing::error!(receiver, %error, "webhooks: a delivery task failed; retrying its event");
                            if let Some(transfer) = state.running.remove(&error.id()) {
                                self.start_head(&transfer, &mut state, &mut tasks);
                            }
                        }
                    }
                }
                _ = renew.tick() => save = true,
                _ = gauge.tick() => {
                    let now = sender.engine.clock().wall_millis();
                    let oldest = state.oldest().into_iter().chain(unread_since).min();
                    let age = oldest.map_or(0, |at| (now - at).max(0) / 1000);
                    oldest_gauge.set(age);
                }
            }
            if save || (state.dirty && last_save.elapsed() >= SAVE_EVERY) {
                last_save = Instant::now();
                let cursor = state
                    .cursor
                    .as_ref()
                    .map(|p| self.sender.engine.feed_cursor(p));
                let saved = progress.save(cursor).await;
                sender.set_fence(progress);
                match saved {
                    Ok(true) => state.dirty = false,
                    Ok(false) => {
                        tracing::warn!(
                            receiver,
                            "webhooks: another instance took the delivery lease over; standing by"
                        );
                        tasks.abort_all();
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(receiver, %error, "webhooks: cannot save the delivery progress");
                        if !progress.holds() {
                            tracing::warn!(
                                receiver,
                                "webhooks: the delivery lease ran out unrenewed; standing by"
                            );
                            tasks.abort_all();
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Queues the selected, unseen events of a page and starts the heads of idle transfers;
    /// returns how many transfer documents the page held.
    fn accept(
        &self,
        page: EventsPage,
        state: &mut State,
        tasks: &mut JoinSet<(String, Outcome)>,
    ) -> usize {
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
        let settings = &self.sender.settings;
        // Marks are numbered without gaps (an item finds its mark by the difference).
        let seq = state.next_seq;
        if page.next.is_some() {
            state.read_after = page.next.clone();
        }
        let selected: Vec<_> = page
            .items
            .into_iter()
            .filter(|event| {
                settings.events.contains(&event.kind) && !state.seen.contains(&event.id)
            })
            .collect();
        let meta: Vec<(String, i64)> = selected
            .iter()
            .map(|event| (event.transfer.transaction_id.clone(), event.at))
            .collect();
        let mut outstanding = 0;
        for (view, (transfer, at)) in Event::from_feed(selected).into_iter().zip(meta) {
            if !state.seen.insert(view.id.clone()) {
                continue;
            }
            let body = match serde_json::to_vec(&view) {
                Ok(body) => Bytes::from(body),
                Err(error) => {
                    tracing::error!(%error, id = view.id, "webhooks: cannot encode an event; skipping it");
                    continue;
                }
            };
            let queue = state.queues.entry(transfer.clone()).or_default();
            queue.push_back(Item {
                id: view.id,
                at,
                body,
                page: seq,
            });
            outstanding += 1;
            state.pending += 1;
            if queue.len() == 1 {
                self.start_head(&transfer, state, tasks);
            }
        }
        // A page with nothing to deliver behind another such page only moves that page's end:
        // no item refers to either, so while an older event blocks the cursor, empty reads
        // do not pile up marks.
        let last_is_done = state.marks.back().is_some_and(|m| m.outstanding == 0);
        if outstanding == 0 && last_is_done && page.next.is_some() {
            state.marks.back_mut().expect("a last mark").next = page.next;
        } else if page.next.is_some() || outstanding > 0 {
            state.next_seq += 1;
            state.marks.push_back(Mark {
                seq,
                next: page.next,
                outstanding,
            });
        }
        state.advance();
        documents
    }

    /// Records the head of `transfer` as finished and starts its next event.
    fn finish(
        &self,
        transfer: &str,
        _outcome: Outcome,
        state: &mut State,
        tasks: &mut JoinSet<(String, Outcome)>,
    ) {
        let Some(queue) = state.queues.get_mut(transfer) else {
            return;
        };
        let Some(item) = queue.pop_front() else {
            return;
        };
        let more = !queue.is_empty();
        if !more {
            state.queues.remove(transfer);
        }
        state.pending -= 1;
        if let Some(front) = state.marks.front().map(|mark| mark.seq) {
            if let Some(mark) = state.marks.get_mut((item.page - front) as usize) {
                mark.outstanding -= 1;
            }
        }
        state.remember_finished(item.id);
        if more {
            self.start_head(transfer, state, tasks);
        }
        state.advance();
    }

    fn start_head(
        &self,
        transfer: &str,
        state: &mut State,
        tasks: &mut JoinSet<(String, Outcome)>,
    ) {
        let Some(item) = state.queues.get(transfer).and_then(|queue| queue.front()) else {
            return;
        };
        let sender = self.sender.clone();
        let item = item.clone();
        let transfer = transfer.to_owned();
        let handle = tasks.spawn({
            let transfer = transfer.clone();
            async move { (transfer, sender.deliver(item).await) }
        });
        state.running.insert(handle.id(), transfer);
    }
}

impl Sender {
    /// Attempts `item` until it is delivered or older than the retry period.
    async fn deliver(&self, item: Item) -> Outcome {
        let settings = &self.settings;
        let receiver = self.receiver.label.as_str();
        let clock = self.engine.clock();
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
                    self.metrics
                        .webhook_deliveries_total
                        .with_label_values(&["delivered"])
                        .inc();
                    self.metrics
                        .webhook_delivery_lag_seconds
                        .observe((now - item.at).max(0) as f64 / 1000.0);
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
        while self.engine.clock().wall_millis() >= self.fence.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One signed POST; `Err` says why it did not count as delivered.
    async fn attempt(&self, item: &Item) -> Result<(), String> {
        let timestamp = self.engine.clock().wall_millis().div_euclid(1000);
        let signature = self.settings.secret.sign(&item.id, timestamp, &item.body);
        let response = self
            .client
            .post(self.receiver.url.clone())
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

    fn mark(state: &mut State, next: u64, outstanding: usize) -> u64 {
        let seq = state.next_seq;
        state.next_seq += 1;
        state.marks.push_back(Mark {
            seq,
            next: Some(FeedPosition::Seq(next)),
            outstanding,
        });
        seq
    }

    #[test]
    fn the_cursor_moves_only_past_pages_whose_events_and_predecessors_are_finished() {
        let mut state = State::start(Some(FeedPosition::Seq(5)));
        mark(&mut state, 10, 1);
        mark(&mut state, 20, 0);
        mark(&mut state, 30, 2);
        state.advance();
        // The first page still has an event out: nothing moves, not even past the empty one.
        assert_eq!(state.cursor, Some(FeedPosition::Seq(5)));
        assert!(!state.dirty);
        // The third page's events finish first: still nothing.
        state.marks[2].outstanding = 0;
        state.advance();
        assert_eq!(state.cursor, Some(FeedPosition::Seq(5)));
        // The first page's last event finishes: past all three.
        state.marks[0].outstanding = 0;
        state.advance();
        assert_eq!(state.cursor, Some(FeedPosition::Seq(30)));
        assert!(state.dirty);
        assert!(state.marks.is_empty());
    }

    /// A dispatcher for a receiver nobody listens on (its attempts fail and retry; these
    /// tests look only at its bookkeeping), selecting the terminal events.
    fn dispatcher(dir: &std::path::Path) -> Dispatcher {
        use crate::store::elasticsearch::Secret;
        use crate::webhooks::WebhookArgs;
        let store: crate::store::DynStore =
            Arc::new(crate::store::embedded::EmbeddedStore::open(dir).unwrap());
        let config = crate::transfer::EngineConfig::with_lease(Duration::from_secs(30));
        let engine = Engine::new(store, config, Metrics::new());
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
            engine,
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
    async fn a_repeated_event_is_queued_once_and_empty_pages_behind_it_share_one_mark() {
        let dir = tempfile::tempdir().unwrap();
        let d = dispatcher(dir.path());
        let mut state = State::start(None);
        let mut tasks = JoinSet::new();
        // t1's terminal event; then t1 again (its repeat), then two pages with nothing.
        d.accept(page(Some("t1"), 10), &mut state, &mut tasks);
        d.accept(page(Some("t1"), 11), &mut state, &mut tasks);
        d.accept(page(None, 12), &mut state, &mut tasks);
        d.accept(page(None, 13), &mut state, &mut tasks);
        assert_eq!(state.pending, 1, "the repeat is not queued again");
        assert_eq!(state.queues["t1"].len(), 1);
        let marks: Vec<(Option<FeedPosition>, usize)> = (state.marks.iter())
            .map(|m| (m.next.clone(), m.outstanding))
            .collect();
        assert_eq!(
            marks,
            [
                (Some(FeedPosition::Seq(10)), 1),
                (Some(FeedPosition::Seq(13)), 0)
            ],
            "the pages with nothing to deliver behind the blocked one merged"
        );
        assert_eq!(state.cursor, None, "blocked by t1's undelivered event");
        tasks.abort_all();
        d.finish("t1", Outcome::Delivered, &mut state, &mut tasks);
        assert_eq!(state.cursor, Some(FeedPosition::Seq(13)));
        assert!(state.dirty && state.marks.is_empty() && state.pending == 0);
    }

    #[test]
    fn finished_ids_are_remembered_up_to_the_bound() {
        let mut state = State::default();
        for n in 0..REMEMBERED + 10 {
            let id = format!("t{n}/transfer.finished");
            state.seen.insert(id.clone());
            state.remember_finished(id);
        }
        assert_eq!(state.seen.len(), REMEMBERED);
        assert!(!state.seen.contains("t0/transfer.finished"));
        assert!(state
            .seen
            .contains(&format!("t{}/transfer.finished", REMEMBERED + 9)));
    }
}
