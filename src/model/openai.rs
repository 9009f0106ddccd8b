//! OpenAI-compatible chat completions provider (skeleton; being written).

use std::time::Duration;

use async_trait::async_trait;

use super::{ChatRequest, ModelError, ModelProvider, ModelStream};

pub struct OpenAiProvider {
    base_url: String,
}

impl OpenAiProvider {
    pub fn new(
        base_url: &str,
        _api_key: Option<String>,
        _max_retries: u32,
        _timeout: Duration,
    ) -> Result<OpenAiProvider, ModelError> {
        Ok(OpenAiProvider {
            base_url: base_url.to_string(),
        })
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    async fn stream(&self, _request: ChatRequest) -> Result<ModelStream, ModelError> {
        Err(ModelError::Upstream(format!(
            "{}: not built yet",
            self.base_url
        )))
    }
}
