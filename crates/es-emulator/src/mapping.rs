//! Index mappings: the declared fields (`keyword`, `text`, numbers, `date`, `boolean`,
//! objects, multi-fields), `dynamic` (`true` infers new fields, `false` stores them unindexed,
//! `strict` refuses them), validation of documents against the mapping, additions by
//! `PUT /{index}/_mapping`, and the values a query or sort reads from a document's `_source`.
//!
//! Elasticsearch indexes a document once, with the mapping of that moment: a field mapped
//! later is not searchable in documents stored before until they are written again
//! (`docs/elasticsearch.md` §8). The emulator reads values from `_source` at query time, so
//! it keeps that rule with generations: every field records the mapping generation that added
//! it ([`FieldDef::since`]), every stored document the generation it was indexed with, and a
//! field has no values in a document older than the field.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::dates;
use crate::errors::{Cause, EsError};

/// How a field is searched and sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    Keyword,
    Text,
    Long,
    Double,
    Date,
    Boolean,
    Object,
    /// `flattened`: an object whose leaves are indexed as keywords under their dotted key
    /// path. Searchable here only by a `term` query on a keyed sub-field
    /// (`labels.release`); anything else on it is refused as not implemented.
    Flattened,
    /// Accepted in mappings and stored, but not searchable by this emulator.
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dynamic {
    True,
    False,
    Strict,
}

/// One mapped field (a multi-field such as `name.keyword` is a field of its own).
#[derive(Debug, Clone)]
pub struct FieldDef {
    pub ty: FieldType,
    /// The declared type name (`integer`, `keyword`, …).
    pub type_name: String,
    /// Where the values are in `_source` (`name` for `name.keyword`).
    pub source_path: String,
    pub format: Option<String>,
    pub ignore_above: Option<usize>,
    pub ignore_malformed: bool,
    /// `false` for `"enabled": false` objects and `"index": false` fields.
    pub indexed: bool,
    pub dynamic: Option<Dynamic>,
    /// The [`Mapping::generation`] that added the field: documents indexed before it have no
    /// values for it.
    pub since: u64,
}

impl FieldDef {
    /// A field at `path` that dynamic mapping adds (as `ty`), at generation `since`: no format,
    /// no `ignore_above`, indexed.
    fn dynamic(path: &str, ty: FieldType, type_name: String, since: u64) -> Self {
        FieldDef {
            ty,
            type_name,
            source_path: path.to_owned(),
            format: None,
            ignore_above: None,
            ignore_malformed: false,
            indexed: true,
            dynamic: None,
            since,
        }
    }

    /// The multi-field `sub_def` of the field at `path` (`{path}.{sub}`: `path`'s values,
    /// indexed as `ty`), added at generation `since`.
    fn multi_field(
        path: &str,
        ty: FieldType,
        type_name: String,
        sub_def: &Value,
        since: u64,
    ) -> Self {
        FieldDef {
            ty,
            type_name,
            source_path: path.to_owned(),
            format: sub_def
                .get("format")
                .and_then(Value::as_str)
                .map(str::to_owned),
            ignore_above: sub_def
                .get("ignore_above")
                .and_then(Value::as_u64)
                .map(|n| n as usize),
            ignore_malformed: false,
            indexed: sub_def.get("index") != Some(&Value::Bool(false)),
            dynamic: None,
            since,
        }
    }
}

/// A value as indexed: what queries compare and sorts order.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Long(i64),
    Double(f64),
    Str(String),
    Bool(bool),
}

