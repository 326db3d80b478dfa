//! HTTP routing: one axum fallback handler that decodes the path, counts the request by
//! kind, applies injected failures, reads the body (up to 100 MiB), checks URL parameters,
//! and dispatches to [`handlers`](crate::handlers). Routing by hand (rather than axum routes)
//! keeps Elasticsearch's own answers for unknown paths (400), wrong methods (405) and index
//! names that start with `_`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::response::Response;
use axum::Router;

use crate::capacity::AnswerAt;
use crate::errors::{self, EsError};
use crate::filter_path::FilterPath;
use crate::handlers;
use crate::security::Principal;
use crate::Shared;

/// `http.max_content_length` of Elasticsearch.
pub const MAX_BODY: usize = 100 * 1024 * 1024;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// The URL query parameters of a request, decoded, in order.
#[derive(Debug, Default)]
pub struct Params(pub Vec<(String, String)>);

impl Params {
    pub fn parse(query: Option<&str>) -> Self {
        Params(
            query
                .map(|q| {
                    url::form_urlencoded::parse(q.as_bytes())
                        .map(|(k, v)| (k.into_owned(), v.into_owned()))
                        .collect()
                })
                .unwrap_or_default(),
        )
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A boolean parameter: `true`, `false`, or present without a value (`true`).
    pub fn bool(&self, name: &str) -> Result<Option<bool>, EsError> {
        match self.get(name) {
            None => Ok(None),
            Some("true" | "") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(other) => Err(EsError::illegal_argument(format!(
                "Failed to parse value [{other}] as only [true] or [false] are allowed."
            ))),
        }
    }

    pub fn long(&self, name: &str) -> Result<Option<i64>, EsError> {
        self.get(name)
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    EsError::illegal_argument(format!(
                        "Failed to parse long parameter [{name}] with value [{v}]"
                    ))
                })
            })
            .transpose()
    }

    /// Refuses, as not implemented by this test double, a parameter given with a value other
    /// than those that change nothing on the emulated one-node, one-shard cluster.
    pub fn refuse_unless(&self, name: &str, harmless: &[&str]) -> Result<(), EsError> {
        match self.get(name) {
            Some(value) if !harmless.contains(&value) => {
                Err(EsError::unsupported(&format!("{name}={value}")))
            }
            _ => Ok(()),
        }
    }

    /// Checks the parameters of an API that names several indices: `allowed` and the
    /// multi-target ones (`allow_no_indices`, `expand_wildcards` as
    /// [`Params::check_expand_wildcards`] allows it, `ignore_unavailable`); answers
    /// `ignore_unavailable` (default `false`).
    pub fn check_multi_target(&self, path: &str, allowed: &[&str]) -> Result<bool, EsError> {
        let multi_target = ["allow_no_indices", "expand_wildcards", "ignore_unavailable"];
        let all: Vec<&str> = multi_target.iter().chain(allowed).copied().collect();
        self.check(path, &all)?;
        self.check_expand_wildcards()?;
        Ok(self.bool("ignore_unavailable")?.unwrap_or(false))
    }

    /// `expand_wildcards`: the emulator has only open, visible indices, so any value that
    /// includes `open` (or `all`) resolves as the default does; the others are refused.
    pub fn check_expand_wildcards(&self) -> Result<(), EsError> {
        let Some(value) = self.get("expand_wildcards") else {
            return Ok(());
        };
        let words: Vec<&str> = value.split(',').collect();
        let known = words
            .iter()
            .all(|w| matches!(*w, "open" | "all" | "closed" | "hidden" | "none"));
        if known && words.iter().any(|w| matches!(*w, "open" | "all")) {
            return Ok(());
        }
        Err(EsError::unsupported(&format!("expand_wildcards={value}")))
    }

    /// 400 for any parameter not in `allowed` (nor a parameter every API accepts).
    pub fn check(&self, path: &str, allowed: &[&str]) -> Result<(), EsError> {
        const EVERYWHERE: [&str; 4] = ["pretty", "human", "error_trace", "filter_path"];
        let mut unknown: Vec<&str> = self
            .0
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| !allowed.contains(k) && !EVERYWHERE.contains(k))
            .collect();
        unknown.dedup();
        match unknown.as_slice() {
            [] => Ok(()),
            [one] => Err(EsError::illegal_argument(format!(
                "request [{path}] contains unrecognized parameter: [{one}]"
            ))),
            many => Err(EsError::illegal_argument(format!(
                "request [{path}] contains unrecognized parameters: [{}]",
                many.join("], [")
            ))),
        }
    }
}

