//! A docker sandbox's layered workspace ([`crate::sandbox::layers::cow`]),
//! where the server runs as root on the docker daemon's host with
//! overlayfs (and the daemon does not remap user namespaces, see
//! `DockerBackend::with_layers`): `/workspace` is a directory the server
//! prepares on the host in place of a tmpfs.
//!
//! Each sandbox has a directory `{root}/{name}` (`root` is the data
//! directory's `sandboxes/docker/`, `name` the container's
//! [`LABEL_WORKSPACE`], which stays when a pool container is claimed):
//! the layered workspace's directories, its chain in `chain.json`, and
//! `workspace/`, bound onto itself as a shared mount before the container
//! starts. The container binds that mount at `/workspace` as a slave
//! (`rslave`), and the server mounts the overlay on it once the container
//! runs: so each mount and unmount the server makes there later (a seed's
//! new overlay) reaches the running container, with no restart, and a
//! container restart (which binds what is on top then) is preceded by
//! taking the overlay off ([`Layered::detach_overlay`]).

use std::collections::HashSet;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bollard::models::{Mount, MountBindOptions, MountBindOptionsPropagationEnum, MountType};

use crate::sandbox::WORKSPACE;
use crate::sandbox::layers::{self, cow};

/// The label naming a container's directory under the root.
pub(super) const LABEL_WORKSPACE: &str = "conclave.workspace";
/// The label holding a container's disk limit in MB.
pub(super) const LABEL_DISK: &str = "conclave.disk_mb";
/// How long a directory no container names is left alone.
const SWEEP_AFTER: std::time::Duration = std::time::Duration::from_secs(600);
/// The uid (and gid) a docker sandbox runs as.
const SANDBOX_UID: u32 = 1000;

/// Where this server keeps its docker sandboxes' layered workspaces.
#[derive(Clone, Debug)]
pub(super) struct Root(PathBuf);

