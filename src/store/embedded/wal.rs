//! The write-ahead log: what makes a group's writes durable between checkpoints.
//!
//! The committer's transaction commits to redb with `Durability::None` (its pages stay in
//! redb's memory, not written or fsynced), and each group's writes were appended here as one
//! record and the log was `fdatasync`ed before anyone saw them ([`super::recent`]). Every [`CHECKPOINT_INTERVAL`] (sooner while
//! groups are busy, see [`BUSY_GROUP_OPS`]; or every [`CHECKPOINT_BYTES`] of log), once a
//! group's callers are answered, the open transaction (or an empty one) commits with `Durability::Immediate`,
//! which makes every earlier commit durable in the redb file too, and the log is emptied. A page a
//! second of groups rewrote is then written once, not once per group, and each group costs
//! one sequential append and one `fdatasync`.
//!
//! **The rule that makes it safe:** nothing is acknowledged, nor visible to a reader, before
//! its record is on disk: the record is written and synced while the transaction holding the
//! group is still open, before the group's writes join the recent writes, and the
//! transaction commits after. A crash therefore leaves the redb file at
//! its last durable commit plus a log holding every record since (and perhaps one record
//! whose group was never acknowledged, which is then applied: its outcome was unknown to its
//! callers, as after a failed commit).
//!
//! **Replay.** Every group's transaction stores its record's number in `META`
//! ([`LOG_APPLIED`]), so the redb file says which records it already holds, whichever commit
//! was the last durable one. Opening the store applies the records after that number, in
//! order, in one durable transaction, then empties the log. A record holds each document
//! exactly as the group stored it (its `seq_no` and source); replay writes them again over the
//! same state the group saw, moving the secondary indexes as the group did. Only the log's
//! tail can be torn (records are appended one at a time, each synced before the next): a
//! record whose length or checksum does not hold ends the log. A log that does not continue
//! the file (its first record to apply is not the next number) refuses the open: the two
//! files were not written together.
//!
//! **After a failure** to write the log, to commit once the record is written, or to
//! checkpoint, the redb state in memory and the log may disagree; later groups would build
//! on the difference. So the store stops writing (`Committer::stop_writing`): every later
//! write and `ready` answer `Unavailable` until the process restarts and replays the log.
//!
//! Time only decides how often checkpoints happen (how long a replay may take and how much
//! redb keeps in memory); no rule of durability depends on it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

/// File name of the log inside `DATA_DIR`, beside [`FILE_NAME`].
pub const LOG_FILE_NAME: &str = "transfer-service.wal";

/// A checkpoint at least this often under load (`EMBEDDED_CHECKPOINT_INTERVAL`); sooner
/// when the groups are busy ([`BUSY_GROUP_OPS`]).
///
/// Each checkpoint holds up every writer waiting behind it while redb writes and fsyncs the
/// pages dirtied since the last one. With few writers waiting (64 clients), rare checkpoints
/// delay a small share of requests and cost the least CPU: every second, p99 12–15 ms; every
/// 50 ms, 43–45 ms and more CPU. With many (2,000 connections, a thousand in flight), each
/// stall delays many requests: every second, the p99 of accepted creates was 290–370 ms in
/// the service; every 50 ms, 200 ms (docs/benchmark.md).
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// A group weighing at least this many ops (about 256 transfers) means many writers are
/// waiting: for the next interval, a group checkpoints once a twentieth of it has passed
/// (50 ms by default), keeping each stall short. (Under 2,000 connections the groups
/// alternate between a few ops and several thousand; at 64 clients none exceeds 256.)
pub const BUSY_GROUP_OPS: usize = 1024;

/// The most documents the acknowledged groups of the committer's open transaction may have
/// written before it commits ([`Wal::commit_due`]): some ten thousand transfers, some tens of
/// MiB of recent writes at most. Under a steady load the checkpoint commits it first.
pub const OPEN_TXN_WRITES: usize = 32_768;

/// A checkpoint once the log holds this much, whatever the time.
pub const CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;

/// The key in [`META`] holding the number of the last log record the file's state includes.
pub(super) const LOG_APPLIED: &str = "log:applied";

/// Bytes before each record's body: its length and a CRC-32 of the length and the body,
/// little endian.
const HEADER: usize = 8;

/// The smallest body: the record's number.
const MIN_BODY: usize = 8;

