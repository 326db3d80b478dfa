//! `GET /accounts/{id}/entries` and `GET /accounts/{id}/balance?at=`: an account's statement
//! (`docs/api.md`, "Statements"), as JSON or, for spreadsheets, CSV.

use crate::transfer::validated::AccountId;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::error::responses::{NoSuchAccount, StoreUnavailable};
use super::error::{ApiError, Problem};
use super::{shorten, AppState, PathId, QueryParams, QuerySpec};
use crate::time::{format_millis, parse_millis};
use crate::transfer::entries::{Entry, EntryKind};
use crate::transfer::operations::ServiceError;
use crate::transfer::statements::{StatementPage, StatementQuery, Statements};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/accounts/{id}/entries", get(list_entries))
        .route("/accounts/{id}/balance", get(balance_at))
}

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// One change of an account's balance.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StatementEntry {
    /// The account's number for it: 1, 2, 3, ... in the order the account applied them,
    /// with no gaps.
    pub seq: u64,
    /// The transfer that made it.
    pub transfer_id: String,
    /// The change: negative when units left the account.
    pub amount: i64,
    pub kind: EntryKind,
    /// The account's balance once it was made.
    pub balance_after: i64,
    /// When it was made: RFC 3339, UTC, millisecond precision; never earlier than the entry
    /// before it.
    pub at: String,
}

impl From<Entry> for StatementEntry {
    fn from(entry: Entry) -> Self {
        Self {
            seq: entry.seq,
            transfer_id: entry.transfer_id,
            amount: entry.amount,
            kind: entry.kind,
            balance_after: entry.balance_after,
            at: format_millis(entry.at),
        }
    }
}

/// A page of a statement, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StatementEntries {
    pub items: Vec<StatementEntry>,
    /// Pass as `cursor` for the next (older) page; `null` on the last.
    pub next_cursor: Option<String>,
}

/// An account's balance at an instant.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BalanceAt {
    pub balance: i64,
    /// The instant asked for, as given back in the service's form.
    pub at: String,
    /// The `seq` of the last entry made at or before `at`; absent when none was (the
    /// opening balance).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

/// The query of `GET /accounts/{id}/entries`.
pub struct EntriesPageQuery;

impl QuerySpec for EntriesPageQuery {
    const NAMES: &'static [&'static str] = &["after", "before", "limit", "cursor"];
    const EXAMPLE: &'static str = "?after=2026-10-01T00:00:00Z&limit=100";
}

/// The query of `GET /accounts/{id}/balance`.
pub struct BalanceQuery;

impl QuerySpec for BalanceQuery {
    const NAMES: &'static [&'static str] = &["at"];
    const EXAMPLE: &'static str = "?at=2026-10-31T23:59:59.999Z";
}

/// The account's entries, newest first: every change of its balance in the order the
/// account applied them, with the balance each left (`Accept: text/csv` for CSV).
///
/// Each entry's `balance_after` is the one before plus its `amount`, and the newest is the
/// account's balance. A transfer that rolled back after it was applied shows both its
/// entry and its reversal; one that never reached the account shows neither.
#[utoipa::path(get, path = "/accounts/{id}/entries", tag = "accounts",
    params(
        ("id" = crate::transfer::validated::AccountId, Path,
            description = "Account id (any value that is not one is 404)"),
        ("after" = Option<String>, Query, format = DateTime,
            description = "Only entries made after this instant (RFC 3339)"),
        ("before" = Option<String>, Query, format = DateTime,
            description = "Only entries made before this instant (RFC 3339)"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 1000, description = "Page size, 1–1000, default 100"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page (opaque)"),
    ),
    responses(
        (status = 200, description = "A page, newest first (`Accept: text/csv`: the same entries as CSV, the next page's cursor in the `next-cursor` header)",
            content((StatementEntries = "application/json"), (String = "text/csv"))),
        NoSuchAccount,
        (status = 422, description = "Bad, unknown or repeated parameter", body = Problem, content_type = "application/problem+json"),
        StoreUnavailable,
    ))]
pub async fn list_entries(
    account: AccountStatement,
    QueryParams(params, _, _): QueryParams<EntriesPageQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (statements, id) = account.of_valid_id()?;
    let mut query = StatementQuery {
        limit: DEFAULT_LIMIT as u64,
        ..StatementQuery::default()
    };
    for (key, value) in &params {
        match key.as_str() {
            "after" => query.after = Some(instant(value, "after")?),
            "before" => query.before = Some(instant(value, "before")?),
            "limit" => query.limit = super::parse_limit(value, MAX_LIMIT)? as u64,
            "cursor" => query.below = Some(cursor(value)?),
            other => {
                return Err(ApiError::Invalid(format!(
                    "unknown parameter `{}`",
                    shorten(other)
                )))
            }
        }
    }
    let page = statements.page(&id, &query).await;
    let page = page.map_err(|e| no_account(e, &id))?;
    Ok(if wants_csv(&headers) {
        csv(page).into_response()
    } else {
        Json(json(page)).into_response()
    })
}

