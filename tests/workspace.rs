//! A session's workspace in and out (issue 68), on real sandboxes: a tar of
//! a small git repository uploaded, a turn that edits a file and adds one,
//! the workspace downloaded and compared; one file put and read; a
//! directory listed; a turn end's snapshot read. Hostile archives (an
//! absolute path, `..`, a file written through a link, a device node, a
//! bomb past the disk) are refused naming the entry and change nothing;
//! an upload during a tool call is a 409; another key's session is a 404
//! on every route. One test runs the real binary as the README does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::TestServer;
use common::binary::{serve_command, spawn_server, stop};
use conclave::config::SandboxBackendKind;
use serde_json::{Value, json};

/// A git repository with two files and one commit, as a gzip tar.
fn repo_tar_gz(dir: &Path) -> Vec<u8> {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("README.md"), "# demo\n").unwrap();
    std::fs::write(dir.join("src/main.py"), "print(\"hi\")\n").unwrap();
    let git = |args: &[&str]| {
        let status = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("git runs");
        assert!(status.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "first"]);
    let out = std::process::Command::new("tar")
        .args(["-C", dir.to_str().unwrap(), "-czf", "-", "."])
        .output()
        .expect("tar runs");
    assert!(out.status.success());
    out.stdout
}

/// One tar entry with any name, link and type, as a hostile client writes
/// it (the tar crate's own setters refuse `..` and absolute paths).
fn raw_entry(name: &str, kind: tar::EntryType, link: &str, data: &[u8]) -> Vec<u8> {
    let mut header = tar::Header::new_ustar();
    header.set_size(data.len() as u64);
    header.set_entry_type(kind);
    header.set_mode(0o644);
    let old = header.as_old_mut();
    old.name[..name.len()].copy_from_slice(name.as_bytes());
    old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    header.set_cksum();
    let mut out = header.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn archive(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = entries.concat();
    out.extend_from_slice(&[0; 1024]);
    out
}

/// The files of a tar, path → contents (links as `-> target`).
fn unpacked(data: &[u8]) -> std::collections::BTreeMap<String, String> {
    let mut files = std::collections::BTreeMap::new();
    let mut archive = tar::Archive::new(data);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let path = path.trim_start_matches("./").to_owned();
        let contents = match entry.header().entry_type() {
            tar::EntryType::Regular => {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut entry, &mut text).unwrap_or_default();
                text
            }
            tar::EntryType::Symlink => {
                format!("-> {}", entry.link_name().unwrap().unwrap().display())
            }
            _ => continue,
        };
        files.insert(path, contents);
    }
    files
}

async fn put(http: &reqwest::Client, url: &str, content_type: &str, body: Vec<u8>) -> (u16, Value) {
    let response = http
        .put(url)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn turn(http: &reqwest::Client, base: &str, id: &str, prompt: &str) -> Vec<Value> {
    let response = http
        .post(format!("{base}/agent/session/{id}/message"))
        .json(&json!({ "prompt": prompt }))
        .send()
        .await
        .unwrap();
    let events = common::ndjson(response).await;
    assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
    events
}

/// The README's first command, on its defaults (the sandbox backend is
/// `auto`: docker here), in a fresh working directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_code_in_and_the_agents_work_out_on_the_real_binary() {
    let cwd = tempfile::tempdir().unwrap();
    // What a server killed mid-upload and mid-clone left behind goes at
    // the next start.
    let stale = [
        cwd.path().join("data/uploads/x.part"),
        cwd.path().join("data/clones/y/repo/f"),
    ];
    for path in &stale {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "left").unwrap();
    }
    let mut command = serve_command(&[]);
    command.current_dir(cwd.path());
    let (mut child, base) = spawn_server(&mut command).await;
    assert!(stale.iter().all(|p| !p.exists()), "{stale:?}");
    assert!(!cwd.path().join("data/clones/y").exists());
    let http = reqwest::Client::new();
    let id = code_in_work_out(&http, &base).await;
    let deleted = http
        .delete(format!("{base}/agent/session/{id}"))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success());
    stop(&mut child).await;
    // Nothing of the upload is left on the server's disk.
    let spooled: Vec<_> = std::fs::read_dir(cwd.path().join("data/uploads"))
        .map(|d| d.collect())
        .unwrap_or_default();
    assert!(spooled.is_empty(), "{spooled:?}");
}

