//! A sandbox's bulk output over a socket of its own: the tar of a
//! workspace (a download, a turn end's snapshot) written by the sandbox's
//! process straight to a TCP listener the server binds on `127.0.0.1` of
//! the sandbox's network namespace, instead of through the exec helper's
//! channel. On docker that channel is the attach stream, which goes
//! through the container's shim, a FIFO, dockerd and its multiplexed
//! framing: three processes and five copies of every byte, which made a
//! 100 MB download about as slow as `docker exec tar` from the CLI. On
//! local it is a pipe, but the helper hex-encodes what it carries. Over
//! the socket the bytes cross the kernel once on the way to the server.
//!
//! The command still runs as an exec (through the helper where it runs),
//! as the sandbox's own user, confined as every exec is: only its stdout
//! is redirected, by a `bash` wrapper that connects with `/dev/tcp` and
//! first writes a token only this exec was told, so a connection from
//! another process of the sandbox is dropped. The listener exists for
//! one exec and is reachable only inside the sandbox's namespace.
//!
//! It needs the server on the sandbox's host with the right to enter its
//! network namespace (root), and `bash` in the image: where either is
//! missing the exec goes another way (docker: `docker exec`; local: a
//! container of its own).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::sandbox::{ExecChunk, ExecRequest, ExecStatus, SandboxError};

/// The wrapper's exit status when it cannot reach the listener.
const UNREACHABLE: i64 = 93;
/// The size of the pieces the output is read and passed on in.
const PIECE: usize = 256 * 1024;
/// How long a connection may take to send its token.
const TOKEN_WAIT: Duration = Duration::from_secs(2);
/// How long the output may go on after the exec ended (what the socket
/// still holds is read in far less).
const AFTER_END: Duration = Duration::from_secs(10);

/// Connects stdout to the listener, sends the token, then runs the
/// command with stdout on the socket (stderr stays the exec's).
const WRAPPER: &str = r#"exec 3<>"/dev/tcp/127.0.0.1/$CONCLAVE_BULK_PORT" || exit 93
printf '%s' "$CONCLAVE_BULK_TOKEN" >&3
unset CONCLAVE_BULK_PORT CONCLAVE_BULK_TOKEN
exec "$@" >&3 3>&-"#;

/// One exec's listener and the token its connection must start with.
pub(super) struct Channel {
    listener: TcpListener,
    port: u16,
    token: String,
}

/// How the output over the socket ended.
#[derive(Debug)]
pub(super) enum Received {
    /// No connection with the token came: the wrapper could not connect
    /// (or did not run).
    Nothing,
    /// The connection ended: all of the output was passed on.
    Whole,
    /// Reading failed, the output did not end in time after the exec, or
    /// the receiver of the output went away.
    Cut(String),
}

impl Channel {
    /// Binds a listener on `127.0.0.1:0` of process `pid`'s network
    /// namespace (a thread enters it, binds and exits).
    pub(super) fn open(pid: u32) -> io::Result<Channel> {
        let namespace = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
        let listener = std::thread::Builder::new()
            .name("bulk-bind".into())
            .spawn(move || {
                // SAFETY: setns on a descriptor this thread owns moves only
                // this thread, which binds one socket and exits.
                if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
                listener.set_nonblocking(true)?;
                Ok(listener)
            })?
            .join()
            .map_err(|_| io::Error::other("the thread binding the bulk listener panicked"))??;
        let port = listener.local_addr()?.port();
        Ok(Channel {
            listener: TcpListener::from_std(listener)?,
            port,
            token: Uuid::new_v4().simple().to_string(),
        })
    }

    /// `request` with its stdout sent to this channel.
    pub(super) fn wrap(&self, request: &ExecRequest) -> ExecRequest {
        let mut command = vec![
            "/bin/bash".to_owned(),
            "-c".to_owned(),
            WRAPPER.to_owned(),
            "conclave-bulk".to_owned(),
        ];
        command.extend(request.command.iter().cloned());
        let mut env = request.env.clone();
        env.insert("CONCLAVE_BULK_PORT".into(), self.port.to_string());
        env.insert("CONCLAVE_BULK_TOKEN".into(), self.token.clone());
        ExecRequest {
            command,
            stdin: None,
            timeout: request.timeout,
            workdir: request.workdir.clone(),
            env,
        }
    }

