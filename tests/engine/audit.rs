//! The auditor against the embedded store, on documents written directly: a clean world, every
//! intermediate state of the protocol (no false positives), and each class of violation
//! detected once (each test names the exact kinds it expects, so it fails if that check is
//! removed, and also if a single fault is reported twice).

use std::sync::Arc;
use transfer_service::time::format_millis;

use serde_json::{json, Value};
use transfer_service::audit::{audit, AuditReport, ViolationKind};
use transfer_service::store::embedded::EmbeddedStore;
use transfer_service::store::{Index, Store, WriteOutcome};
use transfer_service::transfer::clock::{Clock, SystemClock};
use transfer_service::transfer::model::{
    AccountDoc, Legs, RollbackReason, TransferDoc, TransferState,
};
use transfer_service::transfer::protocol::{
    decide_account, plan, transition, AccountDecision, AccountOp, AccountStep, Now, Retention,
    Side, Step,
};

use TransferState::*;
use ViolationKind::*;

/// In flight longer than this is stuck (the fresh documents here are milliseconds old).
const STUCK_AFTER: i64 = 60_000;

struct World {
    store: Arc<EmbeddedStore>,
    _dir: tempfile::TempDir,
}

impl World {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(EmbeddedStore::open(dir.path()).expect("open"));
        World { store, _dir: dir }
    }

    /// Creates or replaces a document, whatever its current version.
    async fn put(&self, index: Index, id: &str, source: Value) {
        let outcome = match self.store.get(index, id).await.unwrap() {
            Some(doc) => self
                .store
                .replace_if(index, id, source.into(), doc.version)
                .await
                .unwrap(),
            None => self.store.create(index, id, source.into()).await.unwrap(),
        };
        assert!(matches!(outcome, WriteOutcome::Written(_)), "{outcome:?}");
    }

    async fn account(&self, a: &AccountDoc) {
        let source = serde_json::to_value(a).unwrap();
        self.put(Index::Accounts, &a.account_id, source).await;
    }

    async fn transfer(&self, t: &TransferDoc) {
        let source = serde_json::to_value(t).unwrap();
        self.put(Index::Transactions, &t.transaction_id, source)
            .await;
    }

    async fn audit(&self) -> AuditReport {
        audit(self.store.as_ref(), STUCK_AFTER).await.unwrap()
    }

    /// The audit of a world where `t` (30 from `a` to `b`) is pending between `accounts`.
    async fn audit_with_t_pending(accounts: &[AccountDoc]) -> AuditReport {
        World::with(&[t_of_30(Pending)], accounts)
            .await
            .audit()
            .await
    }

    /// A world holding `transfers`, then `accounts`.
    async fn with(transfers: &[TransferDoc], accounts: &[AccountDoc]) -> Self {
        let w = World::new();
        for t in transfers {
            w.transfer(t).await;
        }
        w.accounts(accounts).await;
        w
    }

    async fn accounts(&self, accounts: &[AccountDoc]) {
        for a in accounts {
            self.account(a).await;
        }
    }
}

fn now_text() -> String {
    format_millis(SystemClock.wall_millis())
}

/// A fresh account as its document is read: the fields every account has, the others at
/// their defaults (floor 0, no currency, nothing pending).
fn account(id: &str, opening: i64) -> AccountDoc {
    serde_json::from_value(json!({
        "account_id": id, "balance": opening, "opening_balance": opening,
        "creation_time": now_text(), "modification_time": now_text(),
    }))
    .expect("an account document")
}

/// `account` with a balance and a pending list; the pending sums are given as (credits, debits).
fn account_with(
    id: &str,
    opening: i64,
    balance: i64,
    pending: &[&str],
    (credits, debits): (i64, i64),
) -> AccountDoc {
    AccountDoc {
        balance,
        pending_transactions: pending.iter().map(|s| s.to_string()).collect(),
        pending_credits: credits,
        pending_debits: debits,
        ..account(id, opening)
    }
}

