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
//!
//! The document is also written for the clients generators make from it (docs/api.md,
//! "Generated clients"; tests/http/generated_clients.rs runs three): a body that may be absent
//! is optional, not `null` ([`OptionalBodies`]); the two shapes of a transfer are a `oneOf`
//! with their `required` lists ([`TransferShapes`]), so that no generator sends an empty
//! `legs`; an event's `type` is an enum and its `at` a date-time ([`EventTypes`]); the
//! metadata filter is an array parameter ([`MetadataFilter`]); every request body has
//! examples the server accepts as they are.

use axum::http::Method;
use axum::Router;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, ObjectBuilder, Ref, Type};
use utoipa::{Modify, OpenApi};

use super::auth::{self, REALM};
use super::events::FeedCursor;
use super::idempotency::{BatchIdempotencyKey, IdempotencyKey};
use super::transfers::{Attention, Cursor, MetadataFilter, Wait};
use super::AppState;
use crate::auth::Scope;
use crate::transfer::history::EventKind;
use crate::transfer::model::TransferState;
use crate::transfer::validated::{AccountId, Currency, HoldExpiry, Metadata, TransferId};

/// Declares the bearer keys and, on every operation the server can protect, the scope it
/// needs and its `401` and `403` answers. The requirement is optional (`[{}, bearer]`): the
/// service is open until it is configured with keys (`API_KEYS_FILE`; `/metrics` needs
/// `METRICS_REQUIRE_AUTH` too), so a generated client must be usable without a token.
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

/// `scope`, or no key at all (the service without keys), and the `401`/`403` answers of a
/// service with keys (for `/metrics`, `metrics_only`: with `METRICS_REQUIRE_AUTH` too).
fn protect(operation: &mut Operation, scope: Scope, metrics_only: bool) {
    let requirement = SecurityRequirement::new(SECURITY_SCHEME, [scope.as_str()]);
    operation.security = Some(vec![SecurityRequirement::default(), requirement]);
    let when = if metrics_only {
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

/// A request body that may be absent is not required, and its schema is the body's, not
/// `oneOf [body, null]` (what an `Option` body derives): generators read the `null` as a body
/// to send (`null`, a 422) or fail to serialize it, where an absent body is meant.
pub struct OptionalBodies;

impl Modify for OptionalBodies {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{Schema, Type as Kind};
        use utoipa::openapi::{RefOr, Required};
        for item in doc.paths.paths.values_mut() {
            for (_, operation) in operations(item) {
                let Some(RefOr::T(body)) = operation.request_body.as_mut() else {
                    continue;
                };
                for content in body.content.values_mut() {
                    let RefOr::T(content) = content else { continue };
                    let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema else {
                        continue;
                    };
                    let is_null = |member: &RefOr<Schema>| {
                        matches!(member, RefOr::T(Schema::Object(o))
                            if o.schema_type == Kind::Null.into())
                    };
                    let [first, second] = one_of.items.as_slice() else {
                        continue;
                    };
                    let inner = match (is_null(first), is_null(second)) {
                        (false, true) => first.clone(),
                        (true, false) => second.clone(),
                        _ => continue,
                    };
                    content.schema = Some(inner);
                    body.required = Some(Required::False);
                }
            }
        }
    }
}

/// `CreateTransfer` as a `oneOf` of its two shapes, built from the one body type the server
/// reads ([`super::transfers::CreateTransfer`]): `OneLegTransfer` (`from`, `to` and `amount`
/// required, no `legs`) and `MultiLegTransfer` (`legs` required, none of the three), each
/// closed (`additionalProperties: false`), so that exactly one shape fits a valid body and a
/// generated client never sends the other shape's fields (an empty `legs` is a 422).
pub struct TransferShapes;

/// The fields of a one-leg transfer that a multi-leg one has in `legs` instead.
const ONE_LEG_FIELDS: [&str; 3] = ["from", "to", "amount"];

impl Modify for TransferShapes {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{OneOfBuilder, Schema};
        use utoipa::openapi::RefOr;
        let schemas = &mut doc.components.get_or_insert_with(Default::default).schemas;
        let Some(RefOr::T(Schema::Object(both))) = schemas.get("CreateTransfer").cloned() else {
            panic!("CreateTransfer is an object schema")
        };
        let mut one_leg = both.clone();
        one_leg.properties.remove("legs");
        one_leg.required = ONE_LEG_FIELDS.map(String::from).to_vec();
        one_leg.description = Some(
            "A transfer of `amount` units from `from` to `to` (the body of `POST /transfers`, \
             or an item of a batch). Any other field is a 422 naming it (names are \
             case-sensitive: `Hold` is not `hold`)."
                .into(),
        );
        one_leg.examples = vec![serde_json::json!(
            {"from": "alice", "to": "bob", "amount": 100, "metadata": {"order_id": "123"}}
        )];
        let mut multi_leg = both;
        for field in ONE_LEG_FIELDS {
            multi_leg.properties.remove(field);
        }
        multi_leg.required = vec!["legs".into()];
        multi_leg.description = Some(
            "A transfer of several legs, all applied or none (the body of `POST /transfers`, \
             or an item of a batch). Any other field is a 422 naming it."
                .into(),
        );
        multi_leg.examples = vec![serde_json::json!({"legs": [
            {"from": "alice", "to": "bob", "amount": 95},
            {"from": "alice", "to": "fees", "amount": 5},
        ]})];
        let shapes = OneOfBuilder::new()
            .item(Ref::from_schema_name("OneLegTransfer"))
            .item(Ref::from_schema_name("MultiLegTransfer"))
            .description(Some(
                "The body of `POST /transfers` (and an item of a batch): one leg (`from`, `to`, \
                 `amount`) or several (`legs`), never both (a 422).",
            ))
            .examples([
                serde_json::json!({"from": "alice", "to": "bob", "amount": 100}),
                serde_json::json!({"from": "alice", "to": "bob", "amount": 50, "hold": true,
                    "hold_expires_in": "10m"}),
            ]);
        schemas.insert("OneLegTransfer".into(), Schema::Object(one_leg).into());
        schemas.insert("MultiLegTransfer".into(), Schema::Object(multi_leg).into());
        schemas.insert(
            "CreateTransfer".into(),
            Schema::OneOf(shapes.build()).into(),
        );
    }
}

