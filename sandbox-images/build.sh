#!/usr/bin/env bash
# Builds the Conclave sandbox images conclave/sandbox-python:latest and
# conclave/sandbox-shell:latest. See README.md beside this file.
#
#   sandbox-images/build.sh [--force] [python|shell|all]   (default: all)
#
# Idempotent: an image whose conclave.dockerfile-hash label matches its
# Dockerfile and packages.txt is left alone, so a second run costs seconds.
#
# The base image, first match wins:
#   - $BASE, when set (docker may pull it);
#   - debian:bookworm-slim, when it is already in the local image store;
#   - otherwise an offline base: debootstrap (from a Debian mirror, the only
#     network it needs) builds a Debian bookworm root file system with every
#     package of the image, which is cached as a tarball and docker-imported
#     as conclave/base-<image>:bookworm. No image registry is contacted.
#
# Environment: BASE, CONCLAVE_CACHE (default ~/.cache/conclave),
# DEBIAN_MIRROR (http://deb.debian.org/debian), DEBIAN_SECURITY_MIRROR
# (http://deb.debian.org/debian-security; set it empty to skip the
# security updates of the offline base).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../scripts/lib.sh
. "$HERE/../scripts/lib.sh"

SUITE=bookworm
PUBLIC_BASE=debian:$SUITE-slim
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR-http://deb.debian.org/debian-security}
# lib.sh defaults CONCLAVE_CACHE to ${XDG_CACHE_HOME:-~/.cache}/conclave.
CACHE=$CONCLAVE_CACHE
# Bump when the way the offline root file system is made changes, so cached
# tarballs made the old way are not reused.
ROOTFS_RECIPE=1
# Docker sets no PATH for an imported image; the Dockerfiles build on it.
IMPORT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit "${1:-0}"
}

FORCE=
TARGETS=()
for arg in "$@"; do
    case "$arg" in
        python|shell) TARGETS+=("$arg") ;;
        all) TARGETS+=(python shell) ;;
        --force) FORCE=1 ;;
        -h|--help) usage 0 ;;
        *) printf 'unknown argument: %s\n\n' "$arg" >&2; usage 2 ;;
    esac
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(python shell)

# The packages of an image, one per line, comments and blanks dropped.
packages() {
    sed 's/#.*//' "$HERE/$1/packages.txt" | tr -s ' \t' '\n' | sed '/^$/d'
}

# What the final image is made from: its Dockerfile and package list.
image_hash() {
    cat "$HERE/$1/Dockerfile" "$HERE/$1/packages.txt" | sha256sum | cut -d' ' -f1
}

# What the offline root file system is made from.
rootfs_hash() {
    { echo "recipe $ROOTFS_RECIPE suite $SUITE security ${SECURITY_MIRROR:+yes}"; packages "$1"; } \
        | sha256sum | cut -c1-16
}

label_of() { # IMAGE LABEL → the label's value, empty when absent
    docker image inspect -f "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null | sed 's/^<no value>$//' || true
}

human_size() { numfmt --to=iec-i --suffix=B --format='%.1f' "$1"; }

# Unmounts everything mounted at or below DIR, deepest first.
unmount_under() {
    local dir mounts m
    dir=$(realpath "$1")
    mounts=$(awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r)
    for m in $mounts; do
        umount "$m" 2>/dev/null || umount -l "$m" || return 1
    done
}

