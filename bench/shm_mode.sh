#!/usr/bin/env bash
# Which mode an shm in-place 1→1 row lands in, and what went with it
# (issue 21 item 3; bench/RESULTS.md, session 29):
#
#   bench/shm_mode.sh [rows, default 6] [size, default 256]
#
# Each row: a fresh `skiff node --shm`, one `skiff bench pubsub --shared-buffer
# credits --in-place --shapes 1x1` of 2 s, and around it the machine's
# cross-core hand-off time (bench/c2c.c, before and after) and, over the
# middle of the run, each busy thread's share of a CPU running, its share
# waiting in the run queue, its context switches (involuntary ones apart)
# and on which CPU it was seen (samples on CPU 0 / CPU 1). Run it in an
# autogroup of its own at high priority, as the other benches.
# SKIFF=path uses that binary.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SKIFF=${SKIFF:-${CARGO_TARGET_DIR:-$root/target}/release/skiff}
rows=${1:-6}
size=${2:-256}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -pthread -o "$tmp/c2c" "$root/bench/c2c.c"
cat >"$tmp/sample.py" <<'PY'
import os, sys, time
delay, dur, pids = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
def snap():
    r = {}
    for p in pids:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                s = open(f"/proc/{p}/task/{t}/stat").read()
                st = open(f"/proc/{p}/task/{t}/status").read()
                run, wait = map(int, open(f"/proc/{p}/task/{t}/schedstat").read().split()[:2])
            except OSError:
                continue
            comm = s[s.index("(") + 1:s.rindex(")")]
            cpu = int(s[s.rindex(")") + 2:].split()[36])
            cs = {l.split(":")[0]: int(l.split()[1]) for l in st.splitlines() if "ctxt_switches" in l}
            r[(p, t)] = (comm, run, wait, sum(cs.values()), cs.get("nonvoluntary_ctxt_switches", 0), cpu)
    return r
time.sleep(delay)
a, t0, seen = snap(), time.time(), {}
while time.time() - t0 < dur:
    time.sleep(0.05)
    for k, v in snap().items():
        seen.setdefault(k, [0, 0])[v[5] & 1] += 1
b, dt = snap(), time.time() - t0
for k in sorted(b):
    if k not in a:
        continue
    x, y = a[k], b[k]
    run = (y[1] - x[1]) / 1e9 / dt * 100
    if run >= 2:
        print(f"    {y[0]:<16} run {run:5.1f}%  runq {(y[2] - x[2]) / 1e9 / dt * 100:5.1f}%  "
              f"switches/s {(y[3] - x[3]) / dt:6.0f} (involuntary {(y[4] - x[4]) / dt:6.0f})  "
              f"seen on CPU 0/1 {seen.get(k, [0, 0])}")
PY
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
echo "$(nproc) CPUs; $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo); size $size B"
for i in $(seq 1 "$rows"); do
    name="mode$$-$i"
    "$SKIFF" node --tcp "127.0.0.1:$(free_port)" --shm "shm://$name" --no-mesh 2>/dev/null &
    node=$!
    for _ in $(seq 1 50); do [ -S "/dev/shm/skiff/$name/node.sock" ] && break; sleep 0.1; done
    load=$(cut -d' ' -f1 /proc/loadavg)
    before=$("$tmp/c2c" 2000 | awk '{ print $7 }')
    "$SKIFF" bench pubsub --node "shm://$name" --shared-buffer credits --in-place --shapes 1x1 \
        --sizes "$size" --duration-secs 2 >"$tmp/out" 2>&1 &
    bench=$!
    sleep 0.4
    python3 "$tmp/sample.py" 0.4 0.8 "$node" "$(pgrep -P "$bench" -f 'bench pubsub' || echo "$bench")" >"$tmp/threads" || true
    wait "$bench" || true
    after=$("$tmp/c2c" 2000 | awk '{ print $7 }')
    kill -INT "$node" 2>/dev/null || true
    wait "$node" 2>/dev/null || true
    rate=$(grep -E '^skiff ' "$tmp/out" | head -1 | awk '{ print $5 " " $6 }')
    echo "row $i: $rate msgs/s; load $load; c2c one-way ${before} ns before, ${after} ns after"
    cat "$tmp/threads"
done
