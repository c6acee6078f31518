"""sitsctl zk-setup / prove / verify-proof, end to end on the demo config."""
from __future__ import annotations

import json

import pytest

from attestation.zk import ZkError, available_backends, backend
from attestation.zk.field import R
from sitsd.cli import main

from .conftest import CONFIG, snarkjs


def test_prove_then_verify_and_tamper(tmp_path, capsys):
    keys, out = tmp_path / "keys", tmp_path / "out"
    assert main(["zk-setup", "--config", str(CONFIG), "--out", str(keys)]) == 0
    assert "constraints" in capsys.readouterr().out
    assert main(["prove", "--config", str(CONFIG), "--input", "4.0,3.0,2.4,9000,120,2.5", "--keys", str(keys),
                 "--out", str(out)]) == 2  # the config's conditional constraints read mill_mode
    assert "--context: give mill_mode=VALUE" in capsys.readouterr().err
    assert main(["prove", "--config", str(CONFIG), "--input", "4.0,3.0,2.4,9000,120,2.5", "--context", "mill_mode=2",
                 "--keys", str(keys), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "proved roll_gap_correction" in text
    assert f"({available_backends()[-1]})" in text  # default: the fastest installed, as the daemon chooses
    files = ["--vk", str(out / "vk.json"), "--public", str(out / "public.json")]
    assert main(["verify-proof", str(out / "proof.json"), *files, "--config", str(CONFIG)]) == 0
    text = capsys.readouterr().out
    assert "OK" in text and "roll_gap_correction" in text and "rolling_force = 9000" in text
    assert "mill_mode = 2" in text
    res = snarkjs("groth16", "verify", out / "vk.json", out / "public.json", out / "proof.json")
    assert res.returncode == 0 and "OK!" in res.stdout

    # the command changed after proving: rejected
    public = json.loads((out / "public.json").read_text())
    public[0] = str((int(public[0]) + 1) % R)
    (tmp_path / "changed.json").write_text(json.dumps(public))
    assert main(["verify-proof", str(out / "proof.json"), "--vk", str(out / "vk.json"),
                 "--public", str(tmp_path / "changed.json")]) == 1
    assert "INVALID" in capsys.readouterr().err

    # malformed proof: exit 2 with the field named
    proof = json.loads((out / "proof.json").read_text())
    proof["pi_c"] = ["1", "3", "1"]
    (tmp_path / "bad.json").write_text(json.dumps(proof))
    assert main(["verify-proof", str(tmp_path / "bad.json"), *files]) == 2
    assert "pi_c" in capsys.readouterr().err


def test_prove_rejects_out_of_range_input(tmp_path, capsys):
    rc = main(["prove", "--config", str(CONFIG), "--input", "9.0,3.0,2.4,9000,120,2.5", "--context", "mill_mode=2",
               "--keys", str(tmp_path / "k"), "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "entry_thickness" in capsys.readouterr().err


def test_prove_refuses_an_input_that_breaks_a_conditional_constraint(tmp_path, capsys):
    """rolling force 3500 kN is in its signal range but outside the AGC band (mill_mode 2): no proof."""
    common = ["--keys", str(tmp_path / "k"), "--out", str(tmp_path / "o"), "--config", str(CONFIG)]
    assert main(["prove", "--input", "4.0,3.0,2.4,3500,120,2.5", "--context", "mill_mode=2", *common]) == 2
    assert "force_in_band_under_agc" in capsys.readouterr().err
    assert main(["prove", "--input", "4.0,3.0,2.4,9000,120,2.5", "--context", "mode=2", *common]) == 2
    assert "mode is not a context signal of this circuit (it has: mill_mode)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def demo_keys(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys")
    assert main(["zk-setup", "--config", str(CONFIG), "--out", str(keys)]) == 0
    return keys


@pytest.mark.parametrize("name", ["int", "gmpy2", "mcl"])
def test_prove_with_each_backend_verifies_with_snarkjs(name, demo_keys, tmp_path, capsys):
    """`--backend` offers every backend of attestation/zk, mcl (the daemon's, x86_64) included."""
    if name not in available_backends():
        pytest.skip(f"backend {name} is not installed here (see test_prove_names_a_missing_backend)")
    keys, out = demo_keys, tmp_path / "out"
    capsys.readouterr()
    assert main(["prove", "--config", str(CONFIG), "--input", "4.0,3.0,2.4,9000,120,2.5", "--context", "mill_mode=2",
                 "--keys", str(keys), "--out", str(out), "--backend", name]) == 0
    assert f"s ({name}); wrote" in capsys.readouterr().out
    assert main(["verify-proof", str(out / "proof.json"), "--vk", str(out / "vk.json"),
                 "--public", str(out / "public.json")]) == 0
    res = snarkjs("groth16", "verify", out / "vk.json", out / "public.json", out / "proof.json")
    assert res.returncode == 0 and "OK!" in res.stdout


def test_prove_names_a_missing_backend(tmp_path, capsys, monkeypatch):
    """Where mclbn256 is missing (anything but x86_64), `--backend mcl` fails with exit 2 and says why,
    before any setup or proving; without --backend the fastest installed backend is used."""
    def missing():
        raise ImportError("mclbn256 unavailable: No module named 'mclbn256'")

    monkeypatch.setitem(backend._FACTORIES, "mcl", missing)
    monkeypatch.delitem(backend._CACHE, "mcl", raising=False)
    assert "mcl" not in available_backends()
    keys = tmp_path / "k"
    rc = main(["prove", "--config", str(CONFIG), "--input", "4.0,3.0,2.4,9000,120,2.5", "--context", "mill_mode=2",
               "--keys", str(keys), "--out", str(tmp_path / "o"), "--backend", "mcl"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "backend 'mcl' is not installed" in err and "x86_64 only" in err
    assert "installed here: int, gmpy2" in err
    assert not keys.exists()  # refused before making any key
    with pytest.raises(ZkError):
        backend.get("mcl")
