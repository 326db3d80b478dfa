//! The query DSL subset (`docs/elasticsearch.md` §7): `match_all`, `match_none`, `term`, `terms`,
//! `range`, `exists`, `ids`, `bool` (`must`/`filter`/`should`/`must_not`, `minimum_should_match`)
//! and `constant_score`, parsed from JSON, compiled against one index's mapping, and evaluated on
//! documents.
//!
//! Scores are not BM25: every scoring leaf clause scores `1.0 × boost`, `bool` sums its
//! `must` and matching `should` scores, `filter`/`must_not` score nothing, and a `bool` with
//! only filters scores `0.0` (as in Elasticsearch).

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::dates;
use crate::errors::{Cause, EsError};
use crate::mapping::{self, FieldDef, FieldType, Mapping, Scalar};
use crate::state::Doc;

/// A parsed query.
#[derive(Debug, Clone)]
pub enum Query {
    MatchAll {
        boost: f64,
    },
    MatchNone,
    Term {
        field: String,
        values: Vec<Value>,
        boost: f64,
    },
    Range {
        field: String,
        bounds: Vec<(RangeOp, Value)>,
        format: Option<String>,
        boost: f64,
    },
    Exists {
        field: String,
        boost: f64,
    },
    Ids {
        values: Vec<String>,
        boost: f64,
    },
    Bool {
        must: Vec<Query>,
        filter: Vec<Query>,
        should: Vec<Query>,
        must_not: Vec<Query>,
        minimum_should_match: Option<Value>,
        boost: f64,
    },
    ConstantScore {
        filter: Box<Query>,
        boost: f64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOp {
    Gt,
    Gte,
    Lt,
    Lte,
}

fn single_entry<'a>(name: &str, value: &'a Value) -> Result<(&'a String, &'a Value), EsError> {
    let Value::Object(map) = value else {
        return Err(EsError::parsing(format!(
            "[{name}] query malformed, no start_object after query name"
        )));
    };
    let mut entries = map.iter();
    match (entries.next(), entries.next()) {
        (Some(entry), None) => Ok(entry),
        (None, _) => Err(EsError::parsing(format!(
            "[{name}] query malformed, empty clause found"
        ))),
        (Some((a, _)), Some((b, _))) => Err(EsError::parsing(format!(
            "[{name}] query doesn't support multiple fields, found [{a}] and [{b}]"
        ))),
    }
}

fn boost_of(value: Option<&Value>) -> Result<f64, EsError> {
    match value {
        None => Ok(1.0),
        Some(v) => v
            .as_f64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| EsError::parsing(format!("[boost] must be a number, found [{v}]"))),
    }
}

fn clauses(name: &str, value: &Value) -> Result<Vec<Query>, EsError> {
    match value {
        Value::Array(items) => items.iter().map(parse).collect(),
        Value::Object(_) => Ok(vec![parse(value)?]),
        other => Err(EsError::parsing(format!(
            "[bool] query does not support [{name}] with a value of [{other}]"
        ))),
    }
}

fn reject_unknown(query: &str, object: &Map<String, Value>, known: &[&str]) -> Result<(), EsError> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(EsError::parsing(format!(
            "[{query}] query does not support [{key}]"
        ))),
        None => Ok(()),
    }
}

