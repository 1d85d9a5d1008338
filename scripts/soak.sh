#!/usr/bin/env bash
# Soak test (not run in CI): many clients, random object sizes, random SSD faults, slow and
# disconnecting clients against one mmc-server; every acknowledged object is verified by
# checksum at the end. Exit status 0 = PASS, 1 = FAIL (the report says why).
#
#   scripts/soak.sh [DURATION_S] [options of scripts/soak.py]
#   scripts/soak.sh 60 --seed 42 --faults ssd-read
#   MMC_SERVER=target/debug/mmc-server scripts/soak.sh 20
#
# Builds the release server unless MMC_SERVER names a binary. Python 3.9+, standard library
# only. `scripts/soak.sh --help` lists the options.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=60
if [[ $# -gt 0 && $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    duration=$1
    shift
fi
if [[ -z ${MMC_SERVER:-} ]]; then
    cargo build --release --bin mmc-server
    MMC_SERVER=target/release/mmc-server
fi
# scripts/cluster_soak.sh runs the cluster soak through here (MMC_SOAK_SCRIPT).
exec python3 "scripts/${MMC_SOAK_SCRIPT:-soak.py}" --server "$MMC_SERVER" --duration "$duration" "$@"
