//! Subjects and the patterns that select them.
//!
//! A subject is tokens separated by `.` or `/` (`agent.response.completed`,
//! `sync/weights_ready`); the two separators are the same to the bus, so
//! `sync/weights_ready` and `sync.weights_ready` are one subject with one
//! `seq`. A pattern may use `*` for exactly one token and `>` as its last
//! token for one or more.

use std::fmt;

/// Longest subject or pattern, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid subject {subject:?}: {reason}")]
pub struct SubjectError {
    pub subject: String,
    pub reason: &'static str,
}

fn is_separator(c: char) -> bool {
    c == '.' || c == '/'
}

fn tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(is_separator)
}

/// Checks the characters and tokens common to subjects and patterns.
fn check(text: &str) -> Result<(), SubjectError> {
    let fail = |reason| {
        Err(SubjectError {
            subject: text.chars().take(MAX_SUBJECT_BYTES).collect(),
            reason,
        })
    };
    if text.is_empty() {
        return fail("it is empty");
    }
    if text.len() > MAX_SUBJECT_BYTES {
        return fail("it is longer than 256 bytes");
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return fail("it contains whitespace or a control character");
    }
    if tokens(text).any(str::is_empty) {
        return fail("it has an empty token (a leading, trailing or doubled separator)");
    }
    Ok(())
}

/// A subject messages are published to: no wildcards.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subject {
    /// As the publisher wrote it.
    written: String,
    /// With `.` for every separator: the identity of the subject.
    stream: String,
}

impl Subject {
    pub fn parse(text: &str) -> Result<Subject, SubjectError> {
        check(text)?;
        if tokens(text).any(|t| t.contains(['*', '>'])) {
            return Err(SubjectError {
                subject: text.to_owned(),
                reason: "a published subject cannot contain the wildcards * or >",
            });
        }
        Ok(Subject {
            written: text.to_owned(),
            stream: tokens(text).collect::<Vec<_>>().join("."),
        })
    }

    /// Rebuilds a subject read back from the store.
    pub(crate) fn from_parts(written: String, stream: String) -> Subject {
        Subject { written, stream }
    }

    pub fn as_str(&self) -> &str {
        &self.written
    }

    /// The subject with `.` separators, under which its `seq` counts.
    pub fn stream(&self) -> &str {
        &self.stream
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(String),
    /// `*`: one token.
    One,
    /// `>`: one or more tokens, last only.
    Rest,
}

/// A subject pattern with `*` and `>` wildcards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    written: String,
    tokens: Vec<Token>,
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, SubjectError> {
        check(text)?;
        let fail = |reason| {
            Err(SubjectError {
                subject: text.to_owned(),
                reason,
            })
        };
        let parts: Vec<&str> = tokens(text).collect();
        let mut parsed = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            parsed.push(match *part {
                "*" => Token::One,
                ">" if i + 1 == parts.len() => Token::Rest,
                ">" => return fail("> may only be the last token"),
                p if p.contains(['*', '>']) => {
                    return fail("a wildcard must be a whole token (a.*.c, a.>)");
                }
                p => Token::Literal(p.to_owned()),
            });
        }
        Ok(Pattern {
            written: text.to_owned(),
            tokens: parsed,
        })
    }

    /// Patterns separated by commas (`a.*,b`), at least one.
    pub fn parse_list(text: &str) -> Result<Vec<Pattern>, SubjectError> {
        text.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(Pattern::parse)
            .collect::<Result<Vec<_>, _>>()
            .and_then(|patterns| {
                if patterns.is_empty() {
                    Err(SubjectError {
                        subject: text.to_owned(),
                        reason: "no subject given",
                    })
                } else {
                    Ok(patterns)
                }
            })
    }

    pub fn as_str(&self) -> &str {
        &self.written
    }

    /// Whether the subject whose stream (`.`-separated) is given matches.
    pub fn matches_stream(&self, stream: &str) -> bool {
        let mut subject = stream.split('.');
        for token in &self.tokens {
            match (token, subject.next()) {
                (Token::Rest, Some(_)) => return true,
                (Token::One, Some(_)) => {}
                (Token::Literal(want), Some(got)) if want == got => {}
                _ => return false,
            }
        }
        subject.next().is_none()
    }

    pub fn matches(&self, subject: &Subject) -> bool {
        self.matches_stream(subject.stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, subject: &str) -> bool {
        Pattern::parse(pattern)
            .unwrap()
            .matches(&Subject::parse(subject).unwrap())
    }

    #[test]
    fn both_separators_name_one_subject() {
        let slash = Subject::parse("sync/weights_ready").unwrap();
        let dot = Subject::parse("sync.weights_ready").unwrap();
        assert_eq!(slash.stream(), dot.stream());
        assert_eq!(slash.as_str(), "sync/weights_ready");
        assert!(matches("sync.>", "sync/weights_ready"));
        assert!(matches("sync/*", "sync.weights_ready"));
        assert!(matches("inference/results/*", "inference.results/shared"));
        assert!(matches("sync/weights_ready", "sync.weights_ready"));
    }

    #[test]
    fn wildcards_take_one_token_or_the_rest() {
        assert!(matches("agent.response.*", "agent.response.completed"));
        assert!(!matches("agent.response.*", "agent.response"));
        assert!(!matches(
            "agent.response.*",
            "agent.response.completed.late"
        ));
        assert!(matches("agent.>", "agent.response.completed"));
        assert!(matches("agent.>", "agent.x"));
        assert!(!matches("agent.>", "agent"));
        assert!(matches("*.response.>", "agent.response.failed"));
        assert!(!matches("a.b", "a.c"));
        assert!(!matches("a.b", "a.b.c"));
    }

    #[test]
    fn bad_subjects_and_patterns_say_why() {
        for bad in [
            "",
            "a..b",
            ".a",
            "a/",
            "a b",
            "a.*",
            "a.>",
            &"x".repeat(257),
        ] {
            assert!(Subject::parse(bad).is_err(), "{bad:?}");
        }
        for bad in ["a.>.b", "a.b*", "a.>x", "", "a//b"] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?}");
        }
        let err = Pattern::parse("a.>.b").unwrap_err();
        assert!(err.to_string().contains("last token"), "{err}");
        assert!(Pattern::parse_list(" , ").is_err());
        assert_eq!(Pattern::parse_list("a.*, b/c").unwrap().len(), 2);
    }
}
