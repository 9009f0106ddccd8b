//! Copy-on-write workspace layers, kept on the host by the server.
//!
//! A layered workspace is an overlay: its lower layers are immutable
//! directories of a layer store (the snapshot directory's `layers/`), its
//! upper layer the sandbox's own writes since it was mounted, on a tmpfs
//! of what the sandbox's disk limit leaves above the layers (so a write
//! past the limit fails with ENOSPC, as on a tmpfs workspace). A turn-end
//! snapshot *freezes* the turn's changes: what the upper layer changed
//! since the last freeze (`increment`) becomes a new layer on top of the
//! workspace's chain, while the sandbox goes on with the same mount; a
//! fork mounts the chain under an upper layer of its own. So a snapshot
//! costs what the turn changed and a fork costs a few mounts, whatever
//! the workspace's size.
//!
//! The layers of one chain are listed top first. A chain longer than
//! [`MAX_LAYERS`] is merged into one layer by hard links at the next
//! freeze.
//!
//! The server never follows a link of the sandbox's: a freeze walks the
//! upper layer with `lstat` and copies links as links, into a directory
//! it has just made; a layer's tar (downloads, replicas) is written by
//! `tar -c`, which stores links as links. Layers are mounted only
//! read-only and under overlays, never written again.
//!
//! A layer is deleted when no snapshot record names it and no mount of
//! this host's names it (its id is in `/proc/self/mountinfo`, as a lower
//! layer of a workspace or its id-mapped view): deleting a snapshot a
//! live fork still uses leaves the fork's layers until the fork is gone.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod cow;
mod increment;

/// The longest chain of lower layers a freeze leaves; past it, the freeze
/// merges the chain into one layer.
pub const MAX_LAYERS: usize = 16;

/// A layer's id: its directory's name, 32 hex digits.
pub fn layer_id(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?;
    valid_id(name).then_some(name)
}

pub fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether this host can layer workspaces: root, and overlayfs known to
/// the kernel (loaded, or built in).
pub fn supported() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return false;
    }
    fs::read_to_string("/proc/filesystems")
        .map(|list| list.lines().any(|line| line.ends_with("\toverlay")))
        .unwrap_or(false)
}

/// Freezes what the upper layer `upper` changed since the freeze that
/// wrote the index at `index` (none, or unreadable: since it was mounted)
/// into a new layer of `store`; the layer, or `None` when nothing changed
/// (unless `always`), and the call that writes the new index, to be made
/// once the layer is recorded (an index ahead of the recorded chain would
/// lose changes; one behind only copies some again).
pub fn freeze_upper(
    upper: &Path,
    index: &Path,
    store: &Path,
    always: bool,
) -> io::Result<(Option<PathBuf>, impl FnOnce() -> io::Result<()> + use<>)> {
    let tree = increment::walk(upper)?;
    let before = increment::read_index(index).unwrap_or_default();
    let layer = new_layer(store, |part| {
        let changed = increment::increment(upper, &tree, &before, part)?;
        Ok(changed || always)
    })?;
    let index = index.to_owned();
    Ok((layer, move || increment::write_index(&index, &tree)))
}

/// Folds `chain` (top first) into one new layer of `store` by hard links.
pub fn merge(chain: &[PathBuf], store: &Path) -> io::Result<PathBuf> {
    new_layer(store, |part| increment::merge(chain, part).map(|()| true))?
        .ok_or_else(|| io::Error::other("the merge made no layer"))
}

