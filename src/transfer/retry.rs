//! Retrying store requests that failed with a retryable error (429, 503, a timeout, a dropped
//! connection): exponential backoff with full jitter, a bounded number of attempts.
//!
//! Retrying a conditional write whose first attempt may have been applied is safe: if it was,
//! the retry conflicts and the caller reads again.

use std::future::Future;
use std::time::Duration;

use rand::Rng;

use crate::store::StoreError;

/// Runs `request` up to `attempts` times in all, retrying retryable errors while `go_on()`
/// holds, and returns the last answer.
pub async fn retry<T, F, Fut>(
    attempts: u32,
    go_on: impl Fn() -> bool,
    request: F,
) -> Result<T, StoreError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 0;
    loop {
        match request().await {
            Err(e) if e.is_retryable() && attempt + 1 < attempts && go_on() => {
                attempt += 1;
                tokio::time::sleep(backoff(attempt)).await;
            }
            answer => return answer,
        }
    }
}

/// Exponential backoff with full jitter: up to 10 ms × 2^attempt, capped at 1 s.
pub fn backoff(attempt: u32) -> Duration {
    let cap = Duration::from_millis(10u64 << attempt.min(7)).min(Duration::from_secs(1));
    let micros = cap.as_micros().max(1) as u64;
    Duration::from_micros(rand::rng().random_range(micros / 2..=micros))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// `retry` of a request whose n-th call (from 0) answers `answer(n)`: what it returned and
    /// how many calls it made.
    async fn retried(
        attempts: u32,
        go_on: bool,
        answer: impl Fn(u32) -> Result<i32, StoreError>,
    ) -> (Result<i32, StoreError>, u32) {
        let calls = AtomicU32::new(0);
        let result = retry(
            attempts,
            || go_on,
            || async { answer(calls.fetch_add(1, Ordering::SeqCst)) },
        )
        .await;
        (result, calls.load(Ordering::SeqCst))
    }

    fn busy() -> StoreError {
        StoreError::Unavailable("busy".into())
    }

    #[tokio::test]
    async fn retries_retryable_errors_up_to_the_bound() {
        let (answer, calls) = retried(3, true, |_| Err(busy())).await;
        assert!(answer.is_err());
        assert_eq!(calls, 3);
    }

    #[tokio::test]
    async fn stops_at_success_permanent_errors_or_when_told() {
        let (answer, calls) = retried(5, true, |n| if n == 0 { Err(busy()) } else { Ok(7) }).await;
        assert_eq!((answer, calls), (Ok(7), 2));
        let (answer, calls) = retried(5, true, |_| Err(StoreError::Permanent("no".into()))).await;
        assert!(answer.is_err());
        assert_eq!(calls, 1);
        let (_, calls) = retried(5, false, |_| Err(busy())).await;
        assert_eq!(calls, 1);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        for attempt in 0..20 {
            let d = backoff(attempt);
            let cap = Duration::from_millis(10u64 << attempt.min(7)).min(Duration::from_secs(1));
            assert!(d <= cap && d >= cap / 2, "{attempt}: {d:?}");
        }
    }
}
