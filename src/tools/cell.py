# Runs the Python source on stdin as a notebook cell: like `python3 -`, and
# then, when the last statement is an expression, prints its repr (unless it
# is None), as Jupyter and E2B's code interpreter do. Tracebacks show the
# cell's own frames and lines only. Each call is a fresh interpreter, but
# values of plain types (numbers, strings, lists, dicts...), imports and the
# functions and classes a cell defines carry over to the session's next
# cells, kept in `.conclave/cell-state.pickle` in the working directory.
#
# With `--repair` (execute_code's `repair: true`, which the small-model
# harness sets), code whose intent is plain but which would fail is fixed
# first, and each fix is said on stderr on a line starting `repair: `:
# - only for a cell that does not parse: a cell that is a `python -c '...'`
#   command line runs the code it quotes; otherwise the first of a few
#   repairs that makes it parse (a line break inside a string written as
#   `\n`, brackets or a string left open closed, statements joined by `;`
#   before a `with`/`for`/`if` split, blocks written on one line broken into
#   lines, Python 2's `print x`, brackets that close nothing dropped, the
#   line after a block's header indented, a tool result pasted after the
#   code cut, a `return` outside a function taken as the cell's value); a
#   cell no repair makes whole fails with its own syntax error;
# - `print(x).upper()`, which with the builtin print prints and then fails
#   on print's None, runs as `print(x.upper())`;
# - a name the cell uses that nothing binds (it would fail with NameError)
#   is imported when it is one of a few standard modules (`math`,
#   `datetime`, ...) or a function of `math` (`factorial`);
# - a NameError ends with a hint (quote the name if text was meant, define
#   the function if one was called).
# Without `--repair` the cell runs as Python runs it.
import ast, builtins, importlib, io, linecache, math, os, pickle, re, shlex, sys, tokenize
import traceback

MODULES = ("math", "random", "datetime", "itertools", "functools", "collections",
           "statistics", "string", "re", "json", "os", "sys", "time", "fractions")


def unbound_names(tree, builtins_too=False):
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return sorted(n for n in loaded - bound if builtins_too or not hasattr(builtins, n))


def imports_for(tree, namespace):
    notes = []
    for name in unbound_names(tree):
        if name in namespace:
            continue
        if name in MODULES:
            namespace[name] = importlib.import_module(name)
            notes.append(f"import {name}")
        elif not name.startswith("_") and callable(getattr(math, name, None)):
            namespace[name] = getattr(math, name)
            notes.append(f"from math import {name}")
    if notes:
        print(f"repair: the cell uses names it does not define; ran it after {'; '.join(notes)}",
              file=sys.stderr)


def quoted_code(source):
    try:
        words = shlex.split(source.strip())
    except ValueError:
        # Quoting a shell cannot read: the rest of the line, its outer
        # quotes taken off, for the repairs below.
        match = re.match(r"\s*python3?\s+-c\s+(['\"])(.*?)\1?\s*$", source, re.S)
        return match.group(2) if match else None
    if len(words) >= 3 and words[0] in ("python", "python3") and words[1] == "-c":
        return words[2]
    return None


def parses(source):
    # Compiled, not only parsed: `return` outside a function parses.
    try:
        compile(source, "<cell>", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError):
        return False


CLOSERS = {"(": ")", "[": "]", "{": "}"}


def scan(line, stack, quote, strays=None):
    """Walks one line, from inside the string `quote` opened on an earlier
    line (None: from code), pushing the brackets it leaves open on `stack`
    and the positions of closing brackets that close nothing on `strays`.
    Returns the quote still open at the line's end and where on the line
    it opened (-1: on an earlier line)."""
    start, i = -1, 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 1
            elif line.startswith(quote, i):
                i += len(quote) - 1
                quote = None
        elif c == "#":
            break
        elif c in "'\"":
            quote, start = (c * 3 if line.startswith(c * 3, i) else c), i
            i += len(quote) - 1
        elif c in CLOSERS:
            stack.append(c)
        elif c in ")]}" and stack and CLOSERS[stack[-1]] == c:
            stack.pop()
        elif c in ")]}" and strays is not None:
            strays.append(i)
        i += 1
    return quote, start


