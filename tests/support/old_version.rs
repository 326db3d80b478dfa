//! The service as an older commit of this repository built it, for the upgrade tests
//! (`tests/process/rolling_upgrade.rs`, `tests/process/embedded_upgrade.rs`): its sources are
//! taken from git (`git archive`) into `target/old-version/<commit>/src` and built there, its
//! binary copied to `target/old-version/<commit>/transfer-service`. Every older commit builds
//! in one target directory of their own, `target/old-version/target` (`cargo build` would
//! wait on this build's lock in `target/`), so the dependencies they share are built once.
//! The first run builds each (a few minutes on two cores for the first); later runs reuse
//! them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use super::skip;

/// Where the document forms change, the commit this round started from: accounts keep
/// tombstones, entries carry no marks (`docs/design.md` §9, "The fence").
pub const BEFORE_MARKS: &str = "1f9c7dc714b716527e3d278571340fbf1b1bb03a";

/// The last version whose embedded store kept the statements' index keyed by a tuple
/// (`tx_entries`), which redb opens under that key type only.
pub const TUPLE_KEYED_STATEMENTS: &str = "6df5583e7dd1fe71af5298230e1322bed3a6c70c";

/// The last version whose embedded store kept the statements' index a row per entry
/// (`statement_entries`), before it was kept in blocks of seqs.
pub const ROW_KEYED_STATEMENTS: &str = "8173fe6bb71c3c6a9bfc62ffc6067f12eb6039d6";

/// The `transfer-service` binary built from `commit`, or `None` (said loudly) when this
/// clone does not hold that commit (a shallow clone).
pub fn binary(commit: &str) -> Option<PathBuf> {
    // One build at a time in this process; a second caller finds it built.
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target/old-version").join(commit);
    let bin = dir.join("transfer-service");
    if bin.is_file() {
        return Some(bin);
    }
    if !holds_commit(root, commit) {
        eprintln!(
            "\n*** SKIPPED: the rolling upgrade from {commit}: this clone does not hold that \
             commit (shallow: `git fetch --unshallow`) ***\n"
        );
        return None;
    }
    let src = dir.join("src");
    if !src.join("Cargo.toml").is_file() {
        extract(root, commit, &src);
    }
    let target = root.join("target/old-version/target");
    let built = Command::new(env!("CARGO"))
        .args(["build", "--bin", "transfer-service"])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("run cargo");
    assert!(built.success(), "building {commit} failed");
    // Copied beside, then renamed: a copy cut short never passes for the binary.
    let partial = bin.with_extension("partial");
    std::fs::copy(target.join("debug/transfer-service"), &partial).expect("copy the binary");
    std::fs::rename(&partial, &bin).expect("move the binary in place");
    Some(bin)
}

fn holds_commit(root: &Path, commit: &str) -> bool {
    if !skip::on_path("git") {
        skip::or_fail_under_ci("the rolling-upgrade test", "`git` is not on the PATH");
        return false;
    }
    Command::new("git")
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .current_dir(root)
        .status()
        .is_ok_and(|s| s.success())
}

/// The commit's tree into `src` (written beside it first, then renamed, so that a build
/// interrupted halfway never leaves a partial tree that looks whole).
fn extract(root: &Path, commit: &str, src: &Path) {
    let partial = src.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).expect("create the source directory");
    let archive = Command::new("git")
        .args(["archive", "--format=tar", commit])
        .current_dir(root)
        .output()
        .expect("git archive");
    assert!(archive.status.success(), "git archive {commit} failed");
    let mut tar = Command::new("tar")
        .args(["-x", "-C"])
        .arg(&partial)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run tar");
    std::io::Write::write_all(tar.stdin.as_mut().unwrap(), &archive.stdout).expect("to tar");
    drop(tar.stdin.take());
    assert!(tar.wait().expect("tar").success(), "tar failed");
    let _ = std::fs::remove_dir_all(src);
    std::fs::rename(&partial, src).expect("move the sources in place");
}
