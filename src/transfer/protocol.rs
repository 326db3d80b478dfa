//! The two-phase commit of Elastic's post (`docs/design.md §3`) as pure decisions: given the documents, what is the next
//! write? No I/O here; the driver performs what these functions decide.
//!
//! A transfer's state says which steps remain:
//!
//! | state         | steps (the post's numbering)                                   |
//! |---------------|----------------------------------------------------------------|
//! | `created`     | core 1: → `pending`                                            |
//! | `pending`     | core 2: apply to source, core 3: apply to destination, core 4: → `committed` |
//! | `committed`   | core 5: remove from source, core 6: remove from destination, core 7: → `finished` |
//! | `terminating` | rollback 2: undo source, rollback 3: undo destination, rollback 4: → `rolled-back` |
//!
//! A **hold** (`docs/design.md §3`, "Holds") runs core 1–3 and then, instead of core 4, parks
//! ([`Step::Park`]) until a capture, a cancel or its expiry; a captured hold commits, and its
//! core 5/6 settle the captured amount: the remove gives `amount − captured` back to the
//! source and takes it off the destination in the same write that drops the pending entry.
//!
//! Every account step is idempotent, as in the post: the transfer id in
//! `pending_transactions` says whether the amount is on the balance. Where we are stricter
//! than the post:
//! - applying a debit refuses when the balance would go below the floor (counting credits
//!   that have not committed as not spendable), and any step refuses to overflow;
//! - every apply marks its pending entry with a mark unique to that decision, and the commit
//!   records the marks it was decided on (`applied_marks`): a settle (core 5/6) takes away
//!   only the entry the commit counted and gives back any other, which a late worker applied
//!   after an earlier settle (`docs/design.md §9`, "The fence");
//! - rollback 2/3 write the account even when the amount was never applied, so that write
//!   changes the account's version and fences out a stalled worker's conditional write;
//! - tombstones (`settled`) written by versions before marks are still honoured until they
//!   age out: an apply for such an id is refused. No new ones are written.

pub use super::clock::Now;
use super::entries::{Entry, EntryKind};
use super::model::{AccountDoc, Legs, RollbackReason, TransferDoc, TransferState};
use crate::time::Timestamp;

/// Which account of the transfer a step touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Source,
    Destination,
}

impl Side {
    /// This side's account of a one-leg transfer (`""` for a multi-leg one, whose accounts
    /// are its postings').
    pub fn account(self, transfer: &TransferDoc) -> &str {
        let Legs::OneLeg(leg) = &transfer.legs else {
            return "";
        };
        match self {
            Side::Source => &leg.from,
            Side::Destination => &leg.to,
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
    /// Core steps 5/6: forget the pending entry the commit counted. The balance keeps the
    /// settled amount: all of it, or for a partly captured hold `captured`, the difference
    /// going back in the same write. An entry with another mark is a late apply and is
    /// given back.
    Remove,
    /// Rollback steps 2/3: take the delta back if it was applied; write the account either way.
    Undo,
}

impl AccountOp {
    /// The step's name in traces: `apply`, `settle` (the remove of a committed transfer) or
    /// `undo`.
    pub fn step_name(self) -> &'static str {
        match self {
            AccountOp::Apply => "apply",
            AccountOp::Remove => "settle",
            AccountOp::Undo => "undo",
        }
    }
}

/// One step of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// One account of a one-leg transfer: its source or its destination.
    Account(AccountOp, Side),
    /// Every account of a multi-leg transaction, one after the other in the order of
    /// [`TransferDoc::postings`] (the first account's apply fixes the currency the others
    /// must have), each with its net change: one pending entry per account.
    EachAccount(AccountOp),
    /// A conditional write of the transfer document to this state.
    SetState(TransferState),
    /// A hold with both accounts applied and no capture: park it (a conditional write that
    /// hands its lease to the hold until it expires) and stop driving it.
    Park,
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

/// The steps that remain for `transfer`: [`plan`] of its state, except that a hold in
/// `pending` with no capture parks where a transfer would commit.
///
/// A multi-leg transaction takes the same steps with [`Step::EachAccount`] in place of the
/// two account steps ([`plan_legs`]).
pub fn plan_for(transfer: &TransferDoc) -> &'static [Step] {
    use AccountOp::*;
    use Side::*;
    let parks = transfer.is_hold() && transfer.captured_amount.is_none();
    match transfer.transaction_state {
        state if transfer.is_multi_leg() => plan_legs(state, parks),
        TransferState::Pending if parks => &[
            Step::Account(Apply, Source),
            Step::Account(Apply, Destination),
            Step::Park,
        ],
        state => plan(state),
    }
}

