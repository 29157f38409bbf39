"""A decode's kernel launches built from the forward's own launchers, without a graph: per
layer the q/k/v GEMV with its norm, the rotation, cache write and attention, the o
projection, the gate/up GEMV with its norm and SwiGLU, the down projection; then the head
with the final norm. Each launch reads what one before it wrote. For the launch-program
tests (on the CPU emulator and the GPU) and ``scripts/gpu_program_probe.py`` (SmolLM2's
shapes on the H200). ``put`` moves a host array to the device in use (the emulator's
``to_device``, CuPy's ``asarray``)."""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

EPS = 1e-5


@dataclass(frozen=True)
class ChainShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    slots: int  # the static cache's
    start: int  # the first row's position
    vocab: int
    layers: int


TINY = ChainShape(hidden=64, heads=2, kv_heads=1, head_dim=32, mlp=96, slots=16, start=5,
                  vocab=40, layers=2)
SMOLLM2 = ChainShape(hidden=576, heads=9, kv_heads=3, head_dim=64, mlp=1536, slots=256,
                     start=128, vocab=49152, layers=30)


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def rand(rng, shape, dtype: str, put, scale: float = 1.0):
    """Normal values times ``scale`` as ``dtype``, on the device ``put`` moves them to."""
    return put((scale * rng.standard_normal(shape)).astype(np_dtype(dtype)))


def weights(shape: ChainShape, dtype: str, put, seed: int = 0):
    """(per-layer weights and caches, the head's), random and small."""
    rng = np.random.default_rng(seed)
    kv = shape.kv_heads * shape.head_dim

    def gain():
        return put((1 + 0.1 * rng.standard_normal(shape.hidden)).astype(np_dtype(dtype)))

    per = [{"gain1": gain(),
            "qkv": [rand(rng, (n, shape.hidden), dtype, put, 0.1)
                    for n in (shape.heads * shape.head_dim, kv, kv)],
            "cache": [rand(rng, (1, shape.kv_heads, shape.slots, shape.head_dim), dtype, put)
                      for _ in range(2)],
            "o": rand(rng, (shape.hidden, shape.heads * shape.head_dim), dtype, put, 0.1),
            "gain2": gain(),
            "glu": [rand(rng, (shape.mlp, shape.hidden), dtype, put, 0.1) for _ in range(2)],
            "down": rand(rng, (shape.hidden, shape.mlp), dtype, put, 0.1)}
           for _ in range(shape.layers)]
    head = {"gain": gain(), "w": rand(rng, (shape.vocab, shape.hidden), dtype, put, 0.1)}
    return per, head


def inputs(shape: ChainShape, dtype: str, rows: int, put, seed: int = 0):
    """(residual, delta, rotation tables, positions) of ``rows`` decode or verify rows."""
    rng = np.random.default_rng(seed + 100)
    residual = rand(rng, (1, rows, shape.hidden), dtype, put)
    delta = rand(rng, (1, rows, shape.hidden), dtype, put)
    at = np.arange(shape.start, shape.start + rows)
    angles = at[:, None] * (0.05 * np.arange(shape.head_dim) + 0.1)
    cos = put(np.cos(angles).astype(np.float32)[None, None])
    sin = put(np.sin(angles).astype(np.float32)[None, None])
    return residual, delta, cos, sin, put(at.astype(np.int64)[None])


def _heads(x, heads: int, head_dim: int):
    """[1, M, heads * D] as attention reads it: [1, heads, M, D], a strided view."""
    return x.reshape(1, x.shape[1], heads, head_dim).transpose(0, 2, 1, 3)


def forward(fused, dense, shape: ChainShape, residual, delta, cos, sin, positions, per,
            head, stream=None) -> list:
    """Every launch of the chain, through ``fused`` (a ``FusedKernels``) and ``dense`` (a
    ``CudaKernels``) on ``stream``; returns every output, in launch order."""
    rows = residual.shape[1]
    width = shape.heads * shape.head_dim
    outs = []
    for layer in per:
        residual, q, k, v = fused.norm_gemv(residual, delta, layer["gain1"], EPS,
                                            residual.dtype, layer["qkv"], stream=stream)
        cache_k, cache_v, attended = fused.rotary_kv_attention(
            _heads(q, shape.heads, shape.head_dim), _heads(k, shape.kv_heads, shape.head_dim),
            cos, sin, "halves", np.dtype(np.float32), None, None, residual.dtype,
            *layer["cache"], _heads(v, shape.kv_heads, shape.head_dim), positions,
            shape.kv_heads, shape.heads // shape.kv_heads, shape.head_dim ** -0.5,
            np.dtype(np.float32), stream=stream)
        projected = dense.gemv_rows(attended.reshape(rows, width), layer["o"], stream=stream)
        residual, glu = fused.norm_glu(residual, projected.reshape(1, rows, shape.hidden),
                                       layer["gain2"], EPS, residual.dtype, layer["glu"],
                                       residual.dtype, residual.dtype, stream=stream)
        delta = dense.gemv_rows(glu.reshape(rows, shape.mlp), layer["down"],
                                stream=stream).reshape(1, rows, shape.hidden)
        outs += [residual, q, k, v, cache_k, cache_v, attended, projected, glu, delta]
    outs += list(fused.norm_gemv(residual, delta, head["gain"], EPS, residual.dtype,
                                 [head["w"]], stream=stream))
    return outs
