//! `[sandbox]`: where tool calls run, the limits every sandbox gets, and
//! the backends' own settings.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where tool calls run, and the limits every sandbox gets.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// `auto` picks docker when its socket answers, else local.
    pub backend: SandboxBackendKind,
    /// Image of sessions that name none (docker and kubernetes).
    pub image: String,
    pub cpus: f64,
    pub memory_mb: u64,
    pub pids: u32,
    /// Size of the writable workspace.
    pub disk_mb: u64,
    /// Smallest and largest values a session may ask for in
    /// `options.sandbox`: a limit too small to apply (docker treats 0 CPUs
    /// as none) cannot switch it off.
    pub min_cpus: f64,
    pub max_cpus: f64,
    pub min_memory_mb: u64,
    pub max_memory_mb: u64,
    /// Whether a session may ask for network access at all. A sandbox
    /// given network reaches the internet only: not its host, nor private,
    /// link-local (cloud metadata) or reserved addresses.
    pub allow_network: bool,
    /// CIDRs (or addresses) a sandbox given network may reach beyond the
    /// internet, e.g. a package mirror on the private network.
    pub network_allow: Vec<String>,
    /// The egress proxy of sessions that ask for an allow-list
    /// (`options.sandbox.network: {allow: [...]}`): the names they may
    /// narrow it to, and names pinned to addresses.
    pub network: super::NetworkConfig,
    /// Per-exec timeout when a call names none, and the most one may name.
    pub exec_timeout_s: u64,
    pub max_exec_timeout_s: u64,
    /// A sandbox unused this long is destroyed (its session keeps working
    /// and gets a fresh one at its next tool call).
    pub idle_ttl_s: u64,
    /// A sandbox unused this long is paused (docker pause, the cgroup
    /// freezer of local sandboxes; Kubernetes Pods keep running): its
    /// processes, background runs included, are frozen with its files
    /// until the session's next tool call resumes it. 0, the default,
    /// never pauses: a paused sandbox's background jobs (a build left
    /// running between turns) stop making progress.
    pub pause_after_s: u64,
    /// Longest a sandbox lives, used or not: its expiry label, which every
    /// Conclave instance on the host honours, so the sandboxes of a server
    /// that stopped (or whose data directory is gone) do not run forever.
    pub max_lifetime_s: u64,
    /// Live sandboxes at most, the warm pool included.
    pub max_live: usize,
    /// Ready sandboxes kept for new sessions of the default spec.
    pub warm_pool: usize,
    /// Snapshots of each session's workspace at its turn ends, for forks.
    pub snapshots: SnapshotsConfig,
    pub kubernetes: KubernetesConfig,
    pub local: LocalConfig,
}

/// `[sandbox.snapshots]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotsConfig {
    /// Turn-end snapshots kept per session, the latest ones; 0 takes none
    /// (a fork then starts with an empty workspace, or 409 past the first
    /// turn that had a sandbox). Each costs about the workspace's size on
    /// disk, except after a turn that used no tool: it shares the previous
    /// one.
    pub keep_last: usize,
}

impl Default for SnapshotsConfig {
    fn default() -> Self {
        SnapshotsConfig { keep_last: 3 }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SandboxBackendKind {
    Auto,
    Docker,
    Local,
    Kubernetes,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            backend: SandboxBackendKind::Auto,
            image: "conclave/sandbox-python:latest".into(),
            cpus: 1.0,
            memory_mb: 512,
            pids: 256,
            disk_mb: 256,
            min_cpus: 0.1,
            max_cpus: 4.0,
            min_memory_mb: 32,
            max_memory_mb: 4096,
            allow_network: false,
            network_allow: Vec::new(),
            network: Default::default(),
            exec_timeout_s: 60,
            max_exec_timeout_s: 600,
            idle_ttl_s: 900,
            pause_after_s: 0,
            max_lifetime_s: 24 * 3600,
            max_live: 64,
            warm_pool: 2,
            snapshots: Default::default(),
            kubernetes: Default::default(),
            local: Default::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// Namespace of the sandbox Pods, apart from the server's own, so the
    /// server's Role and the deny-all NetworkPolicy reach sandboxes only.
    pub namespace: String,
    /// RuntimeClass of sandbox Pods (`gvisor`, `kata`): a kernel boundary
    /// between agent code and the node beyond what runc gives. `None` takes
    /// the cluster's default.
    pub runtime_class: Option<String>,
    /// `IfNotPresent` starts sandboxes from images preloaded on the nodes
    /// without asking a registry; `Always` picks up a re-pushed tag.
    pub image_pull_policy: String,
    /// How long a create waits for its Pod to run: scheduling, a node
    /// scale-up and an image pull can take minutes on a cold cluster.
    pub start_timeout_s: u64,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            namespace: "conclave".into(),
            runtime_class: None,
            image_pull_policy: "IfNotPresent".into(),
            start_timeout_s: 120,
        }
    }
}

