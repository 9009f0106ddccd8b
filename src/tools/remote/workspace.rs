//! A session's workspace among replicas outside its tool calls: the
//! snapshot of a turn end that ran on another replica than the sandbox's,
//! waiting for snapshots under way there, and holding the live workspace
//! for an upload or a download.

use uuid::Uuid;

use super::{ClusterTools, Forwarded, OWNERS, Owner, Request};
use crate::agent::tools::NotHeldHere;
use crate::agent::{AgentOptions, ToolContext};
use crate::protocol::FilesChanged;

impl ClusterTools {
    /// The replica the store names as the holder of the session's tools,
    /// when it is another one; nothing is claimed.
    async fn holder_elsewhere(&self, session: Uuid) -> Option<String> {
        if crate::sync::lock(&self.held_here).contains_key(&session) {
            return None;
        }
        match self.store.kv_get(OWNERS, &session.to_string()).await {
            Ok(Some(entry)) if entry.value != self.instance.as_bytes() => {
                Some(String::from_utf8_lossy(&entry.value).into_owned())
            }
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(%session, error = %e, "finding a session's sandbox");
                None
            }
        }
    }

    fn request(session: Uuid, owner: Option<&str>, seq: Option<u64>) -> Request {
        Request {
            session_id: session,
            options: AgentOptions::default(),
            owner: owner.map(str::to_owned),
            call: None,
            seq,
        }
    }

    /// Has the turn end `seq` snapshotted where the sandbox is: here, or
    /// on its replica, told over NATS (its answer comes once the snapshot
    /// is under way there, so a reader of the result waits for it). Where this
    /// replica carried the session's calls it knows that replica; a turn
    /// that called no tool asks the store (only sessions that outlive
    /// their turn have turn ends: an ephemeral run asks nothing).
    pub(super) async fn forward_turn_end(&self, session: Uuid, owner: Option<&str>, seq: u64) {
        if crate::sync::lock(&self.held_here).contains_key(&session) {
            return self.local.turn_ended(session, owner, seq).await;
        }
        let known = crate::sync::lock(&self.held_there).get(&session).cloned();
        let holder = match known {
            Some(replica) => Some(replica),
            None => self.holder_elsewhere(session).await,
        };
        match holder {
            Some(replica) => {
                let request = Self::request(session, owner, Some(seq));
                let told = self
                    .exchange(&replica, "turn_ended", &request, None, |_| Ok(Some(())))
                    .await;
                if let Forwarded::Failed(e) = told {
                    tracing::warn!(%session, seq, error = %e, "the turn end's snapshot was not asked for");
                }
            }
            None => self.local.turn_ended(session, owner, seq).await,
        }
    }

    /// What the turn's calls changed, told where they ran: here, or by
    /// the replica holding the sandbox (`None` when it cannot say).
    /// A replica that carried none of the session's calls ran none of
    /// this turn's: nothing changed here (no store read).
    pub(super) async fn changes_where_held(&self, ctx: &ToolContext) -> Option<FilesChanged> {
        let known = crate::sync::lock(&self.held_there)
            .get(&ctx.session_id)
            .cloned();
        let Some(replica) = known else {
            return self.local.turn_changes(ctx).await;
        };
        let mut request = Self::request(ctx.session_id, ctx.owner.as_deref(), None);
        request.options = (*ctx.options).clone();
        let read = |body: bytes::Bytes| {
            serde_json::from_slice::<Option<FilesChanged>>(&body)
                .map(Some)
                .map_err(|e| e.to_string())
        };
        match self
            .exchange(&replica, "turn_changes", &request, None, read)
            .await
        {
            Forwarded::Answered(changes) => changes,
            _ => None,
        }
    }

    /// Waits for the session's snapshots under way, here or on the replica
    /// holding its sandbox (one that stopped has none under way).
    pub(super) async fn settle_snapshots(&self, session: Uuid) {
        match self.holder_elsewhere(session).await {
            Some(replica) => {
                let request = Self::request(session, None, None);
                let _ = self
                    .exchange(&replica, "snapshots_settled", &request, None, |_| {
                        Ok(Some(()))
                    })
                    .await;
            }
            None => self.local.snapshots_settled(session).await,
        }
    }

    /// Makes the session's live workspace this replica's, as its first
    /// tool call would (claimed when nobody holds it, taken over from a
    /// replica that stopped).
    pub(super) async fn hold(&self, session: Uuid) -> Result<(), NotHeldHere> {
        let failed = |e: crate::store::StoreError| NotHeldHere::Unknown(e.to_string());
        loop {
            let (replica, revision) = match self.owner(session).await {
                Err(e) => return Err(failed(e)),
                Ok(Owner::Here { .. }) => return Ok(()),
                Ok(Owner::There { replica, revision }) => (replica, revision),
            };
            if self.alive(&replica).await {
                return Err(NotHeldHere::Replica(replica));
            }
            match self.take_over(session, revision).await {
                Err(e) => return Err(failed(e)),
                Ok(None) => continue,
                Ok(Some(taken)) => {
                    crate::sync::lock(&self.held_here).insert(session, taken);
                    self.local.adopt(session).await;
                    return Ok(());
                }
            }
        }
    }
}
