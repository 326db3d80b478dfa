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
//! **Unindexed documents wait here.** Accounts and webhook cursors have no index entries, and
//! a busy account is rewritten by most groups. The committer does not write them into the
//! open transaction as it goes: until that transaction commits, this map is where they live
//! (the committer reads them here too), and the commit writes each one once, its latest
//! value, in key order ([`Recent::write_unindexed`]). Transfers go into the tables at once:
//! moving their index entries needs what the tables hold.

use std::collections::HashMap;
use std::sync::RwLock;

use bytes::Bytes;

use super::*;

/// Documents by index (in [`Index::ALL`] order) and id: the stored value (`seq_no` and
/// source) of each one's latest write, shared: reading one (the committer checks a busy
/// account's version on most groups) copies no bytes.
pub(super) type DocsById = [HashMap<String, Bytes>; Index::ALL.len()];

/// Acknowledged documents not committed to redb yet. (The store never deletes a document; a
/// delete would need a tombstone here.)
#[derive(Default)]
pub(super) struct Recent {
    docs: RwLock<DocsById>,
    /// Test hook: writing the unindexed documents at a commit panics.
    #[cfg(test)]
    pub(super) panic_writes: std::sync::atomic::AtomicBool,
}

impl Recent {
    /// The latest acknowledged value of a document written since the open transaction began.
    pub(super) fn get(&self, index: Index, id: &str) -> Option<Bytes> {
        let docs = self.docs.read().unwrap_or_else(|e| e.into_inner());
        docs[index as usize].get(id).cloned()
    }

    /// Whether every acknowledged write is committed to redb.
    pub(super) fn is_empty(&self) -> bool {
        let docs = self.docs.read().unwrap_or_else(|e| e.into_inner());
        docs.iter().all(HashMap::is_empty)
    }

    /// Adds a group's writes (each replaces an earlier write of its document). Call once the
    /// group's record is synced, before answering its callers.
    pub(super) fn add(&self, writes: DocsById) {
        let mut docs = self.docs.write().unwrap_or_else(|e| e.into_inner());
        for (held, written) in docs.iter_mut().zip(writes) {
            held.extend(written);
        }
    }

    /// Writes every unindexed document held here into `txn`'s documents, in key order (which
    /// keeps neighbouring inserts on the same pages). Call just before `txn` commits.
    pub(super) fn write_unindexed(&self, txn: &WriteTransaction) -> StoreResult<()> {
        let docs = self.docs.read().unwrap_or_else(|e| e.into_inner());
        let mut table = txn.open_table(DOCS).map_err(storage)?;
        for index in Index::ALL.into_iter().filter(|&index| !indexed(index)) {
            let mut held: Vec<_> = docs[index as usize].iter().collect();
            held.sort_unstable_by_key(|&(id, _)| id);
            for (id, value) in held {
                #[cfg(test)]
                if self.panic_writes.load(std::sync::atomic::Ordering::Relaxed) {
                    panic!("injected: a bug while the open transaction commits");
                }
                table
                    .insert((index.name(), id.as_str()), value.as_ref())
                    .map_err(storage)?;
            }
        }
        Ok(())
    }

    /// Forgets every write. Call only after the transaction holding them has committed.
    pub(super) fn committed(&self) {
        let mut docs = self.docs.write().unwrap_or_else(|e| e.into_inner());
        docs.iter_mut().for_each(HashMap::clear);
    }
}
