//! Deliberations over gRPC (`proto/orchestrator.proto`: `Deliberate`
//! submits one, `GetDeliberationResult` polls it), served on the HTTP listener
//! under `/conclave.orchestrator.v1.Orchestrator/`. A request becomes the
//! JSON body of `POST /deliberations`, so both check the same way.

use serde_json::{Map, Value, json};
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::api::http::auth::Caller;
use crate::api::http::state::AppState;
use crate::protocol::deliberation::{DeliberationResult, DeliberationStatus};

/// The code generated from `proto/orchestrator.proto`.
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]
pub mod proto {
    tonic::include_proto!("conclave.orchestrator.v1");
}

use proto::orchestrator_server::{Orchestrator, OrchestratorServer};

pub fn service(state: AppState) -> OrchestratorServer<GrpcOrchestrator> {
    OrchestratorServer::new(GrpcOrchestrator { state })
}

pub struct GrpcOrchestrator {
    state: AppState,
}

fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no caller identity"))
}

/// The request as the JSON body `POST /deliberations` takes: proto3's
/// zero values mean "the default".
fn body(request: proto::DeliberateRequest) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("task_description".into(), json!(request.task_description));
    let mut put = |key: &str, value: Value| {
        body.insert(key.to_owned(), value);
    };
    if !request.role.is_empty() {
        put("role", json!(request.role));
    }
    if request.num_agents > 0 {
        put("num_agents", json!(request.num_agents));
    }
    if let Some(c) = request.constraints {
        let mut constraints: Map<String, Value> = c
            .extra
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        if !c.rubric.is_empty() {
            constraints.insert("rubric".into(), json!(c.rubric));
        }
        if !c.requirements.is_empty() {
            constraints.insert("requirements".into(), json!(c.requirements));
        }
        if c.max_iterations > 0 {
            constraints.insert("max_iterations".into(), json!(c.max_iterations));
        }
        put("constraints", Value::Object(constraints));
    }
    put("rounds", json!(request.rounds));
    if !request.aggregate.is_empty() {
        put("aggregate", json!(request.aggregate));
    }
    put("models", json!(request.models));
    if !request.judge_model.is_empty() {
        put("judge_model", json!(request.judge_model));
    }
    put("tools", json!(request.tools));
    if request.timeout_s > 0 {
        put("timeout_s", json!(request.timeout_s));
    }
    if let Some(s) = request.agent_timeout_s {
        put("agent_timeout_s", json!(s));
    }
    if let Some(usd) = request.max_budget_usd {
        put("max_budget_usd", json!(usd));
    }
    if let Some(tokens) = request.max_budget_tokens {
        put("max_budget_tokens", json!(tokens));
    }
    body
}

fn reply(result: DeliberationResult) -> proto::GetDeliberationResultResponse {
    let status = match result.status {
        DeliberationStatus::Pending => proto::DeliberationStatus::Pending,
        DeliberationStatus::Completed => proto::DeliberationStatus::Completed,
        DeliberationStatus::Failed => proto::DeliberationStatus::Failed,
    };
    proto::GetDeliberationResultResponse {
        task_id: result.task_id.to_string(),
        status: status as i32,
        results: result
            .results
            .into_iter()
            .map(|agent| proto::DeliberationResult {
                agent_id: agent.agent_id,
                role: agent.role,
                proposal: agent.proposal.map(|p| proto::Proposal {
                    content: p.content,
                    author_id: p.author_id,
                    author_role: p.author_role,
                }),
                status: agent.status,
                error: agent.error.unwrap_or_default(),
                duration_ms: agent.duration_ms,
                model: agent.model,
            })
            .collect(),
        duration_ms: result.duration_ms.unwrap_or(0),
        total_agents: result.total_agents,
        successful_responses: result.successful_responses,
        decision: result.decision.map(|d| proto::Decision {
            method: d.method.as_str().to_owned(),
            choice: d.choice,
            content: d.content,
            reasoning: d.reasoning,
            votes_json: d.votes.map(|v| v.to_string()).unwrap_or_default(),
        }),
        reason: result.reason.unwrap_or_default(),
        session_id: result.session_id.to_string(),
    }
}

#[tonic::async_trait]
impl Orchestrator for GrpcOrchestrator {
    async fn deliberate(
        &self,
        request: Request<proto::DeliberateRequest>,
    ) -> Result<Response<proto::DeliberateResponse>, Status> {
        let caller = caller(&request)?;
        let pending = self
            .state
            .deliberations
            .submit(caller.owner.clone(), &body(request.into_inner()))
            .await?;
        Ok(Response::new(proto::DeliberateResponse {
            task_id: pending.task_id.to_string(),
            status: "SUBMITTED".into(),
            message: crate::deliberation::submitted_message(pending.total_agents, &pending.role),
            session_id: pending.session_id.to_string(),
        }))
    }

    async fn get_deliberation_result(
        &self,
        request: Request<proto::GetDeliberationResultRequest>,
    ) -> Result<Response<proto::GetDeliberationResultResponse>, Status> {
        let caller = caller(&request)?;
        let id = request.into_inner().task_id;
        let task_id = Uuid::parse_str(&id)
            .map_err(|_| Status::not_found(format!("deliberation {id:?} not found")))?;
        let result = self
            .state
            .deliberations
            .get(caller.owner.as_deref(), task_id)
            .await?;
        Ok(Response::new(reply(result)))
    }
}