/// [`plan`] for a multi-leg transaction (`parks`: an uncaptured hold, which parks where it
/// would commit).
pub fn plan_legs(state: TransferState, parks: bool) -> &'static [Step] {
    use AccountOp::*;
    match state {
        TransferState::Created => &[Step::SetState(TransferState::Pending)],
        TransferState::Pending if parks => &[Step::EachAccount(Apply), Step::Park],
        TransferState::Pending => &[
            Step::EachAccount(Apply),
            Step::SetState(TransferState::Committed),
        ],
        TransferState::Committed => &[
            Step::EachAccount(Remove),
            Step::SetState(TransferState::Finished),
        ],
        TransferState::Terminating => &[
            Step::EachAccount(Undo),
            Step::SetState(TransferState::RolledBack),
        ],
        TransferState::Finished | TransferState::RolledBack => &[],
    }
}

/// The rollback that replaces a transfer's next step when its time is up, with its reason:
/// [`timeout_transition`] (`timed_out`) for a plain transfer; for a hold, its own expiry
/// (`expired`) while it has no capture. `TRANSFER_TIMEOUT` never applies to a hold (it waits
/// in `pending` by design), and a captured hold never expires: the capture won.
pub fn deadline_transition(
    transfer: &TransferDoc,
    created_millis: i64,
    now_millis: i64,
    timeout_millis: i64,
) -> Option<(TransferState, RollbackReason)> {
    let Some(expires) = transfer.hold_expires_at.map(Timestamp::millis) else {
        return timeout_transition(transfer, created_millis, now_millis, timeout_millis)
            .map(|to| (to, RollbackReason::TimedOut));
    };
    if transfer.captured_amount.is_some() || now_millis < expires {
        return None;
    }
    rollback_from(transfer.transaction_state).map(|to| (to, RollbackReason::Expired))
}

/// Where a rollback goes from `state`: `created` straight to `rolled-back`, `pending` to
/// `terminating`; nothing else can roll back.
pub fn rollback_from(state: TransferState) -> Option<TransferState> {
    match state {
        TransferState::Created => Some(TransferState::RolledBack),
        TransferState::Pending => Some(TransferState::Terminating),
        _ => None,
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
    rollback_from(transfer.transaction_state)
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
    /// The account already remembers `SETTLED_MAX` young settled ids and pending entries
    /// (each pending entry becomes a settled id): a young tombstone is never forgotten to make
    /// room, so the apply must wait until the oldest age out. Back off, then roll back.
    AccountBusy,
    /// The account's currency is not the one the transfer needs ([`CurrencyRule`]): roll
    /// back. Currencies never change, so deciding again gives the same answer.
    CurrencyMismatch,
}

impl Refusal {
    /// The rollback reason, when the refusal means the transfer must roll back.
    pub fn rollback_reason(self) -> Option<RollbackReason> {
        match self {
            Refusal::InsufficientFunds => Some(RollbackReason::InsufficientFunds),
            Refusal::Overflow => Some(RollbackReason::BalanceOverflow),
            Refusal::AlreadySettled => None,
            Refusal::AccountBusy => Some(RollbackReason::AccountBusy),
            Refusal::CurrencyMismatch => Some(RollbackReason::CurrencyMismatch),
        }
    }
}

/// The decision for one account step.
#[derive(Debug, Clone, PartialEq, Eq)]
// The decision is consumed at once; boxing the document would cost an allocation per step.
#[allow(clippy::large_enum_variant)]
pub enum AccountDecision {
    /// Write this document (conditionally on the version that was read).
    Write(AccountDoc),
    /// Nothing to do: the step was already done (the post's "noop").
    AlreadyDone,
    /// A settle found an entry of the transfer with another mark than the commit recorded:
    /// applied late, after the entry the commit counted was settled. This document gives it
    /// back (the step is then done); the caller counts and logs it.
    UndoLate(AccountDoc),
    Refuse(Refusal),
}

/// How long an account keeps the settled ids (tombstones) that versions before marks wrote,
/// and how many entries it holds. No new tombstone is written: the ones found are dropped
/// once `millis` old (on the clock of the instance deciding), and beyond twice the bound the
/// oldest go. `max_entries` bounds pending entries plus young tombstones: an apply beyond it
/// is refused ([`Refusal::AccountBusy`]), so the document stays bounded whatever the
/// account's traffic.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub millis: i64,
    pub max_entries: usize,
}

