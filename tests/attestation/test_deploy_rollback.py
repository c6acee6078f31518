"""`sitsctl deploy` into a running sitsd (swtpm, the PLC simulator, a real daemon) leaves the running
configuration as it was whenever the deployment fails after the daemon loaded it: a failure inside the daemon's
load, a quote the deployer cannot verify, a deployer that fails in between, and a load nobody confirms (undone
after its timeout). One daemon serves every test of this file, each leaves it as it found it."""
import contextlib
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from attestation.measurement import read_log
from attestation.tpm import Swtpm

from ..conftest import (DEMO_MODEL, EXAMPLE_CONFIG, REPO, example_config_data, multicast_group_url, sitsd_args,
                        wait_ready)

ORIGINAL_SHA = hashlib.sha256(DEMO_MODEL.read_bytes()).hexdigest()


def tampered_model() -> bytes:
    """The demo model with one more ModelProto.doc_string (field 6): same weights, another SHA-256."""
    return DEMO_MODEL.read_bytes() + b"\x32\x08tampered"


NEW_SHA = hashlib.sha256(tampered_model()).hexdigest()


def main_quiet(*args) -> tuple[int, str, str]:
    from sitsd.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A vendor (authority key, approvals of the original and of the new model), a first deployment with
    verify-on-boot, the PLC simulator trusting its AK, and sitsd started on it."""
    tmp = tmp_path_factory.mktemp("rollback")
    model = tmp / "release" / "rolling_mill.onnx"  # the same name: the name is part of the measurement
    model.parent.mkdir()
    auth = tmp / "authority"
    assert main_quiet("policy", "keygen", "--output", auth)[0] == 0
    approvals = {}
    for which, data in (("original", DEMO_MODEL.read_bytes()), ("new", tampered_model())):
        model.write_bytes(data)
        approvals[which] = tmp / f"approval-{which}.json"
        rc, out, err = main_quiet("policy", "approve", "--authority-key", auth / "authority.key.pem", "--config",
                                  EXAMPLE_CONFIG, "--output", approvals[which], "--set", f"model.artifact={model}")
        assert rc == 0, out + err
    model.write_bytes(DEMO_MODEL.read_bytes())
    sw = Swtpm().start()
    ns = SimpleNamespace(tmp=tmp, model=model, pub=auth / "authority.pub.pem", approvals=approvals, tcti=sw.tcti,
                         audit=tmp / "audit", sock=tmp / "c.sock", log=tmp / "sitsd.log")
    plc = proc = None
    try:
        rc, out, err = deploy(ns, EXAMPLE_CONFIG, "original")
        assert rc == 0, out + err
        ak = tmp / "ak.pem"
        ak.write_text(json.loads((ns.audit / "deployment.json").read_text())["ak_public_pem"])
        udp_url = multicast_group_url()
        plc = subprocess.Popen([sys.executable, "-m", "sitsd.plcsim", "--udp-url", udp_url, "--port", "0",
                                "--trust-device-key", str(ak), "--control-stdin", "--model-sha256", ORIGINAL_SHA],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
                               env=dict(os.environ, PYTHONUNBUFFERED="1"))
        endpoint = json.loads(plc.stdout.readline())["endpoint"]
        proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                           attestation__tcti=sw.tcti, plc__security="none", model__artifact=model,
                                           attestation__approval=approvals["original"],
                                           attestation__authority_key=ns.pub, audit__directory=ns.audit,
                                           control__socket=ns.sock),
                                stderr=open(ns.log, "wb"), cwd=REPO)
        wait_ready(proc, ns.log)
        ns.proc = proc
        ns.baseline = running(ns)
        assert ns.baseline["model_sha256"] == ORIGINAL_SHA
        yield ns
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if plc is not None:
            plc.stdin.close()
            try:
                plc.wait(10)
            except subprocess.TimeoutExpired:
                plc.kill()
        sw.stop()


def deploy(live, config, approval: str, *extra):
    return main_quiet("deploy", "--config", config, "--attestation-mode", "tpm2", "--verify-on-boot", "true",
                      "--approval", live.approvals[approval], "--authority-pub", live.pub, "--tcti", live.tcti,
                      "--set", f"audit.directory={live.audit}", "--set", f"control.socket={live.sock}",
                      "--set", f"model.artifact={live.model}", *extra)


def ctl(live, command, **params) -> dict:
    from sitsd.control import request

    return request(live.sock, command, timeout_s=120.0, **params)


def running(live) -> dict:
    """What the daemon runs: its model (status), its config file and live rules (deploy_status)."""
    st = ctl(live, "deploy_status")
    return {"model_sha256": ctl(live, "status")["model_sha256"],
            "current_model": ctl(live, "versions")["current"]["model_sha256"],
            "config_path": st["config_path"], "live_config_sha256": st["live_config_sha256"]}


def events(live) -> list[tuple[str, str, str]]:
    return [(e.kind, e.name, e.sha256) for e in read_log(live.audit / "measurements.jsonl")[1]]


def write_config(live, name: str, change) -> Path:
    data = example_config_data()
    change(data)
    path = live.tmp / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def restore(live):
    """Each test starts from and leaves: the original model bytes at the release path, the original staged
    record, and the daemon on its original model and config with nothing pending."""
    record = (live.audit / "deployment.json").read_bytes()
    assert running(live) == live.baseline and ctl(live, "deploy_status")["pending"] is None
    yield
    live.model.write_bytes(DEMO_MODEL.read_bytes())
    (live.audit / "deployment.json").write_bytes(record)
    assert live.proc.poll() is None, live.log.read_text()[-3000:]


def one_fail_line(out: str) -> str:
    assert len(out.splitlines()) == 1 and out.startswith("Verified: [FAIL] "), out
    return out.strip()


def test_a_failure_after_the_model_swap_inside_the_daemon_undoes_the_swap(live, restore):
    """New model plus actuator limits the model is not proven inside: the daemon swaps the model, then its live
    reload refuses the config; the swap is rolled back (measured), the answer says so, the old model runs."""
    tight = write_config(live, "tight.yaml", lambda d: d["safety"]["actuators"][0].update(min=-0.01, max=0.01))
    live.model.write_bytes(tampered_model())
    staged = (live.audit / "deployment.json").read_bytes()
    n = len(events(live))
    rc, out, err = deploy(live, tight, "new")
    line = one_fail_line(out)
    assert rc == 1
    assert "the running sitsd refused the deployment" in line, line
    assert "the running configuration was restored (rolled back: model)" in line, line
    assert "not proven inside the new config's limits" in line, line  # the reload's refusal, not another failure
    assert running(live) == live.baseline
    assert events(live)[n:] == [("model", "rolling_mill.onnx", NEW_SHA), ("rollback:model", "rolling_mill.onnx",
                                                                            ORIGINAL_SHA)]
    assert (live.audit / "deployment.json").read_bytes() == staged
    assert "deploy undone: rolled back" in live.log.read_text()

    # after the undo, deploying what runs verifies (the rollback event says which model runs)
    live.model.write_bytes(DEMO_MODEL.read_bytes())
    rc, out, err = deploy(live, EXAMPLE_CONFIG, "original")
    assert rc == 0 and out == (f"Verified: [OK] DeviceID=TPM2:0x81000001 | ModelSHA256={ORIGINAL_SHA} | "
                               "PolicySig=valid\n"), out + err
    assert "applied: nothing, already running" in err
    assert running(live) == live.baseline


def test_b_a_quote_the_deployer_cannot_verify_undoes_the_load(live, restore):
    """The daemon loads a new model and a new config (a live change) and quotes; the quote is not by the AK of
    the previous deployment (its record names another key), so deploy fails, and the daemon undoes both."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from attestation.tpm.policy import public_pem

    changed = write_config(live, "b.yaml", lambda d: d["timing"].update(max_transit_ms=6))
    live.model.write_bytes(tampered_model())
    record = json.loads((live.audit / "deployment.json").read_text())
    record["ak_public_pem"] = public_pem(ec.generate_private_key(ec.SECP256R1()).public_key()).decode()
    (live.audit / "deployment.json").write_text(json.dumps(record))
    staged = (live.audit / "deployment.json").read_bytes()
    config_before = [e for e in events(live) if e[0] in ("config", "rollback:config")][-1]
    n = len(events(live))
    rc, out, err = deploy(live, changed, "new")
    line = one_fail_line(out)
    assert rc == 1
    assert line.startswith("Verified: [FAIL] quote: "), line
    assert line.endswith("; the running configuration was restored"), line
    assert running(live) == live.baseline  # model, config path and live rules as before
    assert [e[0] for e in events(live)[n:]] == ["model", "config", "approval", "rollback:config", "rollback:model"]
    assert events(live)[-2] == ("rollback:config", *config_before[1:])
    assert events(live)[-1] == ("rollback:model", "rolling_mill.onnx", ORIGINAL_SHA)
    assert (live.audit / "deployment.json").read_bytes() == staged  # nothing staged
    assert ctl(live, "deploy_status")["pending"] is None


