#!/usr/bin/env bash
# What confirming publishes costs a publisher (issue 16 item 4): `skiff
# bench pubsub` against a fresh `skiff node`, the publisher keeping nothing
# (`unconfirmed_buffer=0`: no `Confirm`, no `Taken` frames) and then keeping
# 1 MiB of unconfirmed publishes (what a client that can fail over keeps by
# default), alternating ROUNDS times in one run. With SKIFF_BEFORE set, the
# same rounds also run that binary, each of its runs beside this one's, so
# an older build and this one see the same machine. Prints a Markdown table
# for bench/RESULTS.md on standard output; raw rows (JSON lines) go to
# bench/confirm_cost.jsonl.
#
#   bench/confirm_cost.sh [--rounds 3] [--duration-secs 2] [--shapes 1x1] [--sizes 8,256]
#
# SKIFF=path uses that binary instead of building it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 DUR=2 SHAPES=1x1 SIZES=8,256
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --duration-secs) DUR="$2"; shift 2 ;;
        --shapes) SHAPES="$2"; shift 2 ;;
        --sizes) SIZES="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "${SKIFF:-}" ]; then
    cargo build --release -p skiff-cli >&2
    target="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    SKIFF="$target/release/skiff"
fi
TMP="$(mktemp -d)"
NODE=""
cleanup() {
    [ -n "$NODE" ] && kill "$NODE" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# One bench run of binary $2 (named $1) against a fresh node of it; $3 = off | on.
run() {
    local name="$1" bin="$2" mode="$3" port buffer
    port="$(free_port)"
    "$bin" node --tcp "127.0.0.1:$port" --log-level warn 2>"$TMP/node.log" &
    NODE=$!
    for _ in $(seq 100); do
        (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.05
    done
    if [ "$mode" = on ]; then buffer=1m; else buffer=0; fi
    "$bin" bench pubsub --shapes "$SHAPES" --sizes "$SIZES" --duration-secs "$DUR" --json \
        --pub-at "skiff://127.0.0.1:$port?unconfirmed_buffer=$buffer" \
        --sub-at "skiff://127.0.0.1:$port" 2>/dev/null \
        | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    r['build'] = '$name'
    r['confirm'] = '$mode'
    print(json.dumps(r))" >> "$TMP/rows.jsonl"
    kill "$NODE"; wait "$NODE" 2>/dev/null || true
    NODE=""
}

LOAD_BEFORE="$(uptime | sed 's/.*load average: //')"
for r in $(seq "$ROUNDS"); do
    if [ -n "${SKIFF_BEFORE:-}" ]; then
        echo "round $r: before, off / on" >&2
        run before "$SKIFF_BEFORE" off
        run before "$SKIFF_BEFORE" on
    fi
    echo "round $r: this build, off / on" >&2
    run this "$SKIFF" off
    run this "$SKIFF" on
done
LOAD_AFTER="$(uptime | sed 's/.*load average: //')"
cp "$TMP/rows.jsonl" bench/confirm_cost.jsonl

echo "Machine: $(nproc) cores, $(uname -r); $(date -u +%Y-%m-%d) $(date -u +%H:%M) UTC; load average before ${LOAD_BEFORE}, after ${LOAD_AFTER}."
echo "Command: \`bench/confirm_cost.sh --rounds $ROUNDS --duration-secs $DUR --shapes $SHAPES --sizes $SIZES\`; rows in \`bench/confirm_cost.jsonl\`."
echo
python3 - "$TMP/rows.jsonl" <<'EOF'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
rate = lambda r: r.get("msgs_per_s") or 0
groups = {}
for r in rows:
    if r.get("test") != "skiff" or not rate(r):
        continue
    k = (r["build"], r["mode"], r["size"])
    groups.setdefault(k, {"off": [], "on": []})[r["confirm"]].append(rate(r))
def fmt(v):
    return f"{v/1e6:.2f} M" if v >= 1e6 else f"{v/1e3:.1f} k"
# Each round's "on" run came right after its "off" run: the median of
# those paired ratios is less moved by load that drifts over the run.
print("| build | row | off (unconfirmed_buffer=0): runs (mean) | on (1 MiB kept): runs (mean) | on / off (means) | on / off per round (median) |")
print("| --- | --- | --- | --- | --- | --- |")
for k in sorted(groups):
    off, on = groups[k]["off"], groups[k]["on"]
    if not off or not on:
        continue
    mo, mn = statistics.mean(off), statistics.mean(on)
    pairs = [b / a for a, b in zip(off, on)]
    print(f"| {k[0]} | {k[1]} {k[2]} B | {', '.join(fmt(v) for v in off)} ({fmt(mo)}) | {', '.join(fmt(v) for v in on)} ({fmt(mn)}) | {mn/mo:.2f} | {', '.join(f'{p:.2f}' for p in pairs)} ({statistics.median(pairs):.2f}) |")
EOF
