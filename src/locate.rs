//! Where `conclave mcp` finds its data directory when none is given.
//!
//! An IDE starts `conclave mcp` from whatever directory it likes, so a
//! default relative to the working directory would be a new, empty store
//! there. Instead `conclave serve` records its data directory in a per-user
//! file while it runs, and `conclave mcp` uses the directory of that server
//! (if it still runs), else the per-user data directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a running server leaves for `conclave mcp` to find.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerRecord {
    pub pid: u32,
    pub data_dir: PathBuf,
    pub url: String,
}

/// Why `conclave mcp` uses the data directory it uses.
#[derive(Debug, Clone, PartialEq)]
pub enum DataDirSource {
    /// The data directory of the server running with this pid.
    RunningServer { pid: u32, url: String },
    /// No server runs: the per-user data directory.
    PerUser,
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// `$XDG_STATE_HOME/conclave/server.json`, else `~/.local/state/…`.
pub fn record_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".local/state")))?;
    Some(base.join("conclave/server.json"))
}

/// `$XDG_DATA_HOME/conclave`, else `~/.local/share/conclave`, else `./data`.
pub fn user_data_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".local/share")))
        .map(|base| base.join("conclave"))
        .unwrap_or_else(|| PathBuf::from("data"))
}

/// Records the running server (written whole, then renamed into place).
pub fn record(record: &ServerRecord) -> std::io::Result<PathBuf> {
    let path = record_path()
        .ok_or_else(|| std::io::Error::other("neither HOME nor XDG_STATE_HOME is set"))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let temp = dir.join(format!("server.json.{}", record.pid));
    std::fs::write(&temp, serde_json::to_vec_pretty(record)?)?;
    std::fs::rename(&temp, &path)?;
    Ok(path)
}

/// Removes the record if it is still this process's.
pub fn forget(pid: u32) {
    if let Some(path) = record_path()
        && read(&path).is_some_and(|r| r.pid == pid)
    {
        let _ = std::fs::remove_file(path);
    }
}

fn read(path: &Path) -> Option<ServerRecord> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The server recorded as running, if its process still lives.
pub fn running_server() -> Option<ServerRecord> {
    record_path()
        .as_deref()
        .and_then(read)
        .filter(|server| alive(server.pid))
}

/// The data directory `conclave mcp` uses when it is given none.
pub fn default_mcp_data_dir() -> (PathBuf, DataDirSource) {
    if let Some(server) = running_server() {
        return (
            server.data_dir,
            DataDirSource::RunningServer {
                pid: server.pid,
                url: server.url,
            },
        );
    }
    (user_data_dir(), DataDirSource::PerUser)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_a_dead_process_is_not_used() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX));
    }
}
