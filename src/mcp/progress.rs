//! A running command's output as MCP progress notifications: the
//! [`Progress`] of a call whose client gave a progress token. Each report
//! is a notification whose `message` is the text, with `_meta.stream`
//! saying `stdout` or `stderr`; a note of output not shown carries no
//! stream. An IDE shows the messages as they come.

use async_trait::async_trait;
use rmcp::RoleServer;
use rmcp::model::{
    NotificationMetaObject, ProgressNotification, ProgressNotificationParam, ProgressToken,
    ServerNotification,
};
use rmcp::service::Peer;
use serde_json::Value;

use crate::tools::output::{NOTE_STREAM, Progress};

/// The client of one call, and the token its notifications carry.
pub struct Notifications {
    pub peer: Peer<RoleServer>,
    pub token: ProgressToken,
}

#[async_trait]
impl Progress for Notifications {
    async fn report(&self, stream: &str, text: String, total: u64) -> Result<(), ()> {
        let param =
            ProgressNotificationParam::new(self.token.clone(), total as f64).with_message(text);
        if stream == NOTE_STREAM {
            return self.peer.notify_progress(param).await.map_err(|_| ());
        }
        let mut meta = NotificationMetaObject::new();
        meta.insert("stream".into(), Value::String(stream.into()));
        // rmcp writes a notification's `_meta` from its extensions.
        let mut notification = ProgressNotification::new(param);
        notification.extensions.insert(meta);
        self.peer
            .send_notification(ServerNotification::ProgressNotification(notification))
            .await
            .map_err(|_| ())
    }
}