def one_line(quote):
    return quote is not None and len(quote) == 1


def close_brackets(source):
    """Closes the brackets each line leaves open at the end of that line."""
    lines, stack, quote = source.split("\n"), [], None
    for n, line in enumerate(lines):
        depth = len(stack)
        quote, _ = scan(line, stack, quote)
        # A one-line string left open ends with its line (`close_strings`
        # closes it before these closers).
        quote = None if one_line(quote) else quote
        if len(stack) > depth and quote is None:
            opened = stack[depth:]
            del stack[depth:]
            lines[n] = line.rstrip() + "".join(CLOSERS[b] for b in reversed(opened))
    return "\n".join(lines)


def close_strings(source):
    """Closes a one-line string left open, before the line's last closers."""
    lines = source.split("\n")
    for n, line in enumerate(lines):
        quote, start = scan(line, [], None)
        if one_line(quote):
            body = line.rstrip()
            tail = len(body) - len(body.rstrip(")]}:"))
            end = max(len(body) - tail, start + 1)
            lines[n] = body[:end] + quote + body[end:]
    return "\n".join(lines)


def escape_line_breaks(source):
    """A line break inside a one-line string was meant as `\\n` (a model's
    `'\\n'` in JSON arrives as a real line break)."""
    out, quote = [], None
    for line in source.split("\n"):
        if one_line(quote):
            out[-1] += "\\n" + line
        else:
            out.append(line)
        quote, _ = scan(line, [], quote)
    return "\n".join(out)


def split_compound(source):
    """`import os; with open(...) as f: ...` becomes two lines."""
    def split(line):
        indent = line[: len(line) - len(line.lstrip())]
        return re.sub(r";\s*(?=(with|for|if|while|try|def|class)\b)", "\n" + indent, line)
    return "\n".join(split(line) for line in source.split("\n"))


PASTED = re.compile(r"\s*(exit_code|status|stderr|stdout|duration_ms): |"
                    r"\s*Traceback \(most recent call last\):|\s*File \"<cell>\", line ")


def drop_pasted_output(source):
    """Cuts the cell at a line of a tool result pasted into it (a small
    model continues the last result it read into its next call)."""
    lines = source.split("\n")
    for n, line in enumerate(lines):
        if n and PASTED.match(line):
            return "\n".join(lines[:n])
    return source


def drop_closers(source):
    """Drops the closing brackets that close nothing (a `}` or `]` of the
    call's JSON written inside its code)."""
    out, stack, quote = [], [], None
    for line in source.split("\n"):
        strays = []
        quote, _ = scan(line, stack, quote, strays)
        quote = None if one_line(quote) else quote
        out.append("".join(c for i, c in enumerate(line) if i not in strays))
    return "\n".join(out)


def indent_blocks(source):
    """Indents the one line after a block's header (`with ...:`, `for
    ...:`) that is not indented under it."""
    lines = source.split("\n")
    for n in range(len(lines) - 1):
        header, body = lines[n], lines[n + 1]
        indent = len(header) - len(header.lstrip())
        if (re.match(r"\s*(with|for|if|elif|else|while|try|except|finally|def|class)\b", header)
                and header.rstrip().endswith(":") and body.strip()
                and len(body) - len(body.lstrip()) <= indent):
            lines[n + 1] = " " * (indent + 4) + body.lstrip()
    return "\n".join(lines)


def top_level_return(source):
    """A `return` outside any function gives the cell's value."""
    source = re.sub(r"(?m)^return\s+(.+)$", r"\1", source)
    return re.sub(r"(?m)^return\s*$", "pass", source)


HEADERS = ("def", "class", "if", "elif", "else", "for", "while", "with", "try", "except",
           "finally")
# The headers a clause (`else`, `elif`, `except`, `finally`) continues.
CONTINUES = {"else": ("if", "elif", "for", "while", "try", "except"), "elif": ("if", "elif"),
             "except": ("try", "except"), "finally": ("try", "except", "else")}


