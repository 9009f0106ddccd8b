# Shared by benches/routers.sh and benches/routing.sh (sourced after
# scripts/lib.sh): the routers' venv, then benches/procs_lib.sh (the
# release binary, a work directory, starting and stopping processes).
# shellcheck shell=bash

apt_install python3-venv curl
VENV=target/routers-venv
if [ ! -x "$VENV/bin/vllm-router" ] || [ ! -x "$VENV/bin/sglang-router" ] \
    || ! "$VENV/bin/python" -c 'import httpx' 2>/dev/null; then
    log "installing sglang-router, vllm-router and httpx from PyPI into $VENV"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q sglang-router==0.3.2 vllm-router==0.1.17 httpx
fi
source benches/procs_lib.sh
