//! Sandboxes: where every tool call of an agent runs.
//!
//! Layout:
//!
//! - this file: the [`SandboxBackend`] and [`Sandbox`] traits every backend
//!   implements, the [`SandboxSpec`] a sandbox is created from, exec requests
//!   and results, and [`SandboxError`].
//! - [`docker`]: containers through bollard.
//! - [`local`]: Linux namespaces, rlimits, landlock and seccomp through
//!   hakoniwa; needs no daemon.
//! - [`kubernetes`]: a Pod per sandbox through kube, exec over the API.
//! - [`files`]: file reads and writes built on exec, so every backend gets
//!   them the same way, with paths confined to the workspace.
//! - [`manager`]: one sandbox per session, created at its first tool call,
//!   an idle TTL, pausing idle ones, a cap on live sandboxes, the warm pool
//!   and orphan reaping.

pub mod archive;
mod bulk;
pub mod changes;
pub mod docker;
pub mod files;
pub mod firewall;
mod helper;
pub mod kubernetes;
pub mod layers;
pub mod local;
pub mod manager;
pub mod proxy;
pub mod secrets;
pub mod snapshots;
mod stdin;
pub mod supervise;
pub(crate) mod tmpfs;
pub mod workspace;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

pub use manager::{Lease, SandboxInfo, SandboxManager};
pub use stdin::{ChannelStdin, Stdin};

/// Label every sandbox Conclave creates carries, so orphans can be found.
pub const LABEL_MANAGED: &str = "conclave.managed";
/// Label naming the session a sandbox belongs to (absent on warm-pool ones).
pub const LABEL_SESSION: &str = "conclave.session";
/// Label naming the server instance (its data directory) that made a
/// sandbox, so servers sharing a daemon only ever reap their own.
pub const LABEL_INSTANCE: &str = "conclave.instance";
/// Label naming the image's pool, on sandboxes waiting in the warm pool.
pub const LABEL_POOL: &str = "conclave.pool";
/// Label holding when a sandbox expires (Unix seconds, `sandbox.max_lifetime_s`
/// after its creation). Every Conclave instance on the host removes expired
/// sandboxes, whichever instance made them and whether or not it still runs.
pub const LABEL_EXPIRES: &str = "conclave.expires";

/// Label holding when a sandbox was made (Unix seconds): its age.
pub const LABEL_CREATED: &str = "conclave.created";

/// The directory tools act in, writable in every backend.
pub const WORKSPACE: &str = "/workspace";

/// The variable that marks every process of one exec where the backend
/// cannot kill an exec itself (`docker exec` without the helper, a
/// Kubernetes exec): every descendant inherits it.
pub(crate) const EXEC_MARKER: &str = "CONCLAVE_EXEC";

/// The argv that kills every process whose environment holds
/// `CONCLAVE_EXEC=marker`, sweeping `/proc` until none is left (a process
/// may fork while it runs); it exits 1 when fifty rounds did not do it.
pub(crate) fn kill_by_marker(marker: &str) -> Vec<String> {
    const SCRIPT: &str = r#"marker="CONCLAVE_EXEC=$1"
round=0
while [ "$round" -lt 50 ]; do
  found=
  for dir in /proc/[0-9]*; do
    if tr '\0' '\n' < "$dir/environ" 2>/dev/null | grep -qxF "$marker"; then
      kill -KILL "${dir#/proc/}" 2>/dev/null && found=1
    fi
  done
  [ -n "$found" ] || exit 0
  round=$((round + 1))
done
exit 1"#;
    ["/bin/sh", "-c", SCRIPT, "conclave-kill", marker]
        .map(String::from)
        .to_vec()
}

/// Everything a sandbox is created with.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSpec {
    pub image: String,
    pub cpus: f64,
    pub memory_mb: u64,
    pub pids: u32,
    pub disk_mb: u64,
    /// `false`: no interface but loopback.
    pub network: bool,
    /// No interface but loopback, where the server's egress proxy
    /// ([`proxy`]) listens and reaches only what this list allows.
    pub egress: Option<crate::config::AllowList>,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
}

/// One command to run in a sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecRequest {
    /// argv; the first element is looked up in `PATH`.
    pub command: Vec<String>,
    /// Written to the process's stdin, which is then closed.
    pub stdin: Option<Stdin>,
    /// The whole process tree is killed when this passes.
    pub timeout: Duration,
    pub workdir: String,
    pub env: BTreeMap<String, String>,
}