/// Makes a new layer of `store` through a directory of its own that
/// `fill` fills and that is renamed into place (or removed, when `fill`
/// says it is not wanted), with its size counted while it is small to
/// walk: a chain's size is the sum of its layers'.
fn new_layer(
    store: &Path,
    fill: impl FnOnce(&Path) -> io::Result<bool>,
) -> io::Result<Option<PathBuf>> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(store)?;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let part = store.join(format!("{id}.part"));
    let layer = store.join(&id);
    fs::DirBuilder::new().mode(0o700).create(&part)?;
    let made = fill(&part).and_then(|wanted| {
        if !wanted {
            return Ok(None);
        }
        fs::rename(&part, &layer)?;
        let bytes = walk_bytes(&layer)?;
        fs::write(size_file(&layer), bytes.to_string())?;
        Ok(Some(layer))
    });
    if !matches!(made, Ok(Some(_))) {
        let _ = fs::remove_dir_all(&part);
    }
    made
}

/// Bytes of the files in a layer, as counted when it was made.
pub fn layer_bytes(layer: &Path) -> u64 {
    match fs::read_to_string(size_file(layer)) {
        Ok(text) => text.trim().parse().unwrap_or(0),
        Err(_) => walk_bytes(layer).unwrap_or(0),
    }
}

fn size_file(layer: &Path) -> PathBuf {
    layer.with_extension("size")
}

/// The bytes of regular files under `dir`, following no link.
fn walk_bytes(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

/// The ids of layers this host's mounts use now.
pub fn mounted_ids() -> io::Result<std::collections::HashSet<String>> {
    let table = fs::read_to_string("/proc/self/mountinfo")?;
    let mut ids = std::collections::HashSet::new();
    for word in table.split(|c: char| !c.is_ascii_hexdigit()) {
        if valid_id(word) {
            ids.insert(word.to_owned());
        }
    }
    Ok(ids)
}

/// Removes a layer and its size file.
pub fn remove(layer: &Path) -> io::Result<()> {
    let _ = fs::remove_file(size_file(layer));
    match fs::remove_dir_all(layer) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Mounts an overlay at `target`: `lowers` top first, and `upper` (its
/// upper and work directories) or none (read-only). Redirects and
/// metacopy stay off, so that an upper layer holds every byte and name it
/// changed and a copy of it is a layer of its own.
pub fn mount_overlay(
    target: &Path,
    lowers: &[PathBuf],
    upper: Option<(&Path, &Path)>,
) -> io::Result<()> {
    let mut options = String::from("lowerdir=");
    for (at, lower) in lowers.iter().enumerate() {
        if at > 0 {
            options.push(':');
        }
        options.push_str(plain(lower)?);
    }
    if let Some((upper, work)) = upper {
        options.push_str(",upperdir=");
        options.push_str(plain(upper)?);
        options.push_str(",workdir=");
        options.push_str(plain(work)?);
    }
    options.push_str(",redirect_dir=off,metacopy=off,index=off,xino=off");
    // Mount options are one page.
    if options.len() >= 4000 {
        return Err(io::Error::other(format!(
            "{} layers' paths are too long for one overlay mount (a data_dir with a shorter path helps)",
            lowers.len()
        )));
    }
    let flags =
        libc::MS_NOSUID | libc::MS_NODEV | if upper.is_none() { libc::MS_RDONLY } else { 0 };
    mount(c"overlay", target, c"overlay", flags, &options)
}

/// A path an overlay's options can name: no `:`, `,` or `\`, valid UTF-8.
fn plain(path: &Path) -> io::Result<&str> {
    path.to_str()
        .filter(|p| !p.contains([':', ',', '\\']))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} cannot be an overlay layer (a ':', ',' or '\\' in the data directory's path)",
                    path.display()
                ),
            )
        })
}

