//! The write-ahead log: what makes a group's writes durable between checkpoints.
//!
//! The committer's transaction commits to redb with `Durability::None` (its pages stay in
//! redb's memory, not written or fsynced), and each group's writes were appended here as one
//! record and the log was `fdatasync`ed before anyone saw them ([`super::recent_writes`]). Every [`CHECKPOINT_INTERVAL`] (sooner while
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

use std::time::{Duration, Instant};

use super::disk::{DataDir, LogFile};
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

/// The first bytes of every record: which format wrote it.
const MAGIC: [u8; 4] = *b"TSL2";

/// Bytes before each record's body, little endian: [`MAGIC`], the body's length (`u32`), the
/// record's number (`u64`), a CRC-32 of the body, and a CRC-32 of those 20 bytes. The header
/// has a checksum of its own so that a damaged length or number is seen as damage, never
/// trusted to say where the log ends.
const HEADER: usize = 24;

/// A CRC-32 of `bytes`.
fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The writes of one group, encoded as they are made: one log record.
pub(super) struct LogRecord {
    number: u64,
    /// The header's room, then the body.
    bytes: Vec<u8>,
}

impl LogRecord {
    fn new(number: u64) -> Self {
        let mut bytes = Vec::with_capacity(4096);
        bytes.extend_from_slice(&[0; HEADER]);
        Self { number, bytes }
    }

    /// The record's number (one more than the last record's).
    pub(super) fn number(&self) -> u64 {
        self.number
    }

    /// Whether the group wrote anything.
    pub(super) fn is_empty(&self) -> bool {
        self.bytes.len() == HEADER
    }

