//! Group commit: one committer at a time applies every waiting batch in its open write
//! transaction, logs it once, and answers each caller its own outcomes.

use std::collections::HashMap;

use super::*;

/// The most ops one group commit takes; bounds the latency a large group adds.
pub const MAX_GROUP_OPS: usize = 4096;

/// What one transaction counts for against [`MAX_GROUP_OPS`]: about the writes of a
/// transfer (its writes are known only once it has run, so the bound is approximate: a
/// 16-leg transaction writes 17 documents).
const TXN_WEIGHT: usize = 4;

pub(super) type ReplyTo = oneshot::Sender<StoreResult<Vec<StoreResult<WriteOutcome>>>>;
pub(super) type TxnReply = oneshot::Sender<StoreResult<TxnOutcome>>;
pub(super) type FlushReply = oneshot::Sender<StoreResult<()>>;

/// One caller's work waiting for the committer.
pub(super) enum Waiting {
    /// A `bulk`: each op on its own.
    Ops(Vec<WriteOp>, ReplyTo),
    /// A `transact`: its writes all or none.
    Txn(TxnWork, TxnReply),
    /// A search about to read redb's tables: the open transaction commits after this group
    /// (see [`super::recent_writes`]).
    Flush(FlushReply),
}

impl Waiting {
    fn weight(&self) -> usize {
        match self {
            Waiting::Ops(ops, _) => ops.len(),
            Waiting::Txn(..) => TXN_WEIGHT,
            Waiting::Flush(_) => 0,
        }
    }

    /// Answers the caller `error`.
    fn fail(self, error: StoreError) {
        match self {
            Waiting::Ops(_, reply) => drop(reply.send(Err(error))),
            Waiting::Txn(_, reply) => drop(reply.send(Err(error))),
            Waiting::Flush(reply) => drop(reply.send(Err(error))),
        }
    }
}

/// What the group's transaction answers one caller, once its record is in the log.
pub(super) enum Answer {
    Ops(Vec<StoreResult<WriteOutcome>>),
    Txn(TxnOutcome),
    Flushed,
}

/// Writes waiting for the committer, and whether one is running.
#[derive(Default)]
pub(super) struct CommitQueue {
    pub(super) waiting: Vec<Waiting>,
    pub(super) committing: bool,
    pub(super) closed: bool,
}

/// The queue, a signal for whoever waits for the committer to finish, the write-ahead log
/// and the open transaction (only the running committer uses them), and the recent writes.
pub(super) struct Committer {
    pub(super) queue: Mutex<CommitQueue>,
    pub(super) idle: Condvar,
    pub(super) log: Mutex<Wal>,
    /// The write transaction kept open across groups, between turns too ([`super::recent_writes`]).
    /// redb has one writer at a time: nothing else may begin a write transaction while it is
    /// here (the store's start and close, and tests after `settle`, are the only others).
    pub(super) open: Mutex<Option<OpenTxn>>,
    /// The documents written by the acknowledged groups of the open transaction: for `get`,
    /// for the committer's own reads, and, for accounts, until the commit writes them.
    pub(super) recent: Recent,
    /// New transfers' listing entries and transfers' new account entries not in the tables
    /// yet ([`super::listing_entries`]). Only the committer changes them, holding `log`.
    pub(super) creations: Mutex<CreationEntries>,
    /// Whether the open transaction holds listing entries (written from `creations`) that
    /// are not committed: a search must then have it commit, even with nothing recent.
    pub(super) listing_uncommitted: std::sync::atomic::AtomicBool,
    /// Why the store stopped writing, once it has (see [`Committer::stop_writing`]).
    pub(super) stopped: std::sync::OnceLock<String>,
    /// `DATA_DIR`, where a stop is recorded for the next start.
    pub(super) files: Arc<dyn DataDir>,
}

impl Committer {
    pub(super) fn new(log: Wal, files: Arc<dyn DataDir>) -> Self {
        Self {
            files,
            queue: Mutex::default(),
            idle: Condvar::new(),
            log: Mutex::new(log),
            open: Mutex::new(None),
            recent: Recent::default(),
            creations: Mutex::default(),
            listing_uncommitted: std::sync::atomic::AtomicBool::new(false),
            stopped: std::sync::OnceLock::new(),
        }
    }

