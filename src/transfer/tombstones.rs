//! The settled ids an account remembers (its tombstones), as versions before marks wrote
//! them (`docs/design.md §9`, "The fence"). This version writes none: it reads them, refuses
//! an apply of an id among them, and drops each once `SETTLED_RETENTION` old, so an
//! account's document sheds them on its first write after that. Until then every account
//! write carries them, so their encoding is kept as it was read.
//!
//! Stored as `"settled": {"ids": "t1 t2 t3", "at": [1764000000000, 1764000000004, ...]}`:
//! the ids in one string, separated by single spaces (no valid id contains a space), and the
//! epoch milliseconds each was settled at, in the same order, oldest settlement first. A
//! membership test is a search of one string.
//!
//! Documents written before this form carry `settled_transactions: [{"id", "at"}, ...]`;
//! [`Tombstones::from_legacy`] reads them, and the next write of the account stores the
//! compact form.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

use super::model::Settled;
use super::validated::valid_id;

/// Recently settled transfer ids, oldest settlement first, each with its time.
///
/// Invariant (checked when decoded, kept by every method): `at` has one entry per id, and
/// every id is a valid id (so none is empty or holds a space). `encoded`, once made, is the
/// stored form of `ids` and `at` as they are: every method that changes them forgets it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(try_from = "StoredTombstones")]
pub struct Tombstones {
    ids: String,
    at: Vec<i64>,
    #[serde(skip)]
    encoded: OnceLock<Arc<RawJson>>,
}

/// An encoding, shared by the copies of the tombstones it encodes.
type RawJson = Box<RawValue>;

impl PartialEq for Tombstones {
    fn eq(&self, other: &Self) -> bool {
        self.ids == other.ids && self.at == other.at
    }
}

impl Eq for Tombstones {}

/// The stored form, as it is written.
#[derive(Serialize)]
struct StoredForm<'a> {
    ids: &'a str,
    at: &'a [i64],
}

impl Serialize for Tombstones {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let encoded = match self.encoded.get() {
            Some(encoded) => encoded,
            None => {
                let stored = StoredForm {
                    ids: &self.ids,
                    at: &self.at,
                };
                // Serialized by serde_json and wrapped as it is (`to_raw_value` does not parse
                // it again). Should that ever fail, the stored form is written directly.
                let Ok(raw) = serde_json::value::to_raw_value(&stored) else {
                    return stored.serialize(serializer);
                };
                self.encoded.get_or_init(|| Arc::new(raw))
            }
        };
        encoded.serialize(serializer)
    }
}

/// The stored form, before its invariant is checked.
#[derive(Deserialize)]
struct StoredTombstones {
    #[serde(default)]
    ids: String,
    #[serde(default)]
    at: Vec<i64>,
}

impl TryFrom<StoredTombstones> for Tombstones {
    type Error = String;

    fn try_from(stored: StoredTombstones) -> Result<Self, String> {
        let tombstones = Tombstones {
            ids: stored.ids,
            at: stored.at,
            encoded: OnceLock::new(),
        };
        let ids = tombstones.ids().count();
        if ids != tombstones.at.len() {
            return Err(format!(
                "settled: {ids} ids but {} times",
                tombstones.at.len()
            ));
        }
        if let Some(bad) = tombstones.ids().find(|id| !valid_id(id)) {
            return Err(format!("settled: invalid id {bad:?}"));
        }
        Ok(tombstones)
    }
}

impl Tombstones {
    /// The tombstones of a document in the form older versions wrote.
    pub fn from_legacy(settled: &[Settled]) -> Self {
        let mut tombstones = Tombstones::default();
        for s in settled {
            tombstones.push(&s.id, s.at);
        }
        tombstones
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// The ids, oldest settlement first.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        (!self.ids.is_empty())
            .then(|| self.ids.split(' '))
            .into_iter()
            .flatten()
    }

