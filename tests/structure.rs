//! The shape of `src/`, checked as the code is: no import loop between
//! top-level modules, no source file past 600 lines, and no function past
//! 120 lines where the server is assembled, configured and runs its turns.
//!
//! A failure names the file and line to look at.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 120;
/// Folders of `src/` whose functions are held to [`MAX_FN_LINES`].
const SHORT_FN_DIRS: [&str; 3] = ["server", "config", "agent"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Test files are named after it (`tests.rs`, `lease_tests.rs`).
fn is_test_file(path: &Path) -> bool {
    path.file_name().unwrap().to_string_lossy().contains("test")
}

fn relative(path: &Path) -> String {
    path.strip_prefix(src().parent().unwrap())
        .unwrap()
        .display()
        .to_string()
}

/// The text with comments, string and char literals blanked (newlines
/// kept, so line numbers hold), for counting braces and finding paths.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r'
            && matches!(next, Some('"' | '#'))
            && !chars
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &c in &chars[i..j.min(chars.len())] {
                blank(&mut out, c);
            }
            i = j;
        } else if c == '"' {
            blank(&mut out, c);
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                if i < chars.len() {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
            if i < chars.len() {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{7f}'), not a lifetime ('a).
            let end = if next == Some('\\') {
                (i + 2..chars.len()).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    for &c in &chars[i..=end] {
                        blank(&mut out, c);
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The top-level module a file of `src/` belongs to; `None` for the crate
/// root and the binaries.
fn top_module(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    let top = first.trim_end_matches(".rs").to_string();
    (!matches!(top.as_str(), "main" | "lib" | "bin")).then_some(top)
}

/// `crate::NAME` paths in `line`.
fn crate_paths(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let before = &line[..line.len() - rest.len() + at];
        rest = &rest[at + "crate::".len()..];
        if before
            .chars()
            .last()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.push(name);
        }
    }
    found
}

/// module → (imported module → the first `file:line` that imports it).
fn module_graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for path in rust_files(&src()) {
        let Some(top) = top_module(&path) else {
            continue;
        };
        if is_test_file(&path) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap();
        for (n, line) in code_only(text).lines().enumerate() {
            for imported in crate_paths(line) {
                if imported != top {
                    edges
                        .entry(top.clone())
                        .or_default()
                        .entry(imported)
                        .or_insert_with(|| format!("{}:{}", relative(&path), n + 1));
                }
            }
        }
    }
    edges
}

/// The shortest loop from `start` back to it, if any.
fn shortest_loop(
    edges: &BTreeMap<String, BTreeMap<String, String>>,
    start: &str,
) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<String, Option<String>> = BTreeMap::new();
    came_from.insert(start.to_string(), None);
    let mut queue = VecDeque::from([start.to_string()]);
    while let Some(module) = queue.pop_front() {
        for next in edges.get(&module).into_iter().flat_map(|e| e.keys()) {
            if next == start {
                let mut path = vec![module.clone()];
                while let Some(Some(prev)) = came_from.get(path.last().unwrap()) {
                    path.push(prev.clone());
                }
                path.reverse();
                path.push(start.to_string());
                return Some(path);
            }
            if !came_from.contains_key(next) {
                came_from.insert(next.clone(), Some(module.clone()));
                queue.push_back(next.clone());
            }
        }
    }
    None
}

#[test]
fn top_level_modules_import_each_other_in_no_loop() {
    let edges = module_graph();
    assert!(
        edges.len() > 10,
        "the module graph has too few modules to be the crate's: {edges:?}"
    );
    let mut reported = BTreeSet::new();
    let mut loops = Vec::new();
    for module in edges.keys() {
        let Some(path) = shortest_loop(&edges, module) else {
            continue;
        };
        let arrows: BTreeSet<(String, String)> = path
            .windows(2)
            .map(|w| (w[0].clone(), w[1].clone()))
            .collect();
        if !reported.insert(arrows) {
            continue;
        }
        let mut text = path.join(" -> ");
        for w in path.windows(2) {
            text += &format!("\n    {} -> {}  ({})", w[0], w[1], edges[&w[0]][&w[1]]);
        }
        loops.push(text);
    }
    assert!(
        loops.is_empty(),
        "import loops between top-level modules of src/:\n{}",
        loops.join("\n")
    );
}

#[test]
fn no_source_file_is_longer_than_600_lines() {
    let long: Vec<String> = rust_files(&src())
        .into_iter()
        .filter(|path| !is_test_file(path))
        .filter_map(|path| {
            let lines = std::fs::read_to_string(&path).unwrap().lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{} ({lines} lines)", relative(&path)))
        })
        .collect();
    assert!(
        long.is_empty(),
        "source files over {MAX_FILE_LINES} lines: {long:?}"
    );
}

/// Each function in `text` as (name, first line, lines).
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| *w == "fn") else {
            continue;
        };
        // `fn` as an item, not in a type (`impl Fn`, `fn(u8)` pointers).
        let qualifiers_only = words[..at].iter().all(|w| {
            w.starts_with("pub")
                || matches!(*w, "async" | "const" | "unsafe" | "extern" | "default")
        });
        let Some(name) = words.get(at + 1) else {
            continue;
        };
        if !qualifiers_only || name.starts_with('(') {
            continue;
        }
        let name: String = name
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The body: from the first `{` (or a `;` before it: no body) to its
        // matching `}`.
        let mut depth = 0usize;
        let mut opened = false;
        let mut end = None;
        'scan: for (n, l) in lines.iter().enumerate().skip(start) {
            for c in l.chars() {
                match c {
                    ';' if !opened => break 'scan,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' if opened => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(n);
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(end) = end {
            found.push((name, start + 1, end - start + 1));
        }
    }
    found
}

#[test]
fn no_function_in_server_config_or_agent_is_longer_than_120_lines() {
    let mut long = Vec::new();
    let mut counted = 0;
    for dir in SHORT_FN_DIRS {
        for path in rust_files(&src().join(dir)) {
            if is_test_file(&path) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let text = text.split("#[cfg(test)]").next().unwrap();
            for (name, line, lines) in functions(text) {
                counted += 1;
                if lines > MAX_FN_LINES {
                    long.push(format!(
                        "{}:{line} fn {name} ({lines} lines)",
                        relative(&path)
                    ));
                }
            }
        }
    }
    assert!(
        counted > 100,
        "found only {counted} functions: the scan is wrong"
    );
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_scans_see_what_they_look_for() {
    // A path in a comment or a string is no import; one in code is.
    let code = code_only(
        "use crate::a; // crate::b\nlet s = \"crate::c\"; r#\"crate::d\"#; crate::e::f();",
    );
    let found: Vec<String> = code.lines().flat_map(crate_paths).collect();
    assert_eq!(found, ["a", "e"]);
    let fns = functions(
        "pub async fn one() {\n    let s = \"}\";\n    if x { y }\n}\nfn two();\nfn three(f: impl Fn() -> u8) -> u8 { f() }\n",
    );
    assert_eq!(
        fns,
        [("one".to_string(), 1, 4), ("three".to_string(), 6, 1)]
    );
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (a, b) in [("x", "y"), ("y", "z"), ("z", "x"), ("y", "w")] {
        edges
            .entry(a.into())
            .or_default()
            .insert(b.into(), "f.rs:1".into());
    }
    assert_eq!(
        shortest_loop(&edges, "x").unwrap(),
        ["x", "y", "z", "x"].map(String::from)
    );
    assert_eq!(shortest_loop(&edges, "w"), None);
}
