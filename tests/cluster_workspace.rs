//! A session's workspace across replicas, as tests/cluster.rs starts them
//! (real `conclave serve` processes on one PostgreSQL database and one
//! nats-server, local sandboxes): turn-end snapshots are kept in NATS's
//! object store, so a fork, a download at a turn end and `changes` work
//! on a replica that does not hold the session's sandbox; a turn that ran
//! on such a replica still gets its snapshot, taken where the sandbox is;
//! an upload makes the replica it reached the sandbox's, a request for
//! the live workspace of a sandbox held elsewhere is passed on to the
//! replica holding it, and a LangGraph rollback on a replica that does
//! not hold the sandbox restores the files there.
//!
//! Needs `CONCLAVE_TEST_POSTGRES` and `CONCLAVE_TEST_NATS_SERVER`, which
//! scripts/test.sh sets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;

use common::Lines;
use common::nats::NatsServer;
use common::postgres::{TestDatabase, test_server};
use common::replicas::{Replica, local_replicas};
use futures::StreamExt;
use serde_json::{Value, json};

/// Replicas A, B and C; the fields drop in order, so the replicas stop
/// before nats-server and the database go.
struct Trio {
    replicas: Vec<Replica>,
    nats: NatsServer,
    database: TestDatabase,
    http: reqwest::Client,
}

impl Trio {
    async fn start() -> Trio {
        let database = TestDatabase::create(&test_server()).await;
        let nats = NatsServer::start(true).await;
        let replicas = local_replicas(3, &database, &nats, &[]).await;
        Trio {
            replicas,
            nats,
            database,
            http: reqwest::Client::new(),
        }
    }

    fn at(&self, on: usize, path: &str) -> String {
        format!("{}{path}", self.replicas[on].1)
    }

    async fn get(&self, on: usize, path: &str) -> reqwest::Response {
        self.http.get(self.at(on, path)).send().await.unwrap()
    }

    async fn post(&self, on: usize, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(self.at(on, path))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn create_session(&self, on: usize) -> String {
        let created: Value = self
            .post(on, "/agent/session", json!({}))
            .await
            .json()
            .await
            .unwrap();
        created["session_id"].as_str().unwrap().to_owned()
    }

    /// A turn on replica `on`; its events, the `result` last. A prompt
    /// starting `$ ` is a command the demo model runs, which must succeed.
    async fn turn(&self, on: usize, id: &str, prompt: &str) -> Vec<Value> {
        let path = format!("/agent/session/{id}/message");
        let response = self.post(on, &path, json!({"prompt": prompt})).await;
        assert_eq!(response.status(), 200, "replica {on}");
        let events = Lines::new(response).until("result").await;
        assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
        if prompt.starts_with("$ ") {
            let result = events.iter().find(|e| e["type"] == "tool_result").unwrap();
            assert_eq!(result["is_error"], false, "{events:?}");
        }
        events
    }

    async fn delete(&self, on: usize, id: &str) {
        let deleted = self
            .http
            .delete(self.at(on, &format!("/agent/session/{id}")))
            .send()
            .await
            .unwrap();
        assert!(deleted.status().is_success(), "{}", deleted.status());
    }

    /// Calls `tool` over MCP on replica `on`'s `/mcp`; the response body.
    async fn mcp_call(&self, on: usize, tool: &str, arguments: Value) -> String {
        common::mcp_tool_call(&self.http, &self.at(on, "/mcp"), None, tool, arguments).await
    }

    /// The snapshot files in NATS's object store.
    async fn shared_files(&self) -> usize {
        let client = async_nats::connect(&self.nats.url).await.unwrap();
        let jetstream = async_nats::jetstream::new(client);
        let bucket = jetstream
            .get_object_store("conclave_snapshots")
            .await
            .unwrap();
        let mut listed = bucket.list().await.unwrap();
        let mut count = 0;
        while let Some(info) = listed.next().await {
            if !info.unwrap().deleted {
                count += 1;
            }
        }
        count
    }

    async fn snapshot_records(&self) -> i64 {
        let mut db = <sqlx::PgConnection as sqlx::Connection>::connect(&self.database.url())
            .await
            .unwrap();
        sqlx::query_scalar(
            "SELECT count(*) FROM kv WHERE namespace = '_snapshots' AND key LIKE 'blob/%'",
        )
        .fetch_one(&mut db)
        .await
        .unwrap()
    }
}

fn last_seq(events: &[Value]) -> u64 {
    events.last().unwrap()["seq"].as_u64().unwrap()
}

/// The file `name` of a tar archive.
fn in_tar(archive: &[u8], name: &str) -> Option<String> {
    let mut archive = tar::Archive::new(archive);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        if path.trim_start_matches("./") == name {
            let mut text = String::new();
            entry.read_to_string(&mut text).unwrap();
            return Some(text);
        }
    }
    None
}

