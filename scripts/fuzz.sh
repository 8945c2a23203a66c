#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a bounded time on nightly and
# fails if any target crashes (its input is kept in fuzz/artifacts/TARGET/).
# Installs cargo-fuzz and the nightly toolchain when missing.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
# Every [[bin]] of fuzz/Cargo.toml is a target.
mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^skiff-fuzz$')

if ! rustup toolchain list | grep -q '^nightly'; then
  echo "== installing the nightly toolchain (cargo fuzz needs it)"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

# Builds go to the shared target dir (under its own subdirectory, as they
# use nightly and sanitizer flags); corpora to fuzz/corpus/TARGET, seeded
# from fuzz/seeds/TARGET when present.
target_dir="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"
failed=()
for t in "${targets[@]}"; do
  echo "== fuzz $t (${secs}s)"
  mkdir -p "fuzz/corpus/$t"
  corpora=("fuzz/corpus/$t")
  [ -d "fuzz/seeds/$t" ] && corpora+=("fuzz/seeds/$t")
  log="$target_dir/$t.log"
  mkdir -p "$target_dir"
  if cargo +nightly fuzz run --fuzz-dir fuzz --target-dir "$target_dir" "$t" "${corpora[@]}" -- \
      -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo '?')
    echo "   ok: $runs runs, no crash"
  else
    if grep -q 'failed to build fuzz script' "$log"; then
      echo "   BUILD FAILED for $t; last lines of $log:"
    else
      echo "   CRASH in $t (input saved in fuzz/artifacts/$t/); last lines of $log:"
    fi
    tail -n 40 "$log" | sed 's/^/   | /'
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} of ${#targets[@]} targets failed: ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${secs}s each, no crash"
