//! Request bodies, decoded in one pass straight into typed fields: no `serde_json::Value`
//! tree is built for a body, nor a map of its keys.
//!
//! A body type ([`json_fields!`]) names its fields, each of a lenient type: [`Text`],
//! [`Integer`], [`Flag`], [`Array`], [`Object`] or [`MetadataField`]. A field holds its value
//! when the JSON has the type the field wants, and `Other` (or `OtherNumber`) when it has
//! another, so that the handler's validator (`super::field`) answers with that field's own
//! 422; a null reads as absent, like a missing field.
//!
//! What a body may hold is exactly what parsing it whole accepted before: every value is
//! parsed and checked, the fields nobody reads included ([`Discard`]), so what `serde_json`
//! refuses (nesting deeper than 128, a number out of range, a lone surrogate, trailing
//! characters) is a 400 wherever it is. Two things are stricter: a field given twice, which a
//! whole-body parse resolved silently (the last won), is a 422 naming it ([`Fields::twice`]):
//! which of the two the client meant is a guess, and parsers disagree on it; and a field the
//! body type does not have (`amt`, `Hold`: names are case-sensitive) is a 422 naming it and
//! the field it is closest to ([`Fields::unknown`], [`did_you_mean`]): ignoring it would do
//! something else than the client asked (capture all of a hold instead of part of it).

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{ApiError, NOT_AN_OBJECT};

/// A JSON string field.
#[derive(Debug)]
pub enum Text {
    Given(String),
    Other,
}

/// A JSON integer field: a signed 64-bit integer, another number (a fraction, an exponent,
/// beyond the range), or something else.
#[derive(Debug)]
pub enum Integer {
    Given(i64),
    OtherNumber,
    Other,
}

/// A JSON boolean field.
#[derive(Debug)]
pub enum Flag {
    Given(bool),
    Other,
}

/// A JSON array field, each element read as `T`.
#[derive(Debug)]
pub enum Array<T> {
    Given(Vec<T>),
    Other,
}

/// A JSON object with the fields of `T`.
#[derive(Debug)]
pub enum Object<T> {
    Given(T),
    Other,
}

/// A JSON object of labels: each key's value (the last, if a key is given twice, as a
/// whole-body parse read it), by key.
#[derive(Debug)]
pub enum MetadataField {
    Given(BTreeMap<String, Text>),
    Other,
}

/// The fields of a JSON object, made by [`json_fields!`].
pub trait Fields: Default {
    /// The field names, as they are spelled in JSON (at most 64).
    const NAMES: &'static [&'static str];

    /// What the object is, for messages: "a transfer", "a capture".
    const KIND: &'static str;

    /// Reads the value of field `name` (one of [`Fields::NAMES`]).
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        name: &'static str,
        map: &mut A,
    ) -> Result<(), A::Error>;

    /// Notes that field `name` was given more than once.
    fn given_twice(&mut self, name: &'static str);

    /// The first field given more than once, if any.
    fn twice(&self) -> Option<&'static str>;

    /// Notes a key that is none of [`Fields::NAMES`] (only the first is kept).
    fn given_unknown(&mut self, name: String);

    /// The first key given that is none of [`Fields::NAMES`], if any.
    fn unknown(&self) -> Option<&str>;
}

