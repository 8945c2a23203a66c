#!/usr/bin/env bash
# The mesh against a three-node nats-server cluster, side by side in one
# run on loopback (issue 6, Evidence):
#
#   - cross-node publish/subscribe: msgs/s at 8 B and 256 B for A->A (one
#     node, for reference), A->B and A->B+C (one message fans out to two
#     nodes), and publish-to-arrival latency A->B (one message at a time);
#   - request/reply across 1, 2 and 3 nodes: the requester on A, responders
#     on A (1 node), on B (2 nodes), on B and C (3 nodes), as a cluster
#     (skiff) / queue group (nats) so one responder answers each request;
#     1 and 16 requests in flight;
#   - failover: a subscriber on skiff://A,B, A killed with kill -9, time
#     until a message published after the kill arrives via B (p50, max).
#
# skiff: three `skiff node --mesh 127.0.0.1:PORT --net bench-PID --seeds
# <the others> --no-scout` processes, driven by `skiff bench pubsub` /
# `request` with --pub-at / --sub-at (the user's tool: skiff's rows need
# nothing of skiff-bench here); the failover trials start their own
# nodes (`skiff bench failover`). nats: three nats-servers joined by routes
# (-cluster / -routes), driven by bench/nats/natsbench (nats.go) with
# -pub-url / -sub-url. Each case runs for skiff and then for nats.
#
#   bench/mesh.sh [--duration-secs 2] [--trials 10] [--repeat 1] [--only nats|skiff]
#
# With --repeat N every publish/subscribe and request case runs N times
# (skiff's run and nats's alternating) and each row is the median run (by
# msgs/s, or p50 for latency rows) with the range of all runs (`runs`,
# `run_min`, `run_max`): one run on this VM can stray by a third.
#
# Rows (one JSON object per line, with a "case" field) go to
# bench/mesh.jsonl; a Markdown section with the summary and the ratio to
# nats goes to stdout; progress to stderr. Installs Debian's nats-server
# (apt) if missing and builds natsbench (Go module proxy). SKIFF=path uses
# that skiff binary instead of building one. When `skiff node` has no
# --mesh option the skiff half is skipped (and said so), never faked.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=2
TRIALS=10
REPEAT=1
ONLY=both
while [ $# -gt 0 ]; do
    case "$1" in
        --duration-secs) DUR="$2"; shift 2 ;;
        --trials) TRIALS="$2"; shift 2 ;;
        --repeat) REPEAT="$2"; shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        *) echo "usage: bench/mesh.sh [--duration-secs N] [--trials N] [--repeat N] [--only nats|skiff]" >&2; exit 2 ;;
    esac
done
SIZES=(8 256)

NATS_SERVER="$(bench/nats/server.sh)"
bench/nats/build.sh >&2
NATSBENCH="$PWD/bench/nats/natsbench"
if [ -z "${SKIFF:-}" ]; then
    cargo build --release -p skiff-cli >&2
    SKIFF="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/skiff"
fi

RUN_SKIFF=0
RUN_NATS=0
[ "$ONLY" != skiff ] && RUN_NATS=1
if [ "$ONLY" != nats ]; then
    if "$SKIFF" node --help 2>/dev/null | grep -q -- '--mesh'; then
        RUN_SKIFF=1
    elif [ "$ONLY" = skiff ]; then
        echo "bench/mesh.sh: $SKIFF node has no --mesh option: no mesh to measure" >&2
        exit 1
    else
        echo "SKIPPED: the skiff half ($SKIFF node has no --mesh option yet); running the nats half only" >&2
    fi
fi

TMP="$(mktemp -d)"
PIDS=()
cleanup() {
    # What the nodes warned of during the run (a member suspected, a link
    # restarted), beyond the start-up notices, so that a run that passed
    # still says what went wrong in it; taken before the nodes stop (each
    # then warns of the others leaving).
    local warned
    warned="$(grep -H ' WARN ' "$TMP"/skiff-*.log 2>/dev/null \
        | grep -v 'is not authenticated or encrypted\|max_connections lowered' || true)"
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ -n "$warned" ]; then
        echo "bench/mesh.sh: the skiff nodes warned $(wc -l <<<"$warned") time(s):" >&2
        sed "s|^$TMP/||" <<<"$warned" | head -n 20 >&2
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

