//! What a model is sent of a session's history: the history itself until
//! a compaction; after one, the summary of its last mark (as a user
//! message), then the messages from that mark's `kept_from` on, marks left
//! out.

use std::sync::Arc;

use crate::model::Message;

/// How the summary opens, so the model knows what it reads.
pub(crate) const SUMMARY_HEAD: &str = "The earlier part of this session was compacted to stay \
     within the model's context window. This is a summary of it; the conversation goes on \
     after it.";

/// The last compaction mark of a history: where it is and where the
/// messages sent after its summary start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub at: usize,
    pub kept_from: usize,
}

/// The last mark of `history`, if any.
pub(crate) fn last_mark(history: &[Message]) -> Option<Mark> {
    history
        .iter()
        .enumerate()
        .rev()
        .find_map(|(at, m)| match m {
            Message::Compacted { kept_from, .. } => Some(Mark {
                at,
                kept_from: usize::try_from(*kept_from).unwrap_or(usize::MAX).min(at),
            }),
            _ => None,
        })
}

/// The model's view of a history, kept up to date as the history grows:
/// shared with each request rather than copied for it.
pub(crate) struct View {
    mark: Option<Mark>,
    /// The view, once there is a mark (without one it is the history).
    messages: Arc<Vec<Message>>,
    /// How many of the history's messages `messages` covers.
    synced: usize,
}

impl View {
    pub(crate) fn of(history: &[Message]) -> View {
        let mark = last_mark(history);
        let mut messages = Vec::new();
        if let Some(mark) = mark
            && let Message::Compacted { summary, .. } = &history[mark.at]
        {
            messages.push(Message::User {
                content: format!("{SUMMARY_HEAD}\n\n{summary}"),
            });
            messages.extend(visible(&history[mark.kept_from..]).cloned());
        }
        View {
            mark,
            messages: Arc::new(messages),
            synced: history.len(),
        }
    }

    pub(crate) fn mark(&self) -> Option<Mark> {
        self.mark
    }

    /// The messages to send for `history` (this view's history, grown
    /// since): the history itself before any compaction.
    pub(crate) fn sync(&mut self, history: &Arc<Vec<Message>>) -> Arc<Vec<Message>> {
        // A history cut back (a rewind), or grown by a mark, is read again.
        let added = history.get(self.synced..);
        if added.is_none_or(|added| added.iter().any(is_mark)) {
            *self = View::of(history);
        }
        if self.mark.is_none() {
            self.synced = history.len();
            return Arc::clone(history);
        }
        if history.len() > self.synced {
            let added = history[self.synced..].iter().cloned();
            Arc::make_mut(&mut self.messages).extend(added);
            self.synced = history.len();
        }
        Arc::clone(&self.messages)
    }
}

fn is_mark(message: &Message) -> bool {
    matches!(message, Message::Compacted { .. })
}

/// Messages with the compaction marks left out.
pub(crate) fn visible(messages: &[Message]) -> impl Iterator<Item = &Message> + Clone {
    messages.iter().filter(|m| !is_mark(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Message {
        Message::User {
            content: text.into(),
        }
    }

    fn mark(summary: &str, kept_from: u64) -> Message {
        Message::Compacted {
            summary: summary.into(),
            kept_from,
        }
    }

    fn texts(messages: &[Message]) -> Vec<String> {
        messages
            .iter()
            .map(|m| match m {
                Message::User { content } => content.clone(),
                Message::Assistant { content, .. } => content.clone(),
                Message::Tool { content, .. } => content.clone(),
                Message::Compacted { summary, .. } => format!("MARK {summary}"),
                Message::Reasoning { text, .. } => format!("THOUGHT {text}"),
            })
            .collect()
    }

    #[test]
    fn without_a_mark_the_view_is_the_history_itself() {
        let history = Arc::new(vec![user("a"), user("b")]);
        let mut view = View::of(&history);
        let sent = view.sync(&history);
        assert!(Arc::ptr_eq(&sent, &history));
    }

    #[test]
    fn after_a_mark_the_summary_then_the_kept_messages() {
        let mut history = Arc::new(vec![user("a"), user("b"), user("c"), mark("S1", 1)]);
        let mut view = View::of(&history);
        let sent = view.sync(&history);
        let texts = texts(&sent);
        assert!(texts[0].starts_with(SUMMARY_HEAD) && texts[0].ends_with("S1"));
        assert_eq!(texts[1..], ["b", "c"]);
        drop(sent);
        Arc::make_mut(&mut history).push(user("d"));
        assert_eq!(
            super::tests::texts(&view.sync(&history))[1..],
            ["b", "c", "d"]
        );
        // A second mark keeping from after the first: the first is left
        // out of what is kept.
        Arc::make_mut(&mut history).push(mark("S2", 2));
        let mut view = View::of(&history);
        let texts = super::tests::texts(&view.sync(&history));
        assert!(texts[0].ends_with("S2"));
        assert_eq!(texts[1..], ["c", "d"]);
    }

    #[test]
    fn a_shorter_history_is_read_again() {
        let history = Arc::new(vec![user("a"), user("b"), mark("S", 1), user("c")]);
        let mut view = View::of(&history);
        let cut = Arc::new(history[..2].to_vec());
        assert!(Arc::ptr_eq(&view.sync(&cut), &cut));
        assert_eq!(view.mark(), None);
    }
}