def statements(line):
    """The statements of one line written as if it had line breaks: cut
    after a header's `:`, before a `return` inside the line, and before an
    `else`/`elif` that closes no `x if y else z` of its own."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip()).readline))
    except (tokenize.TokenError, SyntaxError):
        return [line.strip()]
    cuts, depth, head, ifs, after_header = [0], 0, None, 0, False
    for token in tokens:
        if token.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
            continue
        text, column = token.string, token.start[1]
        if head is None or after_header:
            if after_header:
                cuts.append(column)
            head, ifs, after_header = text, 0, False
        elif depth == 0 and (text == "return" or text in ("else", "elif") and ifs == 0):
            cuts.append(column)
            head, ifs = text, 0
        elif depth == 0 and text in ("if", "else"):
            ifs += 1 if text == "if" else -1
        if token.type == tokenize.OP:
            depth += (text in ("(", "[", "{")) - (text in (")", "]", "}"))
        after_header = depth == 0 and text == ":" and head in HEADERS
    text = line.strip()
    return [text[a:b].strip() for a, b in zip(cuts, cuts[1:] + [len(text)])]


def one_line_blocks(source):
    """A block written on one line (`def f(n): if n <= 1: return n else
    return f(n-1) + f(n-2) return f(20)`) becomes lines: a statement after a
    header goes one level in, a clause back to its header's level, and a
    `return` right after another `return` out of the function."""
    out = []
    for line in source.split("\n"):
        base, level, blocks, last = line[: len(line) - len(line.lstrip())], 0, [], None
        for statement in statements(line):
            word = re.match(r"\w*", statement).group()
            if word in CONTINUES:
                while blocks and blocks[-1][0] not in CONTINUES[word]:
                    blocks.pop()
                level = blocks.pop()[1] if blocks else level
            elif word == "return" and last == "return":
                while blocks and blocks[-1][0] != "def":
                    blocks.pop()
                level = blocks.pop()[1] if blocks else level
            if word in HEADERS and not statement.endswith(":"):
                statement += ":"
            out.append(base + "    " * level + statement)
            if word in HEADERS:
                blocks.append((word, level))
                level += 1
            last = word
    return "\n".join(out)


def print_statements(source):
    """Python 2's `print x` becomes `print(x)`."""
    return re.sub(r"(?m)^(\s*)print\s+(?![(\s=])(.+?)\s*$", r"\1print(\2)", source)


REPAIRS = (("dropped tool output pasted after the code", drop_pasted_output),
           ("a line break in a string written as \\n", escape_line_breaks),
           ("closed the brackets left open", close_brackets),
           ("closed a string left open", close_strings),
           ("split statements joined by `;`", split_compound),
           ("wrote the blocks on one line as lines", one_line_blocks),
           ("made `print x` a call", print_statements),
           ("dropped brackets that close nothing", drop_closers),
           ("indented the line after a `:`", indent_blocks),
           ("took a `return` outside a function as the cell's value", top_level_return))


def repaired(source):
    """The cell after the first repair that makes it parse, or after all of
    them in turn; with what was done. None when nothing does."""
    for what, repair in REPAIRS:
        candidate = repair(source)
        if candidate != source and parses(candidate):
            return candidate, [what]
    current, done = source, []
    for what, repair in REPAIRS:
        candidate = repair(current)
        if candidate != current:
            current, done = candidate, done + [what]
            if parses(current):
                return current, done
    return None


# What a session's cells leave to its next cells: values of plain types,
# imports, and the functions and classes they define; kept in the working
# directory, which is the session's own.
STATE = os.path.join(os.getcwd(), ".conclave", "cell-state.pickle")
PLAIN = (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)


def load_state(namespace):
    """Restores the earlier cells' state; returns their definitions."""
    try:
        with open(STATE, "rb") as f:
            state = pickle.load(f)
        definitions, values = dict(state["definitions"]), dict(state["values"])
    except Exception:
        return {}
    for source in definitions.values():
        try:
            exec(compile(source, "<earlier cell>", "exec"), namespace)
        except Exception:
            pass
    namespace.update(values)
    return definitions