/// Declares a body type: a struct whose fields are `Option<T>` of lenient types (absent
/// or null: `None`), readable as an [`Object`]. The same declaration is the body's OpenAPI
/// schema: each field says, by `#[schema(value_type = ...)]`, what a valid value is (the
/// lenient type only says how to read one), and its doc comment is the field's description;
/// `deny_unknown_fields` states that any other field is refused, as [`Fields::unknown`] makes
/// it.
macro_rules! json_fields {
    ($(#[$meta:meta])* pub struct $name:ident ($kind:literal) { $($(#[$field_meta:meta])* $field:ident: $ty:ty,)* }) => {
        #[derive(Debug, Default, utoipa::ToSchema)]
        #[serde(deny_unknown_fields)]
        $(#[$meta])*
        pub struct $name {
            $($(#[$field_meta])* pub $field: Option<$ty>,)*
            #[serde(skip)]
            twice: Option<&'static str>,
            #[serde(skip)]
            unknown: Option<String>,
        }

        impl $crate::http::body::Fields for $name {
            const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];
            const KIND: &'static str = $kind;

            fn read<'de, A: serde::de::MapAccess<'de>>(
                &mut self,
                name: &'static str,
                map: &mut A,
            ) -> Result<(), A::Error> {
                match name {
                    $(stringify!($field) => self.$field = map.next_value()?,)*
                    _ => unreachable!("`{name}` is not one of the names"),
                }
                Ok(())
            }

            fn given_twice(&mut self, name: &'static str) {
                self.twice.get_or_insert(name);
            }

            fn twice(&self) -> Option<&'static str> {
                self.twice
            }

            fn given_unknown(&mut self, name: String) {
                self.unknown.get_or_insert(name);
            }

            fn unknown(&self) -> Option<&str> {
                self.unknown.as_deref()
            }
        }
    };
}
pub(crate) use json_fields;

/// Parses a request body that must be a JSON object with the fields of `T`: 400 unless it
/// is JSON, 422 unless it is an object.
pub fn parse<T: Fields>(bytes: &[u8]) -> Result<T, ApiError> {
    match serde_json::from_slice::<Object<T>>(bytes) {
        Ok(Object::Given(fields)) => Ok(fields),
        Ok(Object::Other) => Err(ApiError::Invalid(NOT_AN_OBJECT.into())),
        Err(e) => Err(ApiError::Malformed(format!("body is not valid JSON: {e}"))),
    }
}

/// A type that reads any JSON value: the one it wants, or `other()`. Objects and arrays it
/// does not want are still read to the end, every value in them checked ([`Discard`]).
trait Lenient: Sized {
    fn other() -> Self;

    fn string(_: String) -> Self {
        Self::other()
    }

    fn integer(_: i64) -> Self {
        Self::other()
    }

    /// A number that is not a signed 64-bit integer.
    fn other_number() -> Self {
        Self::other()
    }

    fn boolean(_: bool) -> Self {
        Self::other()
    }

    fn object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        while map.next_entry::<Discard, Discard>()?.is_some() {}
        Ok(Self::other())
    }

    fn array<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<Discard>()?.is_some() {}
        Ok(Self::other())
    }
}

impl Lenient for Text {
    fn other() -> Self {
        Text::Other
    }

    fn string(text: String) -> Self {
        Text::Given(text)
    }
}

impl Lenient for Integer {
    fn other() -> Self {
        Integer::Other
    }

    fn integer(n: i64) -> Self {
        Integer::Given(n)
    }

    fn other_number() -> Self {
        Integer::OtherNumber
    }
}

impl Lenient for Flag {
    fn other() -> Self {
        Flag::Other
    }

    fn boolean(flag: bool) -> Self {
        Flag::Given(flag)
    }
}

impl<T: DeserializeOwned> Lenient for Array<T> {
    fn other() -> Self {
        Array::Other
    }

    fn array<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Array::Given(items))
    }
}

impl<T: Fields> Lenient for Object<T> {
    fn other() -> Self {
        Object::Other
    }

    fn object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut fields = T::default();
        // Which of the fields were given, one bit each (a body type has at most 64).
        let mut given = 0u64;
        while let Some(key) = map.next_key_seed(FieldName {
            names: T::NAMES,
            keep_unknown: fields.unknown().is_none(),
        })? {
            let index = match key {
                Key::Known(index) => index,
                Key::Unknown(name) => {
                    if let Some(name) = name {
                        fields.given_unknown(name);
                    }
                    map.next_value::<Discard>()?;
                    continue;
                }
            };
            let name = T::NAMES[index];
            if given & (1 << index) != 0 {
                fields.given_twice(name);
            }
            given |= 1 << index;
            fields.read(name, &mut map)?;
        }
        Ok(Object::Given(fields))
    }
}

impl Lenient for MetadataField {
    fn other() -> Self {
        MetadataField::Other
    }

    fn object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut labels = BTreeMap::new();
        while let Some((key, value)) = map.next_entry::<String, Text>()? {
            labels.insert(key, value);
        }
        Ok(MetadataField::Given(labels))
    }
}

/// Reads any JSON value as `T` ([`Lenient`]).
struct LenientVisitor<T>(PhantomData<T>);