/// Upload a repository, a turn that edits a file and adds one, then the
/// workspace out, its changes and their patch applied with `git apply`
/// onto the uploaded tree; returns the session's id.
async fn code_in_work_out(http: &reqwest::Client, base: &str) -> String {
    let created: Value = http
        .post(format!("{base}/agent/session"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["session_id"].as_str().unwrap().to_owned();

    // The upload comes before the session's first tool call.
    let repo = tempfile::tempdir().unwrap();
    let upload = repo_tar_gz(repo.path());
    let (status, body) = put(
        http,
        &format!("{base}/agent/session/{id}/workspace"),
        "application/gzip",
        upload,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["path"], "/workspace");
    assert!(body["files"].as_u64().unwrap() >= 3, "{body}");

    let events = turn(
        http,
        base,
        &id,
        "$ sed -i 's/hi/hello/' src/main.py && echo new > added.txt && cat README.md",
    )
    .await;
    let result = events.iter().find(|e| e["type"] == "tool_result").unwrap();
    assert_eq!(result["output"]["stdout"], "# demo\n", "{result}");
    // The turn's result says what it did to the files.
    let end = events.last().unwrap();
    assert_eq!(
        end["files_changed"],
        json!({"added": 1, "modified": 1, "deleted": 0}),
        "{end}"
    );

    // Out: the whole workspace, with the agent's edit, its new file and
    // the repository's history.
    let response = http
        .get(format!("{base}/agent/session/{id}/workspace"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-tar");
    let files = unpacked(&response.bytes().await.unwrap());
    assert_eq!(files["src/main.py"], "print(\"hello\")\n");
    assert_eq!(files["added.txt"], "new\n");
    assert_eq!(files["README.md"], "# demo\n");
    assert!(files.contains_key(".git/HEAD"), "{:?}", files.keys());

    // One file, a listing, and the log's record of the upload.
    let text = http
        .get(format!("{base}/agent/session/{id}/files/src/main.py"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text, "print(\"hello\")\n");
    let listing: Value = http
        .get(format!("{base}/agent/session/{id}/files/src/"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listing["entries"][0]["name"], "main.py", "{listing}");
    assert_eq!(listing["entries"][0]["kind"], "file");
    assert_eq!(listing["entries"][0]["size"], 15);
    let log = common::ndjson(
        http.get(format!("{base}/agent/session/{id}/events"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let uploaded = log
        .iter()
        .find(|e| e["type"] == "workspace_uploaded")
        .unwrap_or_else(|| panic!("{log:?}"));
    assert_eq!(uploaded["path"], "/workspace");
    assert_eq!(uploaded["seq"], 1);

    // What the turn changed: exactly those two, and a patch git applies.
    let changes: Value = http
        .get(format!("{base}/agent/session/{id}/changes"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let files: Vec<(&str, &str)> = changes["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        files,
        [("added.txt", "added"), ("src/main.py", "modified")],
        "{changes}"
    );
    assert_eq!(changes["from_seq"], 1, "{changes}");
    let patch = http
        .get(format!("{base}/agent/session/{id}/changes?format=patch"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let tree = repo.path();
    let mut apply = std::process::Command::new("git")
        .args(["apply", "-"])
        .current_dir(tree)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut apply.stdin.take().unwrap(), patch.as_bytes()).unwrap();
    assert!(apply.wait().unwrap().success(), "{patch}");
    assert_eq!(
        std::fs::read_to_string(tree.join("src/main.py")).unwrap(),
        "print(\"hello\")\n"
    );
    assert_eq!(
        std::fs::read_to_string(tree.join("added.txt")).unwrap(),
        "new\n"
    );
    // The next turn is told from the last one's end; one without a call in
    // the sandbox changed nothing.
    let events = turn(http, base, &id, "$ rm added.txt").await;
    let end = events.last().unwrap();
    let deleted = json!({"added": 0, "modified": 0, "deleted": 1});
    assert_eq!(end["files_changed"], deleted, "{end}");
    let events = turn(http, base, &id, "hello").await;
    let end = events.last().unwrap();
    let none = json!({"added": 0, "modified": 0, "deleted": 0});
    assert_eq!(end["files_changed"], none, "{end}");
    id
}

const OWNER: &str = "owner-key";
const OTHER: &str = "other-key";

/// The names at the top of session `id`'s workspace, as its owner lists them.
async fn top_names(http: &reqwest::Client, base: &str, id: &str) -> Vec<String> {
    let listing: Value = http
        .get(format!("{base}/agent/session/{id}/files/"))
        .bearer_auth(OWNER)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Hostile archives, a turn's tool call, another key, one file, a turn
/// end's snapshot, on one backend.
async fn hostile_busy_and_foreign(backend: SandboxBackendKind) {
    let server = TestServer::start_sandboxed(|c| {
        c.sandbox.backend = backend;
        c.sandbox.warm_pool = 0;
        c.sandbox.disk_mb = 16;
        c.api_keys = vec![OWNER.into(), OTHER.into()];
    })
    .await;
    let http = reqwest::Client::new();
    let base = server.url("");
    let created: Value = server
        .send_as(
            OWNER,
            reqwest::Method::POST,
            "/agent/session",
            Some(json!({})),
        )
        .await
        .json()
        .await
        .unwrap();
    let id = created["session_id"].as_str().unwrap().to_owned();
    let workspace = format!("{base}/agent/session/{id}/workspace");
    let as_owner = |request: reqwest::RequestBuilder| request.bearer_auth(OWNER);
    let put_as = |key: &'static str, url: String, kind: &'static str, body: Vec<u8>| {
        let request = http
            .put(url)
            .bearer_auth(key)
            .header("content-type", kind)
            .body(body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };

    let keep = archive(&[raw_entry(
        "keep.txt",
        tar::EntryType::Regular,
        "",
        b"kept\n",
    )]);
    let (status, body) = put_as(OWNER, workspace.clone(), "application/x-tar", keep).await;
    assert_eq!(status, 200, "{body}");

    let hostile = [
        (
            "absolute",
            archive(&[raw_entry(
                "/etc/cron.d/x",
                tar::EntryType::Regular,
                "",
                b"x",
            )]),
            "/etc/cron.d/x",
        ),
        (
            "dot-dot",
            archive(&[
                raw_entry("fine.txt", tar::EntryType::Regular, "", b"x"),
                raw_entry("a/../../x", tar::EntryType::Regular, "", b"x"),
            ]),
            "a/../../x",
        ),
        (
            "through a link",
            archive(&[
                raw_entry("pw", tar::EntryType::Symlink, "/etc", b""),
                raw_entry(
                    "pw/passwd",
                    tar::EntryType::Regular,
                    "",
                    b"root::0:0::/:/bin/sh\n",
                ),
            ]),
            "pw/passwd",
        ),
        (
            "device",
            archive(&[raw_entry("null", tar::EntryType::Char, "", b"")]),
            "null",
        ),
    ];
    for (what, data, entry) in hostile {
        let (status, body) = put_as(OWNER, workspace.clone(), "application/x-tar", data).await;
        assert_eq!(status, 422, "{what}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("'{entry}'")), "{what}: {message}");
    }
    // A bomb: 40 MB of zeros in a small gzip, past the 16 MB disk.
    let mut bomb = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(40 << 20);
    header.set_mode(0o644);
    bomb.append_data(
        &mut header,
        "zeros",
        std::io::Read::take(std::io::repeat(0), 40 << 20),
    )
    .unwrap();
    let bomb = gzip(&bomb.into_inner().unwrap());
    assert!(bomb.len() < 1 << 20);
    let (status, body) = put_as(OWNER, workspace.clone(), "application/gzip", bomb).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sandbox.disk_mb"),
        "{body}"
    );
    // Nothing of those reached the workspace.
    assert_eq!(top_names(&http, &base, &id).await, ["keep.txt"]);
    // Into a workspace with files: a file replaced, one added under a new
    // directory, the rest kept.
    let over = archive(&[
        raw_entry("keep.txt", tar::EntryType::Regular, "", b"replaced\n"),
        raw_entry("sub/new.txt", tar::EntryType::Regular, "", b"new\n"),
    ]);
    let (status, body) = put_as(OWNER, workspace.clone(), "application/x-tar", over).await;
    assert_eq!(status, 200, "{body}");
    for (path, expected) in [("keep.txt", "replaced\n"), ("sub/new.txt", "new\n")] {
        let read = as_owner(http.get(format!("{base}/agent/session/{id}/files/{path}")))
            .send()
            .await
            .unwrap();
        assert_eq!(read.text().await.unwrap(), expected, "{path}");
    }
    let names = top_names(&http, &base, &id).await;
    assert_eq!(names, ["keep.txt", "sub"], "no staging directory is left");
    // An upload whose client goes away half-way leaves nothing either
    // (its staging directory is removed once the server sees the end).
    let half = archive(&[raw_entry(
        "half.txt",
        tar::EntryType::Regular,
        "",
        &[b'x'; 4096],
    )]);
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = vec![
        Ok(half[..2048].to_vec()),
        Err(std::io::Error::other("the client went away")),
    ];
    let cut = as_owner(http.put(workspace.clone()))
        .header("content-type", "application/x-tar")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(pieces)))
        .send()
        .await;
    assert!(cut.is_err(), "{cut:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let names = top_names(&http, &base, &id).await;
        if names == ["keep.txt", "sub"] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cut upload left {names:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // During a tool call: 409, naming the running turn.
    let running = as_owner(http.post(format!("{base}/agent/session/{id}/message")))
        .json(&json!({"prompt": "$ sleep 2; echo done > done.txt"}))
        .send()
        .await
        .unwrap();
    let mut lines = common::Lines::new(running);
    lines.until("tool_use").await;
    let one = archive(&[raw_entry("late.txt", tar::EntryType::Regular, "", b"x")]);
    let (status, body) = put_as(OWNER, workspace.clone(), "application/x-tar", one.clone()).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("running a turn"),
        "{body}"
    );
    let (status, _) = put_as(
        OWNER,
        format!("{base}/agent/session/{id}/files/late.txt"),
        "application/octet-stream",
        b"x".to_vec(),
    )
    .await;
    assert_eq!(status, 409);
    let end = lines.until("result").await;
    assert_eq!(end.last().unwrap()["status"], "success", "{end:?}");
    let status: Value = as_owner(http.get(format!("{base}/agent/session/{id}/status")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let turn_end = status["last_seq"].as_u64().unwrap();

    // One file in, and read back; the turn end's snapshot has what the
    // turn wrote, not what came after.
    let (status, body) = put_as(
        OWNER,
        format!("{base}/agent/session/{id}/files/notes/todo.md"),
        "application/octet-stream",
        b"- ship it\n".to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["path"], "/workspace/notes/todo.md");
    let read = as_owner(http.get(format!("{base}/agent/session/{id}/files/notes/todo.md")))
        .send()
        .await
        .unwrap();
    assert_eq!(read.headers()["content-type"], "text/markdown");
    assert_eq!(read.text().await.unwrap(), "- ship it\n");
    let at_end = as_owner(http.get(format!("{workspace}?at_seq={turn_end}&format=tar.gz")))
        .send()
        .await
        .unwrap();
    assert_eq!(at_end.status(), 200);
    let files = unpacked(&gunzip(&at_end.bytes().await.unwrap()));
    assert_eq!(files.get("done.txt").map(String::as_str), Some("done\n"));
    assert!(!files.contains_key("notes/todo.md"), "{files:?}");
    let missing = as_owner(http.get(format!("{base}/agent/session/{id}/files/nope.txt")))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let outside = as_owner(http.get(format!(
        "{base}/agent/session/{id}/files/a%2F..%2F..%2Fetc%2Fpasswd"
    )))
    .send()
    .await
    .unwrap();
    assert_eq!(outside.status(), 422);

    // Another key: every route is a 404, and nothing changed.
    for (method, path) in [
        (
            reqwest::Method::GET,
            format!("/agent/session/{id}/workspace"),
        ),
        (
            reqwest::Method::GET,
            format!("/agent/session/{id}/files/keep.txt"),
        ),
        (reqwest::Method::GET, format!("/agent/session/{id}/files/")),
    ] {
        let response = http
            .request(method.clone(), server.url(&path))
            .bearer_auth(OTHER)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{method} {path}");
    }
    let (status, _) = put_as(OTHER, workspace.clone(), "application/x-tar", one).await;
    assert_eq!(status, 404);
    let (status, _) = put_as(
        OTHER,
        format!("{base}/agent/session/{id}/files/keep.txt"),
        "application/octet-stream",
        b"theirs".to_vec(),
    )
    .await;
    assert_eq!(status, 404);
    let kept = as_owner(http.get(format!("{base}/agent/session/{id}/files/keep.txt")))
        .send()
        .await
        .unwrap();
    assert_eq!(kept.text().await.unwrap(), "replaced\n");
    // A page of another origin cannot upload.
    let refused = http
        .put(format!("{base}/agent/session/{id}/files/page.txt"))
        .bearer_auth(OWNER)
        .header("origin", "https://evil.example")
        .header("content-type", "text/plain")
        .body("x")
        .send()
        .await
        .unwrap();
    assert!(
        matches!(refused.status().as_u16(), 403 | 415),
        "{}",
        refused.status()
    );
    server.stop_and_remove_sandboxes().await;
}

fn gzip(data: &[u8]) -> Vec<u8> {
    through_gzip(&["-c"], data)
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    through_gzip(&["-dc"], data)
}

/// `data` through the gzip command with `args`.
fn through_gzip(args: &[&str], data: &[u8]) -> Vec<u8> {
    let mut child = std::process::Command::new("gzip")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_code_in_and_the_agents_work_out_on_local() {
    let server = TestServer::start_sandboxed(|c| {
        c.sandbox.backend = SandboxBackendKind::Local;
        c.sandbox.warm_pool = 0;
    })
    .await;
    code_in_work_out(&reqwest::Client::new(), &server.url("")).await;
    server.stop_and_remove_sandboxes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_archives_a_busy_session_and_another_key_on_docker() {
    hostile_busy_and_foreign(SandboxBackendKind::Docker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_archives_a_busy_session_and_another_key_on_local() {
    hostile_busy_and_foreign(SandboxBackendKind::Local).await;
}
