//! `GET /healthz` (the process is up), `GET /readyz` (the store is reachable and migrated),
//! `GET /metrics` (Prometheus text format).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Live")))]
pub async fn healthz() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// Readiness: the store is reachable and migrated.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Ready"), (status = 503, description = "Store unreachable or not migrated")))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let store = &state.engine.store;
    match store.ready().await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({"status": "ready", "store": store.backend()})),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not ready", "store": store.backend(), "detail": e.to_string()})),
        ),
    }
}

/// Every metric of DESIGN §8 in the Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}
