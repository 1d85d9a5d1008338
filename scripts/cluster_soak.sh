#!/usr/bin/env bash
# Cluster chaos soak (a short run is in CI: tests/python/test_cluster_soak.py): a pure meta
# service and local services on loopback, clients putting, reading (through the meta's 307s),
# deleting and batch-reading, while one local service at a time is killed (-9) or stopped
# (SIGTERM, which drains it) and restarted on the same rank and port. Every read is checked
# against the acknowledged bytes; at the end every key is read back and every process must
# exit 0 on SIGTERM. Exit status 0 = PASS, 1 = FAIL (the report says why).
#
#   scripts/cluster_soak.sh [DURATION_S] [options of scripts/cluster_soak.py]
#   scripts/cluster_soak.sh 120 --seed 42 --ranks 4
#   MMC_SERVER=target/debug/mmc-server scripts/cluster_soak.sh 20 --ssd-mb 0
#
# Builds the release server unless MMC_SERVER names a binary. Python 3.9+, standard library
# only. `scripts/cluster_soak.sh --help` lists the options.
set -euo pipefail
# The same duration argument and build as the single-server soak.
MMC_SOAK_SCRIPT=cluster_soak.py exec "$(dirname "$0")/soak.sh" "$@"
