"""`.wasm` binaries, built at test time with `sitsctl build-module` (none is committed: wasm_modules/README.md):
each module's binary computes what its WAT computes, a broken source is refused with where and why, and a signed
`.wasm` hot-swaps under attestation.require_signatures, while one changed after signing is refused."""
import hashlib
import json

import numpy as np
import pytest

from sitsd.hotswap import SwapRefused
from sitsd.wasm import WasmHost

from ..conftest import DEMO_MODEL
from .test_hotswap import frame_versions, module_versions, with_modules
from .test_loop import frame
from .test_wasm import MODULES, build_without_rate_limits

WATS = sorted(MODULES.glob("*.wat"))


@pytest.fixture
def host(tmp_path):
    h = WasmHost(tmp_path / "cache")
    yield h
    h.close()


def sitsctl(capsys, *argv) -> tuple[int, str, str]:
    """sitsctl in this process: (exit status, stdout, stderr)."""
    from sitsd.cli import main

    capsys.readouterr()
    status = main([str(a) for a in argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def build_wasm(capsys, wat, out=None) -> dict:
    status, stdout, stderr = sitsctl(capsys, "build-module", wat, *(["-o", out] if out else []), "--json")
    assert status == 0, stderr
    return json.loads(stdout)


def test_the_modules_are_sources_only():
    assert WATS and not list(MODULES.glob("*.wasm")), "binaries are built, never committed (wasm_modules/README.md)"


@pytest.mark.parametrize("wat", WATS, ids=[w.stem for w in WATS])
def test_each_module_built_to_wasm_computes_what_its_wat_computes(host, tmp_path, capsys, wat):
    golden = json.loads(wat.with_name(f"{wat.stem}.golden.json").read_text())
    n_in, n_out = golden["n_in"], golden["n_out"]
    result = build_wasm(capsys, wat, tmp_path / "out" / f"{wat.stem}.wasm")
    binary = tmp_path / "out" / f"{wat.stem}.wasm"
    assert result["ok"] and result["wasm"] == str(binary) and binary.read_bytes()[:4] == b"\0asm"
    assert result["sha256"] == hashlib.sha256(binary.read_bytes()).hexdigest() and result["version"] == 1
    assert (result["n_in"], result["n_out"]) == (n_in, n_out)
    assert result["golden"]["steps"] == len(golden["steps"]) and not result["warnings"]
    # the golden vectors went next to the binary, where the host looks for them
    vectors = f"{wat.stem}.golden.json"
    assert binary.with_name(vectors).read_bytes() == wat.with_name(vectors).read_bytes()

    stage = "post" if n_out == 1 and n_in == 1 else "pre"
    from_wat = host.load(wat.stem, stage, wat, n_in, n_out)
    from_wasm = host.load(wat.stem, stage, binary, n_in, n_out, expected_sha256=result["sha256"])
    # one module, one identity: the hash of the wasm bytes, whichever file it came from
    assert from_wasm.sha256 == from_wat.sha256 == result["sha256"] and from_wasm.version == from_wat.version
    for i, step in enumerate(golden["steps"]):  # both serving instances, step by step from a fresh state
        from_wat.instance.input[:] = from_wasm.instance.input[:] = step["in"]
        from_wat.instance.process()
        from_wasm.instance.process()
        assert np.array_equal(from_wasm.instance.output, from_wat.instance.output), i
        assert np.allclose(from_wasm.instance.output, step["out"], rtol=0, atol=golden["tolerance"]), i


def test_a_broken_wat_a_missing_file_and_a_module_sitsd_would_refuse_write_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.wat"
    bad.write_text('(module\n  (func (export "process") (result i32)\n    (i32.consst 0)))\n')
    status, out, err = sitsctl(capsys, "build-module", bad)
    assert status == 2 and out == ""
    assert f"{bad}:3:6: not valid WAT: unknown operator" in err and "(i32.consst 0)" in err
    assert not bad.with_suffix(".wasm").exists()
    status, out, _ = sitsctl(capsys, "build-module", bad, "--json")
    answer = json.loads(out)
    assert status == 2 and answer["ok"] is False and answer["status"] == 2 and ":3:6:" in answer["error"]

    status, _, err = sitsctl(capsys, "build-module", tmp_path / "nothing.wat")
    assert status == 2 and "nothing.wat: no such file" in err

    # valid WAT that wasmtime's validator refuses (a type error): the innermost cause is named
    typed = tmp_path / "typed.wat"
    typed.write_text("(module (func (result i32) (i64.const 1)))")
    status, _, err = sitsctl(capsys, "build-module", typed)
    assert status == 2 and "type mismatch: expected i32, found i64" in err and not typed.with_suffix(".wasm").exists()

    # it builds, but without the ABI's exports sitsd would refuse it: exit 1, nothing written
    no_abi = tmp_path / "no_abi.wat"
    no_abi.write_text('(module (memory (export "memory") 1) (func (export "process") (result i32) (i32.const 0)))')
    status, _, err = sitsctl(capsys, "build-module", no_abi)
    assert status == 1 and "missing exports version, selftest" in err and "ABI.md" in err
    assert not no_abi.with_suffix(".wasm").exists()

    # golden vectors that the module does not reproduce: exit 1, nothing written
    (post,) = module_versions(tmp_path / "post", "post_command", versions=(2,))
    golden = json.loads(post.with_name("post_command.golden.json").read_text())
    golden["steps"][1]["out"] = [0.5]
    post.with_name("post_command.golden.json").write_text(json.dumps(golden))
    status, _, err = sitsctl(capsys, "build-module", post)
    assert status == 1 and "golden step 1" in err and not post.with_suffix(".wasm").exists()

    # no golden vectors: built, with a warning that sitsd will not load it without them
    post.with_name("post_command.golden.json").unlink()
    status, out, _ = sitsctl(capsys, "build-module", post)
    assert status == 0 and "warning  no golden vectors" in out and post.with_suffix(".wasm").exists()


def test_help_says_what_build_module_is_for(capsys):
    with pytest.raises(SystemExit) as done:
        sitsctl(capsys, "build-module", "--help")
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("WAT source", "sitsd also loads .wat directly", "golden vectors", "SHA-256", "sitsctl sign",
                  "exit status"):
        assert words in text, words


def test_a_signed_wasm_hot_swaps_under_require_signatures_and_one_changed_after_signing_is_refused(
        host, tmp_path, capsys):
    from attestation.tpm.policy import generate_authority
    from sitsd.signatures import SignaturePolicy

    priv, pub = generate_authority(tmp_path / "authority")
    v2, v3 = module_versions(tmp_path / "post", "post_command", versions=(2, 3), distinct_outputs=True)
    wasm2, wasm3 = v2.with_suffix(".wasm"), v3.with_suffix(".wasm")
    built = build_wasm(capsys, v2)  # next to its WAT and golden vectors
    build_wasm(capsys, v3)
    assert "sitsctl sign" in " ".join(built["next"]) and built["golden"]["copied_to"] is None
    status, out, err = sitsctl(capsys, "sign", "--authority-key", priv, wasm2, wasm3)
    assert status == 0, err

    loop, sent, verifier = build_without_rate_limits(deadline_ms=500.0)  # not about deadlines: no timing flake
    hs = with_modules(loop, host)
    hs.signatures = SignaturePolicy("modules", pub)
    first = loop.stage_set

    # the signed bytes' hash is the wasm hash: a pin of another hash is refused before anything loads
    with pytest.raises(SwapRefused, match=f"SHA-256 {built['sha256']} differs from the expected 0000"):
        hs.update_module(wasm2, name="post_command", expected_sha256="0" * 64)
    assert loop.stage_set is first

    # changed after signing (another build written over it): the signature no longer covers it
    wasm3.write_bytes(wasm2.read_bytes())
    with pytest.raises(SwapRefused, match="signature check failed") as err:
        hs.update_module(wasm3, name="post_command")
    assert "post_command.wasm" in str(err.value) and loop.stage_set is first

    # changed between the signature check and the load: the host compiles only the bytes that were checked
    check = hs.signatures.check

    def check_then_swap_the_file(kind, path, sha256=None):
        answer = check(kind, path, sha256)
        wasm2.write_bytes(original3)
        return answer

    build_wasm(capsys, v3)  # v3's binary again, as signed
    original3 = wasm3.read_bytes()
    saved2 = wasm2.read_bytes()
    hs.signatures.check = check_then_swap_the_file
    with pytest.raises(SwapRefused, match="changed after its signature was checked"):
        hs.update_module(wasm2, name="post_command")
    hs.signatures.check = check
    assert loop.stage_set is first
    wasm2.write_bytes(saved2)

    # the signed binary as built: swapped, and the loop's commands are version 2's
    rec = hs.update_module(wasm2, name="post_command")
    assert rec["sha256"] == built["sha256"] == hashlib.sha256(wasm2.read_bytes()).hexdigest()
    assert rec["module"]["version"] == 2 and loop.stage_set.post.path == wasm2 and loop.stage_set is not first
    loop.step(frame(1))
    command = verifier.verify(sent[-1].envelope).command
    assert not command.failsafe and frame_versions([command.values[0]], [DEMO_MODEL]) == [
        (1, 2, loop.stage_set.model_sha256.hex())], command.values
    assert loop.counters.module_traps == 0 and loop.stage_set.post.frames == 1
