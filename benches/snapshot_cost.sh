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
