#!/usr/bin/env bash
# The queue benchmark, with all its baselines in one run, ready for
# bench/RESULTS.md.
#
#   bench/queue.sh [extra `skiff-bench queue` options]
#
# Builds skiff-bench (release) and the ZeroMQ peer, runs
#   target/release/skiff-bench queue --json --plot bench/queue.svg ...
# keeps the JSON rows in bench/queue.jsonl and the chart in bench/queue.svg,
# and prints to stdout a Markdown section (machine facts, the exact
# command, the table, the issue's targets) to paste into bench/RESULTS.md.
# Progress and build output go to stderr. SKIFF_BENCH=path uses that
# skiff-bench binary instead of building one.
#
# Run it on a quiet machine: with two cores, anything else running (a
# build, a test) shows up in every figure.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}

if [ -z "${SKIFF_BENCH:-}" ]; then
    cargo build --release -p skiff-bench >&2
    SKIFF_BENCH="$target/release/skiff-bench"
fi
zmq=$(bench/zmq/build.sh)

md=$(mktemp)
trap 'rm -f "$md"' EXIT
cmd=(queue --json --plot bench/queue.svg --markdown "$md" --zmq "$zmq" "$@")
echo "running: skiff-bench ${cmd[*]}" >&2
"$SKIFF_BENCH" "${cmd[@]}" | tee bench/queue.jsonl >&2

cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
zmq_version=$(dpkg-query -W -f='${Version}' libzmq3-dev 2>/dev/null || echo unknown)
shown_args=""
for a in "$@"; do shown_args+=" $(printf '%q' "$a")"; done

cat <<EOF
## skiff-bench queue ($(date -u +%Y-%m-%d))

Machine: $(nproc) cores, ${cpu:-unknown CPU}, Linux $(uname -r), $(rustc --version), libzmq3-dev ${zmq_version}.
Loopback (127.0.0.1); every row below comes from the same run.

Command: \`bench/queue.sh${shown_args}\`, which runs
\`target/release/skiff-bench queue --json --plot bench/queue.svg --zmq target/zmq_bench${shown_args}\`
(rows in \`bench/queue.jsonl\`, chart in \`bench/queue.svg\`).

msgs/s counts messages received over the receiver's elapsed time; MB/s is payload
megabytes (10^6 B) per second; \`lost\` is sent but never received (with what the
queues dropped and counted in brackets); \`cpu %\` is the process's CPU time over
wall time (200 = both cores). Latency rows time one message each way, with
both threads of a row on one CPU (\`--latency-cpu\`, named in the options) so
that a row measures the software, not where the scheduler woke the echo thread;
the latency rows of one size run interleaved (\`--rounds\`, each row's share in
turn, round after round), so the rows a target compares ran on the same machine;
with \`timeout=200ms\` a lone message waits for the timeout on both sides, by design.

EOF
cat "$md"
