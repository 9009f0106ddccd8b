//! What an exec of a local sandbox sees and may do, as a hakoniwa
//! [`Container`]: the file system view, namespaces, identity, the rlimits
//! that stand in for missing cgroups, and what the container's init does
//! itself before it runs the command.
//!
//! The view matches a Docker container run `--read-only --tmpfs /tmp
//! --cap-drop ALL --user <uid>` over an image made of the host's own system
//! directories: `/usr`, `/bin`, `/lib`, `/lib64`, `/sbin` and a few files of
//! `/etc`, read-only; `/workspace` read-write; `/tmp` the sandbox's own
//! directory, which like a container's tmpfs lasts as long as the sandbox
//! (see [`Layout::tmp`]); a size-limited tmpfs on `/dev/shm`; a minimal
//! `/dev`; a new `/proc`. Nothing else of the host (its home directories,
//! the data directory, other sandboxes) exists inside.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hakoniwa::{Command, Container, MountOptions, Namespace, Rlimit, Runctl, Stdio};

use super::{policy, sys};
use crate::sandbox::{ExecRequest, SandboxSpec, WORKSPACE, firewall};

/// The uid (and gid) processes have inside a user namespace when the server
/// is not root, as `--user 1000` gives in a container.
pub(super) const MAPPED_UID: u32 = 1000;

/// The user name the sandbox's uid has in its `/etc/passwd`.
const USER: &str = "sandbox";

/// Docker's default `PATH`.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Host directories shared read-only (or as the symlinks they are on hosts
/// with a merged `/usr`).
const SYSTEM_DIRS: [&str; 5] = ["/usr", "/bin", "/lib", "/lib64", "/sbin"];

/// Host files and directories of `/etc` that programs need to load
/// libraries, resolve names, find certificates and know the time zone.
/// `passwd`, `group` and `hosts` are written per sandbox instead, so the
/// host's users and names do not show.
const ETC_SHARED: [&str; 7] = [
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/ssl/certs",
];

/// `sh` starts every exec: it first reads one line from stdin, which the
/// server writes only once the process is in the sandbox's cgroups, so no
/// user code ever runs outside them. Then it runs the command, looked up in
/// `PATH` as a container runtime would (127 when not found), and exits with
/// its status. It stays as the pid namespace's init rather than exec'ing
/// the command, so the command is an ordinary process, as under `docker
/// exec`: signals it sends itself take effect, and orphans are reaped.
const GATE: &str = r#"read -r _ || exit 125; "$@""#;

/// Where a sandbox sees the directory holding the exec helper
/// ([`Layout::helper_dir`]), read-only.
pub(super) const HELPER_DIR: &str = "/.conclave";

/// The exec helper's file name in that directory.
pub(super) const HELPER_FILE: &str = "conclave-exec";

/// Docker's `/dev/shm` size.
const SHM_BYTES: u64 = 64 * 1024 * 1024;

/// Who a sandbox's processes run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Identity {
    /// The server is root: the processes switch to this host uid and gid,
    /// one per sandbox, before the command starts.
    HostUid(u32),
    /// The server is not root: a user namespace maps the server's uid to
    /// [`MAPPED_UID`].
    Mapped,
}

impl Identity {
    /// The uid processes see for themselves.
    pub(super) fn uid(self) -> u32 {
        match self {
            Identity::HostUid(uid) => uid,
            Identity::Mapped => MAPPED_UID,
        }
    }
}

/// Where a sandbox's files live on the host: `<root>/<id>/`.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    pub(super) dir: PathBuf,
}

impl Layout {
    pub(super) fn workspace(&self) -> PathBuf {
        self.dir.join("workspace")
    }

    /// A fresh directory name for one exec's root: empty but for mount
    /// points, read-only inside. Each exec needs its own, as hakoniwa
    /// creates and removes a directory of a fixed name in it while pivoting.
    pub(super) fn exec_root(&self) -> PathBuf {
        self.dir
            .join("run")
            .join(uuid::Uuid::new_v4().simple().to_string())
    }

