//! A simulated disk under the store's files, for the power-loss tests: for each file, what
//! the page cache holds (what reads see), what is durable, and the writes not synced since.
//!
//! - **A power cut** ([`DiskState::power_cut`]) keeps the durable image plus any subset of
//!   the unsynced sectors, each as it was after any of the writes to it since the last sync
//!   (writeback is in no particular order); it may tear one of them (each byte old or new:
//!   a byte is written whole, and a write changes nothing outside its range, "powersafe
//!   overwrite", which redb assumes too); a file that grew may come back at its old size or
//!   its new one, the new part zeros or garbage where nothing reached it; a file whose name
//!   the directory has not synced may be gone.
//! - **`sync_data`** makes the writes durable and the length when it grew; a shrink
//!   (emptying the log) is durable only once `sync_all` returns (`fdatasync` need not write
//!   metadata that reading the data does not need).
//! - **A failed sync** ([`DiskState::fail_syncs`]) returns `EIO` and forgets the unsynced
//!   writes: the cache keeps them, marked clean, and no later sync writes them
//!   ("fsyncgate"); [`DataDir::drop_cache`] brings the cache back to what the disk holds.
//!
//! Every operation is kept in a trace, with the workload's marks between them, so that a
//! test can rebuild the disk as it was after any prefix ([`DiskState::replay`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::Rng;

use super::super::disk::{DataDir, DatabaseFile, LogFile};

/// The unit a power cut keeps or loses whole (or tears).
pub(super) const SECTOR: usize = 512;

/// The store's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FileId {
    Database,
    NewDatabase,
    Log,
    Stopped,
}

impl FileId {
    const ALL: [FileId; 4] = [
        FileId::Database,
        FileId::NewDatabase,
        FileId::Log,
        FileId::Stopped,
    ];

    fn slot(self) -> usize {
        self as usize
    }
}

/// One operation on the disk, or a mark the workload left between them.
#[derive(Clone)]
pub(super) enum DiskOp {
    Create(FileId),
    Remove(FileId),
    /// The new database takes the database's name.
    Install,
    Write(FileId, u64, Vec<u8>),
    SetLen(FileId, u64),
    SyncData(FileId),
    SyncAll(FileId),
    /// A sync that returned `EIO`.
    FailedSync(FileId),
    SyncDir,
    DropCache,
    /// The workload's next step was answered `Ok`.
    Answered,
}

impl std::fmt::Debug for DiskOp {
    /// Writes by where they land and their length, not their bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiskOp::Write(id, offset, data) => {
                write!(f, "Write({id:?}, {} bytes at {offset})", data.len())
            }
            DiskOp::Create(id) => write!(f, "Create({id:?})"),
            DiskOp::Remove(id) => write!(f, "Remove({id:?})"),
            DiskOp::Install => write!(f, "Install"),
            DiskOp::SetLen(id, len) => write!(f, "SetLen({id:?}, {len})"),
            DiskOp::SyncData(id) => write!(f, "SyncData({id:?})"),
            DiskOp::SyncAll(id) => write!(f, "SyncAll({id:?})"),
            DiskOp::FailedSync(id) => write!(f, "FailedSync({id:?})"),
            DiskOp::SyncDir => write!(f, "SyncDir"),
            DiskOp::DropCache => write!(f, "DropCache"),
            DiskOp::Answered => write!(f, "Answered"),
        }
    }
}

/// A write or a length change not synced yet.
#[derive(Clone, Debug)]
enum Unsynced {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

/// One file of the simulated disk.
#[derive(Clone, Debug, Default)]
struct SimFile {
    exists: bool,
    /// Whether the directory's durable entries name it.
    durable_exists: bool,
    cache: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<Unsynced>,
}

fn apply(content: &mut Vec<u8>, change: &Unsynced) {
    match change {
        Unsynced::Write(offset, data) => {
            let (start, end) = (*offset as usize, *offset as usize + data.len());
            if content.len() < end {
                content.resize(end, 0);
            }
            content[start..end].copy_from_slice(data);
        }
        Unsynced::SetLen(len) => content.resize(*len as usize, 0),
    }
}

impl SimFile {
    /// The durable image with every unsynced change applied: what the cache would hold had
    /// no sync failed.
    fn written(&self) -> Vec<u8> {
        let mut content = self.durable.clone();
        for change in &self.unsynced {
            apply(&mut content, change);
        }
        content
    }

