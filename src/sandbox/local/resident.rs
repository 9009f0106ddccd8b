//! A warm sandbox's resident exec helper: `conclave-exec` (see
//! `crate::sandbox::helper`) running in one long-lived container of the
//! sandbox, so that an exec is a line on an open pipe rather than a new
//! container (new namespaces, a copy of the host's mount table, mounts,
//! Landlock, seccomp: about 10 ms and a few ms of the server's CPU).
//!
//! The container is the one each exec used to get: the gate shell stays
//! its pid namespace's init and reaps orphans, and runs the helper, which
//! takes requests on its stdin and answers on its stdout. The helper runs
//! each command in a process group and a Landlock domain of its own and
//! kills what it left in the background when it ends, as on docker.
//! Killing the container's init ends every run at once: a run that does
//! not end when killed, the sandbox's removal, or the sandbox being
//! dropped do that, and the next exec starts a new one.
//!
//! The helper binary is written once per server start into
//! `<root>/.exec/` and mounted read-only at `/.conclave` in every
//! container of every sandbox.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::io::ReaderStream;

use super::jail::{HELPER_FILE, Layout};
use super::run::{self, KillSwitch, Launch};
use super::sandbox::LocalSandbox;
use crate::sandbox::SandboxError;
use crate::sandbox::helper::{Agent, HELPER, Output, Pacing, warn_unsealed};

/// How long a new helper may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The resident container's own processes: the gate shell and the helper.
pub(super) const RESIDENT_PROCESSES: u64 = 2;

/// Writes the helper into `layout`'s helper directory (made 0755), under a
/// temporary name renamed into place, so a helper another server on the
/// same root is running keeps its file.
pub(super) fn install(layout: &Layout) -> io::Result<()> {
    let dir = layout.helper_dir();
    match fs::DirBuilder::new().mode(0o755).create(&dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let temporary = dir.join(format!(".{}", uuid::Uuid::new_v4().simple()));
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o555)
        .open(&temporary)
        .and_then(|mut file| file.write_all(HELPER))
        .and_then(|()| fs::rename(&temporary, dir.join(HELPER_FILE)));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written
}

/// A running resident container and the channel to its helper.
pub(super) struct Resident {
    pub(super) agent: Arc<Agent>,
    switch: Arc<KillSwitch>,
}

impl Resident {
    /// Ends the container and every run in it.
    pub(super) fn kill(&self) {
        self.switch.kill();
    }

    /// The container's init, in whose network namespace the bulk path's
    /// listener is bound.
    pub(super) fn pid(&self) -> Option<u32> {
        self.switch.pid()
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        self.switch.kill();
    }
}

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resident").finish_non_exhaustive()
    }
}

/// Starts `sandbox`'s resident container and waits for its helper to
/// answer.
pub(super) async fn start(
    sandbox: &LocalSandbox,
    egress: Option<run::Egress>,
    token: tokio_util::task::task_tracker::TaskTrackerToken,
) -> Result<Resident, SandboxError> {
    let switch = Arc::new(KillSwitch::default());
    let root = sandbox.layout.exec_root();
    let launch = Launch {
        command: sandbox
            .jail
            .resident_command(&root)
            .map_err(SandboxError::Backend)?,
        root,
        cgroup: sandbox.cgroup.clone(),
        veth: sandbox.jail.veth(),
        egress,
        switch: switch.clone(),
        token,
    };
    let (started, _finished) = run::spawn(launch)?;
    let resident = async {
        let (stdin, stdout, stderr) = run::started(started).await?;
        // Each pipe's stream ends at its first error, as at its end.
        let read = |pipe, tag: fn(bytes::Bytes) -> Output| {
            ReaderStream::new(pipe)
                .scan((), move |(), chunk| std::future::ready(chunk.ok().map(tag)))
        };
        let output =
            futures::stream::select(read(stdout, Output::Replies), read(stderr, Output::Foreign));
        let agent = Agent::new(Box::pin(stdin), output, sandbox.id.clone(), Pacing::Unpaced);
        // The hello's leading newline is the line that opens the gate.
        let landlock = agent
            .hello(b"", START_TIMEOUT)
            .await
            .map_err(|e| SandboxError::Backend(format!("the exec helper: {e}")))?;
        warn_unsealed(&sandbox.id, landlock);
        Ok(Resident {
            agent: Arc::new(agent),
            switch: switch.clone(),
        })
    };
    let resident = resident.await;
    if resident.is_err() {
        switch.kill();
    }
    resident
}
