//! The operations behind the HTTP API: accounts, idempotent transfer creation, cancel,
//! long-poll and listing. Requests never wait for the protocol: a created transfer is handed
//! to a spawned worker that already holds its lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::driver::{parse_transfer, Held};
use super::model::{AccountDoc, RollbackReason, TransferDoc, TransferState};
use super::protocol::{self, Now};
use super::retry::retry;
use super::Engine;
use crate::store::{format_millis, Index, SortKey, StoreError, TransferFilter, WriteOutcome};

/// Failures the API maps to answers.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// 409: the id exists with other data, or the transfer can no longer be cancelled.
    #[error("{0}")]
    Conflict(String),
    /// 404.
    #[error("not found")]
    NotFound,
    /// 503 (retryable) or 500.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The request to open an account.
#[derive(Debug, Clone)]
pub struct NewAccount {
    pub id: String,
    pub balance: i64,
    pub floor: i64,
}

/// A validated transfer request.
#[derive(Debug, Clone)]
pub struct NewTransfer {
    pub id: String,
    pub from: String,
    pub to: String,
    pub amount: i64,
}

/// Whether a create made something new or replayed what exists.
#[derive(Debug, Clone)]
pub enum Created<T> {
    New(T),
    Replayed(T),
}

const CREATE_ATTEMPTS: u32 = 3;

impl Engine {
    pub async fn create_account(
        &self,
        new: NewAccount,
    ) -> Result<Created<AccountDoc>, ServiceError> {
        let now = Now::system();
        let doc = AccountDoc {
            account_id: new.id.clone(),
            balance: new.balance,
            floor: new.floor,
            opening_balance: new.balance,
            pending_transactions: Vec::new(),
            pending_credits: 0,
            pending_debits: 0,
            settled_transactions: Vec::new(),
            creation_time: now.text.clone(),
            modification_time: now.text,
        };
        let source = serde_json::to_value(&doc).expect("documents serialize");
        match self
            .create_with_retries(Index::Accounts, &new.id, source)
            .await?
        {
            WriteOutcome::Written(_) => Ok(Created::New(doc)),
            _ => {
                let existing = self.get_account(&new.id).await?.ok_or_else(|| {
                    StoreError::Unavailable("account exists but cannot be read yet".into())
                })?;
                if existing.opening_balance == new.balance && existing.floor == new.floor {
                    Ok(Created::Replayed(existing))
                } else {
                    Err(ServiceError::Conflict(format!(
                        "account {} exists with another opening balance or floor",
                        new.id
                    )))
                }
            }
        }
    }

    pub async fn get_account(&self, id: &str) -> Result<Option<AccountDoc>, ServiceError> {
        match self.store.get(Index::Accounts, id).await? {
            Some(doc) => Ok(Some(serde_json::from_value(doc.source).map_err(|e| {
                StoreError::Permanent(format!("unreadable account document {id}: {e}"))
            })?)),
            None => Ok(None),
        }
    }

    /// Persists the transfer in `created` with a lease for a new worker, spawns that worker,
    /// and returns at once. The same id with the same request replays the transfer as it is
    /// now; with another request it is a conflict. Transfers are never deleted, so this holds
    /// forever.
    pub async fn create_transfer(
        self: &Arc<Self>,
        new: NewTransfer,
    ) -> Result<Created<TransferDoc>, ServiceError> {
        let now = Now::system();
        let owner = self.new_owner();
        let doc = TransferDoc {
            transaction_id: new.id.clone(),
            src_acct: new.from.clone(),
            dest_acct: new.to.clone(),
            amount: new.amount,
            transaction_state: TransferState::Created,
            reason: None,
            creation_time: now.text.clone(),
            modification_time: now.text.clone(),
            lease_owner: Some(owner.clone()),
            lease_expires_at: Some(format_millis(
                now.millis + self.config.lease.as_millis() as i64,
            )),
        };
        let source = serde_json::to_value(&doc).expect("documents serialize");
        let sent = Instant::now();
        match self
            .create_with_retries(Index::Transactions, &new.id, source)
            .await?
        {
            WriteOutcome::Written(version) => {
                self.metrics.transfers_created_total.inc();
                let shown = doc.clone();
                let deadline = self.lease_deadline(sent);
                self.spawn_driver(
                    owner,
                    Held {
                        doc,
                        version,
                        deadline,
                    },
                );
                Ok(Created::New(shown))
            }
            _ => {
                let held = self.get_transfer_held(&new.id).await?.ok_or_else(|| {
                    StoreError::Unavailable("transfer exists but cannot be read yet".into())
                })?;
                if held.doc.lease_owner.as_deref() == Some(owner.as_str()) {
                    // Our own earlier attempt, whose answer was lost: it is new, and ours to
                    // drive (the lease in it is ours, taken no earlier than `sent`).
                    self.metrics.transfers_created_total.inc();
                    let shown = held.doc.clone();
                    let deadline = self.lease_deadline(sent);
                    self.spawn_driver(owner, Held { deadline, ..held });
                    return Ok(Created::New(shown));
                }
                let existing = held.doc;
                if existing.src_acct == new.from
                    && existing.dest_acct == new.to
                    && existing.amount == new.amount
                {
                    Ok(Created::Replayed(existing))
                } else {
                    Err(ServiceError::Conflict(format!(
                        "transfer {} exists with another from, to or amount",
                        new.id
                    )))
                }
            }
        }
    }

