//! The creation entries of new transfers (their entry in [`TX_BY_CREATED`] and one per
//! account in [`TX_BY_ACCOUNT`]) and the account entries a write files in a transfer (one
//! per new value of its `entries` in [`TX_ENTRIES`], the statements' index), written in
//! sorted runs rather than with each write.
//!
//! **Why.** An account's entries sit together at the end of its range, and a busy load
//! touches every account: written as transfers came, each entry dirtied a page of its own
//! account's range in nearly every transaction, so redb copied and then (at each checkpoint)
//! wrote a page per entry. These inserts and their page writes were the largest cost of a
//! transfer in batches: without them at all, a transfer took 40% less CPU. Sorted, a run
//! writes each account's new entries next to each other, a page once for many of them.
//! The statements' index is laid out the same way (an account's seqs rise) and had the same
//! cost: two of its keys a transfer, written at once, took a fifth more CPU a transfer
//! (`docs/benchmark.md`, "Account statements side by side").
//!
//! **How.** A new transfer's creation entries, and the account entries any write adds to a
//! transfer, are pending here once its group's record is in the log ([`GroupEntries`]).
//! When a run is due (a second after the first pending entry, or many transfers'), the
//! pending entries are sorted and written a chunk at a time, one chunk after each group,
//! into the committer's transaction ([`CreationEntries::write_chunk`]). A search (a listing,
//! a statement's `account_entries`), scan or feed read has the committer write all of them
//! first ([`CreationEntries::write_all`], with the commit it already asks for), so listings
//! and statements stay realtime.
//!
//! **Why this is safe.** NewTransferEntries entries never change once a transfer is created (its
//! creation time and accounts are fixed), and a transfer's account entries only grow (the
//! engine adds values to a transfer's `entries`, never takes one away), so writing one late
//! or twice is the same as writing it once. [`META`] holds [`CREATION_ENTRIES_FROM`]: every
//! transfer whose latest write has a lower `seq_no` has all its entries in the tables. It
//! moves only in the transaction that writes the last chunk of a run, past the last `seq_no`
//! handed out when the run began. After a crash, opening the store writes the entries of
//! every transfer in the feed from it, creation and account entries as its document holds
//! them ([`catch_up_creation_entries`]): a transfer created, or given entries, later has its
//! feed entry later still (the feed holds each transfer at its latest write). Entries
//! written in a transaction that is lost with writes of the log (the chunks count as such,
//! see `OpenTxn::logged`) stop the store's writes until a restart, which catches up.
//!
//! A write that changes what is written late (which the engine never does: a transfer's
//! creation time or accounts, a value taken from its `entries`) makes the change at once
//! and takes the stale entries out of the pending ones ([`GroupEntries::moved`],
//! [`GroupEntries::unfile`]), so a run never writes them back. Nothing else is deferred: an
//! entry that moves when a transfer changes (its state, its lease, its flag) is written
//! with the change, and so is a transfer's metadata entry.

use std::time::{Duration, Instant};

use super::*;

/// The key in [`META`]: every transfer whose latest write's `seq_no` is below this has its
/// creation and account entries in the tables (the name is from before account entries
/// were written late; stores hold it).
pub(super) const CREATION_ENTRIES_FROM: &str = "creation_entries:from";

/// A run is due this long after its first pending entry...
const RUN_AFTER: Duration = Duration::from_secs(1);

/// ... or once this many are pending, counting a transfer's creation entries as one and each
/// account entry as one (a one-leg transfer settled in one transaction adds three): a bound
/// on what waits in memory; below some 21,000 such transfers a second, [`RUN_AFTER`] comes
/// first.
const RUN_TRANSFERS: usize = 65_536;

/// Entries written after each group while a run is being written: twice what the group
/// added (so runs keep ahead of the load), and at least this many. A chunk then costs a
/// group about what its own entries would have, not a whole run's delay.
const CHUNK_ENTRIES: usize = 256;

/// The creation entries of one new transfer, which name it by its number ([`TX_IDS`]).
#[derive(Debug)]
pub(super) struct NewTransferEntries {
    number: u64,
    created: i64,
    accounts: Vec<Box<str>>,
}

impl NewTransferEntries {
    pub(super) fn of(number: u64, keys: &TransferKeys<'_>) -> Self {
        NewTransferEntries {
            number,
            created: keys.created,
            accounts: keys.parties().into_iter().map(|p| p.into()).collect(),
        }
    }

    pub(super) fn number(&self) -> u64 {
        self.number
    }

    /// Writes the entries at once (catching up).
    pub(super) fn write(&self, tables: &mut Tables<'_>) -> StoreResult<()> {
        self.insert_into(&mut tables.by_created, &mut tables.by_account)
            .map_err(storage)
    }

