"""Coverage-guided fuzzing (atheris/libFuzzer) of everything that parses outside input: UADP, configs,
the constraint language, command envelopes, and the Groth16 proof, public-signal, verification-key
and iden3 binary readers.

    python tests/fuzz/harness.py TARGET [libFuzzer flags] [CORPUS_DIR ...]

TARGET is one of the names in TARGETS. Each target feeds the fuzzer's bytes to one reader and
accepts exactly one outcome besides success: that reader's own typed error (a clear message for
the operator). Any other exception is a crash, and libFuzzer's -timeout turns a hang into one;
both stop the run with a non-zero exit code and the offending input written as crash-*/timeout-*.
tests/fuzz/test_atheris.py runs every target for a bounded number of inputs in CI; run one
longer by hand, e.g. `-max_total_time=600`.
"""
from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path

import atheris

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

with atheris.instrument_imports():
    import numpy as np
    from pydantic import ValidationError

    from attestation.envelope import EnvelopeVerifier, decode as decode_envelope
    from attestation.zk import ZkError, verify as zk_verify
    from attestation.zk.formats import r1cs_file, snarkjs_json, wtns, zkey
    from attestation.errors import AttestationError
    from attestation.session import SessionCredential
    from plc.errors import UadpDecodeError
    from plc.uadp import decode as decode_uadp
    from sitsd.config import load_config
    from sitsd.errors import ConfigError
    from sitsd.gates.constraints import ConstraintGate, evaluate_directly
    from sitsd.schema import LinearConstraint, Signal


class Finding(AssertionError):
    """The reader misbehaved: libFuzzer reports this as a crash with the input that caused it."""


# -- UADP ----------------------------------------------------------------------------------------

def fuzz_uadp(data: bytes) -> None:
    try:
        decode_uadp(data)
    except UadpDecodeError as exc:
        # the decoder wraps anything unexpected as "internal decoder error": that is a bug, not a reject
        if "internal decoder error" in str(exc):
            raise Finding(str(exc)) from exc
        if not 0 <= exc.offset <= len(data):
            raise Finding(f"error offset {exc.offset} outside the {len(data)}-byte message: {exc}") from exc


# -- config loader -------------------------------------------------------------------------------

_CONFIG_DIR = Path(tempfile.mkdtemp(prefix="sits-fuzz-config-"))
_CONFIG = _CONFIG_DIR / "fuzzed.yaml"


def fuzz_config(data: bytes) -> None:
    _CONFIG.write_bytes(data)
    try:
        load_config(_CONFIG)
    except ConfigError as exc:
        if not str(exc).startswith(str(_CONFIG)) and "invalid config" not in str(exc):
            raise Finding(f"config error does not name the file: {exc}") from exc


# -- the constraint language (compiled checker against the rules read one at a time) -------------

_NAMES = ["a", "b", "c", "d", "mode"]


def _signal(fdp: atheris.FuzzedDataProvider, name: str) -> dict:
    kind = fdp.PickValueInList(["float", "int", "bool", "enum", "bits"])
    spec: dict = {"name": name, "unit": "1", "type": kind,
                  "on_invalid": fdp.PickValueInList(["failsafe", "drop"])}
    if kind in ("float", "int"):
        lo = fdp.ConsumeIntInRange(-64, 64) / 8
        spec.update(min=lo, max=lo + fdp.ConsumeIntInRange(0, 128) / 8)
    elif kind == "enum":
        spec["values"] = [fdp.ConsumeIntInRange(-8, 8) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    elif kind == "bits":
        spec["mask"] = fdp.ConsumeIntInRange(0, 255)
    if fdp.ConsumeBool():
        spec["max_rate"] = fdp.ConsumeIntInRange(-1, 64) / 4
    return spec


def _constraint(fdp: atheris.FuzzedDataProvider, k: int) -> dict:
    spec: dict = {"name": f"rule{k}",
                  "coefficients": {fdp.PickValueInList(_NAMES): fdp.ConsumeIntInRange(-16, 16) / 4
                                   for _ in range(fdp.ConsumeIntInRange(0, 3))}}
    if fdp.ConsumeBool():
        spec["max"] = fdp.ConsumeIntInRange(-64, 64) / 8
    if fdp.ConsumeBool():
        spec["min"] = fdp.ConsumeIntInRange(-64, 64) / 8
    if fdp.ConsumeBool():  # the `when:` mini-language, from free text
        spec["when"] = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 40))
    return spec


