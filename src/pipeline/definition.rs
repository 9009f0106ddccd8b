//! A pipeline's definition, read from YAML: nodes (agents with a role, a
//! prompt template over the state, tools, a model, the decisions they may
//! return and the fields they may write), edges (on a decision, with a
//! retry counter and its limit, and minimums on state fields), a start
//! node, terminal nodes, and the state's fields with their reducers.
//! Checked once at load; an error names the file, the line and the place.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::state::FieldSpec;
use crate::agent::tools::SANDBOX_TOOLS;

/// One node: an agent turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Who the agent is (`Generator`); in its system prompt.
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// The node's message, with `{field}` replaced by the state's value.
    pub prompt: String,
    /// The tools it may use (all of the agent's when not given).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub model: Option<String>,
    /// What it may answer; the edges route on it.
    #[serde(default)]
    pub decisions: Vec<String>,
    /// The state fields its answer may set.
    #[serde(default)]
    pub writes: Vec<String>,
}

/// One edge: taken after `from` when its decision is `when` (any decision
/// when not given), within its counter's limit and the minimums.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeSpec {
    pub from: String,
    pub to: String,
    #[serde(default)]
    pub when: Option<String>,
    /// Counted each time the edge is taken; once at its limit, taking it
    /// again ends the run failed.
    #[serde(default)]
    pub counter: Option<String>,
    /// Allowed while the counter is at most the limit (inclusive, `<=`)
    /// instead of below it.
    #[serde(default)]
    pub inclusive: bool,
    /// State fields that must be at least these numbers; below, the run
    /// ends failed.
    #[serde(default)]
    pub min: BTreeMap<String, f64>,
}

/// A pipeline as its YAML declares it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub start: String,
    #[serde(default)]
    pub terminal: Vec<String>,
    /// Retry counters and their limits.
    #[serde(default)]
    pub counters: BTreeMap<String, u32>,
    #[serde(default)]
    pub state: BTreeMap<String, FieldSpec>,
    pub nodes: BTreeMap<String, NodeSpec>,
    #[serde(default)]
    pub edges: Vec<EdgeSpec>,
}

/// Why a definition was refused: where, and what.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}:{line}: {place}: {message}")]
pub struct DefinitionError {
    pub file: String,
    /// 1-based; 0 when the place has no line of its own.
    pub line: usize,
    /// `edges[3].to`, `nodes.tester.writes`, …
    pub place: String,
    pub message: String,
}

/// The largest definition read: ample for dozens of nodes with long
/// prompts.
pub const MAX_DEFINITION_BYTES: usize = 256 * 1024;

/// The built-in `connector` pipeline: research, generate, test, review
/// and publish a connector, with retry limits on each way back.
pub const CONNECTOR_YAML: &str = include_str!("connector.yaml");

/// Where an edge goes after a node answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// To `to`; `counter` (if any) is to be counted.
    Next {
        to: String,
        counter: Option<String>,
        reason: String,
    },
    /// A terminal node answered: the run is done.
    Done,
    /// No way on: the run ends failed with this reason.
    Fail(String),
}

impl Definition {
    /// Reads and checks a definition; `file` names it in errors.
    pub fn parse(yaml: &str, file: &str) -> Result<Definition, DefinitionError> {
        crate::yaml::check(yaml, MAX_DEFINITION_BYTES).map_err(|e| DefinitionError {
            file: file.to_owned(),
            line: match e {
                crate::yaml::Refused::TooDeep { line } => line,
                crate::yaml::Refused::TooLarge { .. } => 0,
            },
            place: "document".into(),
            message: e.to_string(),
        })?;
        let definition: Definition = yaml_serde::from_str(yaml).map_err(|e| DefinitionError {
            file: file.to_owned(),
            line: e.location().map_or(0, |l| l.line()),
            place: "document".into(),
            message: crate::words::suggested(&crate::words::plain_types(&e.to_string())),
        })?;
        definition
            .check()
            .map_err(|(place, needle, message)| DefinitionError {
                file: file.to_owned(),
                line: line_of(yaml, &place, &needle),
                place,
                message,
            })?;
        Ok(definition)
    }

