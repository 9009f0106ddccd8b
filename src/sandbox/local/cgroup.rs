//! cgroup v1 limits and accounting for local sandboxes.
//!
//! Each sandbox gets `/sys/fs/cgroup/<controller>/<parent>/<id>` for the
//! controllers the host has mounted as v1 and lets this process write:
//! `memory` (memory.limit_in_bytes, and memory.memsw.limit_in_bytes where
//! swap is accounted, so the limit cannot be dodged by swapping), `pids`
//! (pids.max), `cpu` (cfs quota), `cpuacct` (usage for stats) and `freezer`
//! (pausing an idle sandbox, see [`SandboxCgroup::freeze`]). Every exec
//! of the sandbox is moved into them before it runs any user code, so the
//! limits hold for all of its execs together, as for one container. The
//! directories outlive the server, which lets a restarted server find and
//! kill processes an exec of a previous run left behind.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::sys::{self, PidFd};
use crate::sandbox::SandboxSpec;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Controller {
    Memory,
    Pids,
    Cpu,
    Cpuacct,
    Freezer,
}

impl Controller {
    const ALL: [Controller; 5] = [
        Controller::Memory,
        Controller::Pids,
        Controller::Cpu,
        Controller::Cpuacct,
        Controller::Freezer,
    ];

    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Freezer => "freezer",
        }
    }

    /// A file every non-root v1 cgroup of this controller has; its presence
    /// tells a v1 hierarchy from a v2 one or from nothing.
    fn marker(self) -> &'static str {
        match self {
            Controller::Memory => "memory.limit_in_bytes",
            Controller::Pids => "pids.max",
            Controller::Cpu => "cpu.cfs_quota_us",
            Controller::Cpuacct => "cpuacct.usage",
            Controller::Freezer => "freezer.state",
        }
    }
}

/// The controllers usable on this host, found once at start-up.
#[derive(Debug, Clone)]
pub(super) struct Hierarchy {
    controllers: Vec<Controller>,
    /// `<mount>/<parent>` of each usable controller, once per hierarchy:
    /// `cpu` and `cpuacct` are often one hierarchy mounted twice.
    bases: Vec<PathBuf>,
    /// Each usable controller's `<mount>/<parent>`, for the views a sandbox
    /// gets of its own cgroups.
    by_controller: Vec<(Controller, PathBuf)>,
}

impl Hierarchy {
    /// Creates `<parent>` under each v1 controller mounted below `mount_root`
    /// and keeps those where that works; a host without them (cgroup v2
    /// only, or no permission) gets an empty hierarchy and rlimits instead.
    pub(super) fn detect(mount_root: &Path, parent: &str) -> Hierarchy {
        let mut hierarchy = Hierarchy {
            controllers: Vec::new(),
            bases: Vec::new(),
            by_controller: Vec::new(),
        };
        for controller in Controller::ALL {
            let base = mount_root.join(controller.name()).join(parent);
            // The parent may exist from a run as root while this one is not
            // root: only making a child proves the controller usable.
            let probe = base.join(format!(".probe-{}", uuid::Uuid::new_v4().simple()));
            let usable = fs::create_dir_all(&base).is_ok()
                && base.join(controller.marker()).exists()
                && fs::create_dir(&probe).is_ok()
                && fs::remove_dir(&probe).is_ok();
            if !usable {
                continue;
            }
            let Ok(base) = fs::canonicalize(&base) else {
                continue;
            };
            hierarchy.controllers.push(controller);
            // A sandbox has no use for a view of its freezer state.
            if controller != Controller::Freezer {
                hierarchy.by_controller.push((controller, base.clone()));
            }
            if !hierarchy.bases.contains(&base) {
                hierarchy.bases.push(base);
            }
        }
        hierarchy
    }

    pub(super) fn has(&self, controller: Controller) -> bool {
        self.controllers.contains(&controller)
    }

