//! Named agents (`[agents.NAME]` in the config file), as the real binary
//! serves them at `GET /agents`: the configured profiles, then the session
//! kinds; a profile whose options a session would refuse stops the server
//! at start, naming it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::binary::{serve_command, spawn_server, stop};
use serde_json::Value;

const CONFIG: &str = r#"
[agents.coder]
description = "Writes and runs Python"
options = { model = "demo", system_prompt = "You write Python.", max_turns = 4 }

[agents.panel]
kind = "deliberation"
description = "Three agents vote"
"#;

async fn get(url: &str) -> (u16, Value) {
    let response = reqwest::get(url).await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn configured_agents_are_listed_with_the_session_kinds() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("conclave.toml"), CONFIG).unwrap();
    let mut command = serve_command(&["--sandbox", "local", "--config", "conclave.toml"]);
    command.current_dir(dir.path());
    let (mut child, url) = spawn_server(&mut command).await;

    let (status, body) = get(&format!("{url}/agents")).await;
    assert_eq!(status, 200, "{body}");
    let names: Vec<&str> = body["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "coder",
            "panel",
            "agent",
            "deliberation",
            "pipeline",
            "pipeline:connector"
        ],
        "{body}"
    );
    let (status, coder) = get(&format!("{url}/agents/coder")).await;
    assert_eq!(status, 200, "{coder}");
    assert_eq!(coder["kind"], "agent");
    assert_eq!(coder["model"], "demo");
    assert_eq!(coder["description"], "Writes and runs Python");
    // The profile's prompt is the server's own: it is not handed out.
    assert!(coder.get("options").is_none(), "{coder}");
    // A pipeline definition is an agent of its own.
    let (status, connector) = get(&format!("{url}/agents/pipeline:connector")).await;
    assert_eq!(status, 200, "{connector}");
    assert_eq!(connector["kind"], "pipeline");
    let (_, panel) = get(&format!("{url}/agents/panel")).await;
    assert_eq!(panel["kind"], "deliberation");
    let (status, missing) = get(&format!("{url}/agents/nobody")).await;
    assert_eq!(status, 404, "{missing}");
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("GET /agents"),
        "{missing}"
    );
    stop(&mut child).await;
}

/// Starts the binary with `config`; its exit status and stderr.
async fn refused(config: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("conclave.toml"), config).unwrap();
    let output = serve_command(&["--sandbox", "local", "--config", "conclave.toml"])
        .current_dir(dir.path())
        .output()
        .await
        .unwrap();
    assert!(!output.status.success(), "the server started");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn a_wrong_profile_stops_the_server_at_start() {
    let stderr = refused("[agents.typo]\noptions = { promt = \"hi\" }\n").await;
    assert!(
        stderr.contains("agents.typo") && stderr.contains("promt"),
        "{stderr}"
    );
    let stderr = refused("[agents.x]\noptions = { model = \"no-such-model\" }\n").await;
    assert!(
        stderr.contains("agents.x") && stderr.contains("no-such-model"),
        "{stderr}"
    );
    let stderr = refused("[agents.x]\nkind = \"nonsense\"\n").await;
    assert!(stderr.contains("agents.x"), "{stderr}");
    let stderr = refused("[agents.pipeline]\n").await;
    assert!(stderr.contains("session kind"), "{stderr}");
    let stderr = refused("[agents.\"a b\"]\n").await;
    assert!(stderr.contains("agents.a b"), "{stderr}");
}
