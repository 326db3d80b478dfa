//! The OpenAPI 3.1 document (`/openapi.json`) and Swagger UI (`/docs`, assets vendored at
//! build time so the page works offline).
//!
//! The document states every constraint the server enforces, in the schema where JSON Schema
//! can say it (patterns, lengths, ranges, enums) and in the description where it cannot
//! (`floor` ≤ `balance`, `from` ≠ `to`, a key that must equal the body's `id`), so that a
//! request valid by the document is one the server accepts, and the reverse. The validated
//! strings are component schemas of their own ([`AccountId`], [`TransferId`], [`Wait`], [`Cursor`], the
//! `Idempotency-Key`s), each pattern written once; the tests generate strings from each
//! pattern and send them. Security (the bearer keys, `401`/`403` on every protected
//! operation) is added by [`BearerKeys`] from the same rule the server applies
//! ([`super::auth::required_scope`]); the `422` of an unknown query parameter on every
//! operation by [`StrictQueries`].

use axum::http::Method;
use axum::Router;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, ObjectBuilder, Ref, Type};
use utoipa::{Modify, OpenApi, ToSchema};

use super::auth::{self, REALM};
use super::transfers::Wait;
use super::AppState;
use crate::auth::Scope;
use crate::transfer::validated::{
    id_pattern, text_schema, AccountId, Currency, HoldExpiry, MetadataSchema, TransferId,
};

text_schema! {
    /// The `next_cursor` of the previous page: `<creation time, ms since the epoch>~<id>`. Any
    /// cursor of that form is accepted (a time past 9999-12-31T23:59:59.999Z reads as that
    /// instant).
    pub struct Cursor {
        pattern: format!("^[0-9]+~{}$", id_pattern(128)),
        example: "1700000000000~t-1",
    }
}

text_schema! {
    /// The `next_cursor` of the previous page of `GET /events`, passed back as `after`:
    /// `<store identity>~<position>`, where the identity is the store's (the embedded store's id,
    /// the Elasticsearch transfers index's uuid) and the position, on the embedded store, that of
    /// a write (`<digits>`), on Elasticsearch `<modification time, ms since the epoch>~<id>`.
    /// `now` is the end of the feed. Only cursors of this service's backend and store are
    /// accepted, and none past the end of its feed (a 422 says why); a position without an
    /// identity (as issued before cursors carried one) is taken as this store's.
    pub struct FeedCursor {
        pattern: format!(
            "^(?:now|(?:[0-9]{{0,63}}[A-Za-z_-][A-Za-z0-9_-]{{0,64}}~)?(?:[0-9]{{1,20}}|[0-9]{{1,15}}~{}))$",
            id_pattern(128)
        ),
        example: "e3f1a2b4c5d6e7f8~1042",
    }
}

text_schema! {
    /// An `Idempotency-Key` of `POST /transfers`: an id (1–128 characters of `[A-Za-z0-9._:-]`,
    /// not `.` or `..`), bare or as a quoted Structured Field string (`"t-1"`).
    pub struct IdempotencyKey {
        pattern: bare_or_quoted(&id_pattern(128)),
        example: "t-1",
    }
}

text_schema! {
    /// An `Idempotency-Key` of `POST /transfers/batch`: an id of 1–124 characters (so that
    /// `<key>:<index>` is an id), bare or as a quoted Structured Field string.
    pub struct BatchIdempotencyKey {
        pattern: bare_or_quoted(&id_pattern(124)),
        example: "batch-7",
    }
}

/// `pattern`, bare or between double quotes (a Structured Field string), anchored.
fn bare_or_quoted(pattern: &str) -> String {
    format!(r#"^(?:{pattern}|"{pattern}")$"#)
}

/// The one value `attention` takes.
#[derive(ToSchema)]
pub enum Attention {
    #[schema(rename = "true")]
    True,
}

/// Declares the bearer keys and, on every operation the server protects, the scope it needs
/// and its `401` and `403` answers; `/metrics` gets them as optional (`METRICS_REQUIRE_AUTH`).
pub struct BearerKeys;

/// The name of the security scheme.
pub const SECURITY_SCHEME: &str = "bearer";

impl Modify for BearerKeys {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "An API key of the service's `API_KEYS_FILE`, as `Authorization: Bearer <key>`. \
                 Needed only when the service is configured with keys (otherwise every route \
                 is open). `GET` needs a key with the `read` scope, every other method `write`.",
            ))
            .build();
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(SECURITY_SCHEME, SecurityScheme::Http(scheme));
        for (path, item) in doc.paths.paths.iter_mut() {
            for (method, operation) in operations(item) {
                if let Some(scope) = auth::required_scope(&method, path, false) {
                    protect(operation, scope, false);
                } else if auth::required_scope(&method, path, true).is_some() {
                    protect(operation, Scope::Read, true);
                }
            }
        }
    }
}

/// The operations of a path, with their methods.
fn operations(item: &mut PathItem) -> impl Iterator<Item = (Method, &mut Operation)> {
    [
        (Method::GET, item.get.as_mut()),
        (Method::PUT, item.put.as_mut()),
        (Method::POST, item.post.as_mut()),
        (Method::DELETE, item.delete.as_mut()),
        (Method::OPTIONS, item.options.as_mut()),
        (Method::HEAD, item.head.as_mut()),
        (Method::PATCH, item.patch.as_mut()),
        (Method::TRACE, item.trace.as_mut()),
    ]
    .into_iter()
    .filter_map(|(method, operation)| operation.map(|o| (method, o)))
}

