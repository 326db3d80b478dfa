//! API keys: the operator's `API_KEYS_FILE`, what a key may do (its scopes), the check of a
//! presented key, and the reload of the file on SIGHUP or when it changes.
//!
//! # The file
//! One key per line: `<name> <sha256 of the key, hex> <scopes>`, scopes comma-separated among
//! `read` and `write`; `#` starts a comment; blank lines are skipped:
//!
//! ```text
//! # name     sha256 of the key (printf %s "$KEY" | sha256sum)                 scopes
//! billing    9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  read,write
//! dashboard  60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752  read
//! ```
//!
//! The file holds digests, never keys: reading it does not give anyone a key. A name is the
//! client's, shown on the request's log lines and as the `client` label of
//! `http_requests_total`; it may have several keys (one line each), which is how a key is
//! rotated without a gap. A digest may appear once.
//!
//! # The check
//! A presented key is hashed with SHA-256 and its digest compared with every configured
//! digest in constant time (`subtle`), all of them every time: how long the check takes says
//! nothing about which bytes of which key matched. Keys are never logged; neither are digests.
//!
//! # Reloads
//! [`ApiKeys::spawn_watcher`] reloads the file on SIGHUP and when its content changes (read every
//! `API_KEYS_RELOAD_INTERVAL`; the content is compared, not the mtime, so an atomic rename or a
//! Kubernetes secret's symlink swap is seen like an edit). A file that cannot be read or parsed
//! keeps the keys in force: an ERROR line says why and `api_keys_reloads_total{outcome="error"}`
//! counts it.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The `client` of a request that no key authenticated because none was needed: the service
/// runs without keys, or the route is open (probes, `/metrics`, the OpenAPI document).
pub const ANONYMOUS: &str = "anonymous";

/// The `client` of a request refused with 401: no key, or one the service does not know.
pub const UNAUTHENTICATED: &str = "unauthenticated";

/// The longest key name: names are label values and log fields, so they stay short.
pub const MAX_NAME_LEN: usize = 64;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `GET` (and `HEAD`) on the API.
    Read,
    /// Every other method on the API.
    Write,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One configured key: its client's name, the SHA-256 of the key, its scopes.
#[derive(Debug, Clone)]
pub struct ApiKey {
    name: Arc<str>,
    digest: [u8; 32],
    read: bool,
    write: bool,
}

impl ApiKey {
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub fn allows(&self, scope: Scope) -> bool {
        match scope {
            Scope::Read => self.read,
            Scope::Write => self.write,
        }
    }
}

/// The keys of one version of the file.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    keys: Vec<ApiKey>,
}