# Free ports: 6 TCP (3 nats clients, 3 nats routes), 3 TCP for nats
# monitoring, 3 TCP for skiff clients, 3 UDP for the mesh.
read -r -a PORTS <<<"$(python3 - <<'PY'
import socket
held, out = [], []
for kind in [socket.SOCK_STREAM] * 12 + [socket.SOCK_DGRAM] * 3:
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    held.append(s)
    out.append(str(s.getsockname()[1]))
print(" ".join(out))
PY
)"
NATS_PORT=("${PORTS[@]:0:3}")
ROUTE_PORT=("${PORTS[@]:3:3}")
MON_PORT=("${PORTS[@]:6:3}")
TCP_PORT=("${PORTS[@]:9:3}")
MESH_PORT=("${PORTS[@]:12:3}")
NAMES=(A B C)

wait_tcp() { # port what
    for _ in $(seq 500); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.02
    done
    echo "bench/mesh.sh: $2 does not listen on 127.0.0.1:$1" >&2
    return 1
}

if [ $RUN_NATS = 1 ]; then
    for i in 0 1 2; do
        routes=""
        for j in 0 1 2; do
            [ "$j" = "$i" ] || routes+="${routes:+,}nats://127.0.0.1:${ROUTE_PORT[$j]}"
        done
        "$NATS_SERVER" -a 127.0.0.1 -p "${NATS_PORT[$i]}" -m "${MON_PORT[$i]}" \
            -cluster "nats://127.0.0.1:${ROUTE_PORT[$i]}" -cluster_name "bench-$$" \
            -routes "$routes" >"$TMP/nats-${NAMES[$i]}.log" 2>&1 &
        PIDS+=($!)
    done
    for i in 0 1 2; do wait_tcp "${NATS_PORT[$i]}" "nats-server ${NAMES[$i]}"; done
    # Each server routes to the two others before anything is timed.
    python3 - "${MON_PORT[@]}" <<'PY'
import json, sys, time, urllib.request
deadline = time.time() + 15
for port in sys.argv[1:]:
    while True:
        try:
            n = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/routez", timeout=1))["num_routes"]
        except OSError:
            n = 0
        if n >= 2:
            break
        if time.time() > deadline:
            sys.exit(f"bench/mesh.sh: nats-server (monitor {port}) has {n} routes, not 2")
        time.sleep(0.1)
PY
    echo "nats cluster up: ${NATS_PORT[*]} (routes ${ROUTE_PORT[*]})" >&2
fi

if [ $RUN_SKIFF = 1 ]; then
    for i in 0 1 2; do
        seeds=""
        for j in 0 1 2; do
            [ "$j" = "$i" ] || seeds+="${seeds:+,}127.0.0.1:${MESH_PORT[$j]}"
        done
        "$SKIFF" node --tcp "127.0.0.1:${TCP_PORT[$i]}" --mesh "127.0.0.1:${MESH_PORT[$i]}" \
            --net "bench-$$" --seeds "$seeds" --no-scout >"$TMP/skiff-${NAMES[$i]}.log" 2>&1 &
        PIDS+=($!)
    done
    for i in 0 1 2; do wait_tcp "${TCP_PORT[$i]}" "skiff node ${NAMES[$i]}"; done
    echo "skiff mesh up: clients ${TCP_PORT[*]}, mesh ${MESH_PORT[*]} (net bench-$$)" >&2
fi

sk() { echo "skiff://127.0.0.1:${TCP_PORT[$1]}"; }
nu() { echo "nats://127.0.0.1:${NATS_PORT[$1]}"; }
letter() { local s=""; for i in "$@"; do s+="${s:++}${NAMES[$i]}"; done; echo "$s"; }

