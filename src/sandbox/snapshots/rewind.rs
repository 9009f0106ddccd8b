//! A rewound session's workspace. A rewind to a turn end drops the
//! session's sandbox and records here (`rewound/{session}`) what its next
//! sandbox starts from: the snapshot of that turn end, or, when the session
//! had no sandbox yet, what its first one started from. The record stays
//! until that sandbox is made, so a restart or another replica in between
//! still restores it; the snapshot is held for it meanwhile.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{AtTurn, NAMESPACE, Snapshots, store};
use crate::sandbox::Result;
use crate::store::{Expect, kv_json};

/// What a rewound session's next sandbox starts from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restore {
    /// The turn end the session was rewound to.
    pub seq: u64,
    /// The snapshot of its workspace there; `None`: the session had no
    /// sandbox yet, so the next one starts as its first did (empty, or
    /// from the session's own `from_snapshot`).
    pub snapshot: Option<String>,
    /// Whether the session was added to the snapshot's users for this
    /// restore (and leaves them once it is done).
    pub held: bool,
}

impl Snapshots {
    /// Records that the session's next sandbox starts from its workspace
    /// at the turn end `seq`. False when that workspace is no longer kept
    /// (past `keep_last`, or snapshots are off): nothing is recorded and
    /// the files stay as they are.
    pub async fn rewind(&self, session: Uuid, seq: u64) -> Result<bool> {
        if self.keep_last() == 0 {
            return Ok(false);
        }
        let at = match self.at_turn(session, seq).await? {
            AtTurn::Kept(snapshot) => Some(snapshot),
            AtTurn::Before => None,
            AtTurn::Dropped(_) => return Ok(false),
        };
        let _edit = self.edit.lock().await;
        let before = self.pending(session).await?;
        let restore = match at {
            None => Restore {
                seq,
                snapshot: None,
                held: false,
            },
            // A rewind before the last one's sandbox was made, to the
            // same turn end: its hold stays this one's.
            Some(snapshot)
                if before.as_ref().is_some_and(|b| {
                    b.held && b.snapshot.as_ref() == Some(&snapshot.snapshot_id)
                }) =>
            {
                self.put(
                    &rewound_key(session),
                    &Restore {
                        seq,
                        snapshot: Some(snapshot.snapshot_id),
                        held: true,
                    },
                )
                .await?;
                return Ok(true);
            }
            Some(snapshot) => {
                let held = !snapshot.used_by.contains(&session);
                if held {
                    let kept = self
                        .change(&snapshot.snapshot_id, |s| s.used_by.push(session))
                        .await?;
                    // Deleted since it was looked up (a caller's delete).
                    if kept.is_none() {
                        return Ok(false);
                    }
                }
                Restore {
                    seq,
                    snapshot: Some(snapshot.snapshot_id),
                    held,
                }
            }
        };
        self.put(&rewound_key(session), &restore).await?;
        if let Some(before) = before {
            self.release_hold(session, &before).await?;
        }
        Ok(true)
    }

    /// The restore the session's next sandbox starts from, if it was
    /// rewound since it last had one.
    pub async fn pending(&self, session: Uuid) -> Result<Option<Restore>> {
        kv_json(
            self.store.as_ref(),
            NAMESPACE,
            &rewound_key(session),
            "a rewound workspace",
        )
        .await
        .map_err(store)
    }

    /// The session has a sandbox again (made from `restore`, or one it had
    /// before taken over): the record goes, and the hold on its snapshot.
    pub async fn restored(&self, session: Uuid, restore: &Restore) -> Result<()> {
        let _edit = self.edit.lock().await;
        self.store
            .kv_delete(NAMESPACE, &rewound_key(session), Expect::Any)
            .await
            .map_err(store)?;
        self.release_hold(session, restore).await
    }

    /// Drops the session's use of a restore's snapshot that it took for
    /// the restore alone. The caller holds `edit`.
    async fn release_hold(&self, session: Uuid, restore: &Restore) -> Result<()> {
        if let (true, Some(id)) = (restore.held, &restore.snapshot) {
            self.change(id, |s| s.used_by.retain(|u| *u != session))
                .await?;
        }
        Ok(())
    }

    /// Forgets the session's restore (the session is deleted; its hold
    /// goes with its other uses). The caller holds `edit`.
    pub(super) async fn forget_restore(&self, session: Uuid) -> Result<()> {
        self.store
            .kv_delete(NAMESPACE, &rewound_key(session), Expect::Any)
            .await
            .map_err(store)?;
        Ok(())
    }
}

fn rewound_key(session: Uuid) -> String {
    format!("rewound/{session}")
}
