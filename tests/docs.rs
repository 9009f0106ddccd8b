//! The README's and `docs/`' fenced blocks, as a user would use them.
//!
//! Every `sh` block says how it is checked in its info string: `run` (run
//! as written, in bash with `set -euo pipefail`, against `conclave serve`
//! started as `scripts/serve.sh` starts it: no flags, a fresh working
//! directory, the default `./data`), optionally `expect=TEXT` (its output,
//! background commands' included, must come to hold `TEXT`), or
//! `skip="why"` (a setup this test does not make; the reason is printed).
//! Every `toml` block is a config file a server starts with, and every
//! `json` block is JSON, a value per line.
//!
//! The blocks' `curl` fails on an HTTP error (`--fail-with-body`), so a
//! refused request fails its block, and the port `8080` in a block is the
//! test server's own port, so that a server already on 8080 does not
//! matter.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::binary::{serve_command, spawn_server, stop};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// One fenced block.
#[derive(Debug)]
struct Block {
    file: String,
    line: usize,
    lang: String,
    /// The info string after the language.
    info: String,
    text: String,
}

impl Block {
    fn place(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }

    fn skip(&self) -> Option<&str> {
        self.info
            .split_once("skip=")
            .map(|(_, why)| why.trim().trim_matches('"'))
    }

    fn runs(&self) -> bool {
        self.info.split_whitespace().any(|word| word == "run")
    }

