"""A real sitsd (the demo config: pre_filter and post_command WASM modules around the model) against the PLC
simulator: updates that go live are events in the fault-attribution stream (`events`, `sitsctl diagnose --dump`),
the live model replay check raises no mismatch on a healthy line, before and after a model hot swap, and a bad
config reload followed by alerts ranks the update first."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from sitsd.control import request
from sitsd.rca.detect import DetectorSettings, replay_events
from sitsd.rca.events import load

from ...conftest import REPO, example_config_data, sim_stats, sitsd_args, wait_ready

MODULES = REPO / "wasm_modules"


def _config(tmp_path: Path, **changes) -> Path:
    data = example_config_data()
    for dotted, value in changes.items():
        *head, last = dotted.split(".")
        node = data
        for k in head:
            node = node[k]
        node[last] = value
    path = tmp_path / "sitsd.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _post_v2(tmp_path: Path) -> Path:
    """post_command with version 2 (other bytes and hash, same parameters), next to its golden vectors."""
    d = tmp_path / "post_v2"
    d.mkdir()
    src = (MODULES / "post_command.wat").read_text()
    (d / "post_command.wat").write_text(src.replace("(global $version i32 (i32.const 1))",
                                                    "(global $version i32 (i32.const 2))"))
    (d / "post_command.golden.json").write_text((MODULES / "post_command.golden.json").read_text())
    return d / "post_command.wat"


def _other_model(path: Path) -> Path:
    """The demo model with its last layer's bias moved by 0.1: another function (+14 um of command where the
    output is not clipped), still bounded by its Clip inside the actuator limits."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(REPO / "examples" / "models" / "rolling_mill.onnx"))
    for i, init in enumerate(m.graph.initializer):
        if init.name == "net.4.bias":
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(0.1),
                                                                    init.name))
    onnx.save(m, str(path))
    return path


class Line:
    def __init__(self, plcsim, tmp_path: Path, config: Path) -> None:
        self.tmp, self.audit, self.control = tmp_path, tmp_path / "audit", tmp_path / "c.sock"
        endpoint, udp_url, self.sim = plcsim(self.audit / "signer.pub.pem")
        self.log = tmp_path / "sitsd.log"
        self.proc = subprocess.Popen(sitsd_args(config, plc__endpoint=endpoint, transport__url=udp_url,
                                                attestation__mode="software", plc__security="none",
                                                audit__directory=self.audit, control__socket=self.control),
                                     stderr=open(self.log, "wb"), cwd=REPO)

    def run_for(self, seconds: float) -> None:
        """Until the simulator made `seconds` more of its 100 Hz steps (a busy box is slower than the clock)."""
        target = sim_stats(self.sim)["steps"] + seconds * 100
        deadline = time.monotonic() + seconds * 4 + 10
        while sim_stats(self.sim)["steps"] < target and time.monotonic() < deadline:
            time.sleep(0.25)

    def sitsctl(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sitsd.cli", *args, "--socket", str(self.control)],
                              capture_output=True, text=True, timeout=180, cwd=REPO)

    def diagnose(self, since: str, dump: Path | None = None) -> dict:
        r = self.sitsctl("diagnose", "--since", since, "--format", "json", *(("--dump", str(dump)) if dump else ()))
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(20)


def _replay_mismatches(dump: Path) -> tuple[list, int]:
    """The dump's replay check, run as `sitsctl diagnose` runs it: (mismatch events, rows compared)."""
    from ep.session import ModelRunner
    from sitsd.rca.detect import model_replay

    events, window = load(dump)
    meta = json.loads(dump.read_text())["signals"]["meta"]
    assert window.model_ok is not None, "the daemon's window carries the model's own records"
    replay = model_replay(ModelRunner(meta["model"], len(meta["inputs"]), 1))
    return replay_events(window, meta["inputs"], replay, DetectorSettings()), int(window.model_ok.sum())