    /// The sandbox's `/tmp`, shared by its execs as a container's is. The
    /// backend mounts a tmpfs of `disk_mb` here when it runs as root;
    /// otherwise it is a plain directory on the host's disk.
    pub(super) fn tmp(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// The generated `passwd`, `group`, `hosts` and `resolv.conf`.
    fn etc(&self) -> PathBuf {
        self.dir.join("etc")
    }

    pub(super) fn meta(&self) -> PathBuf {
        self.dir.join("meta.json")
    }

    /// The directory beside the sandboxes that holds the exec helper
    /// (`<root>/.exec/`), shared by all of them; see `resident`.
    pub(super) fn helper_dir(&self) -> PathBuf {
        self.dir.with_file_name(".exec")
    }

    /// Creates the directories and the generated `/etc` files. The
    /// workspace belongs to the sandbox's uid so it can write there.
    pub(super) fn prepare(&self, identity: Identity, hostname: &str) -> io::Result<()> {
        let mut private = fs::DirBuilder::new();
        private.mode(0o700);
        private.create(&self.dir)?;
        private.create(self.etc())?;
        private.create(self.dir.join("run"))?;
        // The sandbox's uid works in here.
        fs::DirBuilder::new().mode(0o755).create(self.workspace())?;
        fs::DirBuilder::new().mode(0o755).create(self.tmp())?;
        // Not through DirBuilder: the umask would take the sticky and
        // other-write bits off.
        fs::set_permissions(self.tmp(), fs::Permissions::from_mode(0o1777))?;
        if let Identity::HostUid(uid) = identity {
            std::os::unix::fs::chown(self.workspace(), Some(uid), Some(uid))?;
        }
        let uid = identity.uid();
        let files = [
            (
                "passwd",
                format!(
                    "root:x:0:0:root:/root:/usr/sbin/nologin\n\
                     nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
                     {USER}:x:{uid}:{uid}:{USER}:{WORKSPACE}:/bin/sh\n"
                ),
            ),
            (
                "group",
                format!("root:x:0:\nnogroup:x:65534:\n{USER}:x:{uid}:\n"),
            ),
            (
                "resolv.conf",
                firewall::resolvers()
                    .iter()
                    .map(|server| format!("nameserver {server}\n"))
                    .collect(),
            ),
            (
                "hosts",
                format!(
                    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
                     127.0.1.1\t{hostname}\n"
                ),
            ),
        ];
        for (name, contents) in files {
            let path = self.etc().join(name);
            fs::write(&path, contents)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
        }
        Ok(())
    }
}

/// Which limits the host's cgroups do not cover and rlimits must.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Fallbacks {
    /// RLIMIT_AS: a poor memory limit (it counts address space, not memory),
    /// but the only one without a memory cgroup.
    pub(super) memory: bool,
    /// RLIMIT_NPROC, which counts the processes of the sandbox's uid.
    pub(super) pids: bool,
    /// RLIMIT_CPU per exec: the CPU seconds `cpus` would allow over the
    /// exec's timeout. It kills rather than throttles.
    pub(super) cpu: bool,
}

/// The container every exec of one sandbox is started in.
#[derive(Debug, Clone)]
pub(super) struct Jail {
    container: Container,
    identity: Identity,
    /// Whether the exec has a network namespace of its own, whose loopback
    /// interface must be brought up.
    private_network: bool,
    /// Whether that namespace gets an interface to the host (`net`).
    veth: bool,
    cpu_rlimit_cpus: Option<f64>,
    env: BTreeMap<String, String>,
    /// The egress proxy's allow-list: its listener is bound in each exec's
    /// network namespace.
    egress: Option<crate::config::AllowList>,
}

impl Jail {
    pub(super) fn new(
        layout: &Layout,
        hostname: &str,
        identity: Identity,
        spec: &SandboxSpec,
        landlock: bool,
        fallbacks: Fallbacks,
        cgroup_views: &[(String, PathBuf)],
    ) -> Jail {
        let mut c = Container::empty();
        for namespace in [
            Namespace::Mount,
            Namespace::Pid,
            Namespace::Ipc,
            Namespace::Uts,
        ] {
            c.unshare(namespace);
        }
        c.hostname(hostname);
        // A bind mount whose source carries locked flags (nodev, noexec …)
        // cannot be remounted read-only with fewer flags in a user
        // namespace; hakoniwa then retries keeping them.
        c.runctl(Runctl::MountFallback);

        let mut readable = Vec::new();
        for dir in SYSTEM_DIRS {
            let host = Path::new(dir);
            if let Ok(target) = fs::read_link(host) {
                c.symlink(&target.to_string_lossy(), dir);
                readable.push(dir);
            } else if host.is_dir() {
                c.bindmount_ro(dir, dir);
                readable.push(dir);
            }
        }
        let mut etc: Vec<String> = ETC_SHARED.iter().map(|p| p.to_string()).collect();
        // Python's per-version configuration (`/etc/python3`, `/etc/python3.11`).
        if let Ok(entries) = fs::read_dir("/etc") {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("python3") {
                    etc.push(format!("/etc/{name}"));
                }
            }
        }
        // As root, a sandbox given network has a namespace of its own and
        // an interface to the host (see `net`); otherwise it shares the host's.
        let veth = spec.network && matches!(identity, Identity::HostUid(_));
        if spec.network && !veth {
            // Only useful, and only meaningful, with the host's network.
            etc.push("/etc/resolv.conf".into());
        }
        for path in etc {
            // `exists` follows symlinks: a dangling one would fail the mount.
            if Path::new(&path).exists() {
                c.bindmount_ro(&path, &path);
            }
        }
        let generated: &[&str] = if veth {
            &["passwd", "group", "hosts", "resolv.conf"]
        } else {
            &["passwd", "group", "hosts"]
        };
        for name in generated {
            let host = layout.etc().join(name);
            c.bindmount_ro(&host.to_string_lossy(), &format!("/etc/{name}"));
        }
        let workspace = layout.workspace();
        c.bindmount_rw(&workspace.to_string_lossy(), WORKSPACE);
        c.bindmount_ro(&layout.helper_dir().to_string_lossy(), HELPER_DIR);
        // The sandbox's own cgroups, read-only, where a container has them:
        // programs size themselves from the limits there.
        for (target, dir) in cgroup_views {
            c.bindmount_ro(&dir.to_string_lossy(), target);
        }
        c.devfsmount("/dev");
        c.procfsmount("/proc");
        c.bindmount_rw(&layout.tmp().to_string_lossy(), "/tmp");
        c.mount(
            "tmpfs",
            "/dev/shm",
            "tmpfs",
            MountOptions::NOSUID | MountOptions::NODEV,
            Some(format!("mode=1777,size={SHM_BYTES}")),
        );

