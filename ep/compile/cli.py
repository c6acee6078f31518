"""`sitsctl compile MODEL.onnx --target cpu --quantization {none,fp8-adaptive,int8} [--compute {fp32,int8-blocks}]
--kv-cache-policy {none,window,tiered} --calibration DATA.npy --output DIR`: progress on stderr, a summary on stdout, exit 0 / 1 (compile
error) / 2 (usage)."""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import CompileError
from ..lowering import COMPUTE_MODES
from .pipeline import KV_CACHE_POLICIES, MODES, TARGETS, compile_model

EPILOG = """examples:
  sitsctl compile examples/models/rolling_mill.onnx --calibration calib.npy --output /var/lib/sitsd/model
  sitsctl compile model.onnx --quantization int8 --calibration calib.npy --output art --force --json
  sitsctl compile stream.onnx --kv-cache-policy tiered --window 256 --page-tokens 16 --warm-codec int8 \
      --warm-pages 8 --cold-slots 256 --calibration frames.npy --output stream.artifact

The calibration file is a .npy array shaped like the model input with the batch axis first (N samples,
N >= 8, taken from the ranges the model will see); 25% of it is held out for the accuracy report.
For a streaming model (python -m sitsd.model export-streaming) it is one stream of frames (N, n_inputs),
run token by token; the last 25% are held out. --kv-cache-policy window/tiered and its parameters go
into the manifest and the runtime reads them from there; an MLP takes --kv-cache-policy none.
The artifact SHA-256 printed at the end is what the daemon reports and the TPM measures."""


def build_parser(prog: str = "sitsctl compile") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Compile an ONNX model into a verified SITS model artifact.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL.onnx", help="the FP32 ONNX model")
    p.add_argument("--target", choices=TARGETS, default="cpu")
    p.add_argument("--quantization", choices=MODES, default="fp8-adaptive",
                   help="weight format: fp8-adaptive (E4M3/E5M2 per layer, storage only), int8 (dynamic, "
                        "faster on VNNI CPUs), none")
    p.add_argument("--compute", choices=COMPUTE_MODES, default="fp32",
                   help="fp8-adaptive: fp32 (FP8 folded to FP32 at load; what ep.bounds and the proof circuit "
                        "analyse) or int8-blocks (large FP8 layers re-quantized at load to int8 blocks, "
                        "MatMulNBits with int8 activations: faster at batch 1, error in the accuracy report; "
                        "not covered by bounds certificates or proofs)")
    p.add_argument("--kv-cache-policy", choices=KV_CACHE_POLICIES, default="none",
                   help="streaming models: window (hot sliding window; pages that slide out are dropped) or "
                        "tiered (hot window, warm compressed pages, cold slots in a file); MLPs: none")
    kv = p.add_argument_group("KV cache (--kv-cache-policy window or tiered)")
    kv.add_argument("--window", type=int, help="tokens attention always sees (default 256)")
    kv.add_argument("--page-tokens", type=int, help="tokens per KV page (default 16)")
    kv.add_argument("--warm-codec", help="tiered: archived page format, int8 or float8e4m3fn (default int8)")
    kv.add_argument("--warm-pages", type=int, help="tiered: pages per stream in RAM (default 8)")
    kv.add_argument("--cold-slots", type=int, help="tiered: pages per stream in the cold file (default 256)")
    p.add_argument("--calibration", metavar="DATA.npy", required=True,
                   help="calibration inputs, shape (N, ...) matching the model input")
    p.add_argument("--output", metavar="DIR", required=True, help="artifact directory to create")
    p.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    p.add_argument("--max-layer-error", type=float, default=0.25,
                   help="fp8: a layer whose best relative output error exceeds this stays FP32 (default 0.25)")
    p.add_argument("--json", action="store_true", help="print the manifest summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def summary(manifest, output) -> str:
    d = manifest.data
    acc, sizes, ops = d["accuracy"], d["sizes"], d["operator_counts"]
    lines = [f"artifact {output}",
             f"  sha256        {manifest.artifact_sha256}",
             f"  quantization  {d['quantization']['mode']}"]
    for layer in d["quantization"]["layers"]:
        err = (layer.get("output_rel_error") or layer.get("weight_rel_error") or {}).get(layer["format"])
        where = ", ".join(layer["nodes"])
        lines.append(f"    {where:<28} {layer['format']:<13} layer rel. error {err:.3g}" if err is not None
                     else f"    {where:<28} {layer['format']}")
    for note in d["quantization"]["notes"]:
        lines.append(f"    note: {note}")
    ratio = sizes["ratio_to_source_weights"]
    lines += [f"  size          {sizes['artifact_bytes']} bytes (model.onnx + weights.sitsw)"
              + (f", {ratio:.2f} x the source weights ({sizes['source_weight_bytes']} bytes)" if ratio else ""),
              f"  operators     {ops['total_before']} -> {ops['total_after']}",
              *([f"  compute       int8-blocks: {len(d['runtime']['compute']['layers'])} layer(s) as int8 blocks "
                 f"of {d['runtime']['compute']['block_size']} (MatMulNBits) at load"]
                if d.get("runtime", {}).get("compute") else []),
              "  kv cache      " + (", ".join(f"{k} {v}" for k, v in d["kv_cache_policy"].items())
                                     if isinstance(d["kv_cache_policy"], dict) else d["kv_cache_policy"]),
              f"  error vs FP32 max {acc['max_abs_error']:.3g}, mean {acc['mean_abs_error']:.3g} "
              f"(held out: max {acc['held_out']['max_abs_error']:.3g}); stated bound {acc['stated_max_abs_error']:.3g}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)

    def progress(msg: str) -> None:
        print(f"compile: {msg}", file=sys.stderr, flush=True)

    try:
        manifest = compile_model(args.model, args.output, quantization=args.quantization,
                                 calibration=args.calibration, target=args.target,
                                 progress=None if args.quiet else progress, kv_cache_policy=args.kv_cache_policy,
                                 fp8_max_layer_error=args.max_layer_error, overwrite=args.force,
                                 compute=args.compute,
                                 kv_params={k: getattr(args, k) for k in ("window", "page_tokens", "warm_codec",
                                                                          "warm_pages", "cold_slots")})
    except CompileError as exc:
        print(f"sitsctl compile: error: {exc}", file=sys.stderr)
        return 1
    print(summary(manifest, args.output))
    if args.json:
        d = manifest.data
        print(json.dumps({"artifact": str(args.output), "sha256": manifest.artifact_sha256,
                          "quantization": d["quantization"]["mode"], "sizes": d["sizes"],
                          "accuracy": {k: d["accuracy"][k] for k in ("max_abs_error", "mean_abs_error",
                                                                      "stated_max_abs_error")},
                          "operator_counts": d["operator_counts"]}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
