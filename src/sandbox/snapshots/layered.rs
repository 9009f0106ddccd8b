//! Snapshots kept as copy-on-write layers ([`crate::sandbox::layers`]):
//! where a sandbox's workspace is layered (local and docker sandboxes, the server root), a
//! turn end records the chain its freeze left, a fork or restore mounts
//! that chain, and a tar is made from it only when one is asked for (a
//! download; a sandbox whose workspace is not layered).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{NAMESPACE, Snapshot, Snapshots, store};
use crate::sandbox::{Result, SandboxError, layers};

impl Snapshots {
    /// The layer store: `layers/` in the snapshot directory.
    pub(super) fn layers_dir(&self) -> PathBuf {
        self.dir.join("layers")
    }

    /// The record's size and layer ids of a chain a freeze left.
    pub(super) async fn chain_record(&self, chain: Vec<PathBuf>) -> Result<(u64, Vec<String>)> {
        let store = self.layers_dir();
        let mut ids = Vec::with_capacity(chain.len());
        for layer in &chain {
            match layers::layer_id(layer) {
                Some(id) if layer.parent() == Some(store.as_path()) => ids.push(id.to_owned()),
                _ => {
                    return Err(SandboxError::Backend(format!(
                        "the workspace's layer {} is not in {}",
                        layer.display(),
                        store.display()
                    )));
                }
            }
        }
        let size =
            tokio::task::spawn_blocking(move || chain.iter().map(|l| layers::layer_bytes(l)).sum())
                .await
                .map_err(|e| SandboxError::Backend(format!("sizing a snapshot's layers: {e}")))?;
        Ok((size, ids))
    }

    /// Whether the layer ids `ids` name the chain `chain`.
    pub(super) fn same_chain(&self, ids: &[String], chain: &[PathBuf]) -> bool {
        ids.len() == chain.len()
            && ids
                .iter()
                .zip(chain)
                .all(|(id, layer)| layers::layer_id(layer) == Some(id.as_str()))
    }

    /// The paths of a layered snapshot's chain, where every layer is on
    /// this host.
    pub(super) async fn chain(&self, snapshot: &Snapshot) -> Option<Vec<PathBuf>> {
        if snapshot.layers.is_empty() {
            return None;
        }
        let chain: Vec<PathBuf> = snapshot
            .layers
            .iter()
            .filter(|id| layers::valid_id(id))
            .map(|id| self.layers_dir().join(id))
            .collect();
        for layer in &chain {
            if tokio::fs::metadata(layer).await.is_err() {
                return None;
            }
        }
        (chain.len() == snapshot.layers.len()).then_some(chain)
    }

    /// Writes a layered snapshot's tar at `path` (through a file of its
    /// own, so a reader never sees half of it).
    pub(super) async fn tar_from_layers(&self, snapshot: &Snapshot, path: &Path) -> Result<()> {
        let id = &snapshot.snapshot_id;
        let chain = self.chain(snapshot).await.ok_or_else(|| {
            SandboxError::File(format!(
                "snapshot {id}: a layer of it is missing from {}",
                self.layers_dir().display()
            ))
        })?;
        let part = self
            .dir
            .join(format!("{id}.{}.part", uuid::Uuid::new_v4().simple()));
        let target = path.to_owned();
        tokio::task::spawn_blocking(move || {
            let made =
                layers::tar_chain(&chain, &part).and_then(|()| std::fs::rename(&part, &target));
            if made.is_err() {
                let _ = std::fs::remove_file(&part);
            }
            made
        })
        .await
        .map_err(|e| SandboxError::Backend(format!("packing snapshot {id}: {e}")))?
        .map_err(|e| SandboxError::File(format!("packing snapshot {id} from its layers: {e}")))
    }

    /// Removes those of `ids` that no record names and no mount uses; a
    /// layer a live sandbox still mounts stays for [`Snapshots::sweep`].
    /// The caller holds `edit`.
    pub(super) async fn drop_layers(&self, ids: &[String]) -> Result<()> {
        // Those of the snapshot being recorded stay, without a look at
        // every record (a turn end drops its session's oldest, whose
        // layers the new chain mostly holds).
        let ids: Vec<&String> = {
            let keep = crate::sync::lock(&self.keep_layers);
            ids.iter().filter(|id| !keep.contains(*id)).collect()
        };
        if ids.is_empty() {
            return Ok(());
        }
        let named = self.named_layers().await?;
        let unused: Vec<PathBuf> = ids
            .iter()
            .filter(|id| !named.contains(**id) && layers::valid_id(id))
            .map(|id| self.layers_dir().join(id))
            .collect();
        tokio::task::spawn_blocking(move || {
            let mounted = layers::mounted_ids()?;
            for layer in unused {
                if layers::layer_id(&layer).is_some_and(|id| !mounted.contains(id)) {
                    layers::remove(&layer)?;
                }
            }
            Ok::<_, std::io::Error>(())
        })
        .await
        .map_err(|e| SandboxError::Backend(format!("removing layers: {e}")))?
        .map_err(|e| SandboxError::File(format!("removing layers: {e}")))
    }

    /// Every layer id some record names.
    async fn named_layers(&self) -> Result<HashSet<String>> {
        Ok(self
            .store
            .kv_list(NAMESPACE, "blob/", usize::MAX)
            .await
            .map_err(store)?
            .iter()
            .filter_map(|entry| serde_json::from_slice::<Snapshot>(&entry.value).ok())
            .flat_map(|snapshot| snapshot.layers)
            .collect())
    }

    /// Removes the layers no record names and no mount uses, older than
    /// `older_than` (a freeze's layer waits for its record that long),
    /// and copies cut off half-way; the number removed.
    pub(super) async fn sweep_layers(&self, older_than: Duration) -> Result<usize> {
        let named = self.named_layers().await?;
        let dir = self.layers_dir();
        tokio::task::spawn_blocking(move || {
            let listing = match std::fs::read_dir(&dir) {
                Ok(listing) => listing,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
                Err(e) => return Err(e),
            };
            let mounted = layers::mounted_ids()?;
            let mut removed = 0;
            for entry in listing.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let stray = if layers::valid_id(&name) {
                    !named.contains(&name) && !mounted.contains(&name)
                } else {
                    name.ends_with(".part")
                };
                let old = entry
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|at| at.elapsed().ok())
                    .is_some_and(|age| age >= older_than);
                if stray && old {
                    let path = entry.path();
                    let gone = if name.ends_with(".part") {
                        std::fs::remove_dir_all(&path)
                    } else {
                        layers::remove(&path)
                    };
                    if gone.is_ok() {
                        removed += 1;
                    }
                }
            }
            Ok(removed)
        })
        .await
        .map_err(|e| SandboxError::Backend(format!("sweeping layers: {e}")))?
        .map_err(|e| SandboxError::File(format!("sweeping layers: {e}")))
    }
}
