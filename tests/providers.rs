//! The OpenAI-compatible and Anthropic providers against a scripted
//! upstream that serves pre-written SSE bodies over real sockets.
//!
//! Retries wait in real time (`Retry-After: 1`, backoff from 200 ms): a
//! paused tokio clock jumps ahead whenever the runtime waits on a socket,
//! which would fire the client's read timeout while the upstream answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "providers/upstream.rs"]
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use conclave::model::anthropic::AnthropicProvider;
use conclave::model::lenient;
use conclave::model::openai::OpenAiProvider;
use conclave::model::{
    ChatRequest, Effort, Message, ModelError, ModelProvider, ModelStream, ReasoningOptions,
    StopReason, StreamEvent, Tokens, ToolCall, ToolCallMode, ToolSpec,
};
use futures::StreamExt;
use serde_json::{Value, json};
use upstream::{Reply, Upstream, chunk_usage, content, data, delta, end, event, finish};

/// Retries allowed in every test; enough for one failure before success.
const RETRIES: u32 = 2;
const TIMEOUT: Duration = Duration::from_secs(10);

fn openai(upstream: &Upstream) -> OpenAiProvider {
    OpenAiProvider::new(
        &format!("{}/v1", upstream.url),
        Some("sk-test".into()),
        RETRIES,
        TIMEOUT,
    )
    .unwrap()
}

fn anthropic(upstream: &Upstream) -> AnthropicProvider {
    AnthropicProvider::new(&upstream.url, Some("ak-test".into()), RETRIES, TIMEOUT).unwrap()
}

/// Every item of a stream; errors as their code. Nothing may follow an error.
async fn drain(mut stream: ModelStream) -> Vec<Result<StreamEvent, &'static str>> {
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        let failed = item.is_err();
        items.push(item.map_err(|e| e.code()));
        if failed {
            assert!(stream.next().await.is_none(), "items after an error");
            break;
        }
    }
    items
}

async fn run(
    provider: &dyn ModelProvider,
    request: ChatRequest,
) -> Vec<Result<StreamEvent, &'static str>> {
    drain(provider.stream(request).await.unwrap()).await
}

/// Generated ids differ per run: checks their shape and blanks them.
fn without_ids(
    items: Vec<Result<StreamEvent, &'static str>>,
) -> Vec<Result<StreamEvent, &'static str>> {
    items
        .into_iter()
        .map(|item| match item {
            Ok(StreamEvent::ToolCall(call)) => {
                assert!(call.id.starts_with("call_"), "{}", call.id);
                Ok(StreamEvent::ToolCall(ToolCall {
                    id: String::new(),
                    ..call
                }))
            }
            other => other,
        })
        .collect()
}

fn tool(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("Runs {name}."),
        input_schema: Arc::new(
            json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        ),
        read_only: false,
    }
}

fn ask(prompt: &str) -> ChatRequest {
    ChatRequest {
        model: "small-model".into(),
        messages: std::sync::Arc::new(vec![Message::User {
            content: prompt.into(),
        }]),
        ..ChatRequest::default()
    }
}

fn text(delta: &str) -> Result<StreamEvent, &'static str> {
    Ok(StreamEvent::TextDelta(delta.into()))
}

fn call(id: &str, name: &str, arguments: Value) -> Result<StreamEvent, &'static str> {
    Ok(StreamEvent::ToolCall(ToolCall {
        id: id.into(),
        name: name.into(),
        arguments,
    }))
}

fn usage(input: u64, output: u64) -> Result<StreamEvent, &'static str> {
    Ok(StreamEvent::Usage(Tokens {
        input,
        output,
        ..Tokens::default()
    }))
}

fn done(reason: StopReason) -> Result<StreamEvent, &'static str> {
    Ok(StreamEvent::Done(reason))
}

fn hello() -> Reply {
    Reply::sse(vec![
        delta(json!({"role": "assistant", "content": ""})),
        content("Hel"),
        content("lo"),
        finish("stop"),
        chunk_usage(12, 2),
        end(),
    ])
}

