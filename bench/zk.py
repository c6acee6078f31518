"""Groth16 proving side by side: our prover per backend, the `snarkjs groth16 prove` CLI, and snarkjs
warm inside one Node process (`groth16.prove` called repeatedly, start-up not counted).

    python bench/zk.py [--json] [--repeat N] [--skip-10k]

Circuits: the demo policy network (compiled from examples/rolling-mill.yaml) and two generated
chains of ~1k and ~10k multiplication constraints. All provers use the same .zkey (our development
setup, which snarkjs reads) and the same witness. Every proof our prover makes (each backend, each
timed run) is checked by our verifier and by snarkjs: all of a circuit's proofs go through snarkjs's
`groth16.verify` in one Node process, and the last one also through the `snarkjs groth16 verify`
command line; snarkjs_verified is true only if snarkjs accepted every one. snarkjs's own proofs
(CLI) are checked by our verifier.
snarkjs uses worker threads on every core; our prover is one Python thread. proof_bytes is the
uncompressed binary proof (A, B, C affine: 64 + 128 + 64 bytes). The last line with --json is one
JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from attestation.zk import Builder, available_backends, dev_setup, prepare, prove, verify  # noqa: E402
from attestation.zk.formats import snarkjs_json as sj, wtns, zkey  # noqa: E402

SNARKJS = REPO / "node_modules" / ".bin" / "snarkjs"
DEMO_INPUT = [4.0, 3.0, 2.4, 9000.0, 120.0, 2.5]
WARM_JS = """
const snarkjs = require(process.argv[2]);
(async () => {
  const zkey = process.argv[3], wtns = process.argv[4];  // files, as the CLI reads them (page-cached)
  const n = parseInt(process.argv[5]);
  await snarkjs.groth16.prove(zkey, wtns);  // warm-up: curve, wasm and worker start-up
  const times = [];
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    await snarkjs.groth16.prove(zkey, wtns);
    times.push(Number(process.hrtime.bigint() - t) / 1e9);
  }
  console.log(JSON.stringify(times));
  process.exit(0);
})();
"""

VERIFY_JS = """
const snarkjs = require(process.argv[2]);
const fs = require("fs");
(async () => {
  const vk = JSON.parse(fs.readFileSync(process.argv[3]));
  const pub = JSON.parse(fs.readFileSync(process.argv[4]));
  const quiet = {info() {}, debug() {}, warn() {}, error() {}};
  const ok = [];
  for (const file of process.argv.slice(5)) {  // one proof.json per argument
    ok.push(await snarkjs.groth16.verify(vk, pub, JSON.parse(fs.readFileSync(file)), quiet));
  }
  console.log(JSON.stringify(ok));
  process.exit(0);
})();
"""


def chain_circuit(n: int):
    """n constraints: a <- a * (a + k) repeated, public x, private k (a dense witness)."""
    b = Builder(outputs=["out"], public=["x"], private=["k"])
    x, k = b.inputs
    a = x
    for _ in range(n - 1):
        a = b.mul(a, a + k)
    b.set_output(0, a)
    c = b.build()
    return c.r1cs, c.witness([3, 5])


def demo_circuit():
    from sitsd.config import load_config
    from sitsd.prover import circuit_for_config

    cm = circuit_for_config(load_config(REPO / "examples" / "rolling-mill.yaml"))
    return cm.circuit.r1cs, cm.witness(DEMO_INPUT, [2])  # mill_mode 2 (AGC)


def _median_all(f, repeat: int) -> tuple[float, list]:
    """Median time of `repeat` calls of f, and every call's result."""
    times, outs = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        outs.append(f())
        times.append(time.perf_counter() - t)
    return statistics.median(times), outs


def _median(f, repeat: int) -> tuple[float, object]:
    median, outs = _median_all(f, repeat)
    return median, outs[-1]


def snarkjs_verify_all(d: Path, vk_file: Path, public_file: Path, proof_files: list[Path]) -> list[bool]:
    """snarkjs's verdict on each proof file, from one Node process (`groth16.verify`, the function the
    `snarkjs groth16 verify` command calls), so that checking every proof costs one start-up."""
    (d / "verify.js").write_text(VERIFY_JS)
    out = subprocess.run(["node", d / "verify.js", str(REPO / "node_modules" / "snarkjs"), vk_file, public_file,
                          *proof_files], check=True, capture_output=True, text=True, timeout=600).stdout
    verdicts = json.loads(out.strip().splitlines()[-1])
    assert len(verdicts) == len(proof_files), out
    return [v is True for v in verdicts]


