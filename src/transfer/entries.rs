//! Account statements (`docs/design.md §12`): every change of an account's balance is an
//! **entry**, numbered by the account (`seq` 1, 2, 3, ... with no gaps), stamped with a time
//! that never goes back on that account, and carrying the balance it left.
//!
//! # Where an entry lives, and why no write is added for it
//! The account's own conditional write makes the entry (it knows the balance after), and the
//! entry rides on writes the protocol makes anyway:
//! - **in the account document** from the write that makes it: an apply's entry beside its
//!   pending entry (`pending_entries`); any other (a settle's give-back, an undo, a late apply
//!   given back) in `unfiled`;
//! - **filed in a transfer document** (`entries`, indexed by `<account>/<seq>`) by the
//!   transfer's next state write: a worker copies what each of its applies saw (its own entry
//!   and the account's `unfiled`) into the transfer it holds, so the commit, the park of a
//!   hold, or the rollback's `terminating` carries them;
//! - and **dropped from the account** only by a later write of that same transfer's settle or
//!   undo, which removes exactly what its transfer document filed (`filed`), a document
//!   already written.
//!
//! So an entry is at every moment in the account document, in a written transfer document,
//! or both: never nowhere. A statement reads both and keeps one of each `seq`
//! ([`merge`]). A transfer settled in one store transaction files its entries in the same
//! transaction and leaves none on the account.
//!
//! # Form
//! On the account: `<seq>/<at ms>/<amount>/<balance after>/<kind>` (`pending_entries`, one
//! per pending transfer, `""` when its apply changed nothing), and the same followed by
//! `/<transfer id>` (`unfiled`). Filed: `<account>/<seq as 20 digits>/<at>/<amount>/<after>/<kind>`,
//! followed by `/<transfer id>` when the entry is another transfer's (carried along). Ids never
//! contain `/`, and the 20-digit `seq` makes `<account>/<seq>` sort in `seq` order as text, so
//! a range of `seq` is a range of the indexed strings.

use std::fmt::Write as _;

use serde::Serialize;

use super::model::AccountDoc;

/// What moved the balance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A transfer's apply took units from the account.
    Debit,
    /// A transfer's apply put units on the account (spendable once it commits).
    Credit,
    /// A hold's apply: the whole amount reserved on the source, or credited (not spendable)
    /// on the destination.
    Hold,
    /// A hold's units given back: what its capture left (as the hold settles), or all of
    /// it (cancelled or expired).
    Release,
    /// An applied transfer taken back: it rolled back, or a late apply was given back.
    Reversal,
}

impl EntryKind {
    fn code(self) -> char {
        match self {
            EntryKind::Debit => 'd',
            EntryKind::Credit => 'c',
            EntryKind::Hold => 'h',
            EntryKind::Release => 'r',
            EntryKind::Reversal => 'v',
        }
    }

    fn from_code(code: &str) -> Option<Self> {
        Some(match code {
            "d" => EntryKind::Debit,
            "c" => EntryKind::Credit,
            "h" => EntryKind::Hold,
            "r" => EntryKind::Release,
            "v" => EntryKind::Reversal,
            _ => return None,
        })
    }

    /// The kind of an apply moving the balance by `amount`.
    pub fn of_apply(amount: i64, hold: bool) -> Self {
        match (hold, amount < 0) {
            (true, _) => EntryKind::Hold,
            (false, true) => EntryKind::Debit,
            (false, false) => EntryKind::Credit,
        }
    }

    /// The kind of an undo of an applied entry.
    pub fn of_undo(hold: bool) -> Self {
        if hold {
            EntryKind::Release
        } else {
            EntryKind::Reversal
        }
    }
}

/// One change of one account's balance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    /// Epoch milliseconds; never less than the account's previous entry's.
    pub at: i64,
    /// The change: negative for units taken off.
    pub amount: i64,
    pub balance_after: i64,
    pub kind: EntryKind,
    /// The transfer that made it (empty where the place it is kept says which).
    pub transfer_id: String,
}