/// Why the file cannot be used. Never quotes a line: a key pasted by mistake where its digest
/// belongs must not reach the log.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("cannot read API_KEYS_FILE {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("API_KEYS_FILE {path}, line {line}: {reason}")]
    Line {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

impl KeySet {
    /// Parses the file's text; `path` only names the file in errors.
    pub fn parse(path: &Path, text: &str) -> Result<KeySet, KeyFileError> {
        let mut keys: Vec<ApiKey> = Vec::new();
        let mut line_of_digest: HashMap<[u8; 32], usize> = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let error = |reason: String| KeyFileError::Line {
                path: path.to_owned(),
                line: number,
                reason,
            };
            let content = line.split('#').next().unwrap_or_default();
            let fields: Vec<&str> = content.split_whitespace().collect();
            if fields.is_empty() {
                continue;
            }
            let key = parse_line(&fields).map_err(error)?;
            if let Some(first) = line_of_digest.insert(key.digest, number) {
                return Err(error(format!(
                    "the same key's digest is already on line {first}; list each key once"
                )));
            }
            keys.push(key);
        }
        Ok(KeySet { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The distinct names, sorted (for the log line of a reload).
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.keys.iter().map(|k| &*k.name).collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// The key whose SHA-256 is that of `presented`, if any. Every configured digest is
    /// compared, each in constant time.
    pub fn find(&self, presented: &[u8]) -> Option<&ApiKey> {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.digest.ct_eq(&digest)) {
                found = Some(key);
            }
        }
        found
    }
}

/// One non-empty line, split into its fields.
fn parse_line(fields: &[&str]) -> Result<ApiKey, String> {
    let [name, digest, scopes] = fields else {
        return Err(format!(
            "expected 3 fields `<name> <sha256 of the key, hex> <scopes>`, found {}",
            fields.len()
        ));
    };
    if !valid_name(name) {
        return Err(format!(
            "the name must be 1–{MAX_NAME_LEN} characters of A-Z a-z 0-9 . _ - and neither \
             `{ANONYMOUS}` nor `{UNAUTHENTICATED}`"
        ));
    }
    let mut bytes = [0u8; 32];
    if digest.len() != 64 || hex::decode_to_slice(digest, &mut bytes).is_err() {
        // Not quoted: it may be the key itself, pasted by mistake.
        return Err(format!(
            "the second field must be the key's SHA-256 as 64 hexadecimal digits \
             (printf %s \"$KEY\" | sha256sum); it has {} characters",
            digest.chars().count()
        ));
    }
    let (mut read, mut write) = (false, false);
    for scope in scopes.split(',') {
        match scope {
            "read" => read = true,
            "write" => write = true,
            _ => {
                return Err(
                    "scopes are `read`, `write` or `read,write` (comma-separated, no spaces)"
                        .into(),
                )
            }
        }
    }
    Ok(ApiKey {
        name: Arc::from(*name),
        digest: bytes,
        read,
        write,
    })
}

/// A name is a bounded label value: 1–64 of `[A-Za-z0-9._-]`, not one of the reserved names.
fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name != ANONYMOUS
        && name != UNAUTHENTICATED
}

/// What the watcher last read, so that a file is reloaded (and a bad one reported) once per
/// change, not at every poll.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// The SHA-256 of the content.
    Content([u8; 32]),
    /// The file could not be read, for this reason.
    Unreadable(std::io::ErrorKind),
}

/// What started a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP: read and apply the file even if unchanged.
    Signal,
    /// The periodic check: apply the file only if it changed.
    Poll,
}

/// The keys in force, and the file they come from.
pub struct ApiKeys {
    path: PathBuf,
    current: RwLock<Arc<KeySet>>,
    seen: Mutex<Seen>,
    metrics: Arc<Metrics>,
}

