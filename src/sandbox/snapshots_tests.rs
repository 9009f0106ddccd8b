//! The records of turn-end snapshots against real stores (SQLite, and
//! PostgreSQL for the statements a snapshot costs), with a sandbox whose
//! `tar` prints a fixed archive: the tar itself is `tests/fork.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Connection;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{AtTurn, Snapshots, TurnEnd};
use crate::sandbox::{ExecChunk, ExecRequest, ExecStatus, Result, Sandbox, SandboxStats};
use crate::store::Store;
use crate::store::conformance::PostgresFixture;
use crate::store::postgres::PostgresStore;
use crate::store::sqlite::SqliteStore;

/// A sandbox whose every command prints `ARCHIVE` and exits 0.
struct Printing;

const ARCHIVE: &[u8] = b"a workspace";

#[async_trait]
impl Sandbox for Printing {
    fn id(&self) -> &str {
        "printing"
    }

    async fn assign(&self, _session_id: &str) -> Result<()> {
        Ok(())
    }

    async fn exec(
        &self,
        _request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        _cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        let _ = output.send(ExecChunk::Stdout(ARCHIVE.into())).await;
        Ok(ExecStatus::succeeded())
    }

    async fn stats(&self) -> Result<SandboxStats> {
        Ok(SandboxStats::default())
    }

    async fn destroy(&self) -> Result<()> {
        Ok(())
    }
}

fn snapshots(store: Arc<dyn Store>, dir: &tempfile::TempDir, keep_last: usize) -> Snapshots {
    Snapshots::new(
        store,
        dir.path().join("snapshots"),
        keep_last,
        "instance".into(),
        Duration::from_secs(10),
    )
}

async fn take(snapshots: &Snapshots, session: Uuid, seq: u64, dirty: bool) {
    let end = TurnEnd {
        session,
        owner: None,
        seq,
        dirty,
        backend: "printing",
        image: "image",
    };
    snapshots.take(end, &Printing).await.unwrap();
}

/// The kept snapshots as (the turn ends each stands for) in order.
async fn kept(snapshots: &Snapshots, session: Uuid) -> Vec<Vec<u64>> {
    let kept = snapshots.of_session(session).await.unwrap();
    kept.into_iter().map(|s| s.turns).collect()
}

fn files(dir: &tempfile::TempDir) -> usize {
    std::fs::read_dir(dir.path().join("snapshots"))
        .unwrap()
        .count()
}

/// Turn ends that leased no sandbox share the snapshot before them; the
/// oldest past `keep_last` are dropped, and a snapshot no turn end
/// stands for goes with its file. A turn end taken again replaces its
/// entry, and the snapshot it stood for alone goes too.
#[tokio::test]
async fn turn_ends_share_drop_and_replace_their_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("db")).unwrap());
    let snapshots = snapshots(store, &dir, 2);
    let session = Uuid::new_v4();

    take(&snapshots, session, 10, true).await;
    take(&snapshots, session, 20, false).await;
    assert_eq!(kept(&snapshots, session).await, [vec![10, 20]]);
    take(&snapshots, session, 30, false).await;
    assert_eq!(kept(&snapshots, session).await, [vec![20, 30]]);
    take(&snapshots, session, 40, true).await;
    assert_eq!(kept(&snapshots, session).await, [vec![30], vec![40]]);
    assert_eq!(files(&dir), 2);
    take(&snapshots, session, 50, true).await;
    assert_eq!(kept(&snapshots, session).await, [vec![40], vec![50]]);
    assert_eq!(files(&dir), 2, "the snapshot of 10 to 30 is gone");

    // Taken again: shared with itself, then made anew.
    take(&snapshots, session, 50, false).await;
    assert_eq!(kept(&snapshots, session).await, [vec![40], vec![50]]);
    let before = snapshots.of_session(session).await.unwrap();
    take(&snapshots, session, 50, true).await;
    let after = snapshots.of_session(session).await.unwrap();
    assert_eq!(kept(&snapshots, session).await, [vec![40], vec![50]]);
    assert_ne!(before[1].snapshot_id, after[1].snapshot_id);
    assert_eq!(files(&dir), 2, "the replaced snapshot is gone");

    assert_eq!(snapshots.at_turn(session, 5).await.unwrap(), AtTurn::Before);
    assert_eq!(
        snapshots.at_turn(session, 10).await.unwrap(),
        AtTurn::Dropped(vec![40, 50])
    );
    assert!(matches!(
        snapshots.at_turn(session, 40).await.unwrap(),
        AtTurn::Kept(s) if s.turns == [40]
    ));
    assert!(snapshots.has_any(session).await.unwrap());

    snapshots.forget_session(session).await.unwrap();
    assert_eq!(kept(&snapshots, session).await, Vec::<Vec<u64>>::new());
    assert_eq!(files(&dir), 0);
    assert!(!snapshots.has_any(session).await.unwrap());
}

