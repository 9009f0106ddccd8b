# Shared set-up for scripts/serve.sh and scripts/test.sh (sourced, not run).
# Installs only what is missing, so a prepared machine starts at once.

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
    apt_install gcc libc6-dev
}
