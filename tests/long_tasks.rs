//! Sessions longer than the model's context window, as the real binary
//! runs them (`conclave serve --sandbox local`, a fresh working directory)
//! against a scripted upstream that enforces a window (`common/windowed.rs`:
//! OpenAI's 400 `context_length_exceeded` past it, vLLM's `max_model_len`
//! in its listing). Each prompt `step N` has the model run a command that
//! prints 4 KB, then answer `done N`.
//!
//! - 60 turns with a 16k window all succeed, with `compacted` events, every
//!   request within the window, and the last turns sent word for word;
//! - `options.compaction: "off"` ends the turn that overflows with
//!   `context_exceeded`, naming the window;
//! - a window set larger than the upstream's in the config: the
//!   provider's refusal is recovered by one compaction and one retry;
//! - a fork before a compaction carries the history as it was, and
//!   `POST …/compact` compacts on request;
//! - a failing command that prints 200 KB gives the model the head and
//!   the tail of its output and the path of the whole, which `Read`
//!   reaches and the files route serves;
//! - Anthropic: thinking arrives as `thinking {reasoning: true}` events,
//!   its signed block is kept in the history and sent back, every request
//!   has at most four cache breakpoints, and cache reads and writes are
//!   counted and priced at the cache's prices;
//! - OpenAI-compatible: `reasoning_content` arrives the same way, and
//!   `options.reasoning.effort` is sent as `reasoning_effort`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod scripted;
#[path = "common/windowed.rs"]
mod windowed;

use common::binary::{serve_command, spawn_server, stop};
use serde_json::{Value, json};
use windowed::{Seen, is_summary, upstream};

const WINDOW: u64 = 16_384;

struct Server {
    child: tokio::process::Child,
    base: String,
    _dir: tempfile::TempDir,
}

/// The binary with the upstream as its OpenAI-compatible provider;
/// `extra` goes into its config file.
async fn serve(upstream: &str, extra: &str) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let config =
        format!("default_model = \"windowed\"\n[openai]\nbase_url = \"{upstream}/v1\"\n{extra}\n");
    std::fs::write(dir.path().join("conclave.toml"), config).unwrap();
    let mut command = serve_command(&["--config", "conclave.toml", "--sandbox", "local"]);
    command.current_dir(dir.path());
    let (child, base) = spawn_server(&mut command).await;
    Server {
        child,
        base,
        _dir: dir,
    }
}

