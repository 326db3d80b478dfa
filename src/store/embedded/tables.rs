//! The embedded store's tables: documents, the per-index sequence numbers, and the secondary
//! indexes of transfers its searches walk, kept in the same write transaction as the documents.

use std::collections::BTreeSet;

use super::*;
use crate::store::entries;

/// `(index, id)` → `seq_no` (8 bytes, little endian) followed by the source, plain or
/// compressed ([`super::at_rest`]).
pub(super) const DOCS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("docs");

/// Whether an index's documents have index entries (transfers do). The others (accounts,
/// webhook cursors) are written into [`DOCS`] only when the open transaction commits, once
/// each ([`super::recent_writes`]); until then the recent writes hold them.
pub(super) fn indexed(index: Index) -> bool {
    index == Index::Transactions
}

/// `"seq:<index>"` → the last `seq_no` handed out in that index.
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// In-flight transfers by `(state, modification_time, id)`: the recovery query, which asks
/// only for in-flight states. A transfer's entry goes when it becomes terminal (a store
/// written before late 2026 may still hold entries of terminal transfers; nothing reads
/// them), so most transfers, settled at once, never have one.
pub(super) const TX_BY_STATE_MODIFIED: TableDefinition<(&str, i64, &str), ()> =
    TableDefinition::new("tx_by_state_modified");

/// A transfer's number → its id. Each transfer is numbered once, by its first write here
/// (the `seq_no` that write was given; a transfer of a store written before numbers existed:
/// the `seq_no` of its latest write then, see [`number_transfers`]), and keeps the number:
/// the indexes with an entry for every transfer ([`TX_BY_CREATED`], [`TX_BY_ACCOUNT`],
/// [`TX_CHANGES`]) name it by these 8 bytes instead of its id (36 bytes for the service's
/// own ids, up to 128 for a client's). Numbers are never reused: `seq_no`s are not.
pub(super) const TX_IDS: TableDefinition<u64, &str> = TableDefinition::new("tx_ids");

/// Transfers by `(creation_time, number)`: the unfiltered listing. Entries of one creation
/// time are in number order, not id order: a walk sorts each creation time's ids
/// ([`super::search`]).
pub(super) const TX_BY_CREATED: TableDefinition<(i64, u64), ()> =
    TableDefinition::new("tx_by_created_n");

/// Transfers by `(state, creation_time, id)`, except finished ones: the listing filtered by
/// state. Finished transfers are nearly all of them, so an entry each would cost a B-tree
/// insert per transfer to serve a filter that keeps almost everything: `?state=finished`
/// walks [`TX_BY_CREATED`] and checks the state on the documents instead
/// ([`listed_by_state`]). A store written before late 2026 may still hold entries of
/// finished transfers; nothing reads them.
pub(super) const TX_BY_STATE_CREATED: TableDefinition<(&str, i64, &str), ()> =
    TableDefinition::new("tx_by_state_created");

/// The state whose transfers [`TX_BY_STATE_CREATED`] leaves out.
pub(super) const UNLISTED_STATE: &str = "finished";

/// Whether [`TX_BY_STATE_CREATED`] lists the transfers in `state`.
pub(super) fn listed_by_state(state: &str) -> bool {
    state != UNLISTED_STATE
}

/// Transfers by `(account, creation_time, number)`, once for the source and once for the
/// destination: the listing filtered by account. As in [`TX_BY_CREATED`], a creation time's
/// entries are in number order.
pub(super) const TX_BY_ACCOUNT: TableDefinition<(&str, i64, u64), ()> =
    TableDefinition::new("tx_by_account_n");

/// Transfers by `(state, id)` whose lease was released (no `lease_owner`): recovery
/// candidates at once, whatever their `modification_time`. Only in-flight states matter;
/// the table holds whichever states such transfers are in.
pub(super) const TX_RELEASED: TableDefinition<(&str, &str), ()> =
    TableDefinition::new("tx_released");

/// Transfers by `(creation_time, id)` that carry `attention` (flagged for a person): the
/// listing `?attention=true`. Few entries, so the other filters of that listing are checked
/// on the documents.
pub(super) const TX_ATTENTION: TableDefinition<(i64, &str), ()> =
    TableDefinition::new("tx_attention");

/// Transfers by `("<key>=<value>", creation_time, id)`, one entry per metadata pair: the
/// listing `?metadata.<key>=<value>`. Keys cannot hold `=`, so the first `=` splits the pair.
/// Transfers without metadata have no entries (and their writes never touch the table).
pub(super) const TX_METADATA: TableDefinition<(&str, i64, &str), ()> =
    TableDefinition::new("tx_metadata");

