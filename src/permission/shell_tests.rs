use super::*;

fn commands(line: &str) -> Vec<String> {
    let analysis = analyze(line);
    assert_eq!(analysis.opaque, None, "{line}");
    analysis.commands
}

fn opaque(line: &str) -> String {
    analyze(line)
        .opaque
        .unwrap_or_else(|| panic!("{line} should be opaque"))
}

#[test]
fn lists_and_pipelines_are_split() {
    assert_eq!(
        commands("git status; ls -l | wc -l && echo ok || true & sleep 1"),
        ["git status", "ls -l", "wc -l", "echo ok", "true", "sleep 1"]
    );
}

#[test]
fn subshells_braces_functions_and_loops_are_walked() {
    for line in [
        "(rm -rf d)",
        "{ rm -rf d; }",
        "f() { rm -rf d; }; f",
        "if true; then rm -rf d; fi",
        "for x in a; do rm -rf d; done",
        "while false; do :; done; until true; do rm -rf d; done",
        "case x in x) rm -rf d;; esac",
        "echo $(rm -rf d)",
        "echo `rm -rf d`",
        "echo \"$(rm -rf d)\"",
        "X=$(rm -rf d) true",
        "cat <(rm -rf d)",
        "cat <<EOF\n$(rm -rf d)\nEOF",
        "... (rm -rf /workspace/keep) && echo".trim_start_matches("... "),
    ] {
        let found = commands(line);
        assert!(
            found.iter().any(|c| c.starts_with("rm -rf")),
            "{line}: {found:?}"
        );
    }
}

#[test]
fn command_strings_of_wrappers_are_followed() {
    for line in [
        "sh -c 'rm -rf d'",
        "bash -c \"rm -rf d\"",
        "bash -lc 'rm -rf d'",
        "/bin/sh -e -c 'rm -rf d'",
        "eval 'rm -rf d'",
        "eval rm -rf d",
        "echo d | xargs rm -rf",
        "echo d | xargs -n 1 -I {} rm -rf {}",
        "env -i FOO=1 rm -rf d",
        "env -S 'rm -rf d'",
        "exec rm -rf d",
        "nohup rm -rf d",
        "timeout -s KILL 5 rm -rf d",
        "nice -n 10 rm -rf d",
        "command rm -rf d",
        "find . -name x -exec rm -rf {} \\;",
        "bash <<EOF\nrm -rf d\nEOF",
        "sh <<< 'rm -rf d'",
        "sh -c 'sh -c \"rm -rf d\"'",
        "trap 'rm -rf d' EXIT",
        "\"rm\" -rf d",
        "r\\m -rf d",
    ] {
        let found = commands(line);
        assert!(
            found.iter().any(|c| c.starts_with("rm -rf")),
            "{line}: {found:?}"
        );
    }
    let by_name = analyze("/usr/bin/rm -rf d").by_name;
    assert_eq!(by_name, ["rm -rf d"]);
}

#[test]
fn what_the_parser_cannot_see_is_opaque() {
    for (line, why) in [
        ("$cmd -rf d", "expansion"),
        ("{rm,-rf,d}", "expansion"),
        ("sh script.sh", "from a file"),
        ("echo 'rm -rf d' | sh", "from its input"),
        ("bash -c \"$X\"", "expansion"),
        ("eval \"$X\"", "expansion"),
        ("source ./x.sh", "from a file"),
        (". ./x.sh", "from a file"),
        ("alias ls='rm -rf'", "alias"),
        ("echo 'unclosed", "does not parse"),
        ("(((", "does not parse"),
        ("echo $(( $(rm -rf d) ))", "expansion"),
        ("echo ${X:-$(rm -rf d)}", "expansion"),
    ] {
        let said = opaque(line);
        assert!(said.contains(why), "{line}: {said}");
    }
    let deep = format!("{}true{}", "(".repeat(200), ")".repeat(200));
    assert!(opaque(&deep).contains("nests deeper"));
    let nested = format!("{}true", "eval ".repeat(12));
    let said = opaque(&nested);
    assert!(said.contains("command strings nest"), "{said}");
}

#[test]
fn substitutions_and_file_redirections_are_marked() {
    assert!(!analyze("git status 2>&1 >/dev/null").substitutes_or_redirects);
    for line in [
        "git status > out",
        "git log < in",
        "echo $(id)",
        "cat <(id)",
        "ls &> x",
    ] {
        assert!(analyze(line).substitutes_or_redirects, "{line}");
    }
}

#[test]
fn a_long_ordinary_script_parses() {
    let script: String = (0..2000).map(|i| format!("echo line {i}\n")).collect();
    assert_eq!(commands(&script).len(), 2000);
    let heredoc = format!("cat > f.py <<'EOF'\n{}EOF\n", "print('x')\n".repeat(5000));
    assert_eq!(commands(&heredoc), ["cat"]);
}
