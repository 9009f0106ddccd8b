//! The real binary against its own `/openapi.json`, checked by
//! schemathesis (`CONCLAVE_TEST_SCHEMATHESIS`, installed by
//! `scripts/test.sh` in a venv of its own): for requests generated from
//! every operation's schema, no answer is a 5xx, and every answer's status,
//! content type, headers and body are ones the document lists.
//!
//! The server has an API key, which every request carries. Left out, and
//! why: the WebSocket upgrades and `/bus/subscribe` (no HTTP answer to
//! check), `/kv` (with `watch=true` it streams until the client leaves),
//! a session's `/events` (it follows the log), the weight-update routes
//! (they pause a pool for the rest of the run), and the workspace upload
//! (schemathesis cannot write a tar body). Schemathesis' checks of what is
//! accepted or refused (`positive_data_acceptance`,
//! `negative_data_rejection`) are not run: the schema does not yet carry
//! every constraint the routes check (a KV key's characters, a turn end
//! that exists): benches/README.md, "OpenAPI conformance", has what they find.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::binary::{serve_command, spawn_server, stop};

const KEY: &str = "schemathesis-key-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_is_one_the_openapi_document_lists() {
    let schemathesis = std::env::var("CONCLAVE_TEST_SCHEMATHESIS").unwrap_or_else(|_| {
        panic!(
            "missing prerequisite: CONCLAVE_TEST_SCHEMATHESIS is not set. Run scripts/test.sh, \
             which installs schemathesis from PyPI and sets it"
        )
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("conclave.toml"),
        format!("api_keys = [\"{KEY}\"]\n"),
    )
    .unwrap();
    let mut command = serve_command(&["--sandbox", "local", "--config", "conclave.toml"]);
    command.current_dir(dir.path());
    let (mut child, url) = spawn_server(&mut command).await;

    let output = tokio::process::Command::new(&schemathesis)
        .current_dir(dir.path())
        .args(["run", &format!("{url}/openapi.json")])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_headers_conformance,response_schema_conformance",
        ])
        .args(["-H", &format!("Authorization: Bearer {KEY}")])
        .args(["--max-examples", "3", "--request-timeout", "30"])
        .args([
            "--exclude-path-regex",
            "ws$|/bus/subscribe|^/kv$|/events$|/weights/",
        ])
        .args(["--exclude-operation-id", "upload"])
        .arg("--generation-deterministic")
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {schemathesis}: {e}"));
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "schemathesis found answers the document does not list ({}):\n{report}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    // It ran the operations, not none of them.
    let tested = report
        .lines()
        .find_map(|line| line.trim().strip_prefix("Tested: "))
        .and_then(|n| n.trim().parse::<u32>().ok())
        .unwrap_or_else(|| panic!("no count of tested operations in:\n{report}"));
    assert!(tested >= 60, "only {tested} operations tested:\n{report}");
    stop(&mut child).await;
}
