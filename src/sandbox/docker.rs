//! Docker containers through bollard.
//!
//! A sandbox is a long-lived container whose main process, under
//! `docker-init`, is Conclave's exec helper (`conclave-exec`, see
//! [`agent`]): the server keeps the container attached and runs each command
//! by writing one line to the helper, which costs a few milliseconds where a
//! `docker exec` costs tens. The container has no network unless asked, a
//! read-only root filesystem, a `/workspace` held to the disk limit (a
//! layered one the server mounts on the host, see [`layered`], or else a
//! tmpfs), tmpfs `/tmp`, user 1000, every capability dropped,
//! `no-new-privileges`, pid, memory and CPU limits, and no log (its stdout
//! is the helper's replies). Each run's command enters a Landlock domain, so no process a
//! run starts can reach the helper's channel through `/proc` to forge
//! replies or read requests; what reaches the channel that is not a reply
//! is dropped at a bounded rate (see [`agent`]).
//!
//! The helper kills a run's processes itself. When a run cannot start
//! because processes earlier runs left behind hold every pid the sandbox may
//! have (a fork bomb whose shell has exited), it kills every process in the
//! container but init, the boot shell and itself, says so on the run's
//! stderr, and starts the run; the workspace is kept.
//!
//! When the helper cannot be started in an image (no `sh`, `head` or
//! `base64`), commands go through `docker exec` instead: docker cannot kill
//! an exec, so each one carries a marker variable and a timeout or cancel
//! runs a second exec that kills every process carrying it. When a kill
//! does not end a run (a fork bomb holds every pid the limit allows), the
//! container is restarted, which kills everything in it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, ContainerSummary, HostConfig, HostConfigLogConfig};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use uuid::Uuid;

use crate::config::AllowList;

use self::agent::{BOOT_SCRIPT, Boot};
use self::layered::{LABEL_DISK, LABEL_WORKSPACE, Layered, Root};
use self::sandbox::DockerSandbox;
use super::{
    LABEL_MANAGED, LABEL_SESSION, ManagedSandbox, Result, Sandbox, SandboxBackend, SandboxError,
    SandboxSpec, WORKSPACE, create_detached,
};

mod agent;
mod egress;
mod layered;
mod sandbox;

/// Name prefix of the containers of sessions; the rest is the session id,
/// so a claimed warm-pool container is found again after a restart.
const SESSION_PREFIX: &str = "conclave-";
const POOL_PREFIX: &str = "conclave-pool-";
/// How long the kill exec may take before the container is restarted.

#[derive(Clone)]
pub struct DockerBackend {
    docker: Docker,
    /// Serves sandboxes made with an allow-list (`SandboxSpec::egress`).
    proxy: Option<Arc<super::proxy::EgressProxy>>,
    /// Where layered workspaces are kept; `None`: tmpfs workspaces.
    layers: Option<Root>,
}