/// Everything a handler needs about one request.
pub struct Ctx<'a> {
    pub shared: &'a Arc<Shared>,
    pub method: &'a Method,
    pub path: &'a str,
    pub params: &'a Params,
    pub body: &'a [u8],
    pub started: Instant,
    /// Who sent the request, when security is on (`_bulk` authorizes each item with it).
    pub principal: Option<&'a Principal>,
    /// The end of the last shard operation the request reserved in the capacity model
    /// (`crate::capacity`): it answers no earlier.
    pub answer_at: AnswerAt,
}

impl Ctx<'_> {
    pub fn took(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// The endpoints.
#[derive(Debug, Clone)]
pub enum Route {
    Info,
    Health(Option<String>),
    Bulk(Option<String>),
    Refresh(Option<String>),
    Search(Option<String>),
    Count(Option<String>),
    Index(String),
    Doc(String, Option<String>),
    Create(String, String),
    /// `/{index}/_mapping`.
    Mapping(String),
    /// `/{index}/_stats[/{metric}]`: one copy's routing, checkpoints and primary term.
    Stats(String, Option<String>),
    /// An Elasticsearch API this double does not implement.
    Unsupported,
    NoHandler,
}

fn percent_decode(segment: &str) -> Result<String, EsError> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(byte) => {
                    out.push(byte);
                    i += 3;
                    continue;
                }
                None => {
                    return Err(EsError::illegal_argument(format!(
                        "partial escape sequence at end of string: {segment}"
                    )))
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).map_err(|_| {
        EsError::illegal_argument(format!("invalid UTF-8 in path segment [{segment}]"))
    })
}

/// Elasticsearch APIs outside the emulated subset (answered 400 "not implemented").
const KNOWN_APIS: [&str; 34] = [
    "_update",
    "_source",
    "_mget",
    "_msearch",
    "_mapping",
    "_mappings",
    "_settings",
    "_cat",
    "_nodes",
    "_cluster",
    "_delete_by_query",
    "_update_by_query",
    "_ingest",
    "_scripts",
    "_aliases",
    "_alias",
    "_index_template",
    "_template",
    "_component_template",
    "_license",
    "_xpack",
    "_security",
    "_snapshot",
    "_tasks",
    "_reindex",
    "_flush",
    "_forcemerge",
    "_stats",
    "_open",
    "_close",
    "_explain",
    "_termvectors",
    "_pit",
    "_analyze",
];

fn route_of(segments: &[String]) -> Route {
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let own = |name: &str| Some(name.to_owned());
    match s.as_slice() {
        [] => Route::Info,
        ["_cluster", "health"] => Route::Health(None),
        ["_cluster", "health", index] => Route::Health(own(index)),
        ["_bulk"] => Route::Bulk(None),
        ["_refresh"] => Route::Refresh(None),
        ["_search"] => Route::Search(None),
        ["_count"] => Route::Count(None),
        // `/_search/scroll` and the like.
        [first, ..] if KNOWN_APIS.contains(first) || *first == "_search" => Route::Unsupported,
        // Any other first segment is an index name, `_x` included: Elasticsearch routes
        // `GET /_x` to the get-index API, which refuses the name (400
        // `invalid_index_name_exception`, observed on 8.19.21), not "no handler".
        [index] => Route::Index((*index).to_owned()),
        [index, "_bulk"] => Route::Bulk(own(index)),
        [index, "_refresh"] => Route::Refresh(own(index)),
        [index, "_search"] => Route::Search(own(index)),
        [index, "_count"] => Route::Count(own(index)),
        [index, "_doc"] => Route::Doc((*index).to_owned(), None),
        [index, "_doc", id] => Route::Doc((*index).to_owned(), own(id)),
        [index, "_create", id] => Route::Create((*index).to_owned(), (*id).to_owned()),
        [index, "_mapping"] => Route::Mapping((*index).to_owned()),
        [index, "_stats"] => Route::Stats((*index).to_owned(), None),
        [index, "_stats", metric] => Route::Stats((*index).to_owned(), own(metric)),
        [_, api, ..] if KNOWN_APIS.contains(api) => Route::Unsupported,
        _ => Route::NoHandler,
    }
}

