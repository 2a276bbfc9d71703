"""Vectorised numpy layers in float32, laid out as Burn stores and computes them.

Activations of the convolutional layers are channels-last (``[B, H, W, C]``) so that every
convolution is one BLAS matrix product and per-channel vectors broadcast without reshaping.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

# W. J. Cody, "Rational Chebyshev approximations for the error function", Math. Comp. 23
# (1969), as in his SPECFUN CALERF: about 18 significant digits in exact arithmetic, so the
# float64 result is good to a few ulps.
_ERF_A = (
    3.16112374387056560e00,
    1.13864154151050156e02,
    3.77485237685302021e02,
    3.20937758913846947e03,
    1.85777706184603153e-1,
)
_ERF_B = (
    2.36012909523441209e01,
    2.44024637934444173e02,
    1.28261652607737228e03,
    2.84423683343917062e03,
)
_ERFC_C = (
    5.64188496988670089e-1,
    8.88314979438837594e00,
    6.61191906371416295e01,
    2.98635138197400131e02,
    8.81952221241769090e02,
    1.71204761263407058e03,
    2.05107837782607147e03,
    1.23033935479799725e03,
    2.15311535474403846e-8,
)
_ERFC_D = (
    1.57449261107098347e01,
    1.17693950891312499e02,
    5.37181101862009858e02,
    1.62138957456669019e03,
    3.29079923573345963e03,
    4.36261909014324716e03,
    3.43936767414372164e03,
    1.23033935480374942e03,
)
_ERFC_P = (
    3.05326634961232344e-1,
    3.60344899949804439e-1,
    1.25781726111229246e-1,
    1.60837851487422766e-2,
    6.58749161529837803e-4,
    1.63153871373020978e-2,
)
_ERFC_Q = (
    2.56852019228982242e00,
    1.87295284992346047e00,
    5.27905102951428412e-1,
    6.05183413124413191e-2,
    2.33520497626869185e-3,
)
_FRAC_1_SQRT_PI = 0.56418958354775628695
_FRAC_1_SQRT_2 = 1.0 / math.sqrt(2.0)


def _ratio(t: np.ndarray, num: tuple[float, ...], den: tuple[float, ...]) -> np.ndarray:
    """Cody's nested form: numerator and denominator share the Horner loop over ``t``."""
    n, d = num[-1] * t, t
    for a, b in zip(num[:-2], den[:-1]):
        n = (n + a) * t
        d = (d + b) * t
    return (n + num[-2]) / (d + den[-1])


def erf(x: np.ndarray) -> np.ndarray:
    """The error function in float64, accurate to about 1e-16; numpy has none, scipy is no dependency."""
    x = np.asarray(x, dtype=np.float64)
    y = np.abs(x)
    out = np.full_like(y, np.nan)
    small = y <= 0.46875
    middle = (y > 0.46875) & (y <= 4.0)
    large = y > 4.0
    ys = y[small]
    out[small] = ys * _ratio(ys * ys, _ERF_A, _ERF_B)
    ym = y[middle]
    out[middle] = 1.0 - np.exp(-ym * ym) * _ratio(ym, _ERFC_C, _ERFC_D)
    yl = np.minimum(y[large], 27.0)  # erfc(27) underflows to 0; this avoids overflow in y*y
    inv_sq = 1.0 / (yl * yl)
    tail = (_FRAC_1_SQRT_PI - inv_sq * _ratio(inv_sq, _ERFC_P, _ERFC_Q)) / yl
    out[large] = 1.0 - np.exp(-yl * yl) * tail
    return np.copysign(out, x)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, ``x * 0.5 * (1 + erf(x / sqrt 2))`` as Burn's ``Gelu::new()``; float32 out.

    Like Burn's, it maps -inf to NaN (``-inf * 0``); that is a result, not worth a warning.
    """
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return (wide * 0.5 * (1.0 + erf(wide * _FRAC_1_SQRT_2))).astype(np.float32)


# Numerical Recipes' erfcc: a Chebyshev fit of erfc over the whole line, fractional error below
# 1.2e-7, which is float32's own precision; one formula, so no branches over the array.
_ERFC_FIT = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
             -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def gelu_float32(x: np.ndarray) -> np.ndarray:
    """Exact GELU to float32 precision, computed in float32: what a float32 reference such as
    PyTorch's gives, at a fraction of :func:`gelu`'s cost."""
    z = np.abs(x) * np.float32(_FRAC_1_SQRT_2)
    t = 1 / (1 + np.float32(0.5) * z)
    poly = np.full_like(t, np.float32(_ERFC_FIT[-1]))
    for coefficient in _ERFC_FIT[-2::-1]:
        poly *= t
        poly += np.float32(coefficient)
    poly -= z * z
    erfc = t * np.exp(poly)  # erfc(|x| / sqrt 2)
    erf = np.copysign(1 - erfc, x)
    return x * np.float32(0.5) * (1 + erf)


def relu_(x: np.ndarray) -> np.ndarray:
    """ReLU in place: ``x`` is always a fresh activation, so no new buffer is needed."""
    return np.maximum(x, 0, out=x)


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Burn's Linear in its default Row layout: ``weight`` is ``[d_in, d_out]``, ``y = x @ W + b``."""
    y = x @ weight
    y += bias
    return y


def conv2d_valid(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Stride-1, unpadded 2-D convolution of channels-last ``x`` with ``[O, C, kh, kw]`` weights.

    im2col: the strided window view is gathered into ``[B*H'*W', C*kh*kw]`` rows whose order
    matches the weight's own ``(C, kh, kw)`` flattening, so one matmul does the work.
    """
    out_channels, in_channels, kh, kw = weight.shape
    windows = sliding_window_view(x, (kh, kw), axis=(1, 2))  # [B, H', W', C, kh, kw]
    batch, height, width = windows.shape[:3]
    columns = windows.reshape(batch * height * width, in_channels * kh * kw)
    y = columns @ weight.reshape(out_channels, in_channels * kh * kw).T
    y += bias
    return y.reshape(batch, height, width, out_channels)


def batch_norm_(
    x: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    eps: float = 1e-5,
) -> np.ndarray:
    """Inference BatchNorm over the last axis, in place, from the running statistics.

    ``(x - mean) / sqrt(var + eps) * gamma + beta`` is applied as one scale and one shift
    per channel, derived here on each call so the model keeps only the file's own arrays.
    """
    scale = gamma / np.sqrt(var + np.float32(eps))
    x *= scale
    x += beta - mean * scale
    return x


def max_pool_2x2(x: np.ndarray) -> np.ndarray:
    """2x2 max pooling with stride 2 over channels-last ``x``, dropping an odd last row/column."""
    batch, height, width, channels = x.shape
    h, w = height // 2, width // 2
    tiles = x[:, : 2 * h, : 2 * w].reshape(batch, h, 2, w, 2, channels)
    return tiles.max(axis=(2, 4))
