"""Trains the demo model: the roll-gap correction that holds exit thickness on target.

Data comes from the simulator's physics (plc/simulator/physics.py): random mill states
(entry thickness, roll heating, strip hardness, tension, current gap), their noisy sensor
readings in the config's signal order, and as label the correction that puts the exit
thickness exactly on target. A small MLP with the input normalisation baked in is trained
in torch 2.13 and exported to ONNX (opset 17, input "signals" [batch, 6], output "command"
[batch, 1], millimetres). The network is a small ReLU MLP (6->16->16->1) whose output head is
`limit * clip(., -1, 1)`: the command is inside ±limit for every input by construction, which
`sitsctl check` then proves on the ONNX graph (IBP and CROWN), so the actuator limits hold
before the safety envelope has to clamp anything. ReLU and clip (rather than tanh) keep the
network exactly expressible as a small Groth16 circuit (attestation/zk/compiler.py): the demo's
policy compiles to a few hundred constraints and is proven whole, see docs/zk.md.

    python examples/train_demo_model.py --output examples/models/rolling_mill.onnx
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from plc.simulator.physics import Disturbance, MillParameters, Stand, ideal_correction  # noqa: E402


def make_dataset(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    p = MillParameters()
    rng = np.random.default_rng(seed)
    x = np.zeros((n, 6), dtype=np.float64)
    y = np.zeros((n, 1), dtype=np.float64)
    stand = Stand(p, dt=0.01)
    scale = np.array([p.noise_thickness_mm, p.noise_thickness_mm, p.noise_gap_mm,
                      p.noise_force_kn, p.noise_tension_kn, p.noise_speed_m_s])
    for i in range(n):
        d = Disturbance(
            entry_thickness=p.entry_nominal + rng.uniform(-0.08, 0.08),
            roll_heating=rng.uniform(0.0, 1.2 * p.heating_max_mm),
            plasticity=p.plasticity * rng.uniform(0.9, 1.1),
            tension=p.nominal_tension + rng.uniform(-15.0, 15.0),
            noise=rng.standard_normal(6) * scale,
        )
        target = ideal_correction(p, d.entry_thickness, d.roll_heating, d.plasticity, d.tension)
        stand.gap = p.nominal_gap + target + rng.uniform(-0.06, 0.06)  # near where the loop operates
        stand.step(stand.gap - p.nominal_gap, d)  # settle the state at that gap (no actuator motion)
        stand.measure(d, x[i])
        y[i, 0] = target
    return x, y


class GapModel(torch.nn.Module):
    def __init__(self, mean: np.ndarray, std: np.ndarray, limit: float) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))
        self.limit = limit
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, signals: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.net((signals - self.mean) / self.std), -1.0, 1.0) * self.limit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=Path("examples/models/rolling_mill.onnx"))
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--limit", type=float, default=0.14,
                    help="bound of the output head in mm; below the actuator limit of the config (0.15)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    x, y = make_dataset(args.samples, args.seed)
    xv, yv = make_dataset(5000, args.seed + 1)
    # Beyond the actuator's reach the best command is the nearest limit; the clip head saturates there.
    reach = 0.98 * args.limit
    print(f"{np.mean(np.abs(y) > reach) * 100:.1f}% of labels beyond ±{reach:.3f} mm, clipped to it")
    y, yv = np.clip(y, -reach, reach), np.clip(yv, -reach, reach)
    model = GapModel(x.mean(0), x.std(0), args.limit)
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)
    for epoch in range(args.epochs):
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 512):
            idx = perm[i:i + 512]
            loss = torch.nn.functional.mse_loss(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
        if epoch % 10 == 9 or epoch == args.epochs - 1:
            with torch.no_grad():
                err = (model(torch.tensor(xv, dtype=torch.float32)) - torch.tensor(yv, dtype=torch.float32)).abs()
            print(f"epoch {epoch + 1}: held-out mean |error| {err.mean().item() * 1000:.2f} um, "
                  f"max {err.max().item() * 1000:.2f} um", flush=True)

    model.eval()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(model, (torch.zeros(1, 6),), str(args.output), input_names=["signals"],
                      output_names=["command"], dynamic_axes={"signals": {0: "batch"}, "command": {0: "batch"}},
                      opset_version=17, dynamo=False)
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
