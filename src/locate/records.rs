//! The records of running servers: one file per `conclave serve`, named
//! `<pid>-<start time>.json` in `$XDG_STATE_HOME/conclave/servers/`.
//!
//! One file per server rather than one shared file: each server writes and
//! removes only its own, so two servers starting or stopping at once never
//! lose each other's entry (a shared file would need a lock around every
//! read-modify-write), and a server that stops removes nobody else's. A
//! file is written whole under a temporary name and renamed into place, so
//! a reader sees a complete record or none. The start time in the name
//! tells a record of a dead process from one of a new process that reuses
//! its pid, so cleaning up a dead server's file never removes a live one's.
//!
//! The key `conclave mcp` relays with goes to the address a record names,
//! so a record is believed only when nobody else could have written it and
//! its server still runs: the directory and the file belong to this user
//! and no other can write them (the directory is made 0700, the files
//! 0600), the process named runs as this user and started when the record
//! says, and the address is one of this host's, given as an IP (no name to
//! resolve elsewhere).

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a running server leaves for `conclave mcp` to find.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerRecord {
    pub pid: u32,
    /// When the process started, in clock ticks after boot (field 22 of
    /// `/proc/<pid>/stat`): a pid reused by another process has another.
    pub started: u64,
    /// Canonical, so that every spelling of the directory matches it.
    pub data_dir: PathBuf,
    /// `http://<ip>:<port>`, on loopback when the server listens on every
    /// address.
    pub url: String,
}

impl ServerRecord {
    /// This process, serving `data_dir` on `listen`.
    pub fn this_process(listen: SocketAddr, data_dir: &Path) -> std::io::Result<ServerRecord> {
        let pid = std::process::id();
        let started = process_started(pid)
            .ok_or_else(|| std::io::Error::other("cannot read this process's start time"))?;
        Ok(ServerRecord {
            pid,
            started,
            data_dir: canonical(data_dir),
            url: ServerRecord::reached_at(listen),
        })
    }

    /// `http://<ip>:<port>` of a server listening on `listen`: on loopback
    /// when it listens on every address.
    pub fn reached_at(listen: SocketAddr) -> String {
        let ip = match listen.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("http://{}", SocketAddr::new(ip, listen.port()))
    }

    fn file_name(&self) -> String {
        format!("{}-{}.json", self.pid, self.started)
    }
}

/// `path` with symlinks and `..` resolved when it exists, else as given.
pub fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Writes `record` into `dir` (made 0700 if missing), whole, then renamed
/// into place. Returns the file's path.
pub fn write(dir: &Path, record: &ServerRecord) -> std::io::Result<PathBuf> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if !private(dir) {
        return Err(std::io::Error::other(format!(
            "{} is not this user's alone (owned by another user, or writable by others)",
            dir.display()
        )));
    }
    let path = dir.join(record.file_name());
    // Hidden and named after this process: readers skip it, and no other
    // server writes the same temporary file.
    let temp = dir.join(format!(".{}.tmp", record.file_name()));
    let _ = std::fs::remove_file(&temp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)?;
    file.write_all(&serde_json::to_vec_pretty(record)?)?;
    file.sync_all()?;
    std::fs::rename(&temp, &path)?;
    Ok(path)
}

/// Removes `record`'s file from `dir`, leaving every other server's.
pub fn remove(dir: &Path, record: &ServerRecord) {
    let _ = std::fs::remove_file(dir.join(record.file_name()));
}

/// The records in `dir` of servers that still run, by pid; files of
/// processes gone are removed on the way. A directory others could write
/// yields none.
pub fn live(dir: &Path) -> Vec<ServerRecord> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    if !private(dir) {
        tracing::warn!(
            dir = %dir.display(),
            "ignoring the records of running servers: the directory is not this user's alone"
        );
        return Vec::new();
    }
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some((pid, started)) = parse_file_name(&entry.file_name().to_string_lossy()) else {
            continue;
        };
        if process_started(pid) != Some(started) || !owned_by_me(Path::new(&format!("/proc/{pid}")))
        {
            // Its server is gone (or was never ours): nothing will use it.
            let _ = std::fs::remove_file(&path);
            continue;
        }
        match read(&path) {
            Some(record) if record.pid == pid && record.started == started => found.push(record),
            _ => {
                tracing::warn!(file = %path.display(), "ignoring a server record that does not hold")
            }
        }
    }
    found.sort_by_key(|r| r.pid);
    found
}