def fuzz_constraints(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    signals = []
    for name in _NAMES[:fdp.ConsumeIntInRange(1, len(_NAMES))]:
        try:
            signals.append(Signal.model_validate(_signal(fdp, name)))
        except ValidationError:
            return  # a rejected signal definition is the clear error we want
    known = {s.name for s in signals}
    rules = []
    for k in range(fdp.ConsumeIntInRange(0, 4)):
        try:
            rule = LinearConstraint.model_validate(_constraint(fdp, k))
        except ValidationError:
            continue
        # names must exist (the config loader's cross-check says so); so must the `when` signals
        if set(rule.coefficients) <= known and all(c.signal in known for c in rule.conditions):
            rules.append(rule)
    gate = ConstraintGate(signals, rules)
    prev, prev_t = None, 0  # the last accepted frame: rates are measured from it, not from a rejected one
    t_ns = 1_000_000_000
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        values = [fdp.PickValueInList([math.nan, math.inf, -math.inf]) if fdp.ConsumeProbability() < 0.05
                  else fdp.ConsumeIntInRange(-80, 80) / 8 for _ in signals]
        dt_ns = fdp.ConsumeIntInRange(1, 2_000_000_000)
        t_ns += dt_ns
        got = gate.check(np.array(values, dtype=float), t_ns)
        if not -1 <= got < len(gate.names):
            raise Finding(f"checker returned index {got} for {len(gate.names)} rules")
        want = evaluate_directly(signals, rules, values, prev, (t_ns - prev_t) * 1e-9 if prev is not None else None)
        name = None if got < 0 else gate.names[got]
        if name != want:
            raise Finding(f"compiled checker says {name!r}, the rules read plainly say {want!r} "
                          f"for {values} (signals {signals}, rules {rules})")
        if got >= 0:
            gate.describe(got, np.array(values, dtype=float))  # the alert text must render too
        else:
            prev, prev_t = values, t_ns


# -- command envelopes and session credentials ---------------------------------------------------

_VERIFIER = None


def _verifier() -> EnvelopeVerifier:
    global _VERIFIER
    if _VERIFIER is None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.derive_private_key(0x5175, ec.SECP256R1())  # fixed: the same verifier in every run
        pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        # offline: fuzz inputs carry any times; the time checks are a few comparisons, covered by the unit tests
        _VERIFIER = EnvelopeVerifier(pem, None, freshness=False)
    return _VERIFIER


def fuzz_envelope(data: bytes) -> None:
    try:
        decode_envelope(data)
    except AttestationError:
        pass
    try:
        _verifier().verify(data)
    except AttestationError:
        pass
    try:
        SessionCredential.from_cbor(data)
    except AttestationError:
        pass


# -- Groth16 proofs, public signals, verification keys (snarkjs JSON) and iden3 binary files --------

def fuzz_zk_json(data: bytes) -> None:
    """Bytes as JSON documents: a proof, public signals and a verification key, then a verification
    of the three together (points must be on the curve and in the subgroup: a clear ZkError)."""
    import json

    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return
    parts = doc if isinstance(doc, list) and len(doc) == 3 else [doc, doc, doc]
    try:
        proof = snarkjs_json.proof_from_json(parts[0])
        public = snarkjs_json.public_from_json(parts[1])
        vk = snarkjs_json.vk_from_json(parts[2])
    except ZkError:
        return
    try:
        result = zk_verify(vk, public, proof)
    except ZkError:
        return
    if result is not False and result is not True:
        raise Finding(f"verify returned {result!r}, not a bool")


def fuzz_zk_bin(data: bytes) -> None:
    """Bytes as .r1cs, .wtns and .zkey files: each reader either returns or raises ZkError."""
    for reader in (r1cs_file.loads, wtns.loads, zkey.loads):
        try:
            reader(data)
        except ZkError:
            pass


TARGETS = {"uadp": fuzz_uadp, "config": fuzz_config, "constraints": fuzz_constraints, "envelope": fuzz_envelope,
           "zk_json": fuzz_zk_json, "zk_bin": fuzz_zk_bin}


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        raise SystemExit(f"usage: {argv[0]} TARGET [libFuzzer flags] [CORPUS ...]; TARGET is one of "
                         f"{', '.join(TARGETS)}")
    target = TARGETS[argv[1]]
    atheris.Setup([argv[0], *argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main(sys.argv)