    /// Checks each node's model against the server's (`known` says why
    /// one is not); `yaml` and `file` are the definition's, for the error.
    pub fn check_models(
        &self,
        yaml: &str,
        file: &str,
        known: &dyn Fn(&str) -> Result<(), String>,
    ) -> Result<(), DefinitionError> {
        for (name, spec) in &self.nodes {
            if let Some(model) = &spec.model
                && let Err(message) = known(model)
            {
                let place = format!("nodes.{name}.model");
                return Err(DefinitionError {
                    file: file.to_owned(),
                    line: line_of(yaml, &place, model),
                    place,
                    message,
                });
            }
        }
        Ok(())
    }

    /// The checks: `Err((place, text to find its line by, message))`.
    fn check(&self) -> Result<(), (String, String, String)> {
        let node = |name: &str, place: String| -> Result<(), (String, String, String)> {
            if self.nodes.contains_key(name) {
                Ok(())
            } else {
                Err((
                    place,
                    name.to_owned(),
                    format!("unknown node {name:?}; nodes: {}", self.node_names()),
                ))
            }
        };
        if self.nodes.is_empty() {
            return Err((
                "nodes".into(),
                "nodes:".into(),
                "a pipeline needs a node".into(),
            ));
        }
        node(&self.start, "start".into())?;
        for (i, name) in self.terminal.iter().enumerate() {
            node(name, format!("terminal[{i}]"))?;
        }
        for (i, edge) in self.edges.iter().enumerate() {
            node(&edge.from, format!("edges[{i}].from"))?;
            node(&edge.to, format!("edges[{i}].to"))?;
            if self.terminal.contains(&edge.from) {
                return Err((
                    format!("edges[{i}].from"),
                    format!("from: {}", edge.from),
                    format!("{:?} is terminal: no edge leaves it", edge.from),
                ));
            }
            if let Some(when) = &edge.when
                && !self.nodes[&edge.from].decisions.contains(when)
            {
                return Err((
                    format!("edges[{i}].when"),
                    format!("when: {when}"),
                    format!(
                        "{:?} never answers {when:?}; its decisions: {}",
                        edge.from,
                        self.nodes[&edge.from].decisions.join(", ")
                    ),
                ));
            }
            if let Some(counter) = &edge.counter
                && !self.counters.contains_key(counter)
            {
                return Err((
                    format!("edges[{i}].counter"),
                    format!("counter: {counter}"),
                    format!("the counter {counter:?} has no limit under counters"),
                ));
            }
            for field in edge.min.keys() {
                if !self.state.contains_key(field) {
                    return Err((
                        format!("edges[{i}].min.{field}"),
                        field.clone(),
                        format!("{field:?} is not a state field"),
                    ));
                }
            }
        }
        for (name, spec) in &self.nodes {
            for tool in spec.tools.iter().flatten() {
                if !SANDBOX_TOOLS.contains(&tool.as_str()) && !tool.starts_with("mcp__") {
                    return Err((
                        format!("nodes.{name}.tools"),
                        tool.clone(),
                        format!(
                            "unknown tool {tool:?}; the sandbox's tools are {}, and an MCP \
                             server's are mcp__{{server}}__{{tool}}",
                            SANDBOX_TOOLS.join(", ")
                        ),
                    ));
                }
            }
            for field in &spec.writes {
                if !self.state.contains_key(field) {
                    return Err((
                        format!("nodes.{name}.writes"),
                        field.clone(),
                        format!("{field:?} has no reducer: declare it under state"),
                    ));
                }
            }
            for field in template_fields(&spec.prompt) {
                if !self.state.contains_key(&field) {
                    return Err((
                        format!("nodes.{name}.prompt"),
                        format!("{{{field}}}"),
                        format!("{{{field}}} is not a state field"),
                    ));
                }
            }
            let leaving: Vec<&EdgeSpec> = self.edges.iter().filter(|e| &e.from == name).collect();
            let terminal = self.terminal.contains(name);
            if !terminal && leaving.is_empty() {
                return Err((
                    format!("nodes.{name}"),
                    format!("{name}:"),
                    "no edge leaves this node and it is not terminal".into(),
                ));
            }
            let catch_all = leaving.iter().any(|e| e.when.is_none());
            if !terminal && !catch_all {
                for decision in &spec.decisions {
                    if !leaving.iter().any(|e| e.when.as_ref() == Some(decision)) {
                        return Err((
                            format!("nodes.{name}.decisions"),
                            decision.clone(),
                            format!("no edge leaves {name:?} on {decision:?}"),
                        ));
                    }
                }
            }
        }
        for (field, spec) in &self.state {
            spec.check()
                .map_err(|message| (format!("state.{field}"), format!("{field}:"), message))?;
        }
        let reachable = self.reachable();
        if let Some(lost) = self.nodes.keys().find(|n| !reachable.contains(*n)) {
            return Err((
                format!("nodes.{lost}"),
                format!("{lost}:"),
                format!("unreachable from the start node {:?}", self.start),
            ));
        }
        if self.terminal.is_empty() {
            return Err((
                "terminal".into(),
                "nodes:".into(),
                "a pipeline needs a terminal node".into(),
            ));
        }
        Ok(())
    }

