#!/usr/bin/env bash
# `lmcache bench l2 --no-skip-verify` (LMCache 0.5.6's own L2 benchmark) through
# mmc_client.lmcache.MmcL2Connector against a running mmc-server: store, lookup (every key
# stored: --lookup-max-hit-rate 1) and load, each key's bytes verified after the load.
#
#   bash perf/lmcache_l2_bench.sh [URL] [extra lmcache bench l2 arguments]
#
# Needs target/lmcache-venv (bash scripts/lmcache_tests.sh installs it). Figures: perf/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
URL=${1:-${MMC_URL:-http://127.0.0.1:8000}}
shift || true
VENV=target/lmcache-venv
PREFIX="bench-$(date +%s)-$$/"
for cfg in "32 1 256" "32 4 256" "16 4 1024"; do
  read -r keys inflight kb <<<"$cfg"
  echo "== lmcache bench l2: $keys keys x $inflight in flight, $kb KiB each, verified"
  timeout 600 "$VENV/bin/lmcache" bench l2 \
    --l2-adapter "{\"type\":\"native_plugin\",\"module_path\":\"mmc_client.lmcache\",\"class_name\":\"MmcL2Connector\",\"adapter_params\":{\"url\":\"$URL\",\"key_prefix\":\"$PREFIX$kb/$inflight/\"}}" \
    --num-keys "$keys" --in-flight "$inflight" --data-size-kb "$kb" --rounds 3 --warmup-rounds 1 \
    --lookup-max-hit-rate 1.0 --no-skip-verify "$@" 2>&1 |
    grep -E "^(Operation|Total keys|Total success|Throughput avg|Avg latency|Duration p50|.*[Vv]erif)" || true
done
