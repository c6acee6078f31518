"""The demo runs its model as a compiled artifact: `examples/compile-demo-model.sh` (the exact
`sitsctl compile` command) compiles the config's .onnx into a cache directory on first use, keyed by
the script, the model and the calibration recipe, so nothing compiled is committed."""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from .config import Config, load_config

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPE = REPO_ROOT / "examples" / "compile-demo-model.sh"
CALIBRATION_ROWS, CALIBRATION_SEED = 512, 0
ARTIFACT_DIR = "rolling_mill.artifact"


def calibration(cfg: Config, rows: int = CALIBRATION_ROWS, seed: int = CALIBRATION_SEED) -> np.ndarray:
    """`rows` frames, each model input uniform over its signal's range (float32, seeded)."""
    by_name = {s.name: s for s in cfg.signals}
    lower = np.array([by_name[n].lower for n in cfg.model.inputs])
    upper = np.array([by_name[n].upper for n in cfg.model.inputs])
    rng = np.random.default_rng(seed)
    return (lower + (upper - lower) * rng.random((rows, len(lower)))).astype(np.float32)


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sits2026" / "demo-model"


def compiled_artifact(config_path: Path, cfg: Config, say=print, cache: Path | None = None) -> Path:
    """The artifact of the config's .onnx compiled by the recipe; compiled now unless already cached."""
    model = Path(cfg.model.artifact)
    key = hashlib.sha256(RECIPE.read_bytes() + model.read_bytes() + calibration(cfg).tobytes()).hexdigest()[:16]
    out = (cache or cache_root()) / key
    artifact = out / ARTIFACT_DIR
    if (artifact / "manifest.json").is_file():
        say(f"model: compiled artifact {artifact} (cached; recipe {RECIPE.relative_to(REPO_ROOT)})")
        return artifact
    say(f"model: compiling {model.name} into {artifact} with {RECIPE.relative_to(REPO_ROOT)} (first run)")
    r = subprocess.run(["sh", str(RECIPE), str(out), str(config_path), str(model)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHON=sys.executable), cwd=REPO_ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{RECIPE.name} failed ({r.returncode}):\n{r.stderr[-2000:]}\n  fix: run it by hand "
                           f"(sh {RECIPE} {out}) to see why, or run the demo on the plain model with --onnx")
    return artifact


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sitsd.demo_model", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibration", help="write the demo's calibration frames (.npy) for a config")
    c.add_argument("--config", type=Path, required=True)
    c.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    np.save(args.output, calibration(load_config(args.config)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