/// The counter a request goes to.
fn kind_of(route: &Route, method: &Method, params: &Params) -> &'static str {
    match route {
        Route::Info | Route::Health(_) => "info",
        Route::Bulk(_) => "bulk",
        Route::Refresh(_) => "refresh",
        Route::Search(_) | Route::Count(_) => "search",
        Route::Index(_) | Route::Mapping(_) | Route::Stats(..) => "indices",
        Route::Create(..) => "create",
        Route::Doc(..) if matches!(*method, Method::GET | Method::HEAD) => "get",
        Route::Doc(..) if *method == Method::DELETE => "delete",
        Route::Doc(..) if params.get("op_type") == Some("create") => "create",
        Route::Doc(..) => "index",
        Route::Unsupported | Route::NoHandler => "other",
    }
}

/// Elasticsearch's answer to a path no REST handler matches: 400 with a plain-string
/// `error` and no `status` (observed on 8.19.21: `{"error":"no handler found for uri
/// [/i/_doc/1/x] and method [GET]"}`).
fn no_handler(path: &str, method: &Method) -> Response {
    let body = serde_json::json!({
        "error": format!("no handler found for uri [{path}] and method [{method}]"),
    });
    errors::json_response(400, &body)
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let method = parts.method;
    let path = parts.uri.path().to_owned();
    let params = Params::parse(parts.uri.query());
    let head = method == Method::HEAD;

    let decoded: Result<Vec<String>, EsError> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let route = match &decoded {
        Ok(segments) => route_of(segments),
        Err(_) => Route::NoHandler,
    };
    shared.count(kind_of(&route, &method, &params));
    if let Some(traceparent) = parts.headers.get("traceparent") {
        shared.record_traceparent(traceparent.to_str().unwrap_or_default());
    }

    let principal = match &shared.security {
        None => Ok(None),
        Some(security) => {
            let uri = parts
                .uri
                .path_and_query()
                .map_or_else(|| path.clone(), |pq| pq.as_str().to_owned());
            security.authenticate(&parts.headers, &uri).and_then(|p| {
                match authorize(&p, &route, &method, &params) {
                    Ok(()) => Ok(Some(p)),
                    Err(error) => Err(Box::new(error.into_response())),
                }
            })
        }
    };
    let response = match (principal, shared.take_fault()) {
        (Err(refused), _) => *refused,
        (Ok(_), Some(status)) => EsError::injected(status).into_response(),
        (Ok(principal), None) => match decoded {
            Err(error) => error.into_response(),
            Ok(_) => match read_body(body, &parts.headers).await {
                Err(response) => response,
                Ok(bytes) => {
                    let ctx = Ctx {
                        shared: &shared,
                        method: &method,
                        path: &path,
                        params: &params,
                        body: &bytes,
                        started,
                        principal: principal.as_ref(),
                        answer_at: AnswerAt::default(),
                    };
                    dispatch(&ctx, route).await
                }
            },
        },
    };
    let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    shared.request_nanos.fetch_add(took, Ordering::Relaxed);
    if head {
        let (parts, _) = response.into_parts();
        Response::from_parts(parts, Body::empty())
    } else {
        response
    }
}