fn transfer(id: &str, src: &str, dest: &str, amount: i64, state: TransferState) -> TransferDoc {
    TransferDoc {
        transaction_state: state,
        ..TransferDoc::created(id, src, dest, amount, SystemClock.timestamp())
    }
}

/// Asserts the exact kinds found (sorted, with repeats).
fn assert_kinds(report: &AuditReport, expected: &[ViolationKind]) {
    assert_eq!(report.kinds(), expected, "{report}");
}

/// [`assert_kinds`], and that the first violation's message says `text`.
fn assert_kinds_saying(report: &AuditReport, expected: &[ViolationKind], text: &str) {
    assert_kinds(report, expected);
    assert!(report.violations[0].message.contains(text), "{report}");
}

/// `t`: 30 from `a` to `b`, in `state`.
fn t_of_30(state: TransferState) -> TransferDoc {
    transfer("t", "a", "b", 30, state)
}

/// `a` (opened with 100) with the debit of `t` applied and pending.
fn a_with_t_applied() -> AccountDoc {
    account_with("a", 100, 70, &["t"], (0, 30))
}

/// `b` (opened with 0) with the credit of `t` applied and pending.
fn b_with_t_applied() -> AccountDoc {
    account_with("b", 0, 30, &["t"], (30, 0))
}

/// `a` opened with 100 and `b` with nothing, untouched.
fn a_and_b() -> [AccountDoc; 2] {
    [account("a", 100), account("b", 0)]
}

// ---------------------------------------------------------------- no false positives

#[tokio::test]
async fn a_clean_quiescent_world_is_clean() {
    let w = World::new();
    let mut a = account("a", 100);
    let mut b = account("b", 5);
    b.floor = -50;
    let c = account("c", 0);
    w.transfer(&transfer("t1", "a", "b", 30, Finished)).await;
    w.transfer(&transfer("t2", "b", "c", 80, Finished)).await;
    let mut rolled = transfer("t3", "a", "c", 1_000, RolledBack);
    rolled.reason = Some(RollbackReason::InsufficientFunds);
    w.transfer(&rolled).await;
    a.balance = 70;
    b.balance = 5 + 30 - 80;
    w.account(&a).await;
    w.account(&b).await;
    w.account(&AccountDoc { balance: 80, ..c }).await;
    let report = w.audit().await;
    assert_kinds(&report, &[]);
    assert!(report.is_quiescent(), "{report}");
    assert_eq!(
        (
            report.accounts,
            report.transfers,
            report.finished,
            report.rolled_back
        ),
        (3, 3, 2, 1)
    );
    assert_eq!((report.total_balance, report.total_opening), (105, 105));
}

#[tokio::test]
async fn a_committed_transfer_half_cleaned_is_no_violation() {
    // After core step 5: the source's pending id is removed, the destination's is not yet.
    let w = World::with(
        &[t_of_30(Committed)],
        &[account_with("a", 100, 70, &[], (0, 0)), b_with_t_applied()],
    )
    .await;
    let report = w.audit().await;
    assert_kinds(&report, &[]);
    assert!(!report.is_quiescent());
}