/// The account's balance at an instant: after the last entry made at or before it.
#[utoipa::path(get, path = "/accounts/{id}/balance", tag = "accounts",
    params(
        ("id" = crate::transfer::validated::AccountId, Path,
            description = "Account id (any value that is not one is 404)"),
        ("at" = String, Query, format = DateTime, description = "The instant (RFC 3339)"),
    ),
    responses(
        (status = 200, description = "The balance then", body = BalanceAt),
        NoSuchAccount,
        (status = 422, description = "`at` missing or not RFC 3339, or before the account's statement begins", body = Problem, content_type = "application/problem+json"),
        StoreUnavailable,
    ))]
pub async fn balance_at(
    account: AccountStatement,
    QueryParams(params, _, _): QueryParams<BalanceQuery>,
) -> Result<Json<BalanceAt>, ApiError> {
    let (statements, id) = account.of_valid_id()?;
    let at = match params.iter().find(|(key, _)| key.as_str() == "at") {
        Some((_, value)) => instant(value, "at")?,
        None => {
            return Err(ApiError::Invalid(
                "`at` is required: an RFC 3339 instant".into(),
            ))
        }
    };
    let found = statements.balance_at(&id, at).await;
    let found = found.map_err(|e| no_account(e, &id))?;
    Ok(Json(BalanceAt {
        balance: found.balance,
        at: format_millis(at),
        seq: found.entry.map(|entry| entry.seq),
    }))
}

/// An RFC 3339 instant, in epoch milliseconds.
fn instant(value: &str, name: &str) -> Result<i64, ApiError> {
    parse_millis(value).ok_or_else(|| {
        ApiError::Invalid(format!(
            "`{name}`: `{}` is not an RFC 3339 instant, such as 2026-10-31T23:59:59Z",
            shorten(value)
        ))
    })
}

/// A statement cursor: the `seq` to continue below.
fn cursor(value: &str) -> Result<u64, ApiError> {
    value
        .parse::<u64>()
        .ok()
        .filter(|seq| *seq > 0 && value.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| ApiError::Invalid("`cursor` is not one this service issued".into()))
}

/// The statement of the account a route's `{id}` names: the id (`None` for one no account
/// can have, a 404 like an account that does not exist) and the statements to read it from.
pub struct AccountStatement {
    id: Option<AccountId>,
    statements: Statements,
}

impl FromRequestParts<AppState> for AccountStatement {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let PathId(id) = PathId::<AccountId>::from_request_parts(parts, state).await?;
        let statements = Statements::new(state.engine.store().clone());
        Ok(Self { id, statements })
    }
}

impl AccountStatement {
    /// The statements and the account id; 404 for an id no account can have (checked in the
    /// handler, after the query's names, as on every route).
    fn of_valid_id(self) -> Result<(Statements, AccountId), ApiError> {
        let id = self
            .id
            .ok_or_else(|| ApiError::NotFound("no account with this id".into()))?;
        Ok((self.statements, id))
    }
}

fn no_account(error: ServiceError, id: &str) -> ApiError {
    match error {
        ServiceError::NotFound => ApiError::NotFound(format!("no account {id}")),
        other => other.into(),
    }
}

fn wants_csv(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|media| media.split(';').next().unwrap_or("").trim() == "text/csv")
}

fn json(page: StatementPage) -> StatementEntries {
    StatementEntries {
        items: page.items.into_iter().map(StatementEntry::from).collect(),
        next_cursor: page.next.map(|seq| seq.to_string()),
    }
}

/// The page as CSV (RFC 4180): a header line, one line per entry, newest first; the next
/// page's cursor in a `Link`-like header, since CSV has no place for it.
fn csv(page: StatementPage) -> Response {
    let mut text = String::from("seq,transfer_id,amount,kind,balance_after,at\r\n");
    for entry in page.items {
        let entry = StatementEntry::from(entry);
        // Ids are `[A-Za-z0-9._:-]` and kinds single words: nothing needs quoting.
        let kind = serde_json::to_value(entry.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        text.push_str(&format!(
            "{},{},{},{},{},{}\r\n",
            entry.seq, entry.transfer_id, entry.amount, kind, entry.balance_after, entry.at
        ));
    }
    let mut response = ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], text).into_response();
    if let Some(next) = page.next {
        if let Ok(value) = next.to_string().parse() {
            response.headers_mut().insert("next-cursor", value);
        }
    }
    response
}
