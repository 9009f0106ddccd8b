//! What a shell command line can run: every simple command in it, found by
//! a real shell parser (brush-parser), inside subshells, braces, functions,
//! loops, `$(…)`, backticks, process substitutions and here-documents, and
//! inside the command strings of the programs that run a command given as
//! their arguments (`sh -c`, `bash -c`, `eval`, `xargs`, `env`, `exec`,
//! `nohup`, `timeout`, `nice`, `command`, `find -exec` …).
//!
//! What the parser cannot see into makes the line *opaque*: a script read
//! from a file or a pipe (`sh script.sh`, `… | sh`), `source`, an `alias`,
//! a command name that only an expansion makes (`$cmd`, `{rm,-rf}`), a
//! command string that is not a literal, a line that does not parse, or
//! one nested past the bounds below. An opaque line never matches an
//! allow rule, and a tool with any deny rule refuses it.

use brush_parser::ParserOptions;
use brush_parser::ast::{
    self, Command, CommandPrefixOrSuffixItem, CompoundCommand, CompoundList, IoFileRedirectKind,
    IoFileRedirectTarget, IoRedirect, Pipeline,
};
use brush_parser::word::{self, WordPiece, WordPieceWithSource};

/// The longest command line that is parsed; a longer one is opaque.
const MAX_LEN: usize = 256 * 1024;
/// How deep brackets may nest before a line is opaque: the parser
/// recurses once per level.
const MAX_NESTING: usize = 64;
/// How many command strings inside command strings are followed.
const MAX_DEPTH: usize = 8;

/// The simple commands a line can run.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Analysis {
    /// Each simple command as its words read (quotes removed where a word
    /// is a literal), the command's name as given.
    pub commands: Vec<String>,
    /// The same commands with each name's directory dropped (`/bin/rm`
    /// is `rm`): what deny rules match as well.
    pub by_name: Vec<String>,
    /// Why the parser cannot see everything the line runs.
    pub opaque: Option<String>,
    /// A word substitutes a command's output, or a redirection reads or
    /// writes a file: what no allow rule vouches for.
    pub substitutes_or_redirects: bool,
}

/// Finds every simple command `line` can run.
pub fn analyze(line: &str) -> Analysis {
    let mut analysis = Analysis::default();
    Walk {
        out: &mut analysis,
        depth: 0,
    }
    .script(line);
    analysis
}

struct Walk<'a> {
    out: &'a mut Analysis,
    /// How many command strings deep the walk is.
    depth: usize,
}

