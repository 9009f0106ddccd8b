//! Tool arguments brought to the tool's JSON schema where the intent is
//! unambiguous, as small models need: a numeric string for a number
//! (`"timeout": "5"`), `"true"`/`"false"` for a boolean, one value where a
//! list is expected, fields the schema does not know dropped. What cannot
//! be read (a required field missing, `"five"` for a number) is refused
//! with the expected shape, so the model can fix its call.
//!
//! Not lenient (the strict harness), nothing is changed: a call that does
//! not fit its schema is refused with what does not fit (an argument the
//! schema does not know only where it forbids other fields).

use serde_json::{Map, Value};

/// The arguments as the schema wants them, and a note per change.
#[derive(Debug, Clone, PartialEq)]
pub struct Coerced {
    pub arguments: Value,
    pub notes: Vec<String>,
}

/// Brings `arguments` to `schema` (an object schema with `properties`),
/// or only checks them against it when not `lenient`; the error says what
/// is wrong and what was expected.
pub fn coerce(arguments: Value, schema: &Value, lenient: bool) -> Result<Coerced, String> {
    let mut notes = Vec::new();
    let mut object = match arguments {
        Value::Object(object) => object,
        Value::Null => Map::new(),
        other => {
            return Err(format!(
                "the arguments must be an object, not {other}; expected {}",
                shape(schema)
            ));
        }
    };
    let properties = schema["properties"].as_object();
    if let Some(properties) = properties {
        if lenient {
            rename_lone_argument(&mut object, schema, properties, &mut notes);
        }
        let closed = schema["additionalProperties"] == Value::Bool(false);
        let open = !closed && !schema["additionalProperties"].is_null();
        let unknown: Vec<String> = object
            .keys()
            .filter(|k| !properties.contains_key(*k))
            .cloned()
            .collect();
        if !lenient && closed && !unknown.is_empty() {
            return Err(format!(
                "unknown argument(s) {}; expected {}",
                unknown.join(", "),
                shape(schema)
            ));
        }
        if lenient && !open {
            for key in unknown {
                object.remove(&key);
                notes.push(format!("dropped unknown argument '{key}'"));
            }
        }
        // `null` for an optional argument means "not given".
        let required: Vec<String> = required_of(schema).into_iter().map(str::to_owned).collect();
        object.retain(|key, value| {
            !(value.is_null()
                && !required.contains(key)
                && !types_of(&properties.get(key).cloned().unwrap_or_default()).contains(&"null"))
        });
        for (key, value) in object.iter_mut() {
            if let Some(property) = properties.get(key) {
                coerce_value(key, value, property, lenient, &mut notes)
                    .map_err(|e| format!("{e}; expected {}", shape(schema)))?;
            }
        }
    }
    let missing = missing_of(schema, &object);
    if !missing.is_empty() {
        return Err(format!(
            "missing required argument(s) {}; expected {}",
            missing.join(", "),
            shape(schema)
        ));
    }
    Ok(Coerced {
        arguments: Value::Object(object),
        notes,
    })
}

/// The required arguments `object` lacks.
fn missing_of<'a>(schema: &'a Value, object: &Map<String, Value>) -> Vec<&'a str> {
    required_of(schema)
        .into_iter()
        .filter(|r| !object.contains_key(*r))
        .collect()
}

