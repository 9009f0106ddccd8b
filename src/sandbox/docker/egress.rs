//! The egress proxy's listener in a docker sandbox's network namespace
//! (see [`crate::sandbox::proxy`]): bound when the container starts, again
//! after a restart (a new namespace), and when a server attaches to a
//! container it did not make (its allow-list read from a label).

use std::sync::{Arc, Mutex};

use bollard::Docker;

use crate::config::AllowList;
use crate::sandbox::proxy::{EgressProxy, Listening};
use crate::sandbox::{Result, SandboxError};

/// The label holding a container's allow-list, its entries joined by `,`.
pub(super) const LABEL_EGRESS: &str = "conclave.egress";

/// A container's allow-list and its listener.
pub(super) struct Egress {
    proxy: Arc<EgressProxy>,
    allow: AllowList,
    /// The container process whose namespace holds the listener, and it.
    listening: Mutex<Option<(i64, Listening)>>,
}

impl Egress {
    pub(super) fn new(proxy: Arc<EgressProxy>, allow: AllowList) -> Egress {
        Egress {
            proxy,
            allow,
            listening: Mutex::new(None),
        }
    }

    /// The allow-list a container's labels record, when it has one.
    pub(super) fn from_label(value: &str) -> Option<AllowList> {
        let entries: Vec<String> = value
            .split(',')
            .filter(|e| !e.is_empty())
            .map(String::from)
            .collect();
        AllowList::parse(&entries).ok()
    }

    pub(super) fn label(allow: &AllowList) -> String {
        allow.to_strings().join(",")
    }

    /// Binds the listener in container `id`'s namespace unless it is bound
    /// there already.
    pub(super) async fn ensure(&self, docker: &Docker, id: &str) -> Result<()> {
        let info = docker
            .inspect_container(id, None)
            .await
            .map_err(|e| SandboxError::Backend(format!("inspecting sandbox {id}: {e}")))?;
        let pid = info.state.and_then(|s| s.pid).filter(|pid| *pid > 0);
        let Some(pid) = pid else {
            return Err(SandboxError::Backend(format!(
                "sandbox {id} has no running process to hold its egress proxy"
            )));
        };
        let mut listening = self.listening.lock().unwrap_or_else(|e| e.into_inner());
        if listening.as_ref().is_some_and(|(held, _)| *held == pid) {
            return Ok(());
        }
        // The old namespace (before a restart) is gone with its process.
        *listening = None;
        let bound = self
            .proxy
            .listen(pid as u32, self.allow.clone(), id.to_string())
            .map_err(|e| {
                SandboxError::Backend(format!(
                    "cannot start the egress proxy in sandbox {id}'s network namespace \
                     (/proc/{pid}/ns/net; the server must run on the docker host, as root): {e}"
                ))
            })?;
        *listening = Some((pid, bound));
        Ok(())
    }
}