/// The statements' index: which transfers ([`TX_IDS`]) file which account entries (the
/// values of their `entries`, [`crate::store::entries`]), in blocks of consecutive seqs of
/// one account ([`super::statement_index`], which has the layout): the statement's range
/// scan ([`super::search::entries_blocking`]). A write that adds values to a transfer's
/// `entries` leaves them to a sorted run ([`super::listing_entries`], which a statement's
/// search has written first); a value gone (never, from the engine) leaves its block at
/// once; transfers without entries have none (and their writes never touch the table).
///
/// Named `statement_blocks`: earlier versions kept a row per entry, in `statement_entries`
/// ([`ROW_KEYED_ENTRIES`], up to `8173fe6`) or `tx_entries` ([`TUPLE_KEYED_ENTRIES`], up to
/// `6df5583`), which a store they wrote still holds, and redb opens a table only with the
/// key and value types it was made with.
pub(super) const TX_ENTRIES: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("statement_blocks");

/// The statement index as versions up to `6df5583` kept it, a row per entry keyed by the
/// tuple `(account, seq, number)`, and its marker in [`META`]: removed once by
/// [`build_entries_index`].
pub(super) const TUPLE_KEYED_ENTRIES: TableDefinition<(&str, u64, u64), ()> =
    TableDefinition::new("tx_entries");
pub(super) const TUPLE_KEYED_ENTRIES_BUILT: &str = "built:tx_entries";

/// The statement index as versions up to `8173fe6` kept it, a row per entry keyed by
/// [`EntryKey`]'s bytes, and its marker in [`META`]: removed once by [`build_entries_index`].
pub(super) const ROW_KEYED_ENTRIES: TableDefinition<&[u8], ()> =
    TableDefinition::new("statement_entries");
pub(super) const ROW_KEYED_ENTRIES_BUILT: &str = "built:statement_entries";

/// One account entry filed by a transfer, as a run sorts them and as [`ROW_KEYED_ENTRIES`]
/// keyed its rows: the account's bytes, a 0, then the seq and the transfer's number, 8 bytes
/// each, big endian. Bytes compare as the tuple `(account, seq, number)` would (an account
/// id never holds a 0, [`crate::store::entries::parse`], so the 0 ends it and a shorter
/// account sorts before a longer one it starts), so a run's sort is one `memcmp` a
/// comparison, and its keys come out grouped by account and block for
/// [`super::statement_index::add`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct EntryKey(Vec<u8>);

impl EntryKey {
    /// The bytes after the account's.
    const TAIL: usize = 1 + 8 + 8;

    pub(super) fn new(account: &str, seq: u64, number: u64) -> Self {
        debug_assert!(!account.as_bytes().contains(&0), "an account id holds no 0");
        let mut key = Vec::with_capacity(account.len() + Self::TAIL);
        key.extend_from_slice(account.as_bytes());
        key.push(0);
        key.extend_from_slice(&seq.to_be_bytes());
        key.extend_from_slice(&number.to_be_bytes());
        EntryKey(key)
    }

    #[cfg(test)]
    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Its `(account, seq, number)`.
    pub(super) fn parts(&self) -> (&str, u64, u64) {
        Self::parse(&self.0).expect("a key made by EntryKey::new")
    }

    /// The `(account, seq, number)` of a stored key; `None` if it is not of this layout.
    pub(super) fn parse(key: &[u8]) -> Option<(&str, u64, u64)> {
        let split = key.len().checked_sub(Self::TAIL)?;
        let (account, tail) = key.split_at(split);
        let (zero, tail) = tail.split_first()?;
        let (seq, number) = tail.split_at(8);
        Some((
            std::str::from_utf8(account).ok().filter(|_| *zero == 0)?,
            u64::from_be_bytes(seq.try_into().ok()?),
            u64::from_be_bytes(number.try_into().ok()?),
        ))
    }
}

/// The change feed (`docs/design.md §11`): `seq_no` of each transfer's latest write → its
/// number ([`TX_IDS`]). A transfer's entry moves to its new `seq_no` in the transaction of
/// every write (and is where a write finds the transfer's number), so the table holds one
/// entry per transfer, in write order. `seq_no`s rise with every committed write and a reader
/// sees only committed transactions: no write can appear later below a position a reader has
/// passed.
pub(super) const TX_CHANGES: TableDefinition<u64, u64> = TableDefinition::new("tx_changes_n");

