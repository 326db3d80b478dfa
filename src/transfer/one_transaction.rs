//! The settlement in one store transaction (`docs/design.md §3`, "In one transaction"), the
//! [`Settlement`] chosen where the store has transactions and `PROTOCOL` is `auto`.
//!
//! A new transfer is created and settled by the same transaction
//! ([`OneTransaction::create_settled`]): one durable write, before `201` answers. A `created`
//! transfer a worker holds (one that recovery resumes) is settled by one too
//! ([`OneTransaction::settle_held`]). A hold, and a case the transaction leaves to the
//! protocol (an account that already holds the transfer, a document that does not decode),
//! go to the two-phase settlement this one holds ([`TwoPhase`]): that choice is made here,
//! not by the callers.
//!
//! Elastic's protocol exists because Elasticsearch writes one document at a time: it records
//! intent (`pending`, the ids in `pending_transactions`) so that a crash between document
//! writes can be finished or undone. A store with multi-document transactions (the embedded
//! one) makes that unnecessary: the worker reads the transfer and its accounts inside one
//! write transaction, decides with the same rules as the protocol's applies
//! ([`protocol::settle_at_once`]), and writes the terminal transfer and every account together,
//! or nothing. A crash before the commit leaves nothing of a new transfer (its client had no
//! answer and retries) and a held one `created` (recovery settles it); after it, everything
//! is written.
//!
//! # Why it needs no clock
//! The transaction writes the transfer only if its version is still the one its worker last
//! wrote, and it reads that version in the same serialized transaction that writes it: a
//! cancel or a takeover that came first changed the version, and then nothing is written. No
//! lease timing is involved, and no stalled worker can apply the transfer later: every
//! two-phase apply follows a `pending` write of the transfer, which a terminal transfer
//! refuses.

use std::sync::Arc;

use futures_util::future::{BoxFuture, FutureExt};
use tracing::Instrument;

use super::admission::Admitted;
use super::documents::{TxnDocs, Versioned};
use super::driver::Worker;
use super::lease::{seal_terminal, Leased};
use super::model::{AccountDoc, RollbackReason, TransferDoc, TransferState};
use super::protocol::{
    self, currency_rule, settle_at_once, AccountOp, AccountStep, Refusal, Retention,
};
use super::retry::retry;
use super::settlement::{Creation, Resumed, Settlement};
use super::transfer_span_in_request;
use super::two_phase::TwoPhase;
use crate::store::{StoreError, StoreResult, TxnOutcome, Version};
use crate::transfer::clock::Now;

/// Attempts of a new transfer's transaction whose outcome is unknown (as for every create).
const CREATE_ATTEMPTS: u32 = 3;

/// The arrows a settled transfer takes, in its one write.
const FINISH: [TransferState; 3] = [
    TransferState::Pending,
    TransferState::Committed,
    TransferState::Finished,
];
/// The arrow of a transfer an account refused: nothing was applied anywhere.
const ROLL_BACK: [TransferState; 1] = [TransferState::RolledBack];

/// What the transaction starts from.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// A new transfer: its id must be free, and it is created already settled.
    New,
    /// A `created` transfer its worker holds, last written at this version.
    Leased(Version),
}

/// What the transaction decided.
enum Decided {
    /// Written: the transfer as written (terminal) and the arrows it took.
    Settled {
        transfer: Box<TransferDoc>,
        path: &'static [TransferState],
    },
    /// The transfer is no longer at the version its worker holds (a cancel, a takeover), or
    /// a new transfer's id is taken: nothing written.
    Changed,
    /// A new transfer's id is taken by our own earlier attempt (its token is ours): that
    /// attempt was committed, its answer lost. The transfer as stored.
    Ours(Box<TransferDoc>),
    /// An account already holds the transfer: nothing written; the two-phase path, which
    /// knows what that means, decides.
    TwoPhase,
    /// A document could not be read: nothing written.
    Failed(StoreError),
}

/// What became of a new transfer's transaction ([`OneTransaction::create_settled`]).
enum CreatedSettled {
    /// Created and settled (finished or rolled back) in one transaction: the transfer as
    /// stored.
    Settled(Box<TransferDoc>),
    /// The id is taken: a replay, or another transfer.
    Exists,
    /// Nothing written: create it and run the two-phase protocol.
    TwoPhase,
}

/// Settles transfers in one store transaction; what it cannot settle so (a hold, or a
/// case the transaction leaves to the protocol) goes to the two-phase settlement it holds.
pub(crate) struct OneTransaction {
    two_phase: TwoPhase,
}

impl OneTransaction {
    pub(crate) fn new(two_phase: TwoPhase) -> Self {
        Self { two_phase }
    }

