//! The `kubernetes` backend: a Pod per sandbox, commands over the exec API.
//!
//! Layout:
//!
//! - this file: [`KubernetesConfig`], [`KubernetesBackend`] (create, attach,
//!   list, remove) and the sandbox a Pod is.
//! - `pod`: the Pod manifest and how far its start has got.
//! - `error`: kube errors mapped to [`SandboxError`].
//! - `exec`: the wrapper that gives exec a workdir, an environment and a
//!   kill switch, and the pump that streams its output.
//!
//! The manifests the server needs in a cluster (namespace, RBAC,
//! NetworkPolicies) are in `deploy/kubernetes/`.

mod error;
mod exec;
mod pod;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{AttachParams, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::error::{describe, kube_error, namespace_error};
use super::supervise::{KILL_GRACE, supervise};
use super::{
    ExecChunk, ExecRequest, ExecStatus, LABEL_MANAGED, LABEL_POOL, LABEL_SESSION, ManagedSandbox,
    Result, Sandbox, SandboxBackend, SandboxError, SandboxSpec, SandboxStats, create_detached,
    exec_collect,
};

/// Backoff between polls of a starting Pod: quick for a cached image, then
/// no busier than every two seconds for a slow pull.
const POLL_MIN: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(2);
/// The kill exec runs a few `grep`s; if it takes longer, the Pod is in
/// trouble and waiting helps nobody.
const KILL_TIMEOUT: Duration = Duration::from_secs(30);
const STATS_TIMEOUT: Duration = Duration::from_secs(10);

pub use crate::config::KubernetesConfig;

/// Makes sandboxes as Pods in one namespace.
#[derive(Clone)]
pub struct KubernetesBackend {
    pods: Api<Pod>,
    config: KubernetesConfig,
}

impl KubernetesBackend {
    /// Connects with the in-cluster service account or the local
    /// kubeconfig, and checks that Pods in the namespace can be listed, so
    /// missing RBAC shows at start-up rather than at the first tool call.
    pub async fn connect(config: KubernetesConfig) -> Result<Self> {
        let client = kube::Client::try_default().await.map_err(|e| {
            SandboxError::Unavailable(format!(
                "no Kubernetes configuration (neither in-cluster nor kubeconfig): {e}"
            ))
        })?;
        let backend = Self::new(client, config);
        backend
            .pods
            .list(&ListParams::default().limit(1))
            .await
            .map_err(|e| {
                SandboxError::Unavailable(format!(
                    "cannot list pods in namespace '{}': {}",
                    backend.config.namespace,
                    describe(&e)
                ))
            })?;
        Ok(backend)
    }

    /// A backend on a client built elsewhere (tests point one at a fake
    /// API server).
    pub fn new(client: kube::Client, config: KubernetesConfig) -> Self {
        KubernetesBackend {
            pods: Api::namespaced(client, &config.namespace),
            config,
        }
    }

    /// Polls the Pod until it is ready, fails, or the start timeout passes.
    async fn wait_ready(&self, name: &str, image: &str) -> Result<()> {
        enum NotReady {
            Starting(String),
            Failed(SandboxError),
        }
        let check = || async {
            let pod = self
                .pods
                .get(name)
                .await
                .map_err(|e| NotReady::Failed(kube_error(e, name)))?;
            match pod::progress(&pod, image) {
                pod::Progress::Ready => Ok(()),
                pod::Progress::Starting(what) => Err(NotReady::Starting(what)),
                pod::Progress::Failed(e) => Err(NotReady::Failed(e)),
            }
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(POLL_MIN)
            .with_max_delay(POLL_MAX)
            .without_max_times();
        let mut last = String::from("not looked at yet");
        let timeout = Duration::from_secs(self.config.start_timeout_s);
        let polled = tokio::time::timeout(
            timeout,
            check
                .retry(backoff)
                .when(|e| matches!(e, NotReady::Starting(_)))
                .notify(|e, _| {
                    if let NotReady::Starting(what) = e {
                        last.clone_from(what);
                    }
                }),
        )
        .await;
        match polled {
            Ok(Ok(())) => Ok(()),
            Ok(Err(NotReady::Failed(e))) => Err(e),
            // Unreachable while the backoff has no limit on retries.
            Ok(Err(NotReady::Starting(what))) => Err(SandboxError::Backend(format!(
                "pod {name} not ready: {what}"
            ))),
            Err(_) => Err(SandboxError::Backend(format!(
                "pod {name} not ready after {} s (last seen: {last})",
                self.config.start_timeout_s
            ))),
        }
    }

    /// Creates a Pod and waits until it runs (see
    /// [`KubernetesBackend::create`], which runs this to its end whatever
    /// its caller does); a Pod that does not start is deleted.
    async fn make(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("conclave-sbx-{}", &id[..12]);
        let manifest = pod::manifest(&name, spec, &self.config)?;
        self.pods
            .create(&PostParams::default(), &manifest)
            .await
            .map_err(|e| namespace_error(e, &self.config.namespace))?;
        if let Err(e) = self.wait_ready(&name, &spec.image).await {
            if let Err(delete) = delete_pod(&self.pods, &name).await {
                tracing::warn!(pod = %name, error = %delete, "cannot delete a pod that failed to start");
            }
            return Err(e);
        }
        tracing::info!(pod = %name, image = %spec.image, "sandbox pod ready");
        // It has just started, and a shell waiting on `sleep` uses no CPU:
        // a zero baseline makes the first stats sample a true average.
        Ok(Arc::new(PodSandbox::new(
            self.pods.clone(),
            name,
            Some(CpuSample {
                at: Instant::now(),
                usage_usec: 0,
            }),
        )))
    }
}

#[async_trait]
impl SandboxBackend for KubernetesBackend {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        let (backend, spec) = (self.clone(), spec.clone());
        create_detached(async move { backend.make(&spec).await }).await
    }

