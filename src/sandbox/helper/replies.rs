//! Reading the helper's replies off its channel (a docker container's
//! attached stdout, a local sandbox's pipe).
//!
//! The stream is the sandbox's, so the reader trusts none of it: lines
//! are cut from each chunk as it comes, with no rescan of what came
//! before, and held to [`MAX_LINE`] bytes (the helper's replies are under
//! `PIPE_BUF`), a longer line being dropped whole. The whole stream is
//! read at [`CHANNEL_RATE`] at most, after a burst of [`CHANNEL_BURST`]
//! (more than the largest file read), so a command that writes without
//! end (`yes`) backs up in its own pipe instead of costing the server a
//! core per sandbox (where the channel is docker's attach stream, which
//! the server decodes frame by frame; a local sandbox's pipe is read as
//! fast as it comes, as its execs' own pipes were). Whatever is not a reply
//! of the helper (a line that does not parse, an overlong one, anything on
//! stderr) is the sandbox's own output: counted, logged at most once every
//! [`LOG_EVERY`] with its counts, and let through at [`FOREIGN_RATE`] only:
//! past that the reader pauses, so the container's pipe fills and its
//! writers block, instead of the server spending a core on them.
//!
//! Landlock keeps a run's processes off the channel (see
//! `src/bin/conclave-exec.rs`), so foreign output is rare; these limits
//! are what holds where the kernel offers no Landlock, and for the boot
//! script, which writes on the same streams.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::sync::lock;

/// The longest line kept: the helper's replies are under `PIPE_BUF`
/// (4096 bytes), so anything longer is not one.
pub(super) const MAX_LINE: usize = 8 * 1024;
/// Bytes per second read off a container's stdout after a burst of
/// [`CHANNEL_BURST`]; beyond, the reader waits for the rate to allow it.
/// Replies are hex, so a run's output comes at half this, and the burst
/// holds a whole file read (`files::MAX_READ_BYTES`).
const CHANNEL_RATE: f64 = 4.0 * 1024.0 * 1024.0;
const CHANNEL_BURST: f64 = 16.0 * 1024.0 * 1024.0;
/// The same for foreign output.
const FOREIGN_RATE: f64 = 64.0 * 1024.0;
const FOREIGN_BURST: f64 = 1024.0 * 1024.0;
/// The shortest pause, so a steady flood costs a wake-up per pause, not
/// one per chunk.
const MIN_PAUSE: Duration = Duration::from_millis(100);
/// How often foreign output is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(5);
/// Bytes of foreign output quoted in the log (the boot script's complaint).
const QUOTED: usize = 200;

/// One reply of the helper for a run.
#[derive(Debug)]
pub(super) enum HelperReply {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(i32),
    /// The run could not start; the message says why.
    Failed(String),
    /// The helper is up; runs are sealed off from the channel under this
    /// Landlock ABI version, or not at all when it is 0 (or an older
    /// helper that does not say).
    Hello {
        landlock: u32,
    },
}

pub(super) type Routes = Arc<Mutex<HashMap<u64, mpsc::Sender<HelperReply>>>>;

/// A piece of what the sandbox's end of the channel wrote.
#[derive(Debug)]
pub enum Output {
    /// On the helper's stdout, where its replies are.
    Replies(Bytes),
    /// On its stderr: never the helper's (the boot script's, or a
    /// process's that reached the channel).
    Foreign(Bytes),
}

/// How fast the reader takes the replies' stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// [`CHANNEL_RATE`] after [`CHANNEL_BURST`]: docker's attach stream.
    Paced,
    /// As fast as it comes: a pipe of the server's own.
    Unpaced,
}

