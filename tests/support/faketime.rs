//! A process whose wall clock is offset, for real: libfaketime (the Debian package
//! `faketime`) preloaded into it with `LD_PRELOAD`. Only the wall clock moves:
//! `FAKETIME_DONT_FAKE_MONOTONIC=1` leaves `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` (what lease
//! deadlines are kept on) untouched, as on a host whose NTP has not caught up.
//!
//! The library is `FAKETIME_LIB` when set, else the first `libfaketime.so.1` found where
//! Debian and `make install` put it. Without it a test skips, saying so, except under CI
//! (`CI` set), where it fails: there the package is installed (`.ci/run`), so a missing
//! library is a broken setup, not a reason to pass.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The library, if this machine has it. A `FAKETIME_LIB` that names no file is an error.
pub fn library() -> Option<PathBuf> {
    if let Some(set) = std::env::var_os("FAKETIME_LIB") {
        let path = PathBuf::from(set);
        assert!(
            path.is_file(),
            "FAKETIME_LIB={} is not a file",
            path.display()
        );
        return Some(path);
    }
    candidates().into_iter().find(|p| p.is_file())
}

/// Where the library is installed: Debian's multiarch directories, then `make install`'s.
fn candidates() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("faketime/libfaketime.so.1"))
        .collect();
    found.sort();
    found.push("/usr/lib/faketime/libfaketime.so.1".into());
    found.push("/usr/local/lib/faketime/libfaketime.so.1".into());
    found
}

/// The library, or `None` after saying loudly why `test` skips; panics under CI.
pub fn library_or_skip(test: &str) -> Option<PathBuf> {
    let found = library();
    if found.is_none() {
        super::skip::or_fail_under_ci(
            test,
            "libfaketime is not installed (apt-get install faketime, or set FAKETIME_LIB)",
        );
    }
    found
}

/// The environment that starts a process with its wall clock `offset` (whole seconds) ahead.
pub fn wall_clock_ahead(library: &Path, offset: Duration) -> Vec<(&'static str, String)> {
    assert_eq!(offset.subsec_nanos(), 0, "whole seconds: {offset:?}");
    vec![
        ("LD_PRELOAD", library.display().to_string()),
        ("FAKETIME", format!("+{}s", offset.as_secs())),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ]
}

/// How far ahead of this process's wall clock `stamp` (RFC 3339, written by another process
/// between `before` and `after` by this process's clock) is: at least and at most.
pub fn offset_of(stamp: &str, before: SystemTime, after: SystemTime) -> (i64, i64) {
    let written = humantime::parse_rfc3339(stamp)
        .unwrap_or_else(|e| panic!("{stamp:?} is not RFC 3339: {e}"));
    let millis = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis() as i64
    };
    (
        millis(written) - millis(after),
        millis(written) - millis(before),
    )
}
