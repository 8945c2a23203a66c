#!/bin/bash
# The 16-requester rate against where the node, requester and responder run
# (see bench/RESULTS.md, "What selects the mode"). Needs taskset; two CPUs.
#   bench/request_placement.sh
# SKIFF=path uses that skiff binary (default ./target/release/skiff); the
# rows are `skiff bench request`'s, whose responder runtime thread is named
# bench-responder and whose requester runtime threads tokio-rt-worker.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SKIFF=${SKIFF:-./target/release/skiff}
taskset -c 0 "$SKIFF" node --tcp 127.0.0.1:4798 2>/dev/null &
NODEPID=$!
out=$(mktemp)
trap 'kill $NODEPID 2>/dev/null; rm -f "$out"' EXIT
sleep 0.5
for cfg in "0 1" "1 0" "1 1" "0 0"; do
  set -- $cfg
  for r in 1 2; do
    "$SKIFF" bench request --node skiff://127.0.0.1:4798 --duration-secs 4 --concurrency 16 > "$out" 2>/dev/null &
    BJ=$!
    sleep 0.4
    for t in /proc/$BJ/task/*; do
      tid=$(basename $t); name=$(cat $t/comm 2>/dev/null)
      case $name in
        bench-responder) taskset -p -c $2 $tid >/dev/null;;
        tokio-rt-worker) taskset -p -c $1 $tid >/dev/null;;
      esac
    done
    wait $BJ
    echo "$(grep skiff-req "$out" | awk '{print $5}') k/s <- requester@$1 responder@$2 node@0"
  done
done