fn hello_events() -> Vec<Result<StreamEvent, &'static str>> {
    vec![
        text("Hel"),
        text("lo"),
        usage(12, 2),
        done(StopReason::EndTurn),
    ]
}

#[tokio::test]
async fn openai_streams_text_and_usage() {
    let upstream = Upstream::start(vec![hello()]).await;
    assert_eq!(run(&openai(&upstream), ask("hi")).await, hello_events());
}

#[tokio::test]
async fn openai_reassembles_parallel_tool_calls_split_across_chunks() {
    let bash = r#"{"command": "ls -la /tmp && echo \"done\""}"#;
    let read = r#"{"path": "src/main.rs", "limit": 40}"#;
    let fragments = |arguments: &str| -> Vec<String> {
        let chars: Vec<char> = arguments.chars().collect();
        chars.chunks(3).map(|c| c.iter().collect()).collect()
    };
    let (bash_parts, read_parts) = (fragments(bash), fragments(read));
    let mut events = vec![
        content("Checking."),
        delta(json!({"tool_calls": [{
            "index": 0, "id": "call_a", "type": "function",
            "function": {"name": "Bash", "arguments": ""}
        }]})),
        delta(json!({"tool_calls": [{
            "index": 1, "id": "call_b", "type": "function",
            "function": {"name": "Read", "arguments": ""}
        }]})),
    ];
    for i in 0..bash_parts.len().max(read_parts.len()) {
        for (index, parts) in [(1, &read_parts), (0, &bash_parts)] {
            if let Some(part) = parts.get(i) {
                events.push(delta(json!({"tool_calls": [{
                    "index": index, "function": {"arguments": part}
                }]})));
            }
        }
    }
    events.extend([finish("tool_calls"), chunk_usage(30, 25), end()]);
    let upstream = Upstream::start(vec![Reply::sse(events)]).await;
    let mut request = ask("look around");
    request.tools = vec![tool("Bash"), tool("Read")];

    assert_eq!(
        run(&openai(&upstream), request).await,
        vec![
            text("Checking."),
            call("call_a", "Bash", serde_json::from_str(bash).unwrap()),
            call("call_b", "Read", serde_json::from_str(read).unwrap()),
            usage(30, 25),
            done(StopReason::ToolUse),
        ]
    );
}