impl ExecRequest {
    /// A shell command line run by `/bin/sh -c` in the workspace.
    pub fn shell(command: impl Into<String>, timeout: Duration) -> ExecRequest {
        ExecRequest {
            command: vec!["/bin/sh".into(), "-c".into(), command.into()],
            stdin: None,
            timeout,
            workdir: WORKSPACE.into(),
            env: BTreeMap::new(),
        }
    }
}

/// A piece of an exec's output, as it arrives.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecChunk {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// How an exec ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecStatus {
    /// `None` when the process was killed (timeout or cancel) before it
    /// reported one.
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration: Duration,
}

#[cfg(test)]
impl ExecStatus {
    /// Exited 0 at once: what the in-memory sandboxes of unit tests answer.
    pub(crate) fn succeeded() -> ExecStatus {
        ExecStatus {
            exit_code: Some(0),
            timed_out: false,
            cancelled: false,
            duration: Duration::ZERO,
        }
    }
}

/// Resource use of a live sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxStats {
    /// Percent of one CPU, averaged since the previous sample where the
    /// backend can tell, else since the sandbox started.
    pub cpu_percent: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
}

/// A sandbox found by its labels (for reaping and for re-attaching).
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedSandbox {
    pub id: String,
    pub instance: Option<String>,
    pub session: Option<String>,
    pub pool: Option<String>,
    /// Unix seconds from [`LABEL_EXPIRES`]; `None` for a sandbox made before
    /// expiry labels (it never expires on its own).
    pub expires: Option<i64>,
    /// Unix seconds from [`LABEL_CREATED`]; `None` for a sandbox made
    /// before creation labels.
    pub created: Option<i64>,
}

impl ManagedSandbox {
    /// A sandbox as its labels describe it: the one place every backend
    /// reads them back. A sandbox claimed by a session is no longer in a pool.
    pub fn from_labels<'a>(
        id: String,
        label: impl Fn(&str) -> Option<&'a String>,
    ) -> ManagedSandbox {
        let session = label(LABEL_SESSION).cloned();
        ManagedSandbox {
            id,
            instance: label(LABEL_INSTANCE).cloned(),
            pool: match session {
                Some(_) => None,
                None => label(LABEL_POOL).cloned(),
            },
            session,
            expires: label(LABEL_EXPIRES).and_then(|v| v.parse().ok()),
            created: label(LABEL_CREATED).and_then(|v| v.parse().ok()),
        }
    }

    /// Whether it expired before `now` (Unix seconds).
    pub fn expired(&self, now: i64) -> bool {
        self.expires.is_some_and(|at| at <= now)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox backend unavailable: {0}")]
    Unavailable(String),
    #[error("sandbox image '{0}' not found; build it with sandbox-images/build.sh")]
    ImageNotFound(String),
    #[error("too many live sandboxes (limit {0}); try again when one is released")]
    Capacity(usize),
    /// The session's key holds as many live sandboxes as its quota allows.
    #[error(transparent)]
    Quota(crate::quota::QuotaExceeded),
    #[error("sandbox {0} is gone")]
    Gone(String),
    #[error("{0}")]
    InvalidPath(String),
    #[error("{0}")]
    File(String),
    #[error("sandbox backend error: {0}")]
    Backend(String),
}

pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

/// The backend the config names; `auto` takes docker when its socket
/// answers and local namespaces otherwise, and says which.
pub async fn connect(
    config: &crate::config::SandboxConfig,
    data_dir: &std::path::Path,
    proxy: Arc<proxy::EgressProxy>,
) -> Result<Arc<dyn SandboxBackend>> {
    use crate::config::SandboxBackendKind as Kind;
    let local = || -> Result<Arc<dyn SandboxBackend>> {
        let root = config
            .local
            .root
            .clone()
            .unwrap_or_else(|| data_dir.join("sandboxes"));
        Ok(Arc::new(
            local::LocalBackend::new(config.local.clone(), root)?.with_proxy(proxy.clone()),
        ))
    };
    // Docker sandboxes' layered workspaces.
    let docker_layers = data_dir.join("docker-workspaces");
    // The docker backend, kept concrete for the network guard.
    let mut docker = None;
    let backend: Arc<dyn SandboxBackend> = match config.backend {
        Kind::Docker => {
            let backend = Arc::new(
                docker::DockerBackend::connect()
                    .await?
                    .with_proxy(proxy.clone())
                    .with_layers(docker_layers.clone())
                    .await,
            );
            docker = Some(backend.clone());
            backend
        }
        Kind::Local => local()?,
        Kind::Kubernetes => {
            Arc::new(kubernetes::KubernetesBackend::connect(config.kubernetes.clone()).await?)
        }
        Kind::Auto => match docker::DockerBackend::connect().await {
            Ok(backend) => {
                tracing::info!("sandbox backend: docker (its socket answers)");
                let backend = Arc::new(
                    backend
                        .with_proxy(proxy.clone())
                        .with_layers(docker_layers.clone())
                        .await,
                );
                docker = Some(backend.clone());
                backend
            }
            Err(e) => {
                tracing::info!(reason = %e, "sandbox backend: local (docker does not answer)");
                local()?
            }
        },
    };
    if config.allow_network {
        guard_network(config, backend.as_ref(), docker.as_deref()).await?;
    }
    Ok(backend)
}

