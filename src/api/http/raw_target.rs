//! Request targets as clients send them.
//!
//! NATS users write subjects as they are (`sync.>`), and curl, Python's
//! urllib and a browser's `fetch` send a literal `>` in a query unencoded;
//! some clients send non-ASCII bytes raw too. The URI parser under the
//! HTTP server refuses `<`, `>`, `"` and `` ` `` there, and bytes that are
//! not UTF-8, before any route runs. [`Targets`] reads an HTTP/1
//! connection's bytes as they come in and percent-encodes those in each
//! request line's target, which means the same to every route (queries
//! and paths are percent-decoded when read); bodies pass untouched.
//! Control characters stay as they are: a target holding one is
//! malformed, not merely unencoded, and is refused (with the JSON error,
//! see `refusal`). Whatever it cannot follow for certain (HTTP/2, a
//! chunked body, an upgrade, a line past its bound) it passes through
//! unchanged from there on, which is what the connection got before.

/// What the reader is in.
#[derive(Debug)]
enum State {
    /// Before or in a request line's method (`len` bytes of it so far).
    Method { len: usize, pri: bool },
    /// In the request target, held up to the space that ends it.
    Target(Vec<u8>),
    /// The rest of the request line.
    Line,
    /// In the headers; `line` holds the current one.
    Headers(Headers),
    /// In a body with `left` bytes to come.
    Body { left: u64 },
    /// Everything as it comes.
    Passthrough,
}

#[derive(Debug, Default)]
struct Headers {
    line: Vec<u8>,
    length: u64,
    chunked: bool,
    upgrade: bool,
}

/// The longest header line followed; a longer one ends the rewriting.
const MAX_LINE: usize = 16 * 1024;
/// The longest method.
const MAX_METHOD: usize = 32;
/// The longest target held; past it the bytes pass as they came, and the
/// parser refuses the target as too long (its bound is 65,534 bytes).
const MAX_TARGET: usize = 64 * 1024;

/// Rewrites the targets of one connection's requests.
#[derive(Debug)]
pub(super) struct Targets {
    state: State,
    http2: bool,
}

impl Default for Targets {
    fn default() -> Self {
        Targets {
            state: State::Method { len: 0, pri: false },
            http2: false,
        }
    }
}

impl Targets {
    /// Whether every later byte passes as it is.
    pub(super) fn is_passthrough(&self) -> bool {
        matches!(self.state, State::Passthrough)
    }

    /// Whether the connection opened with HTTP/2's preface.
    pub(super) fn is_http2(&self) -> bool {
        self.http2
    }

    /// Appends `input`, rewritten, to `out`.
    pub(super) fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut at = 0;
        while at < input.len() {
            match &mut self.state {
                State::Passthrough => {
                    out.extend_from_slice(&input[at..]);
                    return;
                }
                State::Body { left } => {
                    let take = (input.len() - at).min(usize::try_from(*left).unwrap_or(usize::MAX));
                    out.extend_from_slice(&input[at..at + take]);
                    at += take;
                    *left -= take as u64;
                    if *left == 0 {
                        self.state = State::Method { len: 0, pri: false };
                    }
                }
                State::Method { len, pri } => {
                    let byte = input[at];
                    out.push(byte);
                    at += 1;
                    match byte {
                        // Blank lines before a request are allowed.
                        b'\r' | b'\n' if *len == 0 => {}
                        // HTTP/2's preface (`PRI * HTTP/2.0`).
                        b' ' if *pri => {
                            self.http2 = true;
                            self.state = State::Passthrough;
                        }
                        b' ' if *len > 0 => self.state = State::Target(Vec::new()),
                        b'A'..=b'Z' | b'a'..=b'z' | b'-' | b'_' if *len < MAX_METHOD => {
                            *pri = (*len == 0 && byte == b'P')
                                || (*pri
                                    && ((*len == 1 && byte == b'R')
                                        || (*len == 2 && byte == b'I')));
                            *len += 1;
                        }
                        _ => self.state = State::Passthrough,
                    }
                }
                State::Target(target) => {
                    let byte = input[at];
                    at += 1;
                    match byte {
                        b' ' => {
                            encode(target, out);
                            out.push(byte);
                            self.state = State::Line;
                        }
                        b'\r' | b'\n' => {
                            // HTTP/0.9 or garbage: not ours to follow.
                            out.extend_from_slice(target);
                            out.push(byte);
                            self.state = State::Passthrough;
                        }
                        _ if target.len() >= MAX_TARGET => {
                            out.extend_from_slice(target);
                            out.push(byte);
                            self.state = State::Passthrough;
                        }
                        _ => target.push(byte),
                    }
                }
                State::Line => {
                    let byte = input[at];
                    out.push(byte);
                    at += 1;
                    if byte == b'\n' {
                        self.state = State::Headers(Headers::default());
                    }
                }
                State::Headers(headers) => {
                    let byte = input[at];
                    out.push(byte);
                    at += 1;
                    if byte != b'\n' {
                        headers.line.push(byte);
                        if headers.line.len() > MAX_LINE {
                            self.state = State::Passthrough;
                        }
                        continue;
                    }
                    let line = std::mem::take(&mut headers.line);
                    let line = line.strip_suffix(b"\r").unwrap_or(&line);
                    if !line.is_empty() {
                        if !headers.read(line) {
                            self.state = State::Passthrough;
                        }
                        continue;
                    }
                    // The end of the headers.
                    self.state = if headers.upgrade || headers.chunked {
                        State::Passthrough
                    } else if headers.length > 0 {
                        State::Body {
                            left: headers.length,
                        }
                    } else {
                        State::Method { len: 0, pri: false }
                    };
                }
            }
        }
    }
}

