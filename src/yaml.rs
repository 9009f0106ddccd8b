//! Bounds on YAML before it is parsed: its size and how deep it nests.
//!
//! The YAML parser reads a whole document into events before anything
//! checks its depth, and deeply nested flow collections (`a: [[[[…`) cost
//! it time that grows with the square of the depth: 200,000 brackets took
//! 46 s. [`check`] scans the text once, in linear time, and refuses it
//! before the parser sees it.
//!
//! The scan estimates the nesting from the text: block collections by
//! their indentation (each deeper column two levels, as a mapping and a
//! sequence may share one, and each compact `- ` or `? ` a column of its
//! own, where what follows it starts), flow collections by their brackets,
//! skipping
//! comments, quoted scalars and block scalars (`|`, `>`). Brackets inside
//! a plain scalar of a block collection (`title: see [docs]`) open
//! nothing, as in YAML itself. The estimate never counts less than the
//! parser will nest, so a document it passes cannot nest deeper.

use std::fmt;

/// The deepest a document the server reads may nest. Pipeline
/// definitions and LiteLLM configs need fewer than ten levels.
pub const MAX_DEPTH: usize = 64;

/// Why a document was refused before parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Larger than `limit` bytes.
    TooLarge { bytes: usize, limit: usize },
    /// Nests deeper than [`MAX_DEPTH`], first at `line` (1-based).
    TooDeep { line: usize },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::TooLarge { bytes, limit } => {
                write!(f, "the document is {bytes} bytes; the limit is {limit}")
            }
            Refused::TooDeep { line } => write!(
                f,
                "the document nests deeper than {MAX_DEPTH} levels (line {line})"
            ),
        }
    }
}

/// Refuses `text` when it is larger than `max_bytes` or nests deeper than
/// [`MAX_DEPTH`].
pub fn check(text: &str, max_bytes: usize) -> Result<(), Refused> {
    if text.len() > max_bytes {
        return Err(Refused::TooLarge {
            bytes: text.len(),
            limit: max_bytes,
        });
    }
    let mut scan = Scan::default();
    for (number, line) in text.lines().enumerate() {
        if scan.line(line) > MAX_DEPTH {
            return Err(Refused::TooDeep { line: number + 1 });
        }
    }
    Ok(())
}

/// Where the scan is between lines.
#[derive(Default)]
struct Scan {
    /// The indents of the open block collections, innermost last.
    indents: Vec<usize>,
    /// Open flow collections (`[`, `{`).
    flow: usize,
    /// Inside a quoted scalar that goes on past the line end.
    quote: Option<u8>,
    /// Inside a block scalar: lines indented more than this belong to it.
    block_scalar: Option<usize>,
}

impl Scan {
    /// How deep the open block collections may nest: two levels a column,
    /// as a mapping's value may be a sequence at the mapping's own column
    /// (`a:` then `- b`); no other collection shares one.
    fn block_depth(&self) -> usize {
        2 * self.indents.len()
    }

