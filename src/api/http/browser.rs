//! Checks every request passes before routing, so that a web page the user
//! visits cannot drive the server (a loopback server with no keys trusts
//! whoever reaches it):
//!
//! - `Host` must be one the server answers for (`allowed_hosts`): a page on
//!   another name that resolves to this server (DNS rebinding) is refused,
//!   so it can neither read answers nor act.
//! - A state-changing request (any method but GET, HEAD and OPTIONS) and a
//!   WebSocket upgrade that carry an `Origin` must come from the server's
//!   own origin or one in `allowed_origins`: browsers always send `Origin`
//!   on these, so a cross-site form or `fetch` is refused.
//! - A request body must be declared JSON: the types a page may send
//!   without a CORS preflight (`text/plain`, forms) are refused, whatever
//!   the body holds. The one exception is a `multipart/form-data` create
//!   or run carrying the user's files, which besides the `Origin` check is
//!   refused when `Sec-Fetch-Site` says another site's page sent it.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::http::error::ApiError;
use crate::config::Config;

/// The hosts and origins the server answers.
pub struct BrowserPolicy {
    /// Lower-case names; a `*` answers any host.
    hosts: Vec<String>,
    /// Lower-case `scheme://host[:port]`.
    origins: Vec<String>,
}

impl BrowserPolicy {
    pub fn new(config: &Config) -> BrowserPolicy {
        let mut hosts: Vec<String> = config
            .allowed_hosts
            .iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .collect();
        // Clients reach a server bound to one address by that address.
        let ip = config.listen.ip();
        if !ip.is_unspecified() {
            hosts.push(ip.to_string());
        }
        BrowserPolicy {
            hosts,
            origins: config
                .allowed_origins
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .collect(),
        }
    }

    fn allows_host(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        self.hosts.iter().any(|h| h == "*" || *h == name)
    }

    /// Same origin: the page was served from the `Host` this request went
    /// to (any scheme: a TLS proxy in front changes it).
    fn allows_origin(&self, origin: &str, host: &str) -> bool {
        let origin = origin.trim().to_ascii_lowercase();
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        authority.is_some_and(|a| a == host.to_ascii_lowercase()) || self.origins.contains(&origin)
    }
}

/// The middleware; see the module docs.
pub async fn check(
    State(policy): State<Arc<BrowserPolicy>>,
    request: Request,
    next: Next,
) -> Response {
    match refusal(&policy, &request) {
        Some(error) => error.into_response(),
        None => next.run(request).await,
    }
}

/// Why `request` is refused, if it is.
pub fn refusal(policy: &BrowserPolicy, request: &Request) -> Option<ApiError> {
    let (method, headers) = (request.method(), request.headers());
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or_default();
    if !policy.allows_host(host) {
        return Some(ApiError::new(
            StatusCode::FORBIDDEN,
            "host_not_allowed",
            format!("this server does not answer for Host {host:?}; add the name to allowed_hosts"),
        ));
    }
    let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    let upgrade = headers.contains_key(header::UPGRADE);
    if (!safe || upgrade)
        && let Some(origin) = headers.get(header::ORIGIN)
    {
        let origin = origin.to_str().unwrap_or("?");
        if !policy.allows_origin(origin, host) {
            return Some(ApiError::new(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                format!(
                    "requests from pages of {origin} are refused; add it to allowed_origins to allow them"
                ),
            ));
        }
    }
    // The methods routes take bodies with: any other (TRACE, CONNECT, one
    // of a client's own) is no route's, and the router's 405 says so.
    let with_body = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if with_body {
        let has_body = headers.contains_key(header::TRANSFER_ENCODING)
            || headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim() != "0");
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or("?"));
        // A gRPC service's calls carry protobuf (a client may also send
        // their length); no browser sends that type without a preflight.
        let grpc = request.uri().path().starts_with(GRPC_PATHS);
        // A workspace upload carries its bytes as they are: any type a page
        // cannot send without a preflight (application/x-tar,
        // application/gzip, application/octet-stream …).
        let upload = crate::api::routes::workspace::streams_body(method, request.uri().path());
        // A form with the user's files (`POST /agent/session`, `/agent/run`):
        // a type pages send without a preflight, so besides the `Origin`
        // check above, one a browser marks as sent from another site is
        // refused.
        let form = crate::api::routes::workspace::form::streams_form(
            method,
            request.uri().path(),
            headers,
        );
        if form && from_another_site(headers) {
            return Some(ApiError::new(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                "a multipart/form-data request sent from another site's page is refused",
            ));
        }
        let refused = match content_type {
            Some(kind) if grpc && is_grpc(kind) => false,
            Some(_) if form => false,
            Some(kind) if upload => is_simple(kind),
            None if upload => true,
            Some(kind) => !is_json(kind) && (has_body || is_simple(kind)),
            None => has_body,
        };
        if refused && upload {
            return Some(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "send an upload as Content-Type: application/x-tar, application/gzip, application/zstd or application/octet-stream (got {})",
                    content_type.unwrap_or("none")
                ),
            ));
        }
        if refused {
            return Some(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "the body must be sent as Content-Type: application/json (got {})",
                    content_type.unwrap_or("none")
                ),
            ));
        }
    }
    None
}

