#!/usr/bin/env bash
# The scale-out bench (`benches/cluster.rs`, issue 42) on a machine with
# more cores and no package access (the `device` machine: Ubuntu 24.04,
# 16 cores, as root), from binaries built and gathered here.
#
# usage, here (Debian bookworm, PostgreSQL 15 and nats-server installed,
# as the test command installs them):
#     cargo bench --bench cluster --no-run
#     benches/cluster-device.sh pack
#   writes target/device-kit/kit.tar.xz (about 40 MB): the bench, the
#   release server stripped, nats-server, PostgreSQL's server programs and
#   the libraries they link that are not the C library's, and the paths
#   the bench was built with.
# usage, there (in the repository root, `target/device-kit` carried):
#     benches/cluster-device.sh run [SESSIONS TURNS]...
#   unpacks the kit, starts PostgreSQL (as user postgres, made if missing)
#   and runs the bench once per SESSIONS TURNS pair (default: 60 10 and
#   480 20, the two loads of the issue), CONCLAVE_BENCH_ROUNDS rounds each
#   (3 by default), the output of each in $OUT (else target/device-kit).
#   CONCLAVE_BENCH_SERVER=PATH runs it with that server binary in place
#   of the kit's (another build, carried beside the kit), to compare two
#   builds on the same machine. CONCLAVE_BENCH_LOCK_WAITS=1 has
#   PostgreSQL log every lock wait of 5 ms or more (a diagnosis: it
#   changes the deadlock check's timing, so its figures are not the
#   bench's) and writes their count, by the relation waited on, to
#   lock-waits.txt beside the output.
set -euo pipefail
cd "$(dirname "$0")/.."
# log, die, free_port, POSTGRES_SETTINGS, CLEANUP; nothing is installed.
source scripts/lib.sh
KIT=target/device-kit

# The libraries the given programs link, less those every Linux has at
# least as new: the C library's and the compiler's runtime.
libraries() {
    ldd "$@" | awk '$3 ~ /^\// {print $3}' | sort -u \
        | grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux-x86-64|libgcc_s|libstdc\+\+)\.so'
}

# Runs a program as user postgres (initdb and the server refuse root)
# with the libraries of LIBS: as_postgres LIBS PROGRAM ARGS...
as_postgres() {
    local libs=$1
    shift
    if command -v runuser >/dev/null; then
        runuser -u postgres -- env LD_LIBRARY_PATH="$libs" "$@"
    else
        setpriv --reuid postgres --regid postgres --init-groups env LD_LIBRARY_PATH="$libs" "$@"
    fi
}

pack() {
    local bench pg share nats stage
    bench=$(ls -t target/release/deps/cluster-* 2>/dev/null | grep -v '\.d$' | head -1) \
        || true
    [ -n "$bench" ] || die "no bench binary: run cargo bench --bench cluster --no-run first"
    [ -x target/release/conclave ] || die "no target/release/conclave"
    [ -z "$(find src benches -newer "$bench" -name '*.rs' | head -1)" ] \
        || die "sources changed after $bench was built: cargo bench --bench cluster --no-run"
    pg=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
    [ -x "$pg/postgres" ] || die "no PostgreSQL server (apt-get install postgresql)"
    pg=$(dirname "$pg")
    share=/usr/share/postgresql/$(basename "$pg")
    nats=$(command -v nats-server) || die "no nats-server (apt-get install nats-server)"
    stage=$KIT/stage
    rm -rf "$KIT" && mkdir -p "$stage"/{bin,lib,zoneinfo} "$stage/root$pg/bin" "$stage/root$pg/lib"
    # The paths compiled into the bench (cargo's CARGO_BIN_EXE_conclave and
    # CARGO_TARGET_TMPDIR): where it starts the server from, and where it
    # makes its scratch directories.
    echo "$PWD/target/release/conclave" > "$stage/server-path"
    echo "$PWD/target/tmp" > "$stage/tmp-path"
    cp "$bench" "$stage/bin/cluster"
    strip -o "$stage/bin/conclave" target/release/conclave
    cp "$nats" "$stage/bin/nats-server"
    cp "$pg"/bin/{postgres,initdb,pg_ctl} "$stage/root$pg/bin/"
    # Server modules, without the JIT's bitcode (the bench does not use it).
    find "$pg/lib" -maxdepth 1 -name '*.so' ! -name llvmjit.so -exec cp {} "$stage/root$pg/lib/" \;
    mkdir -p "$stage/root$(dirname "$share")"
    cp -r "$share" "$stage/root$share"
    cp -L $(libraries "$pg"/bin/{postgres,initdb,pg_ctl} "$pg/lib/pg_stat_statements.so" \
        target/release/conclave) "$stage/lib/"
    # PostgreSQL reads time zones from the system's tzdata.
    cp -L /usr/share/zoneinfo/{UTC,GMT} "$stage/zoneinfo/"
    git rev-parse --short HEAD > "$stage/commit"
    tar -C "$stage" -cf - . | xz -T0 -6 > "$KIT/kit.tar.xz"
    rm -rf "$stage"
    log "$KIT/kit.tar.xz: $(du -h "$KIT/kit.tar.xz" | cut -f1), from commit $(git rev-parse --short HEAD)"
}

