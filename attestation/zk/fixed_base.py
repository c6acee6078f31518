"""Fixed-base scalar multiplication with precomputed windows: the setup multiplies one generator
by thousands of scalars, where a 8-bit window table makes each product ~32 mixed additions."""
from __future__ import annotations

from typing import Any

from .backend import Backend
from .field import R

_WINDOW = 8


class FixedBase:
    def __init__(self, group: type, base: Any, be: Backend) -> None:
        self.group, self.be = group, be
        q = be.q
        n_windows = (R.bit_length() + _WINDOW - 1) // _WINDOW
        self.table: list[list[Any]] = []
        g = group.lift(base, be)
        for _ in range(n_windows):
            row: list[Any] = [None]
            acc = None
            for _d in range(1, 1 << _WINDOW):
                acc = group.add_mixed(acc, g, q)
                row.append(group.lift(group.to_affine(acc, be), be))
            self.table.append(row)
            nxt = group.to_affine(group.add_mixed(acc, g, q), be)  # 2^8 * g
            g = group.lift(nxt, be)

    def mul(self, k: int) -> Any:
        k %= R
        q = self.be.q
        acc = None
        mask = (1 << _WINDOW) - 1
        w = 0
        while k:
            d = k & mask
            if d:
                acc = self.group.add_mixed(acc, self.table[w][d], q)
            k >>= _WINDOW
            w += 1
        return self.group.to_affine(acc, self.be)
