#!/usr/bin/env bash
# One cross-node pub/sub row through three skiff nodes in a fresh network
# namespace whose loopback drops a share of UDP packets (as
# bench/mesh_reliable.sh sets it up), then each node's association
# counters: how the reliable links recovered from loss (retransmissions by
# cause, duplicates received, time new data waited on a shut window, time
# delivery waited for a missing packet), the nodes' CPU ticks during the
# row and the namespace's UDP receive-buffer drops.
#
#   SKIFF=<skiff> bench/mesh_loss_recovery.sh DROP SHAPE SIZE [DURATION]
#   e.g. bench/mesh_loss_recovery.sh 0.014 1x2 256 2   (A->B+C, 256 B)
#
# SHAPE 1x1 subscribes on B, 1x2 on B and C; the publisher is on A. The
# bench row (JSON) goes to stdout, the counters to stderr. Needs root and
# ip netns.
set -euo pipefail
DROP="$1"; SHAPE="$2"; SIZE="$3"; DUR="${4:-2}"
SKIFF="${SKIFF:-skiff}"
NS=skiff-loss-$$
ip netns add $NS
T=$(mktemp -d)
cleanup() {
    for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del $NS
    rm -rf "$T"
}
trap cleanup EXIT
E=(ip netns exec $NS)
"${E[@]}" ip link set lo up
if [ "$DROP" != 0 ]; then
    "${E[@]}" iptables -A INPUT -i lo -p udp -m statistic --mode random --probability "$DROP" -j DROP
fi
TP=(14001 14002 14003); MP=(15001 15002 15003)
PIDS=()
for i in 0 1 2; do
    seeds=""
    for j in 0 1 2; do [ $j = $i ] || seeds+="${seeds:+,}127.0.0.1:${MP[$j]}"; done
    "${E[@]}" "$SKIFF" node --tcp 127.0.0.1:${TP[$i]} --mesh 127.0.0.1:${MP[$i]} --net loss-$$ \
        --seeds "$seeds" --no-scout >"$T/n$i.log" 2>&1 &
    PIDS+=($!)
done
sleep 1.5
args=(bench pubsub --json --shapes "$SHAPE" --sizes "$SIZE" --duration-secs "$DUR"
    --pub-at skiff://127.0.0.1:${TP[0]} --sub-at skiff://127.0.0.1:${TP[1]})
[ "${SHAPE#*x}" = 2 ] && args+=(--sub-at skiff://127.0.0.1:${TP[2]})
ticks() { for p in "${PIDS[@]}"; do awk '{print $14+$15}' /proc/$p/stat; done | tr '\n' ' '; }
cpu0=$(ticks)
"${E[@]}" "$SKIFF" "${args[@]}"
cpu1=$(ticks)
echo "node CPU ticks (A B C) before: $cpu0 after: $cpu1" >&2
for i in 0 1 2; do
    echo "== node $(echo ABC | cut -c$((i + 1)))" >&2
    "${E[@]}" "$SKIFF" stats --node skiff://127.0.0.1:${TP[$i]} --mesh | grep 'associations:' >&2 || true
done
"${E[@]}" awk '/^Udp:/ { n++ } /^Udp:/ && n == 2 { print "udp RcvbufErrors " $6 }' /proc/net/snmp >&2
if [ "$DROP" != 0 ]; then
    "${E[@]}" iptables -L INPUT -v -n -x | awk '/DROP/ { print "iptables dropped " $1 " packets" }' >&2
fi
