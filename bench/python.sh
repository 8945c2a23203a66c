#!/usr/bin/env bash
# skiff's Python package against nats-py (with nats-server) and pyzmq
# PUSH/PULL, in one run: pub->sub 8 B and 256 B, sequential request p50,
# and the Rust client's pub->sub rate beside them (`skiff bench pubsub`).
# Installs nats-py, pyzmq and maturin from PyPI into target/py-bench-venv,
# nats-server from Debian when missing; builds the extension and the
# skiff binary in release. Usage: bench/python.sh [MESSAGES]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-300000}
venv=target/py-bench-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check maturin nats-py pyzmq
NATS_SERVER="$(bench/nats/server.sh)"
VIRTUAL_ENV="$PWD/$venv" PATH="$PWD/$venv/bin:$PATH" "$venv/bin/maturin" develop -q --release -m crates/skiff-py/Cargo.toml >&2
cargo build -q --release -p skiff-cli
skiff="${CARGO_TARGET_DIR:-$PWD/target}/release/skiff"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$skiff" node --tcp "127.0.0.1:$port" 2>/dev/null & node=$!
"$NATS_SERVER" -a 127.0.0.1 -p "$nport" >/dev/null 2>&1 & nats=$!
trap 'kill $node $nats 2>/dev/null' EXIT
sleep 1
echo "machine: $(nproc) CPUs, $(uname -r); load: $(uptime)" >&2
echo "peers: nats-server $("$NATS_SERVER" --version | awk '{print $2}'), nats-py $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("nats-py"))'), pyzmq $("$venv/bin/python" -c 'import zmq; print(zmq.__version__)'), skiff $(git rev-parse --short HEAD)" >&2
"$venv/bin/python" bench/python_bench.py "skiff://127.0.0.1:$port" "nats://127.0.0.1:$nport" "$n"
echo "Rust client through the same node (skiff bench pubsub, 1x1):" >&2
"$skiff" bench pubsub --node "skiff://127.0.0.1:$port" --shapes 1x1 --sizes 8,256 --json
