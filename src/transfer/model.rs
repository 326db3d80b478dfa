//! The documents of the protocol, with the post's field names (`docs/design.md §2`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::entries::{Entry, EntryKind};
use crate::time::Timestamp;

pub use super::tombstones::Tombstones;

mod stored_transfer;

/// The state of a transfer. A background worker moves it along
/// `created → pending → committed → finished`, or rolls it back along
/// `created → rolled-back` or `pending → terminating → rolled-back`.
///
/// - `created`: accepted; no account has changed yet.
/// - `pending`: being applied to the two accounts (units received are not spendable yet).
/// - `committed`: both balances have changed; it will finish, and can no longer be
///   cancelled or rolled back.
/// - `finished` (final): done; the units have moved and both accounts are settled.
/// - `terminating`: rolling back; what was applied to the accounts is being undone.
/// - `rolled-back` (final): no unit moved; `reason` says why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TransferState {
    Created,
    Pending,
    Committed,
    Finished,
    Terminating,
    RolledBack,
}

impl TransferState {
    pub const ALL: [TransferState; 6] = [
        TransferState::Created,
        TransferState::Pending,
        TransferState::Committed,
        TransferState::Finished,
        TransferState::Terminating,
        TransferState::RolledBack,
    ];

    /// States recovery must drive on (the post's recovery query).
    pub const IN_FLIGHT: [TransferState; 4] = [
        TransferState::Created,
        TransferState::Pending,
        TransferState::Committed,
        TransferState::Terminating,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TransferState::Created => "created",
            TransferState::Pending => "pending",
            TransferState::Committed => "committed",
            TransferState::Finished => "finished",
            TransferState::Terminating => "terminating",
            TransferState::RolledBack => "rolled-back",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, TransferState::Finished | TransferState::RolledBack)
    }

    /// The arrows of the state machine; every state write is checked against them.
    pub fn can_move_to(self, next: TransferState) -> bool {
        use TransferState::*;
        matches!(
            (self, next),
            (Created, Pending)
                | (Pending, Committed)
                | (Committed, Finished)
                | (Created, RolledBack)
                | (Pending, Terminating)
                | (Terminating, RolledBack)
        )
    }
}

impl fmt::Display for TransferState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TransferState {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        TransferState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or(())
    }
}

/// Why a transfer rolled back.
///
/// - `insufficient_funds`: the source balance would have gone below its floor;
/// - `account_not_found`: the source or the destination account does not exist;
/// - `balance_overflow`: a balance would have overflowed a signed 64-bit integer;
/// - `cancelled`: a client cancelled it (`POST /transfers/{id}/cancel`);
/// - `timed_out`: it had not committed after the service's transfer timeout;
/// - `account_busy`: an account was settling more transfers than it can remember; retry;
/// - `expired`: a hold that was neither captured nor cancelled before `hold_expires_at`.
/// - `currency_mismatch`: the accounts do not share one currency, or not the transfer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RollbackReason {
    /// The source balance would have gone below its floor.
    InsufficientFunds,
    /// The source or the destination account does not exist.
    AccountNotFound,
    /// A balance would have overflowed a signed 64-bit integer.
    BalanceOverflow,
    /// The client cancelled it (`POST /transfers/{id}/cancel`).
    Cancelled,
    /// It had not committed after `TRANSFER_TIMEOUT`.
    TimedOut,
    /// An account was settling more transfers than it can remember (`SETTLED_MAX` within
    /// `SETTLED_RETENTION`); the apply backed off and then gave up. Retry later.
    AccountBusy,
    /// A hold was neither captured nor cancelled before its `hold_expires_at`.
    Expired,
    /// The two accounts do not have the same currency (or one has none and the other one),
    /// or the transfer states a currency an account does not have.
    CurrencyMismatch,
}

impl RollbackReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RollbackReason::InsufficientFunds => "insufficient_funds",
            RollbackReason::AccountNotFound => "account_not_found",
            RollbackReason::BalanceOverflow => "balance_overflow",
            RollbackReason::Cancelled => "cancelled",
            RollbackReason::TimedOut => "timed_out",
            RollbackReason::AccountBusy => "account_busy",
            RollbackReason::Expired => "expired",
            RollbackReason::CurrencyMismatch => "currency_mismatch",
        }
    }
}

