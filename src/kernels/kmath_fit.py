#!/usr/bin/env python3
"""kmath_fit.py — prints the polynomial coefficients of src/kernels/kmath.h.

usage: python3 src/kernels/kmath_fit.py      (needs Debian's python3-mpmath)

Each is a Chebyshev least-squares fit (mpmath.chebyfit, 40 digits) of the part of the function
that kmath.h leaves to a polynomial, over the interval kmath.h reduces its argument to, then
rounded to float32 and printed as C hex floats, highest degree first:
  exp:   q(r) = (exp(r) - 1 - r) / r^2 on |r| <= ln2/2 (a little wider), degree 5
  tanh:  p(z) = (tanh(a)/a - 1) / z with z = a^2, a <= 0.55, degree 5
  log:   q(z) = 2 (atanh(s)/s - 1) / z with z = s^2, |s| <= (sqrt2 - 1)/(sqrt2 + 1), degree 3
The accuracy that results in float32 is measured by tests/test_kernels.c (kmath_accuracy) and,
over every float32 input, recorded in docs/exactness.md.
"""
import struct

import mpmath as mp

mp.mp.dps = 40


def f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def c_hex(x):
    """a float32 value as kmath.h spells it: 0x1.xxxxxxp+e with trailing zero digits dropped"""
    sign, h = ("-", (-x).hex()) if x < 0 else ("", x.hex())
    mant, exp = h[len("0x1."):].split("p")
    mant = mant[:6].rstrip("0")
    return "%s0x1%s%sp%sf" % (sign, "." if mant else "", mant, exp if exp.startswith("-") else "+" + exp.lstrip("+"))


def exp_q(r):
    r = mp.mpf(r)
    return mp.mpf(1) / 2 if r == 0 else (mp.exp(r) - 1 - r) / r**2


def tanh_p(z):
    z = mp.mpf(z)
    if z == 0:
        return mp.mpf(-1) / 3
    a = mp.sqrt(z)
    return (mp.tanh(a) / a - 1) / z


def log_q(z):
    z = mp.mpf(z)
    if z == 0:
        return mp.mpf(2) / 3
    s = mp.sqrt(z)
    return 2 * (mp.atanh(s) / s - 1) / z


SMAX = (mp.sqrt(2) - 1) / (mp.sqrt(2) + 1)
FITS = [
    ("KM_EXP_Q", exp_q, [-0.3467, 0.3467], 5),
    ("KM_TANH_P", tanh_p, [0, 0.3025], 5),
    ("KM_LOG_Q", log_q, [0, SMAX**2 * 1.0001], 3),
]

for name, fn, interval, degree in FITS:
    coeffs = mp.chebyfit(fn, interval, degree + 1)
    for i, c in enumerate(coeffs):
        print("#define %s%d %s" % (name, degree - i, c_hex(f32(c))))
