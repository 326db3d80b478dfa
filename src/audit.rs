//! `transfer-service audit`: checks the invariants (docs/design.md §4) on the configured store and
//! exits non-zero with a readable report on any violation.
//!
//! The model follows the protocol (src/transfer/protocol.rs): a transfer id in an account's
//! `pending_transactions` says its amount is on that balance, and a transfer reaches
//! `committed` only once both accounts were applied. So for every account `a`:
//!
//! - **exactness**: `balance(a) = opening(a) + Σ deltas on a of the transfers that are
//!   `committed` or `finished` + Σ deltas of a's pending ids whose transfer is `pending` or
//!   `terminating` (applied, not yet undone)`. A committed or finished hold's delta is its
//!   `captured_amount`; its pending entries were applied with the whole `amount`. A pending
//!   id of a `committed` transfer is already counted by its state, but for the part a hold
//!   captured in part still has to give back (`amount − captured_amount`, returned by the
//!   remove). A pending id of a `created`, `finished` or `rolled-back`
//!   transfer is a violation of its own and is counted as the list says (on the balance for
//!   `created` and `rolled-back`, already counted for `finished`), so that one fault is
//!   reported once and not also as a balance mismatch;
//! - `pending_credits` = Σ amounts of a's pending ids where `a` is the destination, and
//!   `pending_debits` = Σ amounts of those where it is the source;
//! - `balance ≥ floor`, and `balance − pending credits ≥ floor` (credits are not spendable
//!   until they commit, so undoing all of them never breaks the floor). In i128;
//! - every pending id names an existing transfer that involves `a`, at most once.
//!
//! Where a pending id names no transfer, an unreadable one, or one that does not involve the
//! account, its amount cannot be counted: that account's exactness and pending sums, and
//! conservation, are not checked (the pending id is the violation reported).
//!
//! **Conservation**: `Σ balance = Σ opening + Σ deltas of the pending ids counted above`
//! (those of `pending`/`terminating` transfers, and of the `created`/`rolled-back` ones
//! already reported). Every committed or finished transfer moves units between two accounts,
//! so it changes no total.
//!
//! For every transfer: its document id is its `transaction_id`; it moves a positive amount
//! between two different accounts; when `committed` or `finished`, both accounts exist (a
//! `rolled-back` one may name a missing account: `account_not_found`; an in-flight one may
//! too, until it rolls back); when in flight (`created`, `pending`, `committed`,
//! `terminating`), it is not stuck (in flight longer than `stuck_after`: `TRANSFER_TIMEOUT`
//! plus two stale periods for the command; a hold counts from its expiry), and a `creation_time` that does not parse is
//! itself a violation. Every document must decode (an unreadable one is reported once, not
//! again by the checks that would need it; a committed or finished transfer that does not
//! decode can still surface as a balance mismatch of its accounts).
//!
//! **Reading a large store.** Documents are read a page at a time (at most [`PAGE`]), each
//! page with its own time limit (`AUDIT_PAGE_TIMEOUT` on Elasticsearch). A page that fails
//! transiently (timed out, rejected) is asked again from the same cursor with half as many
//! documents, down to [`MIN_PAGE`], at most [`PAGE_ATTEMPTS`] times in a row, and the smaller
//! size is kept for the rest of that index; only then does the audit fail. Progress (pages
//! and documents read) is logged every [`PROGRESS_EVERY`] and when an index is done.
//!
//! **Snapshots.** With the embedded store the two scans (accounts, then transfers) see one
//! quiescent file: stop the service first, as redb lets one process hold the file. With
//! Elasticsearch the scans are separate near-real-time searches while the service runs, so
//! a transfer that moves on between them can look like a balance, conservation, pending-id
//! or missing-account violation. Run the audit at a quiet moment, or expect such transient
//! mismatches to disappear on a re-run: the `audit` command, on any store other than the
//! embedded one, audits again once after 2 s when the first pass found a violation of one of
//! those kinds, and reports the second pass.

