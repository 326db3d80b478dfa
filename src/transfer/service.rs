//! The operations behind the HTTP API: accounts, idempotent transfer creation, cancel,
//! long-poll and listing. Requests never wait for the protocol: a created transfer is handed
//! to a spawned worker that already holds its lease.

use std::sync::Arc;
use std::time::Duration;

use super::admission::{Admitted, Overloaded};
use super::documents::{decode, Versioned};
use super::lease::{Claim, ClaimWrite, Held};
use super::model::{AccountDoc, Metadata, RollbackReason, Tombstones, TransferDoc, TransferState};
use super::protocol;
use super::retry::retry;
use super::Engine;
use crate::store::{SortKey, StoreError, TransferFilter, WriteOutcome};

/// Failures the API maps to answers.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// 409: the id exists with other data, or the transfer can no longer be cancelled.
    #[error("{0}")]
    Conflict(String),
    /// 404.
    #[error("not found")]
    NotFound,
    /// 503 with `Retry-After`: admission control refused the create; nothing was written.
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
    /// 503 (retryable) or 500.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The request to open an account.
#[derive(Debug, Clone, Default)]
pub struct NewAccount {
    pub id: String,
    pub balance: i64,
    pub floor: i64,
    /// Fixed for the account's life ([`super::model::valid_currency`]).
    pub currency: Option<String>,
    /// Labels ([`super::model::valid_metadata`]).
    pub metadata: Metadata,
}

/// A validated transfer request.
#[derive(Debug, Clone, Default)]
pub struct NewTransfer {
    pub id: String,
    pub from: String,
    pub to: String,
    pub amount: i64,
    /// The currency the client states, if any.
    pub currency: Option<String>,
    /// Labels ([`super::model::valid_metadata`]).
    pub metadata: Metadata,
}

/// Whether a create made something new or replayed what exists.
#[derive(Debug, Clone)]
pub enum Created<T> {
    New(T),
    Replayed(T),
}

const CREATE_ATTEMPTS: u32 = 3;

/// What a cancel does to a transfer in the state it was read in.
enum CancelPlan {
    /// Nothing to write: answer with the transfer as it is.
    Answer,
    /// Write this state.
    Move(TransferState),
}

impl Engine {
    pub async fn create_account(
        &self,
        new: NewAccount,
    ) -> Result<Created<AccountDoc>, ServiceError> {
        let now = self.clock.now();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let doc = AccountDoc {
            account_id: new.id.clone(),
            balance: new.balance,
            floor: new.floor,
            opening_balance: new.balance,
            created_by: Some(token.clone()),
            currency: new.currency.clone(),
            metadata: new.metadata.clone(),
            pending_transactions: Vec::new(),
            pending_applied_at: Vec::new(),
            pending_credits: 0,
            pending_debits: 0,
            settled: Tombstones::default(),
            legacy_settled: Vec::new(),
            creation_time: now.text.clone(),
            modification_time: now.text,
        };
        let created = retry(CREATE_ATTEMPTS, || true, || self.docs.create(&doc)).await?;
        if let WriteOutcome::Written(_) = created {
            return Ok(Created::New(doc));
        }
        let existing = self.get_account(&new.id).await?.ok_or_else(|| {
            StoreError::Unavailable("account exists but cannot be read yet".into())
        })?;
        if existing.created_by.as_deref() == Some(token.as_str()) {
            // Our own create, whose answer was lost (the retry found it): it is new.
            return Ok(Created::New(existing));
        }
        if existing.opening_balance == new.balance
            && existing.floor == new.floor
            && existing.currency == new.currency
            && existing.metadata == new.metadata
        {
            Ok(Created::Replayed(existing))
        } else {
            Err(ServiceError::Conflict(format!(
                "account {} exists with another opening balance, floor, currency or metadata",
                new.id
            )))
        }
    }

    pub async fn get_account(&self, id: &str) -> Result<Option<AccountDoc>, ServiceError> {
        Ok(self.docs.get::<AccountDoc>(id).await?.map(|v| v.doc))
    }