impl Retention {
    /// No bound on pending entries, and an older version's tombstones dropped at the first
    /// write (tests of the other defences alone).
    pub const NONE: Retention = Retention {
        millis: i64::MIN,
        max_entries: usize::MAX / 4,
    };

    /// Whether a tombstone stamped `at_millis` is still young at `now_millis`. Stamps from
    /// the future (another instance's clock ahead of ours) are young.
    fn keeps(self, at_millis: i64, now_millis: i64) -> bool {
        now_millis.saturating_sub(at_millis) < self.millis
    }
}

/// Whether the account holds as many young settled ids and pending entries as it may.
fn is_full(account: &AccountDoc, now_millis: i64, retention: Retention) -> bool {
    let young = account
        .settled
        .times()
        .filter(|&at| retention.keeps(at, now_millis))
        .count();
    young + account.pending_transactions.len() >= retention.max_entries
}

/// Which currency an apply needs its account to have.
///
/// Every account of a transfer must have the same currency (or all none), and the
/// transfer's own when it states one. Account currencies are fixed at creation, so the rule
/// is checked where each account is read anyway, on the apply: the source's apply needs the
/// transfer's currency if stated (else any), the destination's apply needs the transfer's
/// currency if stated, else the source's (read by the source's apply just before, which
/// every run of `pending` repeats, done or not). A mismatch refuses the apply and rolls the
/// transfer back: nothing was applied to the destination, and the source's apply is undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CurrencyRule<S = String> {
    /// Whatever the account has (the source of a transfer that states no currency).
    Any,
    /// Exactly this currency (`None`: the account must have none).
    Exactly(Option<S>),
}

impl<S: AsRef<str>> CurrencyRule<S> {
    /// The rule for the source's apply of a transfer stating `stated`.
    pub fn for_source(stated: Option<S>) -> Self {
        match stated {
            Some(currency) => CurrencyRule::Exactly(Some(currency)),
            None => CurrencyRule::Any,
        }
    }

    /// The rule for the destination's apply: the stated currency, else the source's.
    pub fn for_destination(stated: Option<S>, source: Option<S>) -> Self {
        CurrencyRule::Exactly(stated.or(source))
    }

    /// Whether an account with `currency` passes.
    pub fn admits(&self, currency: Option<&str>) -> bool {
        match self {
            CurrencyRule::Any => true,
            CurrencyRule::Exactly(wanted) => wanted.as_ref().map(AsRef::as_ref) == currency,
        }
    }

    /// The same rule, borrowed.
    pub fn as_deref(&self) -> CurrencyRule<&str> {
        match self {
            CurrencyRule::Any => CurrencyRule::Any,
            CurrencyRule::Exactly(wanted) => {
                CurrencyRule::Exactly(wanted.as_ref().map(AsRef::as_ref))
            }
        }
    }
}

/// The currency rule of one account step of a transfer stating `stated`: the first
/// account's apply takes the stated currency or any; every other account's apply needs the
/// stated one, else the first account's (`first`, once its apply ran in this plan).
pub fn currency_rule(
    stated: &Option<String>,
    op: AccountOp,
    index: usize,
    first: &Option<Option<String>>,
) -> CurrencyRule {
    match (op, index) {
        (AccountOp::Apply, 0) => CurrencyRule::for_source(stated.clone()),
        (AccountOp::Apply, _) => {
            // The plan of `pending` applies the first account first, always: its answer is
            // here.
            debug_assert!(
                first.is_some(),
                "another account's apply before the first's"
            );
            let first = first.clone().flatten();
            CurrencyRule::for_destination(stated.clone(), first)
        }
        _ => CurrencyRule::Any,
    }
}