/// Parses one query clause: `{"<name>": {...}}`.
pub fn parse(value: &Value) -> Result<Query, EsError> {
    let Value::Object(outer) = value else {
        return Err(EsError::parsing(format!(
            "query malformed, must start with start_object, found [{value}]"
        )));
    };
    let mut entries = outer.iter();
    let (name, body) = match (entries.next(), entries.next()) {
        (Some(entry), None) => entry,
        (None, _) => return Err(EsError::parsing("query malformed, empty clause found")),
        (Some((a, _)), Some((b, _))) => {
            return Err(EsError::parsing(format!(
                "[{a}] malformed query, expected [END_OBJECT] but found [FIELD_NAME] ([{b}])"
            )))
        }
    };
    let object = body.as_object();
    match name.as_str() {
        "match_all" => {
            let object = object.ok_or_else(|| EsError::parsing("[match_all] query malformed"))?;
            reject_unknown("match_all", object, &["boost", "_name"])?;
            Ok(Query::MatchAll {
                boost: boost_of(object.get("boost"))?,
            })
        }
        "match_none" => Ok(Query::MatchNone),
        "term" => {
            let (field, spec) = single_entry("term", body)?;
            let (value, boost) = match spec {
                Value::Object(spec) => {
                    reject_unknown(
                        "term",
                        spec,
                        &["value", "boost", "case_insensitive", "_name"],
                    )?;
                    if spec.get("case_insensitive") == Some(&Value::Bool(true)) {
                        return Err(EsError::unsupported("term.case_insensitive"));
                    }
                    let value = spec.get("value").cloned().ok_or_else(|| {
                        EsError::parsing("[term] query requires a value, found none")
                    })?;
                    (value, boost_of(spec.get("boost"))?)
                }
                Value::Array(_) => {
                    return Err(EsError::parsing(
                        "[term] query does not support array of values",
                    ))
                }
                scalar => (scalar.clone(), 1.0),
            };
            Ok(Query::Term {
                field: field.clone(),
                values: vec![value],
                boost,
            })
        }
        "terms" => {
            let object = object.ok_or_else(|| EsError::parsing("[terms] query malformed"))?;
            let mut field = None;
            let mut boost = 1.0;
            for (key, value) in object {
                match (key.as_str(), value) {
                    ("boost", v) => boost = boost_of(Some(v))?,
                    ("_name", _) => {}
                    (_, Value::Array(values)) => {
                        if field.is_some() {
                            return Err(EsError::parsing(
                                "[terms] query does not support multiple fields",
                            ));
                        }
                        if values.len() > 65_536 {
                            return Err(EsError::illegal_argument(format!(
                                "The number of terms [{}] used in the Terms Query request has exceeded the allowed maximum of [65536]. This maximum can be set by changing the [index.max_terms_count] index level setting.",
                                values.len()
                            )));
                        }
                        field = Some((key.clone(), values.clone()));
                    }
                    (_, Value::Object(_)) => return Err(EsError::unsupported("terms lookup")),
                    (key, _) => {
                        return Err(EsError::parsing(format!(
                            "[terms] query does not support [{key}]"
                        )))
                    }
                }
            }
            let (field, values) = field.ok_or_else(|| {
                EsError::parsing("[terms] query requires a field with an array of values")
            })?;
            Ok(Query::Term {
                field,
                values,
                boost,
            })
        }
        "range" => {
            let (field, spec) = single_entry("range", body)?;
            let Value::Object(spec) = spec else {
                return Err(EsError::parsing(format!(
                    "[range] query malformed, no start_object after field [{field}]"
                )));
            };
            let mut bounds = Vec::new();
            let mut format = None;
            let mut boost = 1.0;
            let include = |key: &str, default: bool| -> Result<bool, EsError> {
                match spec.get(key) {
                    None => Ok(default),
                    Some(Value::Bool(b)) => Ok(*b),
                    Some(other) => Err(EsError::parsing(format!(
                        "[range] query does not support [{key}] = [{other}]"
                    ))),
                }
            };
            let include_lower = include("include_lower", true)?;
            let include_upper = include("include_upper", true)?;
            for (key, value) in spec {
                let op = match key.as_str() {
                    "gt" => RangeOp::Gt,
                    "gte" => RangeOp::Gte,
                    "lt" => RangeOp::Lt,
                    "lte" => RangeOp::Lte,
                    "from" if include_lower => RangeOp::Gte,
                    "from" => RangeOp::Gt,
                    "to" if include_upper => RangeOp::Lte,
                    "to" => RangeOp::Lt,
                    "format" => {
                        format = value.as_str().map(str::to_owned);
                        continue;
                    }
                    "boost" => {
                        boost = boost_of(Some(value))?;
                        continue;
                    }
                    "time_zone" => {
                        if !matches!(value.as_str(), Some("UTC" | "Z" | "+00:00" | "Etc/UTC")) {
                            return Err(EsError::unsupported("range.time_zone other than UTC"));
                        }
                        continue;
                    }
                    "include_lower" | "include_upper" | "relation" | "_name" => continue,
                    other => {
                        return Err(EsError::parsing(format!(
                            "[range] query does not support [{other}]"
                        )))
                    }
                };
                if !value.is_null() {
                    bounds.push((op, value.clone()));
                }
            }
            Ok(Query::Range {
                field: field.clone(),
                bounds,
                format,
                boost,
            })
        }
        "exists" => {
            let object = object.ok_or_else(|| EsError::parsing("[exists] query malformed"))?;
            reject_unknown("exists", object, &["field", "boost", "_name"])?;
            let field = object
                .get("field")
                .and_then(Value::as_str)
                .ok_or_else(|| EsError::parsing("[exists] must be provided with a [field]"))?;
            Ok(Query::Exists {
                field: field.to_owned(),
                boost: boost_of(object.get("boost"))?,
            })
        }
        "ids" => {
            let object = object.ok_or_else(|| EsError::parsing("[ids] query malformed"))?;
            reject_unknown("ids", object, &["values", "boost", "_name"])?;
            let values = match object.get("values") {
                Some(Value::Array(values)) => values
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s.clone()),
                        Value::Number(n) => Ok(n.to_string()),
                        other => Err(EsError::parsing(format!(
                            "[ids] query does not support values of type [{other}]"
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
                _ => return Err(EsError::parsing("[ids] query malformed, no [values] array")),
            };
            Ok(Query::Ids {
                values,
                boost: boost_of(object.get("boost"))?,
            })
        }
        "bool" => {
            let object = object.ok_or_else(|| EsError::parsing("[bool] query malformed"))?;
            let (mut must, mut filter, mut should, mut must_not) = (vec![], vec![], vec![], vec![]);
            let mut minimum_should_match = None;
            let mut boost = 1.0;
            for (key, value) in object {
                match key.as_str() {
                    "must" => must = clauses(key, value)?,
                    "filter" => filter = clauses(key, value)?,
                    "should" => should = clauses(key, value)?,
                    "must_not" | "mustNot" => must_not = clauses(key, value)?,
                    "minimum_should_match" => minimum_should_match = Some(value.clone()),
                    "boost" => boost = boost_of(Some(value))?,
                    "_name" | "adjust_pure_negative" => {}
                    other => {
                        return Err(EsError::parsing(format!(
                            "[bool] query does not support [{other}]"
                        )))
                    }
                }
            }
            Ok(Query::Bool {
                must,
                filter,
                should,
                must_not,
                minimum_should_match,
                boost,
            })
        }
        "constant_score" => {
            let object =
                object.ok_or_else(|| EsError::parsing("[constant_score] query malformed"))?;
            reject_unknown("constant_score", object, &["filter", "boost", "_name"])?;
            let filter = object
                .get("filter")
                .ok_or_else(|| EsError::parsing("[constant_score] requires a 'filter' element"))?;
            Ok(Query::ConstantScore {
                filter: Box::new(parse(filter)?),
                boost: boost_of(object.get("boost"))?,
            })
        }
        "match"
        | "match_phrase"
        | "multi_match"
        | "query_string"
        | "simple_query_string"
        | "prefix"
        | "wildcard"
        | "regexp"
        | "fuzzy"
        | "nested"
        | "has_child"
        | "has_parent"
        | "script"
        | "function_score"
        | "dis_max"
        | "boosting"
        | "geo_distance"
        | "more_like_this"
        | "knn"
        | "match_phrase_prefix"
        | "terms_set"
        | "combined_fields" => Err(EsError::unsupported(&format!("query [{name}]"))),
        other => Err(
            EsError::parsing(format!("unknown query [{other}]")).caused_by(Cause::new(
                "named_object_not_found_exception",
                format!("[1:1] unknown field [{other}]"),
            )),
        ),
    }
}

/// A query bound to one index: values converted to the field types.
#[derive(Debug)]
pub enum Compiled {
    All(f64),
    Nothing,
    AnyOf {
        field: String,
        accepted: Vec<Scalar>,
        boost: f64,
    },
    IdIn {
        ids: HashSet<String>,
        boost: f64,
    },
    Range {
        field: String,
        lower: Option<(Scalar, bool)>,
        upper: Option<(Scalar, bool)>,
        boost: f64,
    },
    Exists {
        field: String,
        boost: f64,
    },
    Bool {
        must: Vec<Compiled>,
        filter: Vec<Compiled>,
        should: Vec<Compiled>,
        must_not: Vec<Compiled>,
        minimum: usize,
        boost: f64,
    },
    Constant(Box<Compiled>, f64),
    /// A `term` on a key of a `flattened` field: some leaf at that key equals one of these.
    FlattenedKey {
        root: String,
        key: String,
        accepted: Vec<String>,
        boost: f64,
    },
}

/// Whether `field` is a `flattened` field or a key of one.
fn is_flattened(mapping: &Mapping, field: &str) -> bool {
    mapping.flattened_key(field).is_some()
        || mapping
            .field(field)
            .is_some_and(|d| d.ty == FieldType::Flattened)
}

/// A query this test double does not implement, refused rather than answered wrongly.
fn not_implemented(what: &str) -> Cause {
    Cause::new(
        "illegal_argument_exception",
        format!(
            "[{what}] is not implemented by es-emulator (a test double of a subset of the \
             Elasticsearch REST API)"
        ),
    )
}

/// Why a query cannot run on an index: a `query_shard_exception` (the caller wraps it in
/// `search_phase_execution_exception`).
fn shard_error(reason: String, cause: Option<Cause>) -> Cause {
    let mut error = Cause::new("query_shard_exception", reason);
    error.caused_by = cause.map(Box::new);
    error
}

fn minimum_should_match(
    spec: Option<&Value>,
    count: usize,
    has_required: bool,
) -> Result<usize, Cause> {
    let Some(spec) = spec else {
        return Ok(usize::from(count > 0 && !has_required));
    };
    let n = count as i64;
    let wanted = match spec {
        Value::Number(v) => v.as_i64().unwrap_or(0),
        Value::String(s) => {
            let s = s.trim();
            if let Some(percent) = s.strip_suffix('%') {
                let p: i64 = percent.parse().map_err(|_| {
                    shard_error(format!("invalid minimum_should_match [{s}]"), None)
                })?;
                if p < 0 {
                    n - (n * -p) / 100
                } else {
                    (n * p) / 100
                }
            } else {
                s.parse()
                    .map_err(|_| shard_error(format!("invalid minimum_should_match [{s}]"), None))?
            }
        }
        other => {
            return Err(shard_error(
                format!("invalid minimum_should_match [{other}]"),
                None,
            ))
        }
    };
    let wanted = if wanted < 0 { n + wanted } else { wanted };
    Ok(wanted.clamp(0, n) as usize)
}

/// Converts a query value to what the field indexes. Terms on `text` fields are not analyzed.
fn term_value(def: &FieldDef, field: &str, value: &Value) -> Result<Vec<Scalar>, Cause> {
    if def.ty == FieldType::Text {
        return Ok(match value {
            Value::String(s) => vec![Scalar::Str(s.clone())],
            other => vec![Scalar::Str(other.to_string())],
        });
    }
    mapping::coerce(def, value).map_err(|cause| {
        shard_error(
            format!("failed to create query: {}", cause.reason),
            Some(cause),
        )
        .meta("field", field)
    })
}

/// The numeric or string value of a range bound; dates go through date math.
fn bound(
    def: &FieldDef,
    op: RangeOp,
    value: &Value,
    format: Option<&str>,
    now: i64,
) -> Result<(Scalar, bool), Cause> {
    let inclusive = matches!(op, RangeOp::Gte | RangeOp::Lte);
    let invalid = |reason: String| {
        shard_error(
            format!("failed to create query: {reason}"),
            Some(Cause::new("illegal_argument_exception", reason.clone())),
        )
    };
    // A numeric bound: a number, or a string that parses as one.
    let number = || {
        match value {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok(),
            _ => None,
        }
        .ok_or_else(|| invalid(format!("For input string: \"{}\"", plain(value))))
    };
    match def.ty {
        FieldType::Date => {
            let round_up = matches!(op, RangeOp::Gt | RangeOp::Lte);
            let format = format.or(def.format.as_deref());
            let millis = match value {
                Value::String(s) => dates::eval_math(s, now, format, round_up),
                other => dates::parse_value(other, format, round_up),
            }
            .map_err(|e| {
                shard_error(
                    format!("failed to create query: {e}"),
                    Some(Cause::new("parse_exception", e.clone())),
                )
            })?;
            Ok((Scalar::Long(millis), inclusive))
        }
        FieldType::Long => {
            let number = number()?;
            if let Some(exact) = value
                .as_i64()
                .or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()))
            {
                return Ok((Scalar::Long(exact), inclusive));
            }
            // A fractional bound on a long field: the nearest whole bound that selects the
            // same values.
            let whole = match op {
                RangeOp::Gt | RangeOp::Lte => number.floor(),
                RangeOp::Gte | RangeOp::Lt => number.ceil(),
            };
            Ok((Scalar::Long(whole as i64), inclusive))
        }
        FieldType::Double => {
            let number = number()?;
            Ok((Scalar::Double(number), inclusive))
        }
        FieldType::Boolean => {
            let values = mapping::coerce(def, value).map_err(|c| invalid(c.reason))?;
            Ok((
                values.into_iter().next().unwrap_or(Scalar::Bool(false)),
                inclusive,
            ))
        }
        _ => Ok((Scalar::Str(plain(value)), inclusive)),
    }
}

fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Binds `query` to an index's mapping. `now` is the request's `now` for date math.
pub fn compile(query: &Query, mapping: &Mapping, now: i64) -> Result<Compiled, Cause> {
    Ok(match query {
        Query::MatchAll { boost } => Compiled::All(*boost),
        Query::MatchNone => Compiled::Nothing,
        Query::Term {
            field,
            values,
            boost,
        } => {
            if field == "_id" {
                return Ok(Compiled::IdIn {
                    ids: values.iter().map(plain).collect(),
                    boost: *boost,
                });
            }
            if let Some((root, key)) = mapping.flattened_key(field) {
                let mut accepted = Vec::new();
                for value in values {
                    match value {
                        Value::String(s) => accepted.push(s.clone()),
                        _ => return Err(not_implemented("a non-string term on a flattened key")),
                    }
                }
                return Ok(Compiled::FlattenedKey {
                    root: root.to_owned(),
                    key: key.to_owned(),
                    accepted,
                    boost: *boost,
                });
            }
            match mapping.field(field) {
                Some(def) if def.ty == FieldType::Flattened => {
                    return Err(not_implemented("a term query on a whole flattened field"))
                }
                Some(def)
                    if def.indexed && def.ty != FieldType::Object && def.ty != FieldType::Other =>
                {
                    let mut accepted = Vec::new();
                    for value in values {
                        accepted.extend(term_value(def, field, value)?);
                    }
                    Compiled::AnyOf {
                        field: field.clone(),
                        accepted,
                        boost: *boost,
                    }
                }
                _ => Compiled::Nothing,
            }
        }
        Query::Range { field, .. } | Query::Exists { field, .. }
            if is_flattened(mapping, field) =>
        {
            return Err(not_implemented(
                "range and exists queries on flattened fields",
            ))
        }
        Query::Range {
            field,
            bounds,
            format,
            boost,
        } => match mapping.field(field) {
            Some(def)
                if def.indexed && def.ty != FieldType::Object && def.ty != FieldType::Other =>
            {
                let (mut lower, mut upper) = (None, None);
                for (op, value) in bounds {
                    let b = bound(def, *op, value, format.as_deref(), now)?;
                    match op {
                        RangeOp::Gt | RangeOp::Gte => lower = Some(b),
                        RangeOp::Lt | RangeOp::Lte => upper = Some(b),
                    }
                }
                Compiled::Range {
                    field: field.clone(),
                    lower,
                    upper,
                    boost: *boost,
                }
            }
            _ => Compiled::Nothing,
        },
        Query::Exists { field, boost } => Compiled::Exists {
            field: field.clone(),
            boost: *boost,
        },
        Query::Ids { values, boost } => Compiled::IdIn {
            ids: values.iter().cloned().collect(),
            boost: *boost,
        },
        Query::Bool {
            must,
            filter,
            should,
            must_not,
            minimum_should_match: msm,
            boost,
        } => {
            if must.is_empty() && filter.is_empty() && should.is_empty() && must_not.is_empty() {
                // An empty bool is a match_all.
                return Ok(Compiled::All(*boost));
            }
            let all = |list: &Vec<Query>| -> Result<Vec<Compiled>, Cause> {
                list.iter().map(|q| compile(q, mapping, now)).collect()
            };
            Compiled::Bool {
                minimum: minimum_should_match(
                    msm.as_ref(),
                    should.len(),
                    !must.is_empty() || !filter.is_empty(),
                )?,
                must: all(must)?,
                filter: all(filter)?,
                should: all(should)?,
                must_not: all(must_not)?,
                boost: *boost,
            }
        }
        Query::ConstantScore { filter, boost } => {
            Compiled::Constant(Box::new(compile(filter, mapping, now)?), *boost)
        }
    })
}

