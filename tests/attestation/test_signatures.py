"""Detached signatures of modules, configs and models (attestation.signatures), the policy the daemon
applies (sitsd.signatures) and `sitsctl sign` / `verify-signature`, with authority keys made here by
`sitsctl policy keygen` (the example authority's private key does not exist any more)."""
import json
import shutil
import subprocess
import sys

import pytest

from attestation.signatures import SignatureError, sign, signature_path, verify, write
from attestation.tpm.policy import approve, generate_authority, load_authority_private, load_authority_public
from sitsd.signatures import SignaturePolicy, check_startup

from ..conftest import DEMO_MODEL, EXAMPLE_CONFIG, REPO

MODULES = REPO / "wasm_modules"


def keygen(directory):
    r = subprocess.run([sys.executable, "-m", "sitsd.cli", "policy", "keygen", "--output", str(directory)],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    return directory / "authority.key.pem", directory / "authority.pub.pem"


@pytest.fixture
def authority(tmp_path):
    priv, pub = keygen(tmp_path / "authority")
    return load_authority_private(priv), load_authority_public(pub), priv, pub


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "pre_filter.wat"
    shutil.copy(MODULES / "pre_filter.wat", path)
    return path


def test_signed_module_verifies_and_names_kind_name_hash(authority, module):
    key, pub, *_ = authority
    write(sign(key, module), module)
    sig = verify(pub, module)
    assert (sig.kind, sig.name) == ("module", "pre_filter.wat")
    assert json.loads(signature_path(module).read_text())["format"] == "sits-signature"


def test_tampered_file_is_refused(authority, module):
    key, pub, *_ = authority
    write(sign(key, module), module)
    module.write_text(module.read_text().replace("i32.const 1", "i32.const 2", 1))
    with pytest.raises(SignatureError) as err:
        verify(pub, module)
    assert err.value.code == "digest" and "changed after it was signed" in str(err.value)


def test_signature_by_another_key_is_refused(authority, module, tmp_path):
    _, pub, *_ = authority
    other, _ = generate_authority(tmp_path / "other")
    write(sign(load_authority_private(other), module), module)
    with pytest.raises(SignatureError) as err:
        verify(pub, module)
    assert err.value.code == "authority" and "another key" in str(err.value)


def test_edited_signature_file_is_refused(authority, module):
    key, pub, *_ = authority
    sig = sign(key, module)
    raw = bytearray(bytes.fromhex(sig.signature))
    raw[5] ^= 1
    signature_path(module).write_text(sig.to_json().replace(sig.signature, raw.hex()))
    with pytest.raises(SignatureError) as err:
        verify(pub, module)
    assert err.value.code == "signature"


def test_signature_of_one_kind_or_name_does_not_pass_for_another(authority, module, tmp_path):
    key, pub, *_ = authority
    write(sign(key, module, kind="config"), module)
    with pytest.raises(SignatureError) as err:
        verify(pub, module)
    assert err.value.code == "kind"
    write(sign(key, module), module)
    other = tmp_path / "post_command.wat"
    shutil.copy(module, other)
    shutil.copy(signature_path(module), signature_path(other))  # same bytes, signature made for another name
    with pytest.raises(SignatureError) as err:
        verify(pub, other)
    assert err.value.code == "name"


@pytest.mark.parametrize("text", ["", "{}", "[1]", '{"format": "sits-signature", "version": 1}', "\xff"])
def test_malformed_signature_files_give_a_clear_error(authority, module, text):
    _, pub, *_ = authority
    signature_path(module).write_text(text)
    with pytest.raises(SignatureError) as err:
        verify(pub, module)
    assert err.value.code == "format" and "not a valid signature file" in str(err.value)


def test_missing_signature_refused_when_required_accepted_when_not(authority, module):
    *_, pub = authority
    with pytest.raises(SignatureError) as err:
        SignaturePolicy("modules", pub).check("module", module)
    assert err.value.code == "missing" and "sitsctl sign" in str(err.value)
    assert SignaturePolicy("off", None).check("module", module) == "unchecked"
    assert SignaturePolicy("modules", pub).check("config", EXAMPLE_CONFIG) == "unchecked"


def test_model_approval_counts_as_its_signature(authority, tmp_path):
    key, _, _, pub = authority
    model = tmp_path / "rolling_mill.onnx"
    shutil.copy(DEMO_MODEL, model)
    from attestation.signatures import file_sha256

    sha = file_sha256(model)
    policy = SignaturePolicy("all", pub)
    with pytest.raises(SignatureError) as err:
        policy.check("model", model)
    assert err.value.code == "missing" and "approval does not approve" in str(err.value)
    approval = tmp_path / "approval.json"
    approval.write_text(approve(key, 23, [("model", model.name, sha)]).to_json())
    assert SignaturePolicy("all", pub, approval).check("model", model) == "approved"
    write(sign(key, model), model)
    assert policy.check("model", model) == "signed"


def test_startup_check_names_the_unsigned_file(authority, tmp_path):
    from sitsd.config import load_config
    from sitsd.errors import StartupError

    key, _, _, pub = authority
    cfg = load_config(EXAMPLE_CONFIG, {"attestation.require_signatures": "modules", "attestation.authority_key":
                                       str(pub), "attestation.mode": "software"})
    with pytest.raises(StartupError) as err:
        check_startup(cfg, EXAMPLE_CONFIG)
    assert "refusing to start" in str(err.value) and "pre_filter.wat" in str(err.value)
    assert check_startup(load_config(EXAMPLE_CONFIG, {"attestation.mode": "software"}), EXAMPLE_CONFIG) == {}


def test_config_needs_an_authority_key_for_signatures():
    from sitsd.config import load_config
    from sitsd.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(EXAMPLE_CONFIG, {"attestation.require_signatures": "all", "attestation.authority_key": None})
    assert "needs authority_key" in str(err.value)


def test_sitsctl_sign_and_verify_signature(authority, module, tmp_path):
    _, _, priv, pub = authority
    config = tmp_path / "line.yaml"
    shutil.copy(EXAMPLE_CONFIG, config)

    def sitsctl(*args):
        return subprocess.run([sys.executable, "-m", "sitsd.cli", *args], capture_output=True, text=True, cwd=REPO,
                              timeout=60)

    r = sitsctl("sign", "--authority-key", str(priv), str(module), str(config))
    assert r.returncode == 0, r.stderr
    assert signature_path(module).is_file() and signature_path(config).is_file()
    r = sitsctl("verify-signature", "--authority-pub", str(pub), str(module), str(config))
    assert r.returncode == 0 and r.stdout.count("OK ") == 2, r.stderr
    config.write_text(config.read_text() + "\n# edited\n")
    r = sitsctl("verify-signature", "--authority-pub", str(pub), str(config))
    assert r.returncode == 1 and "INVALID" in r.stderr and "changed after it was signed" in r.stderr
    signature_path(module).unlink()
    r = sitsctl("verify-signature", "--authority-pub", str(pub), str(module))
    assert r.returncode == 1 and "no signature" in r.stderr
    r = sitsctl("sign", "--authority-key", str(pub), str(module))  # a public key cannot sign
    assert r.returncode == 2 and "private key" in r.stderr
