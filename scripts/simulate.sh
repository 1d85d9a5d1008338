#!/usr/bin/env bash
# Long runs of the Store's seeded simulation (src/shards/store/sim.rs), for soak testing.
# Usage: scripts/simulate.sh [SEEDS] [STEPS]   SEEDS: N or FROM..TO (default 1..200),
# STEPS per seed (default 20000). A failure prints its seed and step; rerun that seed alone
# (scripts/simulate.sh N STEPS) to replay it exactly.
set -euo pipefail
cd "$(dirname "$0")/.."
export MMC_SIM_SEEDS="${1:-1..200}"
export MMC_SIM_STEPS="${2:-20000}"
exec cargo test --release --lib shards::store::sim::long_run -- --nocapture