/// One account step of one transfer.
#[derive(Debug, Clone, Copy)]
pub struct AccountStep<'a> {
    pub transfer_id: &'a str,
    /// What the apply puts on the balance (and an undo takes back).
    pub amount: i64,
    /// What stays on the balance when a remove settles it: `amount`, or a hold's captured
    /// amount (0 < it ≤ `amount`). Only [`AccountOp::Remove`] reads it.
    pub settle_amount: i64,
    pub side: Side,
    pub op: AccountOp,
    /// What an apply needs of the account's currency (ignored by the other ops: settling or
    /// undoing never depends on it).
    pub currency: CurrencyRule<&'a str>,
    /// An apply: the mark its entry gets. A remove: the mark the commit recorded for this
    /// account (`None` for a transfer committed before marks: any entry is the one). An
    /// undo: `None` gives back whatever entry there is and writes the account either way
    /// (rollback 2/3); `Some` gives back only the entry with that mark, and writes nothing
    /// if it is gone (the late-apply sweep, undoing the entry it saw).
    pub mark: Option<&'a str>,
    /// Whether the transfer is a hold: its entries say `hold` and `release`
    /// ([`EntryKind`]).
    pub hold: bool,
    /// A settle or undo: the `seq`s of this account's entries that the transfer's written
    /// document has filed, which the account then drops ([`super::entries`]).
    pub filed: &'a [u64],
}

impl<'a> AccountStep<'a> {
    /// `transfer_id`'s step `op` of `amount` on its `side`, with nothing more to it: all of
    /// it settles, any currency, no mark, not a hold, nothing filed yet. The other fields
    /// are set by struct update (`AccountStep { hold: true, ..AccountStep::plain(..) }`).
    pub fn plain(transfer_id: &'a str, op: AccountOp, side: Side, amount: i64) -> Self {
        AccountStep {
            transfer_id,
            amount,
            settle_amount: amount,
            side,
            op,
            currency: CurrencyRule::Any,
            mark: None,
            hold: false,
            filed: &[],
        }
    }
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
        settle_amount,
        side,
        op,
        currency,
        mark,
        hold,
        filed,
    } = step;
    let entries = Entries {
        now_millis: now.millis,
        hold,
        filed,
        transfer_id,
    };
    let pending = is_pending(account, transfer_id);
    let settled = account.settled.contains(transfer_id);
    let change = Change::of(side, amount);
    // What to write, and as which decision: a settle that finds a late apply gives it back.
    let write: fn(AccountDoc) -> AccountDecision = match op {
        AccountOp::Remove if pending && is_late(account, transfer_id, mark) => {
            AccountDecision::UndoLate
        }
        _ => AccountDecision::Write,
    };
    let decided = match op {
        AccountOp::Apply if pending => return AccountDecision::AlreadyDone,
        AccountOp::Apply if settled => return AccountDecision::Refuse(Refusal::AlreadySettled),
        AccountOp::Apply => apply(
            account,
            (transfer_id, mark.unwrap_or("")),
            change,
            currency,
            (entries, retention),
        ),
        AccountOp::Remove if !pending => return AccountDecision::AlreadyDone,
        AccountOp::Remove if is_late(account, transfer_id, mark) => {
            undo(account, Some(change), entries)
        }
        AccountOp::Remove => remove(
            account,
            change,
            side.delta(amount) as i128 - side.delta(settle_amount) as i128,
            entries,
        ),
        // A tombstone of a version before marks: that version's undo was done.
        AccountOp::Undo if !pending && settled => return AccountDecision::AlreadyDone,
        AccountOp::Undo if mark.is_some_and(|m| account.pending_mark(transfer_id) != Some(m)) => {
            return AccountDecision::AlreadyDone
        }
        AccountOp::Undo => undo(account, pending.then_some(change), entries),
    };
    match decided {
        Ok(mut next) => {
            stamp(&mut next, now, retention);
            debug_assert_consistent(&next, transfer_id, op);
            write(next)
        }
        Err(refusal) => AccountDecision::Refuse(refusal),
    }
}

/// Whether the transfer's entry on the account was applied late: it carries a mark, and not
/// the one the commit counted (`expected`). An entry without a mark was applied by a version
/// before marks, or lost its mark when such a version rewrote the account: it is settled as
/// those versions did, as the one the commit counted.
fn is_late(account: &AccountDoc, transfer_id: &str, expected: Option<&str>) -> bool {
    match (account.pending_mark(transfer_id), expected) {
        (Some(found), Some(expected)) => !found.is_empty() && found != expected,
        _ => false,
    }
}

