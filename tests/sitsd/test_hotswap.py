"""Hot swap on the real loop: 100 swaps under a 1 kHz loop lose no frame and count every frame once;
traps roll back automatically; a model whose bounds are not proven is refused; and end to end, a
running sitsd swaps its modules and its model through `sitsctl update` without losing a frame."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from sitsd.config import load_config
from sitsd.hotswap import KEPT_SETS, HotSwap, SwapRefused, model_bounds_check
from sitsd.wasm import WasmHost

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG, REPO, example_config_data, sitsd_args, wait_ready
from .test_loop import NOMINAL, build, frame
from .test_wasm import MISBEHAVE, MODULES, UNREACHABLE, build_without_rate_limits


# What each version of a demo module made by module_versions(distinct_outputs=True) adds, so that versions compute
# observably different commands: (parameter index, mm per version above 1) in its `offset` parameters
# (PARAMS+0x200, wasm_modules/ABI.md).
# pre_filter: the roll gap (model input 2; the demo model gives ~0.9 mm of command per mm of gap, so ~1.8e-4 mm per
# version); post_command: the command itself, 2e-5 mm per version. Both far inside the actuator limits (+-0.15 mm)
# and, as steps between two frames, far below the envelope's 2 mm/s at 1 kHz (2e-3 mm per frame).
VERSION_OFFSETS = {"pre_filter": (2, 2e-4), "post_command": (0, 2e-5)}
OFFSET_PARAMS = 0x300  # PARAMS (0x100) + 0x200: offset[0..n)


def version_offset(stem: str, version: int) -> tuple[int, float]:
    """(parameter index, offset) that version `version` of `stem` adds with distinct_outputs (0.0 for version 1)."""
    index, step = VERSION_OFFSETS.get(stem, (0, 0.0))
    return index, (version - 1) * step


def module_versions(tmp_path, stem: str, versions=(1, 2), distinct_outputs: bool = False) -> list:
    """Copies of a demo module that differ in their `version` export (so in their SHA-256), each with its golden
    vectors, in directories of their own (same file name: `update` matches by name). Version 1 is the committed
    module byte for byte; the others differ from it by their version number only, unless `distinct_outputs`: then
    version 2 on also compute differently (VERSION_OFFSETS: a version-dependent offset parameter), and their golden
    vectors are recomputed with test_wasm's numpy models of the modules."""
    import struct

    import numpy as np

    from .test_wasm import reference_post, reference_pre

    marker = "(global $version i32 (i32.const 1))"
    src = (MODULES / f"{stem}.wat").read_text()
    assert marker in src
    golden = json.loads((MODULES / f"{stem}.golden.json").read_text())
    ins = [s["in"] for s in golden["steps"]]
    paths = []
    for v in versions:
        d = tmp_path / f"v{v}"
        d.mkdir(parents=True, exist_ok=True)
        index, off = version_offset(stem, v) if distinct_outputs else (0, 0.0)
        text = src.replace(marker, f"(global $version i32 (i32.const {v}))")
        vectors = golden
        if off:  # the offset parameter (zero in the committed module) as a data segment of its own
            data = "".join(f"\\{b:02x}" for b in struct.pack("<d", off))
            assert text.count("\n  (func (export \"version\")") == 1
            text = text.replace("\n  (func (export \"version\")",
                                f"\n  (data (i32.const {OFFSET_PARAMS + 8 * index:#x}) \"{data}\")  ;; offset[{index}] "
                                f"= {off:g}: what version {v} computes differently\n  (func (export \"version\")", 1)
            if stem == "pre_filter":
                offset = np.zeros(6)
                offset[index] = off
                outs = reference_pre(ins, np.ones(6), offset, np.array([1, 1, 1, .5, .5, .5]))
            else:
                outs = reference_post(ins, 1.0, off, 0.05)
            vectors = {**golden, "description": f"{golden['description']}; version {v}: offset[{index}] = {off:g}",
                       "steps": [{"in": x, "out": np.asarray(y, dtype=np.float64).tolist()} for x, y in zip(ins, outs)]}
        (d / f"{stem}.wat").write_text(text)
        if vectors is golden:
            shutil.copy(MODULES / f"{stem}.golden.json", d / f"{stem}.golden.json")
        else:
            (d / f"{stem}.golden.json").write_text(json.dumps(vectors, indent=1))
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