fn mount(
    source: &std::ffi::CStr,
    target: &Path,
    kind: &std::ffi::CStr,
    flags: libc::c_ulong,
    options: &str,
) -> io::Result<()> {
    let target = CString::new(target.as_os_str().as_bytes())?;
    let options = CString::new(options)?;
    // SAFETY: every pointer is a NUL-terminated string alive for the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            kind.as_ptr(),
            flags,
            options.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Mounts a read-only view of `layer` at `target` in which files its
/// maker's uid `from` owns belong to `to` (an id-mapped mount), so that a
/// sandbox of another uid (a fork) can change them through its overlay.
pub fn mount_mapped(layer: &Path, target: &Path, from: u32, to: u32) -> io::Result<()> {
    let userns = mapping_namespace(from, to)?;
    let source = CString::new(layer.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path; the flags clone the tree detached.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC,
        )
    };
    if tree < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP | libc::MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: `attr` is a valid mount_attr of the size given; the empty
    // path with AT_EMPTY_PATH names the tree itself.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let target = CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: the tree's descriptor and a NUL-terminated target path.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A user namespace whose only mapping is `from` (inside) to `to`
/// (outside), for an id-mapped mount: held by a `sleep` that unshares it
/// before it starts and is killed once its maps are written.
fn mapping_namespace(from: u32, to: u32) -> io::Result<OwnedFd> {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new("sleep");
    command
        .arg("infinity")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: unshare is async-signal-safe and touches no memory.
    unsafe {
        command.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    let pid = child.id();
    let map = format!("{from} {to} 1\n");
    let opened = fs::write(format!("/proc/{pid}/uid_map"), &map)
        .and_then(|()| fs::write(format!("/proc/{pid}/gid_map"), &map))
        .and_then(|()| fs::File::open(format!("/proc/{pid}/ns/user")));
    let _ = child.kill();
    let _ = child.wait();
    Ok(OwnedFd::from(opened?))
}

/// Detaches every mount at or below `dir`, deepest first, and checks that
/// none is left: a directory about to be removed must not reach into a
/// layer through a mount.
pub fn detach_under(dir: &Path) -> io::Result<()> {
    let mut points = mount_points_under(dir)?;
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for point in &points {
        let target = CString::new(point.as_os_str().as_bytes())?;
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
    let left = mount_points_under(dir)?;
    if left.is_empty() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{} is still mounted",
            left[0].display()
        )))
    }
}

/// The mount points at or below `dir`, from this process's mount table
/// (octal escapes decoded).
pub fn mount_points_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let table = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(unescape(point)))
        .filter(|point| point.starts_with(dir))
        .collect())
}

pub(crate) fn unescape(field: &str) -> std::ffi::OsString {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'\\'
            && at + 3 < bytes.len()
            && let Ok(code) = u8::from_str_radix(&field[at + 1..at + 4], 8)
        {
            out.push(code);
            at += 4;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// The owner of a layer's top directory: the uid of the sandbox that
/// made it.
pub fn owner(layer: &Path) -> io::Result<u32> {
    Ok(fs::metadata(layer)?.uid())
}

/// Writes the tar of a chain's merged view to `out`: the chain is mounted
/// read-only at a scratch directory beside `out`, and `tar -c` stores its
/// links as links.
pub fn tar_chain(chain: &[PathBuf], out: &Path) -> io::Result<()> {
    let scratch = out.with_extension(format!("{}.mnt", uuid::Uuid::new_v4().simple()));
    let base = scratch.with_extension("base");
    fs::DirBuilder::new().mode(0o700).create(&scratch)?;
    fs::DirBuilder::new().mode(0o755).create(&base)?;
    // An overlay without an upper needs two lowers.
    let mut lowers = chain.to_vec();
    lowers.push(base.clone());
    let written = mount_overlay(&scratch, &lowers, None).and_then(|()| {
        let packed = run(Command::new("tar")
            .arg("-C")
            .arg(&scratch)
            .arg("--numeric-owner")
            .arg("-cf")
            .arg(out)
            .arg("."));
        let _ = detach_under(&scratch);
        packed
    });
    let _ = fs::remove_dir(&scratch);
    let _ = fs::remove_dir(&base);
    written
}

/// Runs a host tool to its end; its stderr in the error when it fails.
fn run(command: &mut Command) -> io::Result<()> {
    let out = command.output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{} exited {}: {}",
        command.get_program().to_string_lossy(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}
