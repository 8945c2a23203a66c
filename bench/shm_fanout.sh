#!/usr/bin/env bash
# 1→N fan-out through one node, over TCP clients, shm clients, and shm
# clients reading the node's shared buffer of the topic (RBMQ's broker of
# buffers), and shm clients reading that buffer in place with publishers
# bound to the subject (--in-place: `Client::topic_reader`,
# `Client::publisher`), back to back in one run:
#
#   bench/shm_fanout.sh [extra `skiff bench pubsub` options]
#
# Builds skiff (release), starts `skiff node --tcp … --shm …`, and prints
# one table per kind of client (N = 1, 4, 16; 8 B and 256 B) with the
# machine's load, ready for bench/RESULTS.md. SKIFF=path uses that binary;
# SHM_OPTS=query options for the node's and the clients' shm locators
# (e.g. SHM_OPTS='ring=8M&spin=20us': docs/shm.md).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
if [ -z "${SKIFF:-}" ]; then
    cargo build --release -p skiff-cli --bin skiff >&2
    SKIFF="$target/release/skiff"
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
name="fanout$$"
q=${SHM_OPTS:+?$SHM_OPTS}
"$SKIFF" node --tcp "127.0.0.1:$port" --shm "shm://$name$q" --no-mesh 2>/dev/null &
node=$!
trap 'kill -INT $node 2>/dev/null; wait $node 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do [ -S "/dev/shm/skiff/$name/node.sock" ] && break; sleep 0.1; done
common=(--shapes 1x1,1x4,1x16 --sizes 8,256 "$@")
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); shm options: ${SHM_OPTS:-none}; $(nproc) CPUs; $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
for kind in tcp shm shm-shared shm-in-place; do
    case $kind in
        tcp) args=(--node "skiff://127.0.0.1:$port") ;;
        shm) args=(--node "shm://$name$q") ;;
        shm-shared) args=(--node "shm://$name$q" --shared-buffer credits) ;;
        shm-in-place) args=(--node "shm://$name$q" --shared-buffer credits --in-place) ;;
    esac
    echo "== $kind: skiff bench pubsub ${args[*]} ${common[*]}"
    "$SKIFF" bench pubsub "${args[@]}" "${common[@]}"
done