def save_state(namespace, definitions, tree):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            definitions[node.name] = ast.unparse(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            definitions[ast.unparse(node)] = ast.unparse(node)
    values = {}
    for name, value in namespace.items():
        if name.startswith("_") or name in definitions or not isinstance(value, PLAIN):
            continue
        try:
            if len(pickle.dumps(value)) <= 1 << 20:
                values[name] = value
        except Exception:
            pass
    try:
        os.makedirs(os.path.dirname(STATE), exist_ok=True)
        with open(STATE + ".new", "wb") as f:
            pickle.dump({"definitions": definitions, "values": values}, f)
        os.replace(STATE + ".new", STATE)
    except OSError:
        pass


def base_print(node):
    """The `print(x)` call at the base of a chain of methods, attributes
    and subscripts (`print(x).upper()[0]`), with the node holding it;
    None when the chain does not start with such a call."""
    holder = None
    while True:
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "print" and len(node.args) == 1 and holder is not None):
            return node, holder
        if isinstance(node, ast.Call):
            holder, node = node, node.func
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            holder, node = node, node.value
        else:
            return None


def print_outside(tree, namespace):
    """`print(x).upper()` prints x and fails: the builtin print returns
    None. Runs `print(x.upper())`, which is what was meant, with a note;
    not when the cell or an earlier one rebinds `print`."""
    if "print" in namespace or "print" not in unbound_names(tree, builtins_too=True):
        return
    for statement in ast.walk(tree):
        if not isinstance(statement, ast.Expr):
            continue
        found = base_print(statement.value)
        if found is None:
            continue
        call, holder = found
        before = ast.unparse(statement)
        setattr(holder, "func" if isinstance(holder, ast.Call) and holder.func is call else "value",
                call.args[0])
        call.args = [statement.value]
        statement.value = call
        print(f"repair: print() returns None; ran `{ast.unparse(statement)}` for `{before}`",
              file=sys.stderr)


def name_hint(error, tree):
    """For a name used as a value that nothing defines: the text in quotes
    may have been meant (a small model's `print(sandbox[::-1])`); for a
    function nothing defines, where to define it."""
    name = getattr(error, "name", None)
    if not isinstance(error, NameError) or not name:
        return
    nodes = list(ast.walk(tree)) if tree is not None else []
    called = {id(node.func) for node in nodes if isinstance(node, ast.Call)}
    uses = [node for node in nodes if isinstance(node, ast.Name) and node.id == name]
    if any(id(node) not in called for node in uses):
        print(f"hint: `{name}` is not a variable; if you meant the text {name}, write it in "
              f"quotes: '{name}'", file=sys.stderr)
    elif uses:
        print(f"hint: no function `{name}` exists here; define it with `def {name}(...):` in "
              "the cell, before the line that calls it", file=sys.stderr)


repair = "--repair" in sys.argv[1:]
source = sys.stdin.read()
if repair and not parses(source):
    code = quoted_code(source)
    if code is not None:
        print("repair: the cell was a `python -c` command line; ran the code it quotes",
              file=sys.stderr)
        source = code
if repair and not parses(source):
    fixed = repaired(source)
    if fixed is not None:
        source = fixed[0]
        print(f"repair: the cell did not parse; ran it after: {'; '.join(fixed[1])}",
              file=sys.stderr)
        print(source, file=sys.stderr)
linecache.cache["<cell>"] = (len(source), None, source.splitlines(True), "<cell>")
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
definitions = load_state(namespace)
tree = None
try:
    tree = ast.parse(source, "<cell>", "exec")
    if repair:
        print_outside(tree, namespace)
        imports_for(tree, namespace)
    body, last = tree.body, None
    if body and isinstance(body[-1], ast.Expr):
        body, last = body[:-1], ast.Expression(body[-1].value)
    exec(compile(ast.Module(body, type_ignores=[]), "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), namespace)
        if value is not None:
            print(repr(value))
except SystemExit:
    raise
except BaseException as error:
    sys.stdout.flush()
    frames = error.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename != "<cell>":
        frames = frames.tb_next
    traceback.print_exception(type(error), error, frames)
    if repair:
        name_hint(error, tree)
    sys.exit(1)
finally:
    if tree is not None:
        save_state(namespace, definitions, tree)
