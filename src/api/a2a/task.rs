//! A2A tasks: each is one turn of a session (its `contextId`), named by
//! the session and the `seq` the turn started after. What a task is now
//! (its state, status message, artifacts) is folded from the session's
//! events; the one thing kept beside them is the message that started it.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::protocol::{Event, EventKind, ResultStatus};

/// KV namespace of the task records; no API key can name it.
pub const TASKS: &str = "_a2a_tasks";

/// A task id: `{session}-{seq}`.
pub fn task_id(session: Uuid, since: u64) -> String {
    format!("{session}-{since}")
}

/// The session and seq a task id names; `None` for anything else.
pub fn parse_task_id(id: &str) -> Option<(Uuid, u64)> {
    let (session, since) = (id.get(..36)?, id.get(36..)?);
    let since = since.strip_prefix('-')?;
    if since.is_empty() || !since.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((Uuid::parse_str(session).ok()?, since.parse().ok()?))
}

/// The key of a task's record: under its owner, so that a key lists only
/// its own tasks.
pub fn record_key(owner: Option<&str>, session: Uuid, since: u64) -> String {
    format!("{}/{session}/{since:020}", owner_part(owner))
}

pub fn owner_part(owner: Option<&str>) -> &str {
    owner.unwrap_or("local")
}

/// The longest context id a client may choose.
pub const MAX_CONTEXT: usize = 256;

/// The session a client's context id names: the session of that id when
/// it is a UUID, else one derived from the text and the caller's key, so
/// that two keys choosing the same name never share a session.
pub fn context_session(owner: Option<&str>, context: &str) -> Uuid {
    if let Ok(id) = Uuid::parse_str(context) {
        return id;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("a2a-context\n{}\n{context}", owner_part(owner)));
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Uuid::new_v8(bytes)
}

/// What is kept of a task beside the session's events.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The agent the task was sent to.
    pub agent: String,
    /// The message that started it, as the client sent it.
    pub message: Value,
    /// The client's own context id, when it is not the session's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A task state, as A2A names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Submitted,
    Working,
    InputRequired,
    Completed,
    Failed,
    Canceled,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Submitted => "TASK_STATE_SUBMITTED",
            State::Working => "TASK_STATE_WORKING",
            State::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            State::Completed => "TASK_STATE_COMPLETED",
            State::Failed => "TASK_STATE_FAILED",
            State::Canceled => "TASK_STATE_CANCELED",
        }
    }

    pub fn parse(name: &str) -> Option<State> {
        [
            State::Submitted,
            State::Working,
            State::InputRequired,
            State::Completed,
            State::Failed,
            State::Canceled,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, State::Completed | State::Failed | State::Canceled)
    }
}

/// A call that waits for a decision.
#[derive(Debug, Clone)]
struct Waiting {
    tool: String,
    input: Value,
    reason: String,
    expires_at: DateTime<Utc>,
}

/// A task as its events so far make it, and what each new event adds to
/// a stream of it.
pub struct Task {
    pub id: String,
    /// The context id as the client knows it.
    pub context: String,
    pub state: State,
    status_message: Option<Value>,
    pub timestamp: DateTime<Utc>,
    result: Option<String>,
    /// Files written or edited by a successful call: the content when the
    /// last change was a whole `Write`.
    files: BTreeMap<String, Option<String>>,
    /// Write and Edit calls under way: their path and content.
    writing: BTreeMap<String, (String, Option<String>)>,
    waiting: BTreeMap<String, Waiting>,
    texts: usize,
}

impl Task {
    pub fn new(session: Uuid, since: u64, record: &TaskRecord) -> Task {
        let created = record.created_at;
        Task {
            id: task_id(session, since),
            context: record
                .context
                .clone()
                .unwrap_or_else(|| session.to_string()),
            state: State::Submitted,
            status_message: None,
            timestamp: created,
            result: None,
            files: BTreeMap::new(),
            writing: BTreeMap::new(),
            waiting: BTreeMap::new(),
            texts: 0,
        }
    }

    /// The calls that wait for a decision now.
    pub fn waiting(&self) -> BTreeSet<String> {
        self.waiting.keys().cloned().collect()
    }