impl Walk<'_> {
    fn opaque(&mut self, why: impl Into<String>) {
        if self.out.opaque.is_none() {
            self.out.opaque = Some(why.into());
        }
    }

    /// Parses and walks a whole script (a command line or a command
    /// string inside one).
    fn script(&mut self, text: &str) {
        if self.depth > MAX_DEPTH {
            return self.opaque(format!("command strings nest deeper than {MAX_DEPTH}"));
        }
        if text.len() > MAX_LEN {
            return self.opaque(format!("longer than {MAX_LEN} bytes"));
        }
        if nesting(text) > MAX_NESTING {
            return self.opaque(format!("nests deeper than {MAX_NESTING} levels"));
        }
        let options = ParserOptions::default();
        let mut parser = brush_parser::Parser::new(text.as_bytes(), &options);
        match parser.parse_program() {
            Ok(program) => {
                for complete in &program.complete_commands {
                    self.list(complete);
                }
            }
            Err(e) => self.opaque(format!("it does not parse: {e}")),
        }
    }

    /// A command string given to a program that runs it as a script.
    fn nested_script(&mut self, text: &str) {
        self.depth += 1;
        self.script(text);
        self.depth -= 1;
    }

    fn list(&mut self, list: &CompoundList) {
        for item in &list.0 {
            self.pipeline(&item.0.first);
            for next in &item.0.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p),
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &Pipeline) {
        for command in &pipeline.seq {
            self.command(command);
        }
    }

    fn command(&mut self, command: &Command) {
        match command {
            Command::Simple(simple) => self.simple(simple),
            Command::Compound(compound, redirects) => {
                self.compound(compound);
                for redirect in redirects.iter().flat_map(|r| &r.0) {
                    self.redirect(redirect, None);
                }
            }
            Command::Function(function) => {
                self.compound(&function.body.0);
                for redirect in function.body.1.iter().flat_map(|r| &r.0) {
                    self.redirect(redirect, None);
                }
            }
            Command::ExtendedTest(test, redirects) => {
                self.unseen(&test.to_string(), "a `[[ … ]]` test");
                for redirect in redirects.iter().flat_map(|r| &r.0) {
                    self.redirect(redirect, None);
                }
            }
        }
    }

    fn compound(&mut self, compound: &CompoundCommand) {
        match compound {
            CompoundCommand::Arithmetic(a) => self.unseen(&a.expr.value, "an arithmetic command"),
            CompoundCommand::ArithmeticForClause(a) => {
                for expr in [&a.initializer, &a.condition, &a.updater]
                    .into_iter()
                    .flatten()
                {
                    self.unseen(&expr.value, "an arithmetic `for`");
                }
                self.list(&a.body.list);
            }
            CompoundCommand::BraceGroup(b) => self.list(&b.list),
            CompoundCommand::Subshell(s) => self.list(&s.list),
            CompoundCommand::ForClause(f) => {
                for value in f.values.iter().flatten() {
                    self.word(&value.value);
                }
                self.list(&f.body.list);
            }
            CompoundCommand::CaseClause(c) => {
                self.word(&c.value.value);
                for case in &c.cases {
                    for pattern in &case.patterns {
                        self.word(&pattern.value);
                    }
                    if let Some(list) = &case.cmd {
                        self.list(list);
                    }
                }
            }
            CompoundCommand::IfClause(i) => {
                self.list(&i.condition);
                self.list(&i.then);
                for branch in i.elses.iter().flatten() {
                    if let Some(condition) = &branch.condition {
                        self.list(condition);
                    }
                    self.list(&branch.body);
                }
            }
            CompoundCommand::WhileClause(w) | CompoundCommand::UntilClause(w) => {
                self.list(&w.0);
                self.list(&w.1.list);
            }
            CompoundCommand::Coprocess(c) => self.command(&c.body),
        }
    }

    /// Text the walk does not take apart: opaque if it could run a
    /// command (a substitution inside it).
    fn unseen(&mut self, text: &str, what: &str) {
        if runs_commands(text) {
            self.opaque(format!("{what} substitutes a command's output"));
        }
    }

    fn simple(&mut self, simple: &ast::SimpleCommand) {
        let mut words: Vec<Word> = Vec::new();
        let mut here_input: Option<String> = None;
        // The prefix holds assignments and redirections, the name comes
        // next, then the suffix: the order the shell reads them in.
        for item in simple.prefix.iter().flat_map(|p| &p.0) {
            self.item(item, &mut words, &mut here_input);
        }
        if let Some(name) = &simple.word_or_name {
            words.push(self.word(&name.value));
        }
        for item in simple.suffix.iter().flat_map(|s| &s.0) {
            self.item(item, &mut words, &mut here_input);
        }
        if words.is_empty() {
            return;
        }
        self.run(&words, here_input.as_deref());
    }

    fn item(
        &mut self,
        item: &CommandPrefixOrSuffixItem,
        words: &mut Vec<Word>,
        here_input: &mut Option<String>,
    ) {
        match item {
            CommandPrefixOrSuffixItem::Word(w) => words.push(self.word(&w.value)),
            CommandPrefixOrSuffixItem::AssignmentWord(_, w) => {
                // `X=$(cmd)` runs cmd; the assignment is no word of the
                // command.
                self.word(&w.value);
            }
            CommandPrefixOrSuffixItem::IoRedirect(r) => self.redirect(r, Some(here_input)),
            CommandPrefixOrSuffixItem::ProcessSubstitution(_, s) => {
                self.out.substitutes_or_redirects = true;
                self.list(&s.list);
            }
        }
    }

    /// A word: its literal text, walking the commands it substitutes.
    fn word(&mut self, raw: &str) -> Word {
        let options = ParserOptions::default();
        match word::parse(raw, &options) {
            Ok(pieces) => {
                let literal = self.pieces(raw, &pieces);
                Word {
                    text: literal.clone().unwrap_or_else(|| raw.to_string()),
                    literal,
                }
            }
            Err(_) => {
                if runs_commands(raw) {
                    self.opaque(format!("the word `{raw}` does not parse"));
                }
                Word {
                    text: raw.to_string(),
                    literal: None,
                }
            }
        }
    }

    /// The literal text of a word's pieces, `None` when an expansion makes
    /// part of it; substitutions in it are walked.
    fn pieces(&mut self, raw: &str, pieces: &[WordPieceWithSource]) -> Option<String> {
        let mut literal = Some(String::new());
        let push = |literal: &mut Option<String>, text: &str| {
            if let Some(l) = literal.as_mut() {
                l.push_str(text);
            }
        };
        for piece in pieces {
            match &piece.piece {
                WordPiece::Text(t) => {
                    // Unquoted globs and braces expand: not a literal.
                    if t.contains(['*', '?', '[', '{']) {
                        literal = None;
                    }
                    push(&mut literal, t);
                }
                WordPiece::SingleQuotedText(t) => push(&mut literal, t),
                WordPiece::EscapeSequence(t) => push(&mut literal, t.trim_start_matches('\\')),
                WordPiece::DoubleQuotedSequence(inner)
                | WordPiece::GettextDoubleQuotedSequence(inner) => {
                    let text = self.pieces(raw, inner);
                    match text {
                        Some(t) => push(&mut literal, &t),
                        None => literal = None,
                    }
                }
                WordPiece::CommandSubstitution(script)
                | WordPiece::BackquotedCommandSubstitution(script) => {
                    self.out.substitutes_or_redirects = true;
                    self.nested_script(script);
                    literal = None;
                }
                WordPiece::AnsiCQuotedText(_)
                | WordPiece::TildeExpansion(_)
                | WordPiece::ParameterExpansion(_)
                | WordPiece::ArithmeticExpression(_) => {
                    let source = raw.get(piece.start_index..piece.end_index).unwrap_or(raw);
                    self.unseen(source, "an expansion");
                    literal = None;
                }
            }
        }
        literal
    }

    fn redirect(&mut self, redirect: &IoRedirect, here_input: Option<&mut Option<String>>) {
        match redirect {
            IoRedirect::File(_, kind, target) => match target {
                IoFileRedirectTarget::Filename(w) => {
                    let name = self.word(&w.value);
                    let to_null = name.literal.as_deref() == Some("/dev/null");
                    let dup = matches!(
                        kind,
                        IoFileRedirectKind::DuplicateInput | IoFileRedirectKind::DuplicateOutput
                    );
                    if !to_null && !dup {
                        self.out.substitutes_or_redirects = true;
                    }
                }
                IoFileRedirectTarget::Fd(_) => {}
                IoFileRedirectTarget::Duplicate(w) => {
                    let target = self.word(&w.value);
                    let fd = target.literal.as_deref().is_some_and(|t| {
                        t.trim_end_matches('-').chars().all(|c| c.is_ascii_digit())
                    });
                    if !fd {
                        self.out.substitutes_or_redirects = true;
                    }
                }
                IoFileRedirectTarget::ProcessSubstitution(_, s) => {
                    self.out.substitutes_or_redirects = true;
                    self.list(&s.list);
                }
            },
            IoRedirect::HereDocument(_, doc) => {
                let body = doc.doc.value.clone();
                if doc.requires_expansion {
                    let options = ParserOptions::default();
                    match word::parse_heredoc(&body, &options) {
                        Ok(pieces) => {
                            self.pieces(&body, &pieces);
                        }
                        Err(_) => self.unseen(&body, "a here-document"),
                    }
                }
                if let Some(input) = here_input {
                    *input = Some(body);
                }
            }
            IoRedirect::HereString(_, w) => {
                let word = self.word(&w.value);
                if let Some(input) = here_input {
                    *input = Some(word.literal.unwrap_or(word.text));
                }
            }
            IoRedirect::OutputAndError(w, _) => {
                let name = self.word(&w.value);
                if name.literal.as_deref() != Some("/dev/null") {
                    self.out.substitutes_or_redirects = true;
                }
            }
        }
    }
}

/// One word of a simple command.
#[derive(Debug, Clone)]
struct Word {
    /// Its text: the literal when it is one, else as written.
    text: String,
    /// Its text once quotes are removed, when no expansion makes part of it.
    literal: Option<String>,
}

/// Whether text the walk does not take apart could run a command.
fn runs_commands(text: &str) -> bool {
    text.contains("$(") || text.contains('`') || text.contains("<(") || text.contains(">(")
}

/// How deep brackets nest in `text`, quotes not considered (a bound the
/// parser's recursion stays within).
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    for byte in text.bytes() {
        match byte {
            b'(' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

mod launchers;

#[cfg(test)]
#[path = "shell_tests.rs"]
mod tests;
