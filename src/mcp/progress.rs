//! A running command's output as MCP progress notifications, both ends.
//!
//! The server side ([`OutputReporter`]) sends what a command printed since
//! its last report, at most one notification per stream per interval, as
//! the notification's `message`, with `_meta.stream` saying `stdout` or
//! `stderr`; past a per-call cap only byte counts go out. An IDE shows the
//! messages as they come. The client side ([`ProgressRouter`]) is the
//! agent's in-process client: it hands each notification to the tool call
//! that asked for it, which turns it into `tool_output` events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    NotificationMetaObject, NumberOrString, ProgressNotification, ProgressNotificationParam,
    ProgressToken, ServerNotification,
};
use rmcp::service::{NotificationContext, Peer};
use rmcp::{ClientHandler, RoleClient, RoleServer};
use serde_json::Value;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::agent::ToolChunk;
use crate::sandbox::ExecChunk;
use crate::sync::lock;

/// Calls that end sooner report nothing (their result says it all).
pub const FIRST_REPORT_AFTER: Duration = Duration::from_secs(1);
/// At most one report per stream this often.
pub const REPORT_EVERY: Duration = Duration::from_millis(500);
/// Bytes of one stream in one report; the rest of that interval's output is
/// counted, not sent.
pub const REPORT_BYTES: usize = 4 * 1024;
/// Bytes of output a call sends as progress in all; past it, byte counts.
pub const CALL_BYTES: usize = 64 * 1024;

#[derive(Default)]
struct Pending {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Bytes seen but not sent (over a cap).
    skipped: usize,
    /// Bytes of output seen in all.
    total: u64,
    /// Bytes sent as text so far.
    sent: usize,
}

impl Pending {
    /// Queues what fits under the caps and counts the rest.
    fn add(&mut self, chunk: &ExecChunk) {
        let (ExecChunk::Stdout(data) | ExecChunk::Stderr(data)) = chunk;
        self.total += data.len() as u64;
        let queued = self.stdout.len() + self.stderr.len();
        let left_in_call = CALL_BYTES.saturating_sub(self.sent + queued);
        let buffer = match chunk {
            ExecChunk::Stdout(_) => &mut self.stdout,
            ExecChunk::Stderr(_) => &mut self.stderr,
        };
        let room = REPORT_BYTES.saturating_sub(buffer.len()).min(left_in_call);
        let kept = data.len().min(room);
        buffer.extend_from_slice(&data[..kept]);
        self.skipped += data.len() - kept;
    }
}

/// Collects a command's output and reports it from a task of its own, so a
/// slow client never holds the command back.
pub struct OutputReporter {
    pending: Arc<Mutex<Pending>>,
    wake: Arc<Notify>,
    finished: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl OutputReporter {
    pub fn start(peer: Peer<RoleServer>, token: ProgressToken) -> OutputReporter {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let wake = Arc::new(Notify::new());
        let finished = CancellationToken::new();
        let task = tokio::spawn(report(
            peer,
            token,
            pending.clone(),
            wake.clone(),
            finished.clone(),
        ));
        OutputReporter {
            pending,
            wake,
            finished,
            task,
        }
    }

    /// Takes one chunk; never waits.
    pub fn take(&self, chunk: &ExecChunk) {
        lock(&self.pending).add(chunk);
        self.wake.notify_one();
    }

    /// Stops reporting and waits for a report on its way to go out.
    pub async fn finish(self) {
        self.finished.cancel();
        let _ = self.task.await;
    }
}

/// Splits off the longest valid UTF-8 prefix; a character cut at the end
/// waits for the next chunk (bytes that are not UTF-8 go, replaced).
fn take_text(buffer: &mut Vec<u8>) -> String {
    let valid = match std::str::from_utf8(buffer) {
        Ok(_) => buffer.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => buffer.len(),
    };
    let rest = buffer.split_off(valid);
    let text = String::from_utf8_lossy(buffer).into_owned();
    *buffer = rest;
    text
}

async fn report(
    peer: Peer<RoleServer>,
    token: ProgressToken,
    pending: Arc<Mutex<Pending>>,
    wake: Arc<Notify>,
    finished: CancellationToken,
) {
    // A quick call reports nothing: its result follows at once.
    tokio::select! {
        _ = tokio::time::sleep(FIRST_REPORT_AFTER) => {}
        _ = finished.cancelled() => return,
    }
    // Once the call has ended its result carries the rest: no last report.
    loop {
        if send_pending(&peer, &token, &pending).await.is_err() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(REPORT_EVERY) => {}
            _ = finished.cancelled() => return,
        }
        let idle = {
            let pending = lock(&pending);
            pending.stdout.is_empty() && pending.stderr.is_empty() && pending.skipped == 0
        };
        if idle {
            tokio::select! {
                _ = wake.notified() => {}
                _ = finished.cancelled() => return,
            }
        }
    }
}

