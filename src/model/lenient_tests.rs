use std::sync::Arc;

use super::*;

fn tools(names: &[&str]) -> Vec<ToolSpec> {
    names
        .iter()
        .map(|name| ToolSpec {
            name: name.to_string(),
            description: format!("the {name} tool"),
            input_schema: Arc::new(json!({"type": "object"})),
            read_only: false,
        })
        .collect()
}

/// The calls as (name, arguments), after checking their generated ids.
fn named(calls: &[ToolCall]) -> Vec<(String, Value)> {
    for call in calls {
        assert!(call.id.starts_with("call_"), "{}", call.id);
    }
    let mut ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), calls.len(), "ids are unique");
    calls
        .iter()
        .map(|c| (c.name.clone(), c.arguments.clone()))
        .collect()
}

fn recover(text: &str, offered: &[&str]) -> Option<(String, Vec<(String, Value)>)> {
    recover_tool_calls(text, &tools(offered)).map(|r| (r.text, named(&r.calls)))
}

fn bash(command: &str) -> (String, Value) {
    ("Bash".to_string(), json!({"command": command}))
}

#[test]
fn bare_object_is_a_call() {
    assert_eq!(
        recover(
            r#"{"name": "Bash", "arguments": {"command": "ls"}}"#,
            &["Bash"]
        ),
        Some((String::new(), vec![bash("ls")]))
    );
}

