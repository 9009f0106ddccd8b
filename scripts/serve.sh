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
exec target/release/conclave serve "$@"
