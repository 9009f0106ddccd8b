//! Three real `conclave serve` replicas on one PostgreSQL database and one
//! nats-server, as `deploy/` runs them: any replica serves any session, a
//! session runs one turn at a time among them, and the turn of a replica
//! killed with SIGKILL is closed by a survivor within the turn lease.
//!
//! Needs `CONCLAVE_TEST_POSTGRES` (a server the tests make databases in)
//! and `CONCLAVE_TEST_NATS_SERVER` (the nats-server binary; each test
//! starts its own with JetStream); scripts/test.sh sets both. The replicas
//! start in fresh directories with their default data directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::binary::{serve_command, spawn_server};
use common::nats::NatsServer;
use common::postgres::{TestDatabase, test_server};
use common::{Lines, long_prompt, ws_until};
use serde_json::{Value, json};
use sqlx::Connection;
use tokio::process::Child;

/// One `conclave serve` as the README starts it, in a directory of its
/// own, with the shared store and bus given by flags.
struct Replica {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Replica {
    async fn start(
        sandbox: &str,
        store: &str,
        bus: &str,
        lease_s: u64,
        env: &[(&str, &str)],
    ) -> Replica {
        let dir = tempfile::tempdir().unwrap();
        let mut command = serve_command(&["--sandbox", sandbox, "--store", store, "--bus", bus]);
        command
            .current_dir(dir.path())
            .env("CONCLAVE_CLUSTER__TURN_LEASE_S", lease_s.to_string())
            // The demo model pauses between words: turns last a while.
            .env("CONCLAVE_DEMO__CHUNK_DELAY_MS", "20")
            .env("CONCLAVE_SANDBOX__WARM_POOL", "0")
            .envs(env.iter().copied());
        let (child, url) = spawn_server(&mut command).await;
        Replica {
            child,
            url,
            _dir: dir,
        }
    }

    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    fn ws(&self, path: &str) -> String {
        self.at(path).replacen("http://", "ws://", 1)
    }
}

struct Cluster {
    replicas: Vec<Replica>,
    nats: NatsServer,
    /// Dropped after the replicas (fields drop in order).
    database: TestDatabase,
    http: reqwest::Client,
}

async fn cluster(lease_s: u64) -> Cluster {
    cluster_with(lease_s, &[]).await
}

async fn cluster_with(lease_s: u64, env: &[(&str, &str)]) -> Cluster {
    cluster_on("local", lease_s, env).await
}

/// Three replicas on the `sandbox` backend.
async fn cluster_on(sandbox: &str, lease_s: u64, env: &[(&str, &str)]) -> Cluster {
    let database = TestDatabase::create(&test_server()).await;
    let nats = NatsServer::start(true).await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::start(sandbox, &database.url(), &nats.url, lease_s, env).await);
    }
    Cluster {
        replicas,
        nats,
        database,
        http: reqwest::Client::new(),
    }
}

impl Cluster {
    async fn get(&self, on: usize, path: &str) -> reqwest::Response {
        self.http
            .get(self.replicas[on].at(path))
            .send()
            .await
            .unwrap()
    }

    async fn get_json(&self, on: usize, path: &str) -> Value {
        self.get(on, path).await.json().await.unwrap()
    }

