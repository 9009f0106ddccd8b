//! Secrets a sandbox is given in its environment, and the [`Scrubber`]
//! that keeps their values out of everything a tool returns.
//!
//! A secret reaches a sandbox only through `options.sandbox.env` (`{VAR:
//! {secret: NAME}}`). Whatever a tool then prints or reads is scrubbed
//! before the model, the event log, an MCP client or a trace sees it:
//! the value, its JSON-escaped, URL-encoded and base64 forms (base64 at
//! each of the three alignments a value can have inside a longer encoded
//! text, standard and URL-safe alphabets) each become `[secret NAME]`.
//! Output cut at a limit is scrubbed of a piece of a form at the cut too
//! ([`Scrubber::scrub_edges`]); output reported while it runs is held back
//! where it may end in the start of one ([`StreamScrubber`]).

use std::collections::HashMap;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use serde_json::Value;

use crate::config::{Config, SecretMap, key_owner};

/// Bytes of a form that a cut edge must show before they are taken for a
/// piece of it: fewer say nothing of the secret.
const EDGE_PIECE: usize = 6;

/// The configured secrets: every key's (`[secrets]`) and each key's own.
#[derive(Debug, Default)]
pub struct SecretStore {
    global: SecretMap,
    /// By the owner (the key's hash) that sees them.
    by_owner: HashMap<String, SecretMap>,
}

impl SecretStore {
    pub fn from_config(config: &Config) -> SecretStore {
        SecretStore {
            global: config.secrets.clone(),
            by_owner: config
                .keys
                .values()
                .filter(|k| !k.secrets.is_empty())
                .map(|k| (key_owner(&k.key), k.secrets.clone()))
                .collect(),
        }
    }

    /// A scrubber of every configured secret, whoever's: for what the
    /// server logs of a sandbox whose session it does not know.
    pub fn scrubber_of_all(&self) -> Scrubber {
        let all = self
            .global
            .iter()
            .chain(self.by_owner.values().flat_map(|own| own.iter()));
        Scrubber::new(all).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "too many secrets to scrub in the egress proxy's messages");
            Scrubber::default()
        })
    }

    /// The value of secret `name` as `owner`'s sessions see it: the key's
    /// own first, then every key's. `None` when the key has no such secret.
    pub fn get(&self, owner: Option<&str>, name: &str) -> Option<&str> {
        owner
            .and_then(|o| self.by_owner.get(o))
            .and_then(|own| own.get(name))
            .or_else(|| self.global.get(name))
    }
}

/// Replaces every form of some secrets' values with `[secret NAME]`.
#[derive(Clone, Default)]
pub struct Scrubber {
    inner: Option<Arc<Forms>>,
}

struct Forms {
    /// Each form's bytes and the replacement for it, in the finder's order.
    forms: Vec<(Vec<u8>, String)>,
    finder: AhoCorasick,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let forms = self.inner.as_ref().map_or(0, |i| i.forms.len());
        write!(f, "Scrubber({forms} forms)")
    }
}

