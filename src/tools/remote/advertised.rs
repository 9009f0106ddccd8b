//! Where each replica is reached over HTTP, for the requests only the
//! replica holding a session's sandbox can answer (its live workspace):
//! the store's KV namespace `_replica_urls` (no API key can name it), key
//! the replica's instance, value its `cluster.advertise_url`.

use crate::store::{Expect, Store, StoreError};

const NAMESPACE: &str = "_replica_urls";

/// Says where replica `instance` is reached.
pub async fn advertise(store: &dyn Store, instance: &str, url: &str) -> Result<(), StoreError> {
    store
        .kv_put(NAMESPACE, instance, url.as_bytes(), Expect::Any)
        .await
        .map(drop)
}

/// Forgets where replica `instance` is reached (it stops).
pub async fn withdraw(store: &dyn Store, instance: &str) -> Result<(), StoreError> {
    store
        .kv_delete(NAMESPACE, instance, Expect::Any)
        .await
        .map(drop)
}

/// Where replica `instance` said it is reached, if it did.
pub async fn url_of(store: &dyn Store, instance: &str) -> Result<Option<String>, StoreError> {
    Ok(store
        .kv_get(NAMESPACE, instance)
        .await?
        .map(|entry| String::from_utf8_lossy(&entry.value).into_owned()))
}
