//! What the agents of a deliberation are told, and how a judge's or a
//! voter's answer is read (leniently: small models write JSON loosely, or
//! not at all).

use std::sync::Arc;

use serde_json::{Map, Value};

/// A prompt, kept as the pieces it is made of until its call starts: a
/// deliberation's agents share the task, the constraints and each other's
/// proposals, so its pending calls hold pointers to them, not copies, and
/// only the calls running at once (the server's agent permits) hold the
/// text ([`Prompt::render`]).
#[derive(Debug, Clone)]
pub enum Prompt {
    /// An agent's system prompt: its role, the constraints (rendered once
    /// per deliberation), and that its answer is a proposal among others.
    System {
        agent_id: String,
        role: Arc<str>,
        num_agents: u32,
        constraints: Arc<str>,
    },
    /// The task; a tool-using agent's first message leads with its system
    /// prompt.
    Task {
        lead: Option<Box<Prompt>>,
        task: Arc<str>,
    },
    /// A critique round: the agent's own proposal and some of the others'
    /// (at most [`PEERS_SHOWN`]), anonymised.
    Critique {
        task: Arc<str>,
        own: Arc<str>,
        others: Vec<Arc<str>>,
    },
    /// A judge's or a voter's choice over numbered proposals.
    Choose {
        task: Arc<str>,
        proposals: Vec<Arc<str>>,
        voter: bool,
    },
    /// Text as it is.
    Text(Arc<str>),
}

/// The most other proposals a critique or a ballot shows: the agents
/// after this one, in turn. With more agents each reads a different few,
/// so a prompt's size does not grow with the deliberation's.
pub const PEERS_SHOWN: usize = 8;

/// How much of one proposal another agent's prompt shows; the rest is
/// cut, and the prompt says how much.
pub const SHOWN_BYTES: usize = 16 * 1024;

impl Prompt {
    /// The prompt's text.
    pub fn render(&self) -> String {
        match self {
            Prompt::System {
                agent_id,
                role,
                num_agents,
                constraints,
            } => system(agent_id, role, *num_agents, constraints),
            Prompt::Task { lead: None, task } => format!("Task:\n{task}"),
            Prompt::Task {
                lead: Some(lead),
                task,
            } => format!("{}\n\nTask:\n{task}", lead.render()),
            Prompt::Critique { task, own, others } => critique(task, own, others),
            Prompt::Choose {
                task,
                proposals,
                voter,
            } => choose(task, proposals, *voter),
            Prompt::Text(text) => text.to_string(),
        }
    }
}

/// The system prompt of an agent: its role, the constraints, and that its
/// answer is a proposal among others.
fn system(agent_id: &str, role: &str, num_agents: u32, constraints: &str) -> String {
    let mut prompt = format!(
        "You are {agent_id}, an agent with the role {role}. {others}Write your own proposal for \
         the task you are given and answer with the proposal itself, nothing around it.",
        others = if num_agents > 1 {
            format!(
                "{} other agents work on the same task independently. ",
                num_agents - 1
            )
        } else {
            String::new()
        }
    );
    if !constraints.is_empty() {
        prompt.push_str("\n\n");
        prompt.push_str(constraints);
    }
    prompt
}

/// At most [`SHOWN_BYTES`] of a proposal, cut on a character boundary.
fn shown(proposal: &str) -> std::borrow::Cow<'_, str> {
    match cut(proposal, SHOWN_BYTES) {
        None => proposal.into(),
        Some((kept, more)) => format!("{kept}\n[… {more} more bytes not shown]").into(),
    }
}

/// `text` past `max` bytes: its first `max` at most (cut on a character
/// boundary) and how many bytes follow; `None` when it fits. A text cut
/// once, with a note of up to 128 bytes, fits.
pub(super) fn cut(text: &str, max: usize) -> Option<(&str, usize)> {
    if text.len() <= max + 128 {
        return None;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some((&text[..end], text.len() - end))
}

/// The constraints as lines: the known keys `rubric`, `requirements` and
/// `max_iterations` each in its own words, any other key as `key: value`.
pub fn render_constraints(constraints: &Map<String, Value>) -> String {
    let mut lines = Vec::new();
    for (key, value) in constraints {
        match (key.as_str(), value) {
            ("rubric", Value::String(rubric)) => lines.push(format!("Rubric: {rubric}")),
            ("requirements", Value::Array(items)) => {
                lines.push("Requirements:".to_owned());
                lines.extend(items.iter().map(|item| format!("- {}", text(item))));
            }
            ("max_iterations", value) => {
                lines.push(format!("Take at most {} iterations.", text(value)))
            }
            (key, value) => lines.push(format!("{key}: {}", text(value))),
        }
    }
    lines.join("\n")
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A critique round: the agent's own proposal and the others',
/// anonymised, and the request to revise or keep it.
fn critique(task: &str, own: &str, others: &[Arc<str>]) -> String {
    let mut prompt = format!(
        "Task:\n{task}\n\nYour proposal:\n{own}\n\nThe other agents proposed (authors withheld):"
    );
    for (i, other) in others.iter().enumerate() {
        prompt.push_str(&format!("\n\nProposal {}:\n{}", label(i), shown(other)));
    }
    prompt.push_str(
        "\n\nWeigh them against yours. Answer with your revised proposal, or with yours \
         unchanged if it is still the best; answer with the proposal itself only.",
    );
    prompt
}

/// A judge's or a voter's prompt over numbered proposals.
fn choose(task: &str, proposals: &[Arc<str>], voter: bool) -> String {
    let mut prompt = format!("Task:\n{task}\n\nProposals:");
    for (i, proposal) in proposals.iter().enumerate() {
        prompt.push_str(&format!("\n\n[{}]\n{}", i + 1, shown(proposal)));
    }
    let who = if voter {
        "Vote for the best proposal (yours is not among them)."
    } else {
        "Choose the best proposal."
    };
    prompt.push_str(&format!(
        "\n\n{who} Answer with JSON only: {{\"choice\": <the proposal's number>, \
         \"reasoning\": \"<why, in one or two sentences>\"}}"
    ));
    prompt
}

/// The system prompt of the judge.
pub fn judge_system(role: &str) -> String {
    format!(
        "You judge the proposals of {role} agents for a task and pick the one that best does \
         what the task asks."
    )
}

/// `A`, `B`, … `Z`, `AA`, …: anonymous labels.
fn label(mut i: usize) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b'A' + (i % 26) as u8);
        if i < 26 {
            break;
        }
        i = i / 26 - 1;
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

/// A choice read from an answer: the proposal's number (1-based) and the
/// reasoning given, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub number: usize,
    pub reasoning: Option<String>,
}

