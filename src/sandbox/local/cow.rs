//! A local sandbox's layered workspace (see `crate::sandbox::layers`),
//! as root on a host with overlayfs.
//!
//! In the sandbox's directory:
//!
//! - `cow/`: a tmpfs of the disk limit holding the upper layer
//!   `u{generation}` and overlayfs' work directory `w{generation}`;
//! - `workspace/`: the overlay of the layers (`meta.layers`, top first),
//!   then the empty `base/`, under that upper layer;
//! - `lower/{layer id}`: a read-only, id-mapped view of a layer another
//!   sandbox's uid made (a fork's), in which its files are this sandbox's.
//!
//! The overlay is mounted once (at the sandbox's start, or when a fork
//! seeds it) and stays: a freeze copies what the upper layer changed since
//! the last one into a new layer ([`layers::freeze_upper`], the index of
//! the upper layer at that freeze in `index`), so the running sandbox sees
//! nothing change. `meta.mounted` are the lowers of the mount, and
//! `meta.layers` the chain of the workspace as of the last freeze. Every
//! exec's container bind-mounts `workspace/` when it starts, so a seed
//! (a new mount) reaches only containers started after it: the resident
//! is started again.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::jail::Layout;
use super::meta::{Meta, read_meta, write_meta};
use super::sys;
use crate::sandbox::layers::{self, MAX_LAYERS};

impl Layout {
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

    /// The upper layer's entries at the last freeze.
    fn index(&self) -> PathBuf {
        self.dir.join("index")
    }
}

/// Mounts the layered workspace where it is not mounted: a new sandbox,
/// or one whose mounts went with a reboot (its upper layer too, as a
/// tmpfs workspace's files do; the workspace is then its last freeze).
pub(super) fn mount(layout: &Layout, meta: &mut Meta) -> io::Result<()> {
    make_dir(&layout.cow(), 0o700, None)?;
    sys::mount_tmpfs(&layout.cow(), "mode=0700")?;
    if mounted(&layout.workspace())? {
        return Ok(());
    }
    meta.mounted = meta.layers.clone();
    remove_index(layout)?;
    mount_chain(layout, meta, 0o755)?;
    write_meta(layout, meta)?;
    resize(layout, meta)
}

/// Mounts the overlay of `meta.mounted` and the upper layer at the
/// workspace, making the upper layer (its top directory `mode`) and the
/// id-mapped views it needs.
fn mount_chain(layout: &Layout, meta: &Meta, mode: u32) -> io::Result<()> {
    let (upper, work) = (layout.upper(meta.generation), layout.work(meta.generation));
    if !upper.exists() {
        make_dir(&upper, mode, Some(meta.uid))?;
    }
    make_dir(&work, 0o700, None)?;
    make_dir(&layout.base(), 0o755, None)?;
    let mut lowers = Vec::with_capacity(meta.mounted.len() + 1);
    for layer in &meta.mounted {
        let owner = layers::owner(layer)?;
        if owner == meta.uid {
            lowers.push(layer.clone());
            continue;
        }
        let id = layers::layer_id(layer).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a layer", layer.display()),
            )
        })?;
        let view = layout.views().join(id);
        make_dir(&layout.views(), 0o700, None)?;
        make_dir(&view, 0o755, None)?;
        if !mounted(&view)? {
            layers::mount_mapped(layer, &view, owner, meta.uid)?;
        }
        lowers.push(view);
    }
    lowers.push(layout.base());
    layers::mount_overlay(&layout.workspace(), &lowers, Some((&upper, &work)))
}

