#!/usr/bin/env bash
# What security costs, side by side in one run on loopback (issue 17):
#
#   - publish/subscribe 1->1 at 8 B and 256 B through one skiff node over
#     plain TCP and over TLS 1.3 (`tls://`), and through nats-server plain
#     and with TLS (the same certificate);
#   - cross-node publish/subscribe A->B at 8 B and 256 B over a plain mesh
#     and over a sealed one (SKIFF_MESH_SECRET: Noise handshakes,
#     ChaCha20-Poly1305 datagrams).
#
#   bench/security.sh [--duration-secs 2]
#
# Certificates are made for the run with openssl (a CA and a certificate
# for 127.0.0.1) and removed after. skiff rows: `skiff bench pubsub
# --pub-at/--sub-at` against `skiff node` processes; nats rows:
# bench/nats/natsbench (nats.go; NATS_CA makes it trust the CA). Installs
# Debian's nats-server if missing. SKIFF=path uses that skiff binary.
# Prints a Markdown section for bench/RESULTS.md on standard output.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=2
if [[ "${1:-}" == "--duration-secs" ]]; then DUR="$2"; fi
SIZES=(8 256)

NATS_SERVER="$(bench/nats/server.sh)"
bench/nats/build.sh >&2
NATSBENCH="$PWD/bench/nats/natsbench"
if [ -z "${SKIFF:-}" ]; then
    cargo build --release -p skiff-cli >&2
    SKIFF="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/skiff"
fi
TMP="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

# A CA and the servers' certificate (IP 127.0.0.1), for this run only.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj /CN=bench-ca -keyout "$TMP/ca.key" -out "$TMP/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
    -keyout "$TMP/node.key" -out "$TMP/node.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' >"$TMP/san"
openssl x509 -req -in "$TMP/node.csr" -CA "$TMP/ca.pem" -CAkey "$TMP/ca.key" -CAcreateserial \
    -days 1 -extfile "$TMP/san" -out "$TMP/node.pem" 2>/dev/null

# Ports: 4 skiff client (plain, tls, mesh A/B plain... see below), 4 mesh
# client, 2 nats; 4 UDP for the meshes.
read -r -a P <<<"$(python3 - <<'PY'
import socket
held, out = [], []
for kind in [socket.SOCK_STREAM] * 8 + [socket.SOCK_DGRAM] * 4:
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    held.append(s)
    out.append(str(s.getsockname()[1]))