/// The action Elasticsearch authorizes for a request, and its check against the principal's
/// grant (`security` module; `_bulk` items are checked one by one in the handler).
fn authorize(
    principal: &Principal,
    route: &Route,
    method: &Method,
    params: &Params,
) -> Result<(), EsError> {
    use Method as M;
    let on = |action: &str, index: &Option<String>| {
        let names: Vec<&str> = index
            .as_deref()
            .map_or(vec!["*"], |i| i.split(',').collect());
        principal.check_indices(action, &names)
    };
    let one = |i: &String| Some(i.clone());
    match (route, method) {
        (Route::Info, _) => principal.check_cluster("cluster:monitor/main"),
        (Route::Health(_), _) => principal.check_cluster("cluster:monitor/health"),
        (Route::Bulk(_), _) => principal.check_bulk(),
        (Route::Refresh(index), _) => on("indices:admin/refresh", index),
        (Route::Search(index) | Route::Count(index), _) => on("indices:data/read/search", index),
        (Route::Index(index), &M::PUT) => on("indices:admin/create", &one(index)),
        (Route::Index(index), &M::DELETE) => on("indices:admin/delete", &one(index)),
        (Route::Index(index), _) => on("indices:admin/get", &one(index)),
        (Route::Stats(index, _), _) => on("indices:monitor/stats", &one(index)),
        (Route::Mapping(index), &M::GET) => on("indices:admin/mappings/get", &one(index)),
        (Route::Mapping(index), _) => on("indices:admin/mapping/put", &one(index)),
        (Route::Doc(index, _), &M::GET | &M::HEAD) => on("indices:data/read/get", &one(index)),
        (Route::Doc(index, _), &M::DELETE) => on("indices:data/write/delete", &one(index)),
        (Route::Doc(index, _), _) if params.get("op_type") == Some("create") => {
            on("indices:data/write/index:op_type/create", &one(index))
        }
        (Route::Doc(index, _), _) => on("indices:data/write/index:op_type/index", &one(index)),
        (Route::Create(index, _), _) => on("indices:data/write/index:op_type/create", &one(index)),
        (Route::Unsupported | Route::NoHandler, _) => Ok(()),
    }
}

async fn read_body(body: Body, headers: &axum::http::HeaderMap) -> Result<Vec<u8>, Response> {
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|_| {
        EsError::new(
            413,
            "content_too_long_exception",
            format!("request body is larger than http.max_content_length [{MAX_BODY}] bytes"),
        )
        .into_response()
    })?;
    if !bytes.is_empty() {
        if let Some(content_type) = headers.get(header::CONTENT_TYPE) {
            let text = content_type.to_str().unwrap_or("").to_ascii_lowercase();
            // JSON and NDJSON, plain or as `application/vnd.elasticsearch+json`.
            if !text.contains("json") {
                let body = serde_json::json!({
                    "error": format!("Content-Type header [{text}] is not supported"),
                    "status": 406,
                });
                return Err(errors::json_response(406, &body));
            }
        }
    }
    Ok(bytes.to_vec())
}

async fn dispatch(ctx: &Ctx<'_>, route: Route) -> Response {
    // Refused before anything runs: a write must not be applied for an answer that cannot
    // be given.
    let filter = match ctx.params.get("filter_path").map(FilterPath::parse) {
        Some(Err(refused)) => return refused.into_response(),
        Some(Ok(filter)) => filter,
        None => None,
    };
    let answered = answer(ctx, route).await;
    ctx.answer_at
        .wait(&ctx.shared.wake, &ctx.shared.cancel)
        .await;
    (ctx.shared.shard_operations).fetch_add(ctx.answer_at.operations(), Ordering::Relaxed);
    match (answered, filter) {
        (Answered::Answer(answer), Some(filter)) => filtered(answer, &filter).await,
        (Answered::Answer(answer) | Answered::Refused(answer), _) => answer,
    }
}

/// What a request got: an answer, which `filter_path` filters, or an error envelope, which
/// it never does.
enum Answered {
    Answer(Response),
    Refused(Response),
}