#[tokio::test]
async fn openai_retries_429_after_retry_after() {
    let upstream = Upstream::start(vec![
        Reply::status(429, r#"{"error": {"message": "slow down"}}"#).header("retry-after", "1"),
        hello(),
    ])
    .await;
    assert_eq!(run(&openai(&upstream), ask("hi")).await, hello_events());
    assert_eq!(upstream.requests().len(), 2);
}

#[tokio::test]
async fn openai_retries_500() {
    let upstream = Upstream::start(vec![Reply::status(500, "boom"), hello()]).await;
    assert_eq!(run(&openai(&upstream), ask("hi")).await, hello_events());
    assert_eq!(upstream.requests().len(), 2);
}

#[tokio::test]
async fn openai_does_not_retry_400() {
    let body = r#"{"error": {"message": "unknown field 'tols'"}}"#;
    let upstream = Upstream::start(vec![Reply::status(400, body), hello()]).await;
    let Err(error) = openai(&upstream).stream(ask("hi")).await else {
        panic!("a 400 must fail the call");
    };
    match error {
        ModelError::Http { status, body: got } => assert_eq!((status, got.as_str()), (400, body)),
        other => panic!("expected an HTTP error, got {other:?}"),
    }
    assert_eq!(upstream.requests().len(), 1);
}

#[tokio::test]
async fn openai_gives_up_after_max_retries() {
    let upstream = Upstream::start(vec![
        Reply::status(503, "down"),
        Reply::status(503, "down"),
        Reply::status(503, "still down"),
        hello(),
    ])
    .await;
    let Err(error) = openai(&upstream).stream(ask("hi")).await else {
        panic!("the call must fail once retries are spent");
    };
    assert!(
        matches!(&error, ModelError::Http { status: 503, body } if body == "still down"),
        "{error:?}"
    );
    assert_eq!(upstream.requests().len(), 1 + RETRIES as usize);
}

#[tokio::test]
async fn openai_connection_refused_is_a_connect_error() {
    // Bound but not listening: the port stays ours and refuses connections.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let url = format!("http://{}/v1", socket.local_addr().unwrap());
    let provider = OpenAiProvider::new(&url, None, 1, TIMEOUT).unwrap();
    let Err(error) = provider.stream(ask("hi")).await else {
        panic!("nobody listens");
    };
    assert_eq!(error.code(), "model_unreachable", "{error}");
}

#[tokio::test]
async fn openai_malformed_line_is_an_error_and_ends_the_stream() {
    let upstream = Upstream::start(vec![Reply::sse(vec![
        content("hi"),
        "data: {\"choices\": [oops\n\n".into(),
        content("never seen"),
        finish("stop"),
        end(),
    ])])
    .await;
    assert_eq!(
        run(&openai(&upstream), ask("hi")).await,
        vec![text("hi"), Err("model_protocol_error")]
    );
}

#[tokio::test]
async fn openai_error_object_mid_stream_is_an_error() {
    let upstream = Upstream::start(vec![Reply::sse(vec![
        content("par"),
        data(&json!({"error": {"message": "the engine died", "type": "internal"}})),
        content("never seen"),
    ])])
    .await;
    let mut stream = openai(&upstream).stream(ask("hi")).await.unwrap();
    assert_eq!(
        stream.next().await.unwrap().unwrap(),
        StreamEvent::TextDelta("par".into())
    );
    let error = stream.next().await.unwrap().unwrap_err();
    assert_eq!(error.to_string(), "model error: the engine died");
    assert!(stream.next().await.is_none());
}

#[tokio::test]
async fn openai_stream_cut_off_mid_call_is_an_error() {
    let upstream = Upstream::start(vec![Reply::sse(vec![delta(json!({"tool_calls": [{
        "index": 0, "id": "call_a", "type": "function",
        "function": {"name": "Bash", "arguments": "{\"command\": \"rm -r"}
    }]}))])])
    .await;
    let mut request = ask("clean up");
    request.tools = vec![tool("Bash")];
    assert_eq!(
        run(&openai(&upstream), request).await,
        vec![Err("model_protocol_error")]
    );
}

#[tokio::test]
async fn openai_request_body_and_headers() {
    let upstream = Upstream::start(vec![hello()]).await;
    let request = ChatRequest {
        model: "qwen2.5-7b".into(),
        system: Some("Be brief.".into()),
        messages: std::sync::Arc::new(vec![
            Message::User {
                content: "list files".into(),
            },
            Message::Reasoning {
                text: "The user wants a listing.".into(),
                signature: None,
                redacted: None,
            },
            Message::Assistant {
                content: "Listing.".into(),
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "Bash".into(),
                    arguments: json!({"command": "ls"}),
                }],
            },
            Message::Tool {
                tool_call_id: "call_1".into(),
                name: "Bash".into(),
                content: "a.txt".into(),
                is_error: false,
            },
        ]),
        tools: vec![tool("Bash")],
        answer_only: false,
        temperature: Some(0.5),
        seed: Some(3),
        max_tokens: Some(256),
        tool_call_mode: ToolCallMode::Native,
        session_id: Some("5f0c7a52-session".into()),
        owner: None,
        reasoning: Some(ReasoningOptions {
            effort: Some(Effort::High),
            budget_tokens: Some(4096),
        }),
    };
    run(&openai(&upstream), request).await;

    let requests = upstream.requests();
    assert_eq!(requests.len(), 1);
    let got = &requests[0];
    assert_eq!(got.path, "/v1/chat/completions");
    assert_eq!(got.headers["authorization"], "Bearer sk-test");
    assert_eq!(got.headers["x-session-id"], "5f0c7a52-session");
    assert_eq!(got.headers["content-type"], "application/json");
    assert_eq!(
        got.body,
        json!({
            "model": "qwen2.5-7b",
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": "Listing.", "tool_calls": [{
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}
                }]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}
            ],
            "tools": [{"type": "function", "function": {
                "name": "Bash",
                "description": "Runs Bash.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}
            }}],
            "temperature": 0.5,
            "seed": 3,
            "max_tokens": 256,
            "reasoning_effort": "high",
            "user": "5f0c7a52-session"
        })
    );
}