/// A rewind records what the session's next sandbox starts from and holds
/// that snapshot until then: past `keep_last` it pushes the turn end's
/// entry out, and the snapshot stays until the restore is done; a second
/// rewind replaces the first and moves the hold; a turn end no longer
/// kept is refused; before the first snapshot the restore names none.
#[tokio::test]
async fn a_rewind_holds_its_snapshot_until_the_next_sandbox_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("db")).unwrap());
    let snapshots = snapshots(store, &dir, 2);
    let session = Uuid::new_v4();
    take(&snapshots, session, 10, true).await;
    take(&snapshots, session, 20, true).await;
    let ten = snapshots.of_session(session).await.unwrap()[0].clone();
    assert_eq!(snapshots.pending(session).await.unwrap(), None);

    assert!(snapshots.rewind(session, 10).await.unwrap());
    let restore = snapshots.pending(session).await.unwrap().unwrap();
    assert_eq!(
        (restore.seq, restore.snapshot.as_deref(), restore.held),
        (10, Some(ten.snapshot_id.as_str()), true)
    );
    // Turn ends past `keep_last` drop 10's entry; the hold keeps its file.
    take(&snapshots, session, 30, true).await;
    take(&snapshots, session, 40, true).await;
    assert_eq!(kept(&snapshots, session).await, [vec![30], vec![40]]);
    assert_eq!(files(&dir), 3);
    let held = snapshots.get(&ten.snapshot_id).await.unwrap().unwrap();
    assert_eq!(held.used_by, [session]);

    // Rewound again to a kept turn end: the hold moves, and 10 goes.
    assert!(snapshots.rewind(session, 30).await.unwrap());
    assert_eq!(snapshots.get(&ten.snapshot_id).await.unwrap(), None);
    assert_eq!(files(&dir), 2);
    let restore = snapshots.pending(session).await.unwrap().unwrap();
    assert_eq!(restore.seq, 30);
    // The same turn end again keeps the hold it has.
    assert!(snapshots.rewind(session, 30).await.unwrap());
    assert_eq!(
        snapshots.pending(session).await.unwrap(),
        Some(restore.clone())
    );
    snapshots.restored(session, &restore).await.unwrap();
    assert_eq!(snapshots.pending(session).await.unwrap(), None);
    let thirty = snapshots.of_session(session).await.unwrap()[0].clone();
    assert!(thirty.used_by.is_empty(), "{thirty:?}");

    // 10 and 20 are no longer kept: the files stay, nothing is recorded.
    assert!(!snapshots.rewind(session, 20).await.unwrap());
    assert_eq!(snapshots.pending(session).await.unwrap(), None);
    // Before the first turn end: no snapshot, the first sandbox's start.
    assert!(snapshots.rewind(session, 5).await.unwrap());
    let before = snapshots.pending(session).await.unwrap().unwrap();
    assert_eq!((before.snapshot, before.held), (None, false));
    // Deleting the session forgets it.
    snapshots.forget_session(session).await.unwrap();
    assert_eq!(snapshots.pending(session).await.unwrap(), None);
    assert_eq!(files(&dir), 0);

    // With snapshots off nothing is kept to go back to.
    let off = super::Snapshots::new(
        Arc::new(SqliteStore::open(&dir.path().join("db2")).unwrap()),
        dir.path().join("off"),
        0,
        "instance".into(),
        Duration::from_secs(10),
    );
    assert!(!off.rewind(session, 5).await.unwrap());
}

