//! Waiting for something to happen: poll a condition until it holds or a deadline passes.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long a suite waits for anything before it fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(20);

/// Polls `check` until it holds; panics naming `what` after [`DEADLINE`].
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(DEADLINE, what, check).await
}

/// Polls `check` until it holds; panics naming `what` after `limit`.
pub async fn eventually_within<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `find` until it returns something; panics naming `what` after [`DEADLINE`].
pub async fn until_some<T, F, Fut>(what: &str, mut find: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = find().await {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}