    /// Takes in one event of the turn; answers the stream responses it
    /// makes (`statusUpdate`, `artifactUpdate`).
    pub fn apply(&mut self, event: &Event) -> Vec<Value> {
        if self.state.is_terminal() {
            return Vec::new();
        }
        self.timestamp = event.ts;
        let was = self.state;
        let mut out = Vec::new();
        match &event.kind {
            // A2A has no place for the model's reasoning.
            EventKind::TextDelta { .. }
            | EventKind::Rewound { .. }
            | EventKind::Thinking {
                reasoning: true, ..
            } => return out,
            EventKind::ToolUse { id, tool, input } => {
                let path = input.get("file_path").and_then(Value::as_str);
                if let (Some(path), "Write" | "Edit") = (path, tool.as_str()) {
                    let content = (tool == "Write")
                        .then(|| input.get("content").and_then(Value::as_str))
                        .flatten()
                        .map(str::to_owned);
                    self.writing.insert(id.clone(), (path.to_owned(), content));
                }
                self.working();
                out.push(self.update(Some(data_message(self, event))));
            }
            EventKind::ToolResult { id, is_error, .. } => {
                if let Some((path, content)) = self.writing.remove(id)
                    && !is_error
                {
                    self.files.insert(path, content);
                }
                self.working();
                out.push(self.update(Some(data_message(self, event))));
            }
            EventKind::ApprovalRequested {
                call_id,
                tool,
                input,
                reason,
                expires_at,
            } => {
                self.waiting.insert(
                    call_id.clone(),
                    Waiting {
                        tool: tool.clone(),
                        input: input.clone(),
                        reason: reason.clone(),
                        expires_at: *expires_at,
                    },
                );
                self.state = State::InputRequired;
                self.status_message = Some(self.input_request());
                out.push(self.update(self.status_message.clone()));
            }
            EventKind::ApprovalDecided { call_id, .. } => {
                self.waiting.remove(call_id);
                self.working();
                out.push(self.update(Some(data_message(self, event))));
            }
            EventKind::Thinking { content, .. } => {
                self.working();
                self.texts += 1;
                let message = self.message(vec![json!({"text": content})]);
                out.push(self.update(Some(message)));
            }
            EventKind::Result { status, result, .. } => {
                self.result = result.clone().filter(|r| !r.is_empty());
                out.extend(self.artifacts().into_iter().map(|artifact| {
                    json!({"artifactUpdate": {"taskId": self.id, "contextId": self.context,
                        "artifact": artifact, "append": false, "lastChunk": true}})
                }));
                self.state = match status {
                    ResultStatus::Success => State::Completed,
                    ResultStatus::Interrupted => State::Canceled,
                    _ => State::Failed,
                };
                self.waiting.clear();
                let text = self
                    .result
                    .clone()
                    .unwrap_or_else(|| format!("the turn ended: {}", <&str>::from(*status)));
                self.status_message = Some(self.message(vec![json!({"text": text})]));
                out.push(self.update(self.status_message.clone()));
            }
            _ => {
                self.working();
                out.push(self.update(Some(data_message(self, event))));
            }
        }
        if was == State::InputRequired && self.state == State::Working {
            self.status_message = None;
        }
        out
    }

    /// Work goes on, unless calls still wait for a decision.
    fn working(&mut self) {
        if self.waiting.is_empty() {
            self.state = State::Working;
        }
    }

    fn update(&self, message: Option<Value>) -> Value {
        json!({"statusUpdate": {"taskId": self.id, "contextId": self.context,
            "status": self.status(message)}})
    }

    fn status(&self, message: Option<Value>) -> Value {
        let mut status = json!({"state": self.state.name(), "timestamp": stamp(self.timestamp)});
        if let Some(message) = message {
            status["message"] = message;
        }
        status
    }

    /// An agent message of this task.
    fn message(&self, parts: Vec<Value>) -> Value {
        json!({
            "messageId": format!("{}-m{}", self.id, self.texts),
            "contextId": self.context,
            "taskId": self.id,
            "role": "ROLE_AGENT",
            "parts": parts,
        })
    }

    /// What the client is asked for while calls wait: a decision per call.
    fn input_request(&self) -> Value {
        let mut parts = vec![json!({"text": format!(
            "{} call(s) wait for a decision. RpcAnswer with a message on this task whose data \
             part is {{\"decision\": \"allow\" | \"deny\", \"callId\"?, \"message\"?}}.",
            self.waiting.len()
        )})];
        parts.extend(self.waiting.iter().map(|(call, w)| {
            json!({"data": {"callId": call, "tool": w.tool, "input": w.input,
                "reason": w.reason, "expiresAt": stamp(w.expires_at)},
                "mediaType": "application/json"})
        }));
        self.message(parts)
    }

    /// The result text, then each file the turn wrote.
    pub fn artifacts(&self) -> Vec<Value> {
        let mut artifacts = Vec::new();
        if let Some(text) = &self.result {
            artifacts.push(json!({"artifactId": "result", "name": "result",
                "parts": [{"text": text}]}));
        }
        for (path, content) in &self.files {
            let part = match content {
                Some(text) => json!({"text": text, "mediaType": "text/plain",
                    "filename": path.rsplit('/').next().unwrap_or(path)}),
                None => json!({"data": {"path": path, "edited": true},
                    "mediaType": "application/json"}),
            };
            artifacts.push(json!({"artifactId": format!("file:{path}"), "name": path,
                "description": "a file the agent wrote in its workspace", "parts": [part]}));
        }
        artifacts
    }

