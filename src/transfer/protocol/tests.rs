//! Unit tests of the protocol's pure decisions (plans, account steps, retention, holds,
//! legs, currencies).
use super::*;
use crate::transfer::model::Tombstones;
use crate::transfer::model::TransferState::*;

const RETAIN: Retention = Retention {
    millis: 60_000,
    max_entries: 3,
};

fn now() -> Now {
    Now::at(1_000_000)
}

fn at(text: &str) -> Timestamp {
    Timestamp::parse(text).expect("a time")
}

fn account(balance: i64) -> AccountDoc {
    AccountDoc {
        account_id: "a".into(),
        balance,
        floor: 0,
        opening_balance: balance,
        created_by: None,
        currency: None,
        metadata: Default::default(),
        pending_transactions: vec![],
        pending_applied_at: vec![],
        pending_marks: vec![],
        pending_credits: 0,
        pending_debits: 0,
        settled: Tombstones::default(),
        legacy_settled: vec![],
        entry_from: 1,
        entry_seq: 0,
        entry_at: 0,
        pending_entries: Vec::new(),
        unfiled: Vec::new(),
        creation_time: "2026-01-01T00:00:00.000Z".into(),
        modification_time: "2026-01-01T00:00:00.000Z".into(),
    }
}

fn step(op: AccountOp, side: Side, amount: i64) -> AccountStep<'static> {
    AccountStep::plain("t1", op, side, amount)
}

fn decide(a: &AccountDoc, op: AccountOp, side: Side, amount: i64) -> AccountDecision {
    decide_account(a, step(op, side, amount), &now(), RETAIN)
}

/// A new account of `balance` after the apply of `amount` on `side`.
fn applied(balance: i64, side: Side, amount: i64) -> AccountDoc {
    write(decide(&account(balance), AccountOp::Apply, side, amount))
}

fn write(decision: AccountDecision) -> AccountDoc {
    match decision {
        AccountDecision::Write(doc) => doc,
        other => panic!("expected a write, got {other:?}"),
    }
}

fn transfer(state: TransferState) -> TransferDoc {
    TransferDoc {
        transaction_state: state,
        lease_owner: Some("w".into()),
        lease_expires_at: Some(at("2026-01-01T00:00:30.000Z")),
        ..TransferDoc::created("t1", "a", "b", 10, at("2026-01-01T00:00:00.000Z"))
    }
}

#[test]
fn only_the_arrows_of_the_post_are_allowed() {
    let allowed = [
        (Created, Pending),
        (Pending, Committed),
        (Committed, Finished),
        (Created, RolledBack),
        (Pending, Terminating),
        (Terminating, RolledBack),
    ];
    for from in TransferState::ALL {
        for to in TransferState::ALL {
            assert_eq!(
                from.can_move_to(to),
                allowed.contains(&(from, to)),
                "{from} → {to}"
            );
            let moved = transition(&transfer(from), to, None, &now());
            assert_eq!(moved.is_some(), allowed.contains(&(from, to)));
        }
    }
}

#[test]
fn committed_never_rolls_back() {
    assert!(!Committed.can_move_to(Terminating));
    assert!(!Committed.can_move_to(RolledBack));
    let t = transfer(Committed);
    assert_eq!(timeout_transition(&t, 0, i64::MAX, 1), None);
}

#[test]
fn plans_follow_the_post_step_by_step() {
    use AccountOp::*;
    use Side::*;
    assert_eq!(plan(Created), &[Step::SetState(Pending)]);
    assert_eq!(
        plan(Pending),
        &[
            Step::Account(Apply, Source),
            Step::Account(Apply, Destination),
            Step::SetState(Committed)
        ]
    );
    assert_eq!(
        plan(Committed),
        &[
            Step::Account(Remove, Source),
            Step::Account(Remove, Destination),
            Step::SetState(Finished)
        ]
    );
    assert_eq!(
        plan(Terminating),
        &[
            Step::Account(Undo, Source),
            Step::Account(Undo, Destination),
            Step::SetState(RolledBack)
        ]
    );
    assert!(plan(Finished).is_empty());
    assert!(plan(RolledBack).is_empty());
}

fn multi(legs: &[(&str, &str, i64)]) -> TransferDoc {
    let legs: Vec<crate::transfer::model::Leg> = legs
        .iter()
        .map(|(f, t, a)| crate::transfer::model::Leg {
            from: (*f).into(),
            to: (*t).into(),
            amount: *a,
        })
        .collect();
    let amount = legs.iter().map(|leg| leg.amount).sum();
    TransferDoc {
        legs: crate::transfer::model::Legs::multi_leg(legs, amount),
        ..transfer(Pending)
    }
}

