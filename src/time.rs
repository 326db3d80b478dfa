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
