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
//! Every exec's container bind-mounts `workspace/` when it starts, so a
//! new overlay (a freeze, a seed) reaches only containers started after
//! it: the resident is ended first and started again after it.

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
}

/// Mounts the layered workspace where it is not mounted: a new sandbox,
/// or one whose mounts went with a reboot (its upper layer too, as a
/// tmpfs workspace's files do; its layers stay).
pub(super) fn mount(layout: &Layout, meta: &Meta) -> io::Result<()> {
    let size = super::tmpfs_size(meta);
    make_dir(&layout.cow(), 0o700, None)?;
    sys::mount_tmpfs(&layout.cow(), &format!("mode=0700{size}"))?;
    if mounted(&layout.workspace())? {
        return Ok(());
    }
    mount_chain(layout, meta, 0o755)?;
    resize(layout, meta)
}

/// Mounts the overlay of `meta`'s layers and upper layer at the
/// workspace, making the upper layer (its top directory `mode`) and the
/// id-mapped views it needs.
fn mount_chain(layout: &Layout, meta: &Meta, mode: u32) -> io::Result<()> {
    let (upper, work) = (layout.upper(meta.generation), layout.work(meta.generation));
    if !upper.exists() {
        make_dir(&upper, mode, Some(meta.uid))?;
    }
    make_dir(&work, 0o700, None)?;
    make_dir(&layout.base(), 0o755, None)?;
    let mut lowers = Vec::with_capacity(meta.layers.len() + 1);
    for layer in &meta.layers {
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

/// The workspace's layers when nothing changed since its last freeze;
/// `None` when something did (or it was never frozen).
pub(super) fn unchanged(layout: &Layout) -> io::Result<Option<Vec<PathBuf>>> {
    let meta = read_meta(layout)?;
    let same = !meta.layers.is_empty() && layers::is_empty(&layout.upper(meta.generation))?;
    Ok(same.then_some(meta.layers))
}

/// Freezes the upper layer into a new layer of `store` (or, past
/// [`MAX_LAYERS`], the whole workspace into one) and mounts the chain it
/// tops under a fresh upper layer; the chain. Nothing may run in the
/// sandbox meanwhile.
pub(super) fn freeze(layout: &Layout, store: &Path) -> io::Result<Vec<PathBuf>> {
    let mut meta = read_meta(layout)?;
    let chain = if meta.layers.len() >= MAX_LAYERS || crowded(&meta) {
        vec![layers::copy_into(&layout.workspace(), store)?]
    } else {
        let top = layers::copy_into(&layout.upper(meta.generation), store)?;
        std::iter::once(top)
            .chain(meta.layers.iter().cloned())
            .collect()
    };
    remount(layout, &mut meta, chain)?;
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
    let before = std::mem::replace(&mut meta.layers, chain);
    meta.generation = old + 1;
    unmount(layout)?;
    if let Err(e) = mount_chain(layout, meta, mode) {
        let _ = unmount(layout);
        let _ = fs::remove_dir_all(layout.upper(meta.generation));
        let _ = fs::remove_dir_all(layout.work(meta.generation));
        meta.layers = before;
        meta.generation = old;
        mount_chain(layout, meta, mode)?;
        return Err(e);
    }
    write_meta(layout, meta)?;
    let _ = fs::remove_dir_all(layout.upper(old));
    let _ = fs::remove_dir_all(layout.work(old));
    if let Err(e) = resize(layout, meta) {
        tracing::warn!(sandbox = %meta.id, error = %e, "the workspace's upper layer keeps its size");
    }
    Ok(())
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
/// layers: the workspace as a whole stays within the limit, as a tmpfs
/// workspace does.
fn resize(layout: &Layout, meta: &Meta) -> io::Result<()> {
    if meta.spec.disk_mb == 0 {
        return Ok(());
    }
    let limit = meta.spec.disk_mb * 1024 * 1024;
    let below: u64 = meta.layers.iter().map(|l| layers::layer_bytes(l)).sum();
    // Never below a page: even a full workspace can take whiteouts (rm).
    let room = limit.saturating_sub(below).max(4096);
    sys::resize_tmpfs(&layout.cow(), room)
}

/// Whether the layers' bytes leave the upper layer less than a quarter of
/// the disk limit: a merge then counts each file once (and deleted files
/// not at all).
fn crowded(meta: &Meta) -> bool {
    let limit = meta.spec.disk_mb * 1024 * 1024;
    let below: u64 = meta.layers.iter().map(|l| layers::layer_bytes(l)).sum();
    limit > 0 && below > limit / 4 * 3
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
