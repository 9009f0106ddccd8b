//! Forks of an agent session: new sessions whose history is the source's
//! up to a turn end, whose options are the source's with changes on top,
//! and whose sandbox starts from the source's workspace as it was at that
//! turn end (its snapshot, [`crate::sandbox::snapshots`]).
//!
//! The source is only read. Each fork is a session of the caller's key,
//! with usage of its own, whose event log starts with `forked`; its
//! sandbox is made at its first tool call, like any session's, so a fork
//! of many starts no sandbox at once.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use super::profiles::merge_patch;
use crate::protocol::{EventKind, SessionKind, SessionStatus};
use crate::sandbox::SandboxManager;
use crate::sandbox::snapshots::{AtTurn, Snapshots};
use crate::session::{NewSession, OptionError, SessionError, SessionManager};
use crate::store::Store;

/// Events read per page while looking for turn ends.
const PAGE: usize = 4096;

/// `POST /agent/session/{id}/fork`'s body.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// Fork at the last turn that ended at or before this seq; default:
    /// the session as it is now (its last turn end).
    pub at_seq: Option<u64>,
    /// How many forks to make (default 1, at most `agent.max_forks`).
    pub count: Option<u32>,
    /// The forks' name (numbered ` #1`… when there are several).
    pub session_name: Option<String>,
    /// Options changed from the source's, merged on top of them (a JSON
    /// merge patch: objects merge, `null` removes).
    #[schema(value_type = Object)]
    pub options: Option<Map<String, Value>>,
}

/// What a fork made.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Forked {
    pub from_session: Uuid,
    /// The turn end the forks start after (0: before the first turn).
    pub at_seq: u64,
    /// The snapshot the forks' sandboxes start from; `null` for an empty
    /// workspace (the source had no sandbox at that turn end).
    pub from_snapshot: Option<String>,
    pub sessions: Vec<ForkedSession>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ForkedSession {
    pub session_id: Uuid,
    pub session_name: Option<String>,
}

/// What a fork refuses.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(
        "{0} sessions cannot be forked (agent sessions can; a pipeline run forks at a checkpoint with POST /orchestrator/pipeline/fork/{{thread_id}})"
    )]
    Kind(SessionKind),
    #[error("seq {at_seq} is inside a turn; a fork starts at a turn end: {}", list(.ends))]
    MidTurn { at_seq: u64, ends: Vec<u64> },
    #[error("the workspace at the turn end {seq} is no longer kept (sandbox.snapshots.keep_last); kept: {}", list(.kept))]
    Dropped { seq: u64, kept: Vec<u64> },
    #[error(
        "the history at the turn end {0} is not known (the turn was closed by a restart); fork at another turn end"
    )]
    HistoryUnknown(u64),
    #[error("snapshotting the workspace: {0}")]
    Sandbox(String),
}

