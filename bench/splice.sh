#!/usr/bin/env bash
# The splice's throughput (issue 21 item 3): cross-node pub/sub, an shm
# publisher on node A and a TCP subscriber on node B (two `skiff node`
# processes meshed on loopback, reliable links), with A's `splice` on
# (large publishes go on the link by reference into the publisher's ring)
# and off (copied into the link's batches), back to back per round:
#
#   bench/splice.sh [ROUNDS] [extra `skiff bench pubsub` options]
#
# Default 3 rounds of 1x1 at 4 KiB and 64 KiB, 2 s per row. A fresh pair
# of nodes per mode and round. Prints each row (JSON lines, from
# `skiff bench pubsub --json`, with "round" and "splice" added), the
# machine's load, and A's `spliced` count per run (0 with splice off).
# SKIFF=path uses that binary instead of building one.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
rounds=${1:-3}
[ $# -gt 0 ] && shift
target=${CARGO_TARGET_DIR:-$root/target}
if [ -z "${SKIFF:-}" ]; then
    cargo build --release -p skiff-cli --bin skiff >&2
    SKIFF="$target/release/skiff"
fi
free_port() { python3 -c 'import socket,sys; s=socket.socket(socket.AF_INET, getattr(socket, sys.argv[1])); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' "$1"; }
pids=()
stop() {
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}
trap stop EXIT
wait_tcp() {
    for _ in $(seq 1 100); do
        python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2)' "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "bench/splice.sh: no node on port $1" >&2
    exit 1
}
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
for round in $(seq 1 "$rounds"); do
    for splice in 1 0; do
        net="splice-$$-$round-$splice"
        name="splice$$r$round$splice"
        ta=$(free_port SOCK_STREAM) tb=$(free_port SOCK_STREAM)
        ma=$(free_port SOCK_DGRAM) mb=$(free_port SOCK_DGRAM)
        SKIFF_SPLICE=$splice "$SKIFF" node --tcp "127.0.0.1:$ta" --shm "$name" \
            --mesh "127.0.0.1:$ma" --net "$net" --no-scout 2>/dev/null &
        pids+=($!)
        "$SKIFF" node --tcp "127.0.0.1:$tb" --mesh "127.0.0.1:$mb" --net "$net" \
            --seeds "127.0.0.1:$ma" --no-scout 2>/dev/null &
        pids+=($!)
        wait_tcp "$ta"
        wait_tcp "$tb"
        for _ in $(seq 1 50); do [ -S "/dev/shm/skiff/$name/node.sock" ] && break; sleep 0.1; done
        "$SKIFF" bench pubsub --json --shapes 1x1 --sizes 4k,64k \
            --pub-at "shm://$name" --sub-at "skiff://127.0.0.1:$tb" "$@" \
            | python3 -c '
import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        row = json.loads(line)
        print(json.dumps({"round": int(sys.argv[1]), "splice": sys.argv[2] == "1", **row}))
' "$round" "$splice"
        echo "round $round splice=$splice: A spliced $("$SKIFF" stats -n "skiff://127.0.0.1:$ta" --json 2>/dev/null \
            | python3 -c 'import json,sys; v=json.load(sys.stdin); print(sum(l.get("spliced",0) for l in (v.get("mesh") or {}).get("links",[])))' 2>/dev/null || echo '?'); load $(cut -d' ' -f1 /proc/loadavg)"
        stop
    done
done
