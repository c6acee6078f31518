"""Compiles a ModelChain (model.py) to a Groth16 circuit in fixed point, with its witness.

A dense layer is a linear combination of its inputs with the integer weights of quantize.py as
circuit constants (so the verification key pins the model), giving z at scale 2^(F+W_l). ReLU and
Clip decompose z into bits once: the top bit is the sign and the bits above W_l are
floor(z / 2^W_l), back at scale 2^F, so one decomposition does the comparison and the rescaling.
Bit widths come from exact integer interval bounds over the input ranges, so an in-range input
never overflows a decomposition, and out-of-range inputs have no witness.

Public signals (snarkjs order): the outputs (scale 2^(F+W_last)), the model SHA-256 as two 128-bit
halves (constrained to the compiled model's hash), the quantized inputs (scale 2^F_j), then the
context signals (integers: enum, bool, int or bits signals that are not model inputs but that a
constraint's condition reads, e.g. `mill_mode`). The inputs are range checked against the config's
signal ranges, a context signal against its enumeration or range, and linear constraints with
integer coefficients over model inputs are enforced too, in quantized units (see `compile_chain`):
unconditional ones always, conditional ones (`when: mill_mode == 2 and strip_speed > 1.5`) through a
selector bit computed in the circuit from the condition (see `_condition`), so the range holds
exactly when the condition does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from .errors import ZkError
from .field import R, to_signed
from .model import Clip, ModelChain, Relu
from .quantize import Plan, plan
from .r1cs import Builder, Circuit, Lin


@dataclass(frozen=True, slots=True)
class ConditionSpec:
    """`signal op value`: `source` "input" (model input `index`, fixed point) or "context" (context
    signal `index`, an integer); op one of == != < <= > >=."""

    source: str
    index: int
    op: str
    value: float


@dataclass(frozen=True, slots=True)
class ContextSpec:
    """An integer public signal that conditions read: inclusive [lo, hi], and if `values` is given it
    must be one of them (an enumeration)."""

    name: str
    lo: int
    hi: int
    values: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class LinearSpec:
    """lo <= sum(coefficients[i] * x[i]) <= hi over model inputs (either bound may be None), enforced
    while every condition in `when` holds (always when `when` is empty)."""

    name: str
    coefficients: dict[int, float]
    lo: float | None = None
    hi: float | None = None
    when: tuple[ConditionSpec, ...] = ()


@dataclass(slots=True)
class CompiledModel:
    circuit: Circuit
    chain: ModelChain
    plan: Plan
    guard_bits: int
    input_names: tuple[str, ...]
    input_ranges: tuple[tuple[int, int], ...]  # quantized, inclusive
    error_bound: tuple[float, ...]  # per output, absolute, in the model's output units
    linear_enforced: tuple[str, ...] = ()
    linear_skipped: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    context: tuple[ContextSpec, ...] = ()
    linear_conditional: tuple[str, ...] = ()  # the enforced ones that have a `when`

    @property
    def output_scale(self) -> int:
        return 1 << (self.plan.frac_bits + self.plan.layers[-1].shift)

    @property
    def n_constraints(self) -> int:
        return len(self.circuit.r1cs.constraints)

    def hash_signals(self) -> tuple[int, int]:
        h = int(self.chain.sha256, 16)
        return h >> 128, h & ((1 << 128) - 1)

    def quantize(self, x: Sequence[float]) -> list[int]:
        if len(x) != len(self.input_names):
            raise ZkError(f"{len(x)} input values for {len(self.input_names)} model inputs")
        out = []
        for name, raw, f, (lo, hi) in zip(self.input_names, x, self.plan.input_frac_bits, self.input_ranges):
            v = float(raw)
            if not math.isfinite(v):
                raise ZkError(f"input {name} = {raw} is not a finite number")
            q = int(round(v * (1 << f)))
            if not lo <= q <= hi:
                raise ZkError(f"input {name} = {raw} is outside the range [{lo / (1 << f)}, {hi / (1 << f)}] "
                              "the circuit enforces")
            out.append(q)
        return out

    @property
    def context_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.context)

    def context_values(self, ctx: Sequence[float]) -> list[int]:
        if len(ctx) != len(self.context):
            raise ZkError(f"{len(ctx)} context values for the {len(self.context)} context signals "
                          f"({', '.join(self.context_names) or 'none'}) the circuit takes")
        out = []
        for c, raw in zip(self.context, ctx):
            v = float(raw)
            if not math.isfinite(v) or v != int(v):
                raise ZkError(f"context signal {c.name} = {raw} is not an integer")
            q = int(v)
            if not c.lo <= q <= c.hi or (c.values is not None and q not in c.values):
                allowed = list(c.values) if c.values is not None else f"[{c.lo}, {c.hi}]"
                raise ZkError(f"context signal {c.name} = {q} is not one of {allowed}, which the circuit enforces")
            out.append(q)
        return out

    def witness(self, x: Sequence[float], context: Sequence[float] = ()) -> list[int]:
        """The full witness for model inputs `x` and the context signals' values (config order of
        `context_names`); ZkError names an input or context value the circuit does not admit."""
        hi, lo = self.hash_signals()
        q = self.quantize(x)
        c = self.context_values(context)
        return self.circuit.witness([hi, lo, *(v % R for v in q), *(v % R for v in c)])

    def public_signals(self, witness: Sequence[int]) -> list[int]:
        return list(witness[1:1 + self.circuit.r1cs.n_public])

    def decode_outputs(self, public: Sequence[int]) -> list[float]:
        return [to_signed(v) / self.output_scale for v in public[:self.chain.n_outputs]]

    def decode_inputs(self, public: Sequence[int]) -> list[float]:
        n = self.chain.n_outputs
        return [to_signed(v) / (1 << f) for v, f in zip(public[n + 2:n + 2 + len(self.input_names)],
                                                        self.plan.input_frac_bits)]

    def decode_context(self, public: Sequence[int]) -> list[int]:
        first = self.chain.n_outputs + 2 + len(self.input_names)
        return [to_signed(v) for v in public[first:first + len(self.context)]]

    def describe(self) -> str:
        r = self.circuit.r1cs
        p = self.plan
        lines = [f"circuit of {self.chain.source}: {self.n_constraints} constraints, {r.n_wires} wires, "
                 f"{r.n_public} public signals, domain {r.domain_size}",
                 f"fixed point: activations 2^-{p.frac_bits}; inputs " + ", ".join(
                     f"{n} 2^-{f}" for n, f in zip(self.input_names, p.input_frac_bits)),
                 "weights: integers at layer scales 2^-"
                 + "/2^-".join(str(p.frac_bits + q.shift) for q in p.layers)
                 + f"; outputs are integers / 2^{p.frac_bits + p.layers[-1].shift}",
                 "quantization error bound per output (sound, over the whole input box): "
                 + ", ".join(f"{e:.3g}" for e in self.error_bound)]
        if self.context:
            lines.append("context signals (public, integers): " + ", ".join(
                f"{c.name} in {list(c.values) if c.values is not None else [c.lo, c.hi]}" for c in self.context))
        if self.linear_enforced:
            lines.append("linear constraints enforced: " + ", ".join(
                n + (" (conditional)" if n in self.linear_conditional else "") for n in self.linear_enforced))
        if self.linear_skipped:
            lines.append("linear constraints not encoded (non-integer coefficients, a signal that is not a model "
                         "input, or a condition on a non-integer signal that is not a model input): "
                         + ", ".join(self.linear_skipped))
        return "\n".join(lines + self.notes)


def _activation(b: Builder, z: Lin, zlo: int, zhi: int, shift: int, what: str) -> tuple[Lin, int, int]:
    """max(0, floor(z / 2^shift)) and its bounds; one bit decomposition covers sign and rescaling."""
    if zhi < 0:
        return Lin(), 0, 0
    if zlo >= 0:
        if shift == 0:
            return z, zlo, zhi  # already non-negative and at scale: nothing to prove
        n = max(zhi.bit_length(), shift + 1)
        bits = b.bits(z, n, what)
        t = Lin()
        for i in range(shift, n):
            t = t + bits[i] * (1 << (i - shift))
        return t, zlo >> shift, zhi >> shift
    n = max(max(-zlo, zhi).bit_length(), shift) + 1
    off = 1 << (n - 1)
    bits = b.bits(z + off, n, what)
    t = Lin.const(-(off >> shift))
    for i in range(shift, n):
        t = t + bits[i] * (1 << (i - shift))
    return b.mul(bits[n - 1], t), 0, zhi >> shift


def _compare_le(b: Builder, x: Lin, lo: int, hi: int, k: int, what: str) -> Lin:
    """The bit [x <= k] for an integer x known to lie in [lo, hi]: one bit decomposition of
    k - x + 2^(n-1), whose top bit is set exactly when k - x >= 0."""
    if hi <= k:
        return Lin.const(1)
    if lo > k:
        return Lin()
    n = max(hi - k, k - lo).bit_length() + 1
    return b.bits(Lin.const(k) - x + (1 << (n - 1)), n, what)[n - 1]


def _is_equal(b: Builder, x: Lin, k: int) -> Lin:
    """The bit [x == k]: s = 1 - d * inv(d) with d * s = 0 (d = x - k), so s is 1 iff d is 0."""
    d = x - k
    inv = b.new_wire(lambda v: pow(d.value(v) % R, R - 2, R) if d.value(v) % R else 0)
    s = Lin.const(1) - b.mul(d, inv)
    b.enforce(d, s, Lin())
    return s


def _condition(b: Builder, c: ConditionSpec, x: Lin, lo: int, hi: int, scale: int, what: str) -> Lin:
    """The bit [value(x) op c.value] for the integer x = value * 2^scale in [lo, hi]. Since x is an
    integer, each order comparison is x <= k or x >= k for an integer k (t = c.value * 2^scale):
    <= t: k = floor(t); < t: ceil(t) - 1; >= t: ceil(t); > t: floor(t) + 1. == and != hold only where
    t itself is an integer."""
    t = c.value * (1 << scale)
    if c.op in ("==", "!="):
        eq = _is_equal(b, x, int(t)) if float(t).is_integer() and lo <= t <= hi else Lin()
        return eq if c.op == "==" else Lin.const(1) - eq
    if c.op in ("<=", "<"):
        k = math.floor(t) if c.op == "<=" else math.ceil(t) - 1
        return _compare_le(b, x, lo, hi, k, what)
    k = math.ceil(t) if c.op == ">=" else math.floor(t) + 1
    return Lin.const(1) - _compare_le(b, x, lo, hi, k - 1, what)  # x >= k  <=>  not (x <= k - 1)


def _linear(b: Builder, spec: LinearSpec, xs: list[Lin], qr: list[tuple[int, int]], fin: Sequence[int],
            ctx: Sequence[Lin] = (), context: Sequence[ContextSpec] = ()) -> bool:
    """Encode one linear constraint over quantized inputs; False if it cannot be encoded exactly.

    With q_i = round(x_i 2^F_i) and a common scale 2^M (M = max F_i), sum c_i x_i 2^M differs from
    sum c_i q_i 2^(M-F_i) by at most sum |c_i| 2^(M-F_i) / 2; the bounds are widened by that, so every
    admissible input keeps a witness (the check is exact up to input quantization).

    With a `when`, the conditions become one selector bit s (their product), and each bound is the
    range check of s * (slack), which is 0 when s = 0 and the slack itself when s = 1: a violated
    bound under a true condition leaves a negative slack, i.e. a field element with no decomposition.
    Conditions on model inputs compare the quantized input (so, like the bounds, up to quantization).
    """
    coef = {i: c for i, c in spec.coefficients.items() if c}
    if not coef or any(float(c) != int(c) for c in coef.values()):
        return False
    m = max(fin[i] for i in coef)
    total, smin, smax, slack = Lin(), 0, 0, 0.0
    for i, c in coef.items():
        k = int(c) << (m - fin[i])
        total = total + xs[i] * k
        smin += min(k * qr[i][0], k * qr[i][1])
        smax += max(k * qr[i][0], k * qr[i][1])
        slack += abs(k) / 2
    lo = smin if spec.lo is None else max(smin, math.ceil(spec.lo * (1 << m) - slack))
    hi = smax if spec.hi is None else min(smax, math.floor(spec.hi * (1 << m) + slack))
    if not spec.when:
        b.assert_range(total, lo, hi, spec.name)
        return True
    sel = Lin.const(1)
    for j, c in enumerate(spec.when):
        what = f"{spec.name} condition {j}"
        if c.source == "input":
            bit = _condition(b, c, xs[c.index], qr[c.index][0], qr[c.index][1], fin[c.index], what)
        else:
            cs = context[c.index]
            bit = _condition(b, c, ctx[c.index], cs.lo, cs.hi, 0, what)
        sel = bit if j == 0 else b.mul(sel, bit)
    if lo > hi:  # no admissible value: the condition itself must be false
        b.enforce_equal(sel, Lin())
        return True
    if lo > smin:
        b.bits(b.mul(sel, total - lo), max(1, (smax - lo).bit_length()), f"{spec.name} (min, when)")
    if hi < smax:
        b.bits(b.mul(sel, Lin.const(hi) - total), max(1, (hi - smin).bit_length()), f"{spec.name} (max, when)")
    return True


def compile_chain(chain: ModelChain, input_names: Sequence[str], ranges: Sequence[tuple[float, float]],
                  linear: Sequence[LinearSpec] = (), frac_bits: int = 12, guard_bits: int = 2,
                  output_names: Sequence[str] | None = None,
                  context: Sequence[ContextSpec] = ()) -> CompiledModel:
    """The circuit for `chain` over inputs in `ranges` (real units, inclusive); `context` adds integer
    public signals that the `when` conditions of `linear` may read."""
    if len(input_names) != chain.n_inputs or len(ranges) != chain.n_inputs:
        raise ZkError(f"the model takes {chain.n_inputs} inputs; {len(input_names)} names and "
                      f"{len(ranges)} ranges given")
    for name, (lo, hi) in zip(input_names, ranges):
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ZkError(f"input {name} needs a finite range min <= max (set min/max on the signal)")
    p = plan(chain, ranges, frac_bits, guard_bits)
    outs = list(output_names or [f"out{i}" for i in range(chain.n_outputs)])
    for c in context:
        if c.lo > c.hi or (c.values is not None and not c.values):
            raise ZkError(f"context signal {c.name} admits no value")
    b = Builder(outputs=outs, public=["model_sha256_hi", "model_sha256_lo", *input_names,
                                      *(c.name for c in context)])
    pub = b.inputs
    h = int(chain.sha256, 16)
    b.enforce_equal(pub[0], Lin.const(h >> 128))
    b.enforce_equal(pub[1], Lin.const(h & ((1 << 128) - 1)))
    xs = pub[2:2 + len(input_names)]
    ctx = pub[2 + len(input_names):]
    for c, v in zip(context, ctx):
        b.assert_range(v, c.lo, c.hi, c.name)
        if c.values is not None:  # an enumeration: prod (v - value_i) = 0
            acc = v - c.values[0]
            for value in c.values[1:-1]:
                acc = b.mul(acc, v - value)
            if len(c.values) > 1:
                b.enforce(acc, v - c.values[-1], Lin())
            else:
                b.enforce_equal(acc, Lin())
    qr: list[tuple[int, int]] = []
    for name, x, (lo, hi), f in zip(input_names, xs, ranges, p.input_frac_bits):
        qlo, qhi = int(round(lo * (1 << f))), int(round(hi * (1 << f)))
        b.assert_range(x, qlo, qhi, name)
        qr.append((qlo, qhi))
    enforced = [s.name for s in linear if _linear(b, s, xs, qr, p.input_frac_bits, ctx, context)]
    skipped = [s.name for s in linear if s.name not in enforced]
    # the first layer sees centred inputs q_j - c_j (constants are free in R1CS)
    acts = [x - cq for x, cq in zip(xs, p.input_centers)]
    bounds = [(lo - cq, hi - cq) for (lo, hi), cq in zip(qr, p.input_centers)]
    stages = list(chain.stages)
    F = p.frac_bits
    for layer, q in enumerate(p.layers):
        zs, zb = [], []
        for o, row in enumerate(q.coef):
            z, lo, hi = Lin.const(q.bias[o]), q.bias[o], q.bias[o]
            for j, c in enumerate(row):
                if c:
                    z = z + acts[j] * c
                    lo += min(c * bounds[j][0], c * bounds[j][1])
                    hi += max(c * bounds[j][0], c * bounds[j][1])
            zs.append(z)
            zb.append((lo, hi))
        act = stages[2 * layer + 1] if 2 * layer + 1 < len(stages) else None
        if act is None:
            for o, z in enumerate(zs):
                b.set_output(o, z)
            break
        acts, bounds = [], []
        W = q.shift
        for o, (z, (lo, hi)) in enumerate(zip(zs, zb)):
            what = f"layer {layer} unit {o}"
            if isinstance(act, Relu):
                y, ylo, yhi = _activation(b, z, lo, hi, W, what)
            else:
                assert isinstance(act, Clip)
                cl, ch = int(round(act.lo * (1 << F))), int(round(act.hi * (1 << F)))
                d = ch - cl
                pz, plo, phi = _activation(b, z - (cl << W), lo - (cl << W), hi - (cl << W), W, what + " clip low")
                e, _, _ = _activation(b, pz - d, plo - d, phi - d, 0, what + " clip high")
                y = pz - e + cl
                ylo, yhi = max(cl, min(ch, lo >> W)), max(cl, min(ch, hi >> W))
            acts.append(y)
            bounds.append((ylo, yhi))
    circuit = b.build()
    conditional = tuple(s.name for s in linear if s.when and s.name in enforced)
    return CompiledModel(circuit, chain, p, guard_bits, tuple(input_names), tuple(qr),
                         p.error_bound, tuple(enforced), tuple(skipped), context=tuple(context),
                         linear_conditional=conditional)
