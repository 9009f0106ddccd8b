//! A run's state: named fields, each with the reducer that merges what a
//! node writes into what is there (after LangGraph's annotated reducers:
//! `logs` keeps the last 100, `errors` appends).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How a node's write merges into a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reducer {
    /// The new value replaces the old.
    Replace,
    /// Lists: the new items follow the old.
    Append,
    /// Lists: appended, then only the last `keep` items stay.
    KeepLast,
    /// The new value replaces the old unless it is empty (`null`, `""`,
    /// `[]`, `{}`).
    ReplaceIfNonEmpty,
}

/// A state field as a definition declares it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    pub reducer: Reducer,
    /// For `keep_last`: how many items stay.
    #[serde(default)]
    pub keep: Option<usize>,
    /// The value a run starts with (`[]` for list reducers, else `null`).
    #[serde(default)]
    pub default: Option<Value>,
}

impl FieldSpec {
    /// What a definition gets wrong about the field.
    pub fn check(&self) -> Result<(), String> {
        match (self.reducer, self.keep) {
            (Reducer::KeepLast, None | Some(0)) => {
                Err("keep_last needs `keep`, how many items stay (at least 1)".into())
            }
            (Reducer::KeepLast, Some(_)) | (_, None) => Ok(()),
            (_, Some(_)) => Err("`keep` is only for the keep_last reducer".into()),
        }
    }

    pub fn initial(&self) -> Value {
        match (&self.default, self.reducer) {
            (Some(value), _) => value.clone(),
            (None, Reducer::Append | Reducer::KeepLast) => Value::Array(Vec::new()),
            (None, _) => Value::Null,
        }
    }

    /// Merges `new` into `old` as the reducer says.
    pub fn reduce(&self, old: Value, new: Value) -> Value {
        match self.reducer {
            Reducer::Replace => new,
            Reducer::ReplaceIfNonEmpty => {
                if is_empty(&new) {
                    old
                } else {
                    new
                }
            }
            Reducer::Append | Reducer::KeepLast => {
                let mut items = match old {
                    Value::Array(items) => items,
                    Value::Null => Vec::new(),
                    other => vec![other],
                };
                match new {
                    Value::Array(more) => items.extend(more),
                    Value::Null => {}
                    one => items.push(one),
                }
                if self.reducer == Reducer::KeepLast {
                    let keep = self.keep.unwrap_or(usize::MAX);
                    let excess = items.len().saturating_sub(keep);
                    items.drain(..excess);
                }
                Value::Array(items)
            }
        }
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Applies a node's writes to the state, field by field.
pub fn apply(
    state: &mut Map<String, Value>,
    fields: &std::collections::BTreeMap<String, FieldSpec>,
    writes: Map<String, Value>,
) {
    for (field, new) in writes {
        let Some(spec) = fields.get(&field) else {
            continue;
        };
        let old = state.remove(&field).unwrap_or_else(|| spec.initial());
        state.insert(field, spec.reduce(old, new));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(reducer: Reducer, keep: Option<usize>) -> FieldSpec {
        FieldSpec {
            reducer,
            keep,
            default: None,
        }
    }

    #[test]
    fn each_reducer_merges_as_declared() {
        let replace = field(Reducer::Replace, None);
        assert_eq!(replace.reduce(json!("a"), json!("")), json!(""));
        let non_empty = field(Reducer::ReplaceIfNonEmpty, None);
        assert_eq!(non_empty.reduce(json!("a"), json!("")), json!("a"));
        assert_eq!(non_empty.reduce(json!("a"), json!([])), json!("a"));
        assert_eq!(non_empty.reduce(json!("a"), json!("b")), json!("b"));
        let append = field(Reducer::Append, None);
        assert_eq!(
            append.reduce(json!(["a"]), json!(["b", "c"])),
            json!(["a", "b", "c"])
        );
        assert_eq!(append.reduce(json!(["a"]), json!("b")), json!(["a", "b"]));
        assert_eq!(append.reduce(Value::Null, json!(["b"])), json!(["b"]));
    }

    #[test]
    fn logs_keep_the_last_hundred() {
        let logs = field(Reducer::KeepLast, Some(100));
        let old: Vec<Value> = (0..95).map(|i| json!(i)).collect();
        let new: Vec<Value> = (95..110).map(|i| json!(i)).collect();
        let merged = logs.reduce(Value::Array(old), Value::Array(new));
        let items = merged.as_array().unwrap();
        assert_eq!(items.len(), 100);
        assert_eq!(items[0], json!(10));
        assert_eq!(items[99], json!(109));
    }

    #[test]
    fn fields_start_from_their_defaults_and_unknown_writes_are_dropped() {
        let fields = [
            ("logs".to_owned(), field(Reducer::KeepLast, Some(2))),
            (
                "coverage".to_owned(),
                FieldSpec {
                    reducer: Reducer::Replace,
                    keep: None,
                    default: Some(json!(0.0)),
                },
            ),
        ]
        .into();
        let mut state = Map::new();
        let writes = json!({"logs": ["a", "b", "c"], "other": 1})
            .as_object()
            .unwrap()
            .clone();
        apply(&mut state, &fields, writes);
        assert_eq!(state["logs"], json!(["b", "c"]));
        assert!(!state.contains_key("other"));
        assert_eq!(fields["coverage"].initial(), json!(0.0));
        assert_eq!(fields["logs"].initial(), json!([]));
    }

    #[test]
    fn keep_is_checked() {
        assert!(field(Reducer::KeepLast, None).check().is_err());
        assert!(field(Reducer::Replace, Some(3)).check().is_err());
        assert!(field(Reducer::KeepLast, Some(3)).check().is_ok());
    }
}
