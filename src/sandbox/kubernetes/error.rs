//! kube errors as the backend's errors, in one line each.

use crate::sandbox::SandboxError;

/// Maps a kube error on Pod `name` to the backend's error.
pub(super) fn kube_error(error: kube::Error, name: &str) -> SandboxError {
    match &error {
        kube::Error::Api(status) if status.is_not_found() => SandboxError::Gone(name.into()),
        _ => api_error(&error, &format!("pod {name}")),
    }
}

/// Maps a kube error on the namespace as a whole (create, list).
pub(super) fn namespace_error(error: kube::Error, namespace: &str) -> SandboxError {
    match &error {
        kube::Error::Api(status) if status.is_not_found() => SandboxError::Unavailable(format!(
            "namespace '{namespace}' not found; apply deploy/kubernetes/namespace.yaml"
        )),
        _ => api_error(&error, &format!("namespace {namespace}")),
    }
}

fn api_error(error: &kube::Error, what: &str) -> SandboxError {
    match error {
        kube::Error::Api(status) if status.is_forbidden() => SandboxError::Backend(format!(
            "the API server refused access to {what} ({}); check deploy/kubernetes/rbac.yaml",
            status.message
        )),
        kube::Error::HyperError(_) | kube::Error::Service(_) => SandboxError::Unavailable(format!(
            "Kubernetes API server unreachable: {}",
            describe(error)
        )),
        _ => SandboxError::Backend(format!("{what}: {}", describe(error))),
    }
}

/// An error in one line, without kube's debug dump of API statuses.
pub(super) fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.reason),
        other => other.to_string(),
    }
}