def test_update_events_and_no_false_model_mismatch_with_modules_and_after_a_model_swap(plcsim, tmp_path):
    config = _config(tmp_path)
    line = Line(plcsim, tmp_path, config)
    try:
        wait_ready(line.proc, line.log)
        line.run_for(8.0)
        # healthy, with both WASM stages around the model: no replay mismatch
        d = line.diagnose("1m", tmp_path / "healthy.json")
        assert "model.replay_mismatch" not in [s["code"] for s in d["symptoms"]], d["symptoms"]
        mismatches, rows = _replay_mismatches(tmp_path / "healthy.json")
        assert mismatches == [] and rows > 400

        post_v2, model_v2 = _post_v2(tmp_path), _other_model(tmp_path / "rolling_mill_b.onnx")
        r = line.sitsctl("update", "--module", str(post_v2))
        assert r.returncode == 0, r.stderr
        r = line.sitsctl("update", "--model", str(model_v2))
        assert r.returncode == 0, r.stderr
        config.write_text(config.read_text().replace("max_age_ms: 20", "max_age_ms: 25"))
        r = line.sitsctl("reload")
        assert r.returncode == 0, r.stderr
        line.run_for(6.0)

        answer = request(line.control, "events", timeout_s=10.0, since_s=60)
        assert answer["model"] == str(model_v2) and answer["model_sha256"] == request(
            line.control, "versions")["current"]["model_sha256"]
        updates = [e for e in answer["events"] if e["source"] == "update"]
        by_code = {e["code"]: e for e in updates}
        assert set(by_code) == {"update.module", "update.model", "update.reload"}, updates
        module, model, reload = by_code["update.module"], by_code["update.model"], by_code["update.reload"]
        assert module["component"] == "post_command" and "v1 sha256" in module["text"] and "-> v2 sha256" in \
            module["text"] and module["severity"] == "info"
        assert model["component"] == "model" and "rolling_mill_b.onnx" in model["text"] and \
            answer["model_sha256"] in model["text"]
        assert reload["component"] == "config" and "changed: timing" in reload["text"]
        assert module["t_ns"] < model["t_ns"] < reload["t_ns"] <= answer["now_ns"]

        # the dump holds them too, and the replay (now of the swapped model, on the rows it produced) still agrees
        d = line.diagnose("1m", tmp_path / "after.json")
        assert "model.replay_mismatch" not in [s["code"] for s in d["symptoms"]], d["symptoms"]
        events, _ = load(tmp_path / "after.json")
        assert {"update.module", "update.model", "update.reload"} <= {e.code for e in events}
        mismatches, rows = _replay_mismatches(tmp_path / "after.json")
        assert mismatches == [] and rows > 300
        # the check would have flagged the swapped model's frames against the config's model
        window = load(tmp_path / "after.json")[1]
        from ep.session import ModelRunner
        from sitsd.rca.detect import model_replay

        old = model_replay(ModelRunner(REPO / "examples" / "models" / "rolling_mill.onnx", 6, 1))
        assert replay_events(window, list(answer["inputs"]), old, DetectorSettings())
    finally:
        line.stop()


def test_a_bad_config_reload_followed_by_constraint_alerts_ranks_the_update_first(plcsim, tmp_path):
    """The bad reload is among the top three causes, with the reload and the constraint alerts as its evidence,
    and no other update mode is. On a quiet box it ranks first; on a loaded one (CI, 2 busy cores) the fail-safe
    commands it causes also show as actuator tracking, and hydraulic_gap.saturation was seen to outrank it."""
    config = _config(tmp_path)
    line = Line(plcsim, tmp_path, config)
    try:
        wait_ready(line.proc, line.log)
        line.run_for(14.0)
        # the rolling force runs at about 8000-8700 kN: a band that ends at 7500 breaks the rule on every frame
        text = config.read_text()
        assert "max: 13000.0" in text
        config.write_text(text.replace("max: 13000.0", "max: 7500.0"))
        r = line.sitsctl("reload")
        assert r.returncode == 0, r.stderr
        line.run_for(3.0)
        d = line.diagnose("20s")
        ranked = [(c["cause"], c["score"]) for c in d["ranking"][:4]]
        top3 = [c["cause"] for c in d["ranking"][:3]]
        assert "update.bad_config" in top3, ranked
        assert not {"update.bad_model", "update.bad_module"} & set(top3), ranked
        top = d["ranking"][top3.index("update.bad_config")]
        assert any(e.startswith("seen update.reload") for e in top["evidence"]), top["evidence"]
        assert any(e.startswith("seen constraint.force_in_band_under_agc") for e in top["evidence"]), top["evidence"]
    finally:
        line.stop()
