//! `_search` and `_count` (`docs/elasticsearch.md` §7): request parsing, sorting (field sorts,
//! `_score`, `_doc`, missing values last), `search_after`, `from`/`size` with
//! `index.max_result_window`, `track_total_hits`, `seq_no_primary_term`, `version`, `_source`
//! filtering, and the response shape. Searches read the searchable (refreshed) view of each index.

use std::cmp::Ordering;
use std::sync::Arc;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::dates;
use crate::errors::{token_name, Cause, EsError, Ordered};
use crate::mapping::{FieldType, Mapping, Scalar};
use crate::query::{self, Query};
use crate::state::{glob, Cluster, Doc, IndexState};

#[derive(Debug, Clone)]
pub enum SortSpec {
    Field {
        field: String,
        desc: bool,
        missing_first: bool,
        unmapped_type: Option<String>,
        /// `min`/`max` for multi-valued fields; default min for asc, max for desc.
        mode_max: bool,
        format: Option<String>,
    },
    Score {
        desc: bool,
    },
    Doc {
        desc: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TrackTotal {
    Off,
    UpTo(u64),
}

/// Which parts of `_source` a hit shows.
#[derive(Debug, Clone, Default)]
pub struct SourceFilter {
    pub disabled: bool,
    pub includes: Vec<String>,
    pub excludes: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct SearchRequest {
    pub query: Query,
    pub size: i64,
    pub from: i64,
    pub sort: Vec<SortSpec>,
    pub search_after: Option<Vec<Value>>,
    pub seq_no_primary_term: bool,
    pub version: bool,
    pub track_total: TrackTotal,
    pub track_scores: bool,
    pub source: SourceFilter,
    pub total_as_int: bool,
}

impl Default for SearchRequest {
    fn default() -> Self {
        SearchRequest {
            query: Query::MatchAll { boost: 1.0 },
            size: 10,
            from: 0,
            sort: Vec::new(),
            search_after: None,
            seq_no_primary_term: false,
            version: false,
            track_total: TrackTotal::UpTo(10_000),
            track_scores: false,
            source: SourceFilter::default(),
            total_as_int: false,
        }
    }
}

/// A sort option that takes one of two words: `false` for the first (`no`), `true` for the
/// second (`yes`); any other value is refused as `unsupported`.
fn one_of_two(value: &Value, (no, yes): (&str, &str), unsupported: &str) -> Result<bool, EsError> {
    match value.as_str() {
        Some(word) if word == no => Ok(false),
        Some(word) if word == yes => Ok(true),
        _ => Err(EsError::unsupported(unsupported)),
    }
}

fn as_int(key: &str, value: &Value) -> Result<i64, EsError> {
    value
        .as_i64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        .ok_or_else(|| {
            EsError::parsing(format!(
                "[{key}] failed to parse field [{key}]: expected an integer, found [{value}]"
            ))
        })
}

fn as_bool(key: &str, value: &Value) -> Result<bool, EsError> {
    match value {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" || s.is_empty() => Ok(true),
        Value::String(s) if s == "false" => Ok(false),
        other => Err(EsError::illegal_argument(format!(
            "Failed to parse value [{other}] as only [true] or [false] are allowed. ({key})"
        ))),
    }
}

/// `track_total_hits`: `true`, `false` or a number.
pub fn parse_track_total(value: &Value) -> Result<TrackTotal, EsError> {
    match value {
        Value::Bool(true) => Ok(TrackTotal::UpTo(u64::MAX)),
        Value::Bool(false) => Ok(TrackTotal::Off),
        Value::String(s) if s == "true" => Ok(TrackTotal::UpTo(u64::MAX)),
        Value::String(s) if s == "false" => Ok(TrackTotal::Off),
        other => match as_int("track_total_hits", other)? {
            n if n >= 0 => Ok(TrackTotal::UpTo(n as u64)),
            -1 => Ok(TrackTotal::UpTo(u64::MAX)),
            n => Err(EsError::illegal_argument(format!(
                "[track_total_hits] parameter must be positive or equals to -1, got {n}"
            ))),
        },
    }
}

fn sort_order(field: &str, value: &Value) -> Result<bool, EsError> {
    match value.as_str().map(str::to_ascii_lowercase).as_deref() {
        Some("asc") => Ok(false),
        Some("desc") => Ok(true),
        _ => Err(EsError::illegal_argument(format!(
            "Unknown SortOrder [{}] for field [{field}]",
            value.as_str().unwrap_or(&value.to_string())
        ))),
    }
}

fn sort_of(field: &str, desc: Option<bool>) -> SortSpec {
    match field {
        "_score" => SortSpec::Score {
            desc: desc.unwrap_or(true),
        },
        "_doc" => SortSpec::Doc {
            desc: desc.unwrap_or(false),
        },
        _ => {
            let desc = desc.unwrap_or(false);
            SortSpec::Field {
                field: field.to_owned(),
                desc,
                missing_first: false,
                unmapped_type: None,
                mode_max: desc,
                format: None,
            }
        }
    }
}

fn parse_sort_entry(entry: &Value) -> Result<SortSpec, EsError> {
    match entry {
        Value::String(field) => Ok(sort_of(field, None)),
        Value::Object(map) if map.len() == 1 => {
            let (field, spec) = map.iter().next().expect("one entry");
            match spec {
                Value::String(_) => Ok(sort_of(field, Some(sort_order(field, spec)?))),
                Value::Object(options) => {
                    let desc = options
                        .get("order")
                        .map(|o| sort_order(field, o))
                        .transpose()?;
                    let mut spec = sort_of(field, desc);
                    if let SortSpec::Field {
                        missing_first,
                        unmapped_type,
                        mode_max,
                        format,
                        ..
                    } = &mut spec
                    {
                        for (key, value) in options {
                            match key.as_str() {
                                "order" => {}
                                "missing" => {
                                    *missing_first = one_of_two(
                                        value,
                                        ("_last", "_first"),
                                        "sort.missing with a custom value",
                                    )?
                                }
                                "unmapped_type" => {
                                    *unmapped_type = value.as_str().map(str::to_owned)
                                }
                                "mode" => {
                                    *mode_max = one_of_two(
                                        value,
                                        ("min", "max"),
                                        "sort.mode other than min/max",
                                    )?
                                }
                                "format" => *format = value.as_str().map(str::to_owned),
                                "numeric_type" | "nested" => {
                                    return Err(EsError::unsupported(&format!("sort.{key}")))
                                }
                                other => {
                                    return Err(EsError::new(
                                        400,
                                        "x_content_parse_exception",
                                        format!("[field_sort] unknown field [{other}]"),
                                    ))
                                }
                            }
                        }
                    }
                    Ok(spec)
                }
                other => Err(EsError::parsing(format!(
                    "[sort] for field [{field}] must be a string or an object, found [{other}]"
                ))),
            }
        }
        Value::Object(map) if map.is_empty() => Err(EsError::parsing("[sort] empty sort entry")),
        other => Err(EsError::parsing(format!(
            "[sort] malformed sort entry [{other}]"
        ))),
    }
}

/// `sort` of a search body: a list or a single entry.
pub fn parse_sort(value: &Value) -> Result<Vec<SortSpec>, EsError> {
    match value {
        Value::Array(entries) => entries.iter().map(parse_sort_entry).collect(),
        other => Ok(vec![parse_sort_entry(other)?]),
    }
}

/// `sort=f:asc,g:desc` as a URL parameter.
pub fn parse_sort_param(text: &str) -> Result<Vec<SortSpec>, EsError> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|entry| match entry.rsplit_once(':') {
            Some((field, order)) => Ok(sort_of(field, Some(sort_order(field, &json!(order))?))),
            None => Ok(sort_of(entry, None)),
        })
        .collect()
}

/// `_source`: `true`/`false`, a pattern, a list, or `{includes, excludes}`.
pub fn parse_source(value: &Value) -> Result<SourceFilter, EsError> {
    let list = |v: Option<&Value>| -> Result<Vec<String>, EsError> {
        match v {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| {
                    i.as_str().map(str::to_owned).ok_or_else(|| {
                        EsError::parsing(format!("[_source] expected strings, found [{i}]"))
                    })
                })
                .collect(),
            Some(other) => Err(EsError::parsing(format!(
                "[_source] expected a string or a list, found [{other}]"
            ))),
        }
    };
    match value {
        Value::Bool(enabled) => Ok(SourceFilter {
            disabled: !enabled,
            ..SourceFilter::default()
        }),
        Value::String(_) | Value::Array(_) => Ok(SourceFilter {
            includes: list(Some(value))?,
            ..SourceFilter::default()
        }),
        Value::Object(map) => {
            for key in map.keys() {
                if !matches!(
                    key.as_str(),
                    "includes" | "include" | "excludes" | "exclude"
                ) {
                    return Err(EsError::parsing(format!(
                        "Unknown key for a START_ARRAY in [{key}]."
                    )));
                }
            }
            Ok(SourceFilter {
                disabled: false,
                includes: list(map.get("includes").or(map.get("include")))?,
                excludes: list(map.get("excludes").or(map.get("exclude")))?,
            })
        }
        other => Err(EsError::parsing(format!(
            "[_source] expected a boolean, a string, a list or an object, found [{other}]"
        ))),
    }
}

