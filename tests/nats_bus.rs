//! Two real `conclave serve` processes on one NATS (`--bus`): what is
//! published over HTTP on one reaches subscribers over HTTP and the
//! WebSocket on the other, in order with dense `seq`s whichever replica
//! publishes; a NATS that is not there, or has no JetStream, stops the
//! start, naming it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Lines;
use common::binary::{serve_command, spawn_server, stop};
use common::nats::{NatsServer, free_port};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::process::Child;
use tokio_tungstenite::tungstenite::Message;

fn nats_url() -> String {
    std::env::var("CONCLAVE_TEST_NATS").unwrap_or_else(|_| {
        panic!(
            "CONCLAVE_TEST_NATS is not set: these tests need a NATS server with \
             JetStream (scripts/test.sh starts one and sets it)"
        )
    })
}

/// One replica in a data directory of its own.
struct Replica {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Replica {
    /// On `bus`, and on the shared `store` if one is given (else SQLite
    /// in its directory).
    async fn start(bus: &str, store: Option<&str>) -> Replica {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().to_str().unwrap().to_owned();
        let mut args = vec!["--sandbox", "local", "--data-dir", &data_dir, "--bus", bus];
        if let Some(store) = store {
            args.extend(["--store", store]);
        }
        let (child, url) = spawn_server(&mut serve_command(&args)).await;
        Replica {
            child,
            url,
            _dir: dir,
        }
    }

    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    async fn publish(&self, subject: &str, data: Value) -> Value {
        let response = reqwest::Client::new()
            .post(self.at(&format!("/bus/publish/{subject}")))
            .json(&data)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        response.json().await.unwrap()
    }