    /// A new transfer: a hold goes to the two-phase settlement (it parks in `pending`);
    /// any other is created settled, unless the transaction leaves it to the protocol.
    async fn create_new(
        &self,
        worker: &Arc<Worker>,
        transfer: TransferDoc,
        admitted: Admitted,
    ) -> Result<Creation, StoreError> {
        if transfer.is_hold() {
            return self.two_phase.create(worker, transfer, admitted).await;
        }
        match Self::create_settled(worker, &transfer).await? {
            // Answered as stored: already terminal (the same as a `GET` right after). The
            // permit is given back: nothing works on the transfer any more.
            CreatedSettled::Settled(stored) => Ok(Creation::New(*stored)),
            CreatedSettled::Exists => {
                let id = &transfer.transaction_id;
                let existing = worker.shared.docs.get_vouched::<TransferDoc>(id).await?;
                Ok(Creation::Taken(existing))
            }
            CreatedSettled::TwoPhase => self.two_phase.create(worker, transfer, admitted).await,
        }
    }

    /// Creates `transfer` (as accepted: `created`, no lease) and settles it in the same store
    /// transaction. An unknown outcome is retried: if the first attempt was applied, the
    /// retry finds the id taken by a transfer carrying this request's token (`created_by`),
    /// and it is answered as new all the same.
    async fn create_settled(
        worker: &Worker,
        transfer: &TransferDoc,
    ) -> Result<CreatedSettled, StoreError> {
        let shared = &worker.shared;
        let started = shared.clock.boot_time();
        let now = shared.clock.now();
        let retention = shared.config.retention;
        let mut ours = transfer.clone();
        ours.created_by = Some(uuid::Uuid::new_v4().simple().to_string());
        let going = || !shared.shutdown.is_cancelled();
        let span = transfer_span_in_request(transfer);
        let attempt = retry(CREATE_ATTEMPTS, going, || {
            let transfer = ours.clone();
            let now = now.clone();
            shared
                .docs
                .transact(move |txn| decide(txn, transfer, Start::New, &now, retention))
        })
        .instrument(span.clone())
        .await;
        let (settled, path) = match attempt {
            // The work never came to an end (a bug in it): nothing was written.
            Err(StoreError::Permanent(_)) => return Ok(CreatedSettled::TwoPhase),
            Err(error) => return Err(error),
            // A document that does not decode is a person's to repair: the two-phase path
            // creates the transfer and stops at that document, as it always has (never a 500).
            Ok((Decided::Failed(StoreError::Permanent(_)), _)) => {
                return Ok(CreatedSettled::TwoPhase)
            }
            Ok((Decided::Failed(error), _)) => return Err(error),
            Ok((Decided::Changed, _)) => return Ok(CreatedSettled::Exists),
            Ok((Decided::TwoPhase, _)) | Ok((_, TxnOutcome::Refused)) => {
                return Ok(CreatedSettled::TwoPhase)
            }
            Ok((Decided::Ours(stored), _)) => match stored.transaction_state {
                TransferState::Finished => (stored, &FINISH[..]),
                TransferState::RolledBack => (stored, &ROLL_BACK[..]),
                _ => return Ok(CreatedSettled::Exists),
            },
            Ok((Decided::Settled { transfer, path }, TxnOutcome::Committed(_))) => (transfer, path),
        };
        shared.metrics.transfers_created_total.inc();
        let took = shared.clock.boot_time().saturating_duration_since(started);
        let _in_span = span.enter();
        settled_along(worker, TransferState::Created, &settled, path, Some(took));
        Ok(CreatedSettled::Settled(settled))
    }

    /// A transfer a worker holds: settled in one transaction if it is `created` and not a
    /// hold; anything else is the two-phase settlement's.
    async fn resume_held(
        &self,
        worker: &Worker,
        leased: &mut Leased,
    ) -> Result<Resumed, StoreError> {
        if leased.doc.transaction_state == TransferState::Created && !leased.doc.is_hold() {
            Self::settle_held(worker, leased).await
        } else {
            self.two_phase.resume(worker, leased).await
        }
    }