/// Routes each reply on `output` to its run until the stream ends, then
/// cancels `closed`.
pub(super) async fn read_replies(
    mut output: impl Stream<Item = Output> + Unpin,
    routes: Routes,
    closed: CancellationToken,
    container: String,
    pacing: Pacing,
) {
    let _closed = closed.drop_guard();
    let mut lines = Lines::default();
    let mut channel = match pacing {
        Pacing::Paced => Some(Pace::new(CHANNEL_RATE, CHANNEL_BURST)),
        Pacing::Unpaced => None,
    };
    let mut foreign = Foreign::new(container);
    while let Some(chunk) = output.next().await {
        let data = match chunk {
            Output::Replies(data) => data,
            Output::Foreign(data) => {
                foreign.pace(&data).await;
                continue;
            }
        };
        if let Some(channel) = &mut channel {
            channel.take(data.len()).await;
        }
        lines.push(data);
        while let Some(line) = lines.next_line() {
            match line {
                Line::Complete(text) => match parse_reply(&text) {
                    Some((id, reply)) => {
                        let route = lock(&routes).get(&id).cloned();
                        if let Some(route) = route {
                            // A run whose caller went away just loses its
                            // replies.
                            let _ = route.send(reply).await;
                        }
                    }
                    None => foreign.pace(&text).await,
                },
                Line::Dropped(text) => foreign.pace(&text).await,
            }
        }
    }
    // The container is gone (removed, or stopped): runs waiting for replies
    // are told so by their channel closing, rather than wait to time out.
    lock(&routes).clear();
}

/// What [`Lines`] cuts from the stream.
#[derive(Debug, PartialEq)]
enum Line {
    /// A line of at most [`MAX_LINE`] bytes, without its newline.
    Complete(Bytes),
    /// Bytes of a line that grew past [`MAX_LINE`], dropped as they come.
    Dropped(Bytes),
}

/// Cuts a byte stream into lines, scanning each byte once and holding at
/// most [`MAX_LINE`] bytes of an unfinished line.
#[derive(Default)]
struct Lines {
    /// What came and is not cut yet.
    chunk: Bytes,
    /// The start of a line whose end has not come yet.
    pending: BytesMut,
    /// The line being read passed [`MAX_LINE`]: the rest of it goes too.
    overlong: bool,
}

impl Lines {
    /// Takes the next chunk; call only once [`Lines::next_line`] has used
    /// up the previous one.
    fn push(&mut self, chunk: Bytes) {
        debug_assert!(self.chunk.is_empty());
        self.chunk = chunk;
    }

    /// The next line of what was pushed, or `None` once the chunk is used
    /// up (an unfinished line is kept for the next).
    fn next_line(&mut self) -> Option<Line> {
        if self.chunk.is_empty() {
            return None;
        }
        let Some(end) = self.chunk.iter().position(|byte| *byte == b'\n') else {
            let rest = std::mem::take(&mut self.chunk);
            if self.overlong {
                return Some(Line::Dropped(rest));
            }
            if self.pending.len() + rest.len() > MAX_LINE {
                self.overlong = true;
                let mut dropped = std::mem::take(&mut self.pending);
                dropped.extend_from_slice(&rest);
                return Some(Line::Dropped(dropped.freeze()));
            }
            self.pending.extend_from_slice(&rest);
            return None;
        };
        let mut line = self.chunk.split_to(end + 1);
        line.truncate(end);
        if std::mem::take(&mut self.overlong) {
            return Some(Line::Dropped(line));
        }
        if self.pending.len() + line.len() > MAX_LINE {
            let mut dropped = std::mem::take(&mut self.pending);
            dropped.extend_from_slice(&line);
            return Some(Line::Dropped(dropped.freeze()));
        }
        if self.pending.is_empty() {
            return Some(Line::Complete(line));
        }
        self.pending.extend_from_slice(&line);
        Some(Line::Complete(std::mem::take(&mut self.pending).freeze()))
    }
}

/// The sandbox's own output on the helper's channel: counted, logged now
/// and then, and read no faster than [`FOREIGN_RATE`].
struct Foreign {
    container: String,
    pace: Pace,
    /// Counts since the last log line, and the first bytes seen since.
    bytes: u64,
    lines: u64,
    quoted: Vec<u8>,
    logged: Option<Instant>,
}

impl Foreign {
    fn new(container: String) -> Foreign {
        Foreign {
            container,
            pace: Pace::new(FOREIGN_RATE, FOREIGN_BURST),
            bytes: 0,
            lines: 0,
            quoted: Vec::new(),
            logged: None,
        }
    }

