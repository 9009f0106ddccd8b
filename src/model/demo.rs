//! The `demo` model: deterministic, offline, and able to drive real tools.
//!
//! For a user prompt it calls `mcp__sandbox__execute_code` for each fenced
//! code block and `Bash` for each line starting with `$ ` (when those tools
//! are offered), else it answers with the prompt echoed back. After tool
//! results it summarises them. A pipeline node's request for a JSON
//! decision it answers with the first decision offered. Text streams one word per chunk with a
//! configurable pause, so tests and benchmarks can hold a turn open.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::json;

use super::{
    ChatRequest, Message, ModelError, ModelProvider, ModelStream, StopReason, StreamEvent, Tokens,
    ToolCall,
};

pub const EXECUTE_CODE: &str = "mcp__sandbox__execute_code";
pub const BASH: &str = "Bash";

pub struct DemoProvider {
    chunk_delay: Duration,
}

impl DemoProvider {
    pub fn new(chunk_delay: Duration) -> DemoProvider {
        DemoProvider { chunk_delay }
    }
}

/// What the demo model decided to say and call.
#[derive(Debug, PartialEq)]
struct DemoTurn {
    text: String,
    calls: Vec<ToolCall>,
}

fn reply(request: &ChatRequest) -> DemoTurn {
    let offered = |name: &str| request.tools.iter().any(|t| t.name == name);
    let turn = request
        .messages
        .iter()
        .filter(|m| matches!(m, Message::Assistant { .. }))
        .count();
    let results: Vec<&Message> = request
        .messages
        .iter()
        .rev()
        .take_while(|m| matches!(m, Message::Tool { .. }))
        .collect();
    let prompt = request
        .messages
        .iter()
        .rev()
        .find_map(|m| match m {
            Message::User { content } => Some(content.as_str()),
            _ => None,
        })
        .unwrap_or("");
    // Only the last prompt asks: a decision an earlier one asked for is
    // not the answer to this one.
    let asked = decision_asked(prompt);
    if !results.is_empty() {
        if let Some(answer) = asked {
            return DemoTurn {
                text: answer,
                calls: Vec::new(),
            };
        }
        let mut text = String::new();
        for message in results.into_iter().rev() {
            if let Message::Tool {
                name,
                content,
                is_error,
                ..
            } = message
            {
                let verdict = if *is_error { "failed" } else { "returned" };
                let shown: String = content.chars().take(500).collect();
                text.push_str(&format!("The tool {name} {verdict}: {shown}\n"));
            }
        }
        return DemoTurn {
            text: text.trim_end().to_string(),
            calls: Vec::new(),
        };
    }
    let mut calls = Vec::new();
    let mut missing = Vec::new();
    let mut want = |name: &str, arguments: serde_json::Value| {
        if offered(name) {
            let id = format!("toolu_demo_{}_{}", turn + 1, calls.len() + 1);
            calls.push(ToolCall {
                id,
                name: name.to_string(),
                arguments,
            });
        } else if !missing.contains(&name.to_string()) {
            missing.push(name.to_string());
        }
    };
    let mut lines = prompt.lines();
    while let Some(line) = lines.next() {
        if let Some(fence) = line.trim_start().strip_prefix("```") {
            let language = match fence.trim() {
                "" => "python",
                other => other,
            };
            let code: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.trim_start().starts_with("```"))
                .collect();
            want(
                EXECUTE_CODE,
                json!({"code": code.join("\n"), "language": language}),
            );
        } else if let Some(command) = line.strip_prefix("$ ") {
            want(BASH, json!({"command": command.trim()}));
        }
    }
    let text = if !calls.is_empty() {
        format!("I'll run that with {} tool call(s).", calls.len())
    } else if let Some(answer) = asked {
        answer
    } else if !missing.is_empty() {
        format!(
            "I would run this with {}, but that tool is not available in this session.",
            missing.join(" and ")
        )
    } else {
        format!("You said: {prompt}")
    };
    DemoTurn { text, calls }
}

/// A pipeline node's request for `{"decision": "A" | "B", …}`: the demo
/// model answers `{"decision": "A"}`, the first decision offered, once the
/// prompt's tool calls (if any) have run.
fn decision_asked(prompt: &str) -> Option<String> {
    const ASK: &str = "{\"decision\": \"";
    let at = prompt.rfind(ASK)?;
    let rest = &prompt[at + ASK.len()..];
    let decision = &rest[..rest.find('"')?];
    Some(format!("{{\"decision\": \"{decision}\"}}"))
}

/// Splits text into chunks of one word and the whitespace after it.
fn chunks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        if !c.is_whitespace() && current.ends_with(char::is_whitespace) {
            out.push(std::mem::take(&mut current));
        }
        current.push(c);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[async_trait]
