//! What every client of an upstream HTTP server here needs (the model
//! providers and the gateway alike): errors described with their causes,
//! `Retry-After` read in both of its forms and capped, and error bodies
//! read no further than a limit.

use std::error::Error;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::BodyExt;
use reqwest::Response;
use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The longest `Retry-After` honoured; a server asking for more gets this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// An error with its causes: reqwest's own message rarely says what failed.
pub fn describe(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// `Retry-After` in seconds or as an HTTP date, capped at [`MAX_RETRY_AFTER`].
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// The start of a response body (reqwest's or hyper's), at most `limit`
/// bytes, read no further than needed; true when there was more.
pub async fn bounded_body<B>(mut body: B, limit: usize) -> (Bytes, bool)
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let mut bytes = Vec::new();
    while bytes.len() <= limit {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    let cut = bytes.len() > limit;
    bytes.truncate(limit);
    (Bytes::from(bytes), cut)
}

/// An error response's body as text, at most `limit` bytes, `…` when cut.
pub async fn error_text(response: Response, limit: usize) -> String {
    let (bytes, cut) = bounded_body(reqwest::Body::from(response), limit).await;
    let mut body = String::from_utf8_lossy(&bytes).trim().to_string();
    if cut {
        body.push('…');
    }
    body
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn headers(retry_after: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(retry_after).unwrap());
        headers
    }

    #[test]
    fn retry_after_in_seconds() {
        let now = SystemTime::now();
        assert_eq!(
            retry_after(&headers("3"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(retry_after(&headers("3600"), now), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
        assert_eq!(retry_after(&headers("soon"), now), None);
    }

    #[test]
    fn retry_after_as_a_date() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            retry_after(&headers("Sun, 06 Nov 1994 08:49:42 GMT"), now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            retry_after(&headers("Sun, 06 Nov 1994 08:49:00 GMT"), now),
            Some(Duration::ZERO),
            "a date in the past"
        );
    }
}
