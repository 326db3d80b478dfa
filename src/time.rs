//! Timestamps as the documents hold them: RFC 3339 UTC text with millisecond precision, and
//! epoch milliseconds. (The clock the engine reads is `transfer::clock`.)

/// Parses an RFC 3339 timestamp (as the service writes them) to epoch milliseconds.
pub fn parse_millis(text: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339_weak(text)
        .or_else(|_| humantime::parse_rfc3339(text))
        .ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}

/// Formats epoch milliseconds as RFC 3339 UTC with millisecond precision, the form every
/// timestamp in our documents has (sortable as text, a `date` for Elasticsearch).
///
/// ```
/// use transfer_service::time::{format_millis, parse_millis};
/// assert_eq!(format_millis(1_795_314_861_601), "2026-11-22T02:34:21.601Z");
/// assert_eq!(parse_millis("2026-11-22T02:34:21.601Z"), Some(1_795_314_861_601));
/// assert_eq!(parse_millis("yesterday"), None);
/// ```
pub fn format_millis(millis: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(millis.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// A duration setting (`LEASE_DURATION=30s`): its name, the range it takes and an example.
/// A value that is no duration, or one out of the range, is refused at start with a message
/// that names the setting, the value and an example; zero is in the range only of the
/// settings where it means something (`ADMISSION_WAIT=0s` refuses at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationSetting {
    pub name: &'static str,
    pub min: std::time::Duration,
    pub max: std::time::Duration,
    pub example: &'static str,
}

impl DurationSetting {
    /// A setting `name` taking `min_ms` milliseconds to `max_s` seconds (`--help` and the
    /// refusals state the range), shown by `example`.
    pub const fn new(name: &'static str, min_ms: u64, max_s: u64, example: &'static str) -> Self {
        DurationSetting {
            name,
            min: std::time::Duration::from_millis(min_ms),
            max: std::time::Duration::from_secs(max_s),
            example,
        }
    }

    /// `text` as a humantime duration (`500ms`, `1h30m`) within the range, or why not.
    ///
    /// ```
    /// use std::time::Duration;
    /// use transfer_service::time::DurationSetting;
    /// let lease = DurationSetting {
    ///     name: "LEASE_DURATION",
    ///     min: Duration::from_millis(100),
    ///     max: Duration::from_secs(3600),
    ///     example: "30s",
    /// };
    /// assert_eq!(lease.parse("1m30s"), Ok(Duration::from_secs(90)));
    /// assert_eq!(
    ///     lease.parse("abc").unwrap_err(),
    ///     "`abc` is not a duration: LEASE_DURATION is a number and a unit (ms, s, m, h, \
    ///      days), from 100ms to 1h, such as `30s`"
    /// );
    /// assert_eq!(
    ///     lease.parse("0s").unwrap_err(),
    ///     "`0s` is below the range: LEASE_DURATION is from 100ms to 1h, such as `30s`"
    /// );
    /// assert!(lease.parse("2h").unwrap_err().contains("is above the range"));
    /// ```
    pub fn parse(&self, text: &str) -> Result<std::time::Duration, String> {
        let (name, range, example) = (self.name, self.range(), self.example);
        let duration = humantime::parse_duration(text).map_err(|_| {
            format!(
                "`{text}` is not a duration: {name} is a number and a unit (ms, s, m, h, days), \
                 {range}, such as `{example}`"
            )
        })?;
        let off = if duration < self.min {
            "below"
        } else if duration > self.max {
            "above"
        } else {
            return Ok(duration);
        };
        Err(format!(
            "`{text}` is {off} the range: {name} is {range}, such as `{example}`"
        ))
    }

    /// "from 100ms to 1h": the range as the messages and the documentation state it.
    pub fn range(&self) -> String {
        format!(
            "from {} to {}",
            humantime::format_duration(self.min),
            humantime::format_duration(self.max)
        )
    }

    /// The parser clap takes: `value_parser = LEASE_DURATION.parser()`.
    pub fn parser(
        self,
    ) -> impl Fn(&str) -> Result<std::time::Duration, String> + Clone + Send + Sync + 'static {
        move |text| self.parse(text)
    }
}