/// The statements on the store's KV each turn end costs on PostgreSQL,
/// as `pg_stat_statements` counts them: one listing of the session's
/// turn ends, the new record or the shared one's change, the turn end's
/// entry (and the session's first, once), and for each turn end dropped
/// its entry and its record's change. Before each record was read and
/// written once per change, the turn ends listed twice and the first
/// asked for every time, these were 6, 5, 5, 8, 8, 9, 9 and 9.
#[tokio::test]
async fn a_turn_end_lists_its_session_once_and_changes_each_record_once() {
    let fixture = PostgresFixture::new().await;
    let store = PostgresStore::open_with(fixture.options()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let snapshots = snapshots(Arc::new(store), &dir, 3);
    let mut db = sqlx::PgConnection::connect_with(&fixture.options())
        .await
        .unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut db)
        .await
        .expect("PostgreSQL runs with shared_preload_libraries = pg_stat_statements");
    let session = Uuid::new_v4();
    let mut counted = Vec::new();
    for (seq, dirty) in [
        (1, true),
        (2, true),
        (3, true),
        (4, true),
        (5, true),
        (6, false),
        (7, false),
        (8, false),
    ] {
        sqlx::query(
            "SELECT pg_stat_statements_reset(0, \
             (SELECT oid FROM pg_database WHERE datname = current_database()), 0)",
        )
        .execute(&mut db)
        .await
        .unwrap();
        take(&snapshots, session, seq, dirty).await;
        let calls: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND query LIKE '%kv%'",
        )
        .fetch_one(&mut db)
        .await
        .unwrap();
        counted.push(calls);
    }
    // 1: the first's entry too; 4, 5: 1 and 2 dropped (a record each,
    // deleted); 6, 7: shared with 5, dropping 3 and 4 (other records);
    // 8: shared with 5, dropping 5 itself (the shared record's one
    // change).
    assert_eq!(counted, [4, 3, 3, 6, 6, 7, 7, 5]);
    assert_eq!(kept(&snapshots, session).await, [vec![6, 7, 8]]);
}

/// Files kept in memory, as the replicas' shared place would keep them.
#[derive(Default)]
struct Shelf(std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>);

#[async_trait]
impl crate::store::SharedFiles for Shelf {
    async fn put(
        &self,
        name: &str,
        mut data: crate::store::FileReader,
    ) -> std::result::Result<u64, crate::store::StoreError> {
        let mut bytes = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut data, &mut bytes)
            .await
            .unwrap();
        let size = bytes.len() as u64;
        self.0.lock().unwrap().insert(name.to_owned(), bytes);
        Ok(size)
    }

    async fn get(
        &self,
        name: &str,
    ) -> std::result::Result<Option<crate::store::FileReader>, crate::store::StoreError> {
        let bytes = self.0.lock().unwrap().get(name).cloned();
        Ok(bytes.map(|b| Box::new(std::io::Cursor::new(b)) as crate::store::FileReader))
    }

    async fn delete(&self, name: &str) -> std::result::Result<(), crate::store::StoreError> {
        self.0.lock().unwrap().remove(name);
        Ok(())
    }

    fn place(&self) -> String {
        "the test's shelf".into()
    }
}

/// Two replicas, each with a data directory of its own, on one store and
/// one shared place: what A took, B reads (a copy fetched once); deleted
/// through B, it leaves the shared place, and A's own file goes at A's
/// next sweep. Without the shared place B says whose directory has it.
#[tokio::test]
async fn a_snapshot_taken_on_one_replica_is_read_on_another_and_swept_when_gone() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("db")).unwrap());
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let shelf = Arc::new(Shelf::default());
    let replica = |dir: &tempfile::TempDir, instance: &str| {
        Snapshots::new(
            store.clone(),
            dir.path().join("snapshots"),
            2,
            instance.into(),
            Duration::from_secs(10),
        )
    };
    let a = replica(&dir_a, "a").with_shared(shelf.clone());
    let b = replica(&dir_b, "b").with_shared(shelf.clone());
    let alone = replica(&dir_b, "c");
    let session = Uuid::new_v4();
    take(&a, session, 10, true).await;
    let snapshot = a.of_session(session).await.unwrap().remove(0);
    assert_eq!(shelf.0.lock().unwrap().len(), 1, "stored where B reads");

    let unshared = alone.local_path(&snapshot).await.unwrap_err().to_string();
    assert!(
        unshared.contains("another server instance (a)"),
        "{unshared}"
    );
    let path = b.local_path(&snapshot).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), ARCHIVE);
    assert!(path.starts_with(dir_b.path()), "a copy of B's own");
    assert_eq!(files(&dir_b), 1, "no half copy is left");

    // Gone through B: the record, B's copy and the shared file; A's file
    // has no record now, and A's sweep removes it.
    b.forget_session(session).await.unwrap();
    assert!(shelf.0.lock().unwrap().is_empty());
    assert_eq!(files(&dir_b), 0);
    assert_eq!(files(&dir_a), 1);
    assert_eq!(a.sweep(super::SWEEP_AFTER).await.unwrap(), 0, "too young");
    assert_eq!(a.sweep(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(files(&dir_a), 0);
}
