//! WebSocket tickets (`POST /auth/ticket`, `?ticket=`), kept in the
//! store so that a ticket one replica issued opens a socket on another: a
//! load balancer in front of replicas need not be sticky. The store holds
//! each ticket's SHA-256, not the ticket; a ticket is redeemed by deleting
//! its row at the revision read, so it opens one socket whichever replicas
//! race for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::api::http::auth::Caller;
use crate::store::{Expect, KvWrite, Store, StoreError};

/// How long a WebSocket ticket may wait for its socket.
pub const TICKET_TTL: Duration = Duration::from_secs(30);

/// Tickets one caller may get from one replica per [`TICKET_TTL`]; a page
/// needs a few.
const TICKETS_PER_CALLER: usize = 64;
/// The store's KV namespace of tickets; no key's bus namespace (its hash,
/// or `local`) can name it.
const NAMESPACE: &str = "_tickets";
/// Rows looked at for expired tickets each time one is issued.
const SWEEP: usize = 32;

#[derive(Serialize, Deserialize)]
struct Stored {
    owner: Option<String>,
    admin: bool,
    issued_ms: i64,
}

pub struct Tickets {
    store: Arc<dyn Store>,
    /// When this replica issued each caller's recent tickets (the cap).
    issued: Mutex<HashMap<Option<String>, Vec<Instant>>>,
}

fn row_key(ticket: &str) -> String {
    hex::encode(Sha256::digest(ticket.as_bytes()))
}

fn expired(stored: &Stored, now_ms: i64) -> bool {
    now_ms.saturating_sub(stored.issued_ms) >= TICKET_TTL.as_millis() as i64
}

impl Tickets {
    pub fn new(store: Arc<dyn Store>) -> Tickets {
        Tickets {
            store,
            issued: Mutex::new(HashMap::new()),
        }
    }

    /// A fresh single-use ticket standing for `caller`; `None` when the
    /// caller had as many as it may from this replica lately.
    pub async fn issue(&self, caller: &Caller) -> Result<Option<String>, StoreError> {
        {
            let mut issued = crate::sync::lock(&self.issued);
            issued.retain(|_, times| {
                times.retain(|t| t.elapsed() < TICKET_TTL);
                !times.is_empty()
            });
            let times = issued.entry(caller.owner.clone()).or_default();
            if times.len() >= TICKETS_PER_CALLER {
                return Ok(None);
            }
            times.push(Instant::now());
        }
        // 244 random bits from the OS.
        let ticket = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let stored = Stored {
            owner: caller.owner.clone(),
            admin: caller.admin,
            issued_ms: Utc::now().timestamp_millis(),
        };
        let value = serde_json::to_vec(&stored)
            .map_err(|e| StoreError::Corrupt(format!("a ticket: {e}")))?;
        self.store
            .kv_put(NAMESPACE, &row_key(&ticket), &value, Expect::Absent)
            .await?;
        self.sweep().await;
        Ok(Some(ticket))
    }

    /// The caller a ticket stands for, once: a ticket is gone after use,
    /// on every replica.
    pub async fn redeem(&self, ticket: &str) -> Result<Option<Caller>, StoreError> {
        let key = row_key(ticket);
        let Some(entry) = self.store.kv_get(NAMESPACE, &key).await? else {
            return Ok(None);
        };
        let taken = self
            .store
            .kv_delete(NAMESPACE, &key, Expect::Revision(entry.revision))
            .await?;
        if !matches!(taken, KvWrite::Done(_)) {
            return Ok(None);
        }
        let stored: Stored = serde_json::from_slice(&entry.value)
            .map_err(|e| StoreError::Corrupt(format!("ticket {key}: {e}")))?;
        if expired(&stored, Utc::now().timestamp_millis()) {
            return Ok(None);
        }
        Ok(Some(Caller {
            owner: stored.owner,
            admin: stored.admin,
        }))
    }

    /// Deletes expired tickets among a few rows: the hashes are random,
    /// so the rows looked at change as tickets come and go.
    async fn sweep(&self) {
        let now_ms = Utc::now().timestamp_millis();
        let Ok(entries) = self.store.kv_list(NAMESPACE, "", SWEEP).await else {
            return;
        };
        for entry in entries {
            let stale = serde_json::from_slice::<Stored>(&entry.value)
                .map_or(true, |stored| expired(&stored, now_ms));
            if stale {
                let _ = self
                    .store
                    .kv_delete(NAMESPACE, &entry.key, Expect::Revision(entry.revision))
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    fn caller() -> Caller {
        Caller {
            owner: Some("owner-hash".into()),
            admin: false,
        }
    }

    #[tokio::test]
    async fn a_ticket_from_one_replica_opens_one_socket_on_any() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
        let (a, b) = (Tickets::new(store.clone()), Tickets::new(store.clone()));
        let ticket = a.issue(&caller()).await.unwrap().unwrap();
        let redeemed = b.redeem(&ticket).await.unwrap().unwrap();
        assert_eq!(redeemed.owner, caller().owner);
        assert!(!redeemed.admin);
        assert!(a.redeem(&ticket).await.unwrap().is_none(), "used once");
        assert!(b.redeem("not-a-ticket").await.unwrap().is_none());
        // The store keeps the ticket's hash, never the ticket.
        let second = a.issue(&caller()).await.unwrap().unwrap();
        let rows = store.kv_list(NAMESPACE, "", 10).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].key, row_key(&second));
        assert_ne!(rows[0].key, second);
    }

    #[tokio::test]
    async fn an_expired_ticket_is_refused_and_swept() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
        let tickets = Tickets::new(store.clone());
        let old = Stored {
            owner: None,
            admin: true,
            issued_ms: Utc::now().timestamp_millis() - TICKET_TTL.as_millis() as i64,
        };
        let value = serde_json::to_vec(&old).unwrap();
        store
            .kv_put(NAMESPACE, &row_key("old"), &value, Expect::Absent)
            .await
            .unwrap();
        assert!(tickets.redeem("old").await.unwrap().is_none());
        store
            .kv_put(NAMESPACE, &row_key("older"), &value, Expect::Absent)
            .await
            .unwrap();
        let fresh = tickets.issue(&caller()).await.unwrap().unwrap();
        let rows = store.kv_list(NAMESPACE, "", 10).await.unwrap();
        let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(
            keys,
            [row_key(&fresh).as_str()],
            "the expired row was swept"
        );
    }

    #[tokio::test]
    async fn one_caller_gets_a_bounded_number_per_replica() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
        let tickets = Tickets::new(store);
        for _ in 0..TICKETS_PER_CALLER {
            assert!(tickets.issue(&caller()).await.unwrap().is_some());
        }
        assert!(tickets.issue(&caller()).await.unwrap().is_none());
        let other = Caller {
            owner: Some("another".into()),
            admin: false,
        };
        assert!(tickets.issue(&other).await.unwrap().is_some());
    }
}