impl Server {
    async fn create(&self, body: Value) -> String {
        let response = reqwest::Client::new()
            .post(format!("{}/agent/session", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        response.json::<Value>().await.unwrap()["session_id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn post_events(&self, path: &str, body: Value) -> Vec<Value> {
        let response = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let text = response.text().await.unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    async fn turn(&self, id: &str, prompt: &str) -> Vec<Value> {
        let path = format!("/agent/session/{id}/message");
        self.post_events(&path, json!({ "prompt": prompt })).await
    }

    async fn status(&self, id: &str) -> Value {
        let url = format!("{}/agent/session/{id}/status", self.base);
        reqwest::get(url).await.unwrap().json().await.unwrap()
    }
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

fn result(events: &[Value]) -> &Value {
    events.last().filter(|e| e["type"] == "result").unwrap()
}

/// The agent's requests (not the summaries) that were answered.
fn agent_requests(seen: &Seen) -> Vec<(Value, u64)> {
    seen.requests
        .lock()
        .unwrap()
        .iter()
        .filter(|(body, _, refused)| !refused && !is_summary(body))
        .map(|(body, tokens, _)| (body.clone(), *tokens))
        .collect()
}

#[tokio::test]
async fn sixty_turns_outgrow_a_16k_window_and_all_succeed() {
    let (url, seen) = upstream(WINDOW).await;
    // Every turn end's workspace is kept, for the fork below.
    let server = serve(&url, "[sandbox.snapshots]\nkeep_last = 64\n").await;
    let id = server.create(json!({})).await;
    let mut compactions = Vec::new();
    let (mut first_compacted, mut ends) = (None, Vec::new());
    for step in 0..60 {
        let events = server.turn(&id, &format!("step {step}")).await;
        let end = result(&events);
        assert_eq!(end["status"], "success", "step {step}: {events:?}");
        assert_eq!(end["result"], format!("done {step}"));
        ends.push(end["seq"].as_u64().unwrap());
        let found = of_type(&events, "compacted");
        if !found.is_empty() && first_compacted.is_none() {
            first_compacted = Some(step);
        }
        compactions.extend(found.into_iter().cloned());
        assert_eq!(end["context"]["window"], WINDOW);
        assert_eq!(end["context"]["window_source"], "provider");
    }
    assert!(compactions.len() >= 5, "{compactions:?}");
    for compacted in &compactions {
        assert_eq!(compacted["reason"], "auto");
        assert!(compacted["after_tokens"].as_u64() < compacted["before_tokens"].as_u64());
        assert!(compacted["messages_summarised"].as_u64().unwrap() > 0);
    }
    let requests = seen.requests.lock().unwrap().clone();
    assert!(
        requests
            .iter()
            .all(|(_, tokens, refused)| !refused && *tokens <= WINDOW)
    );
    // The last request: the summary, then the last turns word for word.
    let (last, _) = agent_requests(&seen).pop().unwrap();
    let messages = last["messages"].as_array().unwrap();
    let texts: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(texts.iter().any(|t| t.contains("SUMMARY:")), "{texts:?}");
    for recent in ["step 58", "done 58", "step 59"] {
        assert!(texts.contains(&recent), "{recent} in {texts:?}");
    }
    assert!(!texts.contains(&"step 0"));
    let output = "x".repeat(4096);
    assert!(texts.iter().any(|t| t.contains(&output)), "{texts:?}");
    // The status says how full the window is; the stored history keeps
    // every message, with the marks.
    let status = server.status(&id).await;
    assert_eq!(status["context"]["window"], WINDOW);
    let fill = status["context"]["fill"].as_f64().unwrap();
    assert!(fill > 0.0 && fill < 1.0, "{status}");
    let history = status["history"].as_array().unwrap();
    assert!(history.iter().any(|m| m["content"] == "step 0"));
    let marks = history.iter().filter(|m| m["role"] == "compacted").count();
    assert_eq!(marks, compactions.len());

    // A fork at a turn end two turns before the first compaction has the
    // history as it was there: its next turn, the one that did not compact
    // here either, sends it whole, from `step 0`.
    let step = first_compacted.unwrap();
    assert!(step >= 2, "{step}");
    let fork = reqwest::Client::new()
        .post(format!("{}/agent/session/{id}/fork", server.base))
        .json(&json!({ "at_seq": ends[step - 2] }))
        .send()
        .await
        .unwrap();
    let status = fork.status();
    let fork: Value = fork.json().await.unwrap();
    assert_eq!(status, 201, "{fork}");
    let forked = fork["sessions"][0]["session_id"].as_str().unwrap();
    let fork_history = server.status(forked).await["history"].clone();
    let fork_history = fork_history.as_array().unwrap();
    assert_eq!(fork_history.len(), 4 * (step - 1));
    assert!(fork_history.iter().all(|m| m["role"] != "compacted"));
    let events = server.turn(forked, &format!("step {}", step - 1)).await;
    assert_eq!(result(&events)["status"], "success", "{events:?}");
    assert!(of_type(&events, "compacted").is_empty());
    let sent: Vec<(Value, u64)> = agent_requests(&seen)
        .into_iter()
        .filter(|(body, _)| body["user"] == forked)
        .collect();
    assert_eq!(sent.len(), 2);
    for (body, _) in &sent {
        assert_eq!(body["messages"][1]["content"], "step 0");
    }

    // Compaction on request.
    let events = server
        .post_events(&format!("/agent/session/{id}/compact"), json!({}))
        .await;
    let compacted = of_type(&events, "compacted");
    assert_eq!(compacted.len(), 1, "{events:?}");
    assert_eq!(compacted[0]["reason"], "request");
    assert_eq!(result(&events)["status"], "success");
    let unknown = reqwest::Client::new()
        .post(format!(
            "{}/agent/session/00000000-0000-0000-0000-000000000000/compact",
            server.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let mut child = server.child;
    stop(&mut child).await;
}

#[tokio::test]
async fn with_compaction_off_the_overflowing_turn_ends_context_exceeded() {
    let (url, seen) = upstream(WINDOW).await;
    let server = serve(&url, "").await;
    let id = server
        .create(json!({"options": {"compaction": "off"}}))
        .await;
    let mut ended = None;
    for step in 0..30 {
        let events = server.turn(&id, &format!("step {step}")).await;
        if result(&events)["status"] != "success" {
            ended = Some(events);
            break;
        }
        assert!(of_type(&events, "compacted").is_empty());
    }
    let events = ended.expect("a turn past the window");
    assert_eq!(result(&events)["status"], "error");
    let error = of_type(&events, "error")[0];
    assert_eq!(error["code"], "context_exceeded");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("context window of 16384 tokens"),
        "{message}"
    );
    assert!(message.contains("compaction is off"), "{message}");
    let refused = seen.requests.lock().unwrap().iter().filter(|r| r.2).count();
    assert_eq!(refused, 1);
    let mut child = server.child;
    stop(&mut child).await;
}

#[tokio::test]
async fn a_providers_refusal_is_recovered_by_one_compaction_and_a_retry() {
    let (url, seen) = upstream(WINDOW).await;
    // The config says the window is four times what the upstream takes:
    // nothing compacts before the upstream refuses.
    let extra = "[models.windowed]\nprovider = \"openai\"\nmodel = \"windowed\"\n\
                 context_window = 65536\n";
    let server = serve(&url, extra).await;
    let id = server.create(json!({})).await;
    let mut recovered = None;
    for step in 0..30 {
        let events = server.turn(&id, &format!("step {step}")).await;
        let end = result(&events);
        assert_eq!(end["status"], "success", "step {step}: {events:?}");
        assert_eq!(end["context"]["window_source"], "config");
        if let Some(compacted) = of_type(&events, "compacted").first() {
            recovered = Some((*compacted).clone());
            break;
        }
    }
    let compacted = recovered.expect("a compaction after the refusal");
    assert_eq!(compacted["reason"], "context_error");
    let requests = seen.requests.lock().unwrap().clone();
    let refused: Vec<usize> = (0..requests.len()).filter(|i| requests[*i].2).collect();
    assert_eq!(refused.len(), 1, "one refusal");
    // Then the summary, then the same call again, within the window.
    let after = &requests[refused[0] + 1..];
    assert!(is_summary(&after[0].0));
    assert!(!is_summary(&after[1].0) && after[1].1 <= WINDOW);
    let mut child = server.child;
    stop(&mut child).await;
}

#[tokio::test]
async fn a_long_output_reaches_the_model_as_head_and_tail_and_is_kept_whole() {
    let command = "python3 -c \"import sys; print('HEAD'); print('x' * 200000); \
                   print('THE ERROR', file=sys.stderr); sys.exit(1)\"";
    let path = "/workspace/.conclave/outputs/c1.txt";
    let upstream = scripted::Upstream::start(vec![
        scripted::tool_call("c1", "Bash", json!({ "command": command })),
        scripted::tool_call(
            "c2",
            "Read",
            json!({"file_path": path, "offset": 1, "limit": 5}),
        ),
        scripted::says("seen"),
    ])
    .await;
    let extra = "[models.windowed]\nprovider = \"openai\"\nmodel = \"windowed\"\n\
                 context_window = 32768\n";
    let server = serve(&upstream.url, extra).await;
    let id = server.create(json!({})).await;
    let events = server.turn(&id, "run it").await;
    assert_eq!(result(&events)["status"], "success", "{events:?}");
    let requests = upstream.requests();
    let answer = |request: usize, call: &str| -> String {
        let messages = requests[request].body["messages"].as_array().unwrap();
        let message = messages.iter().find(|m| m["tool_call_id"] == call).unwrap();
        message["content"].as_str().unwrap().to_owned()
    };
    let seen = answer(1, "c1");
    // A quarter of the room: (32768 - 4096) / 4 tokens of 3 bytes.
    assert!(seen.len() < 21_504 + 300, "{}", seen.len());
    assert!(seen.contains("HEAD"), "the head");
    assert!(seen.contains("THE ERROR"), "the tail, where the error is");
    let note = seen
        .find("left out")
        .map(|at| &seen[at - 20..(at + 300).min(seen.len())]);
    assert!(
        seen.contains("bytes left out; the whole output"),
        "{note:?}"
    );
    assert!(seen.contains(path));
    // The event keeps what it kept: the output cut at its end.
    let event = of_type(&events, "tool_result")[0]["output"].to_string();
    assert!(event.contains("truncated") && event.len() < 70_000);
    let read = answer(2, "c2");
    assert!(
        read.contains("HEAD") && !read.contains("THE ERROR"),
        "{read:.300}"
    );
    let url = format!(
        "{}/agent/session/{id}/files/.conclave/outputs/c1.txt",
        server.base
    );
    let whole = reqwest::get(url).await.unwrap().text().await.unwrap();
    assert!(
        whole.len() > 200_000 && whole.contains("THE ERROR"),
        "{}",
        whole.len()
    );
    // The server's own file is not the turn's change.
    assert_eq!(result(&events)["files_changed"]["added"], 0);
    let mut child = server.child;
    stop(&mut child).await;
}

/// An Anthropic Messages reply of `text` alone.
fn claude_says(text: &str) -> scripted::Reply {
    let event = scripted::event;
    scripted::Reply::sse(vec![
        event(
            "message_start",
            &json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "content": [], "model": "claude-sonnet-4-5",
                "stop_reason": null, "usage": {"input_tokens": 50, "output_tokens": 1}}}),
        ),
        event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
        ),
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": text}}),
        ),
        event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        ),
        event(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": 3}}),
        ),
        event("message_stop", &json!({"type": "message_stop"})),
    ])
}

