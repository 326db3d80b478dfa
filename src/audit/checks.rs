//! The checks of the invariants (the module doc of [`super`]), each adding what it finds to
//! the report.

use std::collections::{BTreeMap, BTreeSet};

use super::reader::Loaded;
use super::{AuditReport, ViolationKind};
use crate::transfer::model::{AccountDoc, Legs, TransferDoc, TransferState};
use crate::transfer::protocol::Side;
use crate::transfer::requests::Movement;

/// The balance changes a transfer makes once settled, one per account (a multi-leg
/// transaction's net change on each): (side, account, delta). A hold settles its captured
/// amount.
fn deltas(t: &TransferDoc) -> Vec<(&'static str, &str, i128)> {
    t.postings()
        .into_iter()
        .map(|p| {
            let amount = p.settle_amount as i128;
            match p.side {
                Side::Source => ("source", p.account, -amount),
                Side::Destination => ("destination", p.account, amount),
            }
        })
        .collect()
}

/// Counts the transfer by state and checks what holds for it alone: its id, its shape, and
/// that it is not stuck.
pub(super) fn check_transfer(
    report: &mut AuditReport,
    id: &str,
    t: &TransferDoc,
    now: i64,
    stuck_after_millis: i64,
) {
    use TransferState::*;
    use ViolationKind::*;

    match t.transaction_state {
        Finished => report.finished += 1,
        RolledBack => report.rolled_back += 1,
        Created | Pending | Committed | Terminating => report.in_flight += 1,
    }
    if t.transaction_id != id {
        report.violation(
            IdMismatch,
            format!("transfer {id} says its id is {}", t.transaction_id),
        );
    }
    match &t.legs {
        Legs::MultiLeg {
            legs,
            accounts,
            amount,
        } => {
            let total = Movement::legs(legs.clone()).map(|m| m.amount());
            let listed: Vec<&str> = t.postings().iter().map(|p| p.account).collect();
            if total != Ok(*amount) || legs.len() < 2 || *accounts != listed {
                report.violation(
                    MalformedTransfer,
                    format!(
                        "transfer {id} has {} legs that no request can create \
                         (legs {total:?}, amount {amount}, accounts {accounts:?})",
                        legs.len(),
                    ),
                );
            }
        }
        Legs::OneLeg(leg) if leg.amount <= 0 || leg.from == leg.to => report.violation(
            MalformedTransfer,
            format!(
                "transfer {id} moves {} from {} to {}: no request can create it",
                leg.amount, leg.from, leg.to
            ),
        ),
        Legs::OneLeg(_) => {}
    }
    if let Some(why) = &t.attention {
        report.violation(
            NeedsAttention,
            format!("transfer {id} needs a person: {why}"),
        );
    }
    if !t.transaction_state.is_terminal() {
        check_not_stuck(report, id, t, now, stuck_after_millis);
    }
}

/// An in-flight transfer must not be older than `stuck_after_millis`.
fn check_not_stuck(
    report: &mut AuditReport,
    id: &str,
    t: &TransferDoc,
    now: i64,
    stuck_after_millis: i64,
) {
    let state = t.transaction_state;
    // A hold waits by design until it expires: its age counts from then.
    let since = t
        .hold_expires_at
        .map_or(t.creation_time, |expires| expires.max(t.creation_time));
    if now.saturating_sub(since.millis()) > stuck_after_millis {
        report.violation(
            ViolationKind::Stuck,
            format!(
                "transfer {id} is stuck in {state} since {}",
                t.creation_time
            ),
        );
    }
}

/// Per readable account: opening + Σ deltas of the committed and finished transfers. A
/// committed or finished transfer whose account does not exist is reported.
pub(super) fn settled_balances<'a>(
    report: &mut AuditReport,
    accounts: &'a Loaded<AccountDoc>,
    transfers: &BTreeMap<String, TransferDoc>,
) -> BTreeMap<&'a str, i128> {
    let mut settled: BTreeMap<&str, i128> = accounts
        .docs
        .iter()
        .map(|(id, a)| (id.as_str(), a.opening_balance as i128))
        .collect();
    for (id, t) in transfers {
        let state = t.transaction_state;
        if !matches!(state, TransferState::Committed | TransferState::Finished) {
            continue;
        }
        for (side, account, delta) in deltas(t) {
            match settled.get_mut(account) {
                Some(sum) => *sum += delta,
                // Already reported as unreadable.
                None if accounts.unreadable.contains(account) => {}
                None => report.violation(
                    ViolationKind::MissingAccount,
                    format!(
                        "transfer {id} is {state} but its {side} account {account} does not exist"
                    ),
                ),
            }
        }
    }
    settled
}

