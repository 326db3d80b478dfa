//! Typed document I/O: the one place transfer and account documents are decoded from what the
//! store returns and encoded for a write. Callers see [`TransferDoc`] and [`AccountDoc`],
//! never the store's JSON.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Notify;

use super::model::{AccountDoc, TransferDoc};
use crate::store::{Doc, DynStore, Index, Source, StoreError, StoreResult, Version, WriteOutcome};

/// A document with the version it was read or written at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    pub doc: T,
    pub version: Version,
}

/// A document type and the index it lives in.
pub trait Document: Serialize + DeserializeOwned {
    const INDEX: Index;
    /// What the type is called in error messages.
    const KIND: &'static str;
    fn id(&self) -> &str;
    /// Brings a document decoded from an older form to the current one.
    fn upgrade(&mut self) {}
}

impl Document for TransferDoc {
    const INDEX: Index = Index::Transactions;
    const KIND: &'static str = "transfer";
    fn id(&self) -> &str {
        &self.transaction_id
    }
}

impl Document for AccountDoc {
    const INDEX: Index = Index::Accounts;
    const KIND: &'static str = "account";
    fn id(&self) -> &str {
        &self.account_id
    }
    fn upgrade(&mut self) {
        AccountDoc::upgrade(self);
    }
}

/// Typed reads and writes over a store.
#[derive(Clone)]
pub struct Documents {
    store: DynStore,
    /// Woken after every transfer write this process made that was applied: the change
    /// feed's long-poll waits on it.
    transfers_written: Arc<Notify>,
}

impl Documents {
    pub fn new(store: DynStore) -> Self {
        Self {
            store,
            transfers_written: Arc::new(Notify::new()),
        }
    }

    /// Woken (`notify_waiters`) after each applied transfer write of this process. Writes of
    /// other processes do not wake it: waiters also poll.
    pub fn transfers_written(&self) -> &Notify {
        &self.transfers_written
    }

    /// A realtime read. A document that does not decode is a permanent error: only a person
    /// can repair it, and acting on a guess could move money.
    pub async fn get<T: Document>(&self, id: &str) -> StoreResult<Option<Versioned<T>>> {
        match self.store.get(T::INDEX, id).await? {
            Some(doc) => decode(doc).map(Some),
            None => Ok(None),
        }
    }

    /// Create-if-absent (`op_type=create`).
    pub async fn create<T: Document>(&self, doc: &T) -> StoreResult<WriteOutcome> {
        let outcome = self.store.create(T::INDEX, doc.id(), encode(doc)?).await;
        self.written::<T>(outcome)
    }

    /// A write conditional on `version` (`if_seq_no` + `if_primary_term`).
    pub async fn replace_if<T: Document>(
        &self,
        doc: &T,
        version: Version,
    ) -> StoreResult<WriteOutcome> {
        let outcome = self
            .store
            .replace_if(T::INDEX, doc.id(), encode(doc)?, version)
            .await;
        self.written::<T>(outcome)
    }

    fn written<T: Document>(
        &self,
        outcome: StoreResult<WriteOutcome>,
    ) -> StoreResult<WriteOutcome> {
        if T::INDEX == Index::Transactions && matches!(outcome, Ok(WriteOutcome::Written(_))) {
            self.transfers_written.notify_waiters();
        }
        outcome
    }
}

/// Decodes a document the store returned.
pub fn decode<T: Document>(doc: Doc) -> StoreResult<Versioned<T>> {
    match decode_source::<T>(&doc.source) {
        Ok(parsed) => Ok(Versioned {
            doc: parsed,
            version: doc.version,
        }),
        Err(e) => Err(StoreError::Permanent(format!(
            "unreadable {} document {}: {e}",
            T::KIND,
            doc.id
        ))),
    }
}

/// Decodes a source as a `T`, in its current form.
pub fn decode_source<T: Document>(source: &Source) -> serde_json::Result<T> {
    let mut doc: T = source.decode()?;
    doc.upgrade();
    Ok(doc)
}

/// Encodes a document for a write. Our documents are plain structs of strings and integers,
/// which always serialize; should one ever fail, the write fails and nothing is written.
fn encode<T: Document>(doc: &T) -> StoreResult<Source> {
    Source::encode(doc).map_err(|e| {
        StoreError::Permanent(format!(
            "cannot encode {} document {}: {e}",
            T::KIND,
            doc.id()
        ))
    })
}
