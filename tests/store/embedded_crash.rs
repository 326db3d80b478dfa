//! The embedded store under kill -9: a child process writes documents from several tasks and
//! prints each id once the store acknowledged it; the parent kills the child with SIGKILL
//! mid-stream, reopens the file and finds every acknowledged document, intact, at the version
//! it was acknowledged with. Between checkpoints an acknowledged write is in the write-ahead log
//! only, so this is also the test of its replay.
//!
//! The child is this same test binary, re-run on the `embedded_crash::child_writer` test with
//! `CRASH_CHILD_DIR` set (without it, that test does nothing).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use transfer_service::store::embedded::EmbeddedStore;
use transfer_service::store::{Index, Store, WriteOutcome};

const CHILD_ENV: &str = "CRASH_CHILD_DIR";

/// The child's test, by its full name in this binary.
const CHILD_TEST: &str = "embedded_crash::child_writer";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return; // only meaningful as the child of acknowledged_writes_survive_sigkill
    };
    let round = std::env::var("CRASH_CHILD_ROUND").unwrap_or_default();
    let store = Arc::new(EmbeddedStore::open(dir.as_ref()).expect("open"));
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let store = store.clone();
        let round = round.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let id = format!("r{round}-{worker}-{i}");
                let body = json!({ "worker": worker, "i": i, "pad": "x".repeat(200) });
                match store.create(Index::Accounts, &id, body.into()).await {
                    Ok(WriteOutcome::Written(v)) => println!("ACK {id} {}", v.seq_no),
                    other => panic!("write failed: {other:?}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// The id and `seq_no` of an `ACK <id> <seq_no>` line.
fn acknowledged(rest: &str) -> (String, u64) {
    let (id, seq_no) = rest.split_once(' ').unwrap();
    (id.to_owned(), seq_no.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..3 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .env("CRASH_CHILD_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().unwrap();
        let mut acked = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut lines = BufReader::new(stdout).lines();
        // Kill after a few hundred acknowledgements, at a point we do not choose.
        while acked.len() < 300 + round * 97 {
            assert!(Instant::now() < deadline, "child wrote too slowly");
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(rest) = line.strip_prefix("ACK ") {
                        acked.push(acknowledged(rest));
                    }
                }
                _ => panic!("child ended early"),
            }
        }
        child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
        child.wait().unwrap();
        // Lines already printed before the kill are acknowledged too.
        for line in lines.map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("ACK ") {
                acked.push(acknowledged(rest));
            }
        }

        let store = EmbeddedStore::open(dir.path()).expect("reopen after kill -9");
        for (id, seq_no) in &acked {
            let doc = store
                .get(Index::Accounts, id)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("round {round}: acknowledged {id} lost"));
            assert_eq!(doc.version.seq_no, *seq_no, "round {round}: {id}'s version");
            let mut parts = id.split('-').skip(1);
            let (worker, i) = (parts.next().unwrap(), parts.next().unwrap());
            assert_eq!(
                doc.source.to_value().unwrap()["worker"],
                worker.parse::<u64>().unwrap()
            );
            assert_eq!(
                doc.source.to_value().unwrap()["i"],
                i.parse::<u64>().unwrap()
            );
            assert_eq!(
                doc.source.to_value().unwrap()["pad"]
                    .as_str()
                    .unwrap()
                    .len(),
                200
            );
        }
        // The next round's child appends to the same file.
        drop(store);
        eprintln!(
            "round {round}: {} acknowledged writes all present",
            acked.len()
        );
    }
}