    fn change(&mut self, change: Unsynced) {
        apply(&mut self.cache, &change);
        self.unsynced.push(change);
    }

    fn sync(&mut self, all: bool) {
        let written = self.written();
        if all || written.len() >= self.durable.len() {
            self.durable = written;
            self.unsynced.clear();
        } else {
            // The shrink stays unsynced; the data below it is durable.
            let len = written.len();
            self.durable[..len].copy_from_slice(&written);
            self.unsynced = vec![Unsynced::SetLen(len as u64)];
        }
    }

    /// What a power cut leaves of the file (see the module's comment).
    fn cut(&self, rng: &mut StdRng) -> SimFile {
        let exists = match self.exists == self.durable_exists {
            true => self.exists,
            false => rng.random(),
        };
        if !exists {
            return SimFile::default();
        }
        let mut image = self.durable.clone();
        let written = self.written();
        let len = match rng.random_bool(0.5) {
            true => written.len(),
            false => self.durable.len(),
        };
        let garbage_fill = rng.random_bool(0.5);
        if len > image.len() {
            let old = image.len();
            image.resize(len, 0);
            if garbage_fill {
                rng.fill(&mut image[old..]);
            }
        }
        image.truncate(len);
        // Each unsynced sector: as it was after one of its writes, or not written at all.
        let mut versions: BTreeMap<usize, Vec<Vec<u8>>> = BTreeMap::new();
        let mut shadow = self.durable.clone();
        for change in &self.unsynced {
            apply(&mut shadow, change);
            if let Unsynced::Write(offset, data) = change {
                let first = *offset as usize / SECTOR;
                let last = (*offset as usize + data.len()).div_ceil(SECTOR);
                for sector in first..last {
                    let range = sector * SECTOR..((sector + 1) * SECTOR).min(shadow.len());
                    versions
                        .entry(sector)
                        .or_default()
                        .push(shadow[range].to_vec());
                }
            }
        }
        let keep = rng.random_range(0.0..=1.0);
        let mut persisted = Vec::new();
        for (sector, versions) in versions {
            let start = sector * SECTOR;
            if start >= image.len() || !rng.random_bool(keep) {
                continue;
            }
            let version = &versions[rng.random_range(0..versions.len())];
            let end = (start + version.len()).min(image.len());
            persisted.push((start, image[start..end].to_vec()));
            image[start..end].copy_from_slice(&version[..end - start]);
        }
        if !persisted.is_empty() && rng.random_bool(0.5) {
            // Torn: each byte the write changed is old or new.
            let (start, before) = &persisted[rng.random_range(0..persisted.len())];
            for (byte, old) in image[*start..].iter_mut().zip(before) {
                if rng.random_bool(0.5) {
                    *byte = *old;
                }
            }
        }
        SimFile {
            exists: true,
            durable_exists: true,
            cache: image.clone(),
            durable: image,
            unsynced: Vec::new(),
        }
    }
}

/// The whole disk: its files, the trace, and which syncs are to fail.
#[derive(Clone, Debug, Default)]
pub(super) struct DiskState {
    files: [SimFile; 4],
    pub(super) trace: Vec<DiskOp>,
    syncs: usize,
    /// The numbers (from 0, in the order they come) of the syncs that fail.
    fail_syncs: BTreeSet<usize>,
}

impl DiskState {
    /// The database file's length, as reads see it.
    pub(super) fn database_len(&self) -> usize {
        self.files[FileId::Database.slot()].cache.len()
    }

    /// A blank disk whose `failing`th sync (from 0) fails.
    pub(super) fn failing_sync(failing: usize) -> DiskState {
        DiskState {
            fail_syncs: [failing].into(),
            ..DiskState::default()
        }
    }

