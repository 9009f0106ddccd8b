#!/usr/bin/env bash
# Regressions show (issue 67): builds REF and the working tree and runs
# the headline benchmarks of both in alternating rounds (round 1 REF
# first, round 2 the tree first, …), then prints each headline figure as
# the median over the rounds and as a ratio, working tree / REF. Every
# figure is a cost or a latency: below 1.00× is better.
#
#   gateway      gateway CPU per call (µs): `conclave sim`, `conclave serve`
#                with a one-replica pool in front, `wrk -t1 -c16` for
#                COMPARE_GATEWAY_S seconds after 3 s of warm-up; the server's
#                CPU ticks (/proc/PID/stat) over the calls, as
#                benches/routers.sh measures Conclave's. One sim (the
#                tree's) serves both builds.
#   first_event  `cargo bench --bench first_event`: first event of probe
#                runs under 200 concurrent runs, p50 and p99 (ms); and the
#                server's CPU per run of its last block (500 runs one at a
#                time, µs).
#   sandbox      `cargo bench --bench sandbox` (docker and local): warm
#                lease + first exec p50, and the exec round trip p50 (ms).
#   turns        a plain turn's and a tool-calling turn's server CPU (µs):
#                `conclave serve` on its defaults with the demo model and
#                COMPARE_TURN_SANDBOX sandboxes; COMPARE_TURNS runs of
#                {"prompt": "hello"} through POST /agent/run, then
#                COMPARE_TOOL_TURNS of {"prompt": "$ true"} (the demo model
#                calls Bash with `true`), each leasing a sandbox from the
#                warm pool, then COMPARE_SESSION_TURNS in sessions of 50
#                turns whose sandbox is kept (the tool call's own path).
#                One run after the other on one connection; the server's
#                CPU ticks, read once it is idle again, over the runs (the
#                defaults give each figure a second of CPU or more, 100
#                ticks). No cargo bench measures a turn's CPU with a tool
#                call (first_event's last block measures plain runs, shown
#                beside).
#   fork         `cargo bench --bench fork`: fork → first output p50 (ms),
#                docker and local (with CONCLAVE_BENCH_FORKS=COMPARE_FORKS).
#
# A bench that REF does not have (fork before it landed) or a figure its
# output lacks is reported as such: the tree's figure is shown without a
# ratio. The cargo benches run each build's own bench (compiled against
# its own crate). Everything is built once up front and run from a copy,
# so a rebuild of the tree during the run does not change what is
# measured, except for first_event's server: the bench starts the
# target/release/conclave its build names. The first run against a REF
# builds it in a target dir of its own (about 35 minutes on two cores,
# 3.6 GB); later runs reuse it.
#
# usage: benches/compare.sh REF [ROUNDS]      (ROUNDS default 4, or $ROUNDS)
#   COMPARE_ONLY=gateway,first_event,sandbox,turns,fork   what to run (all)
#   COMPARE_GATEWAY_S=15      wrk seconds per gateway block
#   COMPARE_TURNS=5000        plain turns per block
#   COMPARE_TOOL_TURNS=100    tool-calling runs per block
#   COMPARE_SESSION_TURNS=500 tool-calling turns in sessions per block
#   COMPARE_TURN_SANDBOX=docker   the turns' sandbox backend (docker|local)
#   COMPARE_FORKS=1           forks at once in the fork bench (its own
#                             default is 64; the headline does not use them)
#   COMPARE_BENCH_ROUNDS      CONCLAVE_BENCH_ROUNDS for sandbox and fork
#                             (unset: their defaults, 30 and 10)
#   COMPARE_REF_DIR           REF's checkout, a git worktree kept between
#                             runs with its own target dir inside
#                             (default target/compare/ref-SHA; remove with
#                             `git worktree remove --force DIR`)
#   COMPARE_TREE=.            the source tree measured as "tree" (its
#                             build uses cargo's target dir, CARGO_TARGET_DIR
#                             when set)
#   COMPARE_BUILD_NICE=0      nice level of the builds
#   COMPARE_TIMEOUT=1800      seconds one bench run may take
# Writes the table to target/compare/latest.md (Markdown, for
# benches/README.md) and each run's output to target/compare/logs/.
#
# Installs what is missing (as root on Debian, through scripts/lib.sh):
# wrk (gateway), curl and python3; docker.io and a running dockerd, and
# the sandbox images (sandbox-images/build.sh) when sandbox, fork or turns
# on docker are selected. The local backend's figures need root.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/lib.sh

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
case $1 in -h|--help) usage ;; esac
REF_ARG=$1
ROUNDS=${2:-${ROUNDS:-4}}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive number, not $ROUNDS"
ALL=(gateway first_event sandbox turns fork)
IFS=', ' read -r -a ONLY <<< "${COMPARE_ONLY:-${ALL[*]}}"
for b in "${ONLY[@]}"; do
    [[ " ${ALL[*]} " == *" $b "* ]] || die "COMPARE_ONLY: unknown benchmark $b (known: ${ALL[*]})"
