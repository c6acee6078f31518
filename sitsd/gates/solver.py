"""Deploy-time analysis of the constraint gate's rules with z3: can any input pass them all, which rules
contradict each other, which are redundant, and what range each signal is left with.
Exact rational arithmetic throughout, so an answer here is a proof, not a float estimate.

Ctrl-C: during a z3 call z3's own SIGINT handler catches the signal and cancels the call, which then
answers `unknown` with the same reason ("canceled") as a timeout. So the time limit is kept here (a
timer that interrupts the call and notes that it did), not by z3: an `unknown` this module did not cause
is the Ctrl-C z3 swallowed, and it is raised again as KeyboardInterrupt, so `sitsctl check` and `deploy`
stop instead of reporting the checks as timed out and going on."""
from __future__ import annotations

import math
import signal
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction

import z3

from ..config import Condition, LinearConstraint, Signal

MAX_CORES = 5
# MUS enumeration can visit exponentially many subsets; this caps the seeds it explores
MAX_SEEDS = 40


@dataclass(frozen=True)
class ConstraintReport:
    """What check_constraints found. Items in `contradictions` are constraint names or `signal:<name>`
    (a signal's declared domain). `unknown` names the checks that ran out of time: their part of the
    report is conservative (no claim of redundancy, declared range as the bound)."""

    satisfiable: bool
    contradictions: tuple[tuple[str, ...], ...] = ()
    # (when text, minimal set of rules that exclude it): a condition some constraint is written for, under
    # which no input passes the gate, so that operating state (e.g. mill_mode == 2) cannot run at all
    unreachable: tuple[tuple[str, tuple[str, ...]], ...] = ()
    redundant: tuple[str, ...] = ()
    bounding_box: dict[str, tuple[float, float]] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    seconds: float = 0.0


@dataclass(frozen=True, eq=False)
class _Item:
    """One named assertion that may be switched on or off: a signal's domain or a constraint.
    Compared by identity: `==` on z3 terms builds a formula instead of answering."""

    label: str
    formula: z3.BoolRef
    switch: z3.BoolRef  # assumption literal; the solver holds switch -> formula