/// Every committed or finished transfer moved units between accounts of one currency (or
/// of none), the one it stated if it stated one. A missing account is reported elsewhere.
pub(super) fn check_currencies(
    report: &mut AuditReport,
    accounts: &Loaded<AccountDoc>,
    transfers: &BTreeMap<String, TransferDoc>,
) {
    for (id, t) in transfers {
        let state = t.transaction_state;
        if !matches!(state, TransferState::Committed | TransferState::Finished) {
            continue;
        }
        let postings = t.postings();
        let Some(found) = postings
            .iter()
            .map(|p| accounts.docs.get(p.account).map(|a| (p.account, a)))
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        let (first, first_doc) = found[0];
        let wanted = t.currency.as_ref().or(first_doc.currency.as_ref());
        let stated_ok = t
            .currency
            .as_ref()
            .is_none_or(|c| first_doc.currency.as_ref() == Some(c));
        if let Some((other, other_doc)) = found
            .iter()
            .find(|(_, a)| a.currency.as_ref() != wanted)
            .copied()
            .or((!stated_ok).then_some((first, first_doc)))
        {
            let shown = |c: Option<&String>| c.cloned().unwrap_or_else(|| "none".into());
            report.violation(
                ViolationKind::CurrencyMismatch,
                format!(
                    "transfer {id} is {state} in currency {} from {} ({}) to {} ({})",
                    shown(t.currency.as_ref()),
                    first,
                    shown(first_doc.currency.as_ref()),
                    other,
                    shown(other_doc.currency.as_ref())
                ),
            );
        }
    }
}

/// Checks one account: its id, its pending list, its balance, its pending sums and its floor,
/// and adds it to the report's totals. Returns the amount its pending list puts on the balance
/// beyond what the transfers' states count, or `None` when that cannot be counted (then
/// neither this account's exactness and pending sums nor conservation are checked).
pub(super) fn check_account(
    report: &mut AuditReport,
    id: &str,
    a: &AccountDoc,
    settled: &BTreeMap<&str, i128>,
    transfers: &Loaded<TransferDoc>,
) -> Option<i128> {
    if a.account_id != id {
        report.violation(
            ViolationKind::IdMismatch,
            format!("account {id} says its id is {}", a.account_id),
        );
    }
    report.total_balance += a.balance as i128;
    report.total_opening += a.opening_balance as i128;
    report.pending_entries += a.pending_transactions.len();

    let pending = read_pending_list(report, id, a, transfers);
    let credits = if pending.countable {
        let from_transfers = settled.get(id).copied().unwrap_or_default();
        check_exactness(report, id, a, from_transfers, pending.listed);
        check_pending_sums(report, id, a, &pending);
        pending.credits
    } else {
        a.pending_credits as i128
    };
    check_floors(report, id, a, credits);
    pending.countable.then_some(pending.listed)
}

/// What an account's pending list says.
struct PendingList {
    /// Σ deltas on the balance not counted by their transfer's state.
    listed: i128,
    /// Σ amounts of the pending ids where the account is the destination.
    credits: i128,
    /// Σ amounts of the pending ids where the account is the source.
    debits: i128,
    /// False when some pending id's amount cannot be counted (it names no transfer, an
    /// unreadable one, or one that does not involve the account).
    countable: bool,
}

/// Reads an account's pending list, reporting each id that breaks a rule of its own.
fn read_pending_list(
    report: &mut AuditReport,
    id: &str,
    a: &AccountDoc,
    transfers: &Loaded<TransferDoc>,
) -> PendingList {
    let mut list = PendingList {
        listed: 0,
        credits: 0,
        debits: 0,
        countable: true,
    };
    let mut seen = BTreeSet::new();
    for tid in &a.pending_transactions {
        if !seen.insert(tid.as_str()) {
            report.violation(
                ViolationKind::PendingDuplicate,
                format!("account {id} lists {tid} as pending twice"),
            );
            continue;
        }
        let Some(t) = pending_transfer(report, id, tid, transfers) else {
            list.countable = false;
            continue;
        };
        // The account's one entry carries its net change over the transfer's legs.
        let Some(posting) = t.posting_of(id) else {
            list.countable = false;
            continue;
        };
        let amount = posting.amount as i128;
        let delta = match posting.side {
            Side::Source => {
                list.debits += amount;
                -amount
            }
            Side::Destination => {
                list.credits += amount;
                amount
            }
        };
        // What settling will give back (a hold captured in part): on the balance until the
        // remove, beyond what a `committed` state counts.
        let give_back = delta - delta.signum() * posting.settle_amount as i128;
        list.listed += counted_on_balance(report, id, tid, t, delta, give_back);
    }
    list
}

