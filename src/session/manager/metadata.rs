//! A session's metadata: a client's own labels, kept on its record.

use serde_json::{Map, Value};
use uuid::Uuid;

use super::SessionManager;
use crate::session::SessionError;

impl SessionManager {
    /// The metadata of a session the caller has found (and so may see):
    /// it is not kept on the live session, since another replica may
    /// change it.
    pub async fn metadata(&self, id: Uuid) -> Result<Map<String, Value>, SessionError> {
        match self.store.get_session(id).await? {
            Some(record) => Ok(record.metadata),
            None => Err(SessionError::NotFound(id)),
        }
    }

    /// Sets each key of `patch` in the metadata of a session the caller
    /// may see, keeping the others; answers the metadata now.
    pub async fn merge_metadata(
        &self,
        id: Uuid,
        owner: Option<&str>,
        patch: &Map<String, Value>,
    ) -> Result<Map<String, Value>, SessionError> {
        self.find(id, owner, true).await?;
        self.store
            .merge_metadata(id, patch)
            .await?
            .ok_or(SessionError::NotFound(id))
    }
}