done
selected() { [[ " ${ONLY[*]} " == *" $1 "* ]]; }
GATEWAY_S=${COMPARE_GATEWAY_S:-15}
PLAIN_TURNS=${COMPARE_TURNS:-5000}
TOOL_TURNS=${COMPARE_TOOL_TURNS:-100}
SESSION_TURNS=${COMPARE_SESSION_TURNS:-500}
TURN_SANDBOX=${COMPARE_TURN_SANDBOX:-docker}
FORKS=${COMPARE_FORKS:-1}
BUILD_NICE=${COMPARE_BUILD_NICE:-0}
TIMEOUT=${COMPARE_TIMEOUT:-1800}
TREE=$(cd "${COMPARE_TREE:-$ROOT}" && pwd)
OUT=$ROOT/target/compare
LOGS=$OUT/logs

SHA=$(git rev-parse --verify --quiet "$REF_ARG^{commit}") || die "$REF_ARG is no commit here"
REF_NAME=$REF_ARG
REF_DIR=${COMPARE_REF_DIR:-$OUT/ref-${SHA:0:12}}
TREE_NAME="$(git -C "$TREE" rev-parse --short HEAD)"
[ -z "$(git -C "$TREE" status --porcelain --untracked-files=no)" ] || TREE_NAME+=" + uncommitted changes"

ensure_rust
apt_install curl python3 coreutils
selected gateway && apt_install wrk
if selected sandbox || selected fork || { selected turns && [ "$TURN_SANDBOX" = docker ]; }; then
    ensure_docker
    ensure_sandbox_images
fi

# REF's checkout: a detached worktree, reused while it is at REF.
if [ -e "$REF_DIR/.git" ]; then
    [ "$(git -C "$REF_DIR" rev-parse HEAD)" = "$SHA" ] \
        || die "$REF_DIR is not at $SHA: remove it (git worktree remove --force $REF_DIR) or set COMPARE_REF_DIR"
    [ -z "$(git -C "$REF_DIR" status --porcelain --untracked-files=no)" ] \
        || die "$REF_DIR has changes: it must be REF as committed"
elif [ -e "$REF_DIR" ]; then
    die "$REF_DIR exists and is no checkout: remove it or set COMPARE_REF_DIR"
else
    log "checking out $REF_NAME ($SHA) in $REF_DIR"
    mkdir -p "$(dirname "$REF_DIR")"
    # --force: also where a removed checkout is still registered there.
    git worktree add --quiet --force --detach "$REF_DIR" "$SHA"
fi

# The cargo benches selected (each side builds those it has).
CARGO_BENCHES=()
for b in first_event sandbox fork; do selected "$b" && CARGO_BENCHES+=("$b"); done

