//! The command line: `--help` says what the service is; `transfer-service audit` takes its
//! settings after the subcommand, lists them in its `--help`, and only reads: a `DATA_DIR`
//! with no store is an error naming it, and nothing is created or changed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::app::{Backend, TestApp};

/// The service's binary with `args`, its settings only from them (none from the
/// environment of the test run).
fn run(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_transfer-service"));
    for name in ["DATA_DIR", "ELASTICSEARCH_URL", "LISTEN_ADDR"] {
        command.env_remove(name);
    }
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every file under `dir`, with its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn help_says_what_the_service_is_today() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    let first = help.lines().next().unwrap();
    assert!(
        first.contains("embedded store") && first.contains("Elasticsearch by two-phase commit"),
        "{first}"
    );
}

#[test]
fn audit_help_lists_its_settings() {
    let out = run(&["audit", "--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for flag in [
        "--data-dir",
        "--elasticsearch-url",
        "--audit-page-timeout",
        "--index-prefix",
    ] {
        assert!(help.contains(flag), "{flag} in:\n{help}");
    }
    assert!(help.contains("Reads only"), "{help}");
}

#[test]
fn audit_of_a_data_dir_without_a_store_fails_naming_it_and_creates_nothing() {
    let parent = tempfile::tempdir().unwrap();
    let missing = parent.path().join("nonexistent");
    let empty = parent.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for dir in [&missing, &empty] {
        let path = dir.to_str().unwrap();
        for out in [
            run(&["audit", "--data-dir", path]),
            run(&["--data-dir", path, "audit"]),
        ] {
            assert_eq!(out.status.code(), Some(2), "{out:?}");
            let stderr = text(&out.stderr);
            assert!(stderr.contains(path), "{stderr}");
            assert!(!text(&out.stdout).contains("OK"), "{out:?}");
        }
    }
    assert!(!missing.exists(), "the audit created the directory");
    assert!(
        files(&empty).is_empty(),
        "the audit wrote into the directory"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_reads_a_stopped_store_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let app = TestApp::spawn_with(Backend::Embedded, |config| config.data_dir = data.clone()).await;
    app.open_account("alice", 100).await;
    app.open_account("bob", 0).await;
    app.transfer_accepted("t-1", "alice", "bob", 30).await;
    app.settled("t-1").await;
    app.shutdown().await;
    // The store closes once the last of the service's tasks lets it go.
    let deadline = Instant::now() + Duration::from_secs(30);
    let out = loop {
        let out = run(&["audit", "--data-dir", data.to_str().unwrap()]);
        if !text(&out.stderr).contains("held by another process") {
            break out;
        }
        assert!(Instant::now() < deadline, "the store stayed held: {out:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let before = files(&data);
    let again = run(&["audit", "--data-dir", data.to_str().unwrap()]);
    for out in [&out, &again] {
        assert!(out.status.success(), "{out:?}");
        let report = text(&out.stdout);
        assert!(report.contains("OK: every invariant holds"), "{report}");
        assert!(report.contains("accounts: 2, transfers: 1"), "{report}");
    }
    assert_eq!(files(&data), before, "the audit changed the store's files");
}
