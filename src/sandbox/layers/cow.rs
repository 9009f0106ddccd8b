//! A layered workspace on the host: the overlay a sandbox's `/workspace`
//! is, whatever backend runs the sandbox (a local sandbox's namespaces
//! bind it, a docker container mounts it).
//!
//! In the sandbox's directory on the host ([`Cow::dir`]):
//!
//! - `cow/`: a tmpfs of the disk limit holding the upper layer
//!   `u{generation}` and overlayfs' work directory `w{generation}`;
//! - the workspace ([`Cow::workspace`]): the overlay of the layers
//!   ([`Chain::mounted`], top first), then the empty `base/`, under that
//!   upper layer;
//! - `lower/{layer id}`: a read-only, id-mapped view of a layer another
//!   uid made (a fork's), in which its files are this sandbox's;
//! - `index`: the upper layer's entries at the last freeze.
//!
//! The overlay is mounted once (at the sandbox's start, or when a seed
//! puts another chain under it) and stays: a freeze copies what the upper
//! layer changed since the last one into a new layer
//! ([`super::freeze_upper`]), so the running sandbox sees nothing change.
//! [`Chain`] is what the backend keeps beside the sandbox (a local
//! sandbox's `meta.json`, a docker sandbox's `chain.json`), written
//! through the `save` each change is given.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::MAX_LAYERS;
use crate::sandbox::tmpfs;

/// Where a layered workspace is and whose it is.
pub struct Cow {
    /// The sandbox's directory on the host.
    pub dir: PathBuf,
    /// Where the overlay is mounted.
    pub workspace: PathBuf,
    /// The uid the sandbox's processes run as on the host: the upper
    /// layer's owner.
    pub uid: u32,
    /// The sandbox's disk limit; 0 for none.
    pub disk_mb: u64,
}

/// A layered workspace's chain, as its backend keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Chain {
    /// The workspace's layers as of its last freeze, top first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<PathBuf>,
    /// The layers its overlay is mounted on, top first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounted: Vec<PathBuf>,
    /// Which upper layer is the workspace's now (each seed makes the next).
    #[serde(default)]
    pub generation: u64,
}

/// Writes a changed chain where its backend keeps it.
pub type Save<'a> = &'a dyn Fn(&Chain) -> io::Result<()>;

impl Cow {
    fn cow(&self) -> PathBuf {
        self.dir.join("cow")
    }

    fn upper(&self, generation: u64) -> PathBuf {
        self.cow().join(format!("u{generation}"))
    }

    fn work(&self, generation: u64) -> PathBuf {
        self.cow().join(format!("w{generation}"))
    }

    fn views(&self) -> PathBuf {
        self.dir.join("lower")
    }

    fn base(&self) -> PathBuf {
        self.dir.join("base")
    }

    fn index(&self) -> PathBuf {
        self.dir.join("index")
    }

    /// Mounts the layered workspace where it is not mounted: a new
    /// sandbox, one whose overlay was taken off, or one whose mounts went
    /// with a reboot (its upper layer too, as a tmpfs workspace's files
    /// do; the workspace is then its last freeze).
    pub fn mount(&self, chain: &mut Chain, save: Save) -> io::Result<()> {
        make_dir(&self.cow(), 0o700, None)?;
        tmpfs::mount_tmpfs(&self.cow(), "mode=0700")?;
        if overlay_at(&self.workspace)? {
            return Ok(());
        }
        if !self.upper(chain.generation).exists() {
            // The upper layer went with its tmpfs (a reboot): the
            // workspace is its last freeze. One that stayed (the overlay
            // was taken off for a container's restart) goes back on the
            // same lowers.
            chain.mounted = chain.layers.clone();
            self.remove_index()?;
        }
        self.mount_chain(chain, 0o755)?;
        save(chain)?;
        self.resize(chain)
    }