class _System:
    """The signals and constraints translated into one z3 context, with a solver over switchable items."""

    def __init__(self, signals: list[Signal], constraints: list[LinearConstraint], timeout_ms: int) -> None:
        # a private context: callers on other threads or with their own z3 state are not disturbed
        self.ctx = z3.Context()
        self.timeout_ms = timeout_ms
        self.signals = signals
        self._count = 0
        # prefixed so that no signal can be named like z3's own `epsilon`
        self.var = {s.name: z3.Real(f"sig!{s.name}", self.ctx) for s in signals}
        self.domains = [self._item(f"signal:{s.name}", self._domain(s)) for s in signals]
        self.constraints = [self._item(c.name, self._constraint(c)) for c in constraints]
        self.items = self.domains + self.constraints
        self.solver = z3.Solver(ctx=self.ctx)  # no z3 timeout: `run` keeps the limit (see the module doc)
        for it in self.items:
            self.solver.add(z3.Implies(it.switch, it.formula))

    def _item(self, label: str, formula: z3.BoolRef) -> _Item:
        # numbered: two constraints may share a name, their assumption literals must not
        self._count += 1
        return _Item(label, formula, z3.Bool(f"item!{self._count}!{label}", self.ctx))

    def exact(self, x: float | int) -> z3.RatNumRef:
        q = Fraction(x)  # a float's exact binary value, not its decimal rendering
        return z3.RealVal(f"{q.numerator}/{q.denominator}", self.ctx)

    def _domain(self, s: Signal) -> z3.BoolRef:
        x, name = self.var[s.name], s.name
        if s.type == "float":
            return z3.And(self.exact(s.min) <= x, x <= self.exact(s.max))
        if s.type == "enum":
            return z3.Or([x == self.exact(v) for v in s.values])
        if s.type == "bits":
            # value = sum of the mask's bits, each present or not: exactly the integers with value & ~mask == 0
            bits = [1 << k for k in range(s.mask.bit_length()) if s.mask >> k & 1]
            terms = [z3.If(z3.Bool(f"bit!{name}!{b}", self.ctx), self.exact(b), self.exact(0)) for b in bits]
            return x == z3.Sum(terms)
        lo, hi = (0, 1) if s.type == "bool" else (math.ceil(s.min), math.floor(s.max))
        k = z3.Int(f"int!{name}", self.ctx)
        return z3.And(x == z3.ToReal(k), z3.IntVal(lo, self.ctx) <= k, k <= z3.IntVal(hi, self.ctx))

    def _constraint(self, c: LinearConstraint) -> z3.BoolRef:
        total = z3.Sum([self.exact(coef) * self._signal(name, c.name) for name, coef in c.coefficients.items()])
        parts = []
        if c.min is not None:
            parts.append(self.exact(c.min) <= total)
        if c.max is not None:
            parts.append(total <= self.exact(c.max))
        body = z3.And(parts)
        if not c.conditions:
            return body
        return z3.Implies(z3.And([self._condition(cond, c.name) for cond in c.conditions]), body)

    def _condition(self, cond: Condition, owner: str) -> z3.BoolRef:
        x, v = self._signal(cond.signal, owner), self.exact(cond.value)
        return {"==": x == v, "!=": x != v, "<": x < v, "<=": x <= v, ">": x > v, ">=": x >= v}[cond.op]

    def _signal(self, name: str, owner: str) -> z3.ArithRef:
        if name not in self.var:
            raise ValueError(f"constraint {owner!r} refers to {name!r}, which is not a declared signal")
        return self.var[name]

    def check(self, subset: list[_Item]) -> z3.CheckSatResult:
        return self.run(self.solver, *[it.switch for it in subset])

    def run(self, engine: z3.Solver | z3.Optimize, *assumptions, limited: bool = True) -> z3.CheckSatResult:
        """`engine.check(*assumptions)`, within the system's timeout_ms if `limited`. Past the limit a timer
        interrupts the call, which answers `unknown` as z3's own timeout would. A call cancelled by
        anything else was cancelled by z3's Ctrl-C handler (nothing else holds this private context), and
        that interrupt is passed on: see _interrupted."""
        limit = self.timeout_ms if limited else 0
        timed_out, lock, running = threading.Event(), threading.Lock(), [True]

        def expire() -> None:
            with lock:  # never interrupt once the call is over: the interrupt could hit the next call
                if running[0]:
                    timed_out.set()
                    self.ctx.interrupt()

        timer = threading.Timer(limit / 1000, expire) if limit else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            verdict = engine.check(*assumptions)
        finally:
            with lock:
                running[0] = False
            if timer is not None:
                timer.cancel()
        if verdict == z3.unknown and not timed_out.is_set() and engine.reason_unknown() in _CANCELED:
            _interrupted()
        return verdict


# what z3 answers as the reason for a call cancelled by a timeout, Context.interrupt() or its Ctrl-C handler
# (with assumptions, and from Optimize, all of them read "canceled")
_CANCELED = ("canceled", "interrupted", "interrupted from keyboard")