        if let Identity::Mapped = identity {
            c.unshare(Namespace::User);
            c.uidmap(MAPPED_UID).gidmap(MAPPED_UID);
        }
        if !spec.network || veth {
            c.unshare(Namespace::Network);
        }

        if landlock {
            c.landlock_ruleset(policy::landlock_rules(&readable, HELPER_DIR));
        }
        c.seccomp_filter(policy::seccomp_filter());

        // Core dumps would land in the workspace (or go to the host's
        // handler), which no one asked for.
        c.setrlimit(Rlimit::Core, 0, 0);
        if spec.disk_mb > 0 {
            // A file bigger than the disk fails as on a full disk, also
            // where (not root) no tmpfs caps the workspace's total size.
            let bytes = spec.disk_mb * 1024 * 1024;
            c.setrlimit(Rlimit::Fsize, bytes, bytes);
        }
        if fallbacks.memory && spec.memory_mb > 0 {
            let bytes = spec.memory_mb * 1024 * 1024;
            c.setrlimit(Rlimit::As, bytes, bytes);
        }
        if fallbacks.pids && spec.pids > 0 {
            c.setrlimit(Rlimit::Nproc, spec.pids.into(), spec.pids.into());
        }

        let mut env = BTreeMap::from([
            ("PATH".to_string(), PATH.to_string()),
            ("HOME".to_string(), WORKSPACE.to_string()),
            ("HOSTNAME".to_string(), hostname.to_string()),
        ]);
        env.extend(spec.env.clone());
        Jail {
            container: c,
            identity,
            private_network: !spec.network || veth,
            veth,
            cpu_rlimit_cpus: (fallbacks.cpu && spec.cpus > 0.0).then_some(spec.cpus),
            env,
            egress: spec.egress.clone(),
        }
    }

    /// Whether each exec's network namespace must be linked to the host
    /// before the command runs.
    pub(super) fn veth(&self) -> bool {
        self.veth
    }

    /// Whether each exec must run in a container of its own: the CPU limit
    /// is an rlimit set per exec (no cpu cgroup), which a resident helper
    /// would spend across all of them.
    pub(super) fn per_exec_limits(&self) -> bool {
        self.cpu_rlimit_cpus.is_some()
    }

    /// The allow-list of the egress proxy each exec reaches.
    pub(super) fn egress(&self) -> Option<&crate::config::AllowList> {
        self.egress.as_ref()
    }

    /// The command for one exec in root directory `root` (see
    /// [`Layout::exec_root`]): the gate shell running `request.command`,
    /// with pipes for all three streams.
    pub(super) fn command(&self, request: &ExecRequest, root: &Path) -> Result<Command, String> {
        let mut argv: Vec<String> = ["sh", "-c", GATE, "sh"].map(String::from).into();
        argv.extend(request.command.iter().cloned());
        let mut env = self.env.clone();
        env.extend(request.env.clone());
        let mut command = self.launcher(root, request.timeout, "/bin/sh", argv, &env)?;
        command
            .current_dir(Path::new(WORKSPACE).join(&request.workdir))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(command)
    }

    /// The container the sandbox's resident exec helper runs in: the gate
    /// shell stays its pid namespace's init (reaping what runs leave
    /// behind) and runs the helper, which talks over the three pipes.
    pub(super) fn resident_command(&self, root: &Path) -> Result<Command, String> {
        let helper = format!("{HELPER_DIR}/{HELPER_FILE}");
        let argv: Vec<String> = ["sh", "-c", GATE, "sh", helper.as_str()]
            .map(String::from)
            .into();
        let mut command = self.launcher(root, Duration::ZERO, "/bin/sh", argv, &self.env)?;
        command
            .current_dir(Path::new(WORKSPACE))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(command)
    }

    /// The same container running `/bin/true`, to prove at start-up that the
    /// kernel allows all of it.
    pub(super) fn probe_command(&self, root: &Path) -> Result<Command, String> {
        let argv = vec!["true".to_string()];
        self.launcher(root, Duration::from_secs(10), "/bin/true", argv, &self.env)
    }

    /// A command that, once hakoniwa has set the container up, takes the
    /// sandbox's uid (as root; hakoniwa only switches users inside a user
    /// namespace) and execs `program`.
    fn launcher(
        &self,
        root: &Path,
        timeout: Duration,
        program: &str,
        argv: Vec<String>,
        env: &BTreeMap<String, String>,
    ) -> Result<Command, String> {
        let mut container = self.container.clone();
        container.rootdir(root);
        if let Some(cpus) = self.cpu_rlimit_cpus {
            let seconds = (timeout.as_secs_f64() * cpus).ceil().max(1.0) as u64;
            container.setrlimit(Rlimit::Cpu, seconds, seconds);
        }
        let c_string = |s: String| {
            CString::new(s)
                .map_err(|e| format!("a NUL byte in an exec's argument or environment: {e}"))
        };
        let program = c_string(program.to_string())?;
        let argv = argv
            .into_iter()
            .map(c_string)
            .collect::<Result<Vec<_>, _>>()?;
        let envp = env
            .iter()
            .map(|(k, v)| c_string(format!("{k}={v}")))
            .collect::<Result<Vec<_>, _>>()?;
        let setup = Setup {
            uid: match self.identity {
                Identity::HostUid(uid) => Some(uid),
                Identity::Mapped => None,
            },
            loopback: self.private_network,
        };
        // SAFETY: the closure runs in the forked child, after hakoniwa's
        // setup (mounts, rlimits, landlock, seccomp). It makes only system
        // calls on data prepared here and small allocations, which glibc's
        // fork handlers make safe, and it never returns on success.
        Ok(unsafe {
            container.command_from_closure(move || become_sandbox(setup, &program, &argv, &envp))
        })
    }
}