/// Sets up what holds sandboxes given network to the internet
/// ([`firewall`]); a backend that cannot be held refuses to start.
async fn guard_network(
    config: &crate::config::SandboxConfig,
    backend: &dyn SandboxBackend,
    docker: Option<&docker::DockerBackend>,
) -> Result<()> {
    let allow: Vec<ipnet::IpNet> = config
        .network_allow
        .iter()
        .filter_map(|net| firewall::parse_net(net).ok())
        .collect();
    let unavailable = |e: String| {
        SandboxError::Unavailable(format!(
            "sandbox.allow_network is on, but sandboxes' traffic cannot be filtered: {e}"
        ))
    };
    let hook = match (docker, backend.name()) {
        (Some(docker), _) => {
            docker
                .ensure_network(firewall::DOCKER_NETWORK, firewall::DOCKER_BRIDGE)
                .await?;
            firewall::Hook::Bridge(firewall::DOCKER_BRIDGE.into())
        }
        (None, "local") if local::is_root() => local::network_hook(),
        (None, "local") => {
            return Err(unavailable(
                "the local backend gives sandboxes a network of their own only as root; \
                 run it as root or turn sandbox.allow_network off"
                    .into(),
            ));
        }
        // Kubernetes sandboxes: deploy/kubernetes/networkpolicy.yaml.
        _ => return Ok(()),
    };
    tokio::task::spawn_blocking(move || firewall::install(&allow, &hook))
        .await
        .map_err(|e| unavailable(e.to_string()))?
        .map_err(unavailable)?;
    tracing::info!("sandboxes given network reach the internet only (sandbox.network_allow aside)");
    Ok(())
}

/// The id of the server instance that owns `data_dir`, made on first use
/// and kept in `data_dir/instance-id`.
pub fn instance_id(data_dir: &std::path::Path) -> std::io::Result<String> {
    let path = data_dir.join("instance-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        Ok(_) => Err(std::io::Error::other(format!(
            "{} is empty",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(data_dir)?;
            let id = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
            std::fs::write(&path, &id)?;
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

/// Runs a backend's create to its end in a task of its own and hands the
/// sandbox over, or destroys it if the caller has given up meanwhile (its
/// future dropped: a session's first call interrupted). Cancelling the
/// create itself could stop it halfway, with a container already made at
/// the daemon that nothing then knows of.
pub(crate) async fn create_detached(
    create: impl Future<Output = Result<Arc<dyn Sandbox>>> + Send + 'static,
) -> Result<Arc<dyn Sandbox>> {
    let (hand_over, handed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        if let Err(Ok(unclaimed)) = hand_over.send(create.await) {
            destroy_unclaimed(unclaimed).await;
        }
    });
    let mut handed = Unclaimed(handed);
    (&mut handed.0)
        .await
        .map_err(|_| SandboxError::Backend("creating a sandbox: its task ended early".into()))?
}

/// The receiving end of [`create_detached`]: a sandbox sent just as its
/// caller gave up is destroyed, not dropped.
struct Unclaimed(tokio::sync::oneshot::Receiver<Result<Arc<dyn Sandbox>>>);

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Ok(Ok(sandbox)) = self.0.try_recv()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(destroy_unclaimed(sandbox));
        }
    }
}

async fn destroy_unclaimed(sandbox: Arc<dyn Sandbox>) {
    if let Err(e) = sandbox.destroy().await {
        tracing::warn!(sandbox = sandbox.id(), error = %e, "cannot destroy an abandoned sandbox");
    }
}

/// A way of making sandboxes (docker, kubernetes, local).
#[async_trait]
pub trait SandboxBackend: Send + Sync {
    /// `docker`, `kubernetes` or `local`.
    fn name(&self) -> &'static str;

    /// Creates and starts a sandbox; it is ready to exec when this returns.
    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>>;

    /// Finds a live sandbox by id (after a restart); `Ok(None)` if gone.
    async fn attach(&self, id: &str) -> Result<Option<Arc<dyn Sandbox>>>;

