//! Calls of a `run_agent` turn that wait for approval, put to the MCP
//! client. A client that declared the elicitation capability is asked with
//! an `elicitation/create` request (the tool, its input, why it asks); its
//! answer is decided the way `POST …/approvals/{call_id}` decides, so a
//! call decided meanwhile elsewhere (the dashboard, HTTP) is "not pending"
//! and the answer is ignored, and a call decided elsewhere first has its
//! request withdrawn with `notifications/cancelled`. A client without the
//! capability is told in a progress line how to decide over HTTP. Under
//! 2026-07-28, which sends no requests to the client, the same form is an
//! `input_required` result ([`input_required`]) and the retry's answer is
//! decided the same way ([`decide_answer`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};

use chrono::{DateTime, SecondsFormat, Utc};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rmcp::RoleServer;
use rmcp::model::{
    CancelledNotificationParam, ClientResult, ElicitRequest, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationSchema, InputRequest, InputRequiredResult,
    ProgressNotificationParam, ProgressToken, ServerRequest,
};
use rmcp::service::{Peer, PeerRequestOptions, RequestContext};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::agent::decide::{Decider, Refused};
use crate::protocol::{Approval, Event, EventKind};
use crate::session::Session;
use crate::session::approvals::{Decision, Remember};

/// Characters of a call's input an elicitation shows.
const INPUT_CHARS: usize = 2000;

/// Whether the client can be asked with a form (the capability with no
/// mode named means form, as the protocol's first version had it): as the
/// request's `_meta` declares it (2026-07-28), else as the connection's
/// `initialize` did.
pub fn elicits(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.meta
        .client_capabilities()
        .or_else(|| ctx.peer.peer_info().map(|info| info.capabilities.clone()))
        .and_then(|capabilities| capabilities.elicitation)
        .is_some_and(|e| e.form.is_some() || e.url.is_none())
}

/// A call that waits, as its `approval_requested` event tells it.
struct Asked {
    session_id: Uuid,
    call_id: String,
    tool: String,
    input: Value,
    reason: String,
    expires_at: DateTime<Utc>,
}

impl Asked {
    fn of(session_id: Uuid, kind: &EventKind) -> Option<Asked> {
        match kind {
            EventKind::ApprovalRequested {
                call_id,
                tool,
                input,
                reason,
                expires_at,
            } => Some(Asked {
                session_id,
                call_id: call_id.clone(),
                tool: tool.clone(),
                input: input.clone(),
                reason: reason.clone(),
                expires_at: *expires_at,
            }),
            _ => None,
        }
    }
}

/// How to decide a call over HTTP, for a client that cannot be asked.
pub fn http_instructions(session_id: Uuid, call_id: &str, expires_at: &DateTime<Utc>) -> String {
    format!(
        "POST /agent/session/{session_id}/approvals/{call_id} with {{\"decision\":\"allow\"}} or \
         {{\"decision\":\"deny\"}} (the session's API key) before {}, or it is denied",
        expires_at.to_rfc3339_opts(SecondsFormat::Secs, true)
    )
}

/// The progress line of an approval event: what waits and how it is
/// decided, then how it was.
pub fn approval_line(session_id: Uuid, kind: &EventKind, elicits: bool) -> Option<String> {
    Some(match kind {
        EventKind::ApprovalRequested {
            call_id,
            tool,
            reason,
            expires_at,
            ..
        } => {
            let how = if elicits {
                "you are asked".to_string()
            } else {
                http_instructions(session_id, call_id, expires_at)
            };
            format!("call {call_id} ({tool}) waits for approval ({reason}): {how}")
        }
        EventKind::ApprovalDecided {
            call_id,
            decision,
            by,
            message,
            ..
        } => {
            let verdict = match decision {
                Approval::Allow => "allowed",
                Approval::Deny => "denied",
            };
            let told = message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            format!("call {call_id} {verdict} by {by}{told}")
        }
        _ => return None,
    })
}

/// The form a client shows: allow or deny, a message for the model, and
/// whether to allow the tool for the rest of the session.
fn requested_schema() -> Result<ElicitationSchema, serde_json::Error> {
    serde_json::from_value(json!({
        "type": "object",
        "properties": {
            "decision": {
                "type": "string",
                "title": "Decision",
                "description": "allow runs the call; deny refuses it",
                "enum": ["allow", "deny"],
            },
            "message": {
                "type": "string",
                "title": "Message",
                "description": "What the agent reads with the call's result",
            },
            "remember": {
                "type": "boolean",
                "title": "Remember",
                "description": "Allow this tool without asking for the rest of the session",
                "default": false,
            },
        },
        "required": ["decision"],
    }))
}

