//! What every backend must do: one suite of tests, run against SQLite and
//! against PostgreSQL (`suite!` instantiates each test once per backend).
//!
//! - A test is an async fn taking a [`Fixture`]: an empty database that it
//!   opens as a store as often as it needs (again after a close, or twice
//!   at once as two replicas).
//! - The PostgreSQL side needs a server: `CONCLAVE_TEST_POSTGRES` names
//!   one (scripts/test.sh starts one and sets it), and each test makes a
//!   database of its own there, so that tests run in parallel.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::json;
use uuid::Uuid;

use database::{TestDatabase, test_server};

use super::{PostgresStore, SqliteStore, Store};
use crate::model::{Message, ToolCall};
use crate::protocol::Usage;
use crate::protocol::{Event, EventKind, ResultStatus, SessionKind, SessionRecord, SessionStatus};

/// Shared with the integration tests and benches, which use all of it.
#[path = "../../../tests/common/postgres.rs"]
#[allow(dead_code)]
mod database;

mod bus;
mod events;
mod kv;
mod leases;
mod quota;
mod replicas;
mod sessions;
mod usage;

/// An empty database of one backend.
#[async_trait]
pub(crate) trait Fixture: Sync {
    /// Opens a store on the fixture's database; a second call opens the
    /// same database again (a restart, or a second replica).
    async fn open(&self) -> Arc<dyn Store>;
}

pub(crate) struct SqliteFixture {
    dir: tempfile::TempDir,
}

impl SqliteFixture {
    pub(crate) fn new() -> SqliteFixture {
        SqliteFixture {
            dir: tempfile::tempdir().unwrap(),
        }
    }
}

#[async_trait]
impl Fixture for SqliteFixture {
    /// In a directory that does not exist yet: opening creates it.
    async fn open(&self) -> Arc<dyn Store> {
        let path = self.dir.path().join("nested/dir/conclave.db");
        Arc::new(SqliteStore::open(&path).unwrap())
    }
}

/// A database of its own on the server `CONCLAVE_TEST_POSTGRES` names.
pub(crate) struct PostgresFixture {
    database: TestDatabase,
}

impl PostgresFixture {
    pub(crate) async fn new() -> PostgresFixture {
        PostgresFixture {
            database: TestDatabase::create(&test_server()).await,
        }
    }

    /// How to connect to the fixture's database.
    pub(crate) fn options(&self) -> sqlx::postgres::PgConnectOptions {
        self.database.options()
    }
}

/// A connection that died while idle in the pool (the database restarted,
/// a proxy dropped it) is pinged and replaced before it is handed out: the
/// next call succeeds.
#[tokio::test]
async fn a_postgres_connection_that_died_idle_is_replaced_before_use() {
    use sqlx::Connection;
    let fixture = PostgresFixture::new().await;
    let store = fixture.open().await;
    let record = session(None, Utc::now());
    store.create_session(&record).await.unwrap();
    let mut admin = sqlx::PgConnection::connect_with(&fixture.database.options())
        .await
        .unwrap();
    // Idle past the window in which a connection is trusted unpinged.
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'conclave') AS k",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(killed >= 1, "the store's connections were killed");
    assert_eq!(
        store.get_session(record.id).await.unwrap(),
        Some(record),
        "a dead idle connection was replaced"
    );
}

#[async_trait]
impl Fixture for PostgresFixture {
    async fn open(&self) -> Arc<dyn Store> {
        Arc::new(
            PostgresStore::open_with(self.database.options())
                .await
                .unwrap(),
        )
    }
}

/// Instantiates each named test (`module::test`) once per backend, as
/// `store::conformance::sqlite::test` and `…::postgres::test`.
macro_rules! suite {
    ($($module:ident :: $test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$module::$test(&super::SqliteFixture::new()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$module::$test(&super::PostgresFixture::new().await).await;
                }
            )*
        }
    };
}

