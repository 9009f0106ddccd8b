//! The `upload` tool on a session of a running server: between the
//! session's turns (a turn running is an error naming it), logged as
//! `workspace_uploaded` and snapshotted at that point, as
//! `PUT /agent/session/{id}/workspace` does. A scratch sandbox's upload,
//! or one through `conclave mcp` with no server, has no log to write.

use super::host::McpHost;
use super::schema::ToolFailure;
use crate::protocol::EventKind;
use crate::tools::schema::{UploadArchive, Uploaded};
use crate::tools::{Invocation, transfer};

pub async fn upload(
    host: &McpHost,
    call: &Invocation,
    args: UploadArchive,
) -> Result<Uploaded, ToolFailure> {
    let (Some(id), Some(sessions)) = (call.place.session_id(), host.sessions()) else {
        return Ok(transfer::upload(&host.tools, call, args).await?);
    };
    let session = sessions
        .get(id, None)
        .await
        .map_err(|e| ToolFailure(e.to_string()))?;
    let held = sessions
        .hold_between_turns(session)
        .await
        .map_err(|e| match e {
            crate::session::SessionError::Busy(id) => ToolFailure(format!(
                "session {id} is running a turn; upload when its result has come"
            )),
            other => ToolFailure(other.to_string()),
        })?;
    let result = async {
        let uploaded = transfer::upload(&host.tools, call, args).await?;
        let session = &held.session;
        let seq = session
            .emit(EventKind::WorkspaceUploaded {
                path: uploaded.path.clone(),
                files: uploaded.files,
                bytes: uploaded.bytes,
                source: None,
            })
            .map_err(|e| ToolFailure(e.to_string()))?;
        session
            .flush()
            .await
            .map_err(|e| ToolFailure(e.to_string()))?;
        host.tools
            .sandboxes
            .snapshot_turn(session.id, session.owner.as_deref(), seq);
        Ok(uploaded)
    }
    .await;
    held.release().await;
    result
}
