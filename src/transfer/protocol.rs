//! The two-phase commit of seed 003 as pure decisions: given the documents, what is the next
//! write? No I/O here; the driver performs what these functions decide.
//!
//! A transfer's state says which steps remain:
//!
//! | state         | steps (seed 003)                                               |
//! |---------------|----------------------------------------------------------------|
//! | `created`     | core 1: → `pending`                                            |
//! | `pending`     | core 2: apply to source, core 3: apply to destination, core 4: → `committed` |
//! | `committed`   | core 5: remove from source, core 6: remove from destination, core 7: → `finished` |
//! | `terminating` | rollback 2: undo source, rollback 3: undo destination, rollback 4: → `rolled-back` |
//!
//! Every account step is idempotent, as in the post: the transfer id in
//! `pending_transactions` says whether the amount is on the balance. Where we are stricter
//! than the post:
//! - applying a debit refuses when the balance would go below the floor (counting credits
//!   that have not committed as not spendable), and any step refuses to overflow;
//! - settling (core 5/6, rollback 2/3) leaves the id in `settled_transactions`, and an apply
//!   for a settled id is refused: a late worker cannot apply a finished or rolled-back
//!   transfer again (seed 004's tombstones);
//! - rollback 2/3 write the tombstone even when the amount was never applied, so that write
//!   also changes the account's version and fences out a stalled worker's conditional write.

use super::model::{AccountDoc, RollbackReason, Settled, TransferDoc, TransferState};

/// Which account of the transfer a step touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Source,
    Destination,
}

impl Side {
    pub fn account(self, transfer: &TransferDoc) -> &str {
        match self {
            Side::Source => &transfer.src_acct,
            Side::Destination => &transfer.dest_acct,
        }
    }

    /// The signed change this transfer makes to this side's balance.
    pub fn delta(self, amount: i64) -> i64 {
        match self {
            Side::Source => -amount,
            Side::Destination => amount,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Side::Source => "source",
            Side::Destination => "destination",
        }
    }
}

/// What happens to one account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountOp {
    /// Core steps 2/3: add the delta, remember the id as pending.
    Apply,
    /// Core steps 5/6: forget the pending id (the balance stays), remember it as settled.
    Remove,
    /// Rollback steps 2/3: take the delta back if it was applied; remember the id as settled.
    Undo,
}

/// One step of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Account(AccountOp, Side),
    /// A conditional write of the transfer document to this state.
    SetState(TransferState),
}

/// The steps that remain for a transfer in `state`, in order; empty when terminal.
pub fn plan(state: TransferState) -> &'static [Step] {
    use AccountOp::*;
    use Side::*;
    match state {
        TransferState::Created => &[Step::SetState(TransferState::Pending)],
        TransferState::Pending => &[
            Step::Account(Apply, Source),
            Step::Account(Apply, Destination),
            Step::SetState(TransferState::Committed),
        ],
        TransferState::Committed => &[
            Step::Account(Remove, Source),
            Step::Account(Remove, Destination),
            Step::SetState(TransferState::Finished),
        ],
        TransferState::Terminating => &[
            Step::Account(Undo, Source),
            Step::Account(Undo, Destination),
            Step::SetState(TransferState::RolledBack),
        ],
        TransferState::Finished | TransferState::RolledBack => &[],
    }
}

/// When a transfer has outlived `TRANSFER_TIMEOUT`: the rollback write that replaces its next
/// step. Only `created` and `pending` time out; `committed` is always driven to `finished`,
/// `terminating` to `rolled-back`.
pub fn timeout_transition(
    transfer: &TransferDoc,
    created_millis: i64,
    now_millis: i64,
    timeout_millis: i64,
) -> Option<TransferState> {
    if now_millis.saturating_sub(created_millis) < timeout_millis {
        return None;
    }
    match transfer.transaction_state {
        TransferState::Created => Some(TransferState::RolledBack),
        TransferState::Pending => Some(TransferState::Terminating),
        _ => None,
    }
}

/// Why an account step refuses to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The debit would leave less than the floor: roll back.
    InsufficientFunds,
    /// A balance would overflow: roll back.
    Overflow,
    /// The id is already settled on this account: this worker is late (another one finished
    /// or rolled the transfer back). Stop and read the transfer again.
    AlreadySettled,
}

impl Refusal {
    /// The rollback reason, when the refusal means the transfer must roll back.
    pub fn rollback_reason(self) -> Option<RollbackReason> {
        match self {
            Refusal::InsufficientFunds => Some(RollbackReason::InsufficientFunds),
            Refusal::Overflow => Some(RollbackReason::BalanceOverflow),
            Refusal::AlreadySettled => None,
        }
    }
}

/// The decision for one account step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountDecision {
    /// Write this document (conditionally on the version that was read).
    Write(AccountDoc),
    /// Nothing to do: the step was already done (the post's "noop").
    AlreadyDone,
    Refuse(Refusal),
}

/// How long and how many settled ids an account remembers.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub millis: i64,
    pub max_entries: usize,
}

