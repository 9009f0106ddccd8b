//! Usage per key: atomic adds from many writers at once, the day's totals
//! the add answers, and reads by day range and owner.

use std::sync::Arc;

use chrono::NaiveDate;

use super::Fixture;
use crate::store::{Store, UsageCounts};

fn day(text: &str) -> NaiveDate {
    NaiveDate::parse_from_str(text, "%Y-%m-%d").unwrap()
}

fn call(input: u64, output: u64, cost: f64) -> UsageCounts {
    UsageCounts {
        input_tokens: input,
        output_tokens: output,
        cost_usd: cost,
        ..UsageCounts::default()
    }
}

pub(crate) async fn usage_adds_up_per_owner_day_and_model(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let today = day("2026-11-27");
    let total = store
        .usage_add("alice", today, "demo", &call(100, 20, 0.5))
        .await
        .unwrap();
    assert_eq!(total, call(100, 20, 0.5));
    // Another model the same day: the answer is the day's whole total.
    let other = UsageCounts {
        turns: 1,
        tool_calls: 3,
        sandbox_cpu_s: 1.5,
        sandbox_wall_s: 9.0,
        ..call(10, 5, 0.25)
    };
    let total = store
        .usage_add("alice", today, "other", &other)
        .await
        .unwrap();
    assert_eq!(
        total,
        UsageCounts {
            turns: 1,
            tool_calls: 3,
            sandbox_cpu_s: 1.5,
            sandbox_wall_s: 9.0,
            ..call(110, 25, 0.75)
        }
    );
    // Another owner and another day are apart.
    store
        .usage_add("bob", today, "demo", &call(7, 7, 0.0))
        .await
        .unwrap();
    store
        .usage_add("alice", day("2026-11-26"), "demo", &call(1, 1, 0.0))
        .await
        .unwrap();
    assert_eq!(store.usage_day("alice", today).await.unwrap().tokens(), 135);
    assert_eq!(store.usage_day("bob", today).await.unwrap().tokens(), 14);
    assert!(store.usage_day("carol", today).await.unwrap().is_empty());

    let all = store.usage_rows(today, today, None).await.unwrap();
    let keys: Vec<(&str, &str)> = all
        .iter()
        .map(|r| (r.owner.as_str(), r.model.as_str()))
        .collect();
    assert_eq!(
        keys,
        [("alice", "demo"), ("alice", "other"), ("bob", "demo")]
    );
    let alice = store
        .usage_rows(day("2026-11-01"), today, Some("alice"))
        .await
        .unwrap();
    assert_eq!(alice.len(), 3);
    assert_eq!(alice[0].day, day("2026-11-26"));
    assert!(alice.iter().all(|r| r.owner == "alice"));
    assert!(
        store
            .usage_rows(day("2026-11-28"), day("2026-12-31"), None)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Adds racing from two stores on one database (two replicas, for
/// PostgreSQL; two writers of one file, for SQLite) all land. Each
/// answers totals that count its own add and none beyond those made;
/// adds under way at the same moment need not see each other (on
/// PostgreSQL each connection adds to the row of its stripe). An add made
/// after them all sees every one.
pub(crate) async fn concurrent_usage_adds_all_land(fixture: &dyn Fixture) {
    let stores: [Arc<dyn Store>; 2] = [fixture.open().await, fixture.open().await];
    let today = day("2026-11-27");
    let adds = (0..40).map(|i| {
        let store = stores[i % 2].clone();
        tokio::spawn(async move {
            store
                .usage_add("alice", today, "demo", &call(1, 2, 0.125))
                .await
                .unwrap()
                .input_tokens
        })
    });
    let seen: Vec<u64> = futures::future::join_all(adds)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(seen.iter().all(|n| (1..=40).contains(n)), "{seen:?}");
    let mut total = stores[0].usage_day("alice", today).await.unwrap();
    assert_eq!(total, call(40, 80, 5.0));
    for store in &stores {
        let after = store
            .usage_add("alice", today, "other", &call(1, 2, 0.125))
            .await
            .unwrap();
        assert_eq!(
            after.input_tokens,
            total.input_tokens + 1,
            "an add after the others sees every one"
        );
        total = after;
    }
    assert_eq!(
        stores[1].usage_day("alice", today).await.unwrap(),
        call(42, 84, 5.25)
    );
}
