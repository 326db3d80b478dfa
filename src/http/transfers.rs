//! `POST /transfers`, `GET /transfers`, `GET /transfers/{id}`, `POST /transfers/{id}/cancel`.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use super::{field, ApiError, AppState, JsonObject, Problem, MAX_WAIT};
use crate::store::{SortKey, TransferFilter};
use crate::transfer::model::{valid_id, TransferDoc, TransferState};
use crate::transfer::service::{Created, NewTransfer};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/transfers", post(create_transfer).get(list_transfers))
        .route("/transfers/{id}", get(get_transfer))
        .route("/transfers/{id}/cancel", post(cancel_transfer))
}

/// A transfer as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Transfer {
    pub id: String,
    pub from: String,
    pub to: String,
    pub amount: i64,
    pub state: TransferState,
    /// Why it rolled back: `insufficient_funds`, `account_not_found`, `balance_overflow`,
    /// `cancelled` or `timed_out`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<TransferDoc> for Transfer {
    fn from(doc: TransferDoc) -> Self {
        Self {
            id: doc.transaction_id,
            from: doc.src_acct,
            to: doc.dest_acct,
            amount: doc.amount,
            state: doc.transaction_state,
            reason: doc.reason.map(|r| r.as_str().to_owned()),
            created_at: doc.creation_time,
            updated_at: doc.modification_time,
        }
    }
}

/// The body of `POST /transfers`.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[allow(dead_code)]
pub struct CreateTransfer {
    /// Idempotency key: 1–128 characters of `[A-Za-z0-9._:-]`. The server makes a UUIDv7
    /// when absent (then a retry is a new transfer).
    pub id: Option<String>,
    /// Source account id.
    pub from: String,
    /// Destination account id (not `from`).
    pub to: String,
    /// Units to move, 1 to 2^63-1.
    pub amount: i64,
}

/// A page of transfers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TransferPage {
    pub items: Vec<Transfer>,
    /// Pass as `cursor` for the next page; null at the end.
    pub next_cursor: Option<String>,
}

/// Accepts a transfer and answers at once; a background worker drives it.
#[utoipa::path(post, path = "/transfers", tag = "transfers", request_body = CreateTransfer,
    responses(
        (status = 201, description = "Accepted in state `created`", body = Transfer,
            headers(("Location" = String, description = "/transfers/{id}"))),
        (status = 200, description = "Identical replay: the transfer as it is now", body = Transfer),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Same id, different request", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_transfer(
    State(state): State<AppState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let id = field::id(&body, "id")?;
    let from = field::required_id(&body, "from")?;
    let to = field::required_id(&body, "to")?;
    let amount = field::required_integer(&body, "amount")?;
    if amount <= 0 {
        return Err(ApiError::Invalid("`amount` must be positive".into()));
    }
    if from == to {
        return Err(ApiError::Invalid("`from` and `to` must differ".into()));
    }
    let id = id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let new = NewTransfer {
        id,
        from,
        to,
        amount,
    };
    Ok(match state.engine.create_transfer(new).await? {
        Created::New(doc) => {
            let location = format!("/transfers/{}", doc.transaction_id);
            (
                StatusCode::CREATED,
                [(header::LOCATION, location)],
                Json(Transfer::from(doc)),
            )
                .into_response()
        }
        Created::Replayed(doc) => (StatusCode::OK, Json(Transfer::from(doc))).into_response(),
    })
}

/// A transfer; with `?wait=5s`, answers as soon as it is terminal or when the wait ends.
#[utoipa::path(get, path = "/transfers/{id}", tag = "transfers",
    params(("id" = String, Path, description = "Transfer id"),
        ("wait" = Option<String>, Query, description = "Long-poll up to this long (e.g. `5s`, at most 30s) for a terminal state")),
    responses(
        (status = 200, description = "The transfer", body = Transfer),
        (status = 404, description = "No such transfer", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid `wait`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_transfer(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Transfer>, ApiError> {
    let wait = match query.get("wait") {
        None => None,
        Some(text) => Some(
            humantime::parse_duration(text)
                .map_err(|_| {
                    ApiError::Invalid("`wait` must be a duration like 5s or 500ms".into())
                })?
                .min(MAX_WAIT),
        ),
    };
    if !valid_id(&id) {
        return Err(ApiError::NotFound(format!("no transfer {id}")));
    }
    let found = match wait {
        Some(wait) => state.engine.wait_transfer(&id, wait).await?,
        None => state.engine.get_transfer(&id).await?,
    };
    found
        .map(|doc| Json(Transfer::from(doc)))
        .ok_or_else(|| ApiError::NotFound(format!("no transfer {id}")))
}

/// Cancels a transfer that has not committed.
#[utoipa::path(post, path = "/transfers/{id}/cancel", tag = "transfers",
    params(("id" = String, Path, description = "Transfer id")),
    responses(
        (status = 200, description = "`terminating` (rollback under way) or `rolled-back`", body = Transfer),
        (status = 404, description = "No such transfer", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already committed or finished", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn cancel_transfer(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Transfer>, ApiError> {
    if !valid_id(&id) {
        return Err(ApiError::NotFound(format!("no transfer {id}")));
    }
    Ok(Json(Transfer::from(
        state.engine.cancel_transfer(&id).await?,
    )))
}

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;

/// Transfers, newest first, optionally of one account and/or in one state. Near-real-time on
/// Elasticsearch: a transfer may take up to a second to appear.
#[utoipa::path(get, path = "/transfers", tag = "transfers",
    params(
        ("account" = Option<String>, Query, description = "Only transfers from or to this account"),
        ("state" = Option<TransferState>, Query, description = "Only transfers in this state"),
        ("limit" = Option<usize>, Query, description = "Page size, 1–1000, default 50"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page", body = TransferPage),
        (status = 422, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_transfers(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<TransferPage>, ApiError> {
    let mut filter = TransferFilter {
        limit: DEFAULT_LIMIT,
        ..TransferFilter::default()
    };
    for (key, value) in &query {
        match key.as_str() {
            "account" if valid_id(value) => filter.account = Some(value.clone()),
            "state" => {
                let s: TransferState = value
                    .parse()
                    .map_err(|_| ApiError::Invalid(format!("unknown state `{value}`")))?;
                filter.state = Some(s.as_str().to_owned());
            }
            "limit" => {
                filter.limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| ApiError::Invalid(format!("`limit` must be 1–{MAX_LIMIT}")))?;
            }
            "cursor" => filter.after = Some(decode_cursor(value)?),
            "account" => {
                return Err(ApiError::Invalid(
                    "`account` must be 1–128 characters of A-Z a-z 0-9 . _ : -".into(),
                ))
            }
            other => return Err(ApiError::Invalid(format!("unknown parameter `{other}`"))),
        }
    }
    let (docs, next) = state.engine.list_transfers(filter).await?;
    Ok(Json(TransferPage {
        items: docs.into_iter().map(Transfer::from).collect(),
        next_cursor: next.map(|k| format!("{}~{}", k.millis, k.id)),
    }))
}

fn decode_cursor(text: &str) -> Result<SortKey, ApiError> {
    let invalid = || ApiError::Invalid("`cursor` is not one this service issued".into());
    let (millis, id) = text.split_once('~').ok_or_else(invalid)?;
    let millis = millis.parse().map_err(|_| invalid())?;
    if !valid_id(id) {
        return Err(invalid());
    }
    Ok(SortKey {
        millis,
        id: id.to_owned(),
    })
}
