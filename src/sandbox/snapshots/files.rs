//! The snapshots' files: in this data directory, and among replicas also
//! where every replica reads them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use uuid::Uuid;

use super::{NAMESPACE, Snapshot, Snapshots, store};
use crate::sandbox::{Result, SandboxError};
use crate::sync::lock;

impl Snapshots {
    /// Stores the file `path` of snapshot `id` where other replicas read
    /// it (nothing to do on a server of its own).
    pub(super) async fn share(&self, id: &str, path: &Path) -> Result<()> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| SandboxError::File(format!("reading {}: {e}", path.display())))?;
        shared
            .put(id, Box::new(file))
            .await
            .map(drop)
            .map_err(|e| SandboxError::Backend(format!("storing snapshot {id}: {e}")))
    }

    /// Where the snapshot's tar file is on this server: its own, or a copy
    /// fetched now from where the replicas share them.
    pub async fn local_path(&self, snapshot: &Snapshot) -> Result<PathBuf> {
        let path = self.file(&snapshot.snapshot_id);
        match tokio::fs::metadata(&path).await {
            Ok(_) => Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !snapshot.layers.is_empty() => {
                self.tar_from_layers(snapshot, &path).await.map(|()| path)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && self.shared.is_some() => {
                self.fetch(snapshot, &path).await.map(|()| path)
            }
            Err(e) => Err(self.unreadable(snapshot, e)),
        }
    }

    /// Copies a shared snapshot file to `path`, through a file of its own
    /// so that a reader never sees half of it.
    async fn fetch(&self, snapshot: &Snapshot, path: &Path) -> Result<()> {
        let id = &snapshot.snapshot_id;
        let Some(shared) = &self.shared else {
            return Err(self.unreadable(snapshot, std::io::ErrorKind::NotFound.into()));
        };
        let mut reader = shared
            .get(id)
            .await
            .map_err(|e| SandboxError::Backend(format!("reading snapshot {id}: {e}")))?
            .ok_or_else(|| {
                SandboxError::File(format!(
                    "snapshot {id} is not in {} (deleted meanwhile?)",
                    shared.place()
                ))
            })?;
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|e| SandboxError::File(format!("snapshot directory: {e}")))?;
        let part = self
            .dir
            .join(format!("{id}.{}.part", Uuid::new_v4().simple()));
        let copied = async {
            let mut file = tokio::fs::File::create(&part).await?;
            tokio::io::copy(&mut reader, &mut file).await?;
            file.sync_all().await?;
            tokio::fs::rename(&part, path).await
        }
        .await;
        copied.map_err(|e| {
            let _ = std::fs::remove_file(&part);
            SandboxError::File(format!(
                "copying snapshot {id} from {}: {e}",
                shared.place()
            ))
        })
    }

    /// The snapshot's tar file, opened to be streamed.
    pub async fn open(&self, snapshot: &Snapshot) -> Result<tokio::fs::File> {
        let path = self.local_path(snapshot).await?;
        tokio::fs::File::open(path)
            .await
            .map_err(|e| self.unreadable(snapshot, e))
    }

    pub(super) fn unreadable(&self, snapshot: &Snapshot, e: std::io::Error) -> SandboxError {
        let id = &snapshot.snapshot_id;
        if e.kind() == std::io::ErrorKind::NotFound && snapshot.instance != self.instance {
            SandboxError::File(format!(
                "snapshot {id} is stored by another server instance ({}), whose data directory this one cannot read (replicas share snapshots only when the bus is NATS)",
                snapshot.instance
            ))
        } else {
            SandboxError::File(format!("reading snapshot {id}: {e}"))
        }
    }

    /// Removes the files of this data directory whose record is gone
    /// (deleted on another replica, or left by a stop between a file and
    /// its record) and copies cut off half-way; the number removed. Files
    /// younger than `older_than` stay: their record may be on its way
    /// ([`SWEEP_AFTER`](super::SWEEP_AFTER) is long enough).
    pub async fn sweep(&self, older_than: Duration) -> Result<usize> {
        let mut listing = match tokio::fs::read_dir(&self.dir).await {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(SandboxError::File(format!("snapshot directory: {e}"))),
        };
        let kept: std::collections::HashSet<String> = self
            .store
            .kv_list(NAMESPACE, "blob/", usize::MAX)
            .await
            .map_err(store)?
            .into_iter()
            .filter_map(|entry| Some(entry.key.strip_prefix("blob/")?.to_owned()))
            .collect();
        let mut removed = 0;
        while let Ok(Some(entry)) = listing.next_entry().await {
            let name = entry.file_name().to_string_lossy().into_owned();
            let stray = match name.strip_suffix(".tar") {
                Some(id) => !kept.contains(id),
                None => name.ends_with(".part"),
            };
            let old = entry
                .metadata()
                .await
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|at| at.elapsed().ok())
                .is_some_and(|age| age >= older_than);
            if stray && old && tokio::fs::remove_file(entry.path()).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed + self.sweep_layers(older_than).await?)
    }

    pub(super) async fn read_file(&self, snapshot: &Snapshot) -> Result<Bytes> {
        let id = &snapshot.snapshot_id;
        if let Some((cached, data)) = lock(&self.read).as_ref()
            && cached == id
        {
            return Ok(data.clone());
        }
        let path = self.local_path(snapshot).await?;
        let data = Bytes::from(
            tokio::fs::read(path)
                .await
                .map_err(|e| self.unreadable(snapshot, e))?,
        );
        *lock(&self.read) = Some((id.clone(), data.clone()));
        Ok(data)
    }
}