#[test]
fn a_multi_leg_transaction_takes_each_account_once_in_every_state() {
    use AccountOp::*;
    let t = multi(&[("a", "b", 10), ("a", "c", 5)]);
    let in_state = |state| TransferDoc {
        transaction_state: state,
        ..t.clone()
    };
    let hold = TransferDoc {
        hold_expires_at: Some(at("2026-01-02T00:00:00.000Z")),
        ..t.clone()
    };
    let captured = TransferDoc {
        captured_amount: Some(15),
        ..hold.clone()
    };
    let cases = [
        (
            "pending",
            t.clone(),
            vec![Step::EachAccount(Apply), Step::SetState(Committed)],
        ),
        (
            "committed",
            in_state(Committed),
            vec![Step::EachAccount(Remove), Step::SetState(Finished)],
        ),
        (
            "terminating",
            in_state(Terminating),
            vec![Step::EachAccount(Undo), Step::SetState(RolledBack)],
        ),
        ("a hold", hold, vec![Step::EachAccount(Apply), Step::Park]),
        (
            "a captured hold",
            captured,
            vec![Step::EachAccount(Apply), Step::SetState(Committed)],
        ),
    ];
    for (what, doc, steps) in cases {
        assert_eq!(plan_for(&doc), steps.as_slice(), "{what}");
    }
    // A one-leg transfer keeps the post's steps.
    assert_eq!(plan_for(&transfer(Pending)), plan(Pending));
}

/// Each posting of `t` as (account, side, amount).
fn net_changes(t: &TransferDoc) -> Vec<(&str, Side, i64)> {
    t.postings()
        .iter()
        .map(|p| (p.account, p.side, p.amount))
        .collect()
}

#[test]
fn postings_carry_each_accounts_net_change_once_in_order_of_appearance() {
    use Side::*;
    let t = multi(&[("a", "b", 10), ("c", "a", 4), ("b", "c", 10), ("d", "e", 1)]);
    assert_eq!(
        net_changes(&t),
        [
            ("a", Source, 6),
            ("b", Destination, 0),
            ("c", Destination, 6),
            ("d", Source, 1),
            ("e", Destination, 1)
        ]
    );
    // The extremes: the sum of the legs fits, so every net change does.
    let t = multi(&[("a", "b", i64::MAX - 1), ("c", "a", 1)]);
    assert_eq!(
        net_changes(&t),
        [
            ("a", Source, i64::MAX - 2),
            ("b", Destination, i64::MAX - 1),
            ("c", Source, 1)
        ]
    );
    // A one-leg transfer: source, then destination, a hold settling its capture.
    let one = TransferDoc {
        captured_amount: Some(4),
        ..transfer(Committed)
    };
    let got: Vec<_> = one
        .postings()
        .iter()
        .map(|p| (p.account, p.side, p.amount, p.settle_amount))
        .collect();
    assert_eq!(got, [("a", Source, 10, 4), ("b", Destination, 10, 4)]);
    // `posting(i)` is the i-th of them, built or not.
    for t in [one, multi(&[("a", "b", 10), ("c", "a", 4)])] {
        let all = t.postings();
        for (i, p) in all.iter().enumerate() {
            assert_eq!(t.posting(i), Some(*p));
        }
        assert_eq!(t.posting(all.len()), None);
    }
}

#[test]
fn a_net_debit_is_checked_against_the_floor_once() {
    // `a` pays 60 and 50 and receives 30: a net debit of 80 passes on a balance of 100,
    // though the legs' debits sum to 110.
    let t = multi(&[("a", "b", 60), ("a", "c", 50), ("d", "a", 30)]);
    let p = t.posting_of("a").unwrap();
    let step = AccountStep {
        settle_amount: p.settle_amount,
        ..step(AccountOp::Apply, p.side, p.amount)
    };
    let after = write(decide_account(&account(100), step, &now(), RETAIN));
    assert_eq!(
        (
            after.balance,
            after.pending_debits,
            after.pending_transactions.len()
        ),
        (20, 80, 1)
    );
    // A net debit of 81 does not.
    assert_eq!(
        decide_account(&account(79), step, &now(), RETAIN),
        AccountDecision::Refuse(Refusal::InsufficientFunds)
    );
}

