#!/usr/bin/env bash
# Builds Conclave and runs the server on its embedded defaults: 127.0.0.1:8080,
# the SQLite store in ./data, the demo model unless a provider is configured
# (OPENAI_BASE_URL / OPENAI_API_KEY, ANTHROPIC_API_KEY, or --config FILE).
# Extra arguments go to `conclave serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_rust
log "building (release)"
cargo build --release --locked --quiet
# Docker sandboxes when Docker and the images can be had; without them the
# server falls back to the local sandbox backend, so failing here is a notice.
set +e
(
    set -e
    ensure_docker
    ensure_sandbox_images
)
docker_status=$?
set -e
[ "$docker_status" = 0 ] || log "notice: no Docker sandboxes (see above); sandboxes will use the local backend"
exec target/release/conclave serve "$@"
