//! The `run_agent` tool: an IDE hands a task to a sandboxed agent and
//! watches it. One turn runs in a session of the caller (or a new one);
//! its events come as progress notifications, one short line each, and the
//! result is the turn's answer. Cancelling the call interrupts the turn,
//! and with it the commands it runs in the sandbox.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rmcp::RoleServer;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, ErrorData, InputResponses};
use rmcp::service::RequestContext;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::approval::{self, Asker};
use super::follow::{follow_until, http_owner};
use super::host::{Caller, McpHost};
use super::schema::RunAgent;
use crate::protocol::{Event, EventKind, ResultStatus, SessionKind};
use crate::session::{NewSession, Session, SessionError, SessionManager};

/// Characters of an input, an output or a text a progress line shows.
const LINE_CHARS: usize = 200;

/// A refusal the model or the IDE can read (`isError: true`); failures of
/// the server itself stay JSON-RPC errors that say nothing of its insides.
fn refusal(error: SessionError) -> Result<CallToolResult, ErrorData> {
    match error {
        SessionError::Store(_) | SessionError::Internal(_) => {
            tracing::warn!(%error, "run_agent failed");
            Err(ErrorData::internal_error(
                "the session could not be run",
                None,
            ))
        }
        other => Ok(failure(other.to_string())),
    }
}