def model_variant(path):
    """The demo model with one more ModelProto.doc_string (field 6): same graph and weights, other bytes and hash."""
    path.write_bytes(DEMO_MODEL.read_bytes() + b"\x32\x07variant")
    return path


def model_with_output_offset(path, bias_delta: float = 4e-4):
    """The demo model with its last layer's bias moved by `bias_delta` (before the clip head and its scale: ~5.6e-5
    mm of command at the nominal frame): proven inside the same limits, other bytes, and a command that says which
    of the two models computed it (frame_versions)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(DEMO_MODEL))
    bias = next(i for i in model.graph.initializer if i.name == "net.4.bias")
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + bias_delta, bias.name))
    onnx.save(model, str(path))
    return path


def test_100_swaps_under_a_1khz_loop_lose_no_frame_and_count_each_frame_once(host, tmp_path):
    # frames are stamped when the loop takes them, and the deadline is wide: what is counted here is frames and
    # sets, not time (a loop thread preempted for 8 ms on this shared 2-core box is no swap's doing; timing is
    # bench/hotswap.py's, and the end-to-end test's stale drops around a model swap)
    loop, sent, verifier = build(deadline_ms=100.0)
    hs = with_modules(loop, host)
    cfg = load_config(EXAMPLE_CONFIG)
    hs.bounds_check = model_bounds_check(lambda: cfg)  # as the daemon: each model proven, in the proof worker
    # versions that compute different commands: each command then says which versions made it (frame_versions)
    pre_paths = module_versions(tmp_path / "pre", "pre_filter", distinct_outputs=True)
    post_paths = module_versions(tmp_path / "post", "post_command", distinct_outputs=True)
    # two models that compute different commands: each command says which model made it too (frame_versions)
    models = [tmp_path / "rolling_mill_a.onnx", model_with_output_offset(tmp_path / "rolling_mill_b.onnx")]
    shutil.copy(DEMO_MODEL, models[0])
    first = loop.stage_set
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
        records, n_module, n_model = [], 0, 0
        for i in range(100):
            if i % 4 == 3:  # every 4th swap the model: 25 model swaps, each with its bound proof
                records.append(hs.update_model(models[(n_model + 1) % 2]))
                n_model += 1
            else:
                paths = pre_paths if n_module % 2 == 0 else post_paths
                records.append(hs.update_module(paths[(n_module // 2) % 2]))
                n_module += 1
    finally:
        stop.set()
        t.join()
    n = len(generations)
    assert [r["component"] for r in records].count("model") == 25
    assert all(r["swap_frame"] >= 0 for r in records)  # each new set served frames
    # no frame lost: every frame passed the gates and got a model command (no stale drop, no fail-safe)
    assert loop.counters.frames == n and loop.counters.submitted == n and len(sent) == n
    assert loop.counters.dropped_timestamp == 0 and loop.ts_gate.lost == 0
    assert loop.counters.failsafe == 0 and loop.counters.module_traps == 0, list(loop.alerts)[-5:]
    # each frame ran on exactly one set: the per-set counters are the per-frame log, grouped
    by_gen = {g: generations.count(g) for g in set(generations)}
    versions = hs.versions()  # kept sets and retired ones (counters only: their models and modules are freed)
    assert {st["generation"]: st["frames"] for st in versions["sets"] if st["frames"]} == by_gen
    assert sum(st["frames"] for st in versions["sets"]) == n == versions["loop"]["frames_in_sets"]
    assert generations == sorted(generations)  # swaps only move forward, at frame boundaries
    assert len(versions["sets"]) == 101 and len(hs.sets) <= KEPT_SETS
    assert loop.stage_set in hs.sets and hs.previous in hs.sets
    # per-version counters add up: each frame went through one pre, one model and one post version
    assert sum(v["frames"] for v in versions["modules"].values() if v["stage"] == "pre") == n
    assert sum(v["frames"] for v in versions["modules"].values() if v["stage"] == "post") == n
    assert {v["version"] for v in versions["modules"].values()} == {1, 2}
    assert sum(versions["models"].values()) == n
    assert set(versions["models"]) == {hashlib.sha256(m.read_bytes()).hexdigest() for m in models}
    assert loop.stage_set.model_path == str(models[1]) and loop.stage_set.model_sha256 == hashlib.sha256(
        models[1].read_bytes()).digest()
    verifier.expected_model_sha256 = None  # the last frames ran on either model: check each command's own hash
    last = [verifier.verify(out.envelope).command for out in sent[-3:]]
    assert not any(c.failsafe for c in last) and last[-1].model_sha256 == loop.stage_set.model_sha256

    # each command was computed by the versions of the set that took its frame, none by a mix of two sets: the
    # versions compute different commands (distinct_outputs), so each command names the (pre, post) versions that
    # made it, and the set that took the frame (its generation) says which it runs
    runs = {first.generation: (first.pre.version, first.post.version, first.model_sha256.hex())}
    pre_v, post_v, model_sha = runs[first.generation]
    for r in records:  # the swaps in order, each record names the set it made
        if r["component"] == "model":
            model_sha = r["sha256"]
        elif r["module"]["stage"] == "pre":
            pre_v = r["module"]["version"]
        else:
            post_v = r["module"]["version"]
        runs[r["generation"]] = (pre_v, post_v, model_sha)
    made_by = frame_versions([out.values[0] for out in sent], models)
    for i, (g, out, versions_of_frame) in enumerate(zip(generations, sent, made_by)):
        assert versions_of_frame == runs[g], (
            f"frame {i}: command {out.values[0]!r} is what (pre, post, model) {versions_of_frame} compute "
            f"(None: no combination), but its set, generation {g}, runs {runs[g]}")
        assert out.model_sha256.hex() == runs[g][2], f"frame {i}: model {out.model_sha256.hex()[:12]}, set {g}"
    # per-version counters, against the versions each command says made it (not the loop's own bookkeeping)
    for stage, k in (("pre", 0), ("post", 1)):
        from_commands = {v: [m[k] for m in made_by].count(v) for v in (1, 2)}
        counted = {v: sum(e["frames"] for e in versions["modules"].values() if (e["stage"], e["version"]) == (stage, v))
                   for v in (1, 2)}
        assert counted == from_commands and all(from_commands.values()), (stage, counted, from_commands)
    by_model = {}
    for out in sent:  # the model hash each command carries (the one in its envelope)
        by_model[out.model_sha256.hex()] = by_model.get(out.model_sha256.hex(), 0) + 1
    assert {sha: k for sha, k in versions["models"].items() if k} == by_model


def frame_versions(commands: list[float], models: list) -> list[tuple[int, int, str] | None]:
    """The (pre version, post version, model SHA-256 hex) whose combination computes each NOMINAL frame's command
    (module_versions with distinct_outputs; models that compute differently, model_with_output_offset), or None:
    pre_filter passes constant inputs through (plus its offset on the roll gap), the model maps them, and
    post_command adds its offset (both start at their input after the reset of a swap, so no filter state in
    between). Each model runs here on a session of its own: an independent computation of each combination."""
    import numpy as np

    from ep.session import ModelRunner

    expected = {}
    for path in models:
        model = ModelRunner(path, 6, 1)
        for p in (1, 2):
            x = np.array(NOMINAL[:6])
            i, off = version_offset("pre_filter", p)
            x[i] += off
            model.input[0, :] = x
            y = float(model.run()[0][0])
            for q in (1, 2):
                expected[(p, q, model.sha256.hex())] = y + version_offset("post_command", q)[1]
    values = sorted(expected.values())
    assert min(np.diff(values)) > 1e-5, expected  # the combinations are told apart with a wide margin
    return [next((k for k, want in expected.items() if abs(c - want) <= 1e-9), None) for c in commands]


def test_the_bound_proof_runs_in_the_proof_worker_process_which_is_replaced_when_it_dies(tmp_path):
    """The daemon's bound proof runs in a child process (its own GIL: the loop never waits behind it); a
    child that died is replaced, and where none can start the proof runs in-process and says so."""
    from sitsd.hotswap import ModelBoundsCheck, ProofWorker, proof_worker

    cfg = load_config(EXAMPLE_CONFIG)
    check = model_bounds_check(lambda: cfg)
    assert isinstance(check, ModelBoundsCheck) and check.isolate
    proven, report = check(model_variant(tmp_path / "variant.onnx"))
    worker = proof_worker()
    assert proven and "inside the actuator limits" in report and "in the daemon process" not in report
    pid = worker.pid
    assert pid is not None and pid != os.getpid() and worker.proofs >= 1
    proven, report = check(unbounded_model(tmp_path / "unbounded.onnx"))
    assert not proven and "NOT proven inside" in report and worker.pid == pid
    # the proof reads the candidate once and proves only the bytes the daemon loaded: a file that changed
    # after the load is refused, not proven in its new form
    variant = tmp_path / "variant.onnx"
    loaded = hashlib.sha256(variant.read_bytes()).hexdigest()
    assert check(variant, loaded)[0]
    shutil.copy(DEMO_MODEL, variant)
    proven, report = check(variant, loaded)
    assert not proven and "the file changed in between" in report and loaded in report
    os.kill(pid, signal.SIGKILL)
    assert check(DEMO_MODEL)[0] and worker.pid not in (None, pid)  # a fresh child, the proof retried
    broken = ModelBoundsCheck(lambda: cfg, worker=ProofWorker(python=str(tmp_path / "no-such-python")))
    proven, report = broken(DEMO_MODEL)
    assert proven and report.startswith("(proved in the daemon process") and "cannot start" in report
    assert broken.worker.pid is None


def test_trap_right_after_a_swap_rolls_back_automatically(host, tmp_path):
    loop, sent, verifier = build_without_rate_limits(deadline_ms=500.0)  # not about deadlines: no timing flake
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
    assert not verifier.verify(sent[-1].envelope).command.failsafe, list(loop.alerts)[-3:]
    assert first.first_frame == 3 and rec["generation"] == 1
    # the operator's rollback would run the set that just trapped again: refused, unless forced
    with pytest.raises(SwapRefused, match="automatic rollback left.*trap.*--force"):
        hs.rollback()
    assert loop.stage_set is first
    assert hs.rollback(force=True)["generation"] == rec["generation"] and loop.stage_set is not first


def test_a_version_that_sends_mostly_fail_safes_after_a_swap_rolls_back(host, tmp_path):
    """The health watch's fail-safe rate: a post module that passes its golden vectors and never traps, but whose
    every command the envelope (on_violation: failsafe) must replace, is rolled back once more than half of at
    least 20 frames after the swap got the fail-safe; the version before it runs again."""
    from sitsd.gates import SafetyEnvelope

    loop, sent, verifier = build_without_rate_limits(deadline_ms=500.0)  # not about deadlines: no timing flake
    cfg = load_config(EXAMPLE_CONFIG)
    # no max_rate: the version rolled back to must not be refused for a step taken < 1 ms after a fail-safe
    loop.safety = SafetyEnvelope([a.model_copy(update={"on_violation": "failsafe", "max_rate": None})
                                  for a in cfg.safety.actuators], cfg.model.outputs)
    hs = with_modules(loop, host)
    first = loop.stage_set
    bad_post = MISBEHAVE.with_name("off_by_one_mm.wat")
    shutil.copy(bad_post, tmp_path / "post_command.wat")
    shutil.copy(bad_post.with_name("off_by_one_mm.golden.json"), tmp_path / "post_command.golden.json")
    hs.update_module(tmp_path / "post_command.wat")
    swapped = loop.stage_set
    assert swapped is not first
    for seq in range(1, 20):
        loop.step(frame(seq))
        assert verifier.verify(sent[-1].envelope).command.failsafe
        assert hs.check_health() is None  # fewer than 20 frames: not judged yet
    loop.step(frame(20))
    assert swapped.traps == 0 and loop.alerts[-1][1] == "safety"  # no trap: the envelope refused the command
    back = hs.check_health()
    assert back is not None and back["action"] == "rollback", back
    assert "fail-safe rate 20/20 frames after the swap" in back["reason"]
    assert loop.stage_set is first and loop.alerts[-1][1] == "rollback"
    loop.step(frame(21))
    assert not verifier.verify(sent[-1].envelope).command.failsafe, list(loop.alerts)[-3:]


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
    # the loop thread SCHED_FIFO as root, as runtime.realtime_priority runs it in production: then what this test
    # counts around the model swap is the swap's doing (a GIL held next to the loop), not the other tests' load
    rt = {"runtime__realtime_priority": 40} if os.geteuid() == 0 else {}
    daemon = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                         attestation__mode="software", plc__security="none", audit__directory=audit,
                                         control__socket=control, **rt),
                              stderr=open(log, "wb"), cwd=REPO, env=env)
    pre_v2 = module_versions(tmp_path / "pre", "pre_filter", versions=(2,))[0]
    post_v2 = module_versions(tmp_path / "post", "post_command", versions=(2,))[0]
    model_copy = model_variant(tmp_path / "rolling_mill_v2.onnx")  # other bytes, other hash: a real model swap

    def sitsctl(*args):
        r = subprocess.run([sys.executable, "-m", "sitsd.cli", *args, "--socket", str(control)], capture_output=True,
                           text=True, timeout=120, cwd=REPO, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    try:
        wait_ready(daemon, log)
        watched = ("failsafe", "dropped_timestamp", "deadline_missed", "lost", "sign_errors")
        time.sleep(0.3)  # past the startup frames
        before = request(control, "status")["counters"]  # across all three swaps: two modules, then the model
        out = sitsctl("update", "--module", str(pre_v2))
        assert "swapped module:pre pre_filter" in out and "previous kept for rollback" in out
        sitsctl("update", "--module", str(post_v2))
        out = sitsctl("update", "--model", str(model_copy))
        assert "swapped model rolling_mill_v2.onnx" in out and "inside the actuator limits" in out
        assert "proved in the daemon process" not in out  # but in the proof worker, a process of its own
        time.sleep(0.2)  # frames that queued behind a stall have been picked up (stale) by now
        status = request(control, "status")
        after = status["counters"]
        # the daemon's own counters (whatever the PLC makes of the new model hash): the two module swaps and the
        # model swap with its bound proof lost no frame: no stale drop, no sequence gap, no fail-safe, no missed
        # deadline
        assert {k: after[k] - before[k] for k in watched} == dict.fromkeys(watched, 0), json.dumps(
            {"before": before, "after": after, "recent_alerts": status["recent_alerts"]}, indent=1, default=str)
        assert after["frames"] > before["frames"] and after["submitted"] > before["submitted"]
        current = request(control, "versions")["current"]
        assert current["model_sha256"] == hashlib.sha256(model_copy.read_bytes()).hexdigest()
        out = sitsctl("rollback", "--module", "post_command")
        assert "rolled back module:post" in out
        r = subprocess.run([sys.executable, "-m", "sitsd.cli", "update", "--model", str(unbounded_model(
            tmp_path / "unbounded.onnx")), "--socket", str(control)], capture_output=True, text=True, timeout=120,
            cwd=REPO, env=env)
        assert r.returncode == 2 and "bounds not proven" in r.stderr
        out = sitsctl("versions")
        assert "pre_filter@" in out and "rollback" in out
        # the running model (swapped in) runs through the C API, the signature through libcrypto: the GIL kept
        assert "loop call paths: epoch ticker native; signature libcrypto, GIL held; model run ONNX Runtime C API" in out, out
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

        # the config: nothing to roll back before an update; after one, back and (again) forward
        r = subprocess.run([sys.executable, "-m", "sitsd.cli", "rollback", "--config", "--socket", str(control)],
                           capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
        assert r.returncode == 2 and "no config update to roll back" in r.stderr, r.stderr
        data = example_config_data()
        data["timing"]["max_consecutive_drops"] += 1
        data["safety"]["actuators"][0]["max_rate"] *= 0.9
        edited = tmp_path / "rolling-mill-edited.yaml"
        edited.write_text(yaml.safe_dump(data))
        out = sitsctl("update", "--config", str(edited))
        assert "applied live" in out and "timing" in out and "safety" in out, out
        back = json.loads(sitsctl("rollback", "--config", "--json"))
        # the old rules were proven for the running (swapped) model before they went back in
        assert back["component"] == "config" and {"timing", "safety"} <= set(back["changed"]) and back["proof"], back
        out = sitsctl("rollback", "--config")  # forward again, to the edited config
        assert f"rolled back the config to {edited}" in out and "timing" in out, out
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    stopped = [json.loads(line) for line in log.read_text().splitlines() if '"sitsd stopped"' in line][-1]
    assert stopped["frames"] > 0 and stopped["sign_errors"] == 0
    # the measurement log: startup deployment plus the four swaps, replayable
    from attestation.measurement import read_log, replay_file

    header, events = read_log(audit / "measurements.jsonl")
    assert [e.kind for e in events] == ["model", "module:pre", "module:post", "config", "module:pre", "module:post",
                                        "model", "rollback:module:post", "config", "rollback:config",
                                        "rollback:config"]
    assert events[-2].name == events[3].name and events[-1].name == events[-3].name == "rolling-mill-edited.yaml"
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


def test_a_swap_is_measured_before_it_runs_and_a_failed_measurement_changes_nothing(host, tmp_path):
    """An update whose measurement fails (TPM gone, PCR moved, disk full) is refused and the running set stays;
    a rollback still goes ahead (it leaves a faulty version), with an alert that the log was not updated."""
    from attestation.measurement import MeasurementError

    loop, sent, _ = build()
    hs = with_modules(loop, host)
    first = loop.stage_set
    v2 = module_versions(tmp_path, "post_command", versions=(2,))[0]
    seen_running = []

    def measure_fails(kind, name, sha):
        seen_running.append(loop.stage_set is first)  # measured while the old set still runs
        raise MeasurementError("PCR 23 is not the replay of the measurement log")

    hs.measure = measure_fails
    with pytest.raises(SwapRefused, match="could not measure module:post post_command before running it"):
        hs.update_module(v2)
    assert loop.stage_set is first and seen_running == [True] and hs.history == []
    measured = []
    hs.measure = lambda *event: measured.append((loop.stage_set is first, event))
    rec = hs.update_module(v2)
    assert loop.stage_set is not first and measured == [(True, ("module:post", "post_command", rec["sha256"]))]
    hs.measure = measure_fails
    back = hs.rollback()
    assert loop.stage_set is first and back["action"] == "rollback"
    kind, text = loop.alerts[-1][1:3]
    assert kind == "rollback" and "measuring it failed" in text and "MeasurementError" in text


def test_a_refused_update_leaves_the_per_component_rollback_target(host, tmp_path):
    """`sitsctl rollback --module/--model` after a refused update still goes back to the version the last
    update that ran replaced, not to the one running (the refused update never ran)."""
    from attestation.measurement import MeasurementError

    loop, sent, _ = build()
    hs = with_modules(loop, host)
    first_post = loop.stage_set.post
    v2, v3 = module_versions(tmp_path, "post_command", versions=(2, 3))
    hs.measure = lambda *event: None
    hs.update_module(v2)
    running_v2 = loop.stage_set.post

    def measure_fails(kind, name, sha):
        raise MeasurementError("PCR 23 is not the replay of the measurement log")

    hs.measure = measure_fails
    with pytest.raises(SwapRefused, match="could not measure module:post"):
        hs.update_module(v3)
    with pytest.raises(SwapRefused, match="could not measure model"):
        hs.update_model(model_variant(tmp_path / "m2.onnx"))
    assert loop.stage_set.post is running_v2
    with pytest.raises(SwapRefused, match="nothing to roll back for 'model'"):
        hs.rollback("model")
    hs.measure = lambda *event: None
    out = hs.rollback("post_command")
    assert out["action"] == "rollback" and loop.stage_set.post is first_post


def test_a_plc_refusing_the_commands_after_a_swap_rolls_it_back(host, tmp_path):
    """The health watch counts the PLC's refusals (e.g. a PLC that pins the old model's hash), not only the
    loop's own fail-safes; and it never waits for an update that is still preparing."""
    loop, sent, _ = build()
    hs = with_modules(loop, host)
    refused = [0]
    hs.rejections = lambda: refused[0]
    first = loop.stage_set
    v2 = module_versions(tmp_path, "post_command", versions=(2,))[0]
    hs.update_module(v2)
    for seq in range(1, 31):
        loop.step(frame(seq))
    assert hs.check_health() is None and loop.stage_set is not first  # the PLC took them
    refused[0] += 25  # the PLC refuses what the new version sends
    hs._lock.acquire()  # an update preparing meanwhile: the check does not wait for it
    try:
        assert hs.check_health() is None and loop.stage_set is not first
    finally:
        hs._lock.release()
    back = hs.check_health()
    assert back is not None and "the PLC refused 25" in back["reason"] and loop.stage_set is first


