//! Workspace snapshots: a sandbox's `/workspace` as it was at a turn end,
//! kept so that a fork (or a session started `from_snapshot`) begins with
//! a copy of it.
//!
//! A snapshot is a tar of the workspace made inside the sandbox (`tar -c`
//! through an exec, the same on every backend and never reading the
//! sandbox's files on the host, where a symlink could point anywhere),
//! stored as one file under the data directory. A turn that leased no
//! sandbox changed nothing that Conclave saw, so its turn end points at
//! the previous file instead of writing another: such a turn costs a key,
//! not a copy. Restoring is the reverse (`tar -x` in the new sandbox, its
//! stdin the file, read once and shared by forks starting together).
//!
//! Among replicas the file is also kept where every replica reads it
//! ([`SharedFiles`]: NATS's object store when the bus is NATS), written
//! before its record is: the replica that took it reads its own copy, any
//! other fetches one into its data directory when first asked (a fork, a
//! download, a `from_snapshot` session there). A copy whose record is
//! gone, deleted on another replica, goes at the next [`Snapshots::sweep`].
//!
//! The records live in the store's KV (namespace [`NAMESPACE`], which no
//! API key can name):
//!
//! - `blob/{id}`: a [`Snapshot`] with what refers to it: the turn ends of
//!   its session it stands for, the sessions started from it, and whether
//!   a caller named it. A snapshot nothing refers to is deleted.
//! - `turn/{session}/{seq}`: the snapshot of the session's workspace at
//!   the turn end `seq`; the last `sandbox.snapshots.keep_last` are kept.
//! - `first/{session}`: the turn end of the session's first snapshot, so a
//!   fork at an earlier turn end knows the sandbox did not exist yet.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::{Result, Sandbox, SandboxError};
use crate::store::{Expect, SharedFiles, Store, StoreError, kv_json};
use crate::sync::lock;

mod files;
mod layered;
mod named;
mod rewind;
mod tar;

pub use rewind::Restore;

/// The KV namespace of the snapshot records.
pub const NAMESPACE: &str = "_snapshots";

/// How old a file of the snapshot directory with no record must be before
/// [`Snapshots::sweep`] removes it.
pub const SWEEP_AFTER: Duration = Duration::from_secs(600);

/// One stored workspace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    pub snapshot_id: String,
    /// The session whose workspace it is.
    pub session_id: Uuid,
    /// The turn end it was taken at.
    pub seq: u64,
    /// The turn ends of its session it stands for (later turns that leased
    /// no sandbox share it).
    pub turns: Vec<u64>,
    /// Bytes on disk (a tar of the workspace, uncompressed).
    pub size_bytes: u64,
    pub created_at: DateTime<Utc>,
    /// Named by `POST /sandboxes/snapshots`: kept until it is deleted.
    pub named: bool,
    /// Sessions started from it (forks and `from_snapshot`), which keep it
    /// after its own session is gone.
    pub used_by: Vec<Uuid>,
    /// The backend and image of the sandbox it came from.
    pub backend: String,
    pub image: String,
    /// The key that owns its session; only that key may use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub owner: Option<String>,
    /// The server instance whose data directory holds its file.
    #[schema(ignore)]
    pub instance: String,
    /// Copy-on-write: the layers (ids, top first) of the layer store
    /// under the data directory that make up the workspace, in place of a
    /// tar file (which is made from them when one is asked for).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(ignore)]
    pub layers: Vec<String>,
}

impl Snapshot {
    /// Whether nothing refers to it any more.
    fn unused(&self) -> bool {
        self.turns.is_empty() && self.used_by.is_empty() && !self.named
    }

    /// Whether `owner` (a key's owner id; `None`: the server has no keys
    /// or the caller is an admin) may see and use it.
    pub fn visible_to(&self, owner: Option<&str>) -> bool {
        owner.is_none() || self.owner.as_deref() == owner
    }
}