# has_bench DIR NAME: DIR's Cargo.toml declares the bench NAME.
has_bench() {
    [ -f "$1/benches/$2.rs" ] && grep -q "^name = \"$2\"" "$1/Cargo.toml"
}

# build SIDE DIR TARGET_DIR: builds the selected cargo benches DIR has,
# then its release binary (TARGET_DIR empty: cargo's own choice), and
# copies them to $WORK/SIDE/ (bench-NAME, conclave). The benches build
# the binary too, with the dev-dependencies' features (tokio's test-util):
# the release build comes last so that target/release/conclave, which
# first_event starts, is the release binary that the other figures use.
build() {
    local side=$1 dir=$2 target=$3 benches=() names="" b
    for b in "${CARGO_BENCHES[@]}"; do
        has_bench "$dir" "$b" && benches+=(--bench "$b") && names+=", bench $b"
    done
    log "building $side in $dir${target:+ (target dir $target)}: conclave$names"
    mkdir -p "$WORK/$side"
    (
        cd "$dir"
        [ -z "$target" ] || export CARGO_TARGET_DIR=$target
        [ ${#benches[@]} -eq 0 ] || nice -n "$BUILD_NICE" cargo bench --locked --no-run \
            "${benches[@]}" --message-format=json-render-diagnostics
        nice -n "$BUILD_NICE" cargo build --locked --release --bin conclave \
            --message-format=json-render-diagnostics
    ) | python3 -c '
import json, sys
found = {}
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kind, name = m["target"]["kind"], m["target"]["name"]
    if "bench" in kind:
        found["bench-" + name] = m["executable"]
    elif "bin" in kind and name == "conclave":
        found["conclave"] = m["executable"]
for what, path in found.items():
    print(what, path)
' > "$WORK/$side/artifacts" || die "building $side failed (cargo's output above)"
    local what path
    while read -r what path; do cp "$path" "$WORK/$side/$what"; done < "$WORK/$side/artifacts"
    [ -x "$WORK/$side/conclave" ] || die "the $side build made no conclave binary"
}

# procs_lib.sh: $WORK, start, stop, wait_ok (the binary is set, so it
# builds nothing).
CONCLAVE_BENCH_BIN=unused
source benches/procs_lib.sh
source benches/compare_lib.sh
rm -rf "$LOGS"
mkdir -p "$LOGS"

build ref "$REF_DIR" "$REF_DIR/target"
build tree "$TREE" ""
declare -A DIR=([ref]=$REF_DIR [tree]=$TREE)

RESULTS=$WORK/results   # lines: SIDE KEY VALUE ROUND
NOTES=$WORK/notes       # lines: KEY|SIDE|why it has no figure
touch "$RESULTS" "$NOTES"
side_name() { if [ "$1" = ref ]; then echo "REF ($REF_NAME)"; else echo "the tree"; fi; }
note() { echo "$1|$2|$3" >> "$NOTES"; }

# The figures, in the table's order: KEY|benchmark|label.
FIGURES=(
    "gateway_cpu|gateway|gateway CPU per call, µs"
    "first_event_p50|first_event|first event under 200 runs, p50, ms"
    "first_event_p99|first_event|first event under 200 runs, p99, ms"
    "run_cpu_alone|first_event|plain run one at a time (first_event), server CPU, µs"
    "warm_docker|sandbox|docker warm lease + first exec, p50, ms"
    "warm_local|sandbox|local warm lease + first exec, p50, ms"
    "exec_docker|sandbox|docker exec round trip, p50, ms"
    "exec_local|sandbox|local exec round trip, p50, ms"
    "turn_plain|turns|plain turn (/agent/run), server CPU, µs"
    "turn_tool|turns|tool-calling turn (/agent/run, Bash in a new $TURN_SANDBOX sandbox), server CPU, µs"
    "turn_tool_session|turns|tool-calling turn in a session (sandbox kept), server CPU, µs"
    "fork_docker|fork|fork → first output, docker, p50, ms"
    "fork_local|fork|fork → first output, local, p50, ms"
)
keys_of() { local f; for f in "${FIGURES[@]}"; do IFS='|' read -r k b _ <<< "$f"; [ "$b" = "$1" ] && echo "$k"; done; }

# run_cargo_bench BENCH SIDE ROUND: runs the side's bench executable from
# its source tree and records the figures its output has.
run_cargo_bench() {
    local bench=$1 side=$2 round=$3 exe out key value
    exe=$WORK/$side/bench-$bench
    out=$LOGS/$bench-$side-$round.log
    if [ ! -x "$exe" ]; then
        [ "$round" != 1 ] || for key in $(keys_of "$bench"); do
            note "$key" "$side" "no \`cargo bench --bench $bench\`"
        done
        return 0
    fi
    log "round $round: $bench, $(side_name "$side")"
    local envs=("CONCLAVE_BENCH_FORKS=$FORKS")
    [ -z "${COMPARE_BENCH_ROUNDS:-}" ] || envs+=("CONCLAVE_BENCH_ROUNDS=$COMPARE_BENCH_ROUNDS")
    if ! (cd "${DIR[$side]}" && env "${envs[@]}" timeout "$TIMEOUT" "$exe" --bench) > "$out" 2>&1; then
        log "$bench failed for $(side_name "$side") in round $round: see $out"
        for key in $(keys_of "$bench"); do note "$key" "$side" "failed in round $round (see ${out#"$ROOT"/})"; done
        return 0
    fi
    "parse_$bench" "$out" > "$out.figures"
    for key in $(keys_of "$bench"); do
        value=$(awk -v k="$key" '$1 == k && $2 ~ /^[0-9.]+$/ {print $2; exit}' "$out.figures")
        if [ -n "$value" ]; then
            echo "$side $key $value $round" >> "$RESULTS"
        else
            note "$key" "$side" "its output has no such figure (see ${out#"$ROOT"/})"
        fi
    done
}

# isolated COMMAND…: runs COMMAND (in the subshell of the caller's $(…))
# with a cleanup list of its own, so the servers it starts are stopped
# when it fails, even through die, and nothing else is.
isolated() {
    CLEANUP=()
    trap run_cleanup EXIT
    "$@"
}

run_gateway() {
    local side=$1 round=$2 value
    log "round $round: gateway, $(side_name "$side")"
    if value=$(isolated gateway_cpu "$WORK/$side/conclave" "$SIM" "$GATEWAY_S" "$side-$round"); then
        echo "$side gateway_cpu $value $round" >> "$RESULTS"
    else
        note gateway_cpu "$side" "failed in round $round (see target/compare/logs/gateway-$side-$round.log)"
    fi
    cp "$WORK/gateway-$side-$round.log" "$LOGS/" 2>/dev/null || true
}

run_turns() {
    local side=$1 round=$2 values plain tool session key
    log "round $round: turns, $(side_name "$side")"
    if values=$(isolated turn_cpu "$WORK/$side/conclave" "$TURN_SANDBOX" "$PLAIN_TURNS" "$TOOL_TURNS" "$SESSION_TURNS" "$side-$round"); then
        read -r plain tool session <<< "$values"
        printf '%s %s %s %s\n' "$side" turn_plain "$plain" "$round" "$side" turn_tool "$tool" "$round" \
            "$side" turn_tool_session "$session" "$round" >> "$RESULTS"
    else
        for key in $(keys_of turns); do
            note "$key" "$side" "failed in round $round (see target/compare/logs/turns-$side-$round.log)"
        done
    fi
    cp "$WORK/turns-$side-$round.log" "$LOGS/" 2>/dev/null || true
}

if selected gateway; then
    SIM_PORT=$(free_port)
    start sim.log "$WORK/tree/conclave" sim --listen "127.0.0.1:$SIM_PORT" --id sim --tokens 16
    SIM="http://127.0.0.1:$SIM_PORT"
    wait_ok "$SIM/health"
fi

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
STARTED_AT=$(date -u '+%Y-%m-%d %H:%M UTC')
for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order=(ref tree); else order=(tree ref); fi
    for bench in "${ALL[@]}"; do
        selected "$bench" || continue
        for side in "${order[@]}"; do
            case $bench in
                gateway) run_gateway "$side" "$round" ;;
                turns) run_turns "$side" "$round" ;;
                *) run_cargo_bench "$bench" "$side" "$round" ;;
            esac
        done
    done
