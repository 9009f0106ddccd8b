//! Tool calls that wait for a decision. A waiting call is a record in the
//! store (so every replica sees it, `GET /agent/approvals` lists it, and a
//! restart finds it) and a channel on the replica that runs its turn. A
//! decision claims the record (a compare-and-delete: of two decisions one
//! wins, the other finds nothing pending) and then travels to the turn:
//! directly on this replica, over the bus to the others. A decision sent
//! to another replica is done only once that replica acknowledges it
//! ([`super::signal`]); none doing so in time puts the call back as
//! pending and the decider hears that the decision did not reach it.
//!
//! Records live in namespaces no API key can name: `_approvals`, keyed
//! `{owner}/{session}/{call}`, and `_approval_rules`, the allow rules a
//! decision asked to remember, keyed by session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;
use uuid::Uuid;

use super::signal;
use crate::bus::{Bus, Delivery, Pattern, Since};
use crate::protocol::Approval;
use crate::store::{Expect, KvWrite, Store, StoreError};
use crate::sync::lock;

const NAMESPACE: &str = "_approvals";
const RULES: &str = "_approval_rules";
const SIGNALS: &str = signal::NAMESPACE;
const SUBJECT: &str = "session.approval";
/// The most pending calls one owner lists.
pub const MAX_LISTED: usize = 1000;

/// A call waiting for a decision, as stored and listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Pending {
    pub session_id: Uuid,
    pub call_id: String,
    pub tool: String,
    pub input: Value,
    /// Why it waits: which policy asked.
    pub reason: String,
    pub requested_at: DateTime<Utc>,
    /// When it is denied if nobody decides.
    pub expires_at: DateTime<Utc>,
    /// The tool only reads.
    #[serde(default)]
    pub read_only: bool,
    /// The deliberation agent or pipeline node whose call it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The deliberation or pipeline session the call's agent works for:
    /// its owner decides the call there too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<Uuid>,
    /// The tool's input schema, which an edited input must fit.
    #[serde(default, skip_serializing)]
    pub schema: Value,
}

/// A decision as a client gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ApprovalDecision)]
pub struct Decision {
    /// `allow` or `deny`.
    pub decision: Approval,
    /// What the model reads with the call's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The input the call runs with instead (checked against the tool's
    /// schema and the rules again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// `session`: allow the rest of this session's calls of this tool
    /// (or of `rule`) without asking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remember: Option<Remember>,
    /// The allow rule to remember instead of the whole tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Deciding through a deliberation or pipeline session: the agent (or
    /// node) whose call it is, needed only when two of its agents wait on
    /// calls of the same id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Remember {
    Session,
}

/// A decision on its way to the turn, with who gave it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decided {
    pub decision: Decision,
    /// `user`, `admin`, `hook`.
    pub by: String,
}

/// A decision on the bus, for the replica running the turn.
#[derive(Serialize, Deserialize)]
struct Signal {
    session_id: Uuid,
    call_id: String,
    decided: Decided,
    /// Where the taker acknowledges it.
    #[serde(default)]
    ack: Option<Uuid>,
    /// Past this, the decider has given up waiting and put the call back:
    /// the signal is not taken.
    #[serde(default)]
    until: Option<DateTime<Utc>>,
}

/// A call this replica's turn waits on.
pub struct Waiting {
    pub decided: oneshot::Receiver<Decided>,
    key: String,
    revision: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("call {0} is not waiting for a decision (it was decided, timed out, or never asked)")]
    NotPending(String),
    /// No replica took the decision: the turn waiting on the call is
    /// gone, or unreachable. The call is pending again.
    #[error(
        "no replica took the decision for call {0}: the turn waiting on it may have stopped with \
         its replica (it is then closed as interrupted); the call is still pending"
    )]
    Undelivered(String),
    /// The bus refused the decision; the call is pending again.
    #[error("the decision for call {0} could not be sent to the turn's replica: {1}")]
    Bus(String, crate::bus::BusError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

type Key = (Uuid, String);

/// The waiting calls of every session.
pub struct Approvals {
    store: Arc<dyn Store>,
    waiting: Mutex<HashMap<Key, oneshot::Sender<Decided>>>,
    /// With replicas: where decisions for another replica's turns go.
    bus: Option<Arc<dyn Bus>>,
}

fn namespace_of(owner: Option<&str>) -> &str {
    owner.unwrap_or("local")
}

fn key(owner: Option<&str>, session: Uuid, call_id: &str) -> String {
    format!("{}/{session}/{call_id}", namespace_of(owner))
}

fn corrupt(e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!("pending approval: {e}"))
}

impl Approvals {
    /// `bus` carries decisions between replicas; `None` on a server of
    /// its own.
    pub fn new(store: Arc<dyn Store>, bus: Option<Arc<dyn Bus>>) -> Approvals {
        Approvals {
            store,
            waiting: Mutex::default(),
            bus,
        }
    }

