//! The agent's tools end to end: the demo model's tool calls go through the
//! in-process MCP client and server into real docker sandboxes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Lines, TestServer, docker_sandboxes_of, ndjson, types};
use serde_json::{Value, json};

fn tool_results(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_executes_its_code_block_in_a_sandbox() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let prompt = "Please run:\n```python\nimport os\nprint(6 * 7, os.getuid(), os.getcwd())\n```";
    let events = ndjson(server.post("/agent/run", json!({"prompt": prompt})).await).await;
    assert_eq!(
        types(&events),
        [
            "status",
            "thinking",
            "tool_use",
            "tool_result",
            "thinking",
            "result"
        ]
    );
    assert_eq!(events[2]["tool"], "mcp__sandbox__execute_code");
    let output = &events[3]["output"];
    assert_eq!(output["stdout"], "42 1000 /workspace\n", "{output}");
    assert_eq!(output["exit_code"], 0);
    assert_eq!(events[3]["is_error"], false);
    assert_eq!(events[5]["status"], "success");
    // The run's session is over, so is its sandbox.
    let session = events[0]["session_id"].as_str().expect("id");
    let left: Vec<_> = docker_sandboxes_of(&server.data_dir)
        .await
        .into_iter()
        .filter(|s| s.session.as_deref() == Some(session))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    server.stop_and_remove_sandboxes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_one_sandbox_until_it_is_deleted() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let id = server
        .create_session(json!({"options": {"working_dir": "/workspace/proj"}}))
        .await;
    let events = server.turn(&id, "$ echo kept > note.txt && pwd").await;
    assert_eq!(
        tool_results(&events)[0]["output"]["stdout"],
        "/workspace/proj\n"
    );
    let events = server.turn(&id, "$ cat /workspace/proj/note.txt").await;
    assert_eq!(tool_results(&events)[0]["output"]["stdout"], "kept\n");

    let status: Value = server
        .get(&format!("/agent/session/{id}/status"))
        .await
        .json()
        .await
        .expect("json");
    let sandbox = &status["sandbox"];
    assert_eq!(sandbox["backend"], "docker");
    assert_eq!(sandbox["state"], "running");
    assert_eq!(sandbox["image"], "conclave/sandbox-python:latest");
    assert!(
        sandbox["memory_bytes"].as_u64().is_some_and(|b| b > 0),
        "{sandbox}"
    );
    let container = sandbox["id"].as_str().expect("id").to_string();

    let response = server
        .http
        .delete(server.url(&format!("/agent/session/{id}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(response.status(), 200);
    let ids: Vec<String> = docker_sandboxes_of(&server.data_dir)
        .await
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert!(
        !ids.contains(&container),
        "the deleted session's sandbox lives on"
    );
    server.stop_and_remove_sandboxes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupting_a_tool_call_kills_its_process() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let id = server.create_session(json!({})).await;
    let mut lines = Lines::new(server.message(&id, json!({"prompt": "$ sleep 300"})).await);
    lines.until("tool_use").await;
    let response = server
        .post(&format!("/agent/session/{id}/interrupt"), json!({}))
        .await;
    assert_eq!(response.status(), 200);
    let rest = lines.until("result").await;
    assert_eq!(rest.last().expect("result")["status"], "interrupted");
    let events = server
        .turn(&id, "$ ps -eo args | grep -c '^sleep 300' || true")
        .await;
    assert_eq!(tool_results(&events)[0]["output"]["stdout"], "0\n");
    server.stop_and_remove_sandboxes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_tools_and_sandbox_enabled_decide_what_is_offered() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let code = "```python\nprint(1)\n```";
    let events = ndjson(
        server
            .post(
                "/agent/run",
                json!({"prompt": code, "allowed_tools": ["Bash"]}),
            )
            .await,
    )
    .await;
    assert_eq!(types(&events), ["status", "thinking", "result"]);
    assert!(
        events[1]["content"]
            .as_str()
            .is_some_and(|t| t.contains("not available")),
        "{events:?}"
    );
    let events = ndjson(
        server
            .post(
                "/agent/run",
                json!({"prompt": "$ id", "sandbox_enabled": false}),
            )
            .await,
    )
    .await;
    assert_eq!(types(&events), ["status", "thinking", "result"]);
    server.stop_and_remove_sandboxes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_options_are_checked_before_the_session_exists() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    for (options, field) in [
        (json!({"sandbox": {"cpus": 100}}), "options.sandbox.cpus"),
        (
            json!({"sandbox": {"memory_mb": 1}}),
            "options.sandbox.memory_mb",
        ),
        (
            json!({"sandbox": {"backend": "kubernetes"}}),
            "options.sandbox.backend",
        ),
        (
            json!({"sandbox": {"timeout_s": 0}}),
            "options.sandbox.timeout_s",
        ),
    ] {
        for path in ["/agent/session", "/agent/run"] {
            let mut body = json!({"prompt": "$ true", "options": options});
            if path == "/agent/session" {
                body.as_object_mut().expect("object").remove("prompt");
            }
            let response = server.post(path, body).await;
            assert_eq!(response.status(), 422, "{path} {options}");
            let error: Value = response.json().await.expect("json");
            let message = error["error"]["message"].as_str().expect("message");
            assert!(message.contains(field), "{message}");
        }
    }
    // A session's own exec timeout applies to its calls.
    let id = server
        .create_session(json!({"options": {"sandbox": {"timeout_s": 1}}}))
        .await;
    let events = server.turn(&id, "$ sleep 30").await;
    let output = &tool_results(&events)[0]["output"];
    assert_eq!(output["status"], "timeout", "{output}");
    server.stop_and_remove_sandboxes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_stays_healthy_through_a_fork_bomb_and_a_memory_hog() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let id = server
        .create_session(json!({"options": {"sandbox": {"timeout_s": 3, "memory_mb": 128}}}))
        .await;
    let events = server
        .turn(&id, "$ bomb() { bomb | bomb & }; bomb; sleep 10")
        .await;
    assert_eq!(events.last().expect("result")["status"], "success");
    assert_eq!(server.get("/health").await.status(), 200);
    let events = server
        .turn(&id, "$ python3 -c 'x = bytearray(1 << 30)'")
        .await;
    let output = &tool_results(&events)[0]["output"];
    assert_ne!(output["exit_code"], 0, "{output}");
    assert_eq!(server.get("/health").await.status(), 200);
    let events = server.turn(&id, "$ echo fine").await;
    assert_eq!(tool_results(&events)[0]["output"]["stdout"], "fine\n");
    server.stop_and_remove_sandboxes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_image_docker_does_not_have_is_refused_at_creation() {
    let server = TestServer::start_sandboxed(|c| c.sandbox.warm_pool = 0).await;
    let response = server
        .post(
            "/agent/session",
            json!({"options": {"sandbox": {"image": "conclave/no-such-image:1"}}}),
        )
        .await;
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.expect("json");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("options.sandbox.image: no image conclave/no-such-image:1"),
        "{message}"
    );
    let response = server
        .post(
            "/agent/session",
            json!({"options": {"sandbox": {"image": "conclave/sandbox-shell:latest"}}}),
        )
        .await;
    assert_eq!(response.status(), 201);
    server.stop_and_remove_sandboxes().await;
}

/// A long command's output reaches the client while it runs: `tool_output`
/// events between `tool_use` and `tool_result`, stored and replayed like
/// every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_commands_output_streams_as_tool_output_events() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let id = server.create_session(json!({})).await;
    let events = server
        .turn(
            &id,
            "$ for i in 1 2 3 4 5; do echo tick $i; sleep 0.5; done",
        )
        .await;
    let position = |kind: &str| events.iter().position(|e| e["type"] == kind).unwrap();
    let outputs: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_output")
        .collect();
    assert!(!outputs.is_empty(), "{events:?}");
    let first = events
        .iter()
        .position(|e| e["type"] == "tool_output")
        .unwrap();
    assert!(position("tool_use") < first && first < position("tool_result"));
    let streamed: String = outputs
        .iter()
        .map(|e| {
            assert_eq!(e["id"], events[position("tool_use")]["id"]);
            assert_eq!(e["stream"], "stdout", "{e}");
            e["content"].as_str().unwrap()
        })
        .collect();
    assert!(streamed.contains("tick 3"), "{streamed:?}");
    assert!(
        "tick 1\ntick 2\ntick 3\ntick 4\ntick 5\n".contains(&streamed),
        "streamed output is in order and not repeated: {streamed:?}"
    );
    let replay = ndjson(
        server
            .get(&format!("/agent/session/{id}/events?since=0"))
            .await,
    )
    .await;
    assert_eq!(replay, events);
    server.stop_and_remove_sandboxes().await;
}

/// Python runs as a notebook cell: a last line that is an expression has
/// its value printed after the cell's own output; a failing cell's
/// traceback shows the cell's lines, not the runner's; a cell that is a
/// Under the small harness (which asks for repairs): a `python -c` command
/// line runs the code it quotes; a standard module or a `math` function
/// used without an import is imported; a cell that does not parse runs
/// after a repair that makes it parse; methods called on print's result
/// are called inside it; an undefined name gets a hint. Each repair is
/// said on stderr and as an `intervention`. Without it (the strict
/// default) the same cells run as Python runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_shows_the_value_of_a_trailing_expression() {
    let server = TestServer::start_sandboxed(common::with_small_demo).await;
    let output = cell_output(&server, "print('first')\nx = 2\nx ** 100").await;
    assert_eq!(output["stdout"], "first\n1267650600228229401496703205376\n");
    assert_eq!(cell_output(&server, "y = None\ny").await["stdout"], "");
    let output = cell_output(&server, "1 / 0").await;
    let stderr = output["stderr"].as_str().unwrap();
    assert!(stderr.contains("File \"<cell>\", line 1"), "{stderr}");
    assert!(stderr.contains("ZeroDivisionError"), "{stderr}");
    assert!(!stderr.contains("exec("), "{stderr}");
    assert_eq!(output["exit_code"], 1);
    // Plain Python, for a caller that did not ask for repairs.
    let plain = [
        ("print('hello world').upper()", "AttributeError"),
        ("python -c 'print(1)'", "SyntaxError"),
        ("factorial(5)", "NameError: name 'factorial' is not defined"),
        ("x = 6 * 7\nreturn x", "SyntaxError"),
    ];
    for (cell, error) in plain {
        let output = cell_output(&server, cell).await;
        let stderr = output["stderr"].as_str().unwrap();
        assert!(
            stderr.contains(error) && !stderr.contains("repair") && !stderr.contains("hint"),
            "{output}"
        );
        assert_eq!(output["exit_code"], 1, "{output}");
    }
    // A cell written as a command line runs the Python it quotes; a
    // function of `math` it uses without importing it is imported for it.
    let output = repaired_cell_output(&server, "python -c 'print(factorial(20))'").await;
    assert_eq!(output["stdout"], "2432902008176640000\n", "{output}");
    let stderr = output["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("python -c") && stderr.contains("from math import factorial"),
        "{output}"
    );
    // So is one of a few standard modules; a name nothing provides still
    // fails as it would.
    let days = "(datetime.date(2024, 3, 1) - datetime.date(2024, 1, 1)).days";
    assert_eq!(repaired_cell_output(&server, days).await["stdout"], "60\n");
    let output = repaired_cell_output(&server, "no_such_name + 1").await;
    assert!(
        output["stderr"].as_str().unwrap().contains("NameError"),
        "{output}"
    );
    // A cell that does not parse runs after a repair that makes it parse,
    // said on stderr: a bracket left open, statements joined by `;` before
    // a `with`, a line break inside a string and a `for` after a `with` on
    // one line, a bracket that closes nothing, a block not indented,
    // pasted output, a string left open.
    let repairs = [
        (
            "print(sum(int(d) for d in str(2**50))",
            "76\n",
            "closed the brackets left open",
        ),
        (
            "import os; with open('n.txt', 'w') as f: f.write('1 2 3 4 5')\nsum(map(int, open('n.txt').read().split()))",
            "15\n",
            "split statements",
        ),
        // A `'\n'` that arrived as a real line break, and a `for` after
        // the `with` on one line.
        (
            "import sys; with open('n.txt', 'w') as f: for i in range(1, 6): f.write(str(i) + '\n')\nsum(int(x) for x in open('n.txt'))",
            "15\n",
            "wrote the blocks on one line as lines",
        ),
        // The `}` of the call's JSON written inside the code.
        (
            "numbers = [5, 3, 9, 1]\nnumbers.sort()\nprint(numbers)}",
            "[1, 3, 5, 9]\n",
            "dropped brackets that close nothing",
        ),
        // The lines after two `with`s not indented, and the error the
        // model read pasted after its code.
        (
            "with open('notes.txt', 'w') as file:\nfile.write('alpha beta')\nwith open('notes.txt', 'r') as file:\nprint(file.read())\nexit_code: 1\nstatus: error\nstderr: File '<cell>', line 2",
            "alpha beta\n",
            "dropped tool output pasted after the code; indented the line after a `:`",
        ),
        // The cell's result given with a `return`.
        (
            "x = 6 * 7\nreturn x",
            "42\n",
            "took a `return` outside a function",
        ),
        // A recursive function, an `else` without its `:`, and the call,
        // all on one line.
        (
            "def fibonacci(n): if n <= 1: return n else return fibonacci(n-1) + fibonacci(n-2) return fibonacci(20)",
            "6765\n",
            "wrote the blocks on one line as lines",
        ),
        // Parses, and would print and then fail on print's None.
        (
            "print('hello world').upper()",
            "HELLO WORLD\n",
            "ran `print('hello world'.upper())`",
        ),
    ];
    for (cell, stdout, note) in repairs {
        let output = repaired_cell_output(&server, cell).await;
        assert_eq!(output["stdout"], stdout, "{output}");
        assert!(
            output["stderr"].as_str().unwrap().contains(note),
            "{output}"
        );
    }
    let output = repaired_cell_output(&server, "python -c \"print('sandbox'[::-1])\"").await;
    assert_eq!(output["stdout"], "xobdnas\n", "{output}");
    let output = repaired_cell_output(&server, "print('open)").await;
    assert_eq!(output["stdout"], "open\n", "{output}");
    // What no repair makes whole fails with its own syntax error.
    let output = repaired_cell_output(&server, "print(hello world).upper()").await;
    let stderr = output["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("SyntaxError") && !stderr.contains("repair"),
        "{output}"
    );
    assert_eq!(output["exit_code"], 1);
    // A name nothing defines fails, with a hint: quote it when used as a
    // value, define it when called.
    let hints = [
        ("print(sandbox[::-1])", "write it in quotes: 'sandbox'"),
        ("print(is_prime(7))", "define it with `def is_prime(...):`"),
    ];
    for (cell, hint) in hints {
        let output = repaired_cell_output(&server, cell).await;
        let stderr = output["stderr"].as_str().unwrap();
        assert!(
            stderr.contains("NameError") && stderr.contains(hint),
            "{output}"
        );
        assert_eq!(output["exit_code"], 1);
    }
    // `python` is python3 in the image, for models that write either.
    let python = "import subprocess\nsubprocess.run(['python', '-c', 'print(6 * 7)']).returncode";
    assert_eq!(
        repaired_cell_output(&server, python).await["stdout"],
        "42\n0\n"
    );
    server.stop_and_remove_sandboxes().await;
}

/// A session's Python cells see what its earlier cells left (plain values,
/// imports, definitions), as a notebook's do (Qwen2.5-Coder-0.5B set
/// `sandbox = 'sandbox'` in one cell and used it in the next); another
/// session's cells do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_cells_of_a_session_share_their_values() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let id = server.create_session(json!({})).await;
    let cell = |code: &str| format!("```python\n{code}\n```");
    let first =
        "import json\nword = 'sandbox'\ndef twice(n):\n    return 2 * n\nfh = open('f.txt', 'w')";
    let events = server.turn(&id, &cell(first)).await;
    assert_eq!(
        tool_results(&events)[0]["output"]["exit_code"],
        0,
        "{events:?}"
    );
    let events = server
        .turn(
            &id,
            &cell("print(word[::-1], twice(21), json.dumps([1]), 'fh' in dir())"),
        )
        .await;
    assert_eq!(
        tool_results(&events)[0]["output"]["stdout"],
        "xobdnas 42 [1] False\n",
        "{events:?}"
    );
    let output = cell_output(&server, "print(word)").await;
    assert!(
        output["stderr"].as_str().unwrap().contains("NameError"),
        "{output}"
    );
    server.stop_and_remove_sandboxes().await;
}

/// The output of the demo model's one `execute_code` call of a Python cell.
async fn cell_output(server: &TestServer, code: &str) -> Value {
    let prompt = format!("```python\n{code}\n```");
    let events = ndjson(server.post("/agent/run", json!({"prompt": prompt})).await).await;
    tool_results(&events)[0]["output"].clone()
}

/// [`cell_output`] under the small harness: the cell runs with repairs,
/// and each repair that ran is an `intervention` too.
async fn repaired_cell_output(server: &TestServer, code: &str) -> Value {
    let prompt = format!("```python\n{code}\n```");
    let body = json!({"prompt": prompt, "model": "demo-small"});
    let events = ndjson(server.post("/agent/run", body).await).await;
    let output = tool_results(&events)[0]["output"].clone();
    let said: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "intervention" && e["kind"] == "cell_repaired")
        .filter_map(|e| e["detail"].as_str())
        .collect();
    let stderr = output["stderr"].as_str().unwrap_or_default();
    let repairs: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("repair: "))
        .collect();
    assert_eq!(said, repairs, "{events:?}");
    output
}
