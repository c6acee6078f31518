"""Number-theoretic transforms over Fr on the power-of-two domain and on snarkjs's odd coset.

The coset is {g * w^i} with g = w[log2(n) + 1], a primitive 2n-th root: those are the odd powers of
the 2n-th root, where the vanishing polynomial X^n - 1 equals -2 everywhere. snarkjs evaluates
A*B - C there, and its H points are the odd-index Lagrange basis of the 2n domain; a prover that
uses any other coset produces proofs snarkjs rejects.
"""
from __future__ import annotations

from .errors import ZkError
from .field import R, ROOTS, TWO_ADICITY

try:  # gmpy2 multiplies 254-bit numbers ~2x faster; results are converted back to int
    from gmpy2 import mpz as _num
except ImportError:  # pragma: no cover - gmpy2 is a pinned dependency
    _num = int


def log2_exact(n: int) -> int:
    k = n.bit_length() - 1
    if n <= 0 or 1 << k != n or k > TWO_ADICITY:
        raise ZkError(f"domain size {n} is not a power of two up to 2^{TWO_ADICITY}")
    return k


def bit_reverse(a: list) -> list:
    """Permute `a` (length a power of two) into bit-reversed index order, in place; returns it."""
    n = len(a)
    j = 0
    for i in range(1, n):
        bit = n >> 1
        while j & bit:
            j ^= bit
            bit >>= 1
        j |= bit
        if i < j:
            a[i], a[j] = a[j], a[i]
    return a


def _fft(values: list[int], root: int) -> list[int]:
    n = len(values)
    r = _num(R)
    a = bit_reverse([_num(x) for x in values])
    size = 2
    while size <= n:
        half = size >> 1
        w_step = _num(pow(root, n // size, R))
        ws = [_num(1)] * half
        for k in range(1, half):
            ws[k] = ws[k - 1] * w_step % r
        for start in range(0, n, size):
            for k in range(half):
                u = a[start + k]
                v = a[start + k + half] * ws[k] % r
                a[start + k] = (u + v) % r
                a[start + k + half] = (u - v) % r
        size <<= 1
    return [int(x) for x in a]


def fft(coeffs: list[int]) -> list[int]:
    """Evaluations at w^0 .. w^(n-1) of the polynomial with these coefficients."""
    return _fft(coeffs, ROOTS[log2_exact(len(coeffs))])


def ifft(values: list[int]) -> list[int]:
    """Coefficients of the polynomial taking `values` at w^0 .. w^(n-1)."""
    n = len(values)
    root_inv = pow(ROOTS[log2_exact(n)], -1, R)
    n_inv = pow(n, -1, R)
    return [c * n_inv % R for c in _fft(values, root_inv)]


def to_odd_coset(values: list[int]) -> list[int]:
    """Evaluations on the domain -> evaluations at g * w^i (g = w[log2 n + 1]), as snarkjs."""
    n = len(values)
    coeffs = ifft(values)
    g = ROOTS[log2_exact(n) + 1]
    shift = 1
    for j in range(n):
        coeffs[j] = coeffs[j] * shift % R
        shift = shift * g % R
    return fft(coeffs)