/// The checksum of a record: its length and its body (so that a run of zeros, which a crash
/// can leave at the end of a file, is not a valid empty record).
fn checksum(len: [u8; 4], body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&len);
    hasher.update(body);
    hasher.finalize()
}

/// The writes of one group, encoded as they are made: the body of one log record.
pub(super) struct LogRecord {
    number: u64,
    body: Vec<u8>,
}

impl LogRecord {
    fn new(number: u64) -> Self {
        let mut body = Vec::with_capacity(4096);
        body.extend_from_slice(&[0; HEADER]);
        body.extend_from_slice(&number.to_le_bytes());
        Self { number, body }
    }

    /// The record's number (one more than the last record's).
    pub(super) fn number(&self) -> u64 {
        self.number
    }

    /// Whether the group wrote anything.
    pub(super) fn is_empty(&self) -> bool {
        self.body.len() == HEADER + 8
    }

    /// Adds one stored document: its index, id and stored value (`seq_no` and source).
    pub(super) fn push(&mut self, index: Index, id: &str, value: &[u8]) {
        let name = index.name().as_bytes();
        self.body.push(name.len() as u8);
        self.body.extend_from_slice(name);
        self.body
            .extend_from_slice(&(id.len() as u32).to_le_bytes());
        self.body.extend_from_slice(id.as_bytes());
        self.body
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.body.extend_from_slice(value);
    }

    /// The bytes to append: the header filled in, then the body.
    fn seal(&mut self) -> &[u8] {
        let body = &self.body[HEADER..];
        let len = u32::try_from(body.len())
            .expect("a group's record is far below 4 GiB")
            .to_le_bytes();
        let crc = checksum(len, body);
        self.body[..4].copy_from_slice(&len);
        self.body[4..HEADER].copy_from_slice(&crc.to_le_bytes());
        &self.body
    }
}

/// One document of a record read back.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct LoggedWrite<'a> {
    pub(super) index: Index,
    pub(super) id: &'a str,
    pub(super) value: &'a [u8],
}

/// The log file, the next record's number, and when the last checkpoint was.
pub(super) struct Wal {
    file: File,
    next_number: u64,
    bytes: u64,
    last_checkpoint: Instant,
    checkpoint_interval: Duration,
    /// When the last busy group was seen: for an interval after it, checkpoints come every
    /// twentieth of the interval.
    busy_seen: Option<Instant>,
    /// Tests make the next appends fail, as a full or failing disk would.
    #[cfg(test)]
    pub(super) fail_appends: bool,
    /// Tests make the next append panic, as a bug in the committer would.
    #[cfg(test)]
    pub(super) panic_appends: bool,
}