    /// `PUT /kv/{path}` with a JSON value: the status and the body.
    async fn put(&self, path: &str, value: Value) -> (u16, Value) {
        let response = reqwest::Client::new()
            .put(self.at(&format!("/kv/{path}")))
            .json(&value)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    async fn subscribe(&self, query: &str) -> Lines {
        let response = reqwest::get(self.at(&format!("/bus/subscribe?{query}")))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        Lines::new(response)
    }
}

async fn next(lines: &mut Lines) -> Value {
    tokio::time::timeout(Duration::from_secs(10), lines.next())
        .await
        .expect("a line within 10 s")
        .expect("the stream goes on")
}

/// `(subject, seq, data)` of a delivered message.
fn brief(message: &Value) -> (String, u64, Value) {
    assert_eq!(message["type"], "message", "{message}");
    (
        message["subject"].as_str().unwrap().to_owned(),
        message["seq"].as_u64().unwrap(),
        message["data"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_nats_are_one_bus() {
    let bus = nats_url();
    let a = Replica::start(&bus, None).await;
    let b = Replica::start(&bus, None).await;
    for replica in [&a, &b] {
        let ready: Value = reqwest::get(replica.at("/ready"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(ready["bus"], "ok", "{ready}");
    }
    // Subjects of this run alone: the NATS server may be shared.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let kept = format!("sync/{run}/weights_ready");
    let live = format!("chatter.{run}");
    let mut on_b = b
        .subscribe(&format!("subjects=sync.{run}.>,chatter.{run}"))
        .await;
    // Published on either replica, numbered as one.
    let published = [
        a.publish(&kept, json!({"version": 1})).await,
        b.publish(&kept, json!({"version": 2})).await,
        a.publish(&live, json!("hello")).await,
        a.publish(&kept, json!({"version": 3})).await,
    ];
    assert_eq!(
        published,
        [
            json!({"subject": kept, "seq": 1}),
            json!({"subject": kept, "seq": 2}),
            json!({"subject": live, "seq": 1}),
            json!({"subject": kept, "seq": 3}),
        ]
    );
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(brief(&next(&mut on_b).await));
    }
    let kept_seen: Vec<_> = got.iter().filter(|m| m.0 == kept).cloned().collect();
    assert_eq!(
        kept_seen,
        (1..=3)
            .map(|v| (kept.clone(), v, json!({"version": v})))
            .collect::<Vec<_>>()
    );
    assert!(got.contains(&(live.clone(), 1, json!("hello"))), "{got:?}");

    // A WebSocket on B replays what A published, then goes on live.
    let ws_url = b
        .at(&format!("/bus/ws?subscribe=sync.{run}.%3E&since=1"))
        .replacen("http://", "ws://", 1);
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();
    let mut ws_next = async || match tokio::time::timeout(Duration::from_secs(10), ws.next()).await
    {
        Ok(Some(Ok(Message::Text(text)))) => brief(&serde_json::from_str(&text).unwrap()),
        other => panic!("expected a text frame within 10 s: {other:?}"),
    };
    assert_eq!(ws_next().await.1, 2);
    assert_eq!(ws_next().await.1, 3);
    a.publish(&kept, json!({"version": 4})).await;
    assert_eq!(ws_next().await, (kept.clone(), 4, json!({"version": 4})));
    assert_eq!(brief(&next(&mut on_b).await).1, 4);

    // B counts what it delivered from the shared bus.
    let metrics = reqwest::get(b.at("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let delivered = metrics
        .lines()
        .find(|l| l.starts_with("conclave_bus_delivered_total{class=\"sync.>\"}"))
        .unwrap_or_else(|| panic!("{metrics}"));
    let count: f64 = delivered.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= 6.0, "{delivered}");

    drop((on_b, ws));
    let (mut a, mut b) = (a, b);
    stop(&mut a.child).await;
    stop(&mut b.child).await;
}

#[tokio::test]
async fn a_nats_that_is_not_there_stops_the_start_naming_it() {
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let output = serve_command(&[
        "--sandbox",
        "local",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--bus",
        &url,
    ])
    .output()
    .await
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("cannot use the NATS bus at {url}")),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_nats_without_jetstream_stops_the_start_naming_it() {
    let nats = NatsServer::start(false).await;
    let url = nats.url.clone();
    let dir = tempfile::tempdir().unwrap();
    let output = serve_command(&[
        "--sandbox",
        "local",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--bus",
        &url,
    ])
    .output()
    .await
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("cannot use the NATS bus at {url}"))
            && stderr.contains("JetStream"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_store_share_the_kv_and_wake_each_other() {
    let store = common::postgres::database().await;
    let bus = nats_url();
    let a = Replica::start(&bus, Some(&store)).await;
    let b = Replica::start(&bus, Some(&store)).await;
    // A wait and a watch on B, a write on A.
    let waiter = tokio::spawn(reqwest::get(b.at("/kv/topic?wait=10")));
    let mut watch = Lines::new(
        reqwest::get(b.at("/kv?prefix=topic&watch=true"))
            .await
            .unwrap(),
    );
    let (status, put) = a.put("topic?if_revision=0", json!("r1")).await;
    assert_eq!(status, 200, "{put}");
    let first = put["revision"].as_u64().unwrap();
    let waited: Value = waiter.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(
        (waited["value"].clone(), waited["revision"].as_u64()),
        (json!("r1"), Some(first))
    );
    let change = next(&mut watch).await;
    assert_eq!(
        (
            change["type"].as_str(),
            change["key"].as_str(),
            change["revision"].as_u64()
        ),
        (Some("put"), Some("topic"), Some(first)),
        "{change}"
    );
    // Compare-and-set across replicas: B wins at `first`, A then loses.
    let (status, put) = b
        .put(&format!("topic?if_revision={first}"), json!("r2"))
        .await;
    assert_eq!(status, 200, "{put}");
    let second = put["revision"].as_u64().unwrap();
    let (status, refused) = a
        .put(&format!("topic?if_revision={first}"), json!("r3"))
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "revision_mismatch");
    // A wait on A past `second` ends with B's next write.
    let waiter = tokio::spawn(reqwest::get(
        a.at(&format!("/kv/topic?wait=10&after={second}")),
    ));
    let (status, put) = b.put("topic", json!("r4")).await;
    assert_eq!(status, 200, "{put}");
    let waited: Value = waiter.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(waited["value"], json!("r4"));
    drop(watch);
    let (mut a, mut b) = (a, b);
    stop(&mut a.child).await;
    stop(&mut b.child).await;
}