/// The tables a store written before numbers held instead of [`TX_BY_CREATED`],
/// [`TX_BY_ACCOUNT`] and [`TX_CHANGES`] (their entries named transfers by id): deleted once
/// the numbered ones are built ([`number_transfers`]).
pub(super) const BY_ID_TABLES: [&str; 3] = ["tx_by_created", "tx_by_account", "tx_changes"];

/// The key in [`META`] of the store's random id (`Store::identity`).
pub(super) const STORE_ID: &str = "store_id";

/// The key in [`META`] that says every transfer is numbered: [`TX_IDS`], [`TX_CHANGES`],
/// [`TX_BY_CREATED`] and [`TX_BY_ACCOUNT`] hold them all.
pub(super) const NUMBERED: &str = "built:numbered";

/// The key in [`META`] that says [`TX_METADATA`] holds every transfer's metadata.
pub(super) const METADATA_BUILT: &str = "built:tx_metadata";

/// The key in [`META`] that says [`TX_ENTRIES`] holds every transfer's entries.
pub(super) const ENTRIES_BUILT: &str = "built:statement_blocks";

/// The entry of [`TX_METADATA`] for one pair.
pub(super) fn metadata_entry(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

/// The key in [`META`] that says [`TX_ATTENTION`] holds every flagged transfer (it was built
/// from the documents once, when a store written by an older version was first opened).
pub(super) const ATTENTION_BUILT: &str = "built:tx_attention";

/// The only primary term this backend knows (no replicas, no failover).
pub(super) const PRIMARY_TERM: u64 = 1;

/// Fills [`TX_ATTENTION`] from the stored transfers, once: a store written before the table
/// existed may hold flagged transfers. Afterwards every write keeps the table up to date.
pub(super) fn build_attention_index(txn: &WriteTransaction) -> StoreResult<()> {
    let mut attention = txn.open_table(TX_ATTENTION).map_err(permanent)?;
    build_once(txn, ATTENTION_BUILT, |id, _, keys| {
        if keys.attention {
            attention
                .insert((keys.created, id), ())
                .map_err(permanent)?;
        }
        Ok(())
    })
    .map(drop)
}

/// Fills [`TX_METADATA`] from the stored transfers, once: a store written before the table
/// existed holds no transfer with metadata from this service, but one may have been written
/// by a newer version and the store opened again by an older one in between (which kept no
/// entries). Afterwards every write keeps the table up to date.
pub(super) fn build_metadata_index(txn: &WriteTransaction) -> StoreResult<()> {
    let mut index = txn.open_table(TX_METADATA).map_err(permanent)?;
    build_once(txn, METADATA_BUILT, |id, _, keys| {
        for (k, v) in keys.metadata_pairs() {
            index
                .insert((metadata_entry(&k, &v).as_str(), keys.created, id), ())
                .map_err(permanent)?;
        }
        Ok(())
    })
    .map(drop)
}

/// Fills [`TX_ENTRIES`] from the stored transfers, once, as [`build_metadata_index`] does
/// for its table and for the same reason (a newer version may have written entries into a
/// store an older one opened since). Runs after the log's replay: a transfer's number is
/// in its feed entry, under the `seq_no` of its latest write. Afterwards every write keeps
/// the table up to date.
pub(super) fn build_entries_index(txn: &WriteTransaction) -> StoreResult<()> {
    forget_older_entry_indexes(txn)?;
    let mut index = txn.open_table(TX_ENTRIES).map_err(permanent)?;
    let changes = txn.open_table(TX_CHANGES).map_err(permanent)?;
    build_once(txn, ENTRIES_BUILT, |_, seq_no, keys| {
        let entries = keys.entry_keys();
        if entries.is_empty() {
            return Ok(());
        }
        // Without a feed entry the transfer has no number (its document did not decode when
        // the store was numbered): its next write numbers it and files its entries.
        let Some(number) = changes.get(seq_no).map_err(permanent)?.map(|n| n.value()) else {
            return Ok(());
        };
        let keys: Vec<EntryKey> = (entries.iter())
            .map(|(account, seq)| EntryKey::new(account, *seq, number))
            .collect();
        statement_index::add(&mut index, &keys).map_err(permanent)
    })
    .map(drop)
}

/// A store holding [`TUPLE_KEYED_ENTRIES`] or [`ROW_KEYED_ENTRIES`] was last opened by a
/// version up to `6df5583` or `8173fe6`, which filed its transfers' entries there and not in
/// [`TX_ENTRIES`] (also after this version had built it, on a downgrade and upgrade again).
/// Such a table goes, with its marker (so such a version, opened again, builds its own from
/// the documents), and so does [`TX_ENTRIES`]'s marker: [`build_entries_index`] then adds
/// every document's entries. Entries already there stay: the engine never takes an entry
/// from a transfer, and one found is checked against its document before a statement uses
/// it.
fn forget_older_entry_indexes(txn: &WriteTransaction) -> StoreResult<()> {
    let tuple_keyed = txn.delete_table(TUPLE_KEYED_ENTRIES).map_err(permanent)?;
    let row_keyed = txn.delete_table(ROW_KEYED_ENTRIES).map_err(permanent)?;
    if !(tuple_keyed || row_keyed) {
        return Ok(());
    }
    let mut meta = txn.open_table(META).map_err(permanent)?;
    for marker in [
        TUPLE_KEYED_ENTRIES_BUILT,
        ROW_KEYED_ENTRIES_BUILT,
        ENTRIES_BUILT,
    ] {
        meta.remove(marker).map_err(permanent)?;
    }
    Ok(())
}

/// Numbers every stored transfer, once: a store written before numbers holds its listing
/// and feed entries by id (an older one no feed at all). A transfer's number is then the
/// `seq_no` of its latest write: unique, as numbers must be, and below every `seq_no` still
/// to come. The tables by id go. Runs before the log's replay, which finds an existing
/// transfer's number in its feed entry.
pub(super) fn number_transfers(txn: &WriteTransaction) -> StoreResult<()> {
    let started = std::time::Instant::now();
    let mut numbered = 0u64;
    let mut ids = txn.open_table(TX_IDS).map_err(permanent)?;
    let mut changes = txn.open_table(TX_CHANGES).map_err(permanent)?;
    let mut by_created = txn.open_table(TX_BY_CREATED).map_err(permanent)?;
    let mut by_account = txn.open_table(TX_BY_ACCOUNT).map_err(permanent)?;
    let built = build_once(txn, NUMBERED, |id, seq_no, keys| {
        numbered += 1;
        ids.insert(seq_no, id).map_err(permanent)?;
        changes.insert(seq_no, seq_no).map_err(permanent)?;
        NewTransferEntries::of(seq_no, keys)
            .insert_into(&mut by_created, &mut by_account)
            .map_err(permanent)
    })?;
    if built {
        for name in BY_ID_TABLES {
            txn.delete_table(TableDefinition::<u64, ()>::new(name))
                .map_err(permanent)?;
        }
        if numbered > 0 {
            tracing::info!(
                transfers = numbered,
                seconds = started.elapsed().as_secs_f64(),
                "embedded store: numbered the transfers of a store written by an earlier \
                 version, once (their listing and feed entries now name them by number)"
            );
        }
    }
    Ok(())
}

/// Unless [`META`] holds `marker`, passes every stored transfer's id, `seq_no` and index
/// keys to `add`, then records `marker`: an index added by a later version is built from the
/// documents once. A document that does not decode is skipped here as it is by the searches.
/// Whether it built now.
fn build_once(
    txn: &WriteTransaction,
    marker: &str,
    mut add: impl FnMut(&str, u64, &TransferKeys<'_>) -> StoreResult<()>,
) -> StoreResult<bool> {
    let mut meta = txn.open_table(META).map_err(permanent)?;
    if meta.get(marker).map_err(permanent)?.is_some() {
        return Ok(false);
    }
    let docs = txn.open_table(DOCS).map_err(permanent)?;
    let name = Index::Transactions.name();
    for entry in docs.range((name, "")..).map_err(permanent)? {
        let (key, value) = entry.map_err(permanent)?;
        let (index, id) = key.value();
        if index != name {
            break;
        }
        let Ok((seq_no, source)) = split_stored(id, value.value()) else {
            continue;
        };
        if let Ok(keys) = transfer_keys(&source) {
            add(id, seq_no, &keys)?;
        }
    }
    meta.insert(marker, 1).map_err(permanent)?;
    Ok(true)
}

/// The tables one write transaction touches, opened once per group.
pub(super) struct Tables<'txn> {
    pub(super) docs: Table<'txn, (&'static str, &'static str), &'static [u8]>,
    pub(super) meta: Table<'txn, &'static str, u64>,
    pub(super) by_state_modified: Table<'txn, (&'static str, i64, &'static str), ()>,
    pub(super) ids: Table<'txn, u64, &'static str>,
    pub(super) by_created: Table<'txn, (i64, u64), ()>,
    pub(super) by_state_created: Table<'txn, (&'static str, i64, &'static str), ()>,
    pub(super) by_account: Table<'txn, (&'static str, i64, u64), ()>,
    pub(super) released: Table<'txn, (&'static str, &'static str), ()>,
    pub(super) attention: Table<'txn, (i64, &'static str), ()>,
    pub(super) metadata: Table<'txn, (&'static str, i64, &'static str), ()>,
    pub(super) entries: Table<'txn, &'static [u8], &'static [u8]>,
    pub(super) changes: Table<'txn, u64, u64>,
}

