//! `POST /accounts`, `GET /accounts/{id}`.

use crate::transfer::validated::AccountId;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use super::body::{json_fields, Integer, MetadataField, Text};
use super::error::responses::{JsonBodyRefused, StoreUnavailable};
use super::{field, ApiError, AppState, JsonFields, PathId, Problem, QueryParams};
use crate::transfer::model::AccountDoc;
use crate::transfer::operations::Created;
use crate::transfer::requests::NewAccount;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/accounts", post(create_account))
        .route("/accounts/{id}", get(get_account))
}

/// An account as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Account {
    pub id: String,
    pub balance: i64,
    /// The lowest balance a debit may leave.
    pub floor: i64,
    /// What a transfer out may take now: balance less uncommitted credits and the floor.
    pub available: i64,
    /// Transfers applied to the balance and not yet settled.
    pub pending_transactions: Vec<String>,
    /// Its currency, fixed when it was opened; absent for an account without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::transfer::validated::Currency>, nullable = false)]
    pub currency: Option<String>,
    /// Its labels, as given when it was opened; absent when it has none.
    #[serde(skip_serializing_if = "crate::transfer::model::Metadata::is_empty")]
    #[schema(value_type = Option<crate::transfer::validated::Metadata>, nullable = false)]
    pub metadata: crate::transfer::model::Metadata,
    /// When it was opened: RFC 3339, UTC, millisecond precision.
    #[schema(format = DateTime)]
    pub created_at: String,
    /// When it was last written (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl Account {
    fn from_doc(id: String, doc: AccountDoc) -> Self {
        Self {
            id,
            balance: doc.balance,
            floor: doc.floor,
            available: doc.available().clamp(0, i64::MAX as i128) as i64,
            pending_transactions: doc.pending_transactions,
            currency: doc.currency,
            metadata: doc.metadata,
            created_at: doc.creation_time,
            updated_at: doc.modification_time,
        }
    }
}

json_fields! {
    /// The body of `POST /accounts`. Any other field is a 422 naming it (names are
    /// case-sensitive).
    #[schema(examples(json!({"id": "alice", "balance": 1000, "metadata": {"owner": "team-7"}})))]
    pub struct CreateAccount ("an account") {
        /// 1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`.
        #[schema(value_type = crate::transfer::validated::AccountId)]
        id: Text,
        /// Opening balance, a signed 64-bit integer; at least `floor` (so at least 0 when `floor`
        /// is absent), else 422.
        #[schema(value_type = i64)]
        balance: Integer,
        /// Lowest balance a debit may leave, a signed 64-bit integer; default 0; at most
        /// `balance`, else 422.
        #[schema(value_type = Option<i64>)]
        floor: Integer,
        /// The account's currency (1–16 characters of `[A-Z0-9_]`), fixed for its life; absent
        /// or null: none. A transfer moves units only between accounts of one currency (or
        /// between accounts without one).
        #[schema(value_type = Option<crate::transfer::validated::Currency>)]
        currency: Text,
        /// Labels (such as an owner): at most 16 keys of `[a-z0-9_.-]{1,40}`, string values of
        /// at most 256 characters; absent or null: none. Part of the replay comparison.
        #[schema(value_type = Option<crate::transfer::validated::Metadata>)]
        metadata: MetadataField,
    }
}

/// Opens an account with an opening balance (and optionally a currency). Replaying the same
/// request (same balance, floor, currency and metadata) answers 200; another one with the same id 409.
#[utoipa::path(post, path = "/accounts", tag = "accounts",
    request_body = CreateAccount,
    responses(
        (status = 201, description = "Account opened", body = Account),
        (status = 200, description = "Identical replay", body = Account),
        (status = 409, description = "The id exists with other data", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field", body = Problem, content_type = "application/problem+json"),
        JsonBodyRefused,
        StoreUnavailable,
    ))]
pub async fn create_account(
    State(state): State<AppState>,
    _: QueryParams,
    JsonFields(body): JsonFields<CreateAccount>,
) -> Result<Response, ApiError> {
    let new = NewAccount::try_from(body)?;
    let id = new.id().clone();
    Ok(match state.engine.create_account(new).await? {
        Created::New(doc) => {
            (StatusCode::CREATED, Json(Account::from_doc(id.into(), doc))).into_response()
        }
        Created::Replayed(doc) => {
            (StatusCode::OK, Json(Account::from_doc(id.into(), doc))).into_response()
        }
    })
}

impl TryFrom<CreateAccount> for NewAccount {
    type Error = ApiError;

    /// The body, each field read once into its validated value (422 on the first invalid
    /// one), and an opening balance not below the floor.
    fn try_from(body: CreateAccount) -> Result<Self, ApiError> {
        field::known_and_once(&body)?;
        let id = field::account_id(body.id, "id")?;
        let balance = field::required_integer(body.balance, "balance")?;
        let floor = field::integer(body.floor, "floor")?.unwrap_or(0);
        let currency = field::currency(body.currency, "currency")?;
        let metadata = field::metadata(body.metadata, "metadata")?;
        let new = NewAccount::open(id, balance, floor)
            .map_err(|refused| ApiError::Invalid(refused.to_string()))?;
        Ok(new.with_currency(currency).with_metadata(metadata))
    }
}

/// An account's balance and pending transfers.
#[utoipa::path(get, path = "/accounts/{id}", tag = "accounts",
    params(("id" = crate::transfer::validated::AccountId, Path,
        description = "Account id (1–128 characters of `[A-Za-z0-9._:-]`, not `.` or `..`; any other value is 404)")),
    responses(
        (status = 200, description = "The account", body = Account),
        (status = 404, description = "No such account", body = Problem, content_type = "application/problem+json"),
        StoreUnavailable,
    ))]
pub async fn get_account(
    State(state): State<AppState>,
    PathId(id): PathId<AccountId>,
    _: QueryParams,
) -> Result<Json<Account>, ApiError> {
    let Some(id) = id else {
        return Err(ApiError::NotFound("no account with this id".into()));
    };
    match state.engine.get_account(&id).await? {
        Some(doc) => Ok(Json(Account::from_doc(id.into(), doc))),
        None => Err(ApiError::NotFound(format!("no account {id}"))),
    }
}