done

# median SIDE KEY: the median of the rounds' values, empty for none.
median() {
    awk -v s="$1" -v k="$2" '$1 == s && $2 == k {print $3}' "$RESULTS" | sort -g \
        | awk '{v[NR] = $1} END {if (NR) printf "%.2f", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
}
rounds_of() {
    awk -v s="$1" -v k="$2" '$1 == s && $2 == k {printf "%s%s", sep, $3; sep = " "} END {if (!sep) printf "—"}' "$RESULTS"
}
trimmed() { sed -E '/\./ s/0+$//; s/\.$//' <<< "$1"; }

{
    echo "\`benches/compare.sh $REF_NAME $ROUNDS\` on $STARTED_AT: REF $REF_NAME ($SHA), tree $TREE_NAME;"
    echo "$ROUNDS alternating rounds, medians; $(nproc) cores, load average $LOAD_BEFORE at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end."
    echo
    echo "| benchmark | $REF_NAME | tree | tree / $REF_NAME |"
    echo "| --- | ---: | ---: | ---: |"
    FOOT=()
    for f in "${FIGURES[@]}"; do
        IFS='|' read -r key bench label <<< "$f"
        selected "$bench" || continue
        cells=()
        for side in ref tree; do
            m=$(median "$side" "$key")
            cell=$(if [ -n "$m" ]; then trimmed "$m"; else echo n/a; fi)
            # What went wrong for this figure, as a footnote (shared by the
            # figures it is the same for).
            why=$(awk -F'|' -v k="$key" -v s="$side" '$1 == k && $2 == s {printf "%s%s", sep, $3; sep = "; "}' "$NOTES")
            if [ -n "$why" ]; then
                why="$(side_name "$side"): $why"
                for i in "${!FOOT[@]}"; do [ "${FOOT[$i]}" != "$why" ] || break; done
                if [ ${#FOOT[@]} -eq 0 ] || [ "${FOOT[$i]}" != "$why" ]; then
                    FOOT+=("$why")
                    i=$((${#FOOT[@]} - 1))
                fi
                cell+=" [$((i + 1))]"
            fi
            cells+=("$cell")
        done
        r=$(median ref "$key") t=$(median tree "$key")
        if [ -n "$r" ] && [ -n "$t" ] && awk -v r="$r" 'BEGIN {exit !(r > 0)}'; then
            ratio=$(awk -v r="$r" -v t="$t" 'BEGIN {printf "%.2f×", t / r}')
        else
            ratio="—"
        fi
        echo "| $label | ${cells[0]} | ${cells[1]} | $ratio |"
    done
    if [ ${#FOOT[@]} -gt 0 ]; then
        echo
        for i in "${!FOOT[@]}"; do echo "[$((i + 1))] ${FOOT[$i]}"; done
    fi
} > "$OUT/latest.md"

echo
cat "$OUT/latest.md"
echo
echo "Each round's figures (REF | tree), in round order:"
for f in "${FIGURES[@]}"; do
    IFS='|' read -r key bench label <<< "$f"
    selected "$bench" || continue
    printf '  %-60s %s | %s\n' "$label" "$(rounds_of ref "$key")" "$(rounds_of tree "$key")"
done
echo
log "the table is in ${OUT#"$ROOT"/}/latest.md, each run's output in ${LOGS#"$ROOT"/}/"
