#!/usr/bin/env bash
# What a turn end's workspace snapshot costs the server (issue 71: a
# turn-end snapshot at most 10 % of a one-call turn's CPU, on docker and
# local). One release binary, `conclave serve` with the demo model on a
# fresh data directory per server; SNAPSHOT_TURNS turns of
# {"prompt": "$ true"} (the demo model calls Bash with `true`, which marks
# the workspace changed) in sessions of 50 whose sandbox is kept, one after
# the other, the server's CPU ticks over them (benches/compare_lib.sh's
# turn_figures), with snapshots on (`sandbox.snapshots.keep_last = 3`, the
# default) and off (`keep_last = 0`), in SNAPSHOT_ROUNDS alternating
# rounds per backend. The snapshot's share is (on - off) / on.
#
#   SNAPSHOT_BACKENDS="local docker"   which sandbox backends
#   SNAPSHOT_ROUNDS=3                  rounds of on and off per backend
#   SNAPSHOT_TURNS=400                 turns per reading
#   SNAPSHOT_COMMAND=true              each turn's command (`date +%N > t`
#                                      writes a file: a freeze copies it)
#   SNAPSHOT_PREFILL_KB=0              a first turn per session writes 1,000
#                                      files of this many KiB (100: a 100 MB
#                                      workspace), unmeasured
#   SNAPSHOT_CHILDREN=1                count the CPU of the processes the
#                                      server started and reaped (cp, tar,
#                                      sandbox containers) too
#   CONCLAVE_BENCH_BIN                 a release binary (else built)
#
# Run: `bash benches/snapshot_cost.sh` as root (sandboxes), with dockerd
# and the sandbox images for docker (as scripts/test.sh sets them up).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
source benches/procs_lib.sh
source benches/compare_lib.sh

BACKENDS=${SNAPSHOT_BACKENDS:-local docker}
ROUNDS=${SNAPSHOT_ROUNDS:-3}
TURNS=${SNAPSHOT_TURNS:-400}
COMMAND=${SNAPSHOT_COMMAND:-true}
PREFILL_KB=${SNAPSHOT_PREFILL_KB:-0}
export CPU_WITH_CHILDREN=${SNAPSHOT_CHILDREN:-1}
export TURN_TOOL_BODY
TURN_TOOL_BODY=$(python3 -c 'import json, sys; print(json.dumps({"prompt": "$ " + sys.argv[1]}))' "$COMMAND")
if [ "$PREFILL_KB" != 0 ]; then
    export TURN_SESSION_FIRST_BODY
    TURN_SESSION_FIRST_BODY=$(python3 -c 'import json, sys; print(json.dumps({"prompt": "$ mkdir -p fill && for i in $(seq 1000); do head -c %sK /dev/urandom > fill/f$i; done" % sys.argv[1]}))' "$PREFILL_KB")
fi

# figure BACKEND KEEP TAG: the server's CPU µs per turn in a session.
figure() {
    local backend=$1 keep=$2 tag=$3 port base pid data="$WORK/$3-data" figures
    printf '[sandbox.snapshots]\nkeep_last = %s\n' "$keep" > "$WORK/$tag.toml"
    port=$(free_port)
    base="http://127.0.0.1:$port"
    RUST_LOG=warn start "$tag.log" "$BIN" serve --config "$WORK/$tag.toml" \
        --listen "127.0.0.1:$port" --data-dir "$data" --sandbox "$backend"
    pid=$STARTED
    wait_ok "$base/health"
    # No plain or one-shot figures: only the turns in sessions.
    figures=$(turn_figures "$base" "$pid" 1 1 "$TURNS" "$WORK/$tag") || die "turns failed; logs in $WORK"
    stop "$pid"
    "$BIN" sandboxes prune --data-dir "$data" --sandbox "$backend" > /dev/null 2>&1 || true
    echo "${figures##* }"
}

echo "command \`$COMMAND\`, prefill ${PREFILL_KB} KiB x 1,000 files, children counted: $CPU_WITH_CHILDREN"
echo "| backend | round | snapshots on, µs a turn | off, µs a turn | snapshot's share |"
echo "| --- | ---: | ---: | ---: | ---: |"
for backend in $BACKENDS; do
    for round in $(seq "$ROUNDS"); do
        # Alternate which goes first.
        if [ $((round % 2)) = 1 ]; then
            on=$(figure "$backend" 3 "$backend-on-$round")
            off=$(figure "$backend" 0 "$backend-off-$round")
        else
            off=$(figure "$backend" 0 "$backend-off-$round")
            on=$(figure "$backend" 3 "$backend-on-$round")
        fi
        share=$(awk -v on="$on" -v off="$off" 'BEGIN {printf "%.0f %%", (on - off) * 100 / on}')
        echo "| $backend | $round | $on | $off | $share |"
    done
done