#[test]
fn transition_stamps_time_and_leaves_the_lease_alone() {
    let t = transfer(Pending);
    let next = transition(&t, Committed, None, &now()).unwrap();
    assert_eq!(next.transaction_state, Committed);
    assert_eq!(next.modification_time, now().timestamp());
    assert_eq!(
        (next.lease_owner, next.lease_expires_at),
        (t.lease_owner, t.lease_expires_at),
        "the lease is the lease module's to write"
    );
}

#[test]
fn transition_keeps_an_earlier_reason() {
    let t = transfer(Pending);
    let t = transition(
        &t,
        Terminating,
        Some(RollbackReason::InsufficientFunds),
        &now(),
    )
    .unwrap();
    let t = transition(&t, RolledBack, None, &now()).unwrap();
    assert_eq!(t.reason, Some(RollbackReason::InsufficientFunds));
}

#[test]
fn created_and_pending_time_out_others_do_not() {
    assert_eq!(
        timeout_transition(&transfer(Created), 0, 100, 100),
        Some(RolledBack)
    );
    assert_eq!(
        timeout_transition(&transfer(Pending), 0, 100, 100),
        Some(Terminating)
    );
    assert_eq!(timeout_transition(&transfer(Pending), 0, 99, 100), None);
    for state in [Committed, Terminating, Finished, RolledBack] {
        assert_eq!(timeout_transition(&transfer(state), 0, 1_000, 100), None);
    }
}

fn a_hold(state: TransferState, captured: Option<i64>) -> TransferDoc {
    TransferDoc {
        hold_expires_at: Some(at("2026-01-01T00:01:00.000Z")),
        captured_amount: captured,
        ..transfer(state)
    }
}

#[test]
fn an_uncaptured_hold_parks_where_a_transfer_commits() {
    use AccountOp::*;
    use Side::*;
    assert_eq!(
        plan_for(&a_hold(Pending, None)),
        &[
            Step::Account(Apply, Source),
            Step::Account(Apply, Destination),
            Step::Park
        ]
    );
    assert_eq!(plan_for(&a_hold(Pending, Some(5))), plan(Pending));
    assert_eq!(plan_for(&transfer(Pending)), plan(Pending));
    for state in [Created, Committed, Terminating, Finished, RolledBack] {
        assert_eq!(plan_for(&a_hold(state, None)), plan(state), "{state}");
    }
}

#[test]
fn a_hold_expires_on_its_own_time_never_on_the_transfer_timeout() {
    let expires = a_hold(Pending, None).hold_expires_at.unwrap().millis();
    let long_timeout = |t: &TransferDoc, now| deadline_transition(t, 0, now, 1);
    // Far past TRANSFER_TIMEOUT (1 ms here) but before its expiry: it waits.
    assert_eq!(long_timeout(&a_hold(Pending, None), expires - 1), None);
    assert_eq!(long_timeout(&a_hold(Created, None), expires - 1), None);
    assert_eq!(
        long_timeout(&a_hold(Pending, None), expires),
        Some((Terminating, RollbackReason::Expired))
    );
    assert_eq!(
        long_timeout(&a_hold(Created, None), expires),
        Some((RolledBack, RollbackReason::Expired))
    );
    // A captured hold never expires: the capture won.
    assert_eq!(long_timeout(&a_hold(Pending, Some(1)), i64::MAX), None);
    for state in [Committed, Terminating, Finished, RolledBack] {
        assert_eq!(
            long_timeout(&a_hold(state, None), i64::MAX),
            None,
            "{state}"
        );
    }
    // A plain transfer times out as before.
    assert_eq!(
        long_timeout(&transfer(Pending), 1),
        Some((Terminating, RollbackReason::TimedOut))
    );
}

fn settle(a: &AccountDoc, side: Side, amount: i64, settle_amount: i64) -> AccountDoc {
    let step = AccountStep {
        settle_amount,
        ..step(AccountOp::Remove, side, amount)
    };
    write(decide_account(a, step, &now(), RETAIN))
}

#[test]
fn a_partial_capture_gives_the_rest_back_in_the_remove() {
    let src = applied(100, Side::Source, 30);
    let dest = applied(0, Side::Destination, 30);
    let src = settle(&src, Side::Source, 30, 12);
    let dest = settle(&dest, Side::Destination, 30, 12);
    assert_eq!((src.balance, src.pending_debits), (88, 0));
    assert_eq!(
        (dest.balance, dest.pending_credits, dest.available()),
        (12, 0, 12)
    );
    assert!(src.pending_transactions.is_empty() && dest.pending_transactions.is_empty());
    assert!(
        src.settled.is_empty() && dest.settled.is_empty(),
        "no tombstone is written"
    );
    // Idempotent: a second remove changes nothing, whatever amount it carries.
    for (a, side) in [(&src, Side::Source), (&dest, Side::Destination)] {
        let again = AccountStep {
            settle_amount: 12,
            ..step(AccountOp::Remove, side, 30)
        };
        assert_eq!(
            decide_account(a, again, &now(), RETAIN),
            AccountDecision::AlreadyDone
        );
    }
}