    /// Passes on what the connection carrying the token sends, in pieces
    /// of up to 256 KiB, until it ends. `ended` is cancelled once the exec
    /// has ended: with no connection by then, there will be none.
    /// `reached` is cancelled once the connection is made.
    pub(super) async fn receive(
        self,
        output: &mpsc::Sender<ExecChunk>,
        ended: &CancellationToken,
        reached: &CancellationToken,
    ) -> Received {
        let Some(mut stream) = self.connection(ended).await else {
            return Received::Nothing;
        };
        reached.cancel();
        let late = async {
            ended.cancelled().await;
            tokio::time::sleep(AFTER_END).await;
        };
        tokio::pin!(late);
        loop {
            let mut piece = BytesMut::with_capacity(PIECE);
            let read = tokio::select! {
                read = read_piece(&mut stream, &mut piece) => read,
                () = &mut late => {
                    return Received::Cut(format!(
                        "the output went on {} s after the command ended",
                        AFTER_END.as_secs()
                    ));
                }
            };
            match read {
                Ok(()) if piece.is_empty() => return Received::Whole,
                Ok(()) => {
                    if output
                        .send(ExecChunk::Stdout(piece.freeze()))
                        .await
                        .is_err()
                    {
                        return Received::Cut("the output's receiver went away".into());
                    }
                }
                Err(e) => return Received::Cut(format!("reading the output: {e}")),
            }
        }
    }

    /// The first connection that starts with the token.
    async fn connection(&self, ended: &CancellationToken) -> Option<TcpStream> {
        loop {
            let accepted = tokio::select! {
                biased;
                accepted = self.listener.accept() => accepted,
                () = ended.cancelled() => {
                    // A connection made just before the end waits in the
                    // backlog: the kernel completed it before the command ran.
                    match tokio::time::timeout(Duration::from_millis(50), self.listener.accept())
                        .await
                    {
                        Ok(accepted) => accepted,
                        Err(_) => return None,
                    }
                }
            };
            let Ok((mut stream, _)) = accepted else {
                return None;
            };
            let mut got = vec![0u8; self.token.len()];
            let read = tokio::time::timeout(TOKEN_WAIT, stream.read_exact(&mut got)).await;
            if matches!(read, Ok(Ok(_))) && got == self.token.as_bytes() {
                return Some(stream);
            }
            tracing::debug!("a connection to a bulk listener without its token: dropped");
        }
    }
}

/// Passes on what the wrapped exec itself sends (its stderr) once its
/// command reached the channel (`reached`); what came before is held and
/// returned, since it may be the wrapper's own complaint (no bash) that
/// the attach stream's run of the command must not repeat.
async fn forward_own(
    mut own: mpsc::Receiver<ExecChunk>,
    output: &mpsc::Sender<ExecChunk>,
    reached: &CancellationToken,
) -> Vec<ExecChunk> {
    let mut held = Vec::new();
    while let Some(chunk) = own.recv().await {
        if !reached.is_cancelled() {
            held.push(chunk);
            continue;
        }
        for chunk in held.drain(..).chain([chunk]) {
            let _ = output.send(chunk).await;
        }
    }
    held
}

/// What [`exec_over`] came to.
pub(super) enum Over {
    /// The command ran with its stdout on the channel (or failed).
    Done(Result<ExecStatus, SandboxError>),
    /// The command never reached the channel: nothing of it ran, and the
    /// caller runs it another way. `no_bash` when the image has no bash,
    /// which will not change.
    Fallback { no_bash: bool },
}