    /// Counts `data`, logs when it is time, and waits when the sandbox
    /// writes faster than the rate.
    async fn pace(&mut self, data: &[u8]) {
        let now = Instant::now();
        self.bytes += data.len() as u64;
        self.lines += 1;
        let room = QUOTED.saturating_sub(self.quoted.len());
        self.quoted.extend_from_slice(&data[..data.len().min(room)]);
        if self.logged.is_none_or(|at| now - at >= LOG_EVERY) {
            tracing::warn!(
                container = %self.container,
                bytes = self.bytes,
                lines = self.lines,
                first = %String::from_utf8_lossy(&self.quoted).escape_debug(),
                "the sandbox wrote on the exec helper's channel; what is not a reply of the helper is dropped"
            );
            (self.bytes, self.lines, self.logged) = (0, 0, Some(now));
            self.quoted.clear();
        }
        self.pace.take(data.len()).await;
    }
}

/// A byte rate with a burst (a token bucket).
struct Pace {
    rate: f64,
    burst: f64,
    /// Bytes the rate still lets through at once; below zero, the reader
    /// owes a pause.
    allowance: f64,
    refilled: Instant,
}

impl Pace {
    fn new(rate: f64, burst: f64) -> Pace {
        Pace {
            rate,
            burst,
            allowance: burst,
            refilled: Instant::now(),
        }
    }

    /// Counts `bytes`, waiting first when they are over the rate.
    async fn take(&mut self, bytes: usize) {
        let now = Instant::now();
        let earned = (now - self.refilled).as_secs_f64() * self.rate;
        self.refilled = now;
        self.allowance = (self.allowance + earned).min(self.burst) - bytes as f64;
        if self.allowance < 0.0 {
            let owed = Duration::from_secs_f64(-self.allowance / self.rate);
            tokio::time::sleep(owed.max(MIN_PAUSE)).await;
        }
    }
}

