"""deploy/systemd/: `systemd-analyze verify` finds nothing to say about either unit (pointed at
the built server binary), the single-node unit pins CPUs and memory and raises the limits, both
are hardened, and the tokens come from an EnvironmentFile under the names the server reads."""

import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT, SERVER

DIR = os.path.join(ROOT, "deploy", "systemd")
UNITS = {"mmc-server.service": "mmc-server.service", "mmc-server@.service": "mmc-server@1.service"}


def settings(text):
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z]+)=(.*)$", line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


def verify(tmp_path, name, text):
    exe = shutil.which("systemd-analyze")
    if not exe:
        pytest.skip("systemd-analyze is not installed (scripts/test.sh installs the systemd package)")
    unit = tmp_path / name
    unit.write_text(text.replace("/usr/local/bin/mmc-server", SERVER))
    r = subprocess.run([exe, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    return r.returncode, (r.stdout + r.stderr).strip()


@pytest.mark.parametrize("source", sorted(UNITS))
def test_unit_verifies_clean(tmp_path, source):
    with open(os.path.join(DIR, source)) as f:
        text = f.read()
    assert "ExecStart=/usr/local/bin/mmc-server " in text
    code, out = verify(tmp_path, UNITS[source], text)
    assert code == 0 and out == "", out


def test_verify_catches_a_broken_unit(tmp_path):
    with open(os.path.join(DIR, "mmc-server.service")) as f:
        text = f.read()
    code, out = verify(tmp_path, "mmc-server.service", text.replace("CPUAffinity=2-15", "CPUAffinity=two"))
    assert "CPU affinity" in out, out


def test_unit_pins_limits_and_hardens():
    with open(os.path.join(DIR, "mmc-server.service")) as f:
        s = settings(f.read())
    assert re.fullmatch(r"[0-9,-]+", s["CPUAffinity"][0])
    assert s["NUMAPolicy"] == ["bind"] and s["NUMAMask"] == ["0"]
    assert s["LimitMEMLOCK"] == ["infinity"]
    assert int(s["LimitNOFILE"][0]) >= 65536
    for key, value in {
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
        "PrivateTmp": "yes", "PrivateDevices": "yes", "RestrictSUIDSGID": "yes",
        "MemoryDenyWriteExecute": "yes", "CapabilityBoundingSet": "",
    }.items():
        assert s.get(key) == [value], key


def test_tokens_come_from_the_environment_file():
    with open(os.path.join(ROOT, "src", "cli.rs")) as f:
        env_names = re.findall(r'\("(MMC_[A-Z_]+)", "ock\.mmc\.http\.(?:auth|metrics)_token"\)', f.read())
    assert sorted(env_names) == ["MMC_API_TOKEN", "MMC_METRICS_TOKEN"]
    for source in UNITS:
        with open(os.path.join(DIR, source)) as f:
            text = f.read()
        s = settings(text)
        assert s["EnvironmentFile"][0].startswith("/etc/mmc/"), source
        # Never on the command line (visible in /proc) nor in the unit.
        assert "token" not in s["ExecStart"][0].lower(), source
        for name in env_names:
            assert name in text, (source, name)