/// Freezes what the workspace changed since the last freeze into a new
/// layer of `store` on top of its chain (merged into one past
/// [`MAX_LAYERS`]); the chain. Nothing changed (and a chain to show for
/// it): the chain as it was. Nothing may run in the sandbox meanwhile.
pub(super) fn freeze(layout: &Layout, store: &Path) -> io::Result<Vec<PathBuf>> {
    let mut meta = read_meta(layout)?;
    let upper = layout.upper(meta.generation);
    // A workspace's first snapshot is a layer even when empty: a chain.
    let always = meta.layers.is_empty();
    let (top, write_index) = layers::freeze_upper(&upper, &layout.index(), store, always)?;
    let Some(top) = top else {
        return Ok(meta.layers);
    };
    let mut chain: Vec<PathBuf> = std::iter::once(top)
        .chain(meta.layers.iter().cloned())
        .collect();
    if chain.len() > MAX_LAYERS {
        chain = vec![layers::merge(&chain, store)?];
    }
    meta.layers = chain;
    write_meta(layout, &meta)?;
    write_index()?;
    Ok(meta.layers)
}

/// Puts `chain` under the workspace in place of its layers and upper
/// layer. Nothing may run in the sandbox meanwhile.
pub(super) fn seed(layout: &Layout, chain: &[PathBuf]) -> io::Result<()> {
    let mut meta = read_meta(layout)?;
    remount(layout, &mut meta, chain.to_vec())
}

/// Mounts `chain` under a fresh upper layer in place of the workspace's
/// overlay; on failure the old one is mounted again.
fn remount(layout: &Layout, meta: &mut Meta, chain: Vec<PathBuf>) -> io::Result<()> {
    let old = meta.generation;
    // The upper layer's top directory is the workspace's own.
    let mode = fs::metadata(layout.upper(old))
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o755);
    let (before, before_layers) = (
        std::mem::replace(&mut meta.mounted, chain.clone()),
        std::mem::replace(&mut meta.layers, chain),
    );
    meta.generation = old + 1;
    unmount(layout)?;
    if let Err(e) = mount_chain(layout, meta, mode) {
        let _ = unmount(layout);
        let _ = fs::remove_dir_all(layout.upper(meta.generation));
        let _ = fs::remove_dir_all(layout.work(meta.generation));
        (meta.mounted, meta.layers, meta.generation) = (before, before_layers, old);
        mount_chain(layout, meta, mode)?;
        return Err(e);
    }
    remove_index(layout)?;
    write_meta(layout, meta)?;
    let _ = fs::remove_dir_all(layout.upper(old));
    let _ = fs::remove_dir_all(layout.work(old));
    if let Err(e) = resize(layout, meta) {
        tracing::warn!(sandbox = %meta.id, error = %e, "the workspace's upper layer keeps its size");
    }
    Ok(())
}

fn remove_index(layout: &Layout) -> io::Result<()> {
    match fs::remove_file(layout.index()) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Detaches the overlay and the id-mapped views (their directories go).
fn unmount(layout: &Layout) -> io::Result<()> {
    layers::detach_under(&layout.workspace())?;
    layers::detach_under(&layout.views())?;
    match fs::remove_dir_all(layout.views()) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The disk limit in MB when the upper layer is (all but) full: less
/// than 64 KiB left, as a write that failed for lack of room leaves it.
pub(super) fn full(layout: &Layout) -> io::Result<Option<u64>> {
    let meta = read_meta(layout)?;
    if meta.spec.disk_mb == 0 {
        return Ok(None);
    }
    let free = sys::free_bytes(&layout.cow())?;
    Ok((free < 64 * 1024).then_some(meta.spec.disk_mb))
}

/// Sizes the upper layer's tmpfs to what the disk limit leaves above the
/// mounted layers: the workspace as a whole stays within the limit, as a
/// tmpfs workspace does.
fn resize(layout: &Layout, meta: &Meta) -> io::Result<()> {
    let limit = match meta.spec.disk_mb {
        0 => return Ok(()),
        mb => mb * 1024 * 1024,
    };
    let below: u64 = meta.mounted.iter().map(|l| layers::layer_bytes(l)).sum();
    // Never below a page: even a full workspace can take whiteouts (rm).
    let room = limit.saturating_sub(below).max(4096);
    sys::resize_tmpfs(&layout.cow(), room)
}

/// Whether something is mounted at `path`.
fn mounted(path: &Path) -> io::Result<bool> {
    Ok(layers::mount_points_under(path)?
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
