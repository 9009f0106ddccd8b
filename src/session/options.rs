//! Options of every session kind: accepted nested under `options` or flat
//! at the top level of a request, with errors that name the option.

use serde::de::{self, DeserializeOwned, Visitor};
use serde_json::{Map, Value};

/// A request field that is wrong, named by its path (`options.max_turns`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct OptionError {
    pub field: String,
    pub message: String,
}

impl OptionError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> OptionError {
        OptionError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Builds a kind's options from a request body: `options` nested, and
/// every top-level key not in `reserved` taken as a flat option. A key
/// given both ways must agree. Errors name the option's path; a key that
/// is neither an option nor one of `reserved` is named where the request
/// wrote it (`promt`, `options.max_turnz`), with the known name it is
/// closest to.
pub fn from_body<T: DeserializeOwned>(
    body: &Map<String, Value>,
    reserved: &[&str],
) -> Result<T, OptionError> {
    if let Some(fields) = fields_of::<T>() {
        check_names(body, reserved, fields)?;
    }
    let mut merged = match body.get("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err(OptionError::new("options", "must be an object")),
    };
    for (key, value) in body {
        if key == "options" || reserved.contains(&key.as_str()) {
            continue;
        }
        match merged.get(key) {
            Some(nested) if nested != value => {
                return Err(OptionError::new(
                    key.as_str(),
                    "given both flat and under options with different values",
                ));
            }
            _ => {
                merged.insert(key.clone(), value.clone());
            }
        }
    }
    serde_path_to_error::deserialize(Value::Object(merged)).map_err(|e| {
        let path = e.path().to_string();
        let inner = crate::words::plain_types(&e.into_inner().to_string());
        // serde names an unknown field in its message; keep the path
        // pointing at the object that held it. Flat or nested, an option
        // is named `options.NAME`, as the kinds' own checks name it.
        let field = if path == "." {
            "options".to_string()
        } else {
            format!("options.{path}")
        };
        OptionError::new(field, inner)
    })
}

/// A kind's options from a request body, as [`super::SessionTask::options`]
/// builds and checks them, each error named where the request wrote the
/// option: one given only flat (`{"max_turns": "x"}`) is `max_turns`, one
/// under `options` stays `options.max_turns`.
pub async fn as_written(
    task: &dyn super::SessionTask,
    body: &Map<String, Value>,
    fields: &[&str],
) -> Result<Value, super::SessionError> {
    task.options(body, fields).await.map_err(|e| match e {
        super::SessionError::Option(error) => super::SessionError::Option(written(body, error)),
        other => other,
    })
}

fn written(body: &Map<String, Value>, error: OptionError) -> OptionError {
    let Some(path) = error.field.strip_prefix("options.") else {
        return error;
    };
    let name = path.split(['.', '[']).next().unwrap_or(path);
    let nested = body
        .get("options")
        .and_then(Value::as_object)
        .is_some_and(|options| options.contains_key(name));
    if body.contains_key(name) && !nested {
        return OptionError::new(path, error.message);
    }
    error
}

/// Refuses the first key that names nothing, at the top level or under
/// `options` (serde would name it in its message only, and as an option
/// even when it was a typo of one of the route's own fields).
fn check_names(
    body: &Map<String, Value>,
    reserved: &[&str],
    fields: &[&str],
) -> Result<(), OptionError> {
    let top = fields.iter().chain(reserved).copied().chain(["options"]);
    if let Some(key) = body.keys().find(|k| !top.clone().any(|known| known == *k)) {
        return Err(unknown(key.clone(), key, top));
    }
    if let Some(Value::Object(nested)) = body.get("options")
        && let Some(key) = nested.keys().find(|k| !fields.contains(&k.as_str()))
    {
        return Err(unknown(
            format!("options.{key}"),
            key,
            fields.iter().copied(),
        ));
    }
    Ok(())
}

fn unknown<'a>(
    field: String,
    key: &str,
    known: impl Iterator<Item = &'a str> + Clone,
) -> OptionError {
    let message = match crate::words::closest(key, known.clone()) {
        Some(name) => format!("unknown field; did you mean {name}?"),
        None => {
            let mut names: Vec<&str> = known.collect();
            names.sort_unstable();
            format!("unknown field; known fields: {}", names.join(", "))
        }
    };
    OptionError::new(field, message)
}