use crate::time::parse_millis;
use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::store::{DynStore, Index, ScanPage, Store, StoreResult};
use crate::transfer::clock::{Clock, SystemClock};
use crate::transfer::documents::{decode_source, Document};
use crate::transfer::model::{AccountDoc, TransferDoc, TransferState};
use crate::transfer::protocol::Side;

/// What kind of invariant a [`Violation`] breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ViolationKind {
    /// A document that does not decode as an account or a transfer.
    UnreadableDocument,
    /// A document whose repeated id (`account_id`, `transaction_id`) is not its id.
    IdMismatch,
    /// A transfer no request can create: amount ≤ 0, or the same source and destination.
    MalformedTransfer,
    /// A balance that is not opening + committed/finished transfers + in-flight pending ids.
    BalanceMismatch,
    /// The sum of balances is not the sum of openings plus the in-flight pending amounts.
    Conservation,
    /// `balance < floor`.
    BelowFloor,
    /// `balance − pending credits < floor`: undoing the pending credits would break the floor.
    UnspendableCredits,
    /// `pending_credits` is not the sum of the pending credits.
    PendingCreditsDrift,
    /// `pending_debits` is not the sum of the pending debits.
    PendingDebitsDrift,
    /// A pending id of a transfer that is `created`, `finished` or `rolled-back`.
    PendingNotInFlight,
    /// A pending id that names no transfer.
    PendingUnknown,
    /// A pending id of a transfer that does not involve the account.
    PendingUnrelated,
    /// The same id twice in one pending list.
    PendingDuplicate,
    /// A committed or finished transfer whose account does not exist.
    MissingAccount,
    /// A transfer in flight for longer than `stuck_after`.
    Stuck,
    /// An in-flight transfer whose `creation_time` does not parse (so it cannot be told
    /// whether it is stuck).
    UnreadableTime,
    /// A transfer the service flagged because its documents contradict each other
    /// (`attention`): left alone for a person (`docs/design.md §9`).
    NeedsAttention,
    /// A committed or finished transfer between accounts of different currencies, or in
    /// another currency than it stated: units moved that the protocol must have refused.
    CurrencyMismatch,
}

impl ViolationKind {
    /// Whether concurrent progress between the two scans of a live store can produce it (see
    /// the module doc); the `audit` command re-checks before reporting those.
    pub fn may_be_transient(self) -> bool {
        matches!(
            self,
            ViolationKind::BalanceMismatch
                | ViolationKind::Conservation
                | ViolationKind::PendingNotInFlight
                | ViolationKind::PendingUnknown
                | ViolationKind::MissingAccount
        )
    }
}

/// One invariant that does not hold.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub kind: ViolationKind,
    /// In words, naming the documents and numbers involved.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The outcome of one audit.
#[derive(Debug, Default, Clone)]
pub struct AuditReport {
    /// Account documents, readable or not.
    pub accounts: usize,
    /// Transfer documents, readable or not.
    pub transfers: usize,
    pub in_flight: usize,
    pub finished: usize,
    pub rolled_back: usize,
    /// Ids in all the accounts' pending lists together.
    pub pending_entries: usize,
    pub total_balance: i128,
    pub total_opening: i128,
    /// Every invariant that does not hold, sorted by kind.
    pub violations: Vec<Violation>,
}

impl AuditReport {
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// Nothing in flight and every account's pending list empty.
    pub fn is_quiescent(&self) -> bool {
        self.in_flight == 0 && self.pending_entries == 0
    }

    /// The kinds of the violations found, in report order (with repeats).
    pub fn kinds(&self) -> Vec<ViolationKind> {
        self.violations.iter().map(|v| v.kind).collect()
    }

    pub fn has(&self, kind: ViolationKind) -> bool {
        self.violations.iter().any(|v| v.kind == kind)
    }

    fn violation(&mut self, kind: ViolationKind, message: String) {
        self.violations.push(Violation { kind, message });
    }
}