/// The current time, as both forms the documents use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Now {
    pub millis: i64,
    /// RFC 3339, millisecond precision, UTC.
    pub text: String,
}

impl Now {
    pub fn at(millis: i64) -> Self {
        Self {
            millis,
            text: crate::store::format_millis(millis),
        }
    }

    pub fn system() -> Self {
        Self::at(now_millis())
    }
}

/// Wall-clock epoch milliseconds.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One account step of one transfer.
#[derive(Debug, Clone, Copy)]
pub struct AccountStep<'a> {
    pub transfer_id: &'a str,
    pub amount: i64,
    pub side: Side,
    pub op: AccountOp,
}

/// Decides one account step.
pub fn decide_account(
    account: &AccountDoc,
    step: AccountStep<'_>,
    now: &Now,
    retention: Retention,
) -> AccountDecision {
    let AccountStep {
        transfer_id,
        amount,
        side,
        op,
    } = step;
    let now_millis = now.millis;
    let pending = account
        .pending_transactions
        .iter()
        .any(|id| id == transfer_id);
    let settled = account
        .settled_transactions
        .iter()
        .any(|s| s.id == transfer_id);
    let delta = side.delta(amount);
    let credit = if side == Side::Destination { amount } else { 0 };
    let mut next = account.clone();
    match op {
        AccountOp::Apply => {
            if pending {
                return AccountDecision::AlreadyDone;
            }
            if settled {
                return AccountDecision::Refuse(Refusal::AlreadySettled);
            }
            let (Some(balance), Some(pending_credits)) = (
                account.balance.checked_add(delta),
                account.pending_credits.checked_add(credit),
            ) else {
                return AccountDecision::Refuse(Refusal::Overflow);
            };
            if side == Side::Source {
                // Spendable = balance − uncommitted credits − floor, so that undoing any
                // pending credit later can never leave the balance below the floor.
                match account.available() {
                    Some(available) if available >= amount => {}
                    Some(_) => return AccountDecision::Refuse(Refusal::InsufficientFunds),
                    None => return AccountDecision::Refuse(Refusal::Overflow),
                }
            }
            next.balance = balance;
            next.pending_credits = pending_credits;
            next.pending_transactions.push(transfer_id.to_owned());
        }
        AccountOp::Remove => {
            if !pending {
                return AccountDecision::AlreadyDone;
            }
            next.pending_credits -= credit;
            next.pending_transactions.retain(|id| id != transfer_id);
            remember(&mut next, transfer_id, now_millis);
        }
        AccountOp::Undo => {
            if pending {
                let (Some(balance), Some(pending_credits)) = (
                    account.balance.checked_sub(delta),
                    account.pending_credits.checked_sub(credit),
                ) else {
                    return AccountDecision::Refuse(Refusal::Overflow);
                };
                next.balance = balance;
                next.pending_credits = pending_credits;
                next.pending_transactions.retain(|id| id != transfer_id);
            } else if settled {
                return AccountDecision::AlreadyDone;
            }
            // Not applied and not yet fenced: write the tombstone anyway. A worker that
            // stalled before its apply will then either fail its conditional write (the
            // version moved) or read the tombstone and refuse.
            remember(&mut next, transfer_id, now_millis);
        }
    }
    prune_settled(&mut next, now_millis, retention);
    next.modification_time = now.text.clone();
    AccountDecision::Write(next)
}

fn remember(account: &mut AccountDoc, transfer_id: &str, now_millis: i64) {
    account.settled_transactions.push(Settled {
        id: transfer_id.to_owned(),
        at: now_millis,
    });
}

/// Drops tombstones older than the retention, then the oldest beyond the count bound.
fn prune_settled(account: &mut AccountDoc, now_millis: i64, retention: Retention) {
    let cutoff = now_millis.saturating_sub(retention.millis);
    account.settled_transactions.retain(|s| s.at >= cutoff);
    let excess = account
        .settled_transactions
        .len()
        .saturating_sub(retention.max_entries);
    if excess > 0 {
        account.settled_transactions.drain(..excess);
    }
}

/// The transfer document after a state write: checked against the arrows, stamped with the
/// time, the reason kept or set, and the lease renewed (or released when terminal).
pub fn transition(
    transfer: &TransferDoc,
    to: TransferState,
    reason: Option<RollbackReason>,
    now: &Now,
    lease: Option<(&str, &str)>,
) -> Option<TransferDoc> {
    if !transfer.transaction_state.can_move_to(to) {
        return None;
    }
    let mut next = transfer.clone();
    next.transaction_state = to;
    if reason.is_some() {
        next.reason = reason;
    }
    next.modification_time = now.text.clone();
    match lease {
        Some((owner, expires)) if !to.is_terminal() => {
            next.lease_owner = Some(owner.to_owned());
            next.lease_expires_at = Some(expires.to_owned());
        }
        _ => {
            next.lease_owner = None;
            next.lease_expires_at = None;
        }
    }
    Some(next)
}
