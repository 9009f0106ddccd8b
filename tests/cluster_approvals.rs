//! Tool-call approvals across replicas: a call of a turn running on
//! replica A waits for a decision that a client gives on replica B, as
//! tests/cluster.rs starts them (real `conclave serve` processes on one
//! PostgreSQL database and one nats-server, local sandboxes), here with
//! two API keys so that one key's decisions on the other's session can be
//! tried.
//!
//! Needs `CONCLAVE_TEST_POSTGRES` and `CONCLAVE_TEST_NATS_SERVER`, which
//! scripts/test.sh sets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::nats::NatsServer;
use common::postgres::{TestDatabase, test_server};
use common::replicas::{Replica, local_replicas};
use common::{Lines, types};
use serde_json::{Value, json};

const ALICE: &str = "alice-key-0001";
const BOB: &str = "bob-key-00002";

/// A replica and the URL it listens on; the fields drop in order, so the
/// replicas stop before nats-server and the database go.
struct Pair {
    replicas: Vec<Replica>,
    _nats: NatsServer,
    _database: TestDatabase,
    http: reqwest::Client,
}

impl Pair {
    /// Replicas A and B on a fresh database and nats-server.
    async fn start() -> Pair {
        let database = TestDatabase::create(&test_server()).await;
        let nats = NatsServer::start(true).await;
        let keys = format!("{ALICE},{BOB}");
        let env = [("CONCLAVE_API_KEYS", keys.as_str())];
        let replicas = local_replicas(2, &database, &nats, &env).await;
        Pair {
            replicas,
            _nats: nats,
            _database: database,
            http: reqwest::Client::new(),
        }
    }

    fn at(&self, on: usize, path: &str) -> String {
        format!("{}{path}", self.replicas[on].1)
    }

    async fn get(&self, on: usize, key: &str, path: &str) -> reqwest::Response {
        let request = self.http.get(self.at(on, path)).bearer_auth(key);
        request.send().await.unwrap()
    }

    async fn post(&self, on: usize, key: &str, path: &str, body: Value) -> reqwest::Response {
        let request = self.http.post(self.at(on, path)).bearer_auth(key);
        request.json(&body).send().await.unwrap()
    }

    /// `GET /agent/approvals` on replica `on` with `key`.
    async fn approvals(&self, on: usize, key: &str) -> Value {
        let listed = self.get(on, key, "/agent/approvals").await;
        assert_eq!(listed.status(), 200);
        listed.json().await.unwrap()
    }

    /// The sum of a metric's samples on replica `on`.
    async fn metric(&self, on: usize, name: &str) -> f64 {
        let text = self.get(on, ALICE, "/metrics").await.text().await.unwrap();
        text.lines()
            .filter(|line| {
                line.starts_with(&format!("{name} ")) || line.starts_with(&format!("{name}{{"))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {:?}", types(events)))
}

#[tokio::test]
async fn a_decision_given_on_one_replica_runs_the_call_waiting_on_another() {
    let pair = Pair::start().await;
    const A: usize = 0;
    const B: usize = 1;
    let created = pair
        .post(
            A,
            ALICE,
            "/agent/session",
            json!({"options": {"permissions": {"mode": "ask"}}}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let id = created["session_id"].as_str().unwrap().to_string();

    // Alice follows the session on B while its turn runs on A.
    let follow = format!("/agent/session/{id}/events?since=0&follow=true");
    let mut on_b = Lines::new(pair.get(B, ALICE, &follow).await);
    let message = format!("/agent/session/{id}/message");
    let turn = pair
        .post(A, ALICE, &message, json!({"prompt": "$ echo decided-on-b"}))
        .await;
    assert_eq!(turn.status(), 200);
    let mut on_a = Lines::new(turn);

    let before = on_b.until("approval_requested").await;
    let asked = before.last().unwrap();
    let call_id = asked["call_id"].as_str().unwrap().to_string();
    assert_eq!(of_type(&before, "tool_use")["id"], call_id.as_str());
    assert_eq!(asked["input"]["command"], "echo decided-on-b", "{asked}");

    // B lists it to its owner, and to nobody else.
    let listed: Value = pair.approvals(B, ALICE).await;
    let listed = listed["approvals"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["session_id"], id.as_str());
    assert_eq!(listed[0]["call_id"], call_id.as_str());
    let of_bob: Value = pair.approvals(B, BOB).await;
    assert_eq!(of_bob["approvals"], json!([]), "{of_bob}");

    // Another key's decision is refused as if the session did not exist,
    // and leaves the call pending.
    let decide = format!("/agent/session/{id}/approvals/{call_id}");
    let by_bob = pair
        .post(B, BOB, &decide, json!({"decision": "deny"}))
        .await;
    assert_eq!(by_bob.status(), 404);
    let refused: Value = by_bob.json().await.unwrap();
    assert_eq!(refused["error"]["code"], "not_found", "{refused}");

    let allowed = pair
        .post(B, ALICE, &decide, json!({"decision": "allow"}))
        .await;
    assert_eq!(allowed.status(), 200);
    let allowed: Value = allowed.json().await.unwrap();
    assert_eq!(allowed["decision"], "allow", "{allowed}");

    // The turn on A takes the decision and runs the call there (a lost
    // decision would leave it waiting for its five minutes).
    let rest = tokio::time::timeout(Duration::from_secs(60), on_a.until("result"))
        .await
        .expect("the decision reached the turn on A");
    let decided = of_type(&rest, "approval_decided");
    assert_eq!(decided["call_id"], call_id.as_str());
    assert_eq!(decided["decision"], "allow");
    assert_eq!(decided["by"], "user");
    let result = of_type(&rest, "tool_result");
    assert_eq!(result["id"], call_id.as_str(), "{result}");
    assert_eq!(result["is_error"], false, "{result}");
    assert!(
        result["output"].to_string().contains("decided-on-b"),
        "{result}"
    );
    assert_eq!(rest.last().unwrap()["status"], "success");
    assert_eq!(pair.metric(A, "conclave_sandboxes_live").await, 1.0);
    assert_eq!(pair.metric(B, "conclave_sandboxes_live").await, 0.0);
    // B's follower saw the same.
    let after = on_b.until("result").await;
    assert_eq!(of_type(&after, "tool_result"), result);

    // The call is no longer waiting: a second decision, on either, is a 409.
    for on in [B, A] {
        let again = pair
            .post(on, ALICE, &decide, json!({"decision": "deny"}))
            .await;
        assert_eq!(again.status(), 409, "replica {on}");
        let again: Value = again.json().await.unwrap();
        assert_eq!(again["error"]["code"], "not_pending", "{again}");
    }
    let listed: Value = pair.approvals(B, ALICE).await;
    assert_eq!(listed["approvals"], json!([]), "{listed}");
}
