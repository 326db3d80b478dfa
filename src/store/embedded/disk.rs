//! The store's files as it writes them: `DATA_DIR` itself, the write-ahead log, the names in
//! the directory, and the note a run leaves when it stops writing. What a power cut can take
//! away is decided by the calls made through here, redb's included ([`DatabaseBackend`]); the
//! power-loss tests put a simulated disk behind the same traits.
//!
//! **What the store assumes of the disk** (redb assumes the same of its file, see its
//! design notes): a sync that returns `Ok` made the bytes written before it durable (flushes
//! are honoured, no disk cache lies about them), and a sync that fails may have lost them;
//! a byte is written whole or not at all; and "powersafe overwrite": a write changes no byte
//! outside its range, even if the power fails during it. So appending to the log never
//! damages the records before it, and the log needs no padding to sector boundaries.

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::Bound;
use std::path::{Path, PathBuf};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// File name of the note a run leaves in `DATA_DIR` when it stops writing (an I/O error, a
/// failed commit), read by the next start (docs/operations.md, "After an I/O error").
pub const STOPPED_FILE_NAME: &str = "transfer-service.stopped";

/// The database file while it is made: it takes its name, [`super::FILE_NAME`], only once
/// redb has written it whole and synced it, so that a power cut during the very first start
/// never leaves a file under that name that is not a database.
pub const NEW_DATABASE_FILE_NAME: &str = "transfer-service.redb.new";

/// Which of the two database files to open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DatabaseFile {
    /// The store's database, [`super::FILE_NAME`].
    Current,
    /// One being made, [`NEW_DATABASE_FILE_NAME`].
    New,
}

/// The database file as redb writes it: redb's own file backend, except that its syncs are
/// `fsync`, not `fdatasync`.
///
/// Why: redb shrinks the file after a commit that freed its end, syncs with `sync_data`, and
/// then writes a header (its shutdown flag clear) naming the shorter layout. Where
/// `fdatasync` leaves the shrink undone after a power cut (POSIX leaves metadata to the file
/// system; the power-loss tests assume the worst), that header lies over the longer file;
/// the next open rewrites the header's layout in place, with the flag still clear, and a cut
/// that tears that write (bytes old and new, which redb's design allows) leaves a layout
/// past the file's end: redb then refuses the file ("File truncated below stored layout";
/// `store::embedded::tests::power_loss`: one run in about twenty of its open-cut test, 10 of
/// 10 of the test made for it). With `fsync` the shorter length is durable before any header
/// names it. redb syncs only at checkpoints (the write-ahead log takes every group's sync), so
/// this costs a few syncs a second at most.
#[derive(Debug)]
pub(crate) struct DatabaseBackend {
    file: FileBackend,
    /// The same open file, for `fsync`.
    synced: File,
}

impl DatabaseBackend {
    /// Opens or creates the file at `path` as `redb::Builder::create` does.
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let synced = file.try_clone()?;
        let file = FileBackend::new(file).map_err(io::Error::other)?;
        Ok(Self { file, synced })
    }
}

impl StorageBackend for DatabaseBackend {
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.synced.sync_all()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write(offset, data)
    }

    fn close(&self) -> io::Result<()> {
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}

/// `DATA_DIR` as the store uses it.
pub(crate) trait DataDir: Send + Sync + Debug {
    /// Whether the store's database file exists.
    fn database_exists(&self) -> io::Result<bool>;
    /// Removes a new database a start left unfinished (it holds nothing yet).
    fn discard_new_database(&self) -> io::Result<()>;
    /// Gives the new database, written whole and synced, the store's name, durably.
    fn install_new_database(&self) -> io::Result<()>;
    /// The write-ahead log, created if it does not exist (its name is durable only once
    /// [`DataDir::sync`] returns).
    fn open_log(&self) -> io::Result<Box<dyn LogFile>>;
    /// Makes the directory's entries durable: the names of the files created in it.
    fn sync(&self) -> io::Result<()>;
    /// Why the last run stopped writing, if it did and could say so.
    fn stopped_reason(&self) -> io::Result<Option<String>>;
    /// Leaves `reason` for the next start, durably if the disk allows.
    fn record_stopped(&self, reason: &str) -> io::Result<()>;
    /// Removes the note once a start has put everything on disk again.
    fn clear_stopped(&self) -> io::Result<()>;
    /// Drops the page cache's clean copies of the store's files, so that the next reads come
    /// from the disk. After a failed `fsync` the kernel may keep the unwritten pages in its
    /// cache marked clean: a new process would read data the disk does not hold, build on
    /// it, and empty the log that still had it ("fsyncgate"). Dirty pages are kept (and
    /// written back later) as they should be.
    fn drop_cache(&self) -> io::Result<()>;
}

