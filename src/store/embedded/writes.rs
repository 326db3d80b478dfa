//! The writes of one group, in the committer's open transaction: where a group reads
//! documents (its own writes, the recent writes, the tables), how each op and each
//! transaction's writes are checked and then made, and the log's replay, which makes each
//! logged write again the same way.

use bytes::Bytes;

use super::*;

/// What a group's writes add to besides the tables: the `seq_no` counters, the log record,
/// the documents written (for [`Committer::recent`]) and the entries left to the runs (for
/// [`Committer::creations`]); and the recent writes, where the unindexed documents of earlier
/// groups are.
pub(super) struct GroupWrites<'r> {
    pub(super) seq_nos: SeqNos,
    pub(super) record: &'r mut LogRecord,
    pub(super) written: &'r mut DocsById,
    pub(super) recent: &'r Recent,
    /// What its writes leave to the runs (new transfers' creation entries, account entries
    /// filed) and take back from them.
    pub(super) deferred: &'r mut GroupEntries,
}

impl GroupWrites<'_> {
    /// Where the group reads documents, its writes so far included.
    fn view<'v, 'txn>(&'v self, tables: &'v Tables<'txn>) -> GroupView<'v, 'txn> {
        GroupView {
            tables,
            written: self.written,
            recent: self.recent,
        }
    }
}

/// Where a group reads a document as its earlier writes left it. A transfer is written into
/// the tables at once (its index entries move with it). An unindexed document is not
/// ([`super::recent_writes`]): its latest value is in the group's own writes, else in the recent
/// writes of earlier groups, else in the tables.
pub(super) struct GroupView<'v, 'txn> {
    tables: &'v Tables<'txn>,
    written: &'v DocsById,
    recent: &'v Recent,
}

/// A stored value as [`GroupView::lookup`] finds it: in the tables, or in memory (the
/// group's own writes or the recent writes, shared).
enum Stored<'v> {
    Table(redb::AccessGuard<'v, &'static [u8]>),
    Memory(Bytes),
}

impl Stored<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Stored::Table(guard) => guard.value(),
            Stored::Memory(bytes) => bytes,
        }
    }
}

impl<'v> GroupView<'v, '_> {
    /// The stored value (`seq_no` and source) of a document, if any.
    fn lookup(&self, index: Index, id: &str) -> StoreResult<Option<Stored<'v>>> {
        if !indexed(index) {
            if let Some(value) = self.written[index as usize].get(id) {
                return Ok(Some(Stored::Memory(value.clone())));
            }
            if let Some(value) = self.recent.get(index, id) {
                return Ok(Some(Stored::Memory(value)));
            }
        }
        let stored = self.tables.docs.get((index.name(), id)).map_err(storage)?;
        Ok(stored.map(Stored::Table))
    }
}

/// The reads of a transaction's work, through the group's view (so they see the group's
/// earlier writes). A storage error is kept to fail the group (redb may have poisoned the
/// transaction); the work sees it as an error too. The `seq_no` of each document read (or
/// its absence) is kept: checking the transaction's writes then needs no second lookup.
struct GroupReads<'v, 'txn> {
    view: GroupView<'v, 'txn>,
    failed: Option<StoreError>,
    seen: Vec<(Index, String, Option<u64>)>,
}

impl GroupReads<'_, '_> {
    /// The stored value of a document, decoded by `f` (which also answers its `seq_no`).
    fn read<T>(
        &mut self,
        index: Index,
        id: &str,
        f: impl FnOnce(&[u8]) -> StoreResult<(u64, T)>,
    ) -> StoreResult<Option<T>> {
        let stored = match self.view.lookup(index, id) {
            Ok(stored) => stored.map(|stored| f(stored.bytes())).transpose()?,
            Err(e) => {
                self.failed = Some(e.clone());
                return Err(e);
            }
        };
        let seq_no = stored.as_ref().map(|(seq_no, _)| *seq_no);
        self.seen.push((index, id.to_owned(), seq_no));
        Ok(stored.map(|(_, value)| value))
    }