    /// Stores the call as pending and starts waiting for its decision.
    pub async fn request(
        &self,
        owner: Option<&str>,
        pending: &Pending,
    ) -> Result<Waiting, StoreError> {
        let (tell, decided) = oneshot::channel();
        let id = (pending.session_id, pending.call_id.clone());
        lock(&self.waiting).insert(id.clone(), tell);
        let key = key(owner, pending.session_id, &pending.call_id);
        let value = serde_json::to_vec(&StoredPending(pending)).map_err(corrupt)?;
        let written = self
            .store
            .kv_put(NAMESPACE, &key, &value, Expect::Any)
            .await;
        let revision = match written {
            Ok(KvWrite::Done(revision)) => revision,
            Ok(KvWrite::Conflict { .. }) => unreachable!("an unconditional write never conflicts"),
            Err(e) => {
                lock(&self.waiting).remove(&id);
                return Err(e);
            }
        };
        Ok(Waiting {
            decided,
            key,
            revision,
        })
    }

    /// Takes the call back when nobody decided in time: true if it was
    /// still pending; false if a decision claimed it first (it is on its
    /// way, and `waiting.decided` gets it).
    pub async fn withdraw(&self, waiting: &Waiting) -> Result<bool, StoreError> {
        let deleted = self
            .store
            .kv_delete(NAMESPACE, &waiting.key, Expect::Revision(waiting.revision))
            .await?;
        Ok(matches!(deleted, KvWrite::Done(_)))
    }

    /// Forgets this replica's channel for a call (its wait is over).
    pub fn done(&self, session: Uuid, call_id: &str) {
        lock(&self.waiting).remove(&(session, call_id.to_string()));
    }

    /// The pending call of a session, if it is pending.
    pub async fn pending(
        &self,
        owner: Option<&str>,
        session: Uuid,
        call_id: &str,
    ) -> Result<Option<(Pending, u64)>, StoreError> {
        let Some(entry) = self
            .store
            .kv_get(NAMESPACE, &key(owner, session, call_id))
            .await?
        else {
            return Ok(None);
        };
        let pending = serde_json::from_slice(&entry.value).map_err(corrupt)?;
        Ok(Some((pending, entry.revision)))
    }

    /// Claims a pending call for `decided` and sends it to the turn. The
    /// caller has checked that the decider may decide for the session and
    /// that an edited input fits (`revision` is what it checked).
    pub async fn decide(
        &self,
        owner: Option<&str>,
        pending: &Pending,
        revision: u64,
        decided: Decided,
    ) -> Result<(), DecideError> {
        let key = key(owner, pending.session_id, &pending.call_id);
        let claimed = self
            .store
            .kv_delete(NAMESPACE, &key, Expect::Revision(revision))
            .await?;
        if !matches!(claimed, KvWrite::Done(_)) {
            return Err(DecideError::NotPending(pending.call_id.clone()));
        }
        if self.deliver_here(pending.session_id, &pending.call_id, decided.clone()) {
            return Ok(());
        }
        let Some(bus) = &self.bus else {
            tracing::warn!(session = %pending.session_id, call = %pending.call_id,
                "a decision for a call no turn here waits on");
            return Ok(());
        };
        // The taker refuses it past `until`, a second before the wait here
        // ends, so a decision reported as not delivered is not run.
        let until = Utc::now() + chrono::TimeDelta::from_std(signal::ACK_WAIT).unwrap_or_default()
            - chrono::TimeDelta::seconds(1);
        let sent = signal::send_acked(bus.as_ref(), SUBJECT, |ack| {
            serde_json::to_vec(&Signal {
                session_id: pending.session_id,
                call_id: pending.call_id.clone(),
                decided,
                ack: Some(ack),
                until: Some(until),
            })
            .map_err(|e| crate::bus::BusError::Nats(e.into()))
        })
        .await;
        let failed = match sent {
            Ok(true) => return Ok(()),
            Ok(false) => DecideError::Undelivered(pending.call_id.clone()),
            Err(e) => DecideError::Bus(pending.call_id.clone(), e),
        };
        tracing::warn!(session = %pending.session_id, error = %failed, "a decision was not delivered");
        // Pending again, as it was: a later decision may reach it, and the
        // turn (if it lives) times it out as it would have.
        let value = serde_json::to_vec(&StoredPending(pending)).map_err(corrupt)?;
        self.store
            .kv_put(NAMESPACE, &key, &value, Expect::Absent)
            .await?;
        Err(failed)
    }

    fn deliver_here(&self, session: Uuid, call_id: &str, decided: Decided) -> bool {
        let tell = lock(&self.waiting).remove(&(session, call_id.to_string()));
        tell.is_some_and(|tell| tell.send(decided).is_ok())
    }

    /// The owner's pending calls, oldest session first, at most
    /// [`MAX_LISTED`].
    pub async fn list(&self, owner: Option<&str>) -> Result<Vec<Pending>, StoreError> {
        self.listed(&format!("{}/", namespace_of(owner))).await
    }

    /// A session's pending calls.
    pub async fn of_session(
        &self,
        owner: Option<&str>,
        session: Uuid,
    ) -> Result<Vec<Pending>, StoreError> {
        self.listed(&format!("{}/{session}/", namespace_of(owner)))
            .await
    }