/// The field names of `T` when it deserializes as a struct (as serde's
/// derive lists them for its own unknown-field message); `None` for a map
/// or anything else, whose keys serde checks itself.
fn fields_of<T: DeserializeOwned>() -> Option<&'static [&'static str]> {
    let mut fields = None;
    let _ = T::deserialize(FieldNames(&mut fields));
    fields
}

/// A deserializer that only records the field list a struct asks for.
struct FieldNames<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> de::Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(fields);
        Err(de::Error::custom("only the field names were asked for"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Options {
        #[allow(dead_code)]
        max_turns: Option<u32>,
    }

    fn refused(body: Value) -> OptionError {
        let Value::Object(body) = body else {
            panic!("an object")
        };
        from_body::<Options>(&body, &["prompt"]).unwrap_err()
    }

    #[test]
    fn an_unknown_key_is_named_where_it_was_written() {
        let top = refused(json!({"promt": "hi"}));
        assert_eq!(
            (top.field.as_str(), top.message.as_str()),
            ("promt", "unknown field; did you mean prompt?")
        );
        let nested = refused(json!({"prompt": "hi", "options": {"max_turnz": 2}}));
        assert_eq!(
            (nested.field.as_str(), nested.message.as_str()),
            (
                "options.max_turnz",
                "unknown field; did you mean max_turns?"
            )
        );
        let far = refused(json!({"colour": "red"}));
        assert_eq!(
            far.message,
            "unknown field; known fields: max_turns, options, prompt"
        );
        let reserved = refused(json!({"options": {"prompt": "hi"}}));
        assert_eq!(reserved.field, "options.prompt", "not an option");
    }

    #[test]
    fn an_error_is_named_where_the_option_was_written() {
        let named = |body: Value, field: &str| {
            let Value::Object(body) = body else {
                unreachable!()
            };
            written(&body, OptionError::new(field, "bad")).field
        };
        assert_eq!(
            named(json!({"max_turns": "x"}), "options.max_turns"),
            "max_turns"
        );
        assert_eq!(
            named(json!({"sandbox": {"cpus": 99}}), "options.sandbox.cpus"),
            "sandbox.cpus"
        );
        assert_eq!(
            named(json!({"models": ["x"]}), "options.models[0]"),
            "models[0]"
        );
        assert_eq!(
            named(json!({"options": {"max_turns": "x"}}), "options.max_turns"),
            "options.max_turns"
        );
        // Not written at all (a default the kind checks): as the kind names it.
        assert_eq!(named(json!({}), "options.models"), "options.models");
        assert_eq!(named(json!({"kind": "x"}), "kind"), "kind");
    }

    #[test]
    fn a_wrong_type_is_named_with_its_type_in_words() {
        let flat = refused(json!({"prompt": "hi", "max_turns": "x"}));
        assert_eq!(
            (flat.field.as_str(), flat.message.as_str()),
            (
                "options.max_turns",
                "invalid type: string \"x\", expected a whole number from 0 to 4294967295"
            )
        );
        let nested = refused(json!({"options": {"max_turns": -1}}));
        assert_eq!(nested.field, "options.max_turns");
        assert!(
            nested
                .message
                .ends_with("expected a whole number from 0 to 4294967295")
        );
    }

    #[test]
    fn a_map_s_keys_are_all_options() {
        let Value::Object(body) = json!({"anything": 1}) else {
            unreachable!()
        };
        let options: Map<String, Value> = from_body(&body, &[]).unwrap();
        assert_eq!(options["anything"], 1);
    }
}
