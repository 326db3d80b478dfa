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
//! plus two stale periods for the command; a hold counts from its expiry). Every document must
//! decode, a transfer's times included (an unreadable one is reported once, not again by the
//! checks that would need it; a committed or finished transfer that does not decode can still
//! surface as a balance mismatch of its accounts).
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

use std::process::ExitCode;
use std::time::Duration;

use crate::store::{DynStore, Index, Store, StoreResult};
use crate::transfer::clock::{Clock, SystemClock};
use crate::transfer::model::{AccountDoc, TransferDoc};

mod checks;
mod reader;
mod statements;

use checks::{
    check_account, check_conservation, check_currencies, check_transfer, settled_balances,
};
use reader::{load_all, Loaded};
pub use reader::{MIN_PAGE, PAGE, PAGE_ATTEMPTS, PROGRESS_EVERY};

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
    /// A transfer the service flagged because its documents contradict each other
    /// (`attention`): left alone for a person (`docs/design.md §9`).
    NeedsAttention,
    /// A committed or finished transfer between accounts of different currencies, or in
    /// another currency than it stated: units moved that the protocol must have refused.
    CurrencyMismatch,
    /// An account's statement has a gap, a running sum that does not add up, or a last entry
    /// that is not its balance (`docs/design.md §12`).
    StatementMismatch,
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
                | ViolationKind::StatementMismatch
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
    let filed = statements::filed_entries(transfers.docs.values());
    for (id, a) in &accounts.docs {
        statements::check_statement(&mut report, id, a, filed.get(id));
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
    use crate::store::{ScanPage, StoreError, WriteOp};

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
