//! The `Idempotency-Key` request header (draft-ietf-httpapi-idempotency-key-header) on
//! `POST /transfers` and `POST /transfers/batch`.
//!
//! A transfer's id already is its idempotency key: the same id with the same request replays
//! the transfer (`200`, as it is now), with another request it is a `409`. The header is
//! another way to give that id, for clients that send the header by habit:
//!
//! - `POST /transfers`: without a body `id`, the key *is* the transfer's id, so it must be a
//!   valid id (else `422` saying so); with a body `id`, the key must be the same (else `422`).
//! - `POST /transfers/batch`: the key names the batch. Item `i` (from 0) without an `id` gets
//!   the id `<key>:<i>`, so sending the same batch again with the same key replays every item
//!   instead of creating new transfers; items with an `id` keep theirs. The key is 1–124
//!   characters so that every derived id is a valid id.
//!
//! The value may be the draft's form, a Structured Field string (`"key"`, quoted), or the bare
//! token most clients send (`key`); both name the same key.
//!
//! Keys are kept forever: transfers are never deleted, so a key is never forgotten and never
//! reused for another transfer.

use axum::http::{HeaderMap, HeaderName};

use super::ApiError;
use crate::transfer::validated::{id_pattern, text_schema, TransferId, MAX_ID_LEN};

pub const HEADER: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key: an id.
pub const MAX_KEY_LEN: usize = MAX_ID_LEN;

/// The longest batch key: `<key>:<index>` with the largest index (999, a batch holding at
/// most [`MAX_BATCH`](super::batch::MAX_BATCH)) is then at most an id's length.
pub const MAX_BATCH_KEY_LEN: usize =
    MAX_KEY_LEN - ":".len() - ((super::batch::MAX_BATCH - 1).ilog10() as usize + 1);

text_schema! {
    /// An `Idempotency-Key` of `POST /transfers`: an id (1–128 characters of `[A-Za-z0-9._:-]`,
    /// not `.` or `..`), bare or as a quoted Structured Field string (`"t-1"`).
    pub struct IdempotencyKey(TransferId) {
        pattern: bare_or_quoted(&id_pattern(MAX_KEY_LEN)),
        example: "t-1",
    }
}

text_schema! {
    /// An `Idempotency-Key` of `POST /transfers/batch`: an id of 1–124 characters (so that
    /// `<key>:<index>` is an id), bare or as a quoted Structured Field string.
    pub struct BatchIdempotencyKey(TransferId) {
        pattern: bare_or_quoted(&id_pattern(MAX_BATCH_KEY_LEN)),
        example: "batch-7",
    }
}

/// `pattern`, bare or between double quotes (a Structured Field string), anchored.
fn bare_or_quoted(pattern: &str) -> String {
    format!(r#"^(?:{pattern}|"{pattern}")$"#)
}

/// The `Idempotency-Key` of a request, if it has one, checked to be a valid id of at most
/// `max_len` characters (`what_for` ends the 422's detail: what the key becomes).
fn key(
    headers: &HeaderMap,
    max_len: usize,
    what_for: &str,
) -> Result<Option<TransferId>, ApiError> {
    let mut values = headers.get_all(HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::Invalid(
            "the Idempotency-Key header is given more than once".into(),
        ));
    }
    let text = value.to_str().unwrap_or_default();
    let unquoted = match text.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"').unwrap_or(text),
        None => text,
    };
    match TransferId::parse(unquoted.to_owned()).filter(|_| unquoted.len() <= max_len) {
        Some(id) => Ok(Some(id)),
        None => Err(ApiError::Invalid(format!(
            "the Idempotency-Key header must be 1–{max_len} characters of A-Z a-z 0-9 . _ : - \
             (not . or ..), bare or quoted (\"key\"): {what_for}"
        ))),
    }
}

/// The key of `POST /transfers`: a valid id.
pub fn transfer_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let key = key(
        headers,
        MAX_KEY_LEN,
        "without an `id` in the body it is the transfer's id",
    )?;
    Ok(key.map(IdempotencyKey))
}

/// The key of `POST /transfers/batch`: a valid id of at most [`MAX_BATCH_KEY_LEN`].
pub fn batch_key(headers: &HeaderMap) -> Result<Option<BatchIdempotencyKey>, ApiError> {
    let key = key(
        headers,
        MAX_BATCH_KEY_LEN,
        "item i without an `id` gets the id `<key>:<i>`",
    )?;
    Ok(key.map(BatchIdempotencyKey))
}

/// A single transfer's id and its key name the same transfer, or the request is a 422.
pub fn check_same(id: &str, key: &str) -> Result<(), ApiError> {
    if id == key {
        Ok(())
    } else {
        Err(ApiError::Invalid(format!(
            "`id` ({id}) and the Idempotency-Key header ({key}) differ; the key is the \
             transfer's id: send one of them, or the same in both"
        )))
    }
}

/// The id of item `index` of a batch sent with `key`, when the item has none: a key of at
/// most [`MAX_BATCH_KEY_LEN`] characters and an index below 1,000 ([`super::batch::MAX_BATCH`])
/// make an id.
pub fn item_id(key: &BatchIdempotencyKey, index: usize) -> TransferId {
    TransferId::parse(format!("{}:{index}", key.as_str()))
        .expect("a batch key and an item's index make an id")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(HEADER, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_key_is_bare_or_a_structured_field_string() {
        assert_eq!(transfer_key(&HeaderMap::new()).unwrap(), None);
        for (value, key) in [
            ("t-1", "t-1"),
            ("\"t-1\"", "t-1"),
            (
                "018f3a5c-7d2e-7c3a-9b1e-5f6a7b8c9d0e",
                "018f3a5c-7d2e-7c3a-9b1e-5f6a7b8c9d0e",
            ),
            ("a.b:c_d", "a.b:c_d"),
        ] {
            assert_eq!(
                transfer_key(&headers(&[value])).unwrap().unwrap().as_str(),
                key
            );
        }
    }

    #[test]
    fn a_key_that_is_not_an_id_is_refused_saying_why() {
        for value in [
            "",
            "\"\"",
            "\"",
            ".",
            "..",
            "\"..\"",
            "a b",
            "a/b",
            "\"a",
            "a\"",
            "\"a\\\"b\"",
            "é",
        ] {
            let Ok(value) = HeaderValue::from_str(value) else {
                continue;
            };
            let mut map = HeaderMap::new();
            map.insert(HEADER, value.clone());
            match transfer_key(&map) {
                Err(ApiError::Invalid(detail)) => {
                    assert!(detail.contains("transfer's id"), "{detail}")
                }
                other => panic!("{value:?}: {other:?}"),
            }
        }
        let long = "k".repeat(129);
        assert!(transfer_key(&headers(&[&long])).is_err());
        assert!(transfer_key(&headers(&[&long[..128]])).is_ok());
        assert!(transfer_key(&headers(&["a", "a"])).is_err());
    }

    #[test]
    fn a_batch_key_leaves_room_for_the_item_index() {
        assert_eq!(MAX_BATCH_KEY_LEN, 124);
        let longest = "k".repeat(MAX_BATCH_KEY_LEN);
        let key = batch_key(&headers(&[&longest])).unwrap().unwrap();
        assert_eq!(item_id(&key, 999).len(), MAX_KEY_LEN);
        assert!(batch_key(&headers(&[&"k".repeat(125)])).is_err());
        let key = BatchIdempotencyKey(TransferId::parse("b-7".into()).unwrap());
        assert_eq!(item_id(&key, 0).as_str(), "b-7:0");
    }
}