/// What the workspace of a session was at a turn end.
// One per request, never stored in bulk: not worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum AtTurn {
    /// This snapshot.
    Kept(Snapshot),
    /// The session had no sandbox yet: an empty workspace (or the one its
    /// own `from_snapshot` gives).
    Before,
    /// Its snapshot is no longer kept; these turn ends are.
    Dropped(Vec<u64>),
}

/// The snapshot a new sandbox starts from, and the owner of the session
/// it is for.
#[derive(Debug, Clone, Copy)]
pub struct Seed<'a> {
    pub snapshot: &'a str,
    pub session: Uuid,
    pub owner: Option<&'a str>,
}

/// Where a turn-end snapshot comes from.
pub struct TurnEnd<'a> {
    pub session: Uuid,
    pub owner: Option<&'a str>,
    pub seq: u64,
    /// Whether the sandbox was leased since the previous snapshot.
    pub dirty: bool,
    pub backend: &'a str,
    pub image: &'a str,
}

pub struct Snapshots {
    store: Arc<dyn Store>,
    dir: PathBuf,
    keep_last: usize,
    instance: String,
    timeout: Duration,
    /// One change of the records at a time in this process (their
    /// reference lists are read, changed and written back).
    edit: tokio::sync::Mutex<()>,
    /// The file last read for a restore, shared by forks starting at once.
    read: Mutex<Option<(String, Bytes)>>,
    /// Where every replica finds the files, among replicas.
    shared: Option<Arc<dyn SharedFiles>>,
    /// The layers of the snapshot a turn end is recording, which the
    /// records it releases meanwhile cannot free.
    keep_layers: Mutex<Vec<String>>,
}

impl Snapshots {
    pub fn new(
        store: Arc<dyn Store>,
        dir: PathBuf,
        keep_last: usize,
        instance: String,
        timeout: Duration,
    ) -> Snapshots {
        Snapshots {
            store,
            dir,
            keep_last,
            instance,
            timeout,
            edit: tokio::sync::Mutex::new(()),
            read: Mutex::new(None),
            shared: None,
            keep_layers: Mutex::new(Vec::new()),
        }
    }

    /// Keeps every file also in `shared`, where other replicas read it.
    pub fn with_shared(mut self, shared: Arc<dyn SharedFiles>) -> Snapshots {
        self.shared = Some(shared);
        self
    }

    /// How many turn-end snapshots a session keeps; 0 takes none.
    pub fn keep_last(&self) -> usize {
        self.keep_last
    }