#[test]
fn parameters_and_input_stand_for_arguments() {
    for key in ["parameters", "input"] {
        let text = format!(r#"{{"name": "Bash", "{key}": {{"command": "ls"}}}}"#);
        assert_eq!(
            recover(&text, &["Bash"]),
            Some((String::new(), vec![bash("ls")])),
            "{key}"
        );
    }
}

#[test]
fn text_around_a_call_is_kept() {
    assert_eq!(
        recover(
            "Let me look.\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\nThen I'll read it.",
            &["Bash"]
        ),
        Some((
            "Let me look.\n\nThen I'll read it.".to_string(),
            vec![bash("ls")]
        ))
    );
}

#[test]
fn json_fence_is_unwrapped() {
    let text =
        "I'll run it:\n```json\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"pwd\"}}\n```\n";
    assert_eq!(
        recover(text, &["Bash"]),
        Some(("I'll run it:".to_string(), vec![bash("pwd")]))
    );
}

#[test]
fn hermes_tags_with_one_call_each() {
    let text = "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n\
                <tool_call>\n{\"name\": \"Read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>";
    assert_eq!(
        recover(text, &["Bash", "Read"]),
        Some((
            String::new(),
            vec![bash("ls"), ("Read".to_string(), json!({"path": "a.txt"}))]
        ))
    );
}

#[test]
fn unclosed_tag_runs_to_the_end() {
    let text = "Running.<tool_call>{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}";
    assert_eq!(
        recover(text, &["Bash"]),
        Some(("Running.".to_string(), vec![bash("ls")]))
    );
}

#[test]
fn several_objects_in_one_tag() {
    let text = "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"a\"}}\n\
                {\"name\": \"Bash\", \"arguments\": {\"command\": \"b\"}}\n</tool_call>";
    assert_eq!(
        recover(text, &["Bash"]),
        Some((String::new(), vec![bash("a"), bash("b")]))
    );
}

#[test]
fn list_of_calls() {
    let text = r#"[{"name": "Bash", "arguments": {"command": "a"}}, {"name": "Bash", "arguments": {"command": "b"}}]"#;
    assert_eq!(
        recover(text, &["Bash"]),
        Some((String::new(), vec![bash("a"), bash("b")]))
    );
}

#[test]
fn list_with_a_non_call_is_not_calls() {
    let text = r#"[{"name": "Bash", "arguments": {"command": "a"}}, 3]"#;
    assert_eq!(recover(text, &["Bash"]), None);
}

#[test]
fn openai_shaped_call() {
    let text = r#"{"type": "function", "function": {"name": "Bash", "arguments": "{\"command\": \"ls\"}"}}"#;
    assert_eq!(
        recover(text, &["Bash"]),
        Some((String::new(), vec![bash("ls")]))
    );
}

#[test]
fn arguments_as_a_json_string() {
    let text = r#"{"name": "Bash", "arguments": "{\"command\": \"ls\"}"}"#;
    assert_eq!(
        recover(text, &["Bash"]),
        Some((String::new(), vec![bash("ls")]))
    );
}

#[test]
fn missing_arguments_are_empty() {
    assert_eq!(
        recover(r#"{"name": "Bash"}"#, &["Bash"]),
        Some((String::new(), vec![("Bash".to_string(), json!({}))]))
    );
}

/// The agent's code and shell tools, with their real required fields.
fn sandbox_tools() -> Vec<ToolSpec> {
    [
        ("mcp__sandbox__execute_code", json!(["code"])),
        ("Bash", json!(["command"])),
        ("Write", json!(["file_path", "content"])),
    ]
    .into_iter()
    .map(|(name, required)| ToolSpec {
        name: name.into(),
        description: String::new(),
        input_schema: Arc::new(json!({"type": "object", "required": required})),
        read_only: false,
    })
    .collect()
}

#[test]
fn the_replies_small_models_wrote_are_calls() {
    let code = |src: &str| {
        (
            "mcp__sandbox__execute_code".to_string(),
            json!({"code": src}),
        )
    };
    let cases = [
        // One stray bracket (Qwen2.5-Coder-0.5B).
        r#"{"name": "mcp__sandbox__execute_code", "arguments": {"code": "print(20)"}]}"#,
        // The short name, in a json fence.
        "```json\n{\"name\": \"execute_code\", \"arguments\": {\"code\": \"print(20)\"}}\n```",
        // An invented name with the right arguments.
        r#"{"name": "Python", "arguments": {"code": "print(20)"}}"#,
    ];
    for text in cases {
        let found = recover_tool_calls(text, &sandbox_tools())
            .unwrap_or_else(|| panic!("no call in {text}"));
        assert_eq!(named(&found.calls), vec![code("print(20)")], "{text}");
    }
}

#[test]
fn a_loop_is_seen_and_prose_is_not() {
    let call = "{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n";
    assert!(repeats_itself(&format!("Sure.\n{}", call.repeat(4))));
    assert!(!repeats_itself(&format!("Sure.\n{}", call.repeat(3))));
    let fragment = "\"timeout\": 600000, \"language\": \"python\", ";
    assert!(repeats_itself(&format!(
        "{{\"code\": \"1\", {}",
        fragment.repeat(5)
    )));
    assert!(!repeats_itself(&format!("Title\n{}\n", "=".repeat(80))));
    // One character for ever (a sum that prints `1000…` without end).
    let zeros = format!("{{\"code\": \"sum(x) / 1{}", "0".repeat(256));
    assert!(repeats_itself(&zeros));
    assert!(!repeats_itself(&zeros[..zeros.len() - 1]));
    assert!(!repeats_itself(
        "The answer is 42. It was computed with Python."
    ));
}

#[test]
fn names_resolve_exactly_then_by_short_name_then_by_arguments() {
    let tools = sandbox_tools();
    let resolve = |name: &str, args: Value| resolve_tool_name(name, &args, &tools);
    assert_eq!(resolve("Bash", json!({})).unwrap().note, None);
    let short = resolve("EXECUTE_CODE", json!({})).unwrap();
    assert_eq!(short.name, "mcp__sandbox__execute_code");
    assert!(short.note.unwrap().contains("taken to mean"));
    assert_eq!(
        resolve("Shell", json!({"command": "ls"})).unwrap().name,
        "Bash"
    );
    // Arguments fitting no tool, or two, name none.
    assert_eq!(resolve("Compute", json!({"x": 1})), None);
    assert_eq!(resolve("Both", json!({"code": 1, "command": 2})), None);
}

#[test]
fn names_not_offered_are_left_in_the_text() {
    assert_eq!(
        recover(r#"{"name": "rm_everything", "arguments": {}}"#, &["Bash"]),
        None
    );
    assert_eq!(
        recover(
            "<tool_call>{\"name\": \"Write\", \"arguments\": {}}</tool_call>",
            &["Bash"]
        ),
        None
    );
}

#[test]
fn objects_with_other_keys_are_data() {
    let text = r#"The config is {"name": "Bash", "arguments": {}, "timeout": 3}."#;
    assert_eq!(recover(text, &["Bash"]), None);
}

#[test]
fn prose_and_code_are_not_calls() {
    assert_eq!(recover("Nothing to call here.", &["Bash"]), None);
    assert_eq!(
        recover(
            "```rust\nfn main() { let v = [1, 2]; }\n```\nand {not json} or [1]",
            &["Bash"]
        ),
        None
    );
}

#[test]
fn json_inside_a_code_fence_of_another_language_is_skipped() {
    let text = "```python\nx = {\"name\": \"Bash\", \"arguments\": {}}\n```";
    assert_eq!(recover(text, &["Bash"]), None);
}

#[test]
fn a_call_after_other_json_is_found() {
    let text =
        "Data: {\"rows\": [1, 2]}\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}";
    assert_eq!(
        recover(text, &["Bash"]),
        Some(("Data: {\"rows\": [1, 2]}".to_string(), vec![bash("ls")]))
    );
}

#[test]
fn broken_json_in_a_tag_is_repaired() {
    let text = "<tool_call>{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\",}</tool_call>";
    assert_eq!(
        recover(text, &["Bash"]),
        Some((String::new(), vec![bash("ls")]))
    );
}

#[test]
fn arguments_parse_exact_json() {
    assert_eq!(
        parse_arguments(r#"{"command": "ls -la", "timeout": 5}"#),
        json!({"command": "ls -la", "timeout": 5})
    );
    assert_eq!(parse_arguments("  "), json!({}));
}

#[test]
fn arguments_are_repaired_where_obvious() {
    assert_eq!(
        parse_arguments(r#"{"command": "ls -la""#),
        json!({"command": "ls -la"})
    );
    assert_eq!(parse_arguments(r#"{"a": 1,}"#), json!({"a": 1}));
    assert_eq!(parse_arguments(r#"{'a': 'b'}"#), json!({"a": "b"}));
    assert_eq!(
        parse_arguments(r#""{\"a\": 1}""#),
        json!({"a": 1}),
        "encoded twice"
    );
}

#[test]
fn arguments_beyond_repair_are_kept_raw() {
    for raw in ["ls -la", "[1, 2]", "}{", "42"] {
        assert_eq!(parse_arguments(raw), json!({"_raw": raw}), "{raw}");
    }
}

#[test]
fn deeply_nested_arguments_are_not_repaired() {
    let raw = "{\"a\":[".repeat(5000);
    assert_eq!(parse_arguments(&raw), json!({"_raw": raw}));
}

#[test]
fn schema_is_an_answer_or_a_call_to_an_offered_tool() {
    assert_eq!(
        answer_or_call_format(&tools(&["Bash", "Read"])),
        json!({
            "type": "json_schema",
            "json_schema": {
                "name": "answer_or_tool_call",
                "strict": true,
                "schema": {"anyOf": [
                    {
                        "type": "object",
                        "properties": {"answer": {"type": "string"}},
                        "required": ["answer"],
                        "additionalProperties": false
                    },
                    {
                        "type": "object",
                        "properties": {
                            "tool": {"type": "string", "enum": ["Bash", "Read"]},
                            "arguments": {"type": "object"}
                        },
                        "required": ["tool", "arguments"],
                        "additionalProperties": false
                    }
                ]}
            }
        })
    );
}

#[test]
fn instructions_list_every_tool() {
    let text = json_mode_instructions(&tools(&["Bash", "Read"]));
    let listed = text.split_once("The tools:\n").map(|(_, list)| list);
    assert_eq!(
        listed,
        Some(
            "- Bash: the Bash tool\n  arguments schema: {\"type\":\"object\"}\n\
             - Read: the Read tool\n  arguments schema: {\"type\":\"object\"}\n"
        )
    );
}

fn read(text: &str) -> (String, Vec<(String, Value)>) {
    let r = read_answer_or_call(text, &tools(&["Bash"]));
    (r.text, named(&r.calls))
}

#[test]
fn json_mode_answer() {
    assert_eq!(
        read(r#"{"answer": "It is 4."}"#),
        ("It is 4.".to_string(), vec![])
    );
}

#[test]
fn json_mode_call() {
    assert_eq!(
        read(r#"{"tool": "Bash", "arguments": {"command": "ls"}}"#),
        (String::new(), vec![bash("ls")])
    );
    assert_eq!(
        read(r#"{"tool": "Bash", "arguments": {"command": "ls"}"#),
        (String::new(), vec![bash("ls")]),
        "repaired"
    );
}

#[test]
fn json_mode_unknown_tool_is_text() {
    let text = r#"{"tool": "Nope", "arguments": {}}"#;
    assert_eq!(read(text), (text.to_string(), vec![]));
}

#[test]
fn json_mode_ignored_by_the_server() {
    assert_eq!(read("Just text."), ("Just text.".to_string(), vec![]));
    assert_eq!(
        read("<tool_call>{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}</tool_call>"),
        (String::new(), vec![bash("ls")])
    );
}

#[test]
fn a_call_with_python_quote_escapes_and_no_closing_brace_is_read() {
    // Qwen2.5-Coder-0.5B, verbatim: `\'` is no JSON escape, and the
    // outer object never closes.
    let text = r#"{"name": "mcp__sandbox__execute_code", "arguments": {"code": "print(len([c for c in \'programming language\' if c in \'aeiou\']))"}"#;
    let recovered = recover_tool_calls(text, &tools(&["mcp__sandbox__execute_code"])).unwrap();
    assert_eq!(
        named(&recovered.calls),
        [(
            "mcp__sandbox__execute_code".to_string(),
            json!({"code": "print(len([c for c in 'programming language' if c in 'aeiou']))"})
        )]
    );
    // Closed, it is read without the repairing parser.
    let closed = format!("{text}}} and then");
    let recovered = recover_tool_calls(&closed, &tools(&["mcp__sandbox__execute_code"])).unwrap();
    assert_eq!(recovered.calls.len(), 1);
    assert_eq!(recovered.text, "and then");
    assert_eq!(valid_escapes(r#""a\qb""#), r#""a\\qb""#);
    assert_eq!(valid_escapes(r#""a\"b\n""#), r#""a\"b\n""#);
}

#[test]
fn a_reply_that_alternates_calls_without_end_is_cut() {
    let two = "{\"name\": \"Bash\", \"arguments\": {\"command\": \"python -c 'print(1)'\"}}\n\
               {\"name\": \"mcp__sandbox__execute_code\", \"arguments\": {\"code\": \"print(2)\"}}\n";
    assert!(!writes_too_many_calls(&two.repeat(4)));
    assert!(writes_too_many_calls(&two.repeat(9)));
}