impl std::fmt::Display for AuditReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "accounts: {}, transfers: {} (finished {}, rolled back {}, in flight {}), pending ids: {}",
            self.accounts,
            self.transfers,
            self.finished,
            self.rolled_back,
            self.in_flight,
            self.pending_entries
        )?;
        writeln!(
            f,
            "total balance: {}, total opening balance: {}",
            self.total_balance, self.total_opening
        )?;
        if self.violations.is_empty() {
            write!(f, "OK: every invariant holds")
        } else {
            writeln!(f, "VIOLATIONS ({}):", self.violations.len())?;
            for v in &self.violations {
                writeln!(f, "  - {v}")?;
            }
            Ok(())
        }
    }
}

/// Documents per page at first.
pub const PAGE: usize = 500;
/// The smallest page a failing page shrinks to.
pub const MIN_PAGE: usize = 10;
/// Attempts at one page (the same cursor) before the audit fails.
pub const PAGE_ATTEMPTS: u32 = 6;
/// Pause before asking a failed page again, times the attempt number.
const PAGE_BACKOFF: Duration = Duration::from_millis(200);
/// How often reading an index logs its progress.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Every document of an index: the readable ones, and the ids of those that do not decode.
struct Loaded<T> {
    docs: BTreeMap<String, T>,
    unreadable: BTreeSet<String>,
}

impl<T> Loaded<T> {
    /// Documents, readable or not.
    fn len(&self) -> usize {
        self.docs.len() + self.unreadable.len()
    }
}