def _interrupted() -> None:
    """z3's handler swallowed a SIGINT: hand it on to what the process does with one. Under Python's
    default that is KeyboardInterrupt, raised here. A handler of the program's own gets the signal again
    (it runs in the main thread); SIG_IGN ignores it. In those two cases the call stays `unknown`."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        raise KeyboardInterrupt("z3 check interrupted (Ctrl-C)")
    signal.raise_signal(signal.SIGINT)


def check_constraints(signals: list[Signal], constraints: list[LinearConstraint],
                      timeout_ms: int = 5000) -> ConstraintReport:
    """Analyse the domains and linear constraints as the gate enforces them (a constraint with `when`
    applies only while all its conditions hold). `timeout_ms` bounds each z3 call, not the whole run;
    a call that runs out is named in `unknown` and never raises. Ctrl-C during a z3 call raises
    KeyboardInterrupt (z3 swallows the signal; see the module doc).

    `redundant` lists every constraint implied by the domains and all the *other* constraints, each tested
    on its own: two constraints that imply each other are both listed, yet only one of them can go.
    Remove them one at a time and check again."""
    start = time.monotonic()
    system = _System(signals, constraints, timeout_ms)
    unknown: list[str] = []
    verdict = system.check(system.items)
    if verdict == z3.unknown:
        # not proven satisfiable, so a deployment must not rely on it
        return ConstraintReport(False, unknown=("satisfiability",), seconds=time.monotonic() - start)
    if verdict == z3.unsat:
        cores = _contradictions(system, unknown)
        return ConstraintReport(False, contradictions=cores, unknown=tuple(unknown),
                                seconds=time.monotonic() - start)
    unreachable = _unreachable(system, constraints, unknown)
    redundant = _redundant(system, unknown)
    box = _bounding_box(system, unknown)
    return ConstraintReport(True, unreachable=unreachable, redundant=redundant, bounding_box=box,
                            unknown=tuple(unknown), seconds=time.monotonic() - start)


# -- conditions under which nothing passes -----------------------------------------------------------

def _unreachable(system: _System, constraints: list[LinearConstraint],
                 unknown: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each distinct `when` is asserted on top of every rule: unsatisfiable means that while it holds no
    frame can pass, although the set as a whole is satisfiable (another state is). The core is shrunk to a
    minimal set of rules, the condition itself always in force."""
    found = []
    seen: set[str] = set()
    for c in constraints:
        if not c.conditions or c.when in seen:
            continue
        seen.add(c.when)
        cond = system._item(f"when:{c.when}", z3.And([system._condition(d, c.name) for d in c.conditions]))
        system.solver.push()
        system.solver.add(z3.Implies(cond.switch, cond.formula))
        verdict = system.check(system.items + [cond])
        if verdict == z3.unsat:
            core = [it for it in _core_items(system, system.items + [cond]) if it is not cond]
            i = 0
            while i < len(core):  # minimal: drop rules one at a time while the condition stays excluded
                trial = core[:i] + core[i + 1:]
                if system.check(trial + [cond]) == z3.unsat:
                    core = [it for it in _core_items(system, trial + [cond]) if it is not cond]
                else:
                    i += 1
            found.append((c.when, tuple(it.label for it in core)))
        elif verdict == z3.unknown:
            unknown.append(f"unreachable:{c.when}")
        system.solver.pop()
    return tuple(found)


# -- contradictions: minimal unsatisfiable subsets, enumerated MARCO-style ----------------------------

def _contradictions(system: _System, unknown: list[str]) -> tuple[tuple[str, ...], ...]:
    """Up to MAX_CORES distinct minimal unsatisfiable subsets. A map solver over the item switches
    remembers what is explored: supersets of a found core and subsets of a satisfiable set are blocked."""
    explored = z3.Solver(ctx=system.ctx)
    cores: list[list[_Item]] = []
    for _ in range(MAX_SEEDS):
        if len(cores) == MAX_CORES or system.run(explored, limited=False) != z3.sat:
            break
        chosen = explored.model()
        # switches the map leaves open count as on: the larger the seed, the more it can contain
        seed = [it for it in system.items if not z3.is_false(chosen.eval(it.switch))]
        verdict = system.check(seed)
        if verdict == z3.unsat:
            core = _shrink(system, _core_items(system, seed), unknown)
            cores.append(core)
            explored.add(z3.Or([z3.Not(it.switch) for it in core]))
        elif verdict == z3.sat:
            kept = _grow(system, seed)
            explored.add(z3.Or([it.switch for it in system.items if it not in kept] or [z3.BoolVal(False, system.ctx)]))
        else:
            unknown.append("contradictions")
            break
    # smallest first: the shortest explanation is the one to read
    return tuple(tuple(it.label for it in core) for core in sorted(cores, key=len))


