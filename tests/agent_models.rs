//! The turn loop against scripted model upstreams, through the real server:
//! a broken stream closes the turn with an `error` event and an `error`
//! result and the server goes on; an OpenAI tool call runs through the
//! tool router and its result goes back to the model. The small harness's
//! aids, each against the replies a small model writes (calls as text,
//! loops, repeats, empty replies), and what it says it did.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use common::{TestServer, ndjson, stable, types};
use conclave::config::{HarnessKind, ModelAlias, ProviderKind};
use serde_json::{Value, json};
use upstream::{Reply, Upstream, chunk_usage, content, delta, end, finish};

async fn server_for(upstream: &Upstream) -> TestServer {
    server_answering(upstream, HarnessKind::Strict).await
}

/// The `scripted` model, under the harness given.
async fn server_answering(upstream: &Upstream, harness: HarnessKind) -> TestServer {
    let base_url = format!("{}/v1", upstream.url);
    TestServer::start_with(move |c| {
        c.models.insert(
            "scripted".into(),
            ModelAlias {
                provider: ProviderKind::Openai,
                model: "small-model".into(),
                base_url: Some(base_url),
                api_key: None,
                harness: Some(harness),
                ..Default::default()
            },
        );
    })
    .await
}

#[tokio::test]
async fn a_malformed_stream_is_an_error_event_and_a_closed_turn() {
    let upstream = Upstream::start(vec![
        Reply::sse(vec![
            content("par"),
            "data: {\"choices\": [oops\n\n".into(),
            content("never"),
        ]),
        Reply::sse(vec![
            content("fine"),
            finish("stop"),
            chunk_usage(3, 1),
            end(),
        ]),
    ])
    .await;
    let server = server_for(&upstream).await;
    let id = server.create_session(json!({"model": "scripted"})).await;

    let broken = server.turn(&id, "hi").await;
    assert_eq!(types(&broken), vec!["status", "error", "result"]);
    assert_eq!(broken[1]["code"], "model_protocol_error");
    assert_eq!(broken[2]["status"], "error");

    let health = server.get("/health").await;
    assert_eq!(health.status(), 200);
    let next = server.turn(&id, "again").await;
    assert_eq!(next.last().unwrap()["status"], "success");
    assert_eq!(next.last().unwrap()["result"], "fine");
    server.stop().await;
}

#[tokio::test]
async fn an_openai_tool_call_runs_and_its_result_goes_back_to_the_model() {
    let call = |index: u32, piece: Value| {
        delta(json!({"tool_calls": [{"index": index, "function": piece}]}))
    };
    let upstream = Upstream::start(vec![
        Reply::sse(vec![
            delta(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "Bash", "arguments": ""}}]}),
            ),
            call(0, json!({"arguments": "{\"comm"})),
            call(0, json!({"arguments": "and\": \"ls\"}"})),
            finish("tool_calls"),
            chunk_usage(10, 5),
            end(),
        ]),
        Reply::sse(vec![
            content("Done."),
            finish("stop"),
            chunk_usage(20, 2),
            end(),
        ]),
    ])
    .await;
    let server = server_for(&upstream).await;
    let events = ndjson(
        server
            .post(
                "/agent/run",
                json!({"prompt": "list files", "model": "scripted"}),
            )
            .await,
    )
    .await;
    let stable: Vec<Value> = events.iter().map(stable).collect();
    assert_eq!(
        stable,
        vec![
            json!({"type": "status", "message": "Starting agent...", "seq": 1}),
            json!({"type": "tool_use", "id": "call_1", "tool": "Bash", "input": {"command": "ls"}, "seq": 2}),
            json!({"type": "tool_result", "id": "call_1", "tool": "Bash", "output": "ran: ls", "is_error": false, "seq": 3}),
            json!({"type": "thinking", "content": "Done.", "seq": 4}),
            json!({"type": "result", "status": "success", "result": "Done.", "cost_usd": 0.0, "cost_known": false,
                   "turns": 2, "usage": {"input_tokens": 30, "output_tokens": 7, "cost_usd": 0.0, "turns": 2, "tool_calls": 1},
                   "history_len": 4, "seq": 5}),
        ]
    );
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    let session_id = events[0]["session_id"].as_str().unwrap();
    assert_eq!(requests[0].headers["x-session-id"], session_id);
    let messages = requests[1].body["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(
        json!(messages[1..]),
        json!([
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ran: ls"},
        ])
    );
    server.stop().await;
}