/// Appends `target` to `out` with what the URI parser refuses but means
/// one thing percent-encoded: `<`, `>`, `"`, `` ` `` and each byte of a
/// sequence that is not UTF-8. UTF-8 passes as it is (the parser takes
/// it), and so do control characters, which no client sends unencoded in
/// a well-formed target.
fn encode(target: &[u8], out: &mut Vec<u8>) {
    for chunk in target.utf8_chunks() {
        for byte in chunk.valid().bytes() {
            match byte {
                b'<' | b'>' | b'"' | b'`' => percent(byte, out),
                _ => out.push(byte),
            }
        }
        for byte in chunk.invalid() {
            percent(*byte, out);
        }
    }
}

fn percent(byte: u8, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.extend_from_slice(&[
        b'%',
        HEX[usize::from(byte >> 4)],
        HEX[usize::from(byte & 0xF)],
    ]);
}

impl Headers {
    /// Notes what a header line says of the body; false when it cannot be
    /// followed for certain.
    fn read(&mut self, line: &[u8]) -> bool {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            return false;
        };
        let name = line[..colon].to_ascii_lowercase();
        let value = String::from_utf8_lossy(&line[colon + 1..]);
        let value = value.trim();
        match name.as_slice() {
            b"content-length" => match value.parse() {
                Ok(length) => self.length = length,
                Err(_) => return false,
            },
            b"transfer-encoding" => self.chunked = true,
            b"upgrade" => self.upgrade = true,
            _ => {}
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite_in_pieces(input: &[u8], piece: usize) -> Vec<u8> {
        let mut targets = Targets::default();
        let mut out = Vec::new();
        for chunk in input.chunks(piece) {
            targets.feed(chunk, &mut out);
        }
        out
    }

    fn rewrite(input: &[u8]) -> Vec<u8> {
        let whole = rewrite_in_pieces(input, input.len().max(1));
        for piece in [1, 2, 3, 7] {
            assert_eq!(
                rewrite_in_pieces(input, piece),
                whole,
                "in pieces of {piece}"
            );
        }
        whole
    }

    #[test]
    fn raw_brackets_in_targets_are_encoded_and_bodies_left_alone() {
        let input = b"GET /bus/subscribe?subjects=sync.>&since=all HTTP/1.1\r\nHost: h\r\n\r\n\
                      POST /x?q=\"a\" HTTP/1.1\r\nContent-Length: 10\r\n\r\n{\"a\":\"<>\"}\
                      GET /p/`x`?s=a.*,sync/> HTTP/1.1\r\n\r\n";
        let expected =
            b"GET /bus/subscribe?subjects=sync.%3E&since=all HTTP/1.1\r\nHost: h\r\n\r\n\
                         POST /x?q=%22a%22 HTTP/1.1\r\nContent-Length: 10\r\n\r\n{\"a\":\"<>\"}\
                         GET /p/%60x%60?s=a.*,sync/%3E HTTP/1.1\r\n\r\n";
        assert_eq!(
            String::from_utf8_lossy(&rewrite(input)),
            String::from_utf8_lossy(expected)
        );
        let parsed: http::Uri = "/bus/subscribe?subjects=sync.%3E&since=all"
            .parse()
            .unwrap();
        assert_eq!(parsed.query(), Some("subjects=sync.%3E&since=all"));
    }

    #[test]
    fn what_it_cannot_follow_passes_unchanged() {
        for input in [
            &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n<>"[..],
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n<>a\r\n0\r\n\r\nGET /?a=> HTTP/1.1\r\n\r\n",
            b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n<<>>",
            b"POST /x HTTP/1.1\r\nContent-Length: nope\r\n\r\n<>",
        ] {
            let out = rewrite(input);
            let unchanged_from = out.windows(2).position(|w| w == b"<>" || w == b"=>");
            assert!(unchanged_from.is_some(), "{}", String::from_utf8_lossy(&out));
            assert_eq!(out.len(), input.len(), "{}", String::from_utf8_lossy(&out));
        }
        let mut targets = Targets::default();
        targets.feed(b"PRI * HTTP/2.0\r\n", &mut Vec::new());
        assert!(targets.is_passthrough() && targets.is_http2());
        let mut targets = Targets::default();
        targets.feed(
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            &mut Vec::new(),
        );
        assert!(targets.is_passthrough() && !targets.is_http2());
    }

    #[test]
    fn bytes_that_are_not_utf8_are_encoded_and_utf8_and_controls_kept() {
        let input = b"GET /a/{b|c}^\xc3\xa9?q=\xff\xc3x&r=\xe2\x82\xac<\x01 HTTP/1.1\r\n\r\n";
        let expected = b"GET /a/{b|c}^\xc3\xa9?q=%FF%C3x&r=\xe2\x82\xac%3C\x01 HTTP/1.1\r\n\r\n";
        assert_eq!(rewrite(input), expected);
        let parsed: http::Uri = "/a?q=%FF%C3x".parse().unwrap();
        assert_eq!(parsed.query(), Some("q=%FF%C3x"));
    }

    #[test]
    fn a_target_past_its_bound_passes_as_it_came() {
        let target = format!("/{}>", "a".repeat(MAX_TARGET));
        let input = format!("GET {target} HTTP/1.1\r\n\r\nGET /> HTTP/1.1\r\n\r\n");
        let mut targets = Targets::default();
        let mut out = Vec::new();
        targets.feed(input.as_bytes(), &mut out);
        assert_eq!(out, input.as_bytes());
        assert!(targets.is_passthrough());
    }
}
