"""Gather's launcher (``kernels/gather.cu``): the node's index rule and its take in one launch,
where the array path made four (a compare, an add and a select for the negative indices, then
``take``): a decode step gathers its embedding row and its rotary tables' rows, so nine of
its launches go."""
from __future__ import annotations

import math

from engines.native.dtype_names import dtype_name
from engines.native.kernel_source import instance, module
from engines.native.launch.family import LINEAR_BLOCK, KernelFamily, ceil_div, i64
from engines.native.launch.fused_dtypes import FUSED_DTYPES

GATHER_INDEX_DTYPES = ("int64", "int32")
GATHER_MAX_BLOCKS = 1024  # the grid-strided loop covers any size past this


class GatherKernels(KernelFamily):
    MODULE = module("gather.cu", [instance("gather_wrap", d, i) for d in FUSED_DTYPES
                                  for i in GATHER_INDEX_DTYPES])

    def gather(self, data, indices, axis: int, *, stream):
        """ONNX Gather of ``data`` along ``axis`` (already normalised) at ``indices``: out has
        shape data.shape[:axis] + indices.shape + data.shape[axis + 1:]. None where this
        kernel has no instance for the dtypes or the axis is empty (the array path serves
        those)."""
        self._check(data, "data")
        self._check(indices, "indices")
        kinds = (dtype_name(data.dtype), dtype_name(indices.dtype))
        extent = int(data.shape[axis])
        if kinds[0] not in FUSED_DTYPES or kinds[1] not in GATHER_INDEX_DTYPES or extent == 0:
            return None
        name = instance("gather_wrap", *kinds)
        data = self._contiguous(data, stream)
        indices = self._contiguous(indices, stream)
        shape = tuple(data.shape[:axis]) + tuple(indices.shape) + tuple(data.shape[axis + 1:])
        out = self._empty(shape, data.dtype, stream)
        total = out.size
        if total:
            outer = math.prod(data.shape[:axis])
            inner = math.prod(data.shape[axis + 1:])
            blocks = min(ceil_div(total, LINEAR_BLOCK), GATHER_MAX_BLOCKS)
            self._launch(name, blocks, LINEAR_BLOCK,
                         (data, indices, out, i64(outer), i64(extent), i64(indices.size),
                          i64(inner)), stream)
        return out