    /// Every sandbox this backend holds with the `conclave.managed` label.
    async fn list_managed(&self) -> Result<Vec<ManagedSandbox>>;

    /// Destroys a sandbox by id; a missing one is not an error.
    async fn remove(&self, id: &str) -> Result<()>;

    /// Whether this backend can start sandboxes of `image`, so that a
    /// session naming one it cannot is refused when it is created. Backends
    /// that cannot tell (a cluster pulls at start; local ignores images)
    /// say yes.
    async fn has_image(&self, _image: &str) -> Result<bool> {
        Ok(true)
    }
}

/// One live sandbox.
#[async_trait]
pub trait Sandbox: Send + Sync {
    fn id(&self) -> &str;

    /// Marks a warm-pool sandbox as the session's, so that after a server
    /// restart [`SandboxBackend::list_managed`] reports it with its session.
    async fn assign(&self, session_id: &str) -> Result<()>;

    /// Runs a command, sending its output to `output` in chunks as it comes.
    /// A timeout or `cancel` kills the whole process tree. A closed `output`
    /// does not stop the command.
    async fn exec(
        &self,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus>;

    /// [`Sandbox::exec`] for bulk data the server moves itself (the tar of
    /// a workspace snapshot, in or out): run where throughput is best,
    /// which is the same path on most backends.
    async fn exec_bulk(
        &self,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        self.exec(request, output, cancel).await
    }

    async fn stats(&self) -> Result<SandboxStats>;

    /// The CPU time the sandbox's processes have used since it started,
    /// in seconds, where the backend can tell: its key's usage counts it
    /// when the sandbox is removed.
    async fn cpu_seconds(&self) -> Option<f64> {
        None
    }

    /// Freezes every process in the sandbox, keeping them and its files
    /// (an idle sandbox, `sandbox.pause_after_s`). `Ok(false)` says this
    /// backend or host cannot pause it, and nothing changed.
    async fn pause(&self) -> Result<bool> {
        Ok(false)
    }

    /// Lets the processes of a paused sandbox run again; a sandbox that is
    /// not paused is left as it is.
    async fn resume(&self) -> Result<()> {
        Ok(())
    }

    /// Destroys the sandbox and everything in it, paused or not.
    async fn destroy(&self) -> Result<()>;

    /// Copy-on-write workspaces ([`layers`]): turns the workspace's
    /// changes since the last freeze into a new layer of `store`, on top
    /// of its chain; the sandbox goes on with the same mount. The workspace's layers now,
    /// top first; `None` where this sandbox's workspace is not layered
    /// (the caller takes a tar instead). The caller makes sure no exec
    /// runs meanwhile.
    async fn freeze(&self, _store: &std::path::Path) -> Result<Option<Vec<std::path::PathBuf>>> {
        Ok(None)
    }

    /// Puts the layers `chain` (top first) under a fresh sandbox's
    /// workspace in place of what it holds. `Ok(false)` where this
    /// sandbox's workspace is not layered (the caller unpacks a tar).
    async fn seed(&self, _chain: &[std::path::PathBuf]) -> Result<bool> {
        Ok(false)
    }
}

/// The collected result of an exec, for callers that do not stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes dropped because a stream passed `limit`.
    pub truncated: bool,
}

/// Runs `request` and collects up to `limit` bytes of each stream, passing
/// each chunk to `on_chunk` too (for progress reports).
pub async fn exec_collect(
    sandbox: &dyn Sandbox,
    request: ExecRequest,
    limit: usize,
    cancel: CancellationToken,
    mut on_chunk: impl FnMut(&ExecChunk) + Send,
) -> Result<(ExecStatus, Collected)> {
    let (tx, mut rx) = mpsc::channel(64);
    let run = sandbox.exec(request, tx, cancel);
    tokio::pin!(run);
    let mut collected = Collected::default();
    let mut take = |chunk: ExecChunk, collected: &mut Collected| {
        on_chunk(&chunk);
        let (buf, data) = match &chunk {
            ExecChunk::Stdout(d) => (&mut collected.stdout, d),
            ExecChunk::Stderr(d) => (&mut collected.stderr, d),
        };
        let room = limit.saturating_sub(buf.len());
        if data.len() > room {
            collected.truncated = true;
        }
        buf.extend_from_slice(&data[..data.len().min(room)]);
    };
    let status = loop {
        tokio::select! {
            status = &mut run => break status?,
            Some(chunk) = rx.recv() => take(chunk, &mut collected),
        }
    };
    while let Ok(chunk) = rx.try_recv() {
        take(chunk, &mut collected);
    }
    Ok((status, collected))
}