#[tokio::test]
async fn a_session_on_one_replica_is_forked_downloaded_and_compared_on_another() {
    let trio = Trio::start().await;
    let id = trio.create_session(0).await;
    // A's call makes the sandbox there.
    let first = trio.turn(0, &id, "$ echo from-a > note.txt").await;
    let first_end = last_seq(&first);

    // B reads that turn end from NATS: one file, and the whole as a tar.
    let file = trio
        .get(
            1,
            &format!("/agent/session/{id}/files/note.txt?at_seq={first_end}"),
        )
        .await;
    assert_eq!(file.status(), 200);
    assert_eq!(file.text().await.unwrap(), "from-a\n");
    let archive = trio
        .get(
            1,
            &format!("/agent/session/{id}/workspace?at_seq={first_end}"),
        )
        .await;
    assert_eq!(archive.status(), 200);
    let archive = archive.bytes().await.unwrap();
    assert_eq!(in_tar(&archive, "note.txt").as_deref(), Some("from-a\n"));

    // The live workspace is A's: B passes the request on to A (at the URL
    // A advertised in the store) and streams its answer back.
    let live = trio.get(1, &format!("/agent/session/{id}/workspace")).await;
    assert_eq!(live.status(), 200);
    let live = live.bytes().await.unwrap();
    assert_eq!(in_tar(&live, "note.txt").as_deref(), Some("from-a\n"));
    let upload = trio
        .http
        .put(trio.at(1, &format!("/agent/session/{id}/files/late.txt")))
        .header("content-type", "application/octet-stream")
        .body("late-via-b\n")
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), 200, "into A's sandbox, through B");
    let uploaded: Value = upload.json().await.unwrap();
    let upload_end = uploaded["seq"].as_u64().unwrap();
    let listed: Value = trio
        .get(2, &format!("/agent/session/{id}/files/"))
        .await
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"late.txt") && names.contains(&"note.txt"),
        "{listed}"
    );
    // A request already passed on once is not passed on again: B answers
    // 409 naming the replica rather than making a sandbox of its own.
    let once = trio
        .http
        .get(trio.at(1, &format!("/agent/session/{id}/files/note.txt")))
        .header("conclave-forwarded", "test")
        .send()
        .await
        .unwrap();
    assert_eq!(once.status(), 409);
    let refusal: Value = once.json().await.unwrap();
    assert_eq!(refusal["error"]["code"], "sandbox_elsewhere", "{refusal}");
    let message = refusal["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("at_seq") && message.contains("advertise_url"),
        "{refusal}"
    );

    // An IDE on B's /mcp naming the session is refused rather than given
    // a second sandbox: the reply names the replica to connect to.
    let ide = trio
        .mcp_call(
            1,
            "execute_shell",
            json!({"command": "cat note.txt", "session_id": id}),
        )
        .await;
    assert!(ide.contains("sandbox is on replica"), "{ide}");
    assert!(!ide.contains("from-a"), "{ide}");

    // A turn on C, whose call is carried to A: its turn end is snapshotted
    // on A all the same, and B forks at it at once.
    let second = trio.turn(2, &id, "$ echo from-c > more.txt").await;
    let second_end = last_seq(&second);
    let told = &second.last().unwrap()["files_changed"];
    assert_eq!(
        *told,
        json!({"added": 1, "modified": 0, "deleted": 0}),
        "told by A"
    );
    let forked = trio
        .post(
            1,
            &format!("/agent/session/{id}/fork"),
            json!({"at_seq": second_end}),
        )
        .await;
    assert_eq!(forked.status(), 201);
    let forked: Value = forked.json().await.unwrap();
    assert!(forked["from_snapshot"].is_string(), "{forked}");
    let fork = forked["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let read = trio.turn(1, &fork, "$ cat note.txt more.txt").await;
    let output = read.iter().find(|e| e["type"] == "tool_result").unwrap()["output"].to_string();
    assert!(
        output.contains("from-a") && output.contains("from-c"),
        "{output}"
    );

    // A turn on B that calls no tool: its turn end is A's snapshot too.
    let chat = trio.turn(1, &id, "hello").await;
    let chat_end = last_seq(&chat);
    assert_eq!(
        chat.last().unwrap()["files_changed"],
        json!({"added": 0, "modified": 0, "deleted": 0})
    );
    let at_chat = trio
        .get(
            2,
            &format!("/agent/session/{id}/files/more.txt?at_seq={chat_end}"),
        )
        .await;
    assert_eq!(at_chat.status(), 200);
    assert_eq!(at_chat.text().await.unwrap(), "from-c\n");

    // B compares two of A's snapshots: the upload's and the turn's after
    // it (keep_last is 3: the first turn end is no longer kept).
    let changes: Value = trio
        .get(
            1,
            &format!("/agent/session/{id}/changes?from_seq={upload_end}&to_seq={second_end}"),
        )
        .await
        .json()
        .await
        .unwrap();
    let files = changes["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{changes}");
    assert_eq!(files[0]["path"], "more.txt");
    assert_eq!(files[0]["status"], "added");

    // Deleted on C, the sessions take their snapshots out of NATS too.
    assert!(trio.shared_files().await >= 2);
    trio.delete(2, &fork).await;
    trio.delete(2, &id).await;
    assert_eq!(trio.snapshot_records().await, 0);
    assert_eq!(trio.shared_files().await, 0);
}

