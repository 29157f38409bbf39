"""The static-cache writes' launchers (``kernels/kv_write.cu``): a copy of the cache with the
forward's rows at their positions, one thread an element, or a 16-byte run where every
operand allows it (``runs_fit``); two caches (a layer's keys and values) in one launch."""
from __future__ import annotations

from engines.errors import ExecutionError
from engines.native.kernel_source import instance, module
from engines.native.launch.family import LINEAR_BLOCK, KernelFamily, ceil_div, i64
from engines.native.launch.fused_dtypes import FUSED_DTYPES, fused_dtype


def runs_fit(x, per: int) -> bool:
    """Whether a cache or its new rows [B, H, *, D] can move in runs of ``per`` elements
    (16 bytes): D a whole number of runs, contiguous along D, every row start aligned."""
    strides = [st // x.itemsize for st in x.strides]
    return (x.shape[3] % per == 0 and (x.shape[3] == 1 or strides[3] == 1)
            and all(st % per == 0 for st in strides[:3]) and x.data.ptr % 16 == 0)


class KvWriteKernels(KernelFamily):
    MODULE = module("kv_write.cu", [instance(k, d) for d in FUSED_DTYPES
                                    for k in ("kv_write2v", "kv_write", "kv_write2")])

    def kv_write(self, old, new, positions, *, stream):
        """A copy of the cache old [B, H, C, D] with slot positions[m] = new[:, :, m]."""
        old, out, (total, h, d, *strides) = self._kv_operands(old, new, stream)
        m = new.shape[2]
        pos = self._positions(positions, m, stream)
        if out.size:
            self._launch(instance("kv_write", fused_dtype(old.dtype, "old")),
                         ceil_div(out.size, LINEAR_BLOCK), LINEAR_BLOCK,
                         (old, new, pos, out, total, h, i64(old.shape[2]), d, i64(m), *strides),
                         stream)
        return out

    def _kv_operands(self, old, new, stream):
        """The checked operands of one cache write: old (C-contiguous), a fresh output, and
        the launch's (total, H, D, new's four element strides)."""
        self._check(old, "old")
        self._check(new, "new")
        b, h, c, d = old.shape
        if new.ndim != 4 or (new.shape[0], new.shape[1], new.shape[3]) != (b, h, d) \
                or new.dtype != old.dtype:
            raise ExecutionError("new rows do not fit the cache", field="new",
                                 value=(tuple(new.shape), new.dtype.name),
                                 remedy=f"[{b}, {h}, M, {d}] rows in {old.dtype.name}")
        old = self._contiguous(old, stream)
        out = self._empty(old.shape, old.dtype, stream)
        strides = [s // new.itemsize for s in new.strides]
        return old, out, (i64(out.size), i64(h), i64(d), *map(i64, strides))

    def kv_write2(self, old_a, new_a, old_b, new_b, positions, *, stream):
        """Two ``kv_write``s at the same positions in one launch (same dtype, slots and
        rows; otherwise two launches)."""
        if old_a.dtype != old_b.dtype or old_a.ndim != 4 or old_b.ndim != 4 \
                or old_a.shape[2] != old_b.shape[2] or new_a.shape[2:3] != new_b.shape[2:3]:
            return (self.kv_write(old_a, new_a, positions, stream=stream),
                    self.kv_write(old_b, new_b, positions, stream=stream))
        old_a, out_a, args_a = self._kv_operands(old_a, new_a, stream)
        old_b, out_b, args_b = self._kv_operands(old_b, new_b, stream)
        m = new_a.shape[2]
        pos = self._positions(positions, m, stream)
        total = out_a.size + out_b.size
        per = 16 // old_a.itemsize
        if total and all(runs_fit(x, per) for x in (old_a, new_a, old_b, new_b)):
            # 16-byte runs: caches and rows aligned, D whole runs, rows contiguous along D
            runs_a, runs_b = out_a.size // per, out_b.size // per
            self._launch(instance("kv_write2v", fused_dtype(old_a.dtype, "old")),
                         ceil_div(runs_a + runs_b, LINEAR_BLOCK), LINEAR_BLOCK,
                         (old_a, new_a, out_a, i64(runs_a), *args_a[1:6], old_b, new_b,
                          out_b, i64(runs_b), *args_b[1:6], pos, i64(old_a.shape[2]),
                          i64(m)), stream)
            return out_a, out_b
        name = instance("kv_write2", fused_dtype(old_a.dtype, "old"))
        if total:
            self._launch(name, ceil_div(total, LINEAR_BLOCK), LINEAR_BLOCK,
                         (old_a, new_a, out_a, *args_a, old_b, new_b, out_b, *args_b, pos,
                          i64(old_a.shape[2]), i64(m)), stream)
        return out_a, out_b
