//! The words of a load error. figment reports where in the file a value failed (the path) and
//! serde what failed; this module makes one line of it that names the key.
//!
//! serde reads a tagged enum (`[source]`, `[sink]`) by buffering the whole section before it
//! picks the variant, so an error inside the section comes back naming only `source` or `sink`.
//! [`describe`] reads the section again as the chosen kind's struct to get the key back, then
//! words the messages a user meets most: an unknown key (with the keys the section takes), a key
//! of another kind ("applies to mysql sources only"), a missing key, a value not in a list, an
//! unknown kind. A wrong-typed secret is described without its value.

use figment::error::Kind;
use figment::value::Value;
use figment::Figment;
use serde::de::DeserializeOwned;

use super::{RawIceberg, RawLsm, RawMySql, RawPostgres};

/// One kind of a tagged section, for messages.
pub(super) struct KindOf {
    pub(super) section: &'static str,
    pub(super) name: &'static str,
    /// The keys this kind's raw struct takes (`kind` aside).
    pub(super) keys: fn() -> &'static [&'static str],
    /// Reads the section, `kind` removed, as this kind's raw struct: the error, if any.
    read: fn(&Value) -> Option<figment::Error>,
}

impl KindOf {
    fn new<T: DeserializeOwned>(section: &'static str, name: &'static str) -> KindOf {
        KindOf {
            section,
            name,
            keys: keys_of::<T>,
            read: |value| value.deserialize::<T>().err(),
        }
    }
}

/// Every kind of `[source]` and `[sink]`, as [`RawSource`](super::RawSource) and
/// [`RawSink`](super::RawSink) name them (the test
/// `every_kind_is_listed_for_messages` holds the two lists together).
pub(super) fn kinds() -> [KindOf; 4] {
    [
        KindOf::new::<RawPostgres>("source", "postgres"),
        KindOf::new::<RawMySql>("source", "mysql"),
        KindOf::new::<RawIceberg>("sink", "iceberg"),
        KindOf::new::<RawLsm>("sink", "lsm"),
    ]
}

/// The keys a derived `Deserialize` struct takes: serde hands them to `deserialize_struct`.
fn keys_of<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: serde::de::Visitor<'de>>(
            self,
            _: V,
        ) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(serde::de::Error::custom("probed"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut keys: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut keys));
    keys
}

/// The message for a figment error: the key as a dotted path, then what is wrong with it.
pub(super) fn describe(figment: &Figment, e: figment::Error) -> String {
    e.into_iter()
        .map(|e| describe_one(pinpoint(figment, e)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// An error that names only a tagged section (serde buffered it), read again as the section's
/// kind so that it names the key.
fn pinpoint(figment: &Figment, e: figment::Error) -> figment::Error {
    let [section] = e.path.as_slice() else {
        return e;
    };
    let kind = figment
        .find_value(&format!("{section}.kind"))
        .ok()
        .and_then(|v| v.into_string());
    let kinds = kinds();
    let Some(of) = kinds
        .iter()
        .find(|k| k.section == section && Some(k.name) == kind.as_deref())
    else {
        return e;
    };
    let Ok(Value::Dict(tag, mut dict)) = figment.find_value(section) else {
        return e;
    };
    dict.remove("kind");
    match (of.read)(&Value::Dict(tag, dict)) {
        None => e,
        Some(again) => {
            let mut again = again.into_iter().next().unwrap_or(e);
            again.path.insert(0, of.section.to_owned());
            again
        }
    }
}

fn describe_one(e: figment::Error) -> String {
    let mut path = e.path.clone();
    let detail = match &e.kind {
        Kind::UnknownField(field, expected) => {
            if path.last() != Some(field) {
                path.push(field.clone());
            }
            let section = path[..path.len() - 1].join(".");
            let kinds = kinds();
            let tagged = kinds.iter().any(|k| k.section == section);
            match kinds
                .iter()
                .find(|k| k.section == section && (k.keys)().contains(&field.as_str()))
            {
                Some(of) => format!("applies to {} {}s only", of.name, of.section),
                None => {
                    let kind = tagged.then_some("kind").into_iter();
                    let keys: Vec<String> = kind
                        .chain(expected.iter().copied())
                        .map(|k| format!("`{k}`"))
                        .collect();
                    format!("unknown key; expected one of {}", keys.join(", "))
                }
            }
        }
        Kind::MissingField(field) => {
            if path.last().map(String::as_str) != Some(field) {
                path.push(field.to_string());
            }
            let section = path[..path.len() - 1].join(".");
            let names = match field.as_ref() {
                "kind" => kind_names(&section),
                _ => Vec::new(),
            };
            match names.as_slice() {
                [] => "is required".to_owned(),
                names => format!("is required: use {}", one_of(names)),
            }
        }
        Kind::UnknownVariant(found, expected) if path.last().is_some_and(|k| k == "kind") => {
            let section = &path[..path.len() - 1].join(".");
            format!(
                "{found:?} is not a {section} kind; use {}",
                one_of(expected)
            )
        }
        Kind::InvalidType(found, _) if path.last().is_some_and(|k| k == "kind") => {
            let section = path[..path.len() - 1].join(".");
            format!(
                "{found} is not a {section} kind; use {}",
                one_of(&kind_names(&section))
            )
        }
        Kind::UnknownVariant(found, expected) => format!("{found:?}: use {}", one_of(expected)),
        Kind::InvalidType(_, expected) if path.last().is_some_and(|k| is_secret(k)) => {
            format!("invalid type: expected {expected}")
        }
        kind => kind.to_string(),
    };
    match path.join(".") {
        key if key.is_empty() => detail,
        key => format!("key `{key}`: {detail}"),
    }
}

/// The kinds of a tagged section (none for another section).
pub(super) fn kind_names(section: &str) -> Vec<&'static str> {
    kinds()
        .iter()
        .filter(|k| k.section == section)
        .map(|k| k.name)
        .collect()
}

/// Keys whose value never appears in a message.
fn is_secret(key: &str) -> bool {
    matches!(key, "password" | "access_key_id" | "secret_access_key")
}

/// `"a" or "b"`, `"a", "b" or "c"`.
pub(super) fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}
