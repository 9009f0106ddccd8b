//! The constraints of `/openapi.json` that the route annotations do not
//! carry: what a parameter or body must be for the route to take it, so
//! that a client generated from the document (or a fuzzer such as
//! schemathesis) sends only what is taken. Some depend on the server: the
//! session kinds it runs and its `agent.max_forks`.

use serde_json::{Value, json};

/// The document as this server serves it.
pub fn document(doc: utoipa::openapi::OpenApi, kinds: &[&str], max_forks: u32) -> Value {
    let mut doc = serde_json::to_value(doc).unwrap_or_default();
    let paths = &mut doc["paths"];
    let Some(paths) = paths.as_object_mut() else {
        return doc;
    };
    for (path, item) in paths.iter_mut() {
        let Some(operations) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in operations.iter_mut() {
            constrain_parameters(path, operation, kinds);
            constrain_body(path, method, operation);
        }
    }
    let schemas = &mut doc["components"]["schemas"];
    for (schema, field, constraint) in [
        (
            "RunRequest",
            "prompt",
            json!({"minLength": 1, "pattern": "\\S"}),
        ),
        (
            "MessageRequest",
            "prompt",
            json!({"minLength": 1, "pattern": "\\S"}),
        ),
        ("CreateSessionRequest", "kind", json!({"enum": kinds})),
        (
            "ForkRequest",
            "count",
            json!({"minimum": 1, "maximum": max_forks}),
        ),
        ("GitSource", "url", json!({"format": "uri"})),
    ] {
        let property = schemas
            .get_mut(schema)
            .and_then(|s| s.get_mut("properties"))
            .and_then(|p| p.get_mut(field));
        if let Some(property) = property {
            merge(property, constraint);
        }
    }
    // Refused with "unknown field", as the type's serde says.
    for schema in [
        "ApprovalDecision",
        "ForkRequest",
        "MessageRequest",
        "AgentOptions",
    ] {
        if let Some(Value::Object(schema)) = schemas.get_mut(schema) {
            schema.insert("additionalProperties".into(), json!(false));
        }
    }
    doc
}

/// Sets each key of `constraint` in `schema` (a `oneOf` of a type and
/// null, as an optional field is, gets them on its non-null branch).
fn merge(schema: &mut Value, constraint: Value) {
    let target = match schema.get_mut("oneOf").and_then(Value::as_array_mut) {
        Some(branches) => match branches.iter_mut().find(|b| b["type"] != "null") {
            Some(branch) => branch,
            None => return,
        },
        None => schema,
    };
    if let (Some(target), Value::Object(constraint)) = (target.as_object_mut(), constraint) {
        target.extend(constraint);
    }
}

fn constrain_parameters(path: &str, operation: &mut Value, kinds: &[&str]) {
    let Some(parameters) = operation
        .get_mut("parameters")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for parameter in parameters {
        // utoipa writes a u64 as an int64 from 0: its values go on past
        // int64's.
        if let Some(schema) = parameter.get_mut("schema")
            && schema["format"] == "int64"
            && schema["minimum"] == 0
        {
            merge(schema, json!({"format": "uint64", "maximum": u64::MAX}));
        }
        let name = parameter["name"].as_str().unwrap_or_default().to_owned();
        let constraint = match (path, name.as_str()) {
            (_, "slug") if path.starts_with("/meta/") => {
                json!({"pattern": "^(conclave1|rllm1):[A-Za-z0-9_-]*={0,2}$"})
            }
            // Tokens of anything but whitespace, control characters,
            // separators and wildcards, joined by `.` or `/`.
            ("/bus/publish/{subject}", "subject") => json!({
                "maxLength": 256,
                "pattern": "^[^\\s\\x00-\\x1F\\x7F-\\x9F./*>]+([./][^\\s\\x00-\\x1F\\x7F-\\x9F./*>]+)*$"
            }),
            ("/agent/session/{session_id}/changes", "format") => {
                json!({"enum": ["json", "patch"]})
            }
            ("/agent/session/{session_id}/workspace", "format") => {
                json!({"enum": ["tar", "tar.gz"]})
            }
            ("/agent/session/{session_id}/workspace", "path") => json!({"minLength": 1}),
            ("/agent/sessions", "origin") => {
                json!({"enum": ["", "conclave", "a2a", "agui", "langgraph"]})
            }
            ("/agent/sessions", "status") => {
                json!({"enum": ["", "idle", "running", "interrupted", "closed"]})
            }
            ("/agent/sessions", "kind") => {
                let mut any = vec![""];
                any.extend(kinds);
                json!({"enum": any})
            }
            ("/usage", "from" | "to") => json!({"format": "date"}),
            ("/usage", "group_by") => json!({"enum": ["day", "model", "key"]}),
            _ => continue,
        };
        if let Some(schema) = parameter.get_mut("schema") {
            merge(schema, constraint);
        }
    }
}