/// Runs `request` through `exec` with its stdout on `channel`; `sandbox`
/// names the sandbox in errors.
pub(super) async fn exec_over<F>(
    channel: Channel,
    request: &ExecRequest,
    output: &mpsc::Sender<ExecChunk>,
    sandbox: &str,
    exec: impl FnOnce(ExecRequest, mpsc::Sender<ExecChunk>) -> F,
) -> Over
where
    F: Future<Output = Result<ExecStatus, SandboxError>>,
{
    let wrapped = channel.wrap(request);
    let (ended, reached) = (CancellationToken::new(), CancellationToken::new());
    let (own_tx, own) = mpsc::channel(16);
    let run = async {
        let status = exec(wrapped, own_tx).await;
        ended.cancel();
        status
    };
    let (status, received, held) = tokio::join!(
        run,
        channel.receive(output, &ended, &reached),
        forward_own(own, output, &reached)
    );
    let unreached = |status: &Result<ExecStatus, SandboxError>| matches!(status, Ok(s) if matches!(s.exit_code, Some(UNREACHABLE | 127)));
    let fallback = matches!(received, Received::Nothing) && unreached(&status);
    if !fallback {
        for chunk in held {
            let _ = output.send(chunk).await;
        }
    }
    match (received, status) {
        (Received::Nothing, Ok(status)) if matches!(status.exit_code, Some(UNREACHABLE | 127)) => {
            Over::Fallback {
                no_bash: status.exit_code == Some(127),
            }
        }
        (Received::Nothing, Ok(status)) if status.exit_code == Some(0) => {
            Over::Done(Err(SandboxError::Backend(format!(
                "sandbox {sandbox}'s bulk output never reached the server"
            ))))
        }
        (Received::Cut(why), Ok(_)) => Over::Done(Err(SandboxError::Backend(format!(
            "sandbox {sandbox}'s bulk output was cut: {why}"
        )))),
        (_, status) => Over::Done(status),
    }
}

/// Reads until `piece` is full or the stream ends (empty at its end).
async fn read_piece(stream: &mut TcpStream, piece: &mut BytesMut) -> io::Result<()> {
    while piece.len() < PIECE {
        if stream.read_buf(piece).await? == 0 {
            break;
        }
        // Pass on what came without waiting for more once the socket
        // holds nothing further.
        if piece.len() >= PIECE / 4 {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A channel on the host's own loopback (pid of this process).
    fn channel() -> Channel {
        Channel::open(std::process::id()).expect("binds in our own namespace")
    }

    #[tokio::test]
    async fn output_after_the_token_is_passed_on_whole() {
        let channel = channel();
        let (port, token) = (channel.port, channel.token.clone());
        let ended = CancellationToken::new();
        let (tx, mut rx) = mpsc::channel(64);
        let writer = tokio::spawn(async move {
            // A stranger first: no token, dropped.
            let mut stranger = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            stranger.write_all(b"x").await.unwrap();
            drop(stranger);
            let mut ours = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            ours.write_all(token.as_bytes()).await.unwrap();
            ours.write_all(&vec![5u8; 1_000_000]).await.unwrap();
        });
        let received = channel
            .receive(&tx, &ended, &CancellationToken::new())
            .await;
        writer.await.unwrap();
        assert!(matches!(received, Received::Whole), "{received:?}");
        let mut total = 0;
        while let Ok(ExecChunk::Stdout(piece)) = rx.try_recv() {
            assert!(piece.iter().all(|b| *b == 5));
            total += piece.len();
        }
        assert_eq!(total, 1_000_000);
    }

    #[tokio::test]
    async fn no_connection_by_the_end_is_nothing() {
        let channel = channel();
        let ended = CancellationToken::new();
        ended.cancel();
        let (tx, _rx) = mpsc::channel(1);
        assert!(matches!(
            channel
                .receive(&tx, &ended, &CancellationToken::new())
                .await,
            Received::Nothing
        ));
    }

    #[tokio::test]
    async fn the_wrapper_keeps_the_command_and_adds_the_channel() {
        let channel = channel();
        let request = ExecRequest::shell("tar -cf - .", Duration::from_secs(5));
        let wrapped = channel.wrap(&request);
        assert_eq!(&wrapped.command[..2], ["/bin/bash", "-c"]);
        assert_eq!(&wrapped.command[4..], &request.command[..]);
        assert_eq!(wrapped.env["CONCLAVE_BULK_PORT"], channel.port.to_string());
        assert_eq!(wrapped.env["CONCLAVE_BULK_TOKEN"], channel.token);
        assert_eq!(wrapped.workdir, request.workdir);
    }
}
