//! The values callers give the engine, validated: account and transfer ids, currencies,
//! labels and a hold's duration. Each rule is written once, here, as a function (`valid_id`)
//! and, where JSON Schema can say it, as the pattern of the type's OpenAPI schema; a value of
//! a type below ([`AccountId`], [`TransferId`], [`Currency`], [`HoldExpiry`]) holds only what
//! its rule admits, because its one constructor checks it.

use std::time::Duration;

/// Declares a validated value that the API's OpenAPI document shows as a string: a newtype
/// `pub struct Name(Inner)` whose field only its own module can set (by the constructor
/// written beside it, or, given a `rule`, a `parse` that admits a `String` the rule admits),
/// readable through `Deref`. Its doc comment is the schema's description (lines joined as
/// utoipa joins them), with an optional pattern (any expression, so that one rule can build
/// several), an example and, optionally, bounds on its length. No type is declared for the
/// schema alone: the value the server reads or answers is the one the document describes.
macro_rules! text_schema {
    (
        $(#[doc = $doc:literal])*
        pub struct $name:ident ($inner:ty) {
            $(rule: $rule:path,)?
            $(pattern: $pattern:expr,)?
            example: $example:literal $(,)?
            $(length: $min:literal..=$max:expr $(,)?)?
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name($inner);

        impl std::ops::Deref for $name {
            type Target = $inner;

            fn deref(&self) -> &$inner {
                &self.0
            }
        }

        impl From<$name> for $inner {
            fn from(value: $name) -> $inner {
                value.0
            }
        }

        $(
            impl $name {
                /// `text` if it follows the type's rule (the function named in its
                /// declaration).
                pub fn parse(text: String) -> Option<Self> {
                    $rule(&text).then_some(Self(text))
                }
            }
        )?

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                let lines = [$($doc),*].map(|line: &str| line.strip_prefix(' ').unwrap_or(line));
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::Type::String)
                    .description(Some(lines.join("\n")))
                    $(.pattern(Some($pattern)))?
                    .examples([serde_json::json!($example)])
                    $(.min_length(Some($min)).max_length(Some($max)))?
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}
pub(crate) use text_schema;

/// The longest id, in characters.
pub const MAX_ID_LEN: usize = 128;

/// Transfer and account ids: 1–128 characters of `[A-Za-z0-9._:-]` (`docs/design.md §5`), except `.`
/// and `..`, which no Elasticsearch document URL can address.
///
/// ```
/// use transfer_service::transfer::validated::valid_id;
/// assert!(valid_id("t-2026.11:22_01"));
/// assert!(valid_id(&"x".repeat(128)));
/// assert!(!valid_id(""));
/// assert!(!valid_id(&"x".repeat(129)));
/// assert!(!valid_id("a b") && !valid_id("a/b") && !valid_id("é"));
/// assert!(!valid_id(".") && !valid_id(".."));
/// ```
pub fn valid_id(id: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len())
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The id rule ([`valid_id`]) as an unanchored regular expression for ids of at most `max`
/// characters: not `.` or `..` (a first character other than a dot, or one or two dots
/// followed by more). The one place the rule is written as a pattern; every schema that holds
/// an id builds on it.
pub fn id_pattern(max: usize) -> String {
    let (after_first, after_dot) = (max - 1, max - 2);
    format!(
        r"(?:[A-Za-z0-9_:-][A-Za-z0-9._:-]{{0,{after_first}}}|\.[A-Za-z0-9_:-][A-Za-z0-9._:-]{{0,{after_dot}}}|\.\.[A-Za-z0-9._:-]{{1,{after_dot}}})"
    )
}

/// An id type: the rule of [`valid_id`], its pattern and length, one example.
macro_rules! id_schema {
    ($(#[doc = $doc:literal])* $name:ident, $example:literal) => {
        text_schema! {
            $(#[doc = $doc])*
            pub struct $name(String) {
                rule: valid_id,
                pattern: format!("^{}$", id_pattern(MAX_ID_LEN)),
                example: $example,
                length: 1..=MAX_ID_LEN,
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_schema! {
    /// An account id: 1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`.
    AccountId, "acct-1"
}

id_schema! {
    /// A transfer id: 1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`.
    TransferId, "t-1"
}

impl TransferId {
    /// A new id no one has used: a UUIDv7 (time-ordered, so that ids made one after another
    /// sort together).
    pub fn fresh() -> Self {
        Self(uuid::Uuid::now_v7().to_string())
    }
}

/// Units a transfer, one of its legs or a capture moves: a whole number from 1 to 2^63−1 (its
/// one constructor, [`PositiveAmount::new`], refuses anything else).
///
/// ```
/// use transfer_service::transfer::validated::PositiveAmount;
/// assert_eq!(PositiveAmount::new(1).map(PositiveAmount::get), Some(1));
/// assert!(PositiveAmount::new(0).is_none() && PositiveAmount::new(-1).is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PositiveAmount(i64);

impl PositiveAmount {
    /// `units` if it is at least 1.
    pub fn new(units: i64) -> Option<Self> {
        (units >= 1).then_some(Self(units))
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// The longest currency code, in characters.
pub const MAX_CURRENCY_LEN: usize = 16;

/// Currencies: 1–16 characters of `[A-Z0-9_]` (`USD`, `EUR`, `POINTS`, `USD_CENTS`).
///
/// ```
/// use transfer_service::transfer::validated::valid_currency;
/// assert!(valid_currency("USD") && valid_currency("X") && valid_currency(&"A".repeat(16)));
/// assert!(!valid_currency("") && !valid_currency(&"A".repeat(17)));
/// assert!(!valid_currency("usd") && !valid_currency("US D") && !valid_currency("€"));
/// ```
pub fn valid_currency(text: &str) -> bool {
    (1..=MAX_CURRENCY_LEN).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

text_schema! {
    /// A currency code: 1–16 characters of `[A-Z0-9_]`.
    pub struct Currency(String) {
        rule: valid_currency,
        pattern: format!("^[A-Z0-9_]{{1,{MAX_CURRENCY_LEN}}}$"),
        example: "USD",
        length: 1..=MAX_CURRENCY_LEN,
    }
}

/// The shortest a hold may wait for its capture (`hold_expires_in`, `HOLD_TIMEOUT`).
pub const MIN_HOLD: Duration = Duration::from_secs(1);
/// The longest a hold may wait for its capture: 30 days.
pub const MAX_HOLD: Duration = Duration::from_secs(30 * 24 * 3600);

text_schema! {
    /// How long a hold waits for its capture: a duration such as `10m`, `1h30m` or `2days`
    /// (units `s`, `m`, `h`, `days` and the others of humantime), from 1 s to 30 days.
    pub struct HoldExpiry(Duration) {
        example: "10m",
    }
}

impl HoldExpiry {
    /// `duration` if it is within [`MIN_HOLD`]..=[`MAX_HOLD`], else why not.
    ///
    /// ```
    /// use std::time::Duration;
    /// use transfer_service::transfer::validated::HoldExpiry;
    /// assert!(HoldExpiry::new(Duration::from_secs(1)).is_ok());
    /// assert!(HoldExpiry::new(Duration::from_secs(30 * 24 * 3600)).is_ok());
    /// assert!(HoldExpiry::new(Duration::from_millis(999)).is_err());
    /// assert!(HoldExpiry::new(Duration::from_secs(30 * 24 * 3600 + 1)).is_err());
    /// assert_eq!(HoldExpiry::bounds(), "from 1s to 30days");
    /// ```
    pub fn new(duration: Duration) -> Result<Self, String> {
        if (MIN_HOLD..=MAX_HOLD).contains(&duration) {
            Ok(Self(duration))
        } else {
            Err(format!(
                "a hold lasts {}, not {}",
                Self::bounds(),
                humantime::format_duration(duration)
            ))
        }
    }

    /// "from 1s to 30days": [`MIN_HOLD`] and [`MAX_HOLD`] as a client writes them.
    pub fn bounds() -> String {
        let [min, max] = [MIN_HOLD, MAX_HOLD].map(humantime::format_duration);
        format!("from {min} to {max}")
    }

    /// A humantime duration (`10m`, `1h30m`, `2days`) within the bounds.
    pub fn parse(text: &str) -> Option<Self> {
        Self::new(humantime::parse_duration(text).ok()?).ok()
    }
}

/// The most keys one metadata object holds.
pub const METADATA_MAX_KEYS: usize = 16;
/// The longest metadata value, in characters.
pub const METADATA_MAX_VALUE_CHARS: usize = 256;

/// The longest metadata key, in characters.
pub const METADATA_KEY_MAX_CHARS: usize = 40;

/// A metadata key, unanchored: 1–40 characters of `[a-z0-9_.-]`.
pub fn metadata_key_pattern() -> String {
    format!("[a-z0-9_.-]{{1,{METADATA_KEY_MAX_CHARS}}}")
}

/// Metadata keys: 1–40 characters of `[a-z0-9_.-]` (no `=`: the embedded store's index
/// joins a key and its value with it).
///
/// ```
/// use transfer_service::transfer::validated::valid_metadata_key;
/// assert!(valid_metadata_key("order_id") && valid_metadata_key("a.b-c") && valid_metadata_key(&"k".repeat(40)));
/// assert!(!valid_metadata_key("") && !valid_metadata_key(&"k".repeat(41)));
/// assert!(!valid_metadata_key("Order") && !valid_metadata_key("a b") && !valid_metadata_key("a=b"));
/// ```
pub fn valid_metadata_key(key: &str) -> bool {
    (1..=METADATA_KEY_MAX_CHARS).contains(&key.len())
        && key.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        })
}

/// Metadata values: strings of at most 256 characters (the empty string included).
pub fn valid_metadata_value(value: &str) -> bool {
    value.chars().count() <= METADATA_MAX_VALUE_CHARS
}

/// Checks a whole metadata object: at most 16 keys, each key and value valid. `Err` says
/// what is wrong, for the client.
pub fn valid_metadata<'a>(
    entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
) -> Result<(), String> {
    if entries.len() > METADATA_MAX_KEYS {
        return Err(format!(
            "`metadata` has {} keys; at most {METADATA_MAX_KEYS}",
            entries.len()
        ));
    }
    for (key, value) in entries {
        if !valid_metadata_key(key) {
            return Err(format!(
                "`metadata` keys must be 1–{METADATA_KEY_MAX_CHARS} characters of a-z 0-9 _ . -"
            ));
        }
        if !valid_metadata_value(value) {
            return Err(format!(
                "`metadata` values must be strings of at most {METADATA_MAX_VALUE_CHARS} characters"
            ));
        }
    }
    Ok(())
}

/// Labels of a transfer or an account: at most 16 keys of `[a-z0-9_.-]{1,40}`, each value a
/// string of at most 256 characters. Made only by [`Metadata::parse`], which refuses any
/// other, or read back from a document this service wrote (stored as a plain JSON object).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Metadata(std::collections::BTreeMap<String, String>);

impl Metadata {
    /// The labels `pairs` if they keep the rules ([`valid_metadata`]); `Err` says which
    /// they break, for the client. A key given twice keeps its last value.
    pub fn parse(pairs: Vec<(String, String)>) -> Result<Self, String> {
        valid_metadata(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        Ok(Metadata(pairs.into_iter().collect()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of `key`, if labelled.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Every label, by key.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl utoipa::PartialSchema for Metadata {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        let key = utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::Type::String)
            .min_length(Some(1))
            .max_length(Some(METADATA_KEY_MAX_CHARS))
            .pattern(Some(format!("^{}$", metadata_key_pattern())));
        let value = utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::Type::String)
            .max_length(Some(METADATA_MAX_VALUE_CHARS));
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::Type::Object)
            .description(Some(
                "String labels by key: at most 16 keys of `[a-z0-9_.-]{1,40}`, each value a \
                 string of at most 256 characters (else 422).",
            ))
            .max_properties(Some(METADATA_MAX_KEYS))
            .property_names(Some(key))
            .additional_properties(Some(value))
            .examples([serde_json::json!({"order_id": "123"})])
            .into()
    }
}

impl utoipa::ToSchema for Metadata {
    fn name() -> std::borrow::Cow<'static, str> {
        "Metadata".into()
    }
}