    /// Reads one line and answers the deepest nesting seen on it.
    fn line(&mut self, line: &str) -> usize {
        let bytes = line.as_bytes();
        let indent = bytes.iter().take_while(|&&b| b == b' ').count();
        let blank = bytes[indent..].iter().all(|b| b.is_ascii_whitespace());
        if let Some(parent) = self.block_scalar {
            if blank || indent > parent {
                return self.block_depth();
            }
            self.block_scalar = None;
        }
        if blank && self.quote.is_none() {
            return self.block_depth() + self.flow;
        }
        let mut at = 0;
        if self.quote.is_none() && self.flow == 0 {
            while self.indents.last().is_some_and(|&top| top > indent) {
                self.indents.pop();
            }
            if self.indents.last().is_none_or(|&top| top < indent) {
                self.indents.push(indent);
            }
            at = indent;
        }
        let mut deepest = self.block_depth() + self.flow;
        // Whether a scalar or collection may start here: a bracket there
        // opens a flow collection (inside one, any bracket does), a quote
        // a quoted scalar (anywhere else it is a plain scalar's text).
        let mut value_start = true;
        // What came last was a quoted scalar or a flow collection: in a
        // flow collection, a `:` right after it separates a key from its
        // value without a space (`{"a":"b"}`).
        let mut json_key = false;
        while at < bytes.len() {
            let byte = bytes[at];
            if let Some(quote) = self.quote {
                match byte {
                    b'\\' if quote == b'"' => at += 1,
                    b'\'' if quote == b'\'' && bytes.get(at + 1) == Some(&b'\'') => at += 1,
                    _ if byte == quote => self.quote = None,
                    _ => {}
                }
                at += 1;
                continue;
            }
            let after_space = at == 0 || bytes[at - 1] == b' ' || bytes[at - 1] == b'\t';
            let was_json_key = std::mem::take(&mut json_key);
            match byte {
                b'#' if after_space => break,
                b'"' | b'\'' if value_start => {
                    self.quote = Some(byte);
                    value_start = false;
                    json_key = true;
                }
                b'[' | b'{' if value_start || self.flow > 0 => {
                    self.flow += 1;
                    value_start = true;
                }
                b']' | b'}' if self.flow > 0 => {
                    self.flow -= 1;
                    value_start = false;
                    json_key = true;
                }
                b',' if self.flow > 0 => value_start = true,
                b':' if was_json_key && self.flow > 0 => value_start = true,
                // `- ` and `? ` are indicators where a value may start; in
                // the middle of a plain scalar (`a- b`) they are its text.
                b'-' | b'?' | b':'
                    if (byte == b':' || value_start)
                        && bytes.get(at + 1).is_none_or(|b| *b == b' ' || *b == b'\t') =>
                {
                    if byte != b':' && self.flow == 0 {
                        // A compact entry: what follows it on the line
                        // (`- a:`) is a collection at its own column,
                        // which deeper lines below nest in.
                        let mut column = at + 1;
                        while bytes.get(column) == Some(&b' ') {
                            column += 1;
                        }
                        self.indents.push(column);
                    }
                    value_start = true;
                }
                b'|' | b'>' if value_start && self.flow == 0 => {
                    // The rest of the line holds only indicators and a
                    // comment; the following lines are the scalar's text.
                    self.block_scalar = Some(indent);
                    break;
                }
                b' ' | b'\t' => json_key = was_json_key,
                b'&' | b'!' if value_start => {
                    // An anchor or a tag before the value: skip its name.
                    while at + 1 < bytes.len() && bytes[at + 1] != b' ' {
                        at += 1;
                    }
                }
                _ => value_start = false,
            }
            deepest = deepest.max(self.block_depth() + self.flow);
            at += 1;
        }
        deepest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: usize = 1 << 20;

    #[test]
    fn ordinary_documents_pass() {
        for text in [
            crate::pipeline::CONNECTOR_YAML,
            "a: 1\nb:\n  c: [1, 2, {d: 3}]\n  e:\n    - f\n    - - g\n",
            "title: see [docs] and {this}\nnote: 'it''s [ok'\n",
            "text: |\n  [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n  more\nnext: 1\n",
            "q: \"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"\n",
            "# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n",
        ] {
            assert_eq!(check(text, BIG), Ok(()), "{text}");
        }
    }

    #[test]
    fn deep_flow_block_and_compact_nesting_are_refused_in_linear_time() {
        let flow = format!("a: {}", "[".repeat(200_000));
        assert_eq!(check(&flow, BIG), Err(Refused::TooDeep { line: 1 }));
        let mapping = format!("a: {}", "{b: ".repeat(100));
        assert!(check(&mapping, BIG).is_err());
        let block: String = (0..100)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        assert_eq!(check(&block, BIG), Err(Refused::TooDeep { line: 33 }));
        let compact = format!("{}x\n", "- ".repeat(100));
        assert!(check(&compact, BIG).is_err());
        // Across lines, and closed ones do not count.
        let lines = format!("a: {}\n", "[\n".repeat(70));
        assert!(check(&lines, BIG).is_err());
        let closed = format!("a: [{}[1]]\n", "[1], ".repeat(1000));
        assert_eq!(check(&closed, BIG), Ok(()));
    }

    #[test]
    fn a_quote_inside_a_plain_scalar_opens_nothing() {
        // The quote is the plain scalar's text: the brackets after it nest.
        let attack = format!("x: [a'b, {}", "[".repeat(131_000));
        let started = std::time::Instant::now();
        assert_eq!(check(&attack, BIG), Err(Refused::TooDeep { line: 1 }));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        let double = format!("x: [a\"b, {}", "[".repeat(1000));
        assert!(check(&double, BIG).is_err());
        let mapping = format!("x: {{k: v'w, {}", "{a: ".repeat(100));
        assert!(check(&mapping, BIG).is_err());
        // Quotes that start a scalar still hide what is inside them, with
        // a JSON-like key's adjacent `:` too.
        let quoted = format!(
            "x: [a, 'b{}', {{\"k\":\"]]{}\"}}]\n",
            "[".repeat(100),
            "[".repeat(100)
        );
        assert_eq!(check(&quoted, BIG), Ok(()));
        // A `]` inside a quoted value does not close what is open.
        let closed_in_quote = format!("x: [{{\"k\":\"{}\"}}, {}", "]".repeat(10), "[".repeat(100));
        assert!(check(&closed_in_quote, BIG).is_err());
    }

    /// The deepest nesting the scan estimates for `text`.
    fn scanned_depth(text: &str) -> usize {
        let mut scan = Scan::default();
        text.lines().map(|line| scan.line(line)).max().unwrap_or(0)
    }

    /// How deep the parser nests `value`: each collection one level.
    fn parsed_depth(value: &yaml_serde::Value) -> usize {
        match value {
            yaml_serde::Value::Sequence(items) => {
                1 + items.iter().map(parsed_depth).max().unwrap_or(0)
            }
            yaml_serde::Value::Mapping(map) => {
                1 + map
                    .iter()
                    .map(|(k, v)| parsed_depth(k).max(parsed_depth(v)))
                    .max()
                    .unwrap_or(0)
            }
            yaml_serde::Value::Tagged(tagged) => parsed_depth(&tagged.value),
            _ => 0,
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20000))]