    /// Persists the transfer in `created` with a lease for a new worker, spawns that worker,
    /// and returns at once. The same id with the same request replays the transfer as it is
    /// now; with another request it is a conflict. Transfers are never deleted, so this holds
    /// forever. Admitted first: beyond `MAX_IN_FLIGHT` it is refused, having written nothing.
    pub async fn create_transfer(
        self: &Arc<Self>,
        new: NewTransfer,
    ) -> Result<Created<TransferDoc>, ServiceError> {
        let admitted = self.admit(1)?;
        self.create_admitted(new, admitted).await
    }

    /// [`Engine::create_transfer`] with a permit already taken (a batch takes its permits
    /// together). The permit goes to the new transfer's driver; a replay, a conflict or a
    /// failure gives it back.
    pub async fn create_admitted(
        self: &Arc<Self>,
        new: NewTransfer,
        admitted: Admitted,
    ) -> Result<Created<TransferDoc>, ServiceError> {
        let now = self.clock.now();
        let doc = TransferDoc {
            transaction_id: new.id.clone(),
            src_acct: new.from.clone(),
            dest_acct: new.to.clone(),
            amount: new.amount,
            transaction_state: TransferState::Created,
            reason: None,
            creation_time: now.text.clone(),
            modification_time: now.text,
            lease_owner: None,
            lease_expires_at: None,
            attention: None,
            currency: new.currency.clone(),
            metadata: new.metadata.clone(),
        };
        // A create whose answer was lost is still ours (the claim finds our token): it is
        // new, and ours to drive.
        let existing = match self.leases.claim(doc, ClaimWrite::Create).await? {
            Claim::Won(held) => {
                self.metrics.transfers_created_total.inc();
                let shown = held.doc.clone();
                self.spawn_driver(held, Some(admitted));
                return Ok(Created::New(shown));
            }
            Claim::Lost(existing) => existing.ok_or_else(|| {
                StoreError::Unavailable("transfer exists but cannot be read yet".into())
            })?,
        };
        let existing = existing.doc;
        if existing.src_acct == new.from
            && existing.dest_acct == new.to
            && existing.amount == new.amount
            && existing.currency == new.currency
            && existing.metadata == new.metadata
        {
            Ok(Created::Replayed(existing))
        } else {
            Err(ServiceError::Conflict(format!(
                "transfer {} exists with another from, to, amount, currency or metadata",
                new.id
            )))
        }
    }

    pub async fn get_transfer(&self, id: &str) -> Result<Option<TransferDoc>, ServiceError> {
        Ok(self.docs.get::<TransferDoc>(id).await?.map(|v| v.doc))
    }

