#!/usr/bin/env bash
# skiff's node against nats-server, side by side in one run: publish/
# subscribe (1->1, 1->4, 4->4 at 8 B, 256 B, 4 KB), request/reply (1 and 16
# concurrent requesters, with a TCP ping-pong floor), and each server's CPU
# and RSS idle and under load; then 1->1 publish/subscribe and request/reply
# again with everything on one CPU. Prints a Markdown section for
# bench/RESULTS.md on standard output.
#
#   bench/pubsub.sh [--duration-secs 2]
#
# Installs Debian's nats-server (apt) if missing and builds the nats.go
# load generator in bench/nats/ (Go module proxy). The rows come from
# skiff-bench (crates/skiff-bench), whose nodes are `skiff node`:
# SKIFF=path and SKIFF_BENCH=path use those binaries instead of building
# them.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=2
if [[ "${1:-}" == "--duration-secs" ]]; then DUR="$2"; fi

NATS_SERVER="$(bench/nats/server.sh)"
export NATS_SERVER # skiff-bench --nats starts this one
bench/nats/build.sh >&2
if [ -z "${SKIFF:-}" ] || [ -z "${SKIFF_BENCH:-}" ]; then
    cargo build --release -p skiff-cli -p skiff-bench >&2
    target="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    SKIFF="${SKIFF:-$target/release/skiff}"
    SKIFF_BENCH="${SKIFF_BENCH:-$target/release/skiff-bench}"
fi
export SKIFF
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$SKIFF_BENCH" pubsub --nats --duration-secs "$DUR" --markdown "$TMP/pubsub.md" >&2
"$SKIFF_BENCH" request --nats --duration-secs "$DUR" --markdown "$TMP/request.md" >&2
# The same with everything on one CPU (servers, clients, load generators):
# on this VM a wake-up on the other CPU costs tens of microseconds, which
# the two-CPU rows measure as much as either server.
taskset -c 0 "$SKIFF_BENCH" pubsub --nats --shapes 1x1 --duration-secs "$DUR" --markdown "$TMP/pubsub-cpu0.md" >&2
"$SKIFF_BENCH" request --nats --cpu 0 --duration-secs "$DUR" --markdown "$TMP/request-cpu0.md" >&2
# Two CPUs again, with idle CPUs polling (PM QoS wake-up latency 0, what
# `skiff node --wake-latency-us 0` holds) for both systems alike: needs root.
WAKE=0
if [ "$(id -u)" = 0 ] && [ -w /dev/cpu_dma_latency ]; then
    WAKE=1
    "$SKIFF_BENCH" pubsub --nats --wake-latency-us 0 --duration-secs "$DUR" --markdown "$TMP/pubsub-wake.md" >&2
    "$SKIFF_BENCH" request --nats --wake-latency-us 0 --duration-secs "$DUR" --markdown "$TMP/request-wake.md" >&2
else
    echo "SKIPPED the wake-latency rows: they need root and /dev/cpu_dma_latency" >&2
fi

echo "## Node: publish/subscribe and request/reply against nats-server"
echo
echo "Machine: $(nproc) cores, $(uname -r); nats-server $("$NATS_SERVER" --version | awk '{print $NF}'); $(date -u +%Y-%m-%d)."
echo "Command: \`bench/pubsub.sh --duration-secs $DUR\`. Both servers run as child processes on loopback;"
echo "the load generator is \`skiff-bench\` (skiff rows, the code of \`skiff bench\`) or \`bench/nats/natsbench\` (nats.go, nats rows), same shapes."
echo "skiff subscriptions use the \`block\` policy (lossless, flow controlled); nats subscribers use 64 MB / 65536-message pending limits."
echo
echo "### Publish/subscribe"
echo
cat "$TMP/pubsub.md"
echo
echo "### Request/reply"
echo
cat "$TMP/request.md"
echo
echo "### On one CPU"
echo
echo "Everything (node or nats-server, clients, load generator) on CPU 0: no cross-CPU wake-ups."
echo "Publish/subscribe under \`taskset -c 0\`, request/reply with \`--cpu 0\`."
echo
cat "$TMP/pubsub-cpu0.md"
echo
cat "$TMP/request-cpu0.md"
if [ "$WAKE" = 1 ]; then
    echo
    echo "### Idle CPUs polling (wake-up latency 0)"
    echo
    echo "Two CPUs, with a PM QoS wake-up latency of 0 µs held for the whole run (\`--wake-latency-us 0\`,"
    echo "the same request \`skiff node --wake-latency-us 0\` holds): idle CPUs poll instead of halting,"
    echo "for nats-server and skiff alike."
    echo
    cat "$TMP/pubsub-wake.md"
    echo
    cat "$TMP/request-wake.md"
fi