    /// Refuses every later write: after a group's record was written, a failure leaves the
    /// log and redb's state in memory disagreeing about that group, and later groups would
    /// build on the difference. A restart replays the log and starts from what is on disk.
    ///
    /// The reason is also left in `DATA_DIR` ([`DataDir::record_stopped`]) for the next start,
    /// which re-reads the files from the disk, not the page cache, before replaying the log.
    fn stop_writing(&self, reason: String) -> StoreError {
        if self.stopped.get().is_none() {
            tracing::error!(
                %reason,
                "embedded store: writes stopped until the service restarts. After an I/O \
                 error the disk may have lost writes it had accepted: check it (the kernel \
                 log, SMART), reboot the machine if you can, then start the service, which \
                 replays the write-ahead log over what the disk holds (docs/operations.md)"
            );
            if let Err(error) = self.files.record_stopped(&reason) {
                tracing::error!(%error, "embedded store: cannot leave the reason writes stopped in DATA_DIR");
            }
        }
        let reason = self.stopped.get_or_init(|| {
            format!("embedded store: {reason}; writes are refused until the service restarts")
        });
        StoreError::Unavailable(reason.clone())
    }

    /// Waits until no committer's turn is running (its checkpoint included); returns the
    /// queue, locked.
    pub(super) fn wait_idle(&self) -> std::sync::MutexGuard<'_, CommitQueue> {
        let mut queue = lock(&self.queue);
        while queue.committing {
            queue = self.idle.wait(queue).unwrap_or_else(|e| e.into_inner());
        }
        queue
    }

    /// `Unavailable` once writes have stopped.
    pub(super) fn check_writing(&self) -> StoreResult<()> {
        match self.stopped.get() {
            Some(reason) => Err(StoreError::Unavailable(reason.clone())),
            None => Ok(()),
        }
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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
            // Those still queued were never applied: they may retry, unless writes stopped.
            let error = self.committer.check_writing().err().unwrap_or_else(|| {
                StoreError::Unavailable(
                    "embedded store: the committer stopped before this write was applied".into(),
                )
            });
            let mut queue = lock(&self.committer.queue);
            queue.committing = false;
            for waiting in queue.waiting.drain(..) {
                waiting.fail(error.clone());
            }
            self.committer.idle.notify_all();
        }
    }
}

/// The committer: drains waiting batches into its open transaction, logs them once, answers
/// all, checkpoints if one is due; again until nothing waits. Runs on the blocking pool.
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
        let weight: usize = group.iter().map(Waiting::weight).sum();
        match apply_group(db, &committer, &mut group) {
            Ok(answers) => {
                for (waiting, answer) in group.into_iter().zip(answers) {
                    match (waiting, answer) {
                        (Waiting::Ops(_, reply), Answer::Ops(outcomes)) => {
                            let _ = reply.send(Ok(outcomes));
                        }
                        (Waiting::Txn(_, reply), Answer::Txn(outcome)) => {
                            let _ = reply.send(Ok(outcome));
                        }
                        (Waiting::Flush(reply), Answer::Flushed) => {
                            let _ = reply.send(Ok(()));
                        }
                        _ => unreachable!("answers are made in the group's order"),
                    }
                }
            }
            Err(e) => {
                for waiting in group {
                    waiting.fail(e.clone());
                }
            }
        }
        // After the answers: a checkpoint holds up only the writers behind it, not the group
        // just answered (whose writes are durable in the log already).
        checkpoint_if_due(db, &committer, weight);
    }
}