/// The bodies the routes read as free JSON objects: the gateway's (the
/// fields each needs before it is forwarded), a pipeline fork's and an
/// AG-UI run's.
fn constrain_body(path: &str, method: &str, operation: &mut Value) {
    if method != "post" {
        return;
    }
    let endpoint = path
        .strip_prefix("/meta/{slug}")
        .unwrap_or(path)
        .trim_start_matches("/v1");
    let model = json!({"type": "string", "minLength": 1});
    let body = match endpoint {
        "/chat/completions" => json!({"required": ["model", "messages"], "properties": {
            "model": model, "messages": {"type": "array", "items": {"type": "object"}}}}),
        "/completions" => json!({"required": ["model", "prompt"], "properties": {
            "model": model, "prompt": {"type": "string"}}}),
        "/responses" => json!({"required": ["model", "input"], "properties": {
            "model": model, "input": {"type": "string"}}}),
        "/embeddings" => json!({"required": ["model", "input"], "properties": {
            "model": model, "input": {"type": "string"}}}),
        "/tokenize" => json!({"required": ["model", "prompt"], "properties": {
            "model": model, "prompt": {"type": "string"}}}),
        "/detokenize" => json!({"required": ["model", "tokens"], "properties": {
            "model": model, "tokens": {"type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": u32::MAX}}}}),
        "/deliberations" => json!({"required": ["task_description"], "properties": {
            "task_description": {"type": "string", "minLength": 1}}}),
        "/orchestrator/pipelines/validate" => json!({"required": ["yaml"], "properties": {
            "yaml": {"type": "string", "minLength": 1}}}),
        "/rollouts" => json!({"required": ["model"], "properties": {"model": model,
            "prompts": {"type": "array", "items": {"type": "string"}},
            "messages": {"type": "array", "items": {"type": "array", "items": {"type": "object"}}}},
            "oneOf": [{"required": ["prompts"]}, {"required": ["messages"]}]}),
        "/orchestrator/pipeline/fork/{thread_id}" => json!({
            "additionalProperties": false, "properties": {
            "step": {"type": "integer", "minimum": 0, "maximum": u64::MAX},
            "state": {"type": "object"},
            "session_name": {"type": "string"}}}),
        "/ag-ui/{agent}" => json!({"required": ["threadId", "runId"], "properties": {
            "threadId": {"type": "string", "format": "uuid"}, "runId": {"type": "string"},
            "messages": {"type": "array", "items": {"type": "object"}},
            "tools": {"type": "array", "items": {"type": "object"}},
            "forwardedProps": {"type": "object"},
            "resume": {"type": "array", "items": {"type": "object",
                "required": ["interruptId", "status"], "properties": {
                "interruptId": {"type": "string"}, "status": {"type": "string"}}}}}}),
        _ => return,
    };
    // Indexing would add what is missing: only a body the route has is
    // constrained.
    if let Some(schema) = operation.pointer_mut("/requestBody/content/application~1json/schema") {
        merge(schema, body);
        schema["type"] = json!("object");
    }
}

#[cfg(test)]
mod tests {
    use utoipa::OpenApi;

    use super::*;

    #[test]
    fn the_served_document_names_the_servers_kinds_and_adds_nothing_empty() {
        let doc = document(crate::api::ApiDoc::openapi(), &["agent", "custom"], 7);
        let kind = &doc["components"]["schemas"]["CreateSessionRequest"]["properties"]["kind"];
        assert!(
            kind.to_string().contains(r#""enum":["agent","custom"]"#),
            "{kind}"
        );
        let count = &doc["components"]["schemas"]["ForkRequest"]["properties"]["count"];
        assert!(count.to_string().contains(r#""maximum":7"#), "{count}");
        // Only what a route has is constrained: no operation gains a
        // `parameters` or `requestBody` of null.
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                for field in ["parameters", "requestBody"] {
                    assert!(
                        operation.get(field).is_none_or(|v| !v.is_null()),
                        "{method} {path}: {field} is null"
                    );
                }
            }
        }
        let sessions = &doc["paths"]["/agent/sessions"]["get"]["parameters"];
        let origin = sessions
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "origin")
            .unwrap();
        assert!(origin.to_string().contains("langgraph"), "{origin}");
    }
}