    async fn attach(&self, id: &str) -> Result<Option<Arc<dyn Sandbox>>> {
        let Some(pod) = self.pods.get_opt(id).await.map_err(|e| kube_error(e, id))? else {
            return Ok(None);
        };
        let managed = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_MANAGED));
        let running = pod.metadata.deletion_timestamp.is_none()
            && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if managed.map(String::as_str) != Some("true") || !running {
            return Ok(None);
        }
        let baseline = container_started(&pod).map(|at| CpuSample { at, usage_usec: 0 });
        Ok(Some(Arc::new(PodSandbox::new(
            self.pods.clone(),
            id.into(),
            baseline,
        ))))
    }

    async fn list_managed(&self) -> Result<Vec<ManagedSandbox>> {
        let selector = format!("{LABEL_MANAGED}=true");
        let pods = self
            .pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| namespace_error(e, &self.config.namespace))?;
        Ok(pods
            .items
            .into_iter()
            .filter_map(|pod| {
                let labels = pod.metadata.labels.unwrap_or_default();
                Some(ManagedSandbox::from_labels(pod.metadata.name?, |k| {
                    labels.get(k)
                }))
            })
            .collect())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        delete_pod(&self.pods, id).await
    }
}

/// A CPU-time reading and when it was taken, for the next sample's average.
#[derive(Debug, Clone, Copy)]
struct CpuSample {
    at: Instant,
    usage_usec: u64,
}

/// One sandbox Pod.
struct PodSandbox {
    pods: Api<Pod>,
    name: String,
    /// The previous CPU reading; `None` until one is known.
    cpu_baseline: Mutex<Option<CpuSample>>,
}

/// How an exec's wait ended.
enum Outcome {
    Exited(i64),
    /// The connection ended without an exit status.
    Lost,
}

impl PodSandbox {
    fn new(pods: Api<Pod>, name: String, cpu_baseline: Option<CpuSample>) -> Self {
        PodSandbox {
            pods,
            name,
            cpu_baseline: Mutex::new(cpu_baseline),
        }
    }

    fn attach_params(stdin: bool) -> AttachParams {
        AttachParams {
            container: Some(pod::CONTAINER.into()),
            stdin,
            stdout: true,
            stderr: true,
            tty: false,
            max_stdout_buf_size: Some(exec::CHUNK),
            max_stderr_buf_size: Some(exec::CHUNK),
            ..AttachParams::default()
        }
    }

    /// Kills every process of the exec marked `marker`. Failures are logged,
    /// not returned: the exec has already ended for its caller.
    async fn kill_tree(&self, marker: &str) {
        let kill = async {
            let mut attached = self
                .pods
                .exec(
                    &self.name,
                    exec::kill_command(marker),
                    &Self::attach_params(false),
                )
                .await
                .map_err(|e| describe(&e))?;
            // Nobody reads the kill's output.
            let (sink, _) = mpsc::channel(1);
            let status = exec::pump(&mut attached, None, &sink)
                .await
                .ok_or_else(|| "no exit status".to_string())?;
            match exec::exit_code(&status)? {
                0 => Ok(()),
                code => Err(format!("kill script exited with {code}")),
            }
        };
        match tokio::time::timeout(KILL_TIMEOUT, kill).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(pod = %self.name, error = %e, "cannot kill an exec's processes")
            }
            Err(_) => tracing::warn!(pod = %self.name, "killing an exec's processes timed out"),
        }
    }

    /// Percent of one CPU since the previous reading, which `usage_usec`
    /// replaces.
    fn cpu_percent(&self, usage_usec: u64) -> Option<f64> {
        let now = Instant::now();
        let previous = self
            .cpu_baseline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(CpuSample {
                at: now,
                usage_usec,
            })?;
        let elapsed = now.duration_since(previous.at).as_micros() as f64;
        (elapsed > 0.0)
            .then(|| usage_usec.saturating_sub(previous.usage_usec) as f64 / elapsed * 100.0)
    }
}

