//! The models an OpenAI-compatible server lists (`GET {base_url}/models`).
//!
//! A server at a base URL other than OpenAI's serves whatever it loaded,
//! under names no one can guess, so when no default model is named the
//! default is the first one it lists. It is asked at start; a server that
//! cannot be read then (still loading its weights, not started yet) is
//! asked again by the first turn that needs the default, and until it
//! answers such a turn ends with an error that says how to name a model.

use std::sync::OnceLock;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde::Deserialize;

use super::ModelError;
use super::http::{endpoint, secret_header};
use crate::config::ProviderConfig;
use crate::upstream::{bounded_body, describe, error_text};

/// A listing is small; a server still loading should not hold a start or a
/// turn for the provider's full read timeout.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// More than any listing of model names needs.
const LIST_LIMIT: usize = 1024 * 1024;
/// How much of an error body the message keeps.
const ERROR_BODY_LIMIT: usize = 300;

/// The default model of one provider, read from its listing once.
pub(crate) struct Listing {
    /// `{base_url}/models`.
    url: String,
    client: reqwest::Client,
    first: OnceLock<String>,
}

#[derive(Deserialize)]
struct Models {
    data: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    id: String,
}

impl Listing {
    pub(crate) fn new(provider: &ProviderConfig) -> Result<Listing, ModelError> {
        let mut headers = HeaderMap::new();
        if let Some(key) = provider.api_key.as_deref().filter(|key| !key.is_empty()) {
            headers.insert(AUTHORIZATION, secret_header(&format!("Bearer {key}"))?);
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(LIST_TIMEOUT.min(Duration::from_secs(provider.timeout_s.max(1))))
            .build()
            .map_err(|e| ModelError::Upstream(format!("cannot build the HTTP client: {e}")))?;
        Ok(Listing {
            url: endpoint(&provider.base_url, "models")?,
            client,
            first: OnceLock::new(),
        })
    }

    /// The default model, when the listing has been read.
    pub(crate) fn known(&self) -> Option<&str> {
        self.first.get().map(String::as_str)
    }

    /// The default model: the first one listed, asking the server when it
    /// has not answered yet.
    pub(crate) async fn first(&self) -> Result<String, ModelError> {
        if let Some(name) = self.first.get() {
            return Ok(name.clone());
        }
        let name = self
            .ask()
            .await
            .map_err(|message| ModelError::NoDefaultModel {
                url: self.url.clone(),
                message,
            })?;
        // Two turns may ask at once; both take the name set first.
        let name = self.first.get_or_init(|| name).clone();
        tracing::info!(url = %self.url, model = %name, "default model: the first one the provider lists");
        Ok(name)
    }

    async fn ask(&self) -> Result<String, String> {
        let response = self
            .client
            .get(&self.url)
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = response.status();
        if !status.is_success() {
            let body = error_text(response, ERROR_BODY_LIMIT).await;
            return Err(format!("HTTP {}: {body}", status.as_u16()));
        }
        let (bytes, cut) = bounded_body(reqwest::Body::from(response), LIST_LIMIT).await;
        if cut {
            return Err(format!("the listing is over {LIST_LIMIT} bytes"));
        }
        let models: Models = serde_json::from_slice(&bytes)
            .map_err(|e| format!("not a model listing ({{\"data\": [{{\"id\": …}}]}}): {e}"))?;
        models
            .data
            .into_iter()
            .map(|entry| entry.id)
            .find(|id| !id.trim().is_empty())
            .ok_or_else(|| "it lists no model".to_string())
    }
}
