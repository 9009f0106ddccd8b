# Shared by benches/routers.sh and benches/routing.sh (sourced after
# scripts/lib.sh): the routers' venv, the release binary, a work directory,
# and starting and stopping processes.
# shellcheck shell=bash

apt_install python3-venv curl
VENV=target/routers-venv
if [ ! -x "$VENV/bin/vllm-router" ] || [ ! -x "$VENV/bin/sglang-router" ] \
    || ! "$VENV/bin/python" -c 'import httpx' 2>/dev/null; then
    log "installing sglang-router, vllm-router and httpx from PyPI into $VENV"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q sglang-router==0.3.2 vllm-router==0.1.17 httpx
fi
# CONCLAVE_BENCH_BIN: a release conclave binary already built.
if [ -z "${CONCLAVE_BENCH_BIN:-}" ]; then
    cargo build --locked --release --bin conclave
    CONCLAVE_BENCH_BIN=target/release/conclave
fi
BIN=$CONCLAVE_BENCH_BIN
WORK=$(mktemp -d)
CLEANUP+=("rm -rf $WORK")

# Starts a process in the background, its pid in $STARTED; killed at exit.
start() {
    local log=$1; shift
    "$@" > "$WORK/$log" 2>&1 &
    STARTED=$!
    CLEANUP+=("kill $STARTED 2>/dev/null; wait $STARTED 2>/dev/null")
}

# Stops processes started with `start`.
stop() {
    kill "$@" 2>/dev/null || true
    wait "$@" 2>/dev/null || true
}

# Waits until URL answers 200 (60 s).
wait_ok() {
    for _ in $(seq 600); do
        curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    die "$1 did not come up; logs in $WORK"
}
