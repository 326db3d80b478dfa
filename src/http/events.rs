//! `GET /events`: the change feed (`docs/design.md §11`). Every transition of every transfer,
//! in order per transfer, with no gaps for a reader that follows `next_cursor`; at least once
//! (an event may come again, always with the same `id`).

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::responses::StoreUnavailable;
use super::error::{ApiError, Problem};
use super::transfers::Wait;
use super::{AppState, QueryParams};
use crate::transfer::feed::CursorRefused;
use crate::transfer::validated::{id_pattern, text_schema, MAX_ID_LEN};
use crate::transfer::view::Event;

pub fn router() -> Router<AppState> {
    Router::new().route("/events", get(list_events))
}

/// The query of `GET /events`.
pub struct EventsQuery;

impl super::QuerySpec for EventsQuery {
    const NAMES: &'static [&'static str] = &["after", "limit", "wait"];
    const EXAMPLE: &'static str = "?after=<next_cursor>&wait=30s";
}

const DEFAULT_LIMIT: usize = 100;
pub(crate) const MAX_LIMIT: usize = 1000;

text_schema! {
    /// The `next_cursor` of the previous page of `GET /events`, passed back as `after`:
    /// `<store identity>~<position>`, where the identity is the store's (the embedded store's id,
    /// the Elasticsearch transfers index's uuid) and the position, on the embedded store, that of
    /// a write (`<digits>`), on Elasticsearch `<modification time, ms since the epoch>~<id>`.
    /// `now` is the end of the feed. Only cursors of this service's backend and store are
    /// accepted, and none past the end of its feed (a 422 says why); a position without an
    /// identity (as issued before cursors carried one) is taken as this store's.
    pub struct FeedCursor(String) {
        pattern: format!(
            "^(?:now|(?:[0-9]{{0,63}}[A-Za-z_-][A-Za-z0-9_-]{{0,64}}~)?(?:[0-9]{{1,20}}|[0-9]{{1,15}}~{}))$",
            id_pattern(MAX_ID_LEN)
        ),
        example: "e3f1a2b4c5d6e7f8~1042",
    }
}

/// The cursor as issued: its text.
impl Serialize for FeedCursor {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// A page of the feed.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    pub items: Vec<Event>,
    /// Pass as `after` for the next page (also when this one is empty: keep following it).
    /// Null only while the feed has no events at all.
    pub next_cursor: Option<FeedCursor>,
}

/// The change feed: every event of every transfer, oldest write first. Follow `next_cursor`
/// from the start and you see every event, in order per transfer; an event may come again
/// (same `id`): dedupe on `id`. On Elasticsearch the feed trails the present by the
/// horizon (21 s with the defaults; `docs/design.md §11`).
#[utoipa::path(get, path = "/events", tag = "events",
    params(
        ("after" = Option<FeedCursor>, Query,
            description = "`next_cursor` of the previous page; omit to start at the beginning"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 1000,
            description = "Transfers read per page, 1–1000, default 100 (each brings its events)"),
        ("wait" = Option<Wait>, Query,
            description = "When there is nothing new, long-poll up to this long (`<digits><unit>` repeated, capped at 30 s)"),
    ),
    responses(
        (status = 200, description = "A page (maybe empty)", body = EventPage),
        (status = 422, description = "Bad, unknown or repeated parameter, or a cursor this service did not issue", body = Problem, content_type = "application/problem+json"),
        StoreUnavailable,
    ))]
pub async fn list_events(
    State(state): State<AppState>,
    QueryParams(query, _, _): QueryParams<EventsQuery>,
) -> Result<Json<EventPage>, ApiError> {
    let mut after = None;
    let mut limit = DEFAULT_LIMIT;
    let mut wait = std::time::Duration::ZERO;
    for (key, value) in &query {
        match key.as_str() {
            "after" => after = Some(value.as_str()),
            "limit" => limit = super::parse_limit(value, MAX_LIMIT)?,
            "wait" => wait = *Wait::parse(value)?,
            other => {
                return Err(ApiError::Invalid(format!(
                    "unknown parameter `{}`",
                    super::shorten(other)
                )))
            }
        }
    }
    // Read first: the cursors of the page carry it.
    state.engine.feed().store_identity().await?;
    let after = match after {
        None => None,
        Some(text) => match state.engine.feed().check_cursor(text).await {
            Ok(position) => position,
            Err(CursorRefused::Store(error)) => return Err(error.into()),
            Err(refused) => return Err(ApiError::Invalid(format!("`after`: {refused}"))),
        },
    };
    let page = state.engine.feed().page(after, limit, wait).await?;
    Ok(Json(EventPage {
        items: Event::from_feed(page.items),
        next_cursor: page
            .next
            .map(|position| FeedCursor(state.engine.feed().cursor(&position))),
    }))
}