def bench_circuit(name: str, r1cs, witness, repeat: int, tmp: Path, log) -> dict:
    t = time.perf_counter()
    pk = dev_setup(r1cs)
    setup_s = time.perf_counter() - t
    vk = pk.verifying_key()
    public = witness[1:1 + r1cs.n_public]
    d = tmp / name
    d.mkdir()
    zkey.write(d / "c.zkey", pk)
    wtns.write(d / "w.wtns", witness)
    sj.dump(d / "vk.json", sj.vk_to_json(vk))
    row: dict = {"circuit": name, "constraints": len(r1cs.constraints), "domain": r1cs.domain_size, "setup_s": setup_s}
    sj.dump(d / "public.json", sj.public_to_json(public))
    proof_files: list[Path] = []
    for be in available_backends():
        prepared = prepare(pk, be)
        reps = repeat if len(r1cs.constraints) < 5000 else 1
        row[f"ours_{be}_s"], proofs = _median_all(lambda: prove(prepared, witness), reps)
        for i, proof in enumerate(proofs):
            assert verify(vk, public, proof), f"{name}: our {be} proof {i} does not verify"
            proof_files.append(d / f"proof-{be}-{i}.json")
            sj.dump(proof_files[-1], sj.proof_to_json(proof))
    row["verify_s"], ok = _median(lambda: verify(vk, public, proof), repeat)
    row["verify_pyecc_s"], ok_ref = _median(lambda: verify(vk, public, proof, "gmpy2"), 1)  # the reference
    assert ok and ok_ref
    # every proof above through snarkjs (one Node process), the last one also through its command line
    verdicts = snarkjs_verify_all(d, d / "vk.json", d / "public.json", proof_files)
    res = subprocess.run([str(SNARKJS), "groth16", "verify", d / "vk.json", d / "public.json", proof_files[-1]],
                         capture_output=True, text=True)
    row["snarkjs_checked"] = len(verdicts)
    row["snarkjs_rejected"] = [f.name for f, ok in zip(proof_files, verdicts) if not ok]
    row["snarkjs_verified"] = all(verdicts) and res.returncode == 0 and "OK!" in res.stdout
    row["proof_json_bytes"] = proof_files[-1].stat().st_size

    def cli() -> None:
        subprocess.run([str(SNARKJS), "groth16", "prove", d / "c.zkey", d / "w.wtns", d / "p.json", d / "pub.json"],
                       check=True, capture_output=True)
    row["snarkjs_cli_s"], _ = _median(cli, repeat)
    snark_proof = sj.proof_from_json(json.loads((d / "p.json").read_text()))
    assert verify(vk, public, snark_proof), f"{name}: snarkjs's proof with our zkey does not verify with ours"
    (d / "warm.js").write_text(WARM_JS)
    out = subprocess.run(["node", d / "warm.js", str(REPO / "node_modules" / "snarkjs"), d / "c.zkey", d / "w.wtns",
                          str(max(repeat, 3))], check=True, capture_output=True, text=True).stdout
    row["snarkjs_warm_s"] = statistics.median(json.loads(out.strip().splitlines()[-1]))
    log(f"  {name}: done; snarkjs accepted {len(verdicts) - len(row['snarkjs_rejected'])} of our "
        f"{len(verdicts)} proofs" + (f", REJECTED {row['snarkjs_rejected']}" if row["snarkjs_rejected"] else "")
        + ("" if res.returncode == 0 and "OK!" in res.stdout else "; the snarkjs CLI rejected the last"))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON object on the last line")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per prover (median; 1 for 10k)")
    ap.add_argument("--skip-10k", action="store_true", help="leave out the 10k-constraint circuit (its setup is slow)")
    args = ap.parse_args()
    if not SNARKJS.exists():
        print(f"{SNARKJS} is missing: run `make setup` (npm ci)", file=sys.stderr)
        return 2

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    circuits = [("demo", *demo_circuit()), ("chain1k", *chain_circuit(1000))]
    if not args.skip_10k:
        circuits.append(("chain10k", *chain_circuit(10000)))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, r1cs, w in circuits:
            log(f"bench {name}: {len(r1cs.constraints)} constraints")
            rows.append(bench_circuit(name, r1cs, w, args.repeat, Path(tmp), log))
    backends = available_backends()
    best = backends[-1]  # the fastest installed backend is listed last
    head = (f"{'circuit':<10}{'constr':>8}{'domain':>8}" + "".join(f"{'ours ' + b:>12}" for b in backends)
            + f"{'snarkjs cli':>13}{'snarkjs warm':>14}{'x cli':>8}{'x warm':>8}{'verify':>9}{'py_ecc':>8}{'setup':>8}")
    print(head)
    for r in rows:
        ours = r[f"ours_{best}_s"]
        print(f"{r['circuit']:<10}{r['constraints']:>8}{r['domain']:>8}"
              + "".join(f"{r[f'ours_{b}_s']:>11.3f}s" for b in backends)
              + f"{r['snarkjs_cli_s']:>12.3f}s{r['snarkjs_warm_s']:>13.3f}s"
              + f"{r['snarkjs_cli_s'] / ours:>7.2f}x{r['snarkjs_warm_s'] / ours:>7.2f}x"
              + f"{r['verify_s']:>8.4f}s{r['verify_pyecc_s']:>7.2f}s{r['setup_s']:>7.1f}s")
    demo = rows[0]
    ours = demo[f"ours_{best}_s"]
    print(f"ours = backend {best}, one Python thread; snarkjs uses all cores. verify = our verifier, backend {best} (py_ecc: the reference verifier). "
          f"snarkjs verified all {sum(r['snarkjs_checked'] for r in rows)} of our proofs (every backend, every run): "
          f"{all(r['snarkjs_verified'] for r in rows)}; proof 256 bytes binary, "
          f"{demo['proof_json_bytes']} bytes snarkjs JSON")
    summary = {
        "demo_constraints": demo["constraints"],
        "ours_prove_s": round(ours, 4),
        "snarkjs_prove_s": round(demo["snarkjs_cli_s"], 4),
        "snarkjs_warm_prove_s": round(demo["snarkjs_warm_s"], 4),
        "speedup_vs_snarkjs": round(demo["snarkjs_cli_s"] / ours, 3),
        "speedup_vs_snarkjs_warm": round(demo["snarkjs_warm_s"] / ours, 3),
        "verify_s": round(demo["verify_s"], 4),
        "proof_bytes": 256,
        "snarkjs_verified": all(r["snarkjs_verified"] for r in rows),
        "k1_prove_s": round(rows[1][f"ours_{best}_s"], 4),
        "k10_prove_s": round(rows[2][f"ours_{best}_s"], 4) if len(rows) > 2 else None,
    }
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