    /// Settles a `created` transfer its worker holds in one store transaction. `Settled`:
    /// it is terminal (`leased` carries it as written).
    async fn settle_held(worker: &Worker, leased: &mut Leased) -> Result<Resumed, StoreError> {
        let shared = &worker.shared;
        let now = shared.clock.now();
        let retention = shared.config.retention;
        let going = || !shared.shutdown.is_cancelled();
        // Retried like any write whose outcome is unknown: if it was applied, the retry finds
        // the version moved and writes nothing.
        let (decided, outcome) = retry(shared.config.max_store_attempts, going, || {
            let transfer = leased.doc.clone();
            let version = leased.version;
            let now = now.clone();
            shared
                .docs
                .transact(move |txn| decide(txn, transfer, Start::Leased(version), &now, retention))
        })
        .await?;
        let (transfer, path) = match (decided, outcome) {
            // A document that does not decode: the two-phase path stops at it for a person.
            (Decided::Failed(StoreError::Permanent(_)), _) | (Decided::TwoPhase, _) => {
                return Ok(Resumed::TwoPhase)
            }
            (Decided::Failed(error), _) => return Err(error),
            (Decided::Changed | Decided::Ours(_), _) | (_, TxnOutcome::Refused) => {
                return Ok(Resumed::Changed)
            }
            (Decided::Settled { transfer, path }, TxnOutcome::Committed(versions)) => {
                let Some(&version) = versions.first() else {
                    return Ok(Resumed::Changed);
                };
                leased.version = version;
                (transfer, path)
            }
        };
        let from = leased.doc.transaction_state;
        leased.doc = *transfer;
        settled_along(worker, from, &leased.doc, path, None);
        Ok(Resumed::Settled)
    }
}

impl Settlement for OneTransaction {
    fn create<'a>(
        &'a self,
        worker: &'a Arc<Worker>,
        transfer: TransferDoc,
        admitted: Admitted,
    ) -> BoxFuture<'a, Result<Creation, StoreError>> {
        self.create_new(worker, transfer, admitted).boxed()
    }

    fn resume<'a>(
        &'a self,
        worker: &'a Worker,
        leased: &'a mut Leased,
    ) -> BoxFuture<'a, Result<Resumed, StoreError>> {
        self.resume_held(worker, leased).boxed()
    }

    fn in_one_transaction(&self) -> bool {
        true
    }
}

/// Metrics and wake-ups after a transaction settled a transfer that was `from` along
/// `path`. (No remembered account copy needs forgetting: where transactions are used, the
/// account steps run in them too and remember none, `super::accounts`.)
fn settled_along(
    worker: &Worker,
    mut from: TransferState,
    transfer: &TransferDoc,
    path: &[TransferState],
    took: Option<std::time::Duration>,
) {
    let now_millis = worker.shared.clock.wall_millis();
    for &to in path {
        worker.record_transition(transfer, (from, to), now_millis, took);
        from = to;
    }
}

/// The transaction's work: on a new transfer or one as its worker holds it (`start`), every
/// account's change, or the refusal that rolls it back; the writes queued in `txn`, the
/// transfer's first.
fn decide(
    txn: &mut TxnDocs<'_>,
    transfer: TransferDoc,
    start: Start,
    now: &Now,
    retention: Retention,
) -> Decided {
    if let Some(settlement) = unless_as_expected(txn, &transfer, start) {
        return settlement;
    }
    let (changed, filed) = match apply_postings(txn, &transfer, now, retention) {
        Ok(applied) => applied,
        Err(NotApplied::Refused(reason, failed)) => {
            return roll_back(txn, transfer, start, now, reason, failed)
        }
        Err(NotApplied::Otherwise(settlement)) => return settlement,
    };
    let Some(mut next) = moved_along(transfer, &FINISH, None, now) else {
        return Decided::TwoPhase;
    };
    seal_terminal(&mut next, now.timestamp());
    next.entries = filed;
    let queued = write_transfer(txn, &next, start, &FINISH).and_then(|()| {
        changed
            .iter()
            .try_for_each(|account| txn.replace_if(&account.doc, account.version))
    });
    match queued {
        Ok(()) => Decided::Settled {
            transfer: Box::new(next),
            path: &FINISH,
        },
        Err(error) => Decided::Failed(error),
    }
}

/// `None` when the transfer is as `start` says (new and absent, or stored at the worker's
/// version); otherwise what the transaction comes to.
fn unless_as_expected(
    txn: &mut TxnDocs<'_>,
    transfer: &TransferDoc,
    start: Start,
) -> Option<Decided> {
    match (
        start,
        txn.version_of::<TransferDoc>(&transfer.transaction_id),
    ) {
        (Start::New, Ok(None)) => None,
        (Start::New, Ok(Some(_))) => Some(taken(txn, transfer)),
        (Start::Leased(version), Ok(Some(stored))) if stored == version => None,
        (_, Ok(_)) => Some(Decided::Changed),
        (_, Err(error)) => Some(Decided::Failed(error)),
    }
}

/// Why the accounts are not all changed in this transaction.
enum NotApplied {
    /// An account refuses the transfer: it rolls back with this reason, naming the account.
    Refused(RollbackReason, String),
    /// The transaction comes to this instead (the two-phase path, or a failure).
    Otherwise(Decided),
}

