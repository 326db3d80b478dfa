//! The embedded store's searches: stale transfers for recovery and the API's listing, by
//! walking the secondary indexes and loading the documents they name.

use super::*;

/// Loads the transfers named by `keys` (in that order) from one read transaction, up to
/// `limit` of those `filter` keeps. `next` is the last key taken when the page is full.
///
/// A stored document that does not decode is skipped with a warning rather than failing the
/// page: otherwise recovery would stop at the oldest broken document forever, and the listing
/// could not page past it. Skipped keys count as examined: callers that cut their key scan
/// set `next` to the last key, so the cursor still moves past them.
pub(super) fn load_transfers(
    db: &Database,
    keys: Vec<SortKey>,
    limit: usize,
    filter: impl Fn(&TransferKeys<'_>) -> bool,
) -> StoreResult<Page> {
    let txn = db.begin_read().map_err(storage)?;
    let docs = txn.open_table(DOCS).map_err(storage)?;
    let mut out = Vec::new();
    let mut last = None;
    for key in keys {
        if out.len() == limit {
            break;
        }
        if let Some(doc) = wanted_transfer(&docs, &key.id, &filter)? {
            out.push(doc);
            last = Some(key);
        }
    }
    let next = if out.len() == limit && limit > 0 {
        last
    } else {
        None
    };
    Ok(Page { docs: out, next })
}

/// The stored transfer `id` if it is there, decodes, and `filter` keeps it. One that does not
/// decode is skipped with a warning rather than failing the search.
fn wanted_transfer(
    docs: &redb::ReadOnlyTable<(&'static str, &'static str), &'static [u8]>,
    id: &str,
    filter: impl Fn(&TransferKeys<'_>) -> bool,
) -> StoreResult<Option<Doc>> {
    let Some(bytes) = docs
        .get((Index::Transactions.name(), id))
        .map_err(storage)?
    else {
        return Ok(None);
    };
    let stored = split_stored(id, bytes.value());
    let wanted = match &stored {
        Ok((_, source)) => transfer_keys(source).map(|keys| filter(&keys)),
        Err(error) => Err(error.clone()),
    };
    match wanted {
        Ok(true) => {
            let (seq_no, source) = stored?;
            Ok(Some(doc_of(id, seq_no, source.into_owned())))
        }
        Ok(false) => Ok(None),
        Err(error) => {
            tracing::warn!(
                transfer_id = %id,
                %error,
                "skipping a stored transfer that does not decode"
            );
            Ok(None)
        }
    }
}

/// The transfers filing an entry of `q.account` in `q.seqs`, by a walk of [`TX_ENTRIES`]
/// in `(seq, number)` order: each transfer once, at most `q.limit`. A document that does not
/// decode is skipped with a warning (as [`load_transfers`] does), and so is one that no
/// longer files such an entry (an entry left by an older version that rewrote the document
/// without its entries): what is answered always holds what was asked for.
pub(super) fn entries_blocking(db: &Database, q: &EntriesQuery) -> StoreResult<Vec<Doc>> {
    let mut out = Vec::new();
    if q.limit == 0 || q.seqs.is_empty() {
        return Ok(out);
    }
    let txn = db.begin_read().map_err(storage)?;
    let entries = txn.open_table(TX_ENTRIES).map_err(storage)?;
    let ids = txn.open_table(TX_IDS).map_err(storage)?;
    let docs = txn.open_table(DOCS).map_err(storage)?;
    let account = q.account.as_str();
    let mut seen = std::collections::HashSet::new();
    let filing = statement_index::numbers_filing(&entries, account, &q.seqs).map_err(storage)?;
    for (_, number) in filing {
        if !seen.insert(number) {
            continue;
        }
        let Some(id) = ids.get(number).map_err(storage)? else {
            continue;
        };
        let files = |keys: &TransferKeys<'_>| keys.files_entry_in(account, &q.seqs);
        if let Some(doc) = wanted_transfer(&docs, id.value(), files)? {
            out.push(doc);
            if out.len() == q.limit {
                break;
            }
        }
    }
    Ok(out)
}

/// The keys of released transfers in the query's states that the stale range does not
/// already cover (modified at or after the bound), after the cursor.
pub(super) fn released_keys(
    txn: &redb::ReadTransaction,
    q: &StaleQuery,
) -> StoreResult<Vec<SortKey>> {
    let released = txn.open_table(TX_RELEASED).map_err(storage)?;
    let docs = txn.open_table(DOCS).map_err(storage)?;
    let mut keys = Vec::new();
    for state in &q.states {
        for entry in released.range((state.as_str(), "")..).map_err(storage)? {
            let (key, _) = entry.map_err(storage)?;
            let (key_state, id) = key.value();
            if key_state != state {
                break;
            }
            let Some(bytes) = docs
                .get((Index::Transactions.name(), id))
                .map_err(storage)?
            else {
                continue;
            };
            let Ok((_, source)) = split_stored(id, bytes.value()) else {
                continue;
            };
            let Ok(TransferKeys {
                modified: millis, ..
            }) = transfer_keys(&source)
            else {
                continue;
            };
            let key = SortKey {
                millis,
                id: id.to_owned(),
            };
            if millis >= q.modified_before && q.after.as_ref().is_none_or(|after| &key > after) {
                keys.push(key);
            }
        }
    }
    Ok(keys)
}

pub(super) fn find_stale_blocking(db: &Database, q: &StaleQuery) -> StoreResult<Page> {
    let txn = db.begin_read().map_err(storage)?;
    let table = txn.open_table(TX_BY_STATE_MODIFIED).map_err(storage)?;
    debug_assert!(
        !q.states
            .iter()
            .any(|s| matches!(s.as_str(), "finished" | "rolled-back")),
        "the recovery index holds in-flight transfers only: {:?}",
        q.states
    );
    // Up to `limit` candidates from each state, merged by (modification_time, id).
    let mut keys = Vec::new();
    // The lowest last candidate among the states whose scan stopped at its bound: beyond it,
    // that state's keys were not looked at, so the merged page must not go past it.
    let mut horizon: Option<SortKey> = None;
    for state in &q.states {
        let (from_millis, from_id) = match &q.after {
            Some(k) => (k.millis, k.id.as_str()),
            None => (i64::MIN, ""),
        };
        if from_millis >= q.modified_before {
            continue;
        }
        let range = table
            .range((state.as_str(), from_millis, from_id)..(state.as_str(), q.modified_before, ""))
            .map_err(storage)?;
        let mut seen = 0;
        let mut last = None;
        for entry in range.take(q.limit + 1) {
            let (key, _) = entry.map_err(storage)?;
            let (_, millis, id) = key.value();
            let key = SortKey {
                millis,
                id: id.to_owned(),
            };
            seen += 1;
            last = Some(key.clone());
            if q.after.as_ref() != Some(&key) {
                keys.push(key);
            }
        }
        if seen == q.limit + 1 {
            horizon = match (horizon, last) {
                (Some(h), Some(l)) => Some(h.min(l)),
                (h, l) => h.or(l),
            };
        }
    }
    keys.extend(released_keys(&txn, q)?);
    keys.sort();
    keys.dedup();
    if let Some(horizon) = &horizon {
        keys.retain(|key| key <= horizon);
    }
    drop(table);
    drop(txn);
    // Not full although a state was cut: every key up to the horizon was examined (some did
    // not decode), so continue after the last one.
    let cut = horizon
        .filter(|_| q.limit > 0)
        .and_then(|_| keys.last().cloned());
    let mut page = load_transfers(db, keys, q.limit, |_| true)?;
    if page.next.is_none() {
        page.next = cut;
    }
    Ok(page)
}

pub(super) fn list_blocking(db: &Database, f: &TransferFilter) -> StoreResult<Page> {
    // How many index entries to look at: one index serves the most selective filter and the
    // others are checked on the documents, so with more than one filter look further
    // (bounded, to keep one request cheap).
    let filters = [f.attention, f.account.is_some(), f.state.is_some()];
    // A state the state index leaves out is checked on the documents of the unfiltered walk.
    let unlisted = f
        .state
        .as_deref()
        .is_some_and(|state| !listed_by_state(state));
    let count =
        filters.into_iter().filter(|&on| on).count() + f.metadata.len() + usize::from(unlisted);
    let scan = if count > 1 {
        f.limit.saturating_mul(50).max(1000)
    } else {
        f.limit + 1
    };
    let (keys, scanned) = keys_before_cursor(db, f, scan)?;
    // When the scan stopped at its bound, say where it stopped even if the page is not full,
    // so a client paging through a busy account never mistakes "not scanned" for "none".
    // (Keys whose document does not decode are skipped by `load_transfers`, so the page may
    // be short for that reason too: counting entries scanned, not keys kept, still moves the
    // cursor past them.)
    let scan_cut = (scanned >= scan).then(|| keys.last().cloned()).flatten();
    let filter = f.clone();
    let mut page = load_transfers(db, keys, f.limit, move |keys| matches(&filter, keys))?;
    if page.next.is_none() {
        page.next = scan_cut;
    }
    Ok(page)
}

/// Whether a transfer passes every filter of `f` (the index walked serves at most one of
/// them: none for `?state=finished` alone, [`listed_by_state`]).
pub(super) fn matches(f: &TransferFilter, keys: &TransferKeys<'_>) -> bool {
    f.state.as_deref().is_none_or(|s| keys.state == s)
        && f.account.as_deref().is_none_or(|a| keys.involves(a))
        && (!f.attention || keys.attention)
        && keys.has_metadata(&f.metadata)
}

/// Newest first: the keys of up to `scan` entries of the index that serves `f`, walked
/// backwards from the cursor (exclusive), and how many entries were looked at, the cursor's
/// own included.
pub(super) fn keys_before_cursor(
    db: &Database,
    f: &TransferFilter,
    scan: usize,
) -> StoreResult<(Vec<SortKey>, usize)> {
    let txn = db.begin_read().map_err(storage)?;
    let upper = match &f.after {
        Some(k) => (k.millis, k.id.as_str()),
        None => (i64::MAX, "\u{10FFFF}"),
    };
    let mut keys = Vec::new();
    let mut scanned = 0;
    let mut push = |millis: i64, id: &str| {
        scanned += 1;
        let key = SortKey {
            millis,
            id: id.to_owned(),
        };
        if f.after.is_none() || Some(&key) < f.after.as_ref() {
            keys.push(key);
        }
    };
    if f.attention {
        // Flagged transfers are few: the most selective index whatever else is asked.
        let table = txn.open_table(TX_ATTENTION).map_err(storage)?;
        let range = table.range((i64::MIN, "")..=upper).map_err(storage)?;
        for entry in range.rev().take(scan) {
            let (key, _) = entry.map_err(storage)?;
            let (millis, id) = key.value();
            push(millis, id);
        }
    } else if let Some((key, value)) = f.metadata.first() {
        // One pair names few transfers, as a rule (an order id): before the account.
        let entry = metadata_entry(key, value);
        walk_back_within(&txn, TX_METADATA, &entry, upper, scan, &mut push)?;
    } else if let Some(account) = &f.account {
        let ids = txn.open_table(TX_IDS).map_err(storage)?;
        let table = txn.open_table(TX_BY_ACCOUNT).map_err(storage)?;
        let range = table
            .range((account.as_str(), i64::MIN, 0)..=(account.as_str(), upper.0, u64::MAX))
            .map_err(storage)?;
        let entries = range.rev().map(|entry| {
            let (key, _) = entry?;
            let (_, millis, number) = key.value();
            Ok((millis, number))
        });
        walk_back_numbered(&ids, entries, upper, scan, &mut push)?;
    } else if let Some(state) = f.state.as_deref().filter(|state| listed_by_state(state)) {
        walk_back_within(&txn, TX_BY_STATE_CREATED, state, upper, scan, &mut push)?;
    } else {
        let ids = txn.open_table(TX_IDS).map_err(storage)?;
        let table = txn.open_table(TX_BY_CREATED).map_err(storage)?;
        let range = table
            .range((i64::MIN, 0)..=(upper.0, u64::MAX))
            .map_err(storage)?;
        let entries = range.rev().map(|entry| Ok(entry?.0.value()));
        walk_back_numbered(&ids, entries, upper, scan, &mut push)?;
    }
    Ok((keys, scanned))
}

/// Walks the `(creation_time, number)` entries of a numbered index ([`TX_BY_CREATED`],
/// [`TX_BY_ACCOUNT`]), given newest first, and passes the transfers to `push` in
/// `(creation_time, id)` order, newest first, from `upper` (inclusive): up to `scan` of them,
/// then the rest of the last creation time. The index holds a creation time's entries in
/// number order, so each creation time's ids are read and sorted before any is passed on (a
/// page cut inside one could otherwise skip an id that sorts after the cut). A creation time
/// holds the transfers created in one millisecond: some tens at 30,000 transfers a second.
fn walk_back_numbered(
    ids: &redb::ReadOnlyTable<u64, &'static str>,
    entries: impl Iterator<Item = Result<(i64, u64), redb::StorageError>>,
    (to_millis, to_id): (i64, &str),
    scan: usize,
    push: &mut impl FnMut(i64, &str),
) -> StoreResult<()> {
    let mut passed = 0;
    // The creation time being read, and its ids.
    let mut millis = None;
    let mut group: Vec<String> = Vec::new();
    let mut pass_on = |at: i64, group: &mut Vec<String>| {
        group.sort_unstable_by(|a, b| b.cmp(a));
        passed += group.len();
        group.drain(..).for_each(|id| push(at, &id));
        passed
    };
    for entry in entries {
        let (at, number) = entry.map_err(storage)?;
        if millis != Some(at) {
            if let Some(done) = millis {
                if pass_on(done, &mut group) >= scan {
                    return Ok(());
                }
            }
            millis = Some(at);
        }
        let Some(id) = ids.get(number).map_err(storage)? else {
            continue;
        };
        // After the cursor: the range ends at its creation time, not at its id.
        if at == to_millis && id.value() > to_id {
            continue;
        }
        group.push(id.value().to_owned());
    }
    if let Some(done) = millis {
        pass_on(done, &mut group);
    }
    Ok(())
}

/// Walks the entries of `prefix` in a `(prefix, millis, id)` index backwards from `upper`
/// (inclusive), passing up to `scan` of them to `push`.
pub(super) fn walk_back_within(
    txn: &ReadTransaction,
    index: TableDefinition<'static, (&'static str, i64, &'static str), ()>,
    prefix: &str,
    (to_millis, to_id): (i64, &str),
    scan: usize,
    push: &mut impl FnMut(i64, &str),
) -> StoreResult<()> {
    let table = txn.open_table(index).map_err(storage)?;
    let range = table
        .range((prefix, i64::MIN, "")..=(prefix, to_millis, to_id))
        .map_err(storage)?;
    for entry in range.rev().take(scan) {
        let (key, _) = entry.map_err(storage)?;
        let (_, millis, id) = key.value();
        push(millis, id);
    }
    Ok(())
}

/// The change feed: transfers in the order of their latest writes, after `q.after` (a
/// `seq_no`), from one read transaction (`TX_CHANGES` explains why nothing can appear later
/// below a position served). `q.horizon` does not apply: the order is exact.
pub(super) fn changes_blocking(db: &Database, q: &ChangesQuery) -> StoreResult<ChangesPage> {
    let start = match &q.after {
        None => 0,
        Some(FeedPosition::Seq(seq_no)) => seq_no.saturating_add(1),
        Some(FeedPosition::Time(_)) => {
            return Err(StoreError::Permanent(
                "embedded store: a feed position must be a seq_no".into(),
            ))
        }
    };
    let txn = db.begin_read().map_err(storage)?;
    let changes = txn.open_table(TX_CHANGES).map_err(storage)?;
    let docs = txn.open_table(DOCS).map_err(storage)?;
    let mut out = Vec::new();
    let entries: Vec<_> = if q.newest {
        changes
            .last()
            .map_err(storage)?
            .into_iter()
            .map(Ok)
            .collect()
    } else {
        changes
            .range(start..)
            .map_err(storage)?
            .take(q.limit)
            .collect()
    };
    let ids = txn.open_table(TX_IDS).map_err(storage)?;
    for entry in entries {
        let (seq_no, number) = entry.map_err(storage)?;
        let Some(id) = ids.get(number.value()).map_err(storage)? else {
            continue;
        };
        let id = id.value();
        let Some(bytes) = docs
            .get((Index::Transactions.name(), id))
            .map_err(storage)?
        else {
            continue;
        };
        out.push((
            FeedPosition::Seq(seq_no.value()),
            decode(id, bytes.value())?,
        ));
    }
    Ok(ChangesPage { docs: out })
}