/// Reads a search body (`{}` when absent) into `request`.
pub fn parse_body(body: &Value, request: &mut SearchRequest) -> Result<(), EsError> {
    let Value::Object(map) = body else {
        return Err(EsError::parsing("request body must be an object"));
    };
    for (key, value) in map {
        match key.as_str() {
            "query" => request.query = query::parse(value)?,
            "size" => request.size = as_int(key, value)?,
            "from" => request.from = as_int(key, value)?,
            "sort" => request.sort = parse_sort(value)?,
            "search_after" => match value {
                Value::Array(values) => request.search_after = Some(values.clone()),
                other => {
                    return Err(EsError::parsing(format!(
                        "[search_after] expected an array, found [{other}]"
                    )))
                }
            },
            "seq_no_primary_term" => request.seq_no_primary_term = as_bool(key, value)?,
            "version" => request.version = as_bool(key, value)?,
            "track_total_hits" => request.track_total = parse_track_total(value)?,
            "track_scores" => request.track_scores = as_bool(key, value)?,
            "_source" => request.source = parse_source(value)?,
            "timeout" | "profile" | "explain" if value == &Value::Bool(false) => {}
            "timeout" => {}
            "aggs" | "aggregations" | "highlight" | "collapse" | "pit" | "fields"
            | "docvalue_fields" | "script_fields" | "post_filter" | "rescore" | "suggest"
            | "indices_boost" | "stats" | "runtime_mappings" | "knn" | "min_score"
            | "terminate_after" | "stored_fields" | "explain" | "profile" | "ext" | "slice"
            | "retriever" | "rank" => return Err(EsError::unsupported(&format!("search.{key}"))),
            other => {
                return Err(EsError::parsing(format!(
                    "Unknown key for a {} in [{other}].",
                    token_name(value)
                )))
            }
        }
    }
    Ok(())
}

