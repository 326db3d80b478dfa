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
    let entries = std::fs::read_dir(dir).unwrap();
    let mut paths: Vec<PathBuf> = entries.map(|entry| entry.unwrap().path()).collect();
    paths.sort();
    let mut files = Vec::new();
    for path in paths {
        let bytes = std::fs::read(&path).unwrap();
        files.push((path, bytes));
    }
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
    // Only its own: what serves, delivers or admits is no setting of an audit.
    for flag in [
        "--listen-addr",
        "--webhook-url",
        "--max-in-flight",
        "--lease-duration",
    ] {
        assert!(!help.contains(flag), "{flag} in:\n{help}");
    }
}

/// The binary with `env` set, and what it printed on standard error.
fn start_with(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_transfer-service"));
    command
        .env_remove("ELASTICSEARCH_URL")
        .env("DATA_DIR", dir.path())
        .env("LISTEN_ADDR", "127.0.0.1:0")
        .envs(env.iter().copied());
    let out = command.output().expect("run the binary");
    (out.status.code(), text(&out.stderr))
}

#[test]
fn a_setting_that_does_not_parse_stops_the_start_naming_it_its_value_and_an_example() {
    for (env, says) in [
        (
            ("LEASE_DURATION", "0s"),
            "`0s` is below the range: LEASE_DURATION is from 100ms to 1h, such as `30s`",
        ),
        (
            ("LEASE_DURATION", "abc"),
            "`abc` is not a duration: LEASE_DURATION is a number and a unit",
        ),
        (
            ("ADMISSION_WAIT", "fast"),
            "`fast` is not a duration: ADMISSION_WAIT is a number and a unit (ms, s, m, h, \
             days), from 0s to 10s, such as `100ms`",
        ),
        (
            ("RECOVERY_INTERVAL", "0s"),
            "`0s` is below the range: RECOVERY_INTERVAL",
        ),
        (
            ("LISTEN_ADDR", "localhost:8080"),
            "`localhost:8080` is not an IP address and a port: LISTEN_ADDR is `IP:port`",
        ),
    ] {
        let (code, stderr) = start_with(&[env]);
        assert_eq!(code, Some(2), "{env:?}: {stderr}");
        assert!(stderr.contains(says), "{env:?}: {stderr}");
        assert!(
            !stderr.contains("expected number at 0"),
            "{env:?}: {stderr}"
        );
    }
}

#[test]
fn each_duration_settings_row_states_its_range() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let doc = std::fs::read_to_string(path).expect("docs/configuration.md");
    for setting in transfer_service::config::duration_settings() {
        let row = doc
            .lines()
            .filter(|line| line.starts_with("| `"))
            .find(|line| {
                let first_cell = line.split(" | ").next().unwrap_or("");
                first_cell.contains(&format!("`{}`", setting.name))
            })
            .unwrap_or_else(|| panic!("no row for {}", setting.name));
        assert!(
            row.contains(&setting.range()),
            "{}'s row does not say `{}`: {row}",
            setting.name,
            setting.range()
        );
    }
}

#[test]
fn the_openapi_command_ends_quietly_when_its_reader_goes() {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_transfer-service"))
        .arg("openapi")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run transfer-service openapi");
    // `| head -c 100`: read a little, then close the pipe (the document is larger than the
    // pipe's buffer, so the writer is still writing).
    let mut first = [0u8; 100];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stderr), "", "nothing on standard error");
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
    app.open_accounts([("alice", 100), ("bob", 0)]).await;
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

/// Settings read by the libraries the service runs on, not flags of its own: the
/// configuration table lists them, `--help` cannot.
const LIBRARY_SETTINGS: &[&str] = &[
    "RUST_LOG",
    "_RJEM_MALLOC_CONF",
    // OpenTelemetry's standard variables, read by its SDK and `src/telemetry/traces.rs`.
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SDK_DISABLED",
];

/// The rows of the table under "## Settings" in docs/configuration.md: each environment
/// variable its first cell names (one row may name several), with the row's default cell.
fn configuration_table() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let doc = std::fs::read_to_string(path).expect("docs/configuration.md");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Settings"))
        .expect("a Settings section");
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        let default = cells.last().unwrap().trim().to_owned();
        for name in cells[0].split(", ") {
            rows.push((name.trim().trim_matches('`').to_owned(), default.clone()));
        }
    }
    rows
}

/// Each environment variable of `--help`, with its default if it has one.
fn help_settings() -> Vec<(String, Option<String>)> {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    let mut settings = Vec::new();
    for part in help.split("[env: ").skip(1) {
        let name: String = part
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || *c == '_')
            .collect();
        let default = part
            .split_once("[default: ")
            .filter(|(before, _)| !before.contains("\n      --"))
            .map(|(_, rest)| rest[..rest.find(']').unwrap()].to_owned());
        settings.push((name, default));
    }
    settings
}

#[test]
fn the_configuration_table_is_every_setting_of_help_with_its_default() {
    let table = configuration_table();
    let help = help_settings();
    let documented: Vec<&str> = table.iter().map(|(name, _)| name.as_str()).collect();
    for (name, default) in &help {
        let row = table.iter().find(|(n, _)| n == name);
        let Some((_, cell)) = row else {
            panic!("{name} is a setting (--help) missing from docs/configuration.md");
        };
        // A row of one setting with one default states it as `--help` does.
        if let (Some(default), false) = (default, cell.contains(',')) {
            assert!(
                cell.starts_with(&format!("`{default}`")),
                "{name}: docs/configuration.md says {cell}, --help says {default}"
            );
        }
    }
    for name in documented {
        assert!(
            help.iter().any(|(n, _)| n == name) || LIBRARY_SETTINGS.contains(&name),
            "docs/configuration.md lists {name}, which is no setting of --help"
        );
    }
}

/// `shards` grows Elasticsearch indices: on the embedded store it says there is nothing to
/// grow (exit 2) and touches nothing; without `--to` clap refuses it.
#[test]
fn shards_needs_elasticsearch_and_a_count() {
    let out = run(&["shards", "--to", "3"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("ELASTICSEARCH_URL is not set"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["shards"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--to"), "{}", text(&out.stderr));
    let out = run(&["shards", "--to", "0"]);
    assert_eq!(out.status.code(), Some(2));
}