run() {
    local root=/tmp/conclave-device out server tmp libs pg port pairs settings=$POSTGRES_SETTINGS
    [ -f "$KIT/kit.tar.xz" ] || die "no $KIT/kit.tar.xz: pack it first, and carry $KIT"
    out=${OUT:-$KIT}
    rm -rf "$root" && mkdir -p "$root"
    if command -v xz >/dev/null; then
        xz -dc "$KIT/kit.tar.xz"
    else
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$KIT/kit.tar.xz"
    fi | tar -C "$root" -xf -
    server=$(cat "$root/server-path")
    tmp=$(cat "$root/tmp-path")
    mkdir -p "$(dirname "$server")" "$tmp"
    cp "${CONCLAVE_BENCH_SERVER:-$root/bin/conclave}" "$server"
    for zone in UTC GMT; do
        [ -e "/usr/share/zoneinfo/$zone" ] || { mkdir -p /usr/share/zoneinfo; cp "$root/zoneinfo/$zone" /usr/share/zoneinfo/; }
    done
    # Bookworm's libraries, for PostgreSQL, the server and the bench only.
    libs="$root/lib"
    pg=$(ls -d "$root"/root/usr/lib/postgresql/*/bin)
    port=$(free_port)
    if ! id postgres >/dev/null 2>&1; then
        if command -v useradd >/dev/null; then
            useradd --system --no-create-home postgres
        else
            echo "postgres:x:7432:7432::/nonexistent:/bin/sh" >> /etc/passwd
            echo "postgres:x:7432:" >> /etc/group
        fi
    fi
    mkdir -p "$root/pg" && chown postgres "$root/pg" && chmod 755 "$root"
    log "PostgreSQL ($(LD_LIBRARY_PATH=$libs "$pg/postgres" --version)) on 127.0.0.1:$port"
    as_postgres "$libs" "$pg/initdb" -D "$root/pg/data" -A trust -U postgres --no-locale -E UTF8 \
        >"$root/pg/initdb.log" 2>&1 || { cat "$root/pg/initdb.log"; die "initdb failed"; }
    [ -z "${CONCLAVE_BENCH_LOCK_WAITS:-}" ] \
        || settings+=" -c log_lock_waits=on -c deadlock_timeout=5ms"
    as_postgres "$libs" "$pg/pg_ctl" -D "$root/pg/data" -l "$root/pg/server.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $port -k $root/pg $settings" start >/dev/null \
        || { cat "$root/pg/server.log"; die "PostgreSQL did not start"; }
    CLEANUP+=("as_postgres '$libs' '$pg/pg_ctl' -D '$root/pg/data' -m immediate stop >/dev/null 2>&1")
    export CONCLAVE_BENCH_POSTGRES="postgres://postgres@127.0.0.1:$port/postgres"
    export CONCLAVE_BENCH_NATS_SERVER="$root/bin/nats-server"
    pairs=("$@")
    [ ${#pairs[@]} -gt 0 ] || pairs=(60 10 480 20)
    [ $((${#pairs[@]} % 2)) = 0 ] || die "usage: $0 run [SESSIONS TURNS]..."
    log "commit $(cat "$root/commit"), server ${CONCLAVE_BENCH_SERVER:-of the kit}, $(nproc) cores, $(uname -r)"
    for ((i = 0; i < ${#pairs[@]}; i += 2)); do
        local sessions=${pairs[i]} turns=${pairs[i + 1]}
        log "cluster $sessions $turns"
        LD_LIBRARY_PATH=$libs "$root/bin/cluster" "$sessions" "$turns" 2>&1 \
            | tee "$out/cluster-${sessions}x$turns.log"
    done
    if [ -n "${CONCLAVE_BENCH_LOCK_WAITS:-}" ]; then
        {
            echo "lock waits of 5 ms or more: $(grep -c 'still waiting' "$root/pg/server.log" || true)"
            grep -A2 'still waiting' "$root/pg/server.log" | grep -o 'in relation "[^"]*"' \
                | sort | uniq -c | sort -rn || true
        } | tee "$out/lock-waits.txt"
    fi
}

case "${1:-}" in
    pack) pack ;;
    run) shift; run "$@" ;;
    *) die "usage: $0 pack | run [SESSIONS TURNS]..." ;;
esac
