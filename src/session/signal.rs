//! Signals between replicas: an interrupt sent to one replica reaches the
//! turn that runs on another, and so does a decision ([`super::approvals`]).
//! They travel on the bus in a namespace no API key can name (keys'
//! namespaces are their hashes, or `local`).
//!
//! A signal a caller waits on carries an `ack` id: the replica that takes
//! it (the one running the turn) publishes `session.ack.<id>`, and the
//! sender, subscribed to that subject before it sent, answers the caller
//! only then. A signal nobody took within [`ACK_WAIT`] is reported as not
//! delivered, never as done.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::manager::SessionManager;
use crate::bus::{Bus, BusError, Delivery, Pattern, Since, Subject};

pub(super) const NAMESPACE: &str = "_cluster";
const INTERRUPT: &str = "session.interrupt";
const ACK: &str = "session.ack";
/// How long a sender waits for the replica that takes its signal.
pub(super) const ACK_WAIT: Duration = Duration::from_secs(5);

/// An interrupt as sent: a session id alone (fire and forget, as replicas
/// of earlier versions send it) or this, whose taker acknowledges it.
#[derive(Serialize, Deserialize)]
struct Interrupt {
    session_id: Uuid,
    ack: Uuid,
}

/// Sends `payload` (made with the ack id) on `subject` and waits for the
/// replica that takes it: true once one acknowledged it, false when none
/// did within [`ACK_WAIT`]; an error when the bus refused it.
pub(super) async fn send_acked(
    bus: &dyn Bus,
    subject: &str,
    payload: impl FnOnce(Uuid) -> Result<Vec<u8>, BusError>,
) -> Result<bool, BusError> {
    let id = Uuid::new_v4();
    let pattern = Pattern::parse(&format!("{ACK}.{id}"))?;
    let mut acks = bus.subscribe(NAMESPACE, vec![pattern], Since::New).await?;
    let subject = Subject::parse(subject)?;
    bus.publish(NAMESPACE, &subject, Bytes::from(payload(id)?))
        .await?;
    let acked = tokio::time::timeout(ACK_WAIT, async {
        loop {
            match acks.next().await {
                Some(Delivery::Message(_)) => return true,
                Some(_) => continue,
                None => return false,
            }
        }
    })
    .await;
    Ok(acked.unwrap_or(false))
}

/// Tells the sender of a signal that this replica took it.
pub(super) async fn ack(bus: &dyn Bus, id: Uuid) {
    let sent = match Subject::parse(&format!("{ACK}.{id}")) {
        Ok(subject) => bus
            .publish(NAMESPACE, &subject, Bytes::from_static(b"{}"))
            .await
            .map(drop),
        Err(e) => Err(BusError::Subject(e)),
    };
    if let Err(e) = sent {
        tracing::warn!(error = %e, "acknowledging a signal from another replica failed");
    }
}

/// Sends and receives the replicas' signals.
pub struct Signals {
    bus: Arc<dyn Bus>,
}

impl Signals {
    pub fn new(bus: Arc<dyn Bus>) -> Signals {
        Signals { bus }
    }

    /// Asks every replica to interrupt the session's turn; fire and
    /// forget.
    pub fn interrupt(&self, session: Uuid) {
        let bus = self.bus.clone();
        tokio::spawn(async move {
            let sent = match Subject::parse(INTERRUPT) {
                Ok(subject) => {
                    let payload = Bytes::from(session.to_string());
                    bus.publish(NAMESPACE, &subject, payload).await.map(drop)
                }
                Err(e) => Err(BusError::Subject(e)),
            };
            if let Err(e) = sent {
                tracing::warn!(%session, error = %e, "sending an interrupt to the other replicas failed");
            }
        });
    }

    /// Asks every replica to interrupt the session's turn and waits for
    /// the one that runs it: true once it has stopped the turn.
    pub async fn interrupt_acked(&self, session: Uuid) -> Result<bool, BusError> {
        send_acked(self.bus.as_ref(), INTERRUPT, |ack| {
            serde_json::to_vec(&Interrupt {
                session_id: session,
                ack,
            })
            .map_err(|e| BusError::Nats(e.into()))
        })
        .await
    }

    /// Interrupts this replica's turns that another replica was asked to
    /// interrupt, until `stop`. The subscription outlives a bus outage
    /// (its consumers are made again), so this ends only with `stop`.
    pub async fn listen(
        &self,
        sessions: Weak<SessionManager>,
        stop: CancellationToken,
    ) -> Result<(), BusError> {
        let pattern = Pattern::parse(INTERRUPT)?;
        let mut signals = self
            .bus
            .subscribe(NAMESPACE, vec![pattern], Since::New)
            .await?;
        loop {
            let delivery = tokio::select! {
                delivery = signals.next() => delivery,
                _ = stop.cancelled() => return Ok(()),
            };
            let Some(Delivery::Message(message)) = delivery else {
                // A lag loses interrupts: their senders hear of no taker.
                if delivery.is_none() {
                    return Ok(());
                }
                tracing::warn!(
                    "interrupt signals may have been lost (the bus said this replica lagged)"
                );
                continue;
            };
            let Some(sessions) = sessions.upgrade() else {
                return Ok(());
            };
            let (id, ack_id) = match serde_json::from_slice::<Interrupt>(&message.payload) {
                Ok(signal) => (Some(signal.session_id), Some(signal.ack)),
                Err(_) => (
                    std::str::from_utf8(&message.payload)
                        .ok()
                        .and_then(|id| Uuid::parse_str(id).ok()),
                    None,
                ),
            };
            match id {
                Some(id) => {
                    if sessions.interrupt_here(id)
                        && let Some(ack_id) = ack_id
                    {
                        ack(self.bus.as_ref(), ack_id).await;
                    }
                }
                None => tracing::warn!("an interrupt signal without a session id"),
            }
        }
    }
}