/// `transactions/{id}`. The id itself is the document id; `transaction_id` repeats it for
/// sorting (Elasticsearch 8 cannot sort on `_id`).
///
/// Typed: a one-leg transfer and a multi-leg transaction are told apart by [`Legs`], times are
/// [`Timestamp`]s. The stored JSON is a private wire form (`stored_transfer`) with the fields
/// every version reads, byte for byte as before the types: `src_acct`, `dest_acct`, `amount`,
/// `legs` and `accounts` for the legs, RFC 3339 text for the times; an optional field is
/// written only when set (or non-empty). A document whose fields contradict the shape (legs
/// beside `src_acct`) or whose time does not parse is refused as it is read.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "stored_transfer::StoredTransfer")]
pub struct TransferDoc {
    pub transaction_id: String,
    /// What it moves, between which accounts: one leg, or several applied together.
    pub legs: Legs,
    pub transaction_state: TransferState,
    pub reason: Option<RollbackReason>,
    /// When it was accepted (stored as RFC 3339 UTC text, millisecond precision, like every
    /// [`Timestamp`]).
    pub creation_time: Timestamp,
    /// When it was last written; recovery treats a transfer untouched for
    /// `RECOVERY_STALE_AFTER` as stale.
    pub modification_time: Timestamp,
    /// The worker that may act on this transfer until `lease_expires_at` (the lock owner of
    /// the Kestra lock post; see `docs/design.md §9`). Written only by
    /// [`crate::transfer::lease`]. `None` once the transfer is terminal or its owner released
    /// it.
    pub lease_owner: Option<String>,
    /// Until when `lease_owner` may act on it (on the writers' wall clocks, give or take the
    /// skew margin).
    pub lease_expires_at: Option<Timestamp>,
    /// Why a person must look at this transfer: its documents contradict each other (for
    /// example `pending` while an account already holds its settled tombstone, which only a
    /// lost acknowledged write can cause). Such a transfer is left exactly as it is: no
    /// worker, recovery, timeout or cancel acts on it (`docs/design.md §9` gives the manual
    /// procedure).
    pub attention: Option<String>,
    /// The account whose apply was refused, with `reason` (`insufficient_funds`,
    /// `account_not_found`, `balance_overflow`, `account_busy`, `currency_mismatch`): which
    /// account, and so which legs, caused the rollback. Absent otherwise.
    pub failed_account: Option<String>,
    /// Present on a hold only (`"hold": true` at creation): when it rolls back with
    /// `expired` unless captured or cancelled first. A hold is driven to
    /// `pending` (both accounts applied, the credit not spendable) and waits there, parked
    /// ([`crate::transfer::lease`]), instead of committing; `TRANSFER_TIMEOUT` does not apply
    /// to it (`docs/design.md §3`, "Holds").
    pub hold_expires_at: Option<Timestamp>,
    /// A hold's capture: the units that move (0 < n ≤ [`TransferDoc::amount`]); the rest goes back to the
    /// source when the accounts settle (core 5/6). Written once, before `committed`, and
    /// never changed after: every settle step reads the same value.
    pub captured_amount: Option<i64>,
    /// The currency the client stated ([`valid_currency`]); every account must have it.
    /// Absent: the accounts must merely share one (or all have none).
    pub currency: Option<String>,
    /// The client's labels ([`valid_metadata`]); empty (and not written) for most transfers.
    pub metadata: Metadata,
    /// The outbox of the change feed: every transition after `created`, written in the same
    /// conditional write as the transition itself (`docs/design.md §11`). A compact string,
    /// `<code><epoch ms>` per transition, space-separated ([`history`] has the codes);
    /// appended only by [`TransferDoc::note_transitions`], which `src/transfer/lease.rs`
    /// calls before every transfer write. Empty (and not written) while `created`.
    pub history: String,
    /// A token unique to the request that created the transfer in one store transaction
    /// (`docs/design.md §3`, "In one transaction"): a create whose answer was lost finds its
    /// own token on the retry and answers `201`, not a replay's `200`. Absent on transfers
    /// created otherwise (the lease owner's token serves them).
    pub created_by: Option<String>,
    /// Which terminal write of which instance this is, `<instance>/<n>` (numbered by
    /// [`crate::transfer::lease`], 1, 2, ... in each process): the webhooks' fast path of
    /// that instance records by these numbers which of its writes it delivered, so that the
    /// instance reading the feed for a receiver does not deliver them again (`docs/design.md
    /// §11`). Absent before the transfer is terminal, and when it was settled in one store
    /// transaction.
    pub settled_by: Option<String>,
    /// The marks of the pending entries the commit was decided on, one per account in the
    /// order of [`TransferDoc::postings`] (`AccountDoc::pending_marks`): written with
    /// `committed`, read by each settle to tell that entry from a late apply. Empty (and not
    /// written) before the commit, and on a transfer committed before marks, whose settles
    /// take whatever entry they find.
    pub applied_marks: Vec<String>,
    /// The W3C `traceparent` of the request that created the transfer, when traces are
    /// exported (`crate::trace_context`): the spans of its worker, of recovery and of its
    /// webhook deliveries, in any instance and after any restart, are children of it. Written
    /// by the create and kept by every later write; not compared by a replay. Absent (and not
    /// written) when tracing is off; an older version that rewrites the document drops it,
    /// which costs the trace its later spans, nothing else.
    pub traceparent: Option<String>,
    /// Account entries filed here (`<account>/<seq>/...`, [`super::entries`]): this
    /// transfer's, and others' it carried from its accounts' `unfiled`; indexed by their
    /// `<account>/<seq>` start, which is what a statement finds them by. Added by the writes
    /// after the applies (commit, park, `terminating`), or all at once by a transfer settled
    /// in one transaction; never removed. Empty (and not written) before then.
    pub entries: Vec<String>,
}

