"""Hot swap on the real loop: 100 swaps under a 1 kHz loop lose no frame and count every frame once;
traps roll back automatically; a model whose bounds are not proven is refused; and end to end, a
running sitsd swaps its modules and its model through `sitsctl update` without losing a frame."""
import json
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from sitsd.config import load_config
from sitsd.hotswap import HotSwap, SwapRefused, model_bounds_check
from sitsd.wasm import WasmHost

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG, REPO, sitsd_args, wait_ready
from .test_loop import NOMINAL, build, frame
from .test_wasm import MISBEHAVE, MODULES, UNREACHABLE, build_without_rate_limits


def module_versions(tmp_path, stem: str, versions=(1, 2)) -> list:
    """Copies of a demo module that differ in their `version` export (so in their SHA-256), each with
    the module's golden vectors, in directories of their own (same file name: `update` matches by name)."""
    src = (MODULES / f"{stem}.wat").read_text()
    assert "(global $version i32 (i32.const 1))" in src
    paths = []
    for v in versions:
        d = tmp_path / f"v{v}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{stem}.wat").write_text(src.replace("(global $version i32 (i32.const 1))",
                                                   f"(global $version i32 (i32.const {v}))"))
        shutil.copy(MODULES / f"{stem}.golden.json", d / f"{stem}.golden.json")
        paths.append(d / f"{stem}.wat")
    return paths


@pytest.fixture
def host(tmp_path):
    h = WasmHost(tmp_path / "cache")
    yield h
    h.close()


def with_modules(loop, host):
    loop.stage_set.pre = host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6)
    loop.stage_set.post = host.load("post_command", "post", MODULES / "post_command.wat", 1, 1)
    return HotSwap(loop, host, n_inputs=6, n_outputs=1, alerts=loop.alerts)


