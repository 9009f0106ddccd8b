//! Scratch sandboxes of stateless MCP calls. Under the 2026-07-28
//! revision there is no MCP session to keep a scratch sandbox between
//! calls, so a sandbox tool called without `session_id` gets a new scratch
//! sandbox and its result names it (a text block and
//! `_meta["dev.conclave/scratch_id"]`): later calls that pass that id as
//! `session_id` act in the same sandbox. A handle lives as long as its
//! sandbox (`sandbox.idle_ttl_s` unused, then destroyed), belongs to the
//! key that got it, and each key holds at most [`PER_KEY`]: a ninth whose
//! call completes takes the place of the least recently used, whose
//! sandbox goes at once.
//! A call that fails before its sandbox exists, or that its client
//! cancelled (so that no one reads the handle), hands nothing out and
//! leaves no sandbox.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use rmcp::RoleServer;
use rmcp::model::{ContentBlock, MetaObject, ProtocolVersion};
use rmcp::service::RequestContext;
use uuid::Uuid;

use crate::sync::lock;

/// The most scratch handles one key holds at once.
pub const PER_KEY: usize = 8;

/// Where the result's `_meta` names the handle.
pub const META_KEY: &str = "dev.conclave/scratch_id";

/// The tools that act in a sandbox, so that a stateless call of one
/// without `session_id` is given a scratch sandbox.
pub const SANDBOX_TOOLS: &[&str] = &[
    "execute_code",
    "execute_shell",
    "read_file",
    "write_file",
    "edit_file",
    "list_files",
    "glob",
    "grep",
    "kill_background",
    "list_background",
    "upload",
    "download",
];

/// Whether the call came under a revision without MCP sessions.
pub fn stateless(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.meta
        .protocol_version()
        .or_else(|| {
            ctx.peer
                .peer_info()
                .map(|info| info.protocol_version.clone())
        })
        .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28)
}

struct Handle {
    /// The key that got it (`None`: auth is off, or a trusted caller).
    owner: Option<String>,
    /// Whether a call completed in it, so its sandbox was made.
    used: bool,
    last: Instant,
}

/// What a handle named in `session_id` is.
#[derive(Debug, PartialEq)]
pub enum Found {
    /// A live handle of the caller's: act in its sandbox.
    Live,
    /// The caller's handle whose sandbox was destroyed after its idle
    /// time; the handle is gone now.
    Expired,
    /// No handle of the caller's (maybe a session's id).
    NotOne,
}

/// The handles handed out, by sandbox id.
#[derive(Default)]
pub struct ScratchHandles(Mutex<HashMap<Uuid, Handle>>);

impl ScratchHandles {
    /// A new handle of `owner`'s, for a call that has not made its
    /// sandbox yet.
    pub fn hand_out(&self, owner: Option<String>) -> Uuid {
        let id = Uuid::new_v4();
        let handle = Handle {
            owner,
            used: false,
            last: Instant::now(),
        };
        lock(&self.0).insert(id, handle);
        id
    }

    /// What `id` is to a caller acting for `owner` (`None`: a trusted
    /// caller, who may use any); `alive` says whether its sandbox is still
    /// held.
    pub fn find(&self, id: Uuid, owner: Option<&Option<String>>, alive: bool) -> Found {
        let mut handles = lock(&self.0);
        let Some(handle) = handles.get_mut(&id) else {
            return Found::NotOne;
        };
        if owner.is_some_and(|o| *o != handle.owner) {
            return Found::NotOne;
        }
        if handle.used && !alive {
            handles.remove(&id);
            return Found::Expired;
        }
        handle.last = Instant::now();
        Found::Live
    }

    /// A call in `id` completed and the client reads the handle: its
    /// sandbox exists from now on. Returns the handle it takes the place
    /// of (whose sandbox the caller destroys) when its key held
    /// [`PER_KEY`] already: the least recently used.
    pub fn used(&self, id: Uuid) -> Option<Uuid> {
        let mut handles = lock(&self.0);
        let owner = {
            let handle = handles.get_mut(&id)?;
            handle.used = true;
            handle.owner.clone()
        };
        let mine: Vec<(Uuid, Instant)> = handles
            .iter()
            .filter(|(_, h)| h.used && h.owner == owner)
            .map(|(id, h)| (*id, h.last))
            .collect();
        if mine.len() <= PER_KEY {
            return None;
        }
        let (oldest, _) = mine
            .iter()
            .filter(|(other, _)| *other != id)
            .min_by_key(|(_, last)| *last)?;
        handles.remove(oldest);
        Some(*oldest)
    }

    /// Forgets a handle whose first call failed.
    pub fn forget(&self, id: Uuid) {
        lock(&self.0).remove(&id);
    }
}

/// Names the handle in a result: a line the model reads and the `_meta`
/// entry a program reads.
pub fn annotate(result: &mut rmcp::model::CallToolResult, id: Uuid, idle_ttl_s: u64) {
    result.content.push(ContentBlock::text(format!(
        "scratch sandbox {id}: pass session_id \"{id}\" to later calls to act in it again \
         (its files stay); it is removed after {idle_ttl_s} s unused"
    )));
    let meta = result.meta.get_or_insert_with(MetaObject::default);
    meta.0.insert(META_KEY.into(), id.to_string().into());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_is_its_owners_and_expires_with_its_sandbox() {
        let handles = ScratchHandles::default();
        let mine = Some("key-a".to_string());
        let id = handles.hand_out(mine.clone());
        // Before its first call completes, no sandbox is no expiry.
        assert_eq!(handles.find(id, Some(&mine), false), Found::Live);
        assert_eq!(
            handles.find(id, Some(&Some("key-b".into())), true),
            Found::NotOne
        );
        assert_eq!(handles.find(id, None, true), Found::Live);
        assert_eq!(handles.used(id), None);
        assert_eq!(handles.find(id, Some(&mine), true), Found::Live);
        assert_eq!(handles.find(id, Some(&mine), false), Found::Expired);
        assert_eq!(handles.find(id, Some(&mine), true), Found::NotOne);
    }

    #[test]
    fn a_key_holds_at_most_per_key_handles() {
        let handles = ScratchHandles::default();
        let owner = Some("key-a".to_string());
        let made: Vec<Uuid> = (0..PER_KEY)
            .map(|_| {
                let id = handles.hand_out(owner.clone());
                assert_eq!(handles.used(id), None);
                id
            })
            .collect();
        // The first is used again, so the second is the least recent.
        assert_eq!(handles.find(made[0], Some(&owner), true), Found::Live);
        // A handle whose call has not completed takes no one's place.
        let pending = handles.hand_out(owner.clone());
        assert_eq!(handles.find(made[1], Some(&owner), true), Found::Live);
        handles.forget(pending);
        let ninth = handles.hand_out(owner.clone());
        assert_eq!(handles.used(ninth), Some(made[2]));
        // Another key's count is its own.
        let other = handles.hand_out(None);
        assert_eq!(handles.used(other), None);
    }
}
