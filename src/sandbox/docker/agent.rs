//! Opening a docker sandbox's channel to its exec helper
//! (`crate::sandbox::helper`): the container's attached stdin and stdout.
//!
//! A container starts with [`BOOT_SCRIPT`], which waits on stdin for the
//! helper. [`connect`] attaches to the container, sends the helper when it
//! is not running yet, and checks that it answers. Where the helper
//! reports no Landlock, runs are not sealed off from that channel; the
//! server logs a warning and carries on.

use std::time::Duration;

use base64::Engine as _;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::AttachContainerOptions;
use futures::StreamExt;

use crate::sandbox::helper::{Agent, HELPER, Output, Pacing, warn_unsealed};

/// The container's command (run by `/bin/sh -c`): wait for the line
/// `conclave-exec SIZE`, then take SIZE bytes of base64 as the helper and
/// run it on the same stdin. When the helper cannot be made or run (no
/// `head` or `base64` in the image), or ends, the container stays up and
/// execs go through `docker exec`.
pub(super) const BOOT_SCRIPT: &str = r#"while read -r tag size; do [ "$tag" = conclave-exec ] && break; done
head -c "$size" | base64 -d > /tmp/.conclave-exec && chmod 0500 /tmp/.conclave-exec && /tmp/.conclave-exec
exec sleep infinity"#;

/// How long a helper that was just sent may take to answer.
const BOOT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an already running helper may take to answer the probe of a
/// container this server did not start (adopted after a restart).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the container is known to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Boot {
    /// Just (re)started: the boot script waits for the helper.
    Fresh,
    /// Either the helper or the boot script: probe first.
    Unknown,
}

/// Attaches to the container and makes sure its helper answers, sending
/// it first when the container is fresh, or when a probe of an unknown
/// one goes unanswered. Errors are messages: the caller falls back to
/// `docker exec`.
pub(super) async fn connect(docker: &Docker, container: &str, boot: Boot) -> Result<Agent, String> {
    let options = AttachContainerOptions {
        stdin: true,
        stdout: true,
        stderr: true,
        stream: true,
        logs: false,
        detach_keys: None,
    };
    let attached = docker
        .attach_container(container, Some(options))
        .await
        .map_err(|e| format!("attach: {e}"))?;
    // The stream ends at its first error, as the container's end.
    let output = attached
        .output
        .take_while(|chunk| std::future::ready(chunk.is_ok()))
        .filter_map(|chunk| {
            std::future::ready(match chunk {
                Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                    Some(Output::Replies(message))
                }
                Ok(LogOutput::StdErr { message }) => Some(Output::Foreign(message)),
                Ok(LogOutput::StdIn { .. }) | Err(_) => None,
            })
        });
    let agent = Agent::new(
        attached.input,
        Box::pin(output),
        container.to_string(),
        Pacing::Paced,
    );
    // A server that died mid-line left half a request: end that line.
    let probed = match boot {
        Boot::Unknown => agent.hello(b"\n", PROBE_TIMEOUT).await.ok(),
        Boot::Fresh => None,
    };
    let landlock = match probed {
        Some(landlock) => landlock,
        None => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(HELPER);
            let mut payload = format!("conclave-exec {}\n", encoded.len()).into_bytes();
            payload.extend_from_slice(encoded.as_bytes());
            agent.hello(&payload, BOOT_TIMEOUT).await?
        }
    };
    warn_unsealed(container, landlock);
    Ok(agent)
}
