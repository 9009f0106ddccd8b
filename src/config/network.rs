//! `[sandbox.network]`: the names a sandbox may reach through the server's
//! egress proxy (`allow`, the ceiling of every session's
//! `options.sandbox.network.allow`), and names pinned to addresses in the
//! proxy's own resolver (`hosts`).
//!
//! An [`AllowList`] entry is a host name (`pypi.org`), a wildcard for the
//! names under one (`*.pythonhosted.org`, which does not match
//! `pythonhosted.org` itself), or an address or CIDR. A name lets the
//! proxy connect to what it resolves to when that address is public; a
//! loopback, private, link-local or reserved address also needs an
//! address entry that holds it. A request for an address rather than a
//! name needs an address entry.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::egress::{canonical, is_host_name};

/// `[sandbox.network]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// What sessions may ask their sandbox's proxy to reach; empty (the
    /// default) gives no session an allow-list.
    pub allow: Vec<String>,
    /// Names the proxy resolves to these addresses instead of asking DNS
    /// (a package mirror on the private network, a test's listener).
    pub hosts: BTreeMap<String, String>,
}

impl NetworkConfig {
    /// The first problem found, as `(field, message)`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        AllowList::parse(&self.allow)
            .map_err(|(i, e)| (format!("sandbox.network.allow[{i}]"), e))?;
        for (name, addr) in &self.hosts {
            let field = format!("sandbox.network.hosts.{name}");
            if !is_host_name(name) {
                return Err((field, format!("{name:?} is not a host name")));
            }
            addr.trim()
                .parse::<IpAddr>()
                .map_err(|_| (field, format!("{addr:?} is not an IP address")))?;
        }
        Ok(())
    }

    /// The pinned names, lower-cased, with their addresses (entries
    /// [`NetworkConfig::validate`] refuses are left out).
    pub fn pinned(&self) -> BTreeMap<String, IpAddr> {
        self.hosts
            .iter()
            .filter_map(|(name, addr)| Some((normal(name), addr.trim().parse().ok()?)))
            .collect()
    }
}

/// One entry of an allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// Exactly this name.
    Name(String),
    /// Any name under this one (`*.example.org`: `a.example.org`,
    /// `a.b.example.org`, not `example.org`).
    Under(String),
    Net(IpNet),
}

/// The names and addresses a sandbox's proxy connects to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

impl AllowList {
    /// Reads entries; the error is the index of the first bad one and why.
    pub fn parse(entries: &[String]) -> Result<AllowList, (usize, String)> {
        let entries = entries
            .iter()
            .enumerate()
            .map(|(i, text)| parse_entry(text).map_err(|e| (i, e)))
            .collect::<Result<_, _>>()?;
        Ok(AllowList { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The index of the first of `narrower`'s entries this list does not
    /// cover, when there is one: a session may only narrow the ceiling.
    pub fn uncovered(&self, narrower: &AllowList) -> Option<usize> {
        narrower
            .entries
            .iter()
            .position(|entry| !self.entries.iter().any(|own| covers(own, entry)))
    }

    /// Whether `host` (a name, lower-cased or not) is on the list.
    pub fn allows_name(&self, host: &str) -> bool {
        let host = normal(host);
        self.entries.iter().any(|entry| match entry {
            Entry::Name(name) => *name == host,
            Entry::Under(parent) => is_under(&host, parent),
            Entry::Net(_) => false,
        })
    }

    /// Whether an address entry holds `addr`.
    pub fn names_addr(&self, addr: IpAddr) -> bool {
        let addr = canonical(addr);
        self.entries
            .iter()
            .any(|entry| matches!(entry, Entry::Net(net) if net.contains(&addr)))
    }

    /// The entries as the config spells them, normalised.
    pub fn to_strings(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|entry| match entry {
                Entry::Name(name) => name.clone(),
                Entry::Under(parent) => format!("*.{parent}"),
                Entry::Net(net) => net.to_string(),
            })
            .collect()
    }
}

fn parse_entry(text: &str) -> Result<Entry, String> {
    let trimmed = text.trim();
    if let Ok(net) = trimmed.parse::<IpNet>() {
        return Ok(Entry::Net(net.trunc()));
    }
    if let Ok(addr) = trimmed.parse::<IpAddr>() {
        return Ok(Entry::Net(IpNet::from(canonical(addr))));
    }
    let (under, name) = match trimmed.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, trimmed),
    };
    let name = normal(name);
    // A wildcard over a top-level name (`*.com`) is the whole internet
    // under another name.
    if !is_host_name(&name) || (under && !name.contains('.')) {
        return Err(format!(
            "{text:?} is not a host name, *.name (under a name with a dot), an address or a CIDR"
        ));
    }
    Ok(if under {
        Entry::Under(name)
    } else {
        Entry::Name(name)
    })
}

