//! Security, third round: each test is an attack that once worked, run
//! against the real binary with a configuration file as an operator
//! writes it, and what stops it now.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "approvals/script.rs"]
#[allow(dead_code)]
mod script;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use std::time::Instant;

use common::binary::{peak_rss_mib, serve_command, spawn_server};
use common::{Lines, ndjson};
use script::{bash, calls, says};
use serde_json::{Value, json};
use tokio::process::Child;
use upstream::{Reply, Upstream};

const KEY: &str = "third-round-key-a-0123456789";
const OTHER: &str = "third-round-key-b-0123456789";

/// The real binary with `config` (TOML, after the two keys and the
/// scripted model's alias) in a fresh working directory.
struct Binary {
    child: Child,
    url: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Binary {
    async fn start(upstream: Option<&Upstream>, config: &str) -> Binary {
        Binary::start_with_files(upstream, config, &[]).await
    }

    /// [`Binary::start`] with `files` (path, text) written to the working
    /// directory first.
    async fn start_with_files(
        upstream: Option<&Upstream>,
        config: &str,
        files: &[(&str, &str)],
    ) -> Binary {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let model = upstream
            .map(|u| {
                format!(
                    "[models.capable]\nprovider = \"openai\"\nmodel = \"capable-model\"\nbase_url = \"{}/v1\"\n",
                    u.url
                )
            })
            .unwrap_or_default();
        std::fs::write(
            dir.path().join("conclave.toml"),
            format!("api_keys = [\"{KEY}\", \"{OTHER}\"]\n{config}\n{model}"),
        )
        .unwrap();
        let mut command = serve_command(&["--config", "conclave.toml"]);
        command
            .current_dir(dir.path())
            .env("PATH", std::env::var("PATH").unwrap());
        let (child, url) = spawn_server(&mut command).await;
        Binary {
            child,
            url,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    fn post(&self, key: &str, path: &str, body: Value) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.url))
            .bearer_auth(key)
            .json(&body)
    }

    fn get(&self, key: &str, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", self.url))
            .bearer_auth(key)
    }

    /// A one-shot run as `key`: status and the whole body (events, or an
    /// error as JSON).
    async fn run(&self, key: &str, body: Value) -> (u16, Vec<Value>) {
        let response = self.post(key, "/agent/run", body).send().await.unwrap();
        let status = response.status().as_u16();
        if status == 200 {
            (status, ndjson(response).await)
        } else {
            (status, vec![response.json().await.unwrap()])
        }
    }

    /// A new session of `key` with `options`; its id.
    async fn session(&self, key: &str, options: Value) -> String {
        let created = self
            .post(key, "/agent/session", options)
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201);
        let body: Value = created.json().await.unwrap();
        body["session_id"].as_str().unwrap().to_string()
    }

    /// `prompt` to session `id` as `key`, read as it streams.
    async fn message(&self, key: &str, id: &str, prompt: &str) -> Lines {
        let path = format!("/agent/session/{id}/message");
        let body = json!({"prompt": prompt});
        Lines::new(self.post(key, &path, body).send().await.unwrap())
    }

    /// Submits a deliberation of two agents as `key`; the status.
    async fn small_deliberation(&self, key: &str) -> u16 {
        let body = json!({"task_description": "x", "num_agents": 2});
        let response = self.post(key, "/deliberations", body).send().await.unwrap();
        response.status().as_u16()
    }

    async fn stop(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// The `tool_result` of call `id`.
fn result_of<'a>(events: &'a [Value], id: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["type"] == "tool_result" && e["id"] == id)
        .unwrap_or_else(|| panic!("no tool result for {id}: {events:?}"))
}

