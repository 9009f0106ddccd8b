//! The Pod a sandbox runs in, and how far along its start is.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::KubernetesConfig;
use crate::sandbox::{SandboxError, SandboxSpec, WORKSPACE};

/// The one container of a sandbox Pod; exec names it so a sidecar injected
/// by a mesh or an admission webhook is never the one commands land in.
pub(super) const CONTAINER: &str = "sandbox";

/// Label the NetworkPolicies in `deploy/kubernetes/networkpolicy.yaml`
/// select on: `none` gets deny-all, `allowed` gets egress only.
pub(super) const LABEL_NETWORK: &str = "conclave.network";

/// The uid and gid sandbox images are built for (`sandbox-images/`); fixed
/// here too, so `runAsNonRoot` holds even for an image that says `USER root`.
const SANDBOX_ID: i64 = 1000;

/// PID 1 of the container: it only has to stay alive until deleted, and
/// it exits at once on SIGTERM so a graceful delete does not wait out the
/// grace period. `sleep` runs in the background because a shell only
/// handles a trap between commands.
const KEEP_ALIVE: &str = "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done";

/// `/tmp` is RAM-backed (the root filesystem is read-only) and counts
/// against the memory limit, so it stays small; real work belongs in the
/// workspace.
const TMP_SIZE: &str = "64Mi";

/// Waiting reasons that mean the image cannot be had: kubelet will keep
/// retrying, but a sandbox create should not wait for a registry fix.
const IMAGE_REASONS: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// Waiting reasons kubelet will not get past by itself.
const FATAL_REASONS: [&str; 4] = [
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// The Pod for one sandbox.
///
/// Pids: a Pod has no per-Pod pid limit field; the cluster sets one for
/// every Pod with kubelet's `--pod-max-pids` (`podPidsLimit`), so
/// `spec.pids` is not applied here.
pub(super) fn manifest(
    name: &str,
    spec: &SandboxSpec,
    config: &KubernetesConfig,
) -> Result<Pod, SandboxError> {
    if !(spec.cpus.is_finite() && spec.cpus > 0.0) {
        return Err(SandboxError::Backend(format!(
            "sandbox cpus must be a positive number, got {}",
            spec.cpus
        )));
    }
    if spec.memory_mb == 0 || spec.disk_mb == 0 {
        return Err(SandboxError::Backend(
            "sandbox memory_mb and disk_mb must be positive".into(),
        ));
    }
    // Rounded up so a fraction below a millicore still gets one.
    let millicores = (spec.cpus * 1000.0).ceil() as u64;
    let disk = Quantity(format!("{}Mi", spec.disk_mb));
    let limits = BTreeMap::from([
        ("cpu".to_string(), Quantity(format!("{millicores}m"))),
        (
            "memory".to_string(),
            Quantity(format!("{}Mi", spec.memory_mb)),
        ),
        ("ephemeral-storage".to_string(), disk.clone()),
    ]);
    let mut labels = spec.labels.clone();
    let network = if spec.network { "allowed" } else { "none" };
    labels.insert(LABEL_NETWORK.into(), network.into());

    let env = spec
        .env
        .iter()
        .map(|(name, value)| EnvVar {
            name: name.clone(),
            value: Some(value.clone()),
            ..EnvVar::default()
        })
        .collect::<Vec<_>>();
    let container = Container {
        name: CONTAINER.into(),
        image: Some(spec.image.clone()),
        image_pull_policy: Some(config.image_pull_policy.clone()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), KEEP_ALIVE.into()]),
        working_dir: Some(WORKSPACE.into()),
        env: (!env.is_empty()).then_some(env),
        // Requests equal to limits: the Guaranteed QoS class, so a sandbox is
        // the last thing evicted under node pressure and its CPU is not
        // overcommitted.
        resources: Some(ResourceRequirements {
            requests: Some(limits.clone()),
            limits: Some(limits),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "workspace".into(),
                mount_path: WORKSPACE.into(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "tmp".into(),
                mount_path: "/tmp".into(),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    };
    let pod_spec = PodSpec {
        containers: vec![container],
        restart_policy: Some("Never".into()),
        runtime_class_name: config.runtime_class.clone(),
        // Agent code gets no credentials for the API server and no view of
        // the namespace's Services.
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SANDBOX_ID),
            run_as_group: Some(SANDBOX_ID),
            // Makes the emptyDir volumes writable by the sandbox user.
            fs_group: Some(SANDBOX_ID),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        }),
        volumes: Some(vec![
            Volume {
                name: "workspace".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: None,
                    size_limit: Some(disk),
                }),
                ..Volume::default()
            },
            Volume {
                name: "tmp".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    size_limit: Some(Quantity(TMP_SIZE.into())),
                }),
                ..Volume::default()
            },
        ]),
        ..PodSpec::default()
    };
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(config.namespace.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    })
}

/// How far a Pod's start has got.
#[derive(Debug)]
pub(super) enum Progress {
    /// Running, with its container ready for exec.
    Ready,
    /// Still starting; says what it waits for, for the timeout's message.
    Starting(String),
    /// It will not start by itself.
    Failed(SandboxError),
}

pub(super) fn progress(pod: &Pod, image: &str) -> Progress {
    let Some(status) = &pod.status else {
        return Progress::Starting("no status reported yet".into());
    };
    let phase = status.phase.as_deref().unwrap_or("Unknown");
    if matches!(phase, "Failed" | "Succeeded") {
        return Progress::Failed(SandboxError::Backend(format!(
            "pod ended ({phase}) before it was ready: {} {}",
            status.reason.as_deref().unwrap_or_default(),
            status.message.as_deref().unwrap_or_default()
        )));
    }
    let container = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == CONTAINER);
    if let Some(container) = container {
        let state = container.state.as_ref();
        if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
            let reason = waiting.reason.as_deref().unwrap_or("Waiting");
            let message = waiting.message.as_deref().unwrap_or_default();
            if IMAGE_REASONS.contains(&reason) {
                // The variant names only the image; the reason and message
                // tell a missing tag from a registry that refused us.
                tracing::warn!(image, reason, message, "sandbox image cannot be pulled");
                return Progress::Failed(SandboxError::ImageNotFound(image.into()));
            }
            if FATAL_REASONS.contains(&reason) {
                return Progress::Failed(SandboxError::Backend(format!(
                    "sandbox container cannot start: {reason}: {message}"
                )));
            }
            return Progress::Starting(format!("container {reason} {message}"));
        }
        if let Some(terminated) = state.and_then(|s| s.terminated.as_ref()) {
            return Progress::Failed(SandboxError::Backend(format!(
                "sandbox container exited with code {} ({})",
                terminated.exit_code,
                terminated.reason.as_deref().unwrap_or("no reason given")
            )));
        }
        if phase == "Running" && container.ready {
            return Progress::Ready;
        }
        return Progress::Starting(format!("phase {phase}, container not ready"));
    }
    let unschedulable = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    match unschedulable {
        Some(condition) => Progress::Starting(format!(
            "not scheduled: {}",
            condition.message.as_deref().unwrap_or("no node fits")
        )),
        None => Progress::Starting(format!("phase {phase}")),
    }
}
