//! Conclave events as AG-UI events: one session event becomes none, one or
//! a few AG-UI events, and the run's end (a `result`, an `error`, a call
//! waiting for approval) ends the AG-UI run. The turn logic is the
//! session's own; this only translates.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::reasoning::OpenReasoning;
use crate::protocol::{Event, EventKind, Message, ResultStatus};

/// The translation of one run: which text messages are open (one per
/// deliberation agent, `None` for the session's own), and the state a
/// deliberation or pipeline shows.
pub struct Mapper {
    thread_id: String,
    run_id: String,
    open_text: HashMap<Option<String>, String>,
    reasoning: OpenReasoning,
    state: Value,
    /// Calls of this run with no result yet: at a successful end, the
    /// front-end's to answer.
    pending: Vec<String>,
}

/// What one session event came to: the AG-UI events, and whether the run
/// is over.
pub struct Mapped {
    pub events: Vec<Value>,
    pub done: bool,
}

impl Mapper {
    pub fn new(thread_id: String, run_id: String) -> Mapper {
        Mapper {
            thread_id,
            run_id,
            open_text: HashMap::new(),
            reasoning: OpenReasoning::default(),
            state: Value::Object(Map::new()),
            pending: Vec::new(),
        }
    }

    pub fn run_started(&self) -> Value {
        json!({"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id,
            "timestamp": now_ms()})
    }

    /// The end of a run that started no turn (a reconnect).
    pub fn run_finished(&self) -> Value {
        json!({"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id,
            "outcome": {"type": "success"}, "timestamp": now_ms()})
    }

    /// A run that could not start or go on: `RUN_ERROR` ends it.
    pub fn run_error(&self, message: &str, code: &str) -> Value {
        json!({"type": "RUN_ERROR", "message": message, "code": code, "timestamp": now_ms()})
    }

    /// The state a deliberation or pipeline run starts from.
    pub fn state_snapshot(&mut self, kind: &str) -> Value {
        self.state = json!({"kind": kind, "status": "running"});
        json!({"type": "STATE_SNAPSHOT", "snapshot": self.state, "timestamp": now_ms()})
    }

