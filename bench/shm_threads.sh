#!/usr/bin/env bash
# Per-thread CPU of a 1→1 fan-out through one node (issue 21 item 3): the
# node's threads and the load generator's, over TCP clients and over shm
# clients reading the topic's shared buffer, back to back:
#
#   bench/shm_threads.sh [size, default 8] [seconds, default 8]
#
# Samples utime+stime of every thread of the node and of `skiff bench
# pubsub` (from /proc/PID/task/*/stat) over the middle of the run (from
# 3 s to 1 s before its end) and prints each busy thread's share of one
# CPU and CPU time per delivered message (at the run's mean rate), and
# the whole run's CPU time (node and load generator) per delivered
# message, the figure least moved by other load. SKIFF=path uses that
# binary; KINDS="shm-shared" runs only that kind (default: tcp shm-shared
# shm-in-place; shm-in-place reads the topic with `Client::topic_reader`
# on a thread of the subscribers' runtime, `bench-sub`, and publishes with
# `Client::publisher`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SKIFF=${SKIFF:-${CARGO_TARGET_DIR:-$root/target}/release/skiff}
size=${1:-8}
secs=${2:-8}
hz=$(getconf CLK_TCK)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
name="threads$$"
"$SKIFF" node --tcp "127.0.0.1:$port" --shm "$name" --no-mesh 2>/dev/null &
node=$!
trap 'kill -INT $node 2>/dev/null; wait $node 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do [ -S "/dev/shm/skiff/$name/node.sock" ] && break; sleep 0.1; done

# ticks per thread: "pid/tid comm ticks"
snap() {
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            # comm may hold spaces: take what is between the parentheses.
            s=$(cat "$t/stat" 2>/dev/null) || continue
            comm=${s#*(}; comm=${comm%)*}; rest=${s##*) }
            set -- $rest
            cs=$(awk '/^(non)?voluntary_ctxt_switches/ { n += $2 } END { print n + 0 }' "$t/status" 2>/dev/null)
            echo "$p/${t##*/} ${comm// /_} $(( ${12} + ${13} )) ${cs:-0}"
        done
    done
}

# utime+stime of a whole process, its ended threads included.
proc_ticks() {
    local s rest
    s=$(cat /proc/"$1"/stat)
    rest=${s##*) }
    set -- $rest
    echo $(( ${12} + ${13} ))
}

echo "load: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; size $size B"
for kind in ${KINDS:-tcp shm-shared shm-in-place}; do
    case $kind in
        tcp) args=(--node "skiff://127.0.0.1:$port") ;;
        shm-shared) args=(--node "shm://$name" --shared-buffer credits) ;;
        shm-in-place) args=(--node "shm://$name" --shared-buffer credits --in-place) ;;
    esac
    out=$(mktemp)
    node0=$(proc_ticks "$node")
    # The load generator's CPU time, whole run: a subshell reports its
    # children's times (the second line of `times`).
    ( "$SKIFF" bench pubsub "${args[@]}" --shapes 1x1 --sizes "$size" --duration-secs "$secs" --messages 1000000000 >"$out" 2>&1; times >"$out.times" ) &
    sub=$!
    sleep 3
    bench=$(pgrep -P "$sub" -f "bench pubsub" | head -1)
    a=$(snap "$node" "$bench")
    t0=$(date +%s.%N)
    sleep "$(echo "$secs - 4" | bc)"
    b=$(snap "$node" "$bench")
    t1=$(date +%s.%N)
    wait $sub || true
    node1=$(proc_ticks "$node")
    # msgs/s as printed (e.g. `3.04 M`), as a number.
    rate=$(grep -E '^skiff ' "$out" | head -1 | awk '{ m = ($6 == "M") ? 1e6 : (($6 == "k") ? 1e3 : 1); printf "%d", $5 * m }')
    echo "== $kind: $rate msgs/s delivered"
    join <(echo "$a" | sort) <(echo "$b" | sort) | awk -v hz="$hz" -v dt="$(echo "$t1 - $t0" | bc)" -v node="$node" -v rate="${rate:-0}" '
        { pct = ($6 - $3) / hz / dt * 100; cs = ($7 - $4) / dt; split($1, id, "/");
          who = (id[1] == node) ? "node" : "bench";
          ns = (rate > 0) ? pct / 100 * 1e9 / rate : 0;
          if (pct >= 1) printf "%-6s %-22s %6.1f %% CPU %6.0f ns/msg %9.0f switches/s\n", who, $2, pct, ns, cs; tot[who] += pct }
        END { all = tot["node"] + tot["bench"];
              printf "total: node %.1f %%, bench %.1f %% of one CPU; %.0f ns CPU per delivered message\n", tot["node"], tot["bench"], (rate > 0) ? all / 100 * 1e9 / rate : 0 }' | sort -k3 -rn
    # children's user and system time, e.g. `0m1.234s 0m0.100s`
    gen=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] } print t }' "$out.times")
    sent=$(grep -E '^skiff ' "$out" | head -1 | awk '{ print $4 }')
    echo "whole run: node $(echo "scale=2; ($node1 - $node0) / $hz" | bc) s CPU, load generator $gen s CPU, $sent messages: $(echo "($node1 - $node0) / $hz * 1000000000 / $sent + $gen * 1000000000 / $sent" | bc) ns CPU per delivered message"
    rm -f "$out" "$out.times"
done