/// `scope` required (or, when `optional`, required only with `METRICS_REQUIRE_AUTH`), and
/// the `401`/`403` answers.
fn protect(operation: &mut Operation, scope: Scope, optional: bool) {
    let requirement = SecurityRequirement::new(SECURITY_SCHEME, [scope.as_str()]);
    operation.security = Some(if optional {
        vec![SecurityRequirement::default(), requirement]
    } else {
        vec![requirement]
    });
    let when = if optional {
        "With `METRICS_REQUIRE_AUTH` (and API keys)"
    } else {
        "When the service has API keys"
    };
    let answer = |description: String, challenge: &str| {
        let header = HeaderBuilder::new()
            .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
            .description(Some(format!("The challenge, e.g. `{challenge}`")))
            .build();
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/problem+json",
                Content::new(Some(Ref::from_schema_name("Problem"))),
            )
            .header("WWW-Authenticate", header)
            .build()
    };
    let responses = &mut operation.responses.responses;
    responses.insert(
        "401".into(),
        answer(
            format!(
                "{when}: no `Authorization: Bearer` key, or one the service does not know \
                 (mistyped or revoked); `type` `/problems/unauthorized`"
            ),
            &format!(r#"Bearer realm="{REALM}", error="invalid_token""#),
        )
        .into(),
    );
    responses.insert(
        "403".into(),
        answer(
            format!(
                "{when}: the key lacks the `{scope}` scope this operation needs; `type` \
                 `/problems/forbidden`"
            ),
            &format!(r#"Bearer realm="{REALM}", error="insufficient_scope", scope="{scope}""#),
        )
        .into(),
    );
}

/// Adds to every operation the `422` of an unknown or repeated query parameter
/// ([`super::QueryParams`], which every handler takes).
pub struct StrictQueries;

/// What [`StrictQueries`] says an unknown query parameter answers.
const STRICT_QUERY: &str = "an unknown query parameter (names are case-sensitive), or one \
    given twice; `type` `/problems/invalid-field`, the detail naming it";

impl Modify for StrictQueries {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for item in doc.paths.paths.values_mut() {
            for (_, operation) in operations(item) {
                let responses = &mut operation.responses.responses;
                match responses.get_mut("422") {
                    Some(utoipa::openapi::RefOr::T(response)) => {
                        response.description =
                            format!("{}; or {STRICT_QUERY}", response.description);
                    }
                    Some(utoipa::openapi::RefOr::Ref(_)) => {}
                    None => {
                        let mut first = STRICT_QUERY.to_owned();
                        first[..1].make_ascii_uppercase();
                        let response = ResponseBuilder::new()
                            .description(first)
                            .content(
                                "application/problem+json",
                                Content::new(Some(Ref::from_schema_name("Problem"))),
                            )
                            .build();
                        responses.insert("422".into(), response.into());
                    }
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "transfer-service",
        description = "Atomic transfers between accounts: in an embedded store by default, or in \
            Elasticsearch by two-phase commit.\n\n\
            `POST /transfers` answers `201` at once with the transfer as stored: on the \
            embedded store one transaction created and settled it (`finished`, or \
            `rolled-back` with its `reason`; a hold is `created`); on Elasticsearch it is \
            `created` and a background worker drives it to `finished` or `rolled-back`; poll \
            `GET /transfers/{id}` (or long-poll with `?wait=5s`). A transfer's `id` is its idempotency key (or the \
            `Idempotency-Key` header's); ids are kept forever. \
            `POST /transfers/batch` takes up to 1,000 transfers, each answered as alone. \
            Beyond `MAX_IN_FLIGHT` transfers in flight, creates answer `503` with \
            `Retry-After`, having created nothing. Every error is `application/problem+json` \
            (RFC 9457). Input is strict: a body field or query parameter the operation does \
            not have is a `422` naming it. With API keys configured (`API_KEYS_FILE`), `/accounts` and \
            `/transfers` and `/events` need `Authorization: Bearer <key>` (`GET`: scope `read`; other \
            methods: `write`); the probes, `/metrics` (unless `METRICS_REQUIRE_AUTH`) and this \
            document stay open."
    ),
    paths(
        super::accounts::create_account, super::accounts::get_account,
        super::transfers::create_transfer, super::batch::create_batch,
        super::transfers::list_transfers,
        super::transfers::get_transfer, super::transfers::cancel_transfer,
        super::transfers::capture_transfer,
        super::events::list_events,
        super::health::livez, super::health::healthz, super::health::readyz, super::health::metrics,
    ),
    components(schemas(super::Problem, AccountId, TransferId, HoldExpiry, Wait, Cursor, FeedCursor, IdempotencyKey, BatchIdempotencyKey, Attention, Currency, MetadataSchema)),
    modifiers(&BearerKeys, &StrictQueries),
    tags(
        (name = "accounts", description = "Accounts and their balances"),
        (name = "transfers", description = "Transfers between two accounts"),
        (name = "events", description = "The change feed: every transition of every transfer"),
        (name = "operations", description = "Liveness, readiness and metrics"),
    ),
)]
pub struct ApiDoc;

/// The command that rewrites the committed `openapi/openapi.json` from the code.
pub const REGENERATE_COMMAND: &str = "cargo run --quiet -- openapi > openapi/openapi.json";

/// The document as served and as committed at `openapi/openapi.json`.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as the committed file holds it: pretty JSON ending with a newline
/// (`transfer-service openapi` prints it).
pub fn document_json() -> String {
    let mut text = document()
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    text.push('\n');
    text
}

pub fn router() -> Router<AppState> {
    let swagger = utoipa_swagger_ui::SwaggerUi::new("/docs").url("/openapi.json", document());
    Router::new().merge(swagger)
}
