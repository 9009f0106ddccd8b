//! What a sandbox given network may reach: the internet, and nothing of its
//! host or the networks around it unless `sandbox.network_allow` lists it.
//!
//! One iptables chain (and its ip6tables twin), `CONCLAVE-SANDBOX`, holds
//! the rules: the allowed CIDRs, and port 53 of the host's name servers
//! ([`resolvers`]), return at once; the host's own addresses (any `LOCAL`
//! destination) and every range of [`crate::egress::NOT_PUBLIC`]
//! (loopback, private, link-local with the cloud metadata service,
//! multicast, documentation and other reserved ranges: the list the
//! server's own outbound connections are checked against) are rejected;
//! the rest returns. Traffic enters the chain by the backend's hook:
//!
//! - docker: sandboxes with network sit on a bridge network of their own
//!   ([`DOCKER_NETWORK`], no traffic between containers); its forwarded
//!   traffic passes the chain from `DOCKER-USER`, and what it sends to the
//!   host itself from `INPUT`;
//! - local (as root): each exec of a sandbox given network has a network
//!   namespace of its own, linked to the host by a veth pair
//!   ([`Hook::Veths`]); what it sends to the host passes the chain from
//!   `INPUT`, what it forwards passes `CONCLAVE-LOCAL` from `FORWARD`
//!   (the chain, then accept; connections from outside in are dropped),
//!   and `nat` `POSTROUTING` masquerades it on the way out.
//!
//! The rules are written at start-up when `sandbox.allow_network` is on,
//! and stay when the server stops (they only ever narrow what sandboxes
//! reach). Servers on one host share the chain: the last to start wins.
//! Kubernetes sandboxes are held by the NetworkPolicies in
//! `deploy/kubernetes/` instead.

use std::net::IpAddr;
use std::process::Command;

use crate::egress::NOT_PUBLIC;

/// The chain, in `filter`, for IPv4 and IPv6 alike.
const CHAIN: &str = "CONCLAVE-SANDBOX";
/// The chain local sandboxes' forwarded traffic passes.
const LOCAL_CHAIN: &str = "CONCLAVE-LOCAL";
/// The docker network of sandboxes given network, and its bridge.
pub const DOCKER_NETWORK: &str = "conclave-sandbox";
pub const DOCKER_BRIDGE: &str = "cnclv-sandbox";

/// Where the host's resolver is named; one on loopback (a local stub) is
/// out of a network namespace's reach, and systemd-resolved lists the
/// servers behind its stub in [`UPSTREAM_RESOLV_CONF`].
const RESOLV_CONF: &str = "/etc/resolv.conf";
const UPSTREAM_RESOLV_CONF: &str = "/run/systemd/resolve/resolv.conf";

pub use crate::config::parse_net;

/// Where a backend's sandbox traffic enters the chain.
#[derive(Debug, Clone)]
pub enum Hook {
    /// Forwarded and host-bound traffic of a docker bridge.
    Bridge(String),
    /// Forwarded and host-bound traffic of the local backend's veth pairs
    /// (see [`crate::sandbox::local`]): interfaces named `<prefix>*`, whose
    /// sandbox ends take addresses of `subnet`, masqueraded on the way out.
    Veths {
        prefix: String,
        subnet: ipnet::Ipv4Net,
    },
}

/// The name servers a sandbox in a network namespace of its own can use:
/// the host's, less loopback stubs (the upstream servers of
/// systemd-resolved's stub stand in for it).
pub fn resolvers() -> Vec<IpAddr> {
    let listed = |path: &str| -> Vec<IpAddr> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.strip_prefix("nameserver"))
            .filter_map(|addr| addr.trim().parse().ok())
            .filter(|addr: &IpAddr| !addr.is_loopback())
            .collect()
    };
    let servers = listed(RESOLV_CONF);
    if servers.is_empty() {
        listed(UPSTREAM_RESOLV_CONF)
    } else {
        servers
    }
}

