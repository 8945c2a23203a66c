#!/usr/bin/env bash
# NATS clients nobody here wrote against skiff's NATS listener: nats-py
# (PyPI), nats.go (Go module proxy) and nats.js (`nats` on npm), each
# installed once into target/nats-clients. Starts two meshed nodes (A, B)
# with --nats, a node with users (E), two with TLS on the NATS port (F:
# required, G: handshake_first), and for each client two more (C, D) for
# reconnection, then runs tests/nats/{py,go,js}. Usage: tests/nats/run.sh [py] [go] [js]
# (default all). SKIFF=path picks the skiff binary (default target/debug).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/tests/nats"
SKIFF=${SKIFF:-${CARGO_TARGET_DIR:-$root/target}/debug/skiff}
cache=${NATS_CLIENTS_DIR:-${CARGO_TARGET_DIR:-$root/target}/nats-clients}
clients=("$@")
[ ${#clients[@]} -gt 0 ] || clients=(py go js)
mkdir -p "$cache"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

install() {
  case $1 in
    py)
      if ! PYTHONPATH="$cache/pylib" python3 -c 'import nats' 2>/dev/null; then
        echo "   installing nats-py (PyPI)"
        # Into a directory of its own (no venv module needed, nothing
        # installed into the system's Python).
        PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check \
          --target "$cache/pylib" 'nats-py>=2.9,<3'
      fi ;;
    go)
      echo "   building the nats.go suite (Go module proxy)"
      (cd "$here/go" && go build -o "$cache/natsgo-suite" .) ;;
    js)
      if [ ! -d "$cache/js/node_modules/nats" ]; then
        echo "   installing nats.js (npm)"
        mkdir -p "$cache/js"
        (cd "$cache/js" && npm install --silent --no-audit --no-fund 'nats@^2.28' >/dev/null)
      fi ;;
  esac
}

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
uport() { python3 -c 'import socket; s=socket.socket(type=socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start NAME EXTRA-ARGS...: sets ${NAME}_TCP, ${NAME}_NATS, ${NAME}_PID.
start() {
  local name=$1; shift
  local t n
  t=$(port); n=$(port)
  : >"$tmp/$name.log"
  "$SKIFF" node --tcp "127.0.0.1:$t" --nats "127.0.0.1:$n" "$@" >"$tmp/$name.log" 2>&1 &
  local pid=$!
  disown "$pid"
  pids+=("$pid")
  for _ in $(seq 100); do
    grep -q "listening for NATS" "$tmp/$name.log" && break
    kill -0 "$pid" 2>/dev/null || { cat "$tmp/$name.log"; echo "node $name exited"; exit 1; }
    sleep 0.05
  done
  printf -v "${name}_TCP" '%s' "skiff://127.0.0.1:$t"
  printf -v "${name}_NATS" '%s' "nats://127.0.0.1:$n"
  printf -v "${name}_PID" '%s' "$pid"
}

for c in "${clients[@]}"; do install "$c"; done

ma=$(uport); mb=$(uport)
start A --mesh "127.0.0.1:$ma" --net "nats-$$" --no-scout
start B --mesh "127.0.0.1:$mb" --net "nats-$$" --no-scout --seeds "127.0.0.1:$ma"
export SKIFF NATS_A=$A_NATS NATS_B=$B_NATS SKIFF_A=$A_TCP SKIFF_B=$B_TCP

# E: a node with users (a token; alice by password, allowed to publish only
# under alice.; svc by the test-only nkey in tests/nats/go/main.go).
cat >"$tmp/auth.toml" <<'TOML'
[auth]
token = "tok"
[[auth.users]]
name = "alice"
password_hash = "$argon2id$v=19$m=19456,t=2,p=1$dGLlLtIADVUAFiboW/gV8Q$tXRL14ioOZylc3/KwFLU8yeCO/DcIADfYRY1X++nAPs"
[auth.users.permissions]
publish = { allow = ["alice.>"] }
[[auth.users]]
name = "svc"
public_key = "UBQQ2KVTSNUWYGO7OIAY2BALDUNRVQUFNNDDBH2ZPRMJFWCJL22TSWCS"
TOML
start E --config "$tmp/auth.toml"
export NATS_AUTH=$E_NATS

# F and G: TLS on the NATS port (F: INFO in plaintext, then TLS, as
# nats-server; G: handshake_first), with a CA and a certificate for
# 127.0.0.1 made here by openssl (scripts/test.sh installs it).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=skiff nats test ca" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$tmp/ca.key" -out "$tmp/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$tmp/node.key" -out "$tmp/node.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$tmp/ext"
openssl x509 -req -in "$tmp/node.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial \
  -days 2 -extfile "$tmp/ext" -out "$tmp/node.pem" 2>/dev/null
start F --tls-cert "$tmp/node.pem" --tls-key "$tmp/node.key" --nats-tls required
start G --tls-cert "$tmp/node.pem" --tls-key "$tmp/node.key" --nats-tls handshake_first
export NATS_TLS=$F_NATS NATS_TLS_FIRST=$G_NATS NATS_CA="$tmp/ca.pem"

failed=0
for c in "${clients[@]}"; do
  start C; start D
  export NATS_C=$C_NATS NATS_D=$D_NATS KILL_C=$C_PID
  echo "== NATS client: $c"
  case $c in
    py) PYTHONPATH="$cache/pylib" timeout 120 python3 "$here/py/suite.py" || failed=1 ;;
    go) timeout 120 "$cache/natsgo-suite" || failed=1 ;;
    js) NODE_PATH="$cache/js/node_modules" timeout 120 node "$here/js/suite.cjs" || failed=1 ;;
  esac
  kill "$D_PID" 2>/dev/null || true
done
[ "$failed" = 0 ] || { echo "NATS client suites: FAILED (node logs follow)"; tail -n 20 "$tmp"/*.log; exit 1; }
echo "NATS client suites: passed"