    /// What the work read of `op`'s document, if it read it.
    fn seen(&self, op: &WriteOp) -> Option<Option<u64>> {
        let (index, id) = (op.index(), op.id());
        self.seen
            .iter()
            .rev()
            .find(|(i, seen_id, _)| *i == index && seen_id == id)
            .map(|(_, _, seq_no)| *seq_no)
    }
}

impl TxnReads for GroupReads<'_, '_> {
    fn get(&mut self, index: Index, id: &str) -> StoreResult<Option<Doc>> {
        self.read(index, id, |bytes| {
            decode(id, bytes).map(|doc| (doc.version.seq_no, doc))
        })
    }

    fn version(&mut self, index: Index, id: &str) -> StoreResult<Option<Version>> {
        self.read(index, id, |bytes| {
            seq_no_of(id, bytes).map(|seq_no| {
                let version = Version {
                    seq_no,
                    primary_term: PRIMARY_TERM,
                };
                (seq_no, version)
            })
        })
    }
}

/// Runs one transaction's work and applies its writes, all or none: every write is checked
/// before any is made. A panic of the work fails this transaction alone.
pub(super) fn run_txn(
    tables: &mut Tables<'_>,
    writes: &mut GroupWrites<'_>,
    work: TxnWork,
) -> StoreResult<TxnOutcome> {
    let mut reads = GroupReads {
        view: writes.view(tables),
        failed: None,
        seen: Vec::new(),
    };
    let ops = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut reads)));
    if let Some(e) = reads.failed.take() {
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
    // Nothing was written since the work read: what it saw is what a lookup would find.
    let seen: Vec<_> = ops.iter().map(|op| reads.seen(op)).collect();
    let mut checked = Vec::with_capacity(ops.len());
    for (op, seen) in ops.iter().zip(seen) {
        match check_op(&writes.view(tables), op, seen)? {
            Ok(op) => checked.push(op),
            Err(_) => return Ok(TxnOutcome::Refused),
        }
    }
    let mut versions = Vec::with_capacity(checked.len());
    for op in checked {
        versions.push(write_checked(tables, writes, op)?);
    }
    Ok(TxnOutcome::Committed(versions))
}