/// Drives transfers through the real protocol decisions, step by step (interleaved as
/// `script` says), auditing after every write: every state the protocol passes through is
/// clean.
async fn walk(accounts: &[(&str, i64)], transfers: &[TransferDoc], script: &[(usize, Step)]) {
    let w = World::new();
    let now = Now::at(SystemClock.wall_millis());
    let mut docs: Vec<AccountDoc> = accounts.iter().map(|(id, o)| account(id, *o)).collect();
    for a in &docs {
        w.account(a).await;
    }
    let mut ts = transfers.to_vec();
    for t in &ts {
        w.transfer(t).await;
    }
    assert_kinds(&w.audit().await, &[]);
    for (i, (k, step)) in script.iter().enumerate() {
        let t = &mut ts[*k];
        match *step {
            Step::SetState(to) => {
                let reason = (to == Terminating).then_some(RollbackReason::Cancelled);
                *t = transition(t, to, reason, &now).expect("an allowed arrow");
                w.transfer(t).await;
            }
            // Parking changes only the lease.
            Step::Park => {}
            Step::Account(op, side) => {
                let posting = (
                    side.account(t).to_owned(),
                    side,
                    t.amount(),
                    t.settle_amount(),
                );
                write_account_step(&w, &mut docs, (i, t, op), posting, &now).await;
            }
            // Every account of a multi-leg transaction, each with its net change; the audit
            // runs after each account's write.
            Step::EachAccount(op) => {
                let postings: Vec<Posting> = t
                    .postings()
                    .iter()
                    .map(|p| (p.account.to_owned(), p.side, p.amount, p.settle_amount))
                    .collect();
                for posting in postings {
                    write_account_step(&w, &mut docs, (i, t, op), posting, &now).await;
                    assert_kinds(&w.audit().await, &[]);
                }
            }
        }
        assert_kinds(&w.audit().await, &[]);
    }
    let report = w.audit().await;
    assert!(report.is_quiescent(), "{report}");
}

/// One account's part in a transfer: the account, its side, the amount and the settle amount.
type Posting = (String, Side, i64, i64);

/// Step `i` of [`walk`]: decides `op` of `t` on the account of `posting` in `docs`, as the
/// protocol would, and writes what it decides; a refusal fails the walk.
async fn write_account_step(
    w: &World,
    docs: &mut [AccountDoc],
    (i, t, op): (usize, &TransferDoc, AccountOp),
    (id, side, amount, settle_amount): Posting,
    now: &Now,
) {
    let retention = Retention {
        millis: 3_600_000,
        max_entries: 100,
    };
    let a = docs.iter_mut().find(|a| a.account_id == id).unwrap();
    let step = AccountStep {
        settle_amount,
        ..AccountStep::plain(&t.transaction_id, op, side, amount)
    };
    match decide_account(a, step, now, retention) {
        AccountDecision::Write(next) => {
            *a = next;
            w.account(a).await;
        }
        AccountDecision::AlreadyDone => {}
        refused => panic!("step {i} refused: {refused:?}"),
    }
}

fn steps(k: usize, states: &[TransferState]) -> Vec<(usize, Step)> {
    states
        .iter()
        .flat_map(|s| plan(*s).iter().map(move |step| (k, *step)))
        .collect()
}

#[tokio::test]
async fn every_state_of_a_commit_is_clean() {
    let t = transfer("t", "a", "b", 30, Created);
    walk(
        &[("a", 100), ("b", 0)],
        &[t],
        &steps(0, &[Created, Pending, Committed]),
    )
    .await;
}

/// A hold of 30, captured for `captured`.
fn captured_hold(id: &str, src: &str, dest: &str, captured: i64) -> TransferDoc {
    TransferDoc {
        hold_expires_at: Some(SystemClock.timestamp().plus_millis(3_600_000)),
        captured_amount: Some(captured),
        ..transfer(id, src, dest, 30, Created)
    }
}

#[tokio::test]
async fn every_state_of_a_partly_captured_hold_is_clean() {
    // Applied with 30, 12 captured: the removes give 18 back to `a` and take it off `b`.
    walk(
        &[("a", 100), ("b", 0)],
        &[captured_hold("t", "a", "b", 12)],
        &steps(0, &[Created, Pending, Committed]),
    )
    .await;
    // The destination settled first.
    use transfer_service::transfer::protocol::AccountOp::*;
    let mut script = steps(0, &[Created, Pending]);
    script.extend([
        (0, Step::Account(Remove, Side::Destination)),
        (0, Step::Account(Remove, Side::Source)),
        (0, Step::SetState(Finished)),
    ]);
    walk(
        &[("a", 100), ("b", 0)],
        &[captured_hold("t", "a", "b", 12)],
        &script,
    )
    .await;
}

