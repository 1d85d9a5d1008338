#!/usr/bin/env bash
# Bounded fuzzing of the pure parsers (fuzz/README.md): builds every cargo-fuzz target once,
# then runs each for SECONDS_PER_TARGET seconds (default 20) on a temporary copy of its
# committed seed corpus, so the repository stays clean. Exits non-zero if any target crashes,
# times out or runs out of memory; then the input that did it is copied to
# fuzz/artifacts/<target>/ (ignored by git) and its path and base64 (for CI logs) are printed.
#
# Works on stable Rust: the fuzzers are built without a sanitizer (`--sanitizer none`), which
# leaves only stable codegen flags (sancov instrumentation, debug assertions, overflow checks).
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-20}"
if ! [[ "$secs" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [SECONDS_PER_TARGET]" >&2
  exit 2
fi

export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== cargo install cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

flags=(--sanitizer none --debug-assertions)
echo "== cargo fuzz build (fuzz/target)"
cargo fuzz build "${flags[@]}"

triple="$(rustc -vV | sed -n 's/^host: //p')"
bin_dir="fuzz/target/$triple/release"
work="$(mktemp -d "${TMPDIR:-/tmp}/mmc-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT

failed=()
summary=()
for target in $(cargo fuzz list); do
  corpus="$work/corpus/$target"
  artifacts="$work/artifacts/$target"
  mkdir -p "$corpus" "$artifacts"
  if [ -d "fuzz/corpus/$target" ]; then
    cp -R "fuzz/corpus/$target/." "$corpus/"
  fi
  log="$work/$target.log"
  echo "== fuzz $target for ${secs}s"
  rc=0
  # -timeout: one input taking longer is a finding too. The outer timeout is only a backstop.
  timeout --kill-after=10 "$((secs + 120))" \
    "$bin_dir/$target" "$corpus" \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  if [ "$rc" -eq 0 ]; then
    summary+=("$target: ok, ${execs:-?} executions")
    continue
  fi
  failed+=("$target")
  summary+=("$target: FAILED (exit $rc)")
  # The panic message and libFuzzer's report, without the long backtrace.
  grep -E -A3 "panicked at|ERROR: libFuzzer|SUMMARY:|Test unit written|Base64:" "$log" | grep -v -E '^ +[0-9]+: |^ +at ' || tail -n 40 "$log"
  mkdir -p "fuzz/artifacts/$target"
  for f in "$artifacts"/*; do
    [ -f "$f" ] || continue
    kept="fuzz/artifacts/$target/$(basename "$f")"
    cp "$f" "$kept"
    echo "crashing input: $kept"
    echo "reproduce: cargo fuzz run ${flags[*]} $target $kept"
  done
done

echo "== fuzz summary (${secs}s per target)"
printf '  %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzzing found problems in: ${failed[*]} (inputs in fuzz/artifacts/, see fuzz/README.md)" >&2
  exit 1
fi
