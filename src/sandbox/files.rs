//! File operations on a sandbox, built on exec so every backend gets them
//! the same way.
//!
//! Paths are confined to the workspace twice: lexically here (a `..` that
//! climbs out is refused before anything runs), and inside the sandbox,
//! where `realpath` resolves symlinks and a path that lands outside
//! `/workspace` is refused with the same kind of error. `read` and `write`
//! check the file they opened, not the path, so a symlink swapped in after
//! the check sends them nowhere (see [`RESOLVE`]); `list` and `grep` check
//! their starting directory by path and follow no symlinks below it.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use globset::GlobBuilder;
use tokio_util::sync::CancellationToken;

use super::{ExecRequest, Result, Sandbox, SandboxError, Stdin, WORKSPACE, exec_collect};

/// How long one file operation may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(30);
/// Exit status the scripts use for "resolves outside the workspace".
pub(super) const ESCAPE_STATUS: i64 = 97;
/// Largest file `read` returns whole.
pub const MAX_READ_BYTES: usize = 4 * 1024 * 1024;

/// Resolves `$1` with symlinks followed and refuses it when it lands
/// outside the workspace; the checked path is left in `$p`. `confined Q`
/// refuses a resolved path `Q` outside the workspace the same way.
///
/// A check by path alone races: a symlink swapped in between it and the
/// open sends the open elsewhere. So `read` and `write` open first (on
/// descriptor 3) and then check what was opened, read back from
/// `/proc/$$/fd/3`, which names the file itself whatever happens to the
/// path since; they then read or write through that descriptor only.
pub(super) const RESOLVE: &str = r#"confined() { case "$1" in /workspace|/workspace/*) ;; *) echo "path '$2' resolves to '$1', outside /workspace" >&2; exit 97;; esac; }
p=$(realpath -m -- "$1") || exit 97
confined "$p" "$1"
"#;

/// Makes `path` absolute against `workdir` and refuses anything that is
/// not inside the workspace once `.` and `..` are applied.
pub fn confine(path: &str, workdir: &str) -> Result<String> {
    if path.is_empty() {
        return Err(SandboxError::InvalidPath("path is empty".into()));
    }
    if path.contains('\0') {
        return Err(SandboxError::InvalidPath("path contains a NUL byte".into()));
    }
    let joined = Path::new(workdir).join(path);
    let mut normal = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if !normal.pop() {
                    return Err(outside(path));
                }
            }
            Component::Normal(part) => normal.push(part),
        }
    }
    if !normal.starts_with(WORKSPACE) {
        return Err(outside(path));
    }
    normal
        .to_str()
        .map(str::to_string)
        .ok_or_else(|| SandboxError::InvalidPath(format!("path '{path}' is not UTF-8")))
}

fn outside(path: &str) -> SandboxError {
    SandboxError::InvalidPath(format!("path '{path}' is outside {WORKSPACE}"))
}

/// Runs `script` (which starts by resolving `$1`) with `args` and `stdin`,
/// returning stdout, or the error the script reported.
async fn run(
    sandbox: &dyn Sandbox,
    script: &str,
    args: &[&str],
    stdin: Option<Stdin>,
    limit: usize,
) -> Result<(Vec<u8>, bool)> {
    run_within(
        sandbox,
        script_request(script, args, stdin, FILE_TIMEOUT),
        limit,
    )
    .await
}

/// The exec of `script` after [`RESOLVE`], with `args` as `$1`….
pub(super) fn script_request(
    script: &str,
    args: &[&str],
    stdin: Option<Stdin>,
    timeout: Duration,
) -> ExecRequest {
    let mut command = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        format!("{RESOLVE}{script}"),
        "sh".to_string(),
    ];
    command.extend(args.iter().map(|a| a.to_string()));
    ExecRequest {
        command,
        stdin,
        timeout,
        workdir: WORKSPACE.into(),
        env: Default::default(),
    }
}

/// Runs a [`script_request`], returning stdout, or the error the script
/// reported.
pub(super) async fn run_within(
    sandbox: &dyn Sandbox,
    request: ExecRequest,
    limit: usize,
) -> Result<(Vec<u8>, bool)> {
    let (status, out) =
        exec_collect(sandbox, request, limit, CancellationToken::new(), |_| {}).await?;
    let message = || match String::from_utf8_lossy(&out.stderr).trim() {
        "" => format!(
            "the file operation failed with exit status {:?}",
            status.exit_code
        ),
        stderr => stderr.to_string(),
    };
    match status.exit_code {
        Some(0) => Ok((out.stdout, out.truncated)),
        Some(ESCAPE_STATUS) => Err(SandboxError::InvalidPath(message())),
        _ if status.timed_out => Err(SandboxError::File("file operation timed out".into())),
        _ => Err(SandboxError::File(message())),
    }
}