impl Root {
    /// The root at `dir`, made where missing; `None` (tmpfs workspaces)
    /// where this host cannot layer docker workspaces: the server is not
    /// root, overlayfs is missing, or the daemon does not share the
    /// server's mounts (a remote `DOCKER_HOST`, a server in a container
    /// given the host's socket).
    pub(super) fn open(dir: PathBuf) -> Option<Root> {
        if !layers::supported() {
            return None;
        }
        if let Err(why) = daemon_shares_mounts() {
            tracing::info!(
                reason = %why,
                "docker sandboxes' workspaces are tmpfs mounts (no copy-on-write layers)"
            );
            return None;
        }
        // Absolute and without links: the daemon takes a bind's source
        // as one, and the mount table names mounts so.
        let made = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .and_then(|()| fs::canonicalize(&dir));
        match made {
            Ok(dir) => Some(Root(dir)),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "docker sandboxes' workspaces are tmpfs mounts");
                None
            }
        }
    }

    /// A new sandbox's directory, its workspace bound onto itself as a
    /// shared mount; its name.
    pub(super) fn prepare(&self) -> io::Result<String> {
        let name = uuid::Uuid::new_v4().simple().to_string();
        let dir = self.0.join(&name);
        fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let workspace = dir.join("workspace");
        fs::DirBuilder::new().mode(0o755).create(&workspace)?;
        let target = CString::new(workspace.as_os_str().as_bytes())?;
        // SAFETY: NUL-terminated paths alive for each call.
        let rc = unsafe {
            libc::mount(
                target.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        // SAFETY: as above.
        if rc != 0
            || unsafe {
                libc::mount(
                    std::ptr::null(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_SHARED,
                    std::ptr::null(),
                )
            } != 0
        {
            let e = io::Error::last_os_error();
            let _ = self.remove(&name);
            return Err(e);
        }
        Ok(name)
    }

    /// The bind of a sandbox's workspace the container is made with.
    pub(super) fn mount(&self, name: &str) -> Mount {
        Mount {
            target: Some(WORKSPACE.into()),
            source: Some(self.0.join(name).join("workspace").display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(false),
            bind_options: Some(MountBindOptions {
                propagation: Some(MountBindOptionsPropagationEnum::RSLAVE),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Sandbox `name`'s layered workspace of `disk_mb`.
    pub(super) fn layered(&self, name: &str, disk_mb: u64) -> Option<Layered> {
        if !layers::valid_id(name) || !self.0.join(name).is_dir() {
            return None;
        }
        let dir = self.0.join(name);
        Some(Layered {
            root: self.clone(),
            name: name.to_owned(),
            chain_file: dir.join("chain.json"),
            cow: cow::Cow {
                workspace: dir.join("workspace"),
                dir,
                uid: SANDBOX_UID,
                disk_mb,
            },
            chain: Mutex::new(()),
        })
    }

    /// Unmounts and deletes sandbox `name`'s directory.
    pub(super) fn remove(&self, name: &str) -> io::Result<()> {
        if !layers::valid_id(name) {
            return Ok(());
        }
        let dir = self.0.join(name);
        layers::detach_under(&dir)?;
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Deletes the directories of sandboxes that are gone: every one but
    /// those named in `live`, and those changed in the last ten minutes
    /// (a server on the same data directory may be making its container:
    /// `conclave sandboxes list` starts a backend too).
    pub(super) fn sweep(&self, live: &HashSet<String>) {
        let Ok(entries) = fs::read_dir(&self.0) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let recent = entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|at| at.elapsed().is_ok_and(|age| age < SWEEP_AFTER));
            if live.contains(&name) || recent {
                continue;
            }
            if let Err(e) = self.remove(&name) {
                tracing::warn!(workspace = %name, error = %e, "cannot delete a gone docker sandbox's workspace");
            }
        }
    }
}

/// Whether the docker daemon is a process of this host's mount namespace
/// (its socket's peer, whose namespace is this process's), so that the
/// directories and mounts the server makes are the ones its binds see.
fn daemon_shares_mounts() -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let socket = match std::env::var("DOCKER_HOST") {
        Ok(host) if !host.is_empty() => match host.strip_prefix("unix://") {
            Some(path) => PathBuf::from(path),
            None => return Err(format!("the daemon is at {host}")),
        },
        _ => PathBuf::from("/var/run/docker.sock"),
    };
    let stream = std::os::unix::net::UnixStream::connect(&socket)
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    // SAFETY: a zeroed ucred is a valid out-parameter of its size.
    let mut peer: libc::ucred = unsafe { std::mem::zeroed() };
    let mut size = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a connected socket, and a buffer of `size` bytes.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut peer).cast(),
            &mut size,
        )
    };
    if rc != 0 {
        return Err(format!("SO_PEERCRED: {}", io::Error::last_os_error()));
    }
    // 0: the daemon is in a pid namespace this process cannot see.
    if peer.pid <= 0 {
        return Err("the daemon runs in another pid namespace".into());
    }
    let theirs = fs::read_link(format!("/proc/{}/ns/mnt", peer.pid)).map_err(|e| e.to_string())?;
    let ours = fs::read_link("/proc/self/ns/mnt").map_err(|e| e.to_string())?;
    if theirs != ours {
        return Err("the daemon runs in another mount namespace".into());
    }
    Ok(())
}

/// One docker sandbox's layered workspace.
pub(super) struct Layered {
    root: Root,
    /// Its directory's name ([`LABEL_WORKSPACE`]).
    name: String,
    cow: cow::Cow,
    chain_file: PathBuf,
    /// Held while the chain is read and changed.
    chain: Mutex<()>,
}

impl Layered {
    fn load(&self) -> io::Result<cow::Chain> {
        match fs::read(&self.chain_file) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(io::Error::other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(cow::Chain::default()),
            Err(e) => Err(e),
        }
    }

    fn save(&self, chain: &cow::Chain) -> io::Result<()> {
        let temp = self.chain_file.with_extension("json.new");
        fs::write(&temp, serde_json::to_vec(chain).map_err(io::Error::other)?)?;
        fs::rename(&temp, &self.chain_file)
    }

    fn with_chain<T>(
        &self,
        change: impl FnOnce(&cow::Cow, &mut cow::Chain, cow::Save) -> io::Result<T>,
    ) -> io::Result<T> {
        let _held = self.chain.lock().unwrap_or_else(|e| e.into_inner());
        let mut chain = self.load()?;
        change(&self.cow, &mut chain, &|chain| self.save(chain))
    }

    /// Mounts the overlay where it is not (the container runs).
    pub(super) fn mount(&self) -> io::Result<()> {
        self.with_chain(|cow, chain, save| cow.mount(chain, save))
    }

    pub(super) fn freeze(&self, store: &Path) -> io::Result<Vec<PathBuf>> {
        self.with_chain(|cow, chain, save| cow.freeze(chain, store, save))
    }

    pub(super) fn seed(&self, layers: &[PathBuf]) -> io::Result<()> {
        self.with_chain(|cow, chain, save| cow.seed(chain, layers, save))
    }

    pub(super) fn full(&self) -> io::Result<Option<u64>> {
        self.cow.full()
    }

    /// Unmounts and deletes the sandbox's directory (its container gone).
    pub(super) fn remove(&self) -> io::Result<()> {
        let _held = self.chain.lock().unwrap_or_else(|e| e.into_inner());
        self.root.remove(&self.name)
    }

    /// Takes the overlay off the workspace (before a container restart,
    /// which binds what is on top then); [`Layered::mount`] puts it back.
    pub(super) fn detach_overlay(&self) -> io::Result<()> {
        let _held = self.chain.lock().unwrap_or_else(|e| e.into_inner());
        self.cow.detach_overlay()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets a directory's modification time `secs` seconds back.
    fn age(dir: &Path, secs: i64) {
        let path = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let then = libc::timespec {
            tv_sec: now - secs,
            tv_nsec: 0,
        };
        // SAFETY: a NUL-terminated path and two timespecs.
        let rc =
            unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), [then, then].as_ptr(), 0) };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    }

    #[test]
    fn a_sweep_deletes_only_old_directories_no_container_names() {
        assert!(
            layers::supported(),
            "layered workspaces need root and overlayfs; the tests run as root"
        );
        let temp = tempfile::tempdir().unwrap();
        let root = Root(temp.path().to_path_buf());
        let [live, gone, old_live, fresh] = std::array::from_fn(|_| root.prepare().unwrap());
        for name in [&gone, &old_live] {
            age(&temp.path().join(name), 3600);
        }
        root.sweep(&HashSet::from([live.clone(), old_live.clone()]));
        let left = |name: &str| temp.path().join(name).exists();
        assert!(left(&live) && left(&old_live) && left(&fresh));
        assert!(!left(&gone), "an old directory no container names goes");
        assert!(
            layers::mount_points_under(&temp.path().join(&gone))
                .unwrap()
                .is_empty()
        );
        for name in [live, old_live, fresh] {
            root.remove(&name).unwrap();
        }
        assert!(layers::mount_points_under(temp.path()).unwrap().is_empty());
    }
}
