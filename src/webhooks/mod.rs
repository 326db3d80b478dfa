//! Webhooks (`docs/api.md` "Webhooks", `docs/design.md §11` "Webhooks"): every selected event
//! of the change feed POSTed to each configured URL, signed per Standard Webhooks, at least once.
//!
//! - [`signing`]: the `whsec_` secret and the `webhook-signature` header;
//! - [`progress`]: the durable cursor and the delivery lease of one receiver, a document of
//!   the `webhooks` index written with the store's conditional writes;
//! - [`dispatcher`]: one task per URL that reads the feed from that cursor and delivers,
//!   concurrently across transfers, in order per transfer, with retries.
//!
//! Transfers never wait on webhooks: the dispatchers are tasks of their own that only read
//! the feed (and write their own progress document); a slow or dead receiver fills the
//! dispatcher's bounded queue, after which it stops reading the feed until there is room.

pub mod dispatcher;
pub mod fast;
pub mod ledger;
pub mod progress;
pub mod signing;

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::store::elasticsearch::Secret;
use crate::time::DurationSetting;
use crate::transfer::feed::Feed;
use crate::transfer::history::EventKind;
use crate::transfer::model::TransferState;

/// Webhooks (docs/api.md "Webhooks", docs/design.md §11 "Webhooks"). Checked at start-up by
/// [`WebhookSettings::from_args`]: a bad value stops the service with a message
/// naming it. The secret never prints (`--help` hides its environment value, `Debug` shows
/// `***`, and an error about it never quotes it).
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// POST every selected event to these URLs (comma-separated, each `http://` or
    /// `https://`), signed per Standard Webhooks. Unset: no webhooks.
    #[arg(
        long,
        env = "WEBHOOK_URL",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub webhook_url: Vec<String>,
    /// The signing secret, `whsec_<base64 key>` (the HMAC key is the decoded bytes, at least
    /// 16). Required with WEBHOOK_URL.
    #[arg(long, env = "WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<Secret>,
    /// Event types to deliver, comma-separated (`transfer.created`, `transfer.pending`,
    /// `transfer.committed`, `transfer.finished`, `transfer.terminating`,
    /// `transfer.rolled-back`, `transfer.captured`). Default: the terminal ones.
    #[arg(
        long,
        env = "WEBHOOK_EVENTS",
        value_delimiter = ',',
        default_value = "transfer.finished,transfer.rolled-back"
    )]
    pub webhook_events: Vec<String>,
    /// How long an event is retried, counted from the event's time (so it holds across
    /// restarts); then it is given up (logged and counted).
    /// From 1s to 30days.
    #[arg(long, env = "WEBHOOK_RETRY_PERIOD", default_value = "24h", value_parser = WEBHOOK_RETRY_PERIOD.parser())]
    pub webhook_retry_period: Duration,
    /// Time limit of one delivery attempt (connect, send, answer).
    /// From 10ms to 5m.
    #[arg(long, env = "WEBHOOK_TIMEOUT", default_value = "10s", value_parser = WEBHOOK_TIMEOUT.parser())]
    pub webhook_timeout: Duration,
    /// Retries wait a random time up to `WEBHOOK_BACKOFF_MIN × 2^(attempt − 1)` (exponential
    /// backoff with full jitter), at most WEBHOOK_BACKOFF_MAX.
    /// From 1ms to 1h.
    #[arg(long, env = "WEBHOOK_BACKOFF_MIN", default_value = "1s", value_parser = WEBHOOK_BACKOFF_MIN.parser())]
    pub webhook_backoff_min: Duration,
    /// The longest wait between two attempts of one event.
    /// From 1ms to 1day.
    #[arg(long, env = "WEBHOOK_BACKOFF_MAX", default_value = "5m", value_parser = WEBHOOK_BACKOFF_MAX.parser())]
    pub webhook_backoff_max: Duration,
    /// Where a URL seen for the first time starts: `beginning` (every event in the store) or
    /// `now` (the end of the feed when this process started). A URL already delivering keeps
    /// its progress either way.
    #[arg(long, env = "WEBHOOK_START", default_value = "beginning", value_parser = ["beginning", "now"])]
    pub webhook_start: String,
}

impl Default for WebhookArgs {
    fn default() -> Self {
        Self {
            webhook_url: Vec::new(),
            webhook_secret: None,
            webhook_events: vec!["transfer.finished".into(), "transfer.rolled-back".into()],
            webhook_retry_period: Duration::from_secs(24 * 3600),
            webhook_timeout: Duration::from_secs(10),
            webhook_backoff_min: Duration::from_secs(1),
            webhook_backoff_max: Duration::from_secs(300),
            webhook_start: "beginning".into(),
        }
    }
}

