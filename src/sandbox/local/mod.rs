//! Local sandboxes: Linux namespaces, cgroups, rlimits, landlock and seccomp
//! through hakoniwa, on the host itself; no daemon needed.
//!
//! Layout:
//!
//! - this file: [`LocalBackend`]: create, attach, list and remove sandboxes
//!   as directories.
//! - `config`: [`LocalConfig`].
//! - `sandbox`: [`LocalSandbox`]: exec, stats, destroy.
//! - `meta`: the `meta.json` each sandbox directory records itself in.
//! - `jail`: the container every exec runs in: file system view, identity,
//!   namespaces, rlimits, and the last steps its init takes itself.
//! - `policy`: the landlock and seccomp rules.
//! - `resident`: the sandbox's long-lived container and its exec helper.
//! - `run`: one container: the thread that starts it, stdin, streaming,
//!   kills.
//! - `net`: the veth pair that links an exec's network namespace to the
//!   host, for sandboxes given network.
//! - `cgroup`: cgroup v1 limits and accounting.
//! - `sys`: the few system calls made directly (pidfds, loopback, mounts).
//!
//! A sandbox is a directory `<root>/<id>/` holding `workspace/` (its
//! `/workspace`), `tmp/` (its `/tmp`), `meta.json` (spec and labels, so
//! that a restarted server lists, re-attaches or reaps it), `etc/` (its
//! generated `passwd`, `group` and `hosts`) and `run/` (each running exec's
//! root directory, empty but for mount points). A container has new
//! mount, pid, ipc, uts and (unless `spec.network`) network namespaces;
//! when its init exits, the kernel ends whatever else runs in it. Each
//! sandbox keeps one container while it lives, its resident (`resident`),
//! which runs the exec helper docker sandboxes run: an exec is then a line
//! on a pipe, and the helper kills what a command leaves behind when it
//! ends. Uploads, bulk output and hosts whose CPU limit is a per-exec
//! rlimit run each exec in a container of its own instead, whose whole
//! tree ends with the command, as a timeout or cancel ends it at once.
//!
//! Running as root, each sandbox gets a host uid of its own
//! ([`LocalConfig::uid_base`]), cgroup v1 directories for memory, pids and
//! CPU, and tmpfs mounts of `spec.disk_mb` as its `workspace/` and `tmp/`
//! (so the disk limit holds for the workspace as a whole, as docker's tmpfs
//! does, and the files live as long as the host does). Otherwise a user
//! namespace maps the server's uid to 1000, only rlimits apply, and the
//! disk limit caps each file, not the total.
//!
//! `spec.network = true`, as root, gives each exec a network namespace of
//! its own linked to the host by a veth pair (`net`), as docker's bridge
//! networks do: its listeners are on its own `eth0` and loopback, never on
//! the host's interfaces or ports, and its traffic leaves masqueraded
//! through the firewall's chain (`crate::sandbox::firewall`), which the
//! server installs when `sandbox.allow_network` is on. Its `resolv.conf`
//! names the host's name servers, less loopback stubs, which a namespace
//! cannot reach. Not root, `spec.network` shares the host's network stack
//! as Docker's `--network host` does (no isolation of ports or addresses);
//! the server refuses `sandbox.allow_network` then, so only direct users of
//! the backend get that. Each exec's init keeps a parent-death signal, so
//! the whole exec dies with the server, however the server dies.
//! `spec.image` is recorded but unused: the host's system directories are the
//! image.

mod cgroup;
mod config;
mod cow;
mod jail;
mod meta;
mod net;
mod policy;
mod resident;
mod run;
mod sandbox;
mod sys;

#[cfg(test)]
mod cow_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use self::cgroup::{Controller, Hierarchy};
use self::jail::{Fallbacks, Identity, Jail, Layout};
use self::meta::{ID_PREFIX, Meta, SpecRecord, read_meta, valid_id, write_meta};
use super::{
    LABEL_MANAGED, ManagedSandbox, Result, Sandbox, SandboxBackend, SandboxError, SandboxSpec,
    create_detached,
};
use crate::sync::lock;

