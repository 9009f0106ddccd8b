//! Where a compaction cuts a history: the older part is summarised, the
//! last few turns are kept as they were, and a tool call is never parted
//! from its results.

use super::estimate::message_tokens;
use super::view::Mark;
use crate::model::Message;

/// At most this many of the last turns (user messages and what followed)
/// are kept whole.
pub(crate) const KEEP_TURNS: usize = 3;

/// `history[from..to]` is summarised (after the last mark's summary, if
/// any); `history[to..]` is sent as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    pub from: usize,
    pub to: usize,
}

/// The cut that keeps the most of the last [`KEEP_TURNS`] turns within
/// `keep_tokens`, at the start of a turn; when the last turn alone is
/// over, inside it at an assistant message (whose calls' results follow
/// it), keeping as much of it as fits, or else only its last message and
/// what follows. A kept part never starts at a tool result. `None` when
/// nothing before the kept part is left to summarise.
pub(crate) fn choose(history: &[Message], mark: Option<Mark>, keep_tokens: u64) -> Option<Cut> {
    let from = mark.map_or(0, |m| m.kept_from);
    let (mut kept, mut turns) = (0, 0);
    let (mut at_turn, mut in_turn, mut least) = (None, None, None);
    for i in (from + 1..history.len()).rev() {
        let message = &history[i];
        match message {
            Message::Compacted { .. } => continue,
            Message::Tool { .. } => {
                kept += message_tokens(message);
                continue;
            }
            _ => kept += message_tokens(message),
        }
        least.get_or_insert(i);
        if kept > keep_tokens {
            break;
        }
        if matches!(message, Message::User { .. }) {
            at_turn = Some(i);
            turns += 1;
            if turns == KEEP_TURNS {
                break;
            }
        } else if at_turn.is_none() {
            in_turn = Some(i);
        }
    }
    let to = at_turn.or(in_turn).or(least)?;
    let summarised = history[from..to]
        .iter()
        .any(|m| !matches!(m, Message::Compacted { .. }));
    summarised.then_some(Cut { from, to })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolCall;

    fn user(text: &str) -> Message {
        Message::User {
            content: text.into(),
        }
    }

    fn calls(id: &str) -> Message {
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: "Bash".into(),
                arguments: serde_json::json!({}),
            }],
        }
    }

    fn result(id: &str, bytes: usize) -> Message {
        Message::Tool {
            tool_call_id: id.into(),
            name: "Bash".into(),
            content: "x".repeat(bytes),
            is_error: false,
        }
    }

    fn answer() -> Message {
        Message::Assistant {
            content: "done".into(),
            tool_calls: vec![],
        }
    }

    /// Five turns of prompt, call, 300-byte result, answer.
    fn turns(n: usize) -> Vec<Message> {
        (0..n)
            .flat_map(|i| {
                let id = format!("c{i}");
                [user("go"), calls(&id), result(&id, 300), answer()]
            })
            .collect()
    }

    #[test]
    fn the_last_turns_are_kept_within_the_budget() {
        let history = turns(5);
        // Plenty of room: the last three turns are kept.
        assert_eq!(choose(&history, None, 10_000), Some(Cut { from: 0, to: 8 }));
        // Room for about one turn (each is about 130 tokens).
        assert_eq!(choose(&history, None, 150), Some(Cut { from: 0, to: 16 }));
    }

    #[test]
    fn a_call_is_never_parted_from_its_result() {
        // One long turn: prompt, then calls whose results are large.
        let mut history = vec![user("task")];
        for i in 0..6 {
            let id = format!("c{i}");
            history.extend([calls(&id), result(&id, 3000)]);
        }
        let cut = choose(&history, None, 2500).unwrap();
        assert!(matches!(history[cut.to], Message::Assistant { .. }));
        // Even when no whole call fits, the last one is kept with its result.
        let cut = choose(&history, None, 10).unwrap();
        assert_eq!(cut.to, history.len() - 2);
    }

    #[test]
    fn after_a_mark_only_what_it_kept_is_cut_again() {
        let mut history = turns(5);
        history.push(Message::Compacted {
            summary: "S".into(),
            kept_from: 12,
        });
        history.extend(turns(2));
        let cut = choose(&history, super::super::view::last_mark(&history), 10_000).unwrap();
        assert_eq!(cut.from, 12);
        assert!(cut.to > 12);
        // Nothing before the kept part: nothing to summarise.
        let short = vec![user("only")];
        assert_eq!(choose(&short, None, 10), None);
    }
}
