//! The Agent Protocol's own routes under `/langgraph` (agentprotocol.ai's
//! OpenAPI: agents, and runs with ids of their own), over HTTP against the
//! real binary: background, waited and streamed runs on a thread and
//! stateless, a run's status, wait, stream, cancel and deletion by its id
//! alone, the search, and a second key that finds none of them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::binary::{serve_command, spawn_server, stop};
use serde_json::{Value, json};

const KEY_A: &str = "ap-test-key-a-0123456789";
const KEY_B: &str = "ap-test-key-b-0123456789";

/// Two keys; the demo model paced so that a long prompt's turn runs for
/// seconds.
const CONFIG: &str = r#"
api_keys = ["ap-test-key-a-0123456789", "ap-test-key-b-0123456789"]

[demo]
chunk_delay_ms = 40

[agents.chatty]
description = "Streams its text a word at a time"
options = { text_deltas = true }
"#;

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    async fn call(
        &self,
        method: reqwest::Method,
        key: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, String) {
        let mut request = self
            .http
            .request(method, format!("{}/langgraph{path}", self.url))
            .bearer_auth(key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// A JSON answer, with its status checked.
    async fn json(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let (status, text) = self.call(method, KEY_A, path, body).await;
        assert!((200..300).contains(&status), "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.json(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> Value {
        self.json(reqwest::Method::GET, path, None).await
    }
}

fn said(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[tokio::test]
async fn the_agent_protocols_runs_are_found_by_their_own_ids() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("conclave.toml"), CONFIG).unwrap();
    let mut command = serve_command(&["--sandbox", "local", "--config", "conclave.toml"]);
    command.current_dir(dir.path());
    let (mut child, url) = spawn_server(&mut command).await;
    let c = Client {
        http: reqwest::Client::new(),
        url,
    };
    use reqwest::Method;

    // Agents: the server's named agents, with their schemas.
    let agents = c.post("/agents/search", json!({})).await;
    let names: Vec<&str> = agents
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["agent_id"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"agent") && names.contains(&"chatty"),
        "{agents}"
    );
    let chatty = c.post("/agents/search", json!({"name": "chatty"})).await;
    assert_eq!(chatty.as_array().unwrap().len(), 1, "{chatty}");
    assert_eq!(chatty[0]["capabilities"]["ap.io.messages"], true);
    assert_eq!(c.get("/agents/agent").await["agent_id"], "agent");
    let schemas = c.get("/agents/agent/schemas").await;
    assert_eq!(schemas["input_schema"]["required"], json!(["messages"]));
    let (status, _) = c.call(Method::GET, KEY_A, "/agents/nope", None).await;
    assert_eq!(status, 404);

    // A background run on a thread, waited for by its id alone.
    let thread = c.post("/threads", json!({})).await;
    let tid = thread["thread_id"].as_str().unwrap().to_owned();
    let run = c
        .post(
            "/runs",
            json!({"thread_id": tid, "agent_id": "agent", "messages": said("hello there"),
                   "metadata": {"batch": 7}}),
        )
        .await;
    assert_eq!(run["status"], "pending", "{run}");
    assert_eq!(run["thread_id"], tid.as_str());
    let rid = run["run_id"].as_str().unwrap().to_owned();
    let waited = c.get(&format!("/runs/{rid}/wait")).await;
    assert_eq!(waited["run"]["status"], "success", "{waited}");
    assert_eq!(waited["run"]["metadata"], json!({"batch": 7}));
    let messages = waited["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["content"], "hello there");
    assert_eq!(messages.last().unwrap()["role"], "assistant", "{waited}");
    assert_eq!(
        waited["values"]["messages"].as_array().unwrap().len(),
        messages.len()
    );
    let got = c.get(&format!("/runs/{rid}")).await;
    assert_eq!(got["status"], "success");
    assert_eq!(got["thread_id"], tid.as_str());

    // Waited and streamed at once; stateless when no thread is named.
    let stateless = c
        .post(
            "/runs/wait",
            json!({"input": {"messages": said("no thread")}}),
        )
        .await;
    assert_eq!(stateless["run"]["status"], "success", "{stateless}");
    assert!(stateless["run"].get("thread_id").is_none(), "{stateless}");
    assert_eq!(stateless["run"]["agent_id"], "agent");
    let (status, sse) = c
        .call(
            Method::POST,
            KEY_A,
            "/runs/stream",
            Some(
                json!({"thread_id": tid, "messages": said("streamed"), "stream_mode": ["values"]}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{sse}");
    assert!(sse.starts_with("event: metadata"), "{sse}");
    assert!(sse.contains("event: values"), "{sse}");
    assert!(sse.contains("streamed"), "{sse}");

    // The thread's runs, newest first; a run's stream replays it whole.
    let runs = c.post("/runs/search", json!({"thread_id": tid})).await;
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[1]["run_id"], rid.as_str());
    let tagged = c
        .post("/runs/search", json!({"metadata": {"batch": 7}}))
        .await;
    assert_eq!(tagged.as_array().unwrap().len(), 1, "{tagged}");
    let (status, replay) = c
        .call(Method::GET, KEY_A, &format!("/runs/{rid}/stream"), None)
        .await;
    assert_eq!(status, 200);
    assert!(
        replay.contains(&rid) && replay.contains("hello there"),
        "{replay}"
    );

    // Cancelled while it runs; deleted only once it has ended.
    let slow = vec!["word"; 80].join(" ");
    let long = c
        .post("/runs", json!({"thread_id": tid, "messages": said(&slow)}))
        .await;
    let lid = long["run_id"].as_str().unwrap().to_owned();
    let (status, refused) = c
        .call(Method::DELETE, KEY_A, &format!("/runs/{lid}"), None)
        .await;
    assert_eq!(status, 409, "{refused}");
    let (status, _) = c
        .call(
            Method::POST,
            KEY_A,
            &format!("/runs/{lid}/cancel?wait=true"),
            None,
        )
        .await;
    assert_eq!(status, 204);
    assert_eq!(
        c.get(&format!("/runs/{lid}")).await["status"],
        "interrupted"
    );
    let interrupted = c
        .post("/runs/search", json!({"status": "interrupted"}))
        .await;
    assert_eq!(interrupted.as_array().unwrap().len(), 1, "{interrupted}");
    let (status, _) = c
        .call(Method::DELETE, KEY_A, &format!("/runs/{lid}"), None)
        .await;
    assert_eq!(status, 204);
    let (status, _) = c
        .call(Method::GET, KEY_A, &format!("/runs/{lid}"), None)
        .await;
    assert_eq!(status, 404);

    // A deleted thread's runs are gone with it.
    let doomed = c.post("/threads", json!({})).await;
    let did = doomed["thread_id"].as_str().unwrap().to_owned();
    let done = c
        .post(
            "/runs/wait",
            json!({"thread_id": did, "messages": said("soon gone")}),
        )
        .await;
    let done_id = done["run"]["run_id"].as_str().unwrap().to_owned();
    let (status, _) = c
        .call(Method::DELETE, KEY_A, &format!("/threads/{did}"), None)
        .await;
    assert_eq!(status, 204);
    for _ in 0..2 {
        let (status, body) = c
            .call(Method::GET, KEY_A, &format!("/runs/{done_id}"), None)
            .await;
        assert_eq!(status, 404, "{body}");
    }
    let gone = c.post("/runs/search", json!({"thread_id": did})).await;
    assert_eq!(gone, json!([]));

    // Another key finds, waits for, cancels and deletes none of them.
    for (method, path) in [
        (Method::GET, format!("/runs/{rid}")),
        (Method::GET, format!("/runs/{rid}/wait")),
        (Method::GET, format!("/runs/{rid}/stream")),
        (Method::POST, format!("/runs/{rid}/cancel")),
        (Method::DELETE, format!("/runs/{rid}")),
    ] {
        let (status, body) = c.call(method, KEY_B, &path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (_, theirs) = c
        .call(Method::POST, KEY_B, "/runs/search", Some(json!({})))
        .await;
    assert_eq!(theirs, "[]");
    let (status, body) = c
        .call(
            Method::POST,
            KEY_B,
            "/runs",
            Some(json!({"thread_id": tid, "messages": said("intrude")})),
        )
        .await;
    assert_eq!(status, 404, "{body}");

    // A thread of the client's own id: made once, then 409 unless
    // if_exists is do_nothing; another key cannot take the id.
    let chosen = uuid::Uuid::new_v4().to_string();
    let made = c
        .post(
            "/threads",
            json!({"thread_id": chosen, "metadata": {"mine": 1}}),
        )
        .await;
    assert_eq!(made["thread_id"], chosen.as_str(), "{made}");
    let again = json!({"thread_id": chosen});
    let (status, body) = c.call(Method::POST, KEY_A, "/threads", Some(again)).await;
    assert_eq!(status, 409, "{body}");
    let kept = c
        .post(
            "/threads",
            json!({"thread_id": chosen, "if_exists": "do_nothing"}),
        )
        .await;
    assert_eq!(kept["metadata"]["mine"], 1, "{kept}");
    for (key, body, code) in [
        (
            KEY_B,
            json!({"thread_id": chosen, "if_exists": "do_nothing"}),
            409,
        ),
        (KEY_A, json!({"thread_id": "not-a-uuid"}), 422),
        (KEY_A, json!({"if_exists": "replace"}), 422),
    ] {
        let (status, text) = c.call(Method::POST, key, "/threads", Some(body)).await;
        assert_eq!(status, code, "{text}");
    }
    let (status, _) = c
        .call(Method::GET, KEY_B, &format!("/threads/{chosen}"), None)
        .await;
    assert_eq!(status, 404);
    // Nor run on it by making it on demand.
    let intrude = json!({"thread_id": chosen, "if_not_exists": "create", "messages": said("x")});
    let (status, text) = c.call(Method::POST, KEY_B, "/runs", Some(intrude)).await;
    assert_eq!(status, 409, "{text}");

    // A thread made on demand; a webhook and bad input are refused.
    let fresh = uuid::Uuid::new_v4().to_string();
    let made = c
        .post(
            "/runs/wait",
            json!({"thread_id": fresh, "if_not_exists": "create", "messages": said("new")}),
        )
        .await;
    assert_eq!(made["run"]["thread_id"], fresh.as_str(), "{made}");
    assert_eq!(
        c.get(&format!("/threads/{fresh}")).await["thread_id"],
        fresh.as_str()
    );
    for (body, field) in [
        (
            json!({"messages": said("x"), "webhook": "http://169.254.169.254/"}),
            "webhook",
        ),
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": said("x"), "if_not_exists": "maybe"}),
            "if_not_exists",
        ),
        (
            json!({"messages": said("x"), "stream_mode": "debug"}),
            "stream_mode",
        ),
    ] {
        let (status, text) = c.call(Method::POST, KEY_A, "/runs", Some(body)).await;
        assert_eq!(status, 422, "{text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{message}");
    }
    let (status, _) = c.call(Method::GET, KEY_A, "/runs/not-a-uuid", None).await;
    assert_eq!(status, 404);

    stop(&mut child).await;
}
