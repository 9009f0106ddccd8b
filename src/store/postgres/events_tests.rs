//! What a batch costs the sessions' table: a batch that leaves its
//! session's status as it is updates the row in place.

use chrono::Utc;
use sqlx::{Connection, PgConnection, Row};

use super::super::PostgresStore;
use crate::protocol::{SessionStatus, Usage};
use crate::store::conformance::{PostgresFixture, event, session};
use crate::store::{Batch, EventStore, SessionState, SessionStore};

/// The entries in the indexes of `sessions`, dead ones included: an
/// update that is not heap-only adds one to each index.
async fn index_entries(connection: &mut PgConnection) -> i64 {
    sqlx::query(
        "SELECT sum(s.tuple_count + s.dead_tuple_count)::int8
         FROM pg_index i, LATERAL pgstattuple(i.indexrelid) s
         WHERE i.indrelid = 'sessions'::regclass",
    )
    .fetch_one(connection)
    .await
    .unwrap()
    .get(0)
}

/// Every batch writes its session's usage and `updated_at`; one that
/// keeps the status (a turn's batches between its first and its last)
/// is a heap-only update, which no index of the table sees.
#[tokio::test]
async fn batches_that_keep_the_status_add_no_index_entries() {
    let fixture = PostgresFixture::new().await;
    let store = PostgresStore::connect(fixture.options(), 2).await.unwrap();
    let record = session(None, Utc::now());
    store.create_session(&record).await.unwrap();
    let mut connection = PgConnection::connect_with(&fixture.options())
        .await
        .unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .execute(&mut connection)
        .await
        .unwrap();
    let before = index_entries(&mut connection).await;
    let mut usage = Usage::default();
    for seq in 1..=10 {
        usage.output_tokens += 7;
        let state = SessionState {
            status: SessionStatus::Idle,
            usage: usage.clone(),
            updated_at: Utc::now(),
        };
        let events = [event(record.id, seq)];
        let batch = Batch {
            create: None,
            events: &events,
            messages: &[],
            state: Some(&state),
            release: None,
            usage: &[],
        };
        store.append_batch(record.id, batch).await.unwrap();
    }
    assert_eq!(
        index_entries(&mut connection).await,
        before,
        "ten batches added entries to the sessions' indexes"
    );
}