suite!(
    sessions::created_session_reads_back_whole,
    sessions::origin_and_metadata_read_back_filter_and_merge,
    sessions::creating_a_session_twice_fails,
    sessions::update_saves_status_usage_and_updated_at,
    sessions::updating_an_unknown_session_changes_nothing,
    sessions::list_sessions_filters_by_owner_newest_first,
    sessions::expired_ephemeral_sessions_are_found_oldest_first,
    sessions::sessions_with_status_finds_only_that_status,
    sessions::append_messages_continues_after_the_highest_index,
    sessions::racing_message_appends_all_land_in_order,
    sessions::truncate_messages_cuts_the_history_and_appends_continue,
    sessions::messages_of_an_unknown_session_are_refused,
    sessions::delete_session_cascades_to_messages_and_events,
    events::events_since_pages_in_order_and_last_seq_tracks_the_end,
    events::everything_survives_close_and_reopen,
    events::dropping_the_store_keeps_what_was_written,
    events::calls_after_close_fail_with_closed,
    events::close_lets_the_calls_under_way_finish,
    events::concurrent_appends_all_land_without_gaps,
    events::appending_several_events_is_all_or_nothing,
    events::a_batch_saves_the_sessions_state_messages_and_lease_with_its_events_or_none,
    events::a_batch_that_makes_its_session_stores_it_with_its_lease_or_nothing,
    kv::kv_writes_compare_and_set_on_revisions_per_namespace,
    kv::kv_deletes_are_conditional_and_take_a_revision,
    kv::kv_lists_by_literal_prefix_in_key_order_and_survives_a_reopen,
    kv::concurrent_compare_and_set_has_one_winner_per_revision,
    kv::checkpoints_are_kept_per_step_never_overwritten_and_go_with_their_session,
    bus::bus_messages_read_back_in_publish_order_from_a_cursor,
    bus::pruning_keeps_positions_and_last_seqs,
    leases::one_holder_at_a_time,
    quota::slots_hold_a_limit_across_replicas,
    quota::expired_slots_free_themselves,
    quota::racing_takers_never_pass_the_limit,
    quota::window_counts_restart_each_window,
    quota::a_keys_stored_bytes_count_its_sessions_events,
    quota::session_slots_count_the_owners_open_sessions,
    leases::a_race_has_one_winner,
    leases::acquires_racing_releases_always_answer,
    leases::a_turn_lease_is_taken_only_for_a_session_and_reads_it,
    usage::usage_adds_up_per_owner_day_and_model,
    usage::concurrent_usage_adds_all_land,
);

/// Tests of two replicas on one database: PostgreSQL only, the backend
/// that is shared.
macro_rules! replicas {
    ($($test:ident),* $(,)?) => {
        mod two_replicas {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::replicas::$test(&super::PostgresFixture::new().await).await;
                }
            )*
        }
    };
}

replicas!(
    leases_race_across_replicas,
    kv_compare_and_set_across_replicas,
    events_of_one_replica_read_by_the_other,
    a_turn_taken_as_the_last_one_ends_reads_its_end,
);

pub(crate) fn session(owner: Option<&str>, created_at: DateTime<Utc>) -> SessionRecord {
    SessionRecord {
        id: Uuid::new_v4(),
        name: Some("review".into()),
        kind: SessionKind::AGENT,
        owner: owner.map(str::to_owned),
        options: json!({"model": "demo", "max_turns": 4, "tools": ["bash"]}),
        status: SessionStatus::Idle,
        usage: Usage::default(),
        ephemeral: false,
        origin: None,
        metadata: Default::default(),
        created_at,
        updated_at: created_at,
    }
}

pub(crate) fn event(session_id: Uuid, seq: u64) -> Event {
    let kind = match seq % 3 {
        0 => EventKind::TextDelta {
            content: format!("token {seq} "),
            reasoning: false,
        },
        1 => EventKind::ToolResult {
            id: format!("call_{seq}"),
            tool: "bash".into(),
            output: json!({"stdout": "x".repeat(300), "exit_code": 0}),
            is_error: false,
        },
        _ => EventKind::Result {
            status: ResultStatus::Success,
            result: Some("done".into()),
            cost_usd: 0.25,
            cost_known: true,
            turns: 2,
            usage: Usage {
                input_tokens: 120,
                output_tokens: 40,
                cache_read_tokens: 80,
                cache_write_tokens: 0,
                cost_usd: 0.25,
                turns: 2,
                tool_calls: 1,
            },
            duration_ms: 1500,
            history_len: None,
            files_changed: None,
            context: None,
        },
    };
    Event {
        kind,
        session_id,
        seq,
        ts: Utc::now(),
        agent_id: None,
    }
}

pub(crate) fn conversation() -> Vec<Message> {
    vec![
        Message::User {
            content: "list the files".into(),
        },
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "bash".into(),
                arguments: json!({"command": "ls"}),
            }],
        },
        Message::Tool {
            tool_call_id: "call_1".into(),
            name: "bash".into(),
            content: "README.md\nsrc\n".into(),
            is_error: false,
        },
    ]
}