def _core_items(system: _System, subset: list[_Item]) -> list[_Item]:
    core = {str(lit) for lit in system.solver.unsat_core()}
    return [it for it in subset if str(it.switch) in core]


def _shrink(system: _System, core: list[_Item], unknown: list[str]) -> list[_Item]:
    """Drop items one at a time while the rest stays unsatisfiable. An item found necessary stays necessary
    in every smaller unsatisfiable set, so the core z3 returns for a trial keeps it and the index holds."""
    i = 0
    while i < len(core):
        trial = core[:i] + core[i + 1:]
        verdict = system.check(trial)
        if verdict == z3.unsat:
            core = _core_items(system, trial)
        else:
            if verdict == z3.unknown and "contradictions: not minimal" not in unknown:
                unknown.append("contradictions: not minimal")
            i += 1
    return core


def _grow(system: _System, seed: list[_Item]) -> list[_Item]:
    """A maximal satisfiable superset of `seed` (the solver has just found `seed` satisfiable)."""
    kept = _satisfied_by_model(system, seed)
    for it in system.items:
        if it not in kept and system.check(kept + [it]) == z3.sat:
            kept = _satisfied_by_model(system, kept + [it])
    return kept


def _satisfied_by_model(system: _System, kept: list[_Item]) -> list[_Item]:
    # items the current model happens to satisfy join for free, saving a solver call each
    model = system.solver.model()
    return [it for it in system.items
            if it in kept or z3.is_true(model.eval(it.formula, model_completion=True))]


# -- redundancy --------------------------------------------------------------------------------------

def _redundant(system: _System, unknown: list[str]) -> tuple[str, ...]:
    """Constraints whose negation cannot hold with the domains and the other constraints. For a conditional
    constraint the negation of (conditions -> body) is conditions and not body, as z3 derives it."""
    found = []
    for it in system.constraints:
        others = [o for o in system.items if o is not it]
        system.solver.push()
        system.solver.add(z3.Not(it.formula))
        verdict = system.check(others)
        system.solver.pop()
        if verdict == z3.unsat:
            found.append(it.label)
        elif verdict == z3.unknown:
            unknown.append(f"redundant:{it.label}")
    return tuple(found)


# -- bounding box ------------------------------------------------------------------------------------

def _bounding_box(system: _System, unknown: list[str]) -> dict[str, tuple[float, float]]:
    """Per signal, the infimum and supremum over the admissible region (z3's optimiser handles mixed real
    and integer variables). Rounded outward to floats so that every admissible value lies inside."""
    opt = z3.Optimize(ctx=system.ctx)  # no z3 timeout: system.run keeps the limit
    opt.add(*[it.formula for it in system.items])
    box = {}
    for s in system.signals:
        lo = _extreme(system, opt, system.var[s.name], opt.minimize)
        hi = _extreme(system, opt, system.var[s.name], opt.maximize)
        if lo is None:
            unknown.append(f"bounds:{s.name}.min")
        if hi is None:
            unknown.append(f"bounds:{s.name}.max")
        # out of time: the declared range is still a sound (looser) bound
        box[s.name] = (_float_down(lo) if lo is not None else s.lower, _float_up(hi) if hi is not None else s.upper)
    return box


def _extreme(system: _System, opt: z3.Optimize, x: z3.ArithRef, direction) -> Fraction | None:
    opt.push()
    try:
        goal = direction(x)
        return _closure_value(goal.value(), x.ctx) if system.run(opt) == z3.sat else None
    finally:
        opt.pop()


