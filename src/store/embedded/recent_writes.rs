//! The recent writes: the documents written by the groups the committer's open transaction
//! holds, once acknowledged, so that a `get` sees every acknowledged write before that
//! transaction commits (and, for accounts, until it commits they are only here).
//!
//! **Why a transaction stays open.** redb copies a page the first time a transaction changes
//! it, and its commit checksums and writes every page it changed. One transaction per group
//! paid that for the same account, index and document pages again and again; a transaction
//! kept open across groups pays it once per page until it commits (`Wal::commit_due`, or a
//! search, or a checkpoint).
//!
//! **Why this is safe.** A group's writes are added here only once its record is synced in
//! the log, before its callers are answered, and removed only after the transaction holding
//! them has committed. A `get` looks here first and then opens a redb read transaction: if
//! the write it should see is not here, either it was not acknowledged yet or it was
//! committed before the get looked, so the read transaction sees it. Searches, scans and the
//! feed read redb's tables, so they first have the committer commit (`EmbeddedStore::flush`)
//! whenever anything is here: they stay realtime.
//!
//! **Documents wait here.** A busy account is rewritten by most groups, and a transfer by
//! its every step, most of them before the open transaction commits. The committer does not
//! write them into that transaction as it goes: until it commits, this map is where they
//! live (the committer reads them here too), and the commit writes each one once, its latest
//! value, in key order ([`Recent::write_held`]). A transfer's index and feed entries then
//! move once, from what the tables hold (its state at the last commit, or nothing) to its
//! latest keys: the entries of the states it passed through in between are never written.
//! (A write that changes a transfer's creation time or accounts, which the engine never
//! makes, is written through at once: `writes::write_checked`.)

use std::collections::HashMap;
use std::sync::RwLock;

use bytes::Bytes;

use super::*;

/// Documents by index (in [`Index::ALL`] order) and id: the stored value (`seq_no` and
/// source) of each one's latest write, shared: reading one (the committer checks a busy
/// account's version on most groups) copies no bytes.
pub(super) type DocsById = [HashMap<String, Bytes>; Index::ALL.len()];

/// What the commit needs of a transfer written since the open transaction began, besides
/// its latest value: its index keys there (so that the commit parses nothing of it) and, if
/// it is new since, the number it was given at its creation (the `seq_no` of its first
/// write), which its listing entries carry.
#[derive(Debug, Clone)]
pub(super) struct HeldTransfer {
    pub(super) number: Option<u64>,
    pub(super) keys: TransferKeys<'static>,
}

/// [`HeldTransfer`]s by id.
pub(super) type HeldTransfers = HashMap<String, HeldTransfer>;

/// What the recent writes hold.
#[derive(Default)]
struct Held {
    docs: DocsById,
    transfers: HeldTransfers,
}

/// Acknowledged documents not committed to redb yet. (The store never deletes a document; a
/// delete would need a tombstone here.)
#[derive(Default)]
pub(super) struct Recent {
    held: RwLock<Held>,
    /// Test hook: writing the unindexed documents at a commit panics.
    #[cfg(test)]
    pub(super) panic_writes: std::sync::atomic::AtomicBool,
}

impl Recent {
    /// The latest acknowledged value of a document written since the open transaction began.
    pub(super) fn get(&self, index: Index, id: &str) -> Option<Bytes> {
        let held = self.held.read().unwrap_or_else(|e| e.into_inner());
        held.docs[index as usize].get(id).cloned()
    }

    /// The number of a transfer created since the open transaction began.
    pub(super) fn number(&self, id: &str) -> Option<u64> {
        let held = self.held.read().unwrap_or_else(|e| e.into_inner());
        held.transfers.get(id).and_then(|transfer| transfer.number)
    }

    /// What the commit needs of a transfer written since the open transaction began.
    pub(super) fn transfer(&self, id: &str) -> Option<HeldTransfer> {
        let held = self.held.read().unwrap_or_else(|e| e.into_inner());
        held.transfers.get(id).cloned()
    }

    /// Whether every acknowledged write is committed to redb.
    pub(super) fn is_empty(&self) -> bool {
        let held = self.held.read().unwrap_or_else(|e| e.into_inner());
        held.docs.iter().all(HashMap::is_empty)
    }

    /// Adds a group's writes (each replaces an earlier write of its document) and what the
    /// commit needs of its transfers. Call once the group's record is synced, before
    /// answering its callers.
    pub(super) fn add(&self, writes: DocsById, transfers: HeldTransfers) {
        let mut held = self.held.write().unwrap_or_else(|e| e.into_inner());
        for (docs, written) in held.docs.iter_mut().zip(writes) {
            docs.extend(written);
        }
        held.transfers.extend(transfers);
    }

    /// Writes every document held here into `txn`'s tables, in key order (which keeps
    /// neighbouring inserts on the same pages): an unindexed one as it is, a transfer with
    /// its index and feed entries ([`write_held_transfer`]). Call just before `txn` commits.
    pub(super) fn write_held(&self, txn: &WriteTransaction) -> StoreResult<()> {
        let held = self.held.read().unwrap_or_else(|e| e.into_inner());
        let mut tables = Tables::open(txn)?;
        for index in Index::ALL {
            let mut docs: Vec<_> = held.docs[index as usize].iter().collect();
            docs.sort_unstable_by_key(|&(id, _)| id);
            for (id, value) in docs {
                #[cfg(test)]
                if self.panic_writes.load(std::sync::atomic::Ordering::Relaxed) {
                    panic!("injected: a bug while the open transaction commits");
                }
                match indexed(index) {
                    true => write_held_transfer(&mut tables, id, value, held.transfers.get(id))?,
                    false => {
                        tables
                            .docs
                            .insert((index.name(), id.as_str()), value.as_ref())
                            .map_err(storage)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Forgets every write. Call only after the transaction holding them has committed.
    pub(super) fn committed(&self) {
        let mut held = self.held.write().unwrap_or_else(|e| e.into_inner());
        held.docs.iter_mut().for_each(HashMap::clear);
        held.transfers.clear();
    }
}
