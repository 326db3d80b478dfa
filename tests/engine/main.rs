//! The engine without HTTP, one test binary: scenarios of conflicts, lost answers, cancels
//! and timeouts, with a property test of random schedules (`scenarios`); a fault at every
//! step boundary (`faults`); the stale-worker race, seeded (`stale_worker`); and the auditor
//! that checks the invariants of `docs/design.md §4` (`audit`). Everything that involves
//! leases, timeouts or recovery runs on tokio's paused time.

#[path = "../support/mod.rs"]
mod support;

mod audit;
mod clocks;
mod currencies;
mod cut_off_primary;
mod events;
mod faults;
mod holds;
mod legs;
mod one_transaction;
mod scenarios;
mod stale_worker;