/// A sort value of one hit.
#[derive(Debug, Clone, PartialEq)]
enum Key {
    Missing,
    Long(i64),
    Double(f64),
    Str(String),
}

impl Key {
    fn natural(&self, other: &Key) -> Ordering {
        match (self, other) {
            (Key::Long(a), Key::Long(b)) => a.cmp(b),
            (Key::Double(a), Key::Double(b)) => a.total_cmp(b),
            (Key::Long(a), Key::Double(b)) => (*a as f64).total_cmp(b),
            (Key::Double(a), Key::Long(b)) => a.total_cmp(&(*b as f64)),
            (Key::Str(a), Key::Str(b)) => a.cmp(b),
            _ => Ordering::Equal,
        }
    }
}

fn compare_key(a: &Key, b: &Key, spec: &SortSpec) -> Ordering {
    let (desc, missing_first) = match spec {
        SortSpec::Field {
            desc,
            missing_first,
            ..
        } => (*desc, *missing_first),
        SortSpec::Score { desc } | SortSpec::Doc { desc } => (*desc, false),
    };
    match (a, b) {
        (Key::Missing, Key::Missing) => Ordering::Equal,
        (Key::Missing, _) if missing_first => Ordering::Less,
        (Key::Missing, _) => Ordering::Greater,
        (_, Key::Missing) if missing_first => Ordering::Greater,
        (_, Key::Missing) => Ordering::Less,
        _ if desc => b.natural(a),
        _ => a.natural(b),
    }
}

fn compare_keys(a: &[Key], b: &[Key], specs: &[SortSpec]) -> Ordering {
    for ((x, y), spec) in a.iter().zip(b).zip(specs) {
        let order = compare_key(x, y, spec);
        if order != Ordering::Equal {
            return order;
        }
    }
    Ordering::Equal
}