impl DockerBackend {
    /// Connects to the local socket (or `DOCKER_HOST`) and checks that the
    /// daemon answers.
    pub async fn connect() -> Result<DockerBackend> {
        let docker = Docker::connect_with_local_defaults()
            .map_err(|e| SandboxError::Unavailable(format!("docker: {e}")))?
            .with_timeout(Duration::from_secs(120));
        // The daemon may be older than bollard's default API version.
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| SandboxError::Unavailable(format!("docker: {e}")))?;
        docker
            .ping()
            .await
            .map_err(|e| SandboxError::Unavailable(format!("docker: {e}")))?;
        Ok(DockerBackend {
            docker,
            proxy: None,
            layers: None,
        })
    }

    /// Gives sandboxes layered workspaces kept in `dir` where this host
    /// can ([`Root::open`]), and deletes those of containers that are gone.
    pub async fn with_layers(mut self, dir: PathBuf) -> DockerBackend {
        // With user namespaces remapped, the container's uid 1000 is
        // another uid on the host, which would not own the upper layer.
        let remapped = match self.docker.info().await {
            Ok(info) => info
                .security_options
                .unwrap_or_default()
                .iter()
                .any(|option| option.split(',').any(|part| part == "name=userns")),
            Err(e) => {
                tracing::warn!(error = %e, "docker info failed: workspaces stay tmpfs mounts");
                true
            }
        };
        if remapped {
            tracing::info!(
                "docker remaps user namespaces: sandboxes' workspaces are tmpfs mounts \
                 (no copy-on-write layers)"
            );
            return self;
        }
        self.layers = Root::open(dir);
        if let Some(root) = &self.layers {
            match self.workspaces().await {
                Ok(live) => {
                    let root = root.clone();
                    let _ = tokio::task::spawn_blocking(move || root.sweep(&live)).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list containers to sweep gone workspaces");
                }
            }
        }
        self
    }

    /// The workspace names of every container that has one.
    async fn workspaces(&self) -> Result<HashSet<String>> {
        Ok(self
            .labelled(LABEL_WORKSPACE.to_string())
            .await?
            .into_iter()
            .filter_map(|c| c.labels?.get(LABEL_WORKSPACE).cloned())
            .collect())
    }

    /// Every container, running or not, that carries `label` (`key` or
    /// `key=value`).
    async fn labelled(&self, label: String) -> Result<Vec<ContainerSummary>> {
        let filters = HashMap::from([("label".to_string(), vec![label])]);
        let options = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        self.docker
            .list_containers(Some(options))
            .await
            .map_err(backend_error)
    }

    /// The layered workspace a container's labels name.
    fn layered_of(&self, labels: &HashMap<String, String>) -> Option<Arc<Layered>> {
        let name = labels.get(LABEL_WORKSPACE)?;
        let disk_mb = labels
            .get(LABEL_DISK)
            .and_then(|mb| mb.parse().ok())
            .unwrap_or(0);
        self.layers.as_ref()?.layered(name, disk_mb).map(Arc::new)
    }

    /// Serves sandboxes made with an allow-list through `proxy`.
    pub fn with_proxy(mut self, proxy: Arc<super::proxy::EgressProxy>) -> DockerBackend {
        self.proxy = Some(proxy);
        self
    }

    /// Makes the bridge network sandboxes given network sit on, unless it
    /// exists: no traffic between its containers, a fixed bridge name for
    /// the firewall's rules.
    pub async fn ensure_network(&self, name: &str, bridge: &str) -> Result<()> {
        if self.docker.inspect_network(name, None).await.is_ok() {
            return Ok(());
        }
        let request = bollard::models::NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".into()),
            options: Some(HashMap::from([
                (
                    "com.docker.network.bridge.name".to_string(),
                    bridge.to_string(),
                ),
                (
                    "com.docker.network.bridge.enable_icc".to_string(),
                    "false".to_string(),
                ),
            ])),
            labels: Some(HashMap::from([(
                LABEL_MANAGED.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        };
        match self.docker.create_network(request).await {
            Ok(_) => Ok(()),
            // Made meanwhile by another server on this daemon.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) => Ok(()),
            Err(e) => Err(SandboxError::Unavailable(format!(
                "docker: cannot create the network {name}: {e}"
            ))),
        }
    }

    /// Creates, starts and boots a container (see [`DockerBackend::create`],
    /// which runs this to its end whatever its caller does).
    async fn make(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        let name = match spec.labels.get(LABEL_SESSION) {
            Some(session) => format!("{SESSION_PREFIX}{session}"),
            None => format!("{POOL_PREFIX}{}", Uuid::new_v4().simple()),
        };
        let mut labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
        labels.insert(LABEL_MANAGED.into(), "true".into());
        if let Some(allow) = &spec.egress {
            labels.insert(egress::LABEL_EGRESS.into(), egress::Egress::label(allow));
        }
        let workspace = match &self.layers {
            Some(root) => {
                let root = root.clone();
                let name = tokio::task::spawn_blocking(move || root.prepare())
                    .await
                    .map_err(|e| SandboxError::Backend(format!("preparing a workspace: {e}")))?
                    .map_err(|e| {
                        SandboxError::Backend(format!("preparing a layered workspace: {e}"))
                    })?;
                labels.insert(LABEL_WORKSPACE.into(), name.clone());
                labels.insert(LABEL_DISK.into(), spec.disk_mb.to_string());
                self.layered_of(&labels)
            }
            None => None,
        };
        let made = self
            .make_container(spec, name, labels, workspace.clone())
            .await;
        if made.is_err()
            && let Some(workspace) = workspace
        {
            let _ = tokio::task::spawn_blocking(move || workspace.remove()).await;
        }
        made
    }

    /// [`DockerBackend::make`] once the workspace is ready.
    async fn make_container(
        &self,
        spec: &SandboxSpec,
        name: String,
        labels: HashMap<String, String>,
        workspace: Option<Arc<Layered>>,
    ) -> Result<Arc<dyn Sandbox>> {
        let mut host = host_config(spec, workspace.is_none());
        if let (Some(root), Some(name)) = (&self.layers, labels.get(LABEL_WORKSPACE)) {
            host.mounts = Some(vec![root.mount(name)]);
        }
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(vec!["/bin/sh".into(), "-c".into(), BOOT_SCRIPT.into()]),
            entrypoint: Some(Vec::new()),
            // The helper's requests come on stdin, which stays open between
            // attaches.
            open_stdin: Some(true),
            stdin_once: Some(false),
            user: Some("1000:1000".into()),
            working_dir: Some(WORKSPACE.into()),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels),
            network_disabled: Some(!spec.network),
            host_config: Some(host),
            ..Default::default()
        };
        let options = CreateContainerOptions {
            name: Some(name),
            ..Default::default()
        };
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(|e| match e {
                DockerError::DockerResponseServerError {
                    status_code: 404, ..
                } => SandboxError::ImageNotFound(spec.image.clone()),
                other => backend_error(other),
            })?;
        if let Err(e) = self.docker.start_container(&created.id, None).await {
            let _ = remove_container(&self.docker, &created.id).await;
            return Err(backend_error(e));
        }
        // On the bind the running container has: it reaches the container.
        if let Some(workspace) = workspace.clone() {
            let mounted = tokio::task::spawn_blocking(move || workspace.mount())
                .await
                .map_err(|e| SandboxError::Backend(format!("mounting a workspace: {e}")))
                .and_then(|done| {
                    done.map_err(|e| {
                        SandboxError::Backend(format!("mounting the layered workspace: {e}"))
                    })
                });
            if let Err(e) = mounted {
                let _ = remove_container(&self.docker, &created.id).await;
                return Err(e);
            }
        }
        let sandbox = self.sandbox(created.id, Boot::Fresh, spec.egress.clone(), workspace)?;
        if let Err(e) = sandbox.listen().await {
            let _ = remove_container(&self.docker, sandbox.id()).await;
            return Err(e);
        }
        // Started here, off any exec's path (a warm pool fills in the
        // background).
        sandbox.agent().await;
        Ok(Arc::new(sandbox))
    }

    /// A sandbox's handle; one with an allow-list needs the proxy.
    fn sandbox(
        &self,
        id: String,
        boot: Boot,
        allow: Option<AllowList>,
        workspace: Option<Arc<Layered>>,
    ) -> Result<DockerSandbox> {
        let egress = match (allow, &self.proxy) {
            (None, _) => None,
            (Some(allow), Some(proxy)) => Some(egress::Egress::new(proxy.clone(), allow)),
            (Some(_), None) => {
                return Err(SandboxError::Unavailable(
                    "this sandbox has an allow-list, and the backend no egress proxy".into(),
                ));
            }
        };
        Ok(DockerSandbox::new(
            self.docker.clone(),
            id,
            boot,
            egress,
            workspace,
        ))
    }
}