#[tokio::test]
async fn anthropics_prompt_is_too_long_is_recovered_the_same_way() {
    let too_long = r#"{"type": "error", "error": {"type": "invalid_request_error",
        "message": "prompt is too long: 201234 tokens > 200000 maximum"}}"#;
    let upstream = scripted::Upstream::start(vec![
        claude_says("ok 1"),
        claude_says("ok 2"),
        claude_says("ok 3"),
        claude_says("ok 4"),
        scripted::Reply::status(400, too_long),
        claude_says("SUMMARY: the first turn said hello."),
        claude_says("ok 5"),
    ])
    .await;
    let extra = format!(
        "[anthropic]\nbase_url = \"{}\"\napi_key = \"ak-test\"\n",
        upstream.url
    );
    let server = serve("http://127.0.0.1:9", &extra).await;
    let id = server
        .create(json!({"model": "sonnet", "allowed_tools": []}))
        .await;
    for n in 1..=4 {
        let events = server.turn(&id, &format!("turn {n}")).await;
        assert_eq!(result(&events)["result"], format!("ok {n}"), "{events:?}");
    }
    let events = server.turn(&id, "turn 5").await;
    assert_eq!(result(&events)["status"], "success", "{events:?}");
    assert_eq!(result(&events)["result"], "ok 5");
    // Anthropic's protocol at a URL of its own: no built-in window.
    assert_eq!(result(&events)["context"]["window_source"], "default");
    let compacted = of_type(&events, "compacted");
    assert_eq!(compacted.len(), 1);
    assert_eq!(compacted[0]["reason"], "context_error");
    // The retry: the summary first, then the last three turns (this one
    // among them) as they were.
    let requests = upstream.requests();
    let retry = &requests.last().unwrap().body["messages"];
    let first = retry[0]["content"].to_string();
    assert!(
        first.contains("SUMMARY: the first turn said hello."),
        "{retry}"
    );
    assert!(first.contains("turn 3"), "{retry}");
    for gone in ["\"turn 1\"", "\"turn 2\""] {
        assert!(!retry.to_string().contains(gone), "{retry}");
    }
    let mut child = server.child;
    stop(&mut child).await;
}