/// How a field sorts in one index.
#[derive(Debug, Clone, Copy, PartialEq)]
enum SortKind {
    Long,
    Double,
    Date,
    Str,
    Unmapped,
}

fn sort_kind(
    mapping: &Mapping,
    spec: &SortSpec,
    index: &str,
    uuid: &str,
) -> Result<SortKind, Cause> {
    let SortSpec::Field {
        field,
        unmapped_type,
        ..
    } = spec
    else {
        return Ok(SortKind::Double);
    };
    if field == "_id" {
        return Err(Cause::new(
            "illegal_argument_exception",
            "Fielddata access on the _id field is disallowed, you can re-enable it by updating the dynamic cluster setting: indices.id_field_data.enabled",
        ));
    }
    let Some(def) = mapping.field(field) else {
        return match unmapped_type {
            Some(_) => Ok(SortKind::Unmapped),
            None => Err(Cause::new(
                "query_shard_exception",
                format!("No mapping found for [{field}] in order to sort on"),
            )
            .meta("index_uuid", uuid)
            .meta("index", index)),
        };
    };
    Ok(match def.ty {
        FieldType::Long | FieldType::Boolean => SortKind::Long,
        FieldType::Double => SortKind::Double,
        FieldType::Date => SortKind::Date,
        FieldType::Keyword => SortKind::Str,
        FieldType::Text => {
            return Err(Cause::new(
                "illegal_argument_exception",
                format!(
                    "Fielddata is disabled on [{field}] in [{index}]. Text fields are not optimised for operations that require per-document field data like aggregations and sorting, so these operations are disabled by default. Please use a keyword field instead. Alternatively, set fielddata=true on [{field}] in order to load field data by uninverting the inverted index. Note that this can use significant memory."
                ),
            ))
        }
        FieldType::Object | FieldType::Other | FieldType::Flattened => {
            return Err(Cause::new(
                "illegal_argument_exception",
                format!(
                    "Field [{field}] of type [{}] does not support sorting (es-emulator)",
                    def.type_name
                ),
            ))
        }
    })
}

/// The sort key of `doc` for one field sort; numeric missing values are Elasticsearch's
/// `Long.MAX_VALUE`/`Long.MIN_VALUE` sentinels.
fn field_key(mapping: &Mapping, spec: &SortSpec, kind: SortKind, doc: &Doc) -> Key {
    let SortSpec::Field {
        field,
        desc,
        missing_first,
        mode_max,
        ..
    } = spec
    else {
        return Key::Missing;
    };
    let values = if kind == SortKind::Unmapped {
        Vec::new()
    } else {
        mapping.values(field, &doc.source, doc.mapped_at)
    };
    let keys = values.into_iter().map(|v| match v {
        Scalar::Long(n) => Key::Long(n),
        Scalar::Double(f) => Key::Double(f),
        Scalar::Str(s) => Key::Str(s),
        Scalar::Bool(b) => Key::Long(i64::from(b)),
    });
    let chosen = if *mode_max {
        keys.max_by(|a, b| a.natural(b))
    } else {
        keys.min_by(|a, b| a.natural(b))
    };
    match (chosen, kind) {
        (Some(key), _) => key,
        (None, SortKind::Long | SortKind::Date) => {
            // _last: the value that sorts last in this direction; _first the opposite.
            if *desc != *missing_first {
                Key::Long(i64::MIN)
            } else {
                Key::Long(i64::MAX)
            }
        }
        (None, _) => Key::Missing,
    }
}