pub use signing::WebhookSecret;

const DAY: u64 = 24 * 3600;
pub const WEBHOOK_RETRY_PERIOD: DurationSetting =
    DurationSetting::new("WEBHOOK_RETRY_PERIOD", 1_000, 30 * DAY, "24h");
pub const WEBHOOK_TIMEOUT: DurationSetting =
    DurationSetting::new("WEBHOOK_TIMEOUT", 10, 5 * 60, "10s");
/// Zero would retry a failing receiver without pause.
pub const WEBHOOK_BACKOFF_MIN: DurationSetting =
    DurationSetting::new("WEBHOOK_BACKOFF_MIN", 1, 3600, "1s");
pub const WEBHOOK_BACKOFF_MAX: DurationSetting =
    DurationSetting::new("WEBHOOK_BACKOFF_MAX", 1, DAY, "5m");
/// The webhooks' duration settings, each with its range.
pub const DURATION_SETTINGS: [DurationSetting; 4] = [
    WEBHOOK_RETRY_PERIOD,
    WEBHOOK_TIMEOUT,
    WEBHOOK_BACKOFF_MIN,
    WEBHOOK_BACKOFF_MAX,
];

/// Every event type, in the order of a transfer's life.
pub fn all_event_kinds() -> Vec<EventKind> {
    TransferState::ALL
        .into_iter()
        .map(EventKind::State)
        .chain([EventKind::Captured])
        .collect()
}

/// `transfer.<state>` or `transfer.captured`; an unknown type is refused with the list.
pub fn parse_event_type(text: &str) -> Result<EventKind, String> {
    let text = text.trim();
    all_event_kinds()
        .into_iter()
        .find(|kind| kind.type_name() == text)
        .ok_or_else(|| {
            let known: Vec<&str> = all_event_kinds().iter().map(|k| k.type_name()).collect();
            format!(
                "WEBHOOK_EVENTS: unknown event type `{text}` (known: {})",
                known.join(", ")
            )
        })
}

/// One receiver: its URL and the id of its progress document.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub url: url::Url,
    /// `sha256(url)`, 16 hex digits: the id of its progress document. The URL itself is not
    /// stored (it may carry a token); the same URL on every instance shares one document.
    pub id: String,
    /// The URL without user info, query or fragment: what logs and metrics show.
    pub label: String,
}

impl Endpoint {
    pub fn parse(text: &str) -> Result<Self, String> {
        let url = url::Url::parse(text.trim())
            .map_err(|e| format!("WEBHOOK_URL: `{}` is not a URL: {e}", redact(text)))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(format!(
                "WEBHOOK_URL: `{}` must be an http:// or https:// URL with a host",
                redact(text)
            ));
        }
        let digest = Sha256::digest(url.as_str().as_bytes());
        let id = hex::encode(&digest[..8]);
        let mut shown = url.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        shown.set_fragment(None);
        Ok(Self {
            url,
            id,
            label: shown.to_string(),
        })
    }
}

/// Up to the first `?` and without user info, for an error message about a URL that may
/// carry a token.
fn redact(text: &str) -> String {
    let text = text.split(['?', '#']).next().unwrap_or_default();
    match text.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((_, host)) => format!("{scheme}://***@{host}"),
            None => text.to_owned(),
        },
        None => text.to_owned(),
    }
}

/// Exponential backoff with full jitter: a random wait in `[0, min(max, min × 2^(attempt−1))]`
/// after the `attempt`-th failure (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The ceiling of the wait after the `attempt`-th failure.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(30);
        self.min.saturating_mul(factor).min(self.max)
    }

    /// A wait after the `attempt`-th failure, uniformly drawn below the ceiling.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let nanos = ceiling.as_nanos().min(u64::MAX as u128) as u64;
        Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }
}

/// The validated webhook configuration.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub receivers: Vec<Endpoint>,
    pub secret: Arc<WebhookSecret>,
    /// The event types delivered.
    pub events: Vec<EventKind>,
    pub retry_period: Duration,
    pub timeout: Duration,
    pub backoff: Backoff,
    /// How long a delivery lease lasts (the service's `LEASE_DURATION`); renewed every third.
    pub lease: Duration,
    /// Events one dispatcher holds (queued or being delivered) before it stops reading the
    /// feed.
    pub max_pending: usize,
    /// Delivery attempts in flight at once per receiver.
    pub max_concurrent: usize,
    /// A URL seen for the first time starts at the end of the feed (`WEBHOOK_START=now`)
    /// instead of its beginning.
    pub start_now: bool,
}