/// Calls come only from the tool-call channel: a call written into the
/// content is text (the small harness may read it; the provider never
/// does), and a stream is never cut for what it says.
#[tokio::test]
async fn openai_reads_calls_only_from_the_tool_call_channel() {
    let upstream = Upstream::start(vec![Reply::sse(vec![
        content("<tool_call>\n{\"name\": \"Bash\", "),
        content("\"arguments\": {\"command\": \"ls\"}}\n"),
        content("</tool_call>"),
        finish("stop"),
        end(),
    ])])
    .await;
    let mut request = ask("list files");
    request.tools = vec![tool("Bash")];
    assert_eq!(
        run(&openai(&upstream), request).await,
        vec![
            text("<tool_call>\n{\"name\": \"Bash\", "),
            text("\"arguments\": {\"command\": \"ls\"}}\n"),
            text("</tool_call>"),
            done(StopReason::EndTurn),
        ]
    );
    let line = "{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n";
    let mut events: Vec<String> = (0..200).map(|_| content(line)).collect();
    events.extend([finish("length"), end()]);
    let upstream = Upstream::start(vec![Reply::sse(events)]).await;
    let mut request = ask("list files");
    request.tools = vec![tool("Bash")];
    let got = run(&openai(&upstream), request).await;
    assert_eq!(got.len(), 201, "every line, then the end");
    assert_eq!(got.last(), Some(&done(StopReason::MaxTokens)));
}

#[tokio::test]
async fn openai_does_not_recover_calls_without_tools() {
    let written = r#"{"name": "Bash", "arguments": {"command": "ls"}}"#;
    let upstream = Upstream::start(vec![Reply::sse(vec![
        content(written),
        finish("stop"),
        end(),
    ])])
    .await;
    assert_eq!(
        run(&openai(&upstream), ask("show me a call")).await,
        vec![text(written), done(StopReason::EndTurn)]
    );
}

#[tokio::test]
async fn openai_json_schema_mode() {
    let upstream = Upstream::start(vec![
        Reply::sse(vec![
            content("{\"tool\": \"Bash\", "),
            content("\"arguments\": {\"command\": \"ls\"}}"),
            finish("stop"),
            end(),
        ]),
        Reply::sse(vec![
            content("{\"answer\": "),
            content("\"Two files.\"}"),
            finish("stop"),
            end(),
        ]),
    ])
    .await;
    let provider = openai(&upstream);
    let mut request = ask("list files");
    request.system = Some("Be brief.".into());
    request.tools = vec![tool("Bash")];
    request.tool_call_mode = ToolCallMode::JsonSchema;

    assert_eq!(
        without_ids(run(&provider, request.clone()).await),
        vec![
            call("", "Bash", json!({"command": "ls"})),
            done(StopReason::ToolUse)
        ]
    );
    assert_eq!(
        run(&provider, request).await,
        vec![text("Two files."), done(StopReason::EndTurn)]
    );

    let requests = upstream.requests();
    let instructions = lenient::json_mode_instructions(&[tool("Bash")]);
    assert_eq!(
        requests[0].body,
        json!({
            "model": "small-model",
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": format!("Be brief.\n\n{instructions}")},
                {"role": "user", "content": "list files"}
            ],
            "response_format": lenient::answer_or_call_format(&[tool("Bash")])
        })
    );
}