    /// When each was settled, in the order of [`Tombstones::ids`].
    pub fn times(&self) -> impl Iterator<Item = i64> + '_ {
        self.at.iter().copied()
    }

    pub fn contains(&self, transfer_id: &str) -> bool {
        // No stored id is empty or holds a space (a text that does would match across ids).
        if transfer_id.is_empty() || transfer_id.contains(' ') {
            return false;
        }
        // Each occurrence of the id's text is an id of its own only between spaces (or the
        // string's ends): `t1` also occurs in `t10` and `at1`.
        let ids = self.ids.as_bytes();
        memchr::memmem::find_iter(ids, transfer_id.as_bytes()).any(|start| {
            let end = start + transfer_id.len();
            (start == 0 || ids[start - 1] == b' ') && (end == ids.len() || ids[end] == b' ')
        })
    }

    /// Remembers `transfer_id` as settled at `at_millis` (the newest).
    pub fn push(&mut self, transfer_id: &str, at_millis: i64) {
        debug_assert!(valid_id(transfer_id), "{transfer_id:?} is not a valid id");
        if !self.ids.is_empty() {
            self.ids.push(' ');
        }
        self.ids.push_str(transfer_id);
        self.at.push(at_millis);
        self.encoded = OnceLock::new();
    }

    /// Keeps the tombstones for which `keep(position, at_millis)` holds (positions count
    /// from 0, the oldest).
    pub fn retain(&mut self, mut keep: impl FnMut(usize, i64) -> bool) {
        let kept: Vec<bool> = self
            .times()
            .enumerate()
            .map(|(i, at)| keep(i, at))
            .collect();
        let dropped = kept.iter().take_while(|&&k| !k).count();
        if kept[dropped..].iter().all(|&k| k) {
            // The usual case: none, or the oldest few (an account pruned as it settles).
            self.drop_oldest(dropped);
            return;
        }
        let mut ids = String::with_capacity(self.ids.len());
        let mut at = Vec::with_capacity(self.at.len());
        for ((id, time), keep) in self.ids().zip(self.times()).zip(kept) {
            if keep {
                if !ids.is_empty() {
                    ids.push(' ');
                }
                ids.push_str(id);
                at.push(time);
            }
        }
        self.ids = ids;
        self.at = at;
        self.encoded = OnceLock::new();
    }

    /// Forgets the `count` oldest, in place (what pruning an account as it settles does: a
    /// rebuild of a hundred ids took 1.8 µs, this a move of the bytes that stay).
    fn drop_oldest(&mut self, count: usize) {
        if count == 0 {
            return;
        }
        if count >= self.at.len() {
            self.ids.clear();
            self.at.clear();
        } else {
            // Up to and with the space after the `count`-th id (no id holds a space).
            let cut = memchr::memchr_iter(b' ', self.ids.as_bytes())
                .nth(count - 1)
                .map_or(self.ids.len(), |space| space + 1);
            self.ids.drain(..cut);
            self.at.drain(..count);
        }
        self.encoded = OnceLock::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(entries: &[(&str, i64)]) -> Tombstones {
        let mut t = Tombstones::default();
        for (id, at) in entries {
            t.push(id, *at);
        }
        t
    }

    #[test]
    fn ids_are_remembered_in_order_with_their_times() {
        let t = of(&[("t1", 10), ("t2", 20)]);
        assert_eq!(t.ids().collect::<Vec<_>>(), ["t1", "t2"]);
        assert_eq!(t.times().collect::<Vec<_>>(), [10, 20]);
        assert!(t.contains("t2") && !t.contains("t") && !t.contains("t1 t2"));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn they_are_stored_as_one_string_and_one_array_and_read_back() {
        let t = of(&[("t1", 10), ("t2", 20)]);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, r#"{"ids":"t1 t2","at":[10,20]}"#);
        assert_eq!(serde_json::from_str::<Tombstones>(&json).unwrap(), t);
        let empty = serde_json::from_str::<Tombstones>("{}").unwrap();
        assert!(empty.is_empty() && empty.ids().next().is_none());
    }

    #[test]
    fn a_stored_form_that_breaks_the_invariant_does_not_decode() {
        for bad in [
            r#"{"ids":"t1 t2","at":[1]}"#,
            r#"{"ids":"t1","at":[1,2]}"#,
            r#"{"ids":"t1  t2","at":[1,2]}"#,
            r#"{"ids":"t/1","at":[1]}"#,
        ] {
            assert!(serde_json::from_str::<Tombstones>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_encoding_is_made_again_after_every_change_and_shared_by_copies() {
        let mut t = of(&[("a", 1)]);
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"ids":"a","at":[1]}"#
        );
        let copy = t.clone();
        assert!(copy.encoded.get().is_some(), "a copy shares the encoding");
        t.push("b", 2);
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"ids":"a b","at":[1,2]}"#
        );
        assert_eq!(
            serde_json::to_string(&copy).unwrap(),
            r#"{"ids":"a","at":[1]}"#
        );
        t.retain(|i, _| i > 0);
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"ids":"b","at":[2]}"#
        );
        t.retain(|_, _| true);
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"ids":"b","at":[2]}"#
        );
        assert_eq!(
            serde_json::to_string(&Tombstones::default()).unwrap(),
            r#"{"ids":"","at":[]}"#
        );
    }

    #[test]
    fn contains_matches_whole_ids_only() {
        let t = of(&[("t1", 1), ("at10", 2), ("t10", 3), ("x.t1", 4)]);
        for id in ["t1", "at10", "t10", "x.t1"] {
            assert!(t.contains(id), "{id}");
        }
        for id in [
            "t", "1", "at1", "t0", "10", "x", "x.t", "t1 at10", "t10 x.t1",
        ] {
            assert!(!t.contains(id), "{id}");
        }
        assert!(!Tombstones::default().contains("t1"));
    }

    #[test]
    fn retain_keeps_what_the_predicate_keeps_in_order() {
        let mut t = of(&[("a", 1), ("b", 2), ("c", 3), ("d", 4)]);
        t.retain(|i, at| i == 0 || at >= 3);
        assert_eq!(t, of(&[("a", 1), ("c", 3), ("d", 4)]));
        t.retain(|_, _| false);
        assert_eq!(t, Tombstones::default());
    }

    #[test]
    fn dropping_the_oldest_leaves_the_newest_in_order_whatever_the_count() {
        let all = [("a", 1), ("bb", 2), ("ccc", 3), ("d", 4)];
        for dropped in 0..=all.len() {
            let mut t = of(&all);
            t.retain(|i, _| i >= dropped);
            assert_eq!(t, of(&all[dropped..]), "{dropped} dropped");
            assert_eq!(t.ids().count(), t.len(), "{dropped} dropped");
            t.push("e", 5);
            let mut expected = all[dropped..].to_vec();
            expected.push(("e", 5));
            assert_eq!(t, of(&expected), "{dropped} dropped, then one pushed");
            assert!(t.contains("e"));
            assert_eq!(t.contains("a"), dropped == 0, "{dropped} dropped");
        }
    }

    #[test]
    fn the_legacy_form_reads_as_the_same_tombstones() {
        let legacy = [
            Settled {
                id: "t1".into(),
                at: 5,
            },
            Settled {
                id: "t2".into(),
                at: 6,
            },
        ];
        assert_eq!(
            Tombstones::from_legacy(&legacy),
            of(&[("t1", 5), ("t2", 6)])
        );
    }

    #[test]
    fn an_account_written_in_the_legacy_form_decodes_with_its_tombstones_and_is_rewritten_compact()
    {
        use crate::store::Source;
        use crate::transfer::documents::decode_source;
        use crate::transfer::model::AccountDoc;
        let legacy = serde_json::json!({
            "account_id": "a", "balance": 5, "opening_balance": 5,
            "pending_transactions": [],
            "settled_transactions": [{"id": "t1", "at": 5}, {"id": "t2", "at": 6}],
            "creation_time": "2026-01-01T00:00:00.000Z",
            "modification_time": "2026-01-01T00:00:00.000Z",
        });
        let account: AccountDoc = decode_source(&Source::from(legacy)).unwrap();
        assert_eq!(account.settled, of(&[("t1", 5), ("t2", 6)]));
        assert!(account.legacy_settled.is_empty());
        let written = Source::encode(&account).unwrap().to_value().unwrap();
        assert_eq!(
            written["settled"],
            serde_json::json!({"ids": "t1 t2", "at": [5, 6]})
        );
        assert!(written.get("settled_transactions").is_none());
    }
}
