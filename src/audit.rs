//! `transfer-service audit`: checks the invariants (docs/design.md §4) on the configured store and
//! exits non-zero with a readable report on any violation.
//!
//! The model follows the protocol (src/transfer/protocol.rs): a transfer id in an account's
//! `pending_transactions` says its amount is on that balance, and a transfer reaches
//! `committed` only once both accounts were applied. So for every account `a`:
//!
//! - **exactness**: `balance(a) = opening(a) + Σ deltas on a of the transfers that are
//!   `committed` or `finished` + Σ deltas of a's pending ids whose transfer is `pending` or
//!   `terminating` (applied, not yet undone)`. A pending id of a `committed` transfer is
//!   already counted by its state. A pending id of a `created`, `finished` or `rolled-back`
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
//! plus two stale periods for the command), and a `creation_time` that does not parse is
//! itself a violation. Every document must decode (an unreadable one is reported once, not
//! again by the checks that would need it; a committed or finished transfer that does not
//! decode can still surface as a balance mismatch of its accounts).
//!
//! **Snapshots.** With the embedded store the two scans (accounts, then transfers) see one
//! quiescent file: stop the service first, as redb lets one process hold the file. With
//! Elasticsearch the scans are separate near-real-time searches while the service runs, so
//! a transfer that moves on between them can look like a balance, conservation, pending-id
//! or missing-account violation. Run the audit at a quiet moment, or expect such transient
//! mismatches to disappear on a re-run: the `audit` command, on any store other than the
//! embedded one, audits again once after 2 s when the first pass found a violation of one of
//! those kinds, and reports the second pass.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::Duration;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::{parse_millis, Index, Store, StoreResult};
use crate::transfer::clock::{Clock, SystemClock};
use crate::transfer::model::{AccountDoc, TransferDoc, TransferState};

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

const PAGE: usize = 500;

/// Every document of an index: the readable ones, and the ids of those that do not decode.
struct Loaded<T> {
    docs: BTreeMap<String, T>,
    unreadable: BTreeSet<String>,
}

