//! The engine's clock: the one place the engine learns what time it is.
//!
//! The engine reads two kinds of time, and never reads either directly:
//! - **wall time** (epoch milliseconds): what documents store (`creation_time`,
//!   `modification_time`, `lease_expires_at`, tombstone ages) and what another instance
//!   compares against its own wall clock. Instances therefore rely on their wall clocks
//!   agreeing within the bound stated in `docs/design.md §9`; a jump of this host's wall clock
//!   is detected ([`JumpDetector`]) and fences its leases.
//! - **boot time** ([`BootTime`]): the local lease deadline a worker stops acting by. On Linux
//!   it is `CLOCK_BOOTTIME`, which keeps counting while the machine is suspended (a paused VM
//!   wakes up knowing its deadlines passed; `CLOCK_MONOTONIC`, behind `std::time::Instant`,
//!   does not count suspension). Neither this host's wall clock nor a stored
//!   `lease_expires_at` can stretch it.
//!
//! Sleeping (retries, the recovery interval) goes through `tokio::time`, so under tokio's
//! paused time (`#[tokio::test(start_paused = true)]`) a [`TestClock`] and every timer move
//! together and tests run leases, timeouts and recovery without waiting in real time.

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::time::Timestamp;

/// Time since an arbitrary origin that counts suspension: what lease deadlines are kept on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootTime(Duration);

impl BootTime {
    pub fn from_since_boot(since_boot: Duration) -> Self {
        Self(since_boot)
    }

    /// How long after `earlier` this is (zero if it is not after).
    pub fn saturating_duration_since(self, earlier: BootTime) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// How long until `later`, if it is still ahead.
    pub fn until(self, later: BootTime) -> Option<Duration> {
        later.0.checked_sub(self.0).filter(|left| !left.is_zero())
    }
}

impl Add<Duration> for BootTime {
    type Output = BootTime;
    fn add(self, d: Duration) -> BootTime {
        BootTime(self.0 + d)
    }
}

impl Sub<Duration> for BootTime {
    type Output = BootTime;
    fn sub(self, d: Duration) -> BootTime {
        BootTime(self.0.saturating_sub(d))
    }
}

/// What time it is, for the engine.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Wall-clock time, epoch milliseconds.
    fn wall_millis(&self) -> i64;
    /// Time that counts suspension, for local deadlines.
    fn boot_time(&self) -> BootTime;
    /// The current time in both forms documents use.
    fn now(&self) -> Now {
        Now::at(self.wall_millis())
    }
    /// Wall-clock time as a transfer document stores it.
    fn timestamp(&self) -> Timestamp {
        Timestamp::from_millis(self.wall_millis())
    }
}

pub type DynClock = Arc<dyn Clock>;

/// The host's clocks: the system wall clock and `CLOCK_BOOTTIME` (elsewhere than Linux, the
/// OS monotonic clock).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn wall_millis(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }

    fn boot_time(&self) -> BootTime {
        BootTime(since_boot())
    }
}

#[cfg(target_os = "linux")]
fn since_boot() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on every Linux the
    // service supports (2.6.39+), and the call only writes `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        // Cannot happen on a supported kernel; the monotonic clock is the closest substitute.
        return monotonic_since_start();
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(not(target_os = "linux"))]
fn since_boot() -> Duration {
    monotonic_since_start()
}

fn monotonic_since_start() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

/// A clock for tests: it starts at a fixed moment and then follows tokio's clock (virtual
/// when tokio's time is paused). A test may shift its wall time ([`TestClock::set_skew_millis`],
/// an instance whose clock is ahead or behind, or steps), or freeze it altogether
/// ([`TestClock::freeze`]: a clock that does not count a suspension; after
/// [`TestClock::thaw`] both its readings lag by the frozen time).
#[derive(Debug)]
pub struct TestClock {
    start_wall_millis: i64,
    start: Instant,
    skew_millis: AtomicI64,
    freezing: Mutex<Freezing>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Freezing {
    /// Time not counted by earlier freezes.
    lost: Duration,
    /// Since when the clock is frozen, if it is.
    since: Option<Instant>,
}

impl TestClock {
    /// 2026-01-01T00:00:00Z: a fixed start keeps test documents reproducible.
    pub const EPOCH_MILLIS: i64 = 1_767_225_600_000;

    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start_wall_millis: Self::EPOCH_MILLIS,
            start: Instant::now(),
            skew_millis: AtomicI64::new(0),
            freezing: Mutex::default(),
        })
    }

    /// The same timeline with the wall time shifted by `skew_millis`: another instance's
    /// clock.
    pub fn skewed(&self, skew_millis: i64) -> Arc<Self> {
        Arc::new(Self {
            start_wall_millis: self.start_wall_millis,
            start: self.start,
            skew_millis: AtomicI64::new(skew_millis),
            freezing: Mutex::default(),
        })
    }

    /// Moves this clock's wall time relative to the shared timeline (the boot clock is not
    /// affected, as with an NTP step).
    pub fn set_skew_millis(&self, skew_millis: i64) {
        self.skew_millis.store(skew_millis, Ordering::SeqCst);
    }

    /// Stops both readings until [`TestClock::thaw`].
    pub fn freeze(&self) {
        let mut f = self.freezing.lock().unwrap_or_else(|e| e.into_inner());
        f.since.get_or_insert_with(Instant::now);
    }

    /// Lets the clock run again, behind the timeline by the time it was frozen.
    pub fn thaw(&self) {
        let mut f = self.freezing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(since) = f.since.take() {
            f.lost += Instant::now() - since;
        }
    }

    fn elapsed(&self) -> Duration {
        let f = *self.freezing.lock().unwrap_or_else(|e| e.into_inner());
        let read_at = f.since.unwrap_or_else(Instant::now);
        (read_at - self.start).saturating_sub(f.lost)
    }
}