impl ModelProvider for DemoProvider {
    fn provider_name(&self) -> &'static str {
        "conclave.demo"
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let DemoTurn { text, calls } = reply(&request);
        let input_tokens: u64 = request
            .messages
            .iter()
            .map(|m| match m {
                Message::User { content } | Message::Tool { content, .. } => content,
                Message::Assistant { content, .. } => content,
                Message::Compacted { summary, .. } => summary,
                Message::Reasoning { text, .. } => text,
            })
            .map(|c| c.split_whitespace().count() as u64)
            .sum();
        let pieces = chunks(&text);
        let output_tokens = pieces.len() as u64 + calls.len() as u64;
        let stop = if calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        };
        let mut events: Vec<StreamEvent> = pieces.into_iter().map(StreamEvent::TextDelta).collect();
        events.extend(calls.into_iter().map(StreamEvent::ToolCall));
        events.push(StreamEvent::Usage(Tokens {
            input: input_tokens,
            output: output_tokens,
            ..Tokens::default()
        }));
        events.push(StreamEvent::Done(stop));
        let delay = self.chunk_delay;
        let stream = futures::stream::iter(events).then(move |event| async move {
            if !delay.is_zero() && matches!(event, StreamEvent::TextDelta(_)) {
                tokio::time::sleep(delay).await;
            }
            Ok(event)
        });
        Ok(Box::pin(stream))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::ToolSpec;

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: Arc::new(json!({"type": "object"})),
            read_only: false,
        }
    }

    fn ask(prompt: &str, tools: &[&str]) -> ChatRequest {
        ChatRequest {
            model: "demo".into(),
            messages: Arc::new(vec![Message::User {
                content: prompt.into(),
            }]),
            tools: tools.iter().map(|t| tool(t)).collect(),
            ..ChatRequest::default()
        }
    }

    #[test]
    fn code_block_and_dollar_line_become_tool_calls() {
        let r = reply(&ask(
            "please\n```python\nprint(1)\n```\n$ ls -la\n",
            &[EXECUTE_CODE, BASH],
        ));
        assert_eq!(
            r.calls,
            vec![
                ToolCall {
                    id: "toolu_demo_1_1".into(),
                    name: EXECUTE_CODE.into(),
                    arguments: json!({"code": "print(1)", "language": "python"}),
                },
                ToolCall {
                    id: "toolu_demo_1_2".into(),
                    name: BASH.into(),
                    arguments: json!({"command": "ls -la"}),
                },
            ]
        );
    }

    #[test]
    fn tools_not_offered_are_not_called() {
        let r = reply(&ask("$ ls", &[]));
        assert!(r.calls.is_empty());
        assert!(r.text.contains("not available"), "{}", r.text);
    }

    #[test]
    fn a_decision_asked_for_is_the_first_offered_after_the_tools() {
        let prompt = "Review it.\n```python\nprint(1)\n```\nWhen you are done, answer with one JSON object and nothing else: {\"decision\": \"APPROVE\" | \"REJECT_CODE\", \"logs\": …}";
        let first = reply(&ask(prompt, &[EXECUTE_CODE]));
        assert_eq!(first.calls.len(), 1);
        assert_eq!(
            decision_asked(prompt).unwrap(),
            "{\"decision\": \"APPROVE\"}"
        );
        let plain = reply(&ask("answer with {\"decision\": \"DONE\"}", &[]));
        assert_eq!(plain.text, "{\"decision\": \"DONE\"}");
    }

    #[test]
    fn only_the_last_prompt_is_answered() {
        let mut request = ask("answer with {\"decision\": \"DONE\"}", &[BASH]);
        Arc::make_mut(&mut request.messages).extend([
            Message::Assistant {
                content: "{\"decision\": \"DONE\"}".into(),
                tool_calls: vec![],
            },
            Message::User {
                content: "hello".into(),
            },
        ]);
        assert_eq!(reply(&request).text, "You said: hello");
        Arc::make_mut(&mut request.messages).extend([
            Message::Assistant {
                content: "You said: hello".into(),
                tool_calls: vec![],
            },
            Message::User {
                content: "$ ls".into(),
            },
        ]);
        assert_eq!(reply(&request).calls[0].id, "toolu_demo_3_1");
    }

    #[test]
    fn plain_prompt_is_echoed() {
        assert_eq!(
            reply(&ask("hello there", &[])).text,
            "You said: hello there"
        );
    }

    #[test]
    fn tool_results_are_summarised() {
        let mut request = ask("$ echo hi", &[BASH]);
        Arc::make_mut(&mut request.messages).push(Message::Assistant {
            content: String::new(),
            tool_calls: vec![],
        });
        Arc::make_mut(&mut request.messages).push(Message::Tool {
            tool_call_id: "t".into(),
            name: BASH.into(),
            content: "hi".into(),
            is_error: false,
        });
        let r = reply(&request);
        assert_eq!(r.text, "The tool Bash returned: hi");
        assert!(r.calls.is_empty());
    }

    #[test]
    fn chunks_keep_all_text() {
        let text = "one  two\nthree ";
        assert_eq!(chunks(text), vec!["one  ", "two\n", "three "]);
        assert_eq!(chunks(text).concat(), text);
    }

    #[tokio::test]
    async fn complete_collects_the_stream() {
        let demo = DemoProvider::new(Duration::ZERO);
        let response = demo.complete(ask("hi", &[])).await.unwrap();
        assert_eq!(response.text, "You said: hi");
        assert_eq!(response.stop_reason, Some(StopReason::EndTurn));
        assert_eq!(response.tokens.output, 3);
    }
}
