//! A transfer settled in one store transaction (`docs/design.md §3`, "In one transaction").
//!
//! Elastic's protocol exists because Elasticsearch writes one document at a time: it records
//! intent (`pending`, the ids in `pending_transactions`) so that a crash between document
//! writes can be finished or undone. A store with multi-document transactions (the embedded
//! one) makes that unnecessary: the worker reads the transfer and its accounts inside one
//! write transaction, decides with the same rules as the protocol's applies
//! ([`protocol::settle_at_once`]), and writes the terminal transfer and every account together,
//! or nothing. A crash before the commit leaves the transfer `created` (recovery settles it
//! like any other); after it, everything is written.
//!
//! # Why it needs no clock
//! The transaction writes the transfer only if its version is still the one its worker last
//! wrote, and it reads that version in the same serialized transaction that writes it: a
//! cancel or a takeover that came first changed the version, and then nothing is written. No
//! lease timing is involved, and no stalled worker can apply the transfer later: every
//! two-phase apply follows a `pending` write of the transfer, which a terminal transfer
//! refuses.

use super::documents::{TxnDocs, Versioned};
use super::driver::{currency_rule, Interrupt};
use super::lease::{seal_terminal, Held};
use super::model::{AccountDoc, RollbackReason, TransferDoc, TransferState};
use super::protocol::{self, settle_at_once, AccountOp, AccountStep, Refusal, Retention};
use super::retry::retry;
use super::Engine;
use crate::store::{StoreError, TxnOutcome, Version};
use crate::transfer::clock::Now;

/// The arrows a settled transfer takes, in its one write.
const FINISH: [TransferState; 3] = [
    TransferState::Pending,
    TransferState::Committed,
    TransferState::Finished,
];
/// The arrow of a transfer an account refused: nothing was applied anywhere.
const ROLL_BACK: [TransferState; 1] = [TransferState::RolledBack];

/// What the transaction decided.
enum Settlement {
    /// Written: the transfer as written (terminal), the arrows it took, the accounts written.
    Settled {
        transfer: Box<TransferDoc>,
        path: &'static [TransferState],
        accounts: Vec<String>,
    },
    /// The transfer is no longer at the version its worker holds (a cancel, a takeover):
    /// nothing written.
    Changed,
    /// An account already holds the transfer: nothing written; the two-phase path, which
    /// knows what that means, decides.
    TwoPhase,
    /// A document could not be read: nothing written.
    Failed(StoreError),
}

impl Engine {
    /// Whether the worker settles `held` in one store transaction: a new (`created`) transfer
    /// that is not a hold, on a store with transactions, unless `PROTOCOL=two-phase`.
    pub(super) fn settles_in_one_transaction(&self, held: &Held) -> bool {
        self.config.one_transaction
            && held.doc.transaction_state == TransferState::Created
            && !held.doc.is_hold()
            && self.docs.has_transactions()
    }

    /// Settles a `created` transfer in one store transaction. `Ok(true)`: it is terminal
    /// (`held` carries it as written); `Ok(false)`: the two-phase path must run instead.
    pub(super) async fn settle_in_one_transaction(
        &self,
        held: &mut Held,
    ) -> Result<bool, Interrupt> {
        let now = self.clock.now();
        let retention = self.config.retention;
        let going = || !self.shutdown.is_cancelled();
        // Retried like any write whose outcome is unknown: if it was applied, the retry finds
        // the version moved and writes nothing.
        let (settlement, outcome) = retry(self.config.max_store_attempts, going, || {
            let transfer = held.doc.clone();
            let version = held.version;
            let now = now.clone();
            self.docs
                .transact(move |txn| decide(txn, transfer, version, &now, retention))
        })
        .await?;
        let (transfer, path, accounts) = match (settlement, outcome) {
            (Settlement::Failed(error), _) => return Err(error.into()),
            (Settlement::TwoPhase, _) => return Ok(false),
            (Settlement::Changed, _) | (_, TxnOutcome::Refused) => return Err(Interrupt::Reread),
            (
                Settlement::Settled {
                    transfer,
                    path,
                    accounts,
                },
                TxnOutcome::Committed(versions),
            ) => {
                let Some(&version) = versions.first() else {
                    return Err(Interrupt::Reread);
                };
                held.version = version;
                (transfer, path, accounts)
            }
        };
        // The accounts moved under any copy the account steps remember.
        for account in &accounts {
            self.accounts.forget_account(account);
        }
        let mut from = held.doc.transaction_state;
        held.doc = *transfer;
        for &to in path {
            self.record_transition(&held.doc, from, to, now.millis);
            from = to;
        }
        Ok(true)
    }
}

