#!/usr/bin/env python3
"""The peer of benches/pipeline.rs: the seed's connector pipeline as a
LangGraph StateGraph whose six nodes do nothing but write what Conclave's
mock agents write, checkpointed by langgraph-checkpoint-sqlite in a file in
a temporary directory.

Same state as Conclave's connector (replace fields, `research`/`code`/
`tests` kept when the new value is empty, `logs` keeping the last 100,
`errors` appended, the retry counters), the same conditional edges
(test_reviewer and reviewer route on their decision within the counters'
limits; the reviewer's APPROVE needs coverage >= 0.8).

For each variant:
  - sequential: WARMUP runs, then RUNS invocations one after the other,
    each with its own thread_id (sync nodes, SqliteSaver). Timed: each
    run's wall time (invoke to return), and each node's cycle: the time
    from one node's entry to the next node's entry (the node, its writes,
    routing, the checkpoint, the next task's scheduling), read with
    time.perf_counter() at each node's entry.
  - concurrent: CONCURRENT runs started at once with ainvoke on one
    asyncio loop (async nodes, AsyncSqliteSaver), and again as CONCURRENT
    threads released together, each calling invoke (sync nodes, one
    SqliteSaver, whose lock serializes its database work); total wall time.
  - no loss: every run's get_state_history (aget_state_history for the
    asyncio ones) has the 8 checkpoints of a 6-node run (input, start,
    one per node) and its last state's logs name the six nodes in order.

Variants: durability "sync" (the checkpoint is stored before the next
step starts, as Conclave does) with SQLite's synchronous=NORMAL (WAL, no
fsync per commit: what Conclave's store uses) and with the default
synchronous=FULL (an fsync per commit); and LangGraph's default
durability "async" (the checkpoint is written while the next step runs)
with synchronous=FULL. And the same graph compiled with no checkpointer,
sequential only: LangGraph's own cost per node.

Prints one JSON object on stdout. Usage:
  pipeline_langgraph.py [--runs 200] [--warmup 20] [--concurrent 100]
"""

import argparse
import asyncio
import json
import operator
import os
import platform
import sqlite3
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import Annotated, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

NODES = ["research", "generator", "tester", "test_reviewer", "reviewer", "publisher"]
LIMITS = {"test_retries": 3, "gen_fix_retries": 3, "review_retries": 2, "research_retries": 1}
# Input, the start node's write, then one per node.
CHECKPOINTS_PER_RUN = len(NODES) + 2


def keep_last_100(old, new):
    return (old + new)[-100:]


def if_non_empty(old, new):
    return new if new else old


def merge(old, new):
    return {**old, **new}


class State(TypedDict, total=False):
    connector_name: str
    connector_type: str
    original_request: str
    research: Annotated[str, if_non_empty]
    code: Annotated[str, if_non_empty]
    tests: Annotated[str, if_non_empty]
    test_output: str
    coverage_ratio: float
    test_review_decision: str
    review_decision: str
    degraded: bool
    counters: Annotated[dict, merge]
    logs: Annotated[list, keep_last_100]
    errors: Annotated[list, operator.add]


# Each run's node entry times (perf_counter), by connector_name (the run).
STAMPS: dict = {}

# What each node writes, as Conclave's mock agents do in test mode.
WRITES = {
    "research": lambda: {"research": "research by research (mock, visit 1)"},
    "generator": lambda: {"code": "code by generator (mock, visit 1)"},
    "tester": lambda: {
        "tests": "tests by tester (mock, visit 1)",
        "test_output": "test_output by tester (mock, visit 1)",
        "coverage_ratio": 1.0,
    },
    "test_reviewer": lambda: {"test_review_decision": "VALID_PASS"},
    "reviewer": lambda: {"review_decision": "APPROVE"},
    "publisher": lambda: {"degraded": False},
}
DECISIONS = {
    "research": "DONE",
    "generator": "DONE",
    "tester": "DONE",
    "test_reviewer": "VALID_PASS",
    "reviewer": "APPROVE",
    "publisher": "PUBLISHED",
}


def sync_node(name):
    def node(state):
        STAMPS.setdefault(state["connector_name"], []).append(time.perf_counter())
        out = WRITES[name]()
        out["logs"] = [f"{name}: {DECISIONS[name]}"]
        return out

    node.__name__ = name
    return node


