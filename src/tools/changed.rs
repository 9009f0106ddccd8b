//! What a turn's tool calls did to the workspace's files, for its
//! `result`'s `files_changed`.
//!
//! When a turn that made a call that may write (any but `Read`, `Glob`,
//! `Grep`) ends, the workspace's listing is taken (each file's kind, size,
//! modification time and link target, from one `find`) and compared with
//! the one from before its first such call: the last turn's end, kept, or
//! one taken before that call when none is kept (the session's first turn,
//! or after an upload, a clone or an IDE's call changed the workspace
//! between turns, which drop it). A turn that made no such call changed
//! nothing and lists nothing. Contents are not read: a file written with
//! the same bytes counts as modified here, while `GET …/changes` compares
//! contents.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Place, Toolbox};
use crate::agent::ToolContext;
use crate::protocol::FilesChanged;
use crate::sandbox::{ExecRequest, Sandbox, WORKSPACE, exec_collect};
use crate::sync::lock;

/// The most a listing may print (about 200,000 files); a larger one tells
/// nothing.
const LISTING_BYTES: usize = 16 * 1024 * 1024;
const LISTING_TIMEOUT: Duration = Duration::from_secs(60);

/// Each file's kind, size, modification time and link target, by path.
pub type Listing = HashMap<String, [String; 4]>;

/// Each session's workspace listing as its current turn found it, and
/// whether the turn has called into the sandbox since.
#[derive(Default)]
pub struct Baselines(Mutex<HashMap<Uuid, (Listing, bool)>>);

impl Baselines {
    /// Marks a call of the session's turn; false when there is no listing
    /// to compare with (the caller takes one, before the call).
    pub fn touch(&self, session: Uuid) -> bool {
        match lock(&self.0).get_mut(&session) {
            Some((_, touched)) => {
                *touched = true;
                true
            }
            None => false,
        }
    }

    /// Keeps `listing` as what a call of the turn found first, unless a
    /// call that started earlier already gave one.
    fn keep(&self, session: Uuid, listing: Listing, touched: bool) {
        lock(&self.0).entry(session).or_insert((listing, touched));
    }

    /// The workspace changed outside the session's turns: the next turn
    /// lists it afresh before its first call.
    pub fn forget(&self, session: Uuid) {
        lock(&self.0).remove(&session);
    }
}

/// Before the first call of the session's turn that may write, when
/// [`Baselines::touch`] found no listing: the workspace as the turn found it.
pub async fn before_call(baselines: &Baselines, session: Uuid, sandbox: &dyn Sandbox) {
    if let Some(found) = listing(sandbox).await {
        baselines.keep(session, found, true);
    }
}

/// What the turn now ending did to the session's workspace; nothing when
/// it made no call in the sandbox, `None` when the session has none or its
/// files could not be listed.
pub async fn turn_changes(tools: &Toolbox, ctx: &ToolContext) -> Option<FilesChanged> {
    let baselines = &tools.baselines;
    if ctx.options.sandbox_enabled == Some(false) {
        return None;
    }
    let id = ctx.session_id;
    let before = {
        let mut kept = lock(&baselines.0);
        match kept.remove(&id) {
            Some((before, true)) => before,
            // No call in the sandbox this turn: nothing changed.
            untouched => {
                if let Some(entry) = untouched {
                    kept.insert(id, entry);
                }
                return Some(FilesChanged::default());
            }
        }
    };
    let after = async {
        let place = Place::session(&tools.sandboxes, id, &ctx.options, ctx.owner.clone()).ok()?;
        let lease = tools.lease(&place).await.ok()?;
        listing(lease.sandbox.as_ref()).await
    }
    .await;
    let after = after?;
    let changed = compare(&before, &after);
    // The next turn starts from this one's end.
    lock(&baselines.0).insert(id, (after, false));
    Some(changed)
}

/// The workspace's files now, `.git/` and the server's own `.conclave/`
/// (long tool outputs kept whole) left out; `None` when they could not be
/// listed.
pub async fn listing(sandbox: &dyn Sandbox) -> Option<Listing> {
    let git = format!("{WORKSPACE}/.git");
    let own = format!("{WORKSPACE}/.conclave");
    let request = ExecRequest {
        command: [
            "find",
            WORKSPACE,
            "-path",
            &git,
            "-prune",
            "-o",
            "-path",
            &own,
            "-prune",
            "-o",
            "!",
            "-type",
            "d",
            "-printf",
            "%y\\0%s\\0%T@\\0%l\\0%P\\0",
        ]
        .map(String::from)
        .to_vec(),
        stdin: None,
        timeout: LISTING_TIMEOUT,
        workdir: WORKSPACE.into(),
        env: Default::default(),
    };
    let (status, out) = exec_collect(
        sandbox,
        request,
        LISTING_BYTES,
        CancellationToken::new(),
        |_| {},
    )
    .await
    .ok()?;
    if status.exit_code != Some(0) || out.truncated {
        return None;
    }
    Some(parse(&out.stdout))
}

fn parse(bytes: &[u8]) -> Listing {
    let fields: Vec<String> = bytes
        .split(|b| *b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    fields
        .chunks_exact(5)
        .map(|f| {
            (
                f[4].clone(),
                [f[0].clone(), f[1].clone(), f[2].clone(), f[3].clone()],
            )
        })
        .collect()
}

/// What changed from `before` to `after`.
pub fn compare(before: &Listing, after: &Listing) -> FilesChanged {
    let mut changed = FilesChanged::default();
    for (path, now) in after {
        match before.get(path) {
            None => changed.added += 1,
            Some(then) if then != now => changed.modified += 1,
            Some(_) => {}
        }
    }
    changed.deleted = before.keys().filter(|p| !after.contains_key(*p)).count() as u64;
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_read_and_compared_by_path() {
        let before = parse(b"f\x003\x001.5\x00\x00a.txt\x00f\x004\x002.0\x00\x00b.txt\x00l\x000\x001.0\x00a.txt\x00link\x00");
        assert_eq!(before.len(), 3);
        assert_eq!(before["link"][3], "a.txt");
        let after = parse(b"f\x003\x001.5\x00\x00a.txt\x00f\x005\x003.0\x00\x00b.txt\x00f\x001\x004.0\x00\x00new dir/c\nd\x00");
        assert_eq!(
            compare(&before, &after),
            FilesChanged {
                added: 1,
                modified: 1,
                deleted: 1
            }
        );
        assert_eq!(compare(&after, &after), FilesChanged::default());
    }
}