/// What a transfer moves: one leg, or several applied together (`docs/design.md §3`,
/// "Multi-leg transactions"). Stored as `src_acct`, `dest_acct` and `amount` for one leg,
/// exactly as before legs existed, and as `amount`, `legs` and `accounts` for several: never
/// both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Legs {
    /// A one-leg transfer: `amount` units from `from` to `to`.
    OneLeg(Leg),
    /// A multi-leg transaction: 2 to [`MAX_LEGS`] legs, all applied or none.
    MultiLeg {
        legs: Vec<Leg>,
        /// Every account the legs touch, once each, in the order of [`TransferDoc::postings`]:
        /// what the listing by account finds it by.
        accounts: Vec<String>,
        /// The sum of the legs' amounts (at most 2^63−1, so every account's net change fits
        /// too).
        amount: i64,
    },
}

impl Legs {
    /// A multi-leg transaction of `legs`, `amount` in all (their sum), listing the accounts
    /// they touch in the order they first appear (`from` before `to`): the postings' order.
    pub fn multi_leg(legs: Vec<Leg>, amount: i64) -> Self {
        let mut accounts: Vec<String> = Vec::with_capacity(legs.len() + 1);
        for account in legs.iter().flat_map(|leg| [&leg.from, &leg.to]) {
            if !accounts.contains(account) {
                accounts.push(account.clone());
            }
        }
        Legs::MultiLeg {
            legs,
            accounts,
            amount,
        }
    }
}

/// For `skip_serializing_if` on counters that start at zero.
fn is_zero<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// `lease_owner` of a parked hold (`crate::transfer::lease::PARKED`): the hold owns its own
/// lease while it waits for its capture. The stored token every version writes and reads, so
/// it stays as it is.
pub const PARKED_OWNER: &str = "hold";

/// One leg of a multi-leg transaction: `amount` units from `from` to `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Leg {
    /// Source account id (1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`).
    #[schema(value_type = super::validated::AccountId)]
    pub from: String,
    /// Destination account id (same rules); must differ from `from`.
    #[schema(value_type = super::validated::AccountId)]
    pub to: String,
    /// Units this leg moves: an integer from 1 to 2^63-1.
    #[schema(minimum = 1)]
    pub amount: i64,
}

/// What a transfer does to one of its accounts: its net change over all legs, as a
/// direction and a magnitude. One pending entry per account per transfer carries it, so an
/// account in several legs is applied, settled and undone once, and its floor is checked on
/// its net debit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Posting<'a> {
    pub account: &'a str,
    /// `Source` for a net debit, `Destination` for a net credit (or no net change).
    pub side: super::protocol::Side,
    /// The magnitude of the net change (0 when the account's legs cancel out).
    pub amount: i64,
    /// What stays when the transfer settles: `amount`, or a partly captured one-leg hold's
    /// captured amount.
    pub settle_amount: i64,
}

