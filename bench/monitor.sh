#!/usr/bin/env bash
# What the HTTP monitoring listener costs: `skiff bench pubsub` against a
# node without --monitor and against one with --monitor whose /metrics,
# /varz and /connz are scraped every second, alternating ROUNDS times in
# one run (so both see the same machine). Prints a Markdown section for
# bench/RESULTS.md on standard output; raw rows (JSON lines) go to
# bench/monitor.jsonl.
#
#   bench/monitor.sh [--rounds 3] [--duration-secs 2] [--shapes 1x1,4x4] [--sizes 8,256]
#
# SKIFF=path uses that binary instead of building it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 DUR=2 SHAPES=1x1,4x4 SIZES=8,256
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
SCRAPER=""
cleanup() {
    [ -n "$SCRAPER" ] && kill "$SCRAPER" 2>/dev/null || true
    [ -n "$NODE" ] && kill "$NODE" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# One bench run against a fresh node; $1 = off | on.
run() {
    local mode="$1" port mport scrapes=0
    port="$(free_port)"
    local args=(node --tcp "127.0.0.1:$port" --log-level warn)
    if [ "$mode" = on ]; then
        mport="$(free_port)"
        args+=(--monitor "127.0.0.1:$mport")
    fi
    "$SKIFF" "${args[@]}" 2>"$TMP/node.log" &
    NODE=$!
    for _ in $(seq 100); do
        (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.05
    done
    if [ "$mode" = on ]; then
        # Every second, what a Prometheus server and a dashboard would ask.
        ( while true; do
              curl -s -o /dev/null "http://127.0.0.1:$mport/metrics"
              curl -s -o /dev/null "http://127.0.0.1:$mport/varz"
              curl -s -o /dev/null "http://127.0.0.1:$mport/connz?subs=1"
              echo >> "$TMP/scrapes"
              sleep 1
          done ) &
        SCRAPER=$!
    fi
    : > "$TMP/scrapes"
    "$SKIFF" bench pubsub --node "skiff://127.0.0.1:$port" --shapes "$SHAPES" --sizes "$SIZES" \
        --duration-secs "$DUR" --json 2>/dev/null \
        | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    r['monitor'] = '$mode'
    print(json.dumps(r))" >> "$TMP/rows.jsonl"
    if [ -n "$SCRAPER" ]; then
        kill "$SCRAPER" 2>/dev/null || true
        wait "$SCRAPER" 2>/dev/null || true
        SCRAPER=""
        scrapes=$(wc -l < "$TMP/scrapes")
        echo "monitor on: $scrapes scrape rounds (/metrics, /varz, /connz)" >&2
    fi
    kill "$NODE"; wait "$NODE" 2>/dev/null || true
    NODE=""
}

LOAD_BEFORE="$(uptime | sed 's/.*load average: //')"
for r in $(seq "$ROUNDS"); do
    echo "round $r: monitor off" >&2; run off
    echo "round $r: monitor on" >&2; run on
done
LOAD_AFTER="$(uptime | sed 's/.*load average: //')"
cp "$TMP/rows.jsonl" bench/monitor.jsonl

echo "## Monitoring listener: pub/sub with and without --monitor"
echo
echo "Machine: $(nproc) cores, $(uname -r); $(date -u +%Y-%m-%d) $(date -u +%H:%M) UTC; load average before ${LOAD_BEFORE}, after ${LOAD_AFTER}."
echo "Command: \`bench/monitor.sh --rounds $ROUNDS --duration-secs $DUR --shapes $SHAPES --sizes $SIZES\`: \`skiff bench pubsub\` against a fresh \`skiff node\`,"
echo "alternately without \`--monitor\` and with it, \`/metrics\`, \`/varz\` and \`/connz?subs=1\` fetched every second meanwhile; rows in \`bench/monitor.jsonl\`."
echo
python3 - "$TMP/rows.jsonl" <<'EOF'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
def key(r):
    return (r.get("test"), r.get("mode"), r.get("size"))
rate = lambda r: r.get("msgs_per_s") or 0
groups = {}
for r in rows:
    if not rate(r):
        continue
    groups.setdefault(key(r), {"off": [], "on": []})[r["monitor"]].append(rate(r))
def fmt(v):
    return f"{v/1e6:.2f} M" if v >= 1e6 else f"{v/1e3:.1f} k"
print("| row | without monitor: runs (mean) | with monitor, scraped 1/s: runs (mean) | on / off |")
print("| --- | --- | --- | --- |")
for k, g in groups.items():
    off, on = g["off"], g["on"]
    if not off or not on:
        continue
    mo, mn = statistics.mean(off), statistics.mean(on)
    print(f"| {k[1]} {k[2]} B | {', '.join(fmt(v) for v in off)} ({fmt(mo)}) | {', '.join(fmt(v) for v in on)} ({fmt(mn)}) | {mn/mo:.2f} |")
EOF