/// A session that gives no system prompt still tells the model its
/// workspace (the small harness adds its tools, whose `tools` field small
/// models' chat templates often drop, and a worked call), and a model call
/// is capped by `agent.max_tokens` unless the session says otherwise; a
/// session's own prompt and cap replace both.
#[tokio::test]
async fn model_calls_get_a_default_system_prompt_and_token_cap() {
    let done = || {
        Reply::sse(vec![
            content("ok"),
            finish("stop"),
            chunk_usage(1, 1),
            end(),
        ])
    };
    let upstream = Upstream::start(vec![done(), done(), done()]).await;
    let server = server_for(&upstream).await;
    for body in [
        json!({"prompt": "hi", "model": "scripted"}),
        json!({"prompt": "hi", "model": "scripted", "system_prompt": "Be brief.", "max_tokens": 50}),
    ] {
        let events = ndjson(server.post("/agent/run", body).await).await;
        assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
    }
    server.stop().await;
    let small = server_answering(&upstream, HarnessKind::Small).await;
    ndjson(
        small
            .post("/agent/run", json!({"prompt": "hi", "model": "scripted"}))
            .await,
    )
    .await;
    small.stop().await;
    let requests = upstream.requests();
    let first = &requests[0].body;
    assert_eq!(first["max_tokens"], 4096, "{first}");
    assert_eq!(
        first["messages"][0],
        json!({"role": "system", "content": "You are an agent with tools that run in a sandbox. Your workspace is /workspace."})
    );
    let second = &requests[1].body;
    assert_eq!(second["max_tokens"], 50, "{second}");
    assert_eq!(
        second["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    let system = requests[2].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        system.starts_with("You are an agent with tools that run in a sandbox.")
            && system.contains("- Bash: Echoes the command back"),
        "{system}"
    );
    // A worked call, in the shape a small model copies.
    assert!(
        system.contains(
            "You call: {\"name\": \"Bash\", \"arguments\": {\"command\":\"wc -l < notes.txt\"}}"
        ),
        "{system}"
    );
}

/// Model replies written as text, as a small model writes them, under the
/// small harness, and the turn's events.
async fn turn_with_replies(replies: Vec<Reply>) -> (Vec<Value>, Upstream) {
    run_turn(
        replies,
        HarnessKind::Small,
        json!({"prompt": "go", "model": "scripted"}),
    )
    .await
}

/// One `/agent/run` of `body` against `replies`, with the `scripted`
/// model under `harness`.
async fn run_turn(
    replies: Vec<Reply>,
    harness: HarnessKind,
    body: Value,
) -> (Vec<Value>, Upstream) {
    let upstream = Upstream::start(replies).await;
    let server = server_answering(&upstream, harness).await;
    let events = ndjson(server.post("/agent/run", body).await).await;
    server.stop().await;
    (events, upstream)
}

fn says(text: &str) -> Reply {
    Reply::sse(vec![
        content(text),
        finish("stop"),
        chunk_usage(5, 5),
        end(),
    ])
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The `kind`s of a turn's `intervention` events, in order.
fn interventions(events: &[Value]) -> Vec<&str> {
    of_type(events, "intervention")
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect()
}

/// A reply that is one native tool call.
fn calls(name: &str, arguments: &str) -> Reply {
    Reply::sse(vec![
        delta(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": name, "arguments": arguments}}]}),
        ),
        finish("tool_calls"),
        chunk_usage(5, 5),
        end(),
    ])
}

/// `"timeout": "5"` is read as 5, an unknown field is dropped, and the
/// tool result says so; a value that cannot be read is refused with the
/// expected shape, which the model sees.
#[tokio::test]
async fn arguments_are_coerced_to_the_schema_and_the_result_says_so() {
    let (events, upstream) = turn_with_replies(vec![
        says(
            r#"{"name": "Bash", "arguments": {"command": "ls", "timeout": "5", "colour": "red"}}"#,
        ),
        says(r#"{"name": "Bash", "arguments": {"command": "ls", "timeout": "soon"}}"#),
        says("Done."),
    ])
    .await;
    let results = of_type(&events, "tool_result");
    assert_eq!(results.len(), 2, "{events:?}");
    let first = results[0]["output"].as_str().unwrap();
    assert!(first.starts_with("ran: ls"), "{first}");
    assert!(first.contains("'timeout': \"5\" was read as 5"), "{first}");
    assert!(
        first.contains("dropped unknown argument 'colour'"),
        "{first}"
    );
    assert_eq!(results[1]["is_error"], true);
    let refused = results[1]["output"].as_str().unwrap();
    assert!(
        refused.contains("'timeout' is \"soon\"") && refused.contains("command: string"),
        "{refused}"
    );
    assert_eq!(events.last().unwrap()["result"], "Done.");
    // The model read the refusal.
    let third = &upstream.requests()[2].body["messages"];
    assert!(third.to_string().contains("soon"), "{third}");
}

/// A reply that repeats one call 170 times runs it once; distinct calls
/// past `agent.max_tool_calls_per_reply` (8) are dropped; a status event
/// says what went.
#[tokio::test]
async fn repeated_and_excess_calls_in_one_reply_are_bounded() {
    let line = r#"{"name": "Bash", "arguments": {"command": "ls"}}"#;
    let repeated = vec![line; 170].join("\n");
    let distinct: Vec<String> = (0..10)
        .map(|i| format!(r#"{{"name": "Bash", "arguments": {{"command": "echo {i}"}}}}"#))
        .collect();
    let (events, _) = turn_with_replies(vec![
        says(&repeated),
        says(&distinct.join("\n")),
        says("Done."),
    ])
    .await;
    let uses = of_type(&events, "tool_use");
    assert_eq!(uses.len(), 1 + 8, "{events:?}");
    let notes: Vec<&str> = of_type(&events, "status")
        .iter()
        .filter_map(|e| e["message"].as_str())
        .filter(|m| m.contains("in one reply"))
        .collect();
    assert!(
        notes[0].contains("169 repeated call(s) collapsed"),
        "{notes:?}"
    );
    assert!(
        notes[1].contains("2 call(s) past agent.max_tool_calls_per_reply (8)"),
        "{notes:?}"
    );
    assert_eq!(events.last().unwrap()["status"], "success");
}

/// The replies Qwen2.5-Coder-0.5B wrote: a stray bracket, a fenced block
/// naming the tool by another case, a name the tool's description
/// mentions; each runs the tool.
#[tokio::test]
async fn malformed_and_misnamed_calls_still_run() {
    let (events, _) = turn_with_replies(vec![
        says(r#"{"name": "Bash", "arguments": {"command": "one"}]}"#),
        says("```json\n{\"name\": \"bash\", \"arguments\": {\"command\": \"two\"}}\n```"),
        says(r#"{"name": "echoes", "arguments": {"command": "three"}}"#),
        says("Done."),
    ])
    .await;
    let outputs: Vec<String> = of_type(&events, "tool_result")
        .iter()
        .map(|e| {
            e["output"]
                .as_str()
                .unwrap()
                .lines()
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        outputs,
        ["ran: one", "ran: two", "ran: three"],
        "{events:?}"
    );
    assert_eq!(events.last().unwrap()["result"], "Done.");
}

/// A reply that meant to call a tool and cannot be read gets one more try
/// with the format spelled out; a second unreadable one ends the turn.
#[tokio::test]
async fn an_unreadable_call_is_retried_once() {
    let unreadable = "```json\n{\"tool\": ???}\n```";
    let (events, upstream) = turn_with_replies(vec![says(unreadable), says("Done.")]).await;
    assert_eq!(events.last().unwrap()["result"], "Done.", "{events:?}");
    let nudge = upstream.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(nudge["role"], "user");
    assert!(
        nudge["content"]
            .as_str()
            .unwrap()
            .contains("could not be read as a tool call"),
        "{nudge}"
    );
    let (events, upstream) =
        turn_with_replies(vec![says(unreadable), says(unreadable), says("never")]).await;
    assert_eq!(events.last().unwrap()["result"], unreadable);
    assert_eq!(upstream.requests().len(), 2);
}

/// An empty reply after a call answers nothing: it is not kept, and the same request goes again, with a new
/// seed each time and some temperature.
#[tokio::test]
async fn an_empty_reply_is_asked_again() {
    let call = r#"{"name": "Bash", "arguments": {"command": "ls"}}"#;
    let empty = || Reply::sse(vec![finish("stop"), chunk_usage(5, 1), end()]);
    let replies = vec![says(call), empty(), empty(), says("Done.")];
    let (events, upstream) = turn_with_replies(replies).await;
    assert_eq!(events.last().unwrap()["result"], "Done.", "{events:?}");
    let requests = upstream.requests();
    assert_eq!(requests.len(), 4);
    let body = |i: usize| &requests[i].body;
    assert_eq!(body(2)["messages"], body(1)["messages"]);
    assert_eq!(body(3)["messages"], body(1)["messages"]);
    assert!(body(1).get("seed").is_none(), "{}", body(1));
    assert!(body(2)["seed"].is_u64() && body(3)["seed"].is_u64());
    assert_ne!(body(2)["seed"], body(3)["seed"]);
    assert_eq!(body(3)["temperature"], json!(0.7));
}

/// The same call asked for again in a later reply runs again (a shell
/// call may change what it prints); different calls printing the same
/// output get a note that it may be the answer, and the third time the
/// harness takes it as the answer and says so.
#[tokio::test]
async fn an_output_printed_three_times_settles_the_answer() {
    let call = r#"{"name": "Bash", "arguments": {"command": "ls"}}"#;
    let (events, _) = turn_with_replies(vec![says(call), says(call), says("Done.")]).await;
    let results = of_type(&events, "tool_result");
    assert_eq!(results.len(), 2);
    let second = results[1]["output"].as_str().unwrap();
    assert!(
        second.starts_with("ran: ls") && second.contains("printed the same as an earlier call"),
        "{second}"
    );
    assert_eq!(events.last().unwrap()["result"], "Done.");
    // Asked for a third time, its output is taken as the answer.
    let (events, upstream) =
        turn_with_replies(vec![says(call), says(call), says(call), says("never")]).await;
    assert_eq!(of_type(&events, "tool_result").len(), 3);
    assert_eq!(interventions(&events).last(), Some(&"answer_settled"));
    let result = events.last().unwrap();
    assert_eq!(
        (&result["status"], &result["result"]),
        (&json!("success"), &json!("ran: ls")),
        "{events:?}"
    );
    assert_eq!(upstream.requests().len(), 3);
    // Different calls that print the same (here the same command with
    // other timeouts) give the same answer again.
    let variant =
        |t: u32| format!(r#"{{"name": "Bash", "arguments": {{"command": "ls", "timeout": {t}}}}}"#);
    let (events, upstream) = turn_with_replies(vec![
        says(&variant(5)),
        says(&variant(6)),
        says(&variant(7)),
        says("never"),
    ])
    .await;
    let result = events.last().unwrap();
    assert_eq!(
        (&result["status"], &result["result"]),
        (&json!("success"), &json!("ran: ls")),
        "{events:?}"
    );
    assert_eq!(upstream.requests().len(), 3);
}

/// Under the small harness, the model call after a call that printed is
/// offered no tools, so the model answers; a call it writes anyway runs.
/// A call that printed nothing (here one refused) leaves the tools
/// offered. Under the strict one every call offers them.
#[tokio::test]
async fn after_a_printed_output_the_model_is_asked_for_its_answer() {
    let (events, upstream) = run_turn(
        vec![
            says(r#"{"name": "Bash", "arguments": {}}"#),
            says(r#"{"name": "Bash", "arguments": {"command": "ls"}}"#),
            says(r#"<tool_call>{"name": "Bash", "arguments": {"command": "pwd"}}</tool_call>"#),
            says("It printed: ran: pwd."),
        ],
        HarnessKind::Small,
        json!({"prompt": "go", "model": "scripted"}),
    )
    .await;
    let offered = |upstream: &Upstream| -> Vec<bool> {
        upstream
            .requests()
            .iter()
            .map(|r| r.body.get("tools").is_some())
            .collect()
    };
    assert_eq!(offered(&upstream), [true, true, false, false]);
    // Those two end by asking for the answer, which is sent, not kept.
    let requests = upstream.requests();
    let last_says = |i: usize| {
        let messages = requests[i].body["messages"].as_array().unwrap().clone();
        let last = messages.last().unwrap().clone();
        (
            messages.len(),
            last["role"].clone(),
            last["content"].to_string(),
        )
    };
    let (sent, role, text) = last_says(2);
    assert_eq!(role, "user");
    assert!(
        text.contains("The question was: go") && text.contains("Do not call a tool"),
        "{text}"
    );
    let (sent_next, _, _) = last_says(3);
    assert_eq!(
        sent_next,
        sent + 2,
        "the call and its result, no earlier ask"
    );
    assert_eq!(last_says(1).1, "tool");
    let results = of_type(&events, "tool_result");
    assert_eq!(results.len(), 3, "{events:?}");
    assert_eq!(results[0]["is_error"], true);
    assert_eq!(results[2]["output"], "ran: pwd");
    let result = events.last().unwrap();
    assert_eq!(
        (&result["status"], &result["result"]),
        (&json!("success"), &json!("It printed: ran: pwd.")),
        "{events:?}"
    );

    assert_eq!(
        interventions(&events)
            .into_iter()
            .filter(|k| *k == "answer_asked")
            .count(),
        2,
        "{events:?}"
    );

    let (events, upstream) = run_turn(
        vec![calls("Bash", r#"{"command": "ls"}"#), says("Done.")],
        HarnessKind::Strict,
        json!({"prompt": "go", "model": "scripted"}),
    )
    .await;
    assert_eq!(offered(&upstream), [true, true]);
    assert!(interventions(&events).is_empty(), "{events:?}");
}

/// Under the small harness, the calls of a reply after one that printed
/// are not run (a small model's later calls of a reply are variations that
/// print something else): each is answered as not run, an intervention
/// says so, and the next model call asks for the answer. A call before it
/// that printed nothing runs.
#[tokio::test]
async fn calls_after_one_that_printed_are_not_run() {
    let reply = [
        r#"{"name": "Bash", "arguments": {}}"#,
        r#"{"name": "Bash", "arguments": {"command": "pwd"}}"#,
        r#"{"name": "Bash", "arguments": {"command": "ls"}}"#,
        r#"{"name": "Bash", "arguments": {"command": "id"}}"#,
    ]
    .join("\n");
    let (events, upstream) = run_turn(
        vec![says(&reply), says("ran: pwd")],
        HarnessKind::Small,
        json!({"prompt": "go", "model": "scripted"}),
    )
    .await;
    let results = of_type(&events, "tool_result");
    assert_eq!(results.len(), 4, "{events:?}");
    assert_eq!(results[1]["output"], "ran: pwd");
    for skipped in &results[2..] {
        assert_eq!(
            skipped["output"],
            "not run: an earlier call of this reply printed its output"
        );
    }
    assert_eq!(
        interventions(&events),
        [
            "call_recovered",
            "calls_skipped",
            "calls_skipped",
            "answer_asked"
        ],
        "{events:?}"
    );
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[1].body.get("tools").is_none());
    let messages = requests[1].body["messages"].as_array().unwrap();
    let not_run: Vec<&Value> = messages
        .iter()
        .filter(|m| {
            m["role"] == "tool"
                && m["content"]
                    .as_str()
                    .unwrap()
                    .contains("not run: an earlier call of this reply printed its output")
        })
        .collect();
    assert_eq!(not_run.len(), 2, "{messages:?}");
    assert_eq!(events.last().unwrap()["result"], "ran: pwd");
}

/// A failing call asked for again as it was runs again; failing again, its
/// result says so, and the next model call ends with the error and an ask
/// for a fix, sent with some temperature, so a small model at its
/// server's default of 0 writes something else.
/// A session's own temperature is kept.
#[tokio::test]
async fn a_failing_call_repeated_as_it_was_varies_the_next_reply() {
    let refused = r#"{"name": "Bash", "arguments": {}}"#;
    let (events, upstream) =
        turn_with_replies(vec![says(refused), says(refused), says("Done.")]).await;
    let results = of_type(&events, "tool_result");
    assert_eq!(results.len(), 2, "{events:?}");
    let first = results[0]["output"].as_str().unwrap();
    let second = results[1]["output"].as_str().unwrap();
    assert!(!first.contains("already failed"), "{first}");
    assert!(second.contains("already failed in this turn"), "{second}");
    let temperatures: Vec<Value> = upstream
        .requests()
        .iter()
        .map(|r| r.body.get("temperature").cloned().unwrap_or(Value::Null))
        .collect();
    assert_eq!(temperatures, [Value::Null, Value::Null, json!(0.7)]);
    // And it is told so, with the error, in a message sent, not kept.
    let requests = upstream.requests();
    let last = |i: usize| requests[i].body["messages"].as_array().unwrap().clone();
    let told = last(2).last().unwrap().clone();
    assert_eq!(told["role"], "user");
    let told = told["content"].as_str().unwrap();
    assert!(
        told.contains("failed again, the same way") && told.contains("command"),
        "{told}"
    );
    assert_eq!(last(1).last().unwrap()["role"], "tool");

    let (_, upstream) = run_turn(
        vec![says(refused), says(refused), says("Done.")],
        HarnessKind::Small,
        json!({"prompt": "go", "model": "scripted", "temperature": 0.25}),
    )
    .await;
    let temperatures: Vec<Value> = upstream
        .requests()
        .iter()
        .map(|r| r.body["temperature"].clone())
        .collect();
    assert_eq!(temperatures, [json!(0.25), json!(0.25), json!(0.25)]);
}

/// A call that failed twice, asked for a third time as it was, is not run
/// and not kept: the model is asked for a fix again from the same history
/// (a small model at temperature 0 writes the same failing call until the
/// turn runs out).
#[tokio::test]
async fn a_call_that_failed_twice_is_not_run_a_third_time() {
    let refused = r#"{"name": "Bash", "arguments": {}}"#;
    let replies = vec![says(refused), says(refused), says(refused), says("Done.")];
    let (events, upstream) = turn_with_replies(replies).await;
    assert_eq!(of_type(&events, "tool_result").len(), 2, "{events:?}");
    assert_eq!(
        interventions(&events),
        [
            "call_recovered",
            "call_recovered",
            "fix_asked",
            "call_recovered",
            "reply_discarded",
            "fix_asked"
        ],
        "{events:?}"
    );
    assert_eq!(events.last().unwrap()["result"], "Done.");
    let requests = upstream.requests();
    assert_eq!(requests.len(), 4);
    // The fourth model call sees what the third saw: the third reply is
    // not in the history, and the ask for a fix is sent again.
    assert_eq!(requests[3].body["messages"], requests[2].body["messages"]);
    assert_eq!(requests[3].body["temperature"], json!(0.7));
    // With a new seed each time: a server started with a fixed one would
    // otherwise sample the same reply to the same request.
    assert!(requests[0].body.get("seed").is_none());
    assert!(requests[2].body["seed"].is_u64(), "{}", requests[2].body);
    assert_ne!(requests[3].body["seed"], requests[2].body["seed"]);
}

/// A call the model wrote as text, looping until its stream was cut, goes
/// back to it once, as a call: not also as the text it came from (which a
/// small model copies again).
#[tokio::test]
async fn a_call_written_as_text_goes_back_once_as_a_call() {
    let line = r#"{"name": "Bash", "arguments": {"command": "ls"}}"#;
    let looped = format!("{}\n{{\"name\": \"Ba", [line; 3].join("\n"));
    let (events, upstream) = turn_with_replies(vec![says(&looped), says("Done.")]).await;
    assert_eq!(events.last().unwrap()["result"], "Done.", "{events:?}");
    let second = &upstream.requests()[1].body["messages"];
    let assistant = &second[2];
    assert_eq!(assistant["role"], "assistant", "{second}");
    assert!(assistant["content"].is_null(), "{assistant}");
    assert_eq!(assistant["tool_calls"].as_array().unwrap().len(), 1);
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        r#"{"command":"ls"}"#
    );
}

/// A reply that loops (one call written 200 times) is cut while it
/// streams under the small harness, which says so and runs the call once;
/// under the strict one it arrives whole, as text, and nothing runs.
#[tokio::test]
async fn a_looping_reply_is_cut_only_under_the_small_harness() {
    let line = "{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n";
    let looping = || {
        let mut events: Vec<String> = (0..200).map(|_| content(line)).collect();
        events.extend([finish("length"), chunk_usage(5, 5), end()]);
        Reply::sse(events)
    };
    let body = json!({"prompt": "go", "model": "scripted"});
    let (events, _) = run_turn(
        vec![looping(), says("Done.")],
        HarnessKind::Small,
        body.clone(),
    )
    .await;
    assert_eq!(
        interventions(&events)[..2],
        ["reply_cut", "call_recovered"],
        "{events:?}"
    );
    assert_eq!(of_type(&events, "tool_result").len(), 1, "{events:?}");
    assert_eq!(events.last().unwrap()["result"], "Done.");
    let (events, _) = run_turn(vec![looping()], HarnessKind::Strict, body).await;
    assert!(of_type(&events, "tool_use").is_empty(), "{events:?}");
    assert_eq!(events.last().unwrap()["result"], line.repeat(200));
}
