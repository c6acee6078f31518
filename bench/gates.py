"""Per-frame cost of the gates at plant scale: 64 signals and 32 linear constraints.

    python bench/gates.py [--frames N] [--json]

The compiled constraint gate runs side by side with `evaluate_directly`, the same rules evaluated
one by one in plain Python, on the same admissible frames; the timestamp gate is timed too.
The target from the design: <= 20 us per frame for the constraint gate on the 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plc.frame import Frame, RxStampSource  # noqa: E402
from sitsd.config import LinearConstraint, Signal  # noqa: E402
from sitsd.gates import ConstraintGate, TimestampGate  # noqa: E402
from sitsd.gates.constraints import evaluate_directly  # noqa: E402

TARGET_US = 20.0


def plant(seed: int = 3) -> tuple[list[Signal], list[LinearConstraint], np.ndarray]:
    """48 analog signals with rate limits, 8 counters, 4 modes, 4 status words; 32 constraints, 8 conditional."""
    rng = np.random.default_rng(seed)
    signals = [Signal(name=f"a{i}", unit="u", min=0.0, max=100.0, max_rate=1e4) for i in range(48)]
    signals += [Signal(name=f"n{i}", unit="1", type="int", min=0, max=1000) for i in range(8)]
    signals += [Signal(name=f"m{i}", unit="1", type="enum", values=[0, 1, 2, 3]) for i in range(4)]
    signals += [Signal(name=f"s{i}", unit="1", type="bits", mask=0xFF) for i in range(4)]
    constraints = []
    for k in range(32):
        picks = rng.choice(48, size=4, replace=False)
        coefs = {f"a{j}": float(rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 2.0)) for j in picks}
        when = f"m{k % 4} == 2" if k < 8 else None
        constraints.append(LinearConstraint(name=f"c{k}", coefficients=coefs, min=-400.0, max=400.0, when=when))
    frame = np.concatenate([rng.uniform(20, 80, 48), rng.integers(0, 1000, 8), rng.integers(0, 4, 4),
                            rng.integers(0, 256, 4)]).astype(float)
    return signals, constraints, frame


def _time(fn, n: int) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter_ns()
        fn(i)
        out[i] = (time.perf_counter_ns() - t0) / 1e3
    return out


def _summary(us: np.ndarray) -> dict:
    return {"p50": round(float(np.percentile(us, 50)), 2), "p99": round(float(np.percentile(us, 99)), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args()

    signals, constraints, frame = plant()
    gate = ConstraintGate(signals, constraints)
    assert evaluate_directly(signals, constraints, frame.tolist()) is None, "bench frame must be admissible"
    period = 10_000_000  # 100 Hz sender timestamps
    values = [frame.copy() for _ in range(2)]
    compiled = _time(lambda i: gate.check(values[i & 1], 1_000_000_000 + i * period), args.frames)
    assert gate.check(frame.copy(), 1_000_000_000 + args.frames * period) == -1
    windowed_signals = [s.model_copy(update={"rate_window_ms": 20.0}) if s.max_rate else s for s in signals]
    wgate = ConstraintGate(windowed_signals, constraints)
    windowed = _time(lambda i: wgate.check(values[i & 1], 1_000_000_000 + i * period), args.frames)
    listed = frame.tolist()
    direct = _time(lambda i: evaluate_directly(signals, constraints, listed, listed, 0.01), max(args.frames // 10, 500))

    ts_gate = TimestampGate(5_000_000, 1_000_000)
    now = time.time_ns()
    frames = [Frame(7, 1, (i + 1) & 0xFFFF, now + i * period, now + i * period + 50_000, RxStampSource.SOFTWARE, frame)
              for i in range(args.frames)]
    ts = _time(lambda i: ts_gate.check(frames[i]), args.frames)

    r = {"signals": len(signals), "constraints": len(constraints),
         "conditional_constraints": sum(c.when is not None for c in constraints),
         "constraint_gate_us": _summary(compiled), "constraint_gate_rate_window_us": _summary(windowed),
         "direct_evaluation_us": _summary(direct),
         "speedup": round(float(np.median(direct) / np.median(compiled)), 1),
         "timestamp_gate_us": _summary(ts), "target_us": TARGET_US,
         "meets_target": bool(np.median(compiled) <= TARGET_US)}
    print(f"{r['signals']} signals, {r['constraints']} linear constraints ({r['conditional_constraints']} conditional), "
          f"{args.frames} frames:")
    print(f"  compiled constraint gate   p50 {r['constraint_gate_us']['p50']} us  p99 {r['constraint_gate_us']['p99']} us"
          f"  (target <= {TARGET_US:g} us: {'met' if r['meets_target'] else 'NOT met'})")
    print(f"  ... with 20 ms rate windows p50 {r['constraint_gate_rate_window_us']['p50']} us  "
          f"p99 {r['constraint_gate_rate_window_us']['p99']} us")
    print(f"  direct evaluation          p50 {r['direct_evaluation_us']['p50']} us  ({r['speedup']}x slower)")
    print(f"  timestamp gate             p50 {r['timestamp_gate_us']['p50']} us  p99 {r['timestamp_gate_us']['p99']} us")
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
