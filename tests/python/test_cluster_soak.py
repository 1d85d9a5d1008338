"""A short, bounded run of the cluster chaos soak (scripts/cluster_soak.py): a pure meta
service and three local services, clients putting, reading through the meta's redirects,
deleting and batch-reading, while local services are killed (-9) or stopped (SIGTERM, a
drain) and restarted. The soak's own verdict must be PASS."""

import json
import os
import signal
import subprocess
import sys

from conftest import ROOT, SERVER

SOAK = os.path.join(ROOT, "scripts", "cluster_soak.py")


def test_cluster_chaos_soak_passes():
    # Seed 7: a kill -9 and SIGTERMs among its first chaos actions.
    cmd = [
        sys.executable, SOAK, "--server", SERVER, "--duration", "20", "--seed", "7",
        "--clients", "4", "--chaos-every", "2.5", "--dram-mb", "64", "--ssd-mb", "64",
    ]
    # Its own session: on a timeout the soak and the servers it started are killed together.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=80)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError("the soak did not end within 80 s:\n" + out)
    last = [line for line in out.splitlines() if line.startswith("{")]
    assert last, out
    report = json.loads(last[-1])
    assert p.returncode == 0 and report["verdict"] == "PASS", out
    assert report["chaos"].get("kill", 0) + report["chaos"].get("term", 0) >= 1, out
    assert report["answers"] > 100, out
