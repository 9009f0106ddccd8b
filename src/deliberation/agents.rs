//! What one agent of a deliberation does in a round: one model call, or,
//! for a tool-using agent, one turn of its own agent session (with its own
//! sandbox) whose events go into the deliberation's log tagged with the
//! agent's id. And the one budget every agent draws on.
//!
//! A model call is a job ([`MODEL_CALL`]): on one server it runs here, among
//! replicas whichever replica takes it from the queue makes it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::prompts::Prompt;
use crate::jobs::{self, Handler, Jobs};
use crate::model::{ChatRequest, Message, ModelRegistry, ResolvedModel};
use crate::protocol::{ResultStatus, Tokens, Usage};
use crate::session::{Session, SessionManager};
use crate::sync::lock;
use crate::telemetry::{otel, spans};

/// The budget of a whole deliberation, in dollars and/or tokens: each call
/// gets a share of what is left, and once it is spent every agent still
/// working stops with `budget_exceeded`.
pub struct Budget {
    usd: Option<f64>,
    tokens: Option<u64>,
    spent: Mutex<Usage>,
    exceeded: CancellationToken,
}

impl Budget {
    pub fn new(usd: Option<f64>, tokens: Option<u64>) -> Budget {
        Budget {
            usd,
            tokens,
            spent: Mutex::new(Usage::default()),
            exceeded: CancellationToken::new(),
        }
    }

    /// Adds what a call spent; past either limit the budget is exceeded.
    pub fn charge(&self, usage: &Usage) {
        let mut spent = lock(&self.spent);
        spent.add(usage);
        let over_usd = self.usd.is_some_and(|limit| spent.cost_usd >= limit);
        let over_tokens = self
            .tokens
            .is_some_and(|limit| spent.input_tokens + spent.output_tokens >= limit);
        if over_usd || over_tokens {
            self.exceeded.cancel();
        }
    }

    pub fn spent(&self) -> Usage {
        lock(&self.spent).clone()
    }

    pub fn is_exceeded(&self) -> bool {
        self.exceeded.is_cancelled()
    }

    /// Fires once the budget is spent.
    pub fn exceeded(&self) -> CancellationToken {
        self.exceeded.clone()
    }

    /// One call's share of the tokens left, over `calls` calls to come.
    pub fn token_share(&self, calls: u64) -> Option<u32> {
        let limit = self.tokens?;
        let spent = self.spent();
        let left = limit.saturating_sub(spent.input_tokens + spent.output_tokens);
        Some(
            u32::try_from(left / calls.max(1))
                .unwrap_or(u32::MAX)
                .max(1),
        )
    }

    /// One call's share of the dollars left, over `calls` calls to come.
    pub fn usd_share(&self, calls: u64) -> Option<f64> {
        let limit = self.usd?;
        let left = (limit - self.spent().cost_usd).max(0.0);
        Some(left / calls.max(1) as f64)
    }
}

/// How an agent works.
#[derive(Clone)]
pub enum Worker {
    /// One model call per round, with the agent's system prompt, made by
    /// whichever replica takes the job.
    Model {
        model: Box<ResolvedModel>,
        system: Prompt,
        jobs: Arc<dyn Jobs>,
    },
    /// A turn of its own agent session per round (tools and a sandbox),
    /// run by whichever replica takes the job.
    Session {
        manager: Arc<SessionManager>,
        session: Arc<Session>,
        jobs: Arc<dyn Jobs>,
    },
}

/// One agent's work in one round.
pub struct AgentWork {
    pub agent_id: String,
    /// Rendered when the call starts, not before.
    pub prompt: Prompt,
    pub temperature: f32,
    pub max_tokens: Option<u32>,
    pub timeout: Duration,
    pub budget: Arc<Budget>,
    /// The server's agent calls at once (all deliberations): a call waits
    /// for a permit within its time limit.
    pub permits: Arc<Semaphore>,
    /// The deliberation's session: its id groups the model calls, and a
    /// tool-using agent's events go into its log.
    pub parent: Arc<Session>,
}