/// After the open on descriptor 3: the file opened must be `$2` when one
/// is expected (the file a permission check resolved the path to).
const EXPECTED: &str = r#"[ -z "$2" ] || [ "$(readlink "/proc/$$/fd/3")" = "$2" ] || { echo "'$1' no longer leads to '$2' (a link changed since the path was checked); not done" >&2; exit 97; }
"#;

/// The file's bytes (at most [`MAX_READ_BYTES`]) and whether it was longer.
pub async fn read(sandbox: &dyn Sandbox, path: &str) -> Result<(Vec<u8>, bool)> {
    read_expecting(sandbox, path, None).await
}

/// [`read`], refused unless the path opens `expect` (absolute, links
/// resolved) when it is given.
pub async fn read_expecting(
    sandbox: &dyn Sandbox,
    path: &str,
    expect: Option<&str>,
) -> Result<(Vec<u8>, bool)> {
    let script = format!(
        r#"[ -d "$p" ] && {{ echo "'$1' is a directory" >&2; exit 1; }}
exec 3< "$p" || exit 1
confined "$(readlink "/proc/$$/fd/3")" "$1"
{EXPECTED}exec cat <&3"#
    );
    run(
        sandbox,
        &script,
        &[path, expect.unwrap_or_default()],
        None,
        MAX_READ_BYTES,
    )
    .await
    .map_err(|e| reword_missing(e, path))
}

/// Writes `data` to `path`, creating parent directories.
pub async fn write(sandbox: &dyn Sandbox, path: &str, data: Bytes) -> Result<()> {
    write_expecting(sandbox, path, data, None).await
}

/// [`write`], refused unless the path opens `expect` (absolute, links
/// resolved) when it is given; then nothing is written.
pub async fn write_expecting(
    sandbox: &dyn Sandbox,
    path: &str,
    data: Bytes,
    expect: Option<&str>,
) -> Result<()> {
    let request = script_request(
        &write_script(),
        &[path, expect.unwrap_or_default()],
        Some(data.into()),
        FILE_TIMEOUT,
    );
    run_within(sandbox, request, 4096).await.map(|_| ())
}

/// [`write`] of data that may be large (an upload spooled to a file),
/// within `timeout`.
pub async fn write_within(
    sandbox: &dyn Sandbox,
    path: &str,
    data: Stdin,
    timeout: Duration,
) -> Result<()> {
    let request = script_request(&write_script(), &[path, ""], Some(data), timeout);
    run_within(sandbox, request, 4096).await.map(|_| ())
}

/// `$1` the path, `$2` the file it must open (or empty); the data comes
/// on stdin.
fn write_script() -> String {
    // Opened without truncating, checked, then truncated and written
    // through the descriptor's own /proc link (the file that was checked).
    // Where the path leads is checked before its directories are made too,
    // so a link swapped in since makes none elsewhere.
    format!(
        r#"[ -z "$2" ] || [ "$p" = "$2" ] || {{ echo "'$1' no longer leads to '$2' (a link changed since the path was checked); not done" >&2; exit 97; }}
mkdir -p -- "$(dirname -- "$p")" || exit 1
exec 3<> "$p" || exit 1
confined "$(readlink "/proc/$$/fd/3")" "$1"
{EXPECTED}exec cat > "/proc/$$/fd/3""#
    )
}