/// A Messages API reply: the blocks' events given, with the usage given.
fn claude_reply(blocks: Vec<String>, usage: Value) -> scripted::Reply {
    let event = scripted::event;
    let mut events = vec![event(
        "message_start",
        &json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "content": [], "model": "claude-sonnet-4-5",
            "stop_reason": null, "usage": usage}}),
    )];
    events.extend(blocks);
    events.push(event(
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 20}}),
    ));
    events.push(event("message_stop", &json!({"type": "message_stop"})));
    scripted::Reply::sse(events)
}

fn block(index: u32, start: Value, deltas: &[Value]) -> Vec<String> {
    let event = scripted::event;
    let mut events = vec![event(
        "content_block_start",
        &json!({"type": "content_block_start", "index": index, "content_block": start}),
    )];
    for delta in deltas {
        events.push(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }
    events.push(event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": index}),
    ));
    events
}

#[tokio::test]
async fn anthropic_thinking_is_kept_and_the_prompt_cache_is_marked_counted_and_priced() {
    let thought = [
        block(
            0,
            json!({"type": "thinking", "thinking": ""}),
            &[
                json!({"type": "thinking_delta", "thinking": "Say hi "}),
                json!({"type": "thinking_delta", "thinking": "briefly."}),
                json!({"type": "signature_delta", "signature": "sig-1"}),
            ],
        ),
        block(
            1,
            json!({"type": "text", "text": ""}),
            &[json!({"type": "text_delta", "text": "hi"})],
        ),
    ]
    .concat();
    let upstream = scripted::Upstream::start(vec![
        claude_reply(
            thought,
            json!({"input_tokens": 10, "cache_creation_input_tokens": 1000, "output_tokens": 1}),
        ),
        claude_reply(
            block(
                0,
                json!({"type": "text", "text": ""}),
                &[json!({"type": "text_delta", "text": "bye"})],
            ),
            json!({"input_tokens": 30, "cache_read_input_tokens": 1000, "output_tokens": 1}),
        ),
    ])
    .await;
    let extra = format!(
        "[anthropic]\nbase_url = \"{}\"\napi_key = \"ak-test\"\n\
         [prices.claude-sonnet-4-5]\ninput_per_mtok = 3.0\noutput_per_mtok = 15.0\n\
         cache_read_per_mtok = 0.3\ncache_write_per_mtok = 3.75\n",
        upstream.url
    );
    let server = serve("http://127.0.0.1:9", &extra).await;
    let id = server
        .create(json!({"model": "sonnet", "text_deltas": true,
            "reasoning": {"budget_tokens": 2048}}))
        .await;

    let events = server.turn(&id, "greet me").await;
    let reasoning: Vec<&Value> = events.iter().filter(|e| e["reasoning"] == true).collect();
    let kinds: Vec<&str> = reasoning
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["text_delta", "text_delta", "thinking"],
        "{events:?}"
    );
    assert_eq!(reasoning[2]["content"], "Say hi briefly.");
    let end = result(&events);
    assert_eq!(end["result"], "hi");
    assert_eq!(end["usage"]["input_tokens"], 1010);
    assert_eq!(end["usage"]["cache_write_tokens"], 1000);
    assert!(end["usage"].get("cache_read_tokens").is_none(), "{end}");
    let cost = (10.0 * 3.0 + 1000.0 * 3.75 + 20.0 * 15.0) / 1e6;
    assert!(
        (end["usage"]["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-12,
        "{end}"
    );

    let events = server.turn(&id, "bye now").await;
    let end = result(&events);
    assert_eq!(end["usage"]["cache_read_tokens"], 1000);
    let cost = (30.0 * 3.0 + 1000.0 * 0.3 + 20.0 * 15.0) / 1e6;
    assert!(
        (end["usage"]["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-12,
        "{end}"
    );

    let requests = upstream.requests();
    assert_eq!(
        requests[0].body["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    // The signed thinking goes back with the reply it came with.
    assert_eq!(
        requests[1].body["messages"][1]["content"][0],
        json!({"type": "thinking", "thinking": "Say hi briefly.", "signature": "sig-1"})
    );
    for request in &requests {
        let marks = request.body.to_string().matches("cache_control").count();
        assert!(
            (1..=4).contains(&marks),
            "{marks} breakpoints: {}",
            request.body
        );
    }
    let status = server.status(&id).await;
    assert_eq!(status["history"][1]["role"], "reasoning", "{status}");
    assert_eq!(status["history"][1]["signature"], "sig-1");
    assert_eq!(status["usage"]["cache_read_tokens"], 1000);
    assert_eq!(status["usage"]["cache_write_tokens"], 1000);
    let mut child = server.child;
    stop(&mut child).await;
}

#[tokio::test]
async fn openai_reasoning_content_arrives_as_thinking_and_effort_is_sent() {
    use scripted::{Reply, content, data, delta, end, finish};
    let upstream = scripted::Upstream::start(vec![Reply::sse(vec![
        delta(json!({"role": "assistant", "reasoning_content": "Two plus two "})),
        delta(json!({"reasoning_content": "is four."})),
        content("4"),
        finish("stop"),
        data(
            &json!({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 32}}}),
        ),
        end(),
    ])])
    .await;
    let server = serve(&upstream.url, "").await;
    let refused = reqwest::Client::new()
        .post(format!("{}/agent/session", server.base))
        .json(&json!({"reasoning": {"budget_tokens": 100}}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    let body: Value = refused.json().await.unwrap();
    assert!(
        body.to_string().contains("reasoning.budget_tokens"),
        "{body}"
    );

    let id = server
        .create(json!({"model": "windowed", "reasoning": {"effort": "low"}}))
        .await;
    let events = server.turn(&id, "two plus two?").await;
    // The reasoning, then the answer: both `thinking`, the first marked.
    let thinking = of_type(&events, "thinking");
    assert_eq!(thinking.len(), 2, "{events:?}");
    assert_eq!(thinking[0]["reasoning"], true);
    assert_eq!(thinking[0]["content"], "Two plus two is four.");
    assert!(thinking[1].get("reasoning").is_none(), "{events:?}");
    assert_eq!(thinking[1]["content"], "4");
    let end = result(&events);
    assert_eq!(end["result"], "4");
    assert_eq!(end["usage"]["cache_read_tokens"], 32);
    let requests = upstream.requests();
    let asked = requests
        .iter()
        .find(|r| r.path.ends_with("/chat/completions"))
        .unwrap();
    assert_eq!(asked.body["reasoning_effort"], "low");
    let mut child = server.child;
    stop(&mut child).await;
}