def async_node(name):
    inner = sync_node(name)

    async def node(state):
        return inner(state)

    node.__name__ = name
    return node


def after_test_review(state):
    decision = state.get("test_review_decision")
    counters = state.get("counters") or {}
    if decision == "VALID_PASS":
        return "reviewer"
    if decision == "INVALID" and counters.get("test_retries", 0) < LIMITS["test_retries"]:
        return "tester"
    if decision == "VALID_FAIL" and counters.get("gen_fix_retries", 0) < LIMITS["gen_fix_retries"]:
        return "generator"
    return END


def after_review(state):
    decision = state.get("review_decision")
    counters = state.get("counters") or {}
    if decision == "APPROVE" and state.get("coverage_ratio", 0.0) >= 0.8:
        return "publisher"
    if decision == "REJECT_CODE" and counters.get("review_retries", 0) < LIMITS["review_retries"]:
        return "generator"
    if (
        decision == "REJECT_CONTEXT"
        and counters.get("research_retries", 0) <= LIMITS["research_retries"]
    ):
        return "research"
    return END


def builder(make_node):
    graph = StateGraph(State)
    for name in NODES:
        graph.add_node(name, make_node(name))
    graph.add_edge(START, "research")
    graph.add_edge("research", "generator")
    graph.add_edge("generator", "tester")
    graph.add_edge("tester", "test_reviewer")
    graph.add_conditional_edges(
        "test_reviewer", after_test_review, ["reviewer", "tester", "generator", END]
    )
    graph.add_conditional_edges(
        "reviewer", after_review, ["publisher", "generator", "research", END]
    )
    graph.add_edge("publisher", END)
    return graph


def initial(run):
    return {
        "connector_name": run,
        "connector_type": "source",
        "original_request": "",
        "coverage_ratio": 0.0,
        "degraded": False,
        "counters": {},
        "logs": [],
        "errors": [],
    }


def percentiles(samples):
    if not samples:
        return None
    s = sorted(samples)

    def at(p):
        return s[round((len(s) - 1) * p)]

    return {
        "n": len(s),
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": s[-1],
        "mean": sum(s) / len(s),
    }


def intact(history):
    """True when a run's history is a whole 6-node run."""
    if len(history) != CHECKPOINTS_PER_RUN:
        return False
    last = history[0]  # newest first
    logs = [line.split(":")[0] for line in last.values.get("logs", [])]
    return last.next == () and logs == NODES


def sequential(path, synchronous, durability, runs, warmup):
    STAMPS.clear()
    with SqliteSaver.from_conn_string(path) as saver:
        saver.setup()
        saver.conn.execute(f"PRAGMA synchronous={synchronous}")
        graph = builder(sync_node).compile(checkpointer=saver)
        for i in range(warmup):
            run = f"warm-{i}"
            graph.invoke(initial(run), {"configurable": {"thread_id": run}}, durability=durability)
        walls, cycles, lost = [], [], 0
        for i in range(runs):
            run = f"seq-{i}"
            config = {"configurable": {"thread_id": run}}
            started = time.perf_counter()
            graph.invoke(initial(run), config, durability=durability)
            walls.append((time.perf_counter() - started) * 1e3)
            stamps = STAMPS[run]
            cycles.extend((b - a) * 1e3 for a, b in zip(stamps, stamps[1:]))
        for i in range(runs):
            config = {"configurable": {"thread_id": f"seq-{i}"}}
            if not intact(list(graph.get_state_history(config))):
                lost += 1
    return {
        "runs": runs,
        "run_ms": percentiles(walls),
        "per_node_ms": percentiles([w / len(NODES) for w in walls]),
        "cycle_ms": percentiles(cycles),
        "lost": lost,
    }


