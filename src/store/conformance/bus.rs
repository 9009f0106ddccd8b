//! The retained messages of durable bus subjects.

use chrono::{DateTime, TimeDelta, Utc};

use super::Fixture;
use crate::store::{BusCursor, BusRecord, BusStream};

/// Now to the microsecond, the precision both backends keep bus times at.
fn now() -> DateTime<Utc> {
    DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap()
}

fn message(namespace: &str, stream: &str, seq: u64, time: DateTime<Utc>) -> BusRecord {
    BusRecord {
        namespace: namespace.into(),
        stream: stream.into(),
        subject: stream.replace('.', "/"),
        seq,
        time,
        payload: format!("{namespace} {stream} {seq}").into_bytes(),
    }
}

fn sorted(mut streams: Vec<BusStream>) -> Vec<BusStream> {
    streams.sort_by(|a, b| (&a.namespace, &a.stream).cmp(&(&b.namespace, &b.stream)));
    streams
}

pub(crate) async fn bus_messages_read_back_in_publish_order_from_a_cursor(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let t0 = now();
    let published = vec![
        message("t1", "orders.new", 1, t0),
        message("t1", "orders.old", 1, t0 + TimeDelta::seconds(1)),
        message("t1", "orders.new", 2, t0 + TimeDelta::seconds(2)),
    ];
    store.bus_append(&published[..2]).await.unwrap();
    store
        .bus_append(&[message("t2", "orders.new", 1, t0)])
        .await
        .unwrap();
    store.bus_append(&published[2..]).await.unwrap();
    // A batch repeating a seq is refused whole.
    let clashing = [
        message("t1", "orders.new", 3, t0),
        message("t1", "orders.old", 1, t0),
    ];
    assert!(store.bus_append(&clashing).await.is_err());

    let all = store
        .bus_read("t1", BusCursor::default(), 100)
        .await
        .unwrap();
    let records: Vec<BusRecord> = all.iter().map(|(_, record)| record.clone()).collect();
    assert_eq!(records, published);
    assert!(all.windows(2).all(|pair| pair[0].0 < pair[1].0), "{all:?}");
    let after_first = BusCursor {
        after: all[0].0,
        from_time: None,
    };
    assert_eq!(
        store.bus_read("t1", after_first, 100).await.unwrap(),
        all[1..]
    );
    assert_eq!(
        store.bus_read("t1", after_first, 1).await.unwrap(),
        all[1..2]
    );
    let from_time = BusCursor {
        after: 0,
        from_time: Some(t0 + TimeDelta::seconds(1)),
    };
    assert_eq!(
        store.bus_read("t1", from_time, 100).await.unwrap(),
        all[1..]
    );
    assert_eq!(
        sorted(store.bus_streams().await.unwrap()),
        [
            BusStream {
                namespace: "t1".into(),
                stream: "orders.new".into(),
                last_seq: 2,
                retained: 2,
            },
            BusStream {
                namespace: "t1".into(),
                stream: "orders.old".into(),
                last_seq: 1,
                retained: 1,
            },
            BusStream {
                namespace: "t2".into(),
                stream: "orders.new".into(),
                last_seq: 1,
                retained: 1,
            },
        ]
    );
    store.close().await.unwrap();
    drop(store);

    let store = fixture.open().await;
    assert_eq!(
        store
            .bus_read("t1", BusCursor::default(), 100)
            .await
            .unwrap(),
        all
    );
}

/// Pruned messages leave their stream's last `seq` and never give their
/// positions to later messages, through a reopen too.
pub(crate) async fn pruning_keeps_positions_and_last_seqs(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let t0 = now();
    let batch: Vec<BusRecord> = (1..=4)
        .map(|seq| message("t1", "jobs", seq, t0 + TimeDelta::seconds(seq as i64)))
        .collect();
    store.bus_append(&batch).await.unwrap();
    let before = store
        .bus_read("t1", BusCursor::default(), 100)
        .await
        .unwrap();

    assert_eq!(store.bus_prune("t1", "jobs", 2, None).await.unwrap(), 2);
    assert_eq!(store.bus_prune("t1", "other", 9, None).await.unwrap(), 0);
    let kept = store
        .bus_read("t1", BusCursor::default(), 100)
        .await
        .unwrap();
    assert_eq!(kept, before[2..]);
    // By age: message 3 was published before t0 + 3.5 s, message 4 after.
    let older_than = Some(t0 + TimeDelta::milliseconds(3500));
    assert_eq!(
        store.bus_prune("t1", "jobs", 0, older_than).await.unwrap(),
        1
    );
    assert_eq!(store.bus_prune("t1", "jobs", 4, None).await.unwrap(), 1);
    let jobs = |last_seq, retained| BusStream {
        namespace: "t1".into(),
        stream: "jobs".into(),
        last_seq,
        retained,
    };
    assert_eq!(store.bus_streams().await.unwrap(), [jobs(4, 0)]);
    store.close().await.unwrap();
    drop(store);

    let store = fixture.open().await;
    assert_eq!(store.bus_streams().await.unwrap(), [jobs(4, 0)]);
    store
        .bus_append(&[message("t1", "jobs", 5, t0)])
        .await
        .unwrap();
    let next = store
        .bus_read("t1", BusCursor::default(), 100)
        .await
        .unwrap();
    assert_eq!(next.len(), 1);
    assert!(next[0].0 > before[3].0, "position {} reused", next[0].0);
    assert_eq!(store.bus_streams().await.unwrap(), [jobs(5, 1)]);
}
