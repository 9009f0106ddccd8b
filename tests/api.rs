//! The agent API against a real server on 127.0.0.1:0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Lines, TestServer, long_prompt, ndjson, stable, types};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as WsMessage;

fn error_of(body: &Value) -> (&str, &str) {
    (
        body["error"]["code"].as_str().unwrap_or(""),
        body["error"]["message"].as_str().unwrap_or(""),
    )
}

#[tokio::test]
async fn run_streams_ndjson_ending_in_one_result() {
    let server = TestServer::start().await;
    let response = server.post("/agent/run", json!({"prompt": "hello"})).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let events = ndjson(response).await;
    let stable: Vec<Value> = events.iter().map(stable).collect();
    assert_eq!(
        stable,
        vec![
            json!({"type": "status", "message": "Starting agent...", "seq": 1}),
            json!({"type": "thinking", "content": "You said: hello", "seq": 2}),
            json!({"type": "result", "status": "success", "result": "You said: hello",
                   "cost_usd": 0.0, "cost_known": true, "turns": 1,
                   "usage": {"input_tokens": 1, "output_tokens": 3, "cost_usd": 0.0, "turns": 1, "tool_calls": 0},
                   "history_len": 2, "seq": 3}),
        ]
    );
    let id = events[0]["session_id"].as_str().unwrap();
    assert!(
        events
            .iter()
            .all(|e| e["session_id"] == id && e["ts"].is_string())
    );
    server.stop().await;
}

