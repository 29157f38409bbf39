"""Normalisations over the trailing axes: ONNX's LayerNormalization and RMSNormalization,
and the forms onnxruntime's exporters write (SimplifiedLayerNormalization in the ONNX
domain, the Skip* fusions in com.microsoft).

Every mean is a ``be.sum`` over the flattened trailing axes (fixed order, so a row's result
does not depend on how many rows there are) divided by the count. 16-bit inputs are
normalised in float32 when ``stash_type`` is 1 (the default), then rounded once.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Kernel, norm_axis

_FLOAT32 = np.dtype(np.float32)


def _compute_dtype(dtype: np.dtype, stash_type: int) -> np.dtype:
    return _FLOAT32 if stash_type == 1 and dtype.itemsize < 4 else dtype


def _rows(x, axis: int):
    """x as [rows, cols] with cols the product of the axes from ``axis`` on."""
    return x.reshape((math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


def _mean(be, x2, cols: int):
    return be.sum(x2, 1, keepdims=True) / x2.dtype.type(cols)


def rms_normalize(be, x, scale, axis: int, epsilon: float, stash_type: int, out_dtype=None):
    """(x / sqrt(mean(x^2) + eps)) * scale, and 1/sqrt(mean(x^2) + eps) per row."""
    xp = be.xp
    dtype = _compute_dtype(x.dtype, stash_type)
    x2 = _rows(x, axis).astype(dtype, copy=False)
    inv = xp.reciprocal(xp.sqrt(_mean(be, x2 * x2, x2.shape[1]) + dtype.type(epsilon)))
    y = (x2 * inv).reshape(x.shape) * scale.astype(dtype, copy=False)
    stats_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    return y.astype(out_dtype or x.dtype, copy=False), inv.reshape(stats_shape)


def layer_normalize(be, x, scale, bias, axis: int, epsilon: float, stash_type: int):
    """((x - mean) / sqrt(var + eps)) * scale + bias, with the per-row mean and 1/std."""
    xp = be.xp
    dtype = _compute_dtype(x.dtype, stash_type)
    x2 = _rows(x, axis).astype(dtype, copy=False)
    mean = _mean(be, x2, x2.shape[1])
    diff = x2 - mean
    inv = xp.reciprocal(xp.sqrt(_mean(be, diff * diff, x2.shape[1]) + dtype.type(epsilon)))
    y = (diff * inv).reshape(x.shape) * scale.astype(dtype, copy=False)
    if bias is not None:
        y = y + bias.astype(dtype, copy=False)
    stats_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    return y.astype(x.dtype, copy=False), mean.reshape(stats_shape), inv.reshape(stats_shape)


class _Normalization(Kernel):
    default_epsilon = 1e-5

    def setup(self) -> None:
        self.axis = int(self.attr("axis", -1))
        self.epsilon = float(self.attr("epsilon", self.default_epsilon))
        self.stash_type = int(self.attr("stash_type", 1))

    def resolved_axis(self, x) -> int:
        return norm_axis(self.axis, x.ndim, self)


class LayerNormalization(_Normalization):
    """ONNX LayerNormalization (17): outputs Y, Mean, InvStdDev (the last two in X's type)."""

    def __call__(self, be, x, scale, bias=None):
        y, mean, inv = layer_normalize(be, x, scale, bias, self.resolved_axis(x),
                                       self.epsilon, self.stash_type)
        return (y, mean.astype(x.dtype, copy=False), inv.astype(x.dtype, copy=False))


class RMSNormalization(_Normalization):
    """ONNX RMSNormalization (23)."""

    def __call__(self, be, x, scale):
        y, _ = rms_normalize(be, x, scale, self.resolved_axis(x), self.epsilon,
                             self.stash_type)
        return (y,)


class SimplifiedLayerNormalization(_Normalization):
    """onnxruntime's RMS norm, registered in the ONNX domain: outputs Y (in scale's type,
    which may differ from X's) and inv_std_var (float32 for 16-bit inputs by default)."""

    def __call__(self, be, x, scale):
        y, inv = rms_normalize(be, x, scale, self.resolved_axis(x), self.epsilon,
                               self.stash_type, out_dtype=scale.dtype)
        return (y, inv)


class _SkipNormalization(Kernel):
    """com.microsoft Skip*LayerNormalization: s = input + skip (+ bias), normalised over the
    last axis; outputs (output, mean, inv_std_var, input_skip_bias_sum). The statistics
    are float32 for 16-bit inputs (onnxruntime computes them there)."""

    domain = "com.microsoft"
    default_epsilon = 1e-12

    def setup(self) -> None:
        self.epsilon = float(self.attr("epsilon", self.default_epsilon))

    def skip_sum(self, x, skip, bias):
        if skip.shape != x.shape and skip.shape != x.shape[-skip.ndim:]:
            raise self.fail("skip must have the input's shape or its trailing dims",
                            field="skip.shape", value=tuple(skip.shape),
                            remedy=f"give skip the shape {tuple(x.shape)}")
        s = x + skip
        return s if bias is None else s + bias


class SkipSimplifiedLayerNormalization(_SkipNormalization):
    def __call__(self, be, x, skip, gamma, bias=None):
        s = self.skip_sum(x, skip, bias)
        y, inv = rms_normalize(be, s, gamma, s.ndim - 1, self.epsilon, 1)
        return (y, None, inv, s)


class SkipLayerNormalization(_SkipNormalization):
    def __call__(self, be, x, skip, gamma, beta=None, bias=None):
        s = self.skip_sum(x, skip, bias)
        y, mean, inv = layer_normalize(be, s, gamma, beta, s.ndim - 1, self.epsilon, 1)
        return (y, mean, inv, s)


class GroupNormalization(_Normalization):
    """ONNX GroupNormalization: X [N, C, ...] normalised over each group of C / num_groups
    channels (and the spatial axes), by ``layer_normalize``'s fixed-order means; then scaled
    and shifted per channel (opset 21) or per group (opset 18). The first stage computes in
    float32 for 16-bit inputs when ``stash_type`` is 1 (21's default), the second in X's type."""

    def setup(self) -> None:
        super().setup()
        self.groups = int(self.attr("num_groups", 0))
        if self.groups <= 0:
            raise self.fail("num_groups must be positive", field="num_groups",
                            value=self.groups, remedy="set num_groups to a divisor of C")

    def __call__(self, be, x, scale, bias):
        n, c = x.shape[0], x.shape[1]
        if c % self.groups:
            raise self.fail("num_groups does not divide the channels", field="num_groups",
                            value=(self.groups, c), remedy=f"use a divisor of {c}")
        grouped = x.reshape((n, self.groups, -1))
        ones = be.xp.ones((1,), dtype=x.dtype)
        normed, _, _ = layer_normalize(be, grouped, ones, None, 2, self.epsilon,
                                       self.stash_type if self.opset >= 21 else 0)
        if self.opset < 21:  # scale and bias per group
            per = (1, self.groups, 1)
            y = normed * scale.reshape(per) + bias.reshape(per)
            return (y.reshape(x.shape),)
        per = (1, c) + (1,) * (x.ndim - 2)
        return (normed.reshape(x.shape) * scale.reshape(per) + bias.reshape(per),)
