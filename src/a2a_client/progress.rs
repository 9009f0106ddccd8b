//! What one call to a remote agent has heard so far: the task, its state
//! and status message, the artifacts' text; turned into live output as it
//! comes and into the tool's result at the end.

use serde_json::Value;

use super::wire::{self, Artifact, Message, StreamResponse, Task, TaskState, TaskStatus};
use crate::agent::{ToolChunk, ToolOutput};

/// The most artifact text one call keeps (and shows as it comes): the
/// turn truncates a tool's result further, and a remote that streams
/// without end must not fill the server's memory.
const MAX_TEXT: usize = 1024 * 1024;

/// The live output streams: artifact text as `stdout`, state changes and
/// status messages as `info`.
const TEXT_STREAM: &str = "stdout";
const NOTE_STREAM: &str = "info";

#[derive(Debug, Default)]
pub struct Progress {
    pub task_id: Option<String>,
    pub context_id: Option<String>,
    pub state: TaskState,
    /// The text of the latest status message.
    status: String,
    /// Artifacts by id, in the order they first came.
    artifacts: Vec<(String, String)>,
    /// A direct answer: the agent replied with a message, not a task.
    reply: Option<String>,
    /// Text dropped past [`MAX_TEXT`].
    dropped: usize,
    /// Bytes shown as live output so far: a remote that resends its
    /// artifacts or its status without end is shown [`MAX_TEXT`] in all.
    shown: usize,
}

impl Progress {
    /// Whether the call is over: the agent replied, or the task settled.
    pub fn finished(&self) -> bool {
        self.reply.is_some() || self.state.settled()
    }

    /// Takes one answer or event, pushing what it shows to `out`.
    pub fn apply(&mut self, event: StreamResponse, out: &mut Vec<ToolChunk>) {
        if let Some(task) = event.task {
            self.task(task, out);
        } else if let Some(message) = event.message {
            self.ids(&message.task_id, &message.context_id);
            self.reply = Some(self.capped(wire::text_of(&message.parts)));
        } else if let Some(update) = event.status_update {
            self.ids(&update.task_id, &update.context_id);
            self.status(update.status, out);
        } else if let Some(update) = event.artifact_update {
            self.ids(&update.task_id, &update.context_id);
            self.artifact(update.artifact, update.append, out);
        }
    }

    fn ids(&mut self, task_id: &str, context_id: &str) {
        if !task_id.is_empty() {
            self.task_id = Some(task_id.to_string());
        }
        if !context_id.is_empty() {
            self.context_id = Some(context_id.to_string());
        }
    }

    /// A whole task: its artifacts replace what was gathered (a task is a
    /// snapshot), without showing them again.
    fn task(&mut self, task: Task, out: &mut Vec<ToolChunk>) {
        self.ids(&task.id, &task.context_id);
        if !task.artifacts.is_empty() {
            self.artifacts.clear();
            for artifact in task.artifacts {
                let text = self.capped(wire::text_of(&artifact.parts));
                self.artifacts.push((artifact.artifact_id, text));
            }
        }
        self.status(task.status, out);
    }

    fn status(&mut self, status: TaskStatus, out: &mut Vec<ToolChunk>) {
        let text = status
            .message
            .as_ref()
            .map(|m: &Message| wire::text_of(&m.parts))
            .unwrap_or_default();
        let changed = status.state != self.state;
        self.state = status.state;
        if text.is_empty() && !changed {
            return;
        }
        let line = if text.is_empty() {
            format!("[{}]\n", status.state.label())
        } else {
            format!("[{}] {text}\n", status.state.label())
        };
        self.show(NOTE_STREAM, line, out);
        self.status = text;
    }