    /// Inserts the entries into the two tables that hold them.
    pub(super) fn insert_into(
        &self,
        by_created: &mut Table<'_, (i64, u64), ()>,
        by_account: &mut Table<'_, (&'static str, i64, u64), ()>,
    ) -> Result<(), redb::StorageError> {
        by_created.insert((self.created, self.number), ())?;
        for account in &self.accounts {
            by_account.insert((&**account, self.created, self.number), ())?;
        }
        Ok(())
    }
}

/// What one group's writes leave to the runs, and what they took back from them: gathered
/// while the group is applied, handed to [`CreationEntries::add`] once its record is logged.
#[derive(Debug, Default)]
pub(super) struct GroupEntries {
    /// The creation entries of the transfers it created.
    pub(super) created: Vec<NewTransferEntries>,
    /// The account entries ([`TX_ENTRIES`]) its writes added to transfers.
    pub(super) filed: Vec<EntryKey>,
    /// Transfers whose creation time or accounts it changed (their entries were written at
    /// once): their pending creation entries are forgotten.
    pub(super) moved: Vec<u64>,
    /// Account entries its writes took from transfers (removed at once): pending, they are
    /// forgotten.
    pub(super) unfiled: Vec<EntryKey>,
}

impl GroupEntries {
    /// An account entry a write added to a transfer.
    pub(super) fn file(&mut self, key: EntryKey) {
        self.filed.push(key);
    }

    /// An account entry a write took from a transfer (and removed from the table): the
    /// group's own pending copy goes now, an earlier group's once this one is logged.
    pub(super) fn unfile(&mut self, key: EntryKey) {
        self.filed.retain(|filed| *filed != key);
        self.unfiled.push(key);
    }

    /// A transfer whose creation entries a write changed and wrote at once.
    pub(super) fn moved(&mut self, number: u64) {
        self.created.retain(|c| c.number() != number);
        self.moved.push(number);
    }
}

/// A run: the entries pending when it began, sorted, and how far it is written (in the
/// order of its fields: creation, account, then statement entries).
struct Run {
    by_created: Vec<(i64, u64)>,
    by_account: Vec<(Box<str>, i64, u64)>,
    filed: Vec<EntryKey>,
    written: usize,
    /// The last transfer `seq_no` handed out when the run began.
    through: u64,
}

impl Run {
    fn len(&self) -> usize {
        self.by_created.len() + self.by_account.len() + self.filed.len()
    }

    /// Drops the entries not written yet that `keep` refuses. An entry before `written` is
    /// in the tables already: the write that made it stale removed it there. Every segment
    /// after the one `written` is in is unwritten, so `written` still counts the same
    /// entries.
    fn retain_unwritten(
        &mut self,
        keep_created: impl Fn(&(i64, u64)) -> bool,
        keep_account: impl Fn(&(Box<str>, i64, u64)) -> bool,
        keep_filed: impl Fn(&EntryKey) -> bool,
    ) {
        let mut before = 0;
        before += retain_tail(&mut self.by_created, self.written - before, keep_created);
        let written = self.written.saturating_sub(before);
        before += retain_tail(&mut self.by_account, written, keep_account);
        let written = self.written.saturating_sub(before);
        retain_tail(&mut self.filed, written, keep_filed);
    }
}

/// Keeps the entries of `segment` from `written` on that `keep` keeps; returns the
/// segment's length.
fn retain_tail<T>(segment: &mut Vec<T>, written: usize, keep: impl Fn(&T) -> bool) -> usize {
    let tail = segment.split_off(written.min(segment.len()));
    segment.extend(tail.into_iter().filter(|entry| keep(entry)));
    segment.len()
}

/// NewTransferEntries and account entries not in the tables yet: pending, and the run being written.
pub(super) struct CreationEntries {
    pending: Vec<NewTransferEntries>,
    /// Account entries ([`TX_ENTRIES`]) pending.
    pending_filed: Vec<EntryKey>,
    pending_since: Option<Instant>,
    run: Option<Run>,
    /// [`RUN_AFTER`]; tests choose.
    pub(super) run_after: Duration,
    /// Test hook: writing an entry fails once, after this many more (a storage error).
    #[cfg(test)]
    pub(super) fail_after: Option<usize>,
}

impl Default for CreationEntries {
    fn default() -> Self {
        CreationEntries {
            pending: Vec::new(),
            pending_filed: Vec::new(),
            pending_since: None,
            run: None,
            run_after: RUN_AFTER,
            #[cfg(test)]
            fail_after: None,
        }
    }
}

