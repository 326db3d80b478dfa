//! The fast path of an instance that does not hold a receiver's lease (`docs/design.md §11`,
//! "Webhooks"): it delivers the terminal events of the transfers this instance writes
//! terminal as soon as each write is acknowledged, and records which it delivered, so that
//! the instance holding the lease, reading the feed a horizon later, does not deliver them
//! again.
//!
//! - **What is recorded**: every terminal write carries its instance and its number among
//!   that instance's terminal writes (`TransferDoc::settled_by`, `<instance>/<n>`). The fast
//!   path keeps the numbers it delivered as ranges ([`Delivered`]) in one document of the
//!   `webhooks` index per receiver and instance, saved every [`SAVE_EVERY`] while it changes.
//! - **Why nothing is lost**: the holder skips an event only when the document names its
//!   number as delivered. A write the fast path never saw (its answer was lost, the process
//!   died first, the fast path fell behind) has a number no range holds, and the holder
//!   delivers it; so does the holder for a delivery the fast path made but had not saved when
//!   the process died (a duplicate, never a gap). Nothing here depends on a clock.
//! - **Order per transfer**: it runs only for receivers that select terminal events alone
//!   (the default), of which a transfer has exactly one; a receiver that also wants earlier
//!   events gets them in order from the holder (its feed and its own fast path).
//! - **Bounded**: an event it cannot deliver within half the feed's delay is left to the
//!   holder; ranges older than [`KEEP`] are forgotten (a holder that far behind delivers
//!   those again), at most [`MAX_RANGES`] are kept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio::task::JoinSet;

use super::dispatcher::Deliverer;
use crate::store::{DynStore, Index, Source, StoreError, StoreResult, Version, WriteOutcome};
use crate::time::format_millis;
use crate::transfer::history::EventKind;
use crate::transfer::model::{TransferDoc, TransferState};

/// How often the delivered ranges are saved while they change.
pub const SAVE_EVERY: Duration = Duration::from_millis(250);
/// How long a delivered range is remembered after its last delivery.
pub const KEEP: Duration = Duration::from_secs(3600);
/// The most ranges one document holds (the oldest go first).
pub const MAX_RANGES: usize = 10_000;

/// The numbers of one instance's terminal writes whose events were delivered to one
/// receiver: disjoint ranges `[first, last]`, in order, each with the wall millis of its
/// latest delivery.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivered {
    ranges: Vec<(u64, u64, i64)>,
}

impl Delivered {
    /// Whether the write numbered `n` was delivered.
    pub fn contains(&self, n: u64) -> bool {
        let after = self.ranges.partition_point(|&(first, _, _)| first <= n);
        after > 0 && self.ranges[after - 1].1 >= n
    }

    /// Records `n` as delivered at `at_millis`, joining the ranges it touches.
    pub fn insert(&mut self, n: u64, at_millis: i64) {
        let after = self.ranges.partition_point(|&(first, _, _)| first <= n);
        let joins_before = after > 0 && self.ranges[after - 1].1.saturating_add(1) >= n;
        let joins_after = after < self.ranges.len() && n.saturating_add(1) >= self.ranges[after].0;
        match (joins_before, joins_after) {
            (true, true) => {
                let (_, last, at) = self.ranges.remove(after);
                let before = &mut self.ranges[after - 1];
                before.1 = before.1.max(last);
                before.2 = before.2.max(at).max(at_millis);
            }
            (true, false) => {
                let before = &mut self.ranges[after - 1];
                before.1 = before.1.max(n);
                before.2 = before.2.max(at_millis);
            }
            (false, true) => {
                let next = &mut self.ranges[after];
                next.0 = n;
                next.2 = next.2.max(at_millis);
            }
            (false, false) => self.ranges.insert(after, (n, n, at_millis)),
        }
    }

    /// Forgets the ranges last delivered before `millis`, and the oldest beyond `max`.
    pub fn forget(&mut self, millis: i64, max: usize) {
        self.ranges.retain(|&(_, _, at)| at >= millis);
        if self.ranges.len() > max {
            let mut by_age: Vec<i64> = self.ranges.iter().map(|&(_, _, at)| at).collect();
            by_age.sort_unstable();
            let cut = by_age[self.ranges.len() - max - 1];
            self.ranges.retain(|&(_, _, at)| at > cut);
        }
    }

    pub fn ranges(&self) -> usize {
        self.ranges.len()
    }
}

/// The stored document: `webhooks/{receiver id}.fast.{instance}`.
#[derive(Debug, Serialize, Deserialize)]
struct DeliveredDoc {
    /// The document id repeated (scans of the index sort on it).
    receiver_id: String,
    delivered: Delivered,
    modification_time: String,
}

fn doc_id(receiver_id: &str, instance: &str) -> String {
    format!("{receiver_id}.fast.{instance}")
}

/// The instance and number of a terminal write (`TransferDoc::settled_by`).
pub fn settled_by(transfer: &TransferDoc) -> Option<(&str, u64)> {
    let (instance, n) = transfer.settled_by.as_deref()?.rsplit_once('/')?;
    Some((instance, n.parse().ok()?))
}

