#!/usr/bin/env bash
# Runs the gateway benchmark (benches/gateway.rs): the latency the gateway
# adds over a sim replica, and its throughput against the LiteLLM proxy on
# the same replicas. Installs LiteLLM's proxy from PyPI into a venv of its
# own first (target/bench-venv), since the bench needs it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_rust
apt_install python3 python3-venv ca-certificates
VENV=${CONCLAVE_BENCH_VENV:-$PWD/target/bench-venv}
if [ ! -x "$VENV/bin/pip" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (is python3-venv installed?)"
fi
if [ ! -x "$VENV/bin/litellm" ]; then
    log "installing litellm[proxy] from PyPI (a few minutes)"
    "$VENV/bin/pip" install -q --disable-pip-version-check 'litellm[proxy]' \
        || die "pip could not install litellm[proxy]"
fi
export CONCLAVE_BENCH_LITELLM=$VENV/bin/litellm
exec cargo bench --bench gateway
