#!/usr/bin/env bash
# The shared-memory buffer benchmark, with its baselines (Unix domain
# socket, ZeroMQ ipc://) in one run, ready for bench/RESULTS.md.
#
#   bench/shm.sh [extra `skiff-bench shm` options]
#
# `bench/shm.sh --transports shm,udp` adds the same buffer tests over
# `udp://127.0.0.1:0?reliable=true` (rows buf-udp, buf-udp-pingpong).
#
# Builds skiff-bench (release) and the ZeroMQ peer, runs
#   target/release/skiff-bench shm --json --plot bench/shm.svg ...
# keeps the JSON rows in bench/shm.jsonl and the chart in bench/shm.svg,
# and prints a Markdown section (machine facts, the exact command, the
# table, the issue's targets) to paste into bench/RESULTS.md.
# SKIFF_BENCH=path uses that skiff-bench binary instead of building one.
#
# Run it on a quiet machine: with two cores, busy-polling producer and
# consumer need both, and anything else running shows up in every figure.
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
cmd=(shm --json --plot bench/shm.svg --markdown "$md" --zmq "$zmq" "$@")
echo "running: skiff-bench ${cmd[*]}" >&2
"$SKIFF_BENCH" "${cmd[@]}" | tee bench/shm.jsonl >&2

cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
zmq_version=$(dpkg-query -W -f='${Version}' libzmq3-dev 2>/dev/null || echo unknown)
load=$(cut -d' ' -f1-3 /proc/loadavg)
shown_args=""
for a in "$@"; do shown_args+=" $(printf '%q' "$a")"; done

cat <<EOM
## skiff-bench shm ($(date -u +%Y-%m-%d))

Machine: $(nproc) cores, ${cpu:-unknown CPU}, Linux $(uname -r), $(rustc --version), libzmq3-dev ${zmq_version}; load average before the run: ${load}.
Producer and consumer are two threads of one process sharing ring files in /dev/shm (the same path two processes take).

Command: \`bench/shm.sh${shown_args}\`, which runs
\`target/release/skiff-bench shm --json --plot bench/shm.svg --zmq target/zmq_bench${shown_args}\`
(rows in \`bench/shm.jsonl\`, chart in \`bench/shm.svg\`).

\`per-msg\`: one segment (one deliver, one receive, one consumed) per message; \`batch=N\`: messages
packed into segments of up to N bytes, RocketBufs' batching; \`msg api more\`: the message layer,
one \`send(msg, more=true)\` and one read per message, packed into segments of up to 64 KiB
(\`batches\` counts the segments). \`busy-poll\`: \`spin=1s\` (waiters spin);
\`futex\`: \`spin=0\`. uds: std \`UnixStream\` pair, one \`write\` per message or a 64 KiB \`BufWriter\`.
zmq-ipc: PUSH/PULL (rate) and PAIR (round trip) over \`ipc://\`, one context.

EOM
cat "$md"