/// Applies one op. The inner result is the op's own outcome; an inner error is returned only
/// before the op wrote anything (every check comes first). The outer error is a storage
/// error, which fails the whole transaction (redb poisons a transaction that failed part-way
/// through a change).
pub(super) fn apply_op(
    tables: &mut Tables<'_>,
    writes: &mut GroupWrites<'_>,
    op: &WriteOp,
) -> StoreResult<StoreResult<WriteOutcome>> {
    let checked = check_op(&writes.view(tables), op, None)?;
    Ok(match checked {
        Ok(checked) => Ok(WriteOutcome::Written(write_checked(
            tables, writes, checked,
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
/// `seen` is the document's `seq_no` (or its absence) as the transaction's work read it,
/// nothing having been written since: it stands for the lookup, unless the op overwrites a
/// stored transfer, whose old index keys come from its stored source.
///
/// Sources are not parsed, except a transfer's indexed fields (old and new, to move its
/// index entries): an account write costs a lookup (none when the work read it) and a copy;
/// its insert comes once per commit, whatever the number of writes ([`super::recent_writes`]).
pub(super) fn check_op<'o>(
    view: &GroupView<'_, '_>,
    op: &'o WriteOp,
    seen: Option<Option<u64>>,
) -> StoreResult<Result<CheckedOp<'o>, StoreResult<WriteOutcome>>> {
    let index = op.index();
    let id = op.id();
    let looked_up;
    let current = match seen {
        Some(seq_no) if index != Index::Transactions || seq_no.is_none() => {
            seq_no.map(|seq_no| (seq_no, None))
        }
        _ => {
            looked_up = view.lookup(index, id)?;
            match looked_up
                .as_ref()
                .map(|stored| split_stored(id, stored.bytes()))
            {
                None => None,
                Some(Ok((seq_no, old))) => Some((seq_no, Some(old))),
                // A create only needs to know that the id is taken, whatever is stored there.
                Some(Err(_)) if matches!(op, WriteOp::Create { .. }) => {
                    return Ok(Err(Ok(WriteOutcome::AlreadyExists)))
                }
                Some(Err(e)) => return Ok(Err(Err(e))),
            }
        }
    };
    let source = match (op, &current) {
        (WriteOp::Create { .. }, Some(_)) => return Ok(Err(Ok(WriteOutcome::AlreadyExists))),
        (WriteOp::Create { source, .. }, None) => source,
        (WriteOp::ReplaceIf { .. }, None) => return Ok(Err(Ok(WriteOutcome::NotFound))),
        (
            WriteOp::ReplaceIf {
                source, expected, ..
            },
            Some((seq_no, _)),
        ) => {
            let stored = Version {
                seq_no: *seq_no,
                primary_term: PRIMARY_TERM,
            };
            if stored != *expected {
                return Ok(Err(Ok(WriteOutcome::Conflict)));
            }
            source
        }
    };
    // A transfer's index keys, old and new, are read before anything is written: a source
    // that is not a JSON object fails its op alone. (A stored transfer's source is always
    // looked up above.)
    let current = current.and_then(|(seq_no, old)| old.map(|old| (seq_no, old)));
    let current = current.as_ref().map(|(seq_no, old)| (*seq_no, &**old));
    match transfer_change(index, current, source.as_bytes()) {
        Ok(transfer) => Ok(Ok(CheckedOp { op, transfer })),
        Err(e) => Ok(Err(Err(e))),
    }
}

/// What a write of `source` over the stored `current` (`seq_no` and source) moves: for a
/// transfer, its stored `seq_no` and its index keys, old and new. Fails when either source is
/// not a JSON object.
fn transfer_change<'s>(
    index: Index,
    current: Option<(u64, &[u8])>,
    source: &'s [u8],
) -> StoreResult<Option<(Option<u64>, IndexKeys<'s>)>> {
    match index {
        Index::Transactions => {
            let old = current
                .map(|(_, old)| transfer_keys(old).map(TransferKeys::into_owned))
                .transpose()?;
            let new = transfer_keys(source)?;
            Ok(Some((current.map(|(seq_no, _)| seq_no), (old, new))))
        }
        Index::Accounts | Index::Webhooks => Ok(None),
    }
}

/// Writes a checked op: a transfer's document with its new `seq_no`, index and feed entries
/// into the tables; an unindexed document into the group's writes only (the commit writes
/// it). Only storage errors can fail it.
pub(super) fn write_checked(
    tables: &mut Tables<'_>,
    writes: &mut GroupWrites<'_>,
    checked: CheckedOp<'_>,
) -> StoreResult<Version> {
    let CheckedOp { op, transfer } = checked;
    let (index, id) = (op.index(), op.id());
    let source = match op {
        WriteOp::Create { source, .. } | WriteOp::ReplaceIf { source, .. } => source,
    };
    let seq_no = writes.seq_nos.next(tables, index)?;
    // A transfer written terminal is compressed (`at_rest`); the log holds the value as
    // stored, so its replay stores the same bytes.
    let terminal = matches!(&transfer, Some((_, (_, new))) if !new.in_flight());
    let value = value_of(seq_no, source.as_bytes(), terminal);
    // An unindexed document reaches the tables when the open transaction commits; a new
    // transfer's listing entries, with a later run.
    if indexed(index) {
        // A change of a transfer's creation entries (which the engine never makes) is
        // written at once, all of them, and its pending ones are forgotten.
        let moved = match &transfer {
            Some((_, (Some(old), new)))
                if old.created != new.created || old.parties() != new.parties() =>
            {
                Some(new.clone().into_owned())
            }
            _ => None,
        };
        let number = store_document(
            tables,
            index,
            id,
            seq_no,
            &value,
            transfer,
            Some(writes.deferred),
        )?;
        if let (Some(keys), Some(number)) = (moved, number) {
            writes.deferred.moved(number);
            NewTransferEntries::of(number, &keys).write(tables)?;
        }
    }
    writes.record.push(index, id, &value);
    writes.written[index as usize].insert(id.to_owned(), value.into());
    Ok(Version {
        seq_no,
        primary_term: PRIMARY_TERM,
    })
}

/// Stores a document's value (`seq_no` and source) and moves a transfer's index and feed
/// entries (`transfer`, from [`transfer_change`]). Returns a transfer's number ([`TX_IDS`]).
fn store_document(
    tables: &mut Tables<'_>,
    index: Index,
    id: &str,
    seq_no: u64,
    value: &[u8],
    transfer: Option<(Option<u64>, IndexKeys<'_>)>,
    deferred: Option<&mut GroupEntries>,
) -> StoreResult<Option<u64>> {
    tables
        .docs
        .insert((index.name(), id), value)
        .map_err(storage)?;
    let Some((old_seq_no, (old, new))) = transfer else {
        return Ok(None);
    };
    // The feed: the transfer's entry moves to this write's position, and holds its number.
    let numbered = match old_seq_no {
        Some(old_seq_no) => tables.changes.remove(old_seq_no).map_err(storage)?,
        None => None,
    }
    .map(|number| number.value());
    let number = match numbered {
        Some(number) => number,
        // New, or stored without a feed entry (its document did not decode when an older
        // store was numbered, so it has no listing entries either): numbered by this write.
        None => {
            tables.ids.insert(seq_no, id).map_err(storage)?;
            seq_no
        }
    };
    update_transfer_indexes(tables, (id, number), old.as_ref(), &new, deferred)?;
    tables.changes.insert(seq_no, number).map_err(storage)?;
    Ok(Some(number))
}

/// Applies the log's records after the last one the redb file holds, in order, in `txn`
/// (which the caller commits durably), and returns the number of the last record applied.
/// Each write is made again exactly as its group made it, over the same state.
pub(super) fn replay_log(txn: &WriteTransaction, content: &[u8]) -> StoreResult<u64> {
    let mut tables = Tables::open(txn)?;
    let held = tables.meta.get(LOG_APPLIED).map_err(permanent)?;
    let mut last = held.map_or(0, |n| n.value());
    let mut seq_nos = SeqNos::default();
    let (mut records, mut writes) = (0, 0);
    for (number, logged) in read_records(content, last)? {
        if number <= last {
            continue;
        }
        records += 1;
        writes += logged.len();
        if number != last + 1 {
            return Err(StoreError::Permanent(format!(
                "embedded store: the write-ahead log skips from record {last} to {number}: \
                 it was not written with this database file"
            )));
        }
        for write in logged {
            replay_write(&mut tables, &mut seq_nos, &write)?;
        }
        last = number;
    }
    seq_nos.store(&mut tables)?;
    tables.meta.insert(LOG_APPLIED, last).map_err(permanent)?;
    if records > 0 {
        tracing::info!(records, writes, "embedded store: write-ahead log replayed");
    }
    Ok(last)
}

/// Writes one logged document again: its value as logged, its index entries moved from
/// whatever the state holds now (the state its group saw).
fn replay_write(
    tables: &mut Tables<'_>,
    seq_nos: &mut SeqNos,
    write: &LoggedWrite<'_>,
) -> StoreResult<()> {
    let LoggedWrite { index, id, value } = *write;
    let (seq_no, source) = split_stored(id, value)?;
    seq_nos.replayed(tables, index, seq_no)?;
    let stored = tables.docs.get((index.name(), id)).map_err(permanent)?;
    let current = stored
        .as_ref()
        .map(|bytes| split_stored(id, bytes.value()))
        .transpose()?;
    let current = current.as_ref().map(|(seq_no, old)| (*seq_no, &**old));
    let transfer = transfer_change(index, current, &source)?;
    drop(stored);
    store_document(tables, index, id, seq_no, value, transfer, None).map(drop)
}