    /// Sends `content` as live output while the call has shown less than
    /// [`MAX_TEXT`]; past it, one note says the rest is not shown (the
    /// result still has the artifacts, within their own bound).
    fn show(&mut self, stream: &str, mut content: String, out: &mut Vec<ToolChunk>) {
        let room = MAX_TEXT.saturating_sub(self.shown);
        if room == 0 {
            return;
        }
        if content.len() > room {
            let mut cut = room;
            while !content.is_char_boundary(cut) {
                cut -= 1;
            }
            content.truncate(cut);
            content.push_str(&format!(
                "\n[the agent's live output past {MAX_TEXT} bytes is not shown]\n"
            ));
            self.shown = MAX_TEXT;
        } else {
            self.shown += content.len();
        }
        out.push(ToolChunk {
            stream: stream.into(),
            content,
        });
    }

    fn artifact(&mut self, artifact: Artifact, append: bool, out: &mut Vec<ToolChunk>) {
        let text = self.capped(wire::text_of(&artifact.parts));
        match self
            .artifacts
            .iter_mut()
            .find(|(id, _)| *id == artifact.artifact_id)
        {
            Some((_, kept)) if append => kept.push_str(&text),
            Some((_, kept)) => *kept = text.clone(),
            None => self.artifacts.push((artifact.artifact_id, text.clone())),
        }
        if !text.is_empty() {
            self.show(TEXT_STREAM, text, out);
        }
    }

    /// `text`, cut where the call's artifacts would pass [`MAX_TEXT`].
    fn capped(&mut self, mut text: String) -> String {
        let kept: usize = self.artifacts.iter().map(|(_, t)| t.len()).sum();
        let room = MAX_TEXT.saturating_sub(kept);
        if text.len() > room {
            let mut cut = room;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            self.dropped += text.len() - cut;
            text.truncate(cut);
        }
        text
    }

    fn artifacts_text(&self) -> String {
        let mut text = self
            .artifacts
            .iter()
            .map(|(_, t)| t.as_str())
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("\n\n");
        if self.dropped > 0 {
            text.push_str(&format!(
                "\n[{} bytes of the agent's output not kept]",
                self.dropped
            ));
        }
        text
    }