impl<'txn> Tables<'txn> {
    pub(super) fn open(txn: &'txn WriteTransaction) -> StoreResult<Self> {
        Ok(Self {
            docs: txn.open_table(DOCS).map_err(storage)?,
            meta: txn.open_table(META).map_err(storage)?,
            by_state_modified: txn.open_table(TX_BY_STATE_MODIFIED).map_err(storage)?,
            ids: txn.open_table(TX_IDS).map_err(storage)?,
            by_created: txn.open_table(TX_BY_CREATED).map_err(storage)?,
            by_state_created: txn.open_table(TX_BY_STATE_CREATED).map_err(storage)?,
            by_account: txn.open_table(TX_BY_ACCOUNT).map_err(storage)?,
            released: txn.open_table(TX_RELEASED).map_err(storage)?,
            attention: txn.open_table(TX_ATTENTION).map_err(storage)?,
            metadata: txn.open_table(TX_METADATA).map_err(storage)?,
            entries: txn.open_table(TX_ENTRIES).map_err(storage)?,
            changes: txn.open_table(TX_CHANGES).map_err(storage)?,
        })
    }
}

/// The secondary-index keys of one transfer document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TransferKeys<'a> {
    pub(super) state: Cow<'a, str>,
    /// No lease owner: the lease was released.
    pub(super) released: bool,
    pub(super) modified: i64,
    pub(super) created: i64,
    pub(super) src: Cow<'a, str>,
    pub(super) dest: Cow<'a, str>,
    /// The raw JSON of a multi-leg transaction's `accounts` (every account it touches), if
    /// any: parsed only when it changes or a filter asks.
    pub(super) accounts: Option<Cow<'a, str>>,
    /// Flagged for a person (see [`crate::store::fields::ATTENTION`]).
    pub(super) attention: bool,
    /// The raw JSON of `metadata` ([`crate::store::fields::METADATA`]), if any: parsed only
    /// when it changes or a filter asks.
    pub(super) metadata: Option<Cow<'a, str>>,
    /// The raw JSON of `entries` ([`crate::store::fields::ENTRIES`]), if an array: parsed
    /// only when it changes or a search reads it.
    pub(super) entries: Option<Cow<'a, str>>,
}