#[test]
fn a_full_capture_settles_like_a_transfer() {
    let dest = applied(0, Side::Destination, 30);
    assert_eq!(
        settle(&dest, Side::Destination, 30, 30),
        write(decide(&dest, AccountOp::Remove, Side::Destination, 30))
    );
}

#[test]
fn a_partial_capture_at_the_extremes_neither_overflows_nor_overdraws() {
    // The source's debit left room to be undone, so the give-back fits.
    let mut a = account(i64::MAX);
    a.floor = i64::MIN;
    let debited = write(decide(&a, AccountOp::Apply, Side::Source, i64::MAX));
    assert_eq!(
        settle(&debited, Side::Source, i64::MAX, 1).balance,
        i64::MAX - 1
    );
    // The destination's credit was never spendable, so taking it back keeps the floor.
    let credited = applied(0, Side::Destination, i64::MAX);
    let settled = settle(&credited, Side::Destination, i64::MAX, 1);
    assert_eq!((settled.balance, settled.available()), (1, 1));
}

#[test]
fn apply_debits_source_and_remembers_the_id() {
    let a = applied(100, Side::Source, 30);
    assert_eq!(a.balance, 70);
    assert_eq!(a.pending_transactions, ["t1"]);
    assert_eq!(a.pending_credits, 0);
    assert_eq!(a.modification_time, now().text);
}

#[test]
fn apply_credits_destination_as_not_yet_spendable() {
    let a = applied(100, Side::Destination, 30);
    assert_eq!(a.balance, 130);
    assert_eq!(a.pending_credits, 30);
    assert_eq!(a.available(), 100);
}

#[test]
fn apply_twice_is_a_noop() {
    let a = applied(100, Side::Source, 30);
    assert_eq!(
        decide(&a, AccountOp::Apply, Side::Source, 30),
        AccountDecision::AlreadyDone
    );
}

#[test]
fn apply_refuses_to_overdraw_the_floor() {
    let mut a = account(100);
    assert_eq!(
        decide(&a, AccountOp::Apply, Side::Source, 101),
        AccountDecision::Refuse(Refusal::InsufficientFunds)
    );
    write(decide(&a, AccountOp::Apply, Side::Source, 100));
    a.floor = 50;
    assert_eq!(
        decide(&a, AccountOp::Apply, Side::Source, 51),
        AccountDecision::Refuse(Refusal::InsufficientFunds)
    );
    a.floor = -20;
    assert_eq!(
        write(decide(&a, AccountOp::Apply, Side::Source, 120)).balance,
        -20
    );
}

#[test]
fn uncommitted_credits_cannot_be_spent() {
    let a = applied(0, Side::Destination, 50);
    let step = AccountStep {
        transfer_id: "t2",
        ..step(AccountOp::Apply, Side::Source, 1)
    };
    assert_eq!(
        decide_account(&a, step, &now(), RETAIN),
        AccountDecision::Refuse(Refusal::InsufficientFunds)
    );
}

#[test]
fn extreme_floors_neither_overflow_nor_overdraw() {
    let mut a = account(i64::MAX);
    a.floor = i64::MIN;
    let debited = write(decide(&a, AccountOp::Apply, Side::Source, i64::MAX));
    assert_eq!(debited.balance, 0);
    let mut b = account(i64::MIN + 10);
    b.floor = i64::MIN;
    assert_eq!(
        decide(&b, AccountOp::Apply, Side::Source, 11),
        AccountDecision::Refuse(Refusal::InsufficientFunds)
    );
}

#[test]
fn a_credit_leaves_room_to_undo_pending_debits() {
    let a = applied(100, Side::Source, 100);
    assert_eq!((a.balance, a.pending_debits), (0, 100));
    let credit = AccountStep {
        transfer_id: "t2",
        ..step(AccountOp::Apply, Side::Destination, i64::MAX)
    };
    assert_eq!(
        decide_account(&a, credit, &now(), RETAIN),
        AccountDecision::Refuse(Refusal::Overflow),
        "undoing t1 afterwards would overflow"
    );
    let fits = AccountStep {
        amount: i64::MAX - 100,
        settle_amount: i64::MAX - 100,
        ..credit
    };
    let credited = write(decide_account(&a, fits, &now(), RETAIN));
    let undone = write(decide(&credited, AccountOp::Undo, Side::Source, 100));
    assert_eq!(undone.balance, i64::MAX);
    assert_eq!(undone.pending_debits, 0);
}