fn parse_reply(line: &[u8]) -> Option<(u64, HelperReply)> {
    let line = std::str::from_utf8(line).ok()?;
    let mut fields = line.split(' ');
    let (tag, id) = (fields.next()?, fields.next()?.parse().ok()?);
    let data = fields.next();
    if fields.next().is_some() {
        return None;
    }
    let reply = match (tag, data) {
        ("o", Some(data)) => HelperReply::Stdout(hex::decode(data).ok()?.into()),
        ("e", Some(data)) => HelperReply::Stderr(hex::decode(data).ok()?.into()),
        ("x", Some(code)) => HelperReply::Exit(code.parse().ok()?),
        ("f", Some(message)) => {
            HelperReply::Failed(String::from_utf8_lossy(&hex::decode(message).ok()?).into_owned())
        }
        ("h", None) => HelperReply::Hello { landlock: 0 },
        ("h", Some(abi)) => HelperReply::Hello {
            landlock: abi.parse().ok()?,
        },
        _ => return None,
    };
    Some((id, reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_and_garbage_is_skipped() {
        assert!(
            matches!(parse_reply(b"o 7 6869"), Some((7, HelperReply::Stdout(d))) if &d[..] == b"hi")
        );
        assert!(matches!(parse_reply(b"e 7 "), Some((7, HelperReply::Stderr(d))) if d.is_empty()));
        assert!(matches!(
            parse_reply(b"x 9 137"),
            Some((9, HelperReply::Exit(137)))
        ));
        assert!(matches!(
            parse_reply(b"h 3 6"),
            Some((3, HelperReply::Hello { landlock: 6 }))
        ));
        // A helper from before Landlock does not say.
        assert!(matches!(
            parse_reply(b"h 3"),
            Some((3, HelperReply::Hello { landlock: 0 }))
        ));
        assert!(matches!(parse_reply(b"f 1 6e6f"), Some((1, HelperReply::Failed(m))) if m == "no"));
        for garbage in [
            &b"6869"[..],
            b"o x 68",
            b"o 1 zz",
            b"x 1",
            b"h 1 yes",
            b"h 1 2 3",
            b"",
            b"\xff",
        ] {
            assert!(parse_reply(garbage).is_none(), "{garbage:?}");
        }
    }

    /// Feeds `chunks` and returns every line cut, checking after each
    /// chunk that no more than [`MAX_LINE`] bytes are held.
    fn cut(lines: &mut Lines, chunks: impl IntoIterator<Item = Bytes>) -> Vec<Line> {
        let mut cut = Vec::new();
        for chunk in chunks {
            lines.push(chunk);
            cut.extend(std::iter::from_fn(|| lines.next_line()));
            assert!(lines.pending.len() <= MAX_LINE, "{}", lines.pending.len());
        }
        cut
    }

    fn complete(text: &str) -> Line {
        Line::Complete(Bytes::copy_from_slice(text.as_bytes()))
    }

    #[test]
    fn lines_split_across_chunks_are_joined() {
        let chunks = ["o 5 68", "69\nx 5", " 0\n\nh 1 7\n"].map(Bytes::from);
        assert_eq!(
            cut(&mut Lines::default(), chunks),
            [
                complete("o 5 6869"),
                complete("x 5 0"),
                complete(""),
                complete("h 1 7")
            ]
        );
    }

    #[test]
    fn a_line_longer_than_the_cap_is_dropped_whole() {
        let long = Bytes::from(format!("o 5 {}", "61".repeat(MAX_LINE)));
        let mut lines = Lines::default();
        // Cut mid-way, in one chunk with the next line, and at the cap.
        for chunks in [
            vec![
                long.slice(..100),
                long.slice(100..),
                Bytes::from_static(b"\nx 5 0\n"),
            ],
            vec![Bytes::from([&long[..], b"\nx 5 0\n"].concat())],
            vec![long.slice(..MAX_LINE), Bytes::from_static(b"6\nx 5 0\n")],
        ] {
            let cut = cut(&mut lines, chunks);
            let (last, dropped) = cut.split_last().expect("lines");
            assert_eq!(*last, complete("x 5 0"));
            assert!(dropped.iter().all(|line| matches!(line, Line::Dropped(_))));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_without_newlines_is_dropped_paced_and_the_reply_still_routes() {
        const FLOOD: usize = 64 << 20;
        let garbage = Bytes::from(vec![b'z'; 64 << 10]);
        let flood = std::iter::repeat_n(garbage.clone(), FLOOD / garbage.len())
            .chain([Bytes::from_static(b"\no 5 6869\nx 5 0\n")])
            .map(Output::Replies);
        let routes = Routes::default();
        let (tx, mut replies) = mpsc::channel(8);
        lock(&routes).insert(5, tx);
        let started = Instant::now();
        read_replies(
            futures::stream::iter(flood),
            routes,
            CancellationToken::new(),
            "flooded".into(),
            Pacing::Paced,
        )
        .await;
        assert!(matches!(replies.recv().await, Some(HelperReply::Stdout(d)) if &d[..] == b"hi"));
        assert!(matches!(replies.recv().await, Some(HelperReply::Exit(0))));
        // Past the burst the reader took the flood at the rate only.
        let paced = (FLOOD as f64 - FOREIGN_BURST) / FOREIGN_RATE;
        assert!(
            started.elapsed().as_secs_f64() >= paced,
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn replies_are_read_at_the_channel_rate() {
        let line = Bytes::from(format!("o 5 {}\n", "79".repeat(1024)));
        let count = (48 << 20) / line.len();
        let replies = std::iter::repeat_n(line.clone(), count).map(Output::Replies);
        let routes = Routes::default();
        let (tx, mut received) = mpsc::channel(8);
        lock(&routes).insert(5, tx);
        let started = Instant::now();
        let reader = tokio::spawn(read_replies(
            futures::stream::iter(replies),
            routes,
            CancellationToken::new(),
            "chatty".into(),
            Pacing::Paced,
        ));
        for _ in 0..count {
            let reply = received.recv().await;
            assert!(matches!(reply, Some(HelperReply::Stdout(d)) if d.len() == 1024));
        }
        reader.await.expect("the reader");
        let paced = ((count * line.len()) as f64 - CHANNEL_BURST) / CHANNEL_RATE;
        assert!(
            started.elapsed().as_secs_f64() >= paced,
            "{:?}",
            started.elapsed()
        );
    }
}