impl TransferKeys<'_> {
    /// The same keys, owning their text (a write that checks several ops before making any
    /// holds the old keys while the documents change under them).
    pub(super) fn into_owned(self) -> TransferKeys<'static> {
        let own = |text: Cow<'_, str>| Cow::Owned(text.into_owned());
        TransferKeys {
            state: own(self.state),
            released: self.released,
            modified: self.modified,
            created: self.created,
            src: own(self.src),
            dest: own(self.dest),
            accounts: self.accounts.map(own),
            attention: self.attention,
            metadata: self.metadata.map(own),
            entries: self.entries.map(own),
        }
    }
}

impl TransferKeys<'_> {
    /// Not finished or rolled back: a candidate for recovery.
    pub(super) fn in_flight(&self) -> bool {
        !matches!(&*self.state, "finished" | "rolled-back")
    }

    /// Every account the transfer is listed under: the source and destination of a one-leg
    /// transfer, each account of a multi-leg one; once each, never empty strings.
    pub(super) fn parties(&self) -> Vec<Cow<'_, str>> {
        let mut parties: Vec<Cow<'_, str>> = Vec::with_capacity(2);
        for party in [&self.src, &self.dest] {
            if !party.is_empty() && !parties.contains(party) {
                parties.push(Cow::Borrowed(party.as_ref()));
            }
        }
        if let Some(raw) = self.accounts.as_deref() {
            for account in serde_json::from_str::<Vec<Cow<'_, str>>>(raw).unwrap_or_default() {
                if !account.is_empty() && !parties.contains(&account) {
                    parties.push(account);
                }
            }
        }
        parties
    }

    /// Whether the transfer is listed under `account`.
    pub(super) fn involves(&self, account: &str) -> bool {
        self.src == account
            || self.dest == account
            || (self.accounts.is_some() && self.parties().iter().any(|p| p == account))
    }

    /// The metadata's string pairs (none when absent or not an object of strings).
    pub(super) fn metadata_pairs(&self) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
        let Some(raw) = self.metadata.as_deref() else {
            return Vec::new();
        };
        serde_json::from_str::<std::collections::BTreeMap<Cow<'_, str>, Cow<'_, str>>>(raw)
            .map(|map| map.into_iter().collect())
            .unwrap_or_default()
    }

    /// The `(account, seq)` of each well-formed entry value, once each; values that are not
    /// strings of the entry form are skipped ([`crate::store::entries::parse`]).
    pub(super) fn entry_keys(&self) -> BTreeSet<(Cow<'_, str>, u64)> {
        let Some(raw) = self.entries.as_deref() else {
            return BTreeSet::new();
        };
        let values: Vec<&RawValue> = serde_json::from_str(raw).unwrap_or_default();
        values
            .into_iter()
            .filter_map(|value| match text_of(Some(value)) {
                Cow::Borrowed(text) => entries::parse(text).map(|(a, seq)| (Cow::Borrowed(a), seq)),
                Cow::Owned(text) => {
                    entries::parse(&text).map(|(a, seq)| (Cow::Owned(a.to_owned()), seq))
                }
            })
            .collect()
    }

    /// Whether the transfer files an entry of `account` with a seq in `seqs`.
    pub(super) fn files_entry_in(&self, account: &str, seqs: &std::ops::Range<u64>) -> bool {
        self.entry_keys()
            .iter()
            .any(|(a, seq)| a == account && seqs.contains(seq))
    }

    /// Whether the metadata has every pair of `wanted`.
    pub(super) fn has_metadata(&self, wanted: &[(String, String)]) -> bool {
        if wanted.is_empty() {
            return true;
        }
        let pairs = self.metadata_pairs();
        wanted
            .iter()
            .all(|(k, v)| pairs.iter().any(|(pk, pv)| pk == k && pv == v))
    }
}