/// Settings of the local backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalConfig {
    /// Where sandbox directories live. `None` lets the caller choose,
    /// normally `<data_dir>/sandboxes`, so that one setting moves all state.
    pub root: Option<PathBuf>,
    /// First host uid handed to sandboxes when the server runs as root. Each
    /// sandbox runs as a uid of its own, so its processes cannot signal or
    /// read another sandbox's, and RLIMIT_NPROC (the pid limit where there
    /// is no pids cgroup) counts only its own. The default lies far above
    /// the uids of people and of the `/etc/subuid` ranges tools hand out,
    /// and below 2^31 for tools that store uids signed. Two servers on one
    /// host need disjoint ranges.
    pub uid_base: u32,
    /// How many uids from `uid_base` may be used: as root, the most
    /// sandboxes that can exist at once.
    pub uid_count: u32,
    /// Directory made under each cgroup v1 controller
    /// (`/sys/fs/cgroup/<controller>/<cgroup_parent>/<id>`) to hold the
    /// sandboxes' cgroups, so that they are easy to find and to delegate.
    pub cgroup_parent: String,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            root: None,
            uid_base: 1_000_000_000,
            uid_count: 65_536,
            cgroup_parent: "conclave".into(),
        }
    }
}

/// An entry of `sandbox.network_allow`: a CIDR, or one address.
pub fn parse_net(text: &str) -> Result<ipnet::IpNet, String> {
    let text = text.trim();
    text.parse::<ipnet::IpNet>()
        .map(|net| net.trunc())
        .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{text:?} is not a CIDR or an address"))
}

impl SandboxConfig {
    /// The first problem found, as `(field, message)`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let fail = |field: &str, message: String| Err((field.to_string(), message));
        // The kernel's CFS quota cannot go below 1 ms per 100 ms period.
        if !(self.min_cpus >= 0.01 && self.min_cpus <= self.max_cpus) {
            return fail(
                "sandbox.min_cpus",
                format!("must be 0.01 to sandbox.max_cpus ({})", self.max_cpus),
            );
        }
        if !(self.cpus >= self.min_cpus && self.cpus <= self.max_cpus) {
            return fail(
                "sandbox.cpus",
                format!(
                    "must be sandbox.min_cpus ({}) to sandbox.max_cpus ({})",
                    self.min_cpus, self.max_cpus
                ),
            );
        }
        if self.min_memory_mb < 16 || self.min_memory_mb > self.max_memory_mb {
            return fail(
                "sandbox.min_memory_mb",
                format!(
                    "must be 16 to sandbox.max_memory_mb ({})",
                    self.max_memory_mb
                ),
            );
        }
        if self.memory_mb < self.min_memory_mb || self.memory_mb > self.max_memory_mb {
            return fail(
                "sandbox.memory_mb",
                format!(
                    "must be sandbox.min_memory_mb ({}) to sandbox.max_memory_mb ({})",
                    self.min_memory_mb, self.max_memory_mb
                ),
            );
        }
        for (name, value) in [
            ("sandbox.pids", u64::from(self.pids)),
            ("sandbox.disk_mb", self.disk_mb),
            ("sandbox.exec_timeout_s", self.exec_timeout_s),
            ("sandbox.max_live", self.max_live as u64),
        ] {
            if value == 0 {
                return fail(name, "must be at least 1".into());
            }
        }
        if self.pause_after_s > 0 && self.pause_after_s >= self.idle_ttl_s {
            return fail(
                "sandbox.pause_after_s",
                format!(
                    "must be less than sandbox.idle_ttl_s ({}), which destroys an idle \
                     sandbox, or 0 to never pause",
                    self.idle_ttl_s
                ),
            );
        }
        if self.exec_timeout_s > self.max_exec_timeout_s {
            return fail(
                "sandbox.exec_timeout_s",
                "must not exceed sandbox.max_exec_timeout_s".into(),
            );
        }
        for (i, net) in self.network_allow.iter().enumerate() {
            parse_net(net).map_err(|e| (format!("sandbox.network_allow[{i}]"), e))?;
        }
        self.network.validate()?;
        if self.image.trim().is_empty() {
            return fail("sandbox.image", "must not be empty".into());
        }
        Ok(())
    }
}
