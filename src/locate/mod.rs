//! How `conclave mcp` finds the server its user means.
//!
//! An IDE starts `conclave mcp` from whatever directory it likes, and the
//! user may run several `conclave serve`s (one per project, say). Each
//! server records itself while it runs ([`records`]: one file per server),
//! and `conclave mcp` picks among the live ones by data directory: the one
//! on the data directory it was given, else the one on the data directory a
//! `conclave serve` started here would use (`./data`), else the one on the
//! default address (`http://127.0.0.1:8080`, where a browser and every doc
//! go), else the only one running. With several running and none of them
//! on either directory or the default address it refuses, listing each
//! with the `--server` that picks it, rather than guess. With none running
//! it serves the tools itself.
//!
//! Layout:
//!
//! - [`records`]: the per-server files, written atomically, believed only
//!   when this user alone could have written them and their process runs.

pub mod records;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use records::ServerRecord;

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// `$XDG_STATE_HOME/conclave/servers`, else `~/.local/state/…`.
pub fn servers_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".local/state")))?;
    Some(base.join("conclave/servers"))
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

/// Records this process as a server of `data_dir` on `listen`, until
/// [`forget`]. Returns the record and where it was written.
pub fn record(listen: SocketAddr, data_dir: &Path) -> std::io::Result<(ServerRecord, PathBuf)> {
    let dir = servers_dir()
        .ok_or_else(|| std::io::Error::other("neither HOME nor XDG_STATE_HOME is set"))?;
    let record = ServerRecord::this_process(listen, data_dir)?;
    let path = records::write(&dir, &record)?;
    Ok((record, path))
}

/// Removes this server's record, and no other's.
pub fn forget(record: &ServerRecord) {
    if let Some(dir) = servers_dir() {
        records::remove(&dir, record);
    }
}

/// The servers running as this user, by pid.
pub fn running_servers() -> Vec<ServerRecord> {
    servers_dir()
        .map(|dir| records::live(&dir))
        .unwrap_or_default()
}

/// The running server of `data_dir`, if any.
pub fn running_on(data_dir: &Path) -> Option<ServerRecord> {
    on(running_servers(), data_dir)
}

fn on(servers: Vec<ServerRecord>, data_dir: &Path) -> Option<ServerRecord> {
    let data_dir = records::canonical(data_dir);
    servers.into_iter().find(|s| s.data_dir == data_dir)
}

/// What `conclave mcp` serves.
#[derive(Debug, Clone, PartialEq)]
pub enum Serving {
    /// Relays to this running server; `why` says how it was chosen.
    Relay { server: ServerRecord, why: String },
    /// Serves the tools itself on its data directory; `why` says which.
    InProcess { why: String },
}

/// Several servers run and none is on the data directory asked for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct Ambiguous {
    pub wanted: PathBuf,
    pub servers: Vec<ServerRecord>,
}

impl fmt::Display for Ambiguous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} conclave servers run as this user, none of them on {} or on {DEFAULT_URL}; \
             pick one with --server URL (or CONCLAVE_SERVER=URL), or --data-dir DIR:",
            self.servers.len(),
            self.wanted.display()
        )?;
        for server in &self.servers {
            write!(
                f,
                "\n  conclave mcp --server {}    (data dir {}, pid {})",
                server.url,
                server.data_dir.display(),
                server.pid
            )?;
        }
        Ok(())
    }
}

