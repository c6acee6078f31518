"""Analytic-redundancy relations: small arithmetic expressions over signals that stay steady while the plant
is healthy (the gaugemeter equation, mass flow, actuator tracking). Parsed once from the FMEA file.

Grammar: numbers, signal names, `command`, + - * /, unary minus, parentheses and `prev(name)` or
`prev(name, k)` for the value k frames earlier. Nothing else is evaluated (no attribute access, no calls).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

_BINOPS = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.divide}


@dataclass(frozen=True)
class Expression:
    text: str
    tree: ast.expr
    names: frozenset[str]
    max_lag: int

    def evaluate(self, column) -> np.ndarray:
        """`column(name)` -> 1-D array; the result has the window's length (the first max_lag rows are NaN)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.asarray(self._eval(self.tree, column), dtype=np.float64)
        return out

    def _eval(self, node, column):
        if isinstance(node, ast.Constant):
            return float(node.value)
        if isinstance(node, ast.Name):
            return column(node.id)
        if isinstance(node, ast.UnaryOp):
            return -self._eval(node.operand, column)
        if isinstance(node, ast.BinOp):
            return _BINOPS[type(node.op)](self._eval(node.left, column), self._eval(node.right, column))
        # prev(name, k)
        x = column(node.args[0].id)
        k = int(node.args[1].value) if len(node.args) > 1 else 1
        out = np.full(len(x), np.nan)
        out[k:] = x[:-k]
        return out


def parse_expression(text: str) -> Expression:
    """Raises ValueError naming the part of `text` that is not allowed."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {text!r}: {exc.msg} at column {exc.offset}") from None
    names: set[str] = set()
    lag = 0

    def check(node) -> None:
        nonlocal lag
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return
        if isinstance(node, ast.Name):
            names.add(node.id)
            return
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            check(node.operand)
            return
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            check(node.left)
            check(node.right)
            return
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "prev"
                and not node.keywords and 1 <= len(node.args) <= 2 and isinstance(node.args[0], ast.Name)
                and (len(node.args) == 1 or (isinstance(node.args[1], ast.Constant)
                                             and isinstance(node.args[1].value, int) and node.args[1].value >= 1))):
            names.add(node.args[0].id)
            lag = max(lag, node.args[1].value if len(node.args) > 1 else 1)
            return
        raise ValueError(f"{ast.unparse(node)!r} is not allowed in a relation: use numbers, signal names, "
                         f"+ - * /, parentheses and prev(signal[, k])")

    check(tree)
    return Expression(text, tree, frozenset(names), lag)