impl ApiKeys {
    /// Reads the file once; the service does not start on an error.
    pub fn load(path: &Path, metrics: Arc<Metrics>) -> Result<ApiKeys, KeyFileError> {
        let bytes = std::fs::read(path).map_err(|source| KeyFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        let keys = KeySet::parse(path, &String::from_utf8_lossy(&bytes))?;
        metrics.api_keys_loaded.set(keys.len() as i64);
        if keys.is_empty() {
            tracing::warn!(
                path = %path.display(),
                "API_KEYS_FILE holds no key: every request to /accounts, /transfers and /events is refused (401)"
            );
        } else {
            tracing::info!(path = %path.display(), keys = keys.len(), names = ?keys.names(), "API keys loaded");
        }
        Ok(ApiKeys {
            path: path.to_owned(),
            current: RwLock::new(Arc::new(keys)),
            seen: Mutex::new(Seen::Content(Sha256::digest(&bytes).into())),
            metrics,
        })
    }

    /// The keys in force now.
    pub fn current(&self) -> Arc<KeySet> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the file again and puts its keys in force, or keeps the ones in force when it
    /// cannot be read or parsed (logged at ERROR, counted). On [`Trigger::Poll`], a file the
    /// same as last time (or unreadable for the same reason) is left alone.
    pub fn reload(&self, trigger: Trigger) {
        let read = std::fs::read(&self.path);
        let seen = match &read {
            Ok(bytes) => Seen::Content(Sha256::digest(bytes).into()),
            Err(error) => Seen::Unreadable(error.kind()),
        };
        {
            let mut last = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if trigger == Trigger::Poll && *last == seen {
                return;
            }
            *last = seen;
        }
        let parsed = match read {
            Ok(bytes) => KeySet::parse(&self.path, &String::from_utf8_lossy(&bytes)),
            Err(source) => Err(KeyFileError::Read {
                path: self.path.clone(),
                source,
            }),
        };
        match parsed {
            Ok(keys) => {
                tracing::info!(
                    path = %self.path.display(), ?trigger, keys = keys.len(), names = ?keys.names(),
                    "API keys reloaded"
                );
                if keys.is_empty() {
                    tracing::warn!(
                        path = %self.path.display(),
                        "API_KEYS_FILE holds no key: every request to /accounts, /transfers and /events is refused (401)"
                    );
                }
                self.metrics.api_keys_loaded.set(keys.len() as i64);
                self.metrics
                    .api_keys_reloads_total
                    .with_label_values(&["ok"])
                    .inc();
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
            }
            Err(error) => {
                tracing::error!(%error, ?trigger, "API_KEYS_FILE not reloaded; the keys in force stay in force");
                self.metrics
                    .api_keys_reloads_total
                    .with_label_values(&["error"])
                    .inc();
            }
        }
    }

    /// Reloads on SIGHUP and whenever the file's content changes (checked every `interval`),
    /// until `shutdown`. The SIGHUP handler is installed before this returns, so a signal
    /// sent once the service is serving never meets the default action (exit).
    pub fn spawn_watcher(self: &Arc<Self>, interval: Duration, shutdown: CancellationToken) {
        #[cfg(unix)]
        let mut hangups = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::hangup(),
        ) {
            Ok(signal) => Some(signal),
            Err(error) => {
                tracing::warn!(%error, "no SIGHUP handler; API_KEYS_FILE is reloaded when it changes");
                None
            }
        };
        let keys = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                #[cfg(unix)]
                let hangup = async {
                    match hangups.as_mut() {
                        Some(signal) => signal.recv().await,
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let hangup = std::future::pending::<Option<()>>();
                let trigger = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    Some(()) = hangup => Trigger::Signal,
                    _ = ticks.tick() => Trigger::Poll,
                };
                // A small file, read off the runtime's worker threads.
                let reloading = keys.clone();
                let _ = tokio::task::spawn_blocking(move || reloading.reload(trigger)).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(key: &str) -> String {
        hex::encode(Sha256::digest(key.as_bytes()))
    }

    fn parse(text: &str) -> Result<KeySet, KeyFileError> {
        KeySet::parse(Path::new("keys"), text)
    }

    fn line_error(text: &str) -> (usize, String) {
        match parse(text) {
            Err(KeyFileError::Line { line, reason, .. }) => (line, reason),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn the_example_digest_is_the_sha256_of_test() {
        assert_eq!(
            digest_of("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    #[test]
    fn keys_are_found_by_their_digest_with_their_scopes() {
        let text = format!(
            "# the keys\n\n billing {} read,write # a comment\ndashboard\t{} read\nbatch {} write\nbilling {} read\n",
            digest_of("k-billing"),
            digest_of("k-dash").to_uppercase(),
            digest_of("k-batch"),
            digest_of("k-billing-next"),
        );
        let keys = parse(&text).unwrap();
        assert_eq!(keys.len(), 4);
        assert_eq!(keys.names(), ["batch", "billing", "dashboard"]);
        let billing = keys.find(b"k-billing").unwrap();
        assert_eq!(&**billing.name(), "billing");
        assert!(billing.allows(Scope::Read) && billing.allows(Scope::Write));
        let dashboard = keys.find(b"k-dash").unwrap();
        assert!(dashboard.allows(Scope::Read) && !dashboard.allows(Scope::Write));
        let batch = keys.find(b"k-batch").unwrap();
        assert!(!batch.allows(Scope::Read) && batch.allows(Scope::Write));
        let next = keys.find(b"k-billing-next").unwrap();
        assert_eq!(&**next.name(), "billing");
        assert!(next.allows(Scope::Read) && !next.allows(Scope::Write));
        for unknown in ["", "k-billin", "k-billing ", "K-BILLING", "test"] {
            assert!(keys.find(unknown.as_bytes()).is_none(), "{unknown:?}");
        }
    }

    #[test]
    fn an_empty_file_has_no_keys() {
        assert!(parse("").unwrap().is_empty());
        assert!(parse("# nobody yet\n\n   \n").unwrap().is_empty());
    }

    #[test]
    fn a_bad_line_is_named_and_never_quoted() {
        let d = digest_of("k");
        let pasted_key = "sk_live_0123456789abcdef";
        for (text, line, says) in [
            (format!("a {d}\n"), 1, "expected 3 fields"),
            (format!("a {d} read extra\n"), 1, "found 4"),
            (
                format!("ok {d} read\nb {pasted_key} read\n"),
                2,
                "64 hexadecimal",
            ),
            (format!("a {}x read\n", &d[..63]), 1, "64 hexadecimal"),
            (format!("a {d} admin\n"), 1, "scopes are"),
            (format!("a {d} read,\n"), 1, "scopes are"),
            (format!("a {d} Read\n"), 1, "scopes are"),
            (format!("anonymous {d} read\n"), 1, "the name"),
            (format!("unauthenticated {d} read\n"), 1, "the name"),
            (format!("a/b {d} read\n"), 1, "the name"),
            (format!("{} {d} read\n", "n".repeat(65)), 1, "the name"),
            (
                format!("a {d} read\n\nb {d} write\n"),
                3,
                "already on line 1",
            ),
        ] {
            let (at, reason) = line_error(&text);
            assert_eq!(at, line, "{text:?}: {reason}");
            assert!(reason.contains(says), "{text:?}: {reason}");
            assert!(!reason.contains(pasted_key), "{reason}");
            assert!(!reason.contains(&d), "{reason}");
        }
    }

    #[test]
    fn a_reload_keeps_the_keys_in_force_when_the_file_is_bad_or_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, format!("a {} read\n", digest_of("one"))).unwrap();
        let metrics = Metrics::new();
        let keys = ApiKeys::load(&path, metrics.clone()).unwrap();
        let reloads = |outcome: &str| {
            metrics
                .api_keys_reloads_total
                .with_label_values(&[outcome])
                .get()
        };

        // Unchanged: a poll does nothing, a signal reloads.
        keys.reload(Trigger::Poll);
        assert_eq!(reloads("ok"), 0);
        keys.reload(Trigger::Signal);
        assert_eq!(reloads("ok"), 1);

        // Changed: the new keys, the old one gone.
        std::fs::write(&path, format!("b {} write\n", digest_of("two"))).unwrap();
        keys.reload(Trigger::Poll);
        assert_eq!(reloads("ok"), 2);
        assert!(keys.current().find(b"one").is_none());
        assert!(keys.current().find(b"two").is_some());

        // Bad, then gone: the keys in force stay; each change is counted once.
        std::fs::write(&path, "b not-a-digest write\n").unwrap();
        keys.reload(Trigger::Poll);
        keys.reload(Trigger::Poll);
        assert_eq!(reloads("error"), 1);
        std::fs::remove_file(&path).unwrap();
        keys.reload(Trigger::Poll);
        keys.reload(Trigger::Poll);
        assert_eq!(reloads("error"), 2);
        assert!(keys.current().find(b"two").is_some());
        assert_eq!(metrics.api_keys_loaded.get(), 1);

        // Back: reloaded.
        std::fs::write(
            &path,
            format!("c {} read\nd {} read\n", digest_of("3"), digest_of("4")),
        )
        .unwrap();
        keys.reload(Trigger::Poll);
        assert_eq!(reloads("ok"), 3);
        assert_eq!(metrics.api_keys_loaded.get(), 2);
        assert!(keys.current().find(b"two").is_none());
    }
}