// Anthropic Messages events.

fn message_start(input_tokens: u64) -> String {
    event(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [],
            "model": "claude-sonnet-4-5", "stop_reason": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1}
        }}),
    )
}

fn block_start(index: u32, block: Value) -> String {
    event(
        "content_block_start",
        &json!({"type": "content_block_start", "index": index, "content_block": block}),
    )
}

fn block_delta(index: u32, delta: Value) -> String {
    event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}

fn block_stop(index: u32) -> String {
    event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": index}),
    )
}

fn message_end(stop_reason: &str, output_tokens: u64) -> Vec<String> {
    vec![
        event(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                    "usage": {"output_tokens": output_tokens}}),
        ),
        event("message_stop", &json!({"type": "message_stop"})),
    ]
}

fn ping() -> String {
    event("ping", &json!({"type": "ping"}))
}

fn claude_hello() -> Reply {
    let mut events = vec![
        message_start(10),
        block_start(0, json!({"type": "text", "text": ""})),
        block_delta(0, json!({"type": "text_delta", "text": "Hi"})),
        block_stop(0),
    ];
    events.extend(message_end("end_turn", 3));
    Reply::sse(events)
}

#[tokio::test]
async fn anthropic_streams_text_and_tool_use() {
    let mut events = vec![
        message_start(25),
        block_start(0, json!({"type": "text", "text": ""})),
        ping(),
        block_delta(0, json!({"type": "text_delta", "text": "Let me "})),
        block_delta(0, json!({"type": "text_delta", "text": "check."})),
        block_stop(0),
        block_start(
            1,
            json!({"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}),
        ),
    ];
    for part in ["", "{\"comm", "and\": \"ls", " -la\"", "}"] {
        events.push(block_delta(
            1,
            json!({"type": "input_json_delta", "partial_json": part}),
        ));
    }
    events.push(block_stop(1));
    events.extend(message_end("tool_use", 40));
    let upstream = Upstream::start(vec![Reply::sse(events)]).await;
    let mut request = ask("list files");
    request.tools = vec![tool("Bash")];

    assert_eq!(
        run(&anthropic(&upstream), request).await,
        vec![
            text("Let me "),
            text("check."),
            call("toolu_1", "Bash", json!({"command": "ls -la"})),
            usage(25, 40),
            done(StopReason::ToolUse),
        ]
    );
}

#[tokio::test]
async fn anthropic_retries_529_overloaded() {
    let overloaded =
        r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#;
    let upstream = Upstream::start(vec![Reply::status(529, overloaded), claude_hello()]).await;
    assert_eq!(
        run(&anthropic(&upstream), ask("hi")).await,
        vec![text("Hi"), usage(10, 3), done(StopReason::EndTurn)]
    );
    assert_eq!(upstream.requests().len(), 2);
}

#[tokio::test]
async fn anthropic_error_event_is_an_error() {
    let upstream = Upstream::start(vec![Reply::sse(vec![
        message_start(10),
        block_start(0, json!({"type": "text", "text": ""})),
        block_delta(0, json!({"type": "text_delta", "text": "Hi"})),
        event(
            "error",
            &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
        block_stop(0),
    ])])
    .await;
    let mut stream = anthropic(&upstream).stream(ask("hi")).await.unwrap();
    assert_eq!(
        stream.next().await.unwrap().unwrap(),
        StreamEvent::TextDelta("Hi".into())
    );
    let error = stream.next().await.unwrap().unwrap_err();
    assert_eq!(
        error.to_string(),
        "model error: overloaded_error: Overloaded"
    );
    assert!(stream.next().await.is_none());
}

#[tokio::test]
async fn anthropic_stream_without_message_stop_is_an_error() {
    let upstream = Upstream::start(vec![Reply::sse(vec![
        message_start(10),
        block_start(0, json!({"type": "text", "text": ""})),
        block_delta(0, json!({"type": "text_delta", "text": "Hi"})),
    ])])
    .await;
    assert_eq!(
        run(&anthropic(&upstream), ask("hi")).await,
        vec![text("Hi"), Err("model_protocol_error")]
    );
}

#[tokio::test]
async fn anthropic_request_body_and_headers() {
    let upstream = Upstream::start(vec![claude_hello()]).await;
    let result = |id: &str, content: &str, is_error: bool| Message::Tool {
        tool_call_id: id.into(),
        name: "Bash".into(),
        content: content.into(),
        is_error,
    };
    let request = ChatRequest {
        model: "claude-sonnet-4-5".into(),
        system: Some("Be brief.".into()),
        messages: std::sync::Arc::new(vec![
            Message::User {
                content: "two things".into(),
            },
            Message::Assistant {
                content: "Both at once.".into(),
                tool_calls: vec![
                    ToolCall {
                        id: "toolu_1".into(),
                        name: "Bash".into(),
                        arguments: json!({"command": "ls"}),
                    },
                    ToolCall {
                        id: "toolu_2".into(),
                        name: "Bash".into(),
                        arguments: json!({"command": "false"}),
                    },
                ],
            },
            result("toolu_1", "a.txt", false),
            result("toolu_2", "exit 1", true),
        ]),
        tools: vec![tool("Bash")],
        answer_only: false,
        temperature: Some(0.25),
        seed: Some(7),
        max_tokens: None,
        tool_call_mode: ToolCallMode::Native,
        session_id: Some("5f0c7a52-session".into()),
        owner: None,
        reasoning: None,
    };
    run(&anthropic(&upstream), request).await;

    let requests = upstream.requests();
    assert_eq!(requests.len(), 1);
    let got = &requests[0];
    assert_eq!(got.path, "/v1/messages");
    assert_eq!(got.headers["x-api-key"], "ak-test");
    assert_eq!(got.headers["anthropic-version"], "2023-06-01");
    assert_eq!(
        got.body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 4096,
            "stream": true,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "two things"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Both at once."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "false"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt", "is_error": false},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "exit 1", "is_error": true,
                     "cache_control": {"type": "ephemeral"}}
                ]}
            ],
            "tools": [{
                "name": "Bash",
                "description": "Runs Bash.",
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
                "cache_control": {"type": "ephemeral"}
            }],
            "temperature": 0.25,
            "metadata": {"user_id": "5f0c7a52-session"}
        })
    );
}

