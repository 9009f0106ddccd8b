#!/usr/bin/env bash
# The small-model benchmark (see benches/small_model.py): installs what the
# test command installs (llama-server, Qwen2.5-Coder-0.5B, docker and the
# sandbox images), builds conclave and runs the twenty tasks twice: under
# the small harness, then under the strict one (every model's default).
#
# usage: [CONCLAVE_BENCH_BIN=…] [HARNESSES="small strict"] benches/small_model.sh [--tasks N]
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/test.sh --setup-only)"
# CONCLAVE_BENCH_BIN: a conclave binary already built (the model's time dominates
# every figure; a debug build changes none of them measurably).
if [ -z "${CONCLAVE_BENCH_BIN:-}" ]; then
    cargo build --locked --release --bin conclave
    CONCLAVE_BENCH_BIN=target/release/conclave
fi
for harness in ${HARNESSES:-small strict}; do
    python3 benches/small_model.py "$CONCLAVE_BENCH_BIN" \
        "$CONCLAVE_TEST_LLAMA_SERVER" "$CONCLAVE_TEST_QWEN_GGUF" --harness "$harness" "$@"
done