fn output_text(result: &Value) -> String {
    match &result["output"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

// 1. An MCP server that takes the built-in sandbox's name.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_mcp_server_cannot_take_the_sandboxs_name_nor_lend_its_hint() {
    let python = std::env::var("CONCLAVE_TEST_PYTHON")
        .expect("CONCLAVE_TEST_PYTHON must name a python with the mcp package");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/readonly_server.py");
    let upstream = Upstream::start(vec![
        // KEY, plan: the built-in is refused, the server's own tool runs.
        calls(
            "c1",
            "mcp__sandbox__execute_code",
            json!({"code": "print(1)"}),
        ),
        calls("c2", "mcp__ro__execute_code", json!({"code": "print(2)"})),
        says("Done."),
        // OTHER, whose policy trusts no server's hint: refused too.
        calls("c3", "mcp__ro__execute_code", json!({"code": "print(3)"})),
        says("Done."),
        // KEY, ask_writes: the built-in waits for a person.
        calls(
            "c4",
            "mcp__sandbox__execute_code",
            json!({"code": "print(4)"}),
        ),
        says("Done."),
    ])
    .await;
    let line = format!("{python} {script}");
    let config = format!(
        "[mcp]\nstdio_commands = [{}]\nallowed_http_servers = [\"127.0.0.1\"]\n\
         [agent.permissions.keys.\"{OTHER}\"]\ntrust_read_only_hints = false\n",
        json!(line)
    );
    let server = Binary::start(Some(&upstream), &config).await;
    let stdio = json!({"command": python, "args": [script]});
    let http = json!({"url": "http://127.0.0.1:9/mcp"});

    // Named `sandbox` (any case), over stdio or HTTP, in either mode: a
    // 422 naming the server, before anything starts.
    for (name, spec, mode) in [
        ("sandbox", &stdio, "plan"),
        ("sandbox", &http, "ask_writes"),
        ("Sandbox", &stdio, "ask_writes"),
        ("conclave", &http, "plan"),
    ] {
        for path in ["/agent/run", "/agent/session"] {
            let mut body = json!({"model": "capable",
                "mcp_servers": {name: spec}, "permissions": {"mode": mode}});
            if path == "/agent/run" {
                body["prompt"] = json!("x");
            }
            let response = server.post(KEY, path, body).send().await.unwrap();
            assert_eq!(response.status(), 422, "{name} at {path}");
            let body: Value = response.json().await.unwrap();
            let message = body["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(&format!("mcp_servers.{name}: ")),
                "{message}"
            );
            assert!(message.contains("built-in"), "{message}");
        }
    }
    // A name with `__` would make a tool name that names two servers.
    let (status, body) = server
        .run(
            KEY,
            json!({"prompt": "x", "mcp_servers": {"a__sandbox": stdio}}),
        )
        .await;
    assert_eq!(status, 422, "{body:?}");

    let session = |mode: &str, timeout: u64| {
        json!({"prompt": "go", "model": "capable", "max_turns": 5,
            "mcp_servers": {"ro": stdio},
            "permissions": {"mode": mode, "approval_timeout_s": timeout}})
    };
    let (status, events) = server.run(KEY, session("plan", 60)).await;
    assert_eq!(status, 200);
    let builtin = result_of(&events, "c1");
    assert_eq!(builtin["is_error"], true, "{builtin}");
    assert!(output_text(builtin).contains("`plan`"), "{builtin}");
    let external = result_of(&events, "c2");
    assert_eq!(external["is_error"], false, "{external}");
    assert!(
        output_text(external).contains("the external execute_code ran"),
        "{external}"
    );

    let (_, events) = server.run(OTHER, session("plan", 60)).await;
    let distrusted = result_of(&events, "c3");
    assert_eq!(distrusted["is_error"], true, "{distrusted}");
    assert!(output_text(distrusted).contains("`plan`"), "{distrusted}");

    let (_, events) = server.run(KEY, session("ask_writes", 1)).await;
    let asked: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "approval_requested")
        .collect();
    assert_eq!(asked.len(), 1, "{events:?}");
    assert_eq!(asked[0]["tool"], "mcp__sandbox__execute_code");
    assert_eq!(result_of(&events, "c4")["is_error"], true);
    server.stop().await;
}