impl Scalar {
    /// The value as a search hit's `sort` shows it.
    pub fn to_json(&self) -> Value {
        match self {
            Scalar::Long(v) => json!(v),
            Scalar::Double(v) => json!(v),
            Scalar::Str(v) => json!(v),
            Scalar::Bool(v) => json!(i64::from(*v)),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Mapping {
    pub dynamic: Dynamic,
    pub date_detection: bool,
    pub fields: BTreeMap<String, FieldDef>,
    /// The mapping as Elasticsearch shows it (`GET /{index}`), dynamic fields included.
    pub tree: Value,
    /// Counts the `PUT /{index}/_mapping` requests that added fields (0 at creation).
    pub generation: u64,
}

fn mapper_error(reason: String) -> EsError {
    EsError::new(400, "mapper_parsing_exception", reason)
}

fn parse_dynamic(value: &Value) -> Result<Dynamic, EsError> {
    match value {
        Value::Bool(true) => Ok(Dynamic::True),
        Value::Bool(false) => Ok(Dynamic::False),
        Value::String(s) if s == "true" => Ok(Dynamic::True),
        Value::String(s) if s == "false" || s == "runtime" => Ok(Dynamic::False),
        Value::String(s) if s == "strict" => Ok(Dynamic::Strict),
        other => Err(mapper_error(format!(
            "Failed to parse mapping: unknown dynamic value [{other}]"
        ))),
    }
}

fn type_of(name: &str) -> Option<FieldType> {
    Some(match name {
        "keyword" | "constant_keyword" | "wildcard" => FieldType::Keyword,
        "text" | "match_only_text" => FieldType::Text,
        "long" | "integer" | "short" | "byte" | "unsigned_long" => FieldType::Long,
        "double" | "float" | "half_float" | "scaled_float" => FieldType::Double,
        "date" | "date_nanos" => FieldType::Date,
        "boolean" => FieldType::Boolean,
        "object" | "nested" => FieldType::Object,
        "flattened" => FieldType::Flattened,
        "ip" | "geo_point" | "geo_shape" | "binary" | "dense_vector" | "sparse_vector"
        | "version" | "histogram" | "alias" | "search_as_you_type" | "completion"
        | "token_count" | "rank_feature" | "rank_features" | "point" | "shape"
        | "integer_range" | "long_range" | "float_range" | "double_range" | "date_range"
        | "ip_range" | "semantic_text" => FieldType::Other,
        _ => return None,
    })
}

impl Mapping {
    /// The mapping of an index created without one (or auto-created).
    pub fn empty() -> Self {
        Mapping {
            dynamic: Dynamic::True,
            date_detection: true,
            fields: BTreeMap::new(),
            tree: json!({}),
            generation: 0,
        }
    }

    /// Reads the `mappings` of an index creation request.
    pub fn parse(mappings: &Value) -> Result<Self, EsError> {
        let mut mapping = Mapping::empty();
        let Value::Object(root) = mappings else {
            return Err(mapper_error(
                "Failed to parse mapping: Expected map for property [mappings]".into(),
            ));
        };
        let mut unsupported = Vec::new();
        for (key, value) in root {
            match key.as_str() {
                "dynamic" => mapping.dynamic = parse_dynamic(value)?,
                "date_detection" => mapping.date_detection = value.as_bool().unwrap_or(true),
                "properties" => {}
                "_meta" => {}
                // Accepted only with the values that behave as the emulator does.
                "_source" if value == &json!({}) || value == &json!({"enabled": true}) => {}
                "_routing" if value == &json!({}) || value == &json!({"required": false}) => {}
                "numeric_detection" if value == &json!(false) => {}
                "enabled" | "subobjects" if value == &json!(true) => {}
                "_source"
                | "_routing"
                | "numeric_detection"
                | "enabled"
                | "subobjects"
                | "dynamic_date_formats"
                | "dynamic_templates"
                | "runtime" => {
                    return Err(EsError::unsupported(&format!("mappings.{key} {value}")))
                }
                _ => unsupported.push(format!("{key} : {value}")),
            }
        }
        if !unsupported.is_empty() {
            return Err(mapper_error(format!(
                "Failed to parse mapping: Root mapping definition has unsupported parameters:  [{}]",
                unsupported.join("] [")
            )));
        }
        if let Some(properties) = root.get("properties") {
            mapping.parse_properties(properties, "")?;
        }
        mapping.tree = mappings.clone();
        Ok(mapping)
    }

    fn parse_properties(&mut self, properties: &Value, prefix: &str) -> Result<(), EsError> {
        let Value::Object(properties) = properties else {
            return Err(mapper_error(
                "Failed to parse mapping: Expected map for property [properties]".into(),
            ));
        };
        for (name, def) in properties {
            let path = format!("{prefix}{name}");
            let Value::Object(def) = def else {
                return Err(mapper_error(format!(
                    "Failed to parse mapping: Expected map for property [fields] on field [{path}]"
                )));
            };
            let type_name = match def.get("type") {
                Some(Value::String(t)) => t.clone(),
                Some(other) => {
                    return Err(mapper_error(format!(
                        "Failed to parse mapping: No handler for type [{other}] declared on field [{path}]"
                    )))
                }
                None => "object".to_owned(),
            };
            let ty = type_of(&type_name).ok_or_else(|| {
                mapper_error(format!(
                    "Failed to parse mapping: No handler for type [{type_name}] declared on field [{name}]"
                ))
            })?;
            if ty == FieldType::Flattened {
                // Its parameters (depth_limit, ignore_above, index, doc_values, …) change
                // what is indexed; none is modelled.
                if let Some(param) = def.keys().find(|k| *k != "type") {
                    return Err(EsError::unsupported(&format!(
                        "flattened field parameter {param} on [{path}]"
                    )));
                }
            }
            let field = FieldDef {
                ty,
                type_name,
                source_path: path.clone(),
                format: def.get("format").and_then(Value::as_str).map(str::to_owned),
                ignore_above: def
                    .get("ignore_above")
                    .and_then(Value::as_u64)
                    .map(|n| n as usize),
                ignore_malformed: def.get("ignore_malformed") == Some(&Value::Bool(true)),
                indexed: def.get("enabled") != Some(&Value::Bool(false))
                    && def.get("index") != Some(&Value::Bool(false)),
                dynamic: def.get("dynamic").map(parse_dynamic).transpose()?,
                since: 0,
            };
            if let (FieldType::Date, Some(format)) = (ty, &field.format) {
                if let Err(e) = dates::parse_with("1970-01-01", Some(format), false) {
                    if e.starts_with("Invalid format") {
                        return Err(mapper_error(format!(
                            "Failed to parse mapping: {e} on field [{path}]"
                        )));
                    }
                }
            }
            self.fields.insert(path.clone(), field.clone());
            if let Some(Value::Object(multi)) = def.get("fields") {
                for (sub, sub_def) in multi {
                    let sub_type = sub_def
                        .get("type")
                        .and_then(Value::as_str)
                        .unwrap_or("object")
                        .to_owned();
                    let ty = type_of(&sub_type).ok_or_else(|| {
                        mapper_error(format!(
                            "Failed to parse mapping: No handler for type [{sub_type}] declared on field [{sub}]"
                        ))
                    })?;
                    self.fields.insert(
                        format!("{path}.{sub}"),
                        FieldDef::multi_field(&path, ty, sub_type, sub_def, 0),
                    );
                }
            }
            if let Some(sub) = def.get("properties") {
                self.parse_properties(sub, &format!("{path}."))?;
            }
        }
        Ok(())
    }

    pub fn field(&self, path: &str) -> Option<&FieldDef> {
        self.fields.get(path)
    }

    /// Checks a document against the mapping. Returns the fields `dynamic: true` adds (to be
    /// applied with [`Mapping::add_dynamic`] once the document is written).
    pub fn check_document(
        &self,
        id: &str,
        source: &Map<String, Value>,
    ) -> Result<Vec<(String, Value)>, EsError> {
        let mut added = Vec::new();
        self.walk(id, source, "", self.dynamic, &mut added)?;
        Ok(added)
    }

    fn walk(
        &self,
        id: &str,
        object: &Map<String, Value>,
        prefix: &str,
        dynamic: Dynamic,
        added: &mut Vec<(String, Value)>,
    ) -> Result<(), EsError> {
        for (key, value) in object {
            let path = format!("{prefix}{key}");
            if value.is_null() {
                continue;
            }
            let declared = self.fields.get(&path).cloned().or_else(|| {
                added.iter().find(|(p, _)| *p == path).and_then(|(_, def)| {
                    let ty = def.get("type").and_then(Value::as_str).unwrap_or("object");
                    Some(FieldDef::dynamic(&path, type_of(ty)?, ty.to_owned(), 0))
                })
            });
            match declared {
                Some(def) if def.ty == FieldType::Flattened => {
                    if !value.is_object() {
                        return Err(EsError::unsupported(&format!(
                            "a flattened field [{path}] whose value is not an object"
                        )));
                    }
                }
                Some(def) if def.ty == FieldType::Object => {
                    if !def.indexed {
                        continue;
                    }
                    let inner = def.dynamic.unwrap_or(dynamic);
                    for element in flatten(value) {
                        match element {
                            Value::Object(o) => {
                                self.walk(id, o, &format!("{path}."), inner, added)?
                            }
                            Value::Null => {}
                            _ => {
                                return Err(document_error(format!(
                                    "object mapping for [{path}] tried to parse field [{key}] as object, but found a concrete value"
                                )))
                            }
                        }
                    }
                }
                Some(def) => {
                    for element in flatten(value) {
                        if let Err(cause) = coerce(&def, element) {
                            if def.ignore_malformed {
                                continue;
                            }
                            return Err(document_error(format!(
                                "failed to parse field [{path}] of type [{}] in document with id '{id}'. Preview of field's value: '{}'",
                                def.type_name,
                                preview(element)
                            ))
                            .caused_by(cause));
                        }
                    }
                }
                None => match dynamic {
                    Dynamic::False => {}
                    Dynamic::Strict => {
                        let within = if prefix.is_empty() {
                            "_doc"
                        } else {
                            prefix.trim_end_matches('.')
                        };
                        return Err(EsError::new(
                            400,
                            "strict_dynamic_mapping_exception",
                            format!(
                                "mapping set to strict, dynamic introduction of [{key}] within [{within}] is not allowed"
                            ),
                        ));
                    }
                    Dynamic::True => self.infer(id, &path, value, dynamic, added)?,
                },
            }
        }
        Ok(())
    }

    /// Dynamic mapping of a new field from its first value.
    fn infer(
        &self,
        id: &str,
        path: &str,
        value: &Value,
        dynamic: Dynamic,
        added: &mut Vec<(String, Value)>,
    ) -> Result<(), EsError> {
        let Some(first) = flatten(value).into_iter().find(|v| !v.is_null()) else {
            return Ok(());
        };
        let def = match first {
            Value::Object(_) => json!({"type": "object"}),
            Value::Bool(_) => json!({"type": "boolean"}),
            Value::Number(n) if n.is_i64() || n.is_u64() => json!({"type": "long"}),
            Value::Number(_) => json!({"type": "float"}),
            Value::String(s)
                if self.date_detection
                    && s.len() >= 10
                    && dates::parse_with(s, None, false).is_ok()
                    && !s.bytes().all(|b| b.is_ascii_digit()) =>
            {
                json!({"type": "date"})
            }
            _ => {
                json!({"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}})
            }
        };
        added.push((path.to_owned(), def.clone()));
        if def["type"] == "object" {
            for element in flatten(value) {
                if let Value::Object(o) = element {
                    self.walk(id, o, &format!("{path}."), dynamic, added)?;
                }
            }
        } else {
            // Later values of the same array must fit the inferred type.
            let probe = Mapping {
                dynamic,
                date_detection: self.date_detection,
                fields: BTreeMap::new(),
                tree: json!({}),
                generation: 0,
            }
            .with_field(path, &def);
            let mut object = Map::new();
            object.insert(path.to_owned(), value.clone());
            probe.walk(id, &object, "", Dynamic::False, &mut Vec::new())?;
        }
        Ok(())
    }

    fn with_field(mut self, path: &str, def: &Value) -> Self {
        self.add_dynamic(&[(path.to_owned(), def.clone())]);
        self
    }

    /// Adds dynamically mapped fields, to the lookup table and to the shown mapping.
    pub fn add_dynamic(&mut self, added: &[(String, Value)]) {
        for (path, def) in added {
            let type_name = def["type"].as_str().unwrap_or("object").to_owned();
            let Some(ty) = type_of(&type_name) else {
                continue;
            };
            self.fields.insert(
                path.clone(),
                FieldDef::dynamic(path, ty, type_name, self.generation),
            );
            if let Some(Value::Object(multi)) = def.get("fields") {
                for (sub, sub_def) in multi {
                    let sub_type = sub_def["type"].as_str().unwrap_or("keyword").to_owned();
                    if let Some(ty) = type_of(&sub_type) {
                        self.fields.insert(
                            format!("{path}.{sub}"),
                            FieldDef::multi_field(path, ty, sub_type, sub_def, self.generation),
                        );
                    }
                }
            }
            // Shown mapping: mappings.properties.a.properties.b = def
            let segments: Vec<&str> = path.split('.').collect();
            insert_shown(&mut self.tree, &segments, def);
        }
    }

    /// The mapping as `GET /{index}/_mapping` and `GET /{index}` show it: as given, except
    /// that Elasticsearch prints `dynamic` as a string (`"false"`, `"true"`, `"strict"`)
    /// however it was sent, at the root and on object fields (observed on 8.19.21 by the
    /// differential test, `tests/store/differential.rs` of the service).
    pub fn shown(&self) -> Value {
        let mut tree = self.tree.clone();
        dynamic_as_text(&mut tree);
        tree
    }

    /// Whether `field` is mapped and was mapped when a document of generation `mapped_at`
    /// was indexed.
    pub fn indexed_in(&self, field: &str, mapped_at: u64) -> bool {
        self.fields
            .get(field)
            .is_some_and(|def| def.since <= mapped_at)
    }

    /// The indexed values of `field` in a document indexed with generation `mapped_at` (empty
    /// when unmapped, mapped after the document was indexed, or absent).
    pub fn values(&self, field: &str, source: &Value, mapped_at: u64) -> Vec<Scalar> {
        let Some(def) = self.fields.get(field) else {
            return Vec::new();
        };
        if !def.indexed
            || def.ty == FieldType::Object
            || def.ty == FieldType::Other
            || def.ty == FieldType::Flattened
            || def.since > mapped_at
        {
            return Vec::new();
        }
        let mut raw = Vec::new();
        let segments: Vec<&str> = def.source_path.split('.').collect();
        collect(source, &segments, &mut raw);
        raw.into_iter()
            .filter_map(|v| coerce(def, v).ok())
            .flatten()
            .collect()
    }
}

impl Mapping {
    /// `PUT /{index}/_mapping` (§8): the mapping with the fields of `update` added, or the
    /// error Elasticsearch answers. Only additions are modelled: a field mapped already must
    /// be declared with the same type (another type is Elasticsearch's conflict) and the same
    /// parameters (changing an updatable parameter is not implemented); root options other
    /// than `properties` are not implemented.
    pub fn merge(&self, update: &Value) -> Result<Mapping, EsError> {
        let Value::Object(root) = update else {
            return Err(mapper_error(
                "Failed to parse mapping: Expected map for property [mappings]".into(),
            ));
        };
        if let Some(key) = root.keys().find(|k| *k != "properties") {
            return Err(EsError::unsupported(&format!("PUT _mapping with [{key}]")));
        }
        let Some(properties) = root.get("properties") else {
            return Ok(self.clone());
        };
        // Parsed on its own first: the same validation and errors as at index creation.
        let declared = Mapping::parse(&json!({ "properties": properties }))?;
        let mut merged = self.clone();
        let generation = self.generation + 1;
        let mut added = false;
        for (path, def) in declared.fields {
            match self.fields.get(&path) {
                None => {
                    merged.fields.insert(
                        path,
                        FieldDef {
                            since: generation,
                            ..def
                        },
                    );
                    added = true;
                }
                Some(old) if old.type_name != def.type_name => {
                    if old.ty == FieldType::Object || def.ty == FieldType::Object {
                        return Err(EsError::unsupported(&format!(
                            "changing [{path}] between an object and a field"
                        )));
                    }
                    return Err(EsError::illegal_argument(format!(
                        "mapper [{path}] cannot be changed from type [{}] to [{}]",
                        old.type_name, def.type_name
                    )));
                }
                Some(old) => {
                    let same = (old.format.as_ref(), old.ignore_above, old.ignore_malformed)
                        == (def.format.as_ref(), def.ignore_above, def.ignore_malformed)
                        && (old.indexed, old.dynamic) == (def.indexed, def.dynamic);
                    if !same {
                        return Err(EsError::unsupported(&format!(
                            "changing the parameters of mapped field [{path}]"
                        )));
                    }
                }
            }
        }
        if added {
            merged.generation = generation;
            if let Value::Object(update) = properties {
                let tree = merged.tree.as_object_mut().expect("a mapping is an object");
                let shown = tree.entry("properties").or_insert_with(|| json!({}));
                merge_shown(shown, update);
            }
        }
        Ok(merged)
    }
}

/// Adds the declarations of `update` that `shown` (a `properties` object) lacks, through
/// objects' `properties` and fields' multi-fields.
fn merge_shown(shown: &mut Value, update: &Map<String, Value>) {
    let Value::Object(shown) = shown else { return };
    for (name, def) in update {
        let Some(existing) = shown.get_mut(name) else {
            shown.insert(name.clone(), def.clone());
            continue;
        };
        for nested in ["properties", "fields"] {
            if let Some(Value::Object(inner)) = def.get(nested) {
                if let Value::Object(existing) = existing {
                    let into = existing.entry(nested).or_insert_with(|| json!({}));
                    merge_shown(into, inner);
                }
            }
        }
    }
}

/// Puts `def` at `properties.a.properties.b` of the shown mapping.
fn insert_shown(node: &mut Value, segments: &[&str], def: &Value) {
    let Some((first, rest)) = segments.split_first() else {
        return;
    };
    if !node.is_object() {
        *node = json!({});
    }
    let Value::Object(object) = node else { return };
    let properties = object.entry("properties").or_insert_with(|| json!({}));
    if !properties.is_object() {
        *properties = json!({});
    }
    let Value::Object(properties) = properties else {
        return;
    };
    let child = properties
        .entry(first.to_string())
        .or_insert_with(|| json!({}));
    if rest.is_empty() {
        if let (Value::Object(child), Value::Object(def)) = (child, def) {
            for (k, v) in def {
                child.insert(k.clone(), v.clone());
            }
            if child.contains_key("properties") {
                child.remove("type");
            }
        }
    } else {
        insert_shown(child, rest, def);
        if let Value::Object(child) = child {
            if child.get("type").and_then(Value::as_str) == Some("object") {
                child.remove("type");
            }
        }
    }
}

fn document_error(reason: String) -> EsError {
    EsError::new(400, "document_parsing_exception", reason)
}

fn preview(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A value and, for arrays, their elements (nested arrays flattened).
pub fn flatten(value: &Value) -> Vec<&Value> {
    match value {
        Value::Array(items) => items.iter().flat_map(flatten).collect(),
        other => vec![other],
    }
}

/// The values at a dotted path of `_source`, through arrays and dotted keys.
pub fn collect<'a>(value: &'a Value, segments: &[&str], out: &mut Vec<&'a Value>) {
    match value {
        Value::Array(items) => {
            for item in items {
                collect(item, segments, out);
            }
        }
        Value::Null => {}
        _ if segments.is_empty() => out.push(value),
        Value::Object(object) => {
            for take in 1..=segments.len() {
                if let Some(inner) = object.get(&segments[..take].join(".")) {
                    collect(inner, &segments[take..], out);
                }
            }
        }
        _ => {}
    }
}

/// Splits text the way the standard analyzer roughly does: lower case, on non-alphanumerics.
pub fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect()
}

fn parse_long(value: &Value) -> Result<i64, String> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.is_finite() && f.abs() < 9.2e18)
                    .map(|f| f.trunc() as i64)
            })
            .ok_or_else(|| format!("Value [{n}] is out of range for a long")),
        Value::String(s) => s
            .trim()
            .parse::<i64>()
            .or_else(|_| {
                s.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite() && f.abs() < 9.2e18)
                    .map(|f| f.trunc() as i64)
                    .ok_or(())
            })
            .map_err(|_| format!("For input string: \"{s}\"")),
        other => Err(format!(
            "Current token ({}) not numeric, can not use numeric value accessors",
            token_name(other)
        )),
    }
}