/// Default of [`WebhookSettings::max_pending`].
pub const MAX_PENDING: usize = 2_000;
/// Default of [`WebhookSettings::max_concurrent`].
pub const MAX_CONCURRENT: usize = 32;

impl WebhookSettings {
    /// The settings of `args`, `None` when no URL is set; an error names what is wrong.
    pub fn from_args(args: &WebhookArgs, lease: Duration) -> Result<Option<Self>, String> {
        let receivers = args
            .webhook_url
            .iter()
            .filter(|text| !text.trim().is_empty())
            .map(|text| Endpoint::parse(text))
            .collect::<Result<Vec<_>, _>>()?;
        let events = args
            .webhook_events
            .iter()
            .filter(|text| !text.trim().is_empty())
            .map(|text| parse_event_type(text))
            .collect::<Result<Vec<_>, _>>()?;
        if receivers.is_empty() {
            return Ok(None);
        }
        let mut ids: Vec<&str> = receivers.iter().map(|r| r.id.as_str()).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err("WEBHOOK_URL: the same URL is listed twice".into());
        }
        if events.is_empty() {
            return Err("WEBHOOK_EVENTS: no event type selected".into());
        }
        let secret = args
            .webhook_secret
            .as_ref()
            .ok_or("WEBHOOK_SECRET is required when WEBHOOK_URL is set")?;
        // The error never quotes the secret.
        let secret: WebhookSecret = secret
            .expose()
            .parse()
            .map_err(|why| format!("WEBHOOK_SECRET: {why}"))?;
        let positive = |name: &str, value: Duration| {
            if value.is_zero() {
                Err(format!("{name} must be more than 0"))
            } else {
                Ok(value)
            }
        };
        let backoff = Backoff {
            min: positive("WEBHOOK_BACKOFF_MIN", args.webhook_backoff_min)?,
            max: positive("WEBHOOK_BACKOFF_MAX", args.webhook_backoff_max)?,
        };
        if backoff.max < backoff.min {
            return Err("WEBHOOK_BACKOFF_MAX must be at least WEBHOOK_BACKOFF_MIN".into());
        }
        Ok(Some(Self {
            receivers,
            secret: Arc::new(secret),
            events,
            retry_period: positive("WEBHOOK_RETRY_PERIOD", args.webhook_retry_period)?,
            timeout: positive("WEBHOOK_TIMEOUT", args.webhook_timeout)?,
            backoff,
            lease,
            max_pending: MAX_PENDING,
            max_concurrent: MAX_CONCURRENT,
            start_now: match args.webhook_start.as_str() {
                "beginning" => false,
                "now" => true,
                other => return Err(format!("WEBHOOK_START: `{other}` is not beginning or now")),
            },
        }))
    }
}

/// The running dispatchers; they stop when the engine shuts down.
pub struct Webhooks {
    tasks: Vec<JoinHandle<()>>,
}

impl Webhooks {
    /// One dispatcher per receiver, each a task of its own, reading `feed`.
    pub fn spawn(feed: Arc<Feed>, settings: WebhookSettings, metrics: Arc<Metrics>) -> Self {
        let settings = Arc::new(settings);
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client with a timeout and no redirects");
        let tasks = settings
            .receivers
            .iter()
            .map(|receiver| {
                let dispatcher = dispatcher::Dispatcher::new(
                    feed.clone(),
                    settings.clone(),
                    receiver.clone(),
                    client.clone(),
                    metrics.clone(),
                );
                tokio::spawn(dispatcher.run())
            })
            .collect();
        Self { tasks }
    }