#[tokio::test]
async fn a_captured_hold_whose_accounts_kept_the_whole_amount_is_a_mismatch() {
    // Finished, captured for 12 of 30, but the balances moved 30: both accounts are off.
    let w = World::new();
    let mut t = captured_hold("t", "a", "b", 12);
    t.transaction_state = Finished;
    w.transfer(&t).await;
    w.account(&account_with("a", 100, 70, &[], (0, 0))).await;
    w.account(&account_with("b", 0, 30, &[], (0, 0))).await;
    assert_kinds(&w.audit().await, &[BalanceMismatch, BalanceMismatch]);
    // As the protocol leaves it: 12 moved.
    w.account(&account_with("a", 100, 88, &[], (0, 0))).await;
    w.account(&account_with("b", 0, 12, &[], (0, 0))).await;
    assert_kinds(&w.audit().await, &[]);
}

#[tokio::test]
async fn a_waiting_hold_is_stuck_only_past_its_expiry() {
    let w = World::new();
    let mut t = captured_hold("t", "a", "b", 1);
    t.captured_amount = None;
    t.transaction_state = Pending;
    // Created long ago (past any transfer timeout), waiting an hour more: not stuck.
    t.creation_time = SystemClock.timestamp().plus_millis(-10 * STUCK_AFTER);
    w.transfer(&t).await;
    w.accounts(&[a_with_t_applied(), b_with_t_applied()]).await;
    assert_kinds(&w.audit().await, &[]);
    t.hold_expires_at = Some(SystemClock.timestamp().plus_millis(-2 * STUCK_AFTER));
    w.transfer(&t).await;
    assert_kinds(&w.audit().await, &[Stuck]);
}

#[tokio::test]
async fn every_state_of_a_rollback_is_clean() {
    use transfer_service::transfer::protocol::AccountOp::*;
    let t = || transfer("t", "a", "b", 30, Created);
    // Nothing applied; only the source applied; both applied.
    for applied in [
        vec![],
        vec![Step::Account(Apply, Side::Source)],
        vec![
            Step::Account(Apply, Side::Source),
            Step::Account(Apply, Side::Destination),
        ],
    ] {
        let mut script = vec![(0, Step::SetState(Pending))];
        script.extend(applied.into_iter().map(|s| (0, s)));
        script.push((0, Step::SetState(Terminating)));
        script.extend(steps(0, &[Terminating]));
        walk(&[("a", 100), ("b", 0)], &[t()], &script).await;
    }
    // Created → rolled-back directly.
    walk(
        &[("a", 100), ("b", 0)],
        &[t()],
        &[(0, Step::SetState(RolledBack))],
    )
    .await;
}

#[tokio::test]
async fn interleaved_transfers_on_shared_accounts_are_clean_at_every_step() {
    // a → b and b → a at once, one committing, the other rolling back, steps interleaved.
    use transfer_service::transfer::protocol::AccountOp::*;
    let t0 = transfer("t0", "a", "b", 30, Created);
    let t1 = transfer("t1", "b", "a", 20, Created);
    let mut script = Vec::new();
    let c0 = steps(0, &[Created, Pending, Committed]);
    let r1 = [
        (1, Step::SetState(Pending)),
        (1, Step::Account(Apply, Side::Source)),
        (1, Step::Account(Apply, Side::Destination)),
        (1, Step::SetState(Terminating)),
        (1, Step::Account(Undo, Side::Source)),
        (1, Step::Account(Undo, Side::Destination)),
        (1, Step::SetState(RolledBack)),
    ];
    let (mut x, mut y) = (c0.into_iter(), r1.into_iter());
    loop {
        match (x.next(), y.next()) {
            (None, None) => break,
            (p, q) => script.extend(p.into_iter().chain(q)),
        }
    }
    walk(&[("a", 100), ("b", 50)], &[t0, t1], &script).await;
}