fn list(seqs: &[u64]) -> String {
    if seqs.is_empty() {
        return "none".into();
    }
    seqs.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Makes forks of agent sessions.
pub struct Forks {
    pub sessions: Arc<SessionManager>,
    pub store: Arc<dyn Store>,
    pub sandboxes: Option<Arc<SandboxManager>>,
    /// The sessions' tools, which wait for a snapshot under way on the
    /// replica holding the source's sandbox; without, only this server's
    /// are waited for.
    pub tools: Option<Arc<dyn crate::agent::ToolRouter>>,
    pub max_forks: u32,
}

/// The turn end a fork starts after, and the history it keeps.
struct Point {
    seq: u64,
    history_len: Option<u64>,
    /// The turn end (or upload) whose workspace snapshot it has: its own,
    /// or for a rewind's, the one the rewind's files went back to.
    files_at: u64,
    /// Whether it is the source's last turn end.
    last: bool,
}

impl Forks {
    fn snapshots(&self) -> Option<&Arc<Snapshots>> {
        self.sandboxes.as_ref().and_then(|s| s.snapshots())
    }

    /// Forks `source`, a session `viewer` may see (`None`: any), into
    /// sessions of `owner`, as `request` asks.
    pub async fn fork(
        &self,
        source: Uuid,
        (viewer, owner): (Option<&str>, Option<&str>),
        request: ForkRequest,
    ) -> Result<Forked, ForkError> {
        let count = request.count.unwrap_or(1);
        if count == 0 || count > self.max_forks {
            return Err(invalid(
                "count",
                format!("must be 1 to {} (agent.max_forks)", self.max_forks),
            ));
        }
        let session = self.sessions.get(source, viewer).await?;
        if session.kind != SessionKind::AGENT {
            return Err(ForkError::Kind(session.kind.clone()));
        }
        let point = self.turn_end(source, request.at_seq).await?;
        let history = self
            .store
            .messages(source)
            .await
            .map_err(SessionError::from)?;
        let keep = match point.history_len {
            Some(n) => n as usize,
            None if point.seq == 0 => 0,
            None if point.last && session.status() != SessionStatus::Running => history.len(),
            None => return Err(ForkError::HistoryUnknown(point.seq)),
        };
        let history = &history[..keep.min(history.len())];
        let seed = self.workspace_at(source, point.files_at).await?;
        let mut options = Value::clone(&session.options);
        if let Some(overlay) = request.options {
            merge_patch(&mut options, Value::Object(overlay));
        }
        if let Some(snapshot) = &seed {
            set_seed(&mut options, snapshot);
        } else if let Some(asked) = seed_of(&options) {
            self.check_seed(&asked, viewer).await?;
        }
        let body = Map::from_iter([("options".to_owned(), options)]);
        let options = self
            .sessions
            .tasks()
            .require(SessionKind::AGENT.as_str(), "kind")?
            .options(&body, &[])
            .await?;
        let used = seed_of(&options);
        // A fork is a copy of the session: the adapter that made it and
        // its labels come with it.
        let metadata = self.sessions.metadata(source).await?;
        let mut made = Vec::new();
        for i in 0..count {
            let name = request.session_name.clone().map(|name| {
                if count > 1 {
                    format!("{name} #{}", i + 1)
                } else {
                    name
                }
            });
            let fork = self
                .sessions
                .create(NewSession {
                    name: name.clone(),
                    kind: SessionKind::AGENT,
                    owner: owner.map(str::to_owned),
                    options: options.clone(),
                    ephemeral: false,
                    origin: session.origin.clone(),
                    metadata: metadata.clone(),
                })
                .await?;
            if let (Some(snapshot), Some(snapshots)) = (&used, self.snapshots()) {
                snapshots
                    .add_user(snapshot, fork.id)
                    .await
                    .map_err(|e| ForkError::Sandbox(e.to_string()))?;
            }
            if !history.is_empty() {
                self.store
                    .append_messages(fork.id, history)
                    .await
                    .map_err(SessionError::from)?;
            }
            fork.emit(EventKind::Forked {
                from_session: source,
                at_seq: point.seq,
                history_len: Some(history.len() as u64),
            })
            .map_err(SessionError::from)?;
            fork.flush().await.map_err(SessionError::from)?;
            made.push(ForkedSession {
                session_id: fork.id,
                session_name: name,
            });
        }
        Ok(Forked {
            from_session: source,
            at_seq: point.seq,
            from_snapshot: used,
            sessions: made,
        })
    }

    /// The last turn end at or before `at_seq` (default: the last event),
    /// refused when `at_seq` falls inside a turn that no rewind undid.
    async fn turn_end(&self, source: Uuid, at_seq: Option<u64>) -> Result<Point, ForkError> {
        // Each end: its seq, the history's length, whose files it has.
        let mut ends: Vec<(u64, Option<u64>, u64)> = Vec::new();
        // The spans a rewind undid: from the end it went back to until
        // the rewind itself.
        let mut undone: Vec<(u64, u64)> = Vec::new();
        // The history's length at the latest end (none: a new session).
        let mut history = Some(0);
        // The seq of the latest event that belongs to a turn.
        let mut last_turn_event = 0;
        let mut since = 0;
        loop {
            let page = self
                .store
                .events_since(source, since, PAGE)
                .await
                .map_err(SessionError::from)?;
            let Some(last) = page.last() else { break };
            since = last.seq;
            for event in &page {
                match &event.kind {
                    EventKind::Result { history_len, .. } => {
                        ends.push((event.seq, *history_len, event.seq));
                        history = *history_len;
                        last_turn_event = event.seq;
                    }
                    // A rewind undid the turns after the end it went back
                    // to, and is itself where the history is known.
                    EventKind::Rewound {
                        to_seq,
                        history_len,
                        workspace,
                    } => {
                        // Restored: the files the end it went back to
                        // had; kept: those of the last end before it.
                        let files_at = match workspace.as_str() {
                            "restored" => ends.iter().find(|e| e.0 == *to_seq).map(|e| e.2),
                            _ => ends.last().map(|e| e.2),
                        };
                        ends.retain(|(seq, ..)| seq <= to_seq);
                        let files_at = files_at.unwrap_or(*to_seq);
                        ends.push((event.seq, Some(*history_len), files_at));
                        undone.push((*to_seq, event.seq));
                        history = Some(*history_len);
                        last_turn_event = event.seq;
                    }
                    EventKind::Forked { history_len, .. } => history = *history_len,
                    // Files put in between turns: a point to fork at, with
                    // the history of the end before it and the workspace
                    // as the upload left it (its snapshot is taken then).
                    EventKind::WorkspaceUploaded { .. } => {
                        ends.push((event.seq, history, event.seq));
                        last_turn_event = event.seq;
                    }
                    _ => last_turn_event = event.seq,
                }
            }
            if page.len() < PAGE {
                break;
            }
        }
        let at = at_seq.unwrap_or(last_turn_event.max(since));
        let before: Vec<&(u64, Option<u64>, u64)> =
            ends.iter().filter(|(seq, ..)| *seq <= at).collect();
        let end = before.last().map_or(0, |(seq, ..)| *seq);
        // Anything of a turn between that end and `at` means `at` is
        // inside the next turn, unless a rewind undid that turn: the
        // rewound history answers for every point it undid (the end it
        // went back to, as `ends` keeps it).
        let inside = if undone.iter().any(|(to, rewound)| *to < at && at < *rewound) {
            false
        } else if at_seq.is_none() {
            last_turn_event > end
        } else {
            self.turn_event_between(source, end, at).await?
        };
        if inside {
            return Err(ForkError::MidTurn {
                at_seq: at,
                ends: ends.iter().map(|(seq, ..)| *seq).collect(),
            });
        }
        Ok(Point {
            seq: end,
            history_len: before.last().and_then(|(_, n, _)| *n),
            files_at: before.last().map_or(0, |(.., files)| *files),
            last: ends.last().is_none_or(|(seq, ..)| *seq == end),
        })
    }

    /// Whether an event of a turn lies in `(after, until]`.
    async fn turn_event_between(
        &self,
        source: Uuid,
        after: u64,
        until: u64,
    ) -> Result<bool, ForkError> {
        if until <= after {
            return Ok(false);
        }
        let page = self
            .store
            .events_since(source, after, PAGE)
            .await
            .map_err(SessionError::from)?;
        Ok(page
            .iter()
            .take_while(|e| e.seq <= until)
            .any(|e| !matches!(e.kind, EventKind::Forked { .. } | EventKind::Rewound { .. })))
    }

    /// The snapshot of the source's workspace at the turn end `seq`;
    /// `None` when it had no sandbox by then.
    async fn workspace_at(&self, source: Uuid, seq: u64) -> Result<Option<String>, ForkError> {
        let Some(snapshots) = self.snapshots() else {
            return Ok(None);
        };
        match (&self.tools, &self.sandboxes) {
            (Some(tools), _) => tools.snapshots_settled(source).await,
            (None, Some(sandboxes)) => sandboxes.snapshot_settled(source).await,
            (None, None) => {}
        }
        match snapshots
            .at_turn(source, seq)
            .await
            .map_err(|e| ForkError::Sandbox(e.to_string()))?
        {
            AtTurn::Kept(snapshot) => Ok(Some(snapshot.snapshot_id)),
            AtTurn::Before => Ok(None),
            AtTurn::Dropped(kept) => Err(ForkError::Dropped { seq, kept }),
        }
    }

    /// Refuses a `from_snapshot` the caller may not use.
    pub async fn check_seed(&self, snapshot: &str, owner: Option<&str>) -> Result<(), ForkError> {
        let found = match self.snapshots() {
            Some(snapshots) => snapshots
                .get(snapshot)
                .await
                .map_err(|e| ForkError::Sandbox(e.to_string()))?,
            None => None,
        };
        match found {
            Some(s) if s.visible_to(owner) => Ok(()),
            _ => Err(invalid(
                "options.sandbox.from_snapshot",
                format!("no snapshot {snapshot}"),
            )),
        }
    }
}

fn invalid(field: &str, message: String) -> ForkError {
    ForkError::Session(SessionError::Option(OptionError::new(field, message)))
}

/// The snapshot `options.sandbox.from_snapshot` names.
pub fn seed_of(options: &Value) -> Option<String> {
    options
        .pointer("/sandbox/from_snapshot")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn set_seed(options: &mut Value, snapshot: &str) {
    if !options.is_object() {
        *options = Value::Object(Map::new());
    }
    let Some(map) = options.as_object_mut() else {
        return;
    };
    let sandbox = map
        .entry("sandbox")
        .or_insert_with(|| Value::Object(Map::new()));
    if !sandbox.is_object() {
        *sandbox = Value::Object(Map::new());
    }
    if let Some(sandbox) = sandbox.as_object_mut() {
        sandbox.insert("from_snapshot".into(), Value::from(snapshot));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_seed_is_set_however_the_options_look() {
        let mut options = json!({"sandbox": "odd"});
        set_seed(&mut options, "s1");
        assert_eq!(seed_of(&options).as_deref(), Some("s1"));
        let mut options = json!({});
        set_seed(&mut options, "s2");
        assert_eq!(options, json!({"sandbox": {"from_snapshot": "s2"}}));
    }
}