    pub fn map(&mut self, event: &Event) -> Mapped {
        let ts = event.ts.timestamp_millis();
        let agent = event.agent_id.clone();
        let mut out = Vec::new();
        let mut done = false;
        match &event.kind {
            EventKind::TextDelta {
                content,
                reasoning: true,
            } => self.reasoning.delta(event, content, &mut out),
            EventKind::Thinking {
                content,
                reasoning: true,
            } => self.reasoning.whole(event, content, &mut out),
            EventKind::TextDelta { content, .. } => {
                let id = match self.open_text.get(&agent) {
                    Some(id) => id.clone(),
                    None => {
                        let id = format!("{}-{}", event.session_id, event.seq);
                        out.push(text_start(&id, agent.as_deref(), ts));
                        self.open_text.insert(agent.clone(), id.clone());
                        id
                    }
                };
                out.push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id,
                    "delta": content, "timestamp": ts}));
            }
            // A complete piece of text: it closes the message its deltas
            // streamed, or is a whole message when none streamed.
            EventKind::Thinking { content, .. } => match self.open_text.remove(&agent) {
                Some(id) => out.push(text_end(&id, ts)),
                None if content.is_empty() => {}
                None => {
                    let id = format!("{}-{}", event.session_id, event.seq);
                    out.push(text_start(&id, agent.as_deref(), ts));
                    out.push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id,
                        "delta": content, "timestamp": ts}));
                    out.push(text_end(&id, ts));
                }
            },
            EventKind::ToolUse { id, tool, input } => {
                self.close_text(&agent, ts, &mut out);
                if agent.is_none() {
                    self.pending.push(id.clone());
                }
                out.push(json!({"type": "TOOL_CALL_START", "toolCallId": id,
                    "toolCallName": tool, "timestamp": ts}));
                out.push(json!({"type": "TOOL_CALL_ARGS", "toolCallId": id,
                    "delta": input.to_string(), "timestamp": ts}));
                out.push(json!({"type": "TOOL_CALL_END", "toolCallId": id, "timestamp": ts}));
            }
            EventKind::ToolResult { id, output, .. } => {
                self.pending.retain(|p| p != id);
                out.push(
                    json!({"type": "TOOL_CALL_RESULT", "messageId": format!("{id}-result"),
                    "toolCallId": id, "content": text_of(output), "role": "tool",
                    "timestamp": ts}),
                );
            }
            // The run pauses: the next run's `resume` carries the decision.
            EventKind::ApprovalRequested {
                call_id,
                tool,
                input,
                reason,
                expires_at,
            } => {
                self.close_all(ts, &mut out);
                let mut interrupt = json!({"id": call_id, "reason": "tool_approval",
                    "message": format!("{tool} {input}: {reason}"), "toolCallId": call_id,
                    "expiresAt": expires_at.to_rfc3339(),
                    "responseSchema": decision_schema()});
                if let (Some(agent), Some(map)) = (&agent, interrupt.as_object_mut()) {
                    map.insert("metadata".into(), json!({"agentId": agent}));
                }
                out.push(json!({"type": "RUN_FINISHED", "threadId": self.thread_id,
                    "runId": self.run_id, "timestamp": ts,
                    "outcome": {"type": "interrupt", "interrupts": [interrupt]}}));
                done = true;
            }
            EventKind::Error { message, code } if agent.is_none() => {
                self.close_all(ts, &mut out);
                out.push(
                    json!({"type": "RUN_ERROR", "message": message, "code": code,
                    "timestamp": ts}),
                );
                done = true;
            }
            EventKind::Result {
                status,
                result,
                usage,
                ..
            } if agent.is_none() => {
                self.close_all(ts, &mut out);
                out.push(self.finished(*status, result.as_deref(), usage, ts));
                done = true;
            }
            other => self.other(event, other, ts, &mut out),
        }
        Mapped { events: out, done }
    }

    /// Steps and state of pipelines and deliberations; anything else goes
    /// out as a `CUSTOM` event named `conclave.TYPE`, the event whole.
    fn other(&mut self, event: &Event, kind: &EventKind, ts: i64, out: &mut Vec<Value>) {
        let ops = match kind {
            EventKind::NodeStarted { node, step, .. } => {
                out.push(json!({"type": "STEP_STARTED", "stepName": node, "timestamp": ts}));
                vec![("/node".into(), json!(node)), ("/step".into(), json!(step))]
            }
            EventKind::NodeCompleted { node, decision, .. } => {
                out.push(json!({"type": "STEP_FINISHED", "stepName": node, "timestamp": ts}));
                vec![(format!("/decisions/{}", escape(node)), json!(decision))]
            }
            EventKind::Route { from, to, .. } => {
                vec![("/route".into(), json!({"from": from, "to": to}))]
            }
            EventKind::PipelineCompleted { status, reason, .. } => {
                let mut ops = vec![("/status".into(), json!(status))];
                if let Some(reason) = reason {
                    ops.push(("/reason".into(), json!(reason)));
                }
                ops
            }
            EventKind::DeliberationStarted {
                role,
                num_agents,
                rounds,
                ..
            } => vec![
                ("/role".into(), json!(role)),
                ("/numAgents".into(), json!(num_agents)),
                ("/rounds".into(), json!(rounds)),
            ],
            EventKind::RoundStarted { round, .. } => vec![("/round".into(), json!(round))],
            EventKind::AgentStarted { role, round, .. } => {
                let path = format!("/agents/{}", agent_key(event, role));
                vec![(path, json!({"round": round, "status": "working"}))]
            }
            EventKind::AgentCompleted {
                role,
                round,
                proposal,
                ..
            } => {
                let path = format!("/agents/{}", agent_key(event, role));
                let proposal = serde_json::to_value(proposal).unwrap_or_default();
                vec![(
                    path,
                    json!({"round": round, "status": "completed", "proposal": proposal}),
                )]
            }
            EventKind::AgentFailed { role, round, .. } => {
                let path = format!("/agents/{}", agent_key(event, role));
                vec![(path, json!({"round": round, "status": "failed"}))]
            }
            EventKind::Decision { decision } => {
                vec![(
                    "/decision".into(),
                    serde_json::to_value(decision).unwrap_or_default(),
                )]
            }
            EventKind::DeliberationCompleted { status, .. } => {
                vec![(
                    "/status".into(),
                    serde_json::to_value(status).unwrap_or_default(),
                )]
            }
            _ => {
                out.push(
                    json!({"type": "CUSTOM", "name": format!("conclave.{}", kind.type_name()),
                    "value": event, "timestamp": ts}),
                );
                Vec::new()
            }
        };
        if !ops.is_empty() {
            out.push(self.delta(ops, ts));
        }
    }

    /// Applies `add` operations to the run's state and answers the
    /// `STATE_DELTA` that says so. The parents of a path are made as
    /// objects first, so that each operation applies to the state the
    /// client holds.
    fn delta(&mut self, ops: Vec<(String, Value)>, ts: i64) -> Value {
        let mut patch = Vec::new();
        for (path, value) in ops {
            let path = path.as_str();
            let parts: Vec<&str> = path.split('/').skip(1).collect();
            let mut at = String::new();
            for part in &parts[..parts.len().saturating_sub(1)] {
                at.push('/');
                at.push_str(part);
                if self.state.pointer(&at).is_none() {
                    set(&mut self.state, &at, json!({}));
                    patch.push(json!({"op": "add", "path": at, "value": {}}));
                }
            }
            set(&mut self.state, path, value.clone());
            patch.push(json!({"op": "add", "path": path, "value": value}));
        }
        json!({"type": "STATE_DELTA", "delta": patch, "timestamp": ts})
    }

    fn finished(
        &self,
        status: ResultStatus,
        result: Option<&str>,
        usage: &crate::protocol::Usage,
        ts: i64,
    ) -> Value {
        let usage = json!([{"inputTokens": usage.input_tokens,
            "outputTokens": usage.output_tokens,
            "totalTokens": usage.input_tokens + usage.output_tokens}]);
        match status {
            ResultStatus::Success => {
                let mut outcome = json!({"type": "success"});
                if !self.pending.is_empty() {
                    outcome["pendingToolCallIds"] = json!(self.pending);
                }
                json!({"type": "RUN_FINISHED", "threadId": self.thread_id,
                "runId": self.run_id, "result": result, "outcome": outcome,
                "usage": usage, "timestamp": ts})
            }
            ResultStatus::Interrupted => json!({"type": "RUN_FINISHED",
                "threadId": self.thread_id, "runId": self.run_id,
                "outcome": {"type": "cancelled"}, "usage": usage, "timestamp": ts}),
            other => json!({"type": "RUN_ERROR", "code": other.as_str(),
                "message": result.unwrap_or("the turn did not finish"), "usage": usage,
                "timestamp": ts}),
        }
    }

    fn close_text(&mut self, agent: &Option<String>, ts: i64, out: &mut Vec<Value>) {
        if let Some(id) = self.open_text.remove(agent) {
            out.push(text_end(&id, ts));
        }
    }

    fn close_all(&mut self, ts: i64, out: &mut Vec<Value>) {
        self.reasoning.close_all(ts, out);
        for (_, id) in self.open_text.drain() {
            out.push(text_end(&id, ts));
        }
    }
}

