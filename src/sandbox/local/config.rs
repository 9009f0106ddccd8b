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
