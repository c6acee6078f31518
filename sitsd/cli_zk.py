"""`sitsctl zk-setup`, `sitsctl prove` and `sitsctl verify-proof`: Groth16 proofs of the deployed model.

An auditor needs only `verify-proof` (or `snarkjs groth16 verify`) with vk.json, the proof and its
public signals; the config is only needed to decode the signals into units.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from attestation.zk import ZkError, available_backends, prepare, prove, verify
from attestation.zk.formats import snarkjs_json as sj


BACKENDS = ["int", "gmpy2", "mcl"]  # attestation/zk/backend.py, slowest first


def _backend(name: str | None) -> str:
    """The backend `--backend` names, or the fastest installed one (the daemon's choice); ZkError
    saying why a named backend cannot be used here."""
    from attestation.zk import backend

    if name is None:
        return available_backends()[-1]
    try:
        backend.get(name)
    except ZkError as e:
        hint = (f"mcl needs the mclbn256 wheel, which exists for x86_64 only (this machine: "
                f"{platform.machine() or 'unknown'}); " if name == "mcl" else "")
        raise ZkError(f"{e}; {hint}installed here: {', '.join(available_backends())} (without --backend the "
                      "fastest of them is used)") from None
    return name


def register(sub: argparse._SubParsersAction) -> None:
    su = sub.add_parser(
        "zk-setup", help="compile the config's model to a Groth16 circuit and make its keys",
        description="Compiles the model of --config (over the config's signal ranges) to an R1CS circuit and runs "
        "a DEVELOPMENT single-party Groth16 setup: the keys work with snarkjs, but whoever ran the setup could "
        "forge proofs. For production pass --ptau (a multi-party phase-1 file), then run `snarkjs zkey contribute` "
        "on the written circuit.zkey (phase 2) and `snarkjs zkey export verificationkey`. Writes circuit.r1cs, "
        "circuit.zkey, vk.json, circuit.json.")
    su.add_argument("--config", type=Path, required=True, help="sitsd config whose model and ranges define the circuit")
    su.add_argument("--out", type=Path, required=True, help="directory for the keys")
    su.add_argument("--ptau", type=Path, default=None,
                    help="start from this snarkjs phase-1 .ptau instead (production): writes the key `snarkjs groth16 "
                    "setup` would write, to be finished with `snarkjs zkey contribute` (phase 2)")
    su.set_defaults(func=_cmd_setup)

    pr = sub.add_parser(
        "prove", help="prove one command: the model's output for given inputs, as snarkjs JSON",
        description="Proves that the model of --config maps --input to the output in public.json. Public signals "
        "(snarkjs order): the outputs, the model SHA-256 as two 128-bit numbers, the quantized inputs, then the "
        "context signals (integer signals such as mill_mode that conditional constraints read). Uses the "
        "keys in --keys (made by a development setup there if missing or stale). Writes proof.json and "
        "public.json to --out and copies vk.json next to them.")
    pr.add_argument("--config", type=Path, required=True, help="sitsd config (model, signal ranges)")
    pr.add_argument("--input", required=True,
                    help="model inputs in config order, comma separated (e.g. 4.0,3.0,2.4,9000,120,2.5)")
    pr.add_argument("--context", default="", metavar="NAME=VALUE,...",
                    help="values of the circuit's context signals (e.g. mill_mode=2); `sitsctl zk-setup` and "
                    "the error message list them; required when the config has conditional constraints")
    pr.add_argument("--keys", type=Path, required=True, help="key directory (see zk-setup)")
    pr.add_argument("--out", type=Path, required=True, help="directory for proof.json, public.json, vk.json")
    pr.add_argument("--backend", choices=BACKENDS, default=None,
                    help="prover backend: mcl (libmcl native MSM from the mclbn256 wheel, x86_64 only; what the "
                    "daemon uses where installed), gmpy2, or int (pure Python). Default: the fastest installed, "
                    "as the daemon chooses. All give proofs that verify identically")
    pr.set_defaults(func=_cmd_prove)

    vp = sub.add_parser(
        "verify-proof", help="verify a Groth16 proof (snarkjs JSON); exit 0 only if valid",
        description="Checks PROOF against --vk and --public: points on the curve and in the subgroup, public signals "
        "below the field order, and the Groth16 pairing equation. Exit 0: valid. Exit 1: well-formed but invalid "
        "(wrong statement, tampered output, other key). Exit 2: a file is missing or malformed.")
    vp.add_argument("proof", type=Path, metavar="PROOF.json")
    vp.add_argument("--vk", type=Path, required=True, metavar="VK.json", help="verification key (snarkjs format)")
    vp.add_argument("--public", type=Path, required=True, metavar="PUBLIC.json", help="public signals")
    vp.add_argument("--config", type=Path, default=None,
                    help="optional: decode the public signals into the config's units")
    vp.set_defaults(func=_cmd_verify)


def _cmd_setup(args: argparse.Namespace) -> int:
    from .config import load_config
    from .prover import KeyDir, circuit_for_config

    from attestation.zk import dev_setup
    from attestation.zk.formats import ptau
    from attestation.zk.setup import from_ptau

    try:
        cm = circuit_for_config(load_config(args.config))
        t = time.perf_counter()
        if args.ptau is not None:
            pk = from_ptau(cm.circuit.r1cs, ptau.read(args.ptau))
            how = f"phase 1 from {args.ptau.name}; phase 2 not contributed yet (run snarkjs zkey contribute)"
        else:
            pk = dev_setup(cm.circuit.r1cs)
            how = "development single-party setup (toxic waste discarded, not auditable)"
        KeyDir(args.out).write(cm, pk, how)
    except ZkError as e:
        print(f"sitsctl zk-setup: {e}", file=sys.stderr)
        return 2
    print(cm.describe())
    print(f"{how}: {time.perf_counter() - t:.1f} s -> {args.out}/circuit.zkey, vk.json (see docs/zk.md)")
    return 0


def _cmd_prove(args: argparse.Namespace) -> int:
    from .config import load_config
    from .prover import circuit_for_config, ensure_keys

    try:
        values = [float(v) for v in args.input.split(",")]
    except ValueError:
        print(f"sitsctl prove: --input must be numbers separated by commas, got {args.input!r}", file=sys.stderr)
        return 2
    try:
        be = _backend(args.backend)
        cfg = load_config(args.config)
        cm = circuit_for_config(cfg)
        ctx = _context_values(args.context, cm.context_names)
        w = cm.witness(values, ctx)  # before any setup: an inadmissible input fails fast
        cm, pk = ensure_keys(cfg, args.keys, cm)
        t = time.perf_counter()
        proof = prove(prepare(pk, be), w)
        dt = time.perf_counter() - t
        args.out.mkdir(parents=True, exist_ok=True)
        public = cm.public_signals(w)
        sj.dump(args.out / "proof.json", sj.proof_to_json(proof))
        sj.dump(args.out / "public.json", sj.public_to_json(public))
        (args.out / "vk.json").write_text((Path(args.keys) / "vk.json").read_text())
    except ZkError as e:
        print(f"sitsctl prove: {e}", file=sys.stderr)
        return 2
    outs = ", ".join(f"{n} = {v:.6g}" for n, v in zip(cm.circuit.output_names, cm.decode_outputs(public)))
    print(f"proved {outs} (quantization error <= {max(cm.error_bound):.3g}) in {dt:.2f} s ({be}); "
          f"wrote {args.out}/proof.json, public.json, vk.json")
    return 0


def _context_values(text: str, names: tuple[str, ...]) -> list[float]:
    """`--context mill_mode=2,...` in the circuit's context order; ZkError names what is missing or unknown."""
    given: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        try:
            given[name.strip()] = float(value)
        except ValueError:
            raise ZkError(f"--context: write NAME=NUMBER, got {part!r}") from None
        if not sep:
            raise ZkError(f"--context: write NAME=NUMBER, got {part!r}")
    unknown = sorted(set(given) - set(names))
    missing = [n for n in names if n not in given]
    if unknown:
        raise ZkError(f"--context: {', '.join(unknown)} is not a context signal of this circuit "
                      f"(it has: {', '.join(names) or 'none'})")
    if missing:
        raise ZkError(f"--context: give {', '.join(f'{n}=VALUE' for n in missing)} (conditional constraints of the "
                      "config read them, so the circuit takes them as public signals)")
    return [given[n] for n in names]


def _cmd_verify(args: argparse.Namespace) -> int:
    try:
        vk = sj.vk_from_json(sj.load(args.vk), str(args.vk))
        public = sj.public_from_json(sj.load(args.public), str(args.public))
        proof = sj.proof_from_json(sj.load(args.proof), str(args.proof))
        ok = verify(vk, public, proof)
    except ZkError as e:
        print(f"sitsctl verify-proof: INVALID: {e}", file=sys.stderr)
        return 2
    if not ok:
        print(f"sitsctl verify-proof: INVALID: the pairing check fails; {args.proof} is not a proof of "
              f"{args.public} under {args.vk} (tampered proof or signals, or another key)", file=sys.stderr)
        return 1
    msg = f"OK: {args.proof} is a valid proof of {args.public} under {args.vk}"
    if args.config is not None:
        from .config import load_config
        from .prover import circuit_for_config

        try:
            cm = circuit_for_config(load_config(args.config))
            outs = cm.decode_outputs(public)
            ins = cm.decode_inputs(public)
            h = (public[len(outs)] << 128) | public[len(outs) + 1]
            msg += ("\n  outputs: " + ", ".join(f"{n} = {v:.6g}" for n, v in zip(cm.circuit.output_names, outs))
                    + "\n  inputs: " + ", ".join(f"{n} = {v:.6g}" for n, v in zip(cm.input_names, ins))
                    + "".join(f", {n} = {v}" for n, v in zip(cm.context_names, cm.decode_context(public)))
                    + f"\n  model SHA-256: {h:064x}" + ("" if f"{h:064x}" == cm.chain.sha256 else
                                                        f" (differs from the config's model {cm.chain.sha256})"))
        except ZkError as e:
            msg += f"\n  (cannot decode with {args.config}: {e})"
    print(msg)
    return 0