pub use self::config::LocalConfig;
use self::config::probe_hint;
pub use self::sandbox::LocalSandbox;
use self::sandbox::ResidentState;

/// Where cgroup v1 controllers are mounted.
const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// What the backend knows about the host, shared with its sandboxes.
#[derive(Debug)]
struct Host {
    root: PathBuf,
    config: LocalConfig,
    /// Root: per-sandbox host uids, and tmpfs mounts of the disk limit for
    /// each sandbox's `/workspace` and `/tmp`.
    is_root: bool,
    /// Workspaces are overlays of layers (`cow`): root, with overlayfs.
    layered: bool,
    landlock: bool,
    cgroups: Hierarchy,
    fallbacks: Fallbacks,
    /// Sandboxes open in this process, so `remove` can stop their execs and
    /// `attach` hands out the same one.
    open: Mutex<HashMap<String, Weak<LocalSandbox>>>,
    /// Serialises picking a free uid with writing the meta.json that takes it.
    creating: tokio::sync::Mutex<()>,
    /// Serves sandboxes made with an allow-list (`SandboxSpec::egress`).
    proxy: std::sync::OnceLock<Arc<crate::sandbox::proxy::EgressProxy>>,
}

/// Whether this process runs as root, which local sandboxes' own uids and
/// their traffic filter need.
pub fn is_root() -> bool {
    sys::is_root()
}

/// Where the firewall catches the traffic of local sandboxes given network
/// (as root: their veth pairs).
pub fn network_hook() -> super::firewall::Hook {
    net::hook()
}

/// Sandboxes in Linux namespaces on this host.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    host: Arc<Host>,
}

impl LocalBackend {
    /// Opens (creating) `root`, the directory that holds the sandboxes
    /// (`config.root` or the caller's default), and checks that this kernel
    /// lets the server build a sandbox, by running `/bin/true` in one.
    pub fn new(config: LocalConfig, root: PathBuf) -> Result<Self, SandboxError> {
        config.validate()?;
        // Mount sources must be absolute, and a relative root would move
        // with the working directory: the config makes paths absolute.
        if !root.is_absolute() {
            return Err(SandboxError::Unavailable(format!(
                "the local sandbox root {} is not an absolute path",
                root.display()
            )));
        }
        let unavailable = |what: &str, e: io::Error| {
            SandboxError::Unavailable(format!("{what} {}: {e}", root.display()))
        };
        fs::create_dir_all(&root).map_err(|e| unavailable("cannot create", e))?;
        // Workspaces hold whatever agents write; other host users have no
        // business there.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700))
            .map_err(|e| unavailable("cannot restrict", e))?;
        let is_root = sys::is_root();
        let landlock = sys::landlock_supported();
        let cgroups = Hierarchy::detect(Path::new(CGROUP_MOUNT), &config.cgroup_parent);
        let fallbacks = Fallbacks {
            memory: !cgroups.has(Controller::Memory),
            pids: !cgroups.has(Controller::Pids),
            cpu: !cgroups.has(Controller::Cpu),
        };
        let mut weaker = Vec::new();
        if fallbacks.memory {
            weaker.push("memory by RLIMIT_AS (address space, not memory)");
        }
        if fallbacks.pids {
            weaker.push(if is_root {
                "pids by RLIMIT_NPROC of the sandbox's uid"
            } else {
                "pids by RLIMIT_NPROC, per exec"
            });
        }
        if fallbacks.cpu {
            weaker.push("cpus by RLIMIT_CPU over each exec's timeout (kills, not throttles)");
        }
        if !cgroups.has(Controller::Cpuacct) {
            weaker.push("no CPU figure in stats");
        }
        if !landlock {
            weaker.push("no landlock (the mount namespace still hides the host)");
        }
        if !weaker.is_empty() {
            tracing::warn!(
                limits = %weaker.join("; "),
                "local sandboxes: no writable cgroup v1 controller or landlock for some limits; falling back"
            );
        }
        if !is_root {
            tracing::warn!(
                "local sandboxes: not running as root, so a user namespace maps the server's uid \
                 to every sandbox's uid and /tmp is a directory on disk"
            );
        }
        let host = Host {
            root,
            config,
            is_root,
            layered: is_root && crate::sandbox::layers::supported(),
            landlock,
            cgroups,
            fallbacks,
            open: Mutex::new(HashMap::new()),
            creating: tokio::sync::Mutex::new(()),
            proxy: std::sync::OnceLock::new(),
        };
        resident::install(&host.layout(".probe")).map_err(|e| {
            SandboxError::Unavailable(format!(
                "cannot write the exec helper into {}: {e}",
                host.root.display()
            ))
        })?;
        host.probe()?;
        Ok(LocalBackend {
            host: Arc::new(host),
        })
    }

