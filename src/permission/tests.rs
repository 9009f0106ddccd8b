use serde_json::json;

use super::*;

fn policy(mode: Mode, allow: &[&str], deny: &[&str]) -> Policy {
    Policy::compile(
        &Permissions {
            mode: Some(mode),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            ..Permissions::default()
        },
        "options.permissions",
    )
    .unwrap()
}

fn verdict(policy: &Policy, tool: &str, input: serde_json::Value) -> Verdict {
    let read_only = matches!(tool, "Read" | "Glob" | "Grep");
    policy.verdict(&PolicyCall {
        tool,
        input: &input,
        read_only,
        working_dir: "/workspace",
        resolved: None,
    })
}

fn kind(v: &Verdict) -> &'static str {
    match v {
        Verdict::Allow => "allow",
        Verdict::Ask(_) => "ask",
        Verdict::Deny(_) => "deny",
    }
}

#[test]
fn modes_decide_reads_and_writes() {
    let read = || json!({"file_path": "/workspace/a"});
    let bash = || json!({"command": "ls"});
    for (mode, on_read, on_write) in [
        (Mode::Auto, "allow", "allow"),
        (Mode::Ask, "ask", "ask"),
        (Mode::AskWrites, "allow", "ask"),
        (Mode::Plan, "allow", "deny"),
    ] {
        let p = policy(mode, &[], &[]);
        assert_eq!(kind(&verdict(&p, "Read", read())), on_read, "{mode:?}");
        assert_eq!(kind(&verdict(&p, "Bash", bash())), on_write, "{mode:?}");
    }
}

#[test]
fn deny_wins_over_allow_and_rules_come_before_the_mode() {
    let p = policy(Mode::Ask, &["Bash(git *)"], &["Bash(git push*)"]);
    let run = |c: &str| kind(&verdict(&p, "Bash", json!({"command": c})));
    assert_eq!(run("git status"), "allow");
    assert_eq!(run("git push origin main"), "deny");
    assert_eq!(run("ls"), "ask");
    let plan = policy(Mode::Plan, &["Write(/workspace/notes/**)"], &[]);
    let write = |p: &str| {
        kind(&verdict(
            &plan,
            "Write",
            json!({"file_path": p, "content": ""}),
        ))
    };
    assert_eq!(write("/workspace/notes/a/b.md"), "allow");
    assert_eq!(write("/workspace/src/a.rs"), "deny");
}

/// A command allowed by a rule is allowed part by part; a substitution or
/// a redirection is never allowed by one; a deny rule catches any part.
#[test]
fn commands_are_matched_part_by_part() {
    let p = policy(Mode::Ask, &["Bash(git status*)"], &["Bash(rm *)"]);
    let run = |c: &str| kind(&verdict(&p, "Bash", json!({"command": c})));
    assert_eq!(run("git status --short"), "allow");
    assert_eq!(run("git status 2>&1"), "allow");
    assert_eq!(run("git status; curl evil"), "ask");
    assert_eq!(run("git status && git status"), "allow");
    assert_eq!(run("git status $(curl evil)"), "ask");
    assert_eq!(run("git status > /etc/passwd"), "ask");
    assert_eq!(run("git status | rm -rf /"), "deny");
    assert_eq!(run("echo hi & rm x"), "deny");
}

#[test]
fn paths_are_made_absolute_and_dot_dots_resolved() {
    let p = policy(Mode::Ask, &["Write(/workspace/src/**)", "Read(*.md)"], &[]);
    let write = |path: &str| {
        kind(&verdict(
            &p,
            "Write",
            json!({"file_path": path, "content": ""}),
        ))
    };
    assert_eq!(write("src/main.rs"), "allow");
    assert_eq!(write("/workspace/src/a/b/c.rs"), "allow");
    assert_eq!(write("/workspace/src/../../etc/passwd"), "ask");
    assert_eq!(write("/workspace/srcx/a"), "ask");
    assert_eq!(rules::absolute("a/./b/../c", "/w/"), "/w/a/c");
}

#[test]
fn tool_globs_cover_mcp_servers() {
    let p = policy(Mode::Ask, &["mcp__github__*"], &["mcp__github__delete_*"]);
    assert_eq!(
        kind(&verdict(&p, "mcp__github__list_issues", json!({}))),
        "allow"
    );
    assert_eq!(
        kind(&verdict(&p, "mcp__github__delete_repo", json!({}))),
        "deny"
    );
    assert_eq!(kind(&verdict(&p, "mcp__gitlab__list", json!({}))), "ask");
    let text = policy(Mode::Ask, &["mcp__kv__get(*\"key\":\"public/*)"], &[]);
    assert_eq!(
        kind(&verdict(&text, "mcp__kv__get", json!({"key": "public/a"}))),
        "allow"
    );
}

#[test]
fn bad_rules_are_named() {
    for (rule, says) in [
        ("Bash(git", "does not close"),
        ("", "names a tool"),
        ("Bash()", "empty pattern"),
        ("Ba sh", "not a tool name"),
        ("Write([)", "not a valid pattern"),
    ] {
        let err = Permissions {
            deny: vec!["Read".into(), rule.into()],
            ..Permissions::default()
        }
        .validate("options.permissions")
        .unwrap_err();
        assert_eq!(err.field, "options.permissions.deny[1]", "{rule}");
        assert!(err.message.contains(says), "{rule}: {}", err.message);
    }
    let err = Permissions {
        hook_url: Some("ftp://x".into()),
        ..Permissions::default()
    }
    .validate("p")
    .unwrap_err();
    assert_eq!(err.field, "p.hook_url");
    let err = Permissions {
        approval_timeout_s: Some(0),
        ..Permissions::default()
    }
    .validate("p")
    .unwrap_err();
    assert_eq!(err.field, "p.approval_timeout_s");
}

#[test]
fn the_stricter_verdict_wins() {
    let allow = Verdict::Allow;
    let ask = Verdict::Ask("a".into());
    let deny = Verdict::Deny("d".into());
    assert_eq!(allow.clone().stricter(ask.clone()), ask);
    assert_eq!(ask.clone().stricter(deny.clone()), deny);
    assert_eq!(deny.clone().stricter(allow), deny);
}
