//! What the gateway knows of OpenAI Responses API calls: which replica
//! answered each response (a follow-up naming it as
//! `previous_response_id` must go there, as only that replica stored it),
//! and how a response's events and body are read for its trace.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::Value;

use super::trace::Trace;
use crate::sync::lock;

/// Response ids remembered; the oldest are forgotten past it (a follow-up
/// to a forgotten one is balanced like a new call).
const REMEMBERED: usize = 100_000;

/// Who made a response, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The key hash of the caller (`None` when auth is off).
    pub owner: Option<String>,
    pub replica: String,
}

/// Response id → its [`Route`], for the newest 100 000 responses.
#[derive(Default)]
pub struct ResponseRoutes {
    inner: Mutex<Routes>,
}

#[derive(Default)]
struct Routes {
    by_id: HashMap<String, Route>,
    order: VecDeque<String>,
}

impl ResponseRoutes {
    pub fn remember(&self, id: String, route: Route) {
        let mut routes = lock(&self.inner);
        if routes.by_id.insert(id.clone(), route).is_none() {
            routes.order.push_back(id);
        }
        while routes.order.len() > REMEMBERED {
            if let Some(old) = routes.order.pop_front() {
                routes.by_id.remove(&old);
            }
        }
    }

    pub fn find(&self, id: &str) -> Option<Route> {
        lock(&self.inner).by_id.get(id).cloned()
    }
}

/// One streamed event as the recorder needs it: its type, a delta, and
/// the response's id (only these are read; the rest is skipped).
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    delta: Option<Cow<'a, str>>,
    response: Option<Head>,
}

/// A response's id, whatever else it holds.
#[derive(Deserialize)]
struct Head {
    id: Option<String>,
}

/// What a streamed event told: the response's id (from
/// `response.created` and the events after it), whether it carried
/// content, whether it ends the stream.
#[derive(Default)]
pub struct Seen {
    pub id: Option<String>,
    pub content: bool,
    pub ends: bool,
}

/// An SSE `data:` payload of a Responses stream.
pub fn scan_event(data: &[u8]) -> Seen {
    let Ok(event) = serde_json::from_slice::<Event<'_>>(data) else {
        return Seen::default();
    };
    let kind = event.kind.as_deref().unwrap_or_default();
    Seen {
        id: event.response.and_then(|r| r.id),
        content: matches!(
            kind,
            "response.output_text.delta"
                | "response.function_call_arguments.delta"
                | "response.refusal.delta"
        ) && event.delta.is_some_and(|d| !d.is_empty()),
        ends: matches!(
            kind,
            "response.completed" | "response.incomplete" | "response.failed" | "error"
        ),
    }
}

/// The id of a whole (not streamed) response body.
pub fn body_id(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Head>(body).ok()?.id
}

/// One streamed event, read into the trace: text deltas, finished
/// function calls, the final usage.
pub fn read_event(trace: &mut Trace, kind: &str, event: &Value) {
    match kind {
        "response.output_text.delta" => {
            if let Some(delta) = event.get("delta").and_then(Value::as_str) {
                trace.response_text.push_str(delta);
            }
        }
        "response.output_item.done" => {
            if let Some(item) = event.get("item").filter(|i| i["type"] == "function_call") {
                trace.tool_calls.push(item.clone());
            }
        }
        "response.completed" | "response.incomplete" | "response.failed" => {
            if let Some(usage) = event.pointer("/response/usage").filter(|u| !u.is_null()) {
                trace.usage = Some(usage.clone());
            }
        }
        _ => {}
    }
}

/// A whole response, read into the trace: its output text and function
/// calls (its usage is read as any body's).
pub fn read_body(trace: &mut Trace, output: &[Value]) {
    for item in output {
        match item["type"].as_str() {
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    if part["type"] == "output_text" {
                        trace
                            .response_text
                            .push_str(part["text"].as_str().unwrap_or_default());
                    }
                }
            }
            Some("function_call") => trace.tool_calls.push(item.clone()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_give_the_id_content_and_end() {
        let created = br#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","output":[{"type":"message"}]}}"#;
        let seen = scan_event(created);
        assert_eq!(seen.id.as_deref(), Some("resp_1"));
        assert!(!seen.content && !seen.ends);
        let delta = br#"{"type":"response.output_text.delta","delta":"Hi","item_id":"m"}"#;
        assert!(scan_event(delta).content);
        let empty = br#"{"type":"response.output_text.delta","delta":""}"#;
        assert!(!scan_event(empty).content);
        let done = br#"{"response":{"id":"resp_1","usage":{"total_tokens":3}},"type":"response.completed"}"#;
        let seen = scan_event(done);
        assert!(seen.ends);
        assert_eq!(seen.id.as_deref(), Some("resp_1"));
        assert_eq!(
            body_id(br#"{"id":"resp_2","object":"response"}"#).as_deref(),
            Some("resp_2")
        );
    }

    #[test]
    fn the_oldest_routes_are_forgotten() {
        let routes = ResponseRoutes::default();
        let route = |replica: &str| Route {
            owner: None,
            replica: replica.into(),
        };
        for i in 0..=REMEMBERED {
            routes.remember(format!("r{i}"), route("a"));
        }
        assert_eq!(routes.find("r0"), None);
        assert_eq!(routes.find("r1"), Some(route("a")));
        routes.remember("r1".into(), route("b"));
        assert_eq!(routes.find("r1"), Some(route("b")));
    }
}
