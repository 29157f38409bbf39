"""Rotary position embeddings: ONNX RotaryEmbedding (23) and onnxruntime's com.microsoft
form. Both rotate the first ``rotary_dim`` channels of each head by the angle at the token's
position, read from cos/sin caches of half that width; pairs are the two halves of those
channels, or neighbouring channels when ``interleaved``. Positions are device values: the
caches are gathered with them on the backend, nothing is read back.
"""
from __future__ import annotations

from .base import Kernel


def rotate(xp, x, cos, sin, rotary_dim: int, interleaved: bool):
    """x: [B, S, N, H]; cos, sin: [B, S, rotary_dim // 2] (already gathered)."""
    cos = xp.expand_dims(cos.astype(x.dtype, copy=False), 2)
    sin = xp.expand_dims(sin.astype(x.dtype, copy=False), 2)
    head = x[..., :rotary_dim]
    if interleaved:
        x1, x2 = head[..., 0::2], head[..., 1::2]
    else:
        x1, x2 = head[..., : rotary_dim // 2], head[..., rotary_dim // 2:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rotated = xp.stack([real, imag], axis=-1).reshape(head.shape)
    else:
        rotated = xp.concatenate([real, imag], axis=-1)
    if rotary_dim == x.shape[-1]:
        return rotated
    return xp.concatenate([rotated, x[..., rotary_dim:]], axis=-1)


class _Rotary(Kernel):
    def setup(self) -> None:
        self.num_heads = int(self.attr("num_heads", 0))
        self.rotary_dim_attr = int(self.attr("rotary_embedding_dim", 0))
        self.interleaved = bool(self.attr("interleaved", 0))

    def as_bsnh(self, x, head_size: int | None):
        """The input as [B, S, N, H] (a view), and how to put the result back."""
        if x.ndim == 4:  # [B, N, S, H]
            return x.transpose(0, 2, 1, 3), lambda y: y.transpose(0, 2, 1, 3)
        if x.ndim != 3:
            raise self.fail("the input must be 3-D [B, S, hidden] or 4-D [B, N, S, H]",
                            field="input.shape", value=tuple(x.shape),
                            remedy="reshape the input to one of those layouts")
        if self.num_heads:
            heads = self.num_heads
        elif head_size:
            heads = x.shape[2] // head_size
        else:
            raise self.fail("a 3-D input needs num_heads", field="num_heads", value=0,
                            remedy="set the num_heads attribute")
        if heads <= 0 or x.shape[2] % heads:
            raise self.fail("hidden size is not a multiple of num_heads", field="num_heads",
                            value=heads, remedy=f"use a divisor of {x.shape[2]}")
        shape = tuple(x.shape)
        return (x.reshape(shape[0], shape[1], heads, shape[2] // heads),
                lambda y: y.reshape(shape))

    def rotary_dim(self, head_size: int, half: int) -> int:
        dim = self.rotary_dim_attr or head_size
        if dim > head_size or dim % 2 or dim // 2 != half:
            raise self.fail("rotary_embedding_dim does not match the caches", field=
                            "rotary_embedding_dim", value=(dim, head_size, half),
                            remedy="the caches' last axis must be rotary_embedding_dim / 2 "
                                   "(the head size when the attribute is 0)")
        return dim


class RotaryEmbedding(_Rotary):
    """ONNX RotaryEmbedding-23: caches [max_pos, R/2] indexed by position_ids [B, S], or
    caches already [B, S, R/2] when there are no position ids."""

    def __call__(self, be, x, cos_cache, sin_cache, position_ids=None):
        xp = be.xp
        xs, back = self.as_bsnh(x, None)
        if position_ids is not None:
            cos = xp.take(cos_cache, position_ids, axis=0)
            sin = xp.take(sin_cache, position_ids, axis=0)
        else:
            cos, sin = cos_cache, sin_cache
        dim = self.rotary_dim(xs.shape[3], cos.shape[-1])
        return (back(rotate(xp, xs, cos, sin, dim, self.interleaved)),)


class ContribRotaryEmbedding(_Rotary):
    """com.microsoft RotaryEmbedding: position_ids [B, S], or one start position (shape
    [1] or []) from which the S positions count; caches [max_pos, R/2]. With
    rotary_embedding_dim 0 the head size is twice the caches' width."""

    domain = "com.microsoft"
    op_type = "RotaryEmbedding"

    def __call__(self, be, x, position_ids, cos_cache, sin_cache):
        xp = be.xp
        half = cos_cache.shape[-1]
        head_size = None if self.rotary_dim_attr else 2 * half
        xs, back = self.as_bsnh(x, head_size)
        batch, seq = xs.shape[0], xs.shape[1]
        if position_ids.ndim == 2:
            pos = position_ids
        else:
            start = position_ids.reshape(-1)[:1].astype("int64")
            pos = xp.broadcast_to(start + xp.arange(seq, dtype="int64"), (batch, seq))
        cos = xp.take(cos_cache, pos, axis=0)
        sin = xp.take(sin_cache, pos, axis=0)
        dim = self.rotary_dim(xs.shape[3], half)
        return (back(rotate(xp, xs, cos, sin, dim, self.interleaved)),)
