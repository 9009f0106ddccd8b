# Shared by the shell benches (sourced after scripts/lib.sh): the release
# binary, a work directory, and starting, stopping and waiting for
# processes.
# shellcheck shell=bash

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

# Waits until URL answers 200, for SECONDS (60 by default).
wait_ok() {
    local url=$1 tenths=$(( ${2:-60} * 10 ))
    for _ in $(seq "$tenths"); do
        curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
        sleep 0.1
    done
    die "$url did not come up; logs in $WORK"
}
