//! Checks of [`LocalConfig`], the local backend's settings (defined with
//! the rest of the configuration).

use std::path::Path;

use crate::sandbox::{Result, SandboxError};

pub use crate::config::LocalConfig;

impl LocalConfig {
    pub(super) fn validate(&self) -> Result<()> {
        let invalid = |msg: &str| {
            Err(SandboxError::Unavailable(format!(
                "local sandbox config: {msg}"
            )))
        };
        if self.uid_base == 0 {
            return invalid("uid_base must not be 0 (root)");
        }
        if self.uid_count == 0 {
            return invalid("uid_count must be at least 1");
        }
        // u32::MAX is the kernel's "no uid".
        if self.uid_base.checked_add(self.uid_count).is_none() {
            return invalid("uid_base + uid_count must stay below 4294967295");
        }
        let parent = Path::new(&self.cgroup_parent);
        if self.cgroup_parent.is_empty()
            || parent.is_absolute()
            || parent
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return invalid("cgroup_parent must be a relative path without '..'");
        }
        Ok(())
    }
}

/// What the local backend needs, matched to what failed in the start-up
/// test (hakoniwa names the failing call and its arguments): only a refused
/// namespace call is reported as missing namespaces.
pub(super) fn probe_hint(failure: &str, is_root: bool) -> String {
    let namespaces = if is_root {
        "mount, pid, ipc, uts and network namespaces"
    } else {
        "a user namespace holding mount, pid, ipc, uts and network namespaces \
         (unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1 \
         and user.max_user_namespaces > 0, or run as root)"
    };
    if [
        "unshare(",
        "clone(",
        "setns(",
        "UID/GID mapping",
        "uid_map",
        "setgroups",
    ]
    .iter()
    .any(|call| failure.contains(call))
    {
        format!("this host refused to make new namespaces, and local sandboxes need {namespaces}")
    } else if failure.contains("seccomp") {
        "local sandboxes need seccomp filters (a kernel with CONFIG_SECCOMP_FILTER)".into()
    } else if failure.contains("pivot_root") {
        "local sandboxes need pivot_root, which an initramfs root (ramfs) refuses: \
         run the server on a disk-backed root file system"
            .into()
    } else if failure.contains("must be absolute") {
        "mount paths must be absolute: give an absolute data_dir or sandbox.local.root".into()
    } else {
        format!(
            "local sandboxes need {namespaces}, seccomp and pivot_root, and \
             bind-mount the host's system directories read-only"
        )
    }
}
