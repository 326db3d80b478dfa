//! Group commit: one committer at a time applies every waiting batch in one write transaction
//! and answers each caller its own outcomes.

use super::*;

/// The most ops one group commit takes; bounds the latency a large group adds.
pub const MAX_GROUP_OPS: usize = 4096;

/// What one transaction counts for against [`MAX_GROUP_OPS`]: about the writes of a
/// transfer (its writes are known only once it has run, so the bound is approximate: a
/// 16-leg transaction writes 17 documents).
const TXN_WEIGHT: usize = 4;

pub(super) type Reply = oneshot::Sender<StoreResult<Vec<StoreResult<WriteOutcome>>>>;
pub(super) type TxnReply = oneshot::Sender<StoreResult<TxnOutcome>>;

/// One caller's work waiting for the committer.
pub(super) enum Waiting {
    /// A `bulk`: each op on its own.
    Ops(Vec<WriteOp>, Reply),
    /// A `transact`: its writes all or none.
    Txn(TxnWork, TxnReply),
}

impl Waiting {
    fn weight(&self) -> usize {
        match self {
            Waiting::Ops(ops, _) => ops.len(),
            Waiting::Txn(..) => TXN_WEIGHT,
        }
    }
}

/// What the group's transaction answers one caller, once it committed.
pub(super) enum Answer {
    Ops(Vec<StoreResult<WriteOutcome>>),
    Txn(TxnOutcome),
}

/// Writes waiting for the committer, and whether one is running.
#[derive(Default)]
pub(super) struct CommitQueue {
    pub(super) waiting: Vec<Waiting>,
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
        let mut group = {
            let mut queue = lock(&committer.queue);
            if queue.waiting.is_empty() {
                queue.committing = false;
                turn.finished = true;
                committer.idle.notify_all();
                return;
            }
            take_group(&mut queue.waiting)
        };
        match apply_group(db, &mut group) {
            Ok(answers) => {
                for (waiting, answer) in group.into_iter().zip(answers) {
                    match (waiting, answer) {
                        (Waiting::Ops(_, reply), Answer::Ops(outcomes)) => {
                            let _ = reply.send(Ok(outcomes));
                        }
                        (Waiting::Txn(_, reply), Answer::Txn(outcome)) => {
                            let _ = reply.send(Ok(outcome));
                        }
                        _ => unreachable!("answers are made in the group's order"),
                    }
                }
            }
            Err(e) => {
                for waiting in group {
                    match waiting {
                        Waiting::Ops(_, reply) => drop(reply.send(Err(e.clone()))),
                        Waiting::Txn(_, reply) => drop(reply.send(Err(e.clone()))),
                    }
                }
            }
        }
    }
}