impl TransferDoc {
    /// A new one-leg transfer of `amount` from `from` to `to`, `created` at `time`, nothing
    /// else set. Give the rest with struct update syntax
    /// (`TransferDoc { currency, ..TransferDoc::created(..) }`).
    pub fn created(id: &str, from: &str, to: &str, amount: i64, time: Timestamp) -> Self {
        let leg = Leg {
            from: from.to_owned(),
            to: to.to_owned(),
            amount,
        };
        Self::created_moving(id, Legs::OneLeg(leg), time)
    }

    /// A new transfer of `legs`, `created` at `time`, nothing else set: the one place its
    /// fields are listed.
    pub fn created_moving(id: &str, legs: Legs, time: Timestamp) -> Self {
        Self {
            transaction_id: id.to_owned(),
            legs,
            transaction_state: TransferState::Created,
            reason: None,
            creation_time: time,
            modification_time: time,
            lease_owner: None,
            lease_expires_at: None,
            attention: None,
            failed_account: None,
            hold_expires_at: None,
            captured_amount: None,
            currency: None,
            metadata: Metadata::default(),
            history: String::new(),
            created_by: None,
            settled_by: None,
            applied_marks: Vec::new(),
            traceparent: None,
            entries: Vec::new(),
        }
    }

    /// Whether this is a multi-leg transaction (else a one-leg transfer).
    pub fn is_multi_leg(&self) -> bool {
        matches!(self.legs, Legs::MultiLeg { .. })
    }

    /// The units it moves: a one-leg transfer's amount, the sum of a multi-leg one's legs.
    pub fn amount(&self) -> i64 {
        match &self.legs {
            Legs::OneLeg(leg) => leg.amount,
            Legs::MultiLeg { amount, .. } => *amount,
        }
    }

    /// The legs as the API shows them: the stored ones, or the one leg of a plain transfer.
    pub fn leg_list(&self) -> Vec<Leg> {
        match &self.legs {
            Legs::OneLeg(leg) => vec![leg.clone()],
            Legs::MultiLeg { legs, .. } => legs.clone(),
        }
    }

    /// What the transfer does to each account, once per account, in the order accounts
    /// first appear in its legs (`from` before `to`): for a one-leg transfer, the source then
    /// the destination. The first account's apply fixes the currency the others must have.
    pub fn postings(&self) -> Vec<Posting<'_>> {
        match &self.legs {
            Legs::OneLeg(leg) => {
                let settle = self.settle_amount();
                vec![
                    one_leg_posting(leg, super::protocol::Side::Source, settle),
                    one_leg_posting(leg, super::protocol::Side::Destination, settle),
                ]
            }
            Legs::MultiLeg { legs, .. } => net_postings(legs),
        }
    }

    /// The `index`-th of [`TransferDoc::postings`]; for a one-leg transfer without building
    /// the list (the hot path).
    pub fn posting(&self, index: usize) -> Option<Posting<'_>> {
        use super::protocol::Side;
        let Legs::OneLeg(leg) = &self.legs else {
            return self.postings().get(index).copied();
        };
        let side = match index {
            0 => Side::Source,
            1 => Side::Destination,
            _ => return None,
        };
        Some(one_leg_posting(leg, side, self.settle_amount()))
    }

    /// The posting of `account`, if the transfer touches it.
    pub fn posting_of(&self, account: &str) -> Option<Posting<'_>> {
        self.postings().into_iter().find(|p| p.account == account)
    }

    /// Whether this transfer is a hold (waits in `pending` for a capture).
    pub fn is_hold(&self) -> bool {
        self.hold_expires_at.is_some()
    }

    /// The units that move when it commits: the captured amount of a hold, else `amount`.
    pub fn settle_amount(&self) -> i64 {
        self.captured_amount.unwrap_or(self.amount())
    }
}

/// The posting of a one-leg transfer's `side`: its account, the leg's amount, and `settle`
/// staying when it settles.
fn one_leg_posting(leg: &Leg, side: super::protocol::Side, settle: i64) -> Posting<'_> {
    use super::protocol::Side;
    let account = match side {
        Side::Source => &leg.from,
        Side::Destination => &leg.to,
    };
    Posting {
        account,
        side,
        amount: leg.amount,
        settle_amount: settle,
    }
}