fn message_of(asked: &Asked) -> String {
    let input = serde_json::to_string_pretty(&asked.input).unwrap_or_default();
    let input = match input.char_indices().nth(INPUT_CHARS) {
        Some((cut, _)) => format!("{}…", &input[..cut]),
        None => input,
    };
    format!(
        "The agent wants to run {} (call {} of session {}).\nInput:\n{input}\nIt asks because: {}.\n\
         Nobody deciding denies it at {}.",
        asked.tool,
        asked.call_id,
        asked.session_id,
        asked.reason,
        asked.expires_at.to_rfc3339_opts(SecondsFormat::Secs, true)
    )
}

/// The form's answer.
#[derive(Deserialize)]
struct FormAnswer {
    decision: Approval,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    remember: bool,
}

/// The decision a client's answer gives: only an accepted form can allow;
/// a declined or cancelled request denies the call.
fn decision_of(result: ElicitResult) -> Result<Decision, String> {
    let answer = match result.action {
        ElicitationAction::Accept => {
            let content = result.content.unwrap_or(Value::Null);
            serde_json::from_value::<FormAnswer>(content).map_err(|e| e.to_string())?
        }
        // Declined, cancelled, or an action of a later protocol.
        _ => FormAnswer {
            decision: Approval::Deny,
            message: Some("declined in the MCP client".into()),
            remember: false,
        },
    };
    let allow = answer.decision == Approval::Allow;
    Ok(Decision {
        decision: answer.decision,
        message: answer.message.filter(|m| !m.trim().is_empty()),
        input: None,
        remember: (allow && answer.remember).then_some(Remember::Session),
        rule: None,
        agent_id: None,
    })
}

/// The `input_required` result (2026-07-28) of an `approval_requested`
/// event: the form, keyed by the call's id; the caller adds the state.
pub fn input_required(event: &Event) -> Option<InputRequiredResult> {
    let asked = Asked::of(event.session_id, &event.kind)?;
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: message_of(&asked),
        requested_schema: requested_schema().ok()?,
    };
    let request = InputRequest::Elicitation(ElicitRequest::new(params));
    Some(InputRequiredResult::from_input_requests(
        [(asked.call_id, request)].into_iter().collect(),
    ))
}

/// Decides `call_id` with the client's answer to its `input_required`
/// form (an `ElicitResult`, as JSON), as an elicitation's answer is
/// decided; the line to tell the client when the answer was not taken.
pub async fn decide_answer(
    decider: &Decider,
    session: &Session,
    call_id: &str,
    answer: Value,
) -> Option<String> {
    let decision = serde_json::from_value::<ElicitResult>(answer)
        .map_err(|e| format!("the answer is not an elicitation's result: {e}"))
        .and_then(|result| {
            decision_of(result).map_err(|e| format!("the answer does not fit the form: {e}"))
        });
    match decision {
        Ok(decision) => decide(decider, session, call_id, decision)
            .await
            .err()
            .map(|not| format!("call {call_id}: {}", not.why())),
        Err(why) => Some(format!("call {call_id}: {why}; it still waits")),
    }
}

/// Why a client's answer was not taken.
#[derive(Clone, Copy)]
enum NotTaken {
    /// The call was decided first (or is no call that waits).
    Late,
    /// The store failed; the call still waits.
    Failed,
}

impl NotTaken {
    fn why(self) -> &'static str {
        match self {
            NotTaken::Late => "your answer came after the call was decided; it was ignored",
            NotTaken::Failed => "your answer could not be applied",
        }
    }
}

/// Decides `call_id` with a client's answer.
async fn decide(
    decider: &Decider,
    session: &Session,
    call_id: &str,
    decision: Decision,
) -> Result<(), NotTaken> {
    match decider.decide(session, call_id, decision, "user").await {
        Ok(()) => Ok(()),
        Err(Refused::NotPending(_)) => Err(NotTaken::Late),
        Err(e) => {
            tracing::warn!(error = %e, call = %call_id,
                "an MCP client's decision could not be applied");
            Err(NotTaken::Failed)
        }
    }
}

/// Sends `line` as the next progress notification of a call whose
/// client gave `token` (nothing without one); `lines` counts the call's.
pub async fn send_line(
    peer: &Peer<RoleServer>,
    token: Option<&ProgressToken>,
    lines: &AtomicU32,
    line: String,
) {
    let Some(token) = token else { return };
    let progress = lines.fetch_add(1, Ordering::Relaxed) + 1;
    let param =
        ProgressNotificationParam::new(token.clone(), f64::from(progress)).with_message(line);
    // A client that went away just misses the note.
    let _ = peer.notify_progress(param).await;
}

/// Where the asking sends what the client should know.
pub struct Asker<'a> {
    pub peer: &'a Peer<RoleServer>,
    pub decider: &'a Decider,
    pub session: &'a Session,
    /// The call's progress token: without one, nothing is sent.
    pub token: Option<ProgressToken>,
    /// The progress lines sent so far (shared with the turn's lines).
    pub lines: &'a AtomicU32,
}

type Asking<'a> = Pin<Box<dyn Future<Output = String> + Send + 'a>>;

