//! The A2A 1.0 messages the client reads and writes, in their
//! protobuf-JSON form (camelCase fields, enum values by name). Only the
//! fields the client uses are read; unknown ones are ignored, so a newer
//! server's additions do not break it.

use serde::Deserialize;
use serde_json::{Value, json};

/// The part of an agent card the client needs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentCard {
    pub name: String,
    pub description: String,
    pub supported_interfaces: Vec<AgentInterface>,
    pub capabilities: Capabilities,
    pub skills: Vec<AgentSkill>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentInterface {
    pub url: String,
    pub protocol_binding: String,
    pub protocol_version: String,
    pub tenant: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Capabilities {
    pub streaming: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentSkill {
    pub name: String,
    pub description: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum TaskState {
    #[serde(rename = "TASK_STATE_SUBMITTED")]
    Submitted,
    #[serde(rename = "TASK_STATE_WORKING")]
    Working,
    #[serde(rename = "TASK_STATE_COMPLETED")]
    Completed,
    #[serde(rename = "TASK_STATE_FAILED")]
    Failed,
    #[serde(rename = "TASK_STATE_CANCELED")]
    Canceled,
    #[serde(rename = "TASK_STATE_INPUT_REQUIRED")]
    InputRequired,
    #[serde(rename = "TASK_STATE_REJECTED")]
    Rejected,
    #[serde(rename = "TASK_STATE_AUTH_REQUIRED")]
    AuthRequired,
    /// `TASK_STATE_UNSPECIFIED`, or a state of a later version.
    #[default]
    #[serde(other)]
    Unspecified,
}

impl TaskState {
    /// Whether the task stopped: for good, or until the caller answers.
    pub fn settled(self) -> bool {
        !matches!(
            self,
            TaskState::Unspecified | TaskState::Submitted | TaskState::Working
        )
    }

    /// Whether the task waits for the caller: the next message continues it.
    pub fn waits(self) -> bool {
        matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }

    pub fn wire_name(self) -> &'static str {
        match self {
            TaskState::Unspecified => "TASK_STATE_UNSPECIFIED",
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::Rejected => "TASK_STATE_REJECTED",
            TaskState::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
        }
    }

    /// The state as the live output shows it (`input required`).
    pub fn label(self) -> String {
        self.wire_name()
            .trim_start_matches("TASK_STATE_")
            .replace('_', " ")
            .to_lowercase()
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Task {
    pub id: String,
    pub context_id: String,
    pub status: TaskStatus,
    pub artifacts: Vec<Artifact>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TaskStatus {
    pub state: TaskState,
    pub message: Option<Message>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Message {
    pub context_id: String,
    pub task_id: String,
    pub parts: Vec<Part>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Artifact {
    pub artifact_id: String,
    pub parts: Vec<Part>,
}

/// One part: text, structured data, a file by URL or a file inline.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Part {
    pub text: Option<String>,
    pub data: Option<Value>,
    pub url: Option<String>,
    /// Base64, as protobuf-JSON writes bytes.
    pub raw: Option<String>,
    pub media_type: String,
    pub filename: String,
}

impl Part {
    /// The part as the model reads it: text as it is, data as JSON, a
    /// file as a line naming it (its bytes are not the model's to read).
    pub fn render(&self) -> String {
        if let Some(text) = &self.text {
            return text.clone();
        }
        if let Some(data) = &self.data {
            return format!("\n{data}\n");
        }
        let what = [self.filename.as_str(), self.media_type.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(", ");
        match (&self.url, &self.raw) {
            (Some(url), _) => format!("\n[file {what}: {url}]\n"),
            (None, Some(raw)) => format!("\n[file {what}: {} bytes inline]\n", raw.len() / 4 * 3),
            (None, None) => String::new(),
        }
    }
}

/// The text of parts, one after another (chunks of a streamed text are
/// parts of one artifact, so no separator goes between them).
pub fn text_of(parts: &[Part]) -> String {
    parts.iter().map(Part::render).collect()
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StatusUpdate {
    pub task_id: String,
    pub context_id: String,
    pub status: TaskStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ArtifactUpdate {
    pub task_id: String,
    pub context_id: String,
    pub artifact: Artifact,
    pub append: bool,
}

/// One answer of `SendMessage` or one event of `SendStreamingMessage`:
/// exactly one field is set.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StreamResponse {
    pub task: Option<Task>,
    pub message: Option<Message>,
    pub status_update: Option<StatusUpdate>,
    pub artifact_update: Option<ArtifactUpdate>,
}

/// A JSON-RPC 2.0 response.
#[derive(Debug, Deserialize)]
pub struct RpcResponse {
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub error: Option<RpcError>,
}

#[derive(Debug, Deserialize)]
pub struct RpcError {
    #[serde(default)]
    pub code: i64,
    #[serde(default)]
    pub message: String,
}

/// The user's message to the agent, continuing `context_id` (and the task
/// that waits for an answer, `task_id`) when the session has them.
pub fn user_message(text: &str, context_id: Option<&str>, task_id: Option<&str>) -> Value {
    let mut message = json!({
        "messageId": uuid::Uuid::new_v4().to_string(),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    });
    if let Some(context) = context_id {
        message["contextId"] = json!(context);
    }
    if let Some(task) = task_id {
        message["taskId"] = json!(task);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_event_reads_with_unknown_fields_and_states() {
        let event: StreamResponse = serde_json::from_value(json!({
            "statusUpdate": {"taskId": "t", "contextId": "c", "future": 1,
                "status": {"state": "TASK_STATE_WORKING", "timestamp": "2026-01-01T00:00:00Z",
                    "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "hi"}]}}}
        }))
        .unwrap();
        let update = event.status_update.unwrap();
        assert_eq!(update.status.state, TaskState::Working);
        assert_eq!(text_of(&update.status.message.unwrap().parts), "hi");
        let later: TaskStatus =
            serde_json::from_value(json!({"state": "TASK_STATE_SOMETHING_NEW"})).unwrap();
        assert_eq!(later.state, TaskState::Unspecified);
        assert_eq!(TaskState::InputRequired.label(), "input required");
    }

    #[test]
    fn parts_render_as_text_data_and_file_notes() {
        let parts: Vec<Part> = serde_json::from_value(json!([
            {"text": "a"},
            {"data": {"k": 1}},
            {"url": "https://x.example/f.pdf", "filename": "f.pdf", "mediaType": "application/pdf"},
            {"raw": "AAAA", "filename": "b.bin"},
        ]))
        .unwrap();
        assert_eq!(
            text_of(&parts),
            "a\n{\"k\":1}\n\n[file f.pdf, application/pdf: https://x.example/f.pdf]\n\n[file b.bin: 3 bytes inline]\n"
        );
    }

    #[test]
    fn a_follow_up_message_names_its_context_and_task() {
        let message = user_message("more", Some("ctx"), Some("task"));
        assert_eq!(message["role"], "ROLE_USER");
        assert_eq!(message["parts"], json!([{"text": "more"}]));
        assert_eq!(message["contextId"], "ctx");
        assert_eq!(message["taskId"], "task");
        assert!(user_message("first", None, None).get("contextId").is_none());
    }
}