/// The postings of a multi-leg transaction: each account's net change over all `legs`, in
/// the order accounts first appear. A multi-leg transaction is captured whole, so each
/// settles its whole amount.
fn net_postings(legs: &[Leg]) -> Vec<Posting<'_>> {
    use super::protocol::Side;
    let mut nets: Vec<(&str, i128)> = Vec::with_capacity(legs.len() * 2);
    for leg in legs {
        for (account, delta) in [
            (leg.from.as_str(), -(leg.amount as i128)),
            (leg.to.as_str(), leg.amount as i128),
        ] {
            match nets.iter_mut().find(|(a, _)| *a == account) {
                Some((_, net)) => *net += delta,
                None => nets.push((account, delta)),
            }
        }
    }
    nets.into_iter()
        .map(|(account, net)| {
            // Within i64 for every transfer `check_legs` accepted; a document that breaks
            // it saturates (and the audit reports it).
            let amount = i64::try_from(net.unsigned_abs()).unwrap_or(i64::MAX);
            let side = if net < 0 {
                Side::Source
            } else {
                Side::Destination
            };
            Posting {
                account,
                side,
                amount,
                settle_amount: amount,
            }
        })
        .collect()
}

/// One settled transfer id remembered by an account, in the form versions before the compact
/// one ([`Tombstones`]) wrote (a tombstone, `docs/design.md §9`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settled {
    pub id: String,
    /// Epoch milliseconds when it was settled on this account.
    pub at: i64,
}

/// `accounts/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountDoc {
    /// The account id repeated in the source, so the auditor can page accounts in id order
    /// (Elasticsearch 8 cannot sort on `_id`).
    pub account_id: String,
    pub balance: i64,
    /// The lowest balance a debit may leave (0 unless the account says otherwise).
    #[serde(default)]
    pub floor: i64,
    /// The balance the account was opened with: what an identical `POST /accounts` replay is
    /// compared against.
    pub opening_balance: i64,
    /// A token unique to the request that created the account: when the answer to that
    /// create was lost and it is sent again, finding our own token tells a new account (201)
    /// from a replay of someone else's (200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// The account's currency ([`valid_currency`]), fixed when it is opened; absent for an
    /// account without one. Every transfer's accounts share one currency or all have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// The client's labels ([`valid_metadata`]), fixed at creation.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// Ids of transfers applied to this balance and not yet settled (the post's list).
    /// Changed only through [`AccountDoc::add_pending`] and [`AccountDoc::remove_pending`].
    #[serde(default)]
    pub pending_transactions: Vec<String>,
    /// When each entry of `pending_transactions` was applied (epoch milliseconds, in the same
    /// order), so the late-apply sweep looks only at entries older than a lease. Documents
    /// from before this field read as applied long ago (0): the sweep checks them first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_applied_at: Vec<i64>,
    /// Which apply made each entry of `pending_transactions` (in the same order): a mark
    /// unique to that one decision ([`crate::transfer::lease::Leases::new_mark`]). The
    /// commit records the marks it was decided on (`TransferDoc::applied_marks`), so a
    /// settle tells the entry the commit counted from a late apply of the same transfer
    /// made after an earlier settle, and takes the late one back (`docs/design.md §9`,
    /// "The fence"). Entries from before marks read as `""`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_marks: Vec<String>,
    /// Sum of the credits among `pending_transactions`. Credits are not spendable until they
    /// commit, so rolling one back can never push the balance below the floor.
    #[serde(default)]
    pub pending_credits: i64,
    /// Sum of the debits among `pending_transactions`. Any of them may be undone, so a credit
    /// must leave room for all of them: undoing a debit can then never overflow.
    #[serde(default)]
    pub pending_debits: i64,
    /// Settled transfer ids (tombstones) that versions before marks wrote: an apply of one of
    /// these is refused until it ages out (`SETTLED_RETENTION`). This version writes none
    /// (`docs/design.md §9`, "The fence"), so the field leaves an account's document with
    /// the last of them.
    #[serde(default, skip_serializing_if = "Tombstones::is_empty")]
    pub settled: Tombstones,
    /// Tombstones as versions before the compact form wrote them; read, folded into
    /// `settled` by [`AccountDoc::upgrade`] as the document is decoded, never written.
    #[serde(default, rename = "settled_transactions", skip_serializing)]
    pub legacy_settled: Vec<Settled>,
    /// The `seq` of the statement's first entry ([`super::entries`]): 1 for an account opened
    /// by a version with statements; 0 on one opened before them, or rewritten since by such
    /// a version (which drops the field), where the next entry starts a new statement.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub entry_from: u64,
    /// The `seq` of the account's last entry (a change of its balance, [`super::entries`]);
    /// `entry_from − 1` before the first. Written only by [`AccountDoc::record_entry`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub entry_seq: u64,
    /// When the last entry was made (epoch milliseconds): the next is never stamped earlier,
    /// whatever the clock of the instance that makes it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub entry_at: i64,
    /// The entry each apply of `pending_transactions` made (same order), kept until its
    /// transfer has filed it (`""`: the apply changed nothing, or predates statements).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_entries: Vec<String>,
    /// Entries no transfer document is known to have filed yet: a settle's give-back, an
    /// undo, a late apply given back ([`super::entries`] says who files and who drops them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unfiled: Vec<String>,
    pub creation_time: String,
    pub modification_time: String,
}