async fn load_all<T: Document>(
    store: &dyn Store,
    index: Index,
    report: &mut AuditReport,
) -> StoreResult<Loaded<T>> {
    let mut out = Loaded {
        docs: BTreeMap::new(),
        unreadable: BTreeSet::new(),
    };
    let mut after: Option<String> = None;
    let mut reader = PageReader::new(index);
    loop {
        let page = reader.next_page(store, after.as_deref()).await?;
        for doc in page.docs {
            match decode_source::<T>(&doc.source) {
                Ok(parsed) => {
                    out.docs.insert(doc.id, parsed);
                }
                Err(e) => {
                    report.violation(
                        ViolationKind::UnreadableDocument,
                        format!("{index}/{}: unreadable document: {e}", doc.id),
                    );
                    out.unreadable.insert(doc.id);
                }
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => {
                reader.done();
                return Ok(out);
            }
        }
    }
}

/// Reads one index page by page: shrinks the page on transient failures and logs progress
/// (see "Reading a large store" in the module docs).
struct PageReader {
    index: Index,
    page: usize,
    pages: u64,
    documents: u64,
    started: Instant,
    last_progress: Instant,
}

impl PageReader {
    fn new(index: Index) -> Self {
        let now = Instant::now();
        Self {
            index,
            page: PAGE,
            pages: 0,
            documents: 0,
            started: now,
            last_progress: now,
        }
    }

    /// The page after the cursor `after`, asked again smaller while it fails transiently.
    async fn next_page(&mut self, store: &dyn Store, after: Option<&str>) -> StoreResult<ScanPage> {
        let index = self.index;
        let mut attempt = 1;
        let page = loop {
            match store.scan(index, after, self.page).await {
                Ok(page) => break page,
                Err(error) if error.is_retryable() && attempt < PAGE_ATTEMPTS => {
                    let smaller = (self.page / 2).max(MIN_PAGE);
                    tracing::warn!(
                        %index, %error, attempt, page = self.page, next_page = smaller,
                        "audit: a page failed; asking again with a smaller page"
                    );
                    self.page = smaller;
                    tokio::time::sleep(PAGE_BACKOFF * attempt).await;
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        };
        self.pages += 1;
        self.documents += page.docs.len() as u64;
        if self.last_progress.elapsed() >= PROGRESS_EVERY {
            self.last_progress = Instant::now();
            tracing::info!(
                %index, pages = self.pages, documents = self.documents, page = self.page,
                "audit: reading"
            );
        }
        Ok(page)
    }

    fn done(&self) {
        tracing::info!(
            index = %self.index, pages = self.pages, documents = self.documents,
            elapsed_ms = self.started.elapsed().as_millis() as u64,
            "audit: index read"
        );
    }
}

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

/// Audits the store. `stuck_after_millis`: an in-flight transfer older than this is reported.
pub async fn audit(store: &dyn Store, stuck_after_millis: i64) -> StoreResult<AuditReport> {
    store.refresh().await?;
    let mut report = AuditReport::default();
    let accounts: Loaded<AccountDoc> = load_all(store, Index::Accounts, &mut report).await?;
    let transfers: Loaded<TransferDoc> = load_all(store, Index::Transactions, &mut report).await?;
    report.accounts = accounts.len();
    report.transfers = transfers.len();

    let now = SystemClock.wall_millis();
    for (id, t) in &transfers.docs {
        check_transfer(&mut report, id, t, now, stuck_after_millis);
    }
    let settled = settled_balances(&mut report, &accounts, &transfers.docs);
    check_currencies(&mut report, &accounts, &transfers.docs);

    // Conservation needs every balance and every in-flight amount: `None` once one is missing.
    let mut in_flight_delta = accounts.unreadable.is_empty().then_some(0);
    for (id, a) in &accounts.docs {
        let listed = check_account(&mut report, id, a, &settled, &transfers);
        in_flight_delta = in_flight_delta
            .zip(listed)
            .map(|(sum, listed)| sum + listed);
    }
    if let Some(in_flight_delta) = in_flight_delta {
        check_conservation(&mut report, in_flight_delta);
    }
    report.violations.sort();
    Ok(report)
}

/// Counts the transfer by state and checks what holds for it alone: its id, its shape, and
/// that it is not stuck.
fn check_transfer(
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
    if t.is_multi_leg() {
        let total = crate::transfer::model::check_legs(&t.legs);
        let listed: Vec<&str> = t.postings().iter().map(|p| p.account).collect();
        if total != Ok(t.amount)
            || t.legs.len() < 2
            || !t.src_acct.is_empty()
            || !t.dest_acct.is_empty()
            || t.accounts != listed
        {
            report.violation(
                MalformedTransfer,
                format!(
                    "transfer {id} has {} legs that no request can create \
                     (legs {:?}, amount {}, accounts {:?})",
                    t.legs.len(),
                    total,
                    t.amount,
                    t.accounts
                ),
            );
        }
    } else if t.amount <= 0 || t.src_acct == t.dest_acct {
        report.violation(
            MalformedTransfer,
            format!(
                "transfer {id} moves {} from {} to {}: no request can create it",
                t.amount, t.src_acct, t.dest_acct
            ),
        );
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

/// An in-flight transfer must not be older than `stuck_after_millis`, and its age must be
/// readable.
fn check_not_stuck(
    report: &mut AuditReport,
    id: &str,
    t: &TransferDoc,
    now: i64,
    stuck_after_millis: i64,
) {
    let state = t.transaction_state;
    // A hold waits by design until it expires: its age counts from then.
    let since = match (parse_millis(&t.creation_time), t.hold_expires_millis()) {
        (Some(created), Some(expires)) => Some(created.max(expires)),
        (created, _) => created,
    };
    match since {
        Some(since) if now.saturating_sub(since) > stuck_after_millis => report.violation(
            ViolationKind::Stuck,
            format!(
                "transfer {id} is stuck in {state} since {}",
                t.creation_time
            ),
        ),
        Some(_) => {}
        None => report.violation(
            ViolationKind::UnreadableTime,
            format!(
                "transfer {id} is {state} and its creation_time {:?} does not parse: \
                 cannot tell whether it is stuck",
                t.creation_time
            ),
        ),
    }
}

/// Per readable account: opening + Σ deltas of the committed and finished transfers. A
/// committed or finished transfer whose account does not exist is reported.
fn settled_balances<'a>(
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
fn check_currencies(
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
fn check_account(
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
                t.amount,
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
fn check_conservation(report: &mut AuditReport, in_flight_delta: i128) {
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

/// The `audit` command on `store` (opened by `crate::app::audit`), calling a transfer in
/// flight for longer than `stuck` milliseconds stuck.
pub async fn run(store: DynStore, stuck: i64) -> ExitCode {
    let mut result = audit(store.as_ref(), stuck).await;
    // A live, shared store is not scanned as one snapshot (see the module doc): look again
    // before reporting what concurrent progress can explain. The embedded file is held by
    // this process alone, so nothing can move there.
    if let Ok(report) = &result {
        let transient = report.violations.iter().any(|v| v.kind.may_be_transient());
        if transient && store.backend() != "embedded" {
            eprintln!(
                "audit: found {} violation(s), some possibly from transfers moving between the \
                 two scans; auditing again in 2 s",
                report.violations.len()
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
            result = audit(store.as_ref(), stuck).await;
        }
    }
    match result {
        Ok(report) => {
            println!("{report}");
            if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("audit: store error: {error}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use serde_json::{json, Value};

    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{StoreError, WriteOp};

    /// An embedded store whose scans of more than `largest` documents time out, recording
    /// the size every scan asked for and whether it was answered.
    struct SlowPages {
        inner: EmbeddedStore,
        largest: usize,
        scans: Mutex<Vec<(usize, bool)>>,
        _dir: tempfile::TempDir,
    }

    impl SlowPages {
        async fn with_accounts(count: usize, largest: usize) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let inner = EmbeddedStore::open(dir.path()).unwrap();
            let ops = (0..count)
                .map(|n| WriteOp::Create {
                    index: Index::Accounts,
                    id: format!("acct-{n:04}"),
                    source: account(&format!("acct-{n:04}")).into(),
                })
                .collect();
            for result in inner.bulk(ops).await.unwrap() {
                assert!(result.unwrap().written().is_some());
            }
            Self {
                inner,
                largest,
                scans: Mutex::new(Vec::new()),
                _dir: dir,
            }
        }

        fn scans(&self) -> Vec<(usize, bool)> {
            self.scans.lock().unwrap().clone()
        }
    }

    fn account(id: &str) -> Value {
        json!({
            "account_id": id,
            "balance": 10,
            "opening_balance": 10,
            "creation_time": "2026-01-01T00:00:00.000Z",
            "modification_time": "2026-01-01T00:00:00.000Z",
        })
    }

    #[async_trait]
    impl crate::store::Forwarding for SlowPages {
        fn inner(&self) -> &dyn Store {
            &self.inner
        }

        async fn scan(
            &self,
            index: Index,
            after: Option<&str>,
            limit: usize,
        ) -> StoreResult<ScanPage> {
            let answered = limit <= self.largest;
            self.scans.lock().unwrap().push((limit, answered));
            if !answered {
                return Err(StoreError::Unavailable("scan: timed out".into()));
            }
            self.inner.scan(index, after, limit).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_that_times_out_is_asked_again_smaller() {
        let store = SlowPages::with_accounts(300, 100).await;

        let report = audit(&store, i64::MAX)
            .await
            .expect("the audit goes through");

        assert!(report.is_clean(), "{report}");
        assert_eq!(report.accounts, 300);
        let scans = store.scans();
        // Accounts: 500, 250 and 125 time out; 62 at a time reads all 300, and stays at 62.
        let accounts: Vec<(usize, bool)> = scans[..3 + 300 / 62 + 1].to_vec();
        let mut want = vec![(500, false), (250, false), (125, false)];
        want.extend([(62, true); 300 / 62 + 1]);
        assert_eq!(accounts, want);
        // Transfers start over at a full page (another index, other documents).
        assert_eq!(scans[accounts.len()], (PAGE, false));
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_that_keeps_failing_fails_the_audit_after_a_bounded_number_of_attempts() {
        let store = SlowPages::with_accounts(3, 0).await;

        let error = audit(&store, i64::MAX).await.unwrap_err();

        assert!(error.is_retryable(), "{error}");
        let sizes: Vec<usize> = store.scans().iter().map(|(size, _)| *size).collect();
        assert_eq!(sizes, [500, 250, 125, 62, 31, 15]);
        assert_eq!(sizes.len(), PAGE_ATTEMPTS as usize);
    }
}
