#!/usr/bin/env bash
# Issue 16's benchmark rows in one run: bench/mesh.sh (three skiff nodes
# against a three-node nats-server cluster on loopback: cross-node pub/sub
# at 8 B and 256 B, request/reply) with skiff's default reliable links,
# then skiff alone with best-effort links (SKIFF_BEST_EFFORT='bench.>'),
# then both skiff modes again inside a fresh network namespace whose
# loopback drops 1.4 % of UDP packets (the mesh's; clients reach their
# nodes over TCP, undisturbed).
#
#   bench/mesh_reliable.sh [--duration-secs 2]
#
# Every row is the median of REPEAT runs (default 3; bench/mesh.sh
# --repeat), so that the ratios between parts (reliable at 1.4 % drop
# against lossless) compare medians, not two single runs.
# Needs root for the namespace part (skipped, and said so, without it).
# Each part's Markdown summary goes to stdout under its own heading; rows
# to bench/mesh.jsonl (overwritten by each part: the last part's stay).
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=2
[ "${1:-}" = --duration-secs ] && DUR="$2"
if [ -z "${SKIFF:-}" ]; then
    cargo build --release -p skiff-cli >&2
    SKIFF="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/skiff"
fi
export SKIFF
echo "## Reliable links (default), against nats-server"
echo
uptime | sed 's/^/Load: /'
bench/mesh.sh --duration-secs "$DUR" --trials 3 --repeat "${REPEAT:-3}"
echo
echo "## Best-effort links (SKIFF_BEST_EFFORT='bench.>'), skiff only"
echo
SKIFF_BEST_EFFORT='bench.>' bench/mesh.sh --duration-secs "$DUR" --trials 1 --repeat "${REPEAT:-3}" --only skiff
if [ "$(id -u)" = 0 ] && ip netns add skiff-bench-$$ 2>/dev/null; then
    trap 'ip netns del skiff-bench-$$' EXIT
    ip netns exec skiff-bench-$$ ip link set lo up
    ip netns exec skiff-bench-$$ iptables -A INPUT -i lo -p udp -m statistic \
        --mode random --probability 0.014 -j DROP
    for mode in reliable best-effort; do
        echo
        echo "## $mode links at 1.4 % UDP drop (a namespace's loopback), skiff only"
        echo
        if [ $mode = best-effort ]; then export SKIFF_BEST_EFFORT='bench.>'; else unset SKIFF_BEST_EFFORT; fi
        ip netns exec skiff-bench-$$ bench/mesh.sh --duration-secs "$DUR" --trials 1 --repeat "${REPEAT:-3}" --only skiff
        ip netns exec skiff-bench-$$ iptables -L INPUT -v -n -x | awk '/DROP/ { print "iptables dropped " $1 " packets so far" }'
    done
else
    echo "SKIPPED: the 1.4 % drop rows need root and ip netns"
fi