#[test]
fn an_apply_needs_the_currency_of_its_rule_and_settling_does_not() {
    let mut usd = account(100);
    usd.currency = Some("USD".into());
    let plain = account(100);
    let apply = |a: &AccountDoc, side, rule| {
        let step = AccountStep {
            currency: rule,
            ..step(AccountOp::Apply, side, 30)
        };
        decide_account(a, step, &now(), RETAIN)
    };
    let mismatch = AccountDecision::Refuse(Refusal::CurrencyMismatch);
    // The source of a transfer stating nothing: any currency.
    write(apply(&usd, Side::Source, CurrencyRule::for_source(None)));
    write(apply(&plain, Side::Source, CurrencyRule::for_source(None)));
    // Stated: exactly that one, on both sides.
    let eur = CurrencyRule::for_source(Some("EUR"));
    assert_eq!(apply(&usd, Side::Source, eur), mismatch);
    assert_eq!(apply(&plain, Side::Source, eur), mismatch);
    write(apply(
        &usd,
        Side::Source,
        CurrencyRule::for_source(Some("USD")),
    ));
    // The destination: the stated currency, else the source's (none included).
    let from_usd = CurrencyRule::for_destination(None, Some("USD"));
    let from_plain = CurrencyRule::for_destination(None, None);
    write(apply(&usd, Side::Destination, from_usd));
    assert_eq!(apply(&plain, Side::Destination, from_usd), mismatch);
    assert_eq!(apply(&usd, Side::Destination, from_plain), mismatch);
    write(apply(&plain, Side::Destination, from_plain));
    let stated = CurrencyRule::for_destination(Some("EUR"), Some("EUR"));
    assert_eq!(apply(&usd, Side::Destination, stated), mismatch);
    assert_eq!(
        Refusal::CurrencyMismatch.rollback_reason(),
        Some(RollbackReason::CurrencyMismatch)
    );
    // Applied already (its rule passed then): a repeat is a no-op, never a refusal; and
    // undoing or settling does not look at currencies.
    let applied = write(apply(&usd, Side::Source, CurrencyRule::for_source(None)));
    assert_eq!(
        apply(&applied, Side::Source, eur),
        AccountDecision::AlreadyDone
    );
    let undo = AccountStep {
        currency: eur,
        ..step(AccountOp::Undo, Side::Source, 30)
    };
    assert_eq!(
        write(decide_account(&applied, undo, &now(), RETAIN)).balance,
        100
    );
}

#[test]
fn each_refusal_rolls_the_transfer_back_with_its_reason_or_not_at_all() {
    let cases = [
        (
            Refusal::InsufficientFunds,
            Some(RollbackReason::InsufficientFunds),
        ),
        (Refusal::Overflow, Some(RollbackReason::BalanceOverflow)),
        (Refusal::AlreadySettled, None),
        (Refusal::AccountBusy, Some(RollbackReason::AccountBusy)),
        (
            Refusal::CurrencyMismatch,
            Some(RollbackReason::CurrencyMismatch),
        ),
    ];
    for (refusal, reason) in cases {
        assert_eq!(refusal.rollback_reason(), reason, "{refusal:?}");
    }
}

#[test]
fn apply_refuses_to_overflow() {
    let a = account(i64::MAX - 5);
    let overflowing = decide(&a, AccountOp::Apply, Side::Destination, 6);
    assert_eq!(overflowing, AccountDecision::Refuse(Refusal::Overflow));
}

#[test]
fn an_apply_of_an_id_an_older_version_tombstoned_is_refused() {
    let a = tombstoned([("t1", now().millis)]);
    let again = decide(&a, AccountOp::Apply, Side::Source, 30);
    assert_eq!(again, AccountDecision::Refuse(Refusal::AlreadySettled));
}

/// `op` of `t1` on `a` with `mark`: an apply's own, a remove's as the commit recorded it.
fn marked(a: &AccountDoc, op: AccountOp, side: Side, mark: Option<&str>) -> AccountDecision {
    let step = AccountStep {
        mark,
        ..step(op, side, 30)
    };
    decide_account(a, step, &now(), RETAIN)
}