impl Entry {
    /// `<seq>/<at>/<amount>/<after>/<kind>`: an apply's entry beside its pending entry.
    pub fn encode_pending(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            self.seq,
            self.at,
            self.amount,
            self.balance_after,
            self.kind.code()
        )
    }

    /// `<seq>/<at>/<amount>/<after>/<kind>/<transfer id>`: in the account's `unfiled`.
    pub fn encode_unfiled(&self) -> String {
        let mut text = self.encode_pending();
        let _ = write!(text, "/{}", self.transfer_id);
        text
    }

    /// As filed in transfer `filing_transfer`'s `entries`, for `account`.
    pub fn encode_filed(&self, account: &str, filing_transfer: &str) -> String {
        let mut text = crate::store::entries::bound(account, self.seq);
        text.push('/');
        let _ = write!(
            text,
            "{}/{}/{}/{}",
            self.at,
            self.amount,
            self.balance_after,
            self.kind.code()
        );
        if self.transfer_id != filing_transfer {
            let _ = write!(text, "/{}", self.transfer_id);
        }
        text
    }

    /// Reads `pending_entries`/`unfiled` text (`transfer_id` for the pending form, which does
    /// not name it). `None` for `""` or anything malformed.
    pub fn decode_kept(text: &str, transfer_id: &str) -> Option<Self> {
        let mut parts = text.split('/');
        let entry = Self::decode_fields(&mut parts, transfer_id)?;
        Some(match parts.next() {
            Some(id) if !id.is_empty() => Entry {
                transfer_id: id.to_owned(),
                ..entry
            },
            _ => entry,
        })
    }

    /// Reads one value of a transfer's `entries`: the account and the entry (`filing_transfer`
    /// where it names no other).
    pub fn decode_filed(text: &str, filing_transfer: &str) -> Option<(String, Self)> {
        let (account, rest) = text.split_once('/')?;
        Some((
            account.to_owned(),
            Self::decode_kept(rest, filing_transfer)?,
        ))
    }

    fn decode_fields<'a>(
        parts: &mut impl Iterator<Item = &'a str>,
        transfer_id: &str,
    ) -> Option<Self> {
        Some(Entry {
            seq: parts.next()?.parse().ok()?,
            at: parts.next()?.parse().ok()?,
            amount: parts.next()?.parse().ok()?,
            balance_after: parts.next()?.parse().ok()?,
            kind: EntryKind::from_code(parts.next()?)?,
            transfer_id: transfer_id.to_owned(),
        })
    }
}

/// The `seq`s of `account`'s entries among a transfer's filed `entries`.
pub fn filed_seqs(entries: &[String], account: &str) -> Vec<u64> {
    entries
        .iter()
        .filter_map(|text| {
            let rest = text.strip_prefix(account)?.strip_prefix('/')?;
            rest.split('/').next()?.parse().ok()
        })
        .collect()
}

/// Adds `more` to a transfer's filed `entries`, each `(account, seq)` once.
pub fn file(entries: &mut Vec<String>, more: impl IntoIterator<Item = String>) {
    for text in more {
        let key = filed_key_of(&text);
        if !entries.iter().any(|known| filed_key_of(known) == key) {
            entries.push(text);
        }
    }
}

/// `<account>/<seq>` of a filed value.
fn filed_key_of(text: &str) -> &str {
    let mut slashes = text.match_indices('/').map(|(i, _)| i);
    match (slashes.next(), slashes.next()) {
        (Some(_), Some(end)) => &text[..end],
        _ => text,
    }
}

/// What a transfer's next write files of an account its apply saw (`account` as the apply
/// left it): the apply's own entry and the account's unfiled ones, in the filed form.
pub fn to_file(account: &AccountDoc, transfer_id: &str) -> Vec<String> {
    let unfiled = account
        .unfiled
        .iter()
        .filter_map(|text| Entry::decode_kept(text, ""));
    account
        .pending_entry(transfer_id)
        .into_iter()
        .chain(unfiled)
        .map(|entry| entry.encode_filed(&account.account_id, transfer_id))
        .collect()
}

/// One account's entries from wherever they are kept, each `seq` once, in `seq` order.
pub fn merge(mut entries: Vec<Entry>) -> Vec<Entry> {
    entries.sort_by_key(|entry| entry.seq);
    entries.dedup_by_key(|entry| entry.seq);
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, transfer_id: &str) -> Entry {
        Entry {
            seq,
            at: 1_764_000_000_000,
            amount: -25,
            balance_after: 75,
            kind: EntryKind::Debit,
            transfer_id: transfer_id.to_owned(),
        }
    }

    #[test]
    fn each_form_reads_back_what_it_wrote() {
        let own = entry(7, "t-1");
        assert_eq!(
            Entry::decode_kept(&own.encode_pending(), "t-1"),
            Some(own.clone())
        );
        assert_eq!(
            Entry::decode_kept(&own.encode_unfiled(), "ignored"),
            Some(own.clone())
        );
        let filed = own.encode_filed("a:b", "t-1");
        assert_eq!(filed, "a:b/00000000000000000007/1764000000000/-25/75/d");
        assert_eq!(
            Entry::decode_filed(&filed, "t-1"),
            Some(("a:b".to_owned(), own.clone()))
        );
        let carried = own.encode_filed("a", "t-2");
        assert_eq!(
            Entry::decode_filed(&carried, "t-2"),
            Some(("a".to_owned(), own))
        );
        assert_eq!(Entry::decode_kept("", "t-1"), None);
        assert_eq!(Entry::decode_kept("1/2/3/4/x", "t-1"), None);
    }

    #[test]
    fn filing_keeps_each_account_and_seq_once() {
        let mut filed = vec![entry(1, "t").encode_filed("a", "t")];
        file(
            &mut filed,
            [
                entry(1, "t").encode_filed("a", "t"),
                entry(1, "t").encode_filed("b", "t"),
                entry(2, "u").encode_filed("a", "t"),
            ],
        );
        assert_eq!(filed.len(), 3);
        assert_eq!(filed_seqs(&filed, "a"), vec![1, 2]);
        assert_eq!(filed_seqs(&filed, "b"), vec![1]);
        assert!(filed_seqs(&filed, "a.").is_empty());
    }
}
