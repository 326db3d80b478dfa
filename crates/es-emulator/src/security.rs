//! Optional security of this TEST DOUBLE, modelled on Elasticsearch 8 (the service's
//! `docs/elasticsearch.md` §12 has the sources): API keys (`Authorization: ApiKey
//! base64(id:secret)`) and users (`Authorization: Basic`), each with a [`Grant`] of cluster and
//! index privileges.
//!
//! - No credentials: 401 `security_exception` "missing authentication credentials for REST
//!   request [uri]"; credentials that do not authenticate: 401 "unable to authenticate with
//!   provided credentials and anonymous access is not allowed for this request" (with
//!   `additional_unsuccessful_credentials`), or "unable to authenticate user [u] for REST
//!   request [uri]" for a wrong password. Every 401 carries the three `WWW-Authenticate`
//!   challenges, as HTTP headers and under `header` in the body.
//! - An action the grant does not cover: 403 `security_exception` "action [a] is unauthorized
//!   for API key id [k] of user [u] on indices [i], this action is granted by the index
//!   privileges [p,...]" (cluster actions: "... by the cluster privileges [...]"). A `_bulk` is
//!   authorized as a whole when the grant allows bulk writes on some index, then item by item:
//!   an item the grant does not cover fails alone with status 403.
//! - Privileges are the named ones below, as sets of action patterns taken from
//!   Elasticsearch's `IndexPrivilege`, or action patterns themselves
//!   (`indices:admin/mapping/put`). Index names in a grant may end in `*`.
//!
//! Not modelled: realms, roles as objects, run-as, expiry, anonymous access, DLS/FLS,
//! restricted indices, wildcard expansion to authorized indices only.

use std::sync::Mutex;

use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::json;

use crate::errors::{Cause, EsError};
use crate::state::glob;

/// The `WWW-Authenticate` challenges of a default 8.x node (basic realm, token service, API
/// keys).
pub const CHALLENGES: [&str; 3] = [
    "Basic realm=\"security\", charset=\"UTF-8\"",
    "Bearer realm=\"security\"",
    "ApiKey",
];

/// Named index privileges and the action patterns each grants, least to most privileged (the
/// order Elasticsearch lists them in a 403).
const INDEX_PRIVILEGES: &[(&str, &[&str])] = &[
    (
        "create_doc",
        &[
            "indices:data/write/index",
            "indices:data/write/index[*",
            "indices:data/write/index:op_type/create",
            "indices:data/write/bulk*",
        ],
    ),
    (
        "create",
        &["indices:data/write/index*", "indices:data/write/bulk*"],
    ),
    (
        "index",
        &[
            "indices:data/write/index*",
            "indices:data/write/bulk*",
            "indices:data/write/update*",
        ],
    ),
    (
        "delete",
        &["indices:data/write/delete*", "indices:data/write/bulk*"],
    ),
    ("read", &["indices:data/read/*"]),
    (
        "view_index_metadata",
        &[
            "indices:admin/aliases/get",
            "indices:admin/get",
            "indices:admin/mappings/fields/get*",
            "indices:admin/mappings/get",
            "indices:admin/settings/get",
            "indices:admin/resolve/index",
        ],
    ),
    (
        "maintenance",
        &[
            "indices:admin/refresh*",
            "indices:admin/flush*",
            "indices:admin/forcemerge*",
        ],
    ),
    (
        "create_index",
        &["indices:admin/create", "indices:admin/auto_create"],
    ),
    ("delete_index", &["indices:admin/delete"]),
    ("monitor", &["indices:monitor/*"]),
    (
        "write",
        &["indices:data/write/*", "indices:admin/mapping/auto_put"],
    ),
    ("manage", &["indices:monitor/*", "indices:admin/*"]),
    ("all", &["indices:*"]),
];

/// Named cluster privileges (the subset the emulated APIs need).
const CLUSTER_PRIVILEGES: &[(&str, &[&str])] = &[
    ("monitor", &["cluster:monitor/*"]),
    ("manage", &["cluster:monitor/*", "cluster:admin/*"]),
    ("all", &["cluster:*"]),
];

