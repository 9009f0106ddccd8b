//! The network of a local sandbox given network, as root: each exec's new
//! network namespace gets `eth0`, one end of a veth pair whose other end
//! (`cnclv-l<slot>`) stays on the host, with addresses of its own from
//! [`SUBNET`] and a default route through the host. The firewall's hook
//! ([`firewall::Hook::Veths`]) masquerades what leaves and passes it through
//! the sandbox chain, and drops connections from outside, so a sandbox's
//! listeners are on its own interfaces only, never on the host's.
//!
//! Each exec is a namespace tree of its own, so each gets a slot (a veth
//! pair and a /30), taken when its init waits at the gate and given back by
//! the kernel, which deletes the pair when the namespace dies: nothing
//! outlives the exec, even when the server is killed. The slot is the first
//! whose host-side name is free; making the pair fails when another exec
//! (of any server on the host) took it first, and the next is tried.
//!
//! The interfaces are set up with iproute2's `ip` (and `nsenter` to run it
//! in the namespace), as the firewall uses `iptables`.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use ipnet::Ipv4Net;

use crate::sandbox::firewall;

/// The host-side names: `cnclv-l<slot>`, apart from docker's
/// `cnclv-sandbox` bridge for the firewall's `cnclv-l+` match.
const VETH_PREFIX: &str = "cnclv-l";

/// Where the veths take addresses: private (so the sandbox chain refuses
/// traffic between sandboxes), and clear of docker's default pools
/// (172.17.0.0/16 to 172.31.0.0/16 and 192.168.0.0/16).
const SUBNET: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 213, 0, 0), 16);

/// Addresses per slot: a /30 holds the host's end and the sandbox's.
const SLOT_SIZE: u32 = 4;

/// How many times a slot another exec took first is given up for the next.
const TRIES: usize = 16;

/// What the firewall hooks for these sandboxes.
pub(super) fn hook() -> firewall::Hook {
    firewall::Hook::Veths {
        prefix: VETH_PREFIX.into(),
        subnet: SUBNET,
    }
}

/// Gives the network namespace of process `pid` its `eth0`, linked to the
/// host. What fails half-way is deleted.
pub(super) fn attach(pid: u32) -> io::Result<()> {
    let slots = (1u32 << (32 - SUBNET.prefix_len())) / SLOT_SIZE;
    for _ in 0..TRIES {
        let Some(slot) = (0..slots).find(|slot| !taken().contains(slot)) else {
            return Err(io::Error::other(format!(
                "all {slots} network slots of {SUBNET} are taken"
            )));
        };
        let host_end = format!("{VETH_PREFIX}{slot}");
        let made = ip(&[
            "link",
            "add",
            &host_end,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &pid.to_string(),
        ]);
        match made {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        let first = u32::from(SUBNET.network()) + slot * SLOT_SIZE;
        let (host, sandbox) = (Ipv4Addr::from(first + 1), Ipv4Addr::from(first + 2));
        let configured = batch(
            Command::new("ip").args(["-batch", "-"]),
            &format!("addr add {host}/30 dev {host_end}\nlink set {host_end} up\n"),
        )
        .and_then(|()| {
            batch(
                Command::new("nsenter").args([
                    "--target",
                    &pid.to_string(),
                    "--net",
                    "ip",
                    "-batch",
                    "-",
                ]),
                &format!(
                    "addr add {sandbox}/30 dev eth0\nlink set eth0 up\n\
                     route add default via {host}\n"
                ),
            )
        });
        if configured.is_err() {
            let _ = ip(&["link", "del", &host_end]);
        }
        return configured;
    }
    Err(io::Error::other(format!(
        "no free network slot after {TRIES} tries: other execs took each first"
    )))
}

/// The slots whose host-side veth exists.
fn taken() -> BTreeSet<u32> {
    fs::read_dir("/sys/class/net")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            entry
                .file_name()
                .to_str()?
                .strip_prefix(VETH_PREFIX)?
                .parse()
                .ok()
        })
        .collect()
}

fn ip(args: &[&str]) -> io::Result<()> {
    let output = Command::new("ip").args(args).output()?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let kind = if stderr.contains("File exists") {
        io::ErrorKind::AlreadyExists
    } else {
        io::ErrorKind::Other
    };
    Err(io::Error::new(
        kind,
        format!("ip {}: {}", args.join(" "), stderr.trim()),
    ))
}

/// Runs `command` with `script` as its stdin.
fn batch(command: &mut Command, script: &str) -> io::Result<()> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{script:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}
