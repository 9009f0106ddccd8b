//! The few system calls the local backend makes itself rather than through
//! hakoniwa: pidfds, so that a kill can never reach a recycled pid; loopback
//! up, as `--network none` gives a container; and the landlock and euid checks made at start-up.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A handle on one process that keeps naming it after it exits, unlike its
/// pid, which the kernel may hand to a new process once the old one is reaped.
#[derive(Debug)]
pub(super) struct PidFd(OwnedFd);

impl PidFd {
    /// `Ok(None)` when no process has that pid any more.
    pub(super) fn open(pid: u32) -> io::Result<Option<PidFd>> {
        // SAFETY: pidfd_open(2) reads no memory; it returns a new descriptor
        // or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::ESRCH) => Ok(None),
                _ => Err(err),
            };
        }
        // SAFETY: the kernel just created this descriptor; nothing else owns it.
        Ok(Some(PidFd(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })))
    }

    /// Sends SIGKILL. A process that has already exited is not an error: the
    /// caller wants it gone, and it is.
    pub(super) fn kill(&self) {
        // SAFETY: a null siginfo is allowed and makes the kernel fill in the
        // same fields kill(2) would; the descriptor is owned by `self`.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ESRCH) {
                tracing::warn!(error = %err, "cannot kill a sandbox process");
            }
        }
    }

    /// Resolves when the process has exited: a pidfd polls readable then.
    pub(super) async fn exited(self) {
        // SAFETY: a PidFd owns its descriptor, never replaces it, and
        // closes it only when dropped, so it stays valid and the same for
        // the AsyncFd's lifetime.
        let Ok(fd) = (unsafe { AsyncFd::register_with_interest(self, Interest::READABLE) }) else {
            // Registration only fails when the reactor is gone, and then
            // there is no one left to wait for.
            return;
        };
        if let Ok(mut guard) = fd.readable().await {
            guard.retain_ready();
        }
    }
}

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Brings up `lo` in the caller's network namespace, which a new namespace
/// has down. Needs CAP_NET_ADMIN there.
pub(super) fn loopback_up() -> io::Result<()> {
    // SAFETY: socket(2) takes no pointers and returns a new descriptor or -1.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just created this descriptor; nothing else owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write the flags member
    // of the ifreq passed, which lives for both calls.
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) != 0 {
            return Err(io::Error::last_os_error());
        }
        request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether the kernel has landlock (the ABI version is at least 1).
pub(super) fn landlock_supported() -> bool {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and this flag the call
    // only returns the ABI version (or -1); it touches no memory.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    abi >= 1
}

/// Whether this process runs as root, which decides between per-sandbox
/// host uids (root) and a user namespace (anyone else).
pub(super) fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// The pids of `parent`'s children.
pub(super) fn children(parent: u32) -> io::Result<Vec<u32>> {
    match fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")) {
        Ok(list) => Ok(list
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()),
        // Kernels built without CONFIG_PROC_CHILDREN lack the file; every
        // process's stat names its parent, so scan them instead.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut pids = Vec::new();
            for entry in fs::read_dir("/proc")? {
                let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) else {
                    continue;
                };
                if stat_fields(pid).is_some_and(|(_, ppid)| ppid == parent) {
                    pids.push(pid);
                }
            }
            Ok(pids)
        }
        Err(e) => Err(e),
    }
}

/// Whether `pid` is a zombie: it has exited and waits for its parent to
/// reap it, so killing it again changes nothing.
pub(super) fn is_zombie(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|(state, _)| state == 'Z')
}

/// The state letter and parent pid from `/proc/PID/stat`.
fn stat_fields(pid: u32) -> Option<(char, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in parentheses may hold spaces and parentheses of its
    // own; the fields after the last ')' are fixed.
    let mut rest = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((state, ppid))
}