impl Wal {
    /// Opens (or creates) the log in `dir` and returns it with its whole content, to replay.
    pub(super) fn open(dir: &Path, checkpoint_interval: Duration) -> StoreResult<(Self, Vec<u8>)> {
        let path = dir.join(LOG_FILE_NAME);
        let cannot = |e: std::io::Error| {
            StoreError::Permanent(format!("cannot open {}: {e}", path.display()))
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(cannot)?;
        let mut content = Vec::new();
        file.read_to_end(&mut content).map_err(cannot)?;
        // The file's name must survive a power loss too, from its first record on.
        File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(cannot)?;
        let wal = Self {
            file,
            next_number: 1,
            bytes: content.len() as u64,
            last_checkpoint: Instant::now(),
            checkpoint_interval,
            busy_seen: None,
            #[cfg(test)]
            fail_appends: false,
            #[cfg(test)]
            panic_appends: false,
        };
        Ok((wal, content))
    }

    /// A new record for the next group.
    pub(super) fn record(&self) -> LogRecord {
        LogRecord::new(self.next_number)
    }

    /// Whether a group of `weight` ops should make everything durable in the redb file.
    pub(super) fn checkpoint_due(&mut self, weight: usize) -> bool {
        let now = Instant::now();
        if weight >= BUSY_GROUP_OPS {
            self.busy_seen = Some(now);
        }
        // Durations since, never instants plus durations: any configured interval is safe.
        let busy = self
            .busy_seen
            .is_some_and(|seen| now.saturating_duration_since(seen) < self.checkpoint_interval);
        let since = now.saturating_duration_since(self.last_checkpoint);
        self.bytes >= CHECKPOINT_BYTES
            || since >= self.checkpoint_interval
            || (busy && since >= self.checkpoint_interval / 20)
    }

    /// Whether the committer's open transaction, whose acknowledged groups wrote
    /// `acknowledged` documents, should commit now, before a checkpoint does
    /// ([`super::recent`]): at [`OPEN_TXN_WRITES`] documents. This bounds what redb and the
    /// recent writes hold in memory; searches commit it sooner when they need to. Nothing of
    /// durability depends on it.
    ///
    /// Only a size: every commit costs redb work (its allocator state, the checksums of the
    /// pages changed) and a copy of each page the next transaction changes again, and
    /// nothing reads the tables without committing first. Committing every tenth of the
    /// checkpoint interval as well cost 9% more CPU a transfer at 64 clients, and 45% more
    /// on the p99 (docs/benchmark.md).
    pub(super) fn commit_due(&self, acknowledged: usize) -> bool {
        acknowledged >= OPEN_TXN_WRITES
    }

    /// Appends `record` and syncs it: once this returns, the record survives a crash.
    pub(super) fn append(&mut self, record: &mut LogRecord) -> std::io::Result<()> {
        let bytes = record.seal();
        #[cfg(test)]
        if self.panic_appends {
            panic!("injected: a bug in the committer");
        }
        #[cfg(test)]
        if self.fail_appends {
            // Half the record reaches the file, as when the disk fills mid-write.
            self.file.write_all(&bytes[..bytes.len() / 2])?;
            return Err(std::io::Error::other("injected: the disk is full"));
        }
        self.file.write_all(bytes)?;
        self.file.sync_data()?;
        self.bytes += bytes.len() as u64;
        self.next_number = record.number + 1;
        Ok(())
    }

    /// Numbers the next record after `last_applied`, the last record the redb file holds.
    pub(super) fn continue_after(&mut self, last_applied: u64) {
        self.next_number = last_applied + 1;
    }

    /// Empties the log after a durable commit that includes every record in it. Should the
    /// file not shrink, its records are all at or below the number the redb file holds, and
    /// replay skips them.
    pub(super) fn checkpointed(&mut self) -> std::io::Result<()> {
        self.last_checkpoint = Instant::now();
        if self.bytes == 0 {
            return Ok(());
        }
        self.file.set_len(0)?;
        self.file.sync_all()?;
        self.bytes = 0;
        Ok(())
    }
}

/// The complete records of a log's content, in order, as `(number, writes)`.
///
/// Only the tail can be torn: records are appended one at a time, each synced before the
/// next. So an unreadable record (torn, failing its checksum) that is the last thing in the
/// file, or is followed only by zeros, ends the log: the tail of a crash, never acknowledged.
/// One followed by anything else is corruption, and so is a record whose checksum holds but
/// which does not parse (another version wrote it): errors, rather than acknowledged writes
/// silently skipped (the log is left as it is for a person to look at).
pub(super) fn read_records(content: &[u8]) -> StoreResult<Vec<(u64, Vec<LoggedWrite<'_>>)>> {
    let mut records = Vec::new();
    let mut rest = content;
    let at = |rest: &[u8]| content.len() - rest.len();
    while let Some((body, after)) = next_record(rest) {
        let record = decode_record(body).ok_or_else(|| {
            StoreError::Permanent(format!(
                "embedded store: the write-ahead log's record at byte {} does not parse",
                at(rest)
            ))
        })?;
        records.push(record);
        rest = after;
    }
    if !rest.is_empty() {
        if !is_torn_tail(rest) {
            return Err(StoreError::Permanent(format!(
                "embedded store: the write-ahead log is corrupt at byte {} and records follow; \
                 {} is left as it is",
                at(rest),
                LOG_FILE_NAME
            )));
        }
        tracing::warn!(
            ignored_bytes = rest.len(),
            "the write-ahead log ends in a torn record (a crash while it was written); \
             its group was never acknowledged"
        );
    }
    Ok(records)
}

/// The body of the record at the start of `rest` and what follows it, if the record is
/// whole and its checksum holds.
fn next_record(rest: &[u8]) -> Option<(&[u8], &[u8])> {
    let (header, after) = rest.split_first_chunk::<HEADER>()?;
    let (len, crc) = header.split_at(4);
    let len: [u8; 4] = len.try_into().expect("4 bytes");
    let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    let (body, after) = after.split_at_checked(u32::from_le_bytes(len) as usize)?;
    (body.len() >= MIN_BODY && checksum(len, body) == crc).then_some((body, after))
}

/// Whether an unreadable record at the start of `rest` is the last thing in the log: it
/// reaches the end of the file (as far as its length says), or only zeros follow it.
fn is_torn_tail(rest: &[u8]) -> bool {
    let Some((header, after)) = rest.split_first_chunk::<HEADER>() else {
        return true;
    };
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    match after.get(len..) {
        None => true,
        Some(following) => following.iter().all(|&b| b == 0),
    }
}

/// A record's body: its number, then its writes; `None` if it does not parse.
fn decode_record(body: &[u8]) -> Option<(u64, Vec<LoggedWrite<'_>>)> {
    let (number, mut rest) = body.split_first_chunk::<8>()?;
    let mut writes = Vec::new();
    while !rest.is_empty() {
        let (&name_len, after) = rest.split_first()?;
        let (name, after) = after.split_at_checked(name_len as usize)?;
        let index = Index::ALL
            .into_iter()
            .find(|index| index.name().as_bytes() == name)?;
        let (id_len, after) = after.split_first_chunk::<4>()?;
        let (id, after) = after.split_at_checked(u32::from_le_bytes(*id_len) as usize)?;
        let (value_len, after) = after.split_first_chunk::<4>()?;
        let (value, after) = after.split_at_checked(u32::from_le_bytes(*value_len) as usize)?;
        writes.push(LoggedWrite {
            index,
            id: std::str::from_utf8(id).ok()?,
            value,
        });
        rest = after;
    }
    Some((u64::from_le_bytes(*number), writes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(number: u64, writes: &[(Index, &str, &[u8])]) -> Vec<u8> {
        let mut record = LogRecord::new(number);
        for (index, id, value) in writes {
            record.push(*index, id, value);
        }
        record.seal().to_vec()
    }

    fn numbers(content: &[u8]) -> Vec<u64> {
        let records = read_records(content).expect("records");
        records.iter().map(|(number, _)| *number).collect()
    }

    #[test]
    fn records_read_back_as_written() {
        let mut content = record(7, &[(Index::Accounts, "a1", b"\x01value")]);
        content.extend(record(8, &[]));
        content.extend(record(
            9,
            &[
                (Index::Transactions, "t-\u{e9}", b"{}"),
                (Index::Webhooks, "", b""),
            ],
        ));
        let records = read_records(&content).unwrap();
        let expected = |index, id, value| LoggedWrite { index, id, value };
        assert_eq!(
            records[0],
            (
                7,
                vec![expected(Index::Accounts, "a1", b"\x01value".as_slice())]
            )
        );
        assert_eq!(records[1], (8, vec![]));
        assert_eq!(
            records[2],
            (
                9,
                vec![
                    expected(Index::Transactions, "t-\u{e9}", b"{}".as_slice()),
                    expected(Index::Webhooks, "", b"".as_slice()),
                ]
            )
        );
    }

    #[test]
    fn a_torn_tail_ends_the_log_at_the_last_whole_record() {
        let first = record(1, &[(Index::Accounts, "a", b"12345678{}")]);
        let second = record(2, &[(Index::Accounts, "b", b"12345678{\"x\":1}")]);
        let content = [first.clone(), second.clone()].concat();
        for cut in 0..content.len() {
            let expected: &[u64] = match cut {
                c if c < first.len() => &[],
                _ => &[1],
            };
            assert_eq!(numbers(&content[..cut]), expected, "cut at byte {cut}");
        }
        assert_eq!(numbers(&content), [1, 2]);
    }

    #[test]
    fn a_last_record_that_fails_its_checksum_ends_the_log() {
        let first = record(1, &[(Index::Accounts, "a", b"12345678{}")]);
        let second = record(2, &[(Index::Accounts, "b", b"12345678{}")]);
        for flipped in first.len() + 4..first.len() + second.len() {
            let mut content = [first.clone(), second.clone()].concat();
            content[flipped] ^= 0x40;
            assert_eq!(numbers(&content), [1], "byte {flipped} flipped");
        }
    }

    #[test]
    fn zeros_after_the_last_record_end_the_log() {
        let first = record(1, &[(Index::Accounts, "a", b"12345678{}")]);
        for zeros in [1, HEADER, 4096] {
            let content = [first.clone(), vec![0; zeros]].concat();
            assert_eq!(numbers(&content), [1], "{zeros} zeros");
        }
        let torn = record(2, &[(Index::Accounts, "b", b"12345678{}")]);
        let zero_filled = [&torn[..HEADER + 3], &vec![0; 64][..]].concat();
        assert_eq!(numbers(&[first.clone(), zero_filled].concat()), [1]);
    }

    #[test]
    fn a_corrupt_record_followed_by_records_is_an_error_not_an_end() {
        let records: Vec<Vec<u8>> = (1..=3)
            .map(|n| record(n, &[(Index::Accounts, "a", b"12345678{}")]))
            .collect();
        let mut content = records.concat();
        content[records[0].len() + HEADER + 2] ^= 0x01; // in the second record's body
        assert!(
            matches!(read_records(&content), Err(StoreError::Permanent(e)) if e.contains("corrupt")),
            "the third record is acknowledged and must not be skipped"
        );
    }

    #[test]
    fn a_checksummed_record_that_does_not_parse_is_an_error_not_a_skip() {
        let mut unknown = LogRecord::new(1);
        unknown
            .body
            .extend_from_slice(&[5, b'o', b't', b'h', b'e', b'r']);
        let content = unknown.seal().to_vec();
        assert!(matches!(
            read_records(&content),
            Err(StoreError::Permanent(_))
        ));
    }
}

#[cfg(test)]
mod checkpoint_tests {
    use super::*;

    /// A log whose last checkpoint was `ago`, checkpointing every second.
    fn log_checkpointed(ago: Duration) -> (tempfile::TempDir, Wal) {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut log, _) = Wal::open(dir.path(), Duration::from_secs(1)).unwrap();
        log.last_checkpoint = Instant::now().checked_sub(ago).expect("boot was long ago");
        (dir, log)
    }

    #[test]
    fn quiet_groups_checkpoint_once_the_interval_has_passed() {
        let (_dir, mut log) = log_checkpointed(Duration::from_millis(500));
        assert!(!log.checkpoint_due(4));
        assert!(!log.checkpoint_due(BUSY_GROUP_OPS - 1));
        let (_dir, mut log) = log_checkpointed(Duration::from_millis(1001));
        assert!(log.checkpoint_due(4));
    }

    #[test]
    fn after_a_busy_group_checkpoints_come_every_twentieth_of_it() {
        let (_dir, mut log) = log_checkpointed(Duration::from_millis(10));
        assert!(!log.checkpoint_due(BUSY_GROUP_OPS));
        let (_dir, mut log) = log_checkpointed(Duration::from_millis(60));
        assert!(!log.checkpoint_due(BUSY_GROUP_OPS - 1), "no busy group yet");
        assert!(log.checkpoint_due(BUSY_GROUP_OPS));
        // Small groups between the busy ones checkpoint as often, for an interval.
        assert!(log.checkpoint_due(4));
        log.busy_seen = Instant::now().checked_sub(Duration::from_millis(1001));
        assert!(!log.checkpoint_due(4), "busy no more");
    }

    #[test]
    fn any_configured_interval_is_safe() {
        for interval in [Duration::ZERO, Duration::MAX] {
            let dir = tempfile::tempdir().expect("temp dir");
            let (mut log, _) = Wal::open(dir.path(), interval).unwrap();
            let due = log.checkpoint_due(BUSY_GROUP_OPS);
            assert_eq!(due, interval.is_zero(), "{interval:?}");
        }
    }

    #[test]
    fn the_open_transaction_commits_early_only_once_it_holds_many_writes() {
        let (_dir, log) = log_checkpointed(Duration::ZERO);
        assert!(!log.commit_due(1));
        assert!(!log.commit_due(OPEN_TXN_WRITES - 1));
        assert!(log.commit_due(OPEN_TXN_WRITES));
    }

    #[test]
    fn a_long_log_checkpoints_whatever_the_time() {
        let (_dir, mut log) = log_checkpointed(Duration::ZERO);
        assert!(!log.checkpoint_due(4));
        log.bytes = CHECKPOINT_BYTES;
        assert!(log.checkpoint_due(4));
    }
}
