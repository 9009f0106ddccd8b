//! File tools' paths and the permission rules: a path a rule reads is
//! resolved in the sandbox before the check (where its links lead), the
//! tool then acts only if the path still opens that file, and what `Glob`
//! and `Grep` find leaves out what a deny rule covers.

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::Gate;
use crate::agent::deps::TurnDeps;
use crate::agent::tools::{ToolContext, ToolOutput};
use crate::model::ToolCall;

/// The argument a file tool's call carries once its path was resolved in
/// the sandbox: the rules are checked on it too, and the tool acts only if
/// the path still opens that file (`expect` of the sandbox's file tools).
pub const EXPECT_PATH: &str = "expect_path";

/// The argument that holds a file tool's path.
pub(in crate::agent) fn path_argument(tool: &str) -> Option<&'static str> {
    match tool {
        "Read" | "Write" | "Edit" => Some("file_path"),
        "Glob" | "Grep" => Some("path"),
        _ => None,
    }
}

/// Resolves a file tool's path in the sandbox when a rule reads it, and
/// records where it leads in the call ([`EXPECT_PATH`]); why not, when the
/// sandbox could not say.
pub(super) async fn resolve(
    deps: &TurnDeps,
    ctx: &ToolContext,
    gate: &Gate,
    call: &mut ToolCall,
    cancel: &CancellationToken,
) -> Result<(), String> {
    let (Some(argument), true) = (path_argument(&call.name), gate.reads_paths(&call.name)) else {
        return Ok(());
    };
    let given = call
        .arguments
        .get(argument)
        .and_then(Value::as_str)
        .unwrap_or(&gate.working_dir);
    let path = crate::permission::rules::absolute(given, &gate.working_dir);
    match deps.tools.resolve_path(ctx, &path, cancel.clone()).await {
        None => Ok(()),
        Some(Ok(resolved)) => {
            if let Some(arguments) = call.arguments.as_object_mut() {
                arguments.insert(EXPECT_PATH.into(), Value::String(resolved));
            }
            Ok(())
        }
        Some(Err(why)) => Err(why),
    }
}

/// Leaves out of what `Glob` and `Grep` found the files a deny rule covers
/// (for `Read` or for the tool): a search is no way round a rule.
pub(in crate::agent) fn hide_denied(gate: &Gate, call: &ToolCall, output: &mut ToolOutput) {
    if !gate.reads_paths(&call.name) || output.is_error {
        return;
    }
    let Some(found) = output.output.as_object_mut() else {
        return;
    };
    // Glob's matches are relative to where its directory leads.
    let base = call
        .arguments
        .get(EXPECT_PATH)
        .or_else(|| found.get("path"))
        .and_then(Value::as_str)
        .unwrap_or(&gate.working_dir)
        .to_string();
    let Some(Value::Array(matches)) = found.get_mut("matches") else {
        return;
    };
    let before = matches.len();
    matches.retain(|entry| {
        let Some(text) = entry.as_str() else {
            return true;
        };
        let path = if call.name == "Glob" {
            crate::permission::rules::absolute(text, &base)
        } else {
            grep_file(text).to_string()
        };
        !gate.hides(&call.name, &path)
    });
    let hidden = before - matches.len();
    if hidden > 0 {
        found.insert(
            "hidden".into(),
            Value::String(format!(
                "{hidden} match(es) left out: files a deny rule covers"
            )),
        );
    }
}

/// The file of a `grep -n` line (`file:line:text`).
fn grep_file(line: &str) -> &str {
    let bytes = line.as_bytes();
    let mut at = 0;
    while let Some(colon) = line[at..].find(':').map(|i| at + i) {
        let digits = bytes[colon + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits > 0 && bytes.get(colon + 1 + digits) == Some(&b':') {
            return &line[..colon];
        }
        at = colon + 1;
    }
    line
}
