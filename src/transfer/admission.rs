//! Admission control: a bound on the transfers this process has accepted and not yet driven
//! to the end (`docs/design.md §5`, `MAX_IN_FLIGHT`), and a short wait in line for room
//! before a create is refused (`ADMISSION_WAIT`).
//!
//! A create takes an [`Admitted`] before its store write, and the permit lives as long as
//! the work it stands for: it is dropped when the create fails or replays an existing
//! transfer, or when it returns having created the transfer settled (one store transaction,
//! `super::one_transaction`), and otherwise moves into the transfer's driver and is dropped
//! when that driver ends (terminal, or stopped and left to recovery). A batch takes all its
//! permits at once: it is admitted whole or not at all.
//!
//! **Waiting, then shedding.** A create that finds no room waits in line (first come, first
//! served: a batch at the head is not overtaken by the single creates behind it) until
//! permits are given back, for at most `ADMISSION_WAIT`; only then is it refused, before
//! anything is written, so shedding never drops accepted work. The line is bounded: when it
//! already holds `MAX_IN_FLIGHT` transfers, a create is refused at once (the memory a
//! waiting request holds stays bounded under any number of connections). A refusal says
//! when to retry (`Retry-After`) from the rate at which permits have been given back: the
//! time the work ahead needs to drain, at least 1 s (the header counts whole seconds).
//!
//! What recovery or a cancel drives is not counted: it was admitted once already (here or
//! by another instance), and refusing it would leave it stuck. The bound therefore limits
//! new work; `transfers_in_flight` counts every driver.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::{Semaphore, TryAcquireError};
use tokio::time::Instant;

use super::Engine;

/// The default of `MAX_IN_FLIGHT`: a bound on the work queued ahead of a create (on average
/// an accepted transfer is in flight for the bound ÷ the throughput, Little's law). At the
/// 7.5–10k transfers/s of a 2-core machine, 1,024 is 100–135 ms of work (`docs/benchmark.md`
/// has the measurements behind the choice).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// The default of `ADMISSION_WAIT`: how long a create waits in line for room before it is
/// refused. Long enough for a batch of 100 to find room behind a full bound at a few
/// thousand transfers a second, short enough that an accepted create's latency stays within
/// a few hundred milliseconds under any load.
pub const DEFAULT_ADMISSION_WAIT: Duration = Duration::from_millis(100);

/// The longest `Retry-After` a refusal asks for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// How often the drain rate is sampled (at most).
const RATE_SAMPLE: Duration = Duration::from_millis(250);

/// The bound and the line for it. One per engine.
pub struct Admission {
    limit: usize,
    max_wait: Duration,
    /// Places not taken. Tokio's semaphore is fair: permits go to waiters in the order they
    /// asked, a batch's all at once.
    room: Semaphore,
    /// Permits taken (the complement of `room`, kept for reading without racing it).
    in_flight: AtomicUsize,
    /// Transfers waiting in line for room.
    waiting: AtomicUsize,
    /// Permits given back since the start: the drain rate is measured on it.
    given_back: AtomicU64,
    drain: Mutex<DrainRate>,
    /// `transfers_admitted_in_flight`: the value of `in_flight`, for scrapes.
    gauge: IntGauge,
    /// `transfers_waiting_admission`: the value of `waiting`, for scrapes.
    waiting_gauge: IntGauge,
}

/// A create refused because the bound is reached and no room came within the wait: nothing
/// was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{limit} transfers are in flight, the most this instance accepts, and no room came within the wait; retry in {}s", retry_after.as_secs())]
pub struct Overloaded {
    pub limit: usize,
    /// When a retry may find room: the work ahead drained at the observed rate, 1–30 s.
    pub retry_after: Duration,
}

/// Permits for `count` transfers; dropping it gives them back.
#[must_use = "the permits are given back when this is dropped"]
pub struct Admitted {
    admission: Arc<Admission>,
    count: usize,
}

/// Permits given back a second, as last sampled.
#[derive(Debug)]
struct DrainRate {
    sampled_at: Instant,
    given_back_then: u64,
    per_second: f64,
}

/// A place in line: leaving it (admitted, refused or cancelled) takes the count off.
struct InLine<'a> {
    admission: &'a Admission,
    count: usize,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.admission
            .waiting
            .fetch_sub(self.count, Ordering::AcqRel);
        self.admission.waiting_gauge.sub(self.count as i64);
    }
}

impl Admission {
    pub fn new(
        limit: usize,
        max_wait: Duration,
        (gauge, waiting_gauge): (IntGauge, IntGauge),
    ) -> Arc<Self> {
        assert!(limit >= 1, "MAX_IN_FLIGHT is at least 1");
        let limit = limit.min(Semaphore::MAX_PERMITS);
        Arc::new(Self {
            limit,
            max_wait,
            room: Semaphore::new(limit),
            in_flight: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            given_back: AtomicU64::new(0),
            drain: Mutex::new(DrainRate {
                sampled_at: Instant::now(),
                given_back_then: 0,
                per_second: 0.0,
            }),
            gauge,
            waiting_gauge,
        })
    }