    /// Serves sandboxes made with an allow-list through `proxy`.
    pub fn with_proxy(self, proxy: Arc<crate::sandbox::proxy::EgressProxy>) -> LocalBackend {
        let _ = self.host.proxy.set(proxy);
        self
    }
}

impl Host {
    fn layout(&self, id: &str) -> Layout {
        Layout {
            dir: self.root.join(id),
        }
    }

    fn identity(&self, uid: u32) -> Identity {
        if self.is_root {
            Identity::HostUid(uid)
        } else {
            Identity::Mapped
        }
    }

    fn jail(&self, meta: &Meta, layout: &Layout) -> Jail {
        Jail::new(
            layout,
            &meta.id,
            self.identity(meta.uid),
            &meta.spec.clone().into(),
            self.landlock,
            self.fallbacks,
            &self.cgroups.views(&meta.id),
        )
    }

    /// Runs `/bin/true` in a throwaway sandbox built as real ones are.
    fn probe(&self) -> Result<()> {
        let id = format!(".probe-{}", uuid::Uuid::new_v4().simple());
        let layout = self.layout(&id);
        let meta = Meta {
            id: id.clone(),
            uid: self.config.uid_base,
            created_ms: 0,
            spec: SpecRecord::default(),
            layered: false,
            chain: Default::default(),
        };
        let result = (|| {
            layout
                .prepare(self.identity(meta.uid), &id)
                .map_err(|e| format!("cannot prepare {}: {e}", layout.dir.display()))?;
            let jail = self.jail(&meta, &layout);
            let root = layout.exec_root();
            fs::DirBuilder::new()
                .mode(0o755)
                .create(&root)
                .map_err(|e| format!("cannot make {}: {e}", root.display()))?;
            // This thread forks the container and waits for it, so it
            // outlives it, as hakoniwa needs.
            let output = jail
                .probe_command(&root)?
                .output()
                .map_err(|e| e.to_string())?;
            if output.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{}: {}",
                    output.status.reason,
                    String::from_utf8_lossy(&output.stderr).trim()
                ))
            }
        })();
        let _ = fs::remove_dir_all(&layout.dir);
        result.map_err(|failure| {
            SandboxError::Unavailable(format!(
                "local backend: the start-up test sandbox in {} failed: {failure}; {}",
                self.root.display(),
                probe_hint(&failure, self.is_root)
            ))
        })
    }

    /// Every `<root>/local-*` directory, with its meta.json where readable.
    fn scan(&self) -> io::Result<Vec<(String, io::Result<Meta>)>> {
        let mut found = Vec::new();
        for entry in fs::read_dir(&self.root)? {
            let entry = entry?;
            let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if valid_id(&id) && entry.file_type()?.is_dir() {
                let meta = read_meta(&self.layout(&id));
                found.push((id, meta));
            }
        }
        Ok(found)
    }

    /// The lowest uid of the range no sandbox holds.
    fn free_uid(&self) -> Result<u32> {
        let taken: BTreeSet<u32> = self
            .scan()
            .map_err(backend("listing sandboxes"))?
            .into_iter()
            .filter_map(|(_, meta)| meta.ok().map(|m| m.uid))
            .collect();
        (self.config.uid_base..self.config.uid_base + self.config.uid_count)
            .find(|uid| !taken.contains(uid))
            .ok_or(SandboxError::Capacity(self.config.uid_count as usize))
    }

    /// Makes a sandbox's directory, then opens it; what fails halfway is
    /// removed.
    async fn create(self: &Arc<Self>, spec: &SandboxSpec) -> Result<Arc<LocalSandbox>> {
        let host = self.clone();
        let meta = Meta {
            id: format!("{ID_PREFIX}{}", uuid::Uuid::new_v4().simple()),
            uid: jail::MAPPED_UID,
            created_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as u64,
            spec: spec.into(),
            layered: self.layered,
            chain: Default::default(),
        };
        let creating = self.creating.lock().await;
        let meta = tokio::task::spawn_blocking(move || {
            let mut meta = meta;
            if host.is_root {
                meta.uid = host.free_uid()?;
            }
            let layout = host.layout(&meta.id);
            let made = layout
                .prepare(host.identity(meta.uid), &meta.id)
                .and_then(|()| write_meta(&layout, &meta));
            if let Err(e) = made {
                let _ = fs::remove_dir_all(&layout.dir);
                return Err(backend("creating the sandbox directory")(e));
            }
            Ok(meta)
        })
        .await
        .map_err(|e| SandboxError::Backend(format!("creating a sandbox: {e}")))??;
        drop(creating);
        let id = meta.id.clone();
        match self.open(meta, true).await {
            Ok(sandbox) => {
                // Warm from the start: the first exec is a line on a pipe.
                sandbox.resident().await;
                Ok(sandbox)
            }
            Err(e) => {
                let _ = self.purge(&id).await;
                Err(e)
            }
        }
    }

    /// Opens sandbox `meta.id`, creating its cgroups (or, for one a previous
    /// run made, killing what its execs left running in them first).
    async fn open(self: &Arc<Self>, meta: Meta, fresh: bool) -> Result<Arc<LocalSandbox>> {
        let cgroup = Arc::new(self.cgroups.sandbox(&meta.id));
        if !fresh {
            // No exec survives its server: anything still running there was
            // orphaned by a crash and is past its timeout.
            cgroup.kill_all().await;
        }
        let host = self.clone();
        let made = cgroup.clone();
        let (meta, layout, jail) = tokio::task::spawn_blocking(move || {
            let mut meta = meta;
            made.create(&meta.spec.clone().into())
                .map_err(backend("creating the sandbox's cgroups"))?;
            let layout = host.layout(&meta.id);
            // As docker's tmpfs mounts do, these hold the disk limit: the
            // workspace as a whole (its upper layer, when layered), not
            // only each file in it.
            let size = tmpfs_size(&meta);
            if meta.layered {
                cow::mount(&layout, &mut meta)
                    .map_err(backend("mounting the sandbox's /workspace"))?;
            } else if host.is_root {
                let uid = meta.uid;
                crate::sandbox::tmpfs::mount_tmpfs(
                    &layout.workspace(),
                    &format!("mode=0755,uid={uid},gid={uid}{size}"),
                )
                .map_err(backend("mounting the sandbox's /workspace"))?;
            }
            if host.is_root {
                crate::sandbox::tmpfs::mount_tmpfs(&layout.tmp(), &format!("mode=1777{size}"))
                    .map_err(backend("mounting the sandbox's /tmp"))?;
            }
            let jail = host.jail(&meta, &layout);
            Ok::<_, SandboxError>((meta, layout, jail))
        })
        .await
        .map_err(|e| SandboxError::Backend(format!("opening a sandbox: {e}")))??;
        // The CPU figure of the first stats covers the sandbox's life so far.
        let since_created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(Duration::from_millis(meta.created_ms));
        let now = Instant::now();
        let baseline = now.checked_sub(since_created).unwrap_or(now);
        let sandbox = Arc::new(LocalSandbox {
            id: meta.id.clone(),
            layout,
            host: self.clone(),
            cgroup,
            execs: Mutex::default(),
            tracker: TaskTracker::new(),
            cpu_sample: Mutex::new((baseline, 0)),
            resident: tokio::sync::Mutex::new(ResidentState::for_jail(&jail)),
            layered: meta.layered,
            jail,
        });
        lock(&self.open).insert(meta.id, Arc::downgrade(&sandbox));
        Ok(sandbox)
    }

    fn live(&self, id: &str) -> Option<Arc<LocalSandbox>> {
        lock(&self.open).get(id).and_then(Weak::upgrade)
    }

    /// Kills whatever runs in sandbox `id`'s cgroups and deletes them and its
    /// directory.
    async fn purge(&self, id: &str) -> Result<()> {
        lock(&self.open).remove(id);
        let cgroup = self.cgroups.sandbox(id);
        cgroup.kill_all().await;
        let layout = self.layout(id);
        let mounted = self.is_root;
        tokio::task::spawn_blocking(move || {
            cgroup.remove();
            if mounted {
                // Every mount under it first: a removal must not reach
                // into a layer through an id-mapped view.
                crate::sandbox::layers::detach_under(&layout.dir)?;
            }
            match fs::remove_dir_all(&layout.dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        })
        .await
        .map_err(|e| SandboxError::Backend(format!("removing a sandbox: {e}")))?
        .map_err(backend("removing the sandbox directory"))
    }
}