/// The transfer a pending id of account `id` names, when it involves the account; `None` when
/// its amount cannot be counted (the transfer is unreadable, which is already reported, or the
/// pending id is reported here).
fn pending_transfer<'t>(
    report: &mut AuditReport,
    id: &str,
    tid: &str,
    transfers: &'t Loaded<TransferDoc>,
) -> Option<&'t TransferDoc> {
    if transfers.unreadable.contains(tid) {
        return None;
    }
    let Some(t) = transfers.docs.get(tid) else {
        report.violation(
            ViolationKind::PendingUnknown,
            format!(
                "account {id} has pending id {tid} of no transfer \
                 (its balance, pending sums and conservation are not checked)"
            ),
        );
        return None;
    };
    if t.posting_of(id).is_none() {
        report.violation(
            ViolationKind::PendingUnrelated,
            format!(
                "account {id} has {tid} pending, but the transfer moves {} between {} \
                 (its balance, pending sums and conservation are not checked)",
                t.amount(),
                t.postings()
                    .iter()
                    .map(|p| p.account)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        return None;
    }
    Some(t)
}

/// How much of a pending id's `delta` the balance holds beyond what its transfer's state
/// counts. Only a `pending` or `terminating` transfer may be listed; a `created` or
/// `rolled-back` one that is listed anyway is counted as the list says (on the balance), a
/// `finished` one as its state says, so that the fault is reported once, here.
fn counted_on_balance(
    report: &mut AuditReport,
    id: &str,
    tid: &str,
    t: &TransferDoc,
    delta: i128,
    give_back: i128,
) -> i128 {
    use TransferState::*;
    match t.transaction_state {
        Pending | Terminating => delta,
        // Its settled delta is counted by its state; a hold captured in part still holds
        // the rest until the remove gives it back.
        Committed => give_back,
        Finished => {
            report.violation(
                ViolationKind::PendingNotInFlight,
                format!("account {id} still has {tid} pending, but the transfer is finished"),
            );
            0
        }
        Created | RolledBack => {
            report.violation(
                ViolationKind::PendingNotInFlight,
                format!(
                    "account {id} has {tid} pending (so its {delta:+} is counted on the \
                     balance), but the transfer is {}",
                    t.transaction_state
                ),
            );
            delta
        }
    }
}

/// `balance = opening + Σ committed/finished deltas + Σ listed pending deltas`.
fn check_exactness(
    report: &mut AuditReport,
    id: &str,
    a: &AccountDoc,
    from_transfers: i128,
    listed: i128,
) {
    let balance = a.balance as i128;
    let want = from_transfers + listed;
    if balance != want {
        report.violation(
            ViolationKind::BalanceMismatch,
            format!(
                "account {id}: balance {balance}, but opening and committed/finished \
                 transfers give {from_transfers} and its pending ids {listed:+}: {want}"
            ),
        );
    }
}

/// `pending_credits` and `pending_debits` are the sums of the pending list.
fn check_pending_sums(report: &mut AuditReport, id: &str, a: &AccountDoc, list: &PendingList) {
    if a.pending_credits as i128 != list.credits {
        report.violation(
            ViolationKind::PendingCreditsDrift,
            format!(
                "account {id}: pending_credits {} but its pending credits sum to {}",
                a.pending_credits, list.credits
            ),
        );
    }
    if a.pending_debits as i128 != list.debits {
        report.violation(
            ViolationKind::PendingDebitsDrift,
            format!(
                "account {id}: pending_debits {} but its pending debits sum to {}",
                a.pending_debits, list.debits
            ),
        );
    }
}

/// `balance ≥ floor`, and `balance − pending credits ≥ floor` (credits are not spendable until
/// they commit, so undoing all of them must never break the floor).
fn check_floors(report: &mut AuditReport, id: &str, a: &AccountDoc, credits: i128) {
    let balance = a.balance as i128;
    let floor = a.floor as i128;
    if balance < floor {
        report.violation(
            ViolationKind::BelowFloor,
            format!("account {id}: balance {balance} below floor {floor}"),
        );
    } else if balance - credits < floor {
        report.violation(
            ViolationKind::UnspendableCredits,
            format!(
                "account {id}: balance {balance} less pending credits {credits} is below \
                 floor {floor} (undoing those credits would break it)"
            ),
        );
    }
}

/// `Σ balance = Σ opening + Σ in-flight deltas`: a committed or finished transfer moves units
/// between two accounts, so it changes no total.
pub(super) fn check_conservation(report: &mut AuditReport, in_flight_delta: i128) {
    if report.total_balance != report.total_opening + in_flight_delta {
        report.violation(
            ViolationKind::Conservation,
            format!(
                "conservation: total balance {} ≠ total opening {} + in-flight {in_flight_delta:+}",
                report.total_balance, report.total_opening
            ),
        );
    }
}