    /// The task as `GetTask` answers it.
    pub fn to_json(&self, record: &TaskRecord, history_length: Option<usize>) -> Value {
        let mut history = vec![record.message.clone()];
        if let (true, Some(text)) = (self.state.is_terminal(), &self.result) {
            history.push(self.message(vec![json!({"text": text})]));
        }
        if let Some(keep) = history_length {
            history.drain(..history.len().saturating_sub(keep));
        }
        json!({
            "id": self.id,
            "contextId": self.context,
            "status": self.status(self.status_message.clone()),
            "artifacts": self.artifacts(),
            "history": history,
            "metadata": {"agent": record.agent},
        })
    }
}

/// A status message carrying the Conclave event as a data part, for the
/// clients that show the agent's progress (tool calls, pipeline nodes).
fn data_message(task: &Task, event: &Event) -> Value {
    let mut data = serde_json::to_value(&event.kind).unwrap_or(Value::Null);
    if let Some(agent) = &event.agent_id {
        data["agent_id"] = json!(agent);
    }
    task.message(vec![json!({"data": data, "mediaType": "application/json"})])
}

/// A protobuf JSON timestamp.
pub fn stamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Usage;

    fn event(seq: u64, kind: EventKind) -> Event {
        Event::at(seq, kind)
    }

    #[test]
    fn task_ids_round_trip_and_others_are_none() {
        let session = Uuid::new_v4();
        for since in [0, 7, 123_456] {
            assert_eq!(
                parse_task_id(&task_id(session, since)),
                Some((session, since))
            );
        }
        for bad in [
            "",
            "x",
            &session.to_string(),
            &format!("{session}-"),
            &format!("{session}-1a"),
            &format!("{session}7"),
        ] {
            assert_eq!(parse_task_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_turn_folds_into_states_files_and_a_result() {
        let record = TaskRecord {
            agent: "agent".into(),
            message: json!({}),
            context: None,
            created_at: Utc::now(),
        };
        let mut task = Task::new(Uuid::nil(), 3, &record);
        assert_eq!(task.state, State::Submitted);
        let write = json!({"file_path": "/workspace/a.txt", "content": "hi"});
        task.apply(&event(
            4,
            EventKind::ToolUse {
                id: "c1".into(),
                tool: "Write".into(),
                input: write,
            },
        ));
        assert_eq!(task.state, State::Working);
        let asked = task.apply(&event(
            5,
            EventKind::ApprovalRequested {
                call_id: "c2".into(),
                tool: "Bash".into(),
                input: json!({"command": "ls"}),
                reason: "ask".into(),
                expires_at: Utc::now(),
            },
        ));
        assert_eq!(task.state, State::InputRequired);
        assert_eq!(
            asked[0]["statusUpdate"]["status"]["state"],
            "TASK_STATE_INPUT_REQUIRED"
        );
        assert_eq!(task.waiting(), BTreeSet::from(["c2".to_owned()]));
        task.apply(&event(
            6,
            EventKind::ToolResult {
                id: "c1".into(),
                tool: "Write".into(),
                output: json!("ok"),
                is_error: false,
            },
        ));
        task.apply(&event(
            7,
            EventKind::ApprovalDecided {
                call_id: "c2".into(),
                decision: crate::protocol::Approval::Allow,
                by: "user".into(),
                message: None,
                input: None,
                remembered: None,
            },
        ));
        assert_eq!(task.state, State::Working);
        let end = task.apply(&event(
            8,
            EventKind::Result {
                status: ResultStatus::Success,
                result: Some("done".into()),
                cost_usd: 0.0,
                cost_known: true,
                turns: 1,
                usage: Usage::default(),
                duration_ms: 1,
                history_len: None,
                files_changed: None,
                context: None,
            },
        ));
        assert_eq!(task.state, State::Completed);
        let artifacts: Vec<&Value> = end.iter().filter_map(|e| e.get("artifactUpdate")).collect();
        assert_eq!(artifacts[0]["artifact"]["parts"][0]["text"], "done");
        assert_eq!(artifacts[1]["artifact"]["name"], "/workspace/a.txt");
        assert_eq!(artifacts[1]["artifact"]["parts"][0]["text"], "hi");
        assert_eq!(
            end.last().unwrap()["statusUpdate"]["status"]["state"],
            "TASK_STATE_COMPLETED"
        );
        // Nothing changes a finished task.
        assert!(
            task.apply(&event(
                9,
                EventKind::Status {
                    message: "x".into()
                }
            ))
            .is_empty()
        );
    }
}