impl AccountDoc {
    /// Brings a document written by an older version to the current form (the typed
    /// document I/O calls it on every decode).
    pub fn upgrade(&mut self) {
        if !self.legacy_settled.is_empty() {
            let mut settled = Tombstones::from_legacy(&self.legacy_settled);
            for (id, at) in self.settled.ids().zip(self.settled.times()) {
                settled.push(id, at);
            }
            self.settled = settled;
            self.legacy_settled.clear();
        }
    }

    /// Records `transfer_id` as applied (pending) at `at_millis` by the apply marked `mark`,
    /// with the entry the apply made, if it moved the balance.
    pub fn add_pending(
        &mut self,
        transfer_id: &str,
        at_millis: i64,
        mark: &str,
        entry: Option<&Entry>,
    ) {
        self.align_pending_times();
        self.pending_transactions.push(transfer_id.to_owned());
        self.pending_applied_at.push(at_millis);
        self.pending_marks.push(mark.to_owned());
        self.pending_entries
            .push(entry.map(Entry::encode_pending).unwrap_or_default());
    }

    /// The next entry of the account, made by the write that has just moved its balance by
    /// `amount` (so `balance` is the balance after): numbered one past the last, stamped no
    /// earlier than it.
    pub fn record_entry(
        &mut self,
        now_millis: i64,
        amount: i64,
        kind: EntryKind,
        transfer_id: &str,
    ) -> Entry {
        if self.entry_from == 0 {
            // A statement starts here, numbered above every entry the account may have had
            // before an older version rewrote it: from the time, 2^20 numbers a millisecond.
            self.entry_from = (now_millis.max(1) as u64) << 20;
            self.entry_seq = self.entry_from - 1;
        }
        self.entry_seq += 1;
        self.entry_at = self.entry_at.max(now_millis);
        Entry {
            seq: self.entry_seq,
            at: self.entry_at,
            amount,
            balance_after: self.balance,
            kind,
            transfer_id: transfer_id.to_owned(),
        }
    }

    /// The `seq`s of the account's statement: from its first entry to its last (empty before
    /// the first).
    pub fn statement_seqs(&self) -> std::ops::Range<u64> {
        match self.entry_from {
            0 => 0..0,
            from => from..self.entry_seq + 1,
        }
    }

    /// The entry of `transfer_id`'s pending apply, if it made one.
    pub fn pending_entry(&self, transfer_id: &str) -> Option<Entry> {
        let i = self
            .pending_transactions
            .iter()
            .position(|id| id == transfer_id)?;
        Entry::decode_kept(self.pending_entries.get(i)?, transfer_id)
    }

    /// Keeps `entry` until a transfer files it.
    pub fn keep_unfiled(&mut self, entry: &Entry) {
        self.unfiled.push(entry.encode_unfiled());
    }

    /// Drops the entries (pending or unfiled) whose `seq` a written transfer document has
    /// filed.
    pub fn drop_filed(&mut self, filed: &[u64]) {
        if filed.is_empty() {
            return;
        }
        self.unfiled.retain(|text| {
            Entry::decode_kept(text, "").is_none_or(|entry| !filed.contains(&entry.seq))
        });
    }

    /// Every entry kept on the account: the pending applies' and the unfiled ones.
    pub fn kept_entries(&self) -> Vec<Entry> {
        let pending = self
            .pending_transactions
            .iter()
            .zip(&self.pending_entries)
            .filter_map(|(id, text)| Entry::decode_kept(text, id));
        let unfiled = self
            .unfiled
            .iter()
            .filter_map(|text| Entry::decode_kept(text, ""));
        pending.chain(unfiled).collect()
    }