fn failure(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// The session a call continues, as the caller may see it: another key's
/// is "not found", like one that does not exist.
async fn existing(
    sessions: &SessionManager,
    text: &str,
    owner: Option<&str>,
) -> Result<Arc<Session>, SessionError> {
    let id = Uuid::parse_str(text).map_err(|_| SessionError::NotFound(Uuid::nil()))?;
    let session = sessions.get(id, owner).await?;
    if session.kind != SessionKind::AGENT {
        return Err(SessionError::Option(crate::session::OptionError::new(
            "session_id",
            format!("session {id} is a {} session, not an agent's", session.kind),
        )));
    }
    Ok(session)
}

async fn created(
    sessions: &SessionManager,
    options: Option<Map<String, Value>>,
    owner: Option<String>,
) -> Result<Arc<Session>, SessionError> {
    let mut body = Map::new();
    if let Some(options) = options {
        body.insert("options".into(), Value::Object(options));
    }
    let options = sessions
        .tasks()
        .require(SessionKind::AGENT.as_str(), "kind")?
        .options(&body, &[])
        .await?;
    sessions
        .create(NewSession {
            name: None,
            kind: SessionKind::AGENT,
            owner,
            options,
            ephemeral: false,
            origin: None,
            metadata: Default::default(),
        })
        .await
}

pub async fn run(
    host: &Arc<McpHost>,
    caller: &Caller,
    args: RunAgent,
    retry: Retry,
    ctx: RequestContext<RoleServer>,
) -> Result<CallToolResponse, ErrorData> {
    let Some(sessions) = host.sessions() else {
        return Err(ErrorData::invalid_request(
            "run_agent runs in the server: connect to its /mcp",
            None,
        ));
    };
    let owner = http_owner(caller, &ctx).flatten();
    let lines = AtomicU32::new(0);
    let (session, since) = match retry.state {
        // The client answered the approvals of an `input_required` result:
        // the turn it started goes on.
        Some(state) => {
            let Some((id, since)) = resumed(&state) else {
                return Ok(failure(
                    "requestState is not one this server gave: call run_agent again without it"
                        .into(),
                )
                .into());
            };
            let session = match existing(sessions, &id.to_string(), owner.as_deref()).await {
                Ok(session) => session,
                Err(SessionError::NotFound(_)) => {
                    return Ok(failure(format!("session '{id}' not found")).into());
                }
                Err(e) => return refusal(e).map(Into::into),
            };
            if let Some(live) = &host.live {
                for (call_id, answer) in retry.responses.unwrap_or_default() {
                    let told =
                        approval::decide_answer(&live.decider, &session, &call_id, answer).await;
                    if let Some(line) = told {
                        let token = ctx.meta.get_progress_token();
                        approval::send_line(&ctx.peer, token.as_ref(), &lines, line).await;
                    }
                }
            }
            (session, since)
        }
        None => match started(sessions, args, owner, &ctx).await {
            Ok(turn) => (turn.session, turn.since),
            Err(refused) => return refused.map(Into::into),
        },
    };
    let elicits = approval::elicits(&ctx);
    // Under 2026-07-28 the client cannot be sent a request: a call that
    // waits for approval ends the tool call with an `input_required`
    // result, and the client's retry carries the answer.
    let in_results = elicits && super::scratch::stateless(&ctx);
    let done = CancellationToken::new();
    let followed = async {
        let ended = follow_until(
            &session,
            since,
            &ctx,
            None,
            async {
                session.interrupt();
            },
            |event| {
                let line = progress_line(event, elicits)?;
                let line_number = lines.fetch_add(1, Ordering::Relaxed) + 1;
                Some((f64::from(line_number), line))
            },
            |event| in_results && matches!(event.kind, EventKind::ApprovalRequested { .. }),
        )
        .await;
        done.cancel();
        ended
    };
    // The client is asked from this task, so that its requests go out on
    // this call's stream.
    let asking = async {
        let decider = host.live.as_ref().map(|live| &live.decider);
        if let (true, false, Some(decider)) = (elicits, in_results, decider) {
            let asker = Asker {
                peer: &ctx.peer,
                decider,
                session: &session,
                token: ctx.meta.get_progress_token(),
                lines: &lines,
            };
            asker.run(since, done.clone()).await;
        }
    };
    let (ended, ()) = tokio::join!(followed, asking);
    if let Some(event) = &ended
        && let Some(mut asked) = approval::input_required(event)
    {
        asked.request_state = Some(format!("{STATE_PREFIX}{}:{}", session.id, event.seq));
        return Ok(CallToolResponse::InputRequired(asked));
    }
    Ok(answer(&session, ended.as_deref()).into())
}

/// What a retry of an `input_required` result carries.
#[derive(Default)]
pub struct Retry {
    /// The `requestState` the result gave.
    pub state: Option<String>,
    /// The answers, by the key of each input request (the call's id).
    pub responses: Option<InputResponses>,
}

/// How this server's `requestState` starts: the session and the `seq`
/// of the approval request follow. The client only echoes it, and the
/// session is checked against the caller as any `session_id` is.
const STATE_PREFIX: &str = "conclave-approval:";

fn resumed(state: &str) -> Option<(Uuid, u64)> {
    let (id, seq) = state.strip_prefix(STATE_PREFIX)?.split_once(':')?;
    Some((Uuid::parse_str(id).ok()?, seq.parse().ok()?))
}

/// The session a call runs its turn in, and the turn started.
async fn started(
    sessions: &SessionManager,
    args: RunAgent,
    owner: Option<String>,
    ctx: &RequestContext<RoleServer>,
) -> Result<crate::session::StartedTurn, Result<CallToolResult, ErrorData>> {
    let session = match (&args.session_id, args.options) {
        (Some(_), Some(_)) => {
            return Err(Ok(failure(
                "options are those of a new session: give them without session_id".into(),
            )));
        }
        (Some(text), None) => existing(sessions, text, owner.as_deref()).await,
        (None, options) => {
            let made = created(sessions, options, owner).await;
            if made.is_ok() {
                // The caller's resource list has one more session.
                let _ = ctx.peer.notify_resource_list_changed().await;
            }
            made
        }
    };
    let session = match session {
        Ok(session) => session,
        // Named as the caller wrote it, which may not be a UUID.
        Err(SessionError::NotFound(_)) => {
            let text = args.session_id.unwrap_or_default();
            return Err(Ok(failure(format!("session '{text}' not found"))));
        }
        Err(e) => return Err(refusal(e)),
    };
    sessions
        .start_turn(session, args.prompt, false)
        .await
        .map_err(refusal)
}

/// The turn's answer as the tool's content, with the session, status and
/// usage as its structured content.
fn answer(session: &Session, ended: Option<&Event>) -> CallToolResult {
    let (status, text, usage, duration_ms) = match ended.map(|e| &e.kind) {
        Some(EventKind::Result {
            status,
            result,
            usage,
            duration_ms,
            ..
        }) => (*status, result.clone(), Some(usage), *duration_ms),
        // The session was deleted during the turn.
        _ => (ResultStatus::Interrupted, None, None, 0),
    };
    let text = text.unwrap_or_default();
    let mut result = if status == ResultStatus::Error {
        CallToolResult::error(vec![ContentBlock::text(text.clone())])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text.clone())])
    };
    result.structured_content = Some(json!({
        "session_id": session.id,
        "status": status.as_str(),
        "result": text,
        "usage": usage,
        "session_usage": session.usage(),
        "duration_ms": duration_ms,
    }));
    result
}

