//! The embedded store's tables: documents, the per-index sequence numbers, and the secondary
//! indexes of transfers its searches walk, kept in the same write transaction as the documents.

use super::*;

/// `(index, id)` → `seq_no` (8 bytes, little endian) followed by the JSON source.
pub(super) const DOCS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("docs");

/// `"seq:<index>"` → the last `seq_no` handed out in that index.
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Transfers by `(state, modification_time, id)`: the recovery query.
pub(super) const TX_BY_STATE_MODIFIED: TableDefinition<(&str, i64, &str), ()> =
    TableDefinition::new("tx_by_state_modified");

/// Transfers by `(creation_time, id)`: the unfiltered listing.
pub(super) const TX_BY_CREATED: TableDefinition<(i64, &str), ()> =
    TableDefinition::new("tx_by_created");

/// Transfers by `(state, creation_time, id)`: the listing filtered by state.
pub(super) const TX_BY_STATE_CREATED: TableDefinition<(&str, i64, &str), ()> =
    TableDefinition::new("tx_by_state_created");

/// Transfers by `(account, creation_time, id)`, once for the source and once for the
/// destination: the listing filtered by account.
pub(super) const TX_BY_ACCOUNT: TableDefinition<(&str, i64, &str), ()> =
    TableDefinition::new("tx_by_account");

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

/// The key in [`META`] that says [`TX_ATTENTION`] holds every flagged transfer (it was built
/// from the documents once, when a store written by an older version was first opened).
pub(super) const ATTENTION_BUILT: &str = "built:tx_attention";

/// The only primary term this backend knows (no replicas, no failover).
pub(super) const PRIMARY_TERM: u64 = 1;

/// Fills [`TX_ATTENTION`] from the stored transfers, once: a store written before the table
/// existed may hold flagged transfers. Afterwards every write keeps the table up to date.
pub(super) fn build_attention_index(txn: &WriteTransaction) -> StoreResult<()> {
    let mut meta = txn.open_table(META).map_err(permanent)?;
    if meta.get(ATTENTION_BUILT).map_err(permanent)?.is_some() {
        return Ok(());
    }
    let docs = txn.open_table(DOCS).map_err(permanent)?;
    let mut attention = txn.open_table(TX_ATTENTION).map_err(permanent)?;
    let name = Index::Transactions.name();
    for entry in docs.range((name, "")..).map_err(permanent)? {
        let (key, value) = entry.map_err(permanent)?;
        let (index, id) = key.value();
        if index != name {
            break;
        }
        // An undecodable document is skipped here as it is by the searches.
        if let Ok(doc) = decode(id, value.value()) {
            let keys = transfer_keys(&doc.source);
            if keys.attention {
                attention
                    .insert((keys.created, id), ())
                    .map_err(permanent)?;
            }
        }
    }
    meta.insert(ATTENTION_BUILT, 1).map_err(permanent)?;
    Ok(())
}

/// The tables one write transaction touches, opened once per group.
pub(super) struct Tables<'txn> {
    pub(super) docs: Table<'txn, (&'static str, &'static str), &'static [u8]>,
    pub(super) meta: Table<'txn, &'static str, u64>,
    pub(super) by_state_modified: Table<'txn, (&'static str, i64, &'static str), ()>,
    pub(super) by_created: Table<'txn, (i64, &'static str), ()>,
    pub(super) by_state_created: Table<'txn, (&'static str, i64, &'static str), ()>,
    pub(super) by_account: Table<'txn, (&'static str, i64, &'static str), ()>,
    pub(super) released: Table<'txn, (&'static str, &'static str), ()>,
    pub(super) attention: Table<'txn, (i64, &'static str), ()>,
}

impl<'txn> Tables<'txn> {
    pub(super) fn open(txn: &'txn WriteTransaction) -> StoreResult<Self> {
        Ok(Self {
            docs: txn.open_table(DOCS).map_err(storage)?,
            meta: txn.open_table(META).map_err(storage)?,
            by_state_modified: txn.open_table(TX_BY_STATE_MODIFIED).map_err(storage)?,
            by_created: txn.open_table(TX_BY_CREATED).map_err(storage)?,
            by_state_created: txn.open_table(TX_BY_STATE_CREATED).map_err(storage)?,
            by_account: txn.open_table(TX_BY_ACCOUNT).map_err(storage)?,
            released: txn.open_table(TX_RELEASED).map_err(storage)?,
            attention: txn.open_table(TX_ATTENTION).map_err(storage)?,
        })
    }
}

