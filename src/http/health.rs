//! `GET /livez` and `GET /healthz` (the process is up; they depend on nothing, so an
//! orchestrator restarts the process only when the process itself is stuck), `GET /readyz`
//! (the store is reachable and migrated), `GET /metrics` (Prometheus text format).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::{AppState, QueryParams};
use crate::store::StoreError;

/// The content type of the Prometheus text exposition format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/livez", get(livez))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// The body of `/healthz`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `ok`.
    #[schema(example = "ok")]
    pub status: String,
}

/// The body of `/readyz`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Readiness {
    /// `ready` or `not ready`.
    #[schema(example = "ready")]
    pub status: String,
    /// The backend: `embedded` or `elasticsearch` (which Elasticsearch and OpenSearch both
    /// are).
    #[schema(example = "embedded")]
    pub store: String,
    /// The search engine behind the `elasticsearch` backend once it has answered:
    /// `Elasticsearch 8.19.21`, `OpenSearch 2.19.6`. Absent on the embedded store.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "OpenSearch 2.19.6")]
    pub engine: Option<String>,
    /// Why the store is not ready, in general terms (absent when ready); the store's own
    /// error is in the service's log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Liveness: the process answers. It checks no dependency (a store outage must not make an
/// orchestrator restart every instance); `/readyz` is the one that follows the store.
#[utoipa::path(get, path = "/livez", tag = "operations",
    responses((status = 200, description = "Live", body = Health)))]
pub async fn livez(_: QueryParams) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Liveness (the older name, kept for existing probes): the process answers.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Live", body = Health)))]
pub async fn healthz(_: QueryParams) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Readiness: the store is reachable and migrated.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Store unreachable or not migrated", body = Readiness),
    ))]
pub async fn readyz(
    State(state): State<AppState>,
    _: QueryParams,
) -> (StatusCode, Json<Readiness>) {
    let store = state.engine.store();
    let (status, detail) = match store.ready().await {
        Ok(()) => (StatusCode::OK, None),
        Err(e) => {
            // The store's own words name hosts and indices: they go to the log, not the body.
            tracing::warn!(error = %e, "not ready: the store is unreachable or not migrated");
            let why = match &e {
                StoreError::Unavailable(_) => "the store is unreachable; retry later".to_owned(),
                // Says what an operator must fix, without hosts or index names.
                StoreError::Denied { reason, .. } => format!("the store refuses access: {reason}"),
                StoreError::Permanent(_) => {
                    "the store refuses the service (see the service's log)".to_owned()
                }
            };
            (StatusCode::SERVICE_UNAVAILABLE, Some(why))
        }
    };
    let body = Readiness {
        status: if detail.is_none() {
            "ready"
        } else {
            "not ready"
        }
        .into(),
        store: store.backend().into(),
        engine: store.engine().map(|engine| engine.to_string()),
        detail,
    };
    (status, Json(body))
}

/// Prometheus metrics.
///
/// Every series of the service (transfers, recovery, store requests, HTTP requests) in the
/// Prometheus text exposition format. Counters and histograms start at zero with the process.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition format (version 0.0.4)",
        body = String, content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>, _: QueryParams) -> impl IntoResponse {
    if let Some(engine) = state.engine.store().engine() {
        state
            .metrics
            .store_info
            .with_label_values(&[engine.name(), engine.version()])
            .set(1);
    }
    (
        [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
        state.metrics.encode(),
    )
}
