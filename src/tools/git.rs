//! `options.workspace.git`: the server clones a repository and puts it in
//! the session's workspace as an upload would, before the first turn's
//! model call.
//!
//! The server's `git` fetches, not the sandbox: only over HTTP(S), only to
//! addresses `mcp.allowed_http_servers` allows (the name resolved and
//! checked here, and git pinned to those addresses so it cannot resolve it
//! elsewhere), following no redirect, with no system or user git config.
//! The credential, a secret, goes to git as an `Authorization` header in
//! its environment: never on a command line, never into `.git/config`.
//! What git says is scrubbed of it. The clone goes into the sandbox as a
//! tar unpacked by the sandbox's own user, within its disk limit.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use tokio_util::sync::CancellationToken;

use super::{Place, Toolbox};
use crate::agent::{GitSource, Seeded, ToolContext};
use crate::egress::Rules;
use crate::sandbox::secrets::Scrubber;
use crate::sandbox::{Stdin, WORKSPACE, workspace};

/// How often a running git's clone is measured against the sandbox's disk.
const DISK_CHECK_EVERY: Duration = Duration::from_millis(500);

/// What a clone put into the workspace.
#[derive(Debug, Clone, PartialEq)]
pub struct Cloned {
    /// Files and links, and the bytes of their contents.
    pub files: u64,
    pub bytes: u64,
    /// The URL, and `@ref` when one was asked for.
    pub source: String,
}

/// What `options.workspace.git` names, cloned into the session's sandbox.
pub async fn seed(
    tools: &Toolbox,
    rules: &Rules,
    scratch: &Path,
    ctx: &ToolContext,
    cancel: &CancellationToken,
) -> Result<Option<Seeded>, String> {
    let Some(git) = ctx.options.workspace.as_ref().and_then(|w| w.git.as_ref()) else {
        return Ok(None);
    };
    let sandboxes = &tools.sandboxes;
    let place = Place::session(sandboxes, ctx.session_id, &ctx.options, ctx.owner.clone())
        .map_err(|e| e.0)?;
    let credential = match &git.credential {
        Some(name) => Some(
            sandboxes
                .secrets()
                .get(ctx.owner.as_deref(), name)
                .ok_or_else(|| format!("cloning {}: no secret {name} for this key", git.url))?,
        ),
        None => None,
    };
    let cloned = clone_into(tools, &place, rules, git, credential, scratch, cancel).await?;
    tools.baselines.forget(ctx.session_id);
    Ok(Some(Seeded {
        path: WORKSPACE.into(),
        files: cloned.files,
        bytes: cloned.bytes,
        source: cloned.source,
    }))
}

/// Clones `git` (with `credential`, a secret's value) into the sandbox of
/// `place`, working in a directory of its own under `scratch`. The error
/// names the URL and says what git said.
pub async fn clone_into(
    tools: &Toolbox,
    place: &Place,
    rules: &Rules,
    git: &GitSource,
    credential: Option<&str>,
    scratch: &Path,
    cancel: &CancellationToken,
) -> Result<Cloned, String> {
    let url = &git.url;
    let failed = |message: String| format!("cloning {url}: {message}");
    let pinned = rules
        .pinned(url)
        .await
        .map_err(|e| failed(format!("{e} (mcp.allowed_http_servers)")))?;
    let work = scratch.join(uuid::Uuid::new_v4().to_string());
    tokio::fs::create_dir_all(&work)
        .await
        .map_err(|e| failed(format!("making {}: {e}", work.display())))?;
    let _cleanup = RemoveOnDrop(work.clone());
    let repo = work.join("repo");
    let timeout = Duration::from_secs(tools.max_timeout_s());
    let scrubber = credential
        .map(|c| Scrubber::new([("credential", c)]))
        .transpose()
        .map_err(|e| failed(e.to_string()))?
        .unwrap_or_default();
    let env = git_env(&work, pinned, credential);

    let mut clone = vec!["clone".to_string(), "--quiet".into()];
    if let Some(depth) = git.depth {
        clone.extend(["--depth".into(), depth.to_string()]);
    }
    match &git.reference {
        Some(_) if git.ref_is_commit() => clone.push("--no-checkout".into()),
        Some(branch) => clone.extend(["--branch".into(), branch.clone()]),
        None => {}
    }
    clone.extend(["--".into(), url.clone(), repo.display().to_string()]);
    let disk = (
        repo.as_path(),
        place.spec().disk_mb.saturating_mul(1024 * 1024),
    );
    run_git(&clone, &env, &work, timeout, cancel, &scrubber, disk)
        .await
        .map_err(&failed)?;
    if let Some(commit) = git.reference.as_ref().filter(|_| git.ref_is_commit()) {
        let checkout = ["checkout", "--quiet", "--detach", commit.as_str()].map(String::from);
        run_git(&checkout, &env, &repo, timeout, cancel, &scrubber, disk)
            .await
            .map_err(&failed)?;
    }

    let disk_mb = place.spec().disk_mb;
    let archive = work.join("repo.tar");
    let (files, bytes) = {
        let (repo, archive) = (repo.clone(), archive.clone());
        tokio::task::spawn_blocking(move || pack(&repo, &archive))
            .await
            .map_err(|e| failed(e.to_string()))?
            .map_err(|e| failed(format!("packing the clone: {e}")))?
    };
    if bytes > disk_mb.saturating_mul(1024 * 1024) {
        return Err(failed(format!(
            "the clone holds {bytes} bytes, more than the sandbox's disk (sandbox.disk_mb = {disk_mb})"
        )));
    }
    let lease = tools.lease(place).await.map_err(|e| failed(e.0))?;
    workspace::unpack(lease.sandbox.as_ref(), WORKSPACE, Stdin::File(archive))
        .await
        .map_err(|e| failed(e.to_string()))?;
    let source = match &git.reference {
        Some(reference) => format!("{url}@{reference}"),
        None => url.clone(),
    };
    Ok(Cloned {
        files,
        bytes,
        source,
    })
}

