//! A local sandbox's layered workspace ([`crate::sandbox::layers::cow`]),
//! as root on a host with overlayfs: in the sandbox's directory, its
//! chain in `meta.json`. Every exec's container bind-mounts `workspace/`
//! when it starts, so a seed (a new mount) reaches only containers
//! started after it: the resident is started again.

use std::io;
use std::path::{Path, PathBuf};

use super::jail::Layout;
use super::meta::{Meta, read_meta, write_meta};
use crate::sandbox::layers::cow::{Chain, Cow};

fn cow(layout: &Layout, meta: &Meta) -> Cow {
    Cow {
        dir: layout.dir.clone(),
        workspace: layout.workspace(),
        uid: meta.uid,
        disk_mb: meta.spec.disk_mb,
    }
}

/// Runs `change` on the sandbox's chain, which it saves in `meta.json`.
fn with_chain<T>(
    layout: &Layout,
    meta: &mut Meta,
    change: impl FnOnce(&Cow, &mut Chain, &dyn Fn(&Chain) -> io::Result<()>) -> io::Result<T>,
) -> io::Result<T> {
    let cow = cow(layout, meta);
    let mut chain = std::mem::take(&mut meta.chain);
    let rest = meta.clone();
    let save = |chain: &Chain| {
        let mut meta = rest.clone();
        meta.chain = chain.clone();
        write_meta(layout, &meta)
    };
    let done = change(&cow, &mut chain, &save);
    meta.chain = chain;
    done
}

/// Mounts the layered workspace where it is not mounted.
pub(super) fn mount(layout: &Layout, meta: &mut Meta) -> io::Result<()> {
    with_chain(layout, meta, |cow, chain, save| cow.mount(chain, save))
}

/// Freezes what the workspace changed since the last freeze; the chain.
pub(super) fn freeze(layout: &Layout, store: &Path) -> io::Result<Vec<PathBuf>> {
    let mut meta = read_meta(layout)?;
    with_chain(layout, &mut meta, |cow, chain, save| {
        cow.freeze(chain, store, save)
    })
}

/// Puts `layers` under the workspace in place of its layers and upper
/// layer. Nothing may run in the sandbox meanwhile.
pub(super) fn seed(layout: &Layout, layers: &[PathBuf]) -> io::Result<()> {
    let mut meta = read_meta(layout)?;
    with_chain(layout, &mut meta, |cow, chain, save| {
        cow.seed(chain, layers, save)
    })
}

/// The disk limit in MB when the upper layer is (all but) full.
pub(super) fn full(layout: &Layout) -> io::Result<Option<u64>> {
    let meta = read_meta(layout)?;
    cow(layout, &meta).full()
}
