"""Number backends for curve arithmetic: the same formulas run on Python ints or on gmpy2 mpz.

Curve code never imports gmpy2 itself; it receives a `Backend` whose `lift` turns ints into the
backend's number type (mpz multiplies 254-bit numbers ~2.5x faster) and whose `inv` inverts mod q.
Results are converted back to int at the API boundary, so every backend gives identical outputs.
A backend may also bring its own native MSM (`native_points` + `msm`, see backend_mcl.py); msm.py
then hands whole MSMs to it instead of running Pippenger in Python.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from .errors import ZkError
from .field import Q


class Backend(Protocol):
    name: str
    q: Any

    def lift(self, x: int) -> Any: ...

    def inv(self, x: Any) -> Any: ...


class IntBackend:
    """Plain Python ints: always available, the baseline."""

    name = "int"
    q = Q

    def lift(self, x: int) -> int:
        return x

    def inv(self, x: int) -> int:
        return pow(x, -1, Q)


class Gmpy2Backend:
    """gmpy2 mpz numbers (LGPL, a plain wheel): same formulas, faster multiplication and inversion."""

    name = "gmpy2"

    def __init__(self) -> None:
        import gmpy2

        self._mpz: Callable[[int], Any] = gmpy2.mpz
        self._invert = gmpy2.invert
        self.q = gmpy2.mpz(Q)

    def lift(self, x: int) -> Any:
        return self._mpz(x)

    def inv(self, x: Any) -> Any:
        return self._invert(x, self.q)


def _mcl() -> Backend:
    from .backend_mcl import MclBackend

    return MclBackend()


# fastest last: callers that want "the best installed backend" take available()[-1]
_FACTORIES: dict[str, Callable[[], Backend]] = {"int": IntBackend, "gmpy2": Gmpy2Backend, "mcl": _mcl}
_CACHE: dict[str, Backend] = {}


def available() -> list[str]:
    names = []
    for name in _FACTORIES:
        try:
            get(name)
            names.append(name)
        except ZkError:
            pass
    return names


def get(name: str = "gmpy2") -> Backend:
    """The backend called `name` ("int", "gmpy2" or "mcl"); ZkError if unknown or not installed."""
    if name not in _CACHE:
        if name not in _FACTORIES:
            raise ZkError(f"unknown backend {name!r}; choose one of {sorted(_FACTORIES)}")
        try:
            _CACHE[name] = _FACTORIES[name]()
        except ImportError as e:
            raise ZkError(f"backend {name!r} is not installed ({e}); pip install the package or use 'int'")
    return _CACHE[name]
