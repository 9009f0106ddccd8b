//! Who answers a node: the mock agents of test mode (deterministic routing
//! through any path, simulated failures), or an agent turn with real tools
//! in the run's sandbox, whose final answer is a JSON object with the
//! decision and the fields the node writes.
//!
//! A mock node is a job ([`MOCK_NODE`]): on one server it runs here, among
//! replicas whichever replica takes it from the queue answers it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::definition::{Definition, NodeSpec};
use crate::jobs::{self, Handler};
use crate::protocol::{ResultStatus, Usage};
use crate::session::{Session, SessionManager, TurnOptions};

/// The longest a mock node may take: long enough to watch, cancel and
/// resume a run, short of holding a run slot for the pipeline timeout.
pub const MAX_MOCK_DELAY_MS: u64 = 60_000;

/// What mock agents do, per run (`options.mock`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockScript {
    /// A node's decisions, visit by visit; past the list (or for a node not
    /// named) the node answers its first decision whose edge counts no
    /// retry, which walks the pipeline forward.
    #[serde(default)]
    pub decisions: BTreeMap<String, Vec<String>>,
    /// How many malformed answers a node gives before a good one.
    #[serde(default)]
    pub fail: BTreeMap<String, u32>,
    /// How long each node takes.
    #[serde(default)]
    pub delay_ms: u64,
    /// The coverage the tester reports (1.0 by default).
    #[serde(default)]
    pub coverage: Option<f64>,
}

/// A node's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeAnswer {
    pub decision: String,
    pub writes: Map<String, Value>,
    pub usage: Usage,
}

/// The decision that walks forward: the first whose edge counts no retry.
fn forward(definition: &Definition, node: &str, spec: &NodeSpec) -> String {
    spec.decisions
        .iter()
        .find(|d| {
            definition
                .edges
                .iter()
                .any(|e| e.from == node && e.when.as_ref() == Some(*d) && e.counter.is_none())
        })
        .or(spec.decisions.first())
        .cloned()
        .unwrap_or_else(|| "DONE".into())
}

/// A mock agent's answer on its `visit` (0-based) and `attempt` of `node`.
pub async fn mock(
    definition: &Definition,
    node: &str,
    script: &MockScript,
    visit: usize,
    attempt: u32,
    cancel: &CancellationToken,
) -> Result<NodeAnswer, String> {
    let spec = &definition.nodes[node];
    if script.delay_ms > 0 {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(script.delay_ms)) => {}
            _ = cancel.cancelled() => return Err("cancelled".into()),
        }
    }
    if attempt < script.fail.get(node).copied().unwrap_or(0) {
        return Err(format!(
            "{node} (mock) answered no JSON object (simulated failure)"
        ));
    }
    let decision = script
        .decisions
        .get(node)
        .and_then(|list| list.get(visit))
        .cloned()
        .unwrap_or_else(|| forward(definition, node, spec));
    let coverage = script.coverage.unwrap_or(1.0);
    let writes = spec
        .writes
        .iter()
        .map(|field| {
            let value = match field.as_str() {
                "logs" => json!([format!("{node}: {decision}")]),
                "coverage_ratio" => json!(coverage),
                "degraded" => json!(coverage < 1.0),
                "test_review_decision" | "review_decision" => json!(decision),
                other => json!(format!("{other} by {node} (mock, visit {})", visit + 1)),
            };
            (field.clone(), value)
        })
        .collect();
    Ok(NodeAnswer {
        decision,
        writes,
        usage: Usage::default(),
    })
}

/// The kind of job of a mock node.
pub const MOCK_NODE: &str = "pipeline.mock_node";

/// A mock node's visit as a job: the pipeline by name (every replica has
/// the same definitions) and where the run stands.
#[derive(Debug, Serialize, Deserialize)]
pub struct MockNode {
    pub pipeline: String,
    pub node: String,
    pub script: MockScript,
    pub visit: usize,
    pub attempt: u32,
}

/// Answers mock nodes, whichever replica runs their pipeline.
pub struct MockNodes {
    pub definitions: Arc<BTreeMap<String, Arc<Definition>>>,
}

#[async_trait]
impl Handler for MockNodes {
    async fn run(&self, job: Bytes) -> Result<Bytes, String> {
        let job: MockNode = jobs::read(&job)?;
        let definition = self
            .definitions
            .get(&job.pipeline)
            .ok_or_else(|| format!("this replica has no pipeline {:?}", job.pipeline))?;
        if !definition.nodes.contains_key(&job.node) {
            return Err(format!(
                "the pipeline {} has no node {:?}",
                job.pipeline, job.node
            ));
        }
        // Dropping the job's future is its cancel.
        let never = CancellationToken::new();
        let answer = mock(
            definition,
            &job.node,
            &job.script,
            job.visit,
            job.attempt,
            &never,
        )
        .await?;
        jobs::answer(&answer)
    }
}

