"""`sitsctl plcsim --expect-module/--expect-config-sha256/--require-measurements`: the PLC simulator's session
acceptor pins what the measurement log in the session credential says runs; real swtpm, real credentials."""
import hashlib

import pytest

from attestation.session import CredentialError
from sitsd.plcsim import SessionAcceptor, also_accepted_models, build_parser, freshness_options, measurement_pins

from .test_session import MODEL, command
from .test_session_measured import CONFIG, POST, PRE, bound, started


def acceptor(tmp_path, signer, *argv) -> SessionAcceptor:
    key = tmp_path / "device.pub.pem"
    key.write_bytes(signer.device_public_key_pem())
    args = build_parser().parse_args(["--trust-device-key", str(key), "--model-sha256", MODEL.hex(), *argv])
    return SessionAcceptor(key, MODEL, {**freshness_options(args), **measurement_pins(args)})


def test_pins_accept_what_runs_and_refuse_anything_else(swtpm, tmp_path):
    signer, log = started(swtpm, tmp_path)
    try:
        nonce, cred = bound(signer, log)
        data = cred.to_cbor()
        good = acceptor(tmp_path, signer, "--expect-module", f"pre={PRE}", "--expect-module", f"post={POST.upper()}",
                        "--expect-config-sha256", CONFIG)
        verify = good(data, nonce)
        assert verify(signer.sign_command(command(1)))[0] == 1
        other = hashlib.sha256(b"another config").hexdigest()
        for argv, code in ((["--expect-config-sha256", other], "config"),
                           (["--expect-module", f"post={other}"], "module"),
                           (["--expect-module", f"pre={PRE}"], "module")):  # post runs too: pins are the whole set
            nonce, cred = bound(signer, log)
            with pytest.raises(CredentialError) as info:
                acceptor(tmp_path, signer, *argv)(cred.to_cbor(), nonce)
            assert info.value.code == code, (argv, info.value)
    finally:
        signer.close()


@pytest.mark.parametrize("argv, message", [
    (["--expect-module", "middle=" + "0" * 64], "STAGE pre or post"),
    (["--expect-module", "pre"], "STAGE=SHA256"),
    (["--expect-module", "pre=abc"], "64 hex digits"),
    (["--expect-module", f"pre={PRE}", "--expect-module", f"pre={PRE}"], "given twice"),
    (["--expect-config-sha256", "zz" * 32], "64 hex digits"),
])
def test_bad_pins_are_refused_with_the_fix(argv, message):
    args = build_parser().parse_args(["--trust-key", "k.pem", *argv])
    with pytest.raises(SystemExit) as info:
        measurement_pins(args)
    assert message in str(info.value)


def test_require_measurements_is_passed_on():
    args = build_parser().parse_args(["--trust-key", "k.pem", "--require-measurements"])
    assert measurement_pins(args) == {"require_measurements": True}
    assert measurement_pins(build_parser().parse_args(["--trust-key", "k.pem"])) == {}


def test_also_accepted_models_are_checked():
    m2 = "ab" * 32
    args = build_parser().parse_args(["--trust-key", "k.pem", "--model-sha256", "cd" * 32,
                                      "--also-accept-model-sha256", m2])
    assert also_accepted_models(args, session_mode=False) == (bytes.fromhex(m2),)
    assert also_accepted_models(build_parser().parse_args(["--trust-key", "k.pem"]), session_mode=False) == ()
    assert also_accepted_models(args, session_mode=True) == (bytes.fromhex(m2),)  # tpm-session: any of them measured
    approved = build_parser().parse_args(["--trust-device-key", "d.pem", "--model-sha256", "cd" * 32,
                                          "--also-accept-model-sha256", m2, "--approval", "a.json"])
    with pytest.raises(SystemExit, match="cannot go with --approval"):
        also_accepted_models(approved, session_mode=True)
    for argv, message in ((["--model-sha256", "cd" * 32, "--also-accept-model-sha256", "xyz"], "64 digits"),
                          (["--model-sha256", "cd" * 32, "--also-accept-model-sha256", "ab" * 31], "64 digits"),
                          (["--also-accept-model-sha256", m2], "goes with --model-sha256")):
        with pytest.raises(SystemExit, match=message):
            also_accepted_models(build_parser().parse_args(["--trust-key", "k.pem", *argv]), session_mode=False)