    /// Permits for `count` transfers, all or none: at once when there is room and nobody
    /// waits, else after waiting in line for at most the admission wait.
    pub async fn admit(self: &Arc<Self>, count: usize) -> Result<Admitted, Overloaded> {
        let Ok(permits) = u32::try_from(count) else {
            return Err(self.overloaded());
        };
        if count > self.limit {
            return Err(self.overloaded());
        }
        if self.waiting.load(Ordering::Acquire) == 0 {
            match self.room.try_acquire_many(permits) {
                Ok(taken) => return Ok(self.taken(taken, count)),
                Err(TryAcquireError::NoPermits) => {}
                Err(TryAcquireError::Closed) => unreachable!("the room is never closed"),
            }
        }
        let ahead = self.waiting.fetch_add(count, Ordering::AcqRel);
        self.waiting_gauge.add(count as i64);
        let _in_line = InLine {
            admission: self,
            count,
        };
        if ahead + count > self.limit {
            return Err(self.overloaded());
        }
        match tokio::time::timeout(self.max_wait, self.room.acquire_many(permits)).await {
            Ok(Ok(taken)) => Ok(self.taken(taken, count)),
            Ok(Err(_closed)) => unreachable!("the room is never closed"),
            Err(_waited_long_enough) => Err(self.overloaded()),
        }
    }

    /// Turns semaphore permits into an [`Admitted`] that gives them back on drop.
    fn taken(self: &Arc<Self>, taken: tokio::sync::SemaphorePermit<'_>, count: usize) -> Admitted {
        taken.forget();
        self.in_flight.fetch_add(count, Ordering::AcqRel);
        self.gauge.add(count as i64);
        Admitted {
            admission: self.clone(),
            count,
        }
    }

    /// The refusal, with the time the work ahead (in flight and in line) needs to drain at
    /// the observed rate; 1 s while no rate is known.
    fn overloaded(&self) -> Overloaded {
        let ahead = self.in_flight() + self.waiting.load(Ordering::Acquire);
        let per_second = self.drain_rate();
        let drain = if per_second > 0.0 {
            Duration::from_secs_f64((ahead as f64 / per_second).min(MAX_RETRY_AFTER.as_secs_f64()))
        } else {
            Duration::ZERO
        };
        Overloaded {
            limit: self.limit,
            retry_after: Duration::from_secs(drain.as_secs_f64().ceil() as u64)
                .clamp(Duration::from_secs(1), MAX_RETRY_AFTER),
        }
    }

    /// Permits given back a second: sampled at most every [`RATE_SAMPLE`], smoothed over
    /// the samples (half the weight to the newest).
    fn drain_rate(&self) -> f64 {
        let mut drain = self.drain.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = drain.sampled_at.elapsed();
        if elapsed >= RATE_SAMPLE {
            let now_total = self.given_back.load(Ordering::Acquire);
            let newest = (now_total - drain.given_back_then) as f64 / elapsed.as_secs_f64();
            drain.per_second = if drain.per_second > 0.0 {
                (drain.per_second + newest) / 2.0
            } else {
                newest
            };
            drain.sampled_at = Instant::now();
            drain.given_back_then = now_total;
        }
        drain.per_second
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    fn release(&self, count: usize) {
        let before = self.in_flight.fetch_sub(count, Ordering::AcqRel);
        assert!(before >= count, "more permits given back than taken");
        self.gauge.sub(count as i64);
        self.given_back.fetch_add(count as u64, Ordering::AcqRel);
        self.room.add_permits(count);
    }
}

impl Admitted {
    pub fn count(&self) -> usize {
        self.count
    }