/// Where `conclave serve` listens by default, as its record names it.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// Picks among the running `servers`: the one on `given` (the data
/// directory from --data-dir, CONCLAVE_DATA_DIR or the config file); with
/// none given, the one on `here` (the current directory's `./data`), else
/// the one on [`DEFAULT_URL`], else the only one. A given directory no server runs on is served in process,
/// as is the per-user one when no server runs at all.
pub fn choose(
    servers: Vec<ServerRecord>,
    given: Option<&Path>,
    here: &Path,
) -> Result<Serving, Ambiguous> {
    let relay = |server: ServerRecord, why: String| Serving::Relay { server, why };
    if let Some(given) = given {
        return Ok(match on(servers, given) {
            Some(server) => {
                let why = format!("the server running as pid {} on the given data directory", server.pid);
                relay(server, why)
            }
            None => Serving::InProcess {
                why: "given (--data-dir, CONCLAVE_DATA_DIR or the config file), and no server runs on it"
                    .into(),
            },
        });
    }
    if let Some(server) = on(servers.clone(), here) {
        let why = format!(
            "the server running as pid {} on ./data of the current directory",
            server.pid
        );
        return Ok(relay(server, why));
    }
    if let Some(server) = servers.iter().find(|s| s.url == DEFAULT_URL) {
        let why = format!(
            "the server running as pid {} on the default address {DEFAULT_URL}",
            server.pid
        );
        return Ok(relay(server.clone(), why));
    }
    let mut servers = servers;
    match servers.len() {
        0 => Ok(Serving::InProcess {
            why: "the per-user default: no conclave serve is running".into(),
        }),
        1 => {
            let server = servers.remove(0);
            let why = format!(
                "the server running as pid {}, the only one running as this user",
                server.pid
            );
            Ok(relay(server, why))
        }
        _ => Err(Ambiguous {
            wanted: here.to_path_buf(),
            servers,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(pid: u32, data_dir: &str) -> ServerRecord {
        ServerRecord {
            pid,
            started: 1,
            data_dir: PathBuf::from(data_dir),
            url: format!("http://127.0.0.1:{pid}"),
        }
    }

    fn relayed_to(target: Result<Serving, Ambiguous>) -> Option<u32> {
        match target.unwrap() {
            Serving::Relay { server, .. } => Some(server.pid),
            Serving::InProcess { .. } => None,
        }
    }

    #[test]
    fn the_data_dir_decides_then_the_only_server() {
        let two = vec![server(1, "/p/a/data"), server(2, "/p/b/data")];
        let here = Path::new("/p/b/data");
        let elsewhere = Path::new("/q/data");
        assert_eq!(
            relayed_to(choose(two.clone(), Some(Path::new("/p/a/data")), here)),
            Some(1)
        );
        assert_eq!(relayed_to(choose(two.clone(), None, here)), Some(2));
        assert_eq!(relayed_to(choose(two.clone(), Some(elsewhere), here)), None);
        assert_eq!(
            relayed_to(choose(two[..1].to_vec(), None, elsewhere)),
            Some(1)
        );
        assert_eq!(relayed_to(choose(vec![], None, elsewhere)), None);
        let refused = choose(two.clone(), None, elsewhere).unwrap_err();
        assert_eq!(
            refused,
            Ambiguous {
                wanted: elsewhere.into(),
                servers: two
            }
        );
        assert_eq!(
            refused.to_string(),
            "2 conclave servers run as this user, none of them on /q/data or on \
             http://127.0.0.1:8080; pick one with --server URL (or CONCLAVE_SERVER=URL), \
             or --data-dir DIR:\n  \
             conclave mcp --server http://127.0.0.1:1    (data dir /p/a/data, pid 1)\n  \
             conclave mcp --server http://127.0.0.1:2    (data dir /p/b/data, pid 2)"
        );
    }

    #[test]
    fn the_default_address_comes_before_refusing() {
        let mut on_default = server(3, "/p/c/data");
        on_default.url = DEFAULT_URL.into();
        let three = vec![server(1, "/p/a/data"), on_default, server(2, "/p/b/data")];
        // The data directory still decides first.
        let here = Path::new("/p/b/data");
        assert_eq!(relayed_to(choose(three.clone(), None, here)), Some(2));
        // Then the one a browser would reach.
        let elsewhere = Path::new("/q/data");
        assert_eq!(relayed_to(choose(three, None, elsewhere)), Some(3));
    }
}