/// The indexed fields of a transfer source (named as in [`crate::store::fields`]), each as
/// its raw JSON text (absent or `null`: `None`). Only these are looked at; the rest of the
/// document is checked and skipped, not built.
#[derive(Deserialize)]
struct IndexedFields<'a> {
    #[serde(borrow, rename = "transaction_state")]
    state: Option<&'a RawValue>,
    #[serde(borrow, rename = "lease_owner")]
    lease_owner: Option<&'a RawValue>,
    #[serde(borrow, rename = "modification_time")]
    modified: Option<&'a RawValue>,
    #[serde(borrow, rename = "creation_time")]
    created: Option<&'a RawValue>,
    #[serde(borrow, rename = "src_acct")]
    src: Option<&'a RawValue>,
    #[serde(borrow, rename = "dest_acct")]
    dest: Option<&'a RawValue>,
    #[serde(borrow, rename = "accounts")]
    accounts: Option<&'a RawValue>,
    #[serde(borrow, rename = "attention")]
    attention: Option<&'a RawValue>,
    #[serde(borrow, rename = "metadata")]
    metadata: Option<&'a RawValue>,
    #[serde(borrow, rename = "entries")]
    entries: Option<&'a RawValue>,
}

/// The text of a string field (borrowed unless it holds escapes); any other value reads as
/// empty.
fn text_of(raw: Option<&RawValue>) -> Cow<'_, str> {
    raw.and_then(|raw| {
        serde_json::from_str::<&str>(raw.get())
            .map(Cow::Borrowed)
            .or_else(|_| serde_json::from_str::<String>(raw.get()).map(Cow::Owned))
            .ok()
    })
    .unwrap_or_default()
}

/// Reads the index keys of a transfer source. A field of another type than the engine writes
/// reads as empty (or 0): such a document is still indexed, and found, under those keys.
/// Fails only when the source is not a JSON object.
pub(super) fn transfer_keys(source: &[u8]) -> StoreResult<TransferKeys<'_>> {
    let indexed: IndexedFields<'_> = serde_json::from_slice(source).map_err(permanent)?;
    let is_string = |raw: Option<&RawValue>| raw.is_some_and(|raw| raw.get().starts_with('"'));
    let mut keys = TransferKeys {
        released: false,
        state: text_of(indexed.state),
        modified: parse_millis(&text_of(indexed.modified)).unwrap_or(0),
        created: parse_millis(&text_of(indexed.created)).unwrap_or(0),
        src: text_of(indexed.src),
        dest: text_of(indexed.dest),
        accounts: indexed
            .accounts
            .map(RawValue::get)
            .filter(|raw| raw.starts_with('['))
            .map(Cow::Borrowed),
        attention: is_string(indexed.attention),
        metadata: indexed
            .metadata
            .map(RawValue::get)
            .filter(|raw| raw.starts_with('{'))
            .map(Cow::Borrowed),
        entries: indexed
            .entries
            .map(RawValue::get)
            .filter(|raw| raw.starts_with('['))
            .map(Cow::Borrowed),
    };
    // Terminal transfers have no owner either; only in-flight ones are candidates.
    keys.released = indexed.lease_owner.is_none() && keys.in_flight();
    Ok(keys)
}

