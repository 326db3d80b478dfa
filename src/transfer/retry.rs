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

    #[tokio::test]
    async fn retries_retryable_errors_up_to_the_bound() {
        let calls = AtomicU32::new(0);
        let answer: Result<(), _> = retry(
            3,
            || true,
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(StoreError::Unavailable("busy".into()))
            },
        )
        .await;
        assert!(answer.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn stops_at_success_permanent_errors_or_when_told() {
        let calls = AtomicU32::new(0);
        let answer = retry(
            5,
            || true,
            || async {
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0 => Err(StoreError::Unavailable("busy".into())),
                    _ => Ok(7),
                }
            },
        )
        .await;
        assert_eq!(answer, Ok(7));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let calls = AtomicU32::new(0);
        let answer: Result<(), _> = retry(
            5,
            || true,
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(StoreError::Permanent("no".into()))
            },
        )
        .await;
        assert!(answer.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let calls = AtomicU32::new(0);
        let _: Result<(), _> = retry(
            5,
            || false,
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(StoreError::Unavailable("busy".into()))
            },
        )
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
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