    fn node_names(&self) -> String {
        self.nodes.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    fn reachable(&self) -> BTreeSet<String> {
        let mut seen = BTreeSet::from([self.start.clone()]);
        let mut queue = VecDeque::from([self.start.clone()]);
        while let Some(node) = queue.pop_front() {
            for edge in self.edges.iter().filter(|e| e.from == node) {
                if seen.insert(edge.to.clone()) {
                    queue.push_back(edge.to.clone());
                }
            }
        }
        seen
    }

    /// Where the run goes after `node` answered `decision`, given the
    /// counters and the state. An edge on the decision wins over one on
    /// any decision.
    pub fn route(
        &self,
        node: &str,
        decision: &str,
        counters: &BTreeMap<String, u32>,
        state: &serde_json::Map<String, Value>,
    ) -> Route {
        if self.terminal.iter().any(|t| t == node) {
            return Route::Done;
        }
        let leaving = || self.edges.iter().filter(|e| e.from == node);
        let edge = leaving()
            .find(|e| e.when.as_deref() == Some(decision))
            .or_else(|| leaving().find(|e| e.when.is_none()));
        let Some(edge) = edge else {
            return Route::Fail(format!("{node} answered {decision:?}, which no edge takes"));
        };
        for (field, min) in &edge.min {
            let value = state.get(field).and_then(Value::as_f64).unwrap_or(0.0);
            if value < *min {
                return Route::Fail(format!(
                    "{node} answered {decision} but {field} is {value}, below {min}"
                ));
            }
        }
        if let Some(counter) = &edge.counter {
            let limit = self.counters.get(counter).copied().unwrap_or(0);
            let count = counters.get(counter).copied().unwrap_or(0);
            let allowed = if edge.inclusive {
                count <= limit
            } else {
                count < limit
            };
            if !allowed {
                return Route::Fail(format!(
                    "{counter} reached its limit of {limit} ({node} answered {decision})"
                ));
            }
        }
        let reason = match &edge.when {
            Some(when) => format!("{node} answered {when}"),
            None => format!("{node} done"),
        };
        Route::Next {
            to: edge.to.clone(),
            counter: edge.counter.clone(),
            reason,
        }
    }
}

/// The `{field}` names a prompt template uses.
pub fn template_fields(template: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else { break };
        let name = &after[..close];
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            fields.push(name.to_owned());
        }
        rest = &after[close + 1..];
    }
    fields
}

/// The 1-based line of `needle` within the part of `yaml` that `place`
/// names (its first segment's section, e.g. `edges`); 0 if not found.
fn line_of(yaml: &str, place: &str, needle: &str) -> usize {
    let section = place.split(['.', '[']).next().unwrap_or("");
    let lines: Vec<&str> = yaml.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(&format!("{section}:")))
        .unwrap_or(0);
    // Within the list of edges, skip to the indexed entry.
    let mut from = start;
    if section == "edges"
        && let Some(index) = place
            .strip_prefix(&format!("{section}["))
            .and_then(|rest| rest.split(']').next())
            .and_then(|i| i.parse::<usize>().ok())
    {
        let entries: Vec<usize> = (start + 1..lines.len())
            .filter(|&i| lines[i].trim_start().starts_with("- "))
            .collect();
        if let Some(&entry) = entries.get(index) {
            from = entry;
        }
    }
    // A node's or a field's own key, then the needle.
    if let Some(key) = place.split('.').nth(1).filter(|_| section != "edges")
        && let Some(at) =
            (from..lines.len()).find(|&i| lines[i].trim_start().starts_with(&format!("{key}:")))
    {
        from = at;
    }
    (from..lines.len())
        .find(|&i| lines[i].contains(needle))
        .map_or(0, |i| i + 1)
}

#[cfg(test)]
#[path = "definition_tests.rs"]
mod tests;
