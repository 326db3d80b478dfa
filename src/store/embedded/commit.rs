//! Group commit: one committer at a time applies every waiting batch in one write transaction
//! and answers each caller its own outcomes.

use super::*;

/// The most ops one group commit takes; bounds the latency a large group adds.
pub const MAX_GROUP_OPS: usize = 4096;

pub(super) type Reply = oneshot::Sender<StoreResult<Vec<StoreResult<WriteOutcome>>>>;

/// Writes waiting for the committer, and whether one is running.
#[derive(Default)]
pub(super) struct CommitQueue {
    pub(super) waiting: Vec<(Vec<WriteOp>, Reply)>,
    pub(super) committing: bool,
    pub(super) closed: bool,
}

/// The queue, and a signal for whoever waits for the committer to finish.
#[derive(Default)]
pub(super) struct Committer {
    pub(super) queue: Mutex<CommitQueue>,
    pub(super) idle: Condvar,
}

pub(super) fn lock(queue: &Mutex<CommitQueue>) -> std::sync::MutexGuard<'_, CommitQueue> {
    queue.lock().unwrap_or_else(|e| e.into_inner())
}

/// One committer's turn. Should it end abnormally (a panic, or the runtime dropping the
/// blocking task before it ran), dropping it fails the waiting writes (their callers get an
/// error instead of waiting forever) and lets the next write start a new committer.
pub(super) struct CommitterTurn {
    pub(super) committer: Arc<Committer>,
    pub(super) finished: bool,
}

impl Drop for CommitterTurn {
    fn drop(&mut self) {
        if !self.finished {
            let mut queue = lock(&self.committer.queue);
            queue.committing = false;
            queue.waiting.clear();
            self.committer.idle.notify_all();
        }
    }
}