def test_b2_a_deployer_failing_after_the_load_has_it_undone(live, restore):
    """The CLI's verification itself fails (here: a defect in it): the daemon is asked to undo the load."""
    import attestation.deploy

    live.model.write_bytes(tampered_model())
    n = len(events(live))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attestation.deploy, "verify_record", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
        rc, out, err = deploy(live, EXAMPLE_CONFIG, "new")
    assert rc == 1 and one_fail_line(out).startswith("Verified: [FAIL] internal error (RuntimeError('boom'))")
    assert "sitsctl deploy: the running configuration was restored" in err
    assert running(live) == live.baseline
    assert [e[0] for e in events(live)[n:]] == ["model", "approval", "rollback:model"]


def test_c_a_load_never_confirmed_is_undone_after_its_timeout(live, restore):
    """deploy_verified with no commit (a deployer that crashed): the daemon undoes model and config itself."""
    from attestation.deploy import split_events

    from sitsd.config import load_config
    from sitsd.deploy import config_events
    from sitsd.errors import ControlError

    changed = write_config(live, "c.yaml", lambda d: d["timing"].update(max_transit_ms=7))
    live.model.write_bytes(tampered_model())
    approved, _ = split_events(config_events(load_config(changed, {"model.artifact": str(live.model)}), changed))
    approval = live.approvals["new"]
    n = len(events(live))
    answer = ctl(live, "deploy_verified", config=str(changed), nonce=os.urandom(32).hex(),
                 approved_events=[list(e) for e in approved], approval_name=approval.name,
                 approval_sha256=hashlib.sha256(approval.read_bytes()).hexdigest(), confirm_timeout_s=2.0)
    loaded_at = time.monotonic()
    assert answer["applied"] == ["model", "config"] and answer["confirm_timeout_s"] == 2.0 and answer["token"]
    now = running(live)
    assert now["model_sha256"] == NEW_SHA and now["config_path"] == str(changed)
    assert now["live_config_sha256"] != live.baseline["live_config_sha256"]
    assert ctl(live, "deploy_status")["pending"]["applied"] == ["model", "config"]
    with pytest.raises(ControlError, match="busy: a deployment awaits its confirmation"):
        ctl(live, "deploy_verified", config=str(changed), nonce=os.urandom(32).hex(),
            approved_events=[list(e) for e in approved], approval_name=approval.name, approval_sha256="00" * 32)
    with pytest.raises(ControlError, match="no deployment awaits confirmation with this token"):
        ctl(live, "deploy_commit", token="0" * 32)
    while running(live) != live.baseline:
        assert time.monotonic() - loaded_at < 20, f"not undone: {running(live)}"
        time.sleep(0.1)
    assert time.monotonic() - loaded_at > 1.0  # by its timeout, not at once
    # what runs is back; the undo may still be finishing its bookkeeping (its events, its record): a commit then is
    # refused as "being undone", and once done as "already undone"
    while True:
        with pytest.raises(ControlError) as refused:
            ctl(live, "deploy_commit", token=answer["token"])
        if "being undone" not in str(refused.value) or time.monotonic() - loaded_at > 30:
            break
        time.sleep(0.1)
    assert re.search(r"already undone \(not confirmed within 2 s\)", str(refused.value)), refused.value
    late = ctl(live, "deploy_abort", token=answer["token"])
    assert late["already"] and late["restored"] == ["config", "model"] and not late["not_restored"]
    assert [e[0] for e in events(live)[n:]] == ["model", "config", "approval", "rollback:config", "rollback:model"]
    assert "deployment not confirmed by the deployer; undoing it" in live.log.read_text()


def test_d_a_confirmed_load_stays_past_the_timeout(live, restore, monkeypatch):
    """The OK path commits: the load outlives its (shortened) confirmation timeout; then back to the original."""
    import sitsd.cli_deploy

    monkeypatch.setattr(sitsd.cli_deploy, "CONFIRM_TIMEOUT_S", 1.0)
    live.model.write_bytes(tampered_model())
    rc, out, err = deploy(live, EXAMPLE_CONFIG, "new")
    assert rc == 0 and out == f"Verified: [OK] DeviceID=TPM2:0x81000001 | ModelSHA256={NEW_SHA} | PolicySig=valid\n", \
        out + err
    assert "applied: model" in err
    time.sleep(2.0)
    assert running(live)["model_sha256"] == NEW_SHA and ctl(live, "deploy_status")["pending"] is None
    assert "deployment confirmed by the deployer" in live.log.read_text()
    live.model.write_bytes(DEMO_MODEL.read_bytes())
    rc, out, err = deploy(live, EXAMPLE_CONFIG, "original")
    assert rc == 0 and "applied: model" in err, out + err
    assert running(live) == live.baseline
