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
    Timestamp(millis).to_string()
}

/// An instant as the transfer documents store it: epoch milliseconds, written as the text
/// [`format_millis`] gives (RFC 3339 UTC, millisecond precision: sortable as text, a `date`
/// for Elasticsearch) and read with [`parse_millis`]. Text that does not parse is refused
/// with a serde error, so a document holding one does not decode. Ordered as instants.
///
/// ```
/// use transfer_service::time::Timestamp;
/// let at = Timestamp::from_millis(1_795_314_861_601);
/// assert_eq!(serde_json::to_string(&at).unwrap(), r#""2026-11-22T02:34:21.601Z""#);
/// assert_eq!(serde_json::from_str::<Timestamp>(r#""2026-11-22T02:34:21.601Z""#).unwrap(), at);
/// assert!(serde_json::from_str::<Timestamp>(r#""yesterday""#).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const fn from_millis(millis: i64) -> Self {
        Timestamp(millis)
    }

    /// Epoch milliseconds.
    pub const fn millis(self) -> i64 {
        self.0
    }

    /// `millis` later (earlier when negative), saturating.
    pub const fn plus_millis(self, millis: i64) -> Self {
        Timestamp(self.0.saturating_add(millis))
    }

    /// The text [`format_millis`] writes, read back; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        parse_millis(text).map(Timestamp)
    }
}

/// The stored text: exactly [`format_millis`]'s, written without an intermediate `String`.
impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(self.0.max(0) as u64);
        std::fmt::Display::fmt(&humantime::format_rfc3339_millis(t), f)
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Rfc3339;
        impl serde::de::Visitor<'_> for Rfc3339 {
            type Value = Timestamp;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an RFC 3339 time such as \"2026-01-01T00:00:00.000Z\"")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Timestamp, E> {
                Timestamp::parse(text)
                    .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(text), &self))
            }
        }
        deserializer.deserialize_str(Rfc3339)
    }
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
