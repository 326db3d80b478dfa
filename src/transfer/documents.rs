//! Typed document I/O: the one place transfer and account documents are decoded from what the
//! store returns and encoded for a write. Callers see [`TransferDoc`] and [`AccountDoc`],
//! never the store's JSON.

use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Notify;

use super::model::{AccountDoc, TransferDoc};
use crate::store::{
    Doc, DynStore, Index, Source, StoreError, StoreResult, TxnOutcome, TxnReads, Version, WriteOp,
    WriteOutcome,
};

/// Reads of one document [`Documents::get_vouched`] makes at most while a vouch finds it
/// changed since each read (a document being written as it is read under a change of the
/// cluster's copies); then the vouch's `Unavailable` is the answer (a `503`).
const VOUCHED_READS: u32 = 3;

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

    /// A realtime read the store vouches for ([`crate::store::Store::vouch`]): what is
    /// answered to a client, or decided on without a write of its own, is never a write a
    /// cut-off primary accepted and will roll back, nor "not found" from a copy cut off from
    /// the writes it missed. `Unavailable` when that cannot be told now.
    /// A document written between its read and the vouch's second look is read again, a
    /// few times at most.
    pub async fn get_vouched<T: Document>(&self, id: &str) -> StoreResult<Option<Versioned<T>>> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let read = self.get::<T>(id).await?;
            match self
                .vouch::<T>(id, read.as_ref().map(|found| found.version))
                .await
            {
                Ok(()) => return Ok(read),
                Err(error) if error.changed_since_read() && attempts < VOUCHED_READS => continue,
                Err(error) => return Err(error),
            }
        }
    }

    /// Vouches for a read of `id` made earlier: at `read`, or not found (`None`).
    pub async fn vouch<T: Document>(&self, id: &str, read: Option<Version>) -> StoreResult<()> {
        self.store.vouch(T::INDEX, id, read).await
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

    /// Whether the store has multi-document transactions ([`Documents::transact`]).
    pub fn has_transactions(&self) -> bool {
        self.store.transactions()
    }

    /// Runs `work` inside one store transaction: it reads typed documents as they are in the
    /// transaction and queues the writes to make there, which the store applies all together
    /// or not at all ([`crate::store::Store::transact`]). Answers what `work` returned and what
    /// became of its writes. `work` runs on the store's committer: decide, do not wait, and
    /// have no effect but the writes queued (it runs before they are durable, see
    /// [`crate::store::TxnWork`]); its result is handed back only with the store's answer.
    pub async fn transact<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut TxnDocs<'_>) -> R + Send + 'static,
    ) -> StoreResult<(R, TxnOutcome)> {
        let answer = Arc::new(Mutex::new(None));
        let slot = answer.clone();
        let outcome = self
            .store
            .transact(Box::new(move |reads| {
                let mut docs = TxnDocs {
                    reads,
                    writes: Vec::new(),
                };
                let result = work(&mut docs);
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                docs.writes
            }))
            .await?;
        let result = answer.lock().unwrap_or_else(|e| e.into_inner()).take();
        let result = result.ok_or_else(|| {
            StoreError::Permanent("a transaction's work did not come to an end".into())
        })?;
        if matches!(&outcome, TxnOutcome::Committed(versions) if !versions.is_empty()) {
            self.transfers_written.notify_waiters();
        }
        Ok((result, outcome))
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

/// Typed reads and queued writes inside one store transaction ([`Documents::transact`]).
pub struct TxnDocs<'r> {
    reads: &'r mut dyn TxnReads,
    writes: Vec<WriteOp>,
}

impl TxnDocs<'_> {
    /// The document as it is in the transaction (a document that does not decode is a
    /// permanent error, as for [`Documents::get`]).
    pub fn get<T: Document>(&mut self, id: &str) -> StoreResult<Option<Versioned<T>>> {
        match self.reads.get(T::INDEX, id)? {
            Some(doc) => decode(doc).map(Some),
            None => Ok(None),
        }
    }

    /// The document's version in the transaction, without decoding it.
    pub fn version_of<T: Document>(&mut self, id: &str) -> StoreResult<Option<Version>> {
        self.reads.version(T::INDEX, id)
    }

    /// Queues the create of `doc` (refused if its id is taken).
    pub fn create<T: Document>(&mut self, doc: &T) -> StoreResult<()> {
        self.writes.push(WriteOp::Create {
            index: T::INDEX,
            id: doc.id().to_owned(),
            source: encode(doc)?,
        });
        Ok(())
    }

    /// Queues a write of `doc` conditional on `version`; the transaction's writes are made
    /// together when the work is done, in the order queued.
    pub fn replace_if<T: Document>(&mut self, doc: &T, version: Version) -> StoreResult<()> {
        self.writes.push(WriteOp::ReplaceIf {
            index: T::INDEX,
            id: doc.id().to_owned(),
            source: encode(doc)?,
            expected: version,
        });
        Ok(())
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