    async fn create_with_retries(
        &self,
        index: Index,
        id: &str,
        source: serde_json::Value,
    ) -> Result<WriteOutcome, StoreError> {
        retry(
            CREATE_ATTEMPTS,
            || true,
            || self.store.create(index, id, source.clone()),
        )
        .await
    }

    pub async fn get_transfer(&self, id: &str) -> Result<Option<TransferDoc>, ServiceError> {
        Ok(self.get_transfer_held(id).await?.map(|h| h.doc))
    }

    async fn get_transfer_held(&self, id: &str) -> Result<Option<Held>, ServiceError> {
        match self.store.get(Index::Transactions, id).await? {
            Some(doc) => {
                let transfer = parse_transfer(doc.source).map_err(|reason| {
                    StoreError::Permanent(format!("transfer {id}: {reason:?}"))
                })?;
                Ok(Some(Held {
                    doc: transfer,
                    version: doc.version,
                    // Read, not leased: no deadline to act by.
                    deadline: Instant::now(),
                }))
            }
            None => Ok(None),
        }
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
        loop {
            let Some(held) = self.get_transfer_held(id).await? else {
                return Err(ServiceError::NotFound);
            };
            let state = held.doc.transaction_state;
            let to = match state {
                TransferState::Created => TransferState::RolledBack,
                TransferState::Pending => TransferState::Terminating,
                TransferState::Terminating | TransferState::RolledBack => return Ok(held.doc),
                TransferState::Committed | TransferState::Finished => {
                    return Err(ServiceError::Conflict(format!(
                        "transfer {id} is {state}; a committed transfer cannot be cancelled"
                    )))
                }
            };
            let now = Now::system();
            let live_owner = held
                .doc
                .lease_owner
                .clone()
                .filter(|_| self.lease_may_be_live(&held.doc, now.millis));
            // Keep a live holder's lease (it will see the new state at its next write and roll
            // back); otherwise take the lease for a worker of our own.
            let (owner, expires, spawn) = match (&live_owner, to) {
                (Some(owner), _) => (
                    owner.clone(),
                    held.doc.lease_expires_at.clone().unwrap_or_default(),
                    false,
                ),
                (None, TransferState::Terminating) => (
                    self.new_owner(),
                    format_millis(now.millis + self.config.lease.as_millis() as i64),
                    true,
                ),
                (None, _) => (String::new(), String::new(), false),
            };
            let Some(next) = protocol::transition(
                &held.doc,
                to,
                Some(RollbackReason::Cancelled),
                &now,
                Some((&owner, &expires)),
            ) else {
                continue;
            };
            let source = serde_json::to_value(&next).expect("documents serialize");
            let sent = Instant::now();
            match self
                .store
                .replace_if(Index::Transactions, id, source, held.version)
                .await
            {
                Ok(WriteOutcome::Written(version)) => {
                    self.record_transition(&next, state, to, now.millis);
                    if spawn {
                        self.spawn_driver(
                            owner,
                            Held {
                                doc: next.clone(),
                                version,
                                deadline: self.lease_deadline(sent),
                            },
                        );
                    }
                    return Ok(next);
                }
                // The transfer moved meanwhile: decide again on what it is now.
                Ok(_) => continue,
                // The outcome is unknown. If our lease is in the document, our write was
                // applied: drive it now rather than leave it until the lease runs out.
                Err(error) if error.is_retryable() && spawn => {
                    match self.get_transfer_held(id).await? {
                        Some(now) if now.doc.lease_owner.as_deref() == Some(owner.as_str()) => {
                            // Our owner token is unique: the transition was ours.
                            self.record_transition(&now.doc, state, to, protocol::now_millis());
                            let shown = now.doc.clone();
                            let deadline = self.lease_deadline(sent);
                            self.spawn_driver(owner, Held { deadline, ..now });
                            return Ok(shown);
                        }
                        _ => return Err(error.into()),
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// One page of the listing, newest first, and the key to continue after.
    pub async fn list_transfers(
        &self,
        filter: TransferFilter,
    ) -> Result<(Vec<TransferDoc>, Option<SortKey>), ServiceError> {
        let page = self.store.list_transfers(&filter).await?;
        let mut items = Vec::with_capacity(page.docs.len());
        for doc in page.docs {
            let id = doc.id.clone();
            items.push(
                parse_transfer(doc.source).map_err(|reason| {
                    StoreError::Permanent(format!("transfer {id}: {reason:?}"))
                })?,
            );
        }
        Ok((items, page.next))
    }
}
