//! A store as an instance sees it through a primary cut off from its replicas (a test double
//! of what `tests/process/partitions.rs` makes a real cluster do).
//!
//! While an index is cut, a write to it is accepted by the cut-off primary — later reads
//! through it show the write, at a version the cluster never gave out — but it is never
//! acknowledged (it fails as unavailable, as a write that timed out) and never reaches the
//! store the cluster keeps. The store refuses to vouch for a read that shows such a write
//! ([`Store::vouch`]), as Elasticsearch's global checkpoint never covers it. [`CutOff::heal`]
//! rolls every such write back, as the primary does when it rejoins.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;
use transfer_service::store::{
    Doc, DynStore, Forwarding, Index, Store, StoreError, StoreResult, Version, WriteOp,
    WriteOutcome,
};

/// Versions of the writes the cut-off primary accepted: a primary term no real one has.
const DIRTY_TERM: u64 = u64::MAX;

pub struct CutOff {
    inner: DynStore,
    cut: Mutex<Option<Index>>,
    /// What the cut-off primary holds that the cluster does not, by document.
    dirty: Mutex<HashMap<(Index, String), Doc>>,
    next_seq_no: AtomicU64,
    /// Whether any write was accepted dirty (a test that cut nothing tests nothing).
    accepted: AtomicBool,
}

impl CutOff {
    pub fn new(inner: DynStore) -> Self {
        Self {
            inner,
            cut: Mutex::new(None),
            dirty: Mutex::default(),
            next_seq_no: AtomicU64::new(0),
            accepted: AtomicBool::new(false),
        }
    }

    /// From now on, writes to `index` go to the cut-off primary only.
    pub fn cut(&self, index: Index) {
        *self.cut.lock().unwrap() = Some(index);
    }

    /// The primary rejoins: what it accepted alone is rolled back.
    pub fn heal(&self) {
        *self.cut.lock().unwrap() = None;
        self.dirty.lock().unwrap().clear();
    }

    pub fn accepted_dirty_writes(&self) -> bool {
        self.accepted.load(Ordering::Relaxed)
    }

    fn is_cut(&self, index: Index) -> bool {
        *self.cut.lock().unwrap() == Some(index)
    }

    /// The cut-off primary's version of a document it accepted a write of.
    fn dirty_copy(&self, index: Index, id: &str) -> Option<Doc> {
        self.dirty
            .lock()
            .unwrap()
            .get(&(index, id.to_owned()))
            .cloned()
    }

    /// Accepts `op` on the cut-off primary: conditional on what that primary holds (its own
    /// dirty copy, else the cluster's), applied there only, never acknowledged.
    async fn accept_dirty(&self, op: WriteOp) -> StoreResult<WriteOutcome> {
        let (index, id, source, expected) = match op {
            WriteOp::Create { index, id, source } => (index, id, source, None),
            WriteOp::ReplaceIf {
                index,
                id,
                source,
                expected,
            } => (index, id, source, Some(expected)),
        };
        let held = match self.dirty_copy(index, &id) {
            Some(doc) => Some(doc.version),
            None => self.inner.get(index, &id).await?.map(|doc| doc.version),
        };
        if held != expected {
            return Ok(WriteOutcome::Conflict);
        }
        let version = Version {
            seq_no: self.next_seq_no.fetch_add(1, Ordering::Relaxed),
            primary_term: DIRTY_TERM,
        };
        let doc = Doc {
            id: id.clone(),
            version,
            source,
        };
        self.dirty.lock().unwrap().insert((index, id), doc);
        self.accepted.store(true, Ordering::Relaxed);
        Err(StoreError::Unavailable(
            "the primary accepted the write but cannot replicate it (cut off)".into(),
        ))
    }
}

#[async_trait]
impl Forwarding for CutOff {
    fn inner(&self) -> &dyn Store {
        self.inner.as_ref()
    }

    async fn get(&self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        match self.dirty_copy(index, id) {
            Some(doc) => Ok(Some(doc)),
            None => self.inner.get(index, id).await,
        }
    }

    async fn vouch(&self, index: Index, id: &str, read: Option<Version>) -> StoreResult<()> {
        if read.is_some_and(|v| v.primary_term == DIRTY_TERM) {
            return Err(StoreError::Unavailable(
                "read shows a write no replica has".into(),
            ));
        }
        self.inner.vouch(index, id, read).await
    }

    async fn bulk(&self, ops: Vec<WriteOp>) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            let index = match &op {
                WriteOp::Create { index, .. } | WriteOp::ReplaceIf { index, .. } => *index,
            };
            let result = if self.is_cut(index) {
                self.accept_dirty(op).await
            } else {
                match self.inner.bulk(vec![op]).await {
                    Ok(mut one) => one.pop().expect("one result for one op"),
                    Err(e) => Err(e),
                }
            };
            results.push(result);
        }
        Ok(results)
    }

    fn transactions(&self) -> bool {
        // The two-phase protocol, as on Elasticsearch.
        false
    }
}