def _closure_value(value: z3.ArithRef, ctx: z3.Context) -> Fraction | None:
    """z3 writes an optimum that is approached but not attained (a strict `when` condition) as c ± k*epsilon;
    the box reports its closure, c."""
    value = z3.simplify(z3.substitute(value, (z3.Real("epsilon", ctx), z3.RealVal(0, ctx))))
    if z3.is_int_value(value):
        return Fraction(value.as_long())
    if z3.is_rational_value(value):
        return value.as_fraction()
    return None  # an infinity: cannot happen with bounded domains, but never guess


def _float_down(q: Fraction) -> float:
    f = float(q)
    return math.nextafter(f, -math.inf) if Fraction(f) > q else f


def _float_up(q: Fraction) -> float:
    f = float(q)
    return math.nextafter(f, math.inf) if Fraction(f) < q else f


# -- the human report ---------------------------------------------------------------------------------

def report_text(report: ConstraintReport, signals: list[Signal] | None = None) -> str:
    """A readable, multi-line account of the report; `signals` adds units and declared ranges to the box."""
    lines = [_headline(report)]
    for core in report.contradictions:
        lines += _contradiction_lines(core)
    for when, core in report.unreachable:
        lines.append(f"  UNREACHABLE: while {when}, no input passes the constraint gate: {', '.join(core)} "
                     "exclude it")
        lines.append(f"    fix: relax {' or '.join(x for x in core if not x.startswith('signal:')) or 'the domains'}, "
                     "or remove the constraints written for that state")
    if report.redundant:
        lines.append("redundant: implied by the signal domains and the other constraints, so they can be removed")
        lines += [f"  - {name}" for name in report.redundant]
        if len(report.redundant) > 1:
            lines.append("  each is implied on its own; two that imply each other are both listed, but only one "
                         "of them can go: remove one at a time and check again")
    if report.bounding_box:
        lines += _box_lines(report.bounding_box, {s.name: s for s in signals or ()})
    if report.unknown:
        lines.append("not decided within the time limit (raise timeout_ms or simplify): " + ", ".join(report.unknown))
    return "\n".join(lines)


def _headline(report: ConstraintReport) -> str:
    took = f"({report.seconds:.2f} s)"
    if report.satisfiable and report.unreachable:
        return (f"constraints: satisfiable, but {len(report.unreachable)} condition(s) written into them can never "
                f"hold while every rule does {took}")
    if report.satisfiable:
        return f"constraints: satisfiable, some input passes every check {took}"
    if report.contradictions:
        return f"constraints: UNSATISFIABLE, no input can pass the constraint gate {took}"
    return f"constraints: NOT PROVEN satisfiable, the solver ran out of time {took}"


def _contradiction_lines(core: tuple[str, ...]) -> list[str]:
    constraints = [x for x in core if not x.startswith("signal:")]
    domains = [x.removeprefix("signal:") for x in core if x.startswith("signal:")]
    lines = [f"  these constraints cannot hold together: {', '.join(core)}"]
    fixes = []
    if constraints:
        fixes.append(f"relax the bound or the `when` of {' or '.join(constraints)}")
    if domains:
        fixes.append(f"widen the declared range or values of {' or '.join(domains)}")
    lines.append(f"    fix: {'; or '.join(fixes)}")
    return lines


def _box_lines(box: dict[str, tuple[float, float]], by_name: dict[str, Signal]) -> list[str]:
    width = max(len("signal"), *(len(n) for n in box))
    lines = ["bounding box: the values each signal can take while every constraint holds (* tighter than declared)",
             f"  {'signal':<{width}}  {'min':>12}  {'max':>12}  unit  declared"]
    for name, (lo, hi) in box.items():
        s = by_name.get(name)
        unit = s.unit if s else ""
        declared = f"[{s.lower:g}, {s.upper:g}]" if s else ""
        mark = "*" if s and (lo > s.lower or hi < s.upper) else " "
        lines.append(f"{mark} {name:<{width}}  {lo:>12g}  {hi:>12g}  {unit:<4}  {declared}")
    return lines
