"""Rank-1 constraint systems: the data (as iden3 .r1cs holds it) and a builder with witness hints.

Wire order follows circom: 0 is the constant 1, then outputs, public inputs, private inputs,
internal wires. A constraint is A*B = C over linear combinations {wire: coefficient mod r}.
The builder records, next to each internal wire, the function that computes its value from the
wires before it, so the same code that lays out the circuit also computes its witness.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from .errors import ZkError
from .field import R, to_signed

LinComb = Mapping[int, int]
Constraint = tuple[LinComb, LinComb, LinComb]


@dataclass(frozen=True, slots=True)
class R1CS:
    n_wires: int
    n_outputs: int
    n_pub_inputs: int
    n_prv_inputs: int
    constraints: tuple[Constraint, ...]
    wire_labels: tuple[int, ...] = ()

    @property
    def n_public(self) -> int:
        """Public signals excluding the constant wire (outputs first, then public inputs)."""
        return self.n_outputs + self.n_pub_inputs

    @property
    def domain_size(self) -> int:
        """The evaluation domain snarkjs uses: 2^(floor(log2(nConstraints + nPublic)) + 1)."""
        n = len(self.constraints) + self.n_public
        return 1 << ((n.bit_length() - 1) + 1) if n > 0 else 2

    def first_unsatisfied(self, witness: Sequence[int]) -> int | None:
        """Index of the first constraint the witness violates, None if all hold."""
        if len(witness) != self.n_wires or witness[0] != 1:
            raise ZkError(f"witness has {len(witness)} values (w[0]={witness[0] if witness else None}); "
                          f"the circuit needs {self.n_wires} with w[0] = 1")
        for i, (a, b, c) in enumerate(self.constraints):
            if evaluate(a, witness) * evaluate(b, witness) % R != evaluate(c, witness):
                return i
        return None


def evaluate(lc: LinComb, values: Sequence[int]) -> int:
    return sum(k * values[w] for w, k in lc.items()) % R


class Lin:
    """A linear combination of wires with affine operators, used while building a circuit."""

    __slots__ = ("terms",)

    def __init__(self, terms: Mapping[int, int] | None = None) -> None:
        self.terms: dict[int, int] = {w: k % R for w, k in (terms or {}).items() if k % R}

    @staticmethod
    def const(k: int) -> "Lin":
        return Lin({0: k})

    @staticmethod
    def wire(w: int) -> "Lin":
        return Lin({w: 1})

    def __add__(self, other: "Lin | int") -> "Lin":
        o = Lin.const(other) if isinstance(other, int) else other
        t = dict(self.terms)
        for w, k in o.terms.items():
            t[w] = (t.get(w, 0) + k) % R
        return Lin(t)

    def __sub__(self, other: "Lin | int") -> "Lin":
        o = Lin.const(other) if isinstance(other, int) else other
        return self + o * -1

    def __mul__(self, k: int) -> "Lin":
        return Lin({w: c * k for w, c in self.terms.items()})

    def value(self, values: Sequence[int]) -> int:
        return evaluate(self.terms, values)


Hint = Callable[[list[int]], int]


@dataclass(slots=True)
class Circuit:
    """An R1CS plus the hints that compute its internal wires from its inputs."""

    r1cs: R1CS
    input_names: tuple[str, ...]  # public inputs then private inputs, in wire order
    output_names: tuple[str, ...]
    hints: list[tuple[int, Hint]] = field(default_factory=list)

    def witness(self, inputs: Sequence[int]) -> list[int]:
        """Full witness from the input values (field elements, public then private)."""
        r = self.r1cs
        n_in = r.n_pub_inputs + r.n_prv_inputs
        if len(inputs) != n_in:
            raise ZkError(f"the circuit takes {n_in} inputs ({', '.join(self.input_names)}), got {len(inputs)}")
        values = [0] * r.n_wires
        values[0] = 1
        first_in = 1 + r.n_outputs
        for i, v in enumerate(inputs):
            values[first_in + i] = v % R
        for wire, hint in self.hints:
            values[wire] = hint(values) % R
        bad = r.first_unsatisfied(values)
        if bad is not None:
            raise ZkError(f"constraint {bad} does not hold for these inputs; an input is outside the ranges "
                          "the circuit enforces")
        return values


class Builder:
    """Lays out a circuit: declare outputs and inputs first, then wires and constraints."""

    def __init__(self, outputs: Sequence[str], public: Sequence[str], private: Sequence[str] = ()) -> None:
        self._outputs = list(outputs)
        self._inputs = list(public) + list(private)
        self._n_pub = len(public)
        self.n_wires = 1 + len(self._outputs) + len(self._inputs)
        self.constraints: list[Constraint] = []
        self.hints: list[tuple[int, Hint]] = []
        self._outputs_set: set[int] = set()

    @property
    def outputs(self) -> list[Lin]:
        return [Lin.wire(1 + i) for i in range(len(self._outputs))]

    @property
    def inputs(self) -> list[Lin]:
        first = 1 + len(self._outputs)
        return [Lin.wire(first + i) for i in range(len(self._inputs))]

    def new_wire(self, hint: Hint) -> Lin:
        w = self.n_wires
        self.n_wires += 1
        self.hints.append((w, hint))
        return Lin.wire(w)

    def enforce(self, a: Lin, b: Lin, c: Lin) -> None:
        self.constraints.append((a.terms, b.terms, c.terms))

    def enforce_equal(self, a: Lin, b: Lin) -> None:
        self.enforce(a - b, Lin.const(1), Lin())

    def mul(self, a: Lin, b: Lin) -> Lin:
        out = self.new_wire(lambda v: a.value(v) * b.value(v))
        self.enforce(a, b, out)
        return out

    def set_output(self, index: int, value: Lin) -> None:
        w = 1 + index
        if w in self._outputs_set:
            raise ZkError(f"output {self._outputs[index]} set twice")
        self._outputs_set.add(w)
        self.hints.append((w, value.value))
        self.enforce(Lin.wire(w), Lin.const(1), value)

    def bits(self, x: Lin, n: int, what: str) -> list[Lin]:
        """Booleans b_i with sum b_i 2^i = x; the witness fails unless 0 <= x < 2^n."""
        if not 0 < n < 253:
            raise ZkError(f"bit width {n} for {what} is outside 1..252")

        def first(v: list[int], x: Lin = x) -> int:
            val = x.value(v)
            if val >> n:
                raise ZkError(f"{what} = {to_signed(val)} is outside [0, 2^{n}); the input is out of range")
            return val & 1

        out = [self.new_wire(first)]
        for i in range(1, n):
            out.append(self.new_wire(lambda v, i=i, x=x: (x.value(v) >> i) & 1))
        total = Lin()
        for i, b in enumerate(out):
            self.enforce(b, b - 1, Lin())
            total = total + b * (1 << i)
        self.enforce_equal(total, x)
        return out

    def assert_range(self, x: Lin, lo: int, hi: int, what: str) -> None:
        """lo <= x <= hi for the signed integer x encodes (two bit decompositions unless hi-lo+1 = 2^k)."""
        if hi < lo:
            raise ZkError(f"empty range [{lo}, {hi}] for {what}")
        width = max(1, (hi - lo).bit_length())
        self.bits(x - lo, width, f"{what} - {lo}")
        if hi - lo + 1 != 1 << width:
            self.bits(Lin.const(hi) - x, width, f"{hi} - {what}")

    def build(self) -> Circuit:
        missing = [self._outputs[i] for i in range(len(self._outputs)) if 1 + i not in self._outputs_set]
        if missing:
            raise ZkError(f"outputs never set: {missing}")
        r1cs = R1CS(n_wires=self.n_wires, n_outputs=len(self._outputs), n_pub_inputs=self._n_pub,
                    n_prv_inputs=len(self._inputs) - self._n_pub, constraints=tuple(self.constraints),
                    wire_labels=tuple(range(self.n_wires)))
        return Circuit(r1cs, tuple(self._inputs), tuple(self._outputs), list(self.hints))

