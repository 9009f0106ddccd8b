//! What changed in a workspace between two of its snapshots (tar files in
//! the data directory): the files added, modified and deleted, and a
//! unified diff of them that `git apply` takes.
//!
//! Files are compared by their contents (a hash read as the tar streams
//! by), symbolic links by their targets; directories and permission-only
//! changes are not listed, as git does not list them. The repository's own
//! `.git/` is left out. A file is binary when its first 8,000 bytes hold a
//! NUL (git's rule) or it is not UTF-8; the diff names binary files and
//! files over [`MAX_DIFF_BYTES`] without their contents.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::Read;
use std::path::Path;

use serde::Serialize;
use utoipa::ToSchema;
use xxhash_rust::xxh3::Xxh3;

/// Largest file whose contents go into a diff.
pub const MAX_DIFF_BYTES: u64 = 4 * 1024 * 1024;
/// How much of a file decides whether it is binary.
const SNIFF: usize = 8000;

/// One changed file.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FileChange {
    /// Relative to `/workspace`.
    pub path: String,
    pub status: ChangeStatus,
    pub binary: bool,
    /// Its size before (none when added) and after (none when deleted).
    pub bytes_before: Option<u64>,
    pub bytes_after: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChangeStatus {
    Added,
    Modified,
    Deleted,
}

/// A file or link of a snapshot.
#[derive(Debug, Clone, PartialEq)]
struct Item {
    /// `100644`, `100755` or `120000` (a link), as git writes modes.
    mode: &'static str,
    size: u64,
    hash: u128,
    binary: bool,
}

/// The files of a snapshot (`None`: an empty workspace), by path.
fn index(tar: Option<&Path>) -> std::io::Result<BTreeMap<String, Item>> {
    walk(tar, |_, _, _| Ok(()))
}

/// Every file and link of the snapshot, by path. `each` is given each one's
/// path, git mode and a reader of its contents (a link's target) first, and
/// may read as much of them as it needs.
fn walk(
    tar: Option<&Path>,
    mut each: impl FnMut(&str, &'static str, &mut dyn Read) -> std::io::Result<()>,
) -> std::io::Result<BTreeMap<String, Item>> {
    let mut items = BTreeMap::new();
    let Some(tar) = tar else { return Ok(items) };
    let file = std::fs::File::open(tar)?;
    let mut archive = tar::Archive::new(std::io::BufReader::with_capacity(1 << 20, file));
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.to_string_lossy().into_owned();
        let path = path
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_owned();
        let own = |dir: &str| path == dir || path.starts_with(&format!("{dir}/"));
        if path.is_empty() || own(".git") || own(".conclave") {
            continue;
        }
        let kind = entry.header().entry_type();
        let target;
        let (mode, reader): (&'static str, &mut dyn Read) = match kind {
            tar::EntryType::Symlink => {
                target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                ("120000", &mut target.as_slice())
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let executable = entry.header().mode().unwrap_or(0) & 0o111 != 0;
                (if executable { "100755" } else { "100644" }, &mut entry)
            }
            _ => continue,
        };
        // Hashed as it is read, by `each` and then to its end.
        let mut hashing = Hashing {
            inner: reader,
            hash: Xxh3::new(),
            head: Vec::new(),
            size: 0,
        };
        each(&path, mode, &mut hashing)?;
        std::io::copy(&mut hashing, &mut std::io::sink())?;
        let item = Item {
            mode,
            size: hashing.size,
            hash: hashing.hash.digest128(),
            binary: mode != "120000" && hashing.head.contains(&0),
        };
        items.insert(path, item);
    }
    Ok(items)
}

/// A reader that hashes what passes and keeps its first bytes.
struct Hashing<'a> {
    inner: &'a mut dyn Read,
    hash: Xxh3,
    head: Vec<u8>,
    size: u64,
}

impl Read for Hashing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        let room = SNIFF.saturating_sub(self.head.len());
        self.head.extend_from_slice(&buf[..n.min(room)]);
        self.size += n as u64;
        Ok(n)
    }
}

