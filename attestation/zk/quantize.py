"""Fixed-point plan for a ModelChain: per-input and per-layer scales, integer weights, error bound.

Activations are integers at scale 2^F (real = q / 2^F). Input j has its own scale 2^F_j with
F_j = F + floor(log2 max_o |W1[o, j]|): an input whose weights are tiny (the demo's rolling force
in kN, divided by its std by the folded normalisation) is resolved only as finely as it matters,
which keeps its range check and the first layer's bit widths short. Dense layer l maps its inputs
to z at scale 2^(F + W_l), W_l chosen from the magnitudes its inputs can reach (see `plan`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .model import Clip, Dense, ModelChain, Relu

FLOAT32_SLACK = 1e-5  # relative slack for onnxruntime's float32 arithmetic, see Plan.error_bound


@dataclass(frozen=True, slots=True)
class QLayer:
    coef: list[list[int]]  # (out, in) integers
    bias: list[int]
    shift: int  # W_l: z is at scale 2^(F + shift)
    weight_eff: np.ndarray  # the real weights the integers stand for
    bias_eff: np.ndarray


@dataclass(frozen=True, slots=True)
class Plan:
    frac_bits: int
    input_frac_bits: tuple[int, ...]
    input_centers: tuple[int, ...]  # on each input's grid; the first layer sees q_j - center_j
    layers: tuple[QLayer, ...]
    error_bound: tuple[float, ...]  # per output, see plan()


def _log2_floor(x: float) -> int:
    return math.floor(math.log2(x)) if x > 0 else 0


def plan(chain: ModelChain, ranges: Sequence[tuple[float, float]], frac_bits: int, guard_bits: int) -> Plan:
    """Scales for `chain` over the input box, and a sound bound on |circuit output - model output|.

    Error bound per dense layer, with W^, b^ the real values the integers stand for:
    e_z <= |W^| e_in + |W^ - W| max|a| + |b^ - b|; inputs start at 2^-(F_j+1) (rounding), ReLU and
    Clip are 1-Lipschitz and the floor to scale 2^F adds < 2^-F; max|a| comes from interval
    propagation of the exact network. FLOAT32_SLACK times the output magnitude, plus 1e-6, covers
    onnxruntime's float32 arithmetic when the circuit is compared with it.

    The first layer works on centred inputs x_j - c_j (c_j the range midpoint on the input grid,
    a constant, so free in R1CS): the folded normalisation W (x - mean) / std would otherwise make
    z the difference of two large numbers and every weight would need many more bits. Each layer's
    shift is chosen so that the weight rounding of one unit, sum_j |W^ - W| max|a_j|, stays below
    2^-(F + 1 + guard): sum_j max|a_j| 2^(scale_j) <= 2^(shift - guard) .
    """
    F = frac_bits
    dense = [st for st in chain.stages if isinstance(st, Dense)]
    first = np.max(np.abs(dense[0].weight), axis=0)
    fin = tuple(int(min(40, max(0, F + guard_bits + _log2_floor(float(c))))) for c in first)
    centers = tuple(int(round((lo + hi) / 2 * (1 << f))) for (lo, hi), f in zip(ranges, fin))
    # max |a| per layer input, from interval propagation of the exact network
    lo = np.array([r[0] for r in ranges], dtype=np.float64)
    hi = np.array([r[1] for r in ranges], dtype=np.float64)
    c = np.array([q / (1 << f) for q, f in zip(centers, fin)])
    amax = np.maximum(np.abs(lo - c), np.abs(hi - c))
    err = np.array([2.0 ** -(f + 1) for f in fin])  # input rounding
    in_scale = list(fin)
    layers = []
    stages = list(chain.stages)
    li = 0
    for k, st in enumerate(stages):
        if isinstance(st, Dense):
            total = float(sum(a * 2.0 ** s for a, s in zip(amax, in_scale))) or 1.0
            shift = int(min(64, max(1, math.ceil(math.log2(total)) + guard_bits)))
            S = F + shift
            bias_real = st.bias + (st.weight @ c if li == 0 else 0.0)
            coef = [[int(round(float(w) * 2.0 ** (S - in_scale[j]))) for j, w in enumerate(row)] for row in st.weight]
            bias = [int(round(float(v) * 2.0 ** S)) for v in bias_real]
            w_eff = np.array([[q / 2.0 ** (S - in_scale[j]) for j, q in enumerate(row)] for row in coef],
                             dtype=np.float64).reshape(st.weight.shape)
            b_eff = np.array([v / 2.0 ** S for v in bias], dtype=np.float64) - (w_eff @ c if li == 0 else 0.0)
            layers.append(QLayer(coef, bias, shift, w_eff, b_eff))
            b_hat = np.array([v / 2.0 ** S for v in bias])
            # error: |W^| e + |W^ - W| max|a| + |b^ - b| (a centred for the first layer)
            err = np.abs(w_eff) @ err + np.abs(w_eff - st.weight) @ amax + np.abs(b_hat - bias_real)
            if li == 0:
                lo, hi = lo - c, hi - c  # intervals below are for the centred inputs
            mid = st.weight @ ((lo + hi) / 2) + bias_real
            r = np.abs(st.weight) @ ((hi - lo) / 2)
            lo, hi = mid - r, mid + r
            if k != len(stages) - 1:
                err = err + 2.0 ** -F  # the floor back to scale 2^F after the activation
            in_scale = [F] * st.weight.shape[0]
            li += 1
        elif isinstance(st, Relu):
            lo, hi = np.maximum(lo, 0), np.maximum(hi, 0)
        else:
            assert isinstance(st, Clip)
            lo, hi = np.clip(lo, st.lo, st.hi), np.clip(hi, st.lo, st.hi)
            sc = float(1 << F)
            err = err + max(abs(round(st.lo * sc) / sc - st.lo), abs(round(st.hi * sc) / sc - st.hi))
        amax = np.maximum(np.abs(lo), np.abs(hi))
    bound = err + FLOAT32_SLACK * amax + 1e-6
    return Plan(F, fin, centers, tuple(layers), tuple(float(e) for e in bound))
