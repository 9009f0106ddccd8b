//! The OpenAI parameters a pool passes on, drops and injects.

use super::Endpoint;
use super::json::Object;
use crate::config::PoolConfig;

/// The parameters of OpenAI's chat and completions APIs: with
/// `drop_params`, anything else is removed before a call.
const OPENAI_PARAMS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "suffix",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "n",
    "stop",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "echo",
    "best_of",
    "user",
    "seed",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "functions",
    "function_call",
    "metadata",
    "store",
    "reasoning_effort",
    "modalities",
    "audio",
    "prediction",
    "service_tier",
];

/// The parameters of OpenAI's Responses API.
const RESPONSES_PARAMS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "top_logprobs",
    "max_output_tokens",
    "max_tool_calls",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "include",
    "metadata",
    "store",
    "background",
    "truncation",
    "user",
    "service_tier",
    "prompt",
    "prompt_cache_key",
    "safety_identifier",
    "conversation",
];

/// The parameters of OpenAI's embeddings API.
const EMBEDDINGS_PARAMS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

/// Drops and injects parameters as the pool says: the injected sampling
/// parameters go only to the endpoints that generate text, and
/// `drop_params` keeps each endpoint's own (tokenize and detokenize,
/// which OpenAI does not define, keep theirs).
pub(super) fn shape_request(endpoint: Endpoint, pool: &PoolConfig, body: &mut Object) {
    if pool.drop_params {
        let known = match endpoint {
            Endpoint::Chat | Endpoint::Completions => OPENAI_PARAMS,
            Endpoint::Responses => RESPONSES_PARAMS,
            Endpoint::Embeddings => EMBEDDINGS_PARAMS,
            Endpoint::Tokenize | Endpoint::Detokenize => &[],
        };
        if !known.is_empty() {
            body.retain(|key| known.contains(&key));
        }
    }
    for key in &pool.additional_drop_params {
        body.remove(key);
    }
    if endpoint.generates() {
        for (key, value) in &pool.inject {
            body.set(key, value);
        }
    }
}
