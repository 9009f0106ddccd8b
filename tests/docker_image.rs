//! The server image of the top-level `Dockerfile`, as `scripts/test.sh`
//! built it (its name in `CONCLAVE_TEST_SERVER_IMAGE`), run the way its
//! README says: API keys in the environment, the docker socket mounted for
//! sandboxes, the port published. It answers its probes, serves the
//! dashboard and runs a turn; docker sees it healthy; it runs as its own
//! user and stops with exit code 0. It carries git, for
//! `options.workspace.git`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::ndjson;
use serde_json::{Value, json};

const KEY: &str = "image-test-key-0123456789";

fn docker(args: &[&str]) -> String {
    let output = Command::new("docker").args(args).output().expect("docker");
    assert!(
        output.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// A container removed when the test ends, whatever its outcome.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

fn inspect(container: &Container, format: &str) -> String {
    docker(&["inspect", "-f", format, &container.0])
}

/// Waits for `check` to hold, failing with `what` after `within`.
async fn wait_for(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn the_image_serves_probes_the_dashboard_and_a_turn() {
    let image = std::env::var("CONCLAVE_TEST_SERVER_IMAGE").unwrap_or_else(|_| {
        panic!(
            "CONCLAVE_TEST_SERVER_IMAGE is not set: scripts/test.sh builds the image \
             (ensure_server_image in scripts/lib.sh) and exports it"
        )
    });
    // options.workspace.git clones with the server's own git.
    let git = docker(&["run", "--rm", "--entrypoint", "git", &image, "--version"]);
    assert!(git.starts_with("git version"), "{git}");
    let socket = "/var/run/docker.sock";
    let group = std::fs::metadata(socket)
        .map(|m| std::os::unix::fs::MetadataExt::gid(&m).to_string())
        .unwrap_or_else(|e| panic!("{socket}: {e} (scripts/test.sh starts dockerd)"));
    let container = Container(docker(&[
        "run",
        "-d",
        "-p",
        "127.0.0.1::8080",
        "-e",
        &format!("CONCLAVE_API_KEYS={KEY}"),
        "-v",
        &format!("{socket}:{socket}"),
        "--group-add",
        &group,
        &image,
    ]));
    let published = docker(&["port", &container.0, "8080/tcp"]);
    let url = format!("http://{}", published.lines().next().unwrap());
    let http = reqwest::Client::new();

    wait_for("/health answers", Duration::from_secs(60), async || {
        let health = http.get(format!("{url}/health")).send().await;
        health.is_ok_and(|r| r.status() == 200)
    })
    .await;
    let ready = http.get(format!("{url}/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    assert_eq!(
        ready.json::<Value>().await.unwrap(),
        json!({"status": "ready", "store": "ok", "bus": "ok", "draining": false})
    );
    // The embedded dashboard, and the key it takes for everything else.
    let page = http.get(format!("{url}/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("<html"));
    assert_eq!(
        http.get(format!("{url}/agent/sessions"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let events = ndjson(
        http.post(format!("{url}/agent/run"))
            .bearer_auth(KEY)
            .json(&json!({"prompt": "hello from the image"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let result = events.last().unwrap();
    assert_eq!(result["type"], "result", "{events:?}");
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["result"], "You said: hello from the image");

    // The image's own health check (`conclave health`) and user.
    wait_for(
        "docker reports the container healthy",
        Duration::from_secs(60),
        async || inspect(&container, "{{.State.Health.Status}}") == "healthy",
    )
    .await;
    assert_eq!(inspect(&container, "{{.Config.User}}"), "65532:65532");
    docker(&["stop", "-t", "40", &container.0]);
    assert_eq!(inspect(&container, "{{.State.ExitCode}}"), "0");
}