/// A session's history as AG-UI messages, for `MESSAGES_SNAPSHOT`; the
/// ids are the session's and the message's place in it. A compaction's
/// mark is no message of the conversation, and is left out.
pub fn messages_snapshot(session: &str, history: &[Message]) -> Value {
    let messages: Vec<Value> = history
        .iter()
        .enumerate()
        .filter_map(|(i, message)| {
            let id = format!("{session}-m{i}");
            Some(match message {
                Message::Compacted { .. } => return None,
                Message::Reasoning { text, .. } if text.is_empty() => return None,
                Message::Reasoning { text, .. } => {
                    json!({"id": id, "role": "reasoning", "content": text})
                }
                Message::User { content } => json!({"id": id, "role": "user", "content": content}),
                Message::Assistant {
                    content,
                    tool_calls,
                } => {
                    let mut m = json!({"id": id, "role": "assistant", "content": content});
                    if !tool_calls.is_empty() {
                        m["toolCalls"] = tool_calls
                            .iter()
                            .map(|c| {
                                json!({"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments.to_string()}})
                            })
                            .collect();
                    }
                    m
                }
                Message::Tool {
                    tool_call_id,
                    content,
                    is_error,
                    ..
                } => {
                    let mut m = json!({"id": id, "role": "tool", "toolCallId": tool_call_id,
                        "content": content});
                    if *is_error {
                        m["error"] = json!(content);
                    }
                    m
                }
            })
        })
        .collect();
    json!({"type": "MESSAGES_SNAPSHOT", "messages": messages, "timestamp": now_ms()})
}

/// What a resume entry's `payload` may hold: the decision body of
/// `POST /agent/session/{id}/approvals/{call_id}`.
fn decision_schema() -> Value {
    json!({"type": "object", "properties": {
        "decision": {"enum": ["allow", "deny"]},
        "message": {"type": "string"},
        "input": {"type": "object"},
        "remember": {"enum": ["session"]}
    }, "required": ["decision"]})
}

fn text_start(id: &str, agent: Option<&str>, ts: i64) -> Value {
    let mut start = json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant",
        "timestamp": ts});
    if let Some(agent) = agent {
        start["name"] = json!(agent);
    }
    start
}

fn text_end(id: &str, ts: i64) -> Value {
    json!({"type": "TEXT_MESSAGE_END", "messageId": id, "timestamp": ts})
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A deliberation agent's key in the state: its id (agents share a role).
fn agent_key(event: &Event, role: &str) -> String {
    escape(event.agent_id.as_deref().unwrap_or(role))
}

/// A JSON Pointer token (RFC 6901).
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Sets `pointer` in `root`, whose parent must be an object.
fn set(root: &mut Value, pointer: &str, value: Value) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let key = last.replace("~1", "/").replace("~0", "~");
    if let Some(Value::Object(map)) = root.pointer_mut(parent) {
        map.insert(key, value);
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
