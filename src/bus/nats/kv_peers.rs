//! KV writes told between replicas over core NATS: the values stay in
//! the shared store, so a message carries only which key changed, at which
//! revision, and whether it was deleted.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio_util::task::TaskTracker;

use super::names::{decode, encode};
use super::{Shared, nats};
use crate::bus::BusError;
use crate::bus::kv::{Kv, KvPeers};
use crate::store::Store;

const ORIGIN: &str = "Conclave-Origin";
const KEY: &str = "Conclave-Key";
const REVISION: &str = "Conclave-Revision";
const DELETED: &str = "Conclave-Deleted";

struct NatsKvPeers {
    shared: Arc<Shared>,
    /// This replica, so that it skips its own news.
    origin: String,
}

#[async_trait]
impl KvPeers for NatsKvPeers {
    async fn tell(&self, namespace: &str, key: &str, revision: u64, deleted: bool) {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(ORIGIN, self.origin.as_str());
        headers.insert(KEY, encode(key).as_str());
        headers.insert(REVISION, revision.to_string().as_str());
        if deleted {
            headers.insert(DELETED, "1");
        }
        let subject = self.shared.names.kv_subject(namespace);
        let sent = self
            .shared
            .client
            .publish_with_headers(subject, headers, Bytes::new())
            .await;
        if let Err(err) = sent {
            tracing::warn!(error = %err, key, "cannot tell the other replicas of a KV write");
        }
    }
}

/// One write told by another replica: `(namespace, key, revision, deleted)`.
fn read(shared: &Shared, origin: &str, message: &async_nats::Message) -> Option<Change> {
    let headers = message.headers.as_ref()?;
    if headers.get(ORIGIN)?.as_str() == origin {
        return None;
    }
    Some(Change {
        namespace: shared.names.kv_namespace(message.subject.as_str())?,
        key: decode(headers.get(KEY)?.as_str())?,
        revision: headers.get(REVISION)?.as_str().parse().ok()?,
        deleted: headers.get(DELETED).is_some(),
    })
}

struct Change {
    namespace: String,
    key: String,
    revision: u64,
    deleted: bool,
}

/// The KV on `store` told to and by the other replicas. Subscribed before
/// it answers, so no write made elsewhere after is missed.
pub(super) async fn start(
    shared: &Arc<Shared>,
    store: Arc<dyn Store>,
    max_value: usize,
    meter: Option<Arc<crate::bus::StorageMeter>>,
    tasks: &TaskTracker,
) -> Result<Arc<Kv>, BusError> {
    let origin = uuid::Uuid::new_v4().to_string();
    let mut news = shared
        .client
        .subscribe(shared.names.kv_all())
        .await
        .map_err(nats)?;
    // A round trip on the connection: the server has the subscription
    // once it answers (a flush only sends it).
    shared.jetstream.query_account().await.map_err(nats)?;
    let peers = Arc::new(NatsKvPeers {
        shared: shared.clone(),
        origin: origin.clone(),
    });
    let kv = Arc::new(Kv::with_peers(store, max_value, peers).metered(meter));
    let listener = {
        let kv = kv.clone();
        let shared = shared.clone();
        async move {
            loop {
                let message = tokio::select! {
                    message = news.next() => message,
                    () = shared.shutdown.cancelled() => return,
                };
                let Some(message) = message else { return };
                let Some(change) = read(&shared, &origin, &message) else {
                    continue;
                };
                let told = kv
                    .changed_elsewhere(
                        &change.namespace,
                        &change.key,
                        change.revision,
                        change.deleted,
                    )
                    .await;
                if let Err(err) = told {
                    tracing::warn!(error = %err, key = change.key, "cannot read a KV key another replica wrote");
                }
            }
        }
    };
    tasks.spawn(listener);
    Ok(kv)
}