    /// Mounts the overlay of `chain.mounted` and the upper layer at the
    /// workspace, making the upper layer (its top directory `mode`) and
    /// the id-mapped views it needs.
    fn mount_chain(&self, chain: &Chain, mode: u32) -> io::Result<()> {
        let (upper, work) = (self.upper(chain.generation), self.work(chain.generation));
        if !upper.exists() {
            make_dir(&upper, mode, Some(self.uid))?;
        }
        make_dir(&work, 0o700, None)?;
        make_dir(&self.base(), 0o755, None)?;
        let mut lowers = Vec::with_capacity(chain.mounted.len() + 1);
        for layer in &chain.mounted {
            let owner = super::owner(layer)?;
            if owner == self.uid {
                lowers.push(layer.clone());
                continue;
            }
            let id = super::layer_id(layer).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not a layer", layer.display()),
                )
            })?;
            let view = self.views().join(id);
            make_dir(&self.views(), 0o700, None)?;
            make_dir(&view, 0o755, None)?;
            if !mounted(&view)? {
                super::mount_mapped(layer, &view, owner, self.uid)?;
            }
            lowers.push(view);
        }
        lowers.push(self.base());
        super::mount_overlay(&self.workspace, &lowers, Some((&upper, &work)))
    }

    /// Freezes what the workspace changed since the last freeze into a
    /// new layer of `store` on top of its chain (merged into one past
    /// [`MAX_LAYERS`]); the chain. Nothing changed (and a chain to show
    /// for it): the chain as it was. Nothing may run in the sandbox
    /// meanwhile.
    pub fn freeze(&self, chain: &mut Chain, store: &Path, save: Save) -> io::Result<Vec<PathBuf>> {
        let upper = self.upper(chain.generation);
        // A workspace's first snapshot is a layer even when empty: a chain.
        let always = chain.layers.is_empty();
        let (top, write_index) = super::freeze_upper(&upper, &self.index(), store, always)?;
        let Some(top) = top else {
            return Ok(chain.layers.clone());
        };
        let mut layers: Vec<PathBuf> = std::iter::once(top)
            .chain(chain.layers.iter().cloned())
            .collect();
        if layers.len() > MAX_LAYERS {
            layers = vec![super::merge(&layers, store)?];
        }
        chain.layers = layers;
        save(chain)?;
        write_index()?;
        Ok(chain.layers.clone())
    }

    /// Mounts `layers` under a fresh upper layer in place of the
    /// workspace's overlay; on failure the old one is mounted again.
    /// Nothing may run in the sandbox meanwhile.
    pub fn seed(&self, chain: &mut Chain, layers: &[PathBuf], save: Save) -> io::Result<()> {
        let old = chain.generation;
        // The upper layer's top directory is the workspace's own.
        let mode = fs::metadata(self.upper(old))
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o755);
        let before = chain.clone();
        chain.mounted = layers.to_vec();
        chain.layers = layers.to_vec();
        chain.generation = old + 1;
        self.unmount()?;
        if let Err(e) = self.mount_chain(chain, mode) {
            let _ = self.unmount();
            let _ = fs::remove_dir_all(self.upper(chain.generation));
            let _ = fs::remove_dir_all(self.work(chain.generation));
            *chain = before;
            self.mount_chain(chain, mode)?;
            return Err(e);
        }
        self.remove_index()?;
        save(chain)?;
        let _ = fs::remove_dir_all(self.upper(old));
        let _ = fs::remove_dir_all(self.work(old));
        if let Err(e) = self.resize(chain) {
            tracing::warn!(workspace = %self.workspace.display(), error = %e, "the workspace's upper layer keeps its size");
        }
        Ok(())
    }

    fn remove_index(&self) -> io::Result<()> {
        match fs::remove_file(self.index()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Takes the overlay off the workspace; only it: what it was mounted
    /// on (a docker workspace's shared bind) stays.
    pub fn detach_overlay(&self) -> io::Result<()> {
        while overlay_at(&self.workspace)? {
            detach(&self.workspace)?;
        }
        Ok(())
    }

    /// Detaches the overlay and the id-mapped views (their directories go).
    fn unmount(&self) -> io::Result<()> {
        self.detach_overlay()?;
        super::detach_under(&self.views())?;
        match fs::remove_dir_all(self.views()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The disk limit in MB when the upper layer is (all but) full: less
    /// than 64 KiB left, as a write that failed for lack of room leaves it.
    pub fn full(&self) -> io::Result<Option<u64>> {
        if self.disk_mb == 0 {
            return Ok(None);
        }
        let free = tmpfs::free_bytes(&self.cow())?;
        Ok((free < 64 * 1024).then_some(self.disk_mb))
    }

    /// Sizes the upper layer's tmpfs to what the disk limit leaves above
    /// the mounted layers: the workspace as a whole stays within the
    /// limit, as a tmpfs workspace does.
    fn resize(&self, chain: &Chain) -> io::Result<()> {
        let limit = match self.disk_mb {
            0 => return Ok(()),
            mb => mb * 1024 * 1024,
        };
        let below: u64 = chain.mounted.iter().map(|l| super::layer_bytes(l)).sum();
        // Never below a page: even a full workspace can take whiteouts (rm).
        let room = limit.saturating_sub(below).max(4096);
        tmpfs::resize_tmpfs(&self.cow(), room)
    }
}

/// What a command that failed in a full workspace gets on its stderr
/// (its own error is only "No space left on device").
pub fn full_note(limit_mb: u64) -> String {
    format!(
        "\nconclave: /workspace is full: its files take the sandbox's disk limit of {limit_mb} MB \
         (sandbox.disk_mb); remove files, or start a sandbox with a larger disk_mb\n"
    )
}

/// Whether an overlay is mounted at `path` (the top mount there, or one
/// under it).
fn overlay_at(path: &Path) -> io::Result<bool> {
    let table = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(table.lines().any(|line| {
        let point = line.split(' ').nth(4).map(super::unescape);
        let kind = line
            .split(" - ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next());
        point.is_some_and(|p| Path::new(&p) == path) && kind == Some("overlay")
    }))
}

/// Detaches the top mount at `path`.
fn detach(path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let target = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether something is mounted at `path`.
fn mounted(path: &Path) -> io::Result<bool> {
    Ok(super::mount_points_under(path)?
        .iter()
        .any(|point| point == path))
}

fn make_dir(path: &Path, mode: u32, owner: Option<u32>) -> io::Result<()> {
    match fs::DirBuilder::new().mode(mode).create(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    // Not through the umask.
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    if let Some(uid) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(uid))?;
    }
    Ok(())
}