/// The transaction's work: on the transfer as its worker holds it (`version`), every
/// account's change, or the refusal that rolls it back; the writes queued in `txn`, the
/// transfer's first.
fn decide(
    txn: &mut TxnDocs<'_>,
    transfer: TransferDoc,
    version: Version,
    now: &Now,
    retention: Retention,
) -> Settlement {
    match txn.version_of::<TransferDoc>(&transfer.transaction_id) {
        Ok(Some(stored)) if stored == version => {}
        Ok(_) => return Settlement::Changed,
        Err(error) => return Settlement::Failed(error),
    }
    let mut changed: Vec<Versioned<AccountDoc>> = Vec::with_capacity(2);
    // The first account's currency: the others must match it (as in the two-phase applies).
    let mut first_currency = None;
    let mut refused = None;
    for (index, posting) in transfer.postings().into_iter().enumerate() {
        let account = match txn.get::<AccountDoc>(posting.account) {
            Ok(Some(account)) => account,
            Ok(None) => {
                refused = Some((RollbackReason::AccountNotFound, posting.account.to_owned()));
                break;
            }
            Err(error) => return Settlement::Failed(error),
        };
        let currency = currency_rule(&transfer.currency, AccountOp::Apply, index, &first_currency);
        let step = AccountStep {
            transfer_id: &transfer.transaction_id,
            amount: posting.amount,
            settle_amount: posting.settle_amount,
            side: posting.side,
            op: AccountOp::Apply,
            currency: currency.as_deref(),
        };
        match settle_at_once(&account.doc, step, now, retention) {
            Ok(next) => {
                if index == 0 {
                    first_currency = Some(next.currency.clone());
                }
                changed.push(Versioned {
                    doc: next,
                    version: account.version,
                });
            }
            Err(refusal) => match refusal.rollback_reason() {
                Some(reason) if refusal != Refusal::AlreadySettled => {
                    refused = Some((reason, posting.account.to_owned()));
                    break;
                }
                _ => return Settlement::TwoPhase,
            },
        }
    }
    if let Some((reason, failed)) = refused {
        return roll_back(txn, transfer, version, now, reason, failed);
    }
    let Some(mut next) = moved_along(transfer, &FINISH, None, now) else {
        return Settlement::TwoPhase;
    };
    seal_terminal(&mut next, now);
    let mut accounts = Vec::with_capacity(changed.len());
    let queued = txn.replace_if(&next, version).and_then(|()| {
        changed.iter().try_for_each(|account| {
            accounts.push(account.doc.account_id.clone());
            txn.replace_if(&account.doc, account.version)
        })
    });
    match queued {
        Ok(()) => Settlement::Settled {
            transfer: Box::new(next),
            path: &FINISH,
            accounts,
        },
        Err(error) => Settlement::Failed(error),
    }
}

/// The transfer rolled back for `reason`, caused by account `failed`; no account is written
/// (none was changed).
fn roll_back(
    txn: &mut TxnDocs<'_>,
    transfer: TransferDoc,
    version: Version,
    now: &Now,
    reason: RollbackReason,
    failed: String,
) -> Settlement {
    let Some(mut next) = moved_along(transfer, &ROLL_BACK, Some(reason), now) else {
        return Settlement::TwoPhase;
    };
    next.failed_account = Some(failed);
    seal_terminal(&mut next, now);
    match txn.replace_if(&next, version) {
        Ok(()) => Settlement::Settled {
            transfer: Box::new(next),
            path: &ROLL_BACK,
            accounts: Vec::new(),
        },
        Err(error) => Settlement::Failed(error),
    }
}

/// `transfer` moved along `path`, each arrow checked and recorded in its history (so the
/// change feed shows every state it passed, all at this write's time).
fn moved_along(
    mut transfer: TransferDoc,
    path: &[TransferState],
    reason: Option<RollbackReason>,
    now: &Now,
) -> Option<TransferDoc> {
    for &to in path {
        if !protocol::transition_in_place(&mut transfer, to, reason, now) {
            return None;
        }
        transfer.note_transitions(now.millis);
    }
    Some(transfer)
}