    /// One of the permits, as its own; `None` when none is left.
    pub fn take_one(&mut self) -> Option<Admitted> {
        if self.count == 0 {
            return None;
        }
        self.count -= 1;
        Some(Admitted {
            admission: self.admission.clone(),
            count: 1,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if self.count > 0 {
            self.admission.release(self.count);
        }
    }
}

impl Engine {
    /// Permits to create `count` transfers, all or none, waiting in line for room for at
    /// most the admission wait (see the module doc).
    pub async fn admit(&self, count: usize) -> Result<Admitted, Overloaded> {
        self.admission.admit(count).await
    }

    /// The bound (`MAX_IN_FLIGHT`).
    pub fn max_in_flight(&self) -> usize {
        self.admission.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(100);

    fn admission(limit: usize) -> Arc<Admission> {
        let gauges = (
            IntGauge::new("g", "g").unwrap(),
            IntGauge::new("w", "w").unwrap(),
        );
        Admission::new(limit, WAIT, gauges)
    }

    /// `a.admit(count)` on a task of its own, answering the count admitted.
    fn admit_in_background(
        a: &Arc<Admission>,
        count: usize,
    ) -> tokio::task::JoinHandle<Result<usize, Overloaded>> {
        let a = a.clone();
        tokio::spawn(async move { a.admit(count).await.map(|p| p.count()) })
    }

    /// Whether `admit` is still waiting after the runtime has run everything it can.
    async fn still_waiting<T>(admit: &tokio::task::JoinHandle<T>) -> bool {
        tokio::task::yield_now().await;
        !admit.is_finished()
    }

    #[tokio::test(start_paused = true)]
    async fn permits_up_to_the_limit_then_refusals_after_the_wait() {
        let a = admission(2);
        let one = a.admit(1).await.unwrap();
        let two = a.admit(1).await.unwrap();
        let started = Instant::now();
        let refused = a.admit(1).await.err().expect("no room came");
        assert_eq!(started.elapsed(), WAIT, "refused only after the whole wait");
        assert_eq!(refused.limit, 2);
        assert_eq!((a.in_flight(), a.gauge.get()), (2, 2));
        drop(one);
        assert_eq!((a.in_flight(), a.gauge.get()), (1, 1));
        let three = a.admit(1).await.unwrap();
        drop((two, three));
        assert_eq!((a.in_flight(), a.gauge.get()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_create_that_finds_no_room_is_admitted_when_room_comes_within_the_wait() {
        let a = admission(1);
        let first = a.admit(1).await.unwrap();
        let waiting = admit_in_background(&a, 1);
        assert!(still_waiting(&waiting).await);
        tokio::time::sleep(WAIT / 2).await;
        drop(first);
        assert_eq!(waiting.await.unwrap(), Ok(1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_line_is_first_come_first_served_a_batch_included() {
        let a = admission(3);
        let held = a.admit(3).await.unwrap();
        let batch = admit_in_background(&a, 2);
        assert!(still_waiting(&batch).await);
        let single = admit_in_background(&a, 1);
        assert!(still_waiting(&single).await);
        // One place frees: the batch at the head needs two, and the single behind it does
        // not overtake it.
        let mut held = held;
        drop(held.take_one());
        assert!(still_waiting(&batch).await && still_waiting(&single).await);
        drop(held.take_one());
        assert_eq!(batch.await.unwrap(), Ok(2));
        drop(held);
        assert_eq!(single.await.unwrap(), Ok(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_line_refuses_at_once() {
        let a = admission(2);
        let _held = a.admit(2).await.unwrap();
        let in_line = admit_in_background(&a, 2);
        assert!(still_waiting(&in_line).await);
        assert_eq!(a.waiting_gauge.get(), 2, "the two in line, for scrapes");
        let started = Instant::now();
        assert!(a.admit(1).await.is_err());
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "no wait behind a full line"
        );
        assert!(
            in_line.await.unwrap().is_err(),
            "no room came for it either"
        );
        assert_eq!(
            a.waiting.load(Ordering::Acquire),
            0,
            "every place in line left"
        );
        assert_eq!(a.waiting_gauge.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_the_work_ahead_at_the_rate_it_drains() {
        let a = admission(100);
        // 100 permits given back over 4 s: 25 a second.
        for _ in 0..4 {
            drop(a.admit(25).await.unwrap());
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let _full = a.admit(100).await.unwrap();
        let refused = a.admit(1).await.err().expect("no room");
        // 100 in flight (and the refused one in line) drain at 25 a second: 4 s, rounded up.
        assert_eq!(refused.retry_after, Duration::from_secs(5));
        // Nothing known of the rate: 1 s.
        let b = admission(1);
        let _one = b.admit(1).await.unwrap();
        assert_eq!(
            b.admit(1).await.err().unwrap().retry_after,
            Duration::from_secs(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn permits_split_off_one_by_one_and_each_is_given_back_once() {
        let a = admission(3);
        let mut batch = a.admit(3).await.unwrap();
        let first = batch.take_one().unwrap();
        let second = batch.take_one().unwrap();
        assert_eq!((batch.count(), a.in_flight()), (1, 3));
        drop(first);
        assert_eq!(a.in_flight(), 2);
        drop(batch);
        assert_eq!(a.in_flight(), 1, "the one left in the batch");
        drop(second);
        assert_eq!((a.in_flight(), a.gauge.get()), (0, 0));
        assert_eq!(
            a.room.available_permits(),
            3,
            "every permit is back in the room"
        );
        let mut empty = a.admit(0).await.unwrap();
        assert!(empty.take_one().is_none());
        assert!(a.admit(4).await.is_err(), "more than the bound never fits");
    }
}
