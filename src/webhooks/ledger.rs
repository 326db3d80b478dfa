//! What a dispatcher remembers while it holds a receiver's lease: per transfer, its events
//! queued in order (the head is being delivered); the pages read and how many of their
//! events are not finished; the ids seen; the cursor to save. Pure bookkeeping: no I/O, no
//! tasks, no clock. The dispatcher records what it read and what finished, and starts the
//! deliveries the ledger names.
//!
//! - **Dedupe**: an id queued or finished (the last [`REMEMBERED`] finished ones) is not
//!   queued again.
//! - **The cursor** moves to a page's end only once every event of that page and of every
//!   page before it is finished: a crash re-delivers from the saved cursor, never skipping.
//! - **The fast path** (`docs/design.md §11`, "Webhooks"): events this process wrote are
//!   queued as soon as the write is acknowledged ([`Ledger::record_written`]), before the
//!   feed serves them. They belong to no page until the feed serves them: then one still
//!   undelivered holds that page back like the page's own events (a cursor saved past it
//!   would lose it to a crash), and one delivered is skipped as seen.
//! - **Marks stay few**: a page with nothing to deliver, behind another such page, only
//!   moves that page's end, so while an old event blocks the cursor, empty reads do not pile
//!   up marks.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;

use crate::store::FeedPosition;

/// Finished event ids remembered to skip their repeats.
pub const REMEMBERED: usize = 100_000;

/// One selected event of a transfer, queued or being delivered.
#[derive(Debug, Clone)]
pub struct Item {
    /// The event's id (`webhook-id`).
    pub id: String,
    /// When it happened, in wall milliseconds (its retry period runs from it).
    pub at: i64,
    /// The signed body.
    pub body: Bytes,
    /// The mark of the page that holds it back: the one it was first read in; for an event
    /// the fast path queued, the page the feed served it in, `None` until then.
    page: Option<u64>,
    /// Queued by the fast path (else by the feed).
    fast: bool,
    /// The transfer's recorded trace context (`crate::trace_context`): each delivery attempt
    /// is a span of the transfer's trace, and its request carries `traceparent`.
    traceparent: Option<Arc<str>>,
}

impl Item {
    pub fn new(id: String, at: i64, body: Bytes) -> Self {
        Self {
            id,
            at,
            body,
            page: None,
            fast: false,
            traceparent: None,
        }
    }

    /// The same, in the trace `traceparent` names (the transfer's).
    pub fn in_trace(self, traceparent: Option<&str>) -> Self {
        Self {
            traceparent: traceparent.map(Arc::from),
            ..self
        }
    }

    /// The trace its deliveries join, if the transfer recorded one.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// The same, marked as the fast path's.
    pub fn fast(self) -> Self {
        Self { fast: true, ..self }
    }

    /// Whether the fast path queued it (else the feed).
    pub fn is_fast(&self) -> bool {
        self.fast
    }
}

/// A page read: the position at its end and how many of its events are not finished.
#[derive(Debug)]
struct Mark {
    seq: u64,
    next: Option<FeedPosition>,
    outstanding: usize,
}

#[derive(Debug, Default)]
pub struct Ledger {
    /// Per transfer, its events in order; the head is being delivered.
    queues: HashMap<String, VecDeque<Item>>,
    /// The pages whose events are not all finished (or that end past them), oldest first,
    /// numbered without gaps (an item finds its mark by the difference).
    marks: VecDeque<Mark>,
    next_seq: u64,
    /// Ids queued or finished (the latter bounded by [`REMEMBERED`]).
    seen: HashSet<String>,
    finished: VecDeque<String>,
    /// Events queued and not finished.
    pending: usize,
    /// Every selected event before it is finished.
    cursor: Option<FeedPosition>,
    /// Where the next read of the feed starts.
    read_after: Option<FeedPosition>,
    /// The cursor moved since it was last saved.
    dirty: bool,
}

impl Ledger {
    /// A ledger starting at the saved `cursor`.
    pub fn start(cursor: Option<FeedPosition>) -> Self {
        Self {
            read_after: cursor.clone(),
            cursor,
            ..Self::default()
        }
    }

