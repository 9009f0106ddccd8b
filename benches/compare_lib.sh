# Measurements and parsers for benches/compare.sh (sourced after
# scripts/lib.sh and benches/procs_lib.sh, which give log, die, free_port,
# start, stop, wait_ok and $WORK). Each measurement takes the binary to
# measure as its first argument, so one run can load two builds in turn.
# shellcheck shell=bash

CLK_TCK=$(getconf CLK_TCK)

# User plus system CPU ticks of PID, its exited threads included (fields
# 14 and 15 of /proc/PID/stat, as benches/routers.sh reads them); with
# CPU_WITH_CHILDREN=1 also those of the children it has reaped (16 and
# 17: the host tools and sandbox containers it started).
cpu_ticks() {
    if [ "${CPU_WITH_CHILDREN:-0}" = 1 ]; then
        awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat"
    else
        awk '{print $14 + $15}' "/proc/$1/stat"
    fi
}

# Waits (at most 15 s) until PID has spent at most one tick in a second:
# the background work of what came before (a warm pool refilling, a
# sandbox being removed) is done and counted before the next reading.
settle() {
    local pid=$1 before after
    for _ in $(seq 15); do
        before=$(cpu_ticks "$pid")
        sleep 1
        after=$(cpu_ticks "$pid")
        [ $((after - before)) -gt 1 ] || return 0
    done
}

# µs of CPU per unit: ticks / units.
per_unit_us() { awk -v t="$1" -v hz="$CLK_TCK" -v n="$2" 'BEGIN {printf "%.1f", t * 1e6 / hz / n}'; }

# gateway_cpu BIN SIM_URL DURATION_S TAG: the gateway's CPU µs per call, as
# benches/routers.sh measures Conclave's: `conclave serve` with a
# one-replica pool (round robin, the `logprobs`/`return_token_ids`
# injection) in front of the sim, warm pool 0, local sandboxes; `wrk -t1
# -c16` for 3 s of warm-up, then DURATION_S seconds between two readings
# of the server's CPU ticks, divided by the calls wrk counted. Prints it.
gateway_cpu() {
    local bin=$1 sim=$2 duration=$3 tag=$4 port pid before after out calls non2xx
    [ -f "$WORK/post.lua" ] || cat > "$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "sim-model", "messages": [{"role": "user", "content": "Say hello to the router benchmark"}], "logprobs": true, "return_token_ids": true}'
LUA
    port=$(free_port)
    cat > "$WORK/gateway-$tag.toml" <<TOML
listen = "127.0.0.1:$port"
data_dir = "$WORK/gateway-$tag-data"
[sandbox]
warm_pool = 0
[gateway.pools.sim-model]
strategy = "round_robin"
inject = { logprobs = true, return_token_ids = true }
[[gateway.pools.sim-model.replicas]]
url = "$sim/v1"
TOML
    RUST_LOG=warn start "gateway-$tag.log" "$bin" serve --config "$WORK/gateway-$tag.toml" --sandbox local
    pid=$STARTED
    wait_ok "http://127.0.0.1:$port/health"
    local url="http://127.0.0.1:$port/v1/chat/completions"
    wrk -t1 -c16 -d3s -s "$WORK/post.lua" "$url" > /dev/null
    before=$(cpu_ticks "$pid")
    out=$(wrk -t1 -c16 -d"${duration}s" -s "$WORK/post.lua" "$url")
    after=$(cpu_ticks "$pid")
    stop "$pid"
    calls=$(awk '/requests in/ {print $1}' <<< "$out")
    non2xx=$(awk '/Non-2xx/ {print $NF}' <<< "$out")
    [ -z "$non2xx" ] || { log "gateway ($tag) answered $non2xx non-2xx responses"; return 1; }
    [ "${calls:-0}" -gt 0 ] || { log "gateway ($tag): wrk counted no calls"; return 1; }
    per_unit_us $((after - before)) "$calls"
}

