"""Hot swaps that survive a restart (sitsd/persist.py, docs/hotswap.md) against real sitsd processes and the
PLC simulator: a module and the model updated through `sitsctl update` are persisted once they pass their
health watch and run again after `kill -9`; the measurement log says what loaded; a live config reload
re-bases them; a rollback to the config's versions (before or after the restart) removes the state file;
a persisted file whose hash changed falls back to the config's versions with an alert; a changed config
discards the persisted set."""
import json
import shutil
import signal
import subprocess
import sys
import time

import yaml

from ..conftest import DEMO_MODEL, REPO, example_config_data, sitsd_args, wait_ready
from .test_hotswap import module_versions

MODULES = REPO / "wasm_modules"


def changed_model(path):
    """The demo model with another doc string: the same function (its bounds prove), another SHA-256."""
    import onnx

    model = onnx.load(DEMO_MODEL)
    model.doc_string = "rolling mill model, release 2"
    onnx.save(model, path)
    return path


def sha256(path) -> str:
    import hashlib

    from sitsd.wasm import read_source

    return hashlib.sha256(read_source(path) if path.suffix in (".wat", ".wasm") else path.read_bytes()).hexdigest()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Line:
    """A config of its own (the example's, with its modules copied next to it) and sitsd started, killed and
    restarted on it. Each start gets a fresh PLC simulator on the same endpoint and multicast group (the
    software signer's key is new at each start, and the simulator trusts the first key it reads), so the
    config and its overrides stay the same across restarts."""

    def __init__(self, tmp_path, plcsim):
        self.tmp = tmp_path
        self.audit, self.control = tmp_path / "audit", tmp_path / "c.sock"
        self.plcsim, self.sim, self.port = plcsim, None, free_port()
        endpoint, udp_url, self.sim = plcsim(self.audit / "signer.pub.pem", port=self.port,
                                             extra_args=("--rate", "500"))
        self.udp_url = udp_url
        live = tmp_path / "modules"
        live.mkdir()
        for stem in ("pre_filter", "post_command"):
            for suffix in (".wat", ".golden.json"):
                shutil.copy(MODULES / f"{stem}{suffix}", live / f"{stem}{suffix}")
        self.modules = {"pre_filter": live / "pre_filter.wat", "post_command": live / "post_command.wat"}
        data = example_config_data()
        data["model"]["artifact"] = str(DEMO_MODEL)
        for m in data["modules"]:
            m["path"] = str(self.modules[m["name"]])
        data["plc"].update(endpoint=endpoint, security="none", pki_dir=str(tmp_path / "pki"))
        data["transport"]["url"] = udp_url
        data["attestation"] = {"mode": "software"}
        data["audit"]["directory"] = str(self.audit)
        data["control"]["socket"] = str(self.control)
        self.config = tmp_path / "line.yaml"
        self.config.write_text(yaml.safe_dump(data, sort_keys=False))
        self.env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
        self.proc = None
        self.runs = 0
        self.state = self.audit / "active-stages.json"

    def start(self):
        self.runs += 1
        if self.runs > 1:
            self.sim.stdin.close()
            self.sim.wait(20)
            _, _, self.sim = self.plcsim(self.audit / "signer.pub.pem", port=self.port, udp_url=self.udp_url,
                                         extra_args=("--rate", "500"))
        self.log = self.tmp / f"sitsd-{self.runs}.log"
        self.proc = subprocess.Popen(sitsd_args(self.config), stderr=open(self.log, "wb"), cwd=REPO, env=self.env)
        wait_ready(self.proc, self.log)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(30) == 0

    def request(self, cmd, **params):
        from sitsd.control import request

        return request(self.control, cmd, timeout_s=120, **params)

    def sitsctl(self, *args):
        r = subprocess.run([sys.executable, "-m", "sitsd.cli", *map(str, args), "--socket", str(self.control)],
                           capture_output=True, text=True, timeout=120, cwd=REPO, env=self.env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def persisted(self):
        return json.loads(self.state.read_text()) if self.state.exists() else None

    def wait_for(self, what, predicate, timeout_s=120.0):
        """Until the state file satisfies `predicate` (the health watch is frames, not seconds: poll)."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.persisted()):
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            assert time.monotonic() < deadline, f"{what}: state file {self.persisted()}\n{self.log.read_text()[-2000:]}"
            time.sleep(0.1)
        return self.persisted()

    def events(self):
        from attestation.measurement import read_log, replay_file

        _, events = read_log(self.audit / "measurements.jsonl")
        assert replay_file(self.audit / "measurements.jsonl").hex() == events[-1].pcr_after
        return [(e.kind, e.name, e.sha256) for e in events]

    def log_lines(self, message):
        return [json.loads(line) for line in self.log.read_text().splitlines() if f'"{message}' in line]


def module_sha(entries, name):
    return next((m["sha256"] for m in entries["modules"] if m["name"] == name), None)


def test_updates_survive_kill_9_and_a_rollback_to_the_config_removes_them(plcsim, tmp_path):
    line = Line(tmp_path, plcsim)
    pre_v2 = module_versions(tmp_path / "pre", "pre_filter", versions=(2,))[0]
    post_v2 = module_versions(tmp_path / "post", "post_command", versions=(2,))[0]
    (tmp_path / "release2").mkdir()
    model_v2 = changed_model(tmp_path / "release2" / "rolling_mill_v2.onnx")
    config_model_sha, model_v2_sha = sha256(DEMO_MODEL), sha256(model_v2)
    assert config_model_sha != model_v2_sha
    try:
        line.start()
        status = line.request("status")
        assert status["stages_source"] == "config" and status["persistence"]["loaded_at_start"] == "config"
        assert status["persistence"]["enabled"] and status["persistence"]["inactive_reason"] is None

        # an update that passed its watch is persisted; the rollback to the config's set removes the file
        line.sitsctl("update", "--module", post_v2)
        line.wait_for("post_command v2 persisted", lambda s: s and module_sha(s, "post_command") == sha256(post_v2))
        assert line.request("versions")["stages_source"] == "persisted"
        out = line.sitsctl("rollback")
        assert "rolled back set" in out
        assert not line.state.exists()
        versions = line.request("versions")
        assert versions["stages_source"] == "config" and versions["persistence"]["restart_loads"] == "config"

        # a module and the model: persisted once the watch of the last one passed
        line.sitsctl("update", "--module", pre_v2)
        line.sitsctl("update", "--model", model_v2)
        state = line.wait_for("pre_filter v2 and model v2 persisted", lambda s: s and s["model"]["sha256"] ==
                              model_v2_sha and module_sha(s, "pre_filter") == sha256(pre_v2))
        assert module_sha(state, "post_command") == sha256(line.modules["post_command"])
        assert state["config_sha256"] == sha256(line.config) and state["model"]["path"] == str(model_v2)
        line.kill9()  # no clean stop: what runs after the restart comes from the state file alone

        line.start()
        status = line.request("status")
        assert status["stages_source"] == "persisted", status
        assert status["persistence"]["loaded_at_start"] == "persisted"
        assert status["model_sha256"] == model_v2_sha and status["model"] == str(model_v2)
        assert status["stages"]["pre"]["version"] == 2 and status["stages"]["pre"]["sha256"] == sha256(pre_v2)
        assert status["stages"]["post"]["version"] == 1
        versions = line.request("versions")
        assert versions["current"]["label"] == "startup (persisted updates)"
        assert versions["stages_source"] == "persisted" and versions["persistence"]["restart_loads"] == "persisted"
        assert "generation 0 (startup (persisted updates))" in line.sitsctl("versions")
        assert "stages  from persisted; a restart loads the persisted updates" in line.sitsctl("status")
        assert line.log_lines("starting with persisted updates")
        # the measurement log names what loaded, then where it came from
        events = line.events()
        assert events[:3] == [("model", "rolling_mill_v2.onnx", model_v2_sha),
                              ("module:pre", "pre_filter", sha256(pre_v2)),
                              ("module:post", "post_command", sha256(line.modules["post_command"]))]
        assert events[3] == ("config", "line.yaml", sha256(line.config))
        assert events[4][:2] == ("persisted", "active-stages.json") and events[4][2] == sha256(line.state)
        # frames run on the persisted set
        deadline = time.monotonic() + 60
        while line.request("versions")["current"]["frames"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)

        # a live config reload keeps the updates running: the persisted set is re-based on the new bytes
        line.config.write_text(line.config.read_text().replace("max_consecutive_drops: 5", "max_consecutive_drops: 6"))
        assert "timing" in line.sitsctl("update", "--config", line.config)
        line.wait_for("re-based on the edited config", lambda s: s and s["config_sha256"] == sha256(line.config))

        # after the restart the config's versions are loaded as the rollback target: `sitsctl rollback`
        # returns to them, and with the running set equal to the config's the state file goes
        assert "rolled back set" in line.sitsctl("rollback")
        assert not line.state.exists()
        status = line.request("status")
        assert status["stages_source"] == "config" and status["model_sha256"] == config_model_sha
        assert status["stages"]["pre"]["version"] == 1 and status["model"] == str(DEMO_MODEL)
        line.stop()

        line.start()
        status = line.request("status")
        assert status["stages_source"] == "config" and status["persistence"]["loaded_at_start"] == "config"
        assert status["model_sha256"] == config_model_sha and status["stages"]["pre"]["version"] == 1
        assert [e[0] for e in line.events()] == ["model", "module:pre", "module:post", "config"]
    finally:
        line.stop()


def test_a_changed_persisted_file_falls_back_with_an_alert_and_a_changed_config_wins(plcsim, tmp_path):
    line = Line(tmp_path, plcsim)
    pre_v2 = module_versions(tmp_path / "pre", "pre_filter", versions=(2,))[0]
    try:
        line.start()
        line.sitsctl("update", "--module", pre_v2)
        line.wait_for("pre_filter v2 persisted", lambda s: s and module_sha(s, "pre_filter") == sha256(pre_v2))
        line.kill9()

        # the persisted module changed on disk: the config's versions start, an error and an alert say why
        # (a comment would not do: the hash is the wasm's, after converting the .wat)
        src = pre_v2.read_text()
        pre_v2.write_text(src.replace("(global $version i32 (i32.const 2))", "(global $version i32 (i32.const 7))"))
        assert pre_v2.read_text() != src
        line.start()
        status = line.request("status")
        assert status["stages_source"] == "config" and status["persistence"]["loaded_at_start"] == "config"
        assert status["stages"]["pre"]["sha256"] == sha256(line.modules["pre_filter"])
        errors = line.log_lines("persisted updates not loaded")
        assert errors and errors[0]["file"] == str(pre_v2) and "changed after the update was persisted" in \
            errors[0]["reason"]
        deadline = time.monotonic() + 30  # the alert is counted by the housekeeping task
        while "persisted_update" not in line.request("status")["alerts"]:
            assert time.monotonic() < deadline, line.request("status")["alerts"]
            time.sleep(0.1)
        alerts = [a for a in line.log_lines("alert") if a.get("kind") == "persisted_update"]
        assert len(alerts) == 1 and str(pre_v2) in alerts[0]["reason"], alerts
        assert not line.state.exists() and (line.audit / "active-stages.rejected.json").exists()
        assert [e[0] for e in line.events()] == ["model", "module:pre", "module:post", "config"]

        # persisted again, then the config changes before the next start: the config wins, the file goes
        pre_v3 = module_versions(tmp_path / "pre3", "pre_filter", versions=(3,))[0]
        line.sitsctl("update", "--module", pre_v3)
        line.wait_for("pre_filter v3 persisted", lambda s: s and module_sha(s, "pre_filter") == sha256(pre_v3))
        line.stop()
        edited = line.config.read_text().replace("max_consecutive_drops: 5", "max_consecutive_drops: 6")
        assert edited != line.config.read_text()
        line.config.write_text(edited)
        line.start()
        status = line.request("status")
        assert status["stages_source"] == "config" and status["stages"]["pre"]["version"] == 1
        discarded = line.log_lines("persisted updates")
        assert any("config file changed" in d.get("reason", "") for d in discarded), discarded
        assert not line.state.exists()
        assert "persisted_update" not in status["alerts"]
    finally:
        line.stop()
