#!/usr/bin/env bash
# Builds Conclave and puts `conclave` on PATH, so that the docs' `conclave …`
# commands (conclave mcp, conclave sandboxes, conclave sim) work as written:
# into $PREFIX/bin, where PREFIX is /usr/local for root and ~/.local
# otherwise. PROFILE=debug installs a debug build (quicker to build, slower
# to run); the default is release. Run it again after a `git pull`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
profile=${PROFILE:-release}
case "$profile" in
    release) flags=(--release) ;;
    debug) flags=() ;;
    *) die "PROFILE must be release or debug, not '$profile'" ;;
esac
if [ -z "${PREFIX:-}" ]; then
    if [ "$(id -u)" = 0 ]; then PREFIX=/usr/local; else PREFIX=$HOME/.local; fi
fi
ensure_rust
started=$SECONDS
log "building ($profile; the first build takes 10 to 20 minutes on two cores)"
cargo build "${flags[@]}" --locked --bin conclave
log "built in $((SECONDS - started)) s"
install -D -m 0755 "target/$profile/conclave" "$PREFIX/bin/conclave"
log "installed $PREFIX/bin/conclave ($("$PREFIX/bin/conclave" --version))"
found=$(command -v conclave || true)
if [ "$found" != "$PREFIX/bin/conclave" ]; then
    if [ -n "$found" ]; then
        log "notice: another conclave comes first on PATH: $found"
    else
        log "notice: $PREFIX/bin is not on PATH; add it: export PATH=\"$PREFIX/bin:\$PATH\""
    fi
fi
