//! The server's side of `conclave-exec`, the helper that runs as a docker
//! sandbox's main process (its protocol is documented in
//! `src/bin/conclave-exec.rs`).
//!
//! A container starts with [`BOOT_SCRIPT`], which waits on stdin for the
//! helper. [`Agent::connect`] attaches to the container, sends the helper
//! when it is not running yet, and checks that it answers. From then on an
//! exec is a line written on that open connection, and its output comes
//! back as lines on the same one, told apart by the run's id (read by
//! [`read_replies`], which holds the container's stream to bounded memory
//! and CPU). Where the helper reports no Landlock, runs are not sealed off
//! from that connection; the server logs a warning and carries on.

use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use bollard::Docker;
use bollard::query_parameters::AttachContainerOptions;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::replies::{HelperReply, Routes, read_replies};
use crate::sandbox::ExecRequest;
use crate::sync::lock;

/// The helper, compiled by `build.rs` as a static binary.
static HELPER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/conclave-exec"));

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
/// Replies queued per run before the connection waits for its reader.
const RUN_QUEUE: usize = 256;

/// What the container is known to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Boot {
    /// Just (re)started: the boot script waits for the helper.
    Fresh,
    /// Either the helper or the boot script: probe first.
    Unknown,
}

/// An open connection to one container's helper.
pub(super) struct Agent {
    input: tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
    routes: Routes,
    next_id: AtomicU64,
    /// Cancelled when the connection ends (the container stopped).
    closed: CancellationToken,
    _reader: AbortOnDropHandle<()>,
}

/// A run in flight: its replies, and its route removed when dropped.
pub(super) struct RunHandle {
    pub id: u64,
    pub replies: mpsc::Receiver<HelperReply>,
    routes: Routes,
}

impl Drop for RunHandle {
    fn drop(&mut self) {
        lock(&self.routes).remove(&self.id);
    }
}

impl Agent {
    /// Attaches to the container and makes sure its helper answers, sending
    /// it first when the container is fresh, or when a probe of an unknown
    /// one goes unanswered. Errors are messages: the caller falls back to
    /// `docker exec`.
    pub async fn connect(docker: &Docker, container: &str, boot: Boot) -> Result<Agent, String> {
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
        let routes = Routes::default();
        let closed = CancellationToken::new();
        let reader = tokio::spawn(read_replies(
            attached.output,
            routes.clone(),
            closed.clone(),
            container.to_string(),
        ));
        let agent = Agent {
            input: tokio::sync::Mutex::new(attached.input),
            routes,
            // Ids never repeat within one helper's life, across servers too.
            next_id: AtomicU64::new(u64::from(rand_u32()) << 32),
            closed,
            _reader: AbortOnDropHandle::new(reader),
        };
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
        if landlock == 0 {
            tracing::warn!(
                %container,
                "no Landlock for the exec helper's runs: processes in this sandbox can \
                 write to its channel (forge command output) and read the server's requests"
            );
        }
        Ok(agent)
    }

    /// Writes `before`, then a hello, and waits for its answer: the
    /// Landlock ABI version the helper seals runs with, 0 for none.
    async fn hello(&self, before: &[u8], timeout: Duration) -> Result<u32, String> {
        let mut run = self.route();
        let mut message = before.to_vec();
        message.extend_from_slice(format!("\nh {}\n", run.id).as_bytes());
        // The write is timed too: a container that stopped reading its
        // stdin (the boot script gave up) never takes all of a helper.
        let answered = tokio::time::timeout(timeout, async {
            self.write(&message).await?;
            Ok::<_, String>(run.replies.recv().await)
        });
        match answered.await {
            Ok(Ok(Some(HelperReply::Hello { landlock }))) => Ok(landlock),
            Ok(Ok(_)) => Err("the connection closed before the helper answered".into()),
            Ok(Err(message)) => Err(message),
            Err(_) => Err(format!(
                "the helper did not answer within {} ms",
                timeout.as_millis()
            )),
        }
    }

    fn route(&self) -> RunHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, replies) = mpsc::channel(RUN_QUEUE);
        lock(&self.routes).insert(id, tx);
        RunHandle {
            id,
            replies,
            routes: self.routes.clone(),
        }
    }

    async fn write(&self, data: &[u8]) -> Result<(), String> {
        let mut input = self.input.lock().await;
        input
            .write_all(data)
            .await
            .and(input.flush().await)
            .map_err(|e| format!("writing to the helper: {e}"))
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Starts a run; its output, exit or failure come on the handle.
    pub async fn start(&self, request: &ExecRequest) -> Result<RunHandle, String> {
        let run = self.route();
        let mut line = format!("r {} {} ", run.id, hex::encode(&request.workdir));
        match &request.stdin {
            Some(stdin) => match stdin.bytes() {
                Some(data) => line.push_str(&hex::encode(data)),
                None => return Err("the helper takes stdin as bytes, not a file".into()),
            },
            None => line.push('-'),
        }
        let _ = write!(line, " {}", request.command.len());
        for arg in &request.command {
            let _ = write!(line, " {}", hex::encode(arg));
        }
        let _ = write!(line, " {}", request.env.len());
        for (key, value) in &request.env {
            let _ = write!(line, " {}", hex::encode(format!("{key}={value}")));
        }
        line.push('\n');
        self.write(line.as_bytes()).await?;
        Ok(run)
    }

    /// Asks the helper to kill a run's processes; its exit follows.
    pub async fn kill(&self, id: u64) -> Result<(), String> {
        self.write(format!("k {id}\n").as_bytes()).await
    }
}

/// A random number without a dependency: the low bits of a v4 uuid.
fn rand_u32() -> u32 {
    uuid::Uuid::new_v4().as_u128() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helper_is_embedded_and_static() {
        // A 64-bit ELF executable with no program interpreter (PT_INTERP),
        // so any image can run it whatever its C library.
        assert_eq!(&HELPER[..5], b"\x7fELF\x02");
        let u16_at = |at: usize| usize::from(u16::from_le_bytes([HELPER[at], HELPER[at + 1]]));
        let offset = u64::from_le_bytes(HELPER[0x20..0x28].try_into().unwrap()) as usize;
        let (size, count) = (u16_at(0x36), u16_at(0x38));
        assert!(count > 0);
        for header in 0..count {
            let at = offset + header * size;
            let kind = u32::from_le_bytes(HELPER[at..at + 4].try_into().unwrap());
            assert_ne!(kind, 3, "the helper asks for a dynamic loader");
        }
    }
}