/// Whether ceiling entry `own` allows everything `entry` does.
fn covers(own: &Entry, entry: &Entry) -> bool {
    match (own, entry) {
        (Entry::Name(a), Entry::Name(b)) => a == b,
        (Entry::Under(parent), Entry::Name(name)) => is_under(name, parent),
        (Entry::Under(parent), Entry::Under(child)) => child == parent || is_under(child, parent),
        (Entry::Net(wide), Entry::Net(net)) => {
            wide.contains(&net.network()) && wide.prefix_len() <= net.prefix_len()
        }
        _ => false,
    }
}

fn is_under(name: &str, parent: &str) -> bool {
    name.len() > parent.len() + 1
        && name.ends_with(parent)
        && name.as_bytes()[name.len() - parent.len() - 1] == b'.'
}

fn normal(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn names_wildcards_and_nets_match_what_they_say() {
        let l = list(&["PyPI.org.", "*.pythonhosted.org", "10.1.0.0/16", "::1"]);
        assert!(l.allows_name("pypi.org"));
        assert!(!l.allows_name("evil-pypi.org"));
        assert!(!l.allows_name("pypi.org.evil.com"));
        assert!(l.allows_name("files.pythonhosted.org"));
        assert!(l.allows_name("a.b.pythonhosted.org"));
        assert!(!l.allows_name("pythonhosted.org"));
        assert!(!l.allows_name("xpythonhosted.org"));
        assert!(l.names_addr("10.1.2.3".parse().unwrap()));
        assert!(!l.names_addr("10.2.0.1".parse().unwrap()));
        assert!(l.names_addr("::1".parse().unwrap()));
        assert!(l.names_addr("::ffff:10.1.0.9".parse().unwrap()));
    }

    #[test]
    fn bad_entries_are_named_by_index() {
        let bad = |entries: &[&str]| {
            AllowList::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>())
                .unwrap_err()
                .0
        };
        assert_eq!(bad(&["ok.org", "http://x.org"]), 1);
        assert_eq!(bad(&["*.com"]), 0);
        assert_eq!(bad(&["*"]), 0);
        assert_eq!(bad(&["a..b"]), 0);
    }

    #[test]
    fn a_session_may_only_narrow_the_ceiling() {
        let ceiling = list(&["pypi.org", "*.pythonhosted.org", "10.0.0.0/8"]);
        assert_eq!(
            ceiling.uncovered(&list(&[
                "pypi.org",
                "files.pythonhosted.org",
                "*.x.pythonhosted.org",
                "*.pythonhosted.org",
                "10.1.0.0/16"
            ])),
            None
        );
        assert_eq!(
            ceiling.uncovered(&list(&["pypi.org", "github.com"])),
            Some(1)
        );
        assert_eq!(ceiling.uncovered(&list(&["*.pypi.org"])), Some(0));
        assert_eq!(ceiling.uncovered(&list(&["pythonhosted.org"])), Some(0));
        assert_eq!(ceiling.uncovered(&list(&["0.0.0.0/0"])), Some(0));
        assert_eq!(ceiling.uncovered(&list(&["11.0.0.1"])), Some(0));
        assert_eq!(
            AllowList::default().uncovered(&list(&["pypi.org"])),
            Some(0)
        );
    }

    #[test]
    fn hosts_must_be_names_and_addresses() {
        let config = |name: &str, addr: &str| NetworkConfig {
            allow: vec![],
            hosts: BTreeMap::from([(name.to_string(), addr.to_string())]),
        };
        assert!(config("pypi.test", "127.0.0.1").validate().is_ok());
        let (field, _) = config("pypi.test", "localhost").validate().unwrap_err();
        assert_eq!(field, "sandbox.network.hosts.pypi.test");
        assert!(config("a b", "127.0.0.1").validate().is_err());
        assert_eq!(
            config("PyPI.test", "127.0.0.1").pinned().get("pypi.test"),
            Some(&"127.0.0.1".parse().unwrap())
        );
    }
}