async def concurrent(path, synchronous, durability, runs):
    STAMPS.clear()
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        await saver.setup()
        await saver.conn.execute(f"PRAGMA synchronous={synchronous}")
        graph = builder(async_node).compile(checkpointer=saver)
        # One warm-up run, then all at once.
        await graph.ainvoke(
            initial("warm"), {"configurable": {"thread_id": "warm"}}, durability=durability
        )

        async def one(i):
            run = f"con-{i}"
            started = time.perf_counter()
            await graph.ainvoke(
                initial(run), {"configurable": {"thread_id": run}}, durability=durability
            )
            return (time.perf_counter() - started) * 1e3

        started = time.perf_counter()
        walls = await asyncio.gather(*(one(i) for i in range(runs)))
        wall = time.perf_counter() - started
        completed = 0
        for i in range(runs):
            config = {"configurable": {"thread_id": f"con-{i}"}}
            history = [s async for s in graph.aget_state_history(config)]
            if intact(history):
                completed += 1
    return {
        "runs": runs,
        "wall_s": wall,
        "runs_per_s": runs / wall,
        "run_ms": percentiles(list(walls)),
        "intact": completed,
    }


def threaded(path, synchronous, durability, runs):
    """CONCURRENT runs at once on as many threads, one SqliteSaver."""
    STAMPS.clear()
    with SqliteSaver.from_conn_string(path) as saver:
        saver.setup()
        saver.conn.execute(f"PRAGMA synchronous={synchronous}")
        graph = builder(sync_node).compile(checkpointer=saver)
        graph.invoke(initial("warm"), {"configurable": {"thread_id": "warm"}}, durability=durability)
        gate = threading.Barrier(runs + 1)

        def one(i):
            run = f"thr-{i}"
            gate.wait()
            started = time.perf_counter()
            graph.invoke(initial(run), {"configurable": {"thread_id": run}}, durability=durability)
            return (time.perf_counter() - started) * 1e3

        with ThreadPoolExecutor(max_workers=runs) as pool:
            futures = [pool.submit(one, i) for i in range(runs)]
            gate.wait()
            started = time.perf_counter()
            walls = [f.result() for f in futures]
            wall = time.perf_counter() - started
        completed = sum(
            intact(list(graph.get_state_history({"configurable": {"thread_id": f"thr-{i}"}})))
            for i in range(runs)
        )
    return {
        "runs": runs,
        "wall_s": wall,
        "runs_per_s": runs / wall,
        "run_ms": percentiles(walls),
        "intact": completed,
    }


def bare(runs, warmup):
    """The same graph with no checkpointer: LangGraph's own cost."""
    STAMPS.clear()
    graph = builder(sync_node).compile()
    for i in range(warmup):
        graph.invoke(initial(f"bare-warm-{i}"))
    walls, cycles = [], []
    for i in range(runs):
        run = f"bare-{i}"
        started = time.perf_counter()
        graph.invoke(initial(run))
        walls.append((time.perf_counter() - started) * 1e3)
        stamps = STAMPS[run]
        cycles.extend((b - a) * 1e3 for a, b in zip(stamps, stamps[1:]))
    return {"runs": runs, "run_ms": percentiles(walls), "cycle_ms": percentiles(cycles)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=100)
    args = parser.parse_args()
    variants = [
        ("sync, synchronous=NORMAL", "NORMAL", "sync"),
        ("sync, synchronous=FULL", "FULL", "sync"),
        ("async (default), synchronous=FULL", "FULL", "async"),
    ]
    out = {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "langgraph": metadata.version("langgraph"),
        "langgraph_checkpoint_sqlite": metadata.version("langgraph-checkpoint-sqlite"),
        "aiosqlite": metadata.version("aiosqlite"),
        "nodes": len(NODES),
        "checkpoints_per_run": CHECKPOINTS_PER_RUN,
        "variants": [],
    }
    with tempfile.TemporaryDirectory(prefix="langgraph-bench-") as tmp:
        for k, (name, synchronous, durability) in enumerate(variants):
            seq = sequential(
                os.path.join(tmp, f"seq-{k}.sqlite"), synchronous, durability, args.runs, args.warmup
            )
            con = asyncio.run(
                concurrent(
                    os.path.join(tmp, f"con-{k}.sqlite"), synchronous, durability, args.concurrent
                )
            )
            thr = threaded(
                os.path.join(tmp, f"thr-{k}.sqlite"), synchronous, durability, args.concurrent
            )
            out["variants"].append(
                {
                    "name": name,
                    "durability": durability,
                    "synchronous": synchronous,
                    "sequential": seq,
                    "concurrent": con,
                    "threads": thr,
                }
            )
            print(f"langgraph: {name} done", file=sys.stderr)
        out["no_checkpointer"] = bare(args.runs, args.warmup)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