    /// The mark of `transfer_id`'s pending entry (`""` for an entry from before marks), or
    /// `None` when it has none.
    pub fn pending_mark(&self, transfer_id: &str) -> Option<&str> {
        let i = self
            .pending_transactions
            .iter()
            .position(|id| id == transfer_id)?;
        Some(self.pending_marks.get(i).map_or("", String::as_str))
    }

    /// Forgets the pending entry of `transfer_id`, if any; answers the balance entry its apply
    /// made, for the caller to drop (filed) or keep ([`AccountDoc::keep_unfiled`]).
    pub fn remove_pending(&mut self, transfer_id: &str) -> Option<Entry> {
        self.align_pending_times();
        let i = self
            .pending_transactions
            .iter()
            .position(|id| id == transfer_id)?;
        self.pending_transactions.remove(i);
        self.pending_applied_at.remove(i);
        self.pending_marks.remove(i);
        Entry::decode_kept(&self.pending_entries.remove(i), transfer_id)
    }

    /// Each pending id with when it was applied (0 when a document predates the times).
    pub fn pending_with_times(&self) -> impl Iterator<Item = (&str, i64)> {
        self.pending_transactions.iter().enumerate().map(|(i, id)| {
            (
                id.as_str(),
                self.pending_applied_at.get(i).copied().unwrap_or(0),
            )
        })
    }

    fn align_pending_times(&mut self) {
        let n = self.pending_transactions.len();
        self.pending_applied_at.resize(n, 0);
        self.pending_marks.resize(n, String::new());
        self.pending_entries.resize(n, String::new());
    }

    /// What a debit may take: the balance less uncommitted credits and the floor (in i128,
    /// so extreme floors cannot overflow).
    pub fn available(&self) -> i128 {
        self.balance as i128 - self.pending_credits as i128 - self.floor as i128
    }
}