/// The oldest waiting batches, up to [`MAX_GROUP_OPS`] ops (at least one batch).
pub(super) fn take_group(waiting: &mut Vec<Waiting>) -> Vec<Waiting> {
    let mut ops = 0;
    let mut count = 0;
    for batch in waiting.iter() {
        if count > 0 && ops + batch.weight() > MAX_GROUP_OPS {
            break;
        }
        ops += batch.weight();
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
/// nothing, and so does a transaction with such a write; the group fails as a whole only when
/// the transaction does (a storage error, a failed commit), and then nothing of it was
/// acknowledged. Each transaction's work is taken out of the group to be run.
pub(super) fn apply_group(db: &Database, group: &mut [Waiting]) -> StoreResult<Vec<Answer>> {
    let mut txn = db.begin_write().map_err(storage)?;
    txn.set_durability(Durability::Immediate).map_err(storage)?;
    let mut answers = Vec::with_capacity(group.len());
    {
        let mut tables = Tables::open(&txn)?;
        let mut seq_nos = SeqNos::default();
        for waiting in group.iter_mut() {
            let answer = match waiting {
                Waiting::Ops(ops, _) => Answer::Ops(
                    ops.iter()
                        .map(|op| apply_op(&mut tables, &mut seq_nos, op))
                        .collect::<StoreResult<_>>()?,
                ),
                Waiting::Txn(work, _) => {
                    let work = std::mem::replace(work, Box::new(|_| Vec::new()));
                    Answer::Txn(run_txn(&mut tables, &mut seq_nos, work)?)
                }
            };
            answers.push(answer);
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
    Ok(answers)
}

/// The reads of a transaction's work: the group's tables, so they see the group's earlier
/// writes. A storage error is kept to fail the group (redb may have poisoned the
/// transaction); the work sees it as an error too.
struct GroupReads<'t, 'txn> {
    tables: &'t Tables<'txn>,
    failed: Option<StoreError>,
}

impl GroupReads<'_, '_> {
    /// The stored value of a document, decoded by `f`.
    fn read<T>(
        &mut self,
        index: Index,
        id: &str,
        f: impl FnOnce(&[u8]) -> StoreResult<T>,
    ) -> StoreResult<Option<T>> {
        match self.tables.docs.get((index.name(), id)) {
            Ok(stored) => stored.map(|bytes| f(bytes.value())).transpose(),
            Err(e) => {
                let e = storage(e);
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }
}

impl TxnReads for GroupReads<'_, '_> {
    fn get(&mut self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        self.read(index, id, |bytes| decode(id, bytes))
    }

    fn version(&mut self, index: Index, id: &str) -> StoreResult<Option<Version>> {
        self.read(index, id, |bytes| {
            split_stored(id, bytes).map(|(seq_no, _)| Version {
                seq_no,
                primary_term: PRIMARY_TERM,
            })
        })
    }
}

/// Runs one transaction's work and applies its writes, all or none: every write is checked
/// before any is made. A panic of the work fails this transaction alone.
fn run_txn(
    tables: &mut Tables<'_>,
    seq_nos: &mut SeqNos,
    work: TxnWork,
) -> StoreResult<TxnOutcome> {
    let mut reads = GroupReads {
        tables,
        failed: None,
    };
    let ops = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut reads)));
    if let Some(e) = reads.failed {
        return Err(e);
    }
    let Ok(ops) = ops else {
        tracing::error!("a transaction's work panicked; nothing of it was written");
        return Ok(TxnOutcome::Refused);
    };
    let mut seen = std::collections::HashSet::new();
    if !ops.iter().all(|op| seen.insert((op.index(), op.id()))) {
        return Ok(TxnOutcome::Refused);
    }
    let mut checked = Vec::with_capacity(ops.len());
    for op in &ops {
        match check_op(tables, op)? {
            Ok(op) => checked.push(op),
            Err(_) => return Ok(TxnOutcome::Refused),
        }
    }
    let mut versions = Vec::with_capacity(checked.len());
    for op in checked {
        versions.push(write_checked(tables, seq_nos, op)?);
    }
    Ok(TxnOutcome::Committed(versions))
}

/// Applies one op. The inner result is the op's own outcome; an inner error is returned only
/// before the op wrote anything (every check comes first). The outer error is a storage
/// error, which fails the whole transaction (redb poisons a transaction that failed part-way
/// through a change).
pub(super) fn apply_op(
    tables: &mut Tables<'_>,
    seq_nos: &mut SeqNos,
    op: &WriteOp,
) -> StoreResult<StoreResult<WriteOutcome>> {
    Ok(match check_op(tables, op)? {
        Ok(checked) => Ok(WriteOutcome::Written(write_checked(
            tables, seq_nos, checked,
        )?)),
        Err(outcome) => outcome,
    })
}

/// An op whose checks passed, with what its write needs to know of the stored document.
pub(super) struct CheckedOp<'o> {
    op: &'o WriteOp,
    /// A transfer's stored `seq_no` (its feed entry moves) and index keys, old and new.
    transfer: Option<(Option<u64>, IndexKeys<'o>)>,
}

/// A transfer's index entries before a write (owned: the stored document may change before
/// the write is made) and after it.
type IndexKeys<'o> = (Option<TransferKeys<'static>>, TransferKeys<'o>);

/// Checks an op against the stored document without writing anything: `Ok(Ok(_))` when it
/// may be written, `Ok(Err(outcome))` when it must not (a conflict, a taken id, a missing
/// document, or a source that cannot be indexed).
///
/// Sources are not parsed, except a transfer's indexed fields (old and new, to move its
/// index entries): an account write costs a lookup, a copy and an insert.
pub(super) fn check_op<'o>(
    tables: &Tables<'_>,
    op: &'o WriteOp,
) -> StoreResult<Result<CheckedOp<'o>, StoreResult<WriteOutcome>>> {
    let index = op.index();
    let id = op.id();
    let stored = tables.docs.get((index.name(), id)).map_err(storage)?;
    let (source, current) = match (op, &stored) {
        // A create only needs to know that the id is taken, whatever is stored there.
        (WriteOp::Create { .. }, Some(_)) => return Ok(Err(Ok(WriteOutcome::AlreadyExists))),
        (WriteOp::Create { source, .. }, None) => (source, None),
        (WriteOp::ReplaceIf { .. }, None) => return Ok(Err(Ok(WriteOutcome::NotFound))),
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
                return Ok(Err(Ok(WriteOutcome::Conflict)))
            }
            Ok((seq_no, old)) => (source, Some((seq_no, old))),
            Err(e) => return Ok(Err(Err(e))),
        },
    };
    // A transfer's index keys, old and new, are read before anything is written: a source
    // that is not a JSON object fails its op alone.
    let transfer = match index {
        Index::Transactions => {
            let old = match current.map(|(_, old)| transfer_keys(old)).transpose() {
                Ok(old) => old.map(TransferKeys::into_owned),
                Err(e) => return Ok(Err(Err(e))),
            };
            match transfer_keys(source.as_bytes()) {
                Ok(new) => Some((current.map(|(seq_no, _)| seq_no), (old, new))),
                Err(e) => return Ok(Err(Err(e))),
            }
        }
        Index::Accounts | Index::Webhooks => None,
    };
    Ok(Ok(CheckedOp { op, transfer }))
}

/// Writes a checked op: the document with its new `seq_no`, and a transfer's index and feed
/// entries. Only storage errors can fail it.
pub(super) fn write_checked(
    tables: &mut Tables<'_>,
    seq_nos: &mut SeqNos,
    checked: CheckedOp<'_>,
) -> StoreResult<Version> {
    let CheckedOp { op, transfer } = checked;
    let (index, id) = (op.index(), op.id());
    let source = match op {
        WriteOp::Create { source, .. } | WriteOp::ReplaceIf { source, .. } => source,
    };
    let seq_no = seq_nos.next(tables, index)?;
    let bytes = source.as_bytes();
    let mut value = Vec::with_capacity(8 + bytes.len());
    value.extend_from_slice(&seq_no.to_le_bytes());
    value.extend_from_slice(bytes);
    tables
        .docs
        .insert((index.name(), id), value.as_slice())
        .map_err(storage)?;
    if let Some((old_seq_no, (old, new))) = transfer {
        update_transfer_indexes(tables, id, old.as_ref(), &new)?;
        // The feed: the transfer's entry moves to this write's position.
        if let Some(old_seq_no) = old_seq_no {
            tables.changes.remove(old_seq_no).map_err(storage)?;
        }
        tables.changes.insert(seq_no, id).map_err(storage)?;
    }
    Ok(Version {
        seq_no,
        primary_term: PRIMARY_TERM,
    })
}
