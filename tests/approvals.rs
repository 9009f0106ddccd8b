//! Tool-call approvals on real docker sandboxes with a scripted capable
//! model: each permission mode and rule order, a decision over HTTP and
//! over the WebSocket, an edited input, `remember`, the timeout, an
//! interrupt while a call waits, a decision on a call that is not waiting.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "approvals/script.rs"]
#[allow(dead_code)]
mod script;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use common::TestServer;
use futures::{SinkExt, StreamExt};
use script::{allow, bash, calls, capable, decide, of_type, says, start_turn, told, until_asked};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use upstream::Upstream;

async fn server(upstream: &Upstream) -> TestServer {
    let url = upstream.url.clone();
    TestServer::start_sandboxed(move |c| capable(c, &url)).await
}

async fn session(server: &TestServer, permissions: Value) -> String {
    server
        .create_session(json!({"model": "capable", "max_turns": 10, "permissions": permissions}))
        .await
}

/// `ask_writes`: a read runs at once, a write waits and runs once allowed;
/// a deny rule wins over the mode and its reason reaches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_runs_a_write_waits_and_a_denied_call_reaches_the_model() {
    let upstream = Upstream::start(vec![
        calls("c1", "Glob", json!({"pattern": "*"})),
        calls(
            "c2",
            "Write",
            json!({"file_path": "/workspace/keys.env", "content": "x"}),
        ),
        bash(
            "c3",
            "echo written > /workspace/f.txt && cat /workspace/f.txt",
        ),
        says("Done."),
    ])
    .await;
    let server = server(&upstream).await;
    let id = session(
        &server,
        json!({"mode": "ask_writes", "deny": ["Write(/workspace/*.env)"]}),
    )
    .await;
    let mut turn = start_turn(&server, &id, "write f.txt").await;
    let before = until_asked(&mut turn, "c3").await;
    let asked: Vec<&Value> = of_type(&before, "approval_requested");
    assert_eq!(asked.len(), 1, "only the shell call asks: {before:?}");
    assert_eq!(asked[0]["tool"], "Bash");
    assert!(asked[0]["reason"].as_str().unwrap().contains("ask_writes"));
    assert!(asked[0]["expires_at"].is_string());
    let results = of_type(&before, "tool_result");
    assert_eq!(results[0]["id"], "c1");
    assert_eq!(results[0]["is_error"], false, "{before:?}");
    assert_eq!(results[1]["id"], "c2");
    let denied = results[1]["output"].as_str().unwrap();
    assert!(
        denied.starts_with("not run:") && denied.contains("Write(/workspace/*.env)"),
        "{denied}"
    );
    let listed = server.get_json("/agent/approvals").await;
    assert_eq!(listed["approvals"][0]["call_id"], "c3", "{listed}");
    assert_eq!(listed["approvals"][0]["session_id"], id.as_str());
    allow(&server, &id, "c3").await;
    let rest = turn.until("result").await;
    let decided = of_type(&rest, "approval_decided");
    assert_eq!(decided[0]["decision"], "allow");
    assert_eq!(decided[0]["by"], "user");
    let result = of_type(&rest, "tool_result")[0];
    assert_eq!(result["output"]["stdout"], "written\n", "{rest:?}");
    assert_eq!(rest.last().unwrap()["status"], "success");
    let requests: Vec<Value> = upstream.requests().into_iter().map(|r| r.body).collect();
    let c2 = told(&requests[2], "c2");
    assert!(c2.contains("not run:"), "{c2}");
    // Decided and gone: a second decision is a conflict.
    let (status, body) = decide(&server, None, &id, "c3", json!({"decision": "deny"})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_pending"))
    );
    let (status, _) = decide(&server, None, &id, "never", json!({"decision": "allow"})).await;
    assert_eq!(status, 409);
    assert_eq!(
        server.get_json("/agent/approvals").await["approvals"],
        json!([])
    );
    server.stop_and_remove_sandboxes().await;
}

/// `ask`: an edited input runs edited (after an input that does not fit
/// the schema and one a deny rule catches were refused with 422), a denial
/// with a message reaches the model, and `remember` stops the next ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_input_runs_edited_and_remember_stops_the_next_ask() {
    let upstream = Upstream::start(vec![
        bash("c1", "echo original"),
        bash("c2", "echo two"),
        bash("c3", "echo three"),
        bash("c4", "echo four"),
        says("Done."),
    ])
    .await;
    let server = server(&upstream).await;
    let id = session(&server, json!({"mode": "ask", "deny": ["Bash(rm *)"]})).await;
    let mut turn = start_turn(&server, &id, "echo").await;
    until_asked(&mut turn, "c1").await;
    for (input, says) in [
        (json!({"command": 5}), "command"),
        (json!({"command": "rm -rf /workspace"}), "Bash(rm *)"),
    ] {
        let (status, body) = decide(
            &server,
            None,
            &id,
            "c1",
            json!({"decision": "allow", "input": input}),
        )
        .await;
        assert_eq!(status, 422, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{body}"
        );
    }
    let (status, body) = decide(&server, None, &id, "c1", json!({"decision": "alow"})).await;
    assert_eq!(status, 422, "{body}");
    let edited = json!({"decision": "allow", "input": {"command": "echo edited"}});
    assert_eq!(decide(&server, None, &id, "c1", edited).await.0, 200);
    let first = until_asked(&mut turn, "c2").await;
    assert_eq!(
        of_type(&first, "tool_result")[0]["output"]["stdout"],
        "edited\n"
    );
    assert_eq!(
        of_type(&first, "approval_decided")[0]["input"]["command"],
        "echo edited"
    );
    let deny = json!({"decision": "deny", "message": "not now, use three"});
    assert_eq!(decide(&server, None, &id, "c2", deny).await.0, 200);
    until_asked(&mut turn, "c3").await;
    let always = json!({"decision": "allow", "remember": "session"});
    assert_eq!(decide(&server, None, &id, "c3", always).await.0, 200);
    let rest = turn.until("result").await;
    assert!(
        of_type(&rest, "approval_requested").is_empty(),
        "c4 ran without asking: {rest:?}"
    );
    assert_eq!(of_type(&rest, "approval_decided")[0]["remembered"], "Bash");
    let outputs: Vec<&Value> = of_type(&rest, "tool_result")
        .iter()
        .map(|r| &r["output"]["stdout"])
        .collect();
    assert_eq!(outputs, [&json!("three\n"), &json!("four\n")]);
    let requests: Vec<Value> = upstream.requests().into_iter().map(|r| r.body).collect();
    let c2 = told(&requests[2], "c2");
    assert!(
        c2.contains("denied by the user: not now, use three"),
        "{c2}"
    );
    server.stop_and_remove_sandboxes().await;
}