def test_100_swaps_under_a_1khz_loop_lose_no_frame_and_count_each_frame_once(host, tmp_path):
    loop, sent, verifier = build()
    hs = with_modules(loop, host)
    pre_paths = module_versions(tmp_path / "pre", "pre_filter")
    post_paths = module_versions(tmp_path / "post", "post_command")
    generations = []
    stop = threading.Event()

    def run_loop():  # frames at about 1 kHz on their own thread, as the daemon's loop thread
        seq = 0
        while not stop.is_set():
            seq += 1
            loop.step(frame(seq))
            generations.append(loop.last_generation)
            loop.frame_boundary()
            time.sleep(0.001)

    t = threading.Thread(target=run_loop)
    t.start()
    try:
        records = []
        for i in range(100):
            paths = pre_paths if i % 2 == 0 else post_paths
            records.append(hs.update_module(paths[(i // 2) % 2]))
    finally:
        stop.set()
        t.join()
    n = len(generations)
    assert all(r["swap_frame"] >= 0 for r in records)  # each new set served frames
    assert loop.counters.frames == n and loop.counters.submitted == n and len(sent) == n  # no frame lost
    assert loop.counters.failsafe == 0 and loop.counters.module_traps == 0
    # each frame ran on exactly one set: the per-set counters are the per-frame log, grouped
    by_gen = {g: generations.count(g) for g in set(generations)}
    assert {s.generation: s.frames for s in hs.sets if s.frames} == by_gen
    assert sum(s.frames for s in hs.sets) == n
    assert generations == sorted(generations)  # swaps only move forward, at frame boundaries
    assert len(hs.sets) == 101
    # per-version module counters add up: each frame went through one pre and one post version
    versions = hs.versions()["modules"]
    assert sum(v["frames"] for v in versions.values() if v["stage"] == "pre") == n
    assert sum(v["frames"] for v in versions.values() if v["stage"] == "post") == n
    assert {v["version"] for v in versions.values()} == {1, 2}
    for out in sent[-3:]:
        assert not verifier.verify(out.envelope).command.failsafe


def test_trap_right_after_a_swap_rolls_back_automatically(host, tmp_path):
    loop, sent, verifier = build_without_rate_limits()
    hs = with_modules(loop, host)
    first = loop.stage_set
    shutil.copy(MISBEHAVE, tmp_path / "pre_filter.wat")
    shutil.copy(MISBEHAVE.with_name("misbehave.golden.json"), tmp_path / "pre_filter.golden.json")
    measured = []
    hs.measure = lambda kind, name, sha: measured.append((kind, name, sha))
    rec = hs.update_module(tmp_path / "pre_filter.wat")
    assert loop.stage_set is not first and hs.check_health() is None
    loop.step(frame(1))
    bad = list(NOMINAL)
    bad[0] = UNREACHABLE
    loop.step(frame(2, bad))
    assert verifier.verify(sent[-1].envelope).command.failsafe
    back = hs.check_health()
    assert back is not None and back["action"] == "rollback" and "trap" in back["reason"]
    assert loop.stage_set is first and loop.alerts[-1][1] == "rollback"
    # measured per component, so a live deployment's check sees what runs again (not one `rollback:set`)
    assert measured == [("module:pre", "pre_filter", rec["sha256"]),
                        ("rollback:module:pre", "pre_filter", first.pre.sha256)]
    loop.step(frame(3))
    assert not verifier.verify(sent[-1].envelope).command.failsafe
    assert first.first_frame == 3 and rec["generation"] == 1


def test_operator_rollback_of_one_module_and_refusals(host, tmp_path):
    loop, sent, _ = build()
    hs = with_modules(loop, host)
    with pytest.raises(SwapRefused, match="nothing to roll back"):
        hs.rollback()
    v1, v2 = module_versions(tmp_path, "post_command")
    original = loop.stage_set.post
    hs.update_module(v2)
    assert loop.stage_set.post.version == 2
    back = hs.rollback("post_command")
    assert back["component"] == "module:post" and loop.stage_set.post is original
    with pytest.raises(SwapRefused, match="cannot tell which module"):
        hs.update_module(MISBEHAVE)
    with pytest.raises(SwapRefused, match="golden step"):  # misbehave's golden vectors do not fit post_command
        bad = tmp_path / "bad"
        bad.mkdir()
        shutil.copy(v1, bad / "post_command.wat")
        (bad / "post_command.golden.json").write_text(json.dumps({"steps": [{"in": [0.5], "out": [0.7]}]}))
        hs.update_module(bad / "post_command.wat")
    assert loop.stage_set.post is original


def unbounded_model(path):
    """A 6 -> 1 ONNX model whose output (sum of the inputs, thousands) is far outside +-0.15 mm."""
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [6, 1], [1.0] * 6)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "unbounded",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_model_without_proven_bounds_is_refused_and_a_proven_one_swaps(tmp_path):
    loop, sent, verifier = build()
    cfg = load_config(EXAMPLE_CONFIG)
    hs = HotSwap(loop, None, n_inputs=6, n_outputs=1, bounds_check=model_bounds_check(lambda: cfg))
    first = loop.stage_set
    with pytest.raises(SwapRefused, match="bounds not proven") as err:
        hs.update_model(unbounded_model(tmp_path / "unbounded.onnx"))
    assert "NOT proven inside" in str(err.value)
    assert loop.stage_set is first
    copy = tmp_path / "rolling_mill_copy.onnx"
    shutil.copy(DEMO_MODEL, copy)
    rec = hs.update_model(copy)
    assert loop.stage_set.model is not first.model and rec["component"] == "model"
    loop.step(frame(1))
    assert loop.stage_set.frames == 1 and first.frames == 0
    hs.rollback("model")
    assert loop.stage_set.model is first.model


def test_sitsctl_update_swaps_modules_and_model_in_a_running_sitsd_without_losing_a_frame(plcsim, tmp_path):
    from sitsd.control import request

    audit = tmp_path / "audit"
    endpoint, udp_url, _ = plcsim(audit / "signer.pub.pem")  # no model pin: the simulator takes any model
    control = tmp_path / "c.sock"
    log = tmp_path / "sitsd.log"
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                         attestation__mode="software", plc__security="none", audit__directory=audit,
                                         control__socket=control),
                              stderr=open(log, "wb"), cwd=REPO, env=env)
    pre_v2 = module_versions(tmp_path / "pre", "pre_filter", versions=(2,))[0]
    post_v2 = module_versions(tmp_path / "post", "post_command", versions=(2,))[0]
    model_copy = tmp_path / "rolling_mill_v2.onnx"
    shutil.copy(DEMO_MODEL, model_copy)

    def sitsctl(*args):
        r = subprocess.run([sys.executable, "-m", "sitsd.cli", *args, "--socket", str(control)], capture_output=True,
                           text=True, timeout=120, cwd=REPO, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    try:
        wait_ready(daemon, log)
        out = sitsctl("update", "--module", str(pre_v2))
        assert "swapped module:pre pre_filter" in out and "previous kept for rollback" in out
        sitsctl("update", "--module", str(post_v2))
        out = sitsctl("update", "--model", str(model_copy))
        assert "swapped model rolling_mill_v2.onnx" in out and "inside the actuator limits" in out
        out = sitsctl("rollback", "--module", "post_command")
        assert "rolled back module:post" in out
        r = subprocess.run([sys.executable, "-m", "sitsd.cli", "update", "--model", str(unbounded_model(
            tmp_path / "unbounded.onnx")), "--socket", str(control)], capture_output=True, text=True, timeout=120,
            cwd=REPO, env=env)
        assert r.returncode == 2 and "bounds not proven" in r.stderr
        out = sitsctl("versions")
        assert "pre_filter@" in out and "rollback" in out
        versions = request(control, "versions")
        stages = versions["current"]
        assert stages["pre"]["version"] == 2 and stages["post"]["version"] == 1
        assert stages["model"].endswith("rolling_mill_v2.onnx") and stages["frames"] > 0, versions
        assert [h["component"] for h in versions["history"]] == ["module:pre", "module:post", "model", "module:post"]
        # every frame that passed the gates ran on exactly one stage set (the frame in flight aside); the
        # gates' own drops (stale frames on a loaded machine) are counted, not lost
        lp = versions["loop"]
        accounted = lp["frames_in_sets"] + lp["dropped_timestamp"] + lp["dropped_constraint"]
        assert 0 <= lp["frames"] - accounted <= 1
        status = request(control, "status")
        # no frame lost in the daemon: every sequence gap is a frame the timestamp gate itself dropped (stale
        # on a loaded machine), which leaves a gap in the sequence the gate tracks
        assert status["counters"]["lost"] <= status["counters"]["dropped_timestamp"]
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    stopped = [json.loads(line) for line in log.read_text().splitlines() if '"sitsd stopped"' in line][-1]
    assert stopped["frames"] > 0 and stopped["sign_errors"] == 0
    # the measurement log: startup deployment plus the four swaps, replayable
    from attestation.measurement import read_log, replay_file

    header, events = read_log(audit / "measurements.jsonl")
    assert [e.kind for e in events] == ["model", "module:pre", "module:post", "config", "module:pre", "module:post",
                                        "model", "rollback:module:post"]
    assert replay_file(audit / "measurements.jsonl").hex() == events[-1].pcr_after


def test_a_hash_pinned_in_the_config_refuses_other_bytes_until_the_config_changes(host, tmp_path):
    """modules[].sha256 / model.sha256 pin what runs, hot swaps included; the pins are read at each update,
    so a reloaded config with the new hash lets the same update through."""
    import hashlib

    from sitsd.wasm.module import read_source

    loop, sent, _ = build()
    loop.stage_set.pre = host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6)
    loop.stage_set.post = host.load("post_command", "post", MODULES / "post_command.wat", 1, 1)
    pins = {"post_command": loop.stage_set.post.sha256, "model": loop.stage_set.model_sha256.hex()}
    hs = HotSwap(loop, host, n_inputs=6, n_outputs=1, alerts=loop.alerts, pins=lambda: dict(pins))
    original = loop.stage_set.post
    _, v2 = module_versions(tmp_path, "post_command")
    with pytest.raises(SwapRefused, match="which the running config pins .the sha256 of module post_command"):
        hs.update_module(v2)
    assert loop.stage_set.post is original
    copy = tmp_path / "doc.onnx"
    copy.write_bytes(DEMO_MODEL.read_bytes() + b"\x32\x03pin")  # one more doc_string: same model, other hash
    with pytest.raises(SwapRefused, match=r"model.sha256"):
        hs.update_model(copy)
    pins["post_command"] = hashlib.sha256(read_source(v2)).hexdigest()  # the config now pins v2
    hs.update_module(v2)
    assert loop.stage_set.post.version == 2
    pins.pop("model")  # no pin: any proven model may swap in
    hs.update_model(copy)
    assert loop.stage_set.model_sha256 == hashlib.sha256(copy.read_bytes()).digest()
