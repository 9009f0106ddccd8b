//! `meta.json`: what a sandbox directory records about itself, so that a
//! restarted server can list, re-attach and reap it.

use std::collections::BTreeMap;
use std::fs;
use std::io;

use serde::{Deserialize, Serialize};

use super::jail::Layout;
use crate::sandbox::SandboxSpec;

/// Every sandbox id starts with this; the rest is a simple UUID.
pub(super) const ID_PREFIX: &str = "local-";

/// What meta.json holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Meta {
    pub(super) id: String,
    /// The uid processes run as: a host uid when the server is root.
    pub(super) uid: u32,
    /// Creation time, Unix ms: the start of the first CPU figure.
    pub(super) created_ms: u64,
    pub(super) spec: SpecRecord,
    /// Its workspace is an overlay of layers (`cow`), not a tmpfs.
    #[serde(default)]
    pub(super) layered: bool,
    /// Its layered workspace's chain (`layered`).
    #[serde(flatten)]
    pub(super) chain: crate::sandbox::layers::cow::Chain,
}

/// [`SandboxSpec`] as stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct SpecRecord {
    pub(super) image: String,
    pub(super) cpus: f64,
    pub(super) memory_mb: u64,
    pub(super) pids: u32,
    pub(super) disk_mb: u64,
    pub(super) network: bool,
    /// The allow-list of the egress proxy, as its entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) egress: Option<Vec<String>>,
    pub(super) env: BTreeMap<String, String>,
    pub(super) labels: BTreeMap<String, String>,
}

impl From<&SandboxSpec> for SpecRecord {
    fn from(spec: &SandboxSpec) -> Self {
        SpecRecord {
            image: spec.image.clone(),
            cpus: spec.cpus,
            memory_mb: spec.memory_mb,
            pids: spec.pids,
            disk_mb: spec.disk_mb,
            network: spec.network,
            egress: spec.egress.as_ref().map(|list| list.to_strings()),
            env: spec.env.clone(),
            labels: spec.labels.clone(),
        }
    }
}

impl From<SpecRecord> for SandboxSpec {
    fn from(record: SpecRecord) -> Self {
        SandboxSpec {
            image: record.image,
            cpus: record.cpus,
            memory_mb: record.memory_mb,
            pids: record.pids,
            disk_mb: record.disk_mb,
            network: record.network,
            egress: record
                .egress
                .and_then(|entries| crate::config::AllowList::parse(&entries).ok()),
            env: record.env,
            labels: record.labels,
        }
    }
}

pub(super) fn read_meta(layout: &Layout) -> io::Result<Meta> {
    let text = fs::read(layout.meta())?;
    serde_json::from_slice(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Written to a temporary file and renamed, so a crash leaves either no
/// meta.json or a whole one.
pub(super) fn write_meta(layout: &Layout, meta: &Meta) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(meta).map_err(io::Error::other)?;
    let partial = layout.dir.join("meta.json.partial");
    fs::write(&partial, json)?;
    fs::rename(&partial, layout.meta())
}

/// `local-` and 32 lowercase hex digits: anything else is not ours, and
/// never becomes a path.
pub(super) fn valid_id(id: &str) -> bool {
    id.strip_prefix(ID_PREFIX).is_some_and(|hex| {
        hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}