/// The message a real node's agent gets.
pub fn node_prompt(
    pipeline: &str,
    node: &str,
    spec: &NodeSpec,
    state: &Map<String, Value>,
) -> String {
    let mut prompt = format!(
        "You are the {} of the {pipeline} pipeline (node {node}).",
        spec.role.as_deref().unwrap_or(node)
    );
    if let Some(system) = &spec.system_prompt {
        prompt.push_str(&format!("\n{system}"));
    }
    prompt.push_str("\n\n");
    prompt.push_str(&fill(&spec.prompt, state));
    let decisions = if spec.decisions.is_empty() {
        "\"DONE\"".to_owned()
    } else {
        spec.decisions
            .iter()
            .map(|d| format!("\"{d}\""))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let fields: Vec<String> = spec.writes.iter().map(|f| format!("\"{f}\": …")).collect();
    prompt.push_str(&format!(
        "\n\nWhen you are done, answer with one JSON object and nothing else: \
         {{\"decision\": {decisions}{}{}}}",
        if fields.is_empty() { "" } else { ", " },
        fields.join(", ")
    ));
    prompt
}

/// `{field}` replaced by the state's value (text as is, the rest as JSON).
pub fn fill(template: &str, state: &Map<String, Value>) -> String {
    let mut out = template.to_owned();
    for field in super::definition::template_fields(template) {
        let value = match state.get(&field) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        out = out.replace(&format!("{{{field}}}"), &value);
    }
    out
}

/// Reads a real node's final answer: its decision (one the node may give)
/// and the fields it may write; anything else is a node error.
pub fn read_answer(spec: &NodeSpec, text: &str) -> Result<(String, Map<String, Value>), String> {
    let object = crate::model::lenient::object_in(text)
        .ok_or_else(|| "the answer holds no JSON object with a decision".to_owned())?;
    let decision = match object.get("decision") {
        Some(Value::String(d)) => d.trim().to_uppercase(),
        None if spec.decisions.is_empty() => "DONE".into(),
        _ => return Err("the answer's decision is missing or not a string".into()),
    };
    if !spec.decisions.is_empty() && !spec.decisions.contains(&decision) {
        return Err(format!(
            "the decision {decision:?} is not one of {}",
            spec.decisions.join(", ")
        ));
    }
    let writes = object
        .into_iter()
        .filter(|(k, _)| spec.writes.contains(k))
        .collect();
    Ok((decision, writes))
}

/// A real node: a turn of the run's agent session (one per run, so every
/// node works in the same sandbox) with the node's model and tools, its
/// events tagged with the node, run by whichever replica takes the job.
pub async fn agent(
    manager: &SessionManager,
    jobs: &dyn jobs::Jobs,
    worker: &Arc<Session>,
    parent: &Session,
    node: &str,
    spec: &NodeSpec,
    prompt: String,
) -> Result<NodeAnswer, String> {
    let options = TurnOptions {
        model: spec.model.clone(),
        allowed_tools: spec.tools.clone(),
        ..TurnOptions::default()
    };
    let done =
        crate::session::child::run_turn(manager, jobs, worker, prompt, options, parent, node)
            .await?;
    let text = match (done.status, done.text) {
        (ResultStatus::Success, Some(text)) => text,
        (status, _) => {
            let why = done.error.map(|e| format!(": {e}")).unwrap_or_default();
            return Err(format!("the node's turn ended {}{why}", status.as_str()));
        }
    };
    let (decision, writes) = read_answer(spec, &text)?;
    Ok(NodeAnswer {
        decision,
        writes,
        usage: done.usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::definition::CONNECTOR_YAML;

    #[tokio::test]
    async fn mock_agents_walk_forward_and_follow_their_script() {
        let d = Definition::parse(CONNECTOR_YAML, "connector.yaml").unwrap();
        let none = CancellationToken::new();
        let plain = MockScript::default();
        let answer = mock(&d, "test_reviewer", &plain, 0, 0, &none)
            .await
            .unwrap();
        assert_eq!(answer.decision, "VALID_PASS");
        assert_eq!(answer.writes["test_review_decision"], "VALID_PASS");
        assert_eq!(
            mock(&d, "reviewer", &plain, 0, 0, &none)
                .await
                .unwrap()
                .decision,
            "APPROVE"
        );
        let script = MockScript {
            decisions: [("reviewer".to_owned(), vec!["REJECT_CODE".to_owned()])].into(),
            fail: [("tester".to_owned(), 1)].into(),
            ..MockScript::default()
        };
        assert_eq!(
            mock(&d, "reviewer", &script, 0, 0, &none)
                .await
                .unwrap()
                .decision,
            "REJECT_CODE"
        );
        assert_eq!(
            mock(&d, "reviewer", &script, 1, 0, &none)
                .await
                .unwrap()
                .decision,
            "APPROVE"
        );
        assert!(mock(&d, "tester", &script, 0, 0, &none).await.is_err());
        assert!(mock(&d, "tester", &script, 0, 1, &none).await.is_ok());
    }

    #[test]
    fn answers_are_read_against_the_node() {
        let d = Definition::parse(CONNECTOR_YAML, "connector.yaml").unwrap();
        let spec = &d.nodes["tester"];
        let (decision, writes) = read_answer(
            spec,
            "Done. {\"decision\": \"done\", \"coverage_ratio\": 0.9, \"secret\": 1, \"tests\": \"ok\"}",
        )
        .unwrap();
        assert_eq!(decision, "DONE");
        assert_eq!(writes["coverage_ratio"], 0.9);
        assert!(!writes.contains_key("secret"));
        assert!(read_answer(spec, "no json here").is_err());
        assert!(read_answer(&d.nodes["reviewer"], "{\"decision\": \"MAYBE\"}").is_err());
        let state = json!({"connector_name": "sheets", "coverage_ratio": 0.5})
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(
            fill("{connector_name} at {coverage_ratio}", &state),
            "sheets at 0.5"
        );
        let prompt = node_prompt("connector", "reviewer", &d.nodes["reviewer"], &state);
        assert!(
            prompt.contains("\"APPROVE\" | \"REJECT_CODE\" | \"REJECT_CONTEXT\""),
            "{prompt}"
        );
    }
}