/// Every account of the transfer, changed as its settled posting leaves it, in posting order
/// (the first account's currency is the one the others must have, as in the two-phase
/// applies). Units are conserved (`docs/design.md §4`): the balance changes of a decision
/// that writes the accounts sum to zero, checked in debug builds.
fn apply_postings(
    txn: &mut TxnDocs<'_>,
    transfer: &TransferDoc,
    now: &Now,
    retention: Retention,
) -> Result<(Vec<Versioned<AccountDoc>>, Vec<String>), NotApplied> {
    let mut changed: Vec<Versioned<AccountDoc>> = Vec::with_capacity(2);
    let mut filed = Vec::with_capacity(2);
    let mut first_currency = None;
    // What the decision moves, summed over its accounts: zero, or units were made or lost.
    let mut moved = 0i128;
    for (index, posting) in transfer.postings().into_iter().enumerate() {
        let refused = |reason| NotApplied::Refused(reason, posting.account.to_owned());
        let account = match txn.get::<AccountDoc>(posting.account) {
            Ok(Some(account)) => account,
            Ok(None) => return Err(refused(RollbackReason::AccountNotFound)),
            Err(error) => return Err(NotApplied::Otherwise(Decided::Failed(error))),
        };
        let currency = currency_rule(&transfer.currency, AccountOp::Apply, index, &first_currency);
        let step = AccountStep {
            transfer_id: &transfer.transaction_id,
            amount: posting.amount,
            settle_amount: posting.settle_amount,
            side: posting.side,
            op: AccountOp::Apply,
            currency: currency.as_deref(),
            mark: None,
            hold: false,
            filed: &[],
        };
        match settle_at_once(&account.doc, step, now, retention) {
            Ok((next, entry)) => {
                if let Some(entry) = entry {
                    filed.push(entry.encode_filed(posting.account, &transfer.transaction_id));
                }
                if index == 0 {
                    first_currency = Some(next.currency.clone());
                }
                moved += next.balance as i128 - account.doc.balance as i128;
                changed.push(Versioned {
                    doc: next,
                    version: account.version,
                });
            }
            Err(refusal) => match refusal.rollback_reason() {
                Some(reason) if refusal != Refusal::AlreadySettled => return Err(refused(reason)),
                _ => return Err(NotApplied::Otherwise(Decided::TwoPhase)),
            },
        }
    }
    debug_assert_eq!(
        moved, 0,
        "{}: a settlement created or destroyed units",
        transfer.transaction_id
    );
    Ok((changed, filed))
}

/// A new transfer's id is taken: by our own earlier attempt when the stored transfer
/// carries our token, else by another request.
fn taken(txn: &mut TxnDocs<'_>, transfer: &TransferDoc) -> Decided {
    match txn.get::<TransferDoc>(&transfer.transaction_id) {
        Ok(Some(stored))
            if stored.doc.created_by.is_some() && stored.doc.created_by == transfer.created_by =>
        {
            Decided::Ours(Box::new(stored.doc))
        }
        _ => Decided::Changed,
    }
}

/// The transfer rolled back for `reason`, caused by account `failed`; no account is written
/// (none was changed).
fn roll_back(
    txn: &mut TxnDocs<'_>,
    transfer: TransferDoc,
    start: Start,
    now: &Now,
    reason: RollbackReason,
    failed: String,
) -> Decided {
    let Some(mut next) = moved_along(transfer, &ROLL_BACK, Some(reason), now) else {
        return Decided::TwoPhase;
    };
    next.failed_account = Some(failed);
    seal_terminal(&mut next, now.timestamp());
    match write_transfer(txn, &next, start, &ROLL_BACK) {
        Ok(()) => Decided::Settled {
            transfer: Box::new(next),
            path: &ROLL_BACK,
        },
        Err(error) => Decided::Failed(error),
    }
}

/// Queues the transfer's write: its create, or its replace at the held version. `path`: the
/// arrows it took from `created` (either start is a `created` transfer).
fn write_transfer(
    txn: &mut TxnDocs<'_>,
    transfer: &TransferDoc,
    start: Start,
    path: &[TransferState],
) -> StoreResult<()> {
    // States only move forward, along the arrows of the post: the written state is where
    // they lead from `created`.
    debug_assert_eq!(
        path.iter()
            .try_fold(TransferState::Created, |from, &to| from
                .can_move_to(to)
                .then_some(to)),
        Some(transfer.transaction_state),
        "{}: written off the arrows",
        transfer.transaction_id
    );
    match start {
        Start::New => txn.create(transfer),
        Start::Leased(version) => txn.replace_if(transfer, version),
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
