//! Words for people where a library speaks to programmers: the name a
//! typo meant, and serde's Rust type names in plain words. A leaf module:
//! it imports nothing of Conclave, so the configuration and the request
//! checks share it.

/// The known name a typo most likely meant: the nearest by edits, when it
/// is at most two edits (one for short names) away.
pub fn closest<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let key = key.to_ascii_lowercase();
    let limit = if key.chars().count() <= 4 { 1 } else { 2 };
    known
        .map(|name| (strsim::levenshtein(&key, name), name))
        .filter(|(distance, _)| *distance <= limit)
        .min()
        .map(|(_, name)| name)
}

/// serde's message with its Rust type names in words (`expected u32` →
/// `expected a whole number from 0 to 4294967295`): a caller of a JSON API
/// should not need to know Rust's integer types.
pub fn plain_types(message: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        (
            "expected u32",
            "expected a whole number from 0 to 4294967295",
        ),
        ("expected u64", "expected a whole number of 0 or more"),
        ("expected usize", "expected a whole number of 0 or more"),
        ("expected i32", "expected a whole number"),
        ("expected i64", "expected a whole number"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
    ];
    WORDS
        .iter()
        .find(|(rust, _)| {
            message
                .find(rust)
                .is_some_and(|at| !message[at + rust.len()..].starts_with(char::is_alphanumeric))
        })
        .map_or_else(
            || message.to_string(),
            |(rust, words)| message.replacen(rust, words, 1),
        )
}

/// serde's "unknown field `promt`, expected one of `role`, `prompt`"
/// with the name the typo most likely meant added: "…; did you mean
/// `prompt`?". Any other message as it is.
pub fn suggested(message: &str) -> String {
    let Some((_, rest)) = message.split_once("unknown field `") else {
        return message.to_string();
    };
    let Some((name, rest)) = rest.split_once('`') else {
        return message.to_string();
    };
    let Some((_, expected)) = rest.split_once("expected ") else {
        return message.to_string();
    };
    // The names are the quoted words of the list, up to its end.
    let list = expected.split(" at line ").next().unwrap_or(expected);
    let known = list.split('`').skip(1).step_by(2);
    match closest(name, known) {
        Some(near) => format!("{message}; did you mean `{near}`?"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_name_within_two_edits() {
        let known = ["max_turns", "model", "store"];
        assert_eq!(
            closest("max_turnz", known.iter().copied()),
            Some("max_turns")
        );
        assert_eq!(closest("stor", known.iter().copied()), Some("store"));
        assert_eq!(closest("colour", known.iter().copied()), None);
    }

    #[test]
    fn an_unknown_field_gets_the_name_it_meant() {
        let serde = "nodes.greet: unknown field `promt`, expected one of `role`, `prompt`, \
                     `tools` at line 6 column 5";
        assert_eq!(suggested(serde), format!("{serde}; did you mean `prompt`?"));
        let far = "unknown field `colour`, expected `role` or `prompt`";
        assert_eq!(suggested(far), far);
        assert_eq!(
            suggested("missing field `prompt`"),
            "missing field `prompt`"
        );
    }

    #[test]
    fn rust_type_names_become_words() {
        assert_eq!(
            plain_types("expected u64"),
            "expected a whole number of 0 or more"
        );
        assert_eq!(
            plain_types("invalid type: string \"x\", expected u32"),
            "invalid type: string \"x\", expected a whole number from 0 to 4294967295"
        );
        assert_eq!(plain_types("expected u8x"), "expected u8x");
        assert_eq!(plain_types("expected a string"), "expected a string");
    }
}
