#!/usr/bin/env bash
# Builds bench/nats/natsbench (the nats-server load generator) with the
# official nats.go client from the Go module proxy.
set -euo pipefail
cd "$(dirname "$0")"
go mod tidy >/dev/null
go build -o natsbench .
echo "built $(pwd)/natsbench"
