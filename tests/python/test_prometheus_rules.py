"""deploy/prometheus/: the alert rules parse (`promtool check rules`), their unit tests pass
(`promtool test rules`), the example configuration is valid, and the rules cover what
issue 16 lists."""

import os
import re
import shutil
import subprocess

from conftest import ROOT

DIR = os.path.join(ROOT, "deploy", "prometheus")
RULES = os.path.join(DIR, "mmc-server.rules.yml")
TESTS = os.path.join(DIR, "mmc-server.rules.test.yml")

EXPECTED_ALERTS = {
    "MmcServerDown",
    "MmcTierAboveHighWatermark",
    "MmcEvictionStorm",
    "MmcRewarmFailures",
    "MmcSsdFlushFailures",
    "MmcKvEventsDropped",
    "MmcStaleRank",
    "MmcLoadShedding",
    "MmcScrapeTooSlow",
    "MmcScrapeLatencyHigh",
}


def promtool(*args):
    exe = shutil.which("promtool")
    assert exe, "promtool is needed (scripts/test.sh installs the prometheus package)"
    r = subprocess.run([exe, *args], cwd=DIR, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "promtool %s:\n%s%s" % (" ".join(args), r.stdout, r.stderr)
    return r.stdout


def test_rules_check():
    out = promtool("check", "rules", RULES)
    assert "SUCCESS: %d rules found" % len(EXPECTED_ALERTS) in out, out


def test_rules_unit_tests_pass():
    out = promtool("test", "rules", TESTS)
    assert "SUCCESS" in out, out


def test_example_config_is_valid():
    promtool("check", "config", os.path.join(DIR, "prometheus.yml"))


def test_every_alert_is_defined_and_unit_tested():
    with open(RULES) as f:
        defined = set(re.findall(r"^\s*- alert:\s*(\w+)", f.read(), re.M))
    assert defined == EXPECTED_ALERTS
    with open(TESTS) as f:
        tests = f.read()
    for alert in EXPECTED_ALERTS:
        # A firing case (with expected labels) and at least one case where it stays quiet.
        blocks = re.findall(r"alertname: %s\n\s+exp_alerts:(.*?)(?=\n\s+- eval_time|\n\n|\Z)" % alert, tests, re.S)
        assert any("exp_labels" in b for b in blocks), alert + " never fires in a test"
        assert any(b.strip() == "[]" for b in blocks), alert + " is never tested quiet"
