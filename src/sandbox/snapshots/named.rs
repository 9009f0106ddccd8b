//! Named snapshots: kept until un-named, and counted in their key's
//! `storage_mb`.

use super::{NAMESPACE, Snapshot, Snapshots, store};
use crate::sandbox::Result;
use crate::store::StoreError;

impl Snapshots {
    /// The named snapshots `owner` may see (`None`: all).
    pub async fn named(&self, owner: Option<&str>) -> Result<Vec<Snapshot>> {
        let blobs = self
            .store
            .kv_list(NAMESPACE, "blob/", usize::MAX)
            .await
            .map_err(store)?;
        Ok(blobs
            .iter()
            .filter_map(|entry| serde_json::from_slice::<Snapshot>(&entry.value).ok())
            .filter(|s| s.named && s.visible_to(owner))
            .collect())
    }

    /// The named snapshots of `owner` and their bytes on disk.
    pub async fn named_bytes(&self, owner: &str) -> Result<(usize, u64)> {
        let named = self.named(Some(owner)).await?;
        Ok((named.len(), named.iter().map(|s| s.size_bytes).sum()))
    }

    /// Marks a snapshot as named (`true`) or not; an unnamed one nothing
    /// else refers to is deleted. `None` when there is no such snapshot.
    pub async fn set_named(&self, id: &str, named: bool) -> Result<Option<Snapshot>> {
        let _edit = self.edit.lock().await;
        self.change(id, |s| s.named = named).await
    }
}

/// A key's named snapshots count in its `storage_mb`.
#[async_trait::async_trait]
impl crate::store::KeptBytes for Snapshots {
    async fn kept_bytes(&self, owner: &str) -> std::result::Result<u64, StoreError> {
        self.named_bytes(owner)
            .await
            .map(|(_, bytes)| bytes)
            .map_err(|e| StoreError::Io(e.to_string()))
    }
}
