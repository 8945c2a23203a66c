#!/usr/bin/env bash
# Prints the path of the nats-server every bench compares against: $NATS_SERVER
# if set, else the newest v2 release from the Go module proxy, installed once
# into <target>/gobin (`go install github.com/nats-io/nats-server/v2@latest`).
# Debian's package is older; it is used only when Go cannot install one, and
# the version printed by each bench says which ran.
#
#   NATS_SERVER="$(bench/nats/server.sh)"
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${NATS_SERVER:-}" ]; then
    echo "$NATS_SERVER"
    exit 0
fi
target="${CARGO_TARGET_DIR:-$PWD/target}"
bin="$target/gobin/nats-server"
if [ ! -x "$bin" ] && command -v go >/dev/null; then
    echo "installing the newest nats-server v2 (Go module proxy)..." >&2
    GOBIN="$target/gobin" go install github.com/nats-io/nats-server/v2@latest >&2 || true
fi
if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi
if ! command -v nats-server >/dev/null; then
    echo "no Go: installing Debian's (older) nats-server..." >&2
    apt-get update >/dev/null && apt-get install -y nats-server >/dev/null
fi
command -v nats-server
