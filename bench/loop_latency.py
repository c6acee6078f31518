"""Loop latency on real components, with per-stage breakdown and side-by-side baselines.

    python bench/loop_latency.py [--frames N] [--json]

1. Runs the demo loop (swtpm when installed, PLC simulator process, sitsd) for N frames and
   reports the latency from the PLC's send time to the acknowledged write, and each stage.
2. Measures in the same run each fast-path choice against the obvious alternative:
   fixed-layout UADP decode vs asyncua's general decoder, pre-bound IOBinding vs
   InferenceSession.run with a feed dict, TPM2_Sign per command vs a software Ed25519 key.
The last line of stdout with --json is one JSON object: the demo summary plus "baselines".
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attestation.envelope import Command  # noqa: E402
from attestation.signers import SoftwareSigner  # noqa: E402
from ep.session import ModelRunner  # noqa: E402
from plc.uadp import FixedLayout, UadpMessage  # noqa: E402
from sitsd.demo import DEFAULT_CONFIG, human_summary, run_demo  # noqa: E402


def _time(fn, n: int) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out[i] = (time.perf_counter_ns() - t0) / 1e3
    return out


def _pair(name: str, ours, baseline, n: int) -> dict:
    a, b = _time(ours, n), _time(baseline, n)
    pa, pb = float(np.median(a)), float(np.median(b))
    return {"name": name, "ours_p50_us": round(pa, 2), "baseline_p50_us": round(pb, 2),
            "ours_p99_us": round(float(np.percentile(a, 99)), 2), "baseline_p99_us": round(float(np.percentile(b, 99)), 2),
            "speedup": round(pb / pa, 2)}


def baselines(n: int) -> list[dict]:
    from asyncua.common.utils import Buffer
    from asyncua.pubsub.uadp import UadpNetworkMessage

    results = []
    layout = FixedLayout(6)
    data = layout.encode(UadpMessage(7, 1, 1, 1, 1, time.time_ns(), (4.0, 3.0, 1.4, 8000.0, 120.0, 2.6)))
    out = np.zeros(6)
    results.append(_pair("uadp decode: fixed layout vs asyncua UadpNetworkMessage.from_binary",
                         lambda: layout.decode_into(data, out),
                         lambda: UadpNetworkMessage.from_binary(Buffer(data)), n))

    runner = ModelRunner(Path(DEFAULT_CONFIG).parent / "models" / "rolling_mill.onnx", 6, 1)
    x = np.array([[4.0, 3.0, 1.4, 8000.0, 120.0, 2.6]], dtype=np.float32)
    runner.input[:] = x
    sess, feed = runner.session, {runner.input_name: x}
    results.append(_pair("model call: pre-bound IOBinding vs InferenceSession.run(feed dict)",
                         runner.run, lambda: sess.run(None, feed), n))

    model = hashlib.sha256(b"bench").digest()
    soft = SoftwareSigner()
    seq = iter(range(1, 10**9))
    cmd = lambda: Command("ns=2;s=Cmd", (0.01,), next(seq), 0, time.time_ns(), 0, model)  # noqa: E731
    try:
        from attestation.tpm import Swtpm, TpmSigner, swtpm_available

        if swtpm_available():
            with Swtpm() as sw:
                tpm = TpmSigner(sw.tcti)
                try:
                    results.append(_pair("signing: software Ed25519 vs TPM2_Sign ECDSA P-256 (swtpm)",
                                         lambda: soft.sign_command(cmd()), lambda: tpm.sign_command(cmd()),
                                         min(n, 500)))
                finally:
                    tpm.close()
    except Exception as exc:  # a benchmark reports what it could not measure instead of failing
        results.append({"name": "signing", "error": str(exc)})
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=2000, help="frames to run through the loop (default 2000, 100 Hz)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--iterations", type=int, default=2000, help="iterations per baseline pair")
    ap.add_argument("--software", action="store_true", help="sign with a software key in the loop run")
    args = ap.parse_args()

    result = run_demo(seconds=None, frames=args.frames, force_software=args.software, progress=sys.stderr)
    print(human_summary(result))
    pairs = baselines(args.iterations)
    print("\nfast path vs baseline (p50, same run):")
    for p in pairs:
        if "error" in p:
            print(f"  {p['name']}: not measured ({p['error']})")
        else:
            print(f"  {p['name']}: {p['ours_p50_us']} us vs {p['baseline_p50_us']} us  ({p['speedup']}x)")
    if args.json:
        print(json.dumps({**result, "baselines": pairs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