/// The source apply of `t1` on `a` with `mark`, written.
fn apply_marked(a: &AccountDoc, mark: &str) -> AccountDoc {
    write(marked(a, AccountOp::Apply, Side::Source, Some(mark)))
}

/// The source remove of `t1` on `a` with `mark` (as the commit recorded it), written.
fn remove_marked(a: &AccountDoc, mark: &str) -> AccountDoc {
    write(marked(a, AccountOp::Remove, Side::Source, Some(mark)))
}

#[test]
fn an_apply_marks_its_entry_and_a_remove_takes_the_entry_the_commit_counted() {
    let applied = apply_marked(&account(100), "i.1");
    assert_eq!(applied.pending_mark("t1"), Some("i.1"));
    assert_eq!(applied.pending_mark("t2"), None);
    let removed = remove_marked(&applied, "i.1");
    assert_eq!((removed.balance, removed.pending_debits), (70, 0));
    assert!(removed.pending_transactions.is_empty() && removed.pending_marks.is_empty());
}

/// The hole tombstones closed, closed by marks: a worker that took `t1` over commits and
/// settles it; the stalled first worker, its clock wrong, applies `t1` again on an account
/// read after the settle. A remove run again (the settling worker crashed before `finished`)
/// must give that late entry back, not keep it as if the commit had counted it.
#[test]
fn a_late_apply_after_the_settle_is_given_back_by_the_remove_run_again() {
    let applied = apply_marked(&account(100), "i.1");
    let settled = remove_marked(&applied, "i.1");
    let late = apply_marked(&settled, "j.7");
    assert_eq!(late.balance, 40, "applied twice until given back");
    let AccountDecision::UndoLate(again) =
        marked(&late, AccountOp::Remove, Side::Source, Some("i.1"))
    else {
        panic!("a remove must give a late apply back");
    };
    assert_eq!((again.balance, again.pending_debits), (70, 0));
    assert!(again.pending_transactions.is_empty());
    // A transfer committed before marks has none recorded: its remove keeps what it finds.
    assert!(matches!(
        marked(&late, AccountOp::Remove, Side::Source, None),
        AccountDecision::Write(kept) if kept.balance == 40
    ));
}

/// A version before marks rewrites an account without them (it drops the field it does not
/// know): the entry a commit counted then reads as unmarked, and must still settle as
/// counted, not be given back as late.
#[test]
fn an_entry_that_lost_its_mark_to_an_older_version_settles_as_counted() {
    let mut applied = apply_marked(&account(100), "i.1");
    applied.pending_marks.clear();
    let settled = remove_marked(&applied, "i.1");
    assert_eq!((settled.balance, settled.pending_debits), (70, 0));
}

#[test]
fn the_sweeps_undo_gives_back_only_the_entry_it_saw() {
    let late = apply_marked(&account(100), "j.7");
    assert_eq!(
        marked(&late, AccountOp::Undo, Side::Source, Some("other")),
        AccountDecision::AlreadyDone
    );
    let undone = write(marked(&late, AccountOp::Undo, Side::Source, Some("j.7")));
    assert_eq!(undone.balance, 100);
    assert_eq!(
        marked(&undone, AccountOp::Undo, Side::Source, Some("j.7")),
        AccountDecision::AlreadyDone,
        "gone: nothing to write"
    );
}

#[test]
fn remove_keeps_the_balance_and_forgets_the_id() {
    let credited = applied(100, Side::Destination, 30);
    let removed = write(decide(&credited, AccountOp::Remove, Side::Destination, 30));
    assert_eq!(removed.balance, 130);
    assert!(removed.pending_transactions.is_empty());
    assert_eq!(removed.pending_credits, 0);
    assert!(removed.settled.is_empty(), "no tombstone is written");
    assert_eq!(
        decide(&removed, AccountOp::Remove, Side::Destination, 30),
        AccountDecision::AlreadyDone
    );
}

#[test]
fn undo_gives_back_what_was_applied() {
    let debited = applied(100, Side::Source, 30);
    let undone = write(decide(&debited, AccountOp::Undo, Side::Source, 30));
    assert_eq!(undone.balance, 100);
    assert!(undone.pending_transactions.is_empty());
    let credited = applied(100, Side::Destination, 30);
    let undone = write(decide(&credited, AccountOp::Undo, Side::Destination, 30));
    assert_eq!((undone.balance, undone.pending_credits), (100, 0));
    // Run again, it changes no sum but still writes: the write is the fence.
    let again = write(decide(&undone, AccountOp::Undo, Side::Destination, 30));
    assert_eq!((again.balance, again.pending_credits), (100, 0));
}