/// `plan`: the model is told; a read runs and a write does not, without
/// waiting. No decision in time denies a call, and the model is told why.
/// An interrupt ends a wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_mode_the_timeout_and_an_interrupt() {
    let upstream = Upstream::start(vec![
        calls("p1", "Read", json!({"file_path": "/workspace/none.txt"})),
        bash("p2", "touch /workspace/x"),
        says("Plan: touch x."),
        bash("t1", "echo late"),
        says("It was denied."),
        bash("i1", "echo never"),
    ])
    .await;
    let server = server(&upstream).await;
    let plan = session(&server, json!({"mode": "plan"})).await;
    let events = server.turn(&plan, "plan it").await;
    assert!(
        of_type(&events, "approval_requested").is_empty(),
        "{events:?}"
    );
    let results = of_type(&events, "tool_result");
    assert!(
        !results[0]["output"]
            .as_str()
            .unwrap_or_default()
            .starts_with("not run")
    );
    assert!(
        results[1]["output"].as_str().unwrap().contains("`plan`"),
        "{events:?}"
    );
    let first = &upstream.requests()[0].body;
    let system = first["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("plan mode"), "{system}");

    let timed = session(&server, json!({"mode": "ask", "approval_timeout_s": 1})).await;
    let events = server.turn(&timed, "echo").await;
    let decided = of_type(&events, "approval_decided");
    assert_eq!(
        (&decided[0]["by"], &decided[0]["decision"]),
        (&json!("timeout"), &json!("deny"))
    );
    let requests: Vec<Value> = upstream.requests().into_iter().map(|r| r.body).collect();
    assert!(told(&requests[4], "t1").contains("none came within 1 s"));

    let stopped = session(&server, json!({"mode": "ask"})).await;
    let mut turn = start_turn(&server, &stopped, "echo").await;
    until_asked(&mut turn, "i1").await;
    let interrupted = server
        .post(&format!("/agent/session/{stopped}/interrupt"), json!({}))
        .await;
    assert_eq!(interrupted.status(), 200);
    let rest = turn.until("result").await;
    assert_eq!(of_type(&rest, "approval_decided")[0]["by"], "interrupt");
    assert_eq!(rest.last().unwrap()["status"], "interrupted");
    let (status, _) = decide(&server, None, &stopped, "i1", json!({"decision": "allow"})).await;
    assert_eq!(status, 409);
    assert_eq!(
        server.get_json("/agent/approvals").await["approvals"],
        json!([])
    );
    server.stop_and_remove_sandboxes().await;
}

/// A decision on the session's WebSocket, answered `approval_sent`; a
/// second one for the same call is an error frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_frame_decides() {
    let upstream = Upstream::start(vec![bash("w1", "echo via socket"), says("Done.")]).await;
    let server = server(&upstream).await;
    let id = session(&server, json!({"mode": "ask"})).await;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(server.ws_url(&format!("/agent/ws?session_id={id}")))
            .await
            .unwrap();
    let send = |v: Value| WsMessage::Text(v.to_string().into());
    ws.send(send(json!({"type": "message", "prompt": "echo"})))
        .await
        .unwrap();
    while next_frame(&mut ws).await["type"] != "approval_requested" {}
    let frame = json!({"type": "approval", "call_id": "w1", "decision": "allow"});
    ws.send(send(frame.clone())).await.unwrap();
    let mut seen = Vec::new();
    loop {
        let event = next_frame(&mut ws).await;
        let done = event["type"] == "result";
        seen.push(event);
        if done {
            break;
        }
    }
    assert!(
        seen.iter()
            .any(|e| e["type"] == "approval_sent" && e["call_id"] == "w1"),
        "{seen:?}"
    );
    let result = seen.iter().find(|e| e["type"] == "tool_result").unwrap();
    assert_eq!(result["output"]["stdout"], "via socket\n");
    ws.send(send(frame)).await.unwrap();
    let reply = next_frame(&mut ws).await;
    assert_eq!(
        (&reply["type"], &reply["code"]),
        (&json!("error"), &json!("not_pending"))
    );
    server.stop_and_remove_sandboxes().await;
}

/// The next text frame of a socket, as JSON.
async fn next_frame<S, E>(ws: &mut S) -> Value
where
    S: futures::Stream<Item = Result<WsMessage, E>> + Unpin,
    E: std::fmt::Debug,
{
    loop {
        if let WsMessage::Text(text) = ws.next().await.unwrap().unwrap() {
            return serde_json::from_str(&text).unwrap();
        }
    }
}
