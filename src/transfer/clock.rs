//! The engine's clock: the one place the engine learns what time it is.
//!
//! The engine reads two kinds of time, and never reads either directly:
//! - **wall time** (epoch milliseconds): what documents store (`creation_time`,
//!   `modification_time`, `lease_expires_at`, tombstone ages) and what another instance
//!   compares against its own wall clock. Instances therefore rely on their wall clocks
//!   agreeing within the bound stated in `docs/design.md §9`.
//! - **monotonic time** ([`Instant`]): the local lease deadline a worker stops acting by.
//!   Neither this host's wall clock nor a stored `lease_expires_at` can stretch it.
//!
//! Sleeping (retries, the recovery interval) goes through `tokio::time`, so under tokio's
//! paused time (`#[tokio::test(start_paused = true)]`) a [`TestClock`] and every timer move
//! together and tests run leases, timeouts and recovery without waiting in real time.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tokio::time::Instant;

/// What time it is, for the engine.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Wall-clock time, epoch milliseconds.
    fn wall_millis(&self) -> i64;
    /// Monotonic time, for local deadlines.
    fn instant(&self) -> Instant;
    /// The current time in both forms documents use.
    fn now(&self) -> Now {
        Now::at(self.wall_millis())
    }
}

pub type DynClock = Arc<dyn Clock>;

/// The host's clocks: the system wall clock, and tokio's monotonic clock (the OS monotonic
/// clock, unless a test paused tokio's time).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn wall_millis(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// A clock for tests: wall time starts at a fixed moment and then follows tokio's clock (so
/// it is virtual when tokio's time is paused), shifted by a skew that a test may change at
/// any moment (an instance whose clock is ahead or behind, or jumps).
#[derive(Debug)]
pub struct TestClock {
    start_wall_millis: i64,
    start: Instant,
    skew_millis: AtomicI64,
}

impl TestClock {
    /// 2026-01-01T00:00:00Z: a fixed start keeps test documents reproducible.
    pub const EPOCH_MILLIS: i64 = 1_767_225_600_000;

    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start_wall_millis: Self::EPOCH_MILLIS,
            start: Instant::now(),
            skew_millis: AtomicI64::new(0),
        })
    }

    /// The same timeline shifted by `skew_millis`: another instance's clock.
    pub fn skewed(&self, skew_millis: i64) -> Arc<Self> {
        Arc::new(Self {
            start_wall_millis: self.start_wall_millis,
            start: self.start,
            skew_millis: AtomicI64::new(skew_millis),
        })
    }

    /// Moves this clock's wall time relative to the shared timeline (the monotonic clock is
    /// not affected, as with an NTP step).
    pub fn set_skew_millis(&self, skew_millis: i64) {
        self.skew_millis.store(skew_millis, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn wall_millis(&self) -> i64 {
        let elapsed = Instant::now().duration_since(self.start).as_millis() as i64;
        self.start_wall_millis + elapsed + self.skew_millis.load(Ordering::SeqCst)
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// A moment in wall time, in both forms the documents use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Now {
    pub millis: i64,
    /// RFC 3339, millisecond precision, UTC.
    pub text: String,
}

impl Now {
    pub fn at(millis: i64) -> Self {
        Self {
            millis,
            text: crate::store::format_millis(millis),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_test_clock_follows_paused_time() {
        let clock = TestClock::new();
        let t0 = clock.instant();
        assert_eq!(clock.wall_millis(), TestClock::EPOCH_MILLIS);
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(clock.wall_millis(), TestClock::EPOCH_MILLIS + 90_000);
        assert_eq!(clock.instant() - t0, Duration::from_secs(90));
    }

    #[tokio::test(start_paused = true)]
    async fn a_skewed_clock_shares_the_timeline_but_not_the_wall_time() {
        let clock = TestClock::new();
        let ahead = clock.skewed(3_000);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(ahead.wall_millis() - clock.wall_millis(), 3_000);
        assert_eq!(ahead.instant(), clock.instant());
        ahead.set_skew_millis(-1_000);
        assert_eq!(ahead.wall_millis() - clock.wall_millis(), -1_000);
    }

    #[test]
    fn the_system_clock_reads_the_epoch_in_milliseconds() {
        let millis = SystemClock.wall_millis();
        // After 2020-01-01 and before 2100-01-01.
        assert!((1_577_836_800_000..4_102_444_800_000).contains(&millis));
        assert_eq!(
            SystemClock.now().text.len(),
            "2026-01-01T00:00:00.000Z".len()
        );
    }
}