/// `<pid>-<started>.json`, as [`ServerRecord::file_name`] writes it.
fn parse_file_name(name: &str) -> Option<(u32, u64)> {
    let (pid, started) = name.strip_suffix(".json")?.split_once('-')?;
    Some((pid.parse().ok()?, started.parse().ok()?))
}

/// The record in `path` if this user alone can have written it and it
/// names an address of this host.
fn read(path: &Path) -> Option<ServerRecord> {
    if !private(path) {
        return None;
    }
    let record: ServerRecord = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    local_url(&record.url).then_some(record)
}

/// `http://<ip>:<port>` with an IP of this host: loopback, or an address
/// this host can bind (which no other host's address is).
fn local_url(url: &str) -> bool {
    let Some(addr) = url
        .strip_prefix("http://")
        .and_then(|a| a.parse::<SocketAddr>().ok())
    else {
        return false;
    };
    addr.ip().is_loopback()
        || (!addr.ip().is_unspecified()
            && !addr.ip().is_multicast()
            && std::net::UdpSocket::bind(SocketAddr::new(addr.ip(), 0)).is_ok())
}

/// Owned by this user and writable by no one else.
fn private(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .is_ok_and(|m| !m.file_type().is_symlink() && owned_by_me(path) && m.mode() & 0o022 == 0)
}

fn owned_by_me(path: &Path) -> bool {
    // /proc/self belongs to this process's effective user.
    match (
        std::fs::metadata("/proc/self"),
        std::fs::symlink_metadata(path),
    ) {
        (Ok(me), Ok(it)) => me.uid() == it.uid(),
        _ => false,
    }
}

/// When process `pid` started (field 22 of `/proc/<pid>/stat`, after the
/// command name in parentheses, which may hold spaces), if it runs.
fn process_started(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    // After the name: state (field 3) … starttime (field 22).
    after_name.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn record(pid: u32, started: u64, url: &str) -> ServerRecord {
        ServerRecord {
            pid,
            started,
            data_dir: PathBuf::from("/srv/data"),
            url: url.into(),
        }
    }

    #[test]
    fn a_record_of_this_process_is_live_and_others_are_cleaned_up() {
        let dir = tempfile::tempdir().unwrap();
        let servers = dir.path().join("conclave/servers");
        let me = ServerRecord::this_process("0.0.0.0:8080".parse().unwrap(), dir.path()).unwrap();
        assert_eq!(me.url, "http://127.0.0.1:8080");
        assert_eq!(me.data_dir, canonical(dir.path()));
        let path = write(&servers, &me).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&servers).unwrap().mode() & 0o777, 0o700);
        // The same pid, started at another time: a dead server's record.
        let reused = record(me.pid, me.started + 1, "http://127.0.0.1:9000");
        let reused_path = write(&servers, &reused).unwrap();
        let gone = record(u32::MAX, 1, "http://127.0.0.1:9001");
        let gone_path = write(&servers, &gone).unwrap();
        assert_eq!(live(&servers), vec![me.clone()]);
        assert!(!reused_path.exists() && !gone_path.exists());
        remove(&servers, &me);
        assert_eq!(live(&servers), vec![]);
    }

    #[test]
    fn a_record_others_could_write_or_naming_another_host_is_not_believed() {
        let dir = tempfile::tempdir().unwrap();
        let servers = dir.path().join("servers");
        let me = ServerRecord::this_process("127.0.0.1:8080".parse().unwrap(), dir.path()).unwrap();
        let path = write(&servers, &me).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert_eq!(live(&servers), vec![]);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&servers, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(live(&servers), vec![]);
        assert!(write(&servers, &me).is_err());
        std::fs::set_permissions(&servers, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(live(&servers), vec![me.clone()]);
        for url in [
            "http://192.0.2.1:8080",
            "http://example.com:8080",
            "https://127.0.0.1:8080",
            "http://0.0.0.0:8080",
        ] {
            let forged = ServerRecord {
                url: url.into(),
                ..me.clone()
            };
            write(&servers, &forged).unwrap();
            assert_eq!(live(&servers), vec![], "{url}");
        }
    }

    #[test]
    fn file_names_are_pid_and_start_time() {
        assert_eq!(parse_file_name("12-345.json"), Some((12, 345)));
        for name in [".12-345.json.tmp", "12.json", "server.json", "a-1.json"] {
            assert_eq!(parse_file_name(name), None, "{name}");
        }
    }
}
