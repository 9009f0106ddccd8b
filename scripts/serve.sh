#!/usr/bin/env bash
# Builds Conclave and runs the server on its embedded defaults: 127.0.0.1:8080,
# the SQLite store in ./data, the demo model unless a provider is configured
# (OPENAI_BASE_URL / OPENAI_API_KEY, ANTHROPIC_API_KEY, or --config FILE).
# Extra arguments go to `conclave serve`; with `--sandbox local` (or
# CONCLAVE_SANDBOX=local) nothing of Docker is installed, started or built,
# and the sandboxes use Linux namespaces on this host.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

# Docker is skipped when the sandboxes are not to be Docker's.
backend=${CONCLAVE_SANDBOX:-auto}
args=("$@")
for i in "${!args[@]}"; do
    case "${args[$i]}" in
        --sandbox=*) backend=${args[$i]#--sandbox=} ;;
        --sandbox) backend=${args[$((i + 1))]:-auto} ;;
    esac
done
with_docker=true
case "$backend" in local | kubernetes) with_docker=false ;; esac

# What this will do, before it does it.
plan=()
command -v cargo >/dev/null || [ -x "$HOME/.cargo/bin/cargo" ] \
    || plan+=("install Rust's build tools from Debian (apt-get install cargo rustc)")
if [ -x target/release/conclave ]; then
    plan+=("bring target/release/conclave up to date (cargo build --release)")
else
    plan+=("build target/release/conclave (cargo build --release: 10 to 20 minutes the first time on two cores)")
fi
if $with_docker; then
    command -v dockerd >/dev/null || plan+=("install Docker from Debian (apt-get install docker.io)")
    docker info >/dev/null 2>&1 || plan+=("start dockerd (log in $CONCLAVE_CACHE/dockerd.log)")
    docker image inspect conclave/sandbox-shell:latest conclave/sandbox-python:latest >/dev/null 2>&1 \
        || plan+=("build the sandbox images, offline from Debian's mirror with debootstrap when no base image is at hand (5 to 15 minutes the first time)")
fi
plan+=("run conclave serve ${*:-(its defaults: http://127.0.0.1:8080)}")
log "this will:"
for step in "${plan[@]}"; do printf '      - %s\n' "$step" >&2; done
$with_docker && printf '    (no Docker: scripts/serve.sh --sandbox local, and the sandboxes use Linux namespaces)\n' >&2

phase_started=$SECONDS
done_in() { log "$1 in $((SECONDS - phase_started)) s"; phase_started=$SECONDS; }

ensure_rust
log "building (release)"
cargo build --release --locked --bin conclave
done_in "built"
if [ "$(command -v conclave || true)" != "" ] && ! cmp -s "$(command -v conclave)" target/release/conclave; then
    log "notice: the conclave on PATH ($(command -v conclave)) is not this build: scripts/install.sh replaces it"
elif ! command -v conclave >/dev/null; then
    log "notice: conclave is not on PATH (the docs' conclave mcp, conclave sandboxes): scripts/install.sh puts it there"
fi

if $with_docker; then
    # Docker sandboxes when Docker and the images can be had; without them
    # the server falls back to the local sandbox backend, so failing here
    # is a notice.
    set +e
    (
        set -e
        ensure_docker
        ensure_sandbox_images
    )
    docker_status=$?
    set -e
    if [ "$docker_status" = 0 ]; then
        done_in "Docker and the sandbox images ready"
    else
        log "notice: no Docker sandboxes (see above); sandboxes will use the local backend"
    fi
fi
exec target/release/conclave serve "$@"
