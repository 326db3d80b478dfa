//! How the service authenticates to Elasticsearch and which CA it trusts (`docs/elasticsearch.md`
//! §12), and what a refusal means.
//!
//! Credentials, one kind at a time: an API key in the encoded form Elasticsearch and Kibana
//! print (`ELASTICSEARCH_API_KEY`, sent as `Authorization: ApiKey <encoded>`), a user and
//! password (`ELASTICSEARCH_USERNAME` / `ELASTICSEARCH_PASSWORD`, basic authentication), or
//! `user:password@` in `ELASTICSEARCH_URL`. Each secret may instead be read from a file
//! (`..._FILE`, for mounted secrets; one trailing newline is dropped). A secret is held in a
//! [`Secret`], whose `Debug` and `Display` print `***`, so no log line or error message can
//! carry it.
//!
//! TLS: `ELASTICSEARCH_CA_CERT` names a PEM file whose certificates are trusted in addition to
//! the public roots, with full verification (chain and host name). With
//! `ELASTICSEARCH_CA_FINGERPRINT` (the SHA-256 Elasticsearch prints at its first start), the
//! service refuses to start unless one certificate of that file has this fingerprint: a
//! mounted file that is not the cluster's CA is caught before anything is sent.
//!
//! Refusals: a 401 (the credentials do not authenticate) or a 403 (a privilege is missing) is
//! [`StoreError::Denied`], never retried as if the store were down; the 403's reason names the
//! action and the privileges that would grant it, and [`denied`] keeps those words.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use elasticsearch::auth::Credentials;
use elasticsearch::cert::{Certificate, CertificateValidation};
use elasticsearch::http::transport::TransportBuilder;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde_json::Value;

use crate::store::StoreError;

/// A secret: printed as `***` by `Debug` and `Display`; [`Secret::expose`] is the only way to
/// the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret::new(s))
    }
}

/// How the service proves who it is to Elasticsearch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EsCredentials {
    /// `Authorization: ApiKey <encoded>`; the encoded form is base64 of `id:api_key`.
    ApiKey(Secret),
    /// `Authorization: Basic`.
    Basic { username: String, password: Secret },
}

/// Credentials and trusted CA of the Elasticsearch client; `Default` is neither (plain
/// `http://`, or `https://` trusted by the public roots, without authentication).
#[derive(Clone, Debug, Default)]
pub struct EsSecurity {
    pub credentials: Option<EsCredentials>,
    /// The CA bundle to trust, PEM, as read from `ELASTICSEARCH_CA_CERT`.
    pub ca_pem: Option<Vec<u8>>,
}

/// The settings as given (flags or environment), before files are read.
#[derive(Clone, Debug, Default)]
pub struct EsSecuritySettings {
    pub api_key: Option<Secret>,
    pub api_key_file: Option<PathBuf>,
    pub username: Option<String>,
    pub username_file: Option<PathBuf>,
    pub password: Option<Secret>,
    pub password_file: Option<PathBuf>,
    pub ca_cert: Option<PathBuf>,
    pub ca_fingerprint: Option<String>,
}