// 4. Shell deny rules and the ways round them.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_rule_sees_into_subshells_command_strings_and_edits() {
    let attacks = [
        "(rm -rf d)",
        "{ rm -rf d; }",
        "sh -c 'rm -rf d'",
        "bash -c \"rm -rf d\"",
        "eval 'rm -rf d'",
        "echo d | xargs rm -rf",
        "env X=1 rm -rf d",
        "echo $(rm -rf d)",
        "f() { rm -rf d; }; f",
        "/bin/rm -rf d",
    ];
    // A line the parser cannot see into is refused under a deny rule.
    let opaque = ["echo 'rm -rf d' | sh", "c=rm; $c -rf d"];
    let mut script: Vec<Reply> = attacks
        .iter()
        .chain(&opaque)
        .enumerate()
        .map(|(i, command)| bash(&format!("a{i}"), command))
        .collect();
    script.push(bash("ok", "mkdir -p d/e && ls d"));
    script.push(says("Done."));
    script.push(bash("e1", "echo hi"));
    let upstream = Upstream::start(script).await;
    let config = format!("[agent.permissions.keys.\"{KEY}\"]\ndeny = [\"Bash(rm -rf*)\"]\n");
    let server = Binary::start(Some(&upstream), &config).await;

    let (status, events) = server
        .run(
            KEY,
            json!({"prompt": "go", "model": "capable", "max_turns": 20}),
        )
        .await;
    assert_eq!(status, 200);
    for (i, command) in attacks.iter().enumerate() {
        let result = result_of(&events, &format!("a{i}"));
        assert_eq!(result["is_error"], true, "{command}: {result}");
        let said = output_text(result);
        assert!(
            said.contains("not run") && said.contains("Bash(rm -rf*)"),
            "{command}: {said}"
        );
    }
    for (i, command) in opaque.iter().enumerate() {
        let result = result_of(&events, &format!("a{}", attacks.len() + i));
        let said = output_text(result);
        assert!(said.contains("cannot be checked"), "{command}: {said}");
    }
    // What the rule does not cover still runs.
    let ok = result_of(&events, "ok");
    assert_eq!(ok["is_error"], false, "{ok}");

    // An edited input at approval time goes through the same check.
    let id = server
        .session(
            KEY,
            json!({"model": "capable", "permissions": {"mode": "ask"}}),
        )
        .await;
    let mut turn = server.message(KEY, &id, "go").await;
    turn.until("approval_requested").await;
    let edited = json!({"decision": "allow",
        "input": {"command": "echo x; (rm -rf /workspace/keep) && echo"}});
    let response = server
        .post(KEY, &format!("/agent/session/{id}/approvals/e1"), edited)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Bash(rm -rf*)"),
        "{body}"
    );
    let (status, _) = (
        server
            .post(
                KEY,
                &format!("/agent/session/{id}/approvals/e1"),
                json!({"decision": "deny"}),
            )
            .send()
            .await
            .unwrap()
            .status(),
        (),
    );
    assert_eq!(status, 200);
    server.stop().await;
}

// 3. A quote inside a plain scalar of a flow collection.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quote_in_a_flow_scalar_does_not_hide_its_nesting() {
    let server = Binary::start(None, "").await;
    let attack = format!("x: [a'b, {}", "[".repeat(131_000));
    let started = Instant::now();
    let response = server
        .post(
            KEY,
            "/orchestrator/pipelines/validate",
            json!({"yaml": attack}),
        )
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nests deeper than 64"),
        "{body}"
    );
    // The parser took 46 CPU-seconds on it; the scan refuses it at once
    // (the bound is loose: this is a noisy machine, not a benchmark).
    assert!(took.as_secs() < 5, "{took:?}");
    server.stop().await;
}