    fn expect(&self) -> Option<&str> {
        self.info
            .split_whitespace()
            .find_map(|word| word.strip_prefix("expect="))
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fenced blocks of README.md and docs/*.md, in document order.
fn blocks() -> Vec<Block> {
    let mut files = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut found = Vec::new();
    for path in files {
        let name = path.strip_prefix(repo()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut open: Option<Block> = None;
        for (i, line) in text.lines().enumerate() {
            let fence = line.trim_start().strip_prefix("```");
            match (fence, open.take()) {
                (Some(_), Some(block)) => found.push(block),
                (Some(info), None) => {
                    let (lang, rest) = info.trim().split_once(' ').unwrap_or((info.trim(), ""));
                    open = Some(Block {
                        file: name.clone(),
                        line: i + 1,
                        lang: lang.to_owned(),
                        info: rest.trim().to_owned(),
                        text: String::new(),
                    });
                }
                (None, Some(mut block)) => {
                    block.text.push_str(line);
                    block.text.push('\n');
                    open = Some(block);
                }
                (None, None) => {}
            }
        }
        assert!(open.is_none(), "{name}: a fence is not closed");
    }
    found
}

#[test]
fn every_shell_block_says_how_it_is_checked_and_json_blocks_parse() {
    let blocks = blocks();
    assert!(
        blocks.iter().filter(|b| b.runs()).count() >= 8,
        "{blocks:#?}"
    );
    for block in &blocks {
        match block.lang.as_str() {
            "sh" | "bash" | "shell" => assert!(
                block.runs() || block.skip().is_some_and(|why| !why.is_empty()),
                "{}: a shell block needs `run` or `skip=\"why\"`",
                block.place()
            ),
            "json" => {
                for line in block.text.lines().filter(|l| !l.trim().is_empty()) {
                    serde_json::from_str::<serde_json::Value>(line)
                        .unwrap_or_else(|e| panic!("{}: {e}: {line}", block.place()));
                }
            }
            _ => {}
        }
        if let Some(why) = block.skip() {
            println!("not run: {}: {why}", block.place());
        }
    }
}

#[tokio::test]
async fn every_config_block_starts_a_server() {
    let blocks: Vec<Block> = blocks().into_iter().filter(|b| b.lang == "toml").collect();
    assert!(!blocks.is_empty());
    for block in blocks {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("conclave.toml");
        std::fs::write(&file, &block.text).unwrap();
        let mut command = serve_command(&["--config", file.to_str().unwrap()]);
        command.current_dir(dir.path());
        without_providers(&mut command);
        let (mut child, url) = spawn_server(&mut command).await;
        let health = reqwest::get(format!("{url}/health")).await.unwrap();
        assert_eq!(health.status(), 200, "{}", block.place());
        stop(&mut child).await;
    }
}

/// The default server: no model provider from the test's environment.
fn without_providers(command: &mut Command) {
    for name in [
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "OPENAI_MODEL",
        "ANTHROPIC_API_KEY",
    ] {
        command.env_remove(name);
    }
}

/// A directory of what blocks find on `PATH` first: `conclave`, a
/// `curl` that fails on HTTP errors, and as `python3` the test venv's
/// (with the client packages a user of a block would have installed:
/// `langgraph-sdk`, `ag-ui-protocol`, `openai`, `mcp`).
fn path_dir(dir: &Path) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let curl = bin.join("curl");
    std::fs::write(
        &curl,
        "#!/bin/sh\nexec /usr/bin/curl --fail-with-body --show-error \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&curl, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_conclave"), bin.join("conclave")).unwrap();
    let python = std::env::var("CONCLAVE_TEST_PYTHON")
        .expect("CONCLAVE_TEST_PYTHON must name the test venv's python (scripts/test.sh sets it)");
    // A script, not a link: a venv's python finds its packages by the
    // path it is started as.
    let wrapper = bin.join("python3");
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec {python} \"$@\"\n")).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap())
}

/// How long one block may take, background commands' expected output
/// included: a stuck block fails rather than hangs the suite.
const BLOCK_LIMIT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn runnable_blocks_run_as_written_against_the_default_server() {
    let cwd = tempfile::tempdir().unwrap();
    // The user's checkout: the examples a block names are where it says.
    std::os::unix::fs::symlink(repo().join("examples"), cwd.path().join("examples")).unwrap();
    let tools = tempfile::tempdir().unwrap();
    let path = path_dir(tools.path());
    let mut command = serve_command(&[]);
    command.current_dir(cwd.path());
    without_providers(&mut command);
    let (mut server, url) = spawn_server(&mut command).await;
    let port = url.rsplit(':').next().unwrap().to_owned();
    for block in blocks().iter().filter(|b| b.runs()) {
        let script = format!(
            "set -euo pipefail\n{}",
            block.text.replace(":8080", &format!(":{port}"))
        );
        let mut shell = Command::new("bash");
        shell
            .args(["-c", &script])
            .current_dir(cwd.path())
            .env("PATH", &path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so its background commands go with it.
            .process_group(0)
            .kill_on_drop(true);
        let mut child = shell.spawn().unwrap();
        let group = child.id().unwrap() as i32;
        // Both streams' bytes, as they come.
        let (sender, mut chunks) = tokio::sync::mpsc::unbounded_channel();
        let readers = [
            tokio::spawn(forward(child.stdout.take().unwrap(), sender.clone())),
            tokio::spawn(forward(child.stderr.take().unwrap(), sender)),
        ];
        let mut shown = String::new();
        let ran = tokio::time::timeout(BLOCK_LIMIT, async {
            let status = loop {
                tokio::select! {
                    status = child.wait() => break status.unwrap(),
                    Some(chunk) = chunks.recv() => shown.push_str(&chunk),
                }
            };
            // Background commands (a subscriber) may print after the
            // script's last line: read on until what it expects.
            if let Some(text) = block.expect() {
                while !shown.contains(text) {
                    match chunks.recv().await {
                        Some(chunk) => shown.push_str(&chunk),
                        None => break,
                    }
                }
            }
            status
        })
        .await;
        // The block's group: its background commands end with it.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{group}")])
            .stderr(Stdio::null())
            .status();
        for reader in readers {
            reader.abort();
        }
        while let Ok(chunk) = chunks.try_recv() {
            shown.push_str(&chunk);
        }
        match ran {
            Ok(status) => {
                assert!(
                    status.success(),
                    "{} failed ({status}):\n{}\n--- output ---\n{shown}",
                    block.place(),
                    block.text
                );
                if let Some(text) = block.expect() {
                    assert!(
                        shown.contains(text),
                        "{}: no {text:?} in its output:\n{shown}",
                        block.place()
                    );
                }
            }
            Err(_) => panic!(
                "{} did not finish in {BLOCK_LIMIT:?} (or never printed {:?}):\n{}\n--- output ---\n{shown}",
                block.place(),
                block.expect(),
                block.text
            ),
        }
        println!("ran: {}", block.place());
    }
    stop(&mut server).await;
}

/// Sends what `stream` yields until it ends.
async fn forward<R: tokio::io::AsyncRead + Unpin>(
    mut stream: R,
    to: tokio::sync::mpsc::UnboundedSender<String>,
) {
    let mut buffer = [0u8; 8192];
    while let Ok(n) = stream.read(&mut buffer).await {
        if n == 0
            || to
                .send(String::from_utf8_lossy(&buffer[..n]).into_owned())
                .is_err()
        {
            break;
        }
    }
}

/// The README's install block, from the checkout as a user runs it: it
/// builds, installs `conclave` into `$PREFIX/bin` and the next line finds
/// it on `PATH`. A debug build (`PROFILE=debug`) into a temporary prefix,
/// so that the suite neither builds a release nor writes /usr/local.
#[tokio::test]
async fn the_install_block_puts_conclave_on_path() {
    let block = blocks()
        .into_iter()
        .find(|b| b.file == "README.md" && b.text.starts_with("scripts/install.sh"))
        .expect("README.md has a block that starts with scripts/install.sh");
    let prefix = tempfile::tempdir().unwrap();
    let bin = prefix.path().join("bin");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let ran = Command::new("bash")
        .args(["-c", &format!("set -euo pipefail\n{}", block.text)])
        .current_dir(repo())
        .env("PREFIX", prefix.path())
        .env("PROFILE", "debug")
        .env("PATH", &path)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr),
    );
    assert!(
        ran.status.success(),
        "{}: {stdout}\n{stderr}",
        block.place()
    );
    let installed = bin.join("conclave");
    assert!(
        stderr.contains(&format!("installed {}", installed.display())),
        "{stderr}"
    );
    assert!(
        stdout.starts_with(&format!("conclave {}", env!("CARGO_PKG_VERSION"))),
        "{stdout}"
    );
    assert!(!stderr.contains("is not on PATH"), "{stderr}");
}
