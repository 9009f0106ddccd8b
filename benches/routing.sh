#!/usr/bin/env bash
# Routing that knows the replicas' prompt caches (issue 20): four
# `conclave sim` replicas, each modelling a prefix cache of CACHE_TOKENS
# prompt tokens (time to first token = PREFILL_US µs per prompt token it does
# not have: 1 ms by default, a slow engine, so that the prefill that routing
# decides outweighs the CPU the proxies and the client share on a small
# machine), and in front of them, one after the other: Conclave's gateway with
# round_robin, session_affinity and prefix_cache, sglang-router with
# cache_aware and vllm-router with consistent_hash. Each faces the same
# load (benches/routing_client.py): 64 agent conversations at once, 8 turns
# each, on a shared system prompt of 2,000 words, each turn adding 150 words
# of its own and the answer. The sims start afresh for each router.
#
# Reported per router: mean, p50 and p99 time to first token as the client
# saw it; the share of prompt tokens the sims had cached; the mean prefill
# per call the sims modelled (uncached tokens × PREFILL_US, free of the
# machine's noise); the fewest and most calls one sim served.
#
# usage: [CONCLAVE_BENCH_BIN=…] benches/routing.sh [CACHE_TOKENS [PREFILL_US]]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
CACHE_TOKENS=${1:-24000}
PREFILL_US=${2:-1000}
SESSIONS=64 TURNS=8 SYSTEM_WORDS=2000 USER_WORDS=150

source benches/routers_lib.sh

SIM_PIDS=()
SIMS=()
start_sims() {
    SIM_PIDS=()
    SIMS=()
    for i in 0 1 2 3; do
        local port
        port=$(free_port)
        start "sim$i.log" "$BIN" sim --listen "127.0.0.1:$port" --id "sim$i" --tokens 16 \
            --prefix-cache-tokens "$CACHE_TOKENS" --prefill-us-per-token "$PREFILL_US"
        SIM_PIDS+=("$STARTED")
        SIMS+=("http://127.0.0.1:$port")
        wait_ok "http://127.0.0.1:$port/health"
    done
}

# Runs the load through URL and prints one result line: name, mean, p50,
# p99 TTFT (ms), the share of prompt tokens the sims had cached, the mean
# modelled prefill (ms), and the fewest and most calls one sim served.
run() {
    local name=$1 url=$2
    local out
    out=$("$VENV/bin/python" benches/routing_client.py "$url" \
        "$SESSIONS" "$TURNS" "$SYSTEM_WORDS" "$USER_WORDS")
    local stats="["
    for sim in "${SIMS[@]}"; do
        stats+="$(curl -fsS "$sim/sim/stats"),"
    done
    stats="${stats%,}]"
    "$VENV/bin/python" - "$name" "$out" "$stats" "$PREFILL_US" <<'PY' | tee -a "$WORK/results"
import json, statistics, sys
name, out, stats = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
prefill_us = int(sys.argv[4])
if out["failed"]:
    sys.exit(f"{name}: {len(out['failed'])} conversations failed: {out['failed'][:3]}")
ttft = sorted(out["ttft_ms"])
p = lambda q: ttft[min(len(ttft) - 1, int(q * len(ttft)))]
prompt = sum(s["prompt_tokens"] for s in stats)
cached = sum(s["cached_tokens"] for s in stats)
calls = [s["requests"] for s in stats]
prefill_ms = (prompt - cached) * prefill_us / 1000 / sum(calls)
print(f"{name} {statistics.mean(ttft):.1f} {p(0.5):.1f} {p(0.99):.1f} "
      f"{100 * cached / prompt:.0f} {prefill_ms:.1f} {min(calls)} {max(calls)}")
PY
}

conclave() {
    local strategy=$1
    local port
    port=$(free_port)
    {
        echo "listen = \"127.0.0.1:$port\""
        echo "data_dir = \"$WORK/data-$strategy\""
        echo "[sandbox]"
        echo "warm_pool = 0"
        echo "[gateway.pools.sim-model]"
        echo "strategy = \"$strategy\""
        for sim in "${SIMS[@]}"; do
            echo "[[gateway.pools.sim-model.replicas]]"
            echo "url = \"$sim/v1\""
        done
    } > "$WORK/$strategy.toml"
    RUST_LOG=warn start "conclave-$strategy.log" "$BIN" serve --config "$WORK/$strategy.toml" \
        --sandbox local
    local pid=$STARTED
    wait_ok "http://127.0.0.1:$port/health"
    run "conclave-$strategy" "http://127.0.0.1:$port/v1/chat/completions"
    stop "$pid"
}

for strategy in round_robin session_affinity prefix_cache; do
    log "Conclave's gateway, $strategy"
    start_sims
    conclave "$strategy"
    stop "${SIM_PIDS[@]}"
done

# Runs the load through a Rust router on fresh sims: NAME, then the
# router's command up to its worker URLs and policy (port and metrics
# port added here).
router() {
    local name=$1; shift
    log "$name"
    start_sims
    local port
    port=$(free_port)
    start "$name.log" "$@" --host 127.0.0.1 --port "$port" --worker-urls "${SIMS[@]}" \
        --log-level error --prometheus-port "$(free_port)"
    local pid=$STARTED
    wait_ok "http://127.0.0.1:$port/health"
    run "$name" "http://127.0.0.1:$port/v1/chat/completions"
    stop "$pid" "${SIM_PIDS[@]}"
}

router sglang-cache_aware "$VENV/bin/sglang-router" launch --policy cache_aware
router vllm-consistent_hash "$VENV/bin/vllm-router" --policy consistent_hash

echo
echo "$SESSIONS conversations × $TURNS turns, four sims with a prefix cache of $CACHE_TOKENS tokens, $PREFILL_US µs per uncached token"
echo
echo "| router, strategy | mean TTFT ms | p50 | p99 | prompt tokens cached | modelled prefill per call, ms | calls per sim |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
awk '{printf "| %s | %s | %s | %s | %s %% | %s | %s–%s |\n", $1, $2, $3, $4, $5, $6, $7, $8}' "$WORK/results"
awk '$1 == "conclave-prefix_cache" {p = $2} $1 != "conclave-prefix_cache" && (best == "" || $2 < best) {best = $2; who = $1}
     END {printf "\nprefix_cache mean TTFT / the best other (%s): %.2f (goal at most 1.00)\n", who, p / best}' \
    "$WORK/results"