impl EsSecuritySettings {
    /// Reads the `_FILE` variants and the CA, and checks the combination. Errors name the
    /// setting, never its value.
    pub fn load(&self) -> Result<EsSecurity, StoreError> {
        let api_key = one_of(
            "ELASTICSEARCH_API_KEY",
            self.api_key.clone(),
            &self.api_key_file,
        )?;
        let username = one_of(
            "ELASTICSEARCH_USERNAME",
            self.username.clone().map(Secret::new),
            &self.username_file,
        )?;
        let password = one_of(
            "ELASTICSEARCH_PASSWORD",
            self.password.clone(),
            &self.password_file,
        )?;
        let credentials =
            match (api_key, username, password) {
                (Some(_), Some(_), _) | (Some(_), _, Some(_)) => return Err(config_error(
                    "set either ELASTICSEARCH_API_KEY or ELASTICSEARCH_USERNAME/PASSWORD, not both",
                )),
                (Some(key), None, None) => Some(EsCredentials::ApiKey(check_encoded(key)?)),
                (None, Some(username), Some(password)) => Some(EsCredentials::Basic {
                    username: username.expose().to_owned(),
                    password,
                }),
                (None, Some(_), None) => {
                    return Err(config_error(
                        "ELASTICSEARCH_USERNAME needs ELASTICSEARCH_PASSWORD",
                    ))
                }
                (None, None, Some(_)) => {
                    return Err(config_error(
                        "ELASTICSEARCH_PASSWORD needs ELASTICSEARCH_USERNAME",
                    ))
                }
                (None, None, None) => None,
            };
        let ca_pem = match &self.ca_cert {
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                config_error(&format!(
                    "cannot read ELASTICSEARCH_CA_CERT {}: {e}",
                    path.display()
                ))
            })?),
            None => None,
        };
        match (&ca_pem, &self.ca_fingerprint) {
            (Some(pem), Some(fingerprint)) => check_fingerprint(pem, fingerprint)?,
            (None, Some(_)) => {
                return Err(config_error(
                    "ELASTICSEARCH_CA_FINGERPRINT checks the CA of ELASTICSEARCH_CA_CERT, which is not set",
                ))
            }
            _ => {}
        }
        Ok(EsSecurity {
            credentials,
            ca_pem,
        })
    }
}

impl EsSecurity {
    /// How the client authenticates, for the start-up log line (never a secret).
    pub fn describe(&self) -> String {
        match &self.credentials {
            Some(EsCredentials::ApiKey(_)) => "API key".into(),
            Some(EsCredentials::Basic { username, .. }) => format!("user {username}"),
            None => "none (or user:password@ in ELASTICSEARCH_URL)".into(),
        }
    }

    /// `builder` with these credentials and this CA. `url_credentials` (from
    /// `user:password@` in the URL) are used when no other credentials are configured; both
    /// at once are refused as ambiguous.
    pub(super) fn apply(
        self,
        mut builder: TransportBuilder,
        url_credentials: Option<Credentials>,
    ) -> Result<TransportBuilder, StoreError> {
        let credentials = match (self.credentials, url_credentials) {
            (Some(_), Some(_)) => return Err(config_error(
                "ELASTICSEARCH_URL carries user:password@ and other credentials are set; keep one",
            )),
            (Some(EsCredentials::ApiKey(key)), None) => {
                Some(Credentials::EncodedApiKey(key.expose().to_owned()))
            }
            (Some(EsCredentials::Basic { username, password }), None) => {
                Some(Credentials::Basic(username, password.expose().to_owned()))
            }
            (None, url) => url,
        };
        if let Some(credentials) = credentials {
            builder = builder.auth(credentials);
        }
        if let Some(pem) = self.ca_pem {
            let certificate = Certificate::from_pem(&pem).map_err(|e| {
                config_error(&format!(
                    "ELASTICSEARCH_CA_CERT is not a PEM certificate: {e}"
                ))
            })?;
            builder = builder.cert_validation(CertificateValidation::Full(certificate));
        }
        Ok(builder)
    }
}

fn config_error(message: &str) -> StoreError {
    StoreError::Permanent(message.to_owned())
}

/// The value of `name`, given directly or in the file `file` (one trailing newline dropped).
fn one_of(
    name: &str,
    direct: Option<Secret>,
    file: &Option<PathBuf>,
) -> Result<Option<Secret>, StoreError> {
    match (direct, file) {
        (Some(_), Some(_)) => Err(config_error(&format!(
            "set {name} or {name}_FILE, not both"
        ))),
        (Some(value), None) => Ok(Some(value)),
        (None, Some(path)) => read_secret_file(name, path).map(Some),
        (None, None) => Ok(None),
    }
}