    fn file(&mut self, id: FileId) -> &mut SimFile {
        &mut self.files[id.slot()]
    }

    /// Applies `ops` in turn, as [`DiskState::replay_one`] does each.
    pub(super) fn replay(&mut self, ops: &[DiskOp]) {
        for op in ops {
            self.replay_one(op);
        }
    }

    /// The disk after `ops`, from a blank one.
    /// Applies one operation of another disk's trace (its failed syncs fail again).
    pub(super) fn replay_one(&mut self, op: &DiskOp) {
        let _ = self.change(op);
    }

    /// Applies `op` and records it; `Err` for a sync that fails.
    fn apply(&mut self, op: DiskOp) -> io::Result<()> {
        let mut op = op;
        if let DiskOp::SyncData(id) | DiskOp::SyncAll(id) = op {
            self.syncs += 1;
            if self.fail_syncs.contains(&(self.syncs - 1)) {
                op = DiskOp::FailedSync(id);
            }
        }
        let result = self.change(&op);
        self.trace.push(op);
        result
    }

    fn change(&mut self, op: &DiskOp) -> io::Result<()> {
        match op {
            DiskOp::Create(id) => self.file(*id).exists = true,
            DiskOp::Remove(id) => {
                *self.file(*id) = SimFile {
                    durable_exists: self.file(*id).durable_exists,
                    durable: self.file(*id).durable.clone(),
                    ..SimFile::default()
                }
            }
            DiskOp::Write(id, offset, data) => self
                .file(*id)
                .change(Unsynced::Write(*offset, data.clone())),
            DiskOp::SetLen(id, len) => self.file(*id).change(Unsynced::SetLen(*len)),
            DiskOp::SyncData(id) => self.file(*id).sync(false),
            DiskOp::SyncAll(id) => self.file(*id).sync(true),
            DiskOp::FailedSync(id) => {
                self.file(*id).unsynced.clear();
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            DiskOp::Install => {
                // A rename: durable once the directory is synced.
                let new = std::mem::take(self.file(FileId::NewDatabase));
                self.file(FileId::NewDatabase).durable_exists = new.durable_exists;
                let old = self.file(FileId::Database);
                *old = SimFile {
                    durable_exists: old.durable_exists,
                    ..new
                };
            }
            DiskOp::SyncDir => {
                for file in &mut self.files {
                    file.durable_exists = file.exists;
                }
            }
            DiskOp::DropCache => {
                for id in [FileId::Database, FileId::NewDatabase, FileId::Log] {
                    let file = self.file(id);
                    file.cache = file.written();
                }
            }
            DiskOp::Answered => {}
        }
        Ok(())
    }

    /// The disk as a power cut leaves it, booted again: the cache is what the disk holds.
    pub(super) fn power_cut(&self, rng: &mut StdRng) -> DiskState {
        DiskState {
            files: FileId::ALL.map(|id| self.files[id.slot()].cut(rng)),
            ..DiskState::default()
        }
    }
}

/// A handle on a simulated disk, shared by the store's files.
#[derive(Clone, Debug, Default)]
pub(super) struct SimDisk(pub(super) Arc<Mutex<DiskState>>);

impl SimDisk {
    pub(super) fn new(state: DiskState) -> Self {
        Self(Arc::new(Mutex::new(state)))
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, DiskState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn apply(&self, op: DiskOp) -> io::Result<()> {
        self.state().apply(op)
    }

    /// Leaves a mark in the trace: the workload's next step was answered `Ok`.
    pub(super) fn answered(&self) {
        self.state().trace.push(DiskOp::Answered);
    }

    fn read(&self, id: FileId) -> Vec<u8> {
        self.state().files[id.slot()].cache.clone()
    }

    fn exists(&self, id: FileId) -> bool {
        self.state().files[id.slot()].exists
    }

    fn create_if_missing(&self, id: FileId) -> io::Result<()> {
        match self.exists(id) {
            true => Ok(()),
            false => self.apply(DiskOp::Create(id)),
        }
    }

    /// A database file, for redb (created if missing, as `redb::Builder::create` does).
    pub(super) fn database(&self, file: DatabaseFile) -> SimDatabase {
        let id = match file {
            DatabaseFile::Current => FileId::Database,
            DatabaseFile::New => FileId::NewDatabase,
        };
        self.create_if_missing(id)
            .expect("creating a file cannot fail");
        SimDatabase(self.clone(), id)
    }
}

impl DataDir for SimDisk {
    fn database_exists(&self) -> io::Result<bool> {
        Ok(self.exists(FileId::Database))
    }

