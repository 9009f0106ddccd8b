//! A session kind added from outside the crate: a task that echoes, given
//! to the server at build time, served by the same routes, streams and
//! replay as agent sessions, with no change to `api/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use common::{TestServer, ndjson, types, ws_until};
use conclave::protocol::{EventKind, ResultStatus, SessionKind};
use conclave::server::Tools;
use conclave::session::{
    OptionError, Outcome, SessionError, SessionTask, Turn, options::from_body,
};
use conclave::store::StoreError;
use futures::SinkExt;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// The echo kind's own options.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EchoOptions {
    /// How many times the input is echoed, 1 to 5.
    times: u32,
}

struct Echo;

#[async_trait]
impl SessionTask for Echo {
    fn kind(&self) -> SessionKind {
        SessionKind::named("echo")
    }

    async fn options(
        &self,
        body: &Map<String, Value>,
        fields: &[&str],
    ) -> Result<Value, SessionError> {
        let options: EchoOptions = from_body(body, fields)?;
        if !(1..=5).contains(&options.times) {
            return Err(OptionError::new("options.times", "must be 1 to 5").into());
        }
        Ok(serde_json::to_value(options).expect("options serialize"))
    }

    fn describe(&self, options: &Value) -> Map<String, Value> {
        Map::from_iter([("echoes".to_owned(), options["times"].clone())])
    }

    async fn run(&self, turn: &mut Turn, input: String) -> Result<Outcome, StoreError> {
        let options: EchoOptions =
            serde_json::from_value((*turn.session.options).clone()).expect("stored options");
        for _ in 0..options.times {
            turn.session.emit(EventKind::Thinking {
                content: input.clone(),
                reasoning: false,
            })?;
        }
        turn.usage.turns += 1;
        Ok(Outcome::new(
            ResultStatus::Success,
            Some(input.to_uppercase()),
        ))
    }
}

async fn start() -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with_kinds(
        dir.path(),
        Tools::Custom(Arc::new(common::EchoTools)),
        vec![Arc::new(Echo)],
        |_| {},
    )
    .await;
    (server, dir)
}

#[tokio::test]
async fn an_echo_kind_runs_through_ndjson_sse_websocket_and_replay() {
    let (server, _dir) = start().await;
    let created = server
        .post("/agent/session", json!({"kind": "echo", "times": 2}))
        .await;
    assert_eq!(created.status(), 201);
    let id = created.json::<Value>().await.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // NDJSON.
    let events = server.turn(&id, "hi").await;
    assert_eq!(types(&events), ["thinking", "thinking", "result"]);
    assert_eq!(events[2]["status"], "success");
    assert_eq!(events[2]["result"], "HI");
    assert_eq!(events[0]["seq"], 1);

    // SSE: the same events, named by their type.
    let sse = server
        .http
        .post(server.url(&format!("/agent/session/{id}/message")))
        .header("accept", "text/event-stream")
        .json(&json!({"prompt": "again"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        sse.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let text = sse.text().await.unwrap();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names, ["thinking", "thinking", "result"]);
    assert!(text.contains("\"result\":\"AGAIN\""), "{text}");

    // WebSocket: a third turn on the socket.
    let (mut ws, _) =
        tokio_tungstenite::connect_async(server.ws_url(&format!("/agent/ws?session_id={id}")))
            .await
            .unwrap();
    ws.send(WsMessage::Text(
        json!({"type": "message", "prompt": "ws"})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let on_socket = ws_until(&mut ws, "result").await;
    assert_eq!(types(&on_socket), ["thinking", "thinking", "result"]);
    assert_eq!(on_socket[2]["result"], "WS");
    assert_eq!(on_socket[2]["seq"], 9);

    // Replay: all three turns, dense `seq` from 1.
    let replayed = ndjson(server.get(&format!("/agent/session/{id}/events")).await).await;
    let seqs: Vec<u64> = replayed
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=9).collect::<Vec<_>>());
    let since = ndjson(
        server
            .get(&format!("/agent/session/{id}/events?since=6"))
            .await,
    )
    .await;
    assert_eq!(types(&since), ["thinking", "thinking", "result"]);

    // Status: the common fields, the kind's options and what it adds.
    let status: Value = server.status(&id).await;
    assert_eq!(status["kind"], "echo");
    assert_eq!(status["status"], "idle");
    assert_eq!(status["options"], json!({"times": 2}));
    assert_eq!(status["echoes"], 2);
    assert_eq!(status["usage"]["turns"], 3);
    assert_eq!(status["last_seq"], 9);

    // Listing by kind.
    let listed: Value = server
        .get("/agent/sessions?kind=echo")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1);
    let agents: Value = server
        .get("/agent/sessions?kind=agent")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(agents["sessions"], json!([]));
    server.stop().await;
}

#[tokio::test]
async fn kinds_and_their_options_are_checked_before_a_session_exists() {
    let (server, _dir) = start().await;
    for (body, field) in [
        (
            json!({"kind": "oracle"}),
            "kind: unknown session kind \"oracle\"",
        ),
        (json!({"kind": "echo", "times": 9}), "times: must be 1 to 5"),
        (
            json!({"kind": "echo", "model": "demo"}),
            "model: unknown field; known fields: options, session_name, times",
        ),
        (json!({"kind": 3}), "kind"),
    ] {
        let response = server.post("/agent/session", body.clone()).await;
        assert_eq!(response.status(), 422, "{body}");
        let error: Value = response.json().await.unwrap();
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{body}: {message}");
    }
    let unknown = server.get("/agent/sessions?kind=oracle").await;
    assert_eq!(unknown.status(), 422);
    let listed: Value = server.get("/agent/sessions").await.json().await.unwrap();
    assert_eq!(listed["sessions"], json!([]), "no session was made");
    // The agent kind is still there, with its own options.
    let agent = server.post("/agent/session", json!({"max_turns": 2})).await;
    assert_eq!(agent.status(), 201);
    server.stop().await;
}