/// An event's `type` as the enum of every type the feed and the webhooks send, and its `at`
/// a date-time (`crate::transfer::view::Event` derives both as plain strings).
pub struct EventTypes;

impl Modify for EventTypes {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{KnownFormat, Schema, SchemaFormat};
        use utoipa::openapi::RefOr;
        let schemas = &mut doc.components.get_or_insert_with(Default::default).schemas;
        let Some(RefOr::T(Schema::Object(event))) = schemas.get_mut("Event") else {
            panic!("Event is an object schema")
        };
        let types: Vec<serde_json::Value> = TransferState::ALL
            .into_iter()
            .map(EventKind::State)
            .chain([EventKind::Captured])
            .map(|kind| kind.type_name().into())
            .collect();
        if let Some(RefOr::T(Schema::Object(kind))) = event.properties.get_mut("type") {
            kind.enum_values = Some(types);
        }
        if let Some(RefOr::T(Schema::Object(at))) = event.properties.get_mut("at") {
            at.format = Some(SchemaFormat::KnownFormat(KnownFormat::DateTime));
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
        super::statements::list_entries, super::statements::balance_at,
        super::transfers::create_transfer, super::batch::create_batch,
        super::transfers::list_transfers,
        super::transfers::get_transfer, super::transfers::cancel_transfer,
        super::transfers::capture_transfer,
        super::events::list_events,
        super::health::livez, super::health::healthz, super::health::readyz, super::health::metrics,
    ),
    components(schemas(super::Problem, AccountId, TransferId, HoldExpiry, Wait, Cursor, FeedCursor, IdempotencyKey, BatchIdempotencyKey, Attention, Currency, Metadata, MetadataFilter)),
    modifiers(&BearerKeys, &StrictQueries, &OptionalBodies, &TransferShapes, &EventTypes),
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

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::document;
    use crate::transfer::requests::MAX_LEGS;
    use crate::transfer::validated::METADATA_MAX_KEYS;

    /// utoipa's attributes take only literals, so the limits the document states are written
    /// there again: this holds each to the one constant the server checks.
    #[test]
    fn the_limits_the_document_states_are_the_servers_constants() {
        let doc = serde_json::to_value(document()).expect("the document serializes");
        let at = |pointer: &str| doc.pointer(pointer).and_then(Value::as_u64);
        let parameter = |path: &str, name: &str, limit: &str| {
            doc["paths"][path]["get"]["parameters"]
                .as_array()
                .and_then(|all| all.iter().find(|p| p["name"] == name))
                .and_then(|p| p["schema"][limit].as_u64())
        };
        let schemas = "/components/schemas";
        for (stated, limit) in [
            (
                at(&format!(
                    "{schemas}/MultiLegTransfer/properties/legs/maxItems"
                )),
                MAX_LEGS,
            ),
            (
                at(&format!(
                    "{schemas}/CreateBatch/properties/transfers/maxItems"
                )),
                super::super::batch::MAX_BATCH,
            ),
            (
                parameter("/transfers", "metadata", "maxItems"),
                METADATA_MAX_KEYS,
            ),
            (
                parameter("/transfers", "limit", "maximum"),
                super::super::transfers::MAX_LIMIT,
            ),
            (
                parameter("/events", "limit", "maximum"),
                super::super::events::MAX_LIMIT,
            ),
        ] {
            assert_eq!(stated, Some(limit as u64));
        }
    }
}