    /// Whether `id` is neither queued nor remembered as finished.
    pub fn is_new(&self, id: &str) -> bool {
        !self.seen.contains(id)
    }

    /// Records a page read: its selected events as `(transfer, item)` in feed order (those
    /// already seen are skipped) and where it ends. Returns the transfers whose head is now
    /// to be started (they had nothing queued).
    pub fn record_page(
        &mut self,
        events: impl IntoIterator<Item = (String, Item)>,
        next: Option<FeedPosition>,
    ) -> Vec<String> {
        let seq = self.next_seq;
        if next.is_some() {
            self.read_after = next.clone();
        }
        let mut to_start = Vec::new();
        let mut outstanding = 0;
        for (transfer, mut item) in events {
            if !self.seen.insert(item.id.clone()) {
                // Queued by the fast path and not delivered yet: it now holds this page back,
                // as if the page had queued it (else a cursor saved past this page, then a
                // crash or a hand-over, would lose it). A repeat, or a delivered one: nothing.
                if let Some(fast) = self.undelivered_fast(&transfer, &item.id) {
                    fast.page = Some(seq);
                    outstanding += 1;
                }
                continue;
            }
            item.page = Some(seq);
            let queue = self.queues.entry(transfer.clone()).or_default();
            queue.push_back(item);
            outstanding += 1;
            self.pending += 1;
            if queue.len() == 1 {
                to_start.push(transfer);
            }
        }
        let last_is_done = self.marks.back().is_some_and(|m| m.outstanding == 0);
        if outstanding == 0 && last_is_done && next.is_some() {
            self.marks.back_mut().expect("a last mark").next = next;
        } else if next.is_some() || outstanding > 0 {
            self.next_seq += 1;
            self.marks.push_back(Mark {
                seq,
                next,
                outstanding,
            });
        }
        self.advance();
        to_start
    }

    /// Whether the fast path queued event `id` of `transfer` and it is neither delivered nor
    /// served by the feed yet: a page that serves it must still record it.
    pub fn is_undelivered_fast(&self, transfer: &str, id: &str) -> bool {
        self.queues.get(transfer).is_some_and(|queue| {
            queue
                .iter()
                .any(|item| item.id == id && item.page.is_none())
        })
    }

    /// The fast path's event `id` of `transfer`, if it is queued and the feed has not served
    /// it yet.
    fn undelivered_fast(&mut self, transfer: &str, id: &str) -> Option<&mut Item> {
        let queue = self.queues.get_mut(transfer)?;
        queue
            .iter_mut()
            .find(|item| item.id == id && item.page.is_none())
    }

    /// Records events this process wrote, before the feed serves them: `(transfer, item)` in
    /// order, those already seen skipped. They belong to no page: the cursor does not wait
    /// for them (the feed will serve them again, and they are then seen). Returns the
    /// transfers whose head is now to be started.
    pub fn record_written(
        &mut self,
        events: impl IntoIterator<Item = (String, Item)>,
    ) -> Vec<String> {
        let mut to_start = Vec::new();
        for (transfer, mut item) in events {
            if !self.seen.insert(item.id.clone()) {
                continue;
            }
            item.fast = true;
            let queue = self.queues.entry(transfer.clone()).or_default();
            queue.push_back(item);
            self.pending += 1;
            if queue.len() == 1 {
                to_start.push(transfer);
            }
        }
        to_start
    }

    /// The event of `transfer` being delivered, if any.
    pub fn head(&self, transfer: &str) -> Option<&Item> {
        self.queues.get(transfer).and_then(VecDeque::front)
    }

