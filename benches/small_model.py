"""Small local model driving the tools: twenty small tasks through
`/agent/run` with default options, answered by Qwen2.5-Coder-0.5B-Instruct
(Q4_K_M) on a CPU llama-server, with tool calls in real docker sandboxes.

Records per task whether the answer is right, the model calls (turns), the
tool calls and the time, and prints a Markdown table for benches/README.md.
Run it through benches/small_model.sh, which installs everything first.

usage: small_model.py CONCLAVE_BIN LLAMA_SERVER QWEN_GGUF [--tasks N] [--json OUT]
       [--harness small|strict] [--tool-call-mode native|json_schema]
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# (prompt, the text the answer must contain)
TASKS = [
    ("Use Python to compute 2**100 and reply with the number.", "1267650600228229401496703205376"),
    ("Use Python to compute the sum of the squares of the integers from 1 to 1000. Reply with the number.", "333833500"),
    ("Use Python to compute 17 * 23 * 31 and reply with the number.", "12121"),
    ("Use Python to compute the factorial of 20 and reply with the number.", "2432902008176640000"),
    ("Use Python to count the characters in the string 'conclave sandbox' and reply with the count.", "16"),
    ("Use Python to reverse the string 'sandbox' and reply with the result.", "xobdnas"),
    ("Use Python to convert 'hello world' to upper case and reply with the result.", "HELLO WORLD"),
    ("Use Python to count the vowels in 'programming language' and reply with the count.", "7"),
    ("Use Python to compute the 20th Fibonacci number, where the first two are 1 and 1. Reply with the number.", "6765"),
    ("Use Python to find the largest prime number below 100 and reply with it.", "97"),
    ("Use Python to compute 2**64 - 1 and reply with the number.", "18446744073709551615"),
    ("Use Python to compute the sum of the digits of 2**50 and reply with the number.", "76"),
    ("Use Python to write the text 'alpha beta' to the file notes.txt, then read the file back and reply with its content.", "alpha beta"),
    ("Use Python to write the numbers 1 to 5 to numbers.txt, one per line, then read the file and reply with the sum of the numbers.", "15"),
    ("Run the shell command `echo conclave | wc -c` and reply with its output.", "9"),
    ("Run the shell command `pwd` and reply with its output.", "/workspace"),
    ("Run the shell command `expr 6 \\* 7` and reply with its output.", "42"),
    ("Use Python to compute the greatest common divisor of 462 and 1071 and reply with it.", "21"),
    ("Use Python to sort the list [5, 3, 9, 1] in ascending order and reply with the sorted list.", "[1, 3, 5, 9]"),
    ("Use Python to compute the number of days from 2024-01-01 to 2024-03-01 and reply with the number.", "60"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, process, what, seconds=300):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"{what} exited before serving ({process.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"{what} did not become ready within {seconds} s")


def normalized(text):
    return re.sub(r"(?<=\d),(?=\d{3})", "", text or "")


def answers(expected, answer):
    """The expected text stands in the answer on its own: `-60` or `1600`
    does not answer `60`."""
    pattern = r"(?<![\w.-])" + re.escape(expected) + r"(?![\w]|\.\d)"
    return re.search(pattern, normalized(answer)) is not None


def run_task(base, prompt):
    request = urllib.request.Request(
        f"{base}/agent/run",
        data=json.dumps({"prompt": prompt}).encode(),
        headers={"content-type": "application/json"},
    )
    started = time.time()
    events = []
    with urllib.request.urlopen(request, timeout=900) as response:
        for line in response:
            events.append(json.loads(line))
    elapsed = time.time() - started
    result = events[-1]
    return result, events, elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("conclave")
    parser.add_argument("llama_server")
    parser.add_argument("gguf")
    parser.add_argument("--tasks", type=int, default=len(TASKS))
    parser.add_argument("--json")
    # `small` carries the aids for weak models; `strict` is every model's
    # default, which runs what the model asked for and nothing else.
    parser.add_argument("--harness", default="small", choices=["small", "strict"])
    # `json_schema` (small harness only) constrains every reply to an
    # answer or one call.
    parser.add_argument("--tool-call-mode", default="native", choices=["native", "json_schema"])
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="conclave-small-model-")
    llama_port, conclave_port = free_port(), free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(args.llama_server))
    llama = subprocess.Popen(
        [args.llama_server, "-m", args.gguf, "--host", "127.0.0.1", "--port", str(llama_port),
         "-c", "16384", "-np", "1", "--jinja", "--temp", "0", "--seed", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "llama.log"), "w"),
    )
    config = os.path.join(work, "conclave.toml")
    with open(config, "w") as f:
        f.write(
            'default_model = "qwen"\n'
            # A 0.5B model with a 16k context: a tool result of 64 KiB (the
            # default) would not fit; 2 KiB of it is plenty for these tasks.
            "[agent]\n"
            "max_tool_output_bytes = 2048\n"
            # A task that has not settled in three minutes will not.
            "turn_timeout_s = 180\n"
            "[models.qwen]\n"
            'provider = "openai"\n'
            'model = "qwen2.5-coder-0.5b-instruct"\n'
            f'base_url = "http://127.0.0.1:{llama_port}/v1"\n'
            'tools = ["mcp__sandbox__execute_code", "Bash"]\n'
            f'harness = "{args.harness}"\n'
            + (f'tool_call_mode = "{args.tool_call_mode}"\n' if args.tool_call_mode != "native" else "")
        )
    server = subprocess.Popen(
        [args.conclave, "serve", "--config", config, "--listen", f"127.0.0.1:{conclave_port}",
         "--sandbox", "docker", "--data-dir", os.path.join(work, "data")],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "conclave.log"), "w"),
    )
    rows = []
    try:
        wait_ready(f"http://127.0.0.1:{llama_port}/health", llama, "llama-server")
        base = f"http://127.0.0.1:{conclave_port}"
        wait_ready(f"{base}/health", server, "conclave")
        for i, (prompt, expected) in enumerate(TASKS[: args.tasks], 1):
            result, events, elapsed = run_task(base, prompt)
            answer = result.get("result") or ""
            correct = result.get("status") == "success" and answers(expected, answer)
            row = {
                "task": i,
                "prompt": prompt,
                "expected": expected,
                "answer": answer,
                "status": result.get("status"),
                "correct": correct,
                "model_calls": result.get("turns"),
                "tool_calls": result.get("usage", {}).get("tool_calls"),
                "seconds": round(elapsed, 1),
                "interventions": sum(1 for e in events if e["type"] == "intervention"),
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait()
        llama.terminate()
        llama.wait()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    right = sum(r["correct"] for r in rows)
    print(f"harness = {args.harness!r}: {right} of {len(rows)} answered correctly; "
          f"{sum(r['model_calls'] or 0 for r in rows)} model calls, "
          f"{sum(r['tool_calls'] or 0 for r in rows)} tool calls, "
          f"{sum(r['interventions'] for r in rows)} interventions, "
          f"{sum(r['seconds'] for r in rows):.0f} s in all\n")
    print("| # | task | right | model calls | tool calls | s | answer |")
    print("|---|------|-------|-------------|------------|---|--------|")
    for r in rows:
        answer = (r["answer"] or r["status"]).replace("\n", " ").replace("|", "\\|")[:60]
        print(f"| {r['task']} | {r['prompt'][:60]} | {'yes' if r['correct'] else 'no'} | "
              f"{r['model_calls']} | {r['tool_calls']} | {r['seconds']} | {answer} |")


if __name__ == "__main__":
    main()