#[tokio::test]
async fn an_upload_makes_its_replica_the_sandboxs_and_turns_anywhere_reach_it() {
    let trio = Trio::start().await;
    let id = trio.create_session(0).await;
    let upload = trio
        .http
        .put(trio.at(1, &format!("/agent/session/{id}/files/given.txt")))
        .header("content-type", "application/octet-stream")
        .body("given-on-b\n")
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), 200);
    let uploaded: Value = upload.json().await.unwrap();
    // A turn on A and one on C read it in B's sandbox.
    for on in [0, 2] {
        let read = trio.turn(on, &id, "$ cat given.txt").await;
        let result = read.iter().find(|e| e["type"] == "tool_result").unwrap();
        assert!(
            result["output"].to_string().contains("given-on-b"),
            "{result}"
        );
    }
    // The upload's own point is a snapshot A can fork at.
    let seq = uploaded["seq"].as_u64().unwrap();
    let forked = trio
        .post(
            0,
            &format!("/agent/session/{id}/fork"),
            json!({"at_seq": seq}),
        )
        .await;
    assert_eq!(forked.status(), 201);
    let forked: Value = forked.json().await.unwrap();
    let fork = forked["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let read = trio.turn(0, &fork, "$ cat given.txt").await;
    let result = read.iter().find(|e| e["type"] == "tool_result").unwrap();
    assert!(
        result["output"].to_string().contains("given-on-b"),
        "{result}"
    );
}

/// A LangGraph rollback on a replica that does not hold the session's
/// sandbox: the sandbox goes on the replica holding it, and the rollback's
/// run, on the other, starts a sandbox there from the turn end's snapshot
/// (read from NATS): the undone run's file is gone, the first run's is
/// there.
#[tokio::test]
async fn a_rollback_on_another_replica_restores_the_files_there() {
    let trio = Trio::start().await;
    let run = common::langgraph_run;
    let post = |on: usize, path: String, body: Value| {
        let request = trio.http.post(trio.at(on, &format!("/langgraph{path}")));
        common::binary::json_ok(request.json(&body))
    };
    let thread = post(0, "/threads".into(), json!({})).await;
    let id = thread["thread_id"].as_str().unwrap().to_owned();
    // A's run makes the sandbox there.
    let first = run("$ echo kept > kept.txt", "reject");
    post(0, format!("/threads/{id}/runs/wait"), first).await;
    let follow = trio
        .get(
            1,
            &format!("/agent/session/{id}/events?since=0&follow=true"),
        )
        .await;
    let mut events = Lines::new(follow);
    events.until("result").await;
    // B's run calls into A's sandbox.
    let undone = run("$ echo undone | tee undone.txt && sleep 300", "reject");
    post(1, format!("/threads/{id}/runs"), undone).await;
    events.until("tool_output").await;

    let after = post(
        1,
        format!("/threads/{id}/runs/wait"),
        run("$ ls", "rollback"),
    )
    .await;
    let said = after["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(said.contains("kept.txt"), "{after}");
    assert!(!said.contains("undone"), "{after}");
    let rewound = events.until("rewound").await;
    assert_eq!(rewound.last().unwrap()["workspace"], "restored");
    for on in [0, 1] {
        let gone = trio
            .get(on, &format!("/agent/session/{id}/files/undone.txt"))
            .await;
        assert_eq!(gone.status(), 404, "replica {on}");
    }
}
