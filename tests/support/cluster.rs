//! Real Elasticsearch clusters for the tests, started by the repository's launcher
//! (`tools/es-cluster/run`: Elastic's server jars, N nodes in one JVM on 127.0.0.1).
//!
//! - [`shared`]: one single-node cluster per test binary, started on first use and shared by
//!   every `real_es` test of the binary (each test keeps to indices of its own prefix). It goes
//!   away with the test process: the launcher stops when its standard input closes.
//! - [`Cluster::start`]: a cluster of the test's own (several nodes, node settings), for the
//!   tests that stop nodes or shrink thread pools.
//!
//! `TEST_SEARCH_ENGINE=opensearch` makes every cluster started here an OpenSearch 2.19.6 one
//! (`tools/es-cluster/run --engine opensearch`): the same suites then run on OpenSearch
//! (`.ci/run` does so for the store suite, the HTTP contract, the kill -9 test of two instances
//! and the failover test; `docs/testing.md`). `TEST_SEARCH_ENGINE=opensearch3` makes it an
//! OpenSearch 3.9.0 one (`--engine opensearch3`, on Java 21+): `.ci/run` runs the partition
//! test on it where the machine has Java 21+.
//!
//! `ELASTICSEARCH_URL`, when set, names a cluster to use instead of the shared one. Without
//! `java` and `mvn` the real-cluster tests skip and say so, except under `CI=true`, where that
//! is a failure (`super::skip`): CI must run them.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::skip;

/// How long a cluster may take to build (first run: Maven's downloads) and become healthy.
const START_DEADLINE: Duration = Duration::from_secs(600);

/// A running cluster, stopped (every node, its data deleted) when dropped.
pub struct Cluster {
    /// Node 0's URL.
    pub url: String,
    /// Every node's URL, in node order.
    pub nodes: Vec<String>,
    control: Mutex<Control>,
}

struct Control {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

/// What a cluster is started with.
#[derive(Debug, Clone, Default)]
pub struct ClusterSpec {
    pub nodes: usize,
    /// Node settings (`key=value`) for every node.
    pub settings: Vec<String>,
}

impl Cluster {
    /// Starts a cluster as `spec` says and waits until it is healthy; `None` (having said why)
    /// where this machine cannot run one and the run is not CI's.
    pub fn start(spec: &ClusterSpec) -> Option<Cluster> {
        if !java_and_maven_present() {
            return None;
        }
        let mut command = Command::new(launcher());
        command.arg("--engine").arg(engine());
        command.arg("--nodes").arg(spec.nodes.max(1).to_string());
        for setting in &spec.settings {
            command.arg("--setting").arg(setting);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tools/es-cluster/run");
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("launcher stdout"));
        let url = read_value(&mut stdout, "ELASTICSEARCH_URL=");
        let nodes = read_value(&mut stdout, "ELASTICSEARCH_NODES=")
            .split(',')
            .map(str::to_owned)
            .collect();
        Some(Cluster {
            url,
            nodes,
            control: Mutex::new(Control {
                child,
                stdin,
                stdout,
            }),
        })
    }

    /// Stops node `i` (its data is kept), waiting until it is down.
    pub fn stop_node(&self, i: usize) {
        self.command(&format!("stop {i}"), &format!("stopped {i}"));
    }

    /// Starts node `i` again on its ports and data, waiting until the cluster is yellow or
    /// better with it.
    pub fn start_node(&self, i: usize) {
        self.command(&format!("start {i}"), &format!("started {i}"));
    }

    /// Cuts node `i` off from every other node, both ways (`docs/testing.md`, "Network
    /// faults").
    pub fn isolate(&self, i: usize, links: Links) {
        self.answered(&format!("isolate {i} {}", links.word()), "isolated");
    }