/// A `search_after` value converted to the sort's key type.
fn after_key(value: &Value, kind: SortKind, spec: &SortSpec) -> Result<Key, Cause> {
    let field = match spec {
        SortSpec::Field { field, .. } => field.as_str(),
        SortSpec::Score { .. } => "_score",
        SortSpec::Doc { .. } => "_doc",
    };
    let bad = || {
        Cause::new(
            "illegal_argument_exception",
            format!("Failed to parse search_after value for field [{field}]."),
        )
    };
    if value.is_null() {
        return Ok(Key::Missing);
    }
    match (spec, kind) {
        (SortSpec::Score { .. }, _) => value.as_f64().map(Key::Double).ok_or_else(bad),
        (SortSpec::Doc { .. }, _) => value.as_i64().map(Key::Long).ok_or_else(bad),
        (_, SortKind::Long) => value
            .as_i64()
            .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
            .map(Key::Long)
            .ok_or_else(bad),
        (_, SortKind::Date) => dates::parse_value(value, None, false)
            .map(Key::Long)
            .map_err(|_| match value {
                Value::String(text) => unparsable_date(text),
                _ => bad(),
            }),
        (_, SortKind::Double) => value
            .as_f64()
            .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
            .map(Key::Double)
            .ok_or_else(bad),
        (_, SortKind::Str | SortKind::Unmapped) => match value {
            Value::String(s) => Ok(Key::Str(s.clone())),
            Value::Number(n) => Ok(Key::Str(n.to_string())),
            Value::Bool(b) => Ok(Key::Str(b.to_string())),
            _ => Err(bad()),
        },
    }
}

/// A `search_after` string that is no date of a date sort: Elasticsearch parses it with the
/// field's format and answers a `parse_exception` (observed on 8.19.21 by the differential
/// test). The format named is the default one, the only one the backend maps.
fn unparsable_date(text: &str) -> Cause {
    const FORMAT: &str = "strict_date_optional_time||epoch_millis";
    let reason = format!("failed to parse date field [{text}] with format [{FORMAT}]");
    let mut inner = Cause::new("illegal_argument_exception", reason.clone());
    inner.caused_by = Some(Box::new(Cause::new(
        "date_time_parse_exception",
        "Failed to parse with all enclosed parsers",
    )));
    let mut cause = Cause::new("parse_exception", format!("{reason}: [{reason}]"));
    cause.caused_by = Some(Box::new(inner));
    cause
}

fn key_json(key: &Key, kind: SortKind, spec: &SortSpec) -> Value {
    match (key, spec) {
        (
            Key::Long(v),
            SortSpec::Field {
                format: Some(f), ..
            },
        ) if kind == SortKind::Date => {
            if f == "epoch_millis" {
                json!(v.to_string())
            } else {
                json!(dates::format_iso(*v))
            }
        }
        (Key::Long(v), _) => json!(v),
        (Key::Double(v), _) => json!(v),
        (Key::Str(v), _) => json!(v),
        (Key::Missing, _) => Value::Null,
    }
}

/// Applies a source filter to a document's source.
pub fn filter_source(
    raw: &RawValue,
    source: &Value,
    filter: &SourceFilter,
) -> Option<Box<RawValue>> {
    if filter.disabled {
        return None;
    }
    if filter.includes.is_empty() && filter.excludes.is_empty() {
        return RawValue::from_string(raw.get().to_owned()).ok();
    }
    let filtered = match source {
        Value::Object(map) => {
            Value::Object(filter_object(map, "", filter, filter.includes.is_empty()))
        }
        other => other.clone(),
    };
    serde_json::value::to_raw_value(&filtered).ok()
}

fn filter_object(
    map: &Map<String, Value>,
    prefix: &str,
    filter: &SourceFilter,
    all: bool,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in map {
        let path = format!("{prefix}{key}");
        if filter.excludes.iter().any(|p| glob(p, &path)) {
            continue;
        }
        let included = all || filter.includes.iter().any(|p| glob(p, &path));
        let below = format!("{path}.");
        let maybe_below = filter.includes.iter().any(|p| {
            let literal = p.split('*').next().unwrap_or("");
            p.starts_with(&below)
                || (p.contains('*') && (literal.starts_with(&below) || below.starts_with(literal)))
        });
        match value {
            Value::Object(inner) if included || maybe_below => {
                let kept = filter_object(inner, &below, filter, included);
                if included || !kept.is_empty() {
                    out.insert(key.clone(), Value::Object(kept));
                }
            }
            Value::Array(items) if !included && maybe_below => {
                let kept: Vec<Value> = items
                    .iter()
                    .filter_map(|item| match item {
                        Value::Object(inner) => {
                            let kept = filter_object(inner, &below, filter, false);
                            (!kept.is_empty()).then_some(Value::Object(kept))
                        }
                        _ => None,
                    })
                    .collect();
                if !kept.is_empty() {
                    out.insert(key.clone(), Value::Array(kept));
                }
            }
            _ if included => {
                out.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    out
}

#[derive(Serialize)]
struct HitOut<'a> {
    _index: &'a str,
    _id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    _version: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    _seq_no: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    _primary_term: Option<u64>,
    _score: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    _source: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sort: Option<Vec<Value>>,
}

#[derive(Serialize)]
struct HitsOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<Ordered<'a>>,
    max_score: Option<f64>,
    hits: Vec<HitOut<'a>>,
}

#[derive(Serialize)]
struct SearchOut<'a> {
    took: u64,
    timed_out: bool,
    _shards: Ordered<'a>,
    hits: HitsOut<'a>,
}

