//! A permission rule: `Tool`, `Tool(pattern)`, or a glob over tool names
//! (`mcp__github__*`). The pattern is matched on the call's main input:
//! the command of `Bash` and `execute_shell`, the code of `execute_code`,
//! the path of `Read`, `Write`, `Edit`, `Glob` and `Grep` (made absolute
//! and with `..` resolved, so `Write(/workspace/src/**)` cannot be left
//! through `src/../..`, and checked on where it leads once the sandbox
//! followed its links too), else the input as compact JSON.
//!
//! Commands are matched by the simple commands they can run, as a shell
//! parser finds them ([`super::shell`]): a rule allows a command only when
//! it allows each of them, the parser sees them all, and nothing
//! substitutes a command's output or redirects to or from a file; a rule
//! denies a command when it denies the whole line or any one of them.
//! Paths use glob syntax where `*` stays within a directory and `**`
//! crosses them; elsewhere `*` matches anything.

use std::fmt;

use globset::{Glob, GlobBuilder, GlobMatcher};
use serde_json::Value;

use super::PolicyCall;
use super::shell::{Analysis, analyze};

#[derive(Debug, Clone)]
pub struct Rule {
    text: String,
    tool: GlobMatcher,
    pattern: Option<Pattern>,
}

#[derive(Debug, Clone)]
struct Pattern {
    /// `*` within a path segment.
    path: GlobMatcher,
    /// `*` over anything.
    text: GlobMatcher,
}

/// What a tool's main input is, as rules match it.
pub enum Subject {
    /// A shell command line and what it can run.
    Command(String, Analysis),
    /// A path made absolute, and where it leads once links are followed
    /// when the sandbox was asked.
    Path(String, Option<String>),
    Text(String),
}

fn glob(pattern: &str, paths: bool) -> Result<GlobMatcher, String> {
    GlobBuilder::new(pattern)
        .literal_separator(paths)
        .backslash_escape(true)
        .build()
        .map(|g: Glob| g.compile_matcher())
        .map_err(|e| format!("`{pattern}` is not a valid pattern: {e}"))
}

impl Rule {
    pub fn parse(text: &str) -> Result<Rule, String> {
        let trimmed = text.trim();
        let (tool, pattern) = match trimmed.split_once('(') {
            Some((tool, rest)) => {
                let Some(pattern) = rest.strip_suffix(')') else {
                    return Err(format!(
                        "`{trimmed}` opens a `(` it does not close at its end"
                    ));
                };
                (tool.trim(), Some(pattern))
            }
            None => (trimmed, None),
        };
        if tool.is_empty() {
            return Err(
                "a rule names a tool: `Bash`, `Bash(git status*)`, `mcp__github__*`".into(),
            );
        }
        if !tool
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*' | '.'))
        {
            return Err(format!(
                "`{tool}` is not a tool name (letters, digits, `_`, `-`, `.`, and `*` for any)"
            ));
        }
        let pattern = match pattern {
            Some(p) if p.trim().is_empty() => {
                return Err(format!(
                    "`{trimmed}` has an empty pattern; drop the parentheses"
                ));
            }
            Some(p) => Some(Pattern {
                path: glob(p, true)?,
                text: glob(p, false)?,
            }),
            None => None,
        };
        Ok(Rule {
            text: trimmed.to_string(),
            tool: glob(tool, false)?,
            pattern,
        })
    }

    /// Whether the rule is about `tool`.
    pub fn names(&self, tool: &str) -> bool {
        self.tool.is_match(tool)
    }

    /// Whether the rule allows the call: every simple command a command
    /// can run must fit, and the parser must see them all.
    pub fn allows(&self, call: &PolicyCall<'_>, subject: &Subject) -> bool {
        if !self.tool.is_match(call.tool) {
            return false;
        }
        let Some(pattern) = &self.pattern else {
            return true;
        };
        match subject {
            Subject::Command(_, analysis) => {
                !analysis.commands.is_empty()
                    && analysis.opaque.is_none()
                    && !analysis.substitutes_or_redirects
                    && analysis.commands.iter().all(|c| pattern.text.is_match(c))
            }
            Subject::Path(path, resolved) => {
                pattern.path.is_match(path)
                    && resolved.as_ref().is_none_or(|r| pattern.path.is_match(r))
            }
            Subject::Text(text) => pattern.text.is_match(text),
        }
    }

    /// Whether the rule denies the call: the whole command, or any simple
    /// command it can run (by its name as given or without its directory).
    pub fn denies(&self, call: &PolicyCall<'_>, subject: &Subject) -> bool {
        if !self.tool.is_match(call.tool) {
            return false;
        }
        let Some(pattern) = &self.pattern else {
            return true;
        };
        match subject {
            Subject::Command(command, analysis) => {
                pattern.text.is_match(command.trim())
                    || analysis
                        .commands
                        .iter()
                        .chain(&analysis.by_name)
                        .any(|c| pattern.text.is_match(c))
            }
            Subject::Path(path, resolved) => {
                pattern.path.is_match(path)
                    || resolved.as_ref().is_some_and(|r| pattern.path.is_match(r))
            }
            Subject::Text(text) => pattern.text.is_match(text),
        }
    }

    /// Whether the rule has a pattern (matches a call's input, not only
    /// its tool).
    pub fn has_pattern(&self) -> bool {
        self.pattern.is_some()
    }

    /// The rule a remembered decision adds for this tool: all its calls.
    pub fn for_tool(tool: &str) -> Result<Rule, String> {
        Rule::parse(&tool.replace(['(', ')'], ""))
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The call's main input, parsed once for all the rules of a verdict.
pub fn subject(call: &PolicyCall<'_>) -> Subject {
    let field = |name: &str| call.input.get(name).and_then(Value::as_str);
    match call.tool {
        "Bash" | "mcp__sandbox__execute_shell" => {
            let command = field("command").unwrap_or_default();
            Subject::Command(command.to_string(), analyze(command))
        }
        "mcp__sandbox__execute_code" => Subject::Text(field("code").unwrap_or_default().into()),
        "Read" | "Write" | "Edit" => Subject::Path(
            absolute(field("file_path").unwrap_or_default(), call.working_dir),
            call.resolved.map(str::to_string),
        ),
        "Glob" | "Grep" => Subject::Path(
            absolute(field("path").unwrap_or(call.working_dir), call.working_dir),
            call.resolved.map(str::to_string),
        ),
        _ => Subject::Text(call.input.to_string()),
    }
}

/// `path` made absolute against `dir`, with `.` and `..` resolved without
/// touching a file system (a rule is about the path the tool is given).
pub fn absolute(path: &str, dir: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", dir.trim_end_matches('/'))
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}
