"""Tensor ops on the host with numpy: the reference the CUDA ops are compared against.

Nothing crosses a residency here, so nothing is recorded in the ledger.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from engines.ledger import Ledger
from engines.residency import HOST
from engines.tensor_ops.base import TensorOps


def argmax_keys(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(keys, nan_mask): values in a type that orders them exactly (float64 holds every
    float32/float16/bfloat16 value; integers stay int64) and where NaN sits."""
    if x.dtype.kind in "iub":
        keys = x.astype(np.int64)
        return keys, np.zeros(keys.shape, dtype=bool)
    keys = x.astype(np.float64)
    return keys, np.isnan(keys)


class HostTensorOps(TensorOps):
    """numpy implementation of ``TensorOps``."""

    residency = HOST
    supports_device_feed = True

    def __init__(self, ledger: Ledger):
        super().__init__(ledger)

    def _adopt(self, host_array: np.ndarray) -> np.ndarray:
        return host_array

    def _zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def _copy(self, view: np.ndarray) -> np.ndarray:
        return view.copy(order="C")

    def _prepare_ids(self, ids: Any, rows: int) -> np.ndarray:
        return self.check_host_ids(ids, rows)

    def _gather(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return np.take(table, ids, axis=0)

    def _scatter(self, dst: np.ndarray, offset: int, src: np.ndarray) -> None:
        dst[..., offset:offset + src.shape[-1]] = src

    def _argmax(self, logits2d: np.ndarray, rows: int) -> list[int]:
        keys, nan = argmax_keys(logits2d[:rows])
        if keys.dtype.kind == "f":
            keys = np.where(nan, -np.inf, keys)
        best = keys.max(axis=1, keepdims=True)
        hit = (keys == best) & ~nan  # the row maximum among non-NaN values
        first = hit.argmax(axis=1)  # lowest index of the maximum
        return [int(i) if hit[r, i] else -1 for r, i in enumerate(first)]

    def _copy_into(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src, casting="no")

    def _accept(self, logits2d: np.ndarray, drafts: np.ndarray, fed=None,
                head=None) -> tuple[int, int]:
        if head is not None:
            logits2d = np.concatenate([head, logits2d[:drafts.size]])
        best = self._argmax(logits2d, drafts.size + 1)
        n = 0
        while n < drafts.size and best[n] == int(drafts[n]):
            n += 1
        return n, best[n]

    def _argmax_feed(self, logits2d: np.ndarray) -> tuple[int, np.ndarray]:
        token = self._argmax(logits2d, 1)[0]
        return token, np.full((1, 1), token, dtype=np.int64)

    def _advance_positions(self, positions: np.ndarray, step: int) -> np.ndarray:
        return positions[:, -1:] + np.int64(step)

    def _stage(self, v: np.ndarray, site: str) -> np.ndarray:
        return np.array(v, copy=True)  # nothing crosses on the host: nothing to record