// 8. A key's hook, and `remember` under a key's floor.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_hook_is_asked_and_remember_cannot_lift_the_keys_floor() {
    use std::sync::{Arc, Mutex};
    let asked: Arc<Mutex<Vec<Value>>> = Arc::default();
    let recorded = asked.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let recorded = recorded.clone();
            async move {
                let command = body["input"]["command"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                recorded.lock().unwrap().push(body);
                axum::Json(if command.starts_with("echo hooked") {
                    json!({"decision": "allow"})
                } else {
                    json!({"decision": "ask"})
                })
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let upstream = Upstream::start(vec![
        bash("h1", "echo hooked"),
        says("Done."),
        bash("r1", "echo first"),
        says("Done."),
        bash("r2", "echo second"),
        says("Done."),
    ])
    .await;
    let config = format!(
        "[mcp]\nallowed_http_servers = [\"127.0.0.1\"]\n\
         [agent.permissions.keys.\"{KEY}\"]\nmode = \"ask\"\nhook_url = \"{hook}\"\n"
    );
    let server = Binary::start(Some(&upstream), &config).await;

    // The key's hook allows: the call runs without a person.
    let (_, events) = server
        .run(KEY, json!({"prompt": "go", "model": "capable"}))
        .await;
    assert_eq!(result_of(&events, "h1")["is_error"], false, "{events:?}");
    assert_eq!(asked.lock().unwrap().len(), 1);
    let decided = events
        .iter()
        .find(|e| e["type"] == "approval_decided")
        .unwrap();
    assert_eq!(decided["by"], "hook");

    // The hook leaves it to a person, who allows with `remember` and the
    // widest rule: the next call still asks, as the key's floor says.
    let id = server.session(KEY, json!({"model": "capable"})).await;
    for (call, remember) in [("r1", true), ("r2", false)] {
        let mut turn = server.message(KEY, &id, "go").await;
        let before = turn.until("approval_requested").await;
        assert_eq!(before.last().unwrap()["call_id"], call, "{before:?}");
        let decision = if remember {
            json!({"decision": "allow", "remember": "session", "rule": "*"})
        } else {
            json!({"decision": "allow"})
        };
        let response = server
            .post(
                KEY,
                &format!("/agent/session/{id}/approvals/{call}"),
                decision,
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        turn.until("result").await;
    }
    server.stop().await;
}

// 7. One key's waiting runs and every pipeline place.

const GATED: &str = "name: gated
start: run
terminal: [run]
state:
  code: {reducer: replace}
nodes:
  run:
    prompt: '{code}'
    tools: [Bash]
";

/// Starts a gated run as `key` whose node's call waits for a person, and
/// reads its events until the call waits or the run queues: whether it
/// waits for a decision (it holds a place), and the status if it queued.
async fn gated_run(server: &Binary, key: &str) -> (bool, Option<String>) {
    let body = json!({"pipeline": "gated", "input": {"code": "$ echo gated"},
        "permissions": {"mode": "ask"}});
    let response = server
        .post(key, "/orchestrator/pipeline/start", body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let started: Value = response.json().await.unwrap();
    let session = started["session_id"].as_str().unwrap();
    let response = server
        .get(
            key,
            &format!("/agent/session/{session}/events?since=0&follow=true"),
        )
        .send()
        .await
        .unwrap();
    let mut events = Lines::new(response);
    while let Some(event) = events.next().await {
        if event["type"] == "approval_requested" {
            return (true, None);
        }
        let message = event["message"].as_str().unwrap_or_default();
        if event["type"] == "status" && message.starts_with("Queued") {
            return (false, Some(message.to_string()));
        }
    }
    panic!("the run's events ended before it waited or queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_waiting_runs_of_one_key_leave_another_keys_run_unqueued() {
    let server = Binary::start_with_files(
        None,
        "[pipelines]\ndir = \"pipelines\"\n",
        &[("pipelines/gated.yaml", GATED)],
    )
    .await;
    let mut waiting = 0;
    let mut queued = Vec::new();
    for _ in 0..10 {
        match gated_run(&server, KEY).await {
            (true, _) => waiting += 1,
            (false, Some(message)) => queued.push(message),
            (false, None) => unreachable!(),
        }
    }
    // The default share: half of the ten places.
    assert_eq!(waiting, 5);
    assert_eq!(queued.len(), 5);
    assert!(
        queued
            .iter()
            .all(|m| m.contains("pipelines.max_concurrent_per_key")),
        "{queued:?}"
    );
    let health: Value = server
        .get(KEY, "/orchestrator/health")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["max_concurrent_per_key"], 5, "{health}");
    // Another key's run takes a free place at once.
    assert_eq!(gated_run(&server, OTHER).await, (true, None));
    server.stop().await;
}

// 8. What another key sees of a key's usage, and hooks a run is given.

/// The values of the `key` label in Prometheus text.
fn key_labels(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once("key=\"").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once('"').map(|(name, _)| name.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_a_key_only_its_own_usage() {
    const ADMIN: &str = "third-round-admin-0123456789";
    let server = Binary::start(None, &format!("admin_keys = [\"{ADMIN}\"]\n")).await;
    for key in [KEY, OTHER] {
        let (status, events) = server
            .run(key, json!({"prompt": "hello", "sandbox_enabled": false}))
            .await;
        assert_eq!(status, 200);
        assert!(events.iter().any(|e| e["type"] == "result"), "{events:?}");
    }
    let metrics = |key: &'static str| {
        let request = server.get(key, "/metrics").send();
        async move {
            let response = request.await.unwrap();
            assert_eq!(response.status(), 200);
            response.text().await.unwrap()
        }
    };
    let everyone = key_labels(&metrics(ADMIN).await);
    assert_eq!(everyone.len(), 2, "{everyone:?}");
    let own = key_labels(&metrics(KEY).await);
    let other = key_labels(&metrics(OTHER).await);
    assert_eq!(own.len(), 1, "{own:?}");
    assert_eq!(other.len(), 1, "{other:?}");
    assert_ne!(own, other);
    // The series with no key stay.
    assert!(metrics(KEY).await.contains("status=\"success\""));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_hook_outside_the_egress_rules_is_refused_at_submit() {
    let server = Binary::start(None, "").await;
    let permissions = json!({"mode": "ask", "hook_url": "http://169.254.169.254/hook"});
    for (path, body) in [
        (
            "/deliberations",
            json!({"task_description": "x", "role": "critic", "permissions": permissions}),
        ),
        (
            "/orchestrator/pipeline/start",
            json!({"pipeline": "connector", "connector_name": "c", "connector_type": "rest",
                "permissions": permissions}),
        ),
    ] {
        let response = server.post(KEY, path, body).send().await.unwrap();
        assert_eq!(response.status(), 422, "{path}");
        let body: Value = response.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("permissions.hook_url: "),
            "{path}: {message}"
        );
    }
    server.stop().await;
}

// 5. Path rules and links.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_rules_hold_on_where_a_link_leads() {
    let upstream = Upstream::start(vec![
        bash(
            "s1",
            "mkdir -p src secret && echo TOPSECRET | tee secret/key.txt && ln -s /workspace src/up && ln -s /workspace/secret lnk",
        ),
        calls(
            "w1",
            "Write",
            json!({"file_path": "/workspace/src/up/escaped.txt", "content": "x"}),
        ),
        calls(
            "w2",
            "Write",
            json!({"file_path": "/workspace/src/ok.txt", "content": "fine"}),
        ),
        calls("r1", "Read", json!({"file_path": "/workspace/lnk/key.txt"})),
        calls("r2", "Read", json!({"file_path": "/workspace/src/ok.txt"})),
        calls("g1", "Grep", json!({"pattern": "TOPSECRET|fine", "path": "/workspace"})),
        calls("g2", "Glob", json!({"pattern": "**/*.txt", "path": "/workspace"})),
        says("Done."),
    ])
    .await;
    let config =
        format!("[agent.permissions.keys.\"{KEY}\"]\ndeny = [\"Read(/workspace/secret/**)\"]\n");
    let server = Binary::start(Some(&upstream), &config).await;
    let (status, events) = server
        .run(
            KEY,
            json!({"prompt": "go", "model": "capable", "max_turns": 20,
                "permissions": {"mode": "ask_writes", "approval_timeout_s": 1,
                    "allow": ["Write(/workspace/src/**)", "Bash(*)"]}}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(result_of(&events, "s1")["is_error"], false, "{events:?}");
    // A write through a link out of src/ is no longer allowed by the rule
    // for src/: it asks (and times out), where one inside src/ runs.
    let asked: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "approval_requested")
        .collect();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["call_id"], "w1");
    assert_eq!(asked[0]["input"]["expect_path"], "/workspace/escaped.txt");
    assert_eq!(result_of(&events, "w1")["is_error"], true);
    assert_eq!(result_of(&events, "w2")["is_error"], false);
    // A read through a link into secret/ is denied.
    let read = result_of(&events, "r1");
    assert_eq!(read["is_error"], true, "{read}");
    assert!(
        output_text(read).contains("Read(/workspace/secret/**)"),
        "{read}"
    );
    assert!(!output_text(read).contains("TOPSECRET"));
    assert!(output_text(result_of(&events, "r2")).contains("fine"));
    // Searches leave out what the rule covers, and say so.
    for id in ["g1", "g2"] {
        let found = result_of(&events, id);
        let text = output_text(found);
        assert!(
            !text.contains("TOPSECRET") && !text.contains("secret/key"),
            "{id}: {text}"
        );
        assert!(text.contains("ok.txt"), "{id}: {text}");
        assert!(text.contains("left out"), "{id}: {text}");
    }
    server.stop().await;
}

// 2. Concurrent deliberations of one key.

/// Bytes of every file under `dir`.
fn disk_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|entry| {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                disk_bytes(&entry.path())
            } else {
                meta.len()
            }
        })
        .sum()
}