fn backend_error(e: DockerError) -> SandboxError {
    match e {
        DockerError::DockerResponseServerError { message, .. } => SandboxError::Backend(message),
        other => SandboxError::Backend(other.to_string()),
    }
}

fn is_not_found(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Docker refuses an exec into a paused container with a conflict.
fn is_paused(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 409,
            message,
        } if message.contains("is paused")
    )
}

/// The container's limits and mounts: `/tmp`, and `/workspace` too when
/// `tmpfs_workspace` (a layered one is a bind, [`layered`]).
fn host_config(spec: &SandboxSpec, tmpfs_workspace: bool) -> HostConfig {
    let memory = i64::try_from(spec.memory_mb.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX);
    let mut tmpfs = HashMap::from([(
        "/tmp".to_string(),
        "rw,exec,nosuid,nodev,size=64m,mode=1777".to_string(),
    )]);
    if tmpfs_workspace {
        tmpfs.insert(
            WORKSPACE.to_string(),
            format!(
                "rw,exec,nosuid,nodev,size={}m,uid=1000,gid=1000,mode=0755",
                spec.disk_mb
            ),
        );
    }
    HostConfig {
        // A sandbox given network sits on a bridge of its own, whose
        // traffic the firewall holds to the internet.
        network_mode: Some(
            if spec.network {
                super::firewall::DOCKER_NETWORK
            } else {
                "none"
            }
            .into(),
        ),
        readonly_rootfs: Some(true),
        tmpfs: Some(tmpfs),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        pids_limit: Some(i64::from(spec.pids)),
        memory: Some(memory),
        // Equal to `memory`: no swap on top of the limit.
        memory_swap: Some(memory),
        nano_cpus: Some((spec.cpus * 1e9) as i64),
        // docker-init reaps the orphans that killed execs leave behind.
        init: Some(true),
        ipc_mode: Some("private".into()),
        // Stdout carries the helper's replies, which nobody needs on disk.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".into()),
            config: None,
        }),
        ..Default::default()
    }
}