fn token_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "VALUE_NULL",
        Value::Bool(true) => "VALUE_TRUE",
        Value::Bool(false) => "VALUE_FALSE",
        Value::Number(_) => "VALUE_NUMBER",
        Value::String(_) => "VALUE_STRING",
        Value::Array(_) => "START_ARRAY",
        Value::Object(_) => "START_OBJECT",
    }
}

/// What a scalar from `_source` (or a query) becomes in a field of this type.
pub fn coerce(def: &FieldDef, value: &Value) -> Result<Vec<Scalar>, Cause> {
    let illegal = |reason: String| Cause::new("illegal_argument_exception", reason);
    match def.ty {
        FieldType::Long => parse_long(value)
            .map(|v| vec![Scalar::Long(v)])
            .map_err(illegal),
        FieldType::Double => match value {
            Value::Number(n) => Ok(vec![Scalar::Double(n.as_f64().unwrap_or(0.0))]),
            Value::String(s) => s
                .trim()
                .parse::<f64>()
                .map(|f| vec![Scalar::Double(f)])
                .map_err(|_| illegal(format!("For input string: \"{s}\""))),
            other => Err(illegal(format!(
                "Current token ({}) not numeric",
                token_name(other)
            ))),
        },
        FieldType::Date => dates::parse_value(value, def.format.as_deref(), false)
            .map(|v| vec![Scalar::Long(v)])
            .map_err(illegal),
        FieldType::Boolean => match value {
            Value::Bool(b) => Ok(vec![Scalar::Bool(*b)]),
            Value::String(s) if s == "true" => Ok(vec![Scalar::Bool(true)]),
            Value::String(s) if s == "false" || s.is_empty() => Ok(vec![Scalar::Bool(false)]),
            other => Err(illegal(format!(
                "Failed to parse value [{}] as only [true] or [false] are allowed.",
                preview(other)
            ))),
        },
        FieldType::Keyword | FieldType::Text => {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => {
                    return Err(illegal(format!(
                        "failed to parse field of type [{}]: found {}",
                        def.type_name,
                        token_name(other)
                    )))
                }
            };
            if def.ty == FieldType::Text {
                Ok(tokens(&text).into_iter().map(Scalar::Str).collect())
            } else if def
                .ignore_above
                .is_some_and(|max| text.chars().count() > max)
            {
                Ok(Vec::new())
            } else {
                Ok(vec![Scalar::Str(text)])
            }
        }
        FieldType::Object | FieldType::Other | FieldType::Flattened => Ok(Vec::new()),
    }
}