struct Candidate<'a> {
    index: &'a str,
    position: usize,
    doc: &'a Arc<Doc>,
    score: f64,
    keys: Vec<Key>,
}

/// Matches, scores and sort keys of every searchable document of `indices`.
fn collect<'a>(
    cluster: &'a Cluster,
    indices: &'a [String],
    request: &SearchRequest,
    now_millis: i64,
) -> Result<(Vec<Candidate<'a>>, Vec<Vec<SortKind>>), EsError> {
    let mut candidates = Vec::new();
    let mut kinds_per_index = Vec::new();
    for (position, name) in indices.iter().enumerate() {
        let Some(index) = cluster.indices.get(name) else {
            continue;
        };
        let shard_failure = |cause: Cause| EsError::shard_search_failure(cause, name);
        let compiled = query::compile(&request.query, &index.mapping, now_millis).map_err(|c| {
            shard_failure(
                c.meta("index_uuid", index.uuid.as_str())
                    .meta("index", name.as_str()),
            )
        })?;
        let kinds = request
            .sort
            .iter()
            .map(|spec| sort_kind(&index.mapping, spec, name, &index.uuid))
            .collect::<Result<Vec<_>, _>>()
            .map_err(shard_failure)?;
        for doc in index.searchable_docs() {
            let Some(score) = compiled.score(&index.mapping, doc) else {
                continue;
            };
            let keys = request
                .sort
                .iter()
                .zip(&kinds)
                .map(|(spec, kind)| match spec {
                    SortSpec::Score { .. } => Key::Double(score),
                    SortSpec::Doc { .. } => Key::Long(doc.order as i64),
                    field => field_key(&index.mapping, field, *kind, doc),
                })
                .collect();
            candidates.push(Candidate {
                index: name,
                position,
                doc,
                score,
                keys,
            });
        }
        kinds_per_index.push(kinds);
    }
    Ok((candidates, kinds_per_index))
}