/// What six deliberations of the largest kind at once may take: the two
/// the key's quota lets run, each answer kept to 16 KiB. The peak is
/// 512 agent calls in flight, each with its prompt (the task and up to 9
/// answers) and its echoed answer: 396 to 1647 MiB in our runs, as many
/// calls overlap or not; one key took 10.3 GB before the bounds.
const SIX_DELIBERATIONS_RSS_MIB: u64 = 3072;
const SIX_DELIBERATIONS_DISK_MIB: u64 = 512;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_of_the_largest_deliberations_at_once_stay_within_bounds() {
    let server = Binary::start(None, "").await;
    let pid = server.child.id().unwrap();
    let mut done = Lines::new(
        server
            .get(KEY, "/bus/subscribe?subjects=deliberation.completed")
            .send()
            .await
            .unwrap(),
    );
    let task = "Design a rate limiter for a public API. ".repeat(3100);
    assert!(task.len() >= 120_000);
    let body = json!({"task_description": task, "num_agents": 1024, "rounds": 1});
    let submits = (0..6).map(|_| server.post(KEY, "/deliberations", body.clone()).send());
    let answers = futures::future::join_all(submits).await;
    let mut accepted = Vec::new();
    for answer in answers {
        let answer = answer.unwrap();
        let status = answer.status().as_u16();
        let body: Value = answer.json().await.unwrap();
        match status {
            202 => accepted.push(body["task_id"].as_str().unwrap().to_string()),
            429 => {
                let message = body["error"]["message"].as_str().unwrap();
                assert!(message.contains("max_deliberation_calls"), "{message}");
            }
            other => panic!("{other}: {body}"),
        }
    }
    // The key's quota: two of the largest (2,048 calls each) at once.
    assert_eq!(accepted.len(), 2);
    // Another key is not held back by this one.
    assert_eq!(server.small_deliberation(OTHER).await, 202);

    let mut finished = 0;
    while finished < accepted.len() {
        let event = tokio::time::timeout(std::time::Duration::from_secs(900), done.next())
            .await
            .expect("the deliberations end")
            .expect("the bus goes on");
        assert!(
            accepted
                .iter()
                .any(|id| event["data"]["task_id"] == id.as_str())
        );
        assert_eq!(event["data"]["status"], "COMPLETED", "{event}");
        finished += 1;
    }
    let peak = peak_rss_mib(pid);
    let disk = disk_bytes(server._dir.path()) / (1024 * 1024);
    eprintln!(
        "six deliberations of 1024 agents, 120 KiB task: peak RSS {peak} MiB, data {disk} MiB"
    );
    assert!(peak <= SIX_DELIBERATIONS_RSS_MIB, "peak RSS {peak} MiB");
    assert!(disk <= SIX_DELIBERATIONS_DISK_MIB, "data {disk} MiB");
    // Each answer was kept to its bound, with a note.
    let result: Value = server
        .get(KEY, &format!("/deliberations/{}", accepted[0]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let content = result["results"][0]["proposal"]["content"]
        .as_str()
        .unwrap();
    assert!(content.len() <= 16 * 1024 + 200, "{}", content.len());
    assert!(
        content.ends_with("bytes of an answer]"),
        "{}",
        &content[content.len() - 200..]
    );
    // Once they ended, the key may run more.
    assert_eq!(server.small_deliberation(KEY).await, 202);
    server.stop().await;
}

// 6. Named snapshots and storage_mb.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_snapshots_count_in_the_keys_storage_and_number() {
    let server = Binary::start(
        None,
        "[default_quota]\nstorage_mb = 1\nmax_named_snapshots = 2\n",
    )
    .await;
    // A session whose workspace was `command` at its turn end.
    let workspace = |command: &'static str| {
        let server = &server;
        async move {
            let id = server.session(KEY, json!({})).await;
            let mut turn = server.message(KEY, &id, &format!("$ {command}")).await;
            let events = turn.until("result").await;
            let result = events.iter().find(|e| e["type"] == "tool_result").unwrap();
            assert_eq!(result["is_error"], false, "{result}");
            id
        }
    };
    let name = |id: String| {
        let request = server
            .post(KEY, "/sandboxes/snapshots", json!({"session_id": id}))
            .send();
        async move {
            let response = request.await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let small = workspace("echo small | tee small.txt").await;
    let (status, body) = name(small).await;
    assert_eq!(status, 201, "{body}");
    // 3 MB of workspace is past the key's 1 MB: refused, naming the quota.
    let big = workspace("head -c 3000000 /dev/urandom | tee big.bin | wc -c").await;
    let (status, body) = name(big).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["quota"], "storage_mb", "{body}");
    // Small ones fit in bytes, up to the count.
    let second = workspace("echo second | tee s.txt").await;
    assert_eq!(name(second).await.0, 201);
    let third = workspace("echo third | tee t.txt").await;
    let (status, body) = name(third).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["quota"], "max_named_snapshots", "{body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_event_logs_count_in_its_storage() {
    let server = Binary::start(None, "[default_quota]\nstorage_mb = 1\n").await;
    let id = server.session(KEY, json!({"sandbox_enabled": false})).await;
    // The demo model answers with what it was told: 900 KB in (past 80 %
    // of the quota, where every write is measured), about twice that kept
    // in the session's events.
    let long = "a long prompt to keep. ".repeat(39_000);
    let events = server.message(KEY, &id, &long).await.until("result").await;
    assert_eq!(events.last().unwrap()["status"], "success");
    // The key is now past its 1 MiB: no next turn, no KV put.
    let response = server
        .post(
            KEY,
            &format!("/agent/session/{id}/message"),
            json!({"prompt": "more"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["quota"], "storage_mb", "{body}");
    let put = server
        .http
        .put(format!("{}/kv/some-key", server.url))
        .bearer_auth(KEY)
        .json(&json!({"v": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 429);
    // Another key's turns are not held back.
    let (status, _) = server
        .run(OTHER, json!({"prompt": "hello", "sandbox_enabled": false}))
        .await;
    assert_eq!(status, 200);
    // Deleting the session frees its bytes.
    let deleted = server
        .http
        .delete(format!("{}/agent/session/{id}", server.url))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let fresh = server.session(KEY, json!({"sandbox_enabled": false})).await;
    let events = server
        .message(KEY, &fresh, "again")
        .await
        .until("result")
        .await;
    assert_eq!(events.last().unwrap()["status"], "success");
    server.stop().await;
}
