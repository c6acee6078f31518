"""The shipped unit files, checked offline with systemd's own analyzer."""
import re
import shutil
import subprocess

import pytest

from ..conftest import REPO

UNIT = REPO / "systemd" / "sitsd.service"
MOUNT = REPO / "systemd" / "var-lib-sitsd.mount"


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
    shutil.copy(MOUNT, root / "etc/systemd/system/var-lib-sitsd.mount")
    return root


@pytest.mark.parametrize("unit", ["sitsd.service", "var-lib-sitsd.mount"])
def test_unit_verifies_without_warnings(stub_root, unit):
    r = subprocess.run(["systemd-analyze", "verify", f"--root={stub_root}",
                        str(stub_root / "etc/systemd/system" / unit)], capture_output=True, text=True)
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


def _directives(path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for key, value in re.findall(r"^(\w+)=(.*)$", path.read_text(), re.M):
        found.setdefault(key, []).append(value)
    return found


def test_state_is_on_the_data_partition_and_not_under_volatile_binds():
    """The daemon's state directory is the mount unit's Where=, the daemon requires that mount, and the mount
    comes after oe-core's volatile-binds overlay of /var/lib (a service, so not ordered by systemd itself) and
    with the local file systems (before systemd-tmpfiles-setup creates audit/ and pki/ on it)."""
    unit, mount = _directives(UNIT), _directives(MOUNT)
    state = "/var/lib/" + unit["StateDirectory"][0]
    assert mount["Where"] == [state]
    assert MOUNT.name == state.strip("/").replace("/", "-") + ".mount"
    assert unit["RequiresMountsFor"] == [state]
    assert "var-volatile-lib.service" in " ".join(mount["After"]).split()
    assert mount["WantedBy"] == ["local-fs.target"]
    assert mount["What"][0].startswith("/dev/disk/by-label/")
    escaped = subprocess.run(["systemd-escape", "--path", mount["What"][0]], capture_output=True, text=True,
                             check=True).stdout.strip()
    fsck = f"systemd-fsck@{escaped}.service"
    assert fsck in mount["Requires"] and fsck in " ".join(mount["After"]).split()
    assert "noexec" in mount["Options"][0].split(",") and "nodev" in mount["Options"][0].split(",")
    tmpfiles = (REPO / "systemd" / "sitsd.tmpfiles").read_text()
    user = unit["User"][0]
    for sub in ("", "/audit", "/pki"):
        assert re.search(rf"^d {state}{sub} 0[0-7]50 {user} {user} -$", tmpfiles, re.M), f"tmpfiles: {state}{sub}"


def test_default_pki_dir_and_example_configs_are_on_the_data_partition():
    """The OPC UA PKI is written at run time (rejected certificates) and holds the device's key: it lives in
    the daemon's state, not under the read-only /etc."""
    from sitsd.schema import PlcSection

    state = "/var/lib/" + _directives(UNIT)["StateDirectory"][0]
    assert str(PlcSection.model_fields["pki_dir"].default) == f"{state}/pki"
    for name in ("rolling-mill.yaml", "rolling-mill-streaming.yaml"):
        (line,) = re.findall(r"^  pki_dir: (\S+)", (REPO / "examples" / name).read_text(), re.M)
        assert line == f"{state}/pki", name
