//! [`LocalConfig`]: the local backend's settings.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::sandbox::{Result, SandboxError};

/// Settings of the local backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalConfig {
    /// Where sandbox directories live. `None` lets the caller choose,
    /// normally `<data_dir>/sandboxes`, so that one setting moves all state.
    pub root: Option<PathBuf>,
    /// First host uid handed to sandboxes when the server runs as root. Each
    /// sandbox runs as a uid of its own, so its processes cannot signal or
    /// read another sandbox's, and RLIMIT_NPROC (the pid limit where there
    /// is no pids cgroup) counts only its own. The default lies far above
    /// the uids of people and of the `/etc/subuid` ranges tools hand out,
    /// and below 2^31 for tools that store uids signed. Two servers on one
    /// host need disjoint ranges.
    pub uid_base: u32,
    /// How many uids from `uid_base` may be used: as root, the most
    /// sandboxes that can exist at once.
    pub uid_count: u32,
    /// Directory made under each cgroup v1 controller
    /// (`/sys/fs/cgroup/<controller>/<cgroup_parent>/<id>`) to hold the
    /// sandboxes' cgroups, so that they are easy to find and to delegate.
    pub cgroup_parent: String,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            root: None,
            uid_base: 1_000_000_000,
            uid_count: 65_536,
            cgroup_parent: "conclave".into(),
        }
    }
}

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
