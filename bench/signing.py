"""Per-command signing and verification cost of each signing mode, side by side in one run.

    python bench/signing.py [--commands N] [--json]

tpm-session (a session key bound by one TPM2_Quote), tpm-direct (TPM2_Sign per command, through
tpm2-pytss ESAPI), software (Ed25519 in process), and as the baseline a shell integration would
use, the `tpm2_sign` CLI against the same swtpm. Verification is the PLC side's per-command cost
(COSE_Sign1 ES256 check with replay and model checks). Needs swtpm and tpm2-tools (make test
installs both). The last line with --json is one JSON object.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attestation.envelope import Command, EnvelopeVerifier  # noqa: E402
from attestation.session import TpmSessionSigner  # noqa: E402
from attestation.signers import SoftwareSigner  # noqa: E402
from attestation.tpm import Swtpm, TpmSigner  # noqa: E402

MODEL = hashlib.sha256(b"bench model").digest()


def _commands(n: int):
    now = time.time_ns()
    return [Command("ns=2;s=RollGapCommand", (0.01 * (i % 7),), i + 1, i, now, now + 10**9, MODEL) for i in range(n)]


def _time_signing(signer, n: int) -> tuple[np.ndarray, list[bytes]]:
    out, envelopes = np.empty(n), []
    for i, cmd in enumerate(_commands(n)):
        t0 = time.perf_counter_ns()
        envelopes.append(signer.sign_command(cmd))
        out[i] = (time.perf_counter_ns() - t0) / 1e3
    return out, envelopes


def _tpm2_sign_cli(tcti: str, n: int) -> np.ndarray | None:
    exe = shutil.which("tpm2_sign")
    if exe is None:  # the baseline is part of the comparison: no silent null in the JSON
        raise SystemExit("bench/signing.py: tpm2_sign (tpm2-tools) is not installed; it is the shell-integration "
                         "baseline this bench compares with (apt install tpm2-tools, or `make setup`)")
    env = dict(os.environ, TPM2TOOLS_TCTI=tcti)
    out = np.empty(n)
    with tempfile.TemporaryDirectory() as d:
        digest = Path(d) / "digest"
        digest.write_bytes(MODEL)
        for i in range(n):
            t0 = time.perf_counter_ns()
            subprocess.run([exe, "-c", "0x81000001", "-g", "sha256", "-s", "ecdsa", "-d", "-o", str(Path(d) / "sig"),
                            str(digest)], env=env, check=True, capture_output=True)
            out[i] = (time.perf_counter_ns() - t0) / 1e3
    return out


def _p(a: np.ndarray) -> dict:
    return {"p50": round(float(np.percentile(a, 50)), 1), "p99": round(float(np.percentile(a, 99)), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commands", type=int, default=500)
    ap.add_argument("--cli-commands", type=int, default=30, help="tpm2_sign runs (a process each)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with Swtpm() as sw:
        direct = TpmSigner(sw.tcti)  # creates the device key at 0x81000001, also used by the CLI
        t_direct, direct_envelopes = _time_signing(direct, args.commands)
        direct_pem = direct.public_key_pem()
        direct.close()
        session = TpmSessionSigner(sw.tcti)
        session.measure_model(MODEL)
        t0 = time.perf_counter_ns()
        credential = session.bind(os.urandom(32))
        bind_ms = (time.perf_counter_ns() - t0) / 1e6
        t_session, envelopes = _time_signing(session, args.commands)
        session_pem = session.public_key_pem()
        session.close()
        t_cli = _tpm2_sign_cli(sw.tcti, args.cli_commands)
    soft = SoftwareSigner()
    t_soft, soft_envelopes = _time_signing(soft, args.commands)

    def verify_times(pem: bytes, envs: list[bytes]) -> np.ndarray:
        # offline: the envelopes were signed in a batch before this runs, so freshness (a clock read and a few
        # comparisons) is off and each mode's time is the decode and signature check
        verifier = EnvelopeVerifier(pem, MODEL, freshness=False)
        out = np.empty(len(envs))
        for i, env in enumerate(envs):
            t0 = time.perf_counter_ns()
            verifier.verify(env)
            out[i] = (time.perf_counter_ns() - t0) / 1e3
        return out

    # the PLC side's per-command cost for each mode's envelopes (ES256 for the TPM keys, Ed25519 for software)
    t_verify = verify_times(session_pem, envelopes)
    verify_by_mode = {"tpm_session": t_verify, "tpm_direct": verify_times(direct_pem, direct_envelopes),
                      "software": verify_times(soft.public_key_pem(), soft_envelopes)}

    rows = [("tpm-session (session key, quote-bound)", t_session), ("tpm-direct (TPM2_Sign via ESAPI)", t_direct),
            ("software (Ed25519)", t_soft)] + ([("tpm2_sign CLI (baseline)", t_cli)] if t_cli is not None else [])
    base = float(np.median(t_cli)) if t_cli is not None else float(np.median(t_direct))
    print(f"per-command signing, {args.commands} commands (swtpm on a unix socket), p50 / p99 us, speedup vs "
          f"{'the tpm2_sign CLI' if t_cli is not None else 'tpm-direct'}:")
    for name, a in rows:
        print(f"  {name:42} {np.median(a):9.1f} / {np.percentile(a, 99):9.1f}   {base / np.median(a):8.1f}x")
    print(f"  binding the session (one TPM2_Quote + parse): {bind_ms:.2f} ms; credential {len(credential.to_cbor())} B")
    print("  PLC-side verify per command, p50 / p99 us: " + ", ".join(
        f"{mode} {np.median(a):.1f} / {np.percentile(a, 99):.1f}" for mode, a in verify_by_mode.items()))
    result = {"tpm_session_us": round(float(np.median(t_session)), 1), "tpm_direct_us": round(float(np.median(t_direct)), 1),
              "software_us": round(float(np.median(t_soft)), 1),
              "tpm2_tools_cli_us": round(float(np.median(t_cli)), 1) if t_cli is not None else None,
              "verify_us": round(float(np.median(t_verify)), 1), "bind_ms": round(bind_ms, 2),
              "verify_us_by_mode": {m: round(float(np.median(a)), 1) for m, a in verify_by_mode.items()},
              "p99_us": {name.split(" ")[0]: _p(a)["p99"] for name, a in rows}}
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