async fn load_all<T: serde::de::DeserializeOwned>(
    store: &dyn Store,
    index: Index,
    report: &mut AuditReport,
) -> StoreResult<Loaded<T>> {
    let mut out = Loaded {
        docs: BTreeMap::new(),
        unreadable: BTreeSet::new(),
    };
    let mut after: Option<String> = None;
    loop {
        let page = store.scan(index, after.as_deref(), PAGE).await?;
        for doc in page.docs {
            match serde_json::from_value(doc.source) {
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
            None => return Ok(out),
        }
    }
}

/// The two balance changes a transfer makes: (side, account, delta).
fn deltas(t: &TransferDoc) -> [(&'static str, &str, i128); 2] {
    let amount = t.amount as i128;
    [
        ("source", t.src_acct.as_str(), -amount),
        ("destination", t.dest_acct.as_str(), amount),
    ]
}

/// Audits the store. `stuck_after_millis`: an in-flight transfer older than this is reported.
pub async fn audit(store: &dyn Store, stuck_after_millis: i64) -> StoreResult<AuditReport> {
    use TransferState::*;
    use ViolationKind::*;

    store.refresh().await?;
    let mut report = AuditReport::default();
    let accounts: Loaded<AccountDoc> = load_all(store, Index::Accounts, &mut report).await?;
    let transfers: Loaded<TransferDoc> = load_all(store, Index::Transactions, &mut report).await?;
    report.accounts = accounts.docs.len() + accounts.unreadable.len();
    report.transfers = transfers.docs.len() + transfers.unreadable.len();

    // Per account: opening + Σ deltas of the committed and finished transfers.
    let mut settled: BTreeMap<&str, i128> = accounts
        .docs
        .iter()
        .map(|(id, a)| (id.as_str(), a.opening_balance as i128))
        .collect();
    let now = SystemClock.wall_millis();
    for (id, t) in &transfers.docs {
        let state = t.transaction_state;
        match state {
            Finished => report.finished += 1,
            RolledBack => report.rolled_back += 1,
            Created | Pending | Committed | Terminating => report.in_flight += 1,
        }
        if t.transaction_id != *id {
            report.violation(
                IdMismatch,
                format!("transfer {id} says its id is {}", t.transaction_id),
            );
        }
        if t.amount <= 0 || t.src_acct == t.dest_acct {
            report.violation(
                MalformedTransfer,
                format!(
                    "transfer {id} moves {} from {} to {}: no request can create it",
                    t.amount, t.src_acct, t.dest_acct
                ),
            );
        }
        if matches!(state, Committed | Finished) {
            for (side, account, delta) in deltas(t) {
                match settled.get_mut(account) {
                    Some(sum) => *sum += delta,
                    // Already reported as unreadable.
                    None if accounts.unreadable.contains(account) => {}
                    None => report.violation(
                        MissingAccount,
                        format!("transfer {id} is {state} but its {side} account {account} does not exist"),
                    ),
                }
            }
        }
        if !state.is_terminal() {
            match parse_millis(&t.creation_time) {
                Some(created) if now.saturating_sub(created) > stuck_after_millis => report
                    .violation(
                        Stuck,
                        format!(
                            "transfer {id} is stuck in {state} since {}",
                            t.creation_time
                        ),
                    ),
                Some(_) => {}
                None => report.violation(
                    UnreadableTime,
                    format!(
                        "transfer {id} is {state} and its creation_time {:?} does not parse: \
                         cannot tell whether it is stuck",
                        t.creation_time
                    ),
                ),
            }
        }
    }

    // Conservation needs every balance and every in-flight amount.
    let mut conservation_checked = accounts.unreadable.is_empty();
    let mut in_flight_delta: i128 = 0;
    for (id, a) in &accounts.docs {
        if a.account_id != *id {
            report.violation(
                IdMismatch,
                format!("account {id} says its id is {}", a.account_id),
            );
        }
        let balance = a.balance as i128;
        let floor = a.floor as i128;
        report.total_balance += balance;
        report.total_opening += a.opening_balance as i128;
        report.pending_entries += a.pending_transactions.len();

        // What the pending list says: amounts on the balance not counted by a transfer's
        // state, and the credits and debits it holds.
        let mut listed: i128 = 0;
        let mut credits: i128 = 0;
        let mut debits: i128 = 0;
        let mut countable = true;
        let mut seen = BTreeSet::new();
        for tid in &a.pending_transactions {
            if !seen.insert(tid.as_str()) {
                report.violation(
                    PendingDuplicate,
                    format!("account {id} lists {tid} as pending twice"),
                );
                continue;
            }
            if transfers.unreadable.contains(tid) {
                countable = false; // the transfer is reported as unreadable
                continue;
            }
            let Some(t) = transfers.docs.get(tid) else {
                report.violation(
                    PendingUnknown,
                    format!(
                        "account {id} has pending id {tid} of no transfer \
                         (its balance, pending sums and conservation are not checked)"
                    ),
                );
                countable = false;
                continue;
            };
            let amount = t.amount as i128;
            let delta = if t.src_acct == *id {
                debits += amount;
                -amount
            } else if t.dest_acct == *id {
                credits += amount;
                amount
            } else {
                report.violation(
                    PendingUnrelated,
                    format!(
                        "account {id} has {tid} pending, but the transfer moves {} from {} to {} \
                         (its balance, pending sums and conservation are not checked)",
                        t.amount, t.src_acct, t.dest_acct
                    ),
                );
                countable = false;
                continue;
            };
            match t.transaction_state {
                Pending | Terminating => listed += delta,
                Committed => {} // counted by its state
                Finished => report.violation(
                    PendingNotInFlight,
                    format!("account {id} still has {tid} pending, but the transfer is finished"),
                ),
                Created | RolledBack => {
                    report.violation(
                        PendingNotInFlight,
                        format!(
                            "account {id} has {tid} pending (so its {delta:+} is counted on the \
                             balance), but the transfer is {}",
                            t.transaction_state
                        ),
                    );
                    listed += delta;
                }
            }
        }

        if countable {
            in_flight_delta += listed;
            let from_transfers = settled.get(id.as_str()).copied().unwrap_or_default();
            let want = from_transfers + listed;
            if balance != want {
                report.violation(
                    BalanceMismatch,
                    format!(
                        "account {id}: balance {balance}, but opening and committed/finished \
                         transfers give {from_transfers} and its pending ids {listed:+}: {want}"
                    ),
                );
            }
            if a.pending_credits as i128 != credits {
                report.violation(
                    PendingCreditsDrift,
                    format!(
                        "account {id}: pending_credits {} but its pending credits sum to {credits}",
                        a.pending_credits
                    ),
                );
            }
            if a.pending_debits as i128 != debits {
                report.violation(
                    PendingDebitsDrift,
                    format!(
                        "account {id}: pending_debits {} but its pending debits sum to {debits}",
                        a.pending_debits
                    ),
                );
            }
        } else {
            conservation_checked = false;
            credits = a.pending_credits as i128;
        }
        if balance < floor {
            report.violation(
                BelowFloor,
                format!("account {id}: balance {balance} below floor {floor}"),
            );
        } else if balance - credits < floor {
            report.violation(
                UnspendableCredits,
                format!(
                    "account {id}: balance {balance} less pending credits {credits} is below \
                     floor {floor} (undoing those credits would break it)"
                ),
            );
        }
    }
    if conservation_checked && report.total_balance != report.total_opening + in_flight_delta {
        report.violation(
            Conservation,
            format!(
                "conservation: total balance {} ≠ total opening {} + in-flight {in_flight_delta:+}",
                report.total_balance, report.total_opening
            ),
        );
    }
    report.violations.sort();
    Ok(report)
}

/// The `audit` command.
pub async fn run(config: Config) -> ExitCode {
    let metrics = Metrics::new();
    let store =
        match crate::app::open_store(&config, &metrics, crate::app::Migrations::Verify).await {
            Ok(store) => store,
            Err(error) => {
                eprintln!("audit: cannot open the store: {error}");
                return ExitCode::from(2);
            }
        };
    let stuck = (config.transfer_timeout + config.recovery_stale_after * 2).as_millis() as i64;
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
