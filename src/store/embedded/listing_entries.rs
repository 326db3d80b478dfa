//! The creation entries of new transfers (their entry in [`TX_BY_CREATED`] and one per
//! account in [`TX_BY_ACCOUNT`]), written in sorted runs rather than as each transfer is
//! created.
//!
//! **Why.** An account's entries sit together at the end of its range, and a busy load
//! touches every account: written as transfers came, each entry dirtied a page of its own
//! account's range in nearly every transaction, so redb copied and then (at each checkpoint)
//! wrote a page per entry. These inserts and their page writes were the largest cost of a
//! transfer in batches: without them at all, a transfer took 40% less CPU. Sorted, a run
//! writes each account's new entries next to each other, a page once for many of them.
//!
//! **How.** A new transfer's creation entries are pending here once its group's record is
//! in the log. When a run is due (a second after the first pending entry, or many transfers'),
//! the pending entries are sorted and written a chunk at a time, one chunk after each group,
//! into the committer's transaction ([`CreationEntries::write_chunk`]). A search, scan or
//! feed read has the committer write all of them first ([`CreationEntries::write_all`], with
//! the commit it already asks for), so listings stay realtime.
//!
//! **Why this is safe.** These entries never change once a transfer is created (its
//! creation time and accounts are fixed), so writing one late or twice is the same as
//! writing it once. [`META`] holds [`CREATION_ENTRIES_FROM`]: every transfer whose latest
//! write has a lower `seq_no` has its entries in the tables. It moves only in the
//! transaction that writes the last chunk of a run, past the last `seq_no` handed out when
//! the run began. After a crash, opening the store writes the entries of every transfer in
//! the feed from it ([`catch_up_creation_entries`]): a transfer created later has its feed entry
//! later still. Entries written in a transaction that is lost with writes of the log (the
//! chunks count as such, see `OpenTxn::logged`) stop the store's writes until a restart,
//! which catches up.
//!
//! Nothing else is deferred: an entry that moves when a transfer changes (its state, its
//! lease, its flag) is written with the change, and so is a transfer's metadata entry.

use std::time::{Duration, Instant};

use super::*;

/// The key in [`META`]: every transfer whose latest write's `seq_no` is below this has its
/// creation entries in the tables.
pub(super) const CREATION_ENTRIES_FROM: &str = "creation_entries:from";

/// A run is due this long after its first pending entry...
const RUN_AFTER: Duration = Duration::from_secs(1);

/// ... or once this many transfers' entries are pending.
const RUN_TRANSFERS: usize = 65_536;

/// Entries written after each group while a run is being written: twice what the group
/// added (so runs keep ahead of the load), and at least this many. A chunk then costs a
/// group about what its own entries would have, not a whole run's delay.
const CHUNK_ENTRIES: usize = 256;

/// The creation entries of one new transfer, which name it by its number ([`TX_IDS`]).
#[derive(Debug)]
pub(super) struct Creation {
    number: u64,
    created: i64,
    accounts: Vec<Box<str>>,
}

impl Creation {
    pub(super) fn of(number: u64, keys: &TransferKeys<'_>) -> Self {
        Creation {
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

/// A run: the entries pending when it began, sorted, and how far it is written.
struct Run {
    by_created: Vec<(i64, u64)>,
    by_account: Vec<(Box<str>, i64, u64)>,
    written: usize,
    /// The last transfer `seq_no` handed out when the run began.
    through: u64,
}

impl Run {
    fn len(&self) -> usize {
        self.by_created.len() + self.by_account.len()
    }
}

/// Creation entries not in the tables yet: pending, and the run being written.
pub(super) struct CreationEntries {
    pending: Vec<Creation>,
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
        self.pending.is_empty() && self.run.is_none()
    }

    /// Adds the entries of a group's new transfers. Call once the group's record is in the
    /// log. Returns how many entries they are.
    pub(super) fn add(&mut self, created: Vec<Creation>) -> usize {
        if created.is_empty() {
            return 0;
        }
        self.pending_since.get_or_insert_with(Instant::now);
        let entries = created.iter().map(|c| 1 + c.accounts.len()).sum();
        self.pending.extend(created);
        entries
    }

    /// Forgets the entries of transfer `number` not written yet (its creation time or
    /// accounts changed, which the engine never does: the tables get its new entries at once,
    /// and lose the old ones).
    pub(super) fn forget(&mut self, number: u64) {
        self.pending.retain(|c| c.number != number);
        if let Some(run) = &mut self.run {
            // Entries before `written` are in the tables already; the change removes them.
            let split = run.by_created.len();
            let created_tail = run.by_created.split_off(run.written.min(split));
            run.by_created
                .extend(created_tail.into_iter().filter(|&(_, n)| n != number));
            let account_tail = run.by_account.split_off(run.written.saturating_sub(split));
            run.by_account
                .extend(account_tail.into_iter().filter(|&(_, _, n)| n != number));
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
        if !self.pending.is_empty() {
            self.begin_run(last_seq_no);
            written += self.write_run(tables, usize::MAX)?;
        }
        Ok(written)
    }

    fn run_due(&self) -> bool {
        self.pending.len() >= RUN_TRANSFERS
            || self
                .pending_since
                .is_some_and(|since| since.elapsed() >= self.run_after)
    }

    fn begin_run(&mut self, through: u64) {
        let pending = std::mem::take(&mut self.pending);
        self.pending_since = None;
        let mut by_created = Vec::with_capacity(pending.len());
        let mut by_account = Vec::with_capacity(pending.len() * 2);
        for Creation {
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
        self.run = Some(Run {
            by_created,
            by_account,
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
            } else {
                let (account, created, number) = &run.by_account[i - split];
                tables
                    .by_account
                    .insert((&**account, *created, *number), ())
                    .map_err(storage)?;
            }
        }
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

/// At open, after the log's replay: writes the creation entries of every transfer whose
/// latest write comes at or after [`CREATION_ENTRIES_FROM`] (those a crash may have left
/// pending), and moves it past the last `seq_no`. A store without it (new, or written by a
/// version that wrote every entry at once) has them all.
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
            let creation = stored.and_then(|bytes| {
                let (_, source) = split_stored(id.value(), bytes.value()).ok()?;
                // A document that does not decode is skipped, as the searches skip it.
                Some(Creation::of(number, &transfer_keys(&source).ok()?))
            });
            drop(id);
            if let Some(creation) = creation {
                creation.write(&mut tables)?;
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