/// What one transfer does to one account: the balance delta and the pending sums it moves.
#[derive(Debug, Clone, Copy)]
struct Change {
    /// Whether this side is the source (a debit, checked against the floor).
    debits: bool,
    delta: i64,
    credit: i64,
    debit: i64,
}

impl Change {
    fn of(side: Side, amount: i64) -> Self {
        let (credit, debit) = match side {
            Side::Destination => (amount, 0),
            Side::Source => (0, amount),
        };
        Self {
            debits: side == Side::Source,
            delta: side.delta(amount),
            credit,
            debit,
        }
    }
}

/// Whether the transfer's entry is pending on the account.
fn is_pending(account: &AccountDoc, transfer_id: &str) -> bool {
    account
        .pending_transactions
        .iter()
        .any(|id| id == transfer_id)
}

/// What a step needs to keep the account's entries ([`super::entries`]).
#[derive(Debug, Clone, Copy)]
struct Entries<'a> {
    now_millis: i64,
    hold: bool,
    filed: &'a [u64],
    transfer_id: &'a str,
}

impl Entries<'_> {
    /// The entry of a write that has just moved `next`'s balance by `amount`, if it did.
    fn record(&self, next: &mut AccountDoc, amount: i64, kind: EntryKind) -> Option<Entry> {
        (amount != 0).then(|| next.record_entry(self.now_millis, amount, kind, self.transfer_id))
    }

    /// Where the entry of the apply a settle or undo removes goes: dropped if the transfer
    /// filed it, else kept until someone does; and what the transfer filed of the account's
    /// unfiled entries, dropped.
    fn settle_applied(&self, next: &mut AccountDoc, applied: Option<Entry>) {
        if let Some(applied) = applied.filter(|e| !self.filed.contains(&e.seq)) {
            next.keep_unfiled(&applied);
        }
        next.drop_filed(self.filed);
    }
}

