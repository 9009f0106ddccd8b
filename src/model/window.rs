//! A model's context window: `models.NAME.context_window`, else what the
//! model's server reports, else the built-in table of the models whose
//! prices are built in, else `agent.context_window` (with a warning that
//! names the setting).
//!
//! What a server reports ([`ReportedWindows`]): vLLM lists each model's
//! `max_model_len` in `GET /v1/models` (other servers `context_length`);
//! llama-server answers its context per slot in `GET /props`
//! (`default_generation_settings.n_ctx`). Read once per model and kept; a
//! server that could not be read is asked again after a minute.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde_json::Value;

use super::ModelError;
use super::http::{endpoint, secret_header};
use crate::sync::lock;
use crate::upstream::{bounded_body, describe};

/// Where a window comes from, as `status` and `result` say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum WindowSource {
    Config,
    Provider,
    Builtin,
    Default,
}

impl WindowSource {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A model's context window, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub tokens: u64,
    pub source: WindowSource,
}

/// A listing or a `/props` is small; a server that is slow to answer
/// should not hold a turn.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
const BODY_LIMIT: usize = 1024 * 1024;
/// How long a server that could not be read is left alone.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(60);

/// The windows an OpenAI-compatible server reports, per model, read once.
pub(crate) struct ReportedWindows {
    /// `{base_url}/models`.
    models_url: String,
    /// `/props` at the base URL without its `/v1` (llama-server's).
    props_url: String,
    client: reqwest::Client,
    known: Mutex<HashMap<String, Option<u64>>>,
    failed_at: Mutex<Option<Instant>>,
}

impl ReportedWindows {
    pub(crate) fn new(base_url: &str, api_key: Option<&str>) -> Result<Self, ModelError> {
        let mut headers = HeaderMap::new();
        if let Some(key) = api_key.filter(|key| !key.is_empty()) {
            headers.insert(AUTHORIZATION, secret_header(&format!("Bearer {key}"))?);
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(ASK_TIMEOUT)
            .build()
            .map_err(|e| ModelError::Upstream(format!("cannot build the HTTP client: {e}")))?;
        let trimmed = base_url.trim_end_matches('/');
        let root = trimmed.strip_suffix("/v1").unwrap_or(trimmed);
        Ok(ReportedWindows {
            models_url: endpoint(base_url, "models")?,
            props_url: endpoint(root, "props")?,
            client,
            known: Mutex::default(),
            failed_at: Mutex::default(),
        })
    }

    /// The window the server reports for `model`; `None` when it reports
    /// none or cannot be read now.
    pub(crate) async fn of(&self, model: &str) -> Option<u64> {
        if let Some(known) = lock(&self.known).get(model) {
            return *known;
        }
        if lock(&self.failed_at).is_some_and(|at| at.elapsed() < ASK_AGAIN_AFTER) {
            return None;
        }
        match self.ask(model).await {
            Ok(window) => {
                lock(&self.known).insert(model.to_owned(), window);
                window
            }
            Err(message) => {
                tracing::debug!(url = %self.models_url, %message, "the model's window cannot be read");
                *lock(&self.failed_at) = Some(Instant::now());
                None
            }
        }
    }

    async fn ask(&self, model: &str) -> Result<Option<u64>, String> {
        let listing = self.get(&self.models_url).await?;
        if let Some(window) = listed_window(&listing, model) {
            return Ok(Some(window));
        }
        // Not every server has `/props`: one that answers it with an
        // error reports no window.
        Ok(self
            .get(&self.props_url)
            .await
            .ok()
            .and_then(|props| props_window(&props)))
    }

    async fn get(&self, url: &str) -> Result<Value, String> {
        let response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("{url}: HTTP {}", status.as_u16()));
        }
        let (bytes, cut) = bounded_body(reqwest::Body::from(response), BODY_LIMIT).await;
        if cut {
            return Err(format!("{url}: over {BODY_LIMIT} bytes"));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("{url}: {e}"))
    }
}

/// The window a `/models` listing gives `model`: vLLM's `max_model_len`,
/// or the `context_length` other servers list.
fn listed_window(listing: &Value, model: &str) -> Option<u64> {
    let entry = listing
        .get("data")?
        .as_array()?
        .iter()
        .find(|entry| entry.get("id").and_then(Value::as_str) == Some(model))?;
    ["max_model_len", "context_length", "max_context_length"]
        .iter()
        .find_map(|key| entry.get(*key).and_then(Value::as_u64))
        .filter(|window| *window > 0)
}

/// llama-server's context per slot, from its `/props`.
fn props_window(props: &Value) -> Option<u64> {
    props
        .pointer("/default_generation_settings/n_ctx")
        .or_else(|| props.get("n_ctx"))
        .and_then(Value::as_u64)
        .filter(|window| *window > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_listing_gives_the_named_models_window() {
        let listing = json!({"data": [
            {"id": "other", "max_model_len": 4096},
            {"id": "qwen", "max_model_len": 32768},
        ]});
        assert_eq!(listed_window(&listing, "qwen"), Some(32768));
        assert_eq!(listed_window(&listing, "missing"), None);
        let openrouter = json!({"data": [{"id": "m", "context_length": 200000}]});
        assert_eq!(listed_window(&openrouter, "m"), Some(200000));
        let plain = json!({"data": [{"id": "gpt-4o"}]});
        assert_eq!(listed_window(&plain, "gpt-4o"), None);
    }

    #[test]
    fn props_give_the_slots_context() {
        let props = json!({"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1});
        assert_eq!(props_window(&props), Some(2048));
        assert_eq!(props_window(&json!({"n_ctx": 0})), None);
        assert_eq!(props_window(&json!({})), None);
    }

    #[test]
    fn props_are_asked_at_the_servers_root() {
        let windows = ReportedWindows::new("http://127.0.0.1:9/v1/", None).unwrap();
        assert_eq!(windows.props_url, "http://127.0.0.1:9/props");
        assert_eq!(windows.models_url, "http://127.0.0.1:9/v1/models");
    }
}