    fn file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.tar"))
    }

    /// Records the workspace of `sandbox` at a turn end and drops the
    /// session's turn ends past `keep_last`.
    ///
    /// The session's turn ends are listed once: what to drop follows from
    /// that list and this turn end (the manager takes a session's
    /// snapshots one at a time, in the order of its turn ends). Each
    /// record is read and written once however many of its turn ends
    /// change, and `first/{session}` is written only with the session's
    /// first entry, before it, so a session with entries has it without
    /// asking.
    pub async fn take(&self, end: TurnEnd<'_>, sandbox: &dyn Sandbox) -> Result<()> {
        let mut entries = self.turn_entries(end.session).await?;
        let had_any = !entries.is_empty();
        let previous = entries.last().map(|(_, id)| id.clone());
        // A turn end taken again replaces its entry.
        let replaced = entries
            .iter()
            .position(|(seq, _)| *seq == end.seq)
            .map(|at| entries.remove(at));
        let over = (entries.len() + 1).saturating_sub(self.keep_last.max(1));
        let dropped: Vec<(u64, String)> = entries.drain(..over).collect();
        // The turn ends each record no longer stands for.
        let mut released: Vec<(String, Vec<u64>)> = Vec::new();
        for (seq, id) in dropped.iter().chain(replaced.as_ref()) {
            match released.iter_mut().find(|(of, _)| of == id) {
                Some((_, seqs)) => seqs.push(*seq),
                None => released.push((id.clone(), vec![*seq])),
            }
        }
        // A layered workspace freezes first: one that gives the chain of
        // the previous snapshot changed nothing, whatever ran in it.
        let frozen = match (&self.shared, end.dirty) {
            (None, true) => sandbox.freeze(&self.layers_dir()).await?,
            _ => None,
        };
        let unchanged = match (&frozen, &previous) {
            (Some(chain), Some(id)) => self
                .get(id)
                .await?
                .is_some_and(|s| !s.layers.is_empty() && self.same_chain(&s.layers, chain)),
            _ => false,
        };
        let shared = match previous {
            Some(id) if !end.dirty || unchanged => {
                let gone = released
                    .iter()
                    .position(|(of, _)| *of == id)
                    .map_or_else(Vec::new, |at| released.remove(at).1);
                let _edit = self.edit.lock().await;
                self.change(&id, |s| {
                    s.turns.retain(|t| !gone.contains(t));
                    if !s.turns.contains(&end.seq) {
                        s.turns.push(end.seq);
                    }
                })
                .await?
            }
            _ => None,
        };
        let snapshot = match shared {
            Some(snapshot) => snapshot,
            None => self.write(&end, sandbox, frozen).await?,
        };
        let _edit = self.edit.lock().await;
        if !had_any {
            // Absent: this is its first; present (a write of this turn
            // end that failed after it), it stays.
            self.store
                .kv_put(
                    NAMESPACE,
                    &first_key(end.session),
                    &encode(&end.seq)?,
                    Expect::Absent,
                )
                .await
                .map_err(store)?;
        }
        self.put(&turn_key(end.session, end.seq), &snapshot.snapshot_id)
            .await?;
        for (seq, _) in &dropped {
            self.store
                .kv_delete(NAMESPACE, &turn_key(end.session, *seq), Expect::Any)
                .await
                .map_err(store)?;
        }
        *lock(&self.keep_layers) = snapshot.layers.clone();
        let mut changed = Ok(());
        for (id, seqs) in released {
            if id != snapshot.snapshot_id {
                changed = self
                    .change(&id, |s| s.turns.retain(|t| !seqs.contains(t)))
                    .await
                    .map(drop);
                if changed.is_err() {
                    break;
                }
            }
        }
        lock(&self.keep_layers).clear();
        changed
    }

    /// Freezes the workspace's layers, or tars it into a new file, and
    /// stores its record.
    async fn write(
        &self,
        end: &TurnEnd<'_>,
        sandbox: &dyn Sandbox,
        frozen: Option<Vec<PathBuf>>,
    ) -> Result<Snapshot> {
        let id = Uuid::new_v4().simple().to_string();
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|e| SandboxError::File(format!("snapshot directory: {e}")))?;
        // Replicas that share files read tars: layers stay on this host.
        let frozen = match (frozen, &self.shared) {
            (Some(chain), _) => Some(chain),
            (None, None) if !end.dirty => sandbox.freeze(&self.layers_dir()).await?,
            _ => None,
        };
        let (size, layers) = match frozen {
            Some(chain) => self.chain_record(chain).await?,
            None => (self.pack(&id, sandbox).await?, Vec::new()),
        };
        let snapshot = Snapshot {
            snapshot_id: id.clone(),
            session_id: end.session,
            seq: end.seq,
            turns: vec![end.seq],
            size_bytes: size,
            created_at: Utc::now(),
            named: false,
            used_by: Vec::new(),
            backend: end.backend.to_owned(),
            image: end.image.to_owned(),
            owner: end.owner.map(str::to_owned),
            instance: self.instance.clone(),
            layers,
        };
        let _edit = self.edit.lock().await;
        self.put(&blob_key(&id), &snapshot).await?;
        Ok(snapshot)
    }

    /// Tars the workspace into the new file of snapshot `id`; its size.
    async fn pack(&self, id: &str, sandbox: &dyn Sandbox) -> Result<u64> {
        let path = self.file(id);
        let packed = match tar::pack(sandbox, &path, self.timeout).await {
            Ok(size) => self.share(id, &path).await.map(|()| size),
            Err(e) => Err(e),
        };
        if packed.is_err() {
            let _ = tokio::fs::remove_file(&path).await;
        }
        packed
    }

    /// Unpacks a snapshot into a fresh sandbox's workspace, for a session
    /// of its owner or one it was given to (a fork made by an admin);
    /// to any other it is as good as absent.
    pub async fn restore(&self, seed: Seed<'_>, sandbox: &dyn Sandbox) -> Result<()> {
        let id = seed.snapshot;
        let snapshot = self
            .get(id)
            .await?
            .filter(|s| {
                seed.owner.is_none()
                    || s.owner.as_deref() == seed.owner
                    || s.used_by.contains(&seed.session)
            })
            .ok_or_else(|| {
                SandboxError::File(format!("snapshot {id} is gone (deleted, or never made)"))
            })?;
        if let Some(chain) = self.chain(&snapshot).await
            && sandbox.seed(&chain).await?
        {
            return Ok(());
        }
        let data = self.read_file(&snapshot).await?;
        tar::unpack(sandbox, data, self.timeout).await
    }

    /// A snapshot by id, whoever owns it.
    pub async fn get(&self, id: &str) -> Result<Option<Snapshot>> {
        kv_json(
            self.store.as_ref(),
            NAMESPACE,
            &blob_key(id),
            "a snapshot record",
        )
        .await
        .map_err(store)
    }

    /// The session's kept turn-end snapshots, oldest first.
    pub async fn of_session(&self, session: Uuid) -> Result<Vec<Snapshot>> {
        let mut kept: Vec<Snapshot> = Vec::new();
        for (_, id) in self.turn_entries(session).await? {
            if kept.last().is_some_and(|s| s.snapshot_id == id) {
                continue;
            }
            if let Some(snapshot) = self.get(&id).await? {
                kept.push(snapshot);
            }
        }
        Ok(kept)
    }

    /// What the session's workspace was at the turn end `seq`.
    pub async fn at_turn(&self, session: Uuid, seq: u64) -> Result<AtTurn> {
        let entries = self.turn_entries(session).await?;
        if let Some((_, id)) = entries.iter().find(|(at, _)| *at == seq)
            && let Some(snapshot) = self.get(id).await?
        {
            return Ok(AtTurn::Kept(snapshot));
        }
        let first: Option<u64> = kv_json(
            self.store.as_ref(),
            NAMESPACE,
            &first_key(session),
            "a first snapshot",
        )
        .await
        .map_err(store)?;
        Ok(match first {
            Some(first) if first <= seq => {
                AtTurn::Dropped(entries.into_iter().map(|(at, _)| at).collect())
            }
            _ => AtTurn::Before,
        })
    }

    /// Whether the session ever had a turn-end snapshot (its sandbox
    /// existed at a turn end).
    pub async fn has_any(&self, session: Uuid) -> Result<bool> {
        Ok(self
            .store
            .kv_get(NAMESPACE, &first_key(session))
            .await
            .map_err(store)?
            .is_some())
    }

    /// Records that `session` starts from the snapshot, which it keeps.
    pub async fn add_user(&self, id: &str, session: Uuid) -> Result<Option<Snapshot>> {
        let _edit = self.edit.lock().await;
        self.change(id, |s| {
            if !s.used_by.contains(&session) {
                s.used_by.push(session);
            }
        })
        .await
    }

    /// Drops everything the session refers to: its turn ends and its use
    /// of the snapshot it started from. Snapshots nothing else refers to
    /// are deleted with their files.
    pub async fn forget_session(&self, session: Uuid) -> Result<()> {
        let _edit = self.edit.lock().await;
        for (seq, id) in self.turn_entries(session).await? {
            self.store
                .kv_delete(NAMESPACE, &turn_key(session, seq), Expect::Any)
                .await
                .map_err(store)?;
            self.change(&id, |s| s.turns.retain(|t| *t != seq)).await?;
        }
        self.store
            .kv_delete(NAMESPACE, &first_key(session), Expect::Any)
            .await
            .map_err(store)?;
        self.forget_restore(session).await?;
        let blobs = self
            .store
            .kv_list(NAMESPACE, "blob/", usize::MAX)
            .await
            .map_err(store)?;
        for entry in blobs {
            let Ok(snapshot) = serde_json::from_slice::<Snapshot>(&entry.value) else {
                continue;
            };
            if snapshot.used_by.contains(&session) {
                self.change(&snapshot.snapshot_id, |s| {
                    s.used_by.retain(|u| *u != session)
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Applies `edit` to a record and writes it back, or deletes it with
    /// its file when nothing refers to it any more. The caller holds
    /// `edit`. `None` when the record is gone.
    async fn change(&self, id: &str, edit: impl FnOnce(&mut Snapshot)) -> Result<Option<Snapshot>> {
        let Some(mut snapshot) = self.get(id).await? else {
            return Ok(None);
        };
        edit(&mut snapshot);
        if snapshot.unused() {
            self.store
                .kv_delete(NAMESPACE, &blob_key(id), Expect::Any)
                .await
                .map_err(store)?;
            {
                let mut read = lock(&self.read);
                if read.as_ref().is_some_and(|(cached, _)| cached == id) {
                    *read = None;
                }
            }
            match tokio::fs::remove_file(self.file(id)).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(snapshot = id, error = %e, "a snapshot's file stays on disk")
                }
            }
            if !snapshot.layers.is_empty()
                && let Err(e) = self.drop_layers(&snapshot.layers).await
            {
                tracing::warn!(snapshot = id, error = %e, "a snapshot's layers stay on disk");
            }
            if let Some(shared) = &self.shared
                && let Err(e) = shared.delete(id).await
            {
                tracing::warn!(snapshot = id, error = %e, "a snapshot's shared file stays");
            }
        } else {
            self.put(&blob_key(id), &snapshot).await?;
        }
        Ok(Some(snapshot))
    }

    /// `(seq, snapshot id)` of the session's kept turn ends, oldest first.
    async fn turn_entries(&self, session: Uuid) -> Result<Vec<(u64, String)>> {
        let prefix = format!("turn/{session}/");
        let entries = self
            .store
            .kv_list(NAMESPACE, &prefix, usize::MAX)
            .await
            .map_err(store)?;
        Ok(entries
            .into_iter()
            .filter_map(|entry| {
                let seq = entry.key.strip_prefix(&prefix)?.parse().ok()?;
                let id = serde_json::from_slice(&entry.value).ok()?;
                Some((seq, id))
            })
            .collect())
    }

    async fn put(&self, key: &str, value: &impl Serialize) -> Result<()> {
        self.store
            .kv_put(NAMESPACE, key, &encode(value)?, Expect::Any)
            .await
            .map_err(store)?;
        Ok(())
    }
}

fn encode(value: &impl Serialize) -> Result<Vec<u8>> {
    serde_json::to_vec(value)
        .map_err(|e| SandboxError::Backend(format!("encoding a snapshot record: {e}")))
}

fn blob_key(id: &str) -> String {
    format!("blob/{id}")
}

/// Zero-padded so that keys sort in seq order.
fn turn_key(session: Uuid, seq: u64) -> String {
    format!("turn/{session}/{seq:020}")
}

fn first_key(session: Uuid) -> String {
    format!("first/{session}")
}

fn store(e: StoreError) -> SandboxError {
    SandboxError::Backend(format!("snapshot records: {e}"))
}

#[cfg(test)]
#[path = "snapshots_tests.rs"]
mod tests;