def test_old_stage_sets_are_retired_their_versions_freed_and_their_counters_kept(host, tmp_path):
    """Only KEPT_SETS stage sets stay loaded (the running one and the rollback target always): an older one's
    model and module versions are freed unless a rollback can still bring them back, and its frame counts stay
    in `versions`."""
    import gc
    import weakref

    loop, sent, _ = build()
    hs = with_modules(loop, host)
    hs.pickup_timeout_s = 0.01  # no loop thread here: the frames are stepped below, after each swap
    v1, v2 = module_versions(tmp_path, "post_command")
    refs, seq = [], 0
    for i in range(3 * KEPT_SETS):
        rec = hs.update_module(v1 if i % 2 else v2)
        refs.append(weakref.ref(loop.stage_set.post))
        for _ in range(3):
            seq += 1
            loop.step(frame(seq))
    gc.collect()
    assert len(hs.sets) <= KEPT_SETS and loop.stage_set in hs.sets and hs.previous in hs.sets
    alive = [r() for r in refs]
    assert sum(x is None for x in alive) >= 2 * KEPT_SETS - 2  # the old versions are gone, not just unlisted
    versions = hs.versions()
    assert len(versions["sets"]) == 3 * KEPT_SETS + 1 and versions["loop"]["frames_in_sets"] == seq
    assert sum(v["frames"] for v in versions["modules"].values() if v["stage"] == "post") == seq
    # the rollback targets survived the retirement: per component and the whole set
    before = loop.stage_set.post
    back = hs.rollback("post_command")
    assert back["action"] == "rollback" and loop.stage_set.post is not before and loop.stage_set.post is not None
    hs.rollback()
    assert loop.stage_set.post is not None