    /// Where sandbox `id` sees its own cgroups, read-only, as a container
    /// does: `/sys/fs/cgroup/<controller>` → its directory on the host.
    /// Only directories that exist (made by [`SandboxCgroup::create`]).
    pub(super) fn views(&self, id: &str) -> Vec<(String, PathBuf)> {
        self.by_controller
            .iter()
            .map(|(controller, base)| {
                (
                    format!("/sys/fs/cgroup/{}", controller.name()),
                    base.join(id),
                )
            })
            .filter(|(_, dir)| dir.is_dir())
            .collect()
    }

    /// The cgroups of sandbox `id`, whether or not they exist yet.
    pub(super) fn sandbox(&self, id: &str) -> SandboxCgroup {
        SandboxCgroup {
            dirs: self.bases.iter().map(|base| base.join(id)).collect(),
        }
    }
}

/// One sandbox's cgroup directories, one per usable hierarchy.
#[derive(Debug)]
pub(super) struct SandboxCgroup {
    dirs: Vec<PathBuf>,
}

const MIB: u64 = 1024 * 1024;
/// How long freezing may take before a pause gives up.
const FREEZE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);
const CFS_PERIOD_US: u64 = 100_000;

impl SandboxCgroup {
    /// Creates the directories (keeping existing ones) and writes the
    /// spec's limits into them; a limit of 0 means none.
    pub(super) fn create(&self, spec: &SandboxSpec) -> io::Result<()> {
        for dir in &self.dirs {
            match fs::create_dir(dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            if spec.memory_mb > 0 && dir.join(Controller::Memory.marker()).exists() {
                let bytes = spec.memory_mb * MIB;
                write(dir, "memory.limit_in_bytes", bytes)?;
                // Only present when the kernel accounts swap; without it a
                // host with swap lets the sandbox page out past the limit,
                // as Docker does there.
                if dir.join("memory.memsw.limit_in_bytes").exists() {
                    write(dir, "memory.memsw.limit_in_bytes", bytes)?;
                }
            }
            if spec.pids > 0 && dir.join(Controller::Pids.marker()).exists() {
                write(dir, "pids.max", spec.pids)?;
            }
            if spec.cpus > 0.0 && dir.join(Controller::Cpu.marker()).exists() {
                // The quota is CPU time per period; 1 ms is the kernel's
                // minimum.
                let quota = ((spec.cpus * CFS_PERIOD_US as f64) as u64).max(1_000);
                write(dir, "cpu.cfs_period_us", CFS_PERIOD_US)?;
                write(dir, "cpu.cfs_quota_us", quota)?;
            }
        }
        Ok(())
    }

    fn dir_of(&self, controller: Controller) -> Option<&PathBuf> {
        self.dirs
            .iter()
            .find(|dir| dir.join(controller.marker()).exists())
    }

    /// Moves process `pid` (and the children it forks from then on) into
    /// every directory.
    pub(super) fn add(&self, pid: u32) -> io::Result<()> {
        for dir in &self.dirs {
            fs::write(dir.join("cgroup.procs"), pid.to_string())?;
        }
        Ok(())
    }

    pub(super) fn memory_bytes(&self) -> Option<u64> {
        read(self.dir_of(Controller::Memory)?, "memory.usage_in_bytes")
    }

    /// The memory limit and how much of the cgroup's memory is tmpfs
    /// (the sandbox's `/workspace` and `/tmp` as root, `/dev/shm`): files
    /// that stay charged until they are deleted.
    pub(super) fn memory_in_files(&self) -> Option<(u64, u64)> {
        let dir = self.dir_of(Controller::Memory)?;
        let limit = read(dir, "memory.limit_in_bytes")?;
        let stat = fs::read_to_string(dir.join("memory.stat")).ok()?;
        let shmem = stat
            .lines()
            .find_map(|line| line.strip_prefix("total_shmem "))
            .or_else(|| stat.lines().find_map(|line| line.strip_prefix("shmem ")))?
            .trim()
            .parse()
            .ok()?;
        Some((limit, shmem))
    }

    /// The processes in the sandbox's cgroup (not their threads, which
    /// `pids.current` counts too), where it has a pids controller.
    pub(super) fn processes(&self) -> Option<u64> {
        let procs = fs::read_to_string(self.dir_of(Controller::Pids)?.join("cgroup.procs")).ok()?;
        Some(procs.lines().count() as u64)
    }

    /// CPU time used by all its processes since the cgroup was made, in ns.
    pub(super) fn cpu_usage_ns(&self) -> Option<u64> {
        read(self.dir_of(Controller::Cpuacct)?, "cpuacct.usage")
    }

    /// Whether the sandbox can be frozen: the host gave it a freezer cgroup.
    pub(super) fn can_freeze(&self) -> bool {
        self.dir_of(Controller::Freezer).is_some()
    }

    /// Freezes every process of the sandbox, waiting until the kernel says
    /// all are (`FREEZING` turns `FROZEN`; a task in an uninterruptible
    /// wait holds it back, so the request is repeated). Processes an exec
    /// adds later are frozen as they join.
    pub(super) async fn freeze(&self) -> io::Result<()> {
        let Some(dir) = self.dir_of(Controller::Freezer) else {
            return Err(io::Error::other("no freezer cgroup"));
        };
        let deadline = tokio::time::Instant::now() + FREEZE_WITHIN;
        loop {
            write(dir, "freezer.state", "FROZEN")?;
            if fs::read_to_string(dir.join("freezer.state"))?.trim() == "FROZEN" {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                // Half frozen is worse than running: let it all go again.
                let _ = write(dir, "freezer.state", "THAWED");
                return Err(io::Error::other(format!(
                    "the sandbox's processes did not freeze within {FREEZE_WITHIN:?}"
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Lets frozen processes run again; a sandbox not frozen is left alone.
    pub(super) fn thaw(&self) -> io::Result<()> {
        match self.dir_of(Controller::Freezer) {
            Some(dir) => write(dir, "freezer.state", "THAWED"),
            None => Ok(()),
        }
    }

    /// Whether the sandbox is frozen, or being frozen.
    pub(super) fn frozen(&self) -> bool {
        self.dir_of(Controller::Freezer)
            .and_then(|dir| fs::read_to_string(dir.join("freezer.state")).ok())
            .is_some_and(|state| state.trim() != "THAWED")
    }

    /// Kills every live process in the cgroups and waits until they have
    /// exited. Killing a pid-namespace init takes its whole namespace with
    /// it, so this converges even while a fork bomb runs. A frozen sandbox
    /// is thawed after the kill is sent: a frozen process acts on no signal.
    pub(super) async fn kill_all(&self) {
        loop {
            let mut alive = Vec::new();
            for pid in self.procs() {
                // A zombie is already dead and only waits for its parent to
                // reap it; waiting on it here could spin forever.
                if sys::is_zombie(pid) {
                    continue;
                }
                if let Ok(Some(process)) = PidFd::open(pid) {
                    process.kill();
                    alive.push(process);
                }
            }
            if alive.is_empty() {
                return;
            }
            if let Err(e) = self.thaw() {
                tracing::warn!(error = %e, "cannot thaw a sandbox's cgroup to kill its processes");
            }
            for process in alive {
                process.exited().await;
            }
        }
    }

    fn procs(&self) -> BTreeSet<u32> {
        self.dirs
            .iter()
            .filter_map(|dir| fs::read_to_string(dir.join("cgroup.procs")).ok())
            .flat_map(|list| {
                list.lines()
                    .filter_map(|p| p.trim().parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect()
    }

    /// Removes the directories; missing ones are fine. One that still holds
    /// a process is left behind with a warning rather than failing the
    /// removal of the sandbox.
    pub(super) fn remove(&self) {
        for dir in &self.dirs {
            match fs::remove_dir(dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a sandbox cgroup");
                }
                _ => {}
            }
        }
    }
}

fn write(dir: &Path, file: &str, value: impl ToString) -> io::Result<()> {
    fs::write(dir.join(file), value.to_string()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {}: {e}", dir.join(file).display()),
        )
    })
}

fn read(dir: &Path, file: &str) -> Option<u64> {
    fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
}
