#!/usr/bin/env python3
"""Fits the polynomial of the shifted kernels' exp (kernels/nonpositive_exp-inl.h).

exp(r) = 1 + r + r^2 q(r) on |r| <= ln(2)/2 + 2^-20 (the reduced argument's range, with room for
its rounding); q is interpolated at the Chebyshev nodes of that interval, in 50-digit decimal
arithmetic, and its coefficients are rounded to float. The printed maximum is the error of
1 + r + r^2 q(r) in exact arithmetic on a fine grid: a guide only. The contract of the exp is
checked on every float input by tests/exp_test.cpp, not derived from this figure.

Usage: python3 scripts/fit_exp_polynomial.py
"""
import struct
from decimal import Decimal, getcontext

getcontext().prec = 50
DEGREE = 4  # q's degree: exp's polynomial has degree 6


def to_float(x):
    return struct.unpack("f", struct.pack("f", float(x)))[0]


def q_exact(r):  # (e^r - 1 - r) / r^2 = sum_k r^k / (k + 2)!, summed directly (no cancellation)
    term, total, k = Decimal(1) / 2, Decimal(1) / 2, 0
    while abs(term) > Decimal(10) ** -45:
        k += 1
        term *= r / (k + 2)
        total += term
    return total


def cos_decimal(x):  # Taylor series, enough for |x| <= pi
    term, total, k = Decimal(1), Decimal(1), 0
    while abs(term) > Decimal(10) ** -45:
        k += 2
        term *= -x * x / (k * (k - 1))
        total += term
    return total


PI = Decimal("3.14159265358979323846264338327950288419716939937510")
LN2 = Decimal(2).ln()
half_width = LN2 / 2 + Decimal(2) ** -20
nodes = [half_width * cos_decimal(PI * (2 * j + 1) / (2 * (DEGREE + 1))) for j in range(DEGREE + 1)]
# Solve the Vandermonde system for q's monomial coefficients (Gaussian elimination, exact enough).
rows = [[node**k if k else Decimal(1) for k in range(DEGREE + 1)] + [q_exact(node)] for node in nodes]
size = DEGREE + 1
for col in range(size):
    pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
    rows[col], rows[pivot] = rows[pivot], rows[col]
    for r in range(size):
        if r != col:
            factor = rows[r][col] / rows[col][col]
            rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col])]
coefficients = [rows[k][size] / rows[k][k] for k in range(size)]
rounded = [to_float(c) for c in coefficients]

worst = Decimal(0)
steps = 4000
for i in range(steps + 1):
    r = -half_width + 2 * half_width * i / steps
    q = Decimal(0)
    for c in reversed(rounded):
        q = q * r + Decimal(c)
    approximation = 1 + r + r * r * q
    worst = max(worst, abs(approximation / r.exp() - 1))
for k, c in enumerate(rounded):
    print(f"c{k + 2} = {float(c).hex()}  ({c!r})")
print(f"max relative error of 1 + r + r^2 q(r) on the grid: {float(worst):.3e} = {float(worst) / 2**-24:.4f} u (fp32)")