/// An account written before `pending_credits`/`pending_debits` existed reads them as 0
/// although it has a pending entry: settling that entry must not drive them negative.
#[test]
fn settling_a_pending_entry_on_an_old_document_keeps_pending_sums_at_zero() {
    let old: AccountDoc = serde_json::from_value(serde_json::json!({
        "account_id": "a", "balance": 130, "opening_balance": 100,
        "pending_transactions": ["t1"],
        "creation_time": "2026-01-01T00:00:00.000Z",
        "modification_time": "2026-01-01T00:00:00.000Z",
    }))
    .expect("an old account document decodes");
    assert_eq!((old.pending_credits, old.pending_debits), (0, 0));
    for op in [AccountOp::Remove, AccountOp::Undo] {
        for side in [Side::Destination, Side::Source] {
            let next = write(decide(&old, op, side, 30));
            assert!(next.pending_transactions.is_empty(), "{op:?} {side:?}");
            assert_eq!(
                (next.pending_credits, next.pending_debits),
                (0, 0),
                "{op:?} {side:?}"
            );
        }
    }
}

#[test]
fn undo_of_a_never_applied_transfer_still_writes_the_account() {
    let a = account(100);
    let fenced = write(decide(&a, AccountOp::Undo, Side::Source, 30));
    assert_eq!(
        (fenced.balance, fenced.modification_time.as_str()),
        (100, now().text.as_str())
    );
    assert!(fenced.settled.is_empty() && fenced.pending_transactions.is_empty());
}

fn tombstones<S: AsRef<str>>(entries: impl IntoIterator<Item = (S, i64)>) -> Tombstones {
    let mut t = Tombstones::default();
    for (id, at) in entries {
        t.push(id.as_ref(), at);
    }
    t
}

/// An account of 100 holding the tombstones `entries` (`(transfer id, when settled)`).
fn tombstoned<S: AsRef<str>>(entries: impl IntoIterator<Item = (S, i64)>) -> AccountDoc {
    AccountDoc {
        settled: tombstones(entries),
        ..account(100)
    }
}

fn ids(a: &AccountDoc) -> Vec<&str> {
    a.settled.ids().collect()
}

#[test]
fn tombstones_are_kept_by_age_and_a_young_one_is_never_forgotten() {
    let old = now().millis - RETAIN.millis;
    let a = tombstoned([("old", old), ("young", old + 1)]);
    let fenced = write(decide(&a, AccountOp::Undo, Side::Source, 1));
    assert_eq!(ids(&fenced), ["young"], "only the expired one dropped");
    // Full of young tombstones: the apply is refused rather than one being forgotten.
    let full = tombstoned((0..3).map(|i| (format!("s{i}"), now().millis)));
    let one_more = decide(&full, AccountOp::Apply, Side::Source, 1);
    assert_eq!(one_more, AccountDecision::Refuse(Refusal::AccountBusy));
}

#[test]
fn pending_entries_count_against_the_bound_and_a_settle_makes_room() {
    let mut a = account(100);
    for i in 0..3 {
        let step = AccountStep {
            transfer_id: &format!("p{i}"),
            ..step(AccountOp::Apply, Side::Source, 1)
        };
        match decide_account(&a, step, &now(), RETAIN) {
            AccountDecision::Write(next) => a = next,
            other => panic!("apply {i}: {other:?}"),
        }
    }
    assert_eq!(
        decide(&a, AccountOp::Apply, Side::Source, 1),
        AccountDecision::Refuse(Refusal::AccountBusy)
    );
    // Settling one turns its entry into a tombstone: still full, never over.
    let settled = write(decide_account(
        &a,
        AccountStep {
            transfer_id: "p0",
            ..step(AccountOp::Remove, Side::Source, 1)
        },
        &now(),
        RETAIN,
    ));
    assert_eq!(
        (settled.settled.len(), settled.pending_transactions.len()),
        (0, 2)
    );
    assert!(matches!(
        decide(&settled, AccountOp::Apply, Side::Source, 1),
        AccountDecision::Write(_)
    ));
}

#[test]
fn old_tombstones_beyond_twice_the_bound_drop_the_oldest_and_stamps_from_the_future_are_young() {
    let a = tombstoned((0..7).map(|i| (format!("f{i}"), now().millis - 10 + i)));
    let fenced = write(decide(&a, AccountOp::Undo, Side::Source, 1));
    assert_eq!(ids(&fenced), ["f1", "f2", "f3", "f4", "f5", "f6"]);
    let b = tombstoned([("ahead", now().millis + 3_600_000)]);
    let kept = write(decide(&b, AccountOp::Undo, Side::Source, 1));
    assert_eq!(ids(&kept), ["ahead"]);
}