fn compare(a: &Scalar, b: &Scalar) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Scalar::Long(x), Scalar::Long(y)) => Some(x.cmp(y)),
        (Scalar::Double(x), Scalar::Double(y)) => x.partial_cmp(y),
        (Scalar::Long(x), Scalar::Double(y)) => (*x as f64).partial_cmp(y),
        (Scalar::Double(x), Scalar::Long(y)) => x.partial_cmp(&(*y as f64)),
        (Scalar::Str(x), Scalar::Str(y)) => Some(x.cmp(y)),
        (Scalar::Bool(x), Scalar::Bool(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

impl Compiled {
    /// The score of `doc` if it matches.
    pub fn score(&self, mapping: &Mapping, doc: &Doc) -> Option<f64> {
        use std::cmp::Ordering::{Equal, Greater, Less};
        match self {
            Compiled::All(boost) => Some(*boost),
            Compiled::Nothing => None,
            Compiled::AnyOf {
                field,
                accepted,
                boost,
            } => mapping
                .values(field, &doc.source, doc.mapped_at)
                .iter()
                .any(|v| accepted.iter().any(|a| compare(v, a) == Some(Equal)))
                .then_some(*boost),
            Compiled::IdIn { ids, boost } => ids.contains(&doc.id).then_some(*boost),
            Compiled::Range {
                field,
                lower,
                upper,
                boost,
            } => mapping
                .values(field, &doc.source, doc.mapped_at)
                .iter()
                .any(|v| {
                    let above = lower.as_ref().is_none_or(|(b, inclusive)| {
                        matches!(compare(v, b), Some(Greater))
                            || (*inclusive && compare(v, b) == Some(Equal))
                    });
                    let below = upper.as_ref().is_none_or(|(b, inclusive)| {
                        matches!(compare(v, b), Some(Less))
                            || (*inclusive && compare(v, b) == Some(Equal))
                    });
                    above && below
                })
                .then_some(*boost),
            Compiled::Exists { field, boost } => {
                let found = if !mapping.indexed_in(field, doc.mapped_at) {
                    false
                } else if mapping
                    .field(field)
                    .is_some_and(|d| d.ty == FieldType::Object)
                {
                    let mut out = Vec::new();
                    let segments: Vec<&str> = field.split('.').collect();
                    mapping::collect(&doc.source, &segments, &mut out);
                    !out.is_empty()
                } else {
                    !mapping.values(field, &doc.source, doc.mapped_at).is_empty()
                };
                found.then_some(*boost)
            }
            Compiled::Bool {
                must,
                filter,
                should,
                must_not,
                minimum,
                boost,
            } => {
                let mut score = 0.0;
                for clause in must {
                    score += clause.score(mapping, doc)?;
                }
                for clause in filter {
                    clause.score(mapping, doc)?;
                }
                if must_not.iter().any(|c| c.score(mapping, doc).is_some()) {
                    return None;
                }
                let mut matched = 0;
                for clause in should {
                    if let Some(s) = clause.score(mapping, doc) {
                        matched += 1;
                        score += s;
                    }
                }
                (matched >= *minimum).then_some(score * boost)
            }
            Compiled::Constant(filter, boost) => filter.score(mapping, doc).map(|_| *boost),
            Compiled::FlattenedKey {
                root,
                key,
                accepted,
                boost,
            } => mapping
                .flattened_values(root, key, &doc.source, doc.mapped_at)
                .iter()
                .any(|v| accepted.contains(v))
                .then_some(*boost),
        }
    }
}