/// `answer` with its JSON body reduced by `filter` (`crate::filter_path`); an answer whose
/// body is not JSON is left as it is.
async fn filtered(answer: Response, filter: &FilterPath) -> Response {
    let (mut parts, body) = answer.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let kept = serde_json::to_vec(&errors::Ordered(&filter.apply(&value))).unwrap_or_default();
    // The body is another length now.
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(kept))
}

/// The handler's answer, or the error envelope that answers instead.
async fn answer(ctx: &Ctx<'_>, route: Route) -> Answered {
    use Method as M;
    let method = ctx.method;
    let not_allowed = |allowed: &[&str]| {
        Answered::Refused(errors::method_not_allowed(
            ctx.path,
            method.as_str(),
            allowed,
        ))
    };
    let answered = match (&route, method) {
        (Route::Info, &M::GET | &M::HEAD) => handlers::info(ctx),
        (Route::Info, _) => return not_allowed(&["GET", "HEAD"]),
        (Route::Health(index), &M::GET) => handlers::health(ctx, index.as_deref()),
        (Route::Health(_), _) => return not_allowed(&["GET"]),
        (Route::Bulk(index), &M::POST | &M::PUT) => handlers::bulk(ctx, index.as_deref()).await,
        (Route::Bulk(_), _) => return not_allowed(&["POST", "PUT"]),
        (Route::Refresh(index), &M::POST | &M::GET) => handlers::refresh(ctx, index.as_deref()),
        (Route::Refresh(_), _) => return not_allowed(&["POST", "GET"]),
        (Route::Search(index), &M::POST | &M::GET) => handlers::search(ctx, index.as_deref()),
        (Route::Search(_), _) => return not_allowed(&["POST", "GET"]),
        (Route::Count(index), &M::POST | &M::GET) => handlers::count(ctx, index.as_deref()),
        (Route::Count(_), _) => return not_allowed(&["POST", "GET"]),
        (Route::Index(index), &M::PUT) => handlers::create_index(ctx, index),
        (Route::Index(index), &M::HEAD) => handlers::index_exists(ctx, index),
        (Route::Index(index), &M::GET) => handlers::get_index(ctx, index),
        (Route::Index(index), &M::DELETE) => handlers::delete_index(ctx, index),
        (Route::Index(_), _) => return not_allowed(&["PUT", "HEAD", "GET", "DELETE"]),
        (Route::Mapping(index), &M::PUT | &M::POST) => handlers::put_mapping(ctx, index),
        (Route::Mapping(index), &M::GET) => handlers::get_mapping(ctx, index),
        (Route::Mapping(_), _) => return not_allowed(&["GET", "PUT", "POST"]),
        (Route::Stats(index, metric), &M::GET) => handlers::stats(ctx, index, metric.as_deref()),
        (Route::Stats(..), _) => return not_allowed(&["GET"]),
        (Route::Doc(index, Some(id)), &M::GET | &M::HEAD) => handlers::get_doc(ctx, index, id),
        (Route::Doc(index, Some(id)), &M::PUT | &M::POST) => {
            handlers::write_doc(ctx, index, Some(id), false).await
        }
        (Route::Doc(index, Some(id)), &M::DELETE) => handlers::delete_doc(ctx, index, id).await,
        (Route::Doc(_, Some(_)), _) => {
            return not_allowed(&["PUT", "DELETE", "GET", "POST", "HEAD"])
        }
        (Route::Doc(index, None), &M::POST) => handlers::write_doc(ctx, index, None, false).await,
        (Route::Doc(_, None), _) => return not_allowed(&["POST"]),
        (Route::Create(index, id), &M::PUT | &M::POST) => {
            handlers::write_doc(ctx, index, Some(id), true).await
        }
        (Route::Create(..), _) => return not_allowed(&["PUT", "POST"]),
        (Route::Unsupported, _) => Err(EsError::unsupported(&format!("{method} {}", ctx.path))),
        (Route::NoHandler, _) => return Answered::Refused(no_handler(ctx.path, method)),
    };
    match answered {
        Ok(answer) => Answered::Answer(answer),
        Err(error) => Answered::Refused(error.into_response()),
    }
}
