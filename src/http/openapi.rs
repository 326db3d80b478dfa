//! The OpenAPI 3.1 document (`/openapi.json`) and Swagger UI (`/docs`, assets vendored at
//! build time so the page works offline).

use axum::Router;
use utoipa::OpenApi;

use super::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "transfer-service",
        description = "Atomic transfers between accounts, by two-phase commit.\n\n\
            `POST /transfers` answers `201` with state `created` at once; a background worker \
            drives the transfer to `finished` or `rolled-back`; poll `GET /transfers/{id}` \
            (or long-poll with `?wait=5s`). A transfer's `id` is its idempotency key. \
            `POST /transfers/batch` takes up to 1,000 transfers, each answered as alone. \
            Beyond `MAX_IN_FLIGHT` transfers in flight, creates answer `503` with \
            `Retry-After`, having created nothing. Every error is `application/problem+json` \
            (RFC 9457)."
    ),
    paths(
        super::accounts::create_account, super::accounts::get_account,
        super::transfers::create_transfer, super::batch::create_batch,
        super::transfers::list_transfers,
        super::transfers::get_transfer, super::transfers::cancel_transfer,
        super::health::livez, super::health::healthz, super::health::readyz, super::health::metrics,
    ),
    components(schemas(super::Problem)),
    tags(
        (name = "accounts", description = "Accounts and their balances"),
        (name = "transfers", description = "Transfers between two accounts"),
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