#[tokio::test]
async fn a_rolled_back_transfer_may_name_a_missing_account() {
    let w = World::new();
    let mut t = transfer("t", "a", "ghost", 30, RolledBack);
    t.reason = Some(RollbackReason::AccountNotFound);
    w.transfer(&t).await;
    // In flight, it may too: it will roll back.
    w.transfer(&transfer("u", "ghost", "a", 5, Pending)).await;
    w.account(&account("a", 100)).await;
    assert_kinds(&w.audit().await, &[]);
}

// ---------------------------------------------------------------- each violation class

#[tokio::test]
async fn a_balance_mismatch_is_detected() {
    // Units moved between two accounts with no transfer: totals still agree.
    let w = World::new();
    w.account(&account_with("a", 100, 90, &[], (0, 0))).await;
    w.account(&account_with("b", 0, 10, &[], (0, 0))).await;
    assert_kinds(&w.audit().await, &[BalanceMismatch, BalanceMismatch]);
}

#[tokio::test]
async fn a_balance_mismatch_against_in_flight_amounts_is_detected() {
    // The source's pending id says 30 are off its balance, but the balance did not move.
    let a_not_debited = account_with("a", 100, 100, &["t"], (0, 30));
    let report = World::audit_with_t_pending(&[a_not_debited, account("b", 0)]).await;
    assert_kinds(&report, &[BalanceMismatch, Conservation]);
}

#[tokio::test]
async fn a_conservation_violation_is_detected() {
    let w = World::new();
    w.account(&account_with("a", 100, 110, &[], (0, 0))).await;
    w.account(&account("b", 0)).await;
    let report = w.audit().await;
    assert_kinds(&report, &[BalanceMismatch, Conservation]);
    assert_eq!((report.total_balance, report.total_opening), (110, 100));
}

#[tokio::test]
async fn units_moved_between_currencies_are_detected() {
    // Balances exact, totals equal: only the currencies are wrong.
    let in_currency = |a: AccountDoc, c: Option<&str>| AccountDoc {
        currency: c.map(str::to_owned),
        ..a
    };
    let w = World::new();
    let usd = |id, opening, balance| {
        in_currency(account_with(id, opening, balance, &[], (0, 0)), Some("USD"))
    };
    w.account(&usd("u1", 100, 60)).await;
    w.account(&usd("u2", 0, 40)).await;
    let eur = |balance| in_currency(account_with("e", 0, balance, &[], (0, 0)), Some("EUR"));
    w.account(&eur(0)).await;
    w.account(&account("n", 0)).await;
    // Clean: one currency, stated or not.
    w.transfer(&transfer("same", "u1", "u2", 30, Finished))
        .await;
    let stated = TransferDoc {
        currency: Some("USD".into()),
        ..transfer("stated", "u1", "u2", 10, Finished)
    };
    w.transfer(&stated).await;
    assert_kinds(&w.audit().await, &[]);
    // USD into EUR, USD into an account without a currency (committed counts too), and a
    // transfer stating EUR between two USD accounts.
    w.transfer(&transfer("usd-eur", "u1", "e", 10, Finished))
        .await;
    w.transfer(&transfer("usd-none", "u1", "n", 5, Committed))
        .await;
    w.account(&usd("u1", 100, 45)).await;
    w.account(&eur(10)).await;
    w.account(&account_with("n", 0, 5, &[], (0, 0))).await;
    assert_kinds(&w.audit().await, &[CurrencyMismatch, CurrencyMismatch]);
    // Rolled back: nothing moved, nothing to flag.
    let mut rolled = transfer("rolled", "u2", "e", 1, RolledBack);
    rolled.reason = Some(RollbackReason::CurrencyMismatch);
    w.transfer(&rolled).await;
    let wrong_stated = TransferDoc {
        currency: Some("EUR".into()),
        ..transfer("eur-between-usd", "u2", "u1", 1, Finished)
    };
    w.transfer(&wrong_stated).await;
    w.account(&usd("u1", 100, 46)).await;
    w.account(&usd("u2", 0, 39)).await;
    let report = w.audit().await;
    assert_kinds(
        &report,
        &[CurrencyMismatch, CurrencyMismatch, CurrencyMismatch],
    );
    assert!(report.to_string().contains("eur-between-usd"), "{report}");
}

