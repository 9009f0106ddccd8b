#!/usr/bin/env bash
# The gateway against the Rust routers (issue 20): one `conclave sim`
# replica, and in front of it, one after the other, Conclave's gateway
# (`conclave serve` with a pool, traces on as by default), sglang-router
# and vllm-router (from PyPI, in target/routers-venv), each with the seed-001
# injection (`logprobs`, `return_token_ids`) in the requests. Each is loaded
# with `wrk -t1 -c16` for DURATION seconds after a warm-up; the proxy's CPU
# time is read from /proc/PID/stat before and after and divided by the calls
# it served. The sim is also loaded directly, as the reference.
#
# usage: [CONCLAVE_BENCH_BIN=…] benches/routers.sh [DURATION_S]
#        (as root on Debian: installs wrk)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
DURATION=${1:-15}

source benches/routers_lib.sh
apt_install wrk
CLK_TCK=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

cat > "$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "sim-model", "messages": [{"role": "user", "content": "Say hello to the router benchmark"}], "logprobs": true, "return_token_ids": true}'
LUA

# Loads URL with wrk and prints one result line: name, calls/s, p50, p99,
# CPU µs per call of PID (0 for none).
measure() {
    local name=$1 url=$2 pid=$3
    wrk -t1 -c16 -d3s -s "$WORK/post.lua" "$url" > /dev/null
    local before after out calls
    [ "$pid" = 0 ] || before=$(cpu_ticks "$pid")
    out=$(wrk -t1 -c16 -d"${DURATION}s" --latency -s "$WORK/post.lua" "$url")
    [ "$pid" = 0 ] || after=$(cpu_ticks "$pid")
    calls=$(awk '/requests in/ {print $1}' <<< "$out")
    local non2xx
    non2xx=$(awk '/Non-2xx/ {print $NF}' <<< "$out")
    [ -z "$non2xx" ] || die "$name answered $non2xx non-2xx responses"
    local rate p50 p99 cpu=0
    rate=$(awk '/Requests\/sec/ {print $2}' <<< "$out")
    p50=$(awk '$1 == "50%" {print $2}' <<< "$out")
    p99=$(awk '$1 == "99%" {print $2}' <<< "$out")
    if [ "$pid" != 0 ]; then
        cpu=$(awk -v t=$((after - before)) -v hz="$CLK_TCK" -v n="$calls" \
            'BEGIN {printf "%.1f", t * 1e6 / hz / n}')
    fi
    printf '%s %s %s %s %s\n' "$name" "$rate" "$p50" "$p99" "$cpu" | tee -a "$WORK/results"
}

SIM_PORT=$(free_port)
start sim.log "$BIN" sim --listen "127.0.0.1:$SIM_PORT" --id sim --tokens 16
SIM="http://127.0.0.1:$SIM_PORT"
wait_ok "$SIM/health"

log "direct to the sim"
measure direct "$SIM/v1/chat/completions" 0

log "Conclave's gateway"
GW_PORT=$(free_port)
cat > "$WORK/conclave.toml" <<TOML
listen = "127.0.0.1:$GW_PORT"
data_dir = "$WORK/data"
[sandbox]
warm_pool = 0
[gateway.pools.sim-model]
strategy = "round_robin"
inject = { logprobs = true, return_token_ids = true }
[[gateway.pools.sim-model.replicas]]
url = "$SIM/v1"
TOML
RUST_LOG=warn start conclave.log "$BIN" serve --config "$WORK/conclave.toml" --sandbox local
GW_PID=$STARTED
wait_ok "http://127.0.0.1:$GW_PORT/health"
measure conclave "http://127.0.0.1:$GW_PORT/v1/chat/completions" "$GW_PID"

log "sglang-router"
SG_PORT=$(free_port)
start sglang.log "$VENV/bin/sglang-router" launch --host 127.0.0.1 --port "$SG_PORT" \
    --worker-urls "$SIM" --policy round_robin --log-level error \
    --prometheus-port "$(free_port)"
SG_PID=$STARTED
wait_ok "http://127.0.0.1:$SG_PORT/health"
measure sglang-router "http://127.0.0.1:$SG_PORT/v1/chat/completions" "$SG_PID"

log "vllm-router"
VL_PORT=$(free_port)
start vllm.log "$VENV/bin/vllm-router" --host 127.0.0.1 --port "$VL_PORT" \
    --worker-urls "$SIM" --policy round_robin --log-level error \
    --prometheus-port "$(free_port)"
VL_PID=$STARTED
wait_ok "http://127.0.0.1:$VL_PORT/health"
measure vllm-router "http://127.0.0.1:$VL_PORT/v1/chat/completions" "$VL_PID"

echo
echo "| proxy | calls/s | p50 | p99 | CPU µs per call |"
echo "| --- | --- | --- | --- | --- |"
awk '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, ($5 == 0 ? "—" : $5)}' "$WORK/results"
awk '$1 == "conclave" {c = $5} $1 == "sglang-router" {s = $5} $1 == "vllm-router" {v = $5}
     END {best = (s < v ? s : v); printf "\nConclave CPU per call / the better router: %.2f (target at most 0.70)\n", c / best}' \
    "$WORK/results"
