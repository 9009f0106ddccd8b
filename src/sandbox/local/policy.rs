//! Landlock and seccomp rules for every exec: defence in depth behind the
//! mount namespace and the dropped capabilities.

use hakoniwa::landlock::{CompatMode, FsAccess, Resource, Ruleset};
use hakoniwa::seccomp::{Action, Arch, ArgCmp, ArgCmpOp, Filter};

use crate::sandbox::WORKSPACE;

/// Landlock: read everything that is mounted (the mount namespace already
/// hides the rest of the host), execute only system and sandbox files and
/// the exec helper, write only the workspace, `/tmp`, `/dev/shm`, the usual
/// devices and `/proc`.
pub(super) fn landlock_rules(system_dirs: &[&str], helper_dir: &str) -> Ruleset {
    let (r, w, x) = (FsAccess::R, FsAccess::W, FsAccess::X);
    let mut rules = Ruleset::default();
    rules.restrict(Resource::FS, CompatMode::Enforce);
    rules.allow_path("/", r);
    for dir in system_dirs.iter().chain([&helper_dir]) {
        rules.allow_path(dir, r | x);
    }
    // The devices themselves, not `/dev`: without root the sandbox's uid
    // owns the tmpfs hakoniwa builds `/dev` on.
    rules.allow_path("/dev", r);
    for device in [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/dev/tty",
        "/dev/pts",
        "/dev/shm",
    ] {
        rules.allow_path(device, r | w);
    }
    rules.allow_path("/proc", r | w);
    rules.allow_path("/tmp", r | w | x);
    rules.allow_path(WORKSPACE, r | w | x);
    rules
}

/// Seccomp: allow by default and refuse, with EPERM, the system calls
/// Docker's default profile refuses to a container without capabilities:
/// new namespaces (a user namespace would hand the sandbox root inside it),
/// mounts, kernel modules and keyrings, BPF, perf, userfaultfd, io_uring,
/// clock and swap changes; and typing into a terminal (TIOCSTI, TIOCLINUX).
/// Most need capabilities the sandbox lacks anyway; this keeps the kernel
/// code behind them out of reach.
pub(super) fn seccomp_filter() -> Filter {
    const DENIED: [&str; 48] = [
        "acct",
        "add_key",
        "bpf",
        "clock_adjtime",
        "clock_settime",
        "create_module",
        "delete_module",
        "finit_module",
        "fsconfig",
        "fsmount",
        "fsopen",
        "fspick",
        "get_kernel_syms",
        "init_module",
        "io_uring_enter",
        "io_uring_register",
        "io_uring_setup",
        "ioperm",
        "iopl",
        "kcmp",
        "kexec_file_load",
        "kexec_load",
        "keyctl",
        "lookup_dcookie",
        "mount",
        "mount_setattr",
        "move_mount",
        "name_to_handle_at",
        "nfsservctl",
        "open_by_handle_at",
        "open_tree",
        "perf_event_open",
        "pivot_root",
        "query_module",
        "quotactl",
        "reboot",
        "request_key",
        "setns",
        "settimeofday",
        "swapoff",
        "swapon",
        "syslog",
        "umount2",
        "unshare",
        "uselib",
        "userfaultfd",
        "vm86",
        "vm86old",
    ];
    const NAMESPACE_FLAGS: [i32; 7] = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWCGROUP,
    ];
    let eperm = Action::Errno(libc::EPERM);
    // Only the native ABI: calls through another (int 0x80 on x86_64) hit
    // libseccomp's bad-arch action and kill the process.
    let mut filter = Filter::new(Action::Allow);
    filter.add_arch(Arch::Native);
    for name in DENIED {
        filter.add_rule(eperm, name);
    }
    for flag in NAMESPACE_FLAGS {
        let flag = flag as u64;
        filter.add_rule_conditional(
            eperm,
            "clone",
            &[ArgCmp::new(0, ArgCmpOp::MaskedEq, flag, flag)],
        );
    }
    // Typing into a terminal (TIOCSTI) and the console's ioctls (TIOCLINUX
    // can also type): a sandbox has no terminal of its own, and must never
    // push input to one of the host's. The kernel reads the request as a
    // 32-bit int, so only the low half is compared.
    for request in [libc::TIOCSTI, libc::TIOCLINUX] {
        filter.add_rule_conditional(
            eperm,
            "ioctl",
            &[ArgCmp::new(
                1,
                ArgCmpOp::MaskedEq,
                u64::from(u32::MAX),
                request,
            )],
        );
    }
    // clone3 passes its flags in memory, out of a filter's sight; ENOSYS
    // makes libc fall back to clone, whose flags the rules above see.
    filter.add_rule(Action::Errno(libc::ENOSYS), "clone3");
    filter
}
