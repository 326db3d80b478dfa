//! API key files for the auth suites: written as an operator writes them, with each key's
//! SHA-256 made by docs/api.md's recipe (`printf %s "$KEY" | sha256sum`), and replaced
//! atomically (a rename) as a deployment tool would.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A key the tests present, with the line that configures it.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// The client's name: the `client` label and the span field.
    pub name: &'static str,
    /// The secret the client sends as `Authorization: Bearer <secret>`.
    pub secret: &'static str,
    /// `read`, `write` or `read,write`.
    pub scopes: &'static str,
}

/// The SHA-256 of `secret` in hex, made by the shell recipe docs/api.md ("API keys") gives
/// operators.
pub fn sha256_hex(secret: &str) -> String {
    let output = Command::new("sh")
        .args(["-c", r#"printf %s "$KEY" | sha256sum"#])
        .env("KEY", secret)
        .output()
        .expect("run sha256sum");
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let digest = text.split_whitespace().next().expect("a digest").to_owned();
    assert_eq!(digest.len(), 64, "{text}");
    digest
}

/// The file's text for these keys, with a comment and a blank line as an operator's has.
pub fn file_text(keys: &[Key]) -> String {
    let mut text = String::from("# name  sha256 of the key  scopes\n\n");
    for key in keys {
        text.push_str(&format!(
            "{} {} {}  # {} key\n",
            key.name,
            sha256_hex(key.secret),
            key.scopes,
            key.name
        ));
    }
    text
}

/// An `API_KEYS_FILE` in a temp dir of its own.
pub struct KeyFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl KeyFile {
    pub fn new(keys: &[Key]) -> KeyFile {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("api-keys");
        let file = KeyFile { _dir: dir, path };
        file.replace_text(&file_text(keys));
        file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the file with one for `keys`, atomically.
    pub fn replace(&self, keys: &[Key]) {
        self.replace_text(&file_text(keys));
    }

    /// Replaces the file with `text`, atomically (written beside it, then renamed).
    pub fn replace_text(&self, text: &str) {
        let next = self.path.with_extension("next");
        std::fs::write(&next, text).expect("write the key file");
        std::fs::rename(&next, &self.path).expect("rename the key file");
    }
}
