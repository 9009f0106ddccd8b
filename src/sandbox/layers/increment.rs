//! A layer of what an upper layer changed since its last freeze, and the
//! merge of a chain of such layers, without remounting the workspace.
//!
//! A live workspace keeps one overlay mount for its whole life: its upper
//! layer holds every change since the mount. A freeze walks the upper
//! layer (following no link) and compares it with the index the last
//! freeze left (path, inode, ctime and kind of each entry, which a write,
//! a chmod or a rename all move): what is new or changed is copied into
//! the new layer, a directory that replaced an earlier one is copied whole
//! and marked opaque, and what is gone gets a whiteout. So a freeze copies
//! the turn's changes and reads only the names the sandbox wrote, and the
//! running sandbox never sees its workspace change under it.
//!
//! A merge folds a chain of layers into one by hard links (layers are
//! never written again, so sharing their files costs no bytes), applying
//! whiteouts and opaque directories as overlayfs would.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// overlayfs' mark of a directory that hides what layers below hold.
const OPAQUE: &str = "trusted.overlay.opaque";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Dir,
    File,
    Link,
    /// overlayfs' whiteout: a character device 0:0.
    Whiteout,
    Other,
}

impl Kind {
    fn of(meta: &fs::Metadata) -> Kind {
        use std::os::unix::fs::FileTypeExt;
        let kind = meta.file_type();
        if kind.is_dir() {
            Kind::Dir
        } else if kind.is_file() {
            Kind::File
        } else if kind.is_symlink() {
            Kind::Link
        } else if kind.is_char_device() && meta.rdev() == 0 {
            Kind::Whiteout
        } else {
            Kind::Other
        }
    }

    fn code(self) -> u8 {
        match self {
            Kind::Dir => b'd',
            Kind::File => b'f',
            Kind::Link => b'l',
            Kind::Whiteout => b'w',
            Kind::Other => b'o',
        }
    }

    fn from_code(code: u8) -> Kind {
        match code {
            b'd' => Kind::Dir,
            b'f' => Kind::File,
            b'l' => Kind::Link,
            b'w' => Kind::Whiteout,
            _ => Kind::Other,
        }
    }
}

/// One entry of a tree: what a freeze compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    ino: u64,
    ctime_ns: i128,
    kind: Kind,
}

/// A tree's entries by path (relative), in walk order (parents first).
pub(super) type Tree = Vec<(PathBuf, Stamp)>;

/// Every entry under `root`, following no link, sorted by path
/// component by component (so each directory precedes its entries).
pub(super) fn walk(root: &Path) -> io::Result<Tree> {
    let mut tree = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(root.join(&dir))? {
            let entry = entry?;
            let path = dir.join(entry.file_name());
            // A directory entry's metadata is the entry's own (lstat).
            let meta = entry.metadata()?;
            let stamp = Stamp {
                ino: meta.ino(),
                ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
                kind: Kind::of(&meta),
            };
            if stamp.kind == Kind::Dir {
                pending.push(path.clone());
            }
            tree.push((path, stamp));
        }
    }
    tree.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(tree)
}

/// Reads an index written by [`write_index`]; none is an empty one.
pub(super) fn read_index(path: &Path) -> io::Result<HashMap<PathBuf, Stamp>> {
    let data = match fs::read(path) {
        Ok(data) => data,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(e),
    };
    let mut index = HashMap::new();
    for record in data.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let mut fields = record.splitn(4, |b| *b == b' ');
        let (Some(ino), Some(ctime), Some(kind), Some(name)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a bad index record",
            ));
        };
        let number = |field: &[u8]| std::str::from_utf8(field).ok().and_then(|s| s.parse().ok());
        let (Some(ino), Some(ctime_ns)) = (number(ino).map(|n: i128| n as u64), number(ctime))
        else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a bad index record",
            ));
        };
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(name));
        let kind = Kind::from_code(kind.first().copied().unwrap_or(b'o'));
        index.insert(
            path,
            Stamp {
                ino,
                ctime_ns,
                kind,
            },
        );
    }
    Ok(index)
}

/// Writes `tree` as an index: `INO CTIME KIND PATH` records, NUL-ended.
pub(super) fn write_index(path: &Path, tree: &Tree) -> io::Result<()> {
    let partial = path.with_extension("partial");
    let mut out = io::BufWriter::new(fs::File::create(&partial)?);
    for (name, stamp) in tree {
        write!(out, "{} {} ", stamp.ino, stamp.ctime_ns)?;
        out.write_all(&[stamp.kind.code(), b' '])?;
        out.write_all(name.as_os_str().as_bytes())?;
        out.write_all(&[0])?;
    }
    // Not synced: one lost in a crash makes the next freeze copy more.
    out.flush()?;
    drop(out);
    fs::rename(&partial, path)
}

