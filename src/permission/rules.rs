//! A permission rule: `Tool`, `Tool(pattern)`, or a glob over tool names
//! (`mcp__github__*`). The pattern is matched on the call's main input:
//! the command of `Bash` and `execute_shell`, the code of `execute_code`,
//! the path of `Read`, `Write`, `Edit`, `Glob` and `Grep` (made absolute
//! and with `..` resolved, so `Write(/workspace/src/**)` cannot be left
//! through `src/../..`), else the input as compact JSON.
//!
//! Commands are matched part by part: a rule allows a command only when
//! it allows each of its parts (split at `;`, `&&`, `||`, `|`, `&` and new
//! lines), and never one with a substitution (`$(`, a backtick) or a
//! redirection to a file; a rule denies a command when it denies any part.
//! Paths use glob syntax where `*` stays within a directory and `**`
//! crosses them; elsewhere `*` matches anything.

use std::fmt;

use globset::{Glob, GlobBuilder, GlobMatcher};
use serde_json::Value;

use super::Call;

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

/// What a tool's main input is.
enum Subject {
    Command(String),
    Path(String),
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

    /// Whether the rule allows the call: every part of a command must fit.
    pub fn allows(&self, call: &Call<'_>) -> bool {
        if !self.tool.is_match(call.tool) {
            return false;
        }
        let Some(pattern) = &self.pattern else {
            return true;
        };
        match subject(call) {
            Subject::Command(command) => {
                let parts = command_parts(&command);
                !parts.is_empty()
                    && !substitutes_or_redirects(&command)
                    && parts.iter().all(|part| pattern.text.is_match(part))
            }
            Subject::Path(path) => pattern.path.is_match(&path),
            Subject::Text(text) => pattern.text.is_match(&text),
        }
    }

    /// Whether the rule denies the call: the whole command or any part.
    pub fn denies(&self, call: &Call<'_>) -> bool {
        if !self.tool.is_match(call.tool) {
            return false;
        }
        let Some(pattern) = &self.pattern else {
            return true;
        };
        match subject(call) {
            Subject::Command(command) => {
                pattern.text.is_match(command.trim())
                    || command_parts(&command)
                        .iter()
                        .any(|part| pattern.text.is_match(part))
            }
            Subject::Path(path) => pattern.path.is_match(&path),
            Subject::Text(text) => pattern.text.is_match(&text),
        }
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

fn subject(call: &Call<'_>) -> Subject {
    let field = |name: &str| call.input.get(name).and_then(Value::as_str);
    match call.tool {
        "Bash" | "mcp__sandbox__execute_shell" => {
            Subject::Command(field("command").unwrap_or_default().to_string())
        }
        "mcp__sandbox__execute_code" => Subject::Text(field("code").unwrap_or_default().into()),
        "Read" | "Write" | "Edit" => Subject::Path(absolute(
            field("file_path").unwrap_or_default(),
            call.working_dir,
        )),
        "Glob" | "Grep" => Subject::Path(absolute(
            field("path").unwrap_or(call.working_dir),
            call.working_dir,
        )),
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

/// A command's simple commands, split at the shell's list and pipe
/// operators, trimmed, empty ones dropped.
fn command_parts(command: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ';' | '\n' | '|' => {
                if c == '|' && chars.peek() == Some(&'|') {
                    chars.next();
                }
                parts.push(std::mem::take(&mut current));
            }
            '&' if chars.peek() == Some(&'&') => {
                chars.next();
                parts.push(std::mem::take(&mut current));
            }
            // `2>&1` and `>&2` are not a background `&`.
            '&' if !current.ends_with('>') => parts.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    parts.push(current);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// A command substitution, or a redirection to or from a file (`2>&1` and
/// `>&2` are not): what no allow rule can vouch for.
fn substitutes_or_redirects(command: &str) -> bool {
    if command.contains("$(") || command.contains('`') {
        return true;
    }
    let without_dups = command
        .replace("2>&1", "")
        .replace("1>&2", "")
        .replace(">&2", "")
        .replace(">/dev/null", "")
        .replace("> /dev/null", "");
    without_dups.contains('>') || without_dups.contains('<')
}