/// Runs a search on `indices` (already resolved and brought up to date) and serializes the
/// response.
pub fn execute(
    cluster: &Cluster,
    indices: &[String],
    request: &SearchRequest,
    now_millis: i64,
    took: u64,
) -> Result<Vec<u8>, EsError> {
    if request.size < 0 {
        return Err(EsError::illegal_argument(format!(
            "[size] parameter cannot be negative, found [{}]",
            request.size
        )));
    }
    if request.from < 0 {
        return Err(EsError::illegal_argument(format!(
            "[from] parameter cannot be negative, found [{}]",
            request.from
        )));
    }
    if request.search_after.is_some() && request.from > 0 {
        return Err(EsError::validation(&[
            "`from` parameter must be set to 0 when `search_after` is used.".to_owned(),
        ]));
    }
    let window = (request.from + request.size) as usize;
    for name in indices {
        if let Some(index) = cluster.indices.get(name) {
            let max = index.settings.max_result_window;
            if window > max {
                return Err(EsError::shard_search_failure(
                    Cause::new(
                        "illegal_argument_exception",
                        format!(
                            "Result window is too large, from + size must be less than or equal to: [{max}] but was [{window}]. See the scroll api for a more efficient way to request large data sets. This limit can be set by changing the [index.max_result_window] index level setting."
                        ),
                    ),
                    name,
                ));
            }
        }
    }

    let (mut candidates, kinds) = collect(cluster, indices, request, now_millis)?;
    // The sort kinds of the first index decide how `search_after` values are read.
    let first_kinds = kinds.first().cloned().unwrap_or_default();
    let total = candidates.len() as u64;

    if request.sort.is_empty() {
        candidates.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then(a.position.cmp(&b.position))
                .then(a.doc.order.cmp(&b.doc.order))
        });
    } else {
        candidates.sort_by(|a, b| {
            compare_keys(&a.keys, &b.keys, &request.sort)
                .then(a.position.cmp(&b.position))
                .then(a.doc.order.cmp(&b.doc.order))
        });
    }

    if let Some(after) = &request.search_after {
        let specs: Vec<SortSpec> = if request.sort.is_empty() {
            vec![SortSpec::Score { desc: true }]
        } else {
            request.sort.clone()
        };
        if after.len() != specs.len() {
            let name = indices.first().map_or("", String::as_str);
            return Err(EsError::shard_search_failure(
                Cause::new(
                    "illegal_argument_exception",
                    format!(
                        "search_after has {} value(s) but sort has {}.",
                        after.len(),
                        specs.len()
                    ),
                ),
                name,
            ));
        }
        let mut after_keys = Vec::with_capacity(after.len());
        for (i, (value, spec)) in after.iter().zip(&specs).enumerate() {
            let kind = first_kinds.get(i).copied().unwrap_or(SortKind::Double);
            let key = after_key(value, kind, spec).map_err(|cause| {
                EsError::shard_search_failure(cause, indices.first().map_or("", String::as_str))
            })?;
            after_keys.push(key);
        }
        candidates.retain(|c| {
            let keys = if request.sort.is_empty() {
                vec![Key::Double(c.score)]
            } else {
                c.keys.clone()
            };
            compare_keys(&keys, &after_keys, &specs) == Ordering::Greater
        });
    }

    let field_sorted = !request.sort.is_empty()
        && !request
            .sort
            .iter()
            .any(|s| matches!(s, SortSpec::Score { .. }));
    let scores_shown = !field_sorted || request.track_scores;
    let max_score = if scores_shown {
        candidates.iter().map(|c| c.score).reduce(f64::max)
    } else {
        None
    };
    let hits = candidates
        .iter()
        .skip(request.from as usize)
        .take(request.size as usize)
        .map(|c| HitOut {
            _index: c.index,
            _id: &c.doc.id,
            _version: request.version.then_some(c.doc.version),
            _seq_no: request.seq_no_primary_term.then_some(c.doc.seq_no),
            _primary_term: request.seq_no_primary_term.then_some(c.doc.primary_term),
            _score: scores_shown.then_some(c.score),
            _source: filter_source(&c.doc.raw, &c.doc.source, &request.source),
            sort: (!request.sort.is_empty()).then(|| {
                c.keys
                    .iter()
                    .zip(&request.sort)
                    .zip(kinds.get(c.position).map_or(&first_kinds, |k| k))
                    .map(|((key, spec), kind)| key_json(key, *kind, spec))
                    .collect()
            }),
        })
        .collect();
    let total = match request.track_total {
        TrackTotal::Off => None,
        TrackTotal::UpTo(limit) if total > limit => {
            Some(json!({"value": limit, "relation": "gte"}))
        }
        TrackTotal::UpTo(_) => Some(json!({"value": total, "relation": "eq"})),
    };
    let total = if request.total_as_int {
        total.map(|t| t["value"].clone())
    } else {
        total
    };
    let shards = shard_count(cluster, indices);
    let shards = json!({"total": shards, "successful": shards, "skipped": 0, "failed": 0});
    let out = SearchOut {
        took,
        timed_out: false,
        _shards: Ordered(&shards),
        hits: HitsOut {
            total: total.as_ref().map(Ordered),
            max_score,
            hits,
        },
    };
    serde_json::to_vec(&out).map_err(|e| EsError::new(500, "exception", e.to_string()))
}

/// `_count`: the number of searchable documents matching `query`.
pub fn count(
    cluster: &Cluster,
    indices: &[String],
    query: &Query,
    now_millis: i64,
) -> Result<Value, EsError> {
    let request = SearchRequest {
        query: query.clone(),
        ..SearchRequest::default()
    };
    let (candidates, _) = collect(cluster, indices, &request, now_millis)?;
    let shards = shard_count(cluster, indices);
    Ok(json!({
        "count": candidates.len(),
        "_shards": {"total": shards, "successful": shards, "skipped": 0, "failed": 0},
    }))
}

/// The primary shards of `indices`: a search asks each (`_shards.total`).
fn shard_count(cluster: &Cluster, indices: &[String]) -> u64 {
    (indices.iter())
        .filter_map(|name| cluster.indices.get(name))
        .map(IndexState::shard_count)
        .sum()
}
