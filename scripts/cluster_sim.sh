#!/usr/bin/env bash
# A long campaign of the deterministic cluster simulation (src/cluster/sim/), in release, on
# every core.
# Usage: scripts/cluster_sim.sh [SEEDS] [STEPS]
#   SEEDS: N (seeds 1..=N) or FROM..TO (TO excluded); default 500.
#   STEPS: steps per seed (each 1-20 ms of simulated time), then the settling; default 3000.
# Prints, per fault kind (partitions, slow links, drops, duplicates, pauses, kills, restarts,
# failovers, etcd outages, clock jumps, grant replays, client retries, leaves, ...), how many
# were injected, what the workload did, and every failing seed with its first violation;
# exits non-zero when a seed failed. Replay one seed exactly (with its trace):
#   MMC_SIM_SEED=N MMC_SIM_STEPS=STEPS cargo test --release --lib cluster::sim::tests::replay -- --nocapture
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${1:-500}"
case "$seeds" in
*..*) ;;
*) seeds="1..$((seeds + 1))" ;;
esac
export MMC_SIM_CAMPAIGN="$seeds"
export MMC_SIM_STEPS="${2:-3000}"
exec cargo test --release --lib cluster::sim::tests::campaign -- --nocapture