/// What the agent answered.
pub struct AgentAnswer {
    /// The proposal, or why there is none (`timeout`, `budget_exceeded`,
    /// the model's error).
    pub result: Result<String, String>,
    pub usage: Usage,
    pub duration_ms: u64,
}

pub const TIMEOUT: &str = "timeout";
pub const BUDGET_EXCEEDED: &str = "budget_exceeded";

impl Worker {
    /// Runs the call within its time limit and the budget.
    pub async fn answer(&self, call: AgentWork) -> AgentAnswer {
        let span = spans::agent(&call.agent_id, &call.parent.id.to_string());
        let answer = span.within(self.answer_in_span(call)).await;
        if let Err(error) = &answer.result {
            span.fail(error_type(error));
        }
        answer
    }

    async fn answer_in_span(&self, call: AgentWork) -> AgentAnswer {
        let started = Instant::now();
        let mut usage = Usage::default();
        let result = if call.budget.is_exceeded() {
            Err(BUDGET_EXCEEDED.to_owned())
        } else {
            let exceeded = call.budget.exceeded();
            tokio::select! {
                result = tokio::time::timeout(call.timeout, async {
                    let _permit = call.permits.acquire().await;
                    self.work(&call, &mut usage).await
                }) => {
                    result.unwrap_or_else(|_| Err(TIMEOUT.to_owned()))
                }
                _ = exceeded.cancelled() => Err(BUDGET_EXCEEDED.to_owned()),
            }
        };
        AgentAnswer {
            result,
            usage,
            duration_ms: started.elapsed().as_millis() as u64,
        }
    }

    async fn work(&self, call: &AgentWork, usage: &mut Usage) -> Result<String, String> {
        match self {
            Worker::Model {
                model,
                system,
                jobs,
            } => {
                let job = ModelCall {
                    model: model.name.clone(),
                    system: system.render(),
                    prompt: call.prompt.render(),
                    temperature: call.temperature,
                    max_tokens: call.max_tokens,
                    session_id: call.parent.id.to_string(),
                    owner: call.parent.owner.clone(),
                    trace: otel::current_json(),
                };
                let answer: ModelAnswer = jobs::run_json(jobs.as_ref(), MODEL_CALL, &job)
                    .await
                    .map_err(|e| e.to_string())?;
                let tokens = answer.tokens();
                *usage = Usage {
                    cost_usd: model.price.map(|p| p.cost(&tokens)).unwrap_or(0.0),
                    turns: 1,
                    ..Usage::default()
                };
                usage.count(&tokens);
                call.budget.charge(usage);
                let text = answer.text.trim();
                if text.is_empty() {
                    return Err("the model answered nothing".into());
                }
                Ok(text.to_owned())
            }
            Worker::Session {
                manager,
                session,
                jobs,
            } => turn_of(manager, jobs.as_ref(), session, call, usage).await,
        }
    }
}

/// The kind of job of a deliberation agent's model call.
pub const MODEL_CALL: &str = "deliberation.model_call";

/// A model call as a job: everything another replica needs to make it.
#[derive(Debug, Serialize, Deserialize)]
pub struct ModelCall {
    /// The model as the deliberation named it (an alias or upstream name).
    pub model: String,
    pub system: String,
    pub prompt: String,
    pub temperature: f32,
    pub max_tokens: Option<u32>,
    /// The deliberation's session, grouping the call's traces.
    pub session_id: String,
    pub owner: Option<String>,
    /// The agent's trace context, so that the call's span is its child
    /// on whichever replica makes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<serde_json::Map<String, serde_json::Value>>,
}