impl CreationEntries {
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.pending_filed.is_empty() && self.run.is_none()
    }

    /// Takes what a group's writes left to the runs: forgets what they took back, then adds
    /// their new transfers' creation entries and the account entries they filed. Call once
    /// the group's record is in the log. Returns how many entries they added.
    pub(super) fn add(&mut self, group: GroupEntries) -> usize {
        let GroupEntries {
            created,
            filed,
            moved,
            unfiled,
        } = group;
        for number in moved {
            self.forget(number);
        }
        if !unfiled.is_empty() {
            self.forget_filed(&unfiled);
        }
        if created.is_empty() && filed.is_empty() {
            return 0;
        }
        self.pending_since.get_or_insert_with(Instant::now);
        let entries = created.iter().map(|c| 1 + c.accounts.len()).sum::<usize>() + filed.len();
        self.pending.extend(created);
        self.pending_filed.extend(filed);
        entries
    }

    /// Forgets the creation entries of transfer `number` not written yet (its creation time
    /// or accounts changed, which the engine never does: the tables get its new entries at
    /// once, and lose the old ones).
    fn forget(&mut self, number: u64) {
        self.pending.retain(|c| c.number != number);
        if let Some(run) = &mut self.run {
            run.retain_unwritten(|&(_, n)| n != number, |&(_, _, n)| n != number, |_| true);
        }
    }

    /// Forgets the account entries `unfiled` not written yet (a write took them from their
    /// transfer, which the engine never does, and removed them from the table).
    fn forget_filed(&mut self, unfiled: &[EntryKey]) {
        self.pending_filed.retain(|key| !unfiled.contains(key));
        if let Some(run) = &mut self.run {
            run.retain_unwritten(|_| true, |_| true, |key| !unfiled.contains(key));
        }
    }

    /// Begins a run if one is due. Call before a group's writes, with the last transfer
    /// `seq_no` handed out so far: every pending entry is of a transfer written at or before
    /// it (a group's entries are added after its record is logged).
    pub(super) fn begin_run_if_due(&mut self, last_seq_no: u64) {
        if self.run.is_none() && self.run_due() {
            self.begin_run(last_seq_no);
        }
    }

    /// Whether a run is being written.
    pub(super) fn writing(&self) -> bool {
        self.run.is_some()
    }

    /// Writes the next chunk of the run into `tables`, after a group that added `added`
    /// entries. Returns the entries written: the transaction now holds them (see the
    /// module's safety note).
    pub(super) fn write_chunk(
        &mut self,
        tables: &mut Tables<'_>,
        added: usize,
    ) -> StoreResult<usize> {
        self.write_run(tables, CHUNK_ENTRIES.max(2 * added))
    }

    /// Writes every entry into `tables` (before a search, and at close); `last_seq_no` is the
    /// last transfer `seq_no` handed out, all of whose groups' entries were added.
    pub(super) fn write_all(
        &mut self,
        tables: &mut Tables<'_>,
        last_seq_no: u64,
    ) -> StoreResult<usize> {
        let mut written = self.write_run(tables, usize::MAX)?;
        if !(self.pending.is_empty() && self.pending_filed.is_empty()) {
            self.begin_run(last_seq_no);
            written += self.write_run(tables, usize::MAX)?;
        }
        Ok(written)
    }

    fn run_due(&self) -> bool {
        self.pending.len() + self.pending_filed.len() >= RUN_TRANSFERS
            || self
                .pending_since
                .is_some_and(|since| since.elapsed() >= self.run_after)
    }

    fn begin_run(&mut self, through: u64) {
        let pending = std::mem::take(&mut self.pending);
        self.pending_since = None;
        let mut by_created = Vec::with_capacity(pending.len());
        let mut by_account = Vec::with_capacity(pending.len() * 2);
        for NewTransferEntries {
            number,
            created,
            accounts,
        } in pending
        {
            for account in accounts {
                by_account.push((account, created, number));
            }
            by_created.push((created, number));
        }
        by_created.sort_unstable();
        by_account.sort_unstable();
        let mut filed = std::mem::take(&mut self.pending_filed);
        filed.sort_unstable();
        self.run = Some(Run {
            by_created,
            by_account,
            filed,
            written: 0,
            through,
        });
    }

    /// Writes up to `budget` entries of the run; the last of them moves
    /// [`CREATION_ENTRIES_FROM`] in the same transaction.
    fn write_run(&mut self, tables: &mut Tables<'_>, budget: usize) -> StoreResult<usize> {
        let Some(run) = &mut self.run else {
            return Ok(0);
        };
        let end = run.len().min(run.written.saturating_add(budget));
        let split = run.by_created.len();
        let filed_from = split + run.by_account.len();
        for i in run.written..end {
            #[cfg(test)]
            if let Some(left) = &mut self.fail_after {
                if *left == 0 {
                    self.fail_after = None;
                    return Err(StoreError::Unavailable("injected: a listing entry".into()));
                }
                *left -= 1;
            }
            if i < split {
                tables
                    .by_created
                    .insert(run.by_created[i], ())
                    .map_err(storage)?;
            } else if i < filed_from {
                let (account, created, number) = &run.by_account[i - split];
                tables
                    .by_account
                    .insert((&**account, *created, *number), ())
                    .map_err(storage)?;
            }
        }
        // The statement entries in this chunk, a block at a time.
        let filed = run.written.max(filed_from) - filed_from..end.max(filed_from) - filed_from;
        statement_index::add(&mut tables.entries, &run.filed[filed]).map_err(storage)?;
        let written = end - run.written;
        run.written = end;
        if end == run.len() {
            tables
                .meta
                .insert(CREATION_ENTRIES_FROM, run.through + 1)
                .map_err(storage)?;
            self.run = None;
        }
        Ok(written)
    }
}

