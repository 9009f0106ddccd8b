//! The official MCP conformance suite (`@modelcontextprotocol/conformance`
//! from npm, run with Node 24; scripts/test.sh installs both and names
//! them in `CONCLAVE_TEST_MCP_CONFORMANCE` and `CONCLAVE_TEST_NODE`)
//! against `/mcp` of the real binary, started as the README does (default
//! flags but the local sandbox, a fresh working directory). The scenarios
//! that need the kit's own fixture server, and logging, which Conclave
//! does not offer, are the kit's baseline of expected failures
//! (`tests/mcp/conformance-baseline.yml`, which says why for each); every
//! other scenario of the active suite must pass, and a baseline entry that
//! passes fails the run as stale.

use super::common::binary::{serve_command, spawn_server, stop};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_mcp_conformance_suite_passes_what_applies() {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "missing prerequisite: {name} is not set. Run scripts/test.sh, which installs \
                 the MCP conformance suite from npm and Node 24 from PyPI"
            )
        })
    };
    let (node, suite) = (
        var("CONCLAVE_TEST_NODE"),
        var("CONCLAVE_TEST_MCP_CONFORMANCE"),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut command = serve_command(&["--sandbox", "local"]);
    command.current_dir(dir.path());
    let (mut child, url) = spawn_server(&mut command).await;
    let baseline = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/mcp/conformance-baseline.yml"
    );
    let output = tokio::process::Command::new(&node)
        .current_dir(dir.path())
        .arg(&suite)
        .args(["server", "--url", &format!("{url}/mcp")])
        .args(["--expected-failures", baseline])
        .args(["-o", "results"])
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {node} {suite}: {e}"));
    stop(&mut child).await;
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the MCP conformance suite failed:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        report.contains("Baseline check passed"),
        "no baseline check in:\n{report}"
    );
}