fn read_secret_file(name: &str, path: &Path) -> Result<Secret, StoreError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| config_error(&format!("cannot read {name}_FILE {}: {e}", path.display())))?;
    let value = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    if value.is_empty() {
        return Err(config_error(&format!(
            "{name}_FILE {} is empty",
            path.display()
        )));
    }
    Ok(Secret::new(value))
}

/// The encoded form is base64 of `id:api_key`; a raw `id:api_key` or the `api_key` alone is a
/// common mistake that would otherwise only show as a 401.
fn check_encoded(key: Secret) -> Result<Secret, StoreError> {
    let decodes = BASE64
        .decode(key.expose().trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .is_some_and(|text| text.contains(':'));
    if decodes {
        Ok(Secret::new(key.expose().trim()))
    } else {
        Err(config_error(
            "ELASTICSEARCH_API_KEY must be the encoded form Elasticsearch prints (`encoded` of \
             the create API key answer: base64 of id:api_key)",
        ))
    }
}

/// `fingerprint` (hex, any case, `:` separators allowed) is the SHA-256 of one certificate
/// of the PEM bundle.
fn check_fingerprint(pem: &[u8], fingerprint: &str) -> Result<(), StoreError> {
    let wanted: String = fingerprint
        .chars()
        .filter(|c| *c != ':' && !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase();
    if wanted.len() != 64 || !wanted.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(config_error(
            "ELASTICSEARCH_CA_FINGERPRINT must be a SHA-256 fingerprint: 64 hex digits",
        ));
    }
    let certificates: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| config_error(&format!("ELASTICSEARCH_CA_CERT is not PEM: {e}")))?;
    if certificates.is_empty() {
        return Err(config_error("ELASTICSEARCH_CA_CERT holds no certificate"));
    }
    let found = certificates.iter().any(|der| sha256_hex(der) == wanted);
    if found {
        Ok(())
    } else {
        Err(config_error(
            "no certificate of ELASTICSEARCH_CA_CERT has the SHA-256 fingerprint \
             ELASTICSEARCH_CA_FINGERPRINT: the file is not the cluster's CA",
        ))
    }
}

/// Lower-case hex SHA-256, the form Elasticsearch prints.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// The error of a 401 or 403 answer to `op` (`docs/elasticsearch.md` §12). The reason, what
/// `/readyz` shows, says what is wrong in general terms: authentication failed, or which
/// action needs which privileges; the detail adds Elasticsearch's own words (user, key id,
/// indices) for the log.
pub(super) fn denied(op: &str, status: u16, body: &Value) -> StoreError {
    let es_reason = body
        .pointer("/error/reason")
        .and_then(Value::as_str)
        .unwrap_or("");
    let reason = if status == 401 {
        "authentication failed: Elasticsearch refused the service's credentials (HTTP 401); \
         check ELASTICSEARCH_API_KEY or ELASTICSEARCH_USERNAME/ELASTICSEARCH_PASSWORD"
            .to_owned()
    } else {
        match missing_privilege(es_reason) {
            Some(missing) => format!("missing privilege (HTTP 403): {missing}"),
            None => "missing privilege (HTTP 403): Elasticsearch refused an action to the \
                     service's credentials"
                .to_owned(),
        }
    };
    let detail = if es_reason.is_empty() {
        format!("{op}: HTTP {status}")
    } else {
        format!("{op}: HTTP {status} {es_reason}")
    };
    StoreError::Denied { reason, detail }
}

/// From "action [A] is unauthorized for ... , this action is granted by the index privileges
/// [P]": "action [A] needs one of the index privileges [P]" (without the user and indices).
fn missing_privilege(reason: &str) -> Option<String> {
    let action = bracketed(reason.strip_prefix("action ")?)?;
    let (_, granted) = reason.split_once("this action is granted by the ")?;
    let (kind, rest) = granted.split_once(" privileges ")?;
    let privileges = bracketed(rest)?;
    Some(format!(
        "action [{action}] needs one of the {kind} privileges [{privileges}]"
    ))
}