print(" ".join(out))
PY
)"
wait_tcp() {
    for _ in $(seq 500); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.02
    done
    echo "bench/security.sh: nothing listens on 127.0.0.1:$1" >&2
    tail -n 5 "$TMP"/*.log >&2 || true
    exit 1
}
start() { # log, command...
    local log="$1"; shift
    "$@" >"$TMP/$log.log" 2>&1 &
    PIDS+=($!)
}
start plain "$SKIFF" node --tcp "127.0.0.1:${P[0]}"
start tls "$SKIFF" node --tcp "127.0.0.1:${P[1]}" --tls-cert "$TMP/node.pem" --tls-key "$TMP/node.key"
start nats "$NATS_SERVER" -a 127.0.0.1 -p "${P[2]}"
start nats-tls "$NATS_SERVER" -a 127.0.0.1 -p "${P[3]}" --tls --tlscert "$TMP/node.pem" --tlskey "$TMP/node.key"
NET="bench-sec-$$"
start mesh-a "$SKIFF" node --tcp "127.0.0.1:${P[4]}" --mesh "127.0.0.1:${P[8]}" --net "$NET-p" --seeds "127.0.0.1:${P[9]}" --no-scout
start mesh-b "$SKIFF" node --tcp "127.0.0.1:${P[5]}" --mesh "127.0.0.1:${P[9]}" --net "$NET-p" --seeds "127.0.0.1:${P[8]}" --no-scout
SECRET="$(head -c 32 /dev/urandom | base64)"
SKIFF_MESH_SECRET="$SECRET" start sealed-a "$SKIFF" node --tcp "127.0.0.1:${P[6]}" --mesh "127.0.0.1:${P[10]}" --net "$NET-s" --seeds "127.0.0.1:${P[11]}" --no-scout
SKIFF_MESH_SECRET="$SECRET" start sealed-b "$SKIFF" node --tcp "127.0.0.1:${P[7]}" --mesh "127.0.0.1:${P[11]}" --net "$NET-s" --seeds "127.0.0.1:${P[10]}" --no-scout
for i in 0 1 2 3 4 5 6 7; do wait_tcp "${P[$i]}"; done
grep -q "mesh sealed" "$TMP/sealed-a.log" || { echo "bench/security.sh: the sealed node does not say it is sealed" >&2; exit 1; }
sleep 2 # the meshes' members find each other

ROWS="$TMP/rows.jsonl"
: >"$ROWS"
tag() { # case: JSON lines on stdin -> $ROWS with "case"
    python3 -c '
import json, sys
with open(sys.argv[2], "a") as out:
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("{"):
            out.write(json.dumps({"case": sys.argv[1], **json.loads(line)}) + "\n")
' "$1" "$ROWS"
}
sizes="$(IFS=,; echo "${SIZES[*]}")"
CA="$TMP/ca.pem"
skiff_rows() { # case pub-locator sub-locator
    "$SKIFF" bench pubsub --json --shapes 1x1 --sizes "$sizes" --duration-secs "$DUR" \
        --pub-at "$2" --sub-at "$3" | tag "$1"
}
nats_rows() { # case url [NATS_CA]
    for size in "${SIZES[@]}"; do
        NATS_CA="${3:-}" "$NATSBENCH" pubsub -pub-url "$2" -sub-url "$2" -pubs 1 -subs 1 \
            -size "$size" -duration "${DUR}s" | tag "$1"
    done
}
LOAD_BEFORE="$(uptime)"
echo "skiff plain / tls, nats plain / tls ..." >&2
skiff_rows skiff-tcp "skiff://127.0.0.1:${P[0]}" "skiff://127.0.0.1:${P[0]}"
skiff_rows skiff-tls "tls://127.0.0.1:${P[1]}?ca=$CA" "tls://127.0.0.1:${P[1]}?ca=$CA"
nats_rows nats-tcp "nats://127.0.0.1:${P[2]}"
nats_rows nats-tls "tls://127.0.0.1:${P[3]}" "$CA"
echo "mesh plain / sealed ..." >&2
skiff_rows mesh-plain "skiff://127.0.0.1:${P[4]}" "skiff://127.0.0.1:${P[5]}"
skiff_rows mesh-sealed "skiff://127.0.0.1:${P[6]}" "skiff://127.0.0.1:${P[7]}"
LOAD_AFTER="$(uptime)"

echo "## Security: TLS and the sealed mesh against plaintext, and nats-server with TLS"
echo
echo "Machine: $(nproc) cores, $(uname -r); nats-server $("$NATS_SERVER" --version | awk '{print $NF}'); $(date -u +%Y-%m-%d)."
echo "Command: \`bench/security.sh --duration-secs $DUR\`; one run, every row back to back on loopback."
echo "Load: before \`${LOAD_BEFORE#*load average: }\`, after \`${LOAD_AFTER#*load average: }\` (uptime)."
echo "Publish/subscribe 1->1 through one server (skiff: \`skiff bench pubsub\`, block policy; nats: natsbench);"
echo "TLS 1.3 with one P-256 certificate for both servers. Mesh rows: publisher on node A, subscriber on node B."
echo
python3 - "$ROWS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def rate(case, size):
    for r in rows:
        if r["case"] == case and r.get("size") == size and r.get("msgs_per_s"):
            return r["msgs_per_s"]
    return None
def fmt(v):
    if v is None: return "n/a"
    return f"{v/1e6:.2f} M" if v >= 1e6 else f"{v/1e3:.0f} k"
def ratio(a, b):
    return f"{a/b:.2f}x" if a and b else "n/a"
print("| size | skiff TCP | skiff TLS | TLS / TCP (target ≥ 0.7x) | nats TCP | nats TLS | skiff TLS / nats TLS (target ≥ 1.5x) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for s in (8, 256):
    st, sl, nt, nl = rate("skiff-tcp", s), rate("skiff-tls", s), rate("nats-tcp", s), rate("nats-tls", s)
    print(f"| {s} B | {fmt(st)} | {fmt(sl)} | {ratio(sl, st)} | {fmt(nt)} | {fmt(nl)} | {ratio(sl, nl)} |")
print()
print("| size | mesh plain A->B | mesh sealed A->B | sealed / plain (target ≥ 0.7x) |")
print("| --- | --- | --- | --- |")
for s in (8, 256):
    p, q = rate("mesh-plain", s), rate("mesh-sealed", s)
    print(f"| {s} B | {fmt(p)} | {fmt(q)} | {ratio(q, p)} |")
PY
