//! What an exec reads on its stdin.

use std::sync::Arc;

use bytes::Bytes;

/// What an exec reads on its stdin.
#[derive(Debug, Clone, PartialEq)]
pub enum Stdin {
    Bytes(Bytes),
    /// A file of the server's, streamed as it is read (an upload spooled
    /// to disk), never held in memory whole.
    File(std::path::PathBuf),
    /// Pieces sent on a channel as they come (an upload checked as it
    /// arrives), written until the sender is dropped.
    Channel(ChannelStdin),
}

/// The receiving end of a [`Stdin::Channel`], read by one exec.
#[derive(Clone)]
pub struct ChannelStdin(Arc<tokio::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Bytes>>>>);

impl ChannelStdin {
    pub fn new(receiver: tokio::sync::mpsc::Receiver<Bytes>) -> ChannelStdin {
        ChannelStdin(Arc::new(tokio::sync::Mutex::new(Some(receiver))))
    }
}

impl std::fmt::Debug for ChannelStdin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChannelStdin")
    }
}

impl PartialEq for ChannelStdin {
    fn eq(&self, other: &ChannelStdin) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Stdin {
    /// Writes all of it to `to`, then shuts `to` down.
    pub async fn write_to<W>(&self, to: &mut W) -> std::io::Result<()>
    where
        W: tokio::io::AsyncWrite + Unpin + ?Sized,
    {
        use tokio::io::AsyncWriteExt;
        match self {
            Stdin::Bytes(data) => to.write_all(data).await?,
            Stdin::File(path) => {
                // Large reads: each read of a tokio file is a hop to the
                // blocking pool.
                let file = tokio::fs::File::open(path).await?;
                let mut file = tokio::io::BufReader::with_capacity(1 << 20, file);
                tokio::io::copy_buf(&mut file, to).await?;
            }
            Stdin::Channel(channel) => {
                let taken = channel.0.lock().await.take();
                if let Some(mut pieces) = taken {
                    while let Some(piece) = pieces.recv().await {
                        to.write_all(&piece).await?;
                    }
                }
            }
        }
        to.shutdown().await
    }

    /// The bytes, for a path that carries only bytes (the docker helper's
    /// channel); `None` for a file.
    pub fn bytes(&self) -> Option<&Bytes> {
        match self {
            Stdin::Bytes(data) => Some(data),
            Stdin::File(_) | Stdin::Channel(_) => None,
        }
    }
}

impl From<Bytes> for Stdin {
    fn from(data: Bytes) -> Stdin {
        Stdin::Bytes(data)
    }
}