#[async_trait]
impl Sandbox for PodSandbox {
    fn id(&self) -> &str {
        &self.name
    }

    /// A claimed pool Pod trades its pool label for the session's, so a
    /// restarted server finds it by label.
    async fn assign(&self, session_id: &str) -> Result<()> {
        let patch = serde_json::json!({
            "metadata": {"labels": {LABEL_SESSION: session_id, LABEL_POOL: null}}
        });
        self.pods
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| kube_error(e, &self.name))
    }

    async fn exec(
        &self,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        let started = Instant::now();
        let marker = exec::new_marker();
        let command = exec::wrap(&request, &marker)?;
        let params = Self::attach_params(request.stdin.is_some());
        let run = async {
            let mut attached = self
                .pods
                .exec(&self.name, command, &params)
                .await
                .map_err(|e| kube_error(e, &self.name))?;
            match exec::pump(&mut attached, request.stdin, &output).await {
                Some(status) => exec::exit_code(&status).map(Outcome::Exited).map_err(|e| {
                    SandboxError::Backend(format!("exec in pod {} failed: {e}", self.name))
                }),
                None => Ok(Outcome::Lost),
            }
        };
        // After a kill the run is still read, for the output the tree
        // wrote before it died, until its status comes or the grace ends.
        let done = supervise(run, request.timeout, &cancel, KILL_GRACE, || {
            Box::pin(self.kill_tree(&marker))
        })
        .await;
        let killed = done.killed();
        let exit_code = match done.ended {
            Some(Ok(Outcome::Exited(code))) => Some(code).filter(|_| !killed),
            // A killed tree may take its connection with it.
            Some(Ok(Outcome::Lost)) | Some(Err(_)) | None if killed => None,
            Some(Err(e)) => return Err(e),
            Some(Ok(Outcome::Lost)) | None => {
                self.kill_tree(&marker).await;
                return Err(SandboxError::Backend(format!(
                    "exec in pod {} lost its connection before the command ended",
                    self.name
                )));
            }
        };
        Ok(ExecStatus {
            exit_code,
            timed_out: done.timed_out,
            cancelled: done.cancelled,
            duration: started.elapsed(),
        })
    }

    async fn stats(&self) -> Result<SandboxStats> {
        let request = ExecRequest {
            command: exec::stats_command(),
            stdin: None,
            timeout: STATS_TIMEOUT,
            workdir: "/".into(),
            env: BTreeMap::new(),
        };
        let collected = exec_collect(self, request, 64 * 1024, CancellationToken::new(), |_| {});
        let text = match collected.await {
            Ok((_, collected)) => String::from_utf8_lossy(&collected.stdout).into_owned(),
            Err(SandboxError::Gone(id)) => return Err(SandboxError::Gone(id)),
            // The numbers are for display; a sandbox that cannot report them
            // is still a working sandbox.
            Err(e) => {
                tracing::debug!(pod = %self.name, error = %e, "cannot read sandbox stats");
                return Ok(SandboxStats::default());
            }
        };
        let reading = exec::parse_cgroup(&text);
        Ok(SandboxStats {
            cpu_percent: reading.cpu_usec.and_then(|usec| self.cpu_percent(usec)),
            memory_bytes: reading.memory_bytes,
            pids: reading.pids,
        })
    }

    /// A Pod cannot be frozen through the API, and scaling it to zero
    /// would lose its workspace (an `emptyDir`, which lives as long as the
    /// Pod) and every process in it: an idle Pod keeps running until the
    /// idle TTL removes it.
    async fn pause(&self) -> Result<bool> {
        Ok(false)
    }

    async fn destroy(&self) -> Result<()> {
        delete_pod(&self.pods, &self.name).await
    }
}

/// Deletes at once: a sandbox has nothing to flush, and its name must be
/// free for the reaper's next look. A Pod already gone is fine.
async fn delete_pod(pods: &Api<Pod>, name: &str) -> Result<()> {
    match pods
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(kube_error(e, name)),
    }
}

/// When the sandbox container started, as an `Instant`, for CPU averages
/// of an attached Pod.
fn container_started(pod: &Pod) -> Option<Instant> {
    let started = pod
        .status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == pod::CONTAINER)?
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()?;
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(started.0);
    Instant::now().checked_sub(Duration::try_from(age).ok()?)
}
