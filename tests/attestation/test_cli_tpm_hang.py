"""`sitsctl deploy` and `sitsctl enroll` against a TPM that hangs (swtpm SIGSTOPped: connections accepted, no reply):
every TPM call is bounded (attestation.tpm.worker), so the CLI fails naming the step and the TCTI, stages nothing,
and Ctrl-C interrupts it. Real swtpm; the bounds are the real ones (opening: TPM_OPEN_TIMEOUT_S, 10 s) except where
a test lowers the per-call bound in process."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from attestation.tpm import Swtpm

from ..conftest import REPO
from .test_deploy import deploy_args, deploy_in_process, sitsctl, vendor  # noqa: F401 (fixture)


def test_deploy_to_a_frozen_tpm_fails_naming_the_step_and_tcti(tmp_path, vendor):  # noqa: F811
    tpm = Swtpm(tmp_path / "tpm").start()
    tpm._proc.send_signal(signal.SIGSTOP)
    try:
        r = sitsctl(*deploy_args(tmp_path, vendor, tpm.tcti), timeout=120)
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        tpm.stop()
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Verified: [FAIL] TPM: sitsctl deploy"), r.stdout
    assert f"TCTI {tpm.tcti!r} did not answer opening it within 10 s" in lines[0], lines[0]
    assert not (tmp_path / "audit" / "deployment.json").exists()


def test_deploy_with_a_tpm_that_freezes_mid_way_names_the_step(tmp_path, vendor, capsys, monkeypatch):  # noqa: F811
    import attestation.deploy as deploy
    from attestation.tpm import worker

    monkeypatch.setattr(worker, "TPM_SETUP_TIMEOUT_S", 2.0)  # the per-call bound, read at call time
    tpm = Swtpm(tmp_path / "tpm").start()
    real_measure = deploy.measure

    def freeze_then_measure(esapi, **kw):
        tpm._proc.send_signal(signal.SIGSTOP)  # opened; the first call of the deployment hangs
        return real_measure(esapi, **kw)

    monkeypatch.setattr(deploy, "measure", freeze_then_measure)
    try:
        rc, out, _ = deploy_in_process(capsys, tmp_path, vendor, tpm.tcti)
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        tpm.stop()
    assert rc == 1
    assert len(out.splitlines()) == 1 and out.startswith("Verified: [FAIL] TPM: sitsctl deploy (provisioning the "
                                                         "device identity key at 0x81000001)"), out
    assert f"TCTI {tpm.tcti!r} did not answer" in out and "within 2 s" in out, out
    assert not (tmp_path / "audit" / "deployment.json").exists()


def test_enroll_request_to_a_frozen_tpm_fails_naming_the_step_and_tcti(tmp_path):
    tpm = Swtpm(tmp_path / "tpm").start()
    tpm._proc.send_signal(signal.SIGSTOP)
    try:
        r = subprocess.run([sys.executable, "-m", "sitsd.cli", "enroll", "--tcti", tpm.tcti,
                            "-o", tmp_path / "request.json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        tpm._proc.send_signal(signal.SIGCONT)
        tpm.stop()
    assert r.returncode == 2, r.stderr[-2000:]
    assert "sitsctl enroll (request" in r.stderr, r.stderr[-2000:]
    assert f"TCTI {tpm.tcti!r} did not answer opening it within 10 s" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "request.json").exists()


def test_ctrl_c_interrupts_a_deploy_waiting_on_a_frozen_tpm(tmp_path, vendor):  # noqa: F811
    tpm = Swtpm(tmp_path / "tpm").start()
    tpm._proc.send_signal(signal.SIGSTOP)
    proc = subprocess.Popen([sys.executable, "-m", "sitsd.cli", *map(str, deploy_args(tmp_path, vendor, tpm.tcti))],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a CI that runs the suite in the background (a non-interactive shell's `&`) starts it
                            # with SIGINT ignored, which children inherit, and Python then never installs its
                            # KeyboardInterrupt handler: give the deploy the default an operator's terminal gives
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # the deploy's checks before the TPM (the solver, the model) may take seconds on a loaded machine, and the
        # solver handles a Ctrl-C of its own: interrupt only once the deploy says it is opening the TPM
        line = proc.stderr.readline()
        while line and "measuring in the TPM" not in line:
            line = proc.stderr.readline()
        assert "measuring in the TPM" in line, "the deploy ended before opening the TPM"
        time.sleep(1)  # into the (10 s) wait for the TPM to open
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tpm._proc.send_signal(signal.SIGCONT)
        tpm.stop()
    assert proc.returncode == 130, out + err[-2000:]
    assert not (tmp_path / "audit" / "deployment.json").exists()
