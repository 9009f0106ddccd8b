//! `[telemetry]`: where OpenTelemetry traces go. The standard
//! `OTEL_EXPORTER_OTLP_*` and `OTEL_SERVICE_NAME` variables win over the
//! file, as the providers' variables do.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// OTLP trace export; off while no endpoint is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Base URL of an OTLP/HTTP collector (`http://host:4318`); traces go
    /// to its `/v1/traces`. Unset: no export, and spans cost next to
    /// nothing.
    pub otlp_endpoint: Option<String>,
    /// The full URL traces are posted to, as
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` gives it (no path is added).
    /// Only the environment sets it.
    #[serde(skip)]
    pub otlp_traces_endpoint: Option<String>,
    /// Headers sent with every export (a collector's API key).
    pub otlp_headers: BTreeMap<String, String>,
    /// `service.name` of the traces (default `conclave`).
    pub service_name: Option<String>,
    /// Puts prompts, answers and tool arguments in the spans (the GenAI
    /// content attributes). Off: spans carry names, ids and counts only.
    pub capture_content: bool,
}

impl TelemetryConfig {
    /// Where traces are posted, or `None` when export is off: the traces
    /// endpoint as given, else the base endpoint's `/v1/traces`.
    pub fn traces_url(&self) -> Option<String> {
        if let Some(url) = &self.otlp_traces_endpoint {
            return Some(url.clone());
        }
        let base = self.otlp_endpoint.as_deref()?;
        Some(format!("{}/v1/traces", base.trim_end_matches('/')))
    }

    pub fn service_name(&self) -> &str {
        self.service_name.as_deref().unwrap_or("conclave")
    }

    /// Applies `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_HEADERS`
    /// (`key=value,key2=value2`, values percent-encoded) and
    /// `OTEL_SERVICE_NAME`; an empty variable counts as unset.
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if let Some(url) = var("OTEL_EXPORTER_OTLP_ENDPOINT") {
            self.otlp_endpoint = Some(url);
        }
        if let Some(url) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            self.otlp_traces_endpoint = Some(url);
        }
        if let Some(headers) = var("OTEL_EXPORTER_OTLP_HEADERS") {
            for pair in headers.split(',') {
                if let Some((key, value)) = pair.split_once('=') {
                    let value =
                        url::form_urlencoded::parse(format!("v={}", value.trim()).as_bytes())
                            .next()
                            .map(|(_, v)| v.into_owned())
                            .unwrap_or_default();
                    self.otlp_headers.insert(key.trim().to_string(), value);
                }
            }
        }
        if let Some(name) = var("OTEL_SERVICE_NAME") {
            self.service_name = Some(name);
        }
    }

    /// The first problem found, as `(field, message)`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let endpoints = [
            ("telemetry.otlp_endpoint", &self.otlp_endpoint),
            (
                "telemetry.otlp_endpoint (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)",
                &self.otlp_traces_endpoint,
            ),
        ];
        for (field, url) in endpoints {
            let Some(url) = url else { continue };
            let parsed = url::Url::parse(url)
                .map_err(|e| (field.to_string(), format!("{url:?} is not a URL: {e}")))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
                return Err((
                    field.to_string(),
                    format!("{url:?} is not an http:// or https:// URL of an OTLP/HTTP collector"),
                ));
            }
        }
        for (name, value) in &self.otlp_headers {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err((
                    format!("telemetry.otlp_headers.{name}"),
                    "not a valid HTTP header name".into(),
                ));
            }
            if http::HeaderValue::from_str(value).is_err() {
                return Err((
                    format!("telemetry.otlp_headers.{name}"),
                    "the value is not a valid HTTP header value".into(),
                ));
            }
        }
        if self
            .service_name
            .as_deref()
            .is_some_and(|s| s.trim().is_empty())
        {
            return Err(("telemetry.service_name".into(), "must not be empty".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn off_unless_an_endpoint_is_set() {
        let config = TelemetryConfig::default();
        assert_eq!(config.traces_url(), None);
        assert_eq!(config.service_name(), "conclave");
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        let mut config = TelemetryConfig {
            otlp_endpoint: Some("http://file:4318".into()),
            service_name: Some("from-file".into()),
            ..TelemetryConfig::default()
        };
        config.apply_env(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318/"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api_key=a%20b, x-team=ops"),
            ("OTEL_SERVICE_NAME", "edge"),
        ]));
        assert_eq!(
            config.traces_url().as_deref(),
            Some("http://env:4318/v1/traces")
        );
        assert_eq!(config.otlp_headers["api_key"], "a b");
        assert_eq!(config.otlp_headers["x-team"], "ops");
        assert_eq!(config.service_name(), "edge");
        config.apply_env(env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t/x")]));
        assert_eq!(config.traces_url().as_deref(), Some("http://t/x"));
        config.validate().unwrap();
    }

    #[test]
    fn empty_variables_count_as_unset() {
        let mut config = TelemetryConfig::default();
        config.apply_env(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]));
        assert_eq!(config.traces_url(), None);
    }

    #[test]
    fn bad_values_name_their_field() {
        let config = TelemetryConfig {
            otlp_endpoint: Some("localhost:4318".into()),
            ..TelemetryConfig::default()
        };
        let (field, message) = config.validate().unwrap_err();
        assert_eq!(field, "telemetry.otlp_endpoint");
        assert!(message.contains("localhost:4318"), "{message}");
        let mut headers = BTreeMap::new();
        headers.insert("bad header".to_string(), "x".to_string());
        let config = TelemetryConfig {
            otlp_headers: headers,
            ..TelemetryConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().0,
            "telemetry.otlp_headers.bad header"
        );
        let config = TelemetryConfig {
            service_name: Some(String::new()),
            ..TelemetryConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().0, "telemetry.service_name");
    }
}