/// Anthropic's thinking arrives as reasoning pieces and one signed block
/// to send back; a redacted block is kept as it came; cache reads and
/// writes are counted apart, within the input.
#[tokio::test]
async fn anthropic_thinking_blocks_and_cache_counts() {
    let mut events = vec![event(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [],
            "model": "claude-sonnet-4-5", "stop_reason": null,
            "usage": {"input_tokens": 5, "cache_read_input_tokens": 900,
                "cache_creation_input_tokens": 100, "output_tokens": 1}
        }}),
    )];
    events.extend([
        block_start(0, json!({"type": "thinking", "thinking": ""})),
        block_delta(
            0,
            json!({"type": "thinking_delta", "thinking": "The user "}),
        ),
        block_delta(
            0,
            json!({"type": "thinking_delta", "thinking": "wants a file."}),
        ),
        block_delta(0, json!({"type": "signature_delta", "signature": "sig-1"})),
        block_stop(0),
        block_start(1, json!({"type": "redacted_thinking", "data": "enc-1"})),
        block_stop(1),
        block_start(2, json!({"type": "text", "text": ""})),
        block_delta(2, json!({"type": "text_delta", "text": "Done."})),
        block_stop(2),
    ]);
    events.extend(message_end("end_turn", 30));
    let upstream = Upstream::start(vec![Reply::sse(events)]).await;
    assert_eq!(
        run(&anthropic(&upstream), ask("write it")).await,
        vec![
            Ok(StreamEvent::ReasoningDelta("The user ".into())),
            Ok(StreamEvent::ReasoningDelta("wants a file.".into())),
            Ok(StreamEvent::Reasoning(Message::Reasoning {
                text: "The user wants a file.".into(),
                signature: Some("sig-1".into()),
                redacted: None,
            })),
            Ok(StreamEvent::Reasoning(Message::Reasoning {
                text: String::new(),
                signature: None,
                redacted: Some("enc-1".into()),
            })),
            text("Done."),
            Ok(StreamEvent::Usage(Tokens {
                input: 1005,
                output: 30,
                cache_read: 900,
                cache_write: 100,
            })),
            done(StopReason::EndTurn),
        ]
    );
}