/// Sends what is pending, one notification per stream.
async fn send_pending(
    peer: &Peer<RoleServer>,
    token: &ProgressToken,
    pending: &Mutex<Pending>,
) -> Result<(), rmcp::service::ServiceError> {
    let (texts, total, skipped) = {
        let mut pending = lock(pending);
        let stdout = take_text(&mut pending.stdout);
        let stderr = take_text(&mut pending.stderr);
        pending.sent += stdout.len() + stderr.len();
        let skipped = std::mem::take(&mut pending.skipped);
        (
            [("stdout", stdout), ("stderr", stderr)],
            pending.total,
            skipped,
        )
    };
    for (stream, text) in texts {
        if text.is_empty() {
            continue;
        }
        let mut meta = NotificationMetaObject::new();
        meta.insert("stream".into(), Value::String(stream.into()));
        // rmcp writes a notification's `_meta` from its extensions.
        let mut notification = ProgressNotification::new(
            ProgressNotificationParam::new(token.clone(), total as f64).with_message(text),
        );
        notification.extensions.insert(meta);
        peer.send_notification(ServerNotification::ProgressNotification(notification))
            .await?;
    }
    if skipped > 0 {
        let param = ProgressNotificationParam::new(token.clone(), total as f64).with_message(
            format!("[{skipped} bytes of output not shown; {total} so far]"),
        );
        peer.notify_progress(param).await?;
    }
    Ok(())
}

/// The agent's client handler: routes progress notifications to the call
/// whose token they carry.
#[derive(Clone, Default)]
pub struct ProgressRouter {
    calls: Arc<Mutex<HashMap<String, mpsc::Sender<ToolChunk>>>>,
}

/// Unregisters a call's token when the call ends.
pub struct Registration {
    router: ProgressRouter,
    key: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.router.calls).remove(&self.key);
    }
}

impl ProgressRouter {
    /// Sends the notifications carrying `token` to `sink` until the
    /// registration drops.
    pub fn register(&self, token: &ProgressToken, sink: mpsc::Sender<ToolChunk>) -> Registration {
        let key = key_of(token);
        lock(&self.calls).insert(key.clone(), sink);
        Registration {
            router: self.clone(),
            key,
        }
    }
}

fn key_of(token: &ProgressToken) -> String {
    match &token.0 {
        NumberOrString::Number(n) => format!("n:{n}"),
        NumberOrString::String(s) => format!("s:{s}"),
    }
}

impl ClientHandler for ProgressRouter {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        let key = key_of(&params.progress_token);
        let Some(sink) = lock(&self.calls).get(&key).cloned() else {
            return;
        };
        let Some(content) = params.message else {
            return;
        };
        // rmcp 3.9 moves a notification's extensions into the context
        // before it reads `_meta` from them, so `context.meta` is empty and
        // the `_meta` is found among the extensions.
        let stream = context
            .extensions
            .get::<NotificationMetaObject>()
            .and_then(|m| m.get("stream"))
            .or_else(|| context.meta.get("stream"))
            .and_then(Value::as_str)
            .unwrap_or("info")
            .to_string();
        // A turn that cannot keep up loses progress, never the result.
        let _ = sink.try_send(ToolChunk { stream, content });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_caps_is_counted_not_queued() {
        let mut pending = Pending::default();
        pending.add(&ExecChunk::Stdout(vec![b'a'; REPORT_BYTES + 10].into()));
        pending.add(&ExecChunk::Stderr(b"err".to_vec().into()));
        assert_eq!(pending.stdout.len(), REPORT_BYTES);
        assert_eq!(pending.stderr, b"err");
        assert_eq!(pending.skipped, 10);
        assert_eq!(pending.total, REPORT_BYTES as u64 + 13);
        // Near the call's cap, less is queued.
        let mut late = Pending {
            sent: CALL_BYTES - 5,
            ..Pending::default()
        };
        late.add(&ExecChunk::Stdout(b"0123456789".to_vec().into()));
        assert_eq!(late.stdout, b"01234");
        assert_eq!(late.skipped, 5);
    }

    #[test]
    fn a_character_cut_in_two_waits_for_its_end() {
        let mut buffer = "é".as_bytes()[..1].to_vec();
        buffer.splice(0..0, b"ab".iter().copied());
        assert_eq!(take_text(&mut buffer), "ab");
        assert_eq!(buffer.len(), 1);
        buffer.push("é".as_bytes()[1]);
        assert_eq!(take_text(&mut buffer), "é");
        let mut broken = vec![b'x', 0xff, b'y'];
        assert_eq!(take_text(&mut broken), "x\u{fffd}y");
    }
}