OUT=bench/mesh.jsonl
: >"$OUT"
# Appends rows (JSON lines on stdin) to $OUT with "case" set; echoes them
# to stderr.
tag() {
    python3 -c '
import json, sys
case = sys.argv[1]
with open(sys.argv[2], "a") as out:
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        row = {"case": case, **row}
        out.write(json.dumps(row) + "\n")
        print(json.dumps(row), file=sys.stderr)
' "$1" "$OUT"
}
fail() {
    echo "bench/mesh.sh: $1 failed; node logs:" >&2
    tail -n 5 "$TMP"/*.log >&2 || true
    # The whole logs outlive the run (the temporary directory does not):
    # a node's side of a failure is often far from their last lines.
    local keep
    keep="$(mktemp -d "${TMPDIR:-/tmp}/skiff-mesh-failed.XXXXXX")"
    cp "$TMP"/*.log "$keep"/ 2>/dev/null || true
    # And each live node's mesh counters at the failure (membership
    # packets refused, members suspected, links restarted).
    if [ "${RUN_SKIFF:-0}" = 1 ]; then
        for i in 0 1 2; do
            "$SKIFF" stats --mesh --json --node "$(sk "$i")" >"$keep/stats-${NAMES[$i]}.json" 2>&1 || true
        done
    fi
    echo "bench/mesh.sh: the nodes' whole logs and mesh counters are in $keep" >&2
    exit 1
}

# pubsub CASE SHAPE LATENCY PUB SUB...
pubsub_case() {
    local case="$1" shape="$2" latency="$3" pub="$4"; shift 4
    local subs=("$@")
    if [ $RUN_SKIFF = 1 ]; then
        local args=(bench pubsub --json --shapes "$shape" --sizes "$(IFS=,; echo "${SIZES[*]}")"
            --duration-secs "$DUR" --pub-at "$(sk "$pub")")
        for s in "${subs[@]}"; do args+=(--sub-at "$(sk "$s")"); done
        [ "$latency" = 1 ] && args+=(--latency)
        "$SKIFF" "${args[@]}" | tag "$case" || fail "skiff $case"
    fi
    if [ $RUN_NATS = 1 ]; then
        local nargs=(-pub-url "$(nu "$pub")")
        for s in "${subs[@]}"; do nargs+=(-sub-url "$(nu "$s")"); done
        for size in "${SIZES[@]}"; do
            "$NATSBENCH" pubsub "${nargs[@]}" -pubs "${shape%x*}" -subs "${shape#*x}" \
                -size "$size" -duration "${DUR}s" | tag "$case" || fail "nats $case"
            if [ "$latency" = 1 ]; then
                "$NATSBENCH" pubsub -latency "${nargs[@]}" -size "$size" -duration "${DUR}s" \
                    | tag "$case" || fail "nats $case latency"
            fi
        done
    fi
}

# request CASE PUB RESPONDER...
request_case() {
    local case="$1" pub="$2"; shift 2
    local resps=("$@")
    if [ $RUN_SKIFF = 1 ]; then
        local args=(bench request --json --cluster bench.svc --concurrency 1,16
            --sizes 8 --duration-secs "$DUR" --pub-at "$(sk "$pub")")
        for s in "${resps[@]}"; do args+=(--sub-at "$(sk "$s")"); done
        "$SKIFF" "${args[@]}" | tag "$case" || fail "skiff $case"
    fi
    if [ $RUN_NATS = 1 ]; then
        local nargs=(-pub-url "$(nu "$pub")" -queue bench.svc)
        for s in "${resps[@]}"; do nargs+=(-sub-url "$(nu "$s")"); done
        for conc in 1 16; do
            "$NATSBENCH" request "${nargs[@]}" -conc "$conc" -size 8 -duration "${DUR}s" \
                | tag "$case" || fail "nats $case"
        done
    fi
}

for run in $(seq "$REPEAT"); do
    echo "== publish/subscribe (run $run of $REPEAT)" >&2
    pubsub_case "A->A" 1x1 0 0 0
    pubsub_case "A->B" 1x1 1 0 1
    pubsub_case "A->B+C" 1x2 0 0 1 2
    echo "== request/reply (run $run of $REPEAT)" >&2
    request_case "1 node" 0 0
    request_case "2 nodes" 0 1
    request_case "3 nodes" 0 1 2
done
# Each row the median of its runs (rows of one case, test, mode and size).
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def merit(r):
    if r["mode"].endswith("-latency") or r.get("msgs_per_s") is None:
        return -(r.get("p50_us") or 0.0)
    return r["msgs_per_s"]
groups = {}
for r in rows:
    groups.setdefault((r["case"], r["test"], r["mode"], r["size"]), []).append(r)
with open(sys.argv[1], "w") as out:
    for runs in groups.values():
        runs.sort(key=merit)
        row = dict(runs[(len(runs) - 1) // 2])
        if len(runs) > 1:
            lo, hi = sorted(abs(merit(r)) for r in (runs[0], runs[-1]))
            row.update(runs=len(runs), run_min=lo, run_max=hi)
        out.write(json.dumps(row) + "\n")
PY
if [ $RUN_SKIFF = 1 ]; then
    echo "== failover (kill -9, $TRIALS trials)" >&2
    "$SKIFF" bench failover --json --trials "$TRIALS" --net "bench-$$-failover" \
        | tag "failover" || echo "bench/mesh.sh: failover trials failed (see above); the rest stands" >&2
    if "$SKIFF" stats --help 2>/dev/null | grep -q -- '--mesh'; then
        for i in 0 1 2; do
            echo "== skiff stats --mesh, node ${NAMES[$i]}" >&2
            "$SKIFF" stats --mesh --node "$(sk "$i")" >&2 || true
        done
    fi
fi

# The summary: one line per case and size, skiff next to nats.
both="no"
[ $RUN_SKIFF = 1 ] && [ $RUN_NATS = 1 ] && both="yes"
echo "## Mesh: three nodes against a three-node nats-server cluster"
echo
echo "Machine: $(nproc) cores, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), Linux $(uname -r);"
echo "nats-server $("$NATS_SERVER" --version | awk '{print $NF}'), nats.go load generator; $(date -u +%Y-%m-%d)."
median=""
[ "$REPEAT" -gt 1 ] && median=", each the median of $REPEAT runs, skiff's and nats's alternating"
echo "Command: \`bench/mesh.sh --duration-secs $DUR --trials $TRIALS --repeat $REPEAT\`; rows in \`bench/mesh.jsonl\`$median."
echo "All six servers on loopback; A, B, C are the three nodes of each system (skiff: \`--mesh\`, seeds, no scouting;"
echo "nats: routes). skiff subscriptions use the \`block\` policy; nats subscribers 64 MB / 65536-message pending limits."
[ "$both" = yes ] || echo "**Only the $([ $RUN_NATS = 1 ] && echo nats || echo skiff) half ran: no comparison.**"
echo
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def find(system, case, mode, size):
    for r in rows:
        t = r["test"]
        if r["case"] == case and r["mode"] == mode and r["size"] == size and (
            t == system or t == system + "-request"):
            return r
def si(v):
    if v is None: return "-"
    for d, u in ((1e6, " M"), (1e3, " k")):
        if v >= d: return f"{v / d:.2f}{u}"
    return f"{v:.0f}"
def us(v): return "-" if v is None else f"{v:.1f}"
keys = []
for r in rows:
    if r["test"] == "skiff-failover": continue
    k = (r["case"], r["mode"], r["size"])
    if k not in keys: keys.append(k)
print("| case | mode | size B | skiff msgs/s | nats msgs/s | skiff/nats | skiff p50 µs | nats p50 µs | skiff p99 µs | nats p99 µs | lost (skiff/nats) |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
verdicts = []
for case, mode, size in keys:
    s, n = find("skiff", case, mode, size), find("nats", case, mode, size)
    g = lambda r, k: r.get(k) if r else None
    ratio = "-"
    if g(s, "msgs_per_s") and g(n, "msgs_per_s"):
        x = s["msgs_per_s"] / n["msgs_per_s"]
        ratio = f"{x:.2f}x"
        if not mode.endswith("-latency") and not mode.startswith("conc") and case != "A->A" and size <= 256:
            verdicts.append(f"- target ≥ 1.5x nats, {case} {mode} at {size} B: {x:.2f}x: {'met' if x >= 1.5 else '**not met**'}")
    lost = f"{g(s, 'lost') if s and s.get('lost') is not None else '-'}/{g(n, 'lost') if n and n.get('lost') is not None else '-'}"
    print(f"| {case} | {mode} | {size} | {si(g(s, 'msgs_per_s'))} | {si(g(n, 'msgs_per_s'))} | {ratio} "
          f"| {us(g(s, 'p50_us'))} | {us(g(n, 'p50_us'))} | {us(g(s, 'p99_us'))} | {us(g(n, 'p99_us'))} | {lost} |")
fo = [r for r in rows if r["test"] == "skiff-failover"]
print()
if fo:
    r = fo[0]
    opts = dict(o.split("=", 1) for o in r.get("options", "").split() if "=" in o)
    mx = float(opts.get("max_us", "nan")) / 1e3
    print(f"Failover (subscriber on skiff://A,B, A killed with kill -9, publisher on C every 1 ms), "
          f"{opts.get('trials')} trials: p50 {r['p50_us'] / 1e3:.1f} ms, max {mx:.1f} ms; "
          f"{r.get('lost', 0)} messages missed across the gaps (at most once), {opts.get('twice', '?')} delivered twice.")
    verdicts.append(f"- target: clients fail over within 1 s: max {mx:.1f} ms: {'met' if mx <= 1000 else '**not met**'}")
else:
    print("Failover: not measured in this run.")
if verdicts:
    print()
    print("\n".join(verdicts))
PY