    /// Cuts every link between the nodes of `side` and those of `other`, both ways.
    pub fn partition(&self, side: &[usize], other: &[usize], links: Links) {
        let list = |nodes: &[usize]| {
            nodes
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let line = format!("partition {} {} {}", list(side), list(other), links.word());
        self.answered(&line, "partitioned");
    }

    /// Delays every message node `i` sends by `ms`.
    pub fn slow(&self, i: usize, ms: u64) {
        self.answered(&format!("slow {i} {ms}"), "slowed");
    }

    /// Clears every fault and waits (up to two minutes) until the cluster is green again.
    pub fn heal(&self) {
        self.answered("heal", "healed");
    }

    /// The node holding `index`'s primary, as the majority sees it.
    pub fn primary(&self, index: &str) -> usize {
        let answer = self.answered(&format!("primary {index}"), "primary");
        node_index(answer.rsplit(' ').next().unwrap_or_default(), &answer)
    }

    /// The elected master node.
    pub fn master(&self) -> usize {
        let answer = self.answered("master", "master");
        node_index(answer.rsplit(' ').next().unwrap_or_default(), &answer)
    }

    fn command(&self, line: &str, expected: &str) {
        let answer = self.answered(line, expected);
        assert_eq!(answer, expected, "the launcher's answer to `{line}`");
    }

    /// Sends `line` and returns the launcher's one-line answer, which must start with `word`.
    fn answered(&self, line: &str, word: &str) -> String {
        let mut control = self.control.lock().unwrap();
        let stdin = control.stdin.as_mut().expect("launcher stdin");
        writeln!(stdin, "{line}").expect("write to the launcher");
        stdin.flush().expect("flush the launcher's stdin");
        let mut answer = String::new();
        control
            .stdout
            .read_line(&mut answer)
            .expect("read the launcher");
        let answer = answer.trim().to_owned();
        assert!(
            answer == word || answer.starts_with(&format!("{word} ")),
            "the launcher's answer to `{line}`: {answer}"
        );
        answer
    }
}

/// How a cut link fails (`tools/es-cluster/run`'s fault commands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// A send fails at once, as if the connection were refused: the nodes notice at once.
    Disconnect,
    /// Messages vanish: the nodes notice only by their fault-detection timeouts.
    Unresponsive,
}

impl Links {
    fn word(self) -> &'static str {
        match self {
            Links::Disconnect => "disconnect",
            Links::Unresponsive => "unresponsive",
        }
    }
}

fn node_index(word: &str, answer: &str) -> usize {
    word.parse()
        .unwrap_or_else(|_| panic!("a node index in the launcher's answer: {answer}"))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        // End of input: the launcher stops every node and deletes the data.
        drop(control.stdin.take());
        let _ = control.child.wait();
    }
}

/// The cluster every `real_es` test of this binary shares: `ELASTICSEARCH_URL` if set, else a
/// cluster of [`shared_nodes`] started on first use. `None` (said once, loudly) where none
/// can run.
pub fn shared() -> Option<String> {
    static SHARED: OnceLock<Option<String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            if let Ok(url) = std::env::var("ELASTICSEARCH_URL") {
                return Some(url);
            }
            let cluster = Cluster::start(&ClusterSpec {
                nodes: shared_nodes(),
                // Every test makes indices of its own prefix (with `ELASTICSEARCH_SHARDS=3`,
                // 14 shard copies each), past the engines' default of 1,000 a node.
                settings: vec!["cluster.max_shards_per_node=100000".into()],
            })?;
            let url = cluster.url.clone();
            // Kept for the life of the process: the launcher stops when the process exits and
            // its standard input closes.
            std::mem::forget(cluster);
            Some(url)
        })
        .clone()
}

/// Nodes of the shared cluster: `TEST_CLUSTER_NODES`, else 1. `.ci/run` runs the sharded
/// pass on 3 nodes with `ELASTICSEARCH_SHARDS=3` ([`shards`]).
pub fn shared_nodes() -> usize {
    env_number("TEST_CLUSTER_NODES").unwrap_or(1)
}

/// Primary shards of the data indices the tests' stores and services create:
/// `ELASTICSEARCH_SHARDS` (the service's own variable, which the services the tests start
/// inherit), else 1.
pub fn shards() -> u32 {
    env_number("ELASTICSEARCH_SHARDS").unwrap_or(1)
}

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a number")),
    )
}

/// Whether `java` and `mvn` are on the PATH. Without them: a failure under CI, else a loud
/// skip (said once per process).
fn java_and_maven_present() -> bool {
    let present = ["java", "mvn"].iter().all(|tool| skip::on_path(tool));
    if !present {
        static SAID: OnceLock<()> = OnceLock::new();
        SAID.get_or_init(|| {
            skip::or_fail_under_ci(
                "the real-Elasticsearch tests",
                "java or mvn is not installed, so tools/es-cluster/run cannot start a cluster \
                 (install openjdk-17-jdk-headless and maven, or set ELASTICSEARCH_URL)",
            )
        });
    }
    present
}

/// The engine of the clusters started here, the launcher's `--engine`: `TEST_SEARCH_ENGINE`,
/// else `elasticsearch`.
pub fn engine() -> String {
    std::env::var("TEST_SEARCH_ENGINE").unwrap_or_else(|_| "elasticsearch".to_owned())
}

fn launcher() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/es-cluster/run")
}

/// Reads the launcher's lines until one starts with `key`; panics (with what it read) if the
/// launcher exits first or takes longer than [`START_DEADLINE`].
fn read_value(stdout: &mut BufReader<ChildStdout>, key: &str) -> String {
    let deadline = Instant::now() + START_DEADLINE;
    let mut line = String::new();
    loop {
        line.clear();
        let read = stdout.read_line(&mut line).expect("read the launcher");
        assert!(
            read > 0,
            "tools/es-cluster/run exited before printing {key}"
        );
        if let Some(value) = line.trim().strip_prefix(key) {
            return value.to_owned();
        }
        assert!(Instant::now() < deadline, "no {key} from the launcher");
    }
}