/// What the model answered and what it counted.
#[derive(Debug, Serialize, Deserialize)]
pub struct ModelAnswer {
    pub text: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl ModelAnswer {
    fn tokens(&self) -> Tokens {
        Tokens {
            input: self.input_tokens,
            output: self.output_tokens,
            cache_read: self.cache_read_tokens,
            cache_write: self.cache_write_tokens,
        }
    }
}

/// Makes the model calls of deliberations, whichever replica runs them.
pub struct ModelCalls {
    pub models: Arc<ModelRegistry>,
    /// Counts each call under the deliberation's key.
    pub usage: Arc<crate::usage::Recorder>,
}

#[async_trait]
impl Handler for ModelCalls {
    async fn run(&self, job: Bytes) -> Result<Bytes, String> {
        let call: ModelCall = jobs::read(&job)?;
        let model = self
            .models
            .resolve(&call.model)
            .map_err(|e| e.to_string())?;
        let request = ChatRequest {
            model: model.upstream_model.clone(),
            system: Some(call.system),
            messages: Arc::new(vec![Message::User {
                content: call.prompt,
            }]),
            temperature: Some(call.temperature),
            max_tokens: call.max_tokens,
            session_id: Some(call.session_id),
            owner: call.owner.clone(),
            ..ChatRequest::default()
        };
        let span = spans::chat(
            model.provider.provider_name(),
            &model.upstream_model,
            request.session_id.as_deref(),
            &call
                .trace
                .as_ref()
                .map_or(spans::Parent::Current, spans::Parent::Json),
        );
        spans::chat_input(&span, request.system.as_deref(), &*request.messages);
        let response = span
            .within(model.provider.complete(request))
            .await
            .map_err(|e| {
                span.fail(e.code());
                e.to_string()
            })?;
        let tokens = response.tokens;
        let spent = crate::store::UsageCounts {
            input_tokens: tokens.input,
            output_tokens: tokens.output,
            cost_usd: model.price.map_or(0.0, |p| p.cost(&tokens)),
            ..Default::default()
        };
        self.usage
            .add(call.owner.as_deref(), &model.name, spent)
            .await;
        spans::usage(&span, tokens.input, tokens.output);
        spans::chat_output(&span, &response.text, &response.tool_calls);
        jobs::answer(&ModelAnswer {
            text: response.text,
            input_tokens: tokens.input,
            output_tokens: tokens.output,
            cache_read_tokens: tokens.cache_read,
            cache_write_tokens: tokens.cache_write,
        })
    }
}

/// One turn of a tool-using agent's session, its events forwarded.
async fn turn_of(
    manager: &SessionManager,
    jobs: &dyn Jobs,
    session: &Arc<Session>,
    call: &AgentWork,
    usage: &mut Usage,
) -> Result<String, String> {
    let done = crate::session::child::run_turn(
        manager,
        jobs,
        session,
        call.prompt.render(),
        crate::session::TurnOptions::default(),
        &call.parent,
        &call.agent_id,
    )
    .await?;
    *usage = done.usage;
    call.budget.charge(usage);
    match (done.status, done.text) {
        (ResultStatus::Success, Some(text)) if !text.trim().is_empty() => {
            Ok(text.trim().to_owned())
        }
        (ResultStatus::Success, _) => Err("the agent answered nothing".into()),
        (status, _) => Err(format!("the agent's turn ended {}", status.as_str())),
    }
}

/// `error.type` of an agent's span: the reason when it is one of ours,
/// else the model's error, said as one class.
fn error_type(error: &str) -> &'static str {
    match error {
        TIMEOUT => TIMEOUT,
        BUDGET_EXCEEDED => BUDGET_EXCEEDED,
        _ => "agent_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_split_and_stops_once_spent() {
        let budget = Budget::new(None, Some(100));
        assert_eq!(budget.token_share(4), Some(25));
        budget.charge(&Usage {
            input_tokens: 30,
            output_tokens: 30,
            ..Usage::default()
        });
        assert!(!budget.is_exceeded());
        assert_eq!(budget.token_share(2), Some(20));
        budget.charge(&Usage {
            output_tokens: 40,
            ..Usage::default()
        });
        assert!(budget.is_exceeded());
        assert_eq!(budget.token_share(2), Some(1));
        let dollars = Budget::new(Some(1.0), None);
        assert_eq!(dollars.usd_share(4), Some(0.25));
        assert_eq!(dollars.token_share(4), None);
    }
}