impl Asker<'_> {
    /// Asks the client about each call of the turn (from the event after
    /// `since`) that waits, until the turn ends or `done`; requests still
    /// open then are withdrawn.
    pub async fn run(&self, since: u64, done: CancellationToken) {
        let mut events = self.session.subscribe(since, true);
        let mut asking: FuturesUnordered<Asking<'_>> = FuturesUnordered::new();
        let mut open: HashMap<String, CancellationToken> = HashMap::new();
        loop {
            let event = tokio::select! {
                _ = done.cancelled() => break,
                Some(call_id) = asking.next(), if !asking.is_empty() => {
                    open.remove(&call_id);
                    continue;
                }
                event = events.next() => event,
            };
            let Some(event) = event else { break };
            if event.ends_turn() {
                break;
            }
            if let Some(asked) = Asked::of(event.session_id, &event.kind) {
                let withdraw = done.child_token();
                open.insert(asked.call_id.clone(), withdraw.clone());
                asking.push(Box::pin(self.ask(asked, withdraw)));
            } else if let EventKind::ApprovalDecided { call_id, .. } = &event.kind
                && let Some(withdraw) = open.remove(call_id)
            {
                withdraw.cancel();
            }
        }
        for withdraw in open.values() {
            withdraw.cancel();
        }
        while asking.next().await.is_some() {}
    }

    /// Asks about one call and decides it with the answer; returns its id.
    async fn ask(&self, asked: Asked, withdraw: CancellationToken) -> String {
        let outcome = self.answer(&asked, withdraw).await;
        let line = match outcome {
            Ok(None) => None,
            Ok(Some(decision)) => {
                match decide(self.decider, self.session, &asked.call_id, decision).await {
                    Ok(()) => None,
                    Err(not @ NotTaken::Failed) => Some(self.fallback(&asked, not.why())),
                    Err(not) => Some(format!("call {}: {}", asked.call_id, not.why())),
                }
            }
            Err(why) => Some(self.fallback(&asked, &why)),
        };
        if let Some(line) = line {
            self.send(line).await;
        }
        asked.call_id
    }

    /// The client's decision; `None` when the request was withdrawn.
    async fn answer(
        &self,
        asked: &Asked,
        withdraw: CancellationToken,
    ) -> Result<Option<Decision>, String> {
        let schema = requested_schema().map_err(|e| format!("the form: {e}"))?;
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: message_of(asked),
            requested_schema: schema,
        };
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
        // No timeout of its own: the call's wait has one, and its end
        // withdraws the request.
        let handle = self
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .map_err(|e| format!("the request was not sent: {e}"))?;
        let id = handle.id.clone();
        let answered = tokio::select! {
            answered = handle.await_response() => answered,
            _ = withdraw.cancelled() => {
                let param = CancelledNotificationParam::new(
                    Some(id),
                    Some("the call no longer waits for a decision".into()),
                );
                // A client that went away has nothing to withdraw.
                let _ = self.peer.notify_cancelled(param).await;
                return Ok(None);
            }
        };
        match answered {
            Ok(ClientResult::ElicitResult(result)) => decision_of(result)
                .map(Some)
                .map_err(|e| format!("the answer does not fit the form: {e}")),
            Ok(_) => Err("the answer is not an elicitation's".into()),
            Err(e) => Err(format!("the client answered: {e}")),
        }
    }

    fn fallback(&self, asked: &Asked, why: &str) -> String {
        format!(
            "call {} ({}) still waits for approval ({why}): {}",
            asked.call_id,
            asked.tool,
            http_instructions(asked.session_id, &asked.call_id, &asked.expires_at)
        )
    }

    async fn send(&self, line: String) {
        send_line(self.peer, self.token.as_ref(), self.lines, line).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_is_a_valid_elicitation_schema() {
        let schema = serde_json::to_value(requested_schema().unwrap()).unwrap();
        assert_eq!(
            schema["properties"]["decision"]["enum"],
            json!(["allow", "deny"])
        );
        assert_eq!(schema["required"], json!(["decision"]));
        assert_eq!(schema["properties"]["remember"]["type"], "boolean");
    }

    #[test]
    fn answers_become_decisions() {
        let accept = |content| {
            let mut result = ElicitResult::new(ElicitationAction::Accept);
            result.content = Some(content);
            decision_of(result)
        };
        let allowed = accept(json!({"decision": "allow", "message": "", "remember": true}));
        let allowed = allowed.unwrap();
        assert_eq!(allowed.decision, Approval::Allow);
        assert_eq!(allowed.message, None);
        assert_eq!(allowed.remember, Some(Remember::Session));
        // Remembering goes with allow only.
        let denied = accept(json!({"decision": "deny", "message": "no", "remember": true}));
        let denied = denied.unwrap();
        assert_eq!(denied.remember, None);
        assert_eq!(denied.message.as_deref(), Some("no"));
        assert!(accept(json!({"decision": "maybe"})).is_err());
        let declined = decision_of(ElicitResult::new(ElicitationAction::Decline)).unwrap();
        assert_eq!(declined.decision, Approval::Deny);
    }
}