/// What other instances' fast paths (and this one's, from before it held the lease)
/// delivered to a receiver, for the holder to skip.
#[derive(Debug, Default)]
pub struct DeliveredElsewhere {
    by_instance: HashMap<String, Delivered>,
}

impl DeliveredElsewhere {
    /// Reads the documents of the instances that wrote `transfers` terminal. One that cannot
    /// be read counts as delivering nothing: the holder delivers (a duplicate at worst).
    pub async fn read<'t>(
        store: &DynStore,
        receiver_id: &str,
        transfers: impl Iterator<Item = &'t TransferDoc>,
    ) -> Self {
        let mut by_instance = HashMap::new();
        for transfer in transfers {
            let Some((instance, _)) = settled_by(transfer) else {
                continue;
            };
            if by_instance.contains_key(instance) {
                continue;
            }
            let delivered = match store
                .get(Index::Webhooks, &doc_id(receiver_id, instance))
                .await
            {
                Ok(Some(doc)) => match doc.source.decode::<DeliveredDoc>() {
                    Ok(doc) => doc.delivered,
                    Err(error) => {
                        tracing::warn!(%error, instance, "webhooks: a fast path's record does not decode; delivering its events again");
                        Delivered::default()
                    }
                },
                Ok(None) => Delivered::default(),
                Err(error) => {
                    tracing::debug!(%error, instance, "webhooks: cannot read a fast path's record; delivering its events");
                    Delivered::default()
                }
            };
            by_instance.insert(instance.to_owned(), delivered);
        }
        Self { by_instance }
    }

    /// Whether a fast path delivered `transfer`'s terminal event.
    pub fn delivered(&self, transfer: &TransferDoc) -> bool {
        settled_by(transfer).is_some_and(|(instance, n)| {
            self.by_instance
                .get(instance)
                .is_some_and(|delivered| delivered.contains(n))
        })
    }
}

/// Whether a receiver selecting `events` can be served by the fast path of an instance that
/// does not hold its lease: terminal events only, so no event of a transfer can come before
/// the one it delivers.
pub fn serves(events: &[EventKind]) -> bool {
    events
        .iter()
        .all(|kind| matches!(kind, EventKind::State(state) if state.is_terminal()))
}

/// Whether instances without the lease run a fast path for this receiver (and so whether
/// the holder looks for their records): on a store whose feed trails by a horizon (on the
/// embedded store the feed is immediate and one process holds the store), for a selection
/// of terminal events only.
pub(super) fn runs_for(sender: &Deliverer) -> bool {
    sender.feed.delay() > Duration::ZERO && serves(&sender.settings.events)
}

/// This instance's fast path for one receiver, while `leased_here` is false.
pub(super) struct FastPath {
    sender: Arc<Deliverer>,
    leased_here: Arc<AtomicBool>,
    instance: String,
    doc_id: String,
    delivered: Delivered,
    /// The version of our last save; `None` before the first.
    saved: Option<Version>,
    changed: bool,
}

impl FastPath {
    pub(super) fn new(sender: Arc<Deliverer>, leased_here: Arc<AtomicBool>) -> Self {
        let instance = sender.feed.instance().to_owned();
        let doc_id = doc_id(&sender.receiver.id, &instance);
        Self {
            sender,
            leased_here,
            instance,
            doc_id,
            delivered: Delivered::default(),
            saved: None,
            changed: false,
        }
    }