/// The secondary-index keys of one transfer document.
#[derive(PartialEq, Eq)]
pub(super) struct TransferKeys<'a> {
    pub(super) state: &'a str,
    /// No lease owner: the lease was released.
    pub(super) released: bool,
    pub(super) modified: i64,
    pub(super) created: i64,
    pub(super) src: &'a str,
    pub(super) dest: &'a str,
    /// Flagged for a person ([`carries_attention`]).
    pub(super) attention: bool,
}

pub(super) fn transfer_keys(source: &Value) -> TransferKeys<'_> {
    let text = |f: &str| source.get(f).and_then(Value::as_str).unwrap_or("");
    let millis = |f: &str| {
        source
            .get(f)
            .and_then(Value::as_str)
            .and_then(parse_millis)
            .unwrap_or(0)
    };
    TransferKeys {
        state: text(fields::STATE),
        // Terminal transfers have no owner either; only in-flight ones are candidates.
        released: source.get(fields::LEASE_OWNER).is_none_or(Value::is_null)
            && !matches!(text(fields::STATE), "finished" | "rolled-back"),
        modified: millis(fields::MODIFIED),
        created: millis(fields::CREATED),
        src: text(fields::SRC),
        dest: text(fields::DEST),
        attention: carries_attention(source),
    }
}

/// Moves a transfer's index entries from `old` keys (if it existed) to `new` keys, touching
/// only the entries whose keys changed.
pub(super) fn update_transfer_indexes(
    t: &mut Tables<'_>,
    id: &str,
    old: Option<&TransferKeys<'_>>,
    new: &TransferKeys<'_>,
) -> StoreResult<()> {
    let e = storage;
    if let Some(old) = old {
        if old.released && (old.state, old.released) != (new.state, new.released) {
            t.released.remove((old.state, id)).map_err(e)?;
        }
        if (old.state, old.modified) != (new.state, new.modified) {
            t.by_state_modified
                .remove((old.state, old.modified, id))
                .map_err(e)?;
        }
        if old.created != new.created {
            t.by_created.remove((old.created, id)).map_err(e)?;
        }
        if old.attention && (old.created, old.attention) != (new.created, new.attention) {
            t.attention.remove((old.created, id)).map_err(e)?;
        }
        if (old.state, old.created) != (new.state, new.created) {
            t.by_state_created
                .remove((old.state, old.created, id))
                .map_err(e)?;
        }
        if (old.src, old.dest, old.created) != (new.src, new.dest, new.created) {
            t.by_account.remove((old.src, old.created, id)).map_err(e)?;
            t.by_account
                .remove((old.dest, old.created, id))
                .map_err(e)?;
        }
    }
    t.by_state_modified
        .insert((new.state, new.modified, id), ())
        .map_err(e)?;
    t.by_created.insert((new.created, id), ()).map_err(e)?;
    if new.released {
        t.released.insert((new.state, id), ()).map_err(e)?;
    }
    if new.attention {
        t.attention.insert((new.created, id), ()).map_err(e)?;
    }
    t.by_state_created
        .insert((new.state, new.created, id), ())
        .map_err(e)?;
    t.by_account
        .insert((new.src, new.created, id), ())
        .map_err(e)?;
    t.by_account
        .insert((new.dest, new.created, id), ())
        .map_err(e)?;
    Ok(())
}

pub(super) fn decode(id: &str, bytes: &[u8]) -> StoreResult<Doc> {
    if bytes.len() < 8 {
        return Err(StoreError::Permanent(format!(
            "embedded store: document {id} is truncated"
        )));
    }
    let (seq, json) = bytes.split_at(8);
    let seq_no = u64::from_le_bytes(seq.try_into().expect("8 bytes"));
    let source = serde_json::from_slice(json).map_err(permanent)?;
    Ok(Doc {
        id: id.to_owned(),
        version: Version {
            seq_no,
            primary_term: PRIMARY_TERM,
        },
        source,
    })
}

pub(super) fn read_doc(db: &Database, index: Index, id: &str) -> StoreResult<Option<Doc>> {
    let txn = db.begin_read().map_err(storage)?;
    let docs = txn.open_table(DOCS).map_err(storage)?;
    match docs.get((index.name(), id)).map_err(storage)? {
        Some(bytes) => Ok(Some(decode(id, bytes.value())?)),
        None => Ok(None),
    }
}