    async fn post(&self, on: usize, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(self.replicas[on].at(path))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn post_json(&self, on: usize, path: &str, body: Value) -> Value {
        self.post(on, path, body).await.json().await.unwrap()
    }

    async fn create_session(&self, on: usize) -> String {
        let created = self.post_json(on, "/agent/session", json!({})).await;
        created["session_id"].as_str().unwrap().to_string()
    }

    async fn send(&self, on: usize, id: &str, prompt: &str) -> reqwest::Response {
        let path = format!("/agent/session/{id}/message");
        self.post(on, &path, json!({"prompt": prompt})).await
    }

    async fn events(&self, on: usize, id: &str, since: u64) -> Vec<Value> {
        let response = self
            .get(on, &format!("/agent/session/{id}/events?since={since}"))
            .await;
        assert_eq!(response.status(), 200);
        common::ndjson(response).await
    }

    /// The sum of a metric's samples on replica `on` whose labels hold
    /// each of `labels` (`kind="…"`).
    async fn metric(&self, on: usize, name: &str, labels: &[&str]) -> f64 {
        let text = self.get(on, "/metrics").await.text().await.unwrap();
        text.lines()
            .filter(|line| line.starts_with(&format!("{name}{{")))
            .filter(|line| labels.iter().all(|label| line.contains(label)))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Deletes session `id` through replica `on`.
    async fn delete(&self, on: usize, id: &str) {
        let deleted = self
            .http
            .delete(self.replicas[on].at(&format!("/agent/session/{id}")))
            .send()
            .await
            .unwrap();
        assert!(deleted.status().is_success(), "{}", deleted.status());
    }

    /// Kills replica `on` with SIGKILL and waits for it to be gone.
    async fn kill(&mut self, on: usize) {
        self.replicas[on].child.start_kill().unwrap();
        self.replicas[on].child.wait().await.unwrap();
    }

    /// Checks that `jobs` jobs of `kind` were done, on two replicas or
    /// three.
    async fn assert_spread(&self, kind: &str, jobs: usize) {
        let mut done = Vec::new();
        for on in 0..3 {
            let ok = [kind, r#"outcome="ok""#];
            done.push(self.metric(on, "conclave_jobs_done_total", &ok).await);
        }
        assert_eq!(done.iter().sum::<f64>(), jobs as f64, "{kind}: {done:?}");
        assert!(
            done.iter().filter(|n| **n > 0.0).count() >= 2,
            "the jobs {kind} spread: {done:?}"
        );
    }

    /// B or C, once it is doing a job of `kind` (within 30 s).
    async fn doing_a_job(&self, kind: &str) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            for on in [1, 2] {
                if self.metric(on, "conclave_jobs_running", &[kind]).await > 0.0 {
                    return on;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no job {kind} ran on B or C"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Follows deliberation `task` (session `session`) on A, kills B or C
    /// once it does a job of `kind`, and checks that the deliberation still
    /// completes with all its `agents` answering. Answers the killed one.
    async fn kill_a_job_doer(
        &mut self,
        task: &str,
        session: &str,
        kind: &str,
        agents: u64,
    ) -> usize {
        let follow = format!("/agent/session/{session}/events?since=0&follow=true");
        let mut events = Lines::new(self.get(0, &follow).await);
        let victim = self.doing_a_job(kind).await;
        self.kill(victim).await;
        let events = tokio::time::timeout(Duration::from_secs(120), events.until("result"))
            .await
            .expect("the deliberation ends");
        assert_eq!(events.last().unwrap()["status"], "success");
        let done = self.get_json(0, &format!("/deliberations/{task}")).await;
        assert_eq!(done["status"], "COMPLETED", "{done}");
        assert_eq!(
            done["successful_responses"], agents,
            "every agent answered: {done}"
        );
        victim
    }

    /// Jobs of `kind` the replicas but `dead` took over from another.
    async fn taken_over(&self, dead: usize, kind: &str) -> f64 {
        let mut taken = 0.0;
        for on in (0..3).filter(|on| *on != dead) {
            taken += self
                .metric(on, "conclave_jobs_taken_over_total", &[kind])
                .await;
        }
        taken
    }

    /// Submits a deliberation on replica `on`; answers its task and session.
    async fn deliberate(&self, on: usize, body: Value) -> (String, String) {
        let response = self.post(on, "/deliberations", body).await;
        assert_eq!(response.status(), 202);
        let submitted: Value = response.json().await.unwrap();
        let task = submitted["task_id"].as_str().unwrap().to_string();
        let session = submitted["session_id"].as_str().unwrap().to_string();
        (task, session)
    }

    /// A connection of its own to the cluster's database.
    async fn connect_database(&self) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.database.url())
            .await
            .unwrap()
    }

    /// How many sessions' tools the store says a replica holds.
    async fn tool_owners(&self) -> i64 {
        let mut db = self.connect_database().await;
        sqlx::query_scalar("SELECT count(*) FROM kv WHERE namespace = '_sandbox_owners'")
            .fetch_one(&mut db)
            .await
            .unwrap()
    }

    /// Waits until every replica's `/ready` answers `status` (within 60 s).
    async fn ready_everywhere(&self, status: u16) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        for on in 0..self.replicas.len() {
            loop {
                let answered = self.get(on, "/ready").await.status();
                if answered.as_u16() == status {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "replica {on}'s /ready stayed {answered}, not {status}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    async fn status(&self, on: usize, id: &str) -> Value {
        self.get_json(on, &format!("/agent/session/{id}/status"))
            .await
    }
}

fn seqs(events: &[Value]) -> Vec<u64> {
    events.iter().map(|e| e["seq"].as_u64().unwrap()).collect()
}

#[tokio::test]
async fn any_replica_serves_any_session_and_streams_it_live() {
    let cluster = cluster(15).await;
    let id = cluster.create_session(0).await;
    // A WebSocket on C follows the session from its start.
    let (mut ws, _) = tokio_tungstenite::connect_async(
        cluster.replicas[2].ws(&format!("/agent/ws?session_id={id}&since=0")),
    )
    .await
    .unwrap();

    // The first turn runs on B, the second on A.
    let mut turns = Vec::new();
    for on in [1, 0] {
        let response = cluster.send(on, &id, &long_prompt(20)).await;
        assert_eq!(response.status(), 200, "replica {on}");
        let streamed = Lines::new(response).until("result").await;
        let seen_on_c = ws_until(&mut ws, "result").await;
        assert_eq!(
            seen_on_c, streamed,
            "C's WebSocket saw the turn on replica {on} as its caller did"
        );
        turns.push(streamed);
    }
    let all: Vec<Value> = turns.concat();
    let last = all.last().unwrap()["seq"].as_u64().unwrap();
    assert_eq!(
        seqs(&all),
        (1..=last).collect::<Vec<_>>(),
        "one log, no gap"
    );

    // Replays by seq on every replica: the same events, none twice.
    let middle = last / 2;
    for on in 0..3 {
        let replayed = cluster.events(on, &id, middle).await;
        assert_eq!(replayed, all[middle as usize..], "replay on replica {on}");
    }
    // Every replica reports the session as the store has it.
    for on in 0..3 {
        let status = cluster.status(on, &id).await;
        assert_eq!(status["status"], "idle", "{status}");
        assert_eq!(status["usage"]["turns"], 2, "{status}");
    }
    // Deleted on C, it is gone on every replica.
    cluster.delete(2, &id).await;
    for on in 0..3 {
        let status = cluster
            .get(on, &format!("/agent/session/{id}/status"))
            .await;
        assert_eq!(status.status(), 404, "replica {on}");
    }
}

#[tokio::test]
async fn a_run_is_stored_by_its_first_write_and_holds_its_turn_on_every_replica() {
    let cluster = cluster(15).await;
    let response = cluster
        .post(0, "/agent/run", json!({"prompt": long_prompt(60)}))
        .await;
    assert_eq!(response.status(), 200);
    let mut events = Lines::new(response);
    let first = events.next().await.unwrap();
    let id = first["session_id"].as_str().unwrap().to_owned();
    // Its id known from its first event, the session is stored, running,
    // and its turn's lease is held: another replica refuses a second turn.
    let status = cluster.status(1, &id).await;
    assert_eq!(status["status"], "running", "{status}");
    let refused = cluster.send(2, &id, "hello").await;
    assert_eq!(refused.status(), 409);
    let rest = events.until("result").await;
    assert_eq!(rest.last().unwrap()["status"], "success", "{rest:?}");
    // Its one turn over, a run's session is closed.
    let status = cluster.status(2, &id).await;
    assert_eq!(status["status"], "closed", "{status}");
}

#[tokio::test]
async fn two_messages_at_once_on_two_replicas_get_one_turn_and_one_409() {
    let cluster = cluster(15).await;
    let id = cluster.create_session(0).await;
    let prompt = long_prompt(40);
    let (on_a, on_b) = tokio::join!(cluster.send(0, &id, &prompt), cluster.send(1, &id, &prompt));
    let mut statuses = [on_a.status().as_u16(), on_b.status().as_u16()];
    statuses.sort();
    assert_eq!(statuses, [200, 409]);
    let (running, refused) = if on_a.status() == 200 {
        (on_a, on_b)
    } else {
        (on_b, on_a)
    };
    let refused: Value = refused.json().await.unwrap();
    assert!(refused.to_string().contains("running a turn"), "{refused}");
    let events = Lines::new(running).until("result").await;
    assert_eq!(events.last().unwrap()["status"], "success");
    // An interrupt sent to the third replica stops a turn on another.
    let response = cluster.send(1, &id, &long_prompt(400)).await;
    assert_eq!(response.status(), 200);
    let mut lines = Lines::new(response);
    lines.until("status").await;
    let interrupted = cluster
        .post_json(2, &format!("/agent/session/{id}/interrupt"), json!({}))
        .await;
    assert_eq!(interrupted["interrupted"], true, "{interrupted}");
    let rest = lines.until("result").await;
    assert_eq!(rest.last().unwrap()["status"], "interrupted");
}

#[tokio::test]
async fn a_replica_killed_mid_turn_loses_no_event_and_a_survivor_takes_over() {
    let mut cluster = cluster(3).await;
    let id = cluster.create_session(0).await;
    // A client on B follows the session; the turn runs on A.
    let (mut ws, _) = tokio_tungstenite::connect_async(
        cluster.replicas[1].ws(&format!("/agent/ws?session_id={id}&since=0")),
    )
    .await
    .unwrap();
    let response = cluster.send(0, &id, &long_prompt(2000)).await;
    assert_eq!(response.status(), 200);
    let mut on_a = Lines::new(response);
    on_a.until("status").await;
    let killed = std::time::Instant::now();
    cluster.kill(0).await;

    // B's client sees the turn closed by a survivor within the lease (and
    // one sweep period), every event it got before the kill still there.
    let seen = tokio::time::timeout(Duration::from_secs(30), ws_until(&mut ws, "result"))
        .await
        .expect("the cut-off turn is closed within the lease");
    let waited = killed.elapsed();
    assert!(
        waited < Duration::from_secs(20),
        "closed {waited:?} after the kill"
    );
    let result = seen.last().unwrap();
    assert_eq!(result["status"], "interrupted", "{result}");
    let last = result["seq"].as_u64().unwrap();
    assert_eq!(seqs(&seen), (1..=last).collect::<Vec<_>>());
    let stored = cluster.events(2, &id, 0).await;
    assert_eq!(stored, seen, "the store holds exactly what the client saw");

    // The session takes its next message on a survivor.
    let response = cluster.send(2, &id, "hello again").await;
    assert_eq!(response.status(), 200);
    let next = Lines::new(response).until("result").await;
    assert_eq!(next.first().unwrap()["seq"], last + 1);
    assert_eq!(next.last().unwrap()["status"], "success");
}

#[tokio::test]
async fn a_pipeline_cut_by_a_killed_replica_resumes_by_itself_on_another_from_its_checkpoint() {
    let mut cluster = cluster_with(3, &[("CONCLAVE_PIPELINES__TEST_MODE", "true")]).await;
    let started = cluster
        .post_json(
            0,
            "/orchestrator/pipeline/start",
            json!({"connector_name": "crm", "mock": {"delay_ms": 400}}),
        )
        .await;
    let thread = started["thread_id"].as_str().unwrap().to_string();
    let session = started["session_id"].as_str().unwrap().to_string();
    // Followed from C while A runs it.
    let follow = format!("/agent/session/{session}/events?since=0&follow=true");
    let mut events = Lines::new(cluster.get(2, &follow).await);
    let mut checkpoints = 0;
    while checkpoints < 2 {
        if events.next().await.expect("the stream goes on")["type"] == "checkpoint" {
            checkpoints += 1;
        }
    }
    cluster.kill(0).await;
    // A survivor closes the cut-off turn; C's follower sees it.
    let cut = tokio::time::timeout(Duration::from_secs(30), events.until("result"))
        .await
        .expect("the cut-off run is closed within the lease");
    assert_eq!(cut.last().unwrap()["status"], "interrupted");
    // The survivor that closed it starts it again after its last
    // checkpoint, without being asked; from its first event on, every
    // replica says it runs.
    events.next().await.expect("the resumed run's first event");
    for on in [1, 2] {
        let status = cluster
            .get_json(on, &format!("/orchestrator/pipeline/status/{thread}"))
            .await;
        assert_eq!(status["status"], "running", "replica {on}: {status}");
    }
    let last = events.until("result").await;
    assert_eq!(last.last().unwrap()["status"], "success");
    let history = cluster
        .get_json(2, &format!("/orchestrator/pipeline/history/{thread}"))
        .await;
    let ran: Vec<&str> = history["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|step| step["node"].as_str())
        .collect();
    assert_eq!(
        ran,
        [
            "research",
            "generator",
            "tester",
            "test_reviewer",
            "reviewer",
            "publisher"
        ],
        "each node once: {history}"
    );
    // Its mock nodes were jobs the survivors answered (as well as A).
    let mut answered = 0.0;
    for on in [1, 2] {
        let ok = [r#"kind="pipeline.mock_node""#, r#"outcome="ok""#];
        answered += cluster.metric(on, "conclave_jobs_done_total", &ok).await;
    }
    assert!(answered >= 4.0, "B and C answered {answered} nodes");
}

#[tokio::test]
async fn a_websocket_ticket_from_one_replica_opens_a_socket_on_another_once() {
    let cluster = cluster(15).await;
    let id = cluster.create_session(0).await;
    let ticket = cluster.post_json(0, "/auth/ticket", json!({})).await;
    let ticket = ticket["ticket"].as_str().unwrap();
    let url = cluster.replicas[1].ws(&format!("/agent/ws?session_id={id}&ticket={ticket}"));
    tokio_tungstenite::connect_async(&url)
        .await
        .expect("B takes A's ticket");
    let again = tokio_tungstenite::connect_async(&url).await;
    assert!(again.is_err(), "a ticket opens one socket");
}

const MODEL_CALL: &str = r#"kind="deliberation.model_call""#;

#[tokio::test]
async fn deliberation_agents_are_jobs_that_spread_over_the_replicas() {
    let cluster = cluster(15).await;
    let (task, session) = cluster
        .deliberate(
            0,
            json!({"task_description": "Spread these calls", "num_agents": 9}),
        )
        .await;
    let follow = format!("/agent/session/{session}/events?since=0&follow=true");
    let events = Lines::new(cluster.get(1, &follow).await)
        .until("result")
        .await;
    assert_eq!(events.last().unwrap()["status"], "success");
    let done = cluster.get_json(2, &format!("/deliberations/{task}")).await;
    assert_eq!(done["successful_responses"], 9, "{done}");
    cluster.assert_spread(MODEL_CALL, 9).await;
}

#[tokio::test]
async fn a_replica_killed_mid_job_has_its_agent_call_done_by_another() {
    let mut cluster = cluster_with(
        15,
        &[
            ("CONCLAVE_CLUSTER__JOB_ACK_WAIT_S", "2"),
            // Each call streams its words for seconds.
            ("CONCLAVE_DEMO__CHUNK_DELAY_MS", "150"),
        ],
    )
    .await;
    let (task, session) = cluster
        .deliberate(
            0,
            json!({"task_description": "Survive a replica", "num_agents": 6}),
        )
        .await;
    // B or C is making a call: kill it mid-call.
    let victim = cluster
        .kill_a_job_doer(&task, &session, MODEL_CALL, 6)
        .await;
    let taken_over = cluster.taken_over(victim, MODEL_CALL).await;
    assert!(taken_over >= 1.0, "no survivor took over a call");
}

/// Runs `prompt` as a turn on replica `on` and answers its events.
async fn turn(cluster: &Cluster, on: usize, id: &str, prompt: &str) -> Vec<Value> {
    let response = cluster.send(on, id, prompt).await;
    assert_eq!(response.status(), 200, "replica {on}");
    Lines::new(response).until("result").await
}

/// The `status` event whose message holds `words`.
fn status_saying<'a>(events: &'a [Value], words: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["type"] == "status" && e["message"].as_str().unwrap().contains(words))
        .unwrap_or_else(|| panic!("no status saying {words:?}: {events:?}"))
}

fn tool_result(events: &[Value]) -> &Value {
    events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool_result in {events:?}"))
}

#[tokio::test]
async fn tool_calls_run_where_the_sessions_sandbox_is_and_a_lost_one_is_said() {
    let mut cluster = cluster(15).await;
    let id = cluster.create_session(0).await;
    // A's turn makes the sandbox there; B's call is carried to it.
    let wrote = turn(&cluster, 0, &id, "$ echo kept-on-a > note.txt").await;
    assert_eq!(tool_result(&wrote)["is_error"], false, "{wrote:?}");
    let read = turn(&cluster, 1, &id, "$ cat note.txt").await;
    let result = tool_result(&read);
    assert_eq!(result["is_error"], false, "{result}");
    assert!(
        result["output"].to_string().contains("kept-on-a"),
        "B's call ran in A's sandbox: {result}"
    );
    assert!(!read.iter().any(
        |e| e["type"] == "status" && e["message"].as_str().is_some_and(|m| m.contains("lost"))
    ));
    let on_b = cluster.metric(1, "conclave_sandboxes_live", &[]).await;
    assert_eq!(on_b, 0.0, "B made no sandbox of its own");

    // A dies: C's next call says the workspace was lost and runs in a new
    // sandbox there, which B's calls then reach.
    cluster.kill(0).await;
    let after = turn(&cluster, 2, &id, "$ cat note.txt").await;
    let lost = status_saying(&after, "lost");
    assert!(
        lost["message"].as_str().unwrap().contains("new sandbox"),
        "{lost}"
    );
    let result = tool_result(&after);
    assert!(
        !result["output"].to_string().contains("kept-on-a"),
        "the file went with A: {result}"
    );
    turn(&cluster, 2, &id, "$ echo kept-on-c > again.txt").await;
    let read = turn(&cluster, 1, &id, "$ cat again.txt").await;
    assert!(
        tool_result(&read)["output"]
            .to_string()
            .contains("kept-on-c"),
        "{read:?}"
    );
}

#[tokio::test]
async fn tools_are_owned_from_the_first_call_and_an_ephemeral_run_gives_them_up_at_its_end() {
    let cluster = cluster(15).await;
    // A turn that calls no tool claims none: the sandbox's tools are
    // listed on any replica.
    let id = cluster.create_session(0).await;
    let plain = turn(&cluster, 0, &id, "hello").await;
    assert_eq!(plain.last().unwrap()["status"], "success", "{plain:?}");
    assert_eq!(cluster.tool_owners().await, 0);

    let response = cluster
        .post(1, "/agent/run", json!({"prompt": "$ echo from-a-run"}))
        .await;
    assert_eq!(response.status(), 200);
    let events = Lines::new(response).until("result").await;
    assert!(
        tool_result(&events)["output"]
            .to_string()
            .contains("from-a-run"),
        "{events:?}"
    );
    // The run's tools are released once its result is stored.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let live = cluster.metric(1, "conclave_sandboxes_live", &[]).await;
        let owners = cluster.tool_owners().await;
        if live == 0.0 && owners == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after the run: {live} sandboxes live, {owners} owners recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A run's session was made by its one turn on the replica that ran it:
/// a run that called no tool has no tool owner anywhere, and its end
/// asks the store for none.
#[tokio::test]
async fn a_run_that_calls_no_tool_looks_up_no_tool_owner_at_its_end() {
    let cluster = cluster(15).await;
    let mut db = counting_statements(&cluster).await;
    let response = cluster
        .post(2, "/agent/run", json!({"prompt": "hello"}))
        .await;
    assert_eq!(response.status(), 200);
    let events = Lines::new(response).until("result").await;
    assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
    // Released before its result was stored.
    assert_eq!(calls(&mut db, KV_READ).await, 0);
    assert_eq!(cluster.metric(2, "conclave_sandboxes_live", &[]).await, 0.0);
}

/// A session record read (`get_session`, `session_at_end`).
const SESSION_READ: &str = "SELECT % FROM sessions WHERE id = $1";
/// A KV read (`kv_get`), the tool owners' among others.
const KV_READ: &str = "SELECT key, value, revision, updated_at FROM kv WHERE %";

/// A connection to the cluster's database with `pg_stat_statements`
/// reset for it.
async fn counting_statements(cluster: &Cluster) -> sqlx::PgConnection {
    let mut db = cluster.connect_database().await;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut db)
        .await
        .expect("PostgreSQL runs with shared_preload_libraries = pg_stat_statements");
    reset_statements(&mut db).await;
    db
}

async fn reset_statements(db: &mut sqlx::PgConnection) {
    sqlx::query(
        "SELECT pg_stat_statements_reset(0, \
         (SELECT oid FROM pg_database WHERE datname = current_database()), 0)",
    )
    .execute(db)
    .await
    .unwrap();
}

/// How many statements like `pattern` ran in the cluster's database
/// since `pg_stat_statements` was last reset for it.
async fn calls(db: &mut sqlx::PgConnection, pattern: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND query LIKE $1",
    )
    .bind(pattern)
    .fetch_one(db)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_turns_own_tool_calls_read_no_session_record() {
    let cluster = cluster(15).await;
    let mut db = counting_statements(&cluster).await;
    let id = cluster.create_session(0).await;
    // The first call makes the sandbox.
    let first = turn(&cluster, 0, &id, "$ echo one").await;
    assert_eq!(tool_result(&first)["is_error"], false, "{first:?}");
    reset_statements(&mut db).await;
    // The turn running here holds the session: its calls take the
    // session's options from it, not from the store.
    let second = turn(&cluster, 0, &id, "$ echo two").await;
    assert!(
        tool_result(&second)["output"].to_string().contains("two"),
        "{second:?}"
    );
    assert_eq!(calls(&mut db, SESSION_READ).await, 0);
    // A turn on another replica still reaches the session's sandbox.
    let elsewhere = turn(&cluster, 1, &id, "$ echo three").await;
    assert!(
        tool_result(&elsewhere)["output"]
            .to_string()
            .contains("three"),
        "{elsewhere:?}"
    );
}

const CHILD_TURN: &str = r#"kind="session.child_turn""#;

#[tokio::test]
async fn tool_using_agents_run_their_turns_on_any_replica_and_their_events_reach_the_log() {
    let cluster = cluster(15).await;
    let (task, session) = cluster
        .deliberate(
            0,
            json!({"task_description": "Check the shell:\n$ echo agent-ran-this",
                   "num_agents": 6, "tools": true}),
        )
        .await;
    let follow = format!("/agent/session/{session}/events?since=0&follow=true");
    let events = Lines::new(cluster.get(2, &follow).await)
        .until("result")
        .await;
    assert_eq!(events.last().unwrap()["status"], "success");
    let done = cluster.get_json(1, &format!("/deliberations/{task}")).await;
    assert_eq!(done["successful_responses"], 6, "{done}");
    // Each agent's tool call came back into the deliberation's log, tagged.
    let results: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .collect();
    assert_eq!(results.len(), 6, "{events:?}");
    for result in &results {
        assert!(result["agent_id"].as_str().is_some(), "{result}");
        assert!(
            result["output"].to_string().contains("agent-ran-this"),
            "{result}"
        );
    }
    cluster.assert_spread(CHILD_TURN, 6).await;
}

#[tokio::test]
async fn a_tool_using_agent_whose_replica_dies_is_run_again_on_another() {
    let mut cluster = cluster_with(
        3,
        &[
            ("CONCLAVE_CLUSTER__JOB_ACK_WAIT_S", "2"),
            ("CONCLAVE_DEMO__CHUNK_DELAY_MS", "300"),
        ],
    )
    .await;
    let (task, session) = cluster
        .deliberate(
            0,
            json!({"task_description": "Check the shell:\n$ echo agent-ran-this",
                   "num_agents": 3, "tools": true, "timeout_s": 120}),
        )
        .await;
    let victim = cluster
        .kill_a_job_doer(&task, &session, CHILD_TURN, 3)
        .await;
    let taken_over = cluster.taken_over(victim, CHILD_TURN).await;
    assert!(taken_over >= 1.0, "no survivor ran an agent's turn again");
}

#[tokio::test]
async fn a_survivor_on_the_same_docker_daemon_takes_the_sandbox_over_and_keeps_the_workspace() {
    let mut cluster = cluster_on("docker", 15, &[]).await;
    let id = cluster.create_session(0).await;
    let wrote = turn(&cluster, 0, &id, "$ echo kept-by-docker > note.txt").await;
    assert_eq!(tool_result(&wrote)["is_error"], false, "{wrote:?}");
    // A second session whose sandbox A made, deleted after A died.
    let orphan = cluster.create_session(0).await;
    turn(&cluster, 0, &orphan, "$ echo soon-gone > x.txt").await;
    assert_eq!(containers_of(&orphan).len(), 1);
    cluster.kill(0).await;
    cluster.delete(1, &orphan).await;
    assert!(
        containers_of(&orphan).is_empty(),
        "B removed the dead replica's container of the deleted session"
    );
    let read = turn(&cluster, 2, &id, "$ cat note.txt").await;
    let took = status_saying(&read, "took it over");
    assert!(took["message"].as_str().unwrap().contains("kept"), "{took}");
    assert!(
        tool_result(&read)["output"]
            .to_string()
            .contains("kept-by-docker"),
        "the workspace survived A: {read:?}"
    );
    // Deleted, the session takes the adopted container with it.
    cluster.delete(2, &id).await;
    assert!(
        containers_of(&id).is_empty(),
        "the session's container is gone"
    );
    assert_eq!(cluster.tool_owners().await, 0, "no owner is left recorded");
}

/// The docker containers labelled with session `id`.
fn containers_of(id: &str) -> Vec<String> {
    let listed = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=conclave.session={id}"),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// A session on replica `on` whose tool calls wait for a decision.
async fn asking_session(cluster: &Cluster, on: usize) -> String {
    let created = cluster
        .post_json(
            on,
            "/agent/session",
            json!({"options": {"permissions": {"mode": "ask"}}}),
        )
        .await;
    created["session_id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_nats_restart_leaves_one_cluster_and_ready_says_when_it_is_down() {
    let mut cluster = cluster(15).await;
    // A subscriber on C to a subject that is not kept, opened before.
    let subscribed = cluster.get(2, "/bus/subscribe?subjects=chat.live").await;
    assert_eq!(subscribed.status(), 200);
    let mut subscriber = Lines::new(subscribed);
    // And a follower on C of a session whose next turn runs on A.
    let followed = cluster.create_session(0).await;
    let follow = format!("/agent/session/{followed}/events?since=0&follow=true");
    let mut follower = Lines::new(cluster.get(2, &follow).await);

    // nats-server is killed; every replica says it is not ready, and a
    // publish is refused rather than taken.
    let stopped = tokio::time::Instant::now();
    cluster.nats.stop().await;
    cluster.ready_everywhere(503).await;
    let refused = cluster
        .post(0, "/bus/publish/chat.live", json!({"n": 0}))
        .await;
    assert_eq!(refused.status(), 503);
    // Down for 10 s, as an operator's restart on the same store would be.
    tokio::time::sleep_until(stopped + Duration::from_secs(10)).await;
    cluster.nats.restart().await;
    cluster.ready_everywhere(200).await;

    // A message that is not kept goes through again, and the subscriber
    // opened before the outage hears of the cut, then gets it.
    let published = cluster
        .post(0, "/bus/publish/chat.live", json!({"n": 1}))
        .await;
    assert_eq!(published.status(), 202);
    let cut = tokio::time::timeout(Duration::from_secs(30), subscriber.next())
        .await
        .expect("the subscriber hears of the cut")
        .unwrap();
    assert_eq!(cut["type"], "lagged", "{cut}");
    assert_eq!(cut["subject"], "chat.live", "{cut}");
    let message = tokio::time::timeout(Duration::from_secs(30), subscriber.next())
        .await
        .expect("the subscriber gets the new message")
        .unwrap();
    assert_eq!(message["type"], "message", "{message}");
    assert_eq!(message["data"], json!({"n": 1}), "{message}");

    // The follower opened before the outage sees a turn run on A after it.
    let response = cluster.send(0, &followed, "after the restart").await;
    assert_eq!(response.status(), 200);
    let on_a = Lines::new(response).until("result").await;
    let seen = tokio::time::timeout(Duration::from_secs(30), follower.until("result"))
        .await
        .expect("the follower on C sees the turn on A");
    assert_eq!(seen, on_a);

    // A decision given on B reaches the call waiting on A.
    let id = asking_session(&cluster, 0).await;
    let response = cluster.send(0, &id, "$ echo decided-after-restart").await;
    assert_eq!(response.status(), 200);
    let mut on_a = Lines::new(response);
    let asked = on_a.until("approval_requested").await;
    let call_id = asked.last().unwrap()["call_id"]
        .as_str()
        .unwrap()
        .to_string();
    let decided = cluster
        .post(
            1,
            &format!("/agent/session/{id}/approvals/{call_id}"),
            json!({"decision": "allow"}),
        )
        .await;
    assert_eq!(decided.status(), 200);
    let rest = tokio::time::timeout(Duration::from_secs(60), on_a.until("result"))
        .await
        .expect("the decision reached the turn on A");
    let output = rest.iter().find(|e| e["type"] == "tool_result").unwrap();
    assert!(
        output["output"]
            .to_string()
            .contains("decided-after-restart"),
        "{output}"
    );
    assert_eq!(rest.last().unwrap()["status"], "success");

    // An interrupt given on B stops the turn running on A.
    let id = cluster.create_session(0).await;
    let response = cluster.send(0, &id, &long_prompt(2000)).await;
    assert_eq!(response.status(), 200);
    let mut on_a = Lines::new(response);
    on_a.until("status").await;
    let interrupted = cluster
        .post_json(1, &format!("/agent/session/{id}/interrupt"), json!({}))
        .await;
    assert_eq!(interrupted["interrupted"], true, "{interrupted}");
    let ended = tokio::time::timeout(Duration::from_secs(30), on_a.until("result"))
        .await
        .expect("the turn on A ends");
    assert_eq!(ended.last().unwrap()["status"], "interrupted");
}

#[tokio::test]
async fn a_decision_for_a_call_whose_replica_died_is_not_acknowledged() {
    let mut cluster = cluster(15).await;
    let id = asking_session(&cluster, 0).await;
    let response = cluster.send(0, &id, "$ echo never-run").await;
    assert_eq!(response.status(), 200);
    let mut on_a = Lines::new(response);
    let asked = on_a.until("approval_requested").await;
    let call_id = asked.last().unwrap()["call_id"]
        .as_str()
        .unwrap()
        .to_string();
    cluster.kill(0).await;

    // B cannot hand the decision to a turn: a 409 saying so, not a 200,
    // and the call is still listed as waiting.
    let decide = format!("/agent/session/{id}/approvals/{call_id}");
    let refused = cluster.post(1, &decide, json!({"decision": "allow"})).await;
    assert_eq!(refused.status(), 409);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error"]["code"], "not_delivered", "{refused}");
    let listed = cluster.get_json(1, "/agent/approvals").await;
    assert_eq!(
        listed["approvals"][0]["call_id"],
        call_id.as_str(),
        "{listed}"
    );

    // An interrupt of the dead replica's turn is not a `true` either.
    let interrupt = cluster
        .post(1, &format!("/agent/session/{id}/interrupt"), json!({}))
        .await;
    assert_eq!(interrupt.status(), 503);
    let interrupt: Value = interrupt.json().await.unwrap();
    assert_eq!(
        interrupt["error"]["code"], "turn_unreachable",
        "{interrupt}"
    );

    // The survivor closes the cut-off turn; the call never ran.
    let follow = format!("/agent/session/{id}/events?since=0&follow=true");
    let events = tokio::time::timeout(
        Duration::from_secs(60),
        Lines::new(cluster.get(2, &follow).await).until("result"),
    )
    .await
    .expect("a survivor closes the turn");
    assert_eq!(events.last().unwrap()["status"], "interrupted");
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "tool_result" && e["output"].to_string().contains("never-run")),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_message_queued_on_a_survivor_starts_after_the_dead_turns_result() {
    let mut cluster = cluster(3).await;
    let id = cluster.create_session(0).await;
    let response = cluster.send(0, &id, &long_prompt(2000)).await;
    assert_eq!(response.status(), 200);
    Lines::new(response).until("status").await;
    // B is asked while A's turn runs; it waits for the turn's lease.
    let path = format!("/agent/session/{id}/message");
    let queued = {
        let request = cluster
            .http
            .post(cluster.replicas[1].at(&path))
            .json(&json!({"prompt": "after the cut", "queue": true}));
        tokio::spawn(request.send())
    };
    cluster.kill(0).await;
    let response = tokio::time::timeout(Duration::from_secs(60), queued)
        .await
        .expect("the queued message starts once the lease expires")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    let next = Lines::new(response).until("result").await;
    assert_eq!(next.last().unwrap()["status"], "success");

    // The log closes the cut-off turn before the next one begins.
    let stored = cluster.events(2, &id, 0).await;
    let results: Vec<usize> = stored
        .iter()
        .enumerate()
        .filter(|(_, e)| e["type"] == "result")
        .map(|(at, _)| at)
        .collect();
    assert_eq!(results.len(), 2, "{:?}", common::types(&stored));
    assert_eq!(stored[results[0]]["status"], "interrupted");
    let first_of_next = next.first().unwrap()["seq"].as_u64().unwrap();
    assert!(
        stored[results[0]]["seq"].as_u64().unwrap() < first_of_next,
        "{:?}",
        common::types(&stored)
    );
    assert_eq!(seqs(&stored), (1..=stored.len() as u64).collect::<Vec<_>>());
}