/// Privileges on the indices whose names match `names`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexGrant {
    /// Index names or patterns ending in `*`.
    pub names: Vec<String>,
    /// Named privileges (`read`, `index`, ...) or action patterns.
    pub privileges: Vec<String>,
}

/// What a credential may do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    pub cluster: Vec<String>,
    pub indices: Vec<IndexGrant>,
}

impl Grant {
    /// Everything (the `superuser` role).
    pub fn superuser() -> Grant {
        Grant {
            cluster: vec!["all".into()],
            indices: vec![IndexGrant {
                names: vec!["*".into()],
                privileges: vec!["all".into()],
            }],
        }
    }

    /// `privileges` on the indices matching `names`, and no cluster privilege.
    pub fn indices(names: &[&str], privileges: &[&str]) -> Grant {
        Grant {
            cluster: Vec::new(),
            indices: vec![IndexGrant {
                names: names.iter().map(|s| s.to_string()).collect(),
                privileges: privileges.iter().map(|s| s.to_string()).collect(),
            }],
        }
    }

    fn allows_cluster(&self, action: &str) -> bool {
        self.cluster
            .iter()
            .any(|p| privilege_grants(CLUSTER_PRIVILEGES, p, action))
    }

    /// `action` on `index`; `None`: on some index (a `_bulk` as a whole).
    fn allows_index(&self, action: &str, index: Option<&str>) -> bool {
        self.indices.iter().any(|grant| {
            let on_index = match index {
                Some(index) => grant.names.iter().any(|n| glob(n, index)),
                None => true,
            };
            on_index
                && grant
                    .privileges
                    .iter()
                    .any(|p| privilege_grants(INDEX_PRIVILEGES, p, action))
        })
    }
}

fn privilege_grants(table: &[(&str, &[&str])], privilege: &str, action: &str) -> bool {
    match table.iter().find(|(name, _)| *name == privilege) {
        Some((_, patterns)) => patterns.iter().any(|p| glob(p, action)),
        None => glob(privilege, action),
    }
}

