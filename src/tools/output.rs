//! What a running command prints, reported while it runs.
//!
//! [`Reporter`] collects a command's output and sends what it printed since
//! its last report, at most one report per stream per interval, from a
//! task of its own; past a per-call cap only byte counts go out. Where the
//! reports go is a [`Progress`]: the agent's turn (`tool_output` events)
//! or an MCP client (progress notifications).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::agent::ToolChunk;
use crate::sandbox::ExecChunk;
use crate::sandbox::secrets::{Scrubber, StreamScrubber};
use crate::sync::lock;

/// The stream of a report that is a note (a count of output not shown).
pub const NOTE_STREAM: &str = "info";

/// Where a call's reports go.
#[async_trait]
pub trait Progress: Send + Sync {
    /// One report: `text` printed on `stream` (`stdout`, `stderr`, or
    /// [`NOTE_STREAM`]), `total` bytes of output so far. An error stops
    /// the reports (the follower is gone).
    async fn report(&self, stream: &str, text: String, total: u64) -> Result<(), ()>;
}

/// A turn following its call: each report becomes a [`ToolChunk`]; a turn
/// that cannot keep up loses reports, never the result.
#[async_trait]
impl Progress for mpsc::Sender<ToolChunk> {
    async fn report(&self, stream: &str, content: String, _total: u64) -> Result<(), ()> {
        let _ = self.try_send(ToolChunk {
            stream: stream.to_string(),
            content,
        });
        Ok(())
    }
}

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
    /// Each stream's secrets taken out before anything is queued.
    scrub_stdout: StreamScrubber,
    scrub_stderr: StreamScrubber,
}

impl Pending {
    fn new(scrubber: Scrubber) -> Pending {
        Pending {
            scrub_stdout: StreamScrubber::new(scrubber.clone()),
            scrub_stderr: StreamScrubber::new(scrubber),
            ..Pending::default()
        }
    }

    /// Queues what fits under the caps and counts the rest.
    fn add(&mut self, chunk: &ExecChunk) {
        let (ExecChunk::Stdout(raw) | ExecChunk::Stderr(raw)) = chunk;
        self.total += raw.len() as u64;
        let data = match chunk {
            ExecChunk::Stdout(_) => self.scrub_stdout.push(raw),
            ExecChunk::Stderr(_) => self.scrub_stderr.push(raw),
        };
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
/// slow follower never holds the command back.
pub struct Reporter {
    pending: Arc<Mutex<Pending>>,
    wake: Arc<Notify>,
    finished: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Reporter {
    /// Reports to `to`, what `scrubber` finds taken out first.
    pub fn start(to: Arc<dyn Progress>, scrubber: Scrubber) -> Reporter {
        let pending = Arc::new(Mutex::new(Pending::new(scrubber)));
        let wake = Arc::new(Notify::new());
        let finished = CancellationToken::new();
        let task = tokio::spawn(report(to, pending.clone(), wake.clone(), finished.clone()));
        Reporter {
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
    to: Arc<dyn Progress>,
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
        if send_pending(to.as_ref(), &pending).await.is_err() {
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

/// Sends what is pending, one report per stream, then a note of what was
/// not shown.
async fn send_pending(to: &dyn Progress, pending: &Mutex<Pending>) -> Result<(), ()> {
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
        if !text.is_empty() {
            to.report(stream, text, total).await?;
        }
    }
    if skipped > 0 {
        let note = format!("[{skipped} bytes of output not shown; {total} so far]");
        to.report(NOTE_STREAM, note, total).await?;
    }
    Ok(())
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
