//! An archive unpacked as it arrives: into a staging directory of the
//! workspace, by the sandbox's own tar reading the checked pieces on its
//! stdin, and moved into place only once all of it passed. So receiving
//! and checking overlap with unpacking, and a refused archive still
//! changes nothing: its staging directory goes.
//!
//! Into a directory that is empty (a first upload), the staged entries
//! are renamed into it; into one that already has files, a second tar
//! copies the staged tree over it, as the unpacking tar would have done
//! (replacing a file by unlinking it, never writing through a link).

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{TRANSFER_TIMEOUT, TransferError};
use crate::sandbox::files::{run_within, script_request};
use crate::sandbox::{ChannelStdin, Sandbox, SandboxError, Stdin, WORKSPACE};

/// Pieces queued for the sandbox's tar before the sender waits: with the
/// upload's 512 KiB pieces, 2 MiB of the server's memory at most.
const QUEUED: usize = 4;

/// An archive being unpacked into a staging directory.
pub struct Staged {
    sandbox: Arc<dyn Sandbox>,
    staging: String,
    pieces: Option<mpsc::Sender<Bytes>>,
    tar: Option<JoinHandle<Result<(), TransferError>>>,
    /// Committed or abandoned; dropped otherwise (the request went away
    /// half-way), the staging directory is removed on a task of its own.
    settled: bool,
}

impl Staged {
    /// Starts the sandbox's tar on a new staging directory.
    pub fn start(sandbox: Arc<dyn Sandbox>) -> Staged {
        let staging = format!(
            "{WORKSPACE}/.conclave-upload-{}",
            uuid::Uuid::new_v4().simple()
        );
        let (pieces, received) = mpsc::channel(QUEUED);
        let script = r#"mkdir -p -- "$p" || exit 1
exec tar -C "$p" --no-same-owner -xf -"#;
        let request = script_request(
            script,
            &[&staging],
            Some(Stdin::Channel(ChannelStdin::new(received))),
            TRANSFER_TIMEOUT,
        );
        let running = sandbox.clone();
        let tar = tokio::spawn(async move {
            match run_within(running.as_ref(), request, 4096).await {
                Ok(_) => Ok(()),
                Err(SandboxError::File(m)) if !m.contains("No space left") => {
                    Err(TransferError::Refused(format!("tar in the sandbox: {m}")))
                }
                Err(e) => Err(e.into()),
            }
        });
        Staged {
            sandbox,
            staging,
            pieces: Some(pieces),
            tar: Some(tar),
            settled: false,
        }
    }

    /// Hands checked bytes to the tar; an error when it stopped early
    /// (its own: a full disk, a refusal).
    pub async fn send(&mut self, piece: Bytes) -> Result<(), TransferError> {
        let sent = match &self.pieces {
            Some(pieces) => pieces.send(piece).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        self.pieces = None;
        match self.finish_tar().await {
            Ok(()) => Err(TransferError::Refused(
                "tar in the sandbox stopped before the archive's end".into(),
            )),
            Err(e) => Err(e),
        }
    }

    async fn finish_tar(&mut self) -> Result<(), TransferError> {
        self.pieces = None;
        match self.tar.take() {
            Some(tar) => tar.await.map_err(|e| {
                TransferError::Sandbox(SandboxError::Backend(format!("the unpacking task: {e}")))
            })?,
            None => Ok(()),
        }
    }

    /// Ends the archive and moves what it unpacked into `dir` (absolute,
    /// confined), made first. The staging directory goes either way.
    pub async fn commit(mut self, dir: &str) -> Result<(), TransferError> {
        self.settled = true;
        let unpacked = self.finish_tar().await;
        let moved = match unpacked {
            Ok(()) => self.move_into(dir).await,
            Err(e) => Err(e),
        };
        if moved.is_err() {
            self.remove().await;
        }
        moved
    }

    /// Stops the tar and removes what it unpacked.
    pub async fn abandon(mut self) {
        self.settled = true;
        let _ = self.finish_tar().await;
        self.remove().await;
    }

    async fn move_into(&self, dir: &str) -> Result<(), TransferError> {
        // `$p`: the confined target; `$2`: the staging directory, whose
        // entries are renamed into an empty target or copied over one
        // with files.
        let script = r#"mkdir -p -- "$p" || exit 1
confined "$(realpath -- "$p")" "$1"
s="$2"; name="${s##*/}"
if [ -z "$(ls -A -- "$p" | grep -v -x -F -- "$name")" ]; then
  for e in "$s"/* "$s"/.[!.]* "$s"/..?*; do
    if [ -e "$e" ] || [ -L "$e" ]; then mv -- "$e" "$p"/ || exit 1; fi
  done
else
  tar -C "$s" -cf - . | tar -C "$p" --no-same-owner -xf - || exit 1
fi
rm -rf -- "$s""#;
        let request = script_request(script, &[dir, &self.staging], None, TRANSFER_TIMEOUT);
        match run_within(self.sandbox.as_ref(), request, 4096).await {
            Ok(_) => Ok(()),
            Err(SandboxError::File(m)) if !m.contains("No space left") => {
                Err(TransferError::Refused(format!("tar in the sandbox: {m}")))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn remove(&self) {
        remove(self.sandbox.as_ref(), &self.staging).await;
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        self.pieces = None;
        let (tar, sandbox, staging) = (self.tar.take(), self.sandbox.clone(), self.staging.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Some(tar) = tar {
                    let _ = tar.await;
                }
                remove(sandbox.as_ref(), &staging).await;
            });
        }
    }
}

/// Removes a staging directory.
async fn remove(sandbox: &dyn Sandbox, staging: &str) {
    let request = script_request(r#"rm -rf -- "$p""#, &[staging], None, TRANSFER_TIMEOUT);
    if let Err(e) = run_within(sandbox, request, 4096).await {
        tracing::warn!(%staging, error = %e, "an upload's staging directory stays");
    }
}