/// The files that differ between the snapshots `before` and `after`
/// (`None`: an empty workspace), by path.
pub fn changes(before: Option<&Path>, after: Option<&Path>) -> std::io::Result<Vec<FileChange>> {
    // The two read at once, on two threads.
    let (before, after) = std::thread::scope(|scope| {
        let before = scope.spawn(|| index(before));
        let after = index(after);
        (before.join(), after)
    });
    let before = before.map_err(|_| std::io::Error::other("reading a snapshot panicked"))??;
    let after = after?;
    let mut changes = Vec::new();
    for (path, old) in &before {
        match after.get(path) {
            None => changes.push(FileChange {
                path: path.clone(),
                status: ChangeStatus::Deleted,
                binary: old.binary,
                bytes_before: Some(old.size),
                bytes_after: None,
            }),
            Some(new)
                if new.hash != old.hash || (new.mode == "120000") != (old.mode == "120000") =>
            {
                changes.push(FileChange {
                    path: path.clone(),
                    status: ChangeStatus::Modified,
                    binary: old.binary || new.binary,
                    bytes_before: Some(old.size),
                    bytes_after: Some(new.size),
                })
            }
            Some(_) => {}
        }
    }
    for (path, new) in &after {
        if !before.contains_key(path) {
            changes.push(FileChange {
                path: path.clone(),
                status: ChangeStatus::Added,
                binary: new.binary,
                bytes_before: None,
                bytes_after: Some(new.size),
            });
        }
    }
    changes.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(changes)
}

/// The unified diff of `changes` between the snapshots, in git's form.
pub fn patch(
    before: Option<&Path>,
    after: Option<&Path>,
    changes: &[FileChange],
) -> std::io::Result<String> {
    let wanted: HashSet<&str> = changes
        .iter()
        .filter(|c| !c.binary)
        .map(|c| c.path.as_str())
        .collect();
    let old = texts(before, &wanted)?;
    let new = texts(after, &wanted)?;
    let mut out = String::new();
    for change in changes {
        let path = &change.path;
        let (old_item, new_item) = (old.get(path), new.get(path));
        let _ = writeln!(out, "diff --git a/{path} b/{path}");
        match change.status {
            ChangeStatus::Added => {
                let mode = new_item.map_or("100644", |(m, _)| m);
                let _ = writeln!(out, "new file mode {mode}");
            }
            ChangeStatus::Deleted => {
                let mode = old_item.map_or("100644", |(m, _)| m);
                let _ = writeln!(out, "deleted file mode {mode}");
            }
            ChangeStatus::Modified => {
                if let (Some((a, _)), Some((b, _))) = (old_item, new_item)
                    && a != b
                {
                    let _ = writeln!(out, "old mode {a}\nnew mode {b}");
                }
            }
        }
        let (from, to) = match change.status {
            ChangeStatus::Added => ("/dev/null".to_owned(), format!("b/{path}")),
            ChangeStatus::Deleted => (format!("a/{path}"), "/dev/null".to_owned()),
            ChangeStatus::Modified => (format!("a/{path}"), format!("b/{path}")),
        };
        let (Some(a), Some(b)) = (text_of(old_item), text_of(new_item)) else {
            let _ = writeln!(out, "Binary files {from} and {to} differ");
            continue;
        };
        if change.binary {
            let _ = writeln!(out, "Binary files {from} and {to} differ");
            continue;
        }
        if a.is_empty() && b.is_empty() {
            continue;
        }
        let diff = similar::TextDiff::from_lines(a, b);
        let _ = write!(
            out,
            "{}",
            diff.unified_diff().context_radius(3).header(&from, &to)
        );
    }
    Ok(out)
}

/// A side's text: empty when the file is not there, none when it cannot
/// be shown.
fn text_of<'a>(side: Option<&'a (&'static str, Option<String>)>) -> Option<&'a str> {
    match side {
        None => Some(""),
        Some((_, text)) => text.as_deref(),
    }
}

/// The git mode and text of the `wanted` files of a snapshot; no text
/// for one over [`MAX_DIFF_BYTES`] or not UTF-8.
fn texts(
    tar: Option<&Path>,
    wanted: &HashSet<&str>,
) -> std::io::Result<HashMap<String, (&'static str, Option<String>)>> {
    let mut texts = HashMap::new();
    walk(tar, |path, mode, contents| {
        if wanted.contains(path) {
            let mut bytes = Vec::new();
            contents.take(MAX_DIFF_BYTES + 1).read_to_end(&mut bytes)?;
            let text = String::from_utf8(bytes)
                .ok()
                .filter(|t| t.len() as u64 <= MAX_DIFF_BYTES);
            texts.insert(path.to_owned(), (mode, text));
        }
        Ok(())
    })?;
    Ok(texts)
}

/// How many files were added, modified and deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, ToSchema)]
pub struct ChangeCounts {
    pub added: u64,
    pub modified: u64,
    pub deleted: u64,
}

impl ChangeCounts {
    pub fn of(changes: &[FileChange]) -> ChangeCounts {
        let mut counts = ChangeCounts::default();
        for change in changes {
            match change.status {
                ChangeStatus::Added => counts.added += 1,
                ChangeStatus::Modified => counts.modified += 1,
                ChangeStatus::Deleted => counts.deleted += 1,
            }
        }
        counts
    }
}

#[cfg(test)]
#[path = "changes_tests.rs"]
mod tests;