/// Writes the chain with `allow` (CIDRs) first and sends `hook`'s traffic
/// through it, for IPv4 and, where the host has it, IPv6.
pub fn install(allow: &[ipnet::IpNet], hook: &Hook) -> Result<(), String> {
    let resolvers = resolvers();
    for (tool, v6) in [("iptables", false), ("ip6tables", true)] {
        let ours: Vec<_> = allow
            .iter()
            .filter(|net| net.addr().is_ipv6() == v6)
            .cloned()
            .collect();
        let servers: Vec<_> = resolvers
            .iter()
            .filter(|addr| addr.is_ipv6() == v6)
            .cloned()
            .collect();
        match install_family(tool, &chain_rules(&ours, &servers, v6), hook, v6) {
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

/// The chain's rules, in order, as `iptables -A` arguments: the allowed
/// CIDRs and name servers return; the host itself and every range
/// [`NOT_PUBLIC`] lists of the family are rejected; the rest returns.
fn chain_rules(allow: &[ipnet::IpNet], resolvers: &[IpAddr], v6: bool) -> Vec<Vec<String>> {
    let mut rules = Vec::new();
    for net in allow {
        rules.push(words(&[
            "-A",
            CHAIN,
            "-d",
            &net.to_string(),
            "-j",
            "RETURN",
        ]));
    }
    for server in resolvers {
        for protocol in ["udp", "tcp"] {
            rules.push(words(&[
                "-A",
                CHAIN,
                "-d",
                &server.to_string(),
                "-p",
                protocol,
                "--dport",
                "53",
                "-j",
                "RETURN",
            ]));
        }
    }
    rules.push(words(&[
        "-A",
        CHAIN,
        "-m",
        "addrtype",
        "--dst-type",
        "LOCAL",
        "-j",
        "REJECT",
    ]));
    for (net, _) in NOT_PUBLIC {
        if net.contains(':') == v6 {
            rules.push(words(&["-A", CHAIN, "-d", net, "-j", "REJECT"]));
        }
    }
    rules
}

fn install_family(tool: &str, chain: &[Vec<String>], hook: &Hook, v6: bool) -> Result<(), String> {
    // `-N` fails when the chain exists; `-F` then empties it.
    let _ = run(tool, &["-N", CHAIN]);
    run(tool, &["-F", CHAIN])?;
    for rule in chain {
        run(tool, &strs(rule))?;
    }
    let hooks: Vec<Vec<String>> = match hook {
        Hook::Bridge(bridge) => ["DOCKER-USER", "INPUT"]
            .iter()
            .map(|chain| words(&[chain, "-i", bridge, "-j", CHAIN]))
            .collect(),
        Hook::Veths { prefix, subnet } => {
            let veths = format!("{prefix}+");
            // Forwarded traffic passes a chain of its own, which accepts
            // what CHAIN lets through (a host with docker drops forwarded
            // traffic by default) and drops connections from outside.
            let _ = run(tool, &["-N", LOCAL_CHAIN]);
            run(tool, &["-F", LOCAL_CHAIN])?;
            for rule in [
                words(&["-i", &veths, "-j", CHAIN]),
                words(&["-i", &veths, "-j", "ACCEPT"]),
                words(&[
                    "-o",
                    &veths,
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "RELATED,ESTABLISHED",
                    "-j",
                    "ACCEPT",
                ]),
                words(&["-o", &veths, "-j", "DROP"]),
            ] {
                let mut append = vec!["-A", LOCAL_CHAIN];
                append.extend(strs(&rule));
                run(tool, &append)?;
            }
            let mut hooks = vec![
                words(&["INPUT", "-i", &veths, "-j", CHAIN]),
                words(&["FORWARD", "-i", &veths, "-j", LOCAL_CHAIN]),
                words(&["FORWARD", "-o", &veths, "-j", LOCAL_CHAIN]),
            ];
            if !v6 {
                hooks.push(words(&[
                    "-t",
                    "nat",
                    "POSTROUTING",
                    "-s",
                    &subnet.to_string(),
                    "!",
                    "-o",
                    &veths,
                    "-j",
                    "MASQUERADE",
                ]));
                forward_ipv4()?;
            }
            hooks
        }
    };
    for rule in hooks {
        let rule = strs(&rule);
        // `-t nat` comes before the command.
        let (table, rule) = match rule.as_slice() {
            ["-t", table, rest @ ..] => (vec!["-t", *table], rest.to_vec()),
            _ => (Vec::new(), rule),
        };
        let with = |command: &'static str| {
            let mut args = table.clone();
            args.push(command);
            args.extend(&rule);
            args
        };
        if run(tool, &with("-C")).is_err() {
            run(tool, &with("-I"))?;
        }
    }
    Ok(())
}

/// Turns on IPv4 forwarding, which the local backend's sandboxes need to
/// reach past the host (docker turns it on for its own).
fn forward_ipv4() -> Result<(), String> {
    const SYSCTL: &str = "/proc/sys/net/ipv4/ip_forward";
    if std::fs::read_to_string(SYSCTL).is_ok_and(|on| on.trim() == "1") {
        return Ok(());
    }
    tracing::info!("turning on IPv4 forwarding for local sandboxes given network");
    std::fs::write(SYSCTL, "1").map_err(|e| format!("cannot turn on {SYSCTL}: {e}"))
}

fn strs(words: &[String]) -> Vec<&str> {
    words.iter().map(String::as_str).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The ranges a `-j REJECT` rule of the chain names.
    fn rejected(v6: bool) -> Vec<ipnet::IpNet> {
        chain_rules(&[], &[], v6)
            .iter()
            .filter_map(|rule| match strs(rule).as_slice() {
                ["-A", CHAIN, "-d", net, "-j", "REJECT"] => net.parse().ok(),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_chain_rejects_every_range_egress_refuses() {
        let (v4, v6) = (rejected(false), rejected(true));
        for (net, kind) in NOT_PUBLIC {
            let net: ipnet::IpNet = net.parse().expect("a CIDR");
            let rules = if net.addr().is_ipv6() { &v6 } else { &v4 };
            assert!(rules.contains(&net), "{kind} {net} is not rejected");
        }
        assert_eq!(v4.len() + v6.len(), NOT_PUBLIC.len());
        // The documentation ranges, one of them this host's own LAN, which
        // the chain once missed.
        for net in ["192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"] {
            assert!(v4.contains(&net.parse().expect("a CIDR")), "{net}");
        }
    }

    #[test]
    fn allowed_nets_and_name_servers_return_before_any_reject() {
        let allow: Vec<ipnet::IpNet> = vec!["10.1.2.0/24".parse().expect("a CIDR")];
        let servers: Vec<IpAddr> = vec!["10.255.255.53".parse().expect("an address")];
        let rules: Vec<String> = chain_rules(&allow, &servers, false)
            .iter()
            .map(|rule| rule.join(" "))
            .collect();
        let first_reject = rules.iter().position(|r| r.ends_with("REJECT"));
        assert_eq!(
            rules[..first_reject.expect("rejects")],
            [
                format!("-A {CHAIN} -d 10.1.2.0/24 -j RETURN"),
                format!("-A {CHAIN} -d 10.255.255.53 -p udp --dport 53 -j RETURN"),
                format!("-A {CHAIN} -d 10.255.255.53 -p tcp --dport 53 -j RETURN"),
            ]
        );
    }
}
