"""Block-quantised weights: onnxruntime's com.microsoft MatMulNBits and GatherBlockQuantized
(the int4 builds of onnxruntime-genai's builder: every linear layer, and the tied embedding).

B holds each output column's K weights as ``bits``-bit unsigned integers packed low bits
first, in blocks of ``block_size`` along K, one float scale per block and an optional zero
point per block (packed like B, or a float; default 2^(bits-1)). The weight is dequantised
on the backend, W[n, k] = (q - zero_point) * scale, and multiplied through ``be.matmul``
(batch-invariant). The dequantised weight is kept for the node's constant inputs, so a
plan dequantises each weight once, on its first forward (the warm-up, before any capture).

MatMulNBits' ``accuracy_level`` is a hint about the activations' precision; they are always
multiplied in float here (level 0's arithmetic). onnxruntime's CPU kernel at level 4 (the
builder's int4 default) quantises them to int8 blocks first: on SmolLM2 int4 that moves the
logits by up to 2, while at level 0 it agrees with native within 1.2e-4.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Kernel


def unpack(xp, packed, bits: int):
    """uint8 [..., n] -> uint8 [..., n * 8 / bits], the low bits of each byte first."""
    per_byte = 8 // bits
    shifts = xp.arange(0, 8, bits, dtype=np.uint8)
    values = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return values.reshape(packed.shape[:-1] + (packed.shape[-1] * per_byte,))


class MatMulNBits(Kernel):
    domain = "com.microsoft"

    def setup(self) -> None:
        self.k = int(self.attr("K", 0))
        self.n = int(self.attr("N", 0))
        self.bits = int(self.attr("bits", 4))
        self.block = int(self.attr("block_size", 0))
        if self.bits not in (1, 2, 4, 8):
            raise self.fail("only byte-aligned bit widths are supported", field="bits",
                            value=self.bits, remedy="use 2, 4 or 8 bits")
        if self.block < 16 or self.block & (self.block - 1):
            raise self.fail("block_size must be a power of two >= 16", field="block_size",
                            value=self.block, remedy="use 16, 32, 64, 128, ...")
        if self.k <= 0 or self.n <= 0:
            raise self.fail("K and N must be positive", field="K/N", value=(self.k, self.n),
                            remedy="set the K and N attributes to the weight's shape")
        if len(self.node.input) > 4 and self.node.input[4]:
            raise self.fail("g_idx (act-order) is not supported", field="MatMulNBits.input[4]",
                            value=self.node.input[4], remedy="quantise without act-order")
        self.blocks = math.ceil(self.k / self.block)
        self._cached: tuple | None = None

    def weight(self, be, b, scales, zero_points):
        """The dequantised weight [N, K], float32 for 16-bit scales (the scales' dtype
        otherwise): a 16-bit weight would round every element once more."""
        xp = be.xp
        expected = (self.n, self.blocks, self.block * self.bits // 8)
        if tuple(b.shape) != expected:
            raise self.fail("B's shape does not match N, K, bits and block_size",
                            field="B.shape", value=tuple(b.shape),
                            remedy=f"B must be uint8 {list(expected)}")
        dtype = np.dtype(np.float32) if scales.dtype.itemsize < 4 else scales.dtype
        q = unpack(xp, b, self.bits).astype(dtype)  # [N, blocks, block]
        scale = scales.reshape(self.n, self.blocks).astype(dtype)
        if zero_points is None:
            zp = dtype.type(1 << (self.bits - 1))
        elif zero_points.dtype == np.uint8:
            zp = unpack(xp, zero_points.reshape(self.n, -1), self.bits)[:, : self.blocks]
            zp = zp.astype(dtype)[..., None]
        else:
            zp = zero_points.reshape(self.n, self.blocks)[..., None].astype(dtype)
        w = ((q - zp) * scale[..., None]).reshape(self.n, self.blocks * self.block)
        return xp.ascontiguousarray(w[:, : self.k])

    def __call__(self, be, a, b, scales, zero_points=None, g_idx=None, bias=None):
        cached = self._cached
        inputs = (b, scales, zero_points)
        if cached is not None and all(mine is theirs for mine, theirs in zip(cached, inputs)):
            w = cached[3]
        else:
            w = self.weight(be, b, scales, zero_points)
            self._cached = (b, scales, zero_points, w)
        if a.shape[-1] != self.k:
            raise self.fail("A's last axis is not K", field="A.shape", value=tuple(a.shape),
                            remedy=f"A must end in K={self.k}")
        # 16-bit activations are multiplied in float32 and rounded once, with the bias
        y = be.matmul(a.astype(w.dtype, copy=False), w.T)
        if bias is not None:
            y = y + bias.astype(w.dtype, copy=False)
        return (y.astype(a.dtype, copy=False),)


class GatherBlockQuantized(Kernel):
    """com.microsoft GatherBlockQuantized on uint8 data (the builder's quantised embedding
    table): rows gathered along axis 0 by (device) indices, then dequantised, each
    ``block_size`` run of the last axis by its scale and zero point (default 2^(bits-1));
    values of fewer than 8 bits are packed along the last axis, low bits first. Only the
    gathered rows are dequantised. The output has the scales' dtype."""

    domain = "com.microsoft"

    def setup(self) -> None:
        self.bits = int(self.attr("bits", 4))
        self.block = int(self.attr("block_size", 128))
        self.gather_axis = int(self.attr("gather_axis", 0))
        self.quantize_axis = int(self.attr("quantize_axis", 1))
        if self.bits not in (2, 4, 8):
            raise self.fail("uint8 data holds 2, 4 or 8-bit values", field="bits",
                            value=self.bits, remedy="use 2, 4 or 8 bits")
        if self.block < 16 or self.block & (self.block - 1):
            raise self.fail("block_size must be a power of two >= 16", field="block_size",
                            value=self.block, remedy="use 16, 32, 64, 128, ...")
        if self.gather_axis != 0:
            raise self.fail("uint8 data is gathered along axis 0", field="gather_axis",
                            value=self.gather_axis, remedy="gather along axis 0")

    def __call__(self, be, data, indices, scales, zero_points=None):
        xp = be.xp
        if data.dtype != np.uint8:
            raise self.fail("only uint8 (packed) data is supported", field="data.dtype",
                            value=str(data.dtype), remedy="export the table as packed uint8")
        if self.quantize_axis not in (-1, data.ndim - 1):
            raise self.fail("blocks must run along the last axis", field="quantize_axis",
                            value=self.quantize_axis, remedy=f"use {data.ndim - 1}")
        idx = indices.astype(np.int64)
        idx = xp.where(idx < 0, idx + data.shape[0], idx)
        width = data.shape[-1] * 8 // self.bits
        blocks = -(-width // self.block)
        if scales.shape[-1] != blocks:
            raise self.fail("scales do not hold one value per block of the last axis",
                            field="scales.shape", value=tuple(scales.shape),
                            remedy=f"give scales a last axis of {blocks}")
        dtype = np.dtype(np.float32) if scales.dtype.itemsize < 4 else scales.dtype
        q = unpack(xp, xp.take(data, idx, axis=0), self.bits).astype(dtype)
        scale = xp.take(scales, idx, axis=0).astype(dtype)
        if zero_points is None:
            zp = dtype.type(1 << (self.bits - 1))
        else:
            zp = unpack(xp, xp.take(zero_points, idx, axis=0), self.bits)[..., :blocks]
            zp = xp.repeat(zp.astype(dtype), self.block, axis=-1)[..., :width]
        scale = xp.repeat(scale, self.block, axis=-1)[..., :width]
        return (((q - zp) * scale).astype(scales.dtype, copy=False),)
