# Runs the Python source on stdin as a notebook cell: like `python3 -`, and
# then, when the last statement is an expression, prints its repr (unless it
# is None), as Jupyter and E2B's code interpreter do. Tracebacks show the
# cell's own frames and lines only. Each call is a fresh interpreter.
# A cell that is a command line running Python (`python3 -c 'print(1)'`, as
# small models write) runs the code it quotes, with a note on stderr.
import ast, linecache, shlex, sys, traceback


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