impl<'de, T: Lenient> Visitor<'de> for LenientVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<T, E> {
        Ok(T::boolean(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<T, E> {
        Ok(T::integer(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<T, E> {
        Ok(i64::try_from(v).map_or_else(|_| T::other_number(), T::integer))
    }

    fn visit_f64<E>(self, _: f64) -> Result<T, E> {
        Ok(T::other_number())
    }

    fn visit_str<E>(self, v: &str) -> Result<T, E> {
        Ok(T::string(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<T, E> {
        Ok(T::string(v))
    }

    /// A null where no `Option` takes it (an array's element, a label's value).
    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::other())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::object(map)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::array(seq)
    }
}

/// `Deserialize` for lenient types: any JSON value (`deserialize_any`, which parses and
/// checks all of it).
macro_rules! deserialize_leniently {
    ($([$($generics:tt)*] $ty:ty),* $(,)?) => {$(
        impl<'de, $($generics)*> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_any(LenientVisitor(PhantomData))
            }
        }
    )*};
}

deserialize_leniently!(
    [] Text,
    [] Integer,
    [] Flag,
    [] MetadataField,
    [T: Fields] Object<T>,
    [T: DeserializeOwned] Array<T>,
);

/// An object key: its position in `names`, or a key the object does not have (copied only
/// when `keep_unknown`: the first one, for the message). Known keys are matched without being
/// copied.
struct FieldName {
    names: &'static [&'static str],
    keep_unknown: bool,
}

/// What [`FieldName`] read.
enum Key {
    Known(usize),
    Unknown(Option<String>),
}

impl<'de> DeserializeSeed<'de> for FieldName {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for FieldName {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(match self.names.iter().position(|name| *name == key) {
            Some(index) => Key::Known(index),
            None => Key::Unknown(self.keep_unknown.then(|| key.to_owned())),
        })
    }
}

/// The name in `names` that `given` most likely misspells, if one is close enough (by
/// [`closeness`]): the same name in other case (`Hold`), a name with letters left out or
/// added (`amt`, `flor`, `curency`, `transfer`), or one a couple of edits away (`amuont`).
pub fn did_you_mean(given: &str, names: &[&'static str]) -> Option<&'static str> {
    /// Below this two names are unrelated (`foo` and `to` are 0.33 apart).
    const CLOSE: f64 = 0.7;
    names
        .iter()
        .map(|name| (closeness(given, name), *name))
        .filter(|(score, _)| *score >= CLOSE)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, name)| name)
}

/// How alike two field names are, from 0 to 1, ignoring case: 1 for the same letters, 0.9
/// when the shorter is the longer with letters left out and both start alike (an
/// abbreviation or a dropped letter), else the normalized Damerau-Levenshtein similarity.
fn closeness(given: &str, name: &str) -> f64 {
    let (given, name) = (given.to_lowercase(), name.to_lowercase());
    if given == name {
        return 1.0;
    }
    let (short, long) = if given.len() <= name.len() {
        (&given, &name)
    } else {
        (&name, &given)
    };
    let mut rest = long.chars();
    let left_out = short.chars().all(|c| rest.any(|l| l == c));
    if left_out && short.chars().count() >= 2 && short.chars().next() == long.chars().next() {
        return 0.9;
    }
    strsim::normalized_damerau_levenshtein(&given, &name)
}

/// Any JSON value, parsed and checked as a whole-body parse would (depth, numbers,
/// strings), then dropped.
struct Discard;

impl<'de> Deserialize<'de> for Discard {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Discard)
    }
}

impl<'de> Visitor<'de> for Discard {
    type Value = Discard;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Discard, E> {
        Ok(Discard)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Discard, E> {
        Ok(Discard)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Discard, E> {
        Ok(Discard)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Discard, E> {
        Ok(Discard)
    }

    fn visit_str<E>(self, _: &str) -> Result<Discard, E> {
        Ok(Discard)
    }

    fn visit_unit<E>(self) -> Result<Discard, E> {
        Ok(Discard)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Discard, A::Error> {
        while map.next_entry::<Discard, Discard>()?.is_some() {}
        Ok(Discard)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Discard, A::Error> {
        while seq.next_element::<Discard>()?.is_some() {}
        Ok(Discard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::accounts::CreateAccount;
    use crate::http::batch::CreateBatch;
    use crate::http::transfers::{CaptureHold, CreateLeg, CreateTransfer};

    fn transfer(json: &str) -> Result<CreateTransfer, ApiError> {
        parse::<CreateTransfer>(json.as_bytes())
    }

    fn status(result: Result<CreateTransfer, ApiError>) -> u16 {
        result.map_or_else(|e| e.problem().status, |_| 200)
    }

    #[test]
    fn fields_of_the_wanted_type_are_given_and_others_are_marked() {
        let body = transfer(
            r#"{"id":"t1","from":5,"amount":7,"to":"B","hold":"yes","legs":{},"x":[1,{"y":2}]}"#,
        )
        .unwrap();
        assert!(matches!(body.id, Some(Text::Given(ref id)) if id == "t1"));
        assert!(matches!(body.from, Some(Text::Other)));
        assert!(matches!(body.amount, Some(Integer::Given(7))));
        assert!(matches!(body.hold, Some(Flag::Other)));
        assert!(matches!(body.legs, Some(Array::Other)));
        assert!(body.currency.is_none());
        assert_eq!(body.twice(), None);
    }

    #[test]
    fn null_reads_as_absent() {
        let body = transfer(r#"{"id":null,"amount":null}"#).unwrap();
        assert!(body.id.is_none() && body.amount.is_none());
    }

    #[test]
    fn numbers_that_are_not_signed_64_bit_integers_are_other_numbers() {
        for amount in ["1.0", "-0.5", "1e3", "9223372036854775808"] {
            let body = transfer(&format!(r#"{{"amount":{amount}}}"#)).unwrap();
            assert!(
                matches!(body.amount, Some(Integer::OtherNumber)),
                "{amount}: {:?}",
                body.amount
            );
        }
        let body = transfer(r#"{"amount":-9223372036854775808}"#).unwrap();
        assert!(matches!(body.amount, Some(Integer::Given(i64::MIN))));
    }

    #[test]
    fn a_field_given_twice_is_named() {
        let body = transfer(r#"{"amount":1,"id":"a","amount":-1,"id":"b"}"#).unwrap();
        assert_eq!(body.twice(), Some("amount"));
        let body = transfer(r#"{"id":null,"id":"b"}"#).unwrap();
        assert_eq!(body.twice(), Some("id"), "a null counts as given");
        let body = transfer(r#"{"x":1,"x":2}"#).unwrap();
        assert_eq!(body.twice(), None, "fields nobody reads may repeat");
    }

    #[test]
    fn the_first_unknown_field_is_kept_case_sensitively() {
        let body = transfer(r#"{"id":"t","Hold":true,"x":1,"metadata":{"Any":"1"}}"#).unwrap();
        assert_eq!(body.unknown(), Some("Hold"));
        assert!(body.hold.is_none(), "`Hold` is not `hold`");
        assert!(
            body.metadata.is_some(),
            "metadata keys are labels, not fields"
        );
        let body = parse::<CreateBatch>(br#"{"transfers":[{"amt":1}],"extra":{"a":[1]}}"#).unwrap();
        assert_eq!(body.unknown(), Some("extra"));
        let Some(Array::Given(items)) = body.transfers else {
            panic!("an array of items")
        };
        let Object::Given(item) = &items[0] else {
            panic!("an object")
        };
        assert_eq!(item.unknown(), Some("amt"), "each object keeps its own");
        assert_eq!(transfer(r#"{"id":"t"}"#).unwrap().unknown(), None);
    }

    #[test]
    fn a_misspelled_field_is_matched_to_the_field_meant() {
        let transfer = CreateTransfer::NAMES;
        let account = CreateAccount::NAMES;
        for (given, names, meant) in [
            ("amt", CaptureHold::NAMES, Some("amount")),
            ("Hold", transfer, Some("hold")),
            ("AMOUNT", transfer, Some("amount")),
            ("flor", account, Some("floor")),
            ("curency", account, Some("currency")),
            ("hold_expires", transfer, Some("hold_expires_in")),
            ("metdata", transfer, Some("metadata")),
            ("transfer", CreateBatch::NAMES, Some("transfers")),
            ("amuont", CaptureHold::NAMES, Some("amount")),
            ("from_account", CreateLeg::NAMES, Some("from")),
            ("foo", transfer, None),
            ("colour", account, None),
            ("", transfer, None),
        ] {
            assert_eq!(did_you_mean(given, names), meant, "{given:?}");
        }
    }

    #[test]
    fn what_a_whole_body_parse_refuses_is_refused_anywhere_in_the_body() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        for json in [
            format!(r#"{{"x":{deep}}}"#),
            format!(r#"{{"metadata":{{"k":{deep}}}}}"#),
            r#"{"x":1e400}"#.into(),
            r#"{"x":"\ud800"}"#.into(),
            r#"{"\ud800":1}"#.into(),
            r#"{"id":"t"} x"#.into(),
            r#"{"id":"t""#.into(),
            "\u{feff}{}".into(),
        ] {
            assert_eq!(status(transfer(&json)), 400, "{json}");
        }
    }

    #[test]
    fn a_body_that_is_not_an_object_is_422() {
        for json in ["null", "[]", r#"[{"id":"t"}]"#, "1", r#""t""#] {
            assert_eq!(status(transfer(json)), 422, "{json}");
        }
    }

    #[test]
    fn items_and_labels_keep_their_own_shapes() {
        let batch =
            parse::<CreateBatch>(br#"{"transfers":[{"id":"a"},null,[],{"id":"b"}]}"#).unwrap();
        let Some(Array::Given(items)) = batch.transfers else {
            panic!("an array of items")
        };
        let shapes: Vec<bool> = items
            .iter()
            .map(|item| matches!(item, Object::Given(_)))
            .collect();
        assert_eq!(shapes, [true, false, false, true]);
        let body = transfer(r#"{"metadata":{"b":"2","a":1,"b":"3"}}"#).unwrap();
        let Some(MetadataField::Given(labels)) = body.metadata else {
            panic!("an object of labels")
        };
        let keys: Vec<&str> = labels.keys().map(String::as_str).collect();
        assert_eq!(keys, ["a", "b"]);
        assert!(
            matches!(labels["b"], Text::Given(ref v) if v == "3"),
            "the last wins"
        );
        assert!(matches!(labels["a"], Text::Other));
    }
}
