"""The CUDA kernels of the ``lockstep.fused`` nodes (``ops/fused.py``), one launch per node:
the norm, prologue-GEMV, SwiGLU, rotary, cache-write and attention families
(``engines/native/launch``), one object a device; and Gather's (an ONNX node every
forward runs three times: the embedding and the rotary tables).

Written against the executor's prelude (storage types with ``lk_load``/``lk_store``), so a
storage type added there is one more instance here. ``lk_round(T, v)`` rounds a float
through storage type T and back: the kernels round where the unfused graph stores a value
in a narrower dtype, so a float16 graph's chain of float16 ops keeps its roundings; only
reduction orders differ from the host.

Every kernel is batch-invariant (a row's arithmetic depends on its own operands only: one
warp per norm row, one block per (head, query) pair, fixed strides and fixed trees) and
capture-safe (shapes from metadata, positions read on the device, outputs and scratch from
the current allocator on the stream the node passes, no host synchronisation).
"""
from __future__ import annotations

from engines.native.launch.attention import AttentionKernels
from engines.native.launch.gather import GatherKernels
from engines.native.launch.kv_write import KvWriteKernels
from engines.native.launch.norm import NormKernels
from engines.native.launch.prologue_gemv import PrologueGemvKernels
from engines.native.launch.rotary import RotaryKernels
from engines.native.launch.swiglu import SwigluKernels
from engines.native.program_module import program_family


class FusedKernels(NormKernels, PrologueGemvKernels, SwigluKernels, RotaryKernels,
                   KvWriteKernels, AttentionKernels, GatherKernels):
    """The fused nodes' modules of one device, and their launchers."""


_COMPILED: dict[tuple[int, bool], FusedKernels] = {}


def get_fused_kernels(device_id: int = 0, programs: bool = False) -> FusedKernels:
    """The compiled fused kernels for ``device_id``, compiled once per process; with
    ``programs``, the family whose attention a launch program runs (128-thread blocks)."""
    key = (int(device_id), bool(programs))
    kernels = _COMPILED.get(key)
    if kernels is None:
        family = program_family(FusedKernels) if programs else FusedKernels
        kernels = _COMPILED[key] = family(device_id)
    return kernels
