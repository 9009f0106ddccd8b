//! Signals between replicas: an interrupt sent to one replica reaches the
//! turn that runs on another. They travel on the bus in a namespace no
//! API key can name (keys' namespaces are their hashes, or `local`).

use std::sync::{Arc, Weak};

use bytes::Bytes;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::manager::SessionManager;
use crate::bus::{Bus, BusError, Delivery, Pattern, Since, Subject};

const NAMESPACE: &str = "_cluster";
const INTERRUPT: &str = "session.interrupt";

/// Sends and receives the replicas' signals.
pub struct Signals {
    bus: Arc<dyn Bus>,
}

impl Signals {
    pub fn new(bus: Arc<dyn Bus>) -> Signals {
        Signals { bus }
    }

    /// Asks every replica to interrupt the session's turn; fire and
    /// forget, as an interrupt is.
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

    /// Interrupts this replica's turns that another replica was asked to
    /// interrupt, until `stop`.
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
                // A lag loses interrupts nobody can resend; say so.
                if delivery.is_none() {
                    return Ok(());
                }
                tracing::warn!("interrupt signals were lost (the bus said this replica lagged)");
                continue;
            };
            let Some(sessions) = sessions.upgrade() else {
                return Ok(());
            };
            match std::str::from_utf8(&message.payload)
                .ok()
                .and_then(|id| Uuid::parse_str(id).ok())
            {
                Some(id) => sessions.interrupt_here(id),
                None => tracing::warn!("an interrupt signal without a session id"),
            }
        }
    }
}