/// Reads `{"choice": N, "reasoning": …}` from an answer, repaired when
/// loose; failing that, the first number in range the text names. `None`
/// when it names no proposal between 1 and `count`.
pub fn read_choice(answer: &str, count: usize) -> Option<Choice> {
    let in_range = |n: u64| (1..=count as u64).contains(&n).then_some(n as usize);
    if let Some(object) = crate::model::lenient::object_in(answer) {
        let number = match object.get("choice") {
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(s)) => first_number(s),
            _ => None,
        };
        if let Some(number) = number.and_then(in_range) {
            let reasoning = object
                .get("reasoning")
                .and_then(Value::as_str)
                .map(str::to_owned);
            return Some(Choice { number, reasoning });
        }
    }
    let number = numbers(answer).into_iter().find_map(in_range)?;
    Some(Choice {
        number,
        reasoning: None,
    })
}

fn first_number(text: &str) -> Option<u64> {
    numbers(text).into_iter().next()
}

fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty() && s.len() < 10)
        .filter_map(|s| s.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn constraints_render_by_name() {
        let constraints = json!({"rubric": "correct and short", "requirements": ["pure", "typed"],
                                 "max_iterations": 3, "language": "python"});
        let text = render_constraints(constraints.as_object().unwrap());
        assert!(text.contains("Rubric: correct and short"), "{text}");
        assert!(text.contains("- pure\n- typed"), "{text}");
        assert!(text.contains("at most 3 iterations"), "{text}");
        assert!(text.contains("language: python"), "{text}");
    }

    #[test]
    fn choices_are_read_leniently() {
        let exact = read_choice(r#"{"choice": 2, "reasoning": "shorter"}"#, 3).unwrap();
        assert_eq!(exact.number, 2);
        assert_eq!(exact.reasoning.as_deref(), Some("shorter"));
        let loose = read_choice("Sure! {choice: '3', reasoning: 'it handles n=0'", 3).unwrap();
        assert_eq!(loose.number, 3);
        assert_eq!(read_choice("I pick proposal [1].", 3).unwrap().number, 1);
        assert_eq!(read_choice(r#"{"choice": 7}"#, 3), None);
        assert_eq!(read_choice("none of them", 3), None);
        // Out of range in the JSON, in range in the prose: the prose counts.
        assert_eq!(
            read_choice(r#"{"choice": 9} but 2 is good"#, 3)
                .unwrap()
                .number,
            2
        );
    }

    #[test]
    fn labels_go_past_z() {
        assert_eq!(label(0), "A");
        assert_eq!(label(25), "Z");
        assert_eq!(label(26), "AA");
        assert_eq!(label(27), "AB");
    }

    #[test]
    fn critique_withholds_authors() {
        let prompt = critique("sort", "mine", &["theirs".into(), "another".into()]);
        assert!(prompt.contains("Proposal A:\ntheirs") && prompt.contains("Proposal B:\nanother"));
        assert!(!prompt.contains("agent-"), "{prompt}");
    }

    #[test]
    fn a_long_proposal_is_shown_cut_and_says_so() {
        let long: Arc<str> = "é".repeat(SHOWN_BYTES).into();
        let prompt = choose("t", std::slice::from_ref(&long), false);
        assert!(prompt.len() < SHOWN_BYTES + 512, "{}", prompt.len());
        assert!(prompt.contains(&format!("[… {} more bytes not shown]", SHOWN_BYTES)));
        // Its own proposal an agent sees whole.
        let own = critique("t", &long, std::slice::from_ref(&long));
        assert!(own.contains(&*long));
    }
}