def test_a_signed_wat_replaced_after_its_signature_check_is_refused(host, tmp_path):
    """The signature covers the .wat file's bytes; the host compiles those very bytes (read once), so a file
    swapped between the check and the load is refused instead of compiled unsigned."""
    loop, _, _ = build()
    hs = with_modules(loop, host)
    v2, v3 = module_versions(tmp_path, "post_command", versions=(2, 3))
    checked = hashlib.sha256(v2.read_bytes()).hexdigest()
    hs._check_signature = lambda kind, path, sha=None: checked  # the check passed on v2's bytes ...
    v2.write_bytes(v3.read_bytes())  # ... then the file was replaced
    first = loop.stage_set
    with pytest.raises(SwapRefused, match="changed after its signature was checked"):
        hs.update_module(v2)
    assert loop.stage_set is first
    v2.write_bytes((MODULES / "post_command.wat").read_text().replace(
        "(global $version i32 (i32.const 1))", "(global $version i32 (i32.const 2))").encode())
    assert hashlib.sha256(v2.read_bytes()).hexdigest() == checked
    assert hs.update_module(v2)["component"] == "module:post"  # the bytes that were checked load


class _Daemon:
    """What the control handlers use of a Daemon; `_alert` is the daemon's own (the tuple its housekeeping drains)."""

    def __init__(self, hs, loop) -> None:
        from types import SimpleNamespace

        self.hotswap, self.loop, self.alerts, self.measurements = hs, loop, loop.alerts, None
        self.log = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None,
                                   error=lambda *a, **k: None)

    def _alert(self, kind, reason, item=None):
        from sitsd.daemon import Daemon

        Daemon._alert(self, kind, reason, item)


