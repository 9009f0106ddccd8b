# Runs the Python source on stdin as a notebook cell: like `python3 -`, and
# then, when the last statement is an expression, prints its repr (unless it
# is None), as Jupyter and E2B's code interpreter do. Tracebacks show the
# cell's own frames and lines only. Each call is a fresh interpreter.
# A cell that is a command line running Python (`python3 -c 'print(1)'`, as
# small models write) runs the code it quotes, with a note on stderr. A name
# the cell uses but never binds is imported for it when it is one of a few
# standard modules (`math`, `datetime`, ...) or a function of `math`
# (`factorial`), again with a note: the cell would only fail on it.
import ast, builtins, importlib, linecache, math, shlex, sys, traceback

MODULES = ("math", "random", "datetime", "itertools", "functools", "collections",
           "statistics", "string", "re", "json", "os", "sys", "time", "fractions")


def unbound_names(tree):
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
    return sorted(n for n in loaded - bound if not hasattr(builtins, n))


def imports_for(tree, namespace):
    notes = []
    for name in unbound_names(tree):
        if name in MODULES:
            namespace[name] = importlib.import_module(name)
            notes.append(f"import {name}")
        elif not name.startswith("_") and callable(getattr(math, name, None)):
            namespace[name] = getattr(math, name)
            notes.append(f"from math import {name}")
    if notes:
        print(f"note: the cell uses names it does not define; ran it after {'; '.join(notes)}",
              file=sys.stderr)


def quoted_code(source):
    try:
        words = shlex.split(source.strip())
    except ValueError:
        return None
    if len(words) >= 3 and words[0] in ("python", "python3") and words[1] == "-c":
        return words[2]
    return None


source = sys.stdin.read()
try:
    ast.parse(source, "<cell>", "exec")
except SyntaxError:
    code = quoted_code(source)
    if code is not None:
        print("note: the cell was a `python -c` command line; ran the code it quotes",
              file=sys.stderr)
        source = code
linecache.cache["<cell>"] = (len(source), None, source.splitlines(True), "<cell>")
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    tree = ast.parse(source, "<cell>", "exec")
    imports_for(tree, namespace)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), namespace)
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
    sys.exit(1)
