//! Admission control: a bound on the transfers this process has accepted and not yet driven
//! to the end (`docs/design.md §5`, `MAX_IN_FLIGHT`).
//!
//! A create takes an [`Admitted`] before its store write, and the permit lives as long as
//! the work it stands for: it is dropped when the create fails or replays an existing
//! transfer, or when it returns having created the transfer settled (one store transaction,
//! `super::one_transaction`), and otherwise moves into the transfer's driver and is dropped when that
//! driver ends (terminal, or stopped and left to recovery). Beyond the bound a create is refused
//! before anything is written, so shedding never drops accepted work. A batch takes all its
//! permits at once: it is admitted whole or not at all.
//!
//! What recovery or a cancel drives is not counted: it was admitted once already (here or
//! by another instance), and refusing it would leave it stuck. The bound therefore limits
//! new work; `transfers_in_flight` counts every driver.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus::IntGauge;

use super::Engine;

/// The default of `MAX_IN_FLIGHT`: a bound on the work queued ahead of a create (on average
/// an accepted transfer is in flight for the bound ÷ the throughput, Little's law). At the
/// 7.5–10k transfers/s of a 2-core machine under 2,000 connections, 1,024 is 100–135 ms of
/// work. Measured there (the benchmark, clients honouring `Retry-After`, 3 runs): accepted
/// POSTs within 189–245 ms at p99 as the clients saw them (317–375 ms at 4,096, where
/// nothing was shed) and peak RSS 160–163 MiB, at about the same rate in those runs (11–19%
/// fewer transfers/s in earlier single runs: the 503s cost CPU, and smaller groups cost more
/// a transfer). Clients posting batches of 100 from 64 connections (6,400 transfers wanting
/// in) get 28% less throughput than at 4,096 and a third of the latency. A batch needs places
/// for all its items at once, so under load near the bound large batches are refused first
/// (one of 1,000 gets in only while at most 24 are in flight): keep batches to a fraction of
/// the bound, or raise it. Raise it too where throughput matters more than the wait, or on a
/// faster machine (the same bound is then a shorter wait).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// The counter behind the bound. One per engine.
pub struct Admission {
    limit: usize,
    in_flight: AtomicUsize,
    /// `transfers_admitted_in_flight`: the value of `in_flight`, for scrapes.
    gauge: IntGauge,
}

/// A create refused because the bound is reached: nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{limit} transfers are in flight, the most this instance accepts; retry shortly")]
pub struct Overloaded {
    pub limit: usize,
}

/// Permits for `count` transfers; dropping it gives them back.
#[must_use = "the permits are given back when this is dropped"]
pub struct Admitted {
    admission: Arc<Admission>,
    count: usize,
}

impl Admission {
    pub fn new(limit: usize, gauge: IntGauge) -> Arc<Self> {
        assert!(limit >= 1, "MAX_IN_FLIGHT is at least 1");
        Arc::new(Self {
            limit,
            in_flight: AtomicUsize::new(0),
            gauge,
        })
    }

    /// Permits for `count` transfers, all or none.
    pub fn admit(self: &Arc<Self>, count: usize) -> Result<Admitted, Overloaded> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(count).filter(|after| *after <= self.limit)
            })
            .map_err(|_| Overloaded { limit: self.limit })?;
        self.gauge.add(count as i64);
        Ok(Admitted {
            admission: self.clone(),
            count,
        })
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
    /// Permits to create `count` transfers, all or none (see the module doc).
    pub fn admit(&self, count: usize) -> Result<Admitted, Overloaded> {
        self.admission.admit(count)
    }

    /// The bound (`MAX_IN_FLIGHT`).
    pub fn max_in_flight(&self) -> usize {
        self.admission.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(limit: usize) -> Arc<Admission> {
        Admission::new(limit, IntGauge::new("g", "g").unwrap())
    }

    #[test]
    fn permits_up_to_the_limit_then_refusals_until_one_is_given_back() {
        let a = admission(2);
        let one = a.admit(1).unwrap();
        let two = a.admit(1).unwrap();
        assert_eq!(a.admit(1).err(), Some(Overloaded { limit: 2 }));
        assert_eq!((a.in_flight(), a.gauge.get()), (2, 2));
        drop(one);
        assert_eq!((a.in_flight(), a.gauge.get()), (1, 1));
        let three = a.admit(1).unwrap();
        drop((two, three));
        assert_eq!((a.in_flight(), a.gauge.get()), (0, 0));
    }

    #[test]
    fn a_batch_is_admitted_whole_or_not_at_all() {
        let a = admission(5);
        let held = a.admit(3).unwrap();
        assert!(a.admit(3).is_err(), "3 more than the 2 left");
        assert_eq!(a.in_flight(), 3, "a refused batch takes nothing");
        let rest = a.admit(2).unwrap();
        assert!(a.admit(usize::MAX).is_err(), "no overflow");
        drop((held, rest));
        assert_eq!(a.in_flight(), 0);
    }

    #[test]
    fn permits_split_off_one_by_one_and_each_is_given_back_once() {
        let a = admission(3);
        let mut batch = a.admit(3).unwrap();
        let first = batch.take_one().unwrap();
        let second = batch.take_one().unwrap();
        assert_eq!((batch.count(), a.in_flight()), (1, 3));
        drop(first);
        assert_eq!(a.in_flight(), 2);
        drop(batch);
        assert_eq!(a.in_flight(), 1, "the one left in the batch");
        drop(second);
        assert_eq!((a.in_flight(), a.gauge.get()), (0, 0));
        let mut empty = a.admit(0).unwrap();
        assert!(empty.take_one().is_none());
    }
}