    /// Adds one stored document: its index, id and stored value (`seq_no` and source).
    pub(super) fn push(&mut self, index: Index, id: &str, value: &[u8]) {
        let name = index.name().as_bytes();
        self.bytes.push(name.len() as u8);
        self.bytes.extend_from_slice(name);
        self.bytes
            .extend_from_slice(&(id.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(id.as_bytes());
        self.bytes
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(value);
    }

    /// The bytes to append: the header filled in, then the body.
    fn seal(&mut self) -> &[u8] {
        let body_len = self.bytes.len() - HEADER;
        let len = u32::try_from(body_len).expect("a group's record is far below 4 GiB");
        let body_crc = crc(&self.bytes[HEADER..]);
        let header = &mut self.bytes[..HEADER];
        header[..4].copy_from_slice(&MAGIC);
        header[4..8].copy_from_slice(&len.to_le_bytes());
        header[8..16].copy_from_slice(&self.number.to_le_bytes());
        header[16..20].copy_from_slice(&body_crc.to_le_bytes());
        let header_crc = crc(&header[..20]);
        header[20..24].copy_from_slice(&header_crc.to_le_bytes());
        &self.bytes
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
    file: Box<dyn LogFile>,
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
    pub(super) fn open(
        dir: &dyn DataDir,
        checkpoint_interval: Duration,
    ) -> StoreResult<(Self, Vec<u8>)> {
        let cannot = |e: std::io::Error| {
            StoreError::Permanent(format!("embedded store: cannot open {LOG_FILE_NAME}: {e}"))
        };
        let mut file = dir.open_log().map_err(cannot)?;
        let content = file.read_all().map_err(cannot)?;
        // The file's name must survive a power loss too, from its first record on.
        dir.sync().map_err(cannot)?;
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
    /// ([`super::recent_writes`]): at [`OPEN_TXN_WRITES`] documents. This bounds what redb and the
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
        // Records are numbered without gaps, in the order they reach the log: replay applies
        // the records after the number the redb file holds, and stops at a gap.
        debug_assert_eq!(
            record.number, self.next_number,
            "log record {} appended where {} is next",
            record.number, self.next_number
        );
        let bytes = record.seal();
        #[cfg(test)]
        if self.panic_appends {
            panic!("injected: a bug in the committer");
        }
        #[cfg(test)]
        if self.fail_appends {
            // Half the record reaches the file, as when the disk fills mid-write.
            self.file.append(&bytes[..bytes.len() / 2])?;
            return Err(std::io::Error::other("injected: the disk is full"));
        }
        self.file.append(bytes)?;
        // The durability point of every write the group made: nothing of it is visible or
        // answered before this returns.
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
    /// emptying not reach the disk (a power cut before the sync), the records left are all at
    /// or below the number the redb file holds: replay skips them, and the reader takes the
    /// ones after the records appended since for what they are ([`read_records`]). An error
    /// stops the store's writes all the same, as any I/O error does.
    pub(super) fn checkpointed(&mut self) -> std::io::Result<()> {
        self.last_checkpoint = Instant::now();
        if self.bytes == 0 {
            return Ok(());
        }
        self.file.empty()?;
        self.file.sync_all()?;
        self.bytes = 0;
        Ok(())
    }
}

/// The records of a log's content to replay over a file holding every record up to
/// `applied`, in order, as `(number, writes)`.
///
/// Records are appended one at a time, each synced before the next, and an append changes no
/// byte before it (powersafe overwrite, see [`super::disk`]): the log is the run of whole,
/// consecutively numbered records from its start.
/// What follows the run is the tail of a crash (an append never acknowledged: torn, or
/// partly written, or zeros) or records older than `applied` left by an emptying that did
/// not reach the disk. But a whole record numbered after both the run and `applied`, further
/// on, was acknowledged: the log is damaged before it, and opening fails rather than skip it
/// (the log is left as it is for a person to look at). So does a record whose checksums hold
/// but which does not parse (another version wrote it).
pub(super) fn read_records(
    content: &[u8],
    applied: u64,
) -> StoreResult<Vec<(u64, Vec<LoggedWrite<'_>>)>> {
    refuse_old_format(content)?;
    let mut records = Vec::new();
    let mut at = 0;
    let mut last = None;
    while let Some((number, body, end)) = record_at(content, at) {
        if last.is_some_and(|last| number != last + 1) {
            break;
        }
        let writes = decode_writes(body).ok_or_else(|| {
            StoreError::Permanent(format!(
                "embedded store: the write-ahead log's record at byte {at} does not parse"
            ))
        })?;
        records.push((number, writes));
        last = Some(number);
        at = end;
    }
    if at < content.len() {
        let newest = last.unwrap_or(0).max(applied);
        if let Some((later, number)) = newer_record_after(content, at, newest) {
            return Err(StoreError::Permanent(format!(
                "embedded store: the write-ahead log is damaged at byte {at}: record {number} \
                 at byte {later} follows, acknowledged; {LOG_FILE_NAME} is left as it is"
            )));
        }
        if content[at..].iter().any(|&b| b != 0) {
            tracing::warn!(
                at,
                ignored_bytes = content.len() - at,
                "embedded store: the write-ahead log ends in a record that is not whole (a \
                 crash while it was written: never acknowledged) or in records a checkpoint \
                 had applied"
            );
        }
    }
    Ok(records)
}

/// The whole record starting at byte `at`: its number, body, and where the next one starts.
fn record_at(content: &[u8], at: usize) -> Option<(u64, &[u8], usize)> {
    let header: &[u8; HEADER] = content.get(at..)?.first_chunk()?;
    let field = |range: std::ops::Range<usize>| &header[range];
    let u32_at = |start: usize| u32::from_le_bytes(field(start..start + 4).try_into().unwrap());
    if field(0..4) != MAGIC || crc(field(0..20)) != u32_at(20) {
        return None;
    }
    let len = u32_at(4) as usize;
    let number = u64::from_le_bytes(field(8..16).try_into().unwrap());
    let body = content.get(at + HEADER..at + HEADER + len)?;
    (crc(body) == u32_at(16)).then_some((number, body, at + HEADER + len))
}

/// The first whole record from byte `from` on numbered after `newest`, and where it is.
fn newer_record_after(content: &[u8], from: usize, newest: u64) -> Option<(usize, u64)> {
    let starts = content[from..].windows(MAGIC.len()).enumerate();
    starts
        .filter(|(_, bytes)| *bytes == MAGIC)
        .find_map(|(offset, _)| match record_at(content, from + offset) {
            Some((number, ..)) if number > newest => Some((from + offset, number)),
            _ => None,
        })
}

/// Refuses a log written by a version before [`MAGIC`] (its records start with their length
/// and a checksum of it and the body): this version cannot read it, and must not take it for
/// a torn tail.
fn refuse_old_format(content: &[u8]) -> StoreResult<()> {
    let Some((header, rest)) = content.split_first_chunk::<8>() else {
        return Ok(());
    };
    let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
    let old_crc = u32::from_le_bytes(header[4..].try_into().unwrap());
    let whole_old_record = rest.get(..len).is_some_and(|body| {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&header[..4]);
        hasher.update(body);
        hasher.finalize() == old_crc
    });
    match whole_old_record && content[..4] != MAGIC {
        false => Ok(()),
        true => Err(StoreError::Permanent(format!(
            "embedded store: {LOG_FILE_NAME} was written by an earlier version of the service \
             and holds writes the database file may lack: start that version once on this \
             DATA_DIR (it replays the log), stop it, then start this one"
        ))),
    }
}

/// A record's writes; `None` if they do not parse.
fn decode_writes(body: &[u8]) -> Option<Vec<LoggedWrite<'_>>> {
    let mut rest = body;
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
    Some(writes)
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

    /// A record of one account write whose value is `size` bytes.
    fn record_of_size(number: u64, size: usize) -> Vec<u8> {
        let value = [&0u64.to_le_bytes()[..], &vec![b' '; size]].concat();
        record(number, &[(Index::Accounts, "a", &value)])
    }

    fn numbers_over(content: &[u8], applied: u64) -> Vec<u64> {
        let records = read_records(content, applied).expect("records");
        records.iter().map(|(number, _)| *number).collect()
    }

    fn numbers(content: &[u8]) -> Vec<u64> {
        numbers_over(content, 0)
    }

    fn assert_damaged(content: &[u8], applied: u64) {
        let read = read_records(content, applied);
        assert!(
            matches!(&read, Err(StoreError::Permanent(e)) if e.contains("damaged")),
            "{:?}",
            read.map(|records| records.len())
        );
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
        let records = read_records(&content, 0).unwrap();
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
        let first = record_of_size(1, 100);
        let second = record_of_size(2, 5000);
        let content = [first.clone(), second.clone()].concat();
        let whole =
            |record: &[u8]| HEADER + u32::from_le_bytes(record[4..8].try_into().unwrap()) as usize;
        let second_ends = first.len() + whole(&second);
        for cut in 0..content.len() {
            let expected: &[u64] = match cut {
                c if c < whole(&first) => &[],
                c if c < second_ends => &[1],
                _ => &[1, 2],
            };
            assert_eq!(numbers(&content[..cut]), expected, "cut at byte {cut}");
        }
        assert_eq!(numbers(&content), [1, 2]);
    }

    #[test]
    fn a_last_record_damaged_anywhere_ends_the_log() {
        let first = record_of_size(1, 10);
        let second = record_of_size(2, 10);
        for flipped in first.len()..first.len() + HEADER + 30 {
            let mut content = [first.clone(), second.clone()].concat();
            content[flipped] ^= 0x40;
            assert_eq!(numbers(&content), [1], "byte {flipped} flipped");
        }
    }

    #[test]
    fn zeros_after_the_last_record_end_the_log() {
        let first = record_of_size(1, 10);
        for zeros in [1, HEADER, 4096, 3 * 4096 + 5] {
            let content = [first.clone(), vec![0; zeros]].concat();
            assert_eq!(numbers(&content), [1], "{zeros} zeros");
        }
        let torn = record_of_size(2, 10);
        let zero_filled = [&torn[..HEADER + 3], &vec![0; 64][..]].concat();
        assert_eq!(numbers(&[first.clone(), zero_filled].concat()), [1]);
    }

    #[test]
    fn a_last_append_whose_first_sector_was_lost_while_later_ones_persisted_ends_the_log() {
        let first = record_of_size(1, 10);
        let mut second = record_of_size(2, 3 * 4096);
        second[..512].fill(0);
        assert_eq!(numbers(&[first.clone(), second.clone()].concat()), [1]);
        // Or garbage, as a file's new end may hold after a crash.
        second[..512].fill(0xa5);
        assert_eq!(numbers(&[first, second].concat()), [1]);
    }

    #[test]
    fn a_damaged_record_followed_by_a_newer_whole_one_is_an_error_not_an_end() {
        let records: Vec<Vec<u8>> = (1..=3).map(|n| record_of_size(n, 10)).collect();
        let second = records[0].len();
        // In the second record's body, its length, its number, its checksums.
        for flipped in [HEADER + 2, 4, 5, 9, 17, 21] {
            let mut content = records.concat();
            content[second + flipped] ^= 0x01;
            assert_damaged(&content, 0);
        }
        // The first record lost, the second and third whole: they are acknowledged.
        let mut content = records.concat();
        content[..second].fill(0);
        assert_damaged(&content, 0);
    }

    #[test]
    fn records_a_checkpoint_applied_left_behind_newer_ones_end_the_log() {
        // Records 1-3 were applied and the log emptied, but the emptying did not reach the
        // disk: record 4, appended since, lies over the start of what was there.
        let old: Vec<u8> = (1..=3).flat_map(|n| record_of_size(n, 10)).collect();
        let mut content = old.clone();
        let fourth = record_of_size(4, 10);
        content[..fourth.len()].copy_from_slice(&fourth);
        assert_eq!(numbers_over(&content, 3), [4]);
        // None appended since: replay skips them all.
        assert_eq!(numbers_over(&old, 3), [1, 2, 3]);
    }

    #[test]
    fn a_checksummed_record_that_does_not_parse_is_an_error_not_a_skip() {
        let mut unknown = LogRecord::new(1);
        unknown
            .bytes
            .extend_from_slice(&[5, b'o', b't', b'h', b'e', b'r']);
        let content = unknown.seal().to_vec();
        assert!(matches!(
            read_records(&content, 0),
            Err(StoreError::Permanent(_))
        ));
    }

    #[test]
    fn a_log_of_the_earlier_format_is_refused_not_taken_for_a_torn_tail() {
        let body = [&1u64.to_le_bytes()[..], b"\x08accounts"].concat();
        let len = (body.len() as u32).to_le_bytes();
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&len);
        hasher.update(&body);
        let content = [&len[..], &hasher.finalize().to_le_bytes(), &body].concat();
        let read = read_records(&content, 0);
        assert!(
            matches!(&read, Err(StoreError::Permanent(e)) if e.contains("earlier version")),
            "{:?}",
            read.map(|r| r.len())
        );
    }
}

#[cfg(test)]
mod checkpoint_tests {
    use super::*;

    fn data_dir(dir: &tempfile::TempDir) -> super::super::disk::OsDataDir {
        super::super::disk::OsDataDir::create(dir.path()).expect("data dir")
    }

    /// A log whose last checkpoint was `ago`, checkpointing every second.
    fn log_checkpointed(ago: Duration) -> (tempfile::TempDir, Wal) {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut log, _) = Wal::open(&data_dir(&dir), Duration::from_secs(1)).unwrap();
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
            let (mut log, _) = Wal::open(&data_dir(&dir), interval).unwrap();
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