def test_a_refused_update_raises_one_update_refused_alert_and_the_old_version_keeps_running(host, tmp_path):
    import asyncio

    from sitsd.hotswap import control_handlers
    from sitsd.rca.events import event_from_alert
    from sitsd.signatures import SignaturePolicy

    loop, sent, _ = build()
    hs = with_modules(loop, host)
    handlers = control_handlers(_Daemon(hs, loop))
    first = loop.stage_set

    def refused():
        return [a for a in loop.alerts if a[1] == "update_refused"]

    v1, v2 = module_versions(tmp_path, "post_command")
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(v1, bad / "post_command.wat")
    (bad / "post_command.golden.json").write_text(json.dumps({"steps": [{"in": [0.5], "out": [0.7]}]}))
    answer = asyncio.run(handlers["update"]({"module": str(bad / "post_command.wat")}))
    assert answer["ok"] is False and "golden step" in answer["error"]
    (alert,) = refused()
    assert alert[2].startswith("module post_command.wat: refused, the running version stays:") and "golden" in alert[2]
    assert loop.stage_set is first and hs.history == []
    loop.step(frame(1))  # the loop runs on the old set
    assert first.frames == 1 and len(sent) == 1 and not sent[0].failsafe

    hs.signatures = SignaturePolicy("modules", REPO / "examples" / "approval" / "authority.pub.pem")
    answer = asyncio.run(handlers["update"]({"module": str(v2)}))  # unsigned
    assert answer["ok"] is False and "signature check failed" in answer["error"]
    assert len(refused()) == 2 and "signature check failed" in refused()[-1][2] and loop.stage_set is first
    hs.signatures = None

    answer = asyncio.run(handlers["update"]({"model": str(DEMO_MODEL), "sha256": "0" * 64}))
    assert answer["ok"] is False and len(refused()) == 3 and refused()[-1][2].startswith("model rolling_mill")
    assert "\n" not in refused()[-1][2]

    # a refused rollback is no refused update; an update that goes through raises none
    assert asyncio.run(handlers["rollback"]({"model": True}))["ok"] is False
    assert asyncio.run(handlers["update"]({"module": str(v2)}))["updated"] and loop.stage_set is not first
    assert len(refused()) == 3
    loop.step(frame(2))
    assert loop.stage_set.frames == 1 and first.frames == 1
    # fault attribution reads it as an update event; nothing about it is critical
    event = event_from_alert(*refused()[0])
    assert (event.source, event.code, event.severity) == ("update", "update.refused", "warning")