#[tokio::test]
async fn a_balance_below_its_floor_is_detected() {
    let w = World::new();
    // The debit of t is applied (consistently), but it took a below its floor of 0.
    w.transfer(&transfer("t", "a", "b", 15, Pending)).await;
    w.account(&account_with("a", 10, -5, &["t"], (0, 15))).await;
    w.account(&account("b", 0)).await;
    assert_kinds(&w.audit().await, &[BelowFloor]);
}

#[tokio::test]
async fn spending_uncommitted_credits_is_detected() {
    // b received 30 (not committed) and sent 10 of them: its balance is above the floor, but
    // undoing the credit would take it below.
    let w = World::new();
    w.transfer(&transfer("t1", "a", "b", 30, Pending)).await;
    w.transfer(&transfer("t2", "b", "c", 10, Pending)).await;
    w.account(&account_with("a", 100, 70, &["t1"], (0, 30)))
        .await;
    w.account(&account_with("b", 0, 20, &["t1", "t2"], (30, 10)))
        .await;
    w.account(&account("c", 0)).await;
    assert_kinds(&w.audit().await, &[UnspendableCredits]);
}

#[tokio::test]
async fn pending_credits_drift_is_detected() {
    let b_without_its_credit = account_with("b", 0, 30, &["t"], (0, 0));
    let report = World::audit_with_t_pending(&[a_with_t_applied(), b_without_its_credit]).await;
    assert_kinds(&report, &[PendingCreditsDrift]);
}

#[tokio::test]
async fn pending_debits_drift_is_detected() {
    let a_without_its_debit = account_with("a", 100, 70, &["t"], (0, 0));
    let report = World::audit_with_t_pending(&[a_without_its_debit, b_with_t_applied()]).await;
    assert_kinds(&report, &[PendingDebitsDrift]);
}

#[tokio::test]
async fn a_pending_id_of_a_finished_transfer_is_reported_once() {
    let b_settled = account_with("b", 0, 30, &[], (0, 0));
    let w = World::with(&[t_of_30(Finished)], &[a_with_t_applied(), b_settled]).await;
    assert_kinds_saying(&w.audit().await, &[PendingNotInFlight], "finished");
}

#[tokio::test]
async fn a_pending_id_of_a_rolled_back_transfer_is_reported_once() {
    // The source's undo never happened: the id and its 30 are still there.
    let mut t = t_of_30(RolledBack);
    t.reason = Some(RollbackReason::Cancelled);
    let w = World::with(&[t], &[a_with_t_applied(), account("b", 0)]).await;
    assert_kinds(&w.audit().await, &[PendingNotInFlight]);
}

#[tokio::test]
async fn a_pending_id_of_an_unknown_transfer_is_detected() {
    let w = World::new();
    w.account(&account_with("a", 100, 100, &["ghost"], (0, 0)))
        .await;
    assert_kinds(&w.audit().await, &[PendingUnknown]);
}

#[tokio::test]
async fn a_pending_id_of_an_unrelated_transfer_or_twice_is_detected() {
    let a_listing_t_twice = account_with("a", 100, 70, &["t", "t"], (0, 30));
    let c_listing_t = account_with("c", 0, 0, &["t"], (0, 0));
    let report =
        World::audit_with_t_pending(&[a_listing_t_twice, account("b", 0), c_listing_t]).await;
    assert_kinds(&report, &[PendingUnrelated, PendingDuplicate]);
}

#[tokio::test]
async fn a_committed_or_finished_transfer_needs_both_accounts() {
    let w = World::new();
    w.transfer(&transfer("t", "a", "ghost", 30, Finished)).await;
    w.transfer(&transfer("u", "nobody", "a", 5, Committed))
        .await;
    w.account(&account_with("a", 100, 75, &[], (0, 0))).await;
    let report = w.audit().await;
    // The units that left a landed nowhere: conservation says so too.
    assert_kinds(&report, &[Conservation, MissingAccount, MissingAccount]);
}