#[test]
fn without_tombstones_nothing_is_remembered_and_nothing_is_full() {
    let a = write(decide_account(
        &account(100),
        step(AccountOp::Undo, Side::Source, 1),
        &now(),
        Retention::NONE,
    ));
    assert!(a.settled.is_empty());
}

/// A transfer settled in one transaction (`settle_at_once`) keeps every rule of the apply and
/// leaves neither a pending entry nor a tombstone.
fn at_once(a: &AccountDoc, side: Side, amount: i64) -> Result<AccountDoc, Refusal> {
    settle_at_once(a, step(AccountOp::Apply, side, amount), &now(), RETAIN).map(|(next, _)| next)
}

/// `a` with another transfer (`t0`) applied by the two-phase protocol and not yet settled.
fn with_one_in_flight(a: AccountDoc, side: Side, amount: i64) -> AccountDoc {
    let other = AccountStep {
        transfer_id: "t0",
        ..step(AccountOp::Apply, side, amount)
    };
    write(decide_account(&a, other, &now(), RETAIN))
}

#[test]
fn settling_at_once_moves_the_balance_and_leaves_no_entry() {
    let source = at_once(&account(100), Side::Source, 30).unwrap();
    let dest = at_once(&account(0), Side::Destination, 30).unwrap();
    assert_eq!((source.balance, dest.balance), (70, 30));
    for a in [&source, &dest] {
        assert!(a.pending_transactions.is_empty() && a.settled.is_empty());
        assert_eq!((a.pending_credits, a.pending_debits), (0, 0));
        assert_eq!(a.modification_time, now().text);
    }
}

#[test]
fn settling_at_once_keeps_the_floor_and_uncommitted_credits_unspendable() {
    let mut a = account(100);
    a.floor = 50;
    assert_eq!(
        at_once(&a, Side::Source, 51),
        Err(Refusal::InsufficientFunds)
    );
    assert_eq!(at_once(&a, Side::Source, 50).unwrap().balance, 50);
    // 40 of its 100 are a credit not yet committed (a two-phase transfer in flight).
    let credited = with_one_in_flight(account(60), Side::Destination, 40);
    assert_eq!(
        at_once(&credited, Side::Source, 61),
        Err(Refusal::InsufficientFunds)
    );
    assert_eq!(
        at_once(&credited, Side::Source, 60)
            .unwrap()
            .pending_credits,
        40
    );
}

#[test]
fn settling_at_once_refuses_to_overflow_or_to_leave_no_room_for_pending_undos() {
    assert_eq!(
        at_once(&account(i64::MAX), Side::Destination, 1),
        Err(Refusal::Overflow)
    );
    // A debit in flight must stay undoable: a credit may not take the room it needs.
    let debited = with_one_in_flight(account(i64::MAX - 10), Side::Source, 10);
    assert_eq!(
        at_once(&debited, Side::Destination, 11),
        Err(Refusal::Overflow)
    );
    assert!(at_once(&debited, Side::Destination, 10).is_ok());
}

#[test]
fn settling_at_once_refuses_an_account_that_already_holds_the_transfer() {
    let pending = applied(100, Side::Source, 10);
    assert_eq!(
        at_once(&pending, Side::Source, 10),
        Err(Refusal::AlreadySettled)
    );
    let mut settled = write(decide(&pending, AccountOp::Remove, Side::Source, 10));
    settled.settled = tombstones([("t1", now().millis)]);
    assert_eq!(
        at_once(&settled, Side::Source, 10),
        Err(Refusal::AlreadySettled),
        "a tombstone of a version before marks"
    );
}

#[test]
fn settling_at_once_needs_the_currency_of_its_rule() {
    let mut euro = account(100);
    euro.currency = Some("EUR".into());
    let with = |rule: CurrencyRule<&'static str>| AccountStep {
        currency: rule,
        ..step(AccountOp::Apply, Side::Source, 10)
    };
    let decide = |rule| settle_at_once(&euro, with(rule), &now(), RETAIN);
    assert_eq!(
        decide(CurrencyRule::Exactly(Some("USD"))),
        Err(Refusal::CurrencyMismatch)
    );
    assert!(decide(CurrencyRule::Exactly(Some("EUR"))).is_ok());
    assert!(decide(CurrencyRule::Any).is_ok());
}