/// Moves a transfer's index entries from `old` keys (if it existed) to `new` keys, touching
/// only the entries whose keys changed (a redb insert copies the path to its leaf even when
/// the key is there already).
pub(super) fn update_transfer_indexes(
    t: &mut Tables<'_>,
    (id, number): (&str, u64),
    old: Option<&TransferKeys<'_>>,
    new: &TransferKeys<'_>,
    mut deferred: Option<&mut GroupEntries>,
) -> StoreResult<()> {
    let moved = MovedEntries::between(old, new);
    if moved.metadata {
        move_metadata_entries(t, id, old, new)?;
    }
    if moved.entries {
        move_account_entries(t, number, old, new, deferred.as_deref_mut())?;
    }
    if let Some(old) = old {
        move_entries(t, (id, number), old, &moved, EntryOp::Remove)?;
    }
    // A new transfer's creation entries wait for a run, given a list to wait in
    // ([`super::listing_entries`]); otherwise (replay) they are written now.
    match deferred.filter(|_| old.is_none()) {
        Some(deferred) => {
            let now = MovedEntries {
                created: false,
                parties: false,
                ..moved
            };
            move_entries(t, (id, number), new, &now, EntryOp::Insert)?;
            deferred.created.push(NewTransferEntries::of(number, new));
        }
        None => move_entries(t, (id, number), new, &moved, EntryOp::Insert)?,
    }
    Ok(())
}

/// Which of a transfer's index entries a write moves: those whose keys changed, all of them
/// for a new transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MovedEntries {
    released: bool,
    state_modified: bool,
    created: bool,
    attention: bool,
    state_created: bool,
    parties: bool,
    metadata: bool,
    entries: bool,
}

impl MovedEntries {
    fn between(old: Option<&TransferKeys<'_>>, new: &TransferKeys<'_>) -> Self {
        let changed = |same: fn(&TransferKeys<'_>, &TransferKeys<'_>) -> bool| {
            old.is_none_or(|old| !same(old, new))
        };
        Self {
            released: changed(|a, b| (&a.state, a.released) == (&b.state, b.released)),
            state_modified: changed(|a, b| (&a.state, a.modified) == (&b.state, b.modified)),
            created: changed(|a, b| a.created == b.created),
            attention: changed(|a, b| (a.created, a.attention) == (b.created, b.attention)),
            state_created: changed(|a, b| (&a.state, a.created) == (&b.state, b.created)),
            parties: changed(|a, b| {
                (&a.src, &a.dest, &a.accounts, a.created)
                    == (&b.src, &b.dest, &b.accounts, b.created)
            }),
            // Compared as raw text: the engine rewrites the same map in the same (key)
            // order, so a transfer's state writes never parse it.
            metadata: changed(|a, b| (&a.metadata, a.created) == (&b.metadata, b.created))
                && (new.metadata.is_some() || old.is_some_and(|o| o.metadata.is_some())),
            // As raw text too: most writes of a transfer leave its entries as they were.
            entries: changed(|a, b| a.entries == b.entries)
                && (new.entries.is_some() || old.is_some_and(|o| o.entries.is_some())),
        }
    }
}

/// Replaces the metadata entries of `old` (if any) by those of `new`.
fn move_metadata_entries(
    t: &mut Tables<'_>,
    id: &str,
    old: Option<&TransferKeys<'_>>,
    new: &TransferKeys<'_>,
) -> StoreResult<()> {
    if let Some(old) = old {
        for (k, v) in old.metadata_pairs() {
            t.metadata
                .remove((metadata_entry(&k, &v).as_str(), old.created, id))
                .map_err(storage)?;
        }
    }
    for (k, v) in new.metadata_pairs() {
        t.metadata
            .insert((metadata_entry(&k, &v).as_str(), new.created, id), ())
            .map_err(storage)?;
    }
    Ok(())
}