fn required_of(schema: &Value) -> Vec<&str> {
    schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// One required string argument missing and one string argument the
/// schema does not know (`{"command": "2**100"}` for a tool wanting
/// `code`): the model named it differently, and the value moves over.
fn rename_lone_argument(
    object: &mut Map<String, Value>,
    schema: &Value,
    properties: &Map<String, Value>,
    notes: &mut Vec<String>,
) {
    let missing = missing_of(schema, object);
    let unknown: Vec<String> = object
        .iter()
        .filter(|(k, v)| !properties.contains_key(*k) && v.is_string())
        .map(|(k, _)| k.clone())
        .collect();
    if let ([wanted], [given]) = (missing.as_slice(), unknown.as_slice())
        && types_of(&properties[*wanted]).contains(&"string")
        && let Some(value) = object.remove(given)
    {
        notes.push(format!("'{given}' was taken as '{wanted}'"));
        object.insert((*wanted).to_string(), value);
    }
}

/// The JSON types a schema allows (`type` as a string or a list; `anyOf`
/// and `oneOf` branches, as schemars writes `Option<T>`).
fn types_of(schema: &Value) -> Vec<&str> {
    let mut types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    for key in ["anyOf", "oneOf"] {
        for branch in schema[key].as_array().into_iter().flatten() {
            types.extend(types_of(branch));
        }
    }
    types
}

fn coerce_value(
    key: &str,
    value: &mut Value,
    schema: &Value,
    lenient: bool,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let types = types_of(schema);
    let fits = |t: &str| match (t, &*value) {
        ("string", Value::String(_))
        | ("boolean", Value::Bool(_))
        | ("array", Value::Array(_))
        | ("object", Value::Object(_))
        | ("null", Value::Null) => true,
        ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => n.is_i64() || n.is_u64(),
        _ => false,
    };
    if types.is_empty() || types.iter().any(|t| fits(t)) {
        return clamp(key, value, schema, lenient, notes);
    }
    let before = value.to_string();
    let converted = if lenient {
        types.iter().find_map(|t| convert(value, t, schema))
    } else {
        None
    };
    match converted {
        Some(new) => {
            notes.push(format!("'{key}': {before} was read as {new}"));
            *value = new;
            clamp(key, value, schema, lenient, notes)
        }
        None => Err(format!(
            "'{key}' is {before}, which is not {}",
            types.join(" or ")
        )),
    }
}

/// A number outside the schema's `minimum`/`maximum` is brought inside
/// (a timeout of 1000 s where 600 is the most becomes 600), or refused
/// when not `lenient`.
fn clamp(
    key: &str,
    value: &mut Value,
    schema: &Value,
    lenient: bool,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let Some(n) = value.as_f64() else {
        return Ok(());
    };
    let low = schema["minimum"].as_f64();
    let high = schema["maximum"].as_f64();
    let bounded = match (low, high) {
        (Some(low), _) if n < low => low,
        (_, Some(high)) if n > high => high,
        _ => return Ok(()),
    };
    if !lenient {
        return Err(format!(
            "'{key}' is {value}, outside {} to {}",
            low.map_or("-∞".into(), |l| l.to_string()),
            high.map_or("∞".into(), |h| h.to_string())
        ));
    }
    let new = if value.is_f64() {
        serde_json::Number::from_f64(bounded).map_or(Value::Null, Value::Number)
    } else {
        Value::from(bounded as i64)
    };
    notes.push(format!(
        "'{key}': {value} is out of range and was taken as {new}"
    ));
    *value = new;
    Ok(())
}

/// `value` as type `t`, where that reading is unambiguous.
fn convert(value: &Value, t: &str, schema: &Value) -> Option<Value> {
    match (t, value) {
        ("integer", Value::String(s)) => s.trim().parse::<i64>().ok().map(Value::from),
        ("integer", Value::Number(n)) => n
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
            .map(|f| Value::from(f as i64)),
        ("number", Value::String(s)) => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .and_then(|f| serde_json::Number::from_f64(f).map(Value::Number)),
        ("boolean", Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        ("string", Value::Number(_) | Value::Bool(_)) => Some(Value::String(value.to_string())),
        ("array", single) if !single.is_null() => {
            let mut item = single.clone();
            let mut ignored = Vec::new();
            coerce_value("item", &mut item, &schema["items"], true, &mut ignored).ok()?;
            Some(Value::Array(vec![item]))
        }
        _ => None,
    }
}

/// The expected arguments, as `{code: string, timeout?: integer}`.
pub fn shape(schema: &Value) -> String {
    let Some(properties) = schema["properties"].as_object() else {
        return "an object".into();
    };
    let required = required_of(schema);
    let fields: Vec<String> = properties
        .iter()
        .map(|(name, property)| {
            let optional = if required.contains(&name.as_str()) {
                ""
            } else {
                "?"
            };
            let types = types_of(property);
            let types: Vec<&str> = types.into_iter().filter(|t| *t != "null").collect();
            format!(
                "{name}{optional}: {}",
                if types.is_empty() {
                    "any".to_string()
                } else {
                    types.join("|")
                }
            )
        })
        .collect();
    format!("{{{}}}", fields.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn execute_code() -> Value {
        json!({
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "language": {"type": ["string", "null"]},
                "timeout": {"type": ["integer", "null"], "minimum": 1, "maximum": 600},
                "background": {"type": "boolean"},
                "paths": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["code"]
        })
    }

    #[test]
    fn unambiguous_values_are_read_and_noted() {
        let coerced = coerce(
            json!({"code": "1", "timeout": "5", "background": "true", "paths": "a.py", "colour": "red"}),
            &execute_code(),
            true,
        )
        .unwrap();
        assert_eq!(
            coerced.arguments,
            json!({"code": "1", "timeout": 5, "background": true, "paths": ["a.py"]})
        );
        assert_eq!(coerced.notes.len(), 4, "{:?}", coerced.notes);
        assert!(coerced.notes.iter().any(|n| n.contains("'timeout'")));
        assert!(coerced.notes.iter().any(|n| n.contains("'colour'")));
    }

    #[test]
    fn numbers_out_of_range_are_clamped_and_a_lone_argument_renamed() {
        let coerced = coerce(
            json!({"command": "2**100", "timeout": 1000}),
            &execute_code(),
            true,
        )
        .unwrap();
        assert_eq!(coerced.arguments, json!({"code": "2**100", "timeout": 600}));
        assert!(
            coerced
                .notes
                .iter()
                .any(|n| n.contains("'command' was taken as 'code'"))
        );
        let coerced = coerce(json!({"code": "1", "timeout": "0"}), &execute_code(), true).unwrap();
        assert_eq!(coerced.arguments["timeout"], 1);
    }

    #[test]
    fn values_that_fit_are_left_alone() {
        let arguments = json!({"code": "print(1)", "timeout": 5, "language": null});
        let coerced = coerce(arguments.clone(), &execute_code(), true).unwrap();
        assert_eq!(coerced.arguments, arguments);
        assert!(coerced.notes.is_empty());
    }

    #[test]
    fn what_cannot_be_read_is_refused_with_the_shape() {
        let err = coerce(
            json!({"code": "1", "timeout": "five"}),
            &execute_code(),
            true,
        )
        .unwrap_err();
        assert!(err.contains("'timeout' is \"five\""), "{err}");
        assert!(err.contains("code: string"), "{err}");
        assert!(err.contains("timeout?: integer"), "{err}");
        let coerced = coerce(
            json!({"code": "1", "background": null}),
            &execute_code(),
            true,
        )
        .unwrap();
        assert_eq!(coerced.arguments, json!({"code": "1"}), "null is not given");
        let err = coerce(json!({"language": "python"}), &execute_code(), true).unwrap_err();
        assert!(err.contains("missing required argument(s) code"), "{err}");
        let err = coerce(json!("print(1)"), &execute_code(), true).unwrap_err();
        assert!(err.contains("must be an object"), "{err}");
    }

    /// Not lenient, a call that does not fit is refused with what does not
    /// fit, and one that fits passes as it is, unknown fields included
    /// where the schema does not forbid them.
    #[test]
    fn strict_checks_change_nothing() {
        let err = coerce(json!({"code": "1", "timeout": "5"}), &execute_code(), false).unwrap_err();
        assert!(
            err.contains("'timeout' is \"5\", which is not integer"),
            "{err}"
        );
        let err = coerce(
            json!({"code": "1", "timeout": 1000}),
            &execute_code(),
            false,
        )
        .unwrap_err();
        assert!(err.contains("'timeout' is 1000, outside 1 to 600"), "{err}");
        let err = coerce(json!({"command": "2**100"}), &execute_code(), false).unwrap_err();
        assert!(err.contains("missing required argument(s) code"), "{err}");
        let given = json!({"code": "1", "colour": "red", "background": null});
        let checked = coerce(given, &execute_code(), false).unwrap();
        assert_eq!(checked.arguments, json!({"code": "1", "colour": "red"}));
        assert!(checked.notes.is_empty());
        let mut closed = execute_code();
        closed["additionalProperties"] = json!(false);
        let err = coerce(json!({"code": "1", "colour": "red"}), &closed, false).unwrap_err();
        assert!(err.contains("unknown argument(s) colour"), "{err}");
    }
}
