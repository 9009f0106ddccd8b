//! The OpenAI-compatible endpoints the gateway balances, where each lives
//! on a replica, and the checks a request to each passes before any
//! replica is called.

use serde_json::Value;

use super::GatewayError;
use super::json::Object;

/// Which endpoint a call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    /// OpenAI's Responses API.
    Responses,
    Embeddings,
    /// vLLM's and SGLang's `/tokenize` and `/detokenize`, served at the
    /// server's root rather than under `/v1`.
    Tokenize,
    Detokenize,
}

impl Endpoint {
    /// Every endpoint, in the order of [`Endpoint::index`].
    pub const ALL: [Endpoint; 6] = [
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Responses,
        Endpoint::Embeddings,
        Endpoint::Tokenize,
        Endpoint::Detokenize,
    ];

    /// Its path after the replica's base URL (`…/v1`), or after the
    /// server's root for [`Endpoint::at_root`] ones; also its name in
    /// traces.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat/completions",
            Endpoint::Completions => "completions",
            Endpoint::Responses => "responses",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Tokenize => "tokenize",
            Endpoint::Detokenize => "detokenize",
        }
    }

    /// Its place in [`Endpoint::ALL`] (and in a replica's URLs).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Served at the server's root: the replica's base URL loses its
    /// trailing `/v1` first.
    pub fn at_root(self) -> bool {
        matches!(self, Endpoint::Tokenize | Endpoint::Detokenize)
    }

    /// Generates text: may stream, and takes the pool's injected sampling
    /// parameters.
    pub fn generates(self) -> bool {
        matches!(
            self,
            Endpoint::Chat | Endpoint::Completions | Endpoint::Responses
        )
    }

    /// The URL of this endpoint on a replica whose base URL is `base`
    /// (without a trailing slash).
    pub fn url_on(self, base: &str) -> String {
        let base = if self.at_root() {
            base.strip_suffix("/v1").unwrap_or(base)
        } else {
            base
        };
        format!("{base}/{}", self.path())
    }

    /// Refuses a body the replica could only refuse, before one is
    /// called: the fields each endpoint needs, of the right types. Chat
    /// and completions are passed on as they are (their replicas say
    /// what is wrong).
    pub fn check(self, body: &Object) -> Result<(), GatewayError> {
        let bad = |message: &str| Err(GatewayError::BadRequest(message.to_string()));
        match self {
            Endpoint::Chat | Endpoint::Completions => Ok(()),
            Endpoint::Responses => match body.get::<Value>("previous_response_id") {
                None | Some(Value::Null | Value::String(_)) => Ok(()),
                Some(_) => bad("\"previous_response_id\" must be a string"),
            },
            Endpoint::Embeddings => match body.get::<Value>("input") {
                Some(Value::String(_)) => Ok(()),
                Some(Value::Array(items)) if !items.is_empty() => Ok(()),
                _ => bad(
                    "the request needs an \"input\": a string, or a non-empty list of \
                     strings or token lists",
                ),
            },
            Endpoint::Tokenize => {
                let prompt = matches!(body.get::<Value>("prompt"), Some(Value::String(_)));
                let messages = matches!(body.get::<Value>("messages"), Some(Value::Array(_)));
                if prompt || messages {
                    Ok(())
                } else {
                    bad("the request needs a \"prompt\" string (or chat \"messages\")")
                }
            }
            Endpoint::Detokenize => match body.get::<Vec<u64>>("tokens") {
                Some(_) => Ok(()),
                None => bad("the request needs \"tokens\": a list of token ids"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_endpoints_leave_the_v1_out() {
        let base = "http://h:8000/v1";
        assert_eq!(Endpoint::Tokenize.url_on(base), "http://h:8000/tokenize");
        assert_eq!(
            Endpoint::Responses.url_on(base),
            "http://h:8000/v1/responses"
        );
        assert_eq!(
            Endpoint::Detokenize.url_on("http://h/api"),
            "http://h/api/detokenize"
        );
        for (i, endpoint) in Endpoint::ALL.iter().enumerate() {
            assert_eq!(endpoint.index(), i);
        }
    }

    #[test]
    fn bodies_missing_what_the_endpoint_needs_are_refused() {
        let check = |endpoint: Endpoint, body: &str| {
            endpoint
                .check(&Object::parse(body.as_bytes()).unwrap())
                .is_ok()
        };
        assert!(check(Endpoint::Embeddings, r#"{"input": "hi"}"#));
        assert!(check(Endpoint::Embeddings, r#"{"input": ["a", "b"]}"#));
        assert!(!check(Endpoint::Embeddings, r#"{"input": []}"#));
        assert!(!check(Endpoint::Embeddings, r#"{"input": 3}"#));
        assert!(check(Endpoint::Tokenize, r#"{"prompt": "hi"}"#));
        assert!(!check(Endpoint::Tokenize, r#"{"tokens": [1]}"#));
        assert!(check(Endpoint::Detokenize, r#"{"tokens": [1, 2]}"#));
        assert!(!check(Endpoint::Detokenize, r#"{"tokens": ["a"]}"#));
        assert!(check(Endpoint::Responses, r#"{"input": "hi"}"#));
        assert!(!check(
            Endpoint::Responses,
            r#"{"previous_response_id": 1}"#
        ));
    }
}