    /// Records the head of `transfer` as finished (delivered or given up). Returns whether
    /// the transfer has a next event, now its head, to start.
    pub fn finish_head(&mut self, transfer: &str) -> bool {
        let Some(queue) = self.queues.get_mut(transfer) else {
            return false;
        };
        let Some(item) = queue.pop_front() else {
            return false;
        };
        let more = !queue.is_empty();
        if !more {
            self.queues.remove(transfer);
        }
        self.pending -= 1;
        if let (Some(page), Some(front)) = (item.page, self.marks.front().map(|m| m.seq)) {
            if let Some(mark) = self.marks.get_mut((page - front) as usize) {
                mark.outstanding -= 1;
            }
        }
        self.remember_finished(item.id);
        self.advance();
        more
    }

    /// Events queued and not finished.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Where the next read of the feed starts.
    pub fn read_after(&self) -> Option<FeedPosition> {
        self.read_after.clone()
    }

    /// The cursor: every selected event before it is finished.
    pub fn cursor(&self) -> Option<&FeedPosition> {
        self.cursor.as_ref()
    }

    /// Whether the cursor moved since it was last saved.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Notes that the cursor as it is now was saved.
    pub fn saved(&mut self) {
        self.dirty = false;
    }

    /// The `at` of the oldest event not finished (each transfer's head is its oldest).
    pub fn oldest(&self) -> Option<i64> {
        self.queues
            .values()
            .filter_map(|queue| queue.front().map(|item| item.at))
            .min()
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(transfer: &str, n: u32) -> (String, Item) {
        let id = format!("{transfer}/e{n}");
        (
            transfer.to_owned(),
            Item::new(id, i64::from(n), Bytes::new()),
        )
    }

    fn at(seq: u64) -> Option<FeedPosition> {
        Some(FeedPosition::Seq(seq))
    }

    #[test]
    fn the_cursor_moves_only_past_pages_whose_events_and_predecessors_are_finished() {
        let mut ledger = Ledger::start(at(5));
        assert_eq!(ledger.record_page([event("t1", 1)], at(10)), ["t1"]);
        assert!(ledger.record_page([], at(20)).is_empty());
        assert_eq!(
            ledger.record_page([event("t2", 2), event("t3", 3)], at(30)),
            ["t2", "t3"]
        );
        // The first page still has an event out: nothing moves, not even past the empty one.
        assert_eq!(ledger.cursor(), at(5).as_ref());
        assert!(!ledger.is_dirty());
        // The third page's events finish first: still nothing.
        assert!(!ledger.finish_head("t2"));
        assert!(!ledger.finish_head("t3"));
        assert_eq!(ledger.cursor(), at(5).as_ref());
        // The first page's last event finishes: past all three.
        assert!(!ledger.finish_head("t1"));
        assert_eq!(ledger.cursor(), at(30).as_ref());
        assert!(ledger.is_dirty());
        assert_eq!(ledger.pending(), 0);
        ledger.saved();
        assert!(!ledger.is_dirty());
    }

    #[test]
    fn a_transfer_is_delivered_in_order_one_head_at_a_time() {
        let mut ledger = Ledger::start(None);
        assert_eq!(
            ledger.record_page([event("t", 1), event("t", 2)], at(1)),
            ["t"]
        );
        assert_eq!(
            ledger.record_page([event("t", 3)], at(2)),
            Vec::<String>::new()
        );
        assert_eq!(ledger.head("t").map(|i| i.at), Some(1));
        assert_eq!(ledger.oldest(), Some(1));
        assert!(ledger.finish_head("t"));
        assert_eq!(ledger.head("t").map(|i| i.at), Some(2));
        assert!(ledger.finish_head("t"));
        assert_eq!(ledger.cursor(), at(1).as_ref(), "page 2 is still out");
        assert!(!ledger.finish_head("t"));
        assert_eq!(ledger.cursor(), at(2).as_ref());
        assert_eq!((ledger.head("t").is_none(), ledger.oldest()), (true, None));
    }

    #[test]
    fn a_repeated_event_is_queued_once_and_empty_pages_behind_it_share_one_mark() {
        let mut ledger = Ledger::start(None);
        ledger.record_page([event("t1", 1)], at(10));
        ledger.record_page([event("t1", 1)], at(11));
        ledger.record_page([], at(12));
        ledger.record_page([], at(13));
        assert_eq!(ledger.pending(), 1, "the repeat is not queued again");
        let marks: Vec<(Option<FeedPosition>, usize)> = (ledger.marks.iter())
            .map(|m| (m.next.clone(), m.outstanding))
            .collect();
        assert_eq!(
            marks,
            [(at(10), 1), (at(13), 0)],
            "the pages with nothing to deliver behind the blocked one merged"
        );
        assert_eq!(ledger.cursor(), None, "blocked by t1's undelivered event");
        ledger.finish_head("t1");
        assert_eq!(ledger.cursor(), at(13).as_ref());
        assert!(ledger.is_dirty() && ledger.marks.is_empty() && ledger.pending() == 0);
        assert!(!ledger.is_new("t1/e1"), "a finished id is remembered");
        assert_eq!(ledger.read_after(), at(13));
    }

    #[test]
    fn events_written_here_are_delivered_at_once_and_not_queued_again() {
        let mut ledger = Ledger::start(at(5));
        assert_eq!(
            ledger.record_written([event("t1", 1), event("t1", 2)]),
            ["t1"]
        );
        assert!(ledger.head("t1").is_some_and(Item::is_fast));
        // The feed serves a page with another transfer, and later t1's events again.
        assert_eq!(ledger.record_page([event("t2", 3)], at(10)), ["t2"]);
        assert!(ledger
            .record_page([event("t1", 1), event("t1", 2)], at(20))
            .is_empty());
        assert_eq!(ledger.pending(), 3, "t1's events once, t2's");
        // t2 finishes: the cursor moves past its page, not past the page that served t1's
        // fast events again while they are still out.
        assert!(!ledger.finish_head("t2"));
        assert_eq!(ledger.cursor(), at(10).as_ref());
        // t1's second event follows its first, in order; both delivered, the cursor moves.
        assert!(ledger.finish_head("t1"));
        assert_eq!(
            ledger.head("t1").map(|i| (i.at, i.is_fast())),
            Some((2, true))
        );
        assert!(!ledger.finish_head("t1"));
        assert_eq!((ledger.pending(), ledger.cursor()), (0, at(20).as_ref()));
    }

    #[test]
    fn a_fast_event_still_undelivered_when_the_feed_serves_it_holds_that_page_back() {
        let mut ledger = Ledger::start(at(5));
        ledger.record_written([event("t", 1)]);
        // The feed serves it (and another transfer's event) before its delivery ends.
        ledger.record_page([event("u", 2), event("t", 1)], at(10));
        assert_eq!(ledger.pending(), 2, "not queued twice");
        assert!(!ledger.finish_head("u"));
        assert_eq!(
            ledger.cursor(),
            at(5).as_ref(),
            "t's fast event is still out"
        );
        assert!(!ledger.finish_head("t"));
        assert_eq!(ledger.cursor(), at(10).as_ref());
    }

    #[test]
    fn a_fast_event_joins_the_queue_behind_the_feed_events_of_its_transfer() {
        let mut ledger = Ledger::start(None);
        ledger.record_page([event("h", 1)], at(1));
        assert!(ledger
            .record_written([event("h", 1), event("h", 2)])
            .is_empty());
        assert_eq!(ledger.head("h").map(|i| i.at), Some(1));
        assert!(ledger.finish_head("h"), "the fast event is next");
        assert_eq!(
            ledger.head("h").map(|i| (i.at, i.is_fast())),
            Some((2, true))
        );
    }

    #[test]
    fn finished_ids_are_remembered_up_to_the_bound() {
        let mut ledger = Ledger::default();
        for n in 0..REMEMBERED + 10 {
            let id = format!("t{n}/transfer.finished");
            ledger.seen.insert(id.clone());
            ledger.remember_finished(id);
        }
        assert_eq!(ledger.seen.len(), REMEMBERED);
        assert!(ledger.is_new("t0/transfer.finished"));
        assert!(!ledger.is_new(&format!("t{}/transfer.finished", REMEMBERED + 9)));
    }
}
