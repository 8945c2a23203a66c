#!/usr/bin/env bash
# skiff's NATS listener (`skiff node --nats`) against nats-server, driven by
# the same load generator (bench/nats/natsbench, nats.go) in one run, each
# case alternating servers back to back: publish/subscribe 1->1 and 1->4 at
# 8 B and 256 B, request/reply with 1 and 16 requesters (16 on one
# connection, and 16 with a connection each as `nats bench` runs them),
# and each server's peak RSS (VmHWM) after the run. Prints a Markdown section for
# bench/RESULTS.md on standard output; progress on standard error.
#
#   bench/nats_front.sh [--duration-secs 2] [--trials 3] [--floor]
#
# --floor adds a third server to each case: bench/nats_floor_relay.c, the
# least a NATS server can do (one thread, no hand-offs), and two columns,
# its msg/s and its ratio to nats-server: what the load generator reaches
# against a server that costs almost nothing (the floor of each row on
# this machine).
#
# nats-server: $NATS_SERVER, else the newest v2 from the Go module proxy
# (`go install github.com/nats-io/nats-server/v2@latest`, into
# target/gobin). skiff: $SKIFF, else a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=2
TRIALS=3
FLOOR=
while [ $# -gt 0 ]; do
    case $1 in
        --duration-secs) DUR=$2; shift 2 ;;
        --trials) TRIALS=$2; shift 2 ;;
        --floor) FLOOR=1; shift ;;
        *) echo "usage: bench/nats_front.sh [--duration-secs N] [--trials N] [--floor]" >&2; exit 2 ;;
    esac
done
target="${CARGO_TARGET_DIR:-$PWD/target}"
NATS_SERVER="$(bench/nats/server.sh)"
if [ -z "${SKIFF:-}" ]; then
    cargo build --release -p skiff-cli >&2
    SKIFF="$target/release/skiff"
fi
bench/nats/build.sh >&2
servers="nats skiff"
if [ -n "$FLOOR" ]; then
    RELAY="$target/nats_floor_relay"
    mkdir -p "$target"
    cc -O2 -pthread -o "$RELAY" bench/nats_floor_relay.c
    servers="nats skiff floor"
fi
NB="$PWD/bench/nats/natsbench"
TMP=$(mktemp -d)
SERVER_PID=
# (stop runs in a command substitution, so SERVER_PID may name a server
# already stopped: a failed kill must not become the script's status.)
cleanup() { if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; fi; rm -rf "$TMP"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start nats|skiff: a fresh server; sets URL and SERVER_PID.
start() {
    local p; p=$(port)
    case $1 in
        nats) "$NATS_SERVER" -a 127.0.0.1 -p "$p" >"$TMP/server.log" 2>&1 & ;;
        skiff) "$SKIFF" node --tcp none --nats "127.0.0.1:$p" >"$TMP/server.log" 2>&1 & ;;
        floor) "$RELAY" "$p" >"$TMP/server.log" 2>&1 & ;;
    esac
    SERVER_PID=$!
    URL="nats://127.0.0.1:$p"
    for _ in $(seq 100); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1',$p)).close()" 2>/dev/null && return
        sleep 0.05
    done
    echo "$1 did not start" >&2; cat "$TMP/server.log" >&2; exit 1
}
stop() {
    local hwm
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$SERVER_PID/status")
    kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
    echo "$hwm"
}

cases=(
    "pubsub 1->1 8 B|pubsub -pubs 1 -subs 1 -size 8"
    "pubsub 1->1 256 B|pubsub -pubs 1 -subs 1 -size 256"
    "pubsub 1->4 8 B|pubsub -pubs 1 -subs 4 -size 8"
    "pubsub 1->4 256 B|pubsub -pubs 1 -subs 4 -size 256"
    "request 1 requester 8 B|request -conc 1 -size 8"
    "request 16 requesters 8 B|request -conc 16 -size 8"
    "request 16 requesters 8 B, a connection each|request -conc 16 -size 8 -conns per-requester"
)
: >"$TMP/rows"
for t in $(seq "$TRIALS"); do
    for c in "${cases[@]}"; do
        name=${c%%|*}; args=${c#*|}
        for s in $servers; do
            start "$s"
            # shellcheck disable=SC2086
            row=$("$NB" $args -url "$URL" -duration "${DUR}s")
            hwm=$(stop)
            echo "$s trial $t $name: $row rss_kb=$hwm" >&2
            printf '%s\t%s\t%s\t%s\n' "$s" "$name" "$row" "$hwm" >>"$TMP/rows"
        done
    done
done
python3 - "$TMP/rows" "$("$NATS_SERVER" --version)" "$DUR" "$TRIALS" "$(uptime)" <<'PY'
import json, statistics, sys
rows, version, dur, trials, load = sys.argv[1:6]
data = {}
for line in open(rows):
    s, name, row, hwm = line.rstrip("\n").split("\t")
    r = json.loads(row)
    d = data.setdefault(name, {}).setdefault(s, {"rate": [], "p50": [], "rss": []})
    d["rate"].append(r.get("msgs_per_s") or 0)
    if r.get("p50_us") is not None:
        d["p50"].append(r["p50_us"])
    d["rss"].append(int(hwm))
med = lambda v: statistics.median(v) if v else None
print(f"### NATS front end: skiff node --nats against {version}, natsbench (nats.go)\n")
print(f"{trials} trials of {dur} s per case and server, alternating, each on a fresh server; medians. Load while running: `{load.strip()}`.\n")
floor = any("floor" in d for d in data.values())
fh, fs = (" floor msg/s | floor / nats |", " ---: | ---: |") if floor else ("", "")
print(f"| case | nats-server msg/s | skiff msg/s | skiff / nats | nats p50 µs | skiff p50 µs | nats peak RSS MB | skiff peak RSS MB |{fh}")
print(f"| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |{fs}")
for name, d in data.items():
    n, k = d["nats"], d["skiff"]
    nr, kr = med(n["rate"]), med(k["rate"])
    p = lambda v: f"{v:.0f}" if v is not None else "-"
    fc = ""
    if floor:
        fr = med(d["floor"]["rate"])
        fc = f" {fr:,.0f} | {fr / nr:.2f} |"
    print(f"| {name} | {nr:,.0f} | {kr:,.0f} | {kr / nr:.2f} | {p(med(n['p50']))} | {p(med(k['p50']))} | {max(n['rss'])/1024:.1f} | {max(k['rss'])/1024:.1f} |{fc}")
PY