/// Replaces `old` with `new` in a text file: exactly once unless `all`.
/// Returns how many replacements were made.
pub async fn edit(
    sandbox: &dyn Sandbox,
    path: &str,
    old: &str,
    new: &str,
    all: bool,
    expect: Option<&str>,
) -> Result<usize> {
    if old.is_empty() {
        return Err(SandboxError::File("old_string must not be empty".into()));
    }
    if old == new {
        return Err(SandboxError::File(
            "old_string and new_string are the same".into(),
        ));
    }
    let (bytes, truncated) = read_expecting(sandbox, path, expect).await?;
    if truncated {
        return Err(SandboxError::File(format!(
            "'{path}' is larger than {MAX_READ_BYTES} bytes; edit it with a shell command"
        )));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| SandboxError::File(format!("'{path}' is not a UTF-8 text file")))?;
    let count = text.matches(old).count();
    match count {
        0 => Err(SandboxError::File(format!(
            "old_string was not found in '{path}'"
        ))),
        n if n > 1 && !all => Err(SandboxError::File(format!(
            "old_string appears {n} times in '{path}'; give more context or set replace_all"
        ))),
        n => {
            let replaced = if all {
                text.replace(old, new)
            } else {
                text.replacen(old, new, 1)
            };
            write_expecting(sandbox, path, Bytes::from(replaced), expect).await?;
            Ok(n)
        }
    }
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Entry {
    /// Relative to the listed directory.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: &'static str,
    pub size: u64,
}

/// Entries under `path`, `depth` levels deep, at most `limit` of them;
/// symlinks are listed, never followed.
pub async fn list(
    sandbox: &dyn Sandbox,
    path: &str,
    depth: u32,
    limit: usize,
) -> Result<(Vec<Entry>, bool)> {
    let script = r#"[ -d "$p" ] || { echo "'$1' is not a directory" >&2; exit 1; }
exec find "$p" -mindepth 1 -maxdepth "$2" -printf '%y\t%s\t%P\n'"#;
    let depth = depth.clamp(1, 64).to_string();
    let (out, _) = run(sandbox, script, &[path, &depth], None, 16 * 1024 * 1024)
        .await
        .map_err(|e| reword_missing(e, path))?;
    let mut entries: Vec<Entry> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, '\t');
            let kind = match parts.next()? {
                "f" => "file",
                "d" => "dir",
                "l" => "symlink",
                _ => "other",
            };
            let size = parts.next()?.parse().unwrap_or(0);
            Some(Entry {
                path: parts.next()?.to_string(),
                kind,
                size,
            })
        })
        .collect();
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    let truncated = entries.len() > limit;
    entries.truncate(limit);
    Ok((entries, truncated))
}

/// Files under `path` whose relative path matches the glob `pattern`
/// (`**` crosses directories), sorted, at most `limit`.
pub async fn glob(
    sandbox: &dyn Sandbox,
    path: &str,
    pattern: &str,
    limit: usize,
) -> Result<(Vec<String>, bool)> {
    let matcher = GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| SandboxError::File(format!("bad glob pattern: {e}")))?
        .compile_matcher();
    let (entries, _) = list(sandbox, path, 64, usize::MAX).await?;
    let mut found: Vec<String> = entries
        .into_iter()
        .filter(|e| e.kind != "dir" && matcher.is_match(&e.path))
        .map(|e| e.path)
        .collect();
    let truncated = found.len() > limit;
    found.truncate(limit);
    Ok((found, truncated))
}

/// Lines matching the extended regular expression `pattern` under `path`
/// (a file or a directory), as `file:line:text`, optionally only in files
/// whose name matches `include`.
pub async fn grep(
    sandbox: &dyn Sandbox,
    path: &str,
    pattern: &str,
    include: Option<&str>,
    ignore_case: bool,
    limit: usize,
) -> Result<(String, bool)> {
    let script = r#"shift; pat=$1; shift
grep -rnIE "$@" -e "$pat" -- "$p"; s=$?
[ $s -le 1 ] || exit $s"#;
    let mut args = vec![path, pattern];
    let include_arg = include.map(|glob| format!("--include={glob}"));
    if let Some(arg) = &include_arg {
        args.push(arg);
    }
    if ignore_case {
        args.push("-i");
    }
    let (out, truncated) = run(sandbox, script, &args, None, limit)
        .await
        .map_err(|e| reword_missing(e, path))?;
    Ok((String::from_utf8_lossy(&out).into_owned(), truncated))
}

/// Turns the tools' own "No such file" wording into one message.
fn reword_missing(e: SandboxError, path: &str) -> SandboxError {
    match e {
        SandboxError::File(m) if m.contains("No such file") => {
            SandboxError::File(format!("'{path}' does not exist"))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_join_the_workdir() {
        assert_eq!(
            confine("a/b.txt", "/workspace").unwrap(),
            "/workspace/a/b.txt"
        );
        assert_eq!(
            confine("./x/../y", "/workspace/p").unwrap(),
            "/workspace/p/y"
        );
        assert_eq!(confine("/workspace", "/").unwrap(), "/workspace");
    }

    #[test]
    fn climbing_out_is_refused() {
        for bad in ["../etc/passwd", "/etc/passwd", "/workspace/../root", "/"] {
            let err = confine(bad, "/workspace").unwrap_err();
            assert!(
                matches!(&err, SandboxError::InvalidPath(m) if m.contains("outside /workspace")),
                "{bad}: {err}"
            );
        }
        assert!(confine("/workspacex/a", "/workspace").is_err());
        assert!(confine("", "/workspace").is_err());
        assert!(confine("a\0b", "/workspace").is_err());
    }
}