/// Removes the account entries of `old` (if any) that `new` no longer files and inserts
/// those `new` adds, leaving the ones both file untouched (a write that adds an entry to a
/// transfer inserts that one only).
///
/// Given a group's list (`deferred`), the added ones wait there for a run
/// ([`super::listing_entries`]), written late like a new transfer's creation entries: the
/// engine only ever adds values to a transfer's `entries`, so an entry, once filed, stays,
/// and writing it late (or twice) is the same as writing it at once. A removal (which the
/// engine never makes) is immediate, and takes the entry out of the pending ones too
/// ([`GroupEntries::unfile`]), so a run never writes it back. Replay writes both at once.
fn move_account_entries(
    t: &mut Tables<'_>,
    number: u64,
    old: Option<&TransferKeys<'_>>,
    new: &TransferKeys<'_>,
    mut deferred: Option<&mut GroupEntries>,
) -> StoreResult<()> {
    let before = old.map(TransferKeys::entry_keys).unwrap_or_default();
    let after = new.entry_keys();
    for (account, seq) in before.difference(&after) {
        let key = EntryKey::new(account, *seq, number);
        statement_index::remove(&mut t.entries, &key).map_err(storage)?;
        if let Some(deferred) = deferred.as_deref_mut() {
            deferred.unfile(key);
        }
    }
    for (account, seq) in after.difference(&before) {
        let key = EntryKey::new(account, *seq, number);
        match deferred.as_deref_mut() {
            Some(deferred) => deferred.file(key),
            None => statement_index::add(&mut t.entries, &[key]).map_err(storage)?,
        }
    }
    Ok(())
}

/// Whether a write's index entries go (the old keys') or come (the new keys').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryOp {
    Remove,
    Insert,
}

impl EntryOp {
    fn apply<'k, K: redb::Key + 'static>(
        self,
        table: &mut Table<'_, K, ()>,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
    ) -> StoreResult<()> {
        match self {
            EntryOp::Remove => table.remove(key).map(drop),
            EntryOp::Insert => table.insert(key, ()).map(drop),
        }
        .map_err(storage)
    }
}

/// Removes or inserts (`op`) the entries of `keys` that move (but metadata's). An entry is
/// inserted only where its index lists it (the recovery index in-flight transfers, the
/// state index the states it lists); a removal looks everywhere it may be.
fn move_entries(
    t: &mut Tables<'_>,
    (id, number): (&str, u64),
    keys: &TransferKeys<'_>,
    moved: &MovedEntries,
    op: EntryOp,
) -> StoreResult<()> {
    let removing = op == EntryOp::Remove;
    if keys.released && moved.released {
        op.apply(&mut t.released, (&*keys.state, id))?;
    }
    if moved.state_modified && (removing || keys.in_flight()) {
        op.apply(&mut t.by_state_modified, (&*keys.state, keys.modified, id))?;
    }
    if moved.created {
        op.apply(&mut t.by_created, (keys.created, number))?;
    }
    if keys.attention && moved.attention {
        op.apply(&mut t.attention, (keys.created, id))?;
    }
    if moved.state_created && (removing || listed_by_state(&keys.state)) {
        op.apply(&mut t.by_state_created, (&*keys.state, keys.created, id))?;
    }
    if moved.parties {
        for party in keys.parties() {
            op.apply(&mut t.by_account, (&*party, keys.created, number))?;
        }
    }
    Ok(())
}

/// The document stored under `id` (its value as [`super::at_rest`] lays it out). Its source
/// is handed on as stored (decompressed if it was), not parsed.
pub(super) fn decode(id: &str, bytes: &[u8]) -> StoreResult<Doc> {
    let (seq_no, source) = split_stored(id, bytes)?;
    Ok(doc_of(id, seq_no, source.into_owned()))
}

/// The document `id` at `seq_no` with its (plain) source.
pub(super) fn doc_of(id: &str, seq_no: u64, source: Vec<u8>) -> Doc {
    Doc {
        id: id.to_owned(),
        version: Version {
            seq_no,
            primary_term: PRIMARY_TERM,
        },
        source: Source::from_store(source),
    }
}

pub(super) fn read_doc(db: &Database, index: Index, id: &str) -> StoreResult<Option<Doc>> {
    read_doc_of(db, index, id)
}

/// [`read_doc`] on any redb handle (also one opened read-only).
pub(super) fn read_doc_of(
    db: &impl ReadableDatabase,
    index: Index,
    id: &str,
) -> StoreResult<Option<Doc>> {
    let txn = db.begin_read().map_err(storage)?;
    let docs = txn.open_table(DOCS).map_err(storage)?;
    match docs.get((index.name(), id)).map_err(storage)? {
        Some(bytes) => Ok(Some(decode(id, bytes.value())?)),
        None => Ok(None),
    }
}