/// Checkpoints if the log says one is due after a group of `weight` ops. A checkpoint that
/// fails leaves redb's state uncertain while the log holds every write: the store stops
/// writing until a restart replays the log.
fn checkpoint_if_due(db: &Database, committer: &Committer, weight: usize) {
    if committer.check_writing().is_err() {
        return;
    }
    let mut log = lock(&committer.log);
    if !log.checkpoint_due(weight) {
        return;
    }
    if let Err(e) = checkpoint(db, committer, &mut log) {
        committer.stop_writing(format!("checkpoint failed: {e}"));
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

    pub(super) fn counter(index: Index) -> &'static str {
        match index {
            Index::Accounts => "seq:accounts",
            Index::Transactions => "seq:transactions",
            Index::Webhooks => "seq:webhooks",
        }
    }

    /// The last `seq_no` handed out in `index`, if any.
    fn last(&mut self, tables: &Tables<'_>, index: Index) -> StoreResult<Option<u64>> {
        let slot = &mut self.last[Self::slot(index)];
        if let Some(last) = *slot {
            return Ok(last);
        }
        let stored = tables.meta.get(Self::counter(index)).map_err(storage)?;
        let last = stored.map(|last| last.value());
        *slot = Some(last);
        Ok(last)
    }

    /// The `seq_no` of the next write to `index` (the first one ever is 0).
    pub(super) fn next(&mut self, tables: &Tables<'_>, index: Index) -> StoreResult<u64> {
        let next = self.last(tables, index)?.map_or(0, |last| last + 1);
        self.last[Self::slot(index)] = Some(Some(next));
        Ok(next)
    }

    /// Takes a `seq_no` written again by replay, which must be the next one: a group's writes
    /// took consecutive numbers from the counter the file holds. Anything else means the
    /// file was written after the log (by a version that does not read it, say), and
    /// replaying would roll documents back and hand numbers out twice.
    pub(super) fn replayed(
        &mut self,
        tables: &Tables<'_>,
        index: Index,
        seq_no: u64,
    ) -> StoreResult<()> {
        let last = self.last(tables, index)?;
        if seq_no != last.map_or(0, |last| last + 1) {
            return Err(StoreError::Permanent(format!(
                "embedded store: the write-ahead log continues {} at seq_no {seq_no} but the \
                 database file's last is {last:?}: the file was written after the log, which \
                 is left as it is",
                index.name()
            )));
        }
        self.last[Self::slot(index)] = Some(Some(seq_no));
        Ok(())
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

/// The committer's write transaction, open across groups until it commits.
pub(super) struct OpenTxn {
    pub(super) txn: WriteTransaction,
    /// Documents written by the groups it holds whose records are in the log (acknowledged,
    /// or about to be, and in [`Committer::recent`]; the unindexed ones are written into it
    /// when it commits). Losing a transaction that holds any leaves redb's state behind the
    /// log: the store must then stop writing ([`Taken`]).
    logged: usize,
    /// Listing entries of a run written into it ([`super::listing_entries`]): losing them would
    /// lose them until a restart catches them up, so they count as logged writes for
    /// [`OpenTxn::must_keep`] (not for the size that makes it commit).
    listing_entries: usize,
}

impl OpenTxn {
    /// Whether losing it loses what the tables must get: writes of the log, or listing
    /// entries of a run.
    fn must_keep(&self) -> bool {
        self.logged > 0 || self.listing_entries > 0
    }

    fn begin(db: &Database) -> StoreResult<Self> {
        let mut txn = db.begin_write().map_err(storage)?;
        txn.set_durability(Durability::None).map_err(storage)?;
        Ok(Self {
            txn,
            logged: 0,
            listing_entries: 0,
        })
    }

    /// Writes the unindexed documents the recent writes hold, then commits with `durability`;
    /// then every recent write is in redb's tables.
    pub(super) fn commit(
        mut self,
        committer: &Committer,
        durability: Durability,
    ) -> StoreResult<()> {
        committer.recent.write_unindexed(&self.txn)?;
        self.txn.set_durability(durability).map_err(storage)?;
        self.txn.commit().map_err(storage)?;
        committer.recent.committed();
        (committer.listing_uncommitted).store(false, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// The open transaction while the committer works in it, taken out of [`Committer::open`]
/// (or begun). It must end committed, put back, or given up through [`Taken::give_up`]; if
/// it is dropped otherwise (a panic anywhere in the committer's work, its commit included),
/// the logged writes it held are gone from redb's state in memory while the log holds them:
/// later groups would reuse their `seq_no`s, and a later commit would write the recent
/// accounts over a state that lacks the groups they came with. The store stops writing,
/// and a restart replays the log.
struct Taken<'c> {
    committer: &'c Committer,
    open: Option<OpenTxn>,
    /// Logged writes are being committed: the transaction has left `open` for redb's commit,
    /// and a panic there loses them as surely.
    committing_logged: bool,
}

impl<'c> Taken<'c> {
    fn take(db: &Database, committer: &'c Committer) -> StoreResult<Self> {
        let open = match lock(&committer.open).take() {
            Some(open) => open,
            // Recent writes belong to the open transaction: none may outlive it while writing.
            None if !committer.recent.is_empty() => {
                return Err(committer.stop_writing(
                    "acknowledged writes are in memory but no transaction holds them".into(),
                ))
            }
            None => OpenTxn::begin(db)?,
        };
        Ok(Self {
            committer,
            open: Some(open),
            committing_logged: false,
        })
    }

    fn get(&mut self) -> &mut OpenTxn {
        self.open.as_mut().expect("taken until it ends")
    }

    /// Puts the transaction back for the next group.
    fn put_back(mut self) {
        *lock(&self.committer.open) = self.open.take();
    }

    /// Commits it; see [`OpenTxn::commit`]. A failure with logged writes stops writing.
    fn commit(mut self, durability: Durability) -> StoreResult<()> {
        let open = self.open.take().expect("taken until it ends");
        let logged = open.must_keep();
        self.committing_logged = logged;
        let committed = open.commit(self.committer, durability);
        self.committing_logged = false;
        committed.map_err(|e| {
            let reason = format!("commit failed, the writes may or may not be applied: {e}");
            match logged {
                true => self.committer.stop_writing(reason),
                false => StoreError::Unavailable(format!("embedded store: {reason}")),
            }
        })
    }

    /// Drops the transaction after `error` in it (redb may have poisoned it): `error` for the
    /// group that met it, and the store stops writing if logged writes are lost with it.
    fn give_up(mut self, error: StoreError) -> StoreError {
        let open = self.open.take().expect("taken until it ends");
        match open.must_keep() {
            false => error,
            true => self.committer.stop_writing(format!(
                "the open transaction failed, with acknowledged writes in it: {error}"
            )),
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if self.committing_logged || self.open.as_ref().is_some_and(OpenTxn::must_keep) {
            self.committer.stop_writing(
                "the committer stopped part-way (a panic) with acknowledged writes in its open \
                 transaction"
                    .into(),
            );
        }
    }
}

/// Applies a group in the open write transaction (beginning one if none is open). An op that
/// cannot be applied (a stored value that is truncated, a transfer source that is not a JSON
/// object) fails alone, having written nothing, and so does a transaction with such a write;
/// the group fails as a whole only when the transaction does (a storage error, a failed log
/// write or commit), and then nothing of it was acknowledged. Such a failure also loses the
/// earlier groups the open transaction held (logged, acknowledged): the store then stops
/// writing until a restart replays them ([`Taken`]). Each transaction's work is taken out of
/// the group to be run.
///
/// Durability comes from the log ([`super::wal`]): the group's writes are appended and synced
/// there before anything of them is visible or acknowledged. Then they join
/// [`Committer::recent`] and the transaction stays open for the next groups, unless a commit
/// is due ([`Wal::commit_due`]) or a search waits in the group ([`Waiting::Flush`]); those
/// commits have no fsync of their own (checkpoints come after, in [`run_commits`]).
pub(super) fn apply_group(
    db: &Database,
    committer: &Committer,
    group: &mut [Waiting],
) -> StoreResult<Vec<Answer>> {
    committer.check_writing()?;
    let mut log = lock(&committer.log);
    let mut creations = lock(&committer.creations);
    let mut taken = Taken::take(db, committer)?;
    match last_transfer_seq_no(&taken.get().txn) {
        Ok(last) => creations.begin_run_if_due(last),
        Err(e) => return Err(taken.give_up(e)),
    }
    let mut record = log.record();
    let mut written = DocsById::default();
    let mut deferred = GroupEntries::default();
    let mut added = 0;
    let applied = apply_writes(
        &taken.get().txn,
        GroupWrites {
            seq_nos: SeqNos::default(),
            record: &mut record,
            written: &mut written,
            recent: &committer.recent,
            deferred: &mut deferred,
        },
        group,
    );
    let answers = match applied {
        Ok(answers) => answers,
        Err(e) => return Err(taken.give_up(e)),
    };
    // Nothing a reader can see or a caller is told lives only in memory: the record is on
    // disk first. Should the log write fail, the file may hold part of the record, and a
    // later record after it would not be read back: the store stops writing (and the
    // transaction is dropped, so nothing of the group is visible).
    if !record.is_empty() {
        if let Err(e) = log.append(&mut record) {
            let stopped = committer.stop_writing(format!("cannot write the log: {e}"));
            return Err(taken.give_up(stopped));
        }
        taken.get().logged += written.iter().map(HashMap::len).sum::<usize>();
        committer.recent.add(written);
        added = creations.add(deferred);
    }
    let flush = group.iter().any(|w| matches!(w, Waiting::Flush(_)));
    // Listing entries: a chunk of the run after each group, all of them before a search.
    if flush || creations.writing() {
        let chunk = match flush {
            true => Chunk::All,
            false => Chunk::After(added),
        };
        if let Err(e) = write_creations(committer, taken.get(), &mut creations, chunk) {
            return Err(taken.give_up(e));
        }
    }
    let open = taken.get();
    if !(flush || log.commit_due(open.logged)) {
        taken.put_back();
        return Ok(answers);
    }
    // A failed commit leaves the outcome unknown to the callers (they re-read before deciding
    // again), whatever redb's reason; once records are logged, replay will apply them, so the
    // store stops writing until then.
    taken.commit(Durability::None)?;
    Ok(answers)
}

/// The last transfer `seq_no` handed out, as `txn` holds it.
fn last_transfer_seq_no(txn: &WriteTransaction) -> StoreResult<u64> {
    let meta = txn.open_table(META).map_err(storage)?;
    let last = meta
        .get(SeqNos::counter(Index::Transactions))
        .map_err(storage)?;
    Ok(last.map_or(0, |last| last.value()))
}

/// How much of the listing entries to write.
enum Chunk {
    /// The next chunk of the run, after a group that added this many entries.
    After(usize),
    /// All of them (before a search, and at close).
    All,
}

/// Writes listing entries into the open transaction. It then holds writes that must not be
/// lost without a restart catching them up, as logged ones ([`OpenTxn::must_keep`]). Any
/// failure stops writing: the entries and the mark may be written in part, and only a
/// restart, catching up from the mark the file holds, knows what is missing.
fn write_creations(
    committer: &Committer,
    open: &mut OpenTxn,
    creations: &mut CreationEntries,
    chunk: Chunk,
) -> StoreResult<()> {
    let mut write = || {
        let last = last_transfer_seq_no(&open.txn)?;
        let mut tables = Tables::open(&open.txn)?;
        match chunk {
            Chunk::After(added) => creations.write_chunk(&mut tables, added),
            Chunk::All => creations.write_all(&mut tables, last),
        }
    };
    match write() {
        Ok(0) => Ok(()),
        Ok(written) => {
            open.listing_entries += written;
            // Set while `creations` is still held: a search that finds them written finds
            // this set, until the commit.
            (committer.listing_uncommitted).store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
        Err(e) => Err(committer.stop_writing(format!("cannot write listing entries: {e}"))),
    }
}

/// Runs a group's ops and transactions in `txn`, adding each write to the log `record`, to
/// `written` (the latest value of each document) and the entries left to the runs to
/// `deferred`, and stores the `seq_no` counters and the record's number. Unindexed documents
/// are read from `written`, then from the `recent` writes, then from the tables (see
/// [`GroupView`]). An error is a storage error: the transaction may be poisoned.
fn apply_writes(
    txn: &WriteTransaction,
    mut writes: GroupWrites<'_>,
    group: &mut [Waiting],
) -> StoreResult<Vec<Answer>> {
    let mut answers = Vec::with_capacity(group.len());
    let mut tables = Tables::open(txn)?;
    for waiting in group.iter_mut() {
        let answer = match waiting {
            Waiting::Ops(ops, _) => Answer::Ops(
                ops.iter()
                    .map(|op| apply_op(&mut tables, &mut writes, op))
                    .collect::<StoreResult<_>>()?,
            ),
            Waiting::Txn(work, _) => {
                let work = std::mem::replace(work, Box::new(|_| Vec::new()));
                Answer::Txn(run_txn(&mut tables, &mut writes, work)?)
            }
            Waiting::Flush(_) => Answer::Flushed,
        };
        answers.push(answer);
    }
    writes.seq_nos.store(&mut tables)?;
    if !writes.record.is_empty() {
        let number = writes.record.number();
        tables.meta.insert(LOG_APPLIED, number).map_err(storage)?;
    }
    Ok(answers)
}

/// Writes every pending listing entry into the open transaction, before a checkpoint at
/// close: a store closed cleanly has them all in its file.
pub(super) fn write_all_creations(db: &Database, committer: &Committer) -> StoreResult<()> {
    let mut creations = lock(&committer.creations);
    if creations.is_empty() {
        return Ok(());
    }
    let mut taken = Taken::take(db, committer)?;
    match write_creations(committer, taken.get(), &mut creations, Chunk::All) {
        Ok(()) => {
            taken.put_back();
            Ok(())
        }
        Err(e) => Err(taken.give_up(e)),
    }
}

/// Makes every commit so far durable in the redb file (the open transaction, or an empty one,
/// committed with `Durability::Immediate`), then empties the log: in this order, so that at
/// every moment either the file or the log holds each acknowledged write. An error of
/// either is an I/O error, after which what the disk holds is uncertain: the callers stop
/// writing ([`checkpoint_if_due`]; the store's start refuses to finish).
pub(super) fn checkpoint(db: &Database, committer: &Committer, log: &mut Wal) -> StoreResult<()> {
    Taken::take(db, committer)?.commit(Durability::Immediate)?;
    log.checkpointed().map_err(|e| {
        StoreError::Unavailable(format!(
            "embedded store: cannot empty the write-ahead log: {e}"
        ))
    })
}
