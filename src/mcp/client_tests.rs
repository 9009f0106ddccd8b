use super::*;

#[test]
fn the_offered_tools_are_the_named_ones() {
    let names: Vec<String> = builtin_specs(60).into_iter().map(|s| s.name).collect();
    assert_eq!(names, crate::agent::tools::SANDBOX_TOOLS);
}

#[test]
fn agent_tools_map_to_mcp_tools_with_confined_paths() {
    let (tool, args) = translate("Read", &json!({"file_path": "a.py"}), "/workspace/p").unwrap();
    assert_eq!(
        (tool, args),
        (
            "read_file",
            json!({"path": "/workspace/p/a.py", "expect": null})
        )
    );
    // Where the permission check resolved the path goes with it.
    let resolved = json!({"file_path": "a.py", "expect_path": "/workspace/real/a.py"});
    let (_, args) = translate("Read", &resolved, "/workspace/p").unwrap();
    assert_eq!(args["expect"], "/workspace/real/a.py");
    let err = translate(
        "Write",
        &json!({"file_path": "../../etc/x", "content": ""}),
        "/workspace",
    )
    .unwrap_err();
    assert!(err.contains("outside /workspace"), "{err}");
    let (tool, args) = translate(
        "Bash",
        &json!({"command": "ls", "timeout": 1500}),
        "/workspace/p",
    )
    .unwrap();
    assert_eq!(tool, "execute_shell");
    assert_eq!(
        args["command"],
        "mkdir -p '/workspace/p' && cd '/workspace/p' && ls"
    );
    assert_eq!(args["timeout"], 2);
    assert!(translate("Nope", &json!({}), "/workspace").is_err());
    assert!(
        translate("Read", &json!({}), "/workspace")
            .unwrap_err()
            .contains("file_path")
    );
}

#[test]
fn read_numbers_lines_and_honours_offset_and_limit() {
    let out = shape(
        "Read",
        &json!({"offset": 2, "limit": 1}),
        json!({"content": "a\nb\nc\n", "truncated": false}),
    );
    assert_eq!(out.output, json!("     2\tb\n"));
    let exec = shape(
        "Bash",
        &json!({}),
        json!({"status": "error", "exit_code": 1}),
    );
    assert!(exec.is_error);
}