# agent_runs URL BODY N OUT [tool]: N runs of BODY through POST URL one
# after the other, on one kept-alive connection (one curl, the URL N
# times), the NDJSON streams into OUT; fails unless every run ends
# `success` (and, with `tool`, carries a tool_result that is no error).
agent_runs() {
    local url=$1 body=$2 n=$3 out=$4 tool=${5:-} urls=() ok tools
    for _ in $(seq "$n"); do urls+=("$url"); done
    curl -sS --no-buffer --max-time 120 -H 'content-type: application/json' --data-binary "$body" \
        "${urls[@]}" > "$out" || { log "curl failed on $url"; return 1; }
    ok=$(grep '"type":"result"' "$out" | grep -c '"status":"success"' || true)
    [ "$ok" = "$n" ] || { log "$ok of $n runs ended success (streams in $out)"; return 1; }
    if [ -n "$tool" ]; then
        tools=$(grep '"type":"tool_result"' "$out" | grep -c '"is_error":false' || true)
        [ "$tools" = "$n" ] || { log "$tools of $n runs had a tool_result without error (streams in $out)"; return 1; }
    fi
}

# runs_cpu PID N BODY OUT_PREFIX tool|plain URL…: N runs of BODY spread
# evenly over the URLs (one curl each, one after the other), between two
# readings of PID's CPU ticks taken once it is idle; prints CPU µs per run.
runs_cpu() {
    local pid=$1 n=$2 body=$3 prefix=$4 kind=$5 before after left count i=0 url
    shift 5
    settle "$pid"
    before=$(cpu_ticks "$pid")
    left=$n
    for url in "$@"; do
        i=$((i + 1))
        count=$(( (left + $# - i) / ($# - i + 1) ))
        agent_runs "$url" "$body" "$count" "$prefix-$i.ndjson" "${kind#plain}" || return 1
        left=$((left - count))
    done
    settle "$pid"
    after=$(cpu_ticks "$pid")
    per_unit_us $((after - before)) "$n"
}

# turn_cpu BIN BACKEND PLAIN TOOLS SESSION_TOOLS TAG: the server's CPU µs per turn with
# the demo model on a `conclave serve` on its defaults (SQLite in a fresh
# data directory, warm pool 2) with sandboxes on BACKEND, three figures:
#   - PLAIN runs of {"prompt": "hello"} through POST /agent/run (the demo
#     model answers with text);
#   - TOOLS runs of {"prompt": "$ true"} through POST /agent/run (the demo
#     model calls Bash with `true`): each leases a sandbox from the warm
#     pool, which refills, and its sandbox is removed after the run;
#   - SESSION_TOOLS turns of the same prompt in sessions of 50 turns each
#     (POST /agent/session/{id}/message), whose sandbox, leased by a first
#     turn before the reading, is kept: the tool call's own path.
# The runs go one after the other; each figure is read between two
# readings of the server's CPU ticks taken once it is idle (so a pool's
# refill and a sandbox's removal are counted) and follows warm-up runs.
# Prints "PLAIN TOOL TOOL_IN_SESSION". Stops the server, then removes what
# is left of its data directory's sandboxes (nothing when it stopped
# cleanly).
turn_cpu() {
    local bin=$1 backend=$2 plain=$3 tools=$4 session_tools=$5 tag=$6
    local data="$WORK/turns-$tag-data" port base pid figures
    port=$(free_port)
    base="http://127.0.0.1:$port"
    RUST_LOG=warn start "turns-$tag.log" "$bin" serve --listen "127.0.0.1:$port" \
        --data-dir "$data" --sandbox "$backend"
    pid=$STARTED
    wait_ok "$base/health"
    figures=$(turn_figures "$base" "$pid" "$plain" "$tools" "$session_tools" "$WORK/turns-$tag")
    local ok=$?
    stop "$pid"
    "$bin" sandboxes prune --data-dir "$data" --sandbox "$backend" > /dev/null 2>&1 || true
    [ "$ok" = 0 ] && echo "$figures"
}

# turn_figures BASE PID PLAIN TOOLS SESSION_TOOLS PREFIX: turn_cpu's
# measurements on a running server; deletes the sessions it made.
# TURN_TOOL_BODY replaces the tool-calling body, TURN_SESSION_FIRST_BODY
# the first (unmeasured) turn of each session.
turn_figures() {
    local base=$1 pid=$2 plain=$3 tools=$4 session_tools=$5 prefix=$6 per=50 ids=() urls=() id i ok=0 figures=()
    local plain_body='{"prompt": "hello"}' tool_body=${TURN_TOOL_BODY:-'{"prompt": "$ true"}'}
    local first_body=${TURN_SESSION_FIRST_BODY:-$tool_body}
    agent_runs "$base/agent/run" "$plain_body" 20 "$prefix-warm.ndjson" \
        && agent_runs "$base/agent/run" "$tool_body" 4 "$prefix-warm-tool.ndjson" tool \
        && figures+=("$(runs_cpu "$pid" "$plain" "$plain_body" "$prefix-plain" plain "$base/agent/run")") \
        && figures+=("$(runs_cpu "$pid" "$tools" "$tool_body" "$prefix-run" tool "$base/agent/run")") \
        || return 1
    for i in $(seq $(( (session_tools + per - 1) / per ))); do
        id=$(curl -sS -H 'content-type: application/json' -d '{}' "$base/agent/session" \
            | python3 -c 'import json, sys; print(json.load(sys.stdin)["session_id"])') \
            || { log "cannot create a session on $base"; ok=1; break; }
        ids+=("$id")
        urls+=("$base/agent/session/$id/message")
        agent_runs "$base/agent/session/$id/message" "$first_body" 1 "$prefix-session-warm.ndjson" tool \
            || { ok=1; break; }
    done
    [ "$ok" != 0 ] || figures+=("$(runs_cpu "$pid" "$session_tools" "$tool_body" "$prefix-session" tool "${urls[@]}")") || ok=1
    for id in "${ids[@]}"; do curl -sS -o /dev/null -X DELETE "$base/agent/session/$id" || true; done
    [ "$ok" = 0 ] && echo "${figures[*]}"
}

# The figures of a bench's output, as "KEY VALUE" lines (none for a line
# the output lacks).

# cargo bench --bench first_event: the headline block's first-event p50
# and p99 (ms), and the server's CPU per run of its last block (500 runs
# one at a time; µs).
parse_first_event() {
    awk 'function after(word,   i) { for (i = 1; i < NF; i++) if ($i == word) return $(i + 1); return "" }
         /^HEADLINE/ { headline = 1; next }
         headline && $1 == "first" && $2 == "event" {
             print "first_event_p50", after("p50"); print "first_event_p99", after("p99"); headline = 0 }
         /^secondary, reference/ { reference = 1; next }
         reference && /CPU per run/ { print "run_cpu_alone", after("server"); reference = 0 }' "$1"
}

# cargo bench --bench sandbox: per backend (its "== docker" and "== local"
# sections), the warm pool's lease + first exec p50 and the exec round
# trip p50 (ms).
parse_sandbox() {
    awk 'function after(word,   i) { for (i = 1; i < NF; i++) if ($i == word) return $(i + 1); return "" }
         /^== / { backend = $2; next }
         /^warm pool: lease \+ first exec/ { print "warm_" backend, after("p50") }
         /^exec round trip \(bollard\)/ || /^exec round trip \(resident helper\)/ || /^exec round trip +p50/ { print "exec_" backend, after("p50") }' "$1"
}

# cargo bench --bench fork: per backend, the p50 of "fork: new sandbox
# from the snapshot", lease → first output (ms), from its Markdown table.
parse_fork() {
    awk -F'|' 'function trim(s) { gsub(/^ +| +$/, "", s); return s }
         trim($3) == "fork: new sandbox from the snapshot" { print "fork_" trim($2), trim($4) }' "$1"
}