impl Clock for TestClock {
    fn wall_millis(&self) -> i64 {
        let elapsed = self.elapsed().as_millis() as i64;
        self.start_wall_millis + elapsed + self.skew_millis.load(Ordering::SeqCst)
    }

    fn boot_time(&self) -> BootTime {
        BootTime(self.elapsed())
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
            text: crate::time::format_millis(millis),
        }
    }

    /// The moment as a transfer document stores it.
    pub fn timestamp(&self) -> Timestamp {
        Timestamp::from_millis(self.millis)
    }
}

/// Notices when the wall clock steps: between two readings, wall time and boot time should
/// advance alike (NTP slews by at most 0.05 %); when they differ by more than a threshold,
/// the wall clock jumped, and every lease this instance timed against it is suspect.
#[derive(Debug)]
pub struct JumpDetector {
    threshold: Duration,
    last: Mutex<Option<(i64, BootTime)>>,
}

impl JumpDetector {
    pub fn new(threshold: Duration) -> Self {
        Self {
            threshold,
            last: Mutex::new(None),
        }
    }

    /// Reads `clock` and says how far its wall time jumped since the previous call, if
    /// further than the threshold (positive: forward).
    pub fn check(&self, clock: &dyn Clock) -> Option<i64> {
        let (wall, boot) = (clock.wall_millis(), clock.boot_time());
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let previous = last.replace((wall, boot));
        let (wall_before, boot_before) = previous?;
        let boot_elapsed = boot.saturating_duration_since(boot_before).as_millis() as i64;
        let jump = (wall - wall_before) - boot_elapsed;
        (jump.unsigned_abs() as u128 > self.threshold.as_millis()).then_some(jump)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_test_clock_follows_paused_time() {
        let clock = TestClock::new();
        let t0 = clock.boot_time();
        assert_eq!(clock.wall_millis(), TestClock::EPOCH_MILLIS);
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(clock.wall_millis(), TestClock::EPOCH_MILLIS + 90_000);
        assert_eq!(
            clock.boot_time().saturating_duration_since(t0),
            Duration::from_secs(90)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_skewed_clock_shares_the_timeline_but_not_the_wall_time() {
        let clock = TestClock::new();
        let ahead = clock.skewed(3_000);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(ahead.wall_millis() - clock.wall_millis(), 3_000);
        assert_eq!(ahead.boot_time(), clock.boot_time());
        ahead.set_skew_millis(-1_000);
        assert_eq!(ahead.wall_millis() - clock.wall_millis(), -1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_frozen_clock_loses_the_time_it_was_frozen() {
        let clock = TestClock::new();
        let other = clock.skewed(0);
        clock.freeze();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(clock.boot_time(), BootTime(Duration::ZERO));
        clock.thaw();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(clock.boot_time(), BootTime(Duration::from_secs(1)));
        assert_eq!(other.wall_millis() - clock.wall_millis(), 5_000);
    }

    #[test]
    fn the_system_clock_reads_the_epoch_and_a_boot_clock_that_advances() {
        let millis = SystemClock.wall_millis();
        // After 2020-01-01 and before 2100-01-01.
        assert!((1_577_836_800_000..4_102_444_800_000).contains(&millis));
        assert_eq!(
            SystemClock.now().text.len(),
            "2026-01-01T00:00:00.000Z".len()
        );
        let before = SystemClock.boot_time();
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            SystemClock.boot_time().saturating_duration_since(before) >= Duration::from_millis(2)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wall_clock_step_is_detected_and_slow_drift_is_not() {
        let clock = TestClock::new();
        let jumps = JumpDetector::new(Duration::from_millis(100));
        assert_eq!(jumps.check(clock.as_ref()), None, "the first reading");
        tokio::time::sleep(Duration::from_secs(10)).await;
        clock.set_skew_millis(50);
        assert_eq!(jumps.check(clock.as_ref()), None, "within the threshold");
        clock.set_skew_millis(3_050);
        assert_eq!(jumps.check(clock.as_ref()), Some(3_000));
        clock.set_skew_millis(-950);
        assert_eq!(jumps.check(clock.as_ref()), Some(-4_000));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(jumps.check(clock.as_ref()), None);
    }
}