#[tokio::test]
async fn a_stuck_transfer_is_detected() {
    let mut t = t_of_30(Pending);
    t.creation_time = SystemClock.timestamp().plus_millis(-2 * STUCK_AFTER);
    // Old but settled: not stuck.
    let mut done = transfer("old", "a", "b", 1, RolledBack);
    done.creation_time = t.creation_time;
    let w = World::with(&[t, done], &a_and_b()).await;
    assert_kinds_saying(&w.audit().await, &[Stuck], "transfer t ");
}

#[tokio::test]
async fn an_unreadable_creation_time_makes_an_unreadable_document() {
    let w = World::with(&[], &a_and_b()).await;
    let mut t = serde_json::to_value(t_of_30(Created)).unwrap();
    t["creation_time"] = json!("last tuesday");
    w.put(Index::Transactions, "t", t).await;
    assert_kinds(&w.audit().await, &[UnreadableDocument]);
}

#[tokio::test]
async fn an_unreadable_document_is_reported_once() {
    let w = World::new();
    // An account without a balance, and a transfer without an amount that an account lists.
    w.put(Index::Accounts, "x", json!({ "account_id": "x" }))
        .await;
    w.put(
        Index::Transactions,
        "t",
        json!({ "transaction_id": "t", "transaction_state": "pending" }),
    )
    .await;
    w.account(&a_with_t_applied()).await;
    let report = w.audit().await;
    assert_kinds(&report, &[UnreadableDocument, UnreadableDocument]);
    assert_eq!((report.accounts, report.transfers), (2, 1));
}

#[tokio::test]
async fn malformed_transfers_and_id_mismatches_are_detected() {
    let w = World::new();
    let mut t = transfer("t", "a", "a", 0, RolledBack);
    t.transaction_id = "other".into();
    w.transfer_as("t", &t).await;
    let mut a = account("a", 100);
    a.account_id = "b".into();
    w.put(Index::Accounts, "a", serde_json::to_value(&a).unwrap())
        .await;
    assert_kinds(
        &w.audit().await,
        &[IdMismatch, IdMismatch, MalformedTransfer],
    );
}

impl World {
    async fn transfer_as(&self, id: &str, t: &TransferDoc) {
        self.put(Index::Transactions, id, serde_json::to_value(t).unwrap())
            .await;
    }
}

/// The steps of a multi-leg transaction (the first) through `states`.
fn leg_steps(states: &[TransferState]) -> Vec<(usize, Step)> {
    use transfer_service::transfer::protocol::plan_legs;
    states
        .iter()
        .flat_map(|s| plan_legs(*s, false).iter().map(|step| (0, *step)))
        .collect()
}

/// A multi-leg transaction of `legs` in `state`, as the service stores it.
fn multi_leg(id: &str, legs: &[(&str, &str, i64)], state: TransferState) -> TransferDoc {
    let legs = crate::support::engine::leg_list(legs);
    let amount = legs.iter().map(|leg| leg.amount).sum();
    TransferDoc {
        legs: Legs::multi_leg(legs, amount),
        ..transfer(id, "", "", 0, state)
    }
}

#[tokio::test]
async fn every_state_of_a_multi_leg_transaction_is_clean() {
    // `a` pays twice and receives once (net −12), `b` receives and pays (net +7), `c` +5.
    let legs = [("a", "b", 10), ("a", "c", 5), ("c", "a", 3), ("b", "c", 3)];
    let accounts = [("a", 100), ("b", 0), ("c", 0)];
    walk(
        &accounts,
        &[multi_leg("t", &legs, Created)],
        &leg_steps(&[Created, Pending, Committed]),
    )
    .await;
    // Rolled back after every account was applied.
    let mut script = steps(0, &[Created]);
    script.push((
        0,
        Step::EachAccount(transfer_service::transfer::protocol::AccountOp::Apply),
    ));
    script.push((0, Step::SetState(Terminating)));
    script.extend(leg_steps(&[Terminating]));
    walk(&accounts, &[multi_leg("t", &legs, Created)], &script).await;
}

