//! The metadata slug of `/meta/{slug}/v1/…`: a version prefix, then
//! base64url (padded or not) of a JSON object. `conclave1:` is this
//! server's prefix; `rllm1:`, the prefix rLLM's clients send, is read
//! the same way.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value};

pub const PREFIX: &str = "conclave1:";
const ACCEPTED: [&str; 2] = [PREFIX, "rllm1:"];

/// Encodes metadata as a slug (what a client puts in the path).
pub fn encode(metadata: &Map<String, Value>) -> String {
    let json = Value::Object(metadata.clone()).to_string();
    format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
}

/// Decodes a slug; the error says what is wrong with it.
pub fn decode(slug: &str) -> Result<Map<String, Value>, String> {
    let data = ACCEPTED
        .iter()
        .find_map(|prefix| slug.strip_prefix(prefix))
        .ok_or_else(|| {
            format!(
                "the metadata slug must start with {} (then base64url JSON)",
                ACCEPTED.join(" or ")
            )
        })?;
    let bytes = URL_SAFE_NO_PAD
        .decode(data.trim_end_matches('='))
        .map_err(|e| format!("the metadata slug is not base64url: {e}"))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("the metadata slug must hold a JSON object".into()),
        Err(e) => Err(format!("the metadata slug is not JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_and_rllm_slugs() {
        let meta = json!({"session_id": "s-1", "step": 3})
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(decode(&encode(&meta)).unwrap(), meta);
        // What rLLM's clients send: rllm1: + base64url with padding.
        let padded = base64::engine::general_purpose::URL_SAFE.encode(r#"{"session_id":"x"}"#);
        assert_eq!(
            decode(&format!("rllm1:{padded}")).unwrap()["session_id"],
            "x"
        );
    }

    #[test]
    fn bad_slugs_say_why() {
        assert!(decode("abc").unwrap_err().contains("must start with"));
        assert!(decode("conclave1:***").unwrap_err().contains("base64url"));
        let not_json = URL_SAFE_NO_PAD.encode("nope");
        assert!(
            decode(&format!("conclave1:{not_json}"))
                .unwrap_err()
                .contains("not JSON")
        );
        let array = URL_SAFE_NO_PAD.encode("[1]");
        assert!(
            decode(&format!("rllm1:{array}"))
                .unwrap_err()
                .contains("object")
        );
    }
}