/// Whether a browser says the request comes from a page of another site
/// (`Sec-Fetch-Site`, which pages cannot set); clients other than
/// browsers send none.
fn from_another_site(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|site| !matches!(site.trim(), "same-origin" | "none"))
}

/// Where the gRPC services are (`/conclave.bus.v1.Bus/…`,
/// `/conclave.orchestrator.v1.Orchestrator/…`).
const GRPC_PATHS: &str = "/conclave.";

/// `application/grpc`, or a `+` subtype of it (`application/grpc+proto`).
fn is_grpc(content_type: &str) -> bool {
    let essence = essence(content_type);
    essence == "application/grpc" || essence.starts_with("application/grpc+")
}

/// `application/json`, or any `+json` type, with or without parameters.
fn is_json(content_type: &str) -> bool {
    let essence = essence(content_type);
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The types a browser sends cross-site without a preflight.
fn is_simple(content_type: &str) -> bool {
    matches!(
        essence(content_type).as_str(),
        "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data"
    )
}

fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The name of a `Host` value: without its port, and without the brackets
/// of an IPv6 address.
pub fn host_name(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BrowserPolicy {
        BrowserPolicy::new(&Config {
            allowed_origins: vec!["https://app.example.com".into()],
            ..Config::default()
        })
    }

    #[test]
    fn host_names_lose_port_and_brackets() {
        assert_eq!(host_name("localhost:8080"), "localhost");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("[::1]:80"), "::1");
        assert_eq!(host_name("[::1]"), "::1");
        assert_eq!(host_name("127.0.0.1:1"), "127.0.0.1");
        assert_eq!(host_name(""), "");
    }

    #[test]
    fn origins_are_same_origin_or_listed() {
        let p = policy();
        assert!(p.allows_origin("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(p.allows_origin("HTTP://LOCALHOST:8080", "localhost:8080"));
        assert!(!p.allows_origin("http://127.0.0.1:9999", "127.0.0.1:8080"));
        assert!(!p.allows_origin("http://evil.example", "127.0.0.1:8080"));
        assert!(!p.allows_origin("null", "127.0.0.1:8080"));
        assert!(p.allows_origin("https://app.example.com", "127.0.0.1:8080"));
        assert!(p.allows_host("LOCALHOST:1"));
        assert!(!p.allows_host("rebound.example:8080"));
    }

    #[test]
    fn json_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(is_json("application/merge-patch+json"));
        assert!(!is_json("text/plain"));
        assert!(is_simple("text/plain;charset=UTF-8"));
        assert!(is_simple("multipart/form-data; boundary=x"));
        assert!(!is_simple("application/octet-stream"));
        assert!(is_grpc("application/grpc"));
        assert!(is_grpc("application/grpc+proto"));
        assert!(!is_grpc("application/grpc-web"));
    }

    /// A gRPC call that sends its length is taken on the gRPC paths, and
    /// its type is refused anywhere else.
    #[test]
    fn grpc_calls_with_a_length_pass_on_grpc_paths_only() {
        let call = |path: &str| {
            axum::http::Request::post(path)
                .header(header::HOST, "127.0.0.1:8080")
                .header(header::CONTENT_TYPE, "application/grpc")
                .header(header::CONTENT_LENGTH, "12")
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let p = policy();
        assert!(refusal(&p, &call("/conclave.bus.v1.Bus/Publish")).is_none());
        let refused = refusal(&p, &call("/agent/run")).expect("refused");
        assert_eq!(refused.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
}