/// Git's environment: no config but this, no prompt, HTTP(S) only, no
/// redirect, the name pinned to the checked addresses, the credential as
/// a header.
fn git_env(
    home: &Path,
    pinned: Option<(String, u16, Vec<std::net::IpAddr>)>,
    credential: Option<&str>,
) -> Vec<(String, String)> {
    let mut config: Vec<(&str, String)> = vec![
        ("protocol.allow", "never".into()),
        ("protocol.http.allow", "always".into()),
        ("protocol.https.allow", "always".into()),
        ("http.followRedirects", "false".into()),
        ("transfer.fsckObjects", "true".into()),
        ("core.hooksPath", "/dev/null".into()),
    ];
    if let Some((host, port, addrs)) = pinned {
        let addrs: Vec<String> = addrs
            .iter()
            .map(|a| match a {
                std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                v4 => v4.to_string(),
            })
            .collect();
        config.push((
            "http.curloptResolve",
            format!("{host}:{port}:{}", addrs.join(",")),
        ));
    }
    if let Some(credential) = credential {
        let pair = if credential.contains(':') {
            credential.to_string()
        } else {
            format!("x-access-token:{credential}")
        };
        let basic = base64::engine::general_purpose::STANDARD.encode(pair);
        config.push(("http.extraHeader", format!("Authorization: Basic {basic}")));
    }
    let mut env: Vec<(String, String)> = vec![
        ("HOME".into(), home.display().to_string()),
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("GIT_TERMINAL_PROMPT".into(), "0".into()),
        ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
        ("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()),
        ("GIT_CONFIG_COUNT".into(), config.len().to_string()),
    ];
    for (i, (key, value)) in config.into_iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), key.into()));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), value));
    }
    env
}

/// Runs git to its end; its error is the end of what it printed.
async fn run_git(
    args: &[String],
    env: &[(String, String)],
    dir: &Path,
    timeout: Duration,
    cancel: &CancellationToken,
    scrubber: &Scrubber,
    disk: (&Path, u64),
) -> Result<(), String> {
    let mut command = tokio::process::Command::new("git");
    command
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "git is not installed on the server".to_string(),
        _ => format!("running git: {e}"),
    })?;
    // Dropped (killed) when the clone outgrows the sandbox's disk, takes
    // too long or is interrupted.
    let output = child.wait_with_output();
    tokio::pin!(output);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut every = tokio::time::interval(DISK_CHECK_EVERY);
    let output = loop {
        tokio::select! {
            output = &mut output => break output.map_err(|e| format!("running git: {e}"))?,
            _ = &mut deadline => return Err(format!("git took longer than {} s", timeout.as_secs())),
            _ = cancel.cancelled() => return Err("interrupted".into()),
            _ = every.tick() => {
                let (watched, limit) = (disk.0.to_path_buf(), disk.1);
                let used = tokio::task::spawn_blocking(move || count(&watched).map(|(_, b)| b))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(0);
                if used > limit {
                    return Err(format!(
                        "the clone passed {limit} bytes, the sandbox's disk (sandbox.disk_mb = {}), while git fetched; git was stopped",
                        limit / (1024 * 1024)
                    ));
                }
            }
        }
    };
    if output.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    let said: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = said[said.len().saturating_sub(4)..].join("; ");
    Err(scrubber.scrub(&format!("git {}: {tail}", exit_text(&output.status))))
}

fn exit_text(status: &std::process::ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exited with {code}"),
        None => "was killed".into(),
    }
}

/// Writes `repo` as a tar (links kept as links) to `archive`; the files
/// and links it holds and the bytes of their contents.
fn pack(repo: &Path, archive: &Path) -> std::io::Result<(u64, u64)> {
    let file = std::io::BufWriter::new(std::fs::File::create(archive)?);
    let mut builder = tar::Builder::new(file);
    builder.follow_symlinks(false);
    builder.append_dir_all(".", repo)?;
    builder.into_inner()?.into_inner()?.sync_all()?;
    count(repo)
}

fn count(dir: &Path) -> std::io::Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.file_type()?;
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                files += 1;
                if meta.is_file() {
                    bytes += entry.metadata()?.len();
                }
            }
        }
    }
    Ok((files, bytes))
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