    /// The transfer as soon as it is terminal, or as it is when `wait` ends. Wakes on this
    /// process's terminal writes and re-reads at least every 250 ms (another instance may be
    /// the one driving it).
    pub async fn wait_transfer(
        &self,
        id: &str,
        wait: Duration,
    ) -> Result<Option<TransferDoc>, ServiceError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut events = self.terminal_events.subscribe();
        loop {
            let current = self.get_transfer(id).await?;
            match &current {
                None => return Ok(None),
                Some(t) if t.transaction_state.is_terminal() => return Ok(current),
                Some(_) if tokio::time::Instant::now() >= deadline => return Ok(current),
                Some(_) => {}
            }
            let tick = (tokio::time::Instant::now() + Duration::from_millis(250)).min(deadline);
            tokio::select! {
                _ = events.changed() => {}
                _ = tokio::time::sleep_until(tick) => {}
                _ = self.shutdown.cancelled() => return Ok(current),
            }
        }
    }

    /// Cancels a transfer: `created` → `rolled-back`, `pending` → `terminating` (the lease
    /// holder, or a new worker if none is alive, then undoes the accounts). `terminating` and
    /// `rolled-back` answer as they are; `committed` and `finished` are a conflict.
    pub async fn cancel_transfer(self: &Arc<Self>, id: &str) -> Result<TransferDoc, ServiceError> {
        let mut read = self.docs.get::<TransferDoc>(id).await?;
        loop {
            let Some(current) = read else {
                return Err(ServiceError::NotFound);
            };
            let to = match cancel_plan(&current.doc)? {
                CancelPlan::Answer => return Ok(current.doc),
                CancelPlan::Move(to) => to,
            };
            match self.cancel_once(current, to).await? {
                Ok(done) => return Ok(done),
                // The transfer moved meanwhile: decide again on what it is now.
                Err(now) => read = now,
            }
        }
    }

    /// One attempt at moving `current` to `to` with reason `cancelled`. A live holder keeps
    /// its lease (it sees the new state at its next write and rolls back); otherwise a
    /// `terminating` transfer is claimed for a worker of our own. `Err` carries the transfer
    /// as it is now, when the attempt lost a race.
    async fn cancel_once(
        self: &Arc<Self>,
        current: Versioned<TransferDoc>,
        to: TransferState,
    ) -> Result<Result<TransferDoc, Option<Versioned<TransferDoc>>>, ServiceError> {
        let from = current.doc.transaction_state;
        let now = self.clock.now();
        let Some(next) =
            protocol::transition(&current.doc, to, Some(RollbackReason::Cancelled), &now)
        else {
            // `cancel_plan` only moves along arrows: this is a bug, not a race.
            return Err(StoreError::Permanent(format!("cannot cancel: {from} → {to}")).into());
        };
        let live = self.leases.may_be_live(&current.doc);
        if live || to.is_terminal() {
            let outcome = self
                .leases
                .write_keeping_lease(next.clone(), current.version)
                .await?;
            return Ok(match outcome {
                WriteOutcome::Written(_) => {
                    self.record_transition(&next, from, to, now.millis);
                    Ok(next)
                }
                _ => Err(self.docs.get::<TransferDoc>(&next.transaction_id).await?),
            });
        }
        match self
            .leases
            .claim(next, ClaimWrite::ReplaceAt(current.version))
            .await?
        {
            Claim::Won(held) => Ok(Ok(self.start_cancelled(held, from, to))),
            Claim::Lost(now) => Ok(Err(now)),
        }
    }

    /// Records a cancel that took the lease and spawns the worker that rolls it back.
    fn start_cancelled(
        self: &Arc<Self>,
        held: Held,
        from: TransferState,
        to: TransferState,
    ) -> TransferDoc {
        self.record_transition(&held.doc, from, to, self.clock.wall_millis());
        let shown = held.doc.clone();
        self.spawn_driver(held, None);
        shown
    }

    /// One page of the listing, newest first, and the key to continue after.
    pub async fn list_transfers(
        &self,
        filter: TransferFilter,
    ) -> Result<(Vec<TransferDoc>, Option<SortKey>), ServiceError> {
        let page = self.store.list_transfers(&filter).await?;
        let items = page
            .docs
            .into_iter()
            .map(|doc| decode::<TransferDoc>(doc).map(|v| v.doc))
            .collect::<Result<_, _>>()?;
        Ok((items, page.next))
    }
}

/// What a cancel does to a transfer in its current state.
fn cancel_plan(doc: &TransferDoc) -> Result<CancelPlan, ServiceError> {
    let state = doc.transaction_state;
    if let Some(why) = &doc.attention {
        return Err(ServiceError::Conflict(format!(
            "transfer {} needs attention ({why}); it is left as it is for a person",
            doc.transaction_id
        )));
    }
    match state {
        TransferState::Created => Ok(CancelPlan::Move(TransferState::RolledBack)),
        TransferState::Pending => Ok(CancelPlan::Move(TransferState::Terminating)),
        TransferState::Terminating | TransferState::RolledBack => Ok(CancelPlan::Answer),
        TransferState::Committed | TransferState::Finished => Err(ServiceError::Conflict(format!(
            "transfer {} is {state}; a committed transfer cannot be cancelled",
            doc.transaction_id
        ))),
    }
}