/// The named privileges that grant `action`, least privileged first.
fn granted_by(table: &[(&'static str, &[&str])], action: &str) -> Vec<&'static str> {
    table
        .iter()
        .filter(|(_, patterns)| patterns.iter().any(|p| glob(p, action)))
        .map(|(name, _)| *name)
        .collect()
}

/// An API key the emulator accepts.
#[derive(Debug, Clone)]
pub struct ApiKey {
    pub id: String,
    pub secret: String,
    /// The user who created it (named in 403 reasons).
    pub owner: String,
    pub grant: Grant,
}

impl ApiKey {
    pub fn new(id: &str, secret: &str, grant: Grant) -> ApiKey {
        ApiKey {
            id: id.into(),
            secret: secret.into(),
            owner: "transfer-service-admin".into(),
            grant,
        }
    }

    /// The `encoded` form Elasticsearch returns: base64 of `id:secret`.
    pub fn encoded(&self) -> String {
        BASE64.encode(format!("{}:{}", self.id, self.secret))
    }
}

/// A user of the native realm.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub password: String,
    /// Role names (named in 403 reasons).
    pub roles: Vec<String>,
    pub grant: Grant,
}

/// The credentials an emulator with security on accepts.
#[derive(Debug, Clone, Default)]
pub struct SecurityConfig {
    pub api_keys: Vec<ApiKey>,
    pub users: Vec<User>,
}

/// Who a request authenticated as.
#[derive(Debug, Clone)]
pub struct Principal {
    /// As Elasticsearch names it in a 403: `API key id [k] of user [u]`, `user [u] with
    /// effective roles [r]`.
    pub description: String,
    pub grant: Grant,
}

impl Principal {
    /// 403 unless the grant allows the cluster `action`.
    pub fn check_cluster(&self, action: &str) -> Result<(), EsError> {
        if self.grant.allows_cluster(action) {
            return Ok(());
        }
        Err(self.denied(
            action,
            None,
            "cluster",
            &granted_by(CLUSTER_PRIVILEGES, action),
        ))
    }

    /// 403 unless the grant allows the index `action` on every one of `indices` (patterns
    /// with `*` are left out: Elasticsearch expands them to the authorized indices only).
    pub fn check_indices(&self, action: &str, indices: &[&str]) -> Result<(), EsError> {
        let denied: Vec<&str> = indices
            .iter()
            .copied()
            .filter(|i| !i.contains('*') && !self.grant.allows_index(action, Some(i)))
            .collect();
        if denied.is_empty() {
            return Ok(());
        }
        Err(self.denied(
            action,
            Some(&denied),
            "index",
            &granted_by(INDEX_PRIVILEGES, action),
        ))
    }

    /// 403 unless the grant allows bulk writes on some index (a `_bulk` as a whole).
    pub fn check_bulk(&self) -> Result<(), EsError> {
        let action = "indices:data/write/bulk";
        if self.grant.allows_index(action, None) {
            return Ok(());
        }
        Err(self.denied(action, None, "index", &granted_by(INDEX_PRIVILEGES, action)))
    }

    /// The 403 of one `_bulk` item, if its action is not granted on its index.
    pub fn check_bulk_item(&self, op: &str, index: &str) -> Result<(), EsError> {
        let action = match op {
            "create" => "indices:data/write/index:op_type/create",
            "index" => "indices:data/write/index:op_type/index",
            "delete" => "indices:data/write/delete",
            _ => "indices:data/write/update",
        };
        self.check_indices(action, &[index])
    }

    fn denied(
        &self,
        action: &str,
        indices: Option<&[&str]>,
        kind: &str,
        privileges: &[&str],
    ) -> EsError {
        let mut reason = format!("action [{action}] is unauthorized for {}", self.description);
        if let Some(indices) = indices {
            reason.push_str(&format!(" on indices [{}]", indices.join(",")));
        }
        if !privileges.is_empty() {
            reason.push_str(&format!(
                ", this action is granted by the {kind} privileges [{}]",
                privileges.join(",")
            ));
        }
        EsError::new(403, "security_exception", reason)
    }
}

/// The credentials and their state (a key can be invalidated while the emulator runs).
#[derive(Debug)]
pub struct Security {
    config: Mutex<SecurityConfig>,
    invalidated: Mutex<Vec<String>>,
}

impl Security {
    pub fn new(config: SecurityConfig) -> Security {
        Security {
            config: Mutex::new(config),
            invalidated: Mutex::new(Vec::new()),
        }
    }

    /// Invalidates the API key `id` (`DELETE /_security/api_key`): it no longer authenticates.
    pub fn invalidate(&self, id: &str) {
        self.invalidated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.to_owned());
    }

    /// Replaces what the API key `id` may do.
    pub fn set_grant(&self, id: &str, grant: Grant) {
        let mut config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(key) = config.api_keys.iter_mut().find(|k| k.id == id) {
            key.grant = grant;
        }
    }

    /// Who sent the request, or the 401 to answer.
    pub fn authenticate(&self, headers: &HeaderMap, uri: &str) -> Result<Principal, Box<Response>> {
        let Some(value) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return Err(unauthorized(
                format!("missing authentication credentials for REST request [{uri}]"),
                None,
            ));
        };
        let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
        let decoded = BASE64
            .decode(token.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok());
        let config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        match scheme.to_ascii_lowercase().as_str() {
            "apikey" => {
                let Some((id, secret)) = decoded.as_deref().and_then(|d| d.split_once(':')) else {
                    return Err(unauthenticated("API key: invalid ApiKey value".into()));
                };
                let Some(key) = config.api_keys.iter().find(|k| k.id == id) else {
                    return Err(unauthenticated(format!(
                        "API key: unable to find apikey with id {id}"
                    )));
                };
                let invalidated = self.invalidated.lock().unwrap_or_else(|e| e.into_inner());
                if invalidated.iter().any(|i| i == id) {
                    return Err(unauthenticated(format!(
                        "API key: api key [{id}] has been invalidated"
                    )));
                }
                if key.secret != secret {
                    return Err(unauthenticated(format!(
                        "API key: invalid credentials for API key [{id}]"
                    )));
                }
                Ok(Principal {
                    description: format!("API key id [{}] of user [{}]", key.id, key.owner),
                    grant: key.grant.clone(),
                })
            }
            "basic" => {
                let (name, password) = decoded
                    .as_deref()
                    .and_then(|d| d.split_once(':'))
                    .unwrap_or(("", ""));
                match config.users.iter().find(|u| u.name == name) {
                    Some(user) if user.password == password => Ok(Principal {
                        description: format!(
                            "user [{}] with effective roles [{}]",
                            user.name,
                            user.roles.join(",")
                        ),
                        grant: user.grant.clone(),
                    }),
                    _ => Err(unauthorized(
                        format!("unable to authenticate user [{name}] for REST request [{uri}]"),
                        None,
                    )),
                }
            }
            _ => Err(unauthenticated(format!(
                "{scheme}: unsupported authentication scheme"
            ))),
        }
    }
}

