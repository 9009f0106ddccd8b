//! The model's reasoning as AG-UI's reasoning events: a span
//! (`REASONING_START` … `REASONING_END`) holding one reasoning message,
//! streamed from `text_delta {reasoning: true}` events or whole from a
//! `thinking {reasoning: true}`, which closes it.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::protocol::Event;

/// The reasoning messages open, one per deliberation agent (`None` for
/// the session's own), by message id.
#[derive(Default)]
pub(super) struct OpenReasoning(HashMap<Option<String>, String>);

impl OpenReasoning {
    /// A streamed piece: opens the span and its message at the first.
    pub(super) fn delta(&mut self, event: &Event, content: &str, out: &mut Vec<Value>) {
        let ts = event.ts.timestamp_millis();
        let id = match self.0.get(&event.agent_id) {
            Some(id) => id.clone(),
            None => {
                let id = message_id(event);
                open(&id, ts, out);
                self.0.insert(event.agent_id.clone(), id.clone());
                id
            }
        };
        out.push(json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": id,
            "delta": content, "timestamp": ts}));
    }

    /// The whole reasoning: closes what its pieces opened, or is a span of
    /// its own when none streamed.
    pub(super) fn whole(&mut self, event: &Event, content: &str, out: &mut Vec<Value>) {
        let ts = event.ts.timestamp_millis();
        match self.0.remove(&event.agent_id) {
            Some(id) => close(&id, ts, out),
            None if content.is_empty() => {}
            None => {
                let id = message_id(event);
                open(&id, ts, out);
                out.push(json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": id,
                    "delta": content, "timestamp": ts}));
                close(&id, ts, out);
            }
        }
    }

    /// Closes every span still open (the run ends).
    pub(super) fn close_all(&mut self, ts: i64, out: &mut Vec<Value>) {
        for (_, id) in self.0.drain() {
            close(&id, ts, out);
        }
    }
}

fn message_id(event: &Event) -> String {
    format!("{}-{}-reasoning", event.session_id, event.seq)
}

fn open(id: &str, ts: i64, out: &mut Vec<Value>) {
    out.push(json!({"type": "REASONING_START", "messageId": id, "timestamp": ts}));
    out.push(
        json!({"type": "REASONING_MESSAGE_START", "messageId": id, "role": "reasoning",
        "timestamp": ts}),
    );
}

fn close(id: &str, ts: i64, out: &mut Vec<Value>) {
    out.push(json!({"type": "REASONING_MESSAGE_END", "messageId": id, "timestamp": ts}));
    out.push(json!({"type": "REASONING_END", "messageId": id, "timestamp": ts}));
}

#[cfg(test)]
mod tests {
    use super::super::events::Mapper;
    use crate::protocol::{Event, EventKind};

    fn types(mapper: &mut Mapper, kind: EventKind, seq: u64) -> Vec<String> {
        mapper
            .map(&Event::at(seq, kind))
            .events
            .iter()
            .map(|e| e["type"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn streamed_reasoning_is_one_span_closed_by_its_whole_and_text_stays_text() {
        let mut mapper = Mapper::new("t".into(), "r".into());
        let piece = |content: &str| EventKind::TextDelta {
            content: content.into(),
            reasoning: true,
        };
        assert_eq!(
            types(&mut mapper, piece("Two plus "), 1),
            [
                "REASONING_START",
                "REASONING_MESSAGE_START",
                "REASONING_MESSAGE_CONTENT"
            ]
        );
        assert_eq!(
            types(&mut mapper, piece("two."), 2),
            ["REASONING_MESSAGE_CONTENT"]
        );
        let whole = EventKind::Thinking {
            content: "Two plus two.".into(),
            reasoning: true,
        };
        assert_eq!(
            types(&mut mapper, whole.clone(), 3),
            ["REASONING_MESSAGE_END", "REASONING_END"]
        );
        // Unstreamed reasoning is a span of its own; the answer is text.
        assert_eq!(
            types(&mut mapper, whole, 4),
            [
                "REASONING_START",
                "REASONING_MESSAGE_START",
                "REASONING_MESSAGE_CONTENT",
                "REASONING_MESSAGE_END",
                "REASONING_END"
            ]
        );
        let answer = EventKind::Thinking {
            content: "4".into(),
            reasoning: false,
        };
        assert_eq!(
            types(&mut mapper, answer, 5),
            [
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END"
            ]
        );
    }
}
