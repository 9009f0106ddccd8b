//! Sandboxes beyond this manager's own slots: those another process on
//! the same data directory made for a session (`conclave mcp` beside the
//! server), expired ones of any instance on the host, and this instance's
//! as the backend lists them.

use std::path::PathBuf;
use std::sync::Arc;

use uuid::Uuid;

use super::{SandboxManager, lock};
use crate::sandbox::{ManagedSandbox, Result, Sandbox};

/// Which sessions have a sandbox that a process on this data directory
/// made: an empty file per session, named by its id. A process looks for
/// another's sandbox of a session (a listing of the backend, a round trip
/// of milliseconds on docker) only when the session has one, so a new
/// session's first lease goes straight to the warm pool.
#[derive(Clone, Debug)]
pub struct Marks {
    dir: PathBuf,
}

impl Marks {
    /// Marks in `dir`, made now when it is not there.
    pub fn new(dir: PathBuf) -> Marks {
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "the directory of sessions' sandbox marks could not be made");
        }
        Marks { dir }
    }

    fn path(&self, session: Uuid) -> PathBuf {
        self.dir.join(session.to_string())
    }

    /// Says that `session` has a sandbox.
    pub(super) fn set(&self, session: Uuid) {
        if let Err(e) = std::fs::File::create(self.path(session)) {
            tracing::warn!(%session, dir = %self.dir.display(), error = %e, "a session's sandbox could not be marked; another process on this data directory will not find it");
        }
    }

    fn has(&self, session: Uuid) -> bool {
        self.path(session).exists()
    }

    /// Says that `session`'s sandbox is gone.
    pub(super) fn clear(&self, session: Uuid) {
        let _ = std::fs::remove_file(self.path(session));
    }
}

impl SandboxManager {
    /// The server instance whose sandboxes these are.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Marks each session's sandbox in `dir` (the data directory's), so
    /// that a process on the same data directory finds it without listing
    /// the backend for every new session.
    pub fn with_marks(mut self, dir: PathBuf) -> SandboxManager {
        self.marks = Some(Marks::new(dir));
        self
    }

    /// Counts each session's sandbox against its key's `max_sandboxes`.
    pub fn with_quotas(mut self, quotas: std::sync::Arc<crate::quota::Quotas>) -> SandboxManager {
        self.quotas = Some(super::quota::SandboxQuotas { quotas });
        self
    }

    /// The secrets sessions may put in their sandboxes' environment.
    pub fn with_secrets(mut self, secrets: crate::sandbox::secrets::SecretStore) -> SandboxManager {
        self.secrets = std::sync::Arc::new(secrets);
        self
    }

    pub fn secrets(&self) -> &crate::sandbox::secrets::SecretStore {
        &self.secrets
    }

    /// The egress proxy of sandboxes given an allow-list.
    pub fn with_proxy(
        mut self,
        proxy: std::sync::Arc<crate::sandbox::proxy::EgressProxy>,
    ) -> SandboxManager {
        self.proxy = Some(proxy);
        self
    }

    pub fn proxy(&self) -> Option<&std::sync::Arc<crate::sandbox::proxy::EgressProxy>> {
        self.proxy.as_ref()
    }

    /// Destroys the session's sandbox wherever it came from: this manager's,
    /// or one another process on this data directory made (the session was
    /// deleted).
    pub async fn release_shared(&self, session: Uuid) {
        let held = lock(&self.slots).contains_key(&session);
        self.release(session).await;
        if !held {
            match self.existing(session).await {
                Ok(Some(sandbox)) => {
                    if let Err(e) = sandbox.destroy().await {
                        tracing::warn!(%session, error = %e, "destroying a sandbox failed");
                    }
                    if let Some(marks) = &self.marks {
                        marks.clear(session);
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(%session, error = %e, "listing sandboxes failed"),
            }
        }
    }

    /// Removes every expired sandbox on the backend, this instance's or
    /// another's (one whose server stopped, or whose data directory is
    /// gone). A session of this instance whose sandbox expired gets a new
    /// one at its next call. Returns how many went.
    pub async fn prune_expired(&self) -> Result<usize> {
        let now = chrono::Utc::now().timestamp();
        let mut removed = 0;
        for managed in self.backend.list_managed().await? {
            if !managed.expired(now) {
                continue;
            }
            let ours = managed.instance.as_deref() == Some(self.instance.as_str());
            let session = managed
                .session
                .as_deref()
                .and_then(|s| Uuid::parse_str(s).ok())
                .filter(|s| ours && lock(&self.slots).contains_key(s));
            match session {
                Some(session) => self.release(session).await,
                None => {
                    if ours {
                        // A pool sandbox: take it out of the pool first.
                        lock(&self.pool).retain(|s| s.id() != managed.id);
                    }
                    self.backend.remove(&managed.id).await?;
                }
            }
            tracing::info!(sandbox = %managed.id, instance = ?managed.instance, "expired sandbox removed");
            removed += 1;
        }
        Ok(removed)
    }

    /// Removes a sandbox that belongs to no session (a pool or scratch one).
    pub async fn remove(&self, id: &str) -> Result<()> {
        lock(&self.pool).retain(|s| s.id() != id);
        self.backend.remove(id).await
    }

    /// Takes over the session's sandbox that another instance made (a
    /// replica that stopped, on the same docker daemon or kubernetes
    /// namespace): the session's next call attaches to it instead of
    /// making a new one. Answers the instance it came from, or `None`
    /// when there is none to take.
    pub async fn adopt(&self, session: Uuid) -> Result<Option<String>> {
        let wanted = session.to_string();
        let theirs = self.backend.list_managed().await?.into_iter().find(|m| {
            m.session.as_deref() == Some(wanted.as_str())
                && m.instance.as_deref() != Some(self.instance.as_str())
        });
        let Some(theirs) = theirs else {
            return Ok(None);
        };
        lock(&self.found).insert(session, theirs.id.clone());
        Ok(Some(theirs.instance.unwrap_or_default()))
    }

    /// This instance's sandboxes on the backend.
    pub async fn list(&self) -> Result<Vec<ManagedSandbox>> {
        Ok(self
            .backend
            .list_managed()
            .await?
            .into_iter()
            .filter(|m| m.instance.as_deref() == Some(self.instance.as_str()))
            .collect())
    }

    /// The running sandbox of this instance labelled with `session`, if
    /// any.
    pub(super) async fn existing(&self, session: Uuid) -> Result<Option<Arc<dyn Sandbox>>> {
        if let Some(marks) = &self.marks
            && !marks.has(session)
        {
            return Ok(None);
        }
        let wanted = session.to_string();
        let found = self.backend.list_managed().await?.into_iter().find(|m| {
            m.instance.as_deref() == Some(self.instance.as_str())
                && m.session.as_deref() == Some(wanted.as_str())
        });
        match found {
            Some(managed) => self.backend.attach(&managed.id).await,
            None => {
                // Left by a process that stopped before its sandbox went.
                if let Some(marks) = &self.marks {
                    marks.clear(session);
                }
                Ok(None)
            }
        }
    }
}
