//! `POST /agent/session` and `POST /agent/run` with a
//! `multipart/form-data` body (the JSON request, then a tar and files), as
//! the real binary serves them with its default flags: the files are in
//! the workspace before the first turn, each logged as
//! `workspace_uploaded`; a refused part leaves no session behind; a form
//! that another site's page sends is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use common::binary::{get_keyed, serve_command, spawn_server, stop, tool_results};
use serde_json::{Value, json};
use upstream::{Reply, Upstream, says, tool_call};

const KEY: &str = "form-key-00001";
const BOUNDARY: &str = "conclave-test-boundary-7d1f";

fn bash(id: &str, command: &str) -> Reply {
    tool_call(id, "Bash", json!({"command": command}))
}

/// A tar of `README.md` and `src/app.py`.
fn tar_of_two() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, text) in [
        ("README.md", "# uploaded readme\n"),
        ("src/app.py", "print('app')\n"),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, path, text.as_bytes())
            .unwrap();
    }
    builder.into_inner().unwrap()
}

/// A part: its name, its filename, its bytes.
type Part<'a> = (&'a str, Option<&'a str>, Vec<u8>);

fn form(parts: &[Part]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, file, bytes) in parts {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        let disposition = match file {
            Some(file) => format!("form-data; name=\"{name}\"; filename=\"{file}\""),
            None => format!("form-data; name=\"{name}\""),
        };
        body.extend_from_slice(format!("Content-Disposition: {disposition}\r\n\r\n").as_bytes());
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

async fn post_form(url: String, body: Vec<u8>, extra: &[(&str, &str)]) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(KEY)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body);
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn session_count(base: &str) -> usize {
    let (_, list) = get_keyed(KEY, format!("{base}/agent/sessions")).await;
    serde_json::from_str::<Value>(&list).unwrap()["sessions"]
        .as_array()
        .map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_puts_the_users_files_in_before_the_first_turn() {
    let read = "cat README.md src/app.py lib/extra.txt";
    let upstream = Upstream::start(vec![
        bash("c1", read),
        says("read them"),
        bash("c2", read),
        says("read them again"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[keys.form]\nkey = \"{KEY}\"\n\n[models.capable]\nprovider = \"openai\"\nmodel = \"capable-model\"\nbase_url = \"{}/v1\"\n",
        upstream.url
    );
    std::fs::write(dir.path().join("conclave.toml"), config).unwrap();
    let mut command = serve_command(&["--config", "conclave.toml"]);
    command.current_dir(dir.path());
    let (mut child, base) = spawn_server(&mut command).await;
    let parts = |request: Value| -> Vec<u8> {
        form(&[
            ("request", None, request.to_string().into_bytes()),
            ("workspace", Some("code.tar"), tar_of_two()),
            ("file", Some("lib/extra.txt"), b"extra file\n".to_vec()),
        ])
    };

    // A session made with the files.
    let (status, body) = post_form(
        format!("{base}/agent/session"),
        parts(json!({"model": "capable"})),
        &[],
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let created: Value = serde_json::from_str(&body).unwrap();
    let uploaded = created["uploaded"].as_array().unwrap();
    assert_eq!(uploaded.len(), 2, "{body}");
    assert_eq!(uploaded[0]["files"], 2);
    assert_eq!(uploaded[1]["path"], "/workspace/lib/extra.txt");
    let id = created["session_id"].as_str().unwrap().to_string();
    let (status, turn) = common::binary::send_keyed(
        KEY,
        reqwest::Method::POST,
        format!("{base}/agent/session/{id}/message"),
        Some(json!({"prompt": "read the files"})),
    )
    .await;
    assert_eq!(status, 200, "{turn}");
    let events: Vec<Value> = turn
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let results = tool_results(&events);
    assert!(
        results[0].contains("# uploaded readme")
            && results[0].contains("print('app')")
            && results[0].contains("extra file"),
        "{}",
        results[0]
    );
    let (_, log) = get_keyed(KEY, format!("{base}/agent/session/{id}/events")).await;
    assert_eq!(log.matches("\"workspace_uploaded\"").count(), 2, "{log}");

    // A one-shot run with the files: the stream as a JSON run's.
    let (status, run) = post_form(
        format!("{base}/agent/run"),
        parts(json!({"model": "capable", "prompt": "read the files"})),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{run}");
    let events: Vec<Value> = run
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(tool_results(&events)[0].contains("extra file"), "{run}");
    assert_eq!(events.last().unwrap()["type"], "result", "{run}");

    // Refused: the request part not first; a file outside the workspace;
    // a form from another site's page. None leaves a session behind.
    let before = session_count(&base).await;
    assert!(before >= 2, "the session and the run are listed");
    let misordered = form(&[
        ("file", Some("a.txt"), b"a".to_vec()),
        ("request", None, b"{}".to_vec()),
    ]);
    let (status, body) = post_form(format!("{base}/agent/session"), misordered, &[]).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("first part must be `request`"), "{body}");
    let escaping = form(&[
        (
            "request",
            None,
            json!({"model": "capable"}).to_string().into_bytes(),
        ),
        ("file", Some("../../etc/x"), b"x".to_vec()),
    ]);
    let (status, body) = post_form(format!("{base}/agent/session"), escaping, &[]).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("bad_path"), "{body}");
    let hostile = parts(json!({"model": "capable"}));
    let (status, body) = post_form(
        format!("{base}/agent/session"),
        hostile.clone(),
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = post_form(
        format!("{base}/agent/run"),
        hostile,
        &[("origin", "http://evil.example")],
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(session_count(&base).await, before);
    stop(&mut child).await;
}