impl Scrubber {
    /// A scrubber of `secrets`, `(NAME, value)` pairs; an error when their
    /// forms are too many to search for (the caller then gives no secret).
    pub fn new<'a>(
        secrets: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Scrubber, aho_corasick::BuildError> {
        let mut forms: Vec<(Vec<u8>, String)> = Vec::new();
        for (name, value) in secrets {
            let replacement = format!("[secret {name}]");
            for form in forms_of(value) {
                if !form.is_empty() && !forms.iter().any(|(f, _)| *f == form) {
                    forms.push((form, replacement.clone()));
                }
            }
        }
        if forms.is_empty() {
            return Ok(Scrubber::default());
        }
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(forms.iter().map(|(f, _)| f))?;
        Ok(Scrubber {
            inner: Some(Arc::new(Forms { forms, finder })),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_none()
    }

    /// `bytes` with every whole form replaced.
    pub fn scrub_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        let Some(inner) = &self.inner else {
            return bytes.to_vec();
        };
        let mut out = Vec::with_capacity(bytes.len());
        let mut at = 0;
        for m in inner.finder.find_iter(bytes) {
            out.extend_from_slice(&bytes[at..m.start()]);
            out.extend_from_slice(inner.forms[m.pattern().as_usize()].1.as_bytes());
            at = m.end();
        }
        out.extend_from_slice(&bytes[at..]);
        out
    }

    /// `text` with every whole form replaced.
    pub fn scrub(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_string();
        }
        // Forms are UTF-8 and so match on character boundaries.
        String::from_utf8(self.scrub_bytes(text.as_bytes()))
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// As [`Scrubber::scrub`], for text cut out of a longer output: a piece
    /// of a form at a cut edge (its end at the start, its start at the
    /// end) is replaced too.
    pub fn scrub_edges(&self, text: &str, cut_start: bool, cut_end: bool) -> String {
        let Some(inner) = &self.inner else {
            return text.to_string();
        };
        let mut text = text;
        let (mut head, mut tail) = ("", "");
        if cut_start
            && let Some((len, replacement)) = inner.piece(text.as_bytes(), Edge::Start)
            && text.is_char_boundary(len)
        {
            head = replacement;
            text = &text[len..];
        }
        if cut_end
            && let Some((len, replacement)) = inner.piece(text.as_bytes(), Edge::End)
            && text.is_char_boundary(text.len() - len)
        {
            tail = replacement;
            text = &text[..text.len() - len];
        }
        format!("{head}{}{tail}", self.scrub(text))
    }

    /// Every string in `value` (keys too) scrubbed.
    pub fn scrub_value(&self, value: &mut Value) {
        if self.is_empty() {
            return;
        }
        match value {
            Value::String(s) => *s = self.scrub(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.scrub_value(v)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (key, mut v) in entries {
                    self.scrub_value(&mut v);
                    map.insert(self.scrub(&key), v);
                }
            }
            _ => {}
        }
    }

    /// Where a form may start in `bytes` and not end in them: the length
    /// of the longest end of `bytes` that is the start of a form.
    fn open_end(&self, bytes: &[u8]) -> usize {
        let Some(inner) = &self.inner else { return 0 };
        inner
            .forms
            .iter()
            .filter_map(|(form, _)| {
                (1..form.len().min(bytes.len() + 1))
                    .rev()
                    .find(|&k| bytes.ends_with(&form[..k]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[derive(Clone, Copy)]
enum Edge {
    Start,
    End,
}

impl Forms {
    /// The longest piece (at least [`EDGE_PIECE`] bytes, not a whole form)
    /// of a form at `edge` of `bytes`: its length and replacement.
    fn piece(&self, bytes: &[u8], edge: Edge) -> Option<(usize, &str)> {
        self.forms
            .iter()
            .filter_map(|(form, replacement)| {
                let longest = (form.len() - 1).min(bytes.len());
                (EDGE_PIECE..=longest)
                    .rev()
                    .find(|&k| match edge {
                        Edge::Start => bytes.starts_with(&form[form.len() - k..]),
                        Edge::End => bytes.ends_with(&form[..k]),
                    })
                    .map(|k| (k, replacement.as_str()))
            })
            .max_by_key(|(k, _)| *k)
    }
}

/// The forms of one value that are scrubbed.
fn forms_of(value: &str) -> Vec<Vec<u8>> {
    let raw = value.as_bytes();
    let mut forms = vec![raw.to_vec()];
    let escaped = serde_json::to_string(value).unwrap_or_default();
    forms.push(escaped.as_bytes()[1..escaped.len() - 1].to_vec());
    let encoded = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC)
        .to_string();
    forms.push(encoded.to_ascii_lowercase().into_bytes());
    forms.push(encoded.into_bytes());
    for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
        for shift in 0..3usize {
            // The characters that encode only the value's bits, where it
            // starts `shift` bytes into a 3-byte group.
            let mut padded = vec![0u8; shift];
            padded.extend_from_slice(raw);
            let text = engine.encode(&padded);
            let start = (8 * shift).div_ceil(6);
            let end = (8 * (shift + raw.len())) / 6;
            if end > start {
                forms.push(text.as_bytes()[start..end].to_vec());
            }
        }
    }
    forms
}

/// Scrubs one stream of output reported while it runs: what might be the
/// start of a form is held back until the next bytes show whether it is.
#[derive(Default)]
pub struct StreamScrubber {
    scrubber: Scrubber,
    held: Vec<u8>,
}

impl StreamScrubber {
    pub fn new(scrubber: Scrubber) -> StreamScrubber {
        StreamScrubber {
            scrubber,
            held: Vec::new(),
        }
    }

    /// The scrubbed bytes that can go out now, `data` having come.
    pub fn push(&mut self, data: &[u8]) -> Vec<u8> {
        if self.scrubber.is_empty() {
            return data.to_vec();
        }
        self.held.extend_from_slice(data);
        let buffer = std::mem::take(&mut self.held);
        let mut cut = buffer.len() - self.scrubber.open_end(&buffer);
        // A whole form across the cut goes out whole, scrubbed.
        if let Some(inner) = &self.scrubber.inner
            && let Some(m) = inner
                .finder
                .find_iter(&buffer)
                .find(|m| m.start() < cut && m.end() > cut)
        {
            cut = m.end();
        }
        self.held = buffer[cut..].to_vec();
        self.scrubber.scrub_bytes(&buffer[..cut])
    }
}

#[cfg(test)]
#[path = "secrets_tests.rs"]
mod tests;
