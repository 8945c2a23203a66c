#!/usr/bin/env bash
# Builds the ZeroMQ baseline of `skiff-bench queue` and `shm` into target/zmq_bench
# (or $CARGO_TARGET_DIR/zmq_bench), installing gcc and libzmq3-dev from
# Debian when they are missing. Prints the path of the binary.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
out="$target/zmq_bench"

need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc)
[ -f /usr/include/zmq.h ] || need+=(libzmq3-dev)
if ((${#need[@]})); then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    echo "zmq: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    # Refresh the package lists only when the plain install fails.
    "${sudo[@]}" apt-get install -y -q "${need[@]}" >&2 ||
        { "${sudo[@]}" apt-get update -q >&2 && "${sudo[@]}" apt-get install -y -q "${need[@]}" >&2; }
fi

mkdir -p "$target"
if [ ! -x "$out" ] || [ "$here/zmq_bench.c" -nt "$out" ]; then
    gcc -O2 -Wall -Wextra -Werror -std=c11 -o "$out" "$here/zmq_bench.c" -lzmq -lpthread
fi
echo "$out"