    async fn listed(&self, prefix: &str) -> Result<Vec<Pending>, StoreError> {
        let entries = self.store.kv_list(NAMESPACE, prefix, MAX_LISTED).await?;
        let mut pending: Vec<Pending> = entries
            .iter()
            .map(|e| serde_json::from_slice(&e.value).map_err(corrupt))
            .collect::<Result<_, _>>()?;
        pending.sort_by_key(|p| p.requested_at);
        Ok(pending)
    }

    /// The pending calls the agents of `parent` (a deliberation's, a
    /// pipeline's) wait on: of id `call_id` and of `agent_id` when given.
    pub async fn of_agents(
        &self,
        owner: Option<&str>,
        parent: Uuid,
        call_id: Option<&str>,
        agent_id: Option<&str>,
    ) -> Result<Vec<Pending>, StoreError> {
        let mut found = self.list(owner).await?;
        found.retain(|p| {
            p.parent_id == Some(parent)
                && call_id.is_none_or(|c| p.call_id == c)
                && agent_id.is_none_or(|a| p.agent_id.as_deref() == Some(a))
        });
        Ok(found)
    }

    /// Removes a session's pending calls (its turn was closed after a
    /// restart).
    pub async fn clear(&self, owner: Option<&str>, session: Uuid) -> Result<(), StoreError> {
        for pending in self.of_session(owner, session).await? {
            let key = key(owner, session, &pending.call_id);
            self.store.kv_delete(NAMESPACE, &key, Expect::Any).await?;
        }
        Ok(())
    }

    /// Forgets the allow rules decisions remembered for a deleted session.
    pub async fn forget_rules(&self, session: Uuid) -> Result<(), StoreError> {
        self.store
            .kv_delete(RULES, &session.to_string(), Expect::Any)
            .await
            .map(drop)
    }

    /// The allow rules decisions remembered for the session.
    pub async fn remembered(&self, session: Uuid) -> Result<Vec<String>, StoreError> {
        Ok(self
            .store
            .kv_get(RULES, &session.to_string())
            .await?
            .map(|entry| serde_json::from_slice(&entry.value))
            .transpose()
            .map_err(corrupt)?
            .unwrap_or_default())
    }

    /// Adds an allow rule for the rest of the session.
    pub async fn remember(&self, session: Uuid, rule: &str) -> Result<(), StoreError> {
        let key = session.to_string();
        loop {
            let entry = self.store.kv_get(RULES, &key).await?;
            let (mut rules, expect): (Vec<String>, _) = match &entry {
                Some(e) => (
                    serde_json::from_slice(&e.value).map_err(corrupt)?,
                    Expect::Revision(e.revision),
                ),
                None => (Vec::new(), Expect::Absent),
            };
            if rules.iter().any(|r| r == rule) {
                return Ok(());
            }
            rules.push(rule.to_string());
            let value = serde_json::to_vec(&rules).map_err(corrupt)?;
            if let KvWrite::Done(_) = self.store.kv_put(RULES, &key, &value, expect).await? {
                return Ok(());
            }
        }
    }

    /// Takes decisions other replicas received for this replica's turns,
    /// until `stop` (nothing to do on a server of its own).
    pub async fn listen(self: Arc<Self>, stop: CancellationToken) {
        let Some(bus) = self.bus.clone() else {
            return;
        };
        let subscribed = match Pattern::parse(SUBJECT) {
            Ok(pattern) => bus.subscribe(SIGNALS, vec![pattern], Since::New).await,
            Err(e) => {
                tracing::error!(error = %e, "the approval subject does not parse");
                return;
            }
        };
        let mut signals = match subscribed {
            Ok(signals) => signals,
            Err(e) => {
                tracing::error!(error = %e, "this replica cannot take decisions from the others");
                return;
            }
        };
        loop {
            let delivery = tokio::select! {
                delivery = signals.next() => delivery,
                _ = stop.cancelled() => return,
            };
            match delivery {
                None => return,
                Some(Delivery::Message(message)) => {
                    match serde_json::from_slice::<Signal>(&message.payload) {
                        Ok(s) if s.until.is_some_and(|until| Utc::now() > until) => {
                            tracing::warn!(session = %s.session_id, call = %s.call_id,
                                "a decision came after its sender gave up waiting; not taken");
                        }
                        Ok(s) => {
                            if self.deliver_here(s.session_id, &s.call_id, s.decided)
                                && let Some(ack) = s.ack
                            {
                                signal::ack(bus.as_ref(), ack).await;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "a decision signal that does not parse")
                        }
                    }
                }
                Some(_) => tracing::warn!(
                    "decisions were lost (the bus said this replica lagged); their calls time out"
                ),
            }
        }
    }
}

/// A pending call with its schema, as stored (the schema is not listed).
struct StoredPending<'a>(&'a Pending);

impl Serialize for StoredPending<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut value = serde_json::to_value(self.0).map_err(serde::ser::Error::custom)?;
        if let Value::Object(fields) = &mut value {
            fields.insert("schema".into(), self.0.schema.clone());
        }
        value.serialize(s)
    }
}