#[async_trait]
impl SandboxBackend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        let (backend, spec) = (self.clone(), spec.clone());
        create_detached(async move { backend.make(&spec).await }).await
    }

    async fn has_image(&self, image: &str) -> Result<bool> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(SandboxError::Backend(format!(
                "inspecting image {image}: {e}"
            ))),
        }
    }

    async fn attach(&self, id: &str) -> Result<Option<Arc<dyn Sandbox>>> {
        match self.docker.inspect_container(id, None).await {
            Ok(info) => {
                let state = info.state.unwrap_or_default();
                if !state.running.unwrap_or(false) {
                    return Ok(None);
                }
                let id = info.id.unwrap_or_else(|| id.to_string());
                let labels = info.config.and_then(|c| c.labels).unwrap_or_default();
                let allow = labels
                    .get(egress::LABEL_EGRESS)
                    .map(|label| egress::Egress::from_label(label).unwrap_or_default());
                let workspace = self.layered_of(&labels);
                let sandbox = self.sandbox(id, Boot::Unknown, allow, workspace)?;
                // A sandbox is attached to be used: one the server paused
                // while idle is resumed, as the server's own next call would.
                if state.paused.unwrap_or(false) {
                    sandbox.resume().await?;
                    tracing::info!(
                        sandbox = sandbox.id(),
                        "resumed a paused sandbox to attach it"
                    );
                }
                sandbox.listen().await?;
                Ok(Some(Arc::new(sandbox) as Arc<dyn Sandbox>))
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(backend_error(e)),
        }
    }

    async fn list_managed(&self) -> Result<Vec<ManagedSandbox>> {
        let containers = self.labelled(format!("{LABEL_MANAGED}=true")).await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let id = c.id?;
                let labels = c.labels.unwrap_or_default();
                let name = c
                    .names
                    .and_then(|n| n.into_iter().next())
                    .unwrap_or_default();
                let name = name.trim_start_matches('/');
                let mut found = ManagedSandbox::from_labels(id, |k| labels.get(k));
                // A claimed pool container carries its session in its name
                // (a container's labels cannot change).
                if found.session.is_none()
                    && let Some(session) = name
                        .strip_prefix(SESSION_PREFIX)
                        .filter(|rest| Uuid::parse_str(rest).is_ok())
                {
                    found.session = Some(session.to_string());
                    found.pool = None;
                }
                Some(found)
            })
            .collect())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let workspace = match &self.layers {
            Some(_) => match self.docker.inspect_container(id, None).await {
                Ok(info) => {
                    self.layered_of(&info.config.and_then(|c| c.labels).unwrap_or_default())
                }
                Err(_) => None,
            },
            None => None,
        };
        remove_container(&self.docker, id).await?;
        if let Some(workspace) = workspace {
            remove_workspace(workspace).await?;
        }
        Ok(())
    }
}

/// Deletes a gone container's layered workspace.
async fn remove_workspace(workspace: Arc<Layered>) -> Result<()> {
    tokio::task::spawn_blocking(move || workspace.remove())
        .await
        .map_err(|e| SandboxError::Backend(format!("removing a workspace: {e}")))?
        .map_err(|e| SandboxError::Backend(format!("removing a layered workspace: {e}")))
}

/// Force-removes a container and its anonymous volumes; one already gone,
/// or already being removed by another caller, is not an error.
async fn remove_container(docker: &Docker, id: &str) -> Result<()> {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        ..Default::default()
    };
    match docker.remove_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(DockerError::DockerResponseServerError {
            status_code: 409, ..
        }) => Ok(()),
        Err(e) => Err(backend_error(e)),
    }
}