/// Metadata: string labels by key, in key order (so equal maps encode to equal bytes).
pub use super::validated::Metadata;

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::parse(text).expect("a time")
    }

    fn leg(from: &str, to: &str, amount: i64) -> Leg {
        Leg {
            from: from.into(),
            to: to.into(),
            amount,
        }
    }

    fn one_leg() -> TransferDoc {
        TransferDoc {
            transaction_state: TransferState::Finished,
            history: "p1764220800124 c1764220800124 m1764220800124 f1764220800125".into(),
            created_by: Some("d7ae77b61df64efa83dc5a89758fe561".into()),
            settled_by: Some("7744929b3213/178830".into()),
            modification_time: at("2026-11-27T05:20:00.125Z"),
            ..TransferDoc::created(
                "t1",
                "acct-17",
                "acct-842",
                250,
                at("2026-11-27T05:20:00.123Z"),
            )
        }
    }

    fn multi_leg() -> TransferDoc {
        TransferDoc {
            legs: Legs::MultiLeg {
                legs: vec![leg("a", "b", 10), leg("a", "c", 5), leg("b", "c", 3)],
                accounts: vec!["a".into(), "b".into(), "c".into()],
                amount: 18,
            },
            transaction_state: TransferState::Pending,
            lease_owner: Some("i1/w7".into()),
            lease_expires_at: Some(at("2026-01-01T00:00:30.000Z")),
            ..TransferDoc::created("t2", "", "", 18, at("2026-01-01T00:00:00.000Z"))
        }
    }

    /// A hold with every optional field set.
    fn full_hold() -> TransferDoc {
        TransferDoc {
            transaction_state: TransferState::RolledBack,
            reason: Some(RollbackReason::Expired),
            modification_time: at("2026-01-02T00:00:00.001Z"),
            lease_owner: Some(PARKED_OWNER.into()),
            lease_expires_at: Some(at("2026-01-02T00:00:00.000Z")),
            attention: Some("look".into()),
            failed_account: Some("a".into()),
            hold_expires_at: Some(at("2026-01-02T00:00:00.000Z")),
            captured_amount: Some(7),
            currency: Some("EUR".into()),
            metadata: Metadata::parse(vec![("order".into(), "42".into())]).unwrap(),
            history: "p1767225600001 r1767312000001".into(),
            created_by: Some("token".into()),
            settled_by: Some("i1/3".into()),
            applied_marks: vec!["m1".into(), "m2".into()],
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            entries: vec!["a/5/x".into()],
            ..TransferDoc::created("t3", "a", "b", 9, at("2026-01-01T00:00:00.000Z"))
        }
    }

    /// The stored JSON, byte for byte: older versions and Elasticsearch's mappings read it.
    #[test]
    fn the_stored_form_is_pinned() {
        for (doc, json) in [
            (
                one_leg(),
                r#"{"transaction_id":"t1","src_acct":"acct-17","dest_acct":"acct-842","amount":250,"transaction_state":"finished","creation_time":"2026-11-27T05:20:00.123Z","modification_time":"2026-11-27T05:20:00.125Z","history":"p1764220800124 c1764220800124 m1764220800124 f1764220800125","created_by":"d7ae77b61df64efa83dc5a89758fe561","settled_by":"7744929b3213/178830"}"#,
            ),
            (
                multi_leg(),
                r#"{"transaction_id":"t2","amount":18,"legs":[{"from":"a","to":"b","amount":10},{"from":"a","to":"c","amount":5},{"from":"b","to":"c","amount":3}],"accounts":["a","b","c"],"transaction_state":"pending","creation_time":"2026-01-01T00:00:00.000Z","modification_time":"2026-01-01T00:00:00.000Z","lease_owner":"i1/w7","lease_expires_at":"2026-01-01T00:00:30.000Z"}"#,
            ),
            (
                full_hold(),
                r#"{"transaction_id":"t3","src_acct":"a","dest_acct":"b","amount":9,"transaction_state":"rolled-back","reason":"expired","creation_time":"2026-01-01T00:00:00.000Z","modification_time":"2026-01-02T00:00:00.001Z","lease_owner":"hold","lease_expires_at":"2026-01-02T00:00:00.000Z","attention":"look","failed_account":"a","hold_expires_at":"2026-01-02T00:00:00.000Z","captured_amount":7,"currency":"EUR","metadata":{"order":"42"},"history":"p1767225600001 r1767312000001","created_by":"token","settled_by":"i1/3","applied_marks":["m1","m2"],"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","entries":["a/5/x"]}"#,
            ),
        ] {
            assert_eq!(serde_json::to_string(&doc).unwrap(), json);
            assert_eq!(serde_json::from_str::<TransferDoc>(json).unwrap(), doc);
        }
    }

    /// A multi-leg transaction lists its accounts once each, in the order of its postings.
    #[test]
    fn a_multi_leg_transaction_lists_its_accounts_as_its_postings() {
        let legs = vec![leg("c", "a", 1), leg("b", "c", 2), leg("a", "d", 3)];
        let doc = TransferDoc {
            legs: Legs::multi_leg(legs, 6),
            ..multi_leg()
        };
        let Legs::MultiLeg { accounts, .. } = &doc.legs else {
            panic!("multi-leg");
        };
        let posted: Vec<&str> = doc.postings().iter().map(|p| p.account).collect();
        assert_eq!(posted, ["c", "a", "b", "d"]);
        assert_eq!(*accounts, posted);
        assert_eq!(
            multi_leg().legs,
            Legs::multi_leg(multi_leg().leg_list(), 18)
        );
    }

    /// No version writes a document that is both one-leg and multi-leg: one is refused.
    #[test]
    fn a_document_both_one_leg_and_multi_leg_is_refused() {
        let mut with_source = serde_json::to_value(multi_leg()).unwrap();
        with_source["src_acct"] = "a".into();
        let mut with_accounts = serde_json::to_value(one_leg()).unwrap();
        with_accounts["accounts"] = serde_json::json!(["acct-17", "acct-842"]);
        for mixed in [with_source, with_accounts] {
            assert!(serde_json::from_value::<TransferDoc>(mixed).is_err());
        }
    }

    /// A time that does not parse makes the document unreadable (it is not taken as some
    /// other time).
    #[test]
    fn a_document_with_an_unparsable_time_is_refused() {
        let stored = serde_json::to_value(full_hold()).unwrap();
        for field in [
            "creation_time",
            "modification_time",
            "lease_expires_at",
            "hold_expires_at",
        ] {
            let mut broken = stored.clone();
            broken[field] = "last tuesday".into();
            let refused = serde_json::from_value::<TransferDoc>(broken).unwrap_err();
            assert!(
                refused.to_string().contains("last tuesday"),
                "{field}: {refused}"
            );
        }
    }
}
