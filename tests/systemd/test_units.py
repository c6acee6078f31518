"""The shipped unit files, checked offline with systemd's own analyzer."""
import re
import shutil
import subprocess

import pytest

from ..conftest import REPO

UNIT = REPO / "systemd" / "sitsd.service"


@pytest.fixture
def stub_root(tmp_path):
    """A root with the system units and a stub ExecStart binary, so `verify` resolves everything."""
    assert shutil.which("systemd-analyze"), "systemd-analyze missing (Debian package systemd)"
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    stub = root / "usr/bin/sitsd"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    shutil.copy("/bin/kill", root / "bin/kill")
    shutil.copy(UNIT, root / "etc/systemd/system/sitsd.service")
    return root


def test_unit_verifies_without_warnings(stub_root):
    r = subprocess.run(["systemd-analyze", "verify", f"--root={stub_root}",
                        str(stub_root / "etc/systemd/system/sitsd.service")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # verify exits 0 on unknown keys and unparsable values; those only show on stderr
    assert r.stderr.strip() == "", r.stderr


def test_unit_exposure_is_at_most_1_9(stub_root):
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", f"--root={stub_root}", "--threshold=19",
                        "sitsd.service"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    level = float(re.search(r"Overall exposure level for sitsd.service: ([0-9.]+)", r.stdout).group(1))
    assert level <= 1.9


def test_unit_is_notify_with_watchdog_and_the_sysusers_user():
    text = UNIT.read_text()
    assert "Type=notify" in text and re.search(r"^WatchdogSec=\d", text, re.M)
    user = re.search(r"^User=(\S+)", text, re.M).group(1)
    sysusers = (REPO / "systemd" / "sitsd.sysusers").read_text()
    assert re.search(rf"^u {user} ", sysusers, re.M)
    assert re.search(rf"^m {user} tss$", sysusers, re.M)  # /dev/tpmrm0 is root:tss 0660


def test_unit_schedules_fifo_off_cpu0_with_the_device_and_capability_it_needs():
    text = UNIT.read_text()
    directives = dict(re.findall(r"^(CPUSchedulingPolicy|CPUSchedulingPriority|CPUAffinity|LimitRTPRIO|"
                                 r"DeviceAllow|SupplementaryGroups|AmbientCapabilities)=(.+)$", text, re.M))
    assert directives["CPUSchedulingPolicy"] == "fifo"
    # the loop thread raises itself above the rest of the daemon, within LimitRTPRIO
    assert 0 < int(directives["CPUSchedulingPriority"]) < int(directives["LimitRTPRIO"])
    cpus = directives["CPUAffinity"]
    assert "0" not in re.split(r"[-, ]", cpus), f"CPUAffinity={cpus} includes CPU 0"
    assert directives["DeviceAllow"] == "/dev/tpmrm0 rw"
    assert directives["SupplementaryGroups"] == "tss"
    assert directives["AmbientCapabilities"] == "CAP_NET_RAW"
