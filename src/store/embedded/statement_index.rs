//! The statements' index ([`TX_ENTRIES`]): which transfers file which entries of an account,
//! in blocks of [`BLOCK_SEQS`] consecutive seqs, one row per account and block.
//!
//! **Why blocks.** A row per entry cost a B-tree insert per entry: a search from the root,
//! and a leaf's tail moved to make room, in the middle of the table (an account's newest
//! entries sit at the end of its own range, and a load touches every account). At 12,000
//! transfers a second over 1,000 accounts a run of a second ([`super::listing_entries`])
//! wrote some 24 rows into each account's last leaf, one insert at a time. In blocks, the
//! same run rewrites one or two rows an account: its last block's value, read, merged and
//! written once.
//!
//! **Layout.** Key: the account's bytes, a 0, then the block's number (`seq /
//! BLOCK_SEQS`), 8 bytes big endian: bytes compare as `(account, block)` would (an account
//! id never holds a 0, so the 0 ends it and a shorter account sorts before a longer one it
//! starts). Value: the block's `(seq, number)` pairs ([`TX_IDS`]), 8 + 8 bytes big endian
//! each, sorted and each once. A pair is kept per filing transfer, not per seq: should two
//! documents ever file the same `(account, seq)`, both are found (as Elasticsearch would
//! find both), and one losing it does not take the other's.
//!
//! Adding a pair a block holds already changes nothing, so writing an entry late or twice
//! (a run after a crash's catch-up, an index built again) is the same as writing it once.

use std::ops::Range;

use redb::{ReadableTable, StorageError, Table};

use super::tables::EntryKey;

/// Consecutive seqs a row holds: its value is at most 64 pairs (1 KiB) while each seq is
/// filed once.
pub(super) const BLOCK_SEQS: u64 = 64;

/// One `(seq, number)` pair's bytes in a block.
const PAIR: usize = 16;

/// The key of `account`'s block holding `seq`.
fn block_key(account: &[u8], seq: u64) -> Vec<u8> {
    debug_assert!(!account.contains(&0), "an account id holds no 0");
    let mut key = Vec::with_capacity(account.len() + 9);
    key.extend_from_slice(account);
    key.push(0);
    key.extend_from_slice(&(seq / BLOCK_SEQS).to_be_bytes());
    key
}

fn pair(seq: u64, number: u64) -> [u8; PAIR] {
    let mut bytes = [0; PAIR];
    bytes[..8].copy_from_slice(&seq.to_be_bytes());
    bytes[8..].copy_from_slice(&number.to_be_bytes());
    bytes
}

/// The `(seq, number)` pairs of a stored block, in order; a value not of whole pairs (never
/// written by this version) yields its whole pairs only.
fn pairs(value: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
    value.chunks_exact(PAIR).map(|p| {
        let (seq, number) = p.split_at(8);
        (
            u64::from_be_bytes(seq.try_into().expect("8 bytes")),
            u64::from_be_bytes(number.try_into().expect("8 bytes")),
        )
    })
}

/// Adds `keys` (sorted, as a run's are) to the index: each block they fall in is read,
/// merged with its new pairs and written once.
pub(super) fn add(
    table: &mut Table<'_, &'static [u8], &'static [u8]>,
    keys: &[EntryKey],
) -> Result<(), StorageError> {
    debug_assert!(keys.is_sorted(), "a run's keys are sorted");
    let mut rest = keys;
    while let Some(first) = rest.first() {
        let (account, seq, _) = first.parts();
        let block = seq / BLOCK_SEQS;
        let len = rest
            .iter()
            .take_while(|k| {
                let (a, s, _) = k.parts();
                a == account && s / BLOCK_SEQS == block
            })
            .count();
        let (these, after) = rest.split_at(len);
        let key = block_key(account.as_bytes(), seq);
        let mut merged: Vec<[u8; PAIR]> = match table.get(key.as_slice())? {
            Some(value) => value.value().chunks_exact(PAIR).map(to_pair).collect(),
            None => Vec::with_capacity(these.len()),
        };
        let held = merged.len();
        merged.extend(these.iter().map(|k| {
            let (_, seq, number) = k.parts();
            pair(seq, number)
        }));
        if merged.len() > held {
            merged.sort_unstable();
            merged.dedup();
            table.insert(key.as_slice(), merged.concat().as_slice())?;
        }
        rest = after;
    }
    Ok(())
}

fn to_pair(bytes: &[u8]) -> [u8; PAIR] {
    bytes.try_into().expect("a chunk of PAIR bytes")
}

/// Takes `key`'s pair from its block (the row goes with its last pair).
pub(super) fn remove(
    table: &mut Table<'_, &'static [u8], &'static [u8]>,
    key: &EntryKey,
) -> Result<(), StorageError> {
    let (account, seq, number) = key.parts();
    let block = block_key(account.as_bytes(), seq);
    let gone = pair(seq, number);
    let Some(value) = table.get(block.as_slice())? else {
        return Ok(());
    };
    let kept: Vec<u8> = (value.value().chunks_exact(PAIR))
        .filter(|p| *p != gone)
        .flatten()
        .copied()
        .collect();
    drop(value);
    if kept.is_empty() {
        table.remove(block.as_slice())?;
    } else {
        table.insert(block.as_slice(), kept.as_slice())?;
    }
    Ok(())
}

/// The numbers of the transfers filing `account`'s entries with a seq in `seqs`, in `(seq,
/// number)` order (a transfer filing several of them once for each).
pub(super) fn numbers_filing(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    account: &str,
    seqs: &Range<u64>,
) -> Result<Vec<(u64, u64)>, StorageError> {
    let mut found = Vec::new();
    if seqs.is_empty() || account.as_bytes().contains(&0) {
        return Ok(found);
    }
    let from = block_key(account.as_bytes(), seqs.start);
    let through = block_key(account.as_bytes(), seqs.end - 1);
    for row in table.range(from.as_slice()..=through.as_slice())? {
        let (_, value) = row?;
        found.extend(pairs(value.value()).filter(|(seq, _)| seqs.contains(seq)));
    }
    Ok(found)
}

/// Every `(account, seq, number)` the index holds, in order: for tests and checks.
#[cfg(test)]
pub(super) fn all_rows(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
) -> Vec<(String, u64, u64)> {
    let mut rows = Vec::new();
    for row in table.iter().expect("the index reads") {
        let (key, value) = row.expect("a row");
        let key = key.value();
        let account = &key[..key.len() - 9];
        for (seq, number) in pairs(value.value()) {
            rows.push((
                String::from_utf8(account.to_vec()).expect("an account id"),
                seq,
                number,
            ));
        }
    }
    rows
}
