# Shared set-up for scripts/serve.sh and scripts/test.sh (sourced, not run).
# Installs only what is missing, so a prepared machine starts at once.
# shellcheck shell=bash

# The repository root, wherever the sourcing script runs from.
CONCLAVE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# What the scripts download and build once (dockerd's log, the sandbox
# images' root file systems). Not exported: the server reads every CONCLAVE_*
# variable as configuration and refuses ones it does not know.
CONCLAVE_CACHE=${CONCLAVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/conclave}
export -n CONCLAVE_CACHE

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

APT_UPDATED=
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get to install them"
    [ "$(id -u)" = 0 ] || die "missing packages ${missing[*]}: run as root, or install them first"
    if [ -z "$APT_UPDATED" ]; then
        log "apt-get update"
        apt-get update -qq
        APT_UPDATED=1
    fi
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Rust: the one on PATH (rustup's, usually), else Debian's cargo when it is
# new enough (Rust 1.88 or later is needed).
ensure_rust() {
    [ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
    if ! command -v cargo >/dev/null; then
        apt_install cargo rustc
    fi
    command -v cargo >/dev/null || die "no cargo on PATH; install Rust 1.88+ (rustup)"
    local version
    version=$(rustc --version | awk '{print $2}')
    if ! printf '1.88.0\n%s\n' "$version" | sort -V -C; then
        die "rustc $version is too old: Conclave needs Rust 1.88 or later (rustup update stable)"
    fi
    # libseccomp-dev: the local sandbox backend (hakoniwa) links libseccomp.
    apt_install gcc libc6-dev libseccomp-dev
}

# Docker: Debian's docker.io when dockerd is missing, and a daemon that
# answers `docker info`. One started here runs on after the script, in a
# session of its own, logging to $CONCLAVE_CACHE/dockerd.log.
ensure_docker() {
    command -v dockerd >/dev/null || apt_install docker.io
    docker info >/dev/null 2>&1 && return 0
    [ "$(id -u)" = 0 ] || die "dockerd is not reachable and only root can start it here: start it (systemctl start docker) or use a user in the docker group"
    mkdir -p "$CONCLAVE_CACHE"
    local logfile="$CONCLAVE_CACHE/dockerd.log" pid
    log "starting dockerd (log: $logfile)"
    setsid nohup dockerd >"$logfile" 2>&1 </dev/null &
    pid=$!
    for _ in $(seq 1 120); do
        if docker info >/dev/null 2>&1; then
            log "dockerd is up"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || die "dockerd exited at start-up: see $logfile"
        sleep 0.5
    done
    die "dockerd did not answer docker info within 60 s: see $logfile"
}

# The sandbox images conclave/sandbox-{python,shell}:latest, built by
# sandbox-images/build.sh (a no-op when they are up to date; offline with
# debootstrap when no base image is at hand). Needs ensure_docker first.
ensure_sandbox_images() {
    # Only root can run debootstrap; build.sh says so itself if it needs it.
    [ "$(id -u)" != 0 ] || apt_install debootstrap
    CONCLAVE_CACHE="$CONCLAVE_CACHE" "$CONCLAVE_ROOT/sandbox-images/build.sh" all \
        || die "building the sandbox images failed (sandbox-images/build.sh, output above)"
}

# conclave/rust-builder:bookworm, the builder stage of the server image where
# no public Rust image is at hand: deploy/rust-builder/Dockerfile on BASE
# with this host's toolchain (its docs left out). Rebuilt only when the
# Dockerfile, the toolchain, the host's extra certificate authorities or the
# base changes (a label holds their hash).
ensure_rust_builder() { # BUILDER BASE
    local builder=$1 base=$2 sysroot hash context cas=/usr/local/share/ca-certificates
    sysroot=$(rustc --print sysroot)
    [ -d "$cas" ] || cas=$(mktemp -d)
    hash=$({ cat "$CONCLAVE_ROOT/deploy/rust-builder/Dockerfile" "$cas"/*; rustc -vV; cargo -V
             docker image inspect -f '{{.Id}}' "$base"; } 2>/dev/null | sha256sum | cut -d' ' -f1)
    if [ "$(docker image inspect -f '{{ index .Config.Labels "conclave.builder-hash" }}' "$builder" 2>/dev/null)" = "$hash" ]; then
        return 0
    fi
    log "building $builder from $base and the toolchain in $sysroot"
    # The context, as links that tar follows.
    context=$(mktemp -d)
    ln -s "$CONCLAVE_ROOT/deploy/rust-builder/Dockerfile" "$context/Dockerfile"
    ln -s "$cas" "$context/extra-ca"
    ln -s "$sysroot" "$context/rust"
    tar -chf - -C "$context" --exclude=./rust/share . \
        | docker build -q --label "conclave.builder-hash=$hash" --build-arg "BASE_IMAGE=$base" -t "$builder" - >/dev/null \
        || die "building $builder failed (deploy/rust-builder/Dockerfile)"
    rm -rf "$context"
}

# The server image of the top-level Dockerfile as conclave/server:test,
# exported as CONCLAVE_TEST_SERVER_IMAGE for tests/docker_image.rs: its
# runtime stage (`--target prebuilt`) around the debug binary cargo builds
# for the tests, on debian:bookworm-slim when docker has it, else on the
# debootstrapped conclave/base-shell:bookworm (needs ensure_sandbox_images
# first). This host is Debian bookworm too, so the binary runs there. The
# full multi-stage build (compiling inside docker, `docker build .`) takes
# 20 to 40 minutes on two cores, which a test run cannot spend;
# deploy/README.md says when it was run and how long it took.
ensure_server_image() {
    local base=debian:bookworm-slim context started
    docker image inspect "$base" >/dev/null 2>&1 || base=conclave/base-shell:bookworm
    log "cargo build --bin conclave (for the server image)"
    (cd "$CONCLAVE_ROOT" && cargo build --locked --quiet --bin conclave) \
        || die "building the conclave binary failed"
    context=$(mktemp -d)
    cp "$CONCLAVE_ROOT/target/debug/conclave" "$context/conclave"
    started=$SECONDS
    docker build -q --target prebuilt --build-arg "BASE_IMAGE=$base" \
        -f "$CONCLAVE_ROOT/Dockerfile" -t conclave/server:test "$context" >/dev/null \
        || { rm -rf "$context"; die "building the server image (Dockerfile, target prebuilt, on $base) failed"; }
    rm -rf "$context"
    log "conclave/server:test built on $base in $((SECONDS - started)) s"
    export CONCLAVE_TEST_SERVER_IMAGE=conclave/server:test
}

# A free TCP port on 127.0.0.1 (python3 is installed first by test.sh).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# PostgreSQL for the scale-out tests: Debian's server, a cluster made with
# initdb in a temporary directory as user postgres (trust on 127.0.0.1
# only), started on a free port. Exports CONCLAVE_TEST_POSTGRES, the URL of
# its `postgres` database; tests make databases of their own in it. The
# cluster is stopped and removed when the sourcing script exits. It loads
# pg_stat_statements, with which benches/cluster.rs counts statements.
# The settings the PostgreSQL of the tests and benches runs with
# (benches/cluster-device.sh starts its own with them too).
POSTGRES_SETTINGS="-c max_connections=400 -c fsync=on -c shared_preload_libraries=pg_stat_statements"
ensure_postgres() {
    command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
        || apt_install postgresql
    local bin
    bin=$(dirname "$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1)")
    [ -x "$bin/initdb" ] || die "PostgreSQL's initdb not found (apt-get install postgresql)"
    id postgres >/dev/null 2>&1 || die "no user postgres (the postgresql package makes it)"
    PG_DIR=$(mktemp -d /tmp/conclave-pg.XXXXXX)
    chown postgres "$PG_DIR"
    local port
    port=$(free_port)
    log "starting PostgreSQL ($("$bin/postgres" --version | awk '{print $3}')) on 127.0.0.1:$port, data in $PG_DIR"
    runuser -u postgres -- "$bin/initdb" -D "$PG_DIR/data" -A trust -U postgres >"$PG_DIR/initdb.log" 2>&1 \
        || die "initdb failed: see $PG_DIR/initdb.log"
    runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $port -k $PG_DIR $POSTGRES_SETTINGS" start >/dev/null \
        || die "PostgreSQL did not start: see $PG_DIR/server.log"
    PG_BIN=$bin
    export CONCLAVE_TEST_POSTGRES="postgres://postgres@127.0.0.1:$port/postgres"
    CLEANUP+=("runuser -u postgres -- $PG_BIN/pg_ctl -D $PG_DIR/data -m immediate stop >/dev/null 2>&1; rm -rf $PG_DIR")
}

# NATS with JetStream for the scale-out tests: Debian's nats-server on a
# free port, its store in a temporary directory. Exports CONCLAVE_TEST_NATS
# (tests isolate themselves by stream and bucket names) and
# CONCLAVE_TEST_NATS_SERVER (the binary, for tests that start their own).
ensure_nats() {
    command -v nats-server >/dev/null || apt_install nats-server
    NATS_DIR=$(mktemp -d /tmp/conclave-nats.XXXXXX)
    local port pid
    port=$(free_port)
    log "starting nats-server ($(nats-server --version)) with JetStream on 127.0.0.1:$port"
    setsid nats-server -a 127.0.0.1 -p "$port" -js -sd "$NATS_DIR" >"$NATS_DIR/server.log" 2>&1 </dev/null &
    pid=$!
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            export CONCLAVE_TEST_NATS="nats://127.0.0.1:$port"
            export CONCLAVE_TEST_NATS_SERVER
            CONCLAVE_TEST_NATS_SERVER=$(command -v nats-server)
            CLEANUP+=("kill $pid 2>/dev/null; rm -rf $NATS_DIR")
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || die "nats-server exited at start-up: see $NATS_DIR/server.log"
        sleep 0.1
    done
    die "nats-server did not listen on 127.0.0.1:$port within 10 s: see $NATS_DIR/server.log"
}

# Unmounts everything mounted under DIR, deepest first.
unmount_under() {
    local dir=$1
    findmnt -rn -o TARGET | awk -v d="$dir/" 'index($0, d) == 1' | sort -r \
        | while read -r target; do umount -l "$target" 2>/dev/null || true; done
}

# What a test run may leave on the host: the cgroups of local sandboxes
# and stopped docker sandbox containers. leftovers_mark FILE records those
# there before the run; leftovers_clear FILE removes the ones made since.
# A cgroup with a process in it is not removed (rmdir refuses), nor is a
# running container: only what no process uses any more.
leftovers_now() {
    find /sys/fs/cgroup -maxdepth 3 -type d -path '*/conclave/local-*' 2>/dev/null
    if command -v docker >/dev/null; then
        docker ps -aq --no-trunc --filter label=conclave.managed --filter status=exited 2>/dev/null
        docker ps -aq --no-trunc --filter label=conclave.managed --filter status=created 2>/dev/null
    fi
}
leftovers_mark() {
    leftovers_now | sort > "$1"
}
leftovers_clear() {
    local item
    leftovers_now | sort | comm -13 "$1" - | while read -r item; do
        case $item in
            /sys/fs/cgroup/*) rmdir "$item" 2>/dev/null || true ;;
            *) docker rm -f "$item" >/dev/null 2>&1 || true ;;
        esac
    done
}

# Commands run when the sourcing script exits (servers started above).
CLEANUP=()
run_cleanup() {
    local c
    for c in "${CLEANUP[@]}"; do eval "$c" || true; done
}
trap run_cleanup EXIT