#[tokio::test]
async fn tool_calls_go_through_the_router_and_back_to_the_model() {
    let server = TestServer::start().await;
    let events = ndjson(
        server
            .post("/agent/run", json!({"prompt": "$ echo hi"}))
            .await,
    )
    .await;
    let stable: Vec<Value> = events.iter().map(stable).collect();
    assert_eq!(
        stable,
        vec![
            json!({"type": "status", "message": "Starting agent...", "seq": 1}),
            json!({"type": "thinking", "content": "I'll run that with 1 tool call(s).", "seq": 2}),
            json!({"type": "tool_use", "id": "toolu_demo_1_1", "tool": "Bash", "input": {"command": "echo hi"}, "seq": 3}),
            json!({"type": "tool_result", "id": "toolu_demo_1_1", "tool": "Bash", "output": "ran: echo hi", "is_error": false, "seq": 4}),
            json!({"type": "thinking", "content": "The tool Bash returned: ran: echo hi", "seq": 5}),
            json!({"type": "result", "status": "success", "result": "The tool Bash returned: ran: echo hi",
                   "cost_usd": 0.0, "cost_known": true, "turns": 2,
                   "usage": {"input_tokens": 16, "output_tokens": 15, "cost_usd": 0.0, "turns": 2, "tool_calls": 1},
                   "history_len": 4, "seq": 6}),
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn options_are_accepted_flat_and_nested() {
    let server = TestServer::start().await;
    for body in [
        json!({"prompt": "$ ls", "max_turns": 1}),
        json!({"prompt": "$ ls", "options": {"max_turns": 1}}),
    ] {
        let events = ndjson(server.post("/agent/run", body).await).await;
        let result = events.last().unwrap();
        assert_eq!(result["status"], "max_turns", "{events:?}");
        assert_eq!(result["turns"], 1);
    }
    server.stop().await;
}

#[tokio::test]
async fn allowed_tools_filters_what_the_model_is_offered() {
    let server = TestServer::start().await;
    let events = ndjson(
        server
            .post(
                "/agent/run",
                json!({"prompt": "$ ls", "allowed_tools": ["Read"]}),
            )
            .await,
    )
    .await;
    assert_eq!(types(&events), vec!["status", "thinking", "result"]);
    assert_eq!(
        events[1]["content"],
        "I would run this with Bash, but that tool is not available in this session."
    );
    server.stop().await;
}

#[tokio::test]
async fn budget_stops_the_turn_and_unpriced_models_say_cost_is_unknown() {
    let server = TestServer::start_with(|c| {
        c.prices
            .insert("demo".into(), conclave::model::Price::new(1_000_000.0, 0.0));
        c.models.insert(
            "unpriced".into(),
            conclave::config::ModelAlias {
                provider: conclave::config::ProviderKind::Demo,
                model: "demo-unpriced".into(),
                base_url: None,
                api_key: None,
                ..Default::default()
            },
        );
    })
    .await;
    let events = ndjson(
        server
            .post(
                "/agent/run",
                json!({"prompt": "$ ls", "max_budget_usd": 0.5}),
            )
            .await,
    )
    .await;
    assert_eq!(types(&events), vec!["status", "thinking", "result"]);
    let result = events.last().unwrap();
    assert_eq!(result["status"], "budget_exceeded");
    assert_eq!(result["cost_usd"], 2.0, "two input words at $1 each");
    assert_eq!(result["cost_known"], true);

    let events = ndjson(
        server
            .post("/agent/run", json!({"prompt": "hi", "model": "unpriced"}))
            .await,
    )
    .await;
    let result = events.last().unwrap();
    assert_eq!(
        (
            result["status"].clone(),
            result["cost_usd"].clone(),
            result["cost_known"].clone()
        ),
        (json!("success"), json!(0.0), json!(false))
    );
    server.stop().await;
}

#[tokio::test]
async fn sse_when_the_client_asks_for_it() {
    let server = TestServer::start().await;
    let response = server
        .http
        .post(server.url("/agent/run"))
        .header("accept", "text/event-stream")
        .json(&json!({"prompt": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let text = response.text().await.unwrap();
    let frames: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|frame| frame.contains("data:"))
        .map(|frame| {
            let field = |name: &str| {
                frame
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_string())
                    .unwrap_or_default()
            };
            (
                field("event:"),
                serde_json::from_str(&field("data:")).unwrap(),
            )
        })
        .collect();
    let names: Vec<&str> = frames.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["status", "thinking", "result"]);
    assert_eq!(frames[2].1["status"], "success");
    server.stop().await;
}

#[tokio::test]
async fn session_lifecycle_message_status_events_delete() {
    let server = TestServer::start().await;
    let response = server
        .post(
            "/agent/session",
            json!({"session_name": "bugfix-auth-123", "options": {"system_prompt": "be brief"}}),
        )
        .await;
    assert_eq!(response.status(), 201);
    let created: Value = response.json().await.unwrap();
    let id = created["session_id"].as_str().unwrap().to_string();
    assert_eq!(
        created,
        json!({"session_id": id, "session_name": "bugfix-auth-123", "status": "created"})
    );

    let first = server.turn(&id, "one").await;
    let second = server.turn(&id, "two").await;
    assert_eq!(types(&first), vec!["status", "thinking", "result"]);
    assert_eq!(second[0]["seq"], 4, "seq continues across turns");

    let status: Value = server.status(&id).await;
    assert_eq!(status["status"], "idle");
    assert_eq!(status["session_name"], "bugfix-auth-123");
    assert_eq!(status["last_seq"], 6);
    assert_eq!(status["usage"]["turns"], 2);
    assert_eq!(
        status["history"],
        json!([
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "You said: one"},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": "You said: two"},
        ])
    );

    let replay = ndjson(
        server
            .get(&format!("/agent/session/{id}/events?since=3"))
            .await,
    )
    .await;
    assert_eq!(replay, second, "replay returns exactly what was streamed");

    let sessions: Value = server.get("/agent/sessions").await.json().await.unwrap();
    assert_eq!(sessions["sessions"][0]["session_id"], id.as_str());
    // The list shows what the kind adds, as the status does: the model.
    assert_eq!(sessions["sessions"][0]["model"], "demo");

    let deleted = server
        .http
        .delete(server.url(&format!("/agent/session/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    assert_eq!(
        deleted.json::<Value>().await.unwrap(),
        json!({"session_id": id, "status": "deleted"})
    );
    let gone = server.get(&format!("/agent/session/{id}/status")).await;
    assert_eq!(gone.status(), 404);
    server.stop().await;
}

#[tokio::test]
async fn second_message_while_running_is_409_and_interrupt_closes_the_turn() {
    let server = TestServer::start_with(|c| c.demo.chunk_delay_ms = 20).await;
    let id = server.create_session(json!({"text_deltas": true})).await;
    let running = server
        .message(&id, json!({"prompt": long_prompt(500)}))
        .await;
    let mut lines = Lines::new(running);
    lines.until("text_delta").await;

    let busy = server.message(&id, json!({"prompt": "again"})).await;
    assert_eq!(busy.status(), 409);
    let body: Value = busy.json().await.unwrap();
    assert_eq!(error_of(&body).0, "session_busy");

    let interrupted: Value = server
        .post(&format!("/agent/session/{id}/interrupt"), json!({}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(interrupted, json!({"session_id": id, "interrupted": true}));
    let rest = lines.until("result").await;
    assert_eq!(rest.last().unwrap()["status"], "interrupted");
    assert!(
        lines.next().await.is_none(),
        "the stream ends after the result"
    );

    let status: Value = server.status(&id).await;
    assert_eq!(
        (status["status"].clone(), status["running"].clone()),
        (json!("interrupted"), json!(false))
    );
    // The session takes the next message.
    let next = server.turn(&id, "go on").await;
    assert_eq!(next.last().unwrap()["status"], "success");
    server.stop().await;
}

#[tokio::test]
async fn interrupt_during_a_tool_call_stops_the_tool_and_the_turn() {
    let server = TestServer::start().await;
    let id = server.create_session(json!({})).await;
    let response = server.message(&id, json!({"prompt": "$ block"})).await;
    let mut lines = Lines::new(response);
    lines.until("tool_use").await;
    server
        .post(&format!("/agent/session/{id}/interrupt"), json!({}))
        .await;
    let rest: Vec<Value> = lines.until("result").await.iter().map(stable).collect();
    assert_eq!(
        rest,
        vec![
            json!({"type": "tool_result", "id": "toolu_demo_1_1", "tool": "Bash",
                   "output": "stopped: the turn was cancelled", "is_error": true, "seq": 4}),
            json!({"type": "result", "status": "interrupted", "result": "I'll run that with 1 tool call(s).",
                   "cost_usd": 0.0, "cost_known": true, "turns": 1,
                   "usage": {"input_tokens": 2, "output_tokens": 8, "cost_usd": 0.0, "turns": 1, "tool_calls": 1},
                   "history_len": 3, "seq": 5}),
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn queued_message_waits_for_the_running_turn() {
    let server = TestServer::start_with(|c| c.demo.chunk_delay_ms = 5).await;
    let id = server.create_session(json!({"text_deltas": true})).await;
    let first = server
        .message(&id, json!({"prompt": long_prompt(40)}))
        .await;
    let mut first = Lines::new(first);
    first.until("text_delta").await;
    let queued = server
        .message(&id, json!({"prompt": "after", "queue": true}))
        .await;
    assert_eq!(queued.status(), 200);
    let first_rest = first.until("result").await;
    let second = ndjson(queued).await;
    assert_eq!(first_rest.last().unwrap()["status"], "success");
    assert_eq!(second.last().unwrap()["result"], "You said: after");
    assert!(second[0]["seq"].as_u64() > first_rest.last().unwrap()["seq"].as_u64());
    server.stop().await;
}

#[tokio::test]
async fn client_leaving_an_ephemeral_run_interrupts_it() {
    let server = TestServer::start_with(|c| c.demo.chunk_delay_ms = 20).await;
    let response = server
        .post(
            "/agent/run",
            json!({"prompt": long_prompt(500), "text_deltas": true}),
        )
        .await;
    let mut lines = Lines::new(response);
    let first = lines.next().await.unwrap();
    let id = first["session_id"].as_str().unwrap().to_string();
    drop(lines);
    // Follow the session's log until the turn's result arrives.
    let follow = server
        .get(&format!("/agent/session/{id}/events?since=0&follow=true"))
        .await;
    let events = Lines::new(follow).until("result").await;
    assert_eq!(events.last().unwrap()["status"], "interrupted");
    server.stop().await;
}

#[tokio::test]
async fn follow_streams_new_events_after_the_replay() {
    let server = TestServer::start().await;
    let id = server.create_session(json!({})).await;
    server.turn(&id, "one").await;
    let follow = server
        .get(&format!("/agent/session/{id}/events?since=1&follow=true"))
        .await;
    let mut lines = Lines::new(follow);
    let replayed = lines.until("result").await;
    assert_eq!(types(&replayed), vec!["thinking", "result"]);
    server.turn(&id, "two").await;
    let live = lines.until("result").await;
    let seqs: Vec<u64> = live.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![4, 5, 6]);
    server.stop().await;
}

#[tokio::test]
async fn websocket_message_interrupt_and_resume_with_since() {
    let server = TestServer::start_with(|c| c.demo.chunk_delay_ms = 20).await;
    let id = server.create_session(json!({"text_deltas": true})).await;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(server.ws_url(&format!("/agent/ws?session_id={id}")))
            .await
            .unwrap();
    ws.send(WsMessage::Text(
        json!({"type": "message", "prompt": "hi there"})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let events = common::ws_until(&mut ws, "result").await;
    assert_eq!(events.last().unwrap()["status"], "success");
    assert_eq!(events[0]["seq"], 1);

    // A long turn, interrupted over the socket.
    ws.send(WsMessage::Text(
        json!({"type": "message", "prompt": long_prompt(500)})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    loop {
        let WsMessage::Text(text) = ws.next().await.unwrap().unwrap() else {
            continue;
        };
        if serde_json::from_str::<Value>(&text).unwrap()["type"] == "text_delta" {
            break;
        }
    }
    ws.send(WsMessage::Text(
        json!({"type": "message", "prompt": "meanwhile"})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    ws.send(WsMessage::Text(
        json!({"type": "interrupt"}).to_string().into(),
    ))
    .await
    .unwrap();
    let mut saw_busy = false;
    let mut answered = None;
    let last_seq = loop {
        let WsMessage::Text(text) = ws.next().await.unwrap().unwrap() else {
            continue;
        };
        let event: Value = serde_json::from_str(&text).unwrap();
        if event["type"] == "error" && event["code"] == "session_busy" {
            saw_busy = true;
        }
        if event["type"] == "interrupted" {
            answered = Some(event["interrupted"].clone());
        }
        if event["type"] == "result" {
            assert_eq!(event["status"], "interrupted");
            break event["seq"].as_u64().unwrap();
        }
    };
    assert!(saw_busy, "a message during a turn is refused");
    // The interrupt is answered, the result may come first.
    while answered.is_none() {
        let WsMessage::Text(text) = ws.next().await.unwrap().unwrap() else {
            continue;
        };
        let event: Value = serde_json::from_str(&text).unwrap();
        if event["type"] == "interrupted" {
            answered = Some(event["interrupted"].clone());
        }
    }
    assert_eq!(answered, Some(json!(true)));
    // While idle, as the REST route does: nothing was running.
    ws.send(WsMessage::Text(
        json!({"type": "interrupt"}).to_string().into(),
    ))
    .await
    .unwrap();
    let WsMessage::Text(text) = ws.next().await.unwrap().unwrap() else {
        panic!("a text reply");
    };
    let reply: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        reply,
        json!({"type": "interrupted", "session_id": id, "interrupted": false})
    );
    ws.close(None).await.unwrap();

    // Resume: a new socket replays from `since`.
    let (mut again, _) = tokio_tungstenite::connect_async(
        server.ws_url(&format!("/agent/ws?session_id={id}&since={}", last_seq - 1)),
    )
    .await
    .unwrap();
    let WsMessage::Text(text) = again.next().await.unwrap().unwrap() else {
        panic!("text frame")
    };
    let replayed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (replayed["seq"].as_u64(), replayed["type"].as_str()),
        (Some(last_seq), Some("result"))
    );

    // Bad frames get an error frame, not a closed socket.
    again
        .send(WsMessage::Text("{\"type\":\"dance\"}".into()))
        .await
        .unwrap();
    let WsMessage::Text(text) = again.next().await.unwrap().unwrap() else {
        panic!("text frame")
    };
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["code"],
        "bad_frame"
    );
    server.stop().await;
}

#[tokio::test]
async fn websocket_for_an_unknown_session_is_404() {
    let server = TestServer::start().await;
    let err = tokio_tungstenite::connect_async(
        server.ws_url(&format!("/agent/ws?session_id={}", uuid::Uuid::new_v4())),
    )
    .await
    .unwrap_err();
    match err {
        tokio_tungstenite::tungstenite::Error::Http(response) => assert_eq!(response.status(), 404),
        other => panic!("expected HTTP 404, got {other}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_requests_get_json_errors_with_the_right_status() {
    let server = TestServer::start_with(|c| c.max_body_bytes = 4096).await;
    let id = server.create_session(json!({})).await;
    let raw = |path: &str, body: &'static str| {
        server
            .http
            .post(server.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let cases: Vec<(reqwest::Response, u16, &str, &str)> = vec![
        (
            raw("/agent/run", "{\"prompt\": ").await.unwrap(),
            400,
            "malformed_json",
            "malformed JSON",
        ),
        (
            server
                .post("/agent/run", json!({"prompt": "x", "max_turns": "ten"}))
                .await,
            422,
            "invalid_request",
            // Its type in words, not Rust's `u32`.
            "max_turns: invalid type: string \"ten\", expected a whole number from 0 to",
        ),
        (
            server
                .post(
                    "/agent/run",
                    json!({"prompt": "x", "options": {"max_turnz": 1}}),
                )
                .await,
            422,
            "invalid_request",
            "options.max_turnz: unknown field; did you mean max_turns?",
        ),
        (
            server
                .post("/agent/run", json!({"promt": "x", "max_turns": 1}))
                .await,
            422,
            "invalid_request",
            "promt: unknown field; did you mean prompt?",
        ),
        (
            server
                .post(
                    "/agent/run",
                    json!({"prompt": "x", "model": "no-such-model"}),
                )
                .await,
            422,
            "invalid_request",
            "model",
        ),
        (
            server.post("/agent/run", json!({})).await,
            422,
            "invalid_request",
            "prompt: is required",
        ),
        (
            server
                .post("/agent/run", json!({"prompt": "x".repeat(5000)}))
                .await,
            413,
            "body_too_large",
            "max_body_bytes is 4096 bytes",
        ),
        (
            server
                .message(&id, json!({"prompt": "x", "model": "demo"}))
                .await,
            422,
            "invalid_request",
            "model: unknown field",
        ),
        (
            server
                .post(
                    &format!("/agent/session/{}/message", uuid::Uuid::new_v4()),
                    json!({"prompt": "x"}),
                )
                .await,
            404,
            "not_found",
            "not found",
        ),
        (
            server.get("/agent/session/not-a-uuid/status").await,
            404,
            "not_found",
            "not-a-uuid",
        ),
        (
            server
                .get(&format!("/agent/session/{id}/events?since=abc"))
                .await,
            400,
            "bad_request",
            "since",
        ),
        (
            server
                .post("/agent/session", json!({"kind": "symposium"}))
                .await,
            422,
            "invalid_request",
            "kind",
        ),
        (
            server.get("/no/such/route").await,
            404,
            "not_found",
            "no such route",
        ),
        (
            server
                .http
                .put(server.url("/agent/run"))
                .send()
                .await
                .unwrap(),
            405,
            "method_not_allowed",
            "method",
        ),
    ];
    for (response, status, code, fragment) in cases {
        assert_eq!(response.status().as_u16(), status, "{code}");
        assert_eq!(response.headers()["content-type"], "application/json");
        let body: Value = response.json().await.unwrap();
        let (got_code, message) = error_of(&body);
        assert_eq!(got_code, code, "{body}");
        assert!(
            message.contains(fragment),
            "{message:?} should mention {fragment:?}"
        );
    }
    // Nothing was lost: the session still works.
    let ok = server.turn(&id, "fine").await;
    assert_eq!(ok.last().unwrap()["status"], "success");
    server.stop().await;
}

#[tokio::test]
async fn api_keys_guard_every_route_and_isolate_sessions() {
    let alice = "key-alice-0001";
    let bob = "key-bob-000002";
    let server = TestServer::start_with(|c| c.api_keys = vec![alice.into(), bob.into()]).await;
    let as_key = |key: &str, request: reqwest::RequestBuilder| request.bearer_auth(key.to_string());

    for path in ["/agent/sessions", "/metrics", "/openapi.json"] {
        let response = server.get(path).await;
        assert_eq!(response.status(), 401, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(error_of(&body).0, "unauthorized");
    }
    // Probes carry no key: liveness answers without one.
    assert_eq!(server.get("/health").await.status(), 200);
    let wrong = as_key(
        "key-mallory-03",
        server.http.get(server.url("/agent/sessions")),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(wrong.status(), 401);

    let created: Value = as_key(
        alice,
        server
            .http
            .post(server.url("/agent/session"))
            .json(&json!({})),
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let id = created["session_id"].as_str().unwrap().to_string();
    for (method, path) in [
        (reqwest::Method::GET, format!("/agent/session/{id}/status")),
        (reqwest::Method::GET, format!("/agent/session/{id}/events")),
        (
            reqwest::Method::POST,
            format!("/agent/session/{id}/interrupt"),
        ),
        (reqwest::Method::DELETE, format!("/agent/session/{id}")),
    ] {
        let response = as_key(bob, server.http.request(method.clone(), server.url(&path)))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "bob {method} {path}");
    }
    let bob_message = as_key(
        bob,
        server
            .http
            .post(server.url(&format!("/agent/session/{id}/message")))
            .json(&json!({"prompt": "x"})),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(bob_message.status(), 404);
    let bobs: Value = as_key(bob, server.http.get(server.url("/agent/sessions")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(bobs, json!({"sessions": []}));
    // Alice's session is no cursor for bob: it would tell when it was made.
    let cursor = as_key(
        bob,
        server
            .http
            .get(server.url(&format!("/agent/sessions?before={id}"))),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(cursor.status(), 422);
    let alices: Value = as_key(alice, server.http.get(server.url("/agent/sessions")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(alices["sessions"][0]["session_id"], id.as_str());

    // WebSocket: no key → 401, bob's token → 404, alice's token → open.
    for (query, status) in [(String::new(), 401), (format!("&token={bob}"), 404)] {
        match tokio_tungstenite::connect_async(
            server.ws_url(&format!("/agent/ws?session_id={id}{query}")),
        )
        .await
        {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), status)
            }
            other => panic!("expected HTTP {status}, got {:?}", other.map(|_| ())),
        }
    }
    let (mut ws, _) = tokio_tungstenite::connect_async(
        server.ws_url(&format!("/agent/ws?session_id={id}&token={alice}")),
    )
    .await
    .unwrap();
    ws.send(WsMessage::Text(
        json!({"type": "message", "prompt": "hi"})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    loop {
        let WsMessage::Text(text) = ws.next().await.unwrap().unwrap() else {
            continue;
        };
        if serde_json::from_str::<Value>(&text).unwrap()["type"] == "result" {
            break;
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn health_metrics_and_openapi() {
    let server = TestServer::start().await;
    ndjson(
        server
            .post("/agent/run", json!({"prompt": "count me"}))
            .await,
    )
    .await;
    let health: Value = server.get("/health").await.json().await.unwrap();
    assert_eq!(
        (health["status"].clone(), health["default_model"].clone()),
        (json!("ok"), json!("demo"))
    );

    // The client has the result; the turn counts itself once it has also
    // stored the session's new state, a moment later.
    let needles = [
        "conclave_sessions_created_total 1",
        "conclave_turns_total{status=\"success\"} 1",
        "conclave_events_total{type=\"result\"} 1",
        "conclave_model_latency_seconds_count{model=\"demo\"} 1",
        "conclave_turns_running 0",
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = server.get("/metrics").await.text().await.unwrap();
        let missing: Vec<&str> = needles
            .into_iter()
            .filter(|needle| !metrics.contains(needle))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing:?} missing from\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // OpenMetrics by default; Prometheus' older text format when only
    // text/plain is accepted.
    let scrape = |accept: &'static str| {
        let request = server
            .http
            .get(server.url("/metrics"))
            .header("accept", accept);
        async move {
            let response = request.send().await.unwrap();
            let kind = response.headers()["content-type"]
                .to_str()
                .unwrap()
                .to_string();
            (kind, response.text().await.unwrap())
        }
    };
    let (kind, open) =
        scrape("application/openmetrics-text; version=1.0.0, text/plain; q=0.5").await;
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    assert!(
        open.ends_with("# EOF\n") && open.contains("# TYPE conclave_turns counter"),
        "{open}"
    );
    let (kind, text) = scrape("text/plain").await;
    assert_eq!(kind, "text/plain; version=0.0.4; charset=utf-8");
    assert!(!text.contains("# EOF"), "{text}");
    assert!(
        text.contains("# TYPE conclave_turns_total counter"),
        "{text}"
    );
    assert!(
        text.contains("conclave_turns_total{status=\"success\"} 1"),
        "{text}"
    );

    let doc: Value = server.get("/openapi.json").await.json().await.unwrap();
    let paths: Vec<&String> = doc["paths"].as_object().unwrap().keys().collect();
    for path in [
        "/agent/run",
        "/agent/session",
        "/agent/session/{session_id}/message",
        "/agent/session/{session_id}/interrupt",
        "/agent/session/{session_id}/status",
        "/agent/session/{session_id}/events",
        "/agent/session/{session_id}",
        "/agent/sessions",
        "/agent/ws",
        "/health",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(
            paths.contains(&&path.to_string()),
            "{path} missing from {paths:?}"
        );
    }
    // Every operation lists the statuses any route may answer: 401 unless
    // public, 400 with a body or a query, 413, 415 and 422 with a body.
    let statuses = |path: &str, method: &str| -> Vec<String> {
        doc["paths"][path][method]["responses"]
            .as_object()
            .unwrap_or_else(|| panic!("{path} {method}"))
            .keys()
            .cloned()
            .collect()
    };
    for (path, method, has, lacks) in [
        (
            "/agent/session",
            "post",
            vec!["400", "401", "413", "415", "422"],
            vec![],
        ),
        (
            "/agent/sessions",
            "get",
            vec!["400", "401"],
            vec!["413", "415"],
        ),
        ("/health", "get", vec![], vec!["400", "401", "413"]),
    ] {
        let listed = statuses(path, method);
        for status in has {
            assert!(
                listed.iter().any(|s| s == status),
                "{path} {method} lacks {status}: {listed:?}"
            );
        }
        for status in lacks {
            assert!(
                !listed.iter().any(|s| s == status),
                "{path} {method} lists {status}: {listed:?}"
            );
        }
    }
    // A range the route enforces is in the schema, so that a client (or
    // schemathesis) knows what it refuses.
    let limit = doc["paths"]["/agent/sessions"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(
        (
            limit["schema"]["minimum"].as_f64(),
            limit["schema"]["maximum"].as_f64()
        ),
        (Some(1.0), Some(10000.0)),
        "{limit}"
    );
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            // A path parameter is one the path names; the rest are queries.
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let name = parameter["name"].as_str().unwrap();
                let in_path = path.contains(&format!("{{{name}}}"));
                let place = if in_path { "path" } else { "query" };
                assert_eq!(parameter["in"], place, "{path} {method} {name}");
            }
            let public = path == "/health" || path == "/ready";
            assert_eq!(
                operation["responses"].get("401").is_some(),
                !public,
                "{path} {method}"
            );
        }
    }
    // The request bodies are the types the routes parse: what the document
    // says a body holds is what the server reads.
    let schemas = &doc["components"]["schemas"];
    let fields = |schema: &str| -> Vec<String> {
        let mut fields: Vec<String> = schemas[schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{schema} has no properties: {doc}"))
            .keys()
            .cloned()
            .collect();
        fields.sort();
        fields
    };
    assert_eq!(
        fields("RunRequest"),
        ["options", "prompt", "queue", "session_name"]
    );
    assert_eq!(fields("MessageRequest"), ["prompt", "queue"]);
    assert_eq!(
        fields("CreateSessionRequest"),
        ["kind", "options", "session_name"]
    );
    for schema in ["RunRequest", "MessageRequest"] {
        assert_eq!(schemas[schema]["required"], json!(["prompt"]), "{schema}");
    }
    assert_eq!(
        doc["paths"]["/agent/session/{session_id}/message"]["post"]["requestBody"]["content"]["application/json"]
            ["schema"]["$ref"],
        "#/components/schemas/MessageRequest"
    );
    server.stop().await;
}

#[tokio::test]
async fn shutdown_interrupts_running_turns_and_restart_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(dir.path(), |c| c.demo.chunk_delay_ms = 20).await;
    let id = server.create_session(json!({"text_deltas": true})).await;
    let response = server
        .message(&id, json!({"prompt": long_prompt(500)}))
        .await;
    let mut lines = Lines::new(response);
    let mut streamed = lines.until("text_delta").await;
    server.begin_stop();
    streamed.extend(lines.until("result").await);
    assert_eq!(streamed.last().unwrap()["status"], "interrupted");
    server.wait_stopped().await;

    let again = TestServer::start_in(dir.path(), |_| {}).await;
    let status: Value = again
        .get(&format!("/agent/session/{id}/status"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["status"], "interrupted");
    let replay = ndjson(again.get(&format!("/agent/session/{id}/events")).await).await;
    assert_eq!(
        replay, streamed,
        "every streamed event survived the restart"
    );
    again.stop().await;
}

#[tokio::test]
async fn an_unknown_model_is_refused_with_the_known_names() {
    let server = TestServer::start().await;
    let response = server
        .post("/agent/session", json!({"options": {"model": "gpt-4o"}}))
        .await;
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("options.model: unknown model 'gpt-4o'; known models: demo"),
        "{message}"
    );
    // A Claude name says which key serves it.
    let response = server
        .post(
            "/agent/session",
            json!({"options": {"model": "claude-sonnet-4-5"}}),
        )
        .await;
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("set ANTHROPIC_API_KEY"), "{message}");
    server.stop().await;
}

/// A client that takes no `text_delta` events still hears from a long model
/// call: a `status` heartbeat every `agent.status_interval_ms`.
#[tokio::test]
async fn a_long_model_call_sends_status_heartbeats() {
    let server = TestServer::start_with(|c| {
        c.demo.chunk_delay_ms = 20;
        c.agent.status_interval_ms = 100;
    })
    .await;
    // About 40 words at 20 ms each: the call streams for ~0.8 s.
    let events = ndjson(
        server
            .post("/agent/run", json!({"prompt": long_prompt(40)}))
            .await,
    )
    .await;
    let beats: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["type"] == "status"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("The model is still writing"))
        })
        .collect();
    assert!(!beats.is_empty(), "{events:?}");
    assert_eq!(events.last().unwrap()["status"], "success");
    // With deltas on, the deltas are the progress: no heartbeat.
    let events = ndjson(
        server
            .post(
                "/agent/run",
                json!({"prompt": long_prompt(40), "text_deltas": true}),
            )
            .await,
    )
    .await;
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "status"
                && e["message"].as_str().unwrap().contains("still writing")),
        "{events:?}"
    );
    server.stop().await;
}

/// A turn that runs past `agent.turn_timeout_s` ends `timed_out`, says why,
/// and leaves the session ready for the next message.
#[tokio::test]
async fn a_turn_past_its_wall_clock_limit_ends_timed_out() {
    let server = TestServer::start_with(|c| {
        c.demo.chunk_delay_ms = 50;
        c.agent.turn_timeout_s = 1;
    })
    .await;
    let id = server.create_session(json!({})).await;
    let events = server.turn(&id, &long_prompt(200)).await;
    let result = events.last().unwrap();
    assert_eq!(result["status"], "timed_out", "{events:?}");
    let note = &events[events.len() - 2];
    assert!(
        note["message"]
            .as_str()
            .is_some_and(|m| m.contains("agent.turn_timeout_s")),
        "{note}"
    );
    let next = server.turn(&id, "short").await;
    assert_eq!(next.last().unwrap()["status"], "success");
    server.stop().await;
}

/// `GET /agent/sessions` pages with `limit` and `before` (the `next_before`
/// of the page before), filters by `status`, `kind` and `ephemeral`, and refuses values
/// it cannot read with a 422 naming the parameter.
#[tokio::test]
async fn session_list_pages_and_filters() {
    let server = TestServer::start().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(server.create_session(json!({})).await);
    }
    let _ = server.turn(&ids[1], "hi").await;
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    let mut seen = Vec::new();
    let mut path = "/agent/sessions?limit=2".to_string();
    loop {
        let page: Value = server.get(&path).await.json().await.unwrap();
        for s in page["sessions"].as_array().unwrap() {
            seen.push(s["session_id"].as_str().unwrap().to_string());
        }
        match page["next_before"].as_str() {
            Some(next) => path = format!("/agent/sessions?limit=2&before={next}"),
            None => break,
        }
    }
    assert_eq!(seen, newest_first);
    let ephemeral = ndjson(server.post("/agent/run", json!({"prompt": "x"})).await).await;
    let run_id = ephemeral[0]["session_id"].as_str().unwrap();
    let closed: Value = server
        .get("/agent/sessions?status=closed&kind=agent")
        .await
        .json()
        .await
        .unwrap();
    let closed: Vec<&str> = closed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(closed, vec![run_id]);
    // The one-shot runs alone, or none of them.
    let shared = &server;
    let listed = |query: &'static str| async move {
        let page: Value = shared
            .get(&format!("/agent/sessions?{query}"))
            .await
            .json()
            .await
            .unwrap();
        let sessions = page["sessions"].as_array().unwrap().clone();
        let flags: Vec<bool> = sessions
            .iter()
            .map(|s| s["ephemeral"].as_bool().unwrap())
            .collect();
        let ids: Vec<String> = sessions
            .iter()
            .map(|s| s["session_id"].as_str().unwrap().to_string())
            .collect();
        (ids, flags)
    };
    assert_eq!(
        listed("ephemeral=true").await,
        (vec![run_id.to_string()], vec![true])
    );
    assert_eq!(
        listed("ephemeral=false").await,
        (newest_first.clone(), vec![false; 5])
    );
    assert_eq!(listed("").await.0.len(), 6);
    assert_eq!(
        listed("status=&kind=&before=").await.0.len(),
        6,
        "empty is no filter"
    );
    // Filtering by kind: tests/session_kinds.rs, with a second kind.
    for (query, field, code) in [
        ("status=done", "status", 422),
        ("kind=robot", "kind", 422),
        ("before=nope", "before", 422),
        ("before=00000000-0000-0000-0000-000000000000", "before", 422),
        ("limit=0", "limit", 422),
        ("colour=red", "colour", 400),
        ("ephemeral=maybe", "ephemeral", 400),
    ] {
        let response = server.get(&format!("/agent/sessions?{query}")).await;
        assert_eq!(response.status(), code, "{query}");
        let body: Value = response.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{query}: {message}");
    }
    server.stop().await;
}

/// A finished `/agent/run` session is deleted once `agent.ephemeral_retention_s`
/// has passed; sessions made with `POST /agent/session` stay.
#[tokio::test]
async fn finished_ephemeral_sessions_expire_after_their_retention() {
    let server = TestServer::start_with(|c| c.agent.ephemeral_retention_s = 1).await;
    let kept = server.create_session(json!({})).await;
    let events = ndjson(server.post("/agent/run", json!({"prompt": "x"})).await).await;
    let run_id = events[0]["session_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = server
            .get(&format!("/agent/session/{run_id}/status"))
            .await
            .status();
        if status == 404 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            Instant::now() < deadline,
            "the run session was never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sessions: Value = server.get("/agent/sessions").await.json().await.unwrap();
    assert_eq!(sessions["sessions"].as_array().unwrap().len(), 1);
    assert_eq!(sessions["sessions"][0]["session_id"], kept.as_str());
    server.stop().await;
}

/// The README's WebSocket example: `examples/ws_client.py` with a stock
/// `python3` (standard library only) sends a prompt and prints the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_websocket_client_needs_nothing_installed() {
    let server = TestServer::start().await;
    let id = server.create_session(json!({})).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/ws_client.py");
    let base = server.ws_url("");
    let output = tokio::process::Command::new("python3")
        .args(["-I", script, &id, "hello over a socket", &base])
        .output()
        .await
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(types(&events), vec!["status", "thinking", "result"]);
    assert_eq!(events[2]["result"], "You said: hello over a socket");
    server.stop().await;
}

/// `Bash` calls that each wait until `parties` calls are in flight at
/// once (so calls run one after another never finish), and fail for the
/// command `fail`.
struct Rendezvous {
    barrier: tokio::sync::Barrier,
}

#[async_trait::async_trait]
impl conclave::agent::ToolRouter for Rendezvous {
    async fn specs(&self, ctx: &conclave::agent::ToolContext) -> Vec<conclave::model::ToolSpec> {
        common::EchoTools.specs(ctx).await
    }

    async fn call(
        &self,
        _ctx: &conclave::agent::ToolContext,
        _name: &str,
        input: Value,
        cancel: tokio_util::sync::CancellationToken,
    ) -> conclave::agent::ToolOutput {
        let command = input["command"].as_str().unwrap_or_default().to_owned();
        tokio::select! {
            _ = self.barrier.wait() => {}
            _ = cancel.cancelled() => return conclave::agent::ToolOutput::error("cancelled"),
        }
        conclave::agent::ToolOutput {
            output: Value::String(format!("ran: {command}")),
            is_error: command == "fail",
        }
    }
}

#[tokio::test]
async fn parallel_tool_calls_of_one_reply_run_at_once_and_report_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let tools = conclave::server::Tools::Custom(std::sync::Arc::new(Rendezvous {
        barrier: tokio::sync::Barrier::new(3),
    }));
    let server = TestServer::start_with_tools(dir.path(), tools, |_| {}).await;
    let id = server
        .create_session(json!({"parallel_tool_calls": true}))
        .await;
    // Three calls in one reply; each finishes only once all three run.
    let events = tokio::time::timeout(
        Duration::from_secs(60),
        server.turn(&id, "$ first\n$ fail\n$ third"),
    )
    .await
    .expect("the three calls ran at once");
    let calls: Vec<(&str, String)> = events
        .iter()
        .filter(|e| e["type"] == "tool_use" || e["type"] == "tool_result")
        .map(|e| {
            let what = match e["type"].as_str().unwrap() {
                "tool_use" => e["input"]["command"].as_str().unwrap().to_owned(),
                _ => e["output"].as_str().unwrap().to_owned(),
            };
            (e["type"].as_str().unwrap(), what)
        })
        .collect();
    // Every tool_use first, then every result in the calls' order; the
    // failing one cancelled neither of the others.
    let expected = [
        ("tool_use", "first"),
        ("tool_use", "fail"),
        ("tool_use", "third"),
        ("tool_result", "ran: first"),
        ("tool_result", "ran: fail"),
        ("tool_result", "ran: third"),
    ];
    let expected: Vec<(&str, String)> = expected
        .iter()
        .map(|(t, w)| (*t, (*w).to_owned()))
        .collect();
    assert_eq!(calls, expected, "{events:?}");
    let errors: Vec<bool> = events
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .map(|e| e["is_error"].as_bool().unwrap())
        .collect();
    assert_eq!(errors, [false, true, false]);
    assert_eq!(events.last().unwrap()["status"], "success");
}