    /// The tool's result: the artifacts' text when the task completed
    /// (the status message when it has none, a direct reply as it is); an
    /// error naming the state and saying what the agent said otherwise.
    pub fn outcome(&self, agent: &str) -> ToolOutput {
        if let Some(reply) = &self.reply {
            return ToolOutput {
                output: Value::String(reply.clone()),
                is_error: false,
            };
        }
        let artifacts = self.artifacts_text();
        if self.state == TaskState::Completed {
            let text = if artifacts.is_empty() {
                self.status.clone()
            } else {
                artifacts
            };
            return ToolOutput {
                output: Value::String(text),
                is_error: false,
            };
        }
        let said = match self.status.as_str() {
            "" => String::new(),
            status => format!(": {status}"),
        };
        let mut message = match self.state {
            TaskState::InputRequired | TaskState::AuthRequired => format!(
                "the remote agent '{agent}' needs more from you ({}){said}. Call a2a__{agent} again with the answer: it continues the same task.",
                self.state.wire_name()
            ),
            TaskState::Submitted | TaskState::Working | TaskState::Unspecified => format!(
                "the remote agent '{agent}' stopped answering before its task ended ({}){said}",
                self.state.wire_name()
            ),
            state => format!(
                "the remote agent '{agent}' ended its task as {}{said}",
                state.wire_name()
            ),
        };
        if !artifacts.is_empty() {
            message.push_str("\n\n");
            message.push_str(&artifacts);
        }
        ToolOutput::error(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(v: Value) -> StreamResponse {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_stream_shows_status_and_artifact_text_and_returns_the_artifacts() {
        let mut progress = Progress::default();
        let mut out = Vec::new();
        for e in [
            json!({"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_SUBMITTED"}}}),
            json!({"statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING",
                "message": {"parts": [{"text": "thinking"}]}}}}),
            json!({"artifactUpdate": {"taskId": "t", "artifact": {"artifactId": "a", "parts": [{"text": "Hel"}]}}}),
            json!({"artifactUpdate": {"taskId": "t", "artifact": {"artifactId": "a", "parts": [{"text": "lo"}]}, "append": true}}),
            json!({"artifactUpdate": {"taskId": "t", "artifact": {"artifactId": "b", "parts": [{"data": {"n": 1}}]}}}),
        ] {
            progress.apply(event(e), &mut out);
            assert!(!progress.finished());
        }
        progress.apply(
            event(
                json!({"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_COMPLETED"}}}),
            ),
            &mut out,
        );
        assert!(progress.finished());
        let shown: Vec<(&str, &str)> = out
            .iter()
            .map(|c| (c.stream.as_str(), c.content.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("info", "[submitted]\n"),
                ("info", "[working] thinking\n"),
                ("stdout", "Hel"),
                ("stdout", "lo"),
                ("stdout", "\n{\"n\":1}\n"),
                ("info", "[completed]\n"),
            ]
        );
        assert_eq!(
            (progress.task_id.as_deref(), progress.context_id.as_deref()),
            (Some("t"), Some("c"))
        );
        assert_eq!(
            progress.outcome("x"),
            ToolOutput {
                output: json!("Hello\n\n\n{\"n\":1}\n"),
                is_error: false
            }
        );
    }

    #[test]
    fn a_task_that_waits_or_fails_is_an_error_naming_its_state() {
        let mut progress = Progress::default();
        let mut out = Vec::new();
        progress.apply(
            event(json!({"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED",
                "message": {"parts": [{"text": "Which city?"}]}}}})),
            &mut out,
        );
        assert!(progress.finished());
        let outcome = progress.outcome("weather");
        assert!(outcome.is_error);
        assert_eq!(
            outcome.output,
            json!(
                "the remote agent 'weather' needs more from you (TASK_STATE_INPUT_REQUIRED): Which city?. Call a2a__weather again with the answer: it continues the same task."
            )
        );
        progress.apply(
            event(json!({"statusUpdate": {"status": {"state": "TASK_STATE_REJECTED"}}})),
            &mut out,
        );
        assert_eq!(
            progress.outcome("weather").output,
            json!("the remote agent 'weather' ended its task as TASK_STATE_REJECTED")
        );
    }

    #[test]
    fn a_direct_reply_is_the_result() {
        let mut progress = Progress::default();
        progress.apply(
            event(json!({"message": {"contextId": "c", "parts": [{"text": "hi"}]}})),
            &mut Vec::new(),
        );
        assert!(progress.finished());
        assert_eq!(progress.context_id.as_deref(), Some("c"));
        assert_eq!(progress.outcome("x").output, json!("hi"));
    }

    #[test]
    fn artifact_text_past_the_cap_is_dropped_and_counted() {
        let mut progress = Progress::default();
        let mut out = Vec::new();
        let big = "x".repeat(MAX_TEXT - 2);
        for text in [big.as_str(), "ééé"] {
            progress.apply(
                event(json!({"artifactUpdate": {"artifact": {"artifactId": "a", "parts": [{"text": text}]}, "append": true}})),
                &mut out,
            );
        }
        progress.apply(
            event(json!({"statusUpdate": {"status": {"state": "TASK_STATE_COMPLETED"}}})),
            &mut out,
        );
        let text = progress.outcome("x").output.as_str().unwrap().to_string();
        assert!(
            text.ends_with("xxé\n[4 bytes of the agent's output not kept]"),
            "{}",
            &text[text.len() - 60..]
        );
    }

    #[test]
    fn a_remote_resending_its_output_is_shown_to_the_bound() {
        let mut progress = Progress::default();
        let mut out = Vec::new();
        let chunk = "y".repeat(100 * 1024);
        for _ in 0..100 {
            progress.apply(
                event(json!({"artifactUpdate": {"artifact": {"artifactId": "a", "parts": [{"text": chunk}]}, "append": false}})),
                &mut out,
            );
            progress.apply(
                event(
                    json!({"statusUpdate": {"status": {"state": "TASK_STATE_WORKING",
                    "message": {"parts": [{"text": chunk}]}}}}),
                ),
                &mut out,
            );
        }
        let shown: usize = out.iter().map(|c| c.content.len()).sum();
        assert!(shown <= MAX_TEXT + 100, "{shown}");
        assert!(out.last().unwrap().content.contains("is not shown"));
    }
}
