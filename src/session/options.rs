//! Options of every session kind: accepted nested under `options` or flat
//! at the top level of a request, with errors that name the option.

use serde::de::DeserializeOwned;
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
/// given both ways must agree. Errors name the option's path.
pub fn from_body<T: DeserializeOwned>(
    body: &Map<String, Value>,
    reserved: &[&str],
) -> Result<T, OptionError> {
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
        let inner = e.into_inner().to_string();
        // serde names an unknown field in its message; keep the path
        // pointing at the object that held it.
        let field = if path == "." {
            "options".to_string()
        } else {
            format!("options.{path}")
        };
        OptionError::new(field, inner)
    })
}