#[async_trait]
impl SandboxBackend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        let (host, spec) = (self.host.clone(), spec.clone());
        create_detached(async move {
            let sandbox: Arc<dyn Sandbox> = host.create(&spec).await?;
            Ok(sandbox)
        })
        .await
    }

    async fn attach(&self, id: &str) -> Result<Option<Arc<dyn Sandbox>>> {
        if !valid_id(id) {
            return Ok(None);
        }
        if let Some(sandbox) = self.host.live(id) {
            return Ok(Some(sandbox));
        }
        let layout = self.host.layout(id);
        let meta = match tokio::task::spawn_blocking(move || read_meta(&layout)).await {
            Ok(Ok(meta)) => meta,
            Ok(Err(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Ok(Err(e)) => return Err(backend("reading the sandbox's meta.json")(e)),
            Err(e) => return Err(SandboxError::Backend(format!("attaching a sandbox: {e}"))),
        };
        Ok(Some(self.host.open(meta, false).await?))
    }

    async fn list_managed(&self) -> Result<Vec<ManagedSandbox>> {
        let host = self.host.clone();
        let found = tokio::task::spawn_blocking(move || host.scan())
            .await
            .map_err(|e| SandboxError::Backend(format!("listing sandboxes: {e}")))?
            .map_err(backend("listing sandboxes"))?;
        let mut managed = Vec::new();
        for (id, meta) in found {
            match meta {
                Ok(meta) if meta.spec.labels.contains_key(LABEL_MANAGED) => {
                    managed.push(ManagedSandbox::from_labels(id, |k| meta.spec.labels.get(k)))
                }
                Ok(_) => {}
                // A directory without a readable meta.json is a create that
                // crashed half-way; it is ours by its name, and an orphan.
                Err(e) => {
                    tracing::warn!(id, error = %e, "sandbox directory without a readable meta.json");
                    managed.push(ManagedSandbox {
                        id,
                        instance: None,
                        session: None,
                        pool: None,
                        expires: None,
                        created: None,
                    });
                }
            }
        }
        Ok(managed)
    }

    async fn remove(&self, id: &str) -> Result<()> {
        if !valid_id(id) {
            return Ok(());
        }
        match self.host.live(id) {
            Some(sandbox) => sandbox.destroy().await,
            None => self.host.purge(id).await,
        }
    }
}

/// The tmpfs option that holds a sandbox's disk limit.
fn tmpfs_size(meta: &Meta) -> String {
    match meta.spec.disk_mb {
        0 => String::new(),
        mb => format!(",size={mb}m"),
    }
}

fn backend(what: &'static str) -> impl Fn(io::Error) -> SandboxError {
    move |e| SandboxError::Backend(format!("{what}: {e}"))
}