/// The text between a leading `[` and its `]`.
fn bracketed(text: &str) -> Option<&str> {
    let inner = text.strip_prefix('[')?;
    inner.split_once(']').map(|(inside, _)| inside)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn settings() -> EsSecuritySettings {
        EsSecuritySettings::default()
    }

    #[test]
    fn a_secret_never_prints() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?} {secret}"), "*** ***");
        let credentials = EsCredentials::Basic {
            username: "svc".into(),
            password: secret,
        };
        assert!(!format!("{credentials:?}").contains("hunter2"));
    }

    #[test]
    fn an_api_key_must_be_the_encoded_form() {
        let encoded = BASE64.encode("id1:s3cret");
        let mut given = settings();
        given.api_key = Some(Secret::new(format!("{encoded}\n")));
        let loaded = given.load().unwrap();
        assert_eq!(
            loaded.credentials,
            Some(EsCredentials::ApiKey(Secret::new(encoded)))
        );
        given.api_key = Some(Secret::new("id1:s3cret"));
        let error = given.load().unwrap_err().to_string();
        assert!(error.contains("encoded form"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
    }

    #[test]
    fn secrets_come_from_files_without_their_newline() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "p@ss word\n").unwrap();
        let mut given = settings();
        given.username = Some("svc".into());
        given.password_file = Some(password.clone());
        assert_eq!(
            given.load().unwrap().credentials,
            Some(EsCredentials::Basic {
                username: "svc".into(),
                password: Secret::new("p@ss word"),
            })
        );
        given.password = Some(Secret::new("other"));
        assert!(given.load().unwrap_err().to_string().contains("not both"));
        given.password = None;
        given.password_file = Some(dir.path().join("missing"));
        assert!(given
            .load()
            .unwrap_err()
            .to_string()
            .contains("cannot read ELASTICSEARCH_PASSWORD_FILE"));
    }

    #[test]
    fn credentials_are_one_kind_and_complete() {
        let mut given = settings();
        given.username = Some("svc".into());
        assert!(given
            .load()
            .unwrap_err()
            .to_string()
            .contains("needs ELASTICSEARCH_PASSWORD"));
        given.api_key = Some(Secret::new(BASE64.encode("a:b")));
        given.password = Some(Secret::new("p"));
        assert!(given.load().unwrap_err().to_string().contains("not both"));
        assert!(settings().load().unwrap().credentials.is_none());
    }

    #[test]
    fn a_fingerprint_alone_is_refused() {
        let mut given = settings();
        given.ca_fingerprint = Some("00".repeat(32));
        assert!(given
            .load()
            .unwrap_err()
            .to_string()
            .contains("ELASTICSEARCH_CA_CERT, which is not set"));
    }

    #[test]
    fn sha256_is_lower_case_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_403_names_the_action_and_the_privileges_without_user_or_indices() {
        let body = json!({"error": {"type": "security_exception", "reason":
            "action [indices:admin/create] is unauthorized for API key id [k1] of user [svc] \
             on indices [ts-accounts], this action is granted by the index privileges \
             [create_index,manage,all]"}, "status": 403});
        let StoreError::Denied { reason, detail } = denied("migrate", 403, &body) else {
            panic!("not denied");
        };
        assert_eq!(
            reason,
            "missing privilege (HTTP 403): action [indices:admin/create] needs one of the \
             index privileges [create_index,manage,all]"
        );
        assert!(detail.contains("on indices [ts-accounts]"), "{detail}");
        let StoreError::Denied { reason, .. } = denied("get", 403, &Value::Null) else {
            panic!("not denied");
        };
        assert!(
            reason.starts_with("missing privilege (HTTP 403)"),
            "{reason}"
        );
    }

    #[test]
    fn a_401_says_authentication_failed() {
        let error = denied("ready", 401, &Value::Null);
        assert!(!error.is_retryable());
        assert!(
            error.to_string().contains("authentication failed"),
            "{error}"
        );
    }
}
