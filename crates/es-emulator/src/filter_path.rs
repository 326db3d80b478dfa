//! `filter_path`, Elasticsearch's response filtering: an answer keeps only the fields its
//! patterns name (`items.*.status,items.*._seq_no`).
//!
//! As Elasticsearch does it:
//! - patterns are comma-separated, each a dot-separated path of field names; a segment may
//!   hold `*` wildcards (`_s*`), and `**` stands for any number of levels;
//! - a field whose path a pattern names entirely is kept whole; arrays are transparent (a
//!   pattern goes on into each element), and objects and arrays left empty are dropped;
//! - an answer with nothing kept is `{}`;
//! - it filters answers, never error envelopes: a refused request still says why.
//!
//! Not implemented: exclusions (`-_source`), which are refused as such.

use serde_json::{Map, Value};

use crate::errors::EsError;
use crate::state::glob;

/// The patterns of one `filter_path`, each split into its segments.
#[derive(Debug)]
pub struct FilterPath(Vec<Vec<String>>);

impl FilterPath {
    /// The patterns of a `filter_path` value; `None` when it names none.
    pub fn parse(text: &str) -> Result<Option<Self>, EsError> {
        let mut patterns = Vec::new();
        for pattern in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if pattern.starts_with('-') {
                return Err(EsError::unsupported(&format!(
                    "filter_path exclusion {pattern}"
                )));
            }
            patterns.push(pattern.split('.').map(str::to_owned).collect());
        }
        Ok((!patterns.is_empty()).then_some(FilterPath(patterns)))
    }

    /// What of `answer` the patterns keep.
    pub fn apply(&self, answer: &Value) -> Value {
        let patterns: Vec<&[String]> = self.0.iter().map(Vec::as_slice).collect();
        keep(answer, &patterns).unwrap_or_else(|| Value::Object(Map::new()))
    }
}

/// `value` reduced to what `patterns` (the segments left to match below it) keep; `None`
/// when they keep nothing of it.
fn keep(value: &Value, patterns: &[&[String]]) -> Option<Value> {
    match value {
        Value::Object(fields) => {
            let mut kept = Map::new();
            for (name, field) in fields {
                let mut whole = false;
                let mut below = Vec::new();
                for pattern in patterns {
                    step(pattern, name, &mut whole, &mut below);
                }
                let field = if whole {
                    Some(field.clone())
                } else if below.is_empty() {
                    None
                } else {
                    keep(field, &below)
                };
                if let Some(field) = field {
                    kept.insert(name.clone(), field);
                }
            }
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        Value::Array(items) => {
            let kept: Vec<Value> = items.iter().filter_map(|i| keep(i, patterns)).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        // A scalar that patterns still go below has nothing they could name.
        _ => None,
    }
}

/// Matches the field `name` against `pattern`: it is kept whole when the pattern ends
/// there, or the rest of the pattern goes on below it.
fn step<'p>(pattern: &'p [String], name: &str, whole: &mut bool, below: &mut Vec<&'p [String]>) {
    let Some((first, rest)) = pattern.split_first() else {
        return;
    };
    if first == "**" {
        if rest.is_empty() {
            *whole = true;
            return;
        }
        // `**` takes this level (and stays for the next) or none at all.
        below.push(pattern);
        step(rest, name, whole, below);
    } else if glob(first, name) {
        match rest.is_empty() {
            true => *whole = true,
            false => below.push(rest),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn filtered(filter: &str, answer: Value) -> Value {
        FilterPath::parse(filter).unwrap().unwrap().apply(&answer)
    }

    #[test]
    fn bulk_items_keep_only_the_named_fields_under_their_action() {
        let answer = json!({"took": 3, "errors": true, "items": [
            {"create": {"_index": "i", "_id": "a", "_seq_no": 0, "_primary_term": 1,
                        "result": "created", "_shards": {"total": 1}, "status": 201}},
            {"index": {"_index": "i", "_id": "a", "status": 409,
                       "error": {"type": "version_conflict_engine_exception", "reason": "r"}}},
        ]});
        assert_eq!(
            filtered(
                "items.*.status,items.*._seq_no,items.*._primary_term,items.*.error",
                answer
            ),
            json!({"items": [
                {"create": {"_seq_no": 0, "_primary_term": 1, "status": 201}},
                {"index": {"status": 409,
                           "error": {"type": "version_conflict_engine_exception", "reason": "r"}}},
            ]})
        );
    }

    #[test]
    fn wildcards_and_double_stars_match_as_in_elasticsearch() {
        let doc = json!({"_index": "i", "_seq_no": 0, "found": true, "_source": {"x": 1, "y": 2}});
        assert_eq!(
            filtered("_s*,**.x", doc.clone()),
            json!({"_seq_no": 0, "_source": {"x": 1, "y": 2}})
        );
        assert_eq!(filtered("**.x", doc.clone()), json!({"_source": {"x": 1}}));
        assert_eq!(filtered("**", doc.clone()), doc);
        assert_eq!(filtered("f*d", doc.clone()), json!({"found": true}));
    }

    #[test]
    fn nothing_kept_is_an_empty_object_and_scalars_end_a_path() {
        assert_eq!(filtered("nothing.here", json!({"a": 1})), json!({}));
        assert_eq!(filtered("a.b", json!({"a": 1})), json!({}));
        assert_eq!(
            filtered("a", json!({"a": [1, {"b": 2}]})),
            json!({"a": [1, {"b": 2}]})
        );
        assert_eq!(
            filtered("a.b", json!({"a": [1, {"b": 2}, {"c": 3}]})),
            json!({"a": [{"b": 2}]})
        );
    }

    #[test]
    fn exclusions_are_refused_and_empty_patterns_name_nothing() {
        assert!(FilterPath::parse("-_source").is_err());
        assert!(FilterPath::parse("found,-_source").is_err());
        assert!(FilterPath::parse(" , ").unwrap().is_none());
    }
}