/// At open, after the log's replay: writes the creation and account entries of every
/// transfer whose latest write comes at or after [`CREATION_ENTRIES_FROM`] (those a crash
/// may have left pending), and moves it past the last `seq_no`. A store without it (new,
/// or written by a version that wrote every entry at once) has them all.
pub(super) fn catch_up_creation_entries(txn: &WriteTransaction) -> StoreResult<()> {
    let mut tables = Tables::open(txn)?;
    let next = tables
        .meta
        .get(SeqNos::counter(Index::Transactions))
        .map_err(permanent)?
        .map_or(0, |last| last.value() + 1);
    let from = tables
        .meta
        .get(CREATION_ENTRIES_FROM)
        .map_err(permanent)?
        .map(|from| from.value());
    if let Some(from) = from {
        let changed: Vec<u64> = tables
            .changes
            .range(from..)
            .map_err(permanent)?
            .map(|entry| entry.map(|(_, number)| number.value()).map_err(permanent))
            .collect::<StoreResult<_>>()?;
        let name = Index::Transactions.name();
        for &number in &changed {
            let Some(id) = tables.ids.get(number).map_err(permanent)? else {
                continue;
            };
            let stored = tables.docs.get((name, id.value())).map_err(permanent)?;
            let entries = stored.and_then(|bytes| {
                let (_, source) = split_stored(id.value(), bytes.value()).ok()?;
                // A document that does not decode is skipped, as the searches skip it.
                let keys = transfer_keys(&source).ok()?;
                let filed: Vec<EntryKey> = (keys.entry_keys().iter())
                    .map(|(account, seq)| EntryKey::new(account, *seq, number))
                    .collect();
                Some((NewTransferEntries::of(number, &keys), filed))
            });
            drop(id);
            if let Some((creation, mut filed)) = entries {
                creation.write(&mut tables)?;
                filed.sort_unstable();
                statement_index::add(&mut tables.entries, &filed).map_err(permanent)?;
            }
        }
        if !changed.is_empty() {
            tracing::info!(
                transfers = changed.len(),
                "embedded store: wrote the listing entries a crash left pending"
            );
        }
    }
    tables
        .meta
        .insert(CREATION_ENTRIES_FROM, next)
        .map_err(permanent)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run with the first `written` of its entries in the tables.
    fn run(written: usize) -> Run {
        Run {
            by_created: vec![(1, 1), (2, 2)],
            by_account: vec![("a".into(), 1, 1), ("a".into(), 2, 2)],
            filed: vec![EntryKey::new("a", 1, 1), EntryKey::new("a", 1, 2)],
            written,
            through: 2,
        }
    }

    #[test]
    fn only_the_entries_a_run_has_not_written_are_forgotten() {
        let not_2 = |run: &mut Run| {
            run.retain_unwritten(|&(_, n)| n != 2, |&(_, _, n)| n != 2, |_| true);
            run.retain_unwritten(|_| true, |_| true, |k| *k != EntryKey::new("a", 1, 2));
        };
        // Written up to the middle of the account entries: transfer 2's creation entry is in
        // the tables (its change removed it there), its account entry and filed one are not.
        let mut middle = run(3);
        not_2(&mut middle);
        assert_eq!(middle.by_created, [(1, 1), (2, 2)]);
        assert_eq!(middle.by_account, [(Box::<str>::from("a"), 1, 1)]);
        assert_eq!(middle.filed, [EntryKey::new("a", 1, 1)]);
        assert_eq!((middle.written, middle.len()), (3, 4));
        // Nothing written: all of transfer 2's go.
        let mut start = run(0);
        not_2(&mut start);
        assert_eq!((start.by_created.len(), start.by_account.len()), (1, 1));
        assert_eq!(start.filed, [EntryKey::new("a", 1, 1)]);
        // Written up to the filed entries: only those are left to forget.
        let mut late = run(5);
        not_2(&mut late);
        assert_eq!(late.len(), 5, "the last, transfer 2's filed entry, goes");
    }
}
