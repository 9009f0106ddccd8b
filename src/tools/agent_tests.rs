use super::*;

#[test]
fn the_offered_tools_are_the_named_ones() {
    let names: Vec<String> = builtin_specs(60).into_iter().map(|s| s.name).collect();
    assert_eq!(names, crate::agent::tools::SANDBOX_TOOLS);
}

#[test]
fn agent_tools_map_to_sandbox_tools_with_confined_paths() {
    let Request::Read(read) =
        translate("Read", &json!({"file_path": "a.py"}), "/workspace/p").unwrap()
    else {
        panic!("Read is read_file");
    };
    assert_eq!(read.path, "/workspace/p/a.py");
    assert_eq!(read.expect, None);
    // Where the permission check resolved the path goes with it.
    let resolved = json!({"file_path": "a.py", "expect_path": "/workspace/real/a.py"});
    let Request::Read(read) = translate("Read", &resolved, "/workspace/p").unwrap() else {
        panic!("Read is read_file");
    };
    assert_eq!(read.expect.as_deref(), Some("/workspace/real/a.py"));
    let err = translate(
        "Write",
        &json!({"file_path": "../../etc/x", "content": ""}),
        "/workspace",
    )
    .unwrap_err();
    assert!(err.contains("outside /workspace"), "{err}");
    let Request::Shell(shell) = translate(
        "Bash",
        &json!({"command": "ls", "timeout": 1500}),
        "/workspace/p",
    )
    .unwrap() else {
        panic!("Bash is execute_shell");
    };
    assert_eq!(
        shell.command,
        "mkdir -p '/workspace/p' && cd '/workspace/p' && ls"
    );
    assert_eq!(shell.timeout, Some(2));
    assert!(!shell.background);
    assert!(translate("Nope", &json!({}), "/workspace").is_err());
    assert!(
        translate("Read", &json!({}), "/workspace")
            .unwrap_err()
            .contains("file_path")
    );
}

#[test]
fn the_sandbox_tools_arguments_are_checked_as_the_mcp_server_checks_them() {
    let Request::Code(code) = translate(
        "mcp__sandbox__execute_code",
        &json!({"code": "1+1", "language": "python", "timeout": 5, "session_id": "x", "repair": null}),
        "/workspace",
    )
    .unwrap() else {
        panic!("execute_code");
    };
    assert_eq!((code.code.as_str(), code.timeout), ("1+1", Some(5)));
    // The session is the caller's own, whatever the model says.
    assert_eq!(code.session_id, None);
    let err = translate(
        "mcp__sandbox__execute_code",
        &json!({"code": "1", "timeout": "soon"}),
        "/workspace",
    )
    .unwrap_err();
    assert!(err.contains("timeout"), "{err}");
    let err = translate(
        "mcp__sandbox__execute_shell",
        &json!({"command": "ls", "timeout": -1}),
        "/workspace",
    )
    .unwrap_err();
    assert!(err.contains("timeout"), "{err}");
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
