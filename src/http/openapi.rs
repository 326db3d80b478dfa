//! The OpenAPI 3.1 document (`/openapi.json`) and Swagger UI (`/docs`, assets vendored at
//! build time so the page works offline).

use axum::Router;
use utoipa::OpenApi;

use super::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "transfer-service", description = "Atomic transfers between accounts, by two-phase commit."),
    paths(
        super::accounts::create_account, super::accounts::get_account,
        super::transfers::create_transfer, super::transfers::list_transfers,
        super::transfers::get_transfer, super::transfers::cancel_transfer,
        super::health::healthz, super::health::readyz, super::health::metrics,
    ),
    components(schemas(super::Problem)),
    tags((name = "accounts"), (name = "transfers"), (name = "operations")),
)]
pub struct ApiDoc;

/// The document as served and as committed at `openapi/openapi.json`.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

pub fn router() -> Router<AppState> {
    let swagger = utoipa_swagger_ui::SwaggerUi::new("/docs").url("/openapi.json", document());
    Router::new().merge(swagger)
}