/// An event as one short readable line: a tool call and its input, the
/// start of its output, the agent's text; `None` for what says nothing new.
fn progress_line(event: &Event, elicits: bool) -> Option<String> {
    Some(match &event.kind {
        EventKind::ApprovalRequested { .. } | EventKind::ApprovalDecided { .. } => {
            return approval::approval_line(event.session_id, &event.kind, elicits);
        }
        EventKind::ToolUse { tool, input, .. } => {
            format!("{tool} {}", short(&input_text(input)))
        }
        EventKind::ToolOutput {
            stream, content, ..
        } => format!("{stream}: {}", short(content)),
        EventKind::ToolResult {
            tool,
            output,
            is_error,
            ..
        } => {
            let how = if *is_error { "failed" } else { "returned" };
            format!("{tool} {how}: {}", short(&output_text(output)))
        }
        EventKind::Thinking {
            content,
            reasoning: true,
        } => format!("reasoning: {}", short(content)),
        EventKind::Thinking { content, .. } | EventKind::TextDelta { content, .. } => {
            short(content)
        }
        EventKind::Error { message, .. } => format!("error: {}", short(message)),
        _ => return None,
    })
}

/// A tool's input: its code or command when it has one, else its JSON.
fn input_text(input: &Value) -> String {
    ["code", "command", "file_path", "path", "pattern"]
        .iter()
        .find_map(|key| input.get(key).and_then(Value::as_str))
        .map_or_else(|| input.to_string(), str::to_string)
}

/// A tool's output: what it printed when it is an execution's result.
fn output_text(output: &Value) -> String {
    let printed = ["stdout", "stderr"]
        .iter()
        .filter_map(|key| output.get(key).and_then(Value::as_str))
        .collect::<String>();
    match output {
        Value::String(text) => text.clone(),
        _ if !printed.is_empty() => printed,
        other => other.to_string(),
    }
}

/// The first characters of a text on one line.
fn short(text: &str) -> String {
    let line: String = text.trim().replace('\n', " ⏎ ");
    match line.char_indices().nth(LINE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_are_short_and_on_one_line() {
        let event = |kind| Event {
            session_id: Uuid::nil(),
            seq: 1,
            ts: chrono::Utc::now(),
            agent_id: None,
            kind,
        };
        let call = event(EventKind::ToolUse {
            id: "t1".into(),
            tool: "mcp__sandbox__execute_code".into(),
            input: json!({"code": "print(6 * 7)\nprint('done')"}),
        });
        assert_eq!(
            progress_line(&call, false).as_deref(),
            Some("mcp__sandbox__execute_code print(6 * 7) ⏎ print('done')")
        );
        let result = event(EventKind::ToolResult {
            id: "t1".into(),
            tool: "mcp__sandbox__execute_code".into(),
            output: json!({"stdout": "x".repeat(500), "stderr": "", "exit_code": 0}),
            is_error: false,
        });
        let line = progress_line(&result, false).unwrap();
        assert!(line.starts_with("mcp__sandbox__execute_code returned: xxx"));
        assert!(line.ends_with("x…"), "{line}");
        assert_eq!(
            progress_line(
                &event(EventKind::Status {
                    message: "Starting".into()
                }),
                false
            ),
            None
        );
    }
}
