"""sitsd with model.kind streaming against the PLC simulator: commands flow and none is rejected, the
stream's state survives a SIGTERM restart (resume from its snapshot) and a kill -9 (snapshot + journal
replay), and the KV state in RAM stays the same size while the stream grows."""
import json
import signal
import subprocess
import time

import pytest

from sitsd.config import load_config
from sitsd.control import request
from sitsd.errors import ControlError
from sitsd.model import model_sha256

from ..conftest import DEMO_MODEL, REPO, sitsd_args, wait_ready

STREAMING_CONFIG = REPO / "examples" / "rolling-mill-streaming.yaml"
# a small window and warm arena so a few seconds at 100 Hz slide the window and reach the cold file
SETS = {"model__streaming__window": 32, "model__streaming__page_tokens": 8, "model__streaming__warm_pages": 2,
        "attestation__mode": "software", "plc__security": "none"}


def _log_events(log, event: str) -> list[dict]:
    out = []
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        if rec.get("event") == event:
            out.append(rec)
    return out


def _wait(control, predicate, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    status = request(control, "status")
    while not predicate(status):
        assert time.monotonic() < deadline, f"condition not reached: {json.dumps(status)[:2000]}"
        time.sleep(0.2)
        status = request(control, "status")
    return status


def _plc_stats(sim) -> dict:
    sim.stdin.write("stats\n")
    sim.stdin.flush()
    while True:
        line = sim.stdout.readline()
        assert line, "the PLC simulator exited"
        if line.startswith('{"stats"'):
            return json.loads(line)["stats"]


def test_streaming_model_runs_resumes_after_sigterm_and_recovers_after_kill(plcsim, tmp_path):
    audit, control, state = tmp_path / "audit", tmp_path / "c.sock", tmp_path / "audit" / "streams"
    sha = model_sha256(load_config(STREAMING_CONFIG, {"model.streaming.window": 32}))
    runs, sims = [], []

    def start(n: int):
        for old in sims:  # the previous PLC trusted the previous run's key (software keys are per start)
            if old.poll() is None:
                old.stdin.close()
                old.wait(10)
        endpoint, udp_url, sim = plcsim(audit / "signer.pub.pem", model_sha256=sha)  # a PLC that pins the model
        log = tmp_path / f"sitsd{n}.log"
        proc = subprocess.Popen(sitsd_args(STREAMING_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                           audit__directory=audit, control__socket=control, **SETS),
                                stderr=open(log, "wb"), cwd=REPO)
        runs.append(proc)
        sims.append(sim)
        wait_ready(proc, log)
        (started,) = _log_events(log, "streaming model")
        return proc, sim, log, started

    try:
        # 1. a fresh stream: commands flow, the window slides, pages reach the cold file, RAM stays put
        proc, sim, log, started = start(1)
        assert started["position"] == 0 and started["replayed_frames"] == 0
        assert started["state_dir"].startswith(str(state))  # <audit.directory>/streams/<model and KV settings>
        first = _wait(control, lambda s: s["stream"]["position"] > 100 and s["counters"]["commands"] > 100)
        assert first["model"] == "streaming" and first["model_sha256"] == sha
        assert first["stream"]["window_tokens"] <= 32 + 8  # the window slid: capacity = window + one page
        later = _wait(control, lambda s: s["stream"]["position"] > first["stream"]["position"] + 150)
        for key in ("kv_ram_bytes", "hot_bytes", "warm_bytes", "cold_index_bytes"):
            assert later["stream"][key] == first["stream"][key], key  # allocated once, flat in the length
        assert later["stream"]["cold_file_bytes"] > 0
        stats = _plc_stats(sim)
        assert stats["rejected"] == 0 and stats["accepted"] > 100
        # 2. SIGTERM: a clean stop checkpoints; the next start resumes from the snapshot, nothing to replay
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        last = later["stream"]["position"]
        proc, sim, log, resumed = start(2)
        assert resumed["position"] >= last and resumed["replayed_frames"] == 0
        status = _wait(control, lambda s: s["stream"]["position"] > resumed["position"] + 100)
        assert status["counters"]["commands"] > 100
        assert _plc_stats(sim)["rejected"] == 0
        with pytest.raises(ControlError, match="not supported for model.kind streaming"):
            request(control, "update", timeout_s=30, model=str(DEMO_MODEL))  # the stream's KV belongs to its weights
        assert request(control, "status")["model_sha256"] == sha
        # 3. kill -9 between checkpoints: the next start loads the snapshot and replays the journal
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        killed_at = status["stream"]["position"]
        proc, sim, log, recovered = start(3)
        assert recovered["position"] >= killed_at and recovered["replayed_frames"] >= killed_at - resumed["position"]
        status = _wait(control, lambda s: s["stream"]["position"] > recovered["position"] + 100)
        assert status["stream"]["recovered"]["replayed_frames"] == recovered["replayed_frames"]
        assert _plc_stats(sim)["rejected"] == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        for p in runs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def test_streaming_config_refuses_proofs_and_an_artifact():
    from sitsd.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(STREAMING_CONFIG, {"proof.policy": "every"})
    assert "proof.policy" in str(err.value) and "no circuit" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(STREAMING_CONFIG, {"model.artifact": "models/rolling_mill.onnx"})
    assert "drop model.artifact" in str(err.value)


def test_check_states_the_head_bound_and_that_attention_is_not_analysed():
    from sitsd.check import run_check

    result = run_check(load_config(STREAMING_CONFIG))
    assert result["bounds_proven"] is True
    lo, hi = result["output_bounds"]["roll_gap_correction"]
    assert -0.15 <= lo < hi <= 0.15
    assert "attention layers are NOT analysed" in result["report"]


def test_demo_runs_the_streaming_config():
    from sitsd.demo import human_summary, run_demo

    r = run_demo(seconds=3, progress=None, force_software=True, security="none", config_path=STREAMING_CONFIG)
    assert r["model_kind"] == "streaming" and r["proofs"] is None  # proofs are skipped: no circuit
    assert r["commands"] > 100 and r["rejected_by_plc"] == 0
    assert r["stream"]["position"] >= r["frames"] - r["dropped"] > 0
    assert "no control quality expected" in human_summary(r)


def test_daemon_model_from_a_compiled_streaming_artifact(tmp_path):
    """export-streaming -> sitsctl compile --kv-cache-policy tiered -> model.artifact: the daemon's runner takes
    its KV settings from the manifest, signs with the artifact SHA-256, and `check` reads the compiled head."""
    import sys

    import numpy as np
    import yaml

    from ep.compile import main as compile_main
    from sitsd.check import run_check
    from sitsd.model import build_model

    onnx_file = tmp_path / "stream.onnx"
    r = subprocess.run([sys.executable, "-m", "sitsd.model", "export-streaming", "--config", str(STREAMING_CONFIG),
                        "--output", str(onnx_file)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    cfg = load_config(STREAMING_CONFIG)
    lo = np.array([s.lower for s in cfg.signals if s.name in cfg.model.inputs])
    hi = np.array([s.upper for s in cfg.signals if s.name in cfg.model.inputs])
    np.save(tmp_path / "frames.npy", (lo + (hi - lo) * np.random.default_rng(0).random((64, 6))).astype(np.float32))
    assert compile_main([str(onnx_file), "--kv-cache-policy", "tiered", "--window", "24", "--page-tokens", "8",
                         "--calibration", str(tmp_path / "frames.npy"), "--output", str(tmp_path / "art"),
                         "--quiet"]) == 0
    data = yaml.safe_load(STREAMING_CONFIG.read_text())
    for m in data["modules"]:
        m["path"] = str(STREAMING_CONFIG.parent / m["path"])
    data["model"]["artifact"] = str(tmp_path / "art")
    data["audit"]["directory"] = str(tmp_path / "audit")
    (tmp_path / "both.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(Exception, match="carries its KV policy"):  # one place decides the KV settings
        load_config(tmp_path / "both.yaml")
    data["model"]["streaming"] = {"checkpoint_every": 0}
    (tmp_path / "art.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(tmp_path / "art.yaml")
    runner = build_model(cfg)
    try:
        assert runner.kv_policy["policy"] == "tiered" and runner.pool.config.window == 24
        assert runner.sha256.hex() == model_sha256(cfg) == runner.manifest.artifact_sha256
        for _ in range(40):
            runner.input[0] = (lo + hi) / 2
            out = float(runner.run()[0, 0])
            assert -0.15 <= out <= 0.15
    finally:
        runner.close()
    result = run_check(cfg)
    assert result["bounds_proven"] and "attention layers are NOT analysed" in result["report"]


def test_state_is_kept_per_model_and_kv_settings(tmp_path):
    """Same model and settings resume; another seed or window starts a fresh stream (never KV of other
    weights or another layout)."""
    from sitsd.model import build_model

    def run(tokens: int, **sets) -> int:
        cfg = load_config(STREAMING_CONFIG, {"audit.directory": str(tmp_path / "audit"), **sets})
        runner = build_model(cfg)
        start = runner.position
        for _ in range(tokens):
            runner.input[0] = 0.5
            runner.run()
        runner.close()
        return start

    assert run(20) == 0
    assert run(5) == 20
    assert run(5, **{"model.streaming.window": 64}) == 0
    assert run(5, **{"model.streaming.seed": 1}) == 0
    assert run(0) == 25


def test_stream_ids_for_every_publisher_id_type_fit_the_pool_and_are_stable():
    """(publisher_id << 16 | writer) as before for ids below 2**47; a string or wide id gets a stable 63-bit
    digest instead of a TypeError or an id the stream pool cannot hold."""
    from sitsd.model import stream_id

    def sid(**sets):
        return stream_id(load_config(STREAMING_CONFIG, sets))

    assert sid() == (7 << 16) | 1  # the example's uint16 id 7, writer 1: unchanged
    wide = sid(**{"transport.publisher_id_type": "uint64", "transport.publisher_id": str(2**63 + 5)})
    text = sid(**{"transport.publisher_id_type": "string", "transport.publisher_id": "line-7"})
    for v in (wide, text):
        assert 0 <= v < 2**63
    assert text == sid(**{"transport.publisher_id_type": "string", "transport.publisher_id": "line-7"})
    assert text != sid(**{"transport.publisher_id_type": "string", "transport.publisher_id": "line-8"})
