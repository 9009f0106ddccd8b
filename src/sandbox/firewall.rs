//! What a sandbox given network may reach: the internet, and nothing of its
//! host or the networks around it unless `sandbox.network_allow` lists it.
//!
//! One iptables chain (and its ip6tables twin), `CONCLAVE-SANDBOX`, holds
//! the rules: the allowed CIDRs return at once; the host's own addresses
//! (any `LOCAL` destination), loopback, private (RFC 1918, CGNAT, ULA),
//! link-local (the cloud metadata service at 169.254.169.254), multicast
//! and reserved ranges are rejected; the rest returns. Traffic enters the
//! chain by the backend's hook:
//!
//! - docker: sandboxes with network sit on a bridge network of their own
//!   ([`DOCKER_NETWORK`], no traffic between containers); its forwarded
//!   traffic passes the chain from `DOCKER-USER`, and what it sends to the
//!   host itself from `INPUT`;
//! - local (as root): each sandbox runs as a uid of its own range, and
//!   `OUTPUT` sends that range's traffic through the chain.
//!
//! The rules are written at start-up when `sandbox.allow_network` is on,
//! and stay when the server stops (they only ever narrow what sandboxes
//! reach). Servers on one host share the chain: the last to start wins.
//! Kubernetes sandboxes are held by the NetworkPolicies in
//! `deploy/kubernetes/` instead.

use std::process::Command;

/// The chain, in `filter`, for IPv4 and IPv6 alike.
const CHAIN: &str = "CONCLAVE-SANDBOX";
/// The docker network of sandboxes given network, and its bridge.
pub const DOCKER_NETWORK: &str = "conclave-sandbox";
pub const DOCKER_BRIDGE: &str = "cnclv-sandbox";

const BLOCKED_V4: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
];
const BLOCKED_V6: &[&str] = &[
    "::1/128",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

pub use crate::config::parse_net;

/// Where a backend's sandbox traffic enters the chain.
#[derive(Debug, Clone)]
pub enum Hook {
    /// Forwarded and host-bound traffic of a docker bridge.
    Bridge(String),
    /// Traffic of processes of these host uids (first, last).
    Uids(u32, u32),
}

/// Writes the chain with `allow` (CIDRs) first and sends `hook`'s traffic
/// through it, for IPv4 and, where the host has it, IPv6.
pub fn install(allow: &[ipnet::IpNet], hook: &Hook) -> Result<(), String> {
    for (tool, v6) in [("iptables", false), ("ip6tables", true)] {
        let blocked = if v6 { BLOCKED_V6 } else { BLOCKED_V4 };
        let ours = allow.iter().filter(|net| net.addr().is_ipv6() == v6);
        match install_family(tool, ours, blocked, hook) {
            Ok(()) => {}
            // The docker network has no IPv6; a host without ip6tables (or
            // docker's IPv6 chains) is the one case left open, and said.
            Err(e) if v6 => {
                tracing::warn!(error = %e, "sandbox IPv6 traffic is not filtered");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn install_family<'a>(
    tool: &str,
    allow: impl Iterator<Item = &'a ipnet::IpNet>,
    blocked: &[&str],
    hook: &Hook,
) -> Result<(), String> {
    // `-N` fails when the chain exists; `-F` then empties it.
    let _ = run(tool, &["-N", CHAIN]);
    run(tool, &["-F", CHAIN])?;
    for net in allow {
        run(tool, &["-A", CHAIN, "-d", &net.to_string(), "-j", "RETURN"])?;
    }
    // Name resolution through the host's resolver (a local stub such as
    // 127.0.0.53), when the sandbox shares its resolv.conf.
    for protocol in ["udp", "tcp"] {
        run(
            tool,
            &[
                "-A",
                CHAIN,
                "-p",
                protocol,
                "--dport",
                "53",
                "-m",
                "addrtype",
                "--dst-type",
                "LOCAL",
                "-j",
                "RETURN",
            ],
        )?;
    }
    run(
        tool,
        &[
            "-A",
            CHAIN,
            "-m",
            "addrtype",
            "--dst-type",
            "LOCAL",
            "-j",
            "REJECT",
        ],
    )?;
    for net in blocked {
        run(tool, &["-A", CHAIN, "-d", net, "-j", "REJECT"])?;
    }
    let rules: Vec<Vec<String>> = match hook {
        Hook::Bridge(bridge) => ["DOCKER-USER", "INPUT"]
            .iter()
            .map(|chain| words(&[chain, "-i", bridge, "-j", CHAIN]))
            .collect(),
        Hook::Uids(first, last) => vec![words(&[
            "OUTPUT",
            "-m",
            "owner",
            "--uid-owner",
            &format!("{first}-{last}"),
            "-j",
            CHAIN,
        ])],
    };
    for rule in rules {
        let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
        let mut check = vec!["-C"];
        check.extend(&rule);
        if run(tool, &check).is_err() {
            let mut insert = vec!["-I"];
            insert.extend(&rule);
            run(tool, &insert)?;
        }
    }
    Ok(())
}

fn words(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

fn run(tool: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(tool)
        .args(["-w", "5"])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {tool}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{tool} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