/// Core steps 2/3: add the delta, remember the id as pending with its `mark` and the entry
/// the apply made.
fn apply(
    account: &AccountDoc,
    (transfer_id, mark): (&str, &str),
    change: Change,
    currency: CurrencyRule<&str>,
    (entries, retention): (Entries<'_>, Retention),
) -> Result<AccountDoc, Refusal> {
    let now_millis = entries.now_millis;
    let entry_room = Some((now_millis, retention));
    let (balance, pending_credits, pending_debits) =
        apply_rules(account, currency, change, entry_room)?;
    let mut next = account.clone();
    next.balance = balance;
    next.pending_credits = pending_credits;
    next.pending_debits = pending_debits;
    let kind = EntryKind::of_apply(change.delta, entries.hold);
    let entry = entries.record(&mut next, change.delta, kind);
    next.add_pending(transfer_id, now_millis, mark, entry.as_ref());
    debug_assert_moved_by(account, &next, change);
    debug_assert!(
        !change.debits || next.available() >= 0,
        "a debit left {} below its floor {} (pending credits {})",
        next.balance,
        next.floor,
        next.pending_credits
    );
    Ok(next)
}

/// The rules of every apply, two-phase or in one transaction ([`settle_at_once`]), in their
/// order: the currency (a mismatch is final, so it comes before the bound), room for one more
/// pending entry (`entry_room`: the time and retention it is judged by; `None` for an apply
/// that leaves no entry), then the floor and overflow ([`applied_sums`]). Answers the balance
/// and pending sums once `change` is applied, or why it may not be.
fn apply_rules(
    account: &AccountDoc,
    currency: CurrencyRule<&str>,
    change: Change,
    entry_room: Option<(i64, Retention)>,
) -> Result<(i64, i64, i64), Refusal> {
    if !currency.admits(account.currency.as_deref()) {
        return Err(Refusal::CurrencyMismatch);
    }
    // A full account only has to wait.
    if entry_room.is_some_and(|(now_millis, retention)| is_full(account, now_millis, retention)) {
        return Err(Refusal::AccountBusy);
    }
    applied_sums(account, change)
}

/// Units are conserved (`docs/design.md §4`): an apply moves the account's balance by exactly
/// its side's share of the transfer, and the shares of a transfer's accounts sum to zero.
fn debug_assert_moved_by(before: &AccountDoc, after: &AccountDoc, change: Change) {
    debug_assert_eq!(
        after.balance as i128 - before.balance as i128,
        change.delta as i128,
        "an apply on {} moved its balance by other than its share",
        before.account_id
    );
}

/// The balance and pending sums once `change` is applied, or why it may not be: the floor
/// and overflow rules of every apply.
fn applied_sums(account: &AccountDoc, change: Change) -> Result<(i64, i64, i64), Refusal> {
    // Spendable = balance − uncommitted credits − floor, so that undoing any pending credit
    // later can never leave the balance below the floor.
    if change.debits && account.available() < change.debit as i128 {
        return Err(Refusal::InsufficientFunds);
    }
    let (Some(balance), Some(pending_credits), Some(pending_debits)) = (
        account.balance.checked_add(change.delta),
        account.pending_credits.checked_add(change.credit),
        account.pending_debits.checked_add(change.debit),
    ) else {
        return Err(Refusal::Overflow);
    };
    // A credit must leave room to undo every pending debit: the balance they would restore
    // has to fit too.
    if i64::try_from(balance as i128 + pending_debits as i128).is_err() {
        return Err(Refusal::Overflow);
    }
    Ok((balance, pending_credits, pending_debits))
}

/// One account's part of a transfer settled in one store transaction (`docs/design.md §3`,
/// "In one transaction"): the rules of an apply ([`apply_rules`], save the room for a
/// pending entry, since none is left) and the delta, with no pending entry and no tombstone.
/// Nothing can apply the transfer to the account again: its document becomes terminal in
/// the same commit, and every two-phase apply comes after a `pending` write of it, which a
/// terminal transfer refuses. An account that holds the transfer already (pending or
/// settled) contradicts a `created` transfer: refused with [`Refusal::AlreadySettled`], for
/// the two-phase path to sort out (a two-phase apply finds a pending entry done instead).
pub fn settle_at_once(
    account: &AccountDoc,
    step: AccountStep<'_>,
    now: &Now,
    retention: Retention,
) -> Result<(AccountDoc, Option<Entry>), Refusal> {
    let id = step.transfer_id;
    if is_pending(account, id) || account.settled.contains(id) {
        return Err(Refusal::AlreadySettled);
    }
    // Nothing stays pending: the pending sums are checked as an apply would and left as
    // they were.
    let change = Change::of(step.side, step.amount);
    let (balance, _, _) = apply_rules(account, step.currency, change, None)?;
    let mut next = account.clone();
    next.balance = balance;
    debug_assert_moved_by(account, &next, change);
    let entries = Entries {
        now_millis: now.millis,
        hold: false,
        filed: &[],
        transfer_id: id,
    };
    let entry = entries.record(
        &mut next,
        change.delta,
        EntryKind::of_apply(change.delta, false),
    );
    stamp(&mut next, now, retention);
    Ok((next, entry))
}

/// Core steps 5/6: forget the pending entry. `give_back` is what the
/// balance returns of the applied delta: 0 when all of it settles; for a hold captured in
/// part, `amount − captured` back to the source (positive) and off the destination
/// (negative). Both fit: the source's room was kept for undoing its pending debits, and the
/// destination's credit was never spendable.
fn remove(
    account: &AccountDoc,
    change: Change,
    give_back: i128,
    entries: Entries<'_>,
) -> Result<AccountDoc, Refusal> {
    let balance =
        i64::try_from(account.balance as i128 - give_back).map_err(|_| Refusal::Overflow)?;
    let mut next = account.clone();
    // `give_back` fits an i64: the balance it moved did.
    forget_pending(
        &mut next,
        balance,
        change,
        (-(give_back as i64), EntryKind::Release),
        entries,
    );
    Ok(next)
}

/// Rollback steps 2/3: take the delta back if it was applied (`applied`: the change, when
/// the transfer's entry is pending on the account). The account is written either way (the
/// caller stamps it).
fn undo(
    account: &AccountDoc,
    applied: Option<Change>,
    entries: Entries<'_>,
) -> Result<AccountDoc, Refusal> {
    let mut next = account.clone();
    next.drop_filed(entries.filed);
    if let Some(change) = applied {
        let balance = account
            .balance
            .checked_sub(change.delta)
            .ok_or(Refusal::Overflow)?;
        let undone = (-change.delta, EntryKind::of_undo(entries.hold));
        forget_pending(&mut next, balance, change, undone, entries);
    }
    // Applied or not, the account is written. Not applied: a worker that stalled before its
    // apply then fails its conditional write (the version moved); one that reads the
    // account afterwards and applies late is given back by the sweep (the transfer is
    // terminal) or by this undo run again (`docs/design.md §9`, "The fence").
    Ok(next)
}

/// What a settle and an undo share: the balance becomes `balance`, the transfer's entry
/// leaves the pending list and sums, its apply's balance entry is dropped or kept
/// ([`Entries::settle_applied`]), and the change of balance this write makes (`moved`, of
/// its kind) is an entry kept until a transfer files it.
fn forget_pending(
    next: &mut AccountDoc,
    balance: i64,
    change: Change,
    (moved, kind): (i64, EntryKind),
    entries: Entries<'_>,
) {
    next.balance = balance;
    // Never below zero, even on a document whose sums an older version did not keep.
    next.pending_credits = next.pending_credits.saturating_sub(change.credit).max(0);
    next.pending_debits = next.pending_debits.saturating_sub(change.debit).max(0);
    let applied = next.remove_pending(entries.transfer_id);
    entries.settle_applied(next, applied);
    if let Some(entry) = entries.record(next, moved, kind) {
        next.keep_unfiled(&entry);
    }
}

/// The account invariants every decision keeps (checked in debug builds, after each one):
/// pending sums are never negative and are zero with nothing pending, and an id is never
/// both pending and settled on the same account.
fn debug_assert_consistent(account: &AccountDoc, transfer_id: &str, op: AccountOp) {
    debug_assert!(
        account.pending_credits >= 0 && account.pending_debits >= 0,
        "{op:?} of {transfer_id} left negative pending sums on {}: credits {}, debits {}",
        account.account_id,
        account.pending_credits,
        account.pending_debits
    );
    debug_assert!(
        !account.pending_transactions.is_empty()
            || (account.pending_credits == 0 && account.pending_debits == 0),
        "{op:?} of {transfer_id} left pending sums on {} with nothing pending",
        account.account_id
    );
    debug_assert!(
        !account
            .pending_transactions
            .iter()
            .any(|id| account.settled.contains(id)),
        "{op:?} of {transfer_id} left an id both pending and settled on {}",
        account.account_id
    );
}

/// What every account decision does to the document it writes: old tombstones dropped, the
/// time stamped.
fn stamp(account: &mut AccountDoc, now: &Now, retention: Retention) {
    prune_settled(account, now.millis, retention);
    account.modification_time.clone_from(&now.text);
}

/// Drops tombstones older than the retention; beyond twice the count bound, the oldest.
fn prune_settled(account: &mut AccountDoc, now_millis: i64, retention: Retention) {
    account
        .settled
        .retain(|_, at| retention.keeps(at, now_millis));
    let hard_bound = retention.max_entries.saturating_mul(2);
    let excess = account.settled.len().saturating_sub(hard_bound);
    if excess > 0 {
        account.settled.retain(|i, _| i >= excess);
    }
}

/// The transfer document after a state write: checked against the arrows, stamped with the
/// time, the reason kept or set. The lease fields are left to [`super::lease`].
pub fn transition(
    transfer: &TransferDoc,
    to: TransferState,
    reason: Option<RollbackReason>,
    now: &Now,
) -> Option<TransferDoc> {
    if !transfer.transaction_state.can_move_to(to) {
        return None;
    }
    let mut next = transfer.clone();
    move_along(&mut next, to, reason, now);
    Some(next)
}

/// [`transition`] on the document itself: `false` (and nothing changed) when `to` is not
/// an arrow from its state.
pub fn transition_in_place(
    transfer: &mut TransferDoc,
    to: TransferState,
    reason: Option<RollbackReason>,
    now: &Now,
) -> bool {
    let allowed = transfer.transaction_state.can_move_to(to);
    if allowed {
        move_along(transfer, to, reason, now);
    }
    allowed
}

fn move_along(
    transfer: &mut TransferDoc,
    to: TransferState,
    reason: Option<RollbackReason>,
    now: &Now,
) {
    transfer.transaction_state = to;
    if reason.is_some() {
        transfer.reason = reason;
    }
    transfer.modification_time = now.timestamp();
}

#[cfg(test)]
mod tests;