/// Writes into the new directory `into` what `upper` (now `tree`)
/// changed since `before`; whether anything did.
pub(super) fn increment(
    upper: &Path,
    tree: &Tree,
    before: &HashMap<PathBuf, Stamp>,
    into: &Path,
) -> io::Result<bool> {
    copy_attrs_dir(upper, into)?;
    let now: HashMap<&Path, Stamp> = tree.iter().map(|(p, s)| (p.as_path(), *s)).collect();
    let mut made: HashSet<PathBuf> = HashSet::new();
    // Directories copied whole: they replaced an earlier one.
    let mut whole: Vec<&Path> = Vec::new();
    let mut changed = false;
    for (path, stamp) in tree {
        let under_whole = whole.iter().any(|w| path.starts_with(w) && path != *w);
        let old = before.get(path);
        if !under_whole && old == Some(stamp) {
            continue;
        }
        changed = true;
        ensure_parents(upper, into, path, &mut made)?;
        let replaced = old.is_some_and(|o| o.ino != stamp.ino || o.kind != stamp.kind);
        copy_entry(&upper.join(path), &into.join(path), stamp.kind)?;
        if stamp.kind == Kind::Dir {
            made.insert(path.clone());
            if replaced && !under_whole {
                set_opaque(&into.join(path))?;
                whole.push(path);
            }
        }
    }
    // Gone: a whiteout where its parent is still a directory and was not
    // replaced (an opaque directory hides it already).
    for (path, stamp) in before {
        if now.contains_key(path.as_path()) || stamp.kind == Kind::Whiteout {
            continue;
        }
        let parent = path.parent().unwrap_or(Path::new(""));
        let parent_is_dir =
            parent.as_os_str().is_empty() || now.get(parent).is_some_and(|s| s.kind == Kind::Dir);
        let parent_replaced = whole.iter().any(|w| parent.starts_with(w));
        if !parent_is_dir || parent_replaced {
            continue;
        }
        changed = true;
        ensure_parents(upper, into, path, &mut made)?;
        whiteout(&into.join(path))?;
    }
    Ok(changed)
}

/// Makes the directories above `path` in `into` that are not there yet,
/// with the attributes of the upper layer's.
fn ensure_parents(
    upper: &Path,
    into: &Path,
    path: &Path,
    made: &mut HashSet<PathBuf>,
) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut parent = path.parent();
    while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
        if made.contains(dir) {
            break;
        }
        missing.push(dir.to_path_buf());
        parent = dir.parent();
    }
    for dir in missing.into_iter().rev() {
        copy_entry(&upper.join(&dir), &into.join(&dir), Kind::Dir)?;
        made.insert(dir);
    }
    Ok(())
}

/// Copies one entry (a directory: itself, not its contents).
fn copy_entry(from: &Path, to: &Path, kind: Kind) -> io::Result<()> {
    match kind {
        Kind::Dir => {
            fs::create_dir(to)?;
            copy_attrs_dir(from, to)
        }
        Kind::File => {
            use std::os::unix::fs::OpenOptionsExt;
            // Never through a link, should one have taken the file's place.
            let mut source = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(from)?;
            let mut target = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(to)?;
            io::copy(&mut source, &mut target)?;
            drop(target);
            copy_owner_and_xattrs(from, to)?;
            copy_times(from, to)
        }
        Kind::Link => {
            std::os::unix::fs::symlink(fs::read_link(from)?, to)?;
            copy_owner_and_xattrs(from, to)?;
            copy_times(from, to)
        }
        Kind::Whiteout => whiteout(to),
        // Pipes and sockets hold no data a snapshot could keep.
        Kind::Other => Ok(()),
    }
}

fn copy_attrs_dir(from: &Path, to: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(from)?;
    fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    copy_owner_and_xattrs(from, to)?;
    copy_times(from, to)
}