/// Kept thinking goes back with its assistant message, unsigned reasoning
/// does not; `reasoning` turns thinking on with room for the answer and no
/// temperature; breakpoints stay within the API's four and never sit on a
/// thinking block.
#[tokio::test]
async fn anthropic_sends_thinking_back_and_asks_for_it() {
    let upstream = Upstream::start(vec![claude_hello()]).await;
    let request = ChatRequest {
        model: "claude-sonnet-4-5".into(),
        system: Some("Be brief.".into()),
        messages: std::sync::Arc::new(vec![
            Message::User {
                content: "write it".into(),
            },
            Message::Reasoning {
                text: "The user wants a file.".into(),
                signature: Some("sig-1".into()),
                redacted: None,
            },
            Message::Reasoning {
                text: String::new(),
                signature: None,
                redacted: Some("enc-1".into()),
            },
            Message::Reasoning {
                text: "from another provider".into(),
                signature: None,
                redacted: None,
            },
            Message::Assistant {
                content: "Done.".into(),
                tool_calls: Vec::new(),
            },
            Message::User {
                content: "thanks".into(),
            },
        ]),
        tools: vec![tool("Bash"), tool("Read")],
        temperature: Some(0.3),
        reasoning: Some(ReasoningOptions {
            effort: Some(Effort::Low),
            budget_tokens: None,
        }),
        ..ChatRequest::default()
    };
    run(&anthropic(&upstream), request).await;
    let body = &upstream.requests()[0].body;
    assert_eq!(
        body["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    assert_eq!(body["max_tokens"], 2048 + 4096);
    assert!(body.get("temperature").is_none(), "{body}");
    assert_eq!(
        body["messages"][1],
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user wants a file.", "signature": "sig-1"},
            {"type": "redacted_thinking", "data": "enc-1"},
            {"type": "text", "text": "Done."}
        ]})
    );
    let marked: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .chain(body["system"].as_array().unwrap())
        .chain(
            body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|m| m["content"].as_array().unwrap()),
        )
        .filter(|block| block.get("cache_control").is_some())
        .map(|block| block["name"].as_str().or(block["text"].as_str()).unwrap())
        .collect();
    assert_eq!(marked, ["Read", "Be brief.", "thanks"]);
}

/// `reasoning_content` (and `reasoning`) pieces arrive as reasoning;
/// `cached_tokens` is counted as cache reads.
#[tokio::test]
async fn openai_reasoning_content_and_cached_tokens() {
    let upstream = Upstream::start(vec![Reply::sse(vec![
        delta(json!({"role": "assistant", "reasoning_content": "Think"})),
        delta(json!({"reasoning": "ing."})),
        content("Hi"),
        finish("stop"),
        data(
            &json!({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 32}}}),
        ),
        end(),
    ])])
    .await;
    assert_eq!(
        run(&openai(&upstream), ask("hi")).await,
        vec![
            Ok(StreamEvent::ReasoningDelta("Think".into())),
            Ok(StreamEvent::ReasoningDelta("ing.".into())),
            text("Hi"),
            Ok(StreamEvent::Usage(Tokens {
                input: 40,
                output: 3,
                cache_read: 32,
                cache_write: 0,
            })),
            done(StopReason::EndTurn),
        ]
    );
}