impl Mapping {
    /// For `labels.release` where `labels` is a `flattened` field: (`labels`, `release`).
    pub fn flattened_key<'a>(&self, field: &'a str) -> Option<(&'a str, &'a str)> {
        field.match_indices('.').find_map(|(at, _)| {
            let (root, key) = (&field[..at], &field[at + 1..]);
            let def = self.fields.get(root)?;
            (def.ty == FieldType::Flattened && !key.is_empty()).then_some((root, key))
        })
    }

    /// The values a `flattened` field `root` indexes under `key` in a document indexed with
    /// generation `mapped_at`: the leaves at that dotted path, as keyword text (numbers and
    /// booleans as their JSON text).
    pub fn flattened_values(
        &self,
        root: &str,
        key: &str,
        source: &Value,
        mapped_at: u64,
    ) -> Vec<String> {
        if !self.indexed_in(root, mapped_at) {
            return Vec::new();
        }
        let mut objects = Vec::new();
        let segments: Vec<&str> = root.split('.').collect();
        collect(source, &segments, &mut objects);
        let mut out = Vec::new();
        for object in objects {
            leaves(object, "", &mut |path, leaf| {
                if path == key {
                    out.push(match leaf {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    });
                }
            });
        }
        out
    }
}

/// Every leaf of `value` with its dotted key path below `prefix` (arrays add no segment).
fn leaves(value: &Value, prefix: &str, f: &mut impl FnMut(&str, &Value)) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(v, &path, f);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| leaves(v, prefix, f)),
        Value::Null => {}
        leaf => f(prefix, leaf),
    }
}

/// `dynamic: <bool>` → `dynamic: "<bool>"` on a mapping object and on every object field
/// under its `properties` (not on a field that happens to be named `dynamic`).
fn dynamic_as_text(object: &mut Value) {
    let Value::Object(map) = object else {
        return;
    };
    if let Some(Value::Bool(flag)) = map.get("dynamic") {
        let text = flag.to_string();
        map.insert("dynamic".into(), Value::String(text));
    }
    if let Some(Value::Object(properties)) = map.get_mut("properties") {
        for def in properties.values_mut() {
            dynamic_as_text(def);
        }
    }
}