/// The committer: drains waiting batches into one transaction, commits once, answers all;
/// again until nothing waits. Runs on the blocking pool.
pub(super) fn run_commits(db: &Database, mut turn: CommitterTurn) {
    let committer = turn.committer.clone();
    loop {
        let group = {
            let mut queue = lock(&committer.queue);
            if queue.waiting.is_empty() {
                queue.committing = false;
                turn.finished = true;
                committer.idle.notify_all();
                return;
            }
            take_group(&mut queue.waiting)
        };
        match apply_group(db, &group) {
            Ok(mut results) => {
                // `results` is in group order; hand each caller its own slice.
                for (batch, reply) in group.into_iter().rev() {
                    let mine = results.split_off(results.len() - batch.len());
                    let _ = reply.send(Ok(mine));
                }
            }
            Err(e) => {
                for (_, reply) in group {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// The oldest waiting batches, up to [`MAX_GROUP_OPS`] ops (at least one batch).
pub(super) fn take_group(waiting: &mut Vec<(Vec<WriteOp>, Reply)>) -> Vec<(Vec<WriteOp>, Reply)> {
    let mut ops = 0;
    let mut count = 0;
    for (batch, _) in waiting.iter() {
        if count > 0 && ops + batch.len() > MAX_GROUP_OPS {
            break;
        }
        ops += batch.len();
        count += 1;
    }
    waiting.drain(..count).collect()
}

/// The last `seq_no` handed out per index during one group: read from [`META`] at the first
/// write of the index, counted in memory, and stored once before the commit (two B-tree
/// operations per index and group instead of two per write).
#[derive(Default)]
pub(super) struct SeqNos {
    last: [Option<Option<u64>>; Index::ALL.len()],
}

impl SeqNos {
    fn slot(index: Index) -> usize {
        match index {
            Index::Accounts => 0,
            Index::Transactions => 1,
            Index::Webhooks => 2,
        }
    }

    fn counter(index: Index) -> &'static str {
        match index {
            Index::Accounts => "seq:accounts",
            Index::Transactions => "seq:transactions",
            Index::Webhooks => "seq:webhooks",
        }
    }

    /// The `seq_no` of the next write to `index` (the first one ever is 0).
    pub(super) fn next(&mut self, tables: &Tables<'_>, index: Index) -> StoreResult<u64> {
        let slot = &mut self.last[Self::slot(index)];
        let last = match *slot {
            Some(last) => last,
            None => tables
                .meta
                .get(Self::counter(index))
                .map_err(storage)?
                .map(|last| last.value()),
        };
        let next = last.map_or(0, |last| last + 1);
        *slot = Some(Some(next));
        Ok(next)
    }

    /// Writes the counters that moved into [`META`], in the group's transaction.
    pub(super) fn store(&self, tables: &mut Tables<'_>) -> StoreResult<()> {
        for index in Index::ALL {
            if let Some(Some(last)) = self.last[Self::slot(index)] {
                tables
                    .meta
                    .insert(Self::counter(index), last)
                    .map_err(storage)?;
            }
        }
        Ok(())
    }
}

/// Applies a group in one write transaction. An op that cannot be applied (a stored value
/// that is truncated, a transfer source that is not a JSON object) fails alone, having written
/// nothing; the group fails as a whole only when the transaction does (a storage error, a
/// failed commit), and then no op of it was acknowledged.
pub(super) fn apply_group(
    db: &Database,
    group: &[(Vec<WriteOp>, Reply)],
) -> StoreResult<Vec<StoreResult<WriteOutcome>>> {
    let mut txn = db.begin_write().map_err(storage)?;
    txn.set_durability(Durability::Immediate).map_err(storage)?;
    let mut results = Vec::new();
    {
        let mut tables = Tables::open(&txn)?;
        let mut seq_nos = SeqNos::default();
        for (batch, _) in group {
            for op in batch {
                results.push(apply_op(&mut tables, &mut seq_nos, op)?);
            }
        }
        seq_nos.store(&mut tables)?;
    }
    // Only now is anything acknowledged: until commit returns, a crash loses the whole group
    // and no caller has been told it was written. A failed commit leaves the outcome unknown
    // to the callers (they re-read before deciding again), whatever redb's reason.
    txn.commit().map_err(|e| {
        StoreError::Unavailable(format!(
            "embedded store: commit failed, the writes may or may not be applied: {e}"
        ))
    })?;
    Ok(results)
}

/// Applies one op. The inner result is the op's own outcome; an inner error is returned only
/// before the op wrote anything (every check comes first). The outer error is a storage
/// error, which fails the whole transaction (redb poisons a transaction that failed part-way
/// through a change).
///
/// Sources are not parsed, except a transfer's indexed fields (old and new, to move its
/// index entries): an account write costs a lookup, a copy and an insert.
pub(super) fn apply_op(
    tables: &mut Tables<'_>,
    seq_nos: &mut SeqNos,
    op: &WriteOp,
) -> StoreResult<StoreResult<WriteOutcome>> {
    let index = op.index();
    let id = op.id();
    let stored = tables.docs.get((index.name(), id)).map_err(storage)?;
    let (source, current) = match (op, &stored) {
        // A create only needs to know that the id is taken, whatever is stored there.
        (WriteOp::Create { .. }, Some(_)) => return Ok(Ok(WriteOutcome::AlreadyExists)),
        (WriteOp::Create { source, .. }, None) => (source, None),
        (WriteOp::ReplaceIf { .. }, None) => return Ok(Ok(WriteOutcome::NotFound)),
        (
            WriteOp::ReplaceIf {
                source, expected, ..
            },
            Some(bytes),
        ) => match split_stored(id, bytes.value()) {
            Ok((seq_no, _))
                if (Version {
                    seq_no,
                    primary_term: PRIMARY_TERM,
                }) != *expected =>
            {
                return Ok(Ok(WriteOutcome::Conflict))
            }
            // Only a transfer's old source is read again (for its index keys).
            Ok((seq_no, old)) => (
                source,
                (index == Index::Transactions).then(|| (seq_no, old.to_vec())),
            ),
            Err(e) => return Ok(Err(e)),
        },
    };
    drop(stored);
    // A transfer's index keys, old and new, are read before anything is written: a source
    // that is not a JSON object fails its op alone.
    let keys = match index {
        Index::Transactions => {
            let old = match current
                .as_ref()
                .map(|(_, old)| transfer_keys(old))
                .transpose()
            {
                Ok(old) => old,
                Err(e) => return Ok(Err(e)),
            };
            match transfer_keys(source.as_bytes()) {
                Ok(new) => Some((old, new)),
                Err(e) => return Ok(Err(e)),
            }
        }
        Index::Accounts | Index::Webhooks => None,
    };
    let seq_no = seq_nos.next(tables, index)?;
    // Every check passed: from here on, only writes.
    let bytes = source.as_bytes();
    let mut value = Vec::with_capacity(8 + bytes.len());
    value.extend_from_slice(&seq_no.to_le_bytes());
    value.extend_from_slice(bytes);
    tables
        .docs
        .insert((index.name(), id), value.as_slice())
        .map_err(storage)?;
    if let Some((old, new)) = keys {
        update_transfer_indexes(tables, id, old.as_ref(), &new)?;
        // The feed: the transfer's entry moves to this write's position.
        if let Some((old_seq_no, _)) = &current {
            tables.changes.remove(old_seq_no).map_err(storage)?;
        }
        tables.changes.insert(seq_no, id).map_err(storage)?;
    }
    Ok(Ok(WriteOutcome::Written(Version {
        seq_no,
        primary_term: PRIMARY_TERM,
    })))
}
