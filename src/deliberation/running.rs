//! What running deliberations may hold: the agent calls of the ones a key
//! runs at once (`max_deliberation_calls`, its quota) and of all the
//! server runs at once ([`MAX_RUNNING_CALLS`]), counted on this replica.
//! A deliberation past either is refused before it starts (`429`, naming
//! the bound); each of its answers is kept up to [`MAX_ANSWER_BYTES`].
//! Together they bound the memory and disk deliberations take, however
//! many keys submit them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use crate::quota::{KeyTable, QuotaExceeded};
use crate::sync::lock;

/// The agent calls of every deliberation running on this replica at
/// once: eight of the largest (each holds at most [`MAX_ANSWER_BYTES`] an
/// answer).
pub const MAX_RUNNING_CALLS: u64 = 8 * super::MAX_AGENT_CALLS;
/// The most of one agent's answer a deliberation keeps (in its record, its
/// events and the prompts of its critique rounds); the rest is cut, with
/// a note that says so.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024;
/// What a refused client is told to wait: a running deliberation ends
/// within its timeout, usually far sooner.
const RETRY: Duration = Duration::from_secs(30);

/// The calls held, by key, and the holds of submitted deliberations whose
/// run has not started yet.
pub struct Running {
    keys: Arc<KeyTable>,
    counts: Mutex<Counts>,
    /// Taken at submit, handed to the run (by its session) when it starts.
    waiting: Mutex<HashMap<Uuid, Hold>>,
}

#[derive(Default)]
struct Counts {
    all: u64,
    by_key: HashMap<String, u64>,
}

/// A deliberation's place; given back when dropped.
pub struct Hold {
    running: Arc<Running>,
    owner: String,
    calls: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut counts = lock(&self.running.counts);
        counts.all = counts.all.saturating_sub(self.calls);
        if let Some(count) = counts.by_key.get_mut(&self.owner) {
            *count = count.saturating_sub(self.calls);
            if *count == 0 {
                counts.by_key.remove(&self.owner);
            }
        }
    }
}

impl Running {
    pub fn new(keys: Arc<KeyTable>) -> Arc<Running> {
        Arc::new(Running {
            keys,
            counts: Mutex::new(Counts::default()),
            waiting: Mutex::new(HashMap::new()),
        })
    }

    /// A place for a deliberation of `calls` agent calls, or the bound it
    /// would pass.
    pub fn take(self: &Arc<Self>, owner: Option<&str>, calls: u64) -> Result<Hold, QuotaExceeded> {
        let limit = self.keys.quota(owner).max_deliberation_calls;
        let key = owner.unwrap_or_default().to_owned();
        let mut counts = lock(&self.counts);
        let own = counts.by_key.get(&key).copied().unwrap_or(0);
        let refused = |quota: &'static str, limit: u64, held: u64| QuotaExceeded {
            key: self.keys.name(owner),
            quota,
            limit: limit.to_string(),
            why: format!(
                "deliberations running hold {held} agent calls; this one of {calls} would pass {limit}: \
                 wait for one to end, or make it smaller"
            ),
            reset: None,
            retry_after: RETRY,
        };
        if let Some(limit) = limit
            && own + calls > limit
        {
            return Err(refused("max_deliberation_calls", limit, own));
        }
        if counts.all + calls > MAX_RUNNING_CALLS {
            return Err(refused(
                "the server's running deliberation calls",
                MAX_RUNNING_CALLS,
                counts.all,
            ));
        }
        counts.all += calls;
        *counts.by_key.entry(key.clone()).or_default() += calls;
        Ok(Hold {
            running: self.clone(),
            owner: key,
            calls,
        })
    }

    /// Keeps a submitted deliberation's place until its run starts.
    pub fn keep(&self, session: Uuid, hold: Hold) {
        lock(&self.waiting).insert(session, hold);
    }

    /// The place kept for the session's deliberation, if it was submitted.
    pub fn claim(&self, session: Uuid) -> Option<Hold> {
        lock(&self.waiting).remove(&session)
    }
}

/// `answer`, cut to [`MAX_ANSWER_BYTES`] (at a character boundary) with a
/// note of how much was left out; an answer cut once is kept as it is.
pub fn kept(answer: &str) -> String {
    match super::prompts::cut(answer, MAX_ANSWER_BYTES) {
        None => answer.to_owned(),
        Some((kept, more)) => format!(
            "{kept}\n[cut: {more} more bytes; a deliberation keeps {MAX_ANSWER_BYTES} bytes of an answer]"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(keys: &[&str]) -> Arc<Running> {
        let config = crate::config::Config {
            api_keys: keys.iter().map(|k| k.to_string()).collect(),
            ..crate::config::Config::default()
        };
        Running::new(Arc::new(KeyTable::new(&config)))
    }

    #[test]
    fn a_key_holds_its_quota_and_the_server_its_bound() {
        let running = running(&["key-a-0123456789", "key-b-0123456789"]);
        let a = crate::config::key_owner("key-a-0123456789");
        let b = crate::config::key_owner("key-b-0123456789");
        let largest = super::super::MAX_AGENT_CALLS;
        let first = running.take(Some(&a), largest).unwrap();
        let _second = running.take(Some(&a), largest).unwrap();
        let refused = running.take(Some(&a), 1).err().unwrap();
        assert_eq!(refused.quota, "max_deliberation_calls");
        // Another key has its own.
        let _others: Vec<Hold> = (0..2)
            .map(|_| running.take(Some(&b), largest).unwrap())
            .collect();
        drop(first);
        assert!(running.take(Some(&a), largest).is_ok());
    }

    #[test]
    fn long_answers_are_cut_with_a_note() {
        assert_eq!(kept("short"), "short");
        let long = "é".repeat(MAX_ANSWER_BYTES);
        let cut = kept(&long);
        assert!(cut.len() < MAX_ANSWER_BYTES + 100, "{}", cut.len());
        assert!(cut.ends_with("bytes of an answer]"), "{cut}");
        assert_eq!(kept(&cut), cut);
    }
}