        /// Whatever the parser reads, the scan estimates at least as deep
        /// (documents built of the tokens that open, close and hide
        /// nesting; no aliases, which repeat a node without nesting it).
        #[test]
        fn the_scan_never_counts_less_than_the_parser_nests(
            tokens in proptest::collection::vec(proptest::sample::select(vec![
                "[", "]", "{", "}", ",", ", ", "'", "\"", "''", "a", "b'c", " ", ": ", ":",
                "\n", "\n  ", "\n    ", "- ", "? ", "#", " #", "\\", "|", ">", "&x ", "!t ",
            ]), 0..48)
        ) {
            let text: String = tokens.concat();
            if let Ok(value) = yaml_serde::from_str::<yaml_serde::Value>(&text) {
                let parsed = parsed_depth(&value);
                let scanned = scanned_depth(&text);
                proptest::prop_assert!(
                    scanned >= parsed,
                    "scan {} < parser {} for {:?}", scanned, parsed, text
                );
            }
        }
    }

    #[test]
    fn size_is_checked_first() {
        assert_eq!(
            check("a: 1\n", 3),
            Err(Refused::TooLarge { bytes: 5, limit: 3 })
        );
    }

    #[test]
    fn whatever_passes_parses_within_the_parsers_own_limit() {
        // 60 flow levels pass the scan and the parser reads them.
        let text = format!("a: {}1{}", "[".repeat(60), "]".repeat(60));
        assert_eq!(check(&text, BIG), Ok(()));
        let value: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
        assert!(value.get("a").is_some());
    }
}
