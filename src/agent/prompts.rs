//! The system prompt a turn sends when its session gives none.

use crate::model::ToolSpec;

/// Where the model works, for a session with tools and no system prompt
/// of its own. A harness may add to it (the small one lists the tools and
/// writes out an example).
pub(super) fn default_system_prompt(
    tools: &[ToolSpec],
    working_dir: Option<&str>,
) -> Option<String> {
    (!tools.is_empty()).then(|| {
        format!(
            "You are an agent with tools that run in a sandbox. Your workspace is {}.",
            working_dir.unwrap_or(crate::sandbox::WORKSPACE)
        )
    })
}