fn copy_owner_and_xattrs(from: &Path, to: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(from)?;
    std::os::unix::fs::lchown(to, Some(meta.uid()), Some(meta.gid()))?;
    if meta.file_type().is_file() {
        // chown clears set-id bits.
        fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    }
    let (from_c, to_c) = (cstring(from)?, cstring(to)?);
    let names = xattr_names(&from_c)?;
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = CString::new(name)?;
        // SAFETY: NUL-terminated strings; a null buffer asks the size.
        let size =
            unsafe { libc::lgetxattr(from_c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            continue;
        }
        let mut value = vec![0u8; size as usize];
        // SAFETY: a buffer of the size the kernel gave.
        let read = unsafe {
            libc::lgetxattr(
                from_c.as_ptr(),
                name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if read < 0 {
            continue;
        }
        // SAFETY: NUL-terminated strings and a buffer of `read` bytes.
        let rc = unsafe {
            libc::lsetxattr(
                to_c.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                read as usize,
                0,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn xattr_names(path: &CString) -> io::Result<Vec<u8>> {
    // SAFETY: a NUL-terminated path; a null buffer asks the size.
    let size = unsafe { libc::llistxattr(path.as_ptr(), std::ptr::null_mut(), 0) };
    if size <= 0 {
        return Ok(Vec::new());
    }
    let mut names = vec![0u8; size as usize];
    // SAFETY: a buffer of the size the kernel gave.
    let read = unsafe { libc::llistxattr(path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    names.truncate(read as usize);
    Ok(names)
}

fn copy_times(from: &Path, to: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(from)?;
    let times = [
        libc::timespec {
            tv_sec: meta.atime(),
            tv_nsec: meta.atime_nsec(),
        },
        libc::timespec {
            tv_sec: meta.mtime(),
            tv_nsec: meta.mtime_nsec(),
        },
    ];
    let to = cstring(to)?;
    // SAFETY: a NUL-terminated path and two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            to.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_opaque(dir: &Path) -> io::Result<()> {
    let (dir, name) = (cstring(dir)?, CString::new(OPAQUE)?);
    // SAFETY: NUL-terminated strings and a one-byte value.
    let rc = unsafe { libc::lsetxattr(dir.as_ptr(), name.as_ptr(), c"y".as_ptr().cast(), 1, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn is_opaque(dir: &Path) -> io::Result<bool> {
    let (dir, name) = (cstring(dir)?, CString::new(OPAQUE)?);
    let mut value = [0u8; 1];
    // SAFETY: a one-byte buffer.
    let read =
        unsafe { libc::lgetxattr(dir.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), 1) };
    Ok(read == 1 && value[0] == b'y')
}

fn whiteout(path: &Path) -> io::Result<()> {
    let path = cstring(path)?;
    // SAFETY: a NUL-terminated path; device 0:0 is overlayfs' whiteout.
    if unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn cstring(path: &Path) -> io::Result<CString> {
    Ok(CString::new(path.as_os_str().as_bytes())?)
}

/// Folds `chain` (top first) into the new directory `into`, by hard
/// links, as overlayfs would show it over whatever lies below the chain
/// (whiteouts and opaque directories are kept for that). A layer is
/// mounted for another sandbox through a view that maps its one owner
/// (its top directory's) to that sandbox's uid: what a layer of another
/// owner brings (a fork's chain holds its source's layers) is copied and
/// given the top layer's owner instead of linked.
pub(super) fn merge(chain: &[PathBuf], into: &Path) -> io::Result<()> {
    let top = chain
        .first()
        .ok_or_else(|| io::Error::other("no layer to merge"))?;
    copy_attrs_dir(top, into)?;
    let owner = fs::symlink_metadata(top)?.uid();
    for layer in chain.iter().rev() {
        for (path, stamp) in walk(layer)? {
            let (from, to) = (layer.join(&path), into.join(&path));
            // Every entry's parent is a directory the merge made.
            if !fs::symlink_metadata(to.parent().unwrap_or(into))?.is_dir() {
                return Err(io::Error::other(format!(
                    "{}: a parent is not a directory",
                    path.display()
                )));
            }
            let existing = fs::symlink_metadata(&to).ok();
            let foreign =
                stamp.kind != Kind::Whiteout && fs::symlink_metadata(&from)?.uid() != owner;
            match stamp.kind {
                Kind::Dir => {
                    let keep = existing.as_ref().is_some_and(|m| m.is_dir()) && !is_opaque(&from)?;
                    if keep {
                        copy_attrs_dir(&from, &to)?;
                    } else {
                        remove(&to, existing.as_ref())?;
                        copy_entry(&from, &to, Kind::Dir)?;
                    }
                }
                Kind::File if !foreign => {
                    remove(&to, existing.as_ref())?;
                    fs::hard_link(&from, &to)?;
                }
                kind => {
                    remove(&to, existing.as_ref())?;
                    copy_entry(&from, &to, kind)?;
                }
            }
            if foreign {
                std::os::unix::fs::lchown(&to, Some(owner), Some(owner))?;
            }
        }
    }
    Ok(())
}

fn remove(path: &Path, meta: Option<&fs::Metadata>) -> io::Result<()> {
    match meta {
        Some(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Some(_) => fs::remove_file(path),
        None => Ok(()),
    }
}
