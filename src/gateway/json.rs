//! [`Object`]: a call's JSON body as the gateway handles it. Its top-level
//! values are kept as the client wrote them (`RawValue`): reading the body
//! builds no tree of its nested values (a conversation's messages, its
//! tools), and writing it for a replica copies each value's text. Only the
//! keys the gateway reads (`model`, `stream`, the prompt for
//! `prefix_cache`) are parsed, when they are read.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Map, Value};

#[derive(Debug, Default)]
pub struct Object(BTreeMap<String, Box<RawValue>>);

impl Object {
    /// `bytes` as a JSON object; the error says whether the text is not
    /// JSON or not an object ([`serde_json::Error::classify`]).
    pub fn parse(bytes: &[u8]) -> Result<Object, serde_json::Error> {
        serde_json::from_slice(bytes).map(Object)
    }

    pub fn from_map(map: Map<String, Value>) -> Object {
        Object(
            map.into_iter()
                .filter_map(|(key, value)| Some((key, to_raw_value(&value).ok()?)))
                .collect(),
        )
    }

    /// The value of `key` read as a `T`; `None` when it is missing or not
    /// a `T`.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        serde_json::from_str(self.0.get(key)?.get()).ok()
    }

    /// Sets `key` to `value` written as JSON.
    pub fn set<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) {
        if let Ok(raw) = to_raw_value(value) {
            self.0.insert(key.to_string(), raw);
        }
    }

    pub fn remove(&mut self, key: &str) {
        self.0.remove(key);
    }

    /// Keeps the keys `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.0.retain(|key, _| keep(key));
    }

    /// The object as JSON text.
    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(&self.0).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Values come back as written (nested ones untouched, numbers not
    /// rewritten), set and removed keys as set.
    #[test]
    fn an_object_is_written_back_with_its_values_as_they_came() {
        let text = br#"{"model": "a", "messages": [{"role": "user", "content": "x\u00e9"}], "temperature": 1.50, "drop": 1}"#;
        let mut object = Object::parse(text).unwrap();
        assert_eq!(object.get::<String>("model").as_deref(), Some("a"));
        assert_eq!(object.get::<bool>("model"), None);
        assert_eq!(object.get::<bool>("stream"), None);
        object.set("model", "b\"c");
        object.set("logprobs", &json!(true));
        object.remove("drop");
        let written = object.to_bytes();
        assert_eq!(
            std::str::from_utf8(&written).unwrap(),
            r#"{"logprobs":true,"messages":[{"role": "user", "content": "x\u00e9"}],"model":"b\"c","temperature":1.50}"#
        );
    }

    /// Text that is not JSON and JSON that is not an object are told apart.
    #[test]
    fn errors_say_whether_the_text_is_json() {
        use serde_json::error::Category;
        assert_eq!(
            Object::parse(b"{\"a\": ").unwrap_err().classify(),
            Category::Eof
        );
        assert_eq!(
            Object::parse(b"{a}").unwrap_err().classify(),
            Category::Syntax
        );
        assert_eq!(
            Object::parse(b"[1]").unwrap_err().classify(),
            Category::Data
        );
        assert_eq!(
            Object::from_map(json!({"k": [1, 2]}).as_object().unwrap().clone()).get::<Vec<u8>>("k"),
            Some(vec![1, 2])
        );
    }
}
