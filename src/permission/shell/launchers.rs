//! The programs that run a command given in their arguments (`sh -c`,
//! `eval`, `env`, `xargs`, `find -exec` …): the command they run is
//! walked as one more simple command, or as a script.

use super::{Walk, Word};

impl Walk<'_> {
    /// Records a simple command, and follows the command it runs when its
    /// program runs one given in its arguments.
    pub(super) fn run(&mut self, words: &[Word], here_input: Option<&str>) {
        let Some(name) = words.first() else {
            return;
        };
        let Some(program) = name.literal.as_deref() else {
            return self.opaque(format!(
                "the command name `{}` is made by an expansion",
                name.text
            ));
        };
        let texts: Vec<&str> = words.iter().map(|w| w.text.as_str()).collect();
        let base = program.rsplit('/').next().unwrap_or(program);
        self.out.commands.push(texts.join(" "));
        let mut by_name = texts.clone();
        by_name[0] = base;
        self.out.by_name.push(by_name.join(" "));
        let args = &words[1..];
        match base {
            "sh" | "bash" | "dash" | "zsh" | "ksh" | "mksh" | "ash" | "busybox" => {
                self.shell(base, args, here_input);
            }
            "eval" => {
                let text: Option<Vec<&str>> = args.iter().map(|w| w.literal.as_deref()).collect();
                match text {
                    Some(parts) => self.nested_script(&parts.join(" ")),
                    None => self.opaque("`eval` of words an expansion makes"),
                }
            }
            "source" | "." => self.opaque(format!("`{base}` runs a script from a file")),
            "alias" => self.opaque("an `alias` renames commands"),
            "trap" => match args.first().and_then(|w| w.literal.as_deref()) {
                Some(action) if !action.starts_with('-') => self.nested_script(action),
                Some(_) => {}
                None if args.is_empty() => {}
                None => self.opaque("a `trap` action an expansion makes"),
            },
            "exec" | "nohup" | "builtin" | "time" | "setsid" => {
                let rest = skip_options(args, &[]);
                self.run_rest(rest, here_input);
            }
            "command" => {
                if args.first().and_then(|w| w.literal.as_deref()) == Some("-v")
                    || args.first().and_then(|w| w.literal.as_deref()) == Some("-V")
                {
                    return;
                }
                self.run_rest(skip_options(args, &[]), here_input);
            }
            "nice" => self.run_rest(skip_options(args, &["-n", "--adjustment"]), here_input),
            "stdbuf" => self.run_rest(skip_options(args, &["-i", "-o", "-e"]), here_input),
            "sudo" | "doas" => self.run_rest(
                skip_options(
                    args,
                    &["-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"],
                ),
                here_input,
            ),
            "timeout" => {
                let rest = skip_options(args, &["-s", "--signal", "-k", "--kill-after"]);
                // The first operand is the duration.
                self.run_rest(rest.get(1..).unwrap_or_default(), here_input);
            }
            "xargs" => {
                let rest = skip_options(
                    args,
                    &[
                        "-I",
                        "-i",
                        "-n",
                        "-P",
                        "-d",
                        "-E",
                        "-e",
                        "-L",
                        "-l",
                        "-s",
                        "-a",
                        "--max-args",
                        "--max-procs",
                        "--delimiter",
                        "--arg-file",
                        "--max-lines",
                        "--max-chars",
                        "--replace",
                        "--eof",
                    ],
                );
                // With no command, xargs runs `echo`.
                self.run_rest(rest, None);
            }
            "env" => self.env(args, here_input),
            "find" => self.find(args),
            _ => {}
        }
    }

    /// The command a wrapper runs: its remaining words.
    fn run_rest(&mut self, rest: &[Word], here_input: Option<&str>) {
        if !rest.is_empty() {
            self.run(rest, here_input);
        }
    }

    /// `sh -c STRING`, `sh` reading a here-document, or a script it reads
    /// from somewhere the parser cannot see.
    fn shell(&mut self, program: &str, args: &[Word], here_input: Option<&str>) {
        let mut at = 0;
        if program == "busybox" {
            // `busybox sh …` is the shell; `busybox rm …` is rm.
            match args.first().and_then(|w| w.literal.as_deref()) {
                Some("sh" | "ash" | "bash") => at = 1,
                Some(_) => return self.run_rest(args, here_input),
                None if args.is_empty() => return,
                None => return self.opaque("a busybox applet an expansion names"),
            }
        }
        let mut command_string = false;
        while let Some(word) = args.get(at) {
            let Some(text) = word.literal.as_deref() else {
                return self.opaque(format!("`{program}` is given words an expansion makes"));
            };
            if text == "--" || !text.starts_with(['-', '+']) {
                break;
            }
            if text.starts_with('-') && !text.starts_with("--") && text.contains('c') {
                command_string = true;
            }
            if matches!(text, "-o" | "+o" | "-O" | "+O" | "--init-file" | "--rcfile") {
                at += 1;
            }
            at += 1;
        }
        if args.get(at).and_then(|w| w.literal.as_deref()) == Some("--") {
            at += 1;
        }
        if command_string {
            match args.get(at) {
                Some(word) => match word.literal.as_deref() {
                    Some(script) => self.nested_script(script),
                    None => self.opaque(format!("`{program} -c` of a string an expansion makes")),
                },
                None => self.opaque(format!("`{program} -c` without a command string")),
            }
        } else if args.get(at).is_some() {
            self.opaque(format!("`{program}` runs a script from a file"));
        } else {
            match here_input {
                Some(script) => self.nested_script(script),
                None => self.opaque(format!("`{program}` reads its script from its input")),
            }
        }
    }

    /// `env [-i] [-u NAME] [-C DIR] [-S STRING] [NAME=VALUE]… [COMMAND …]`.
    fn env(&mut self, args: &[Word], here_input: Option<&str>) {
        let mut at = 0;
        while let Some(word) = args.get(at) {
            let Some(text) = word.literal.as_deref() else {
                return self.opaque("`env` is given words an expansion makes");
            };
            if text == "-S" || text == "--split-string" {
                match args.get(at + 1).and_then(|w| w.literal.as_deref()) {
                    Some(script) => return self.nested_script(script),
                    None => return self.opaque("`env -S` of a string an expansion makes"),
                }
            }
            if let Some(script) = text
                .strip_prefix("-S")
                .or_else(|| text.strip_prefix("--split-string="))
            {
                return self.nested_script(script);
            }
            if matches!(text, "-u" | "--unset" | "-C" | "--chdir") {
                at += 2;
            } else if text.starts_with('-') || text.contains('=') {
                at += 1;
            } else {
                break;
            }
        }
        self.run_rest(args.get(at..).unwrap_or_default(), here_input);
    }

    /// `find … -exec COMMAND … ;` (and `-execdir`, `-ok`, `-okdir`).
    fn find(&mut self, args: &[Word]) {
        let mut at = 0;
        while at < args.len() {
            let launches = matches!(
                args[at].literal.as_deref(),
                Some("-exec" | "-execdir" | "-ok" | "-okdir")
            );
            at += 1;
            if !launches {
                continue;
            }
            let end = args[at..]
                .iter()
                .position(|w| matches!(w.literal.as_deref(), Some(";" | "+")))
                .map_or(args.len(), |i| at + i);
            self.run_rest(&args[at..end], None);
            at = end + 1;
        }
    }
}

/// The words after a wrapper's options (`-n 5`, `--`), where `with_value`
/// names the options whose value is the next word.
fn skip_options<'w>(args: &'w [Word], with_value: &[&str]) -> &'w [Word] {
    let mut at = 0;
    while let Some(text) = args.get(at).map(|w| w.text.as_str()) {
        if text == "--" {
            at += 1;
            break;
        }
        if !text.starts_with('-') || text == "-" {
            break;
        }
        at += if with_value.contains(&text) { 2 } else { 1 };
    }
    args.get(at..).unwrap_or_default()
}
