#!/usr/bin/env bash
# Soak (issue 16, Evidence): three meshed `skiff node`s on loopback, a
# publisher on A at a steady rate, one subscriber on B and one on C; C's
# subscriber is paused (SIGSTOP) and resumed (SIGCONT) in turn. At the end:
#   - RSS of every node flat after warm-up (the last sample within 25 % +
#     8 MiB of the one taken at a quarter of the run);
#   - counters add up, per subscription: published = received + dropped by
#     its policy (counted in the node's stats) + still queued; and nothing
#     lost or dropped between the nodes (every link's lost / dropped is 0).
#
#   scripts/soak.sh DURATION_SECONDS [RATE_PER_SECOND]
#
# CI runs it for 2 minutes (scripts/test.sh); by hand: `scripts/soak.sh 3600`.
# SKIFF=path picks the binary (default: a debug build of this tree).
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:?usage: scripts/soak.sh DURATION_SECONDS [RATE_PER_SECOND]}
RATE=${2:-2000}
if [ -z "${SKIFF:-}" ]; then
    cargo build --quiet -p skiff-cli
    SKIFF="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug/skiff"
fi
TMP="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT

read -r -a PORTS <<<"$(python3 - <<'PY'
import socket
held, out = [], []
for kind in [socket.SOCK_STREAM] * 3 + [socket.SOCK_DGRAM] * 3:
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    held.append(s)
    out.append(str(s.getsockname()[1]))
print(" ".join(out))
PY
)"
TCP=("${PORTS[@]:0:3}")
MESH=("${PORTS[@]:3:3}")
NET="soak-$$"
NODE_PIDS=()
for i in 0 1 2; do
    seeds=""
    for j in 0 1 2; do [ "$j" != "$i" ] && seeds+="${seeds:+,}127.0.0.1:${MESH[$j]}"; done
    "$SKIFF" node --tcp "127.0.0.1:${TCP[$i]}" --mesh "127.0.0.1:${MESH[$i]}" --net "$NET" \
        --seeds "$seeds" --no-scout 2>"$TMP/node$i.log" &
    PIDS+=($!)
    NODE_PIDS+=($!)
done
node() { echo "skiff://127.0.0.1:${TCP[$1]}"; }
stats() { "$SKIFF" stats --json -n "$(node "$1")"; }
for i in 0 1 2; do
    for _ in $(seq 100); do
        up=$(stats "$i" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["mesh"]["stats"]["members_up"])' 2>/dev/null || echo 0)
        [ "$up" = 2 ] && break
        sleep 0.1
    done
    [ "$up" = 2 ] || { echo "soak: node $i did not join the mesh" >&2; tail "$TMP"/node*.log >&2; exit 1; }
done
"$SKIFF" sub -n "$(node 1)" 'soak.>' >"$TMP/sub_b" 2>"$TMP/sub_b.err" &
PIDS+=($!)
"$SKIFF" sub -n "$(node 2)" 'soak.>' >"$TMP/sub_c" 2>"$TMP/sub_c.err" &
SUB_C=$!
PIDS+=($SUB_C)
# Until A knows both subscriptions.
for _ in $(seq 100); do
    n=$(stats 0 | python3 -c 'import json,sys; print(sum(p["patterns"] for p in json.load(sys.stdin)["mesh"]["peers"] if p["up"]))')
    [ "$n" = 2 ] && break
    sleep 0.1
done
rss() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }

echo "soak: $DUR s at $RATE msg/s through A, subscribers on B and C (C paused and resumed)" >&2
python3 - "$DUR" "$RATE" <<'PY' | "$SKIFF" pub -n "$(node 0)" soak.n &
import sys, time
dur, rate = float(sys.argv[1]), float(sys.argv[2])
start = time.monotonic()
i = 0
out = sys.stdout
while True:
    now = time.monotonic() - start
    if now >= dur:
        break
    due = int(now * rate)
    while i < due:
        out.write(f"{i}\n")
        i += 1
    out.flush()
    time.sleep(0.005)
print(i, file=open("/dev/stderr", "w"))
PY
PUB=$!
PIDS+=($PUB)
START=$(date +%s)
QUARTER=""
declare -A RSS0
while kill -0 "$PUB" 2>/dev/null; do
    t=$(( $(date +%s) - START ))
    # C's subscriber: paused for 3 s out of every 10.
    if [ $(( t % 10 )) -lt 3 ]; then kill -STOP "$SUB_C" 2>/dev/null || true; else kill -CONT "$SUB_C" 2>/dev/null || true; fi
    if [ -z "$QUARTER" ] && [ "$t" -ge $(( DUR / 4 )) ]; then
        QUARTER=$t
        for i in 0 1 2; do RSS0[$i]=$(rss "${NODE_PIDS[$i]}"); done
        echo "soak: RSS at ${t}s (after warm-up): A ${RSS0[0]} kB, B ${RSS0[1]} kB, C ${RSS0[2]} kB" >&2
    fi
    sleep 0.5
done
kill -CONT "$SUB_C" 2>/dev/null || true
wait "$PUB" || { echo "soak: the publisher failed" >&2; exit 1; }
# Let every queue drain (the subscribers read what waits).
sleep 3
fail=0
for i in 0 1 2; do
    r=$(rss "${NODE_PIDS[$i]}")
    limit=$(( ${RSS0[$i]} * 125 / 100 + 8192 ))
    echo "soak: node $i RSS ${RSS0[$i]} kB -> $r kB (limit $limit kB)" >&2
    [ "$r" -le "$limit" ] || { echo "soak: node $i grew" >&2; fail=1; }
done
published=$(stats 0 | python3 -c 'import json,sys; print(json.load(sys.stdin)["published"])')
for pair in "1 sub_b" "2 sub_c"; do
    set -- $pair
    got=$(wc -l <"$TMP/$2")
    read -r dropped queued links <<<"$(stats "$1" | python3 -c '
import json, sys
s = json.load(sys.stdin)
subs = [x for c in s["clients"] for x in c["subscriptions"] if x["pattern"] == "soak.>"]
print(sum(x["dropped"] for x in subs), sum(x["queued"] for x in subs), end=" ")
bad = sum(l["lost"] + l["dropped_newest"] + l["dropped_oldest"] for l in s["mesh"]["links"])
print(bad)')"
    echo "soak: $2: published $published = received $got + dropped by its policy $dropped + queued $queued; link losses $links" >&2
    [ $(( got + dropped + queued )) -eq "$published" ] || { echo "soak: $2's counters do not add up" >&2; fail=1; }
    [ "$links" -eq 0 ] || { echo "soak: the links lost or dropped frames" >&2; fail=1; }
done
# And A's own links.
a_links=$(stats 0 | python3 -c 'import json,sys; s=json.load(sys.stdin); print(sum(l["lost"] + l["dropped_newest"] + l["dropped_oldest"] for l in s["mesh"]["links"]))')
[ "$a_links" -eq 0 ] || { echo "soak: A's links lost or dropped $a_links frames" >&2; fail=1; }
[ $fail = 0 ] && echo "soak: passed ($DUR s, $published messages)" >&2
exit $fail
