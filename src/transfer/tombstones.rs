//! The settled ids an account remembers (its tombstones, `docs/design.md §9`), in a compact
//! form: every account write carries them, so their cost per write is what a hot account pays.
//!
//! Stored as `"settled": {"ids": "t1 t2 t3", "at": [1764000000000, 1764000000004, ...]}`:
//! the ids in one string, separated by single spaces (no valid id contains a space), and the
//! epoch milliseconds each was settled at, in the same order, oldest settlement first. A
//! hundred tombstones then encode and decode as one string and an array of integers instead
//! of a hundred objects; a membership test is a scan of one string.
//!
//! Documents written before this form carry `settled_transactions: [{"id", "at"}, ...]`;
//! [`Tombstones::from_legacy`] reads them, and the next write of the account stores the
//! compact form.

use serde::{Deserialize, Serialize};

use super::model::Settled;
use super::validated::valid_id;

/// Recently settled transfer ids, oldest settlement first, each with its time.
///
/// Invariant (checked when decoded, kept by every method): `at` has one entry per id, and
/// every id is a valid id (so none is empty or holds a space).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "StoredTombstones")]
pub struct Tombstones {
    ids: String,
    at: Vec<i64>,
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
        self.ids().any(|id| id == transfer_id)
    }

    /// Remembers `transfer_id` as settled at `at_millis` (the newest).
    pub fn push(&mut self, transfer_id: &str, at_millis: i64) {
        debug_assert!(valid_id(transfer_id), "{transfer_id:?} is not a valid id");
        if !self.ids.is_empty() {
            self.ids.push(' ');
        }
        self.ids.push_str(transfer_id);
        self.at.push(at_millis);
    }

    /// Keeps the tombstones for which `keep(position, at_millis)` holds (positions count
    /// from 0, the oldest).
    pub fn retain(&mut self, mut keep: impl FnMut(usize, i64) -> bool) {
        let kept: Vec<bool> = self
            .times()
            .enumerate()
            .map(|(i, at)| keep(i, at))
            .collect();
        if kept.iter().all(|&k| k) {
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
    fn retain_keeps_what_the_predicate_keeps_in_order() {
        let mut t = of(&[("a", 1), ("b", 2), ("c", 3), ("d", 4)]);
        t.retain(|i, at| i == 0 || at >= 3);
        assert_eq!(t, of(&[("a", 1), ("c", 3), ("d", 4)]));
        t.retain(|_, _| false);
        assert_eq!(t, Tombstones::default());
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