#[tokio::test]
async fn a_multi_leg_transaction_is_counted_by_each_accounts_net_change() {
    let w = World::new();
    let t = multi_leg(
        "t",
        &[("a", "b", 10), ("a", "c", 5), ("c", "a", 3)],
        Finished,
    );
    w.transfer(&t).await;
    // Exact: a −12, b +10, c +2.
    w.account(&account_with("a", 100, 88, &[], (0, 0))).await;
    w.account(&account_with("b", 0, 10, &[], (0, 0))).await;
    w.account(&account_with("c", 0, 2, &[], (0, 0))).await;
    assert_kinds(&w.audit().await, &[]);
    // `a` debited its legs' gross debits (15) instead of its net: not exact, nor conserved.
    w.account(&account_with("a", 100, 85, &[], (0, 0))).await;
    assert_kinds(&w.audit().await, &[BalanceMismatch, Conservation]);
    w.account(&account_with("a", 100, 88, &[], (0, 0))).await;
    // Pending: each account's one entry holds its net change in its sums.
    let pending = TransferDoc {
        transaction_id: "p".into(),
        ..multi_leg("p", &[("a", "b", 4), ("b", "c", 1)], Pending)
    };
    w.transfer(&pending).await;
    w.account(&account_with("a", 100, 84, &["p"], (0, 4))).await;
    w.account(&account_with("b", 0, 13, &["p"], (3, 0))).await;
    w.account(&account_with("c", 0, 3, &["p"], (1, 0))).await;
    assert_kinds(&w.audit().await, &[]);
    // `b`'s pending sums counted its gross credit (4), not its net (3).
    w.account(&account_with("b", 0, 13, &["p"], (4, 0))).await;
    assert_kinds(&w.audit().await, &[PendingCreditsDrift]);
    w.account(&account_with("b", 0, 13, &["p"], (3, 0))).await;
    // An entry of the transaction on an account it does not touch.
    w.account(&account_with("d", 0, 0, &["p"], (0, 0))).await;
    assert_kinds(&w.audit().await, &[PendingUnrelated]);
}

#[tokio::test]
async fn malformed_or_mixed_currency_multi_leg_transactions_are_reported() {
    let w = World::new();
    for id in ["a", "b", "c"] {
        w.account(&account(id, 0)).await;
    }
    // Legs whose sum is not the amount, and one whose accounts list is wrong.
    let mut wrong_sum = multi_leg("sum", &[("a", "b", 1), ("b", "c", 1)], RolledBack);
    if let Legs::MultiLeg { amount, .. } = &mut wrong_sum.legs {
        *amount = 3;
    }
    w.transfer(&wrong_sum).await;
    let mut wrong_accounts = multi_leg("acc", &[("a", "b", 1), ("b", "c", 1)], RolledBack);
    if let Legs::MultiLeg { accounts, .. } = &mut wrong_accounts.legs {
        accounts.pop();
    }
    w.transfer(&wrong_accounts).await;
    assert_kinds(&w.audit().await, &[MalformedTransfer, MalformedTransfer]);
    let w = World::new();
    let in_currency = |a: AccountDoc, c: &str| AccountDoc {
        currency: Some(c.into()),
        ..a
    };
    let usd = |id: &str, balance| in_currency(account_with(id, 100, balance, &[], (0, 0)), "USD");
    w.account(&usd("a", 98)).await;
    w.account(&usd("b", 101)).await;
    w.account(&in_currency(
        account_with("e", 100, 101, &[], (0, 0)),
        "EUR",
    ))
    .await;
    // The third account is in another currency.
    let t = multi_leg("mixed", &[("a", "b", 1), ("a", "e", 1)], Finished);
    w.transfer(&t).await;
    assert_kinds(&w.audit().await, &[CurrencyMismatch]);
}