WORK=
cleanup() {
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        if unmount_under "$WORK"; then
            rm -rf --one-file-system "$WORK"
        else
            printf 'warning: could not unmount everything under %s; left it in place\n' "$WORK" >&2
        fi
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Makes the cached root file system tarball of an image with debootstrap.
make_rootfs() { # IMAGE TARBALL
    local name=$1 tarball=$2 root pkgs logfile start
    [ "$(id -u)" = 0 ] || die "the offline base of $name needs root (debootstrap, chroot); run as root or provide a base: BASE=... $0 $name"
    command -v debootstrap >/dev/null || apt_install debootstrap
    pkgs=$(packages "$name" | paste -sd, -)
    WORK=$(mktemp -d "$CACHE/rootfs-$name.XXXXXX")
    root=$WORK/root
    logfile=$CACHE/debootstrap-$name.log
    start=$SECONDS

    log "debootstrap $SUITE (minbase + $(packages "$name" | wc -l) packages) from $MIRROR; log: $logfile"
    if ! debootstrap --variant=minbase --include="$pkgs" "$SUITE" "$root" "$MIRROR" >"$logfile" 2>&1; then
        tail -n 20 "$logfile" >&2
        [ -f "$root/debootstrap/debootstrap.log" ] && tail -n 20 "$root/debootstrap/debootstrap.log" >&2
        die "debootstrap failed for $name (is $MIRROR reachable?); full log: $logfile"
    fi

    # Sources for images derived later, and the security updates now.
    {
        echo "deb $MIRROR $SUITE main"
        echo "deb $MIRROR $SUITE-updates main"
        [ -z "$SECURITY_MIRROR" ] || echo "deb $SECURITY_MIRROR $SUITE-security main"
    } >"$root/etc/apt/sources.list"
    if [ -n "$SECURITY_MIRROR" ]; then
        log "applying $SUITE-updates and $SUITE-security"
        mount -t proc proc "$root/proc"
        if ! { chroot "$root" apt-get update -qq &&
               chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Use-Pty=0 dist-upgrade; } >>"$logfile" 2>&1; then
            tail -n 10 "$logfile" >&2
            die "updating the $name root file system failed; full log: $logfile (DEBIAN_SECURITY_MIRROR= skips the updates)"
        fi
    fi
    unmount_under "$root" || die "could not unmount what is mounted under $root"
    if awk -v d="$(realpath "$root")" '$2 == d || index($2, d "/") == 1 { found = 1 } END { exit !found }' /proc/mounts; then
        die "something is still mounted under $root; not trimming it"
    fi

    log "trimming (apt lists and caches, docs except copyright files, man pages, translations, logs)"
    # Like debian:*-slim: packages installed later skip these paths too.
    cat >"$root/etc/dpkg/dpkg.cfg.d/docker-minimal" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
    rm -rf --one-file-system \
        "${root:?}"/var/lib/apt/lists/* \
        "${root:?}"/var/cache/apt/*.bin "${root:?}"/var/cache/apt/archives/*.deb \
        "${root:?}"/var/cache/apt/archives/partial/* \
        "${root:?}"/var/cache/debconf/*-old "${root:?}"/var/lib/dpkg/*-old \
        "${root:?}"/usr/share/man/* "${root:?}"/usr/share/info/* "${root:?}"/usr/share/groff/* \
        "${root:?}"/usr/share/lintian/* "${root:?}"/usr/share/linda/* \
        "${root:?}"/debootstrap "${root:?}"/tmp/* "${root:?}"/var/tmp/* \
        "${root:?}"/dev/* "${root:?}"/etc/resolv.conf "${root:?}"/etc/hostname
    find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
    find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf --one-file-system {} +
    find "$root/var/log" -type f -delete
    # A fresh machine-id per container is systemd's business; none is baked in.
    [ ! -e "$root/etc/machine-id" ] || : >"$root/etc/machine-id"
    # Lets anyone tell what this base holds.
    printf '%s\n' "conclave offline base: $name, $SUITE, $(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        "packages: $pkgs" >"$root/etc/conclave-base"

    log "writing $tarball"
    tar -C "$root" --numeric-owner -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
    cleanup
    WORK=
    log "root file system of $name ready in $((SECONDS - start)) s ($(human_size "$(stat -c %s "$tarball")"))"
}

# Sets OFFLINE_BASE to the tag of the offline base of an image, making it
# when needed. (Not printed: in a $(...) subshell the cleanup trap would not
# run, and a failed debootstrap would leave its mounts behind.)
OFFLINE_BASE=
offline_base() { # IMAGE
    local name=$1 rhash tag tarball
    rhash=$(rootfs_hash "$name")
    tag=conclave/base-$name:$SUITE
    if [ "$(label_of "$tag" conclave.rootfs-hash)" = "$rhash" ]; then
        log "offline base $tag is up to date"
        OFFLINE_BASE=$tag
        return
    fi
    tarball=$CACHE/rootfs-$name-$rhash.tar
    if [ -s "$tarball" ]; then
        log "using the cached root file system $tarball"
    else
        make_rootfs "$name" "$tarball"
    fi
    log "importing $tarball as $tag"
    docker import \
        --change "ENV PATH=$IMPORT_PATH" \
        --change "LABEL conclave.rootfs-hash=$rhash" \
        --change 'CMD ["bash"]' \
        --message "conclave offline base for $name ($SUITE, debootstrap)" \
        "$tarball" "$tag" >/dev/null || die "docker import of $tarball failed"
    OFFLINE_BASE=$tag
}

build_image() { # IMAGE
    local name=$1 tag hash base start
    tag=conclave/sandbox-$name:latest
    hash=$(image_hash "$name")
    if [ -z "$FORCE" ] && [ "$(label_of "$tag" conclave.dockerfile-hash)" = "$hash" ]; then
        log "$tag is up to date (conclave.dockerfile-hash ${hash:0:12})"
        return
    fi
    start=$SECONDS
    if [ -n "${BASE:-}" ]; then
        base=$BASE
        log "$tag: base $base (from \$BASE)"
    elif docker image inspect "$PUBLIC_BASE" >/dev/null 2>&1; then
        base=$PUBLIC_BASE
        log "$tag: base $base (found locally)"
    else
        log "$tag: $PUBLIC_BASE is not in the local image store; using the offline base conclave/base-$name:$SUITE (no registry needed)"
        offline_base "$name"
        base=$OFFLINE_BASE
    fi
    log "docker build $tag from $base"
    docker build \
        --build-arg "BASE=$base" \
        --label "conclave.dockerfile-hash=$hash" \
        --label "conclave.base=$base" \
        -t "$tag" "$HERE/$name" || die "docker build of $tag failed (base $base)"
    log "$tag built in $((SECONDS - start)) s"
}

command -v docker >/dev/null || die "no docker CLI: apt-get install docker.io (scripts/lib.sh ensure_docker does it)"
if ! docker_err=$(docker info 2>&1 >/dev/null); then
    die "dockerd not reachable (${docker_err##*$'\n'}): start it with 'nohup dockerd >/var/log/dockerd.log 2>&1 &' or 'systemctl start docker' (scripts/lib.sh ensure_docker does it)"
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/sandbox-images.lock"
if ! flock -n 9; then
    log "another build.sh holds $CACHE/sandbox-images.lock; waiting"
    flock 9
fi

for name in "${TARGETS[@]}"; do
    build_image "$name"
done

log "sizes:"
for name in "${TARGETS[@]}"; do
    for tag in "conclave/sandbox-$name:latest" "conclave/base-$name:$SUITE"; do
        size=$(docker image inspect -f '{{.Size}}' "$tag" 2>/dev/null) || continue
        printf '    %-36s %s\n' "$tag" "$(human_size "$size")" >&2
    done
done