/// What the container's init does itself before exec'ing the command.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// Drop root for this uid (and gid).
    uid: Option<u32>,
    /// Bring up `lo` in the new network namespace, as `--network none`
    /// leaves it; programs serve and connect on 127.0.0.1.
    loopback: bool,
}

/// In the container's init, still privileged (root, or root of its user
/// namespace): leave the server's session, bring up loopback, drop root,
/// exec. Returns only on failure,
/// with the exit status to report.
fn become_sandbox(setup: Setup, program: &CStr, argv: &[CString], envp: &[CString]) -> i32 {
    let fail = |msg: &[u8], status: i32| {
        // SAFETY: write(2) reads `msg`, which outlives the call.
        unsafe { libc::write(libc::STDERR_FILENO, msg.as_ptr().cast(), msg.len()) };
        status
    };
    // A session of its own, without a controlling terminal: nothing in the
    // sandbox can reach the terminal the server was started from (`/dev/tty`
    // answers ENXIO, and TIOCSTI has no terminal to type into).
    // SAFETY: setsid(2) takes no arguments.
    if unsafe { libc::setsid() } < 0 {
        return fail(b"conclave: cannot start a new session\n", 125);
    }
    if setup.loopback && sys::loopback_up().is_err() {
        return fail(b"conclave: cannot bring up the loopback interface\n", 125);
    }
    if let Some(uid) = setup.uid {
        // SAFETY: plain system calls without pointers but setgroups' empty
        // list. setuid from root to another uid also clears every
        // capability, so nothing of root survives into the command.
        let switched = unsafe {
            libc::setgroups(0, std::ptr::null()) == 0
                && libc::setgid(uid) == 0
                && libc::setuid(uid) == 0
        };
        if !switched {
            return fail(b"conclave: cannot switch to the sandbox's uid\n", 125);
        }
        // Changing uid cleared the parent-death signal hakoniwa set; without
        // it, killing the server (and so the monitor) would leave the
        // sandbox running. It comes back here, microseconds later.
        // SAFETY: prctl(2) with two integer arguments touches no memory.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
            return fail(b"conclave: cannot set the parent-death signal\n", 125);
        }
    }
    let pointers = |strings: &[CString]| -> Vec<*const libc::c_char> {
        strings
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let (argv, envp) = (pointers(argv), pointers(envp));
    // SAFETY: the program, argv and envp point at NUL-terminated strings in
    // NULL-terminated arrays, all alive across the call.
    unsafe { libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    fail(b"conclave: cannot exec the sandbox's shell\n", 126)
}
