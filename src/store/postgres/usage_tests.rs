//! A key's usage added on several connections at once: none waits for
//! another's row, and every read sums what each added.

use chrono::NaiveDate;
use sqlx::{Connection, PgConnection, Row};

use super::{add_query, counts};
use crate::store::conformance::PostgresFixture;
use crate::store::{UsageCounts, UsageStore};

use super::super::PostgresStore;

fn spent(tokens: u64) -> UsageCounts {
    UsageCounts {
        input_tokens: tokens,
        output_tokens: 1,
        cost_usd: 0.5,
        turns: 1,
        ..UsageCounts::default()
    }
}

/// Adds `spent` to the key's usage of `model` on `day` on `connection`,
/// in whatever transaction it has open; answers the day's totals it saw.
async fn add(
    connection: &mut PgConnection,
    day: NaiveDate,
    model: &str,
    spent: &UsageCounts,
) -> Result<UsageCounts, sqlx::Error> {
    let row = add_query("key", day, model, spent)
        .fetch_one(connection)
        .await?;
    Ok(counts(&row, 0).unwrap())
}

/// The stripe `connection` adds to, as the store's statements take it.
async fn stripe(connection: &mut PgConnection) -> i16 {
    sqlx::query(concat!("SELECT ", stripe!()))
        .fetch_one(connection)
        .await
        .unwrap()
        .get(0)
}

/// Two connections (of different stripes) add to the same key, day and
/// model, the first one's transaction still open: the second's add does
/// not wait for it (a lock wait fails it at once), sees only what was
/// committed before it and its own, and both adds count once each
/// committed. With one row per key, day and model, the second waited
/// until the first ended.
#[tokio::test]
async fn adds_on_two_connections_do_not_wait_for_each_other() {
    let fixture = PostgresFixture::new().await;
    let store = PostgresStore::connect(fixture.options(), 2).await.unwrap();
    let day = NaiveDate::from_ymd_opt(2026, 11, 30).unwrap();
    store
        .usage_add("key", day, "demo", &spent(100))
        .await
        .unwrap();

    let mut first = PgConnection::connect_with(&fixture.options())
        .await
        .unwrap();
    let mut second = PgConnection::connect_with(&fixture.options())
        .await
        .unwrap();
    // A backend whose stripe is not the first's.
    while stripe(&mut second).await == stripe(&mut first).await {
        second = PgConnection::connect_with(&fixture.options())
            .await
            .unwrap();
    }
    let mut open = first.begin().await.unwrap();
    let seen = add(&mut open, day, "demo", &spent(10)).await.unwrap();
    assert_eq!((seen.input_tokens, seen.turns), (110, 2));

    sqlx::query("SET lock_timeout = '1ms'")
        .execute(&mut second)
        .await
        .unwrap();
    let seen = add(&mut second, day, "demo", &spent(1))
        .await
        .expect("an add that waits for no other transaction's row");
    assert_eq!(
        (seen.input_tokens, seen.output_tokens, seen.turns),
        (101, 2, 2),
        "the committed add and its own, not the one under way"
    );
    open.commit().await.unwrap();

    let day_totals = store.usage_day("key", day).await.unwrap();
    assert_eq!(
        (
            day_totals.input_tokens,
            day_totals.turns,
            day_totals.cost_usd
        ),
        (111, 3, 1.5)
    );
    let rows = store.usage_rows(day, day, None).await.unwrap();
    let listed: Vec<(&str, &str, u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r.owner.as_str(),
                r.model.as_str(),
                r.counts.input_tokens,
                r.counts.turns,
            )
        })
        .collect();
    assert_eq!(listed, [("key", "demo", 111, 3)], "one row of the stripes");
    let totals = store
        .usage_add("key", day, "other", &spent(4))
        .await
        .unwrap();
    assert_eq!((totals.input_tokens, totals.turns), (115, 4));
}

/// Adds on the same connection go to its one stripe: a key's rows of a
/// day and model stay as few as the connections that wrote them.
#[tokio::test]
async fn a_connection_adds_to_its_one_row() {
    let fixture = PostgresFixture::new().await;
    // Made by the store's migrations.
    PostgresStore::connect(fixture.options(), 1).await.unwrap();
    let mut connection = PgConnection::connect_with(&fixture.options())
        .await
        .unwrap();
    let day = NaiveDate::from_ymd_opt(2026, 11, 30).unwrap();
    for n in 1..=5 {
        let seen = add(&mut connection, day, "demo", &spent(n)).await.unwrap();
        assert_eq!(seen.turns, n);
    }
    let rows: i64 = sqlx::query("SELECT count(*) FROM key_usage_stripes")
        .fetch_one(&mut connection)
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
}

/// How a replica of the version before adds usage: to the one row of
/// the key, day and model in `key_usage`.
const ADD_BEFORE_STRIPES: &str = "INSERT INTO key_usage (owner, day, model, input_tokens,
        output_tokens, cost_usd, turns, tool_calls, sandbox_cpu_s, sandbox_wall_s)
    VALUES ($1, $2, $3, $4, 0, 0, 1, 0, 0, 0)
    ON CONFLICT (owner, day, model) DO UPDATE SET
        input_tokens = key_usage.input_tokens + excluded.input_tokens,
        turns = key_usage.turns + excluded.turns";

/// During an upgrade, replicas of the version before still add usage as
/// they did, beside this version's stripes: both keep working on the
/// migrated database, and every read counts both.
#[tokio::test]
async fn usage_added_the_way_before_stripes_still_counts() {
    let fixture = PostgresFixture::new().await;
    let store = PostgresStore::connect(fixture.options(), 1).await.unwrap();
    let mut before = PgConnection::connect_with(&fixture.options())
        .await
        .unwrap();
    let day = NaiveDate::from_ymd_opt(2026, 11, 30).unwrap();
    for tokens in [7_i64, 8] {
        sqlx::query(ADD_BEFORE_STRIPES)
            .bind("key")
            .bind("2026-11-30")
            .bind("demo")
            .bind(tokens)
            .execute(&mut before)
            .await
            .expect("the statement of the version before");
    }
    let totals = store
        .usage_add("key", day, "demo", &spent(100))
        .await
        .unwrap();
    assert_eq!((totals.input_tokens, totals.turns), (115, 3));
    let totals = store
        .usage_add("key", day, "other", &spent(1))
        .await
        .unwrap();
    assert_eq!((totals.input_tokens, totals.turns), (116, 4));
    assert_eq!(store.usage_day("key", day).await.unwrap(), totals);
    let rows = store.usage_rows(day, day, Some("key")).await.unwrap();
    let listed: Vec<(&str, u64, u64)> = rows
        .iter()
        .map(|r| (r.model.as_str(), r.counts.input_tokens, r.counts.turns))
        .collect();
    assert_eq!(listed, [("demo", 115, 3), ("other", 1, 1)]);
}