/// 401 after credentials were tried and failed.
fn unauthenticated(unsuccessful: String) -> Box<Response> {
    unauthorized(
        "unable to authenticate with provided credentials and anonymous access is not allowed \
         for this request"
            .into(),
        Some(unsuccessful),
    )
}

/// A 401 `security_exception` with the challenges in the body and as headers.
fn unauthorized(reason: String, unsuccessful: Option<String>) -> Box<Response> {
    let mut cause = Cause::new("security_exception", reason);
    if let Some(unsuccessful) = unsuccessful {
        cause = cause.meta("additional_unsuccessful_credentials", unsuccessful);
    }
    let cause = cause.meta("header", json!({ "WWW-Authenticate": CHALLENGES }));
    let mut response = EsError::from_cause(401, cause).into_response();
    for challenge in CHALLENGES {
        response.headers_mut().append(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
    }
    Box::new(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privileges_that_grant_an_action_are_listed_as_elasticsearch_lists_them() {
        let of = |action| granted_by(INDEX_PRIVILEGES, action).join(",");
        assert_eq!(
            of("indices:data/write/index:op_type/create"),
            "create_doc,create,index,write,all"
        );
        assert_eq!(
            of("indices:data/write/index:op_type/index"),
            "create,index,write,all"
        );
        assert_eq!(of("indices:data/write/delete"), "delete,write,all");
        assert_eq!(of("indices:data/read/search"), "read,all");
        assert_eq!(of("indices:admin/create"), "create_index,manage,all");
        assert_eq!(of("indices:admin/get"), "view_index_metadata,manage,all");
        assert_eq!(of("indices:admin/refresh"), "maintenance,manage,all");
        assert_eq!(of("indices:admin/mapping/put"), "manage,all");
        assert_eq!(
            granted_by(CLUSTER_PRIVILEGES, "cluster:monitor/main").join(","),
            "monitor,manage,all"
        );
    }

    #[test]
    fn grants_match_index_patterns_and_action_patterns() {
        let grant = Grant::indices(&["ts-*"], &["read", "indices:admin/mapping/put"]);
        assert!(grant.allows_index("indices:data/read/get", Some("ts-accounts")));
        assert!(grant.allows_index("indices:admin/mapping/put", Some("ts-accounts")));
        assert!(!grant.allows_index("indices:data/read/get", Some("other")));
        assert!(!grant.allows_index("indices:admin/create", Some("ts-accounts")));
        assert!(!grant.allows_cluster("cluster:monitor/main"));
        assert!(Grant::superuser().allows_cluster("cluster:monitor/main"));
        assert!(glob("a*c*", "abxcd") && !glob("a*c", "abxcd"));
    }

    #[test]
    fn a_denial_names_the_action_the_indices_and_the_privileges() {
        let principal = Principal {
            description: "API key id [k1] of user [svc]".into(),
            grant: Grant::indices(&["*"], &["read"]),
        };
        let error = principal
            .check_indices("indices:admin/create", &["ts-accounts"])
            .unwrap_err();
        assert_eq!(error.status, 403);
        assert_eq!(
            error.cause.reason,
            "action [indices:admin/create] is unauthorized for API key id [k1] of user [svc] \
             on indices [ts-accounts], this action is granted by the index privileges \
             [create_index,manage,all]"
        );
        assert!(principal
            .check_indices("indices:data/read/get", &["ts-accounts"])
            .is_ok());
        assert!(principal.check_bulk().is_err());
    }
}