    /// Delivers this instance's terminal writes until the engine shuts down.
    pub(super) async fn run(mut self) {
        let feed = self.sender.feed.clone();
        let shutdown = feed.shutdown_token();
        let mut written = feed.terminal_writes();
        let mut tasks: JoinSet<Option<u64>> = JoinSet::new();
        let mut save = tokio::time::interval(SAVE_EVERY);
        save.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                transfer = written.recv() => match transfer {
                    Ok(transfer) => self.start(&mut tasks, &transfer),
                    // Missed writes are left to the holder: their numbers are in no range.
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                Some(Ok(Some(n))) = tasks.join_next(), if !tasks.is_empty() => {
                    self.delivered.insert(n, feed.clock().wall_millis());
                    self.changed = true;
                }
                _ = save.tick(), if self.changed => self.save().await,
            }
        }
        // What was delivered by now is saved once more, so the holder does not repeat it.
        tasks.abort_all();
        while let Some(joined) = tasks.join_next().await {
            if let Ok(Some(n)) = joined {
                self.delivered.insert(n, feed.clock().wall_millis());
                self.changed = true;
            }
        }
        if self.changed {
            self.save().await;
        }
    }

    /// Starts delivering `transfer`'s terminal event, unless the lease is held here (the
    /// holder's own fast path delivers it), it is not this instance's numbered write, or
    /// too many deliveries are running.
    fn start(&self, tasks: &mut JoinSet<Option<u64>>, transfer: &Arc<TransferDoc>) {
        let sender = &self.sender;
        if self.leased_here.load(Ordering::Acquire) || tasks.len() >= sender.settings.max_pending {
            return;
        }
        let Some((instance, n)) = settled_by(transfer) else {
            return;
        };
        if instance != self.instance {
            return;
        }
        let Some((_, item)) = sender.items_of(transfer).into_iter().next() else {
            return;
        };
        debug_assert!(matches!(
            transfer.transaction_state,
            TransferState::Finished | TransferState::RolledBack
        ));
        let sender = sender.clone();
        let until = item.at + (sender.feed.delay() / 2).as_millis() as i64;
        tasks.spawn(async move { sender.deliver_fast(item.fast(), until).await.then_some(n) });
    }

    /// Saves the delivered ranges (best effort: on failure the next tick tries again, and
    /// meanwhile the holder delivers what it cannot see, a duplicate at worst).
    async fn save(&mut self) {
        let store = self.sender.feed.store();
        let now = self.sender.feed.clock().wall_millis();
        self.delivered
            .forget(now - KEEP.as_millis() as i64, MAX_RANGES);
        match self.write(store, now).await {
            Ok(version) => {
                self.saved = Some(version);
                self.changed = false;
            }
            Err(error) => {
                self.saved = None;
                tracing::warn!(receiver = self.sender.receiver.label.as_str(), %error,
                    "webhooks: cannot save what the fast path delivered; retrying");
            }
        }
    }

    async fn write(&self, store: &DynStore, now: i64) -> StoreResult<Version> {
        let doc = DeliveredDoc {
            receiver_id: self.doc_id.clone(),
            delivered: self.delivered.clone(),
            modification_time: format_millis(now),
        };
        let source = Source::encode(&doc)
            .map_err(|e| StoreError::Permanent(format!("fast path record: {e}")))?;
        let outcome = match self.saved {
            None => {
                store
                    .create(Index::Webhooks, &self.doc_id, source.clone())
                    .await?
            }
            Some(version) => {
                store
                    .replace_if(Index::Webhooks, &self.doc_id, source.clone(), version)
                    .await?
            }
        };
        match outcome {
            WriteOutcome::Written(version) => Ok(version),
            // Only this instance writes the document: an unknown version (a save whose
            // answer was lost) is read and overwritten.
            _ => {
                let current = store.get(Index::Webhooks, &self.doc_id).await?;
                let outcome = match current {
                    Some(current) => {
                        store
                            .replace_if(Index::Webhooks, &self.doc_id, source, current.version)
                            .await?
                    }
                    None => store.create(Index::Webhooks, &self.doc_id, source).await?,
                };
                match outcome {
                    WriteOutcome::Written(version) => Ok(version),
                    other => Err(StoreError::Unavailable(format!(
                        "fast path record: {other:?}"
                    ))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Timestamp;

    fn delivered(numbers: &[u64]) -> Delivered {
        let mut d = Delivered::default();
        for (i, &n) in numbers.iter().enumerate() {
            d.insert(n, i as i64);
        }
        d
    }

    #[test]
    fn delivered_numbers_join_into_ranges_in_any_order() {
        let d = delivered(&[5, 1, 3, 2, 9, 4]);
        assert_eq!(d.ranges, vec![(1, 5, 5), (9, 9, 4)]);
        for n in 1..=5 {
            assert!(d.contains(n), "{n}");
        }
        for n in [0, 6, 7, 8, 10] {
            assert!(!d.contains(n), "{n}");
        }
        assert!(d.contains(9));
    }

    #[test]
    fn a_number_never_delivered_stays_a_gap() {
        let d = delivered(&[1, 2, 4, 5]);
        assert!(!d.contains(3));
        assert_eq!(d.ranges(), 2);
    }

    #[test]
    fn old_ranges_are_forgotten_then_the_oldest_beyond_the_bound() {
        let mut d = delivered(&[1, 3, 5, 7]);
        d.forget(1, usize::MAX);
        assert_eq!(d.ranges, vec![(3, 3, 1), (5, 5, 2), (7, 7, 3)]);
        d.forget(0, 2);
        assert_eq!(d.ranges, vec![(5, 5, 2), (7, 7, 3)]);
    }

    #[test]
    fn a_terminal_write_names_its_instance_and_number() {
        let mut doc = TransferDoc::created("t", "a", "b", 1, Timestamp::from_millis(0));
        assert_eq!(settled_by(&doc), None);
        doc.settled_by = Some("0123456789ab/42".into());
        assert_eq!(settled_by(&doc), Some(("0123456789ab", 42)));
    }

    #[test]
    fn only_terminal_selections_are_served_by_a_non_holder() {
        let finished = EventKind::State(TransferState::Finished);
        let rolled_back = EventKind::State(TransferState::RolledBack);
        assert!(serves(&[finished, rolled_back]));
        assert!(!serves(&[
            EventKind::State(TransferState::Pending),
            finished
        ]));
        assert!(!serves(&[EventKind::Captured]));
    }
}