    fn discard_new_database(&self) -> io::Result<()> {
        if self.exists(FileId::NewDatabase) {
            self.apply(DiskOp::Remove(FileId::NewDatabase))?;
        }
        Ok(())
    }

    fn install_new_database(&self) -> io::Result<()> {
        self.apply(DiskOp::Install)?;
        self.apply(DiskOp::SyncDir)
    }
    fn open_log(&self) -> io::Result<Box<dyn LogFile>> {
        self.create_if_missing(FileId::Log)?;
        Ok(Box::new(SimLog(self.clone())))
    }

    fn sync(&self) -> io::Result<()> {
        self.apply(DiskOp::SyncDir)
    }

    fn stopped_reason(&self) -> io::Result<Option<String>> {
        Ok(self
            .exists(FileId::Stopped)
            .then(|| String::from_utf8_lossy(&self.read(FileId::Stopped)).into_owned()))
    }

    fn record_stopped(&self, reason: &str) -> io::Result<()> {
        self.create_if_missing(FileId::Stopped)?;
        self.apply(DiskOp::SetLen(FileId::Stopped, 0))?;
        self.apply(DiskOp::Write(
            FileId::Stopped,
            0,
            reason.as_bytes().to_vec(),
        ))?;
        self.apply(DiskOp::SyncAll(FileId::Stopped))?;
        self.apply(DiskOp::SyncDir)
    }

    fn clear_stopped(&self) -> io::Result<()> {
        if self.exists(FileId::Stopped) {
            self.apply(DiskOp::Remove(FileId::Stopped))?;
            self.apply(DiskOp::SyncDir)?;
        }
        Ok(())
    }

    fn drop_cache(&self) -> io::Result<()> {
        self.apply(DiskOp::DropCache)
    }
}

/// The log on the simulated disk.
#[derive(Debug)]
struct SimLog(SimDisk);

impl LogFile for SimLog {
    fn read_all(&mut self) -> io::Result<Vec<u8>> {
        Ok(self.0.read(FileId::Log))
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let end = self.0.state().files[FileId::Log.slot()].cache.len() as u64;
        self.0
            .apply(DiskOp::Write(FileId::Log, end, bytes.to_vec()))
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.apply(DiskOp::SyncData(FileId::Log))
    }

    fn empty(&mut self) -> io::Result<()> {
        self.0.apply(DiskOp::SetLen(FileId::Log, 0))
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.0.apply(DiskOp::SyncAll(FileId::Log))
    }
}

/// The database file on the simulated disk, as redb's storage.
#[derive(Debug)]
pub(super) struct SimDatabase(SimDisk, FileId);

impl redb::StorageBackend for SimDatabase {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.state().files[self.1.slot()].cache.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let state = self.0.state();
        let cache = &state.files[self.1.slot()].cache;
        let range = offset as usize..offset as usize + out.len();
        let bytes = cache
            .get(range)
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        out.copy_from_slice(bytes);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.apply(DiskOp::SetLen(self.1, len))
    }

    /// `fsync`, as the store's database backend syncs (`disk::DatabaseBackend`): with
    /// `fdatasync` a shrink could stay undone under the header that names it.
    fn sync_data(&self) -> io::Result<()> {
        self.0.apply(DiskOp::SyncAll(self.1))
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.apply(DiskOp::Write(self.1, offset, data.to_vec()))
    }
}
