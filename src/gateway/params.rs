//! The OpenAI parameters a pool passes on, drops and injects.

use super::config::PoolConfig;
use super::json::Object;

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

/// Drops and injects parameters as the pool says.
pub(super) fn shape_request(pool: &PoolConfig, body: &mut Object) {
    if pool.drop_params {
        body.retain(|key| OPENAI_PARAMS.contains(&key));
    }
    for key in &pool.additional_drop_params {
        body.remove(key);
    }
    for (key, value) in &pool.inject {
        body.set(key, value);
    }
}