    /// Waits up to `grace` for the dispatchers to save their progress and release their
    /// leases (they stop on the engine's shutdown); those still running then are aborted.
    pub async fn stopped(self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        for task in self.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::elasticsearch::Secret;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn args(urls: &[&str]) -> WebhookArgs {
        WebhookArgs {
            webhook_url: urls.iter().map(|u| u.to_string()).collect(),
            webhook_secret: Some(Secret::new(SECRET)),
            ..WebhookArgs::default()
        }
    }

    fn refusal(args: &WebhookArgs) -> String {
        WebhookSettings::from_args(args, Duration::from_secs(30)).unwrap_err()
    }

    #[test]
    fn event_types_parse_by_name_and_unknown_ones_are_named() {
        assert_eq!(
            parse_event_type("transfer.rolled-back"),
            Ok(EventKind::State(TransferState::RolledBack))
        );
        assert_eq!(
            parse_event_type(" transfer.captured"),
            Ok(EventKind::Captured)
        );
        for kind in all_event_kinds() {
            assert_eq!(parse_event_type(kind.type_name()), Ok(kind));
        }
        let error = parse_event_type("transfer.done").unwrap_err();
        assert!(error.contains("`transfer.done`"), "{error}");
        assert!(error.contains("transfer.finished"), "{error}");
        let mut bad = args(&["http://127.0.0.1:9/hook"]);
        bad.webhook_events = vec!["transfer.finished".into(), "transfer.oops".into()];
        assert!(refusal(&bad).contains("`transfer.oops`"));
    }

    #[test]
    fn the_default_selection_is_the_terminal_events() {
        let settings = WebhookSettings::from_args(&args(&["http://x.test/h"]), Duration::ZERO)
            .unwrap()
            .unwrap();
        assert_eq!(
            settings.events,
            [
                EventKind::State(TransferState::Finished),
                EventKind::State(TransferState::RolledBack)
            ]
        );
        assert_eq!(settings.retry_period, Duration::from_secs(24 * 3600));
    }

    #[test]
    fn urls_are_checked_and_need_a_secret() {
        assert!(WebhookSettings::from_args(&args(&[]), Duration::ZERO)
            .unwrap()
            .is_none());
        assert!(WebhookSettings::from_args(&args(&[""]), Duration::ZERO)
            .unwrap()
            .is_none());
        let two = WebhookSettings::from_args(
            &args(&["http://a.test/h", "https://b.test:8443/h?token=s3cr3t"]),
            Duration::ZERO,
        )
        .unwrap()
        .unwrap();
        assert_eq!(two.receivers.len(), 2);
        assert_ne!(two.receivers[0].id, two.receivers[1].id);
        assert_eq!(two.receivers[1].label, "https://b.test:8443/h");
        for (bad, why) in [
            ("ftp://a.test/h", "http:// or https://"),
            ("a.test/h", "not a URL"),
            ("http://u:pw@[bad/h?token=s3cr3t", "not a URL"),
        ] {
            let message = refusal(&args(&[bad]));
            assert!(message.contains(why), "{bad}: {message}");
            assert!(
                !message.contains("s3cr3t") && !message.contains("pw"),
                "{message}"
            );
        }
        assert!(refusal(&args(&["http://a.test/h", "http://a.test/h"])).contains("twice"));
        let mut no_secret = args(&["http://a.test/h"]);
        no_secret.webhook_secret = None;
        assert!(refusal(&no_secret).contains("WEBHOOK_SECRET is required"));
        let mut bad_secret = args(&["http://a.test/h"]);
        bad_secret.webhook_secret = Some(Secret::new("s3cr3t-not-whsec"));
        let message = refusal(&bad_secret);
        assert!(message.starts_with("WEBHOOK_SECRET: "), "{message}");
        assert!(!message.contains("s3cr3t"), "{message}");
        let mut zero = args(&["http://a.test/h"]);
        zero.webhook_timeout = Duration::ZERO;
        assert!(refusal(&zero).contains("WEBHOOK_TIMEOUT"));
    }

    #[test]
    fn backoff_grows_exponentially_under_its_cap_with_full_jitter() {
        let backoff = Backoff {
            min: Duration::from_millis(100),
            max: Duration::from_secs(5),
        };
        assert_eq!(backoff.ceiling(1), Duration::from_millis(100));
        assert_eq!(backoff.ceiling(2), Duration::from_millis(200));
        assert_eq!(backoff.ceiling(6), Duration::from_millis(3200));
        assert_eq!(backoff.ceiling(7), Duration::from_secs(5));
        assert_eq!(backoff.ceiling(1000), Duration::from_secs(5));
        for attempt in [1, 3, 7, 40] {
            let ceiling = backoff.ceiling(attempt);
            let delays: Vec<Duration> = (0..200).map(|_| backoff.delay(attempt)).collect();
            assert!(delays.iter().all(|d| *d <= ceiling), "{attempt}");
            // Full jitter: spread over the whole range, not clustered at the ceiling.
            assert!(delays.iter().any(|d| *d < ceiling / 2), "{attempt}");
            assert!(delays.iter().any(|d| *d > ceiling / 2), "{attempt}");
        }
    }
}
