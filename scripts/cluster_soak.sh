#!/usr/bin/env bash
# Cluster chaos soak (short runs are in CI: tests/python/test_cluster_soak.py): a pure meta
# service (or, with --ha, two metas electing a leader on a real etcd from `etcd` on PATH) and
# local services on loopback; clients putting, reading (through the meta's 307s), deleting,
# rewriting, batch-reading, replaying used grants and retrying puts whose answer they never
# read, while one fault at a time hits the cluster: a local service frozen (SIGSTOP) shorter
# or longer than the heartbeat timeout, killed (-9) and restarted (at once or later), stopped
# with SIGTERM (a drain) and restarted; with --ha the leader killed (-9, restarted as a
# standby) or frozen past its lease. Every read is judged against what was acknowledged
# (scripts/cluster_soak_judge.py); a restarted or resumed rank must serve within the
# heartbeat timeout + 1 s; at the end every key is read back and every process must exit 0 on
# SIGTERM. The last line is the verdict (JSON): corrupt reads, resurrected deletes, stale
# overwrites, losses no documented rule allows, replays accepted... all 0. Exit status
# 0 = PASS, 1 = FAIL (the report says why, with times to match the logs it keeps).
#
#   scripts/cluster_soak.sh [DURATION_S] [options of scripts/cluster_soak.py]
#   scripts/cluster_soak.sh 300 --seed 42
#   scripts/cluster_soak.sh 300 --seed 42 --ha --stall-dump
#   scripts/cluster_soak.sh 120 --sequence freeze-long,kill,term --chaos-every 5
#   MMC_SERVER=target/debug/mmc-server scripts/cluster_soak.sh 20 --ssd-mb 0
#
# Builds the release server unless MMC_SERVER names a binary. Python 3.9+, standard library
# only. `scripts/cluster_soak.sh --help` lists the options.
set -euo pipefail
# The same duration argument and build as the single-server soak.
MMC_SOAK_SCRIPT=cluster_soak.py exec "$(dirname "$0")/soak.sh" "$@"
