//! The turn loop's own work per model call does not grow with the session.
//!
//! Time is too noisy to assert on these machines, so the test counts what
//! grows when a turn copies or rereads the conversation: the bytes the
//! process allocates. A tool router of the test's own reads the count at
//! each tool call; one turn (two model calls of the `demo` model, a tool
//! call, the store, the events, the HTTP request and its stream) lies
//! between two readings. A turn that read the whole history back from the
//! store, or cloned it per model call, would allocate in proportion to the
//! session's length: at the 500th turn, some 2,000 messages.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use common::TestServer;
use conclave::agent::{ToolContext, ToolOutput, ToolRouter};
use conclave::model::ToolSpec;
use conclave::server::Tools;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The system allocator, counting the bytes it hands out.
struct Counting;

static ALLOCATED: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size as u64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `Bash`, answering at once and noting the bytes allocated so far.
#[derive(Default)]
struct Readings(Mutex<Vec<u64>>);

#[async_trait]
impl ToolRouter for Readings {
    async fn specs(&self, _ctx: &ToolContext) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "Bash".into(),
            description: "Runs a command".into(),
            input_schema: Arc::new(json!({"type": "object", "properties": {
                "command": {"type": "string"}
            }, "required": ["command"]})),
            read_only: false,
        }]
    }

    async fn call(
        &self,
        _ctx: &ToolContext,
        _name: &str,
        _input: Value,
        _cancel: CancellationToken,
    ) -> ToolOutput {
        self.0
            .lock()
            .unwrap()
            .push(ALLOCATED.load(Ordering::Relaxed));
        ToolOutput {
            output: Value::String("ok".into()),
            is_error: false,
        }
    }
}

const TURNS: usize = 500;
const WINDOW: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_work_stays_flat_over_a_500_turn_session() {
    let dir = tempfile::tempdir().unwrap();
    let readings = Arc::new(Readings::default());
    let server =
        TestServer::start_with_tools(dir.path(), Tools::Custom(readings.clone()), |_| {}).await;
    let id = server.create_session(json!({})).await;
    for turn in 0..TURNS {
        let events = server.turn(&id, &format!("$ echo {turn}")).await;
        let result = events.last().expect("events");
        assert_eq!(
            (&result["type"], &result["status"]),
            (&json!("result"), &json!("success")),
            "turn {turn}: {events:?}"
        );
        // The demo model numbers its calls by the replies it finds in the
        // history: each turn's model saw the whole conversation.
        let call = events.iter().find(|e| e["type"] == "tool_use");
        assert_eq!(
            call.map(|e| &e["id"]),
            Some(&json!(format!("toolu_demo_{}_1", 2 * turn + 1))),
            "turn {turn}: {events:?}"
        );
    }
    let status: Value = server.status(&id).await;
    assert_eq!(status["usage"]["turns"], 2 * TURNS as u64);
    assert_eq!(status["history"].as_array().map(Vec::len), Some(4 * TURNS));
    server.stop().await;

    let readings = readings.0.lock().unwrap().clone();
    assert_eq!(readings.len(), TURNS);
    // Bytes per turn: from one tool call to the next. The first turns
    // warm caches and pools up; the window starts after them.
    let per_turn: Vec<u64> = readings.windows(2).map(|w| w[1] - w[0]).collect();
    let mean = |turns: &[u64]| turns.iter().sum::<u64>() as f64 / turns.len() as f64;
    let early = mean(&per_turn[5..5 + WINDOW]);
    let late = mean(&per_turn[per_turn.len() - WINDOW..]);
    eprintln!(
        "bytes allocated per turn: turns 6-55 {early:.0}, last {WINDOW} {late:.0} ({:.2}x)",
        late / early
    );
    assert!(
        late <= early * 1.25,
        "a turn allocates {late:.0} bytes late in the session against {early:.0} early on: \
         its work grows with the session"
    );
}