/// The write-ahead log's file.
pub(crate) trait LogFile: Send + Debug {
    /// Its whole content, from the start.
    fn read_all(&mut self) -> io::Result<Vec<u8>>;
    /// Writes `bytes` at the end.
    fn append(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// `fdatasync`: the bytes appended so far, and the length that reads them, are durable.
    fn sync_data(&mut self) -> io::Result<()>;
    /// Cuts the file to nothing (durable only after [`LogFile::sync_all`]).
    fn empty(&mut self) -> io::Result<()>;
    /// `fsync`: the file as it is now, its length included, is durable.
    fn sync_all(&mut self) -> io::Result<()>;
}

/// `DATA_DIR` on the real file system.
#[derive(Debug)]
pub(crate) struct OsDataDir {
    dir: PathBuf,
}

impl OsDataDir {
    /// `dir`, created if needed (with any missing parents) such that its name survives a
    /// power cut: the parent of each directory made is synced.
    pub(crate) fn create(dir: &Path) -> io::Result<Self> {
        create_durably(dir, &mut sync_dir)?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The path of `file`.
    pub(crate) fn database(&self, file: DatabaseFile) -> PathBuf {
        match file {
            DatabaseFile::Current => self.path(super::FILE_NAME),
            DatabaseFile::New => self.path(NEW_DATABASE_FILE_NAME),
        }
    }
}

/// Creates `dir` and its missing parents, then has `sync` make each new name durable: the
/// parent of every directory made, outermost first.
pub(crate) fn create_durably(
    dir: &Path,
    sync: &mut dyn FnMut(&Path) -> io::Result<()>,
) -> io::Result<()> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    std::fs::create_dir_all(dir)?;
    for made in missing.iter().rev() {
        let parent = match made.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        sync(parent)?;
    }
    Ok(())
}

/// `fsync` of a directory: the names created in it are durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl DataDir for OsDataDir {
    fn database_exists(&self) -> io::Result<bool> {
        self.path(super::FILE_NAME).try_exists()
    }

    fn discard_new_database(&self) -> io::Result<()> {
        match std::fs::remove_file(self.path(NEW_DATABASE_FILE_NAME)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn install_new_database(&self) -> io::Result<()> {
        let new = self.path(NEW_DATABASE_FILE_NAME);
        std::fs::rename(new, self.path(super::FILE_NAME))?;
        self.sync()
    }

    fn open_log(&self) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(self.path(super::LOG_FILE_NAME))?;
        Ok(Box::new(OsLogFile { file }))
    }

    fn sync(&self) -> io::Result<()> {
        sync_dir(&self.dir)
    }

    fn stopped_reason(&self) -> io::Result<Option<String>> {
        match std::fs::read(self.path(STOPPED_FILE_NAME)) {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn record_stopped(&self, reason: &str) -> io::Result<()> {
        let mut file = File::create(self.path(STOPPED_FILE_NAME))?;
        file.write_all(reason.as_bytes())?;
        file.sync_all()?;
        self.sync()
    }

    fn clear_stopped(&self) -> io::Result<()> {
        match std::fs::remove_file(self.path(STOPPED_FILE_NAME)) {
            Ok(()) => self.sync(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn drop_cache(&self) -> io::Result<()> {
        for name in [super::FILE_NAME, super::LOG_FILE_NAME] {
            match File::open(self.path(name)) {
                Ok(file) => drop_file_cache(&file)?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// `posix_fadvise(DONTNEED)` over the whole file: its clean cached pages are dropped.
fn drop_file_cache(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call; the advice reads no memory.
    let error = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    match error {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// The log on the real file system (opened to append: every write lands at the end).
#[derive(Debug)]
struct OsLogFile {
    file: File,
}

impl LogFile for OsLogFile {
    fn read_all(&mut self) -> io::Result<Vec<u8>> {
        let mut content = Vec::new();
        self.file.read_to_end(&mut content)?;
        Ok(content)
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn empty(&mut self) -> io::Result<()> {
        self.file.set_len(0)
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creating_the_data_dir_syncs_the_parent_of_every_directory_it_makes() {
        let root = tempfile::tempdir().expect("temp dir");
        let dir = root.path().join("a/b/c");
        std::fs::create_dir(root.path().join("a")).unwrap();
        let mut synced = Vec::new();
        create_durably(&dir, &mut |d| {
            synced.push(d.to_owned());
            Ok(())
        })
        .unwrap();
        assert!(dir.is_dir());
        assert_eq!(synced, [root.path().join("a"), root.path().join("a/b")]);
        // Nothing made, nothing to sync.
        synced.clear();
        create_durably(&dir, &mut |d| {
            synced.push(d.to_owned());
            Ok(())
        })
        .unwrap();
        assert!(synced.is_empty());
    }

    #[test]
    fn the_stopped_note_is_kept_until_cleared() {
        let root = tempfile::tempdir().expect("temp dir");
        let dir = OsDataDir::create(root.path()).unwrap();
        assert_eq!(dir.stopped_reason().unwrap(), None);
        dir.record_stopped("checkpoint failed: EIO").unwrap();
        let reason = dir.stopped_reason().unwrap();
        assert_eq!(reason.as_deref(), Some("checkpoint failed: EIO"));
        dir.clear_stopped().unwrap();
        assert_eq!(dir.stopped_reason().unwrap(), None);
        dir.clear_stopped().unwrap();
    }

    #[test]
    fn dropping_the_cache_of_missing_files_is_not_an_error() {
        let root = tempfile::tempdir().expect("temp dir");
        let dir = OsDataDir::create(root.path()).unwrap();
        dir.drop_cache().unwrap();
        std::fs::write(root.path().join(super::super::FILE_NAME), b"x").unwrap();
        dir.drop_cache().unwrap();
    }
}
