"""The tensor ops interface and the rules every backend shares, implemented once here.

A backend (``HostTensorOps``, ``CudaTensorOps``) only supplies the few primitives that
touch memory (``_adopt``, ``_zeros``, ``_copy``, ``_gather``, ``_scatter``, ``_argmax``,
``_prepare_ids``). Validation, the view-or-copy rule, the empty-result rule, the residency
rule and the all-NaN rule live here so both backends cannot drift apart, which is what
claim 8 (tensor ops agree) checks.

Rules:
- an empty result is a host-empty numpy array, whatever the backend; a host-empty array is
  therefore accepted by every backend as input;
- any other value must live where the ops live (``residency``), else ``ResidencyError``
  naming both remedies (adopt the host value first, or read the device value back through
  a sanctioned readback and use the host ops);
- ``slice_axis`` is the only narrowing: a zero-copy view when every extent before ``axis``
  is 1, else a C-contiguous copy (on CUDA a device-to-device copy on the engine's stream);
- ids out of range are ``InputError``, never clamped.
"""
from __future__ import annotations

import abc
import math
import operator
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from engines.errors import InputError, NonFiniteLogits, ResidencyError
from engines.ledger import Ledger
from engines.residency import HOST, residency_of
from engines.tensor_ops.pending import PendingToken, ReadyToken

SUPPORTED_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16"})


def dtype_name(dtype: Any) -> str:
    """Canonical name of a supported dtype; anything else is an ``InputError``."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    if name not in SUPPORTED_DTYPES:
        raise InputError("unsupported dtype", field="dtype", value=name,
                         remedy=f"use one of {', '.join(SUPPORTED_DTYPES)}")
    return name


def _int_arg(value: Any, field: str) -> int:
    """A Python or numpy integer (not bool) as int, else an InputError naming ``field``."""
    if isinstance(value, (bool, np.bool_)):
        raise InputError("must be an integer, not a bool", field=field, value=value)
    try:
        return operator.index(value)
    except TypeError:
        raise InputError("must be an integer", field=field, value=value,
                         remedy="pass a Python int") from None


def _ndarray_like(value: Any, field: str) -> None:
    if not (hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "ndim")):
        raise InputError(f"must be an array, got {type(value).__name__}", field=field,
                         remedy="pass a numpy array (host) or a CuPy array (device)")


def _ids_out_of_range(value: int, position: int, rows: int, count: int) -> InputError:
    return InputError(f"id {value} at position {position} is out of range for a table of "
                      f"{rows} rows ({count} id(s) out of range)", field="ids", value=value,
                      remedy=f"use ids in [0, {rows}); ids are never clamped")


def host_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """The canonical empty result: a host numpy array with a zero extent."""
    return np.empty(tuple(shape), dtype=np.dtype(dtype))


class TensorOps(abc.ABC):
    """The resident tensor ops a workflow uses to move and narrow values (see module doc)."""

    residency: str  # "host" or "cuda:N"
    # whether next_token_feed / advance_positions are implemented (the greedy loop then
    # feeds the next step from where the ops live, with no host input but the decision)
    supports_device_feed: bool = False
    # whether next_token_async returns before the id is read back (a device's copy in
    # flight): only then does queuing work ahead of the read pay (shifted speculative rounds)
    asynchronous_ids: bool = False

    def __init__(self, ledger: Ledger):
        if not isinstance(ledger, Ledger):
            raise InputError("tensor ops need the session's Ledger", field="ledger",
                             value=type(ledger).__name__)
        self.ledger = ledger

    # -- residency ---------------------------------------------------------------------------
    def residency_error(self, field: str, where: str) -> ResidencyError:
        return ResidencyError(
            f"{field} lives on {where} but these tensor ops work on {self.residency}",
            field=field, value=where,
            remedy=("adopt the host value first (tensor_ops.adopt) so it lives on the device, "
                    "or read the device value back through a sanctioned readback and use "
                    "the host tensor ops (HostTensorOps)"))

    def check_resident(self, value: Any, field: str) -> str:
        """Residency of ``value``; it must be ``self.residency`` or a host-empty array."""
        _ndarray_like(value, field)
        try:
            where = residency_of(value)
        except TypeError:
            raise InputError(f"cannot tell where a {type(value).__name__} lives", field=field,
                             remedy="pass a numpy or CuPy array") from None
        if where == self.residency or (where == HOST and value.size == 0):
            return where
        raise self.residency_error(field, where)

    # -- the interface -----------------------------------------------------------------------
    def adopt(self, host_array: Any):
        """Host to where the ops live; counted ``ledger.record_adopt`` when it crosses."""
        self._check_adoptable(host_array)
        if host_array.size == 0:
            return host_array
        return self._adopt(host_array)

    def adopt_feeds(self, arrays: Sequence[Any], key: str) -> tuple:
        """``adopt`` of a forward's small feeds (its token ids and positions), each counted
        as ``adopt`` counts it. A device may stage them together into buffers it keeps for
        ``key`` and their shape, one copy a call, so a decode or verification step's feeds
        keep their addresses (a graph slot then reuses its feed copy) and allocate nothing.
        A kept buffer is overwritten by the next call with the same key and shape, in the
        engine's stream order: a caller uses it for one forward (and what that forward's
        result is compared with) before the next forward of that key and width."""
        for array in arrays:
            self._check_adoptable(array)
        return self._adopt_feeds(tuple(arrays), key)

    def _adopt_feeds(self, arrays: tuple[np.ndarray, ...], key: str) -> tuple:
        return tuple(a if a.size == 0 else self._adopt(a) for a in arrays)

    def _check_adoptable(self, host_array: Any) -> None:
        _ndarray_like(host_array, "host_array")
        try:
            where = residency_of(host_array)
        except TypeError:
            where = type(host_array).__name__
        if where != HOST or not isinstance(host_array, np.ndarray):
            raise ResidencyError(
                f"adopt takes a host numpy array; this value lives on {where}",
                field="host_array", value=where,
                remedy=("pass the host value (adopt is the only host-to-device crossing), "
                        "or read the device value back through a sanctioned readback first "
                        "and use the host tensor ops"))
        dtype_name(host_array.dtype)

    def zeros(self, shape: Any, dtype: Any):
        """Zeros of ``shape`` and ``dtype`` where the ops live (host-empty if any extent is 0)."""
        name = dtype_name(dtype)
        try:
            dims = tuple(_int_arg(d, "shape") for d in shape)
        except TypeError:
            raise InputError("must be a sequence of integers", field="shape", value=shape) from None
        if any(d < 0 for d in dims):
            raise InputError("extents must be >= 0", field="shape", value=dims)
        if math.prod(dims) == 0:
            return np.zeros(dims, SUPPORTED_DTYPES[name])
        return self._zeros(dims, SUPPORTED_DTYPES[name])

    def normalize_axis(self, v: Any, axis: Any) -> int:
        a = _int_arg(axis, "axis")
        if not -v.ndim <= a < v.ndim or v.ndim == 0:
            raise InputError(f"out of range for a rank-{v.ndim} value", field="axis", value=a,
                             remedy=f"use an axis in [-{v.ndim}, {v.ndim})")
        return a % v.ndim

    def slice_axis(self, v: Any, axis: Any, start: Any, length: Any):
        """``v[..., start:start+length, ...]`` along ``axis``: a view when every extent before
        ``axis`` is 1 (``v`` itself for the whole axis), else a C-contiguous copy; an empty
        window is host-empty."""
        self.check_resident(v, "v")
        ax = self.normalize_axis(v, axis)
        s = _int_arg(start, "start")
        n = _int_arg(length, "length")
        extent = v.shape[ax]
        if s < 0:
            raise InputError("window start must be >= 0", field="start", value=s,
                             remedy=f"use a start in [0, {extent}]")
        if n < 0:
            raise InputError("window length must be >= 0", field="length", value=n)
        if s + n > extent:
            raise InputError(f"window [{s}, {s + n}) runs past extent {extent} of axis {ax}",
                             field="length", value=n,
                             remedy=f"use start + length <= {extent}")
        out_shape = v.shape[:ax] + (n,) + v.shape[ax + 1:]
        if math.prod(out_shape) == 0:
            return host_empty(out_shape, v.dtype)
        leading_one = math.prod(v.shape[:ax]) == 1
        if leading_one and s == 0 and n == extent:
            return v  # the whole axis (a decode step's last position): v itself
        view = v[(slice(None),) * ax + (slice(s, s + n),)]
        return view if leading_one else self._copy(view)

    def last_along_axis(self, v: Any, axis: Any):
        """``slice_axis(v, axis, n - 1, 1)``; an axis of extent 0 has no last element."""
        self.check_resident(v, "v")
        ax = self.normalize_axis(v, axis)
        extent = v.shape[ax]
        if extent == 0:
            raise InputError(f"axis {ax} has extent 0, so there is no last element",
                             field="axis", value=ax)
        return self.slice_axis(v, ax, extent - 1, 1)

    def truncate_axis(self, v: Any, axis: Any, length: Any):
        """``slice_axis(v, axis, 0, length)``."""
        return self.slice_axis(v, axis, 0, length)

    def gather_rows(self, table: Any, ids: Any):
        """``table[ids]`` along axis 0. Host ids (list, tuple, numpy) are checked against the
        row count; an id out of range is an ``InputError``, never clamped. Device ids are
        accepted only by device ops and are the caller's contract (see the backend)."""
        self.check_resident(table, "table")
        if table.ndim < 1:
            raise InputError("gather_rows needs a table of rank >= 1", field="table",
                             value=tuple(table.shape))
        rows = table.shape[0]
        if hasattr(ids, "shape") and not isinstance(ids, np.ndarray):
            self.check_resident(ids, "ids")
        prepared = self._prepare_ids(ids, rows)
        out_shape = (int(prepared.shape[0]),) + tuple(table.shape[1:])
        if math.prod(out_shape) == 0:
            return host_empty(out_shape, table.dtype)
        return self._gather(table, prepared)

    def check_host_ids(self, ids: Any, rows: int) -> np.ndarray:
        """Host ids as a 1-D int64 array, every id in [0, rows), else ``InputError``."""
        if isinstance(ids, np.ndarray):
            arr = ids
        elif isinstance(ids, (list, tuple)):
            values = [_int_arg(i, "ids") for i in ids]
            bad = [i for i in values if not 0 <= i < rows]
            if bad:  # checked before numpy could wrap an id too large for int64
                raise _ids_out_of_range(bad[0], values.index(bad[0]), rows, len(bad))
            arr = np.asarray(values, dtype=np.int64).reshape(len(values))
        else:
            raise InputError(f"ids must be a list or array of integers, got {type(ids).__name__}",
                             field="ids", remedy="pass a list of ints or a 1-D integer array")
        if arr.ndim != 1:
            raise InputError("ids must be 1-D", field="ids", value=tuple(arr.shape))
        if arr.size and arr.dtype.kind not in "iu":
            raise InputError("ids must have an integer dtype", field="ids", value=arr.dtype.name)
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= rows:
            big = np.flatnonzero(arr >= rows)  # before int64 could wrap a uint64
            raise _ids_out_of_range(int(arr[big[0]]), int(big[0]), rows, big.size)
        arr = arr.astype(np.int64, copy=False)
        bad = np.flatnonzero((arr < 0) | (arr >= rows))
        if bad.size:
            raise _ids_out_of_range(int(arr[bad[0]]), int(bad[0]), rows, bad.size)
        return arr

    def scatter_into_last_axis(self, dst: Any, offset: Any, src: Any):
        """``dst[..., offset:offset+w] = src`` in place (w = src's last extent); returns dst."""
        self.check_resident(dst, "dst")
        self.check_resident(src, "src")
        if dst.ndim < 1:
            raise InputError("dst must have rank >= 1", field="dst", value=tuple(dst.shape))
        off = _int_arg(offset, "offset")
        if src.dtype != dst.dtype:
            raise InputError(f"src dtype {src.dtype.name} differs from dst dtype {dst.dtype.name}",
                             field="src.dtype", value=src.dtype.name,
                             remedy="cast src to dst's dtype first; scatter never converts")
        if src.ndim != dst.ndim or tuple(src.shape[:-1]) != tuple(dst.shape[:-1]):
            raise InputError(f"src rows {tuple(src.shape[:-1])} differ from dst rows "
                             f"{tuple(dst.shape[:-1])}", field="src.shape",
                             value=tuple(src.shape),
                             remedy="src must match dst in every axis but the last")
        width = src.shape[-1]
        if off < 0 or off + width > dst.shape[-1]:
            raise InputError(f"offset {off} + width {width} does not fit dst width "
                             f"{dst.shape[-1]}", field="offset", value=off,
                             remedy=f"use 0 <= offset <= {dst.shape[-1] - width}")
        if src.size == 0:
            return dst
        self._scatter(dst, off, src)
        return dst

    def argmax_rows(self, logits2d: Any, rows: Any) -> list[int]:
        """Per row of the first ``rows`` rows: the index of the largest value, ties to the
        lowest index, NaN ignored; an all-NaN row is an ``InputError``."""
        self.check_resident(logits2d, "logits2d")
        if logits2d.ndim != 2:
            raise InputError("argmax_rows needs a 2-D [rows, vocab] value", field="logits2d",
                             value=tuple(logits2d.shape))
        dtype_name(logits2d.dtype)
        r = _int_arg(rows, "rows")
        if not 0 <= r <= logits2d.shape[0]:
            raise InputError(f"rows must be in [0, {logits2d.shape[0]}]", field="rows", value=r)
        if r == 0:
            return []
        if logits2d.shape[1] == 0:
            raise InputError("rows of width 0 have no argmax", field="logits2d",
                             value=tuple(logits2d.shape))
        ids = self._argmax(logits2d, r)
        for i, t in enumerate(ids):
            if t < 0:
                raise NonFiniteLogits(f"row {i} is all NaN, so it has no argmax",
                                      field="logits2d", value=f"row {i}",
                                      remedy="the logits are corrupt upstream")
        return ids

    def copy_into(self, dst: Any, src: Any):
        """``dst[...] = src`` in place (same shape and dtype, no conversion); returns dst.

        The snapshot primitive: on CUDA a device-to-device copy on the engine's stream."""
        self.check_resident(dst, "dst")
        self.check_resident(src, "src")
        if src.dtype != dst.dtype:
            raise InputError(f"src dtype {src.dtype.name} differs from dst dtype {dst.dtype.name}",
                             field="src.dtype", value=src.dtype.name,
                             remedy="copy between buffers of one dtype; copy_into never converts")
        if tuple(src.shape) != tuple(dst.shape):
            raise InputError(f"src shape {tuple(src.shape)} differs from dst shape "
                             f"{tuple(dst.shape)}", field="src.shape", value=tuple(src.shape),
                             remedy="copy between buffers of one shape (preallocate dst like src)")
        if dst.size:
            self._copy_into(dst, src)
        return dst

    def accept_drafts(self, logits2d: Any, drafts: Any, fed: Any = None,
                      head: Any = None) -> tuple[int, int]:
        """Verification on the residency of the logits: ``(accepted, bonus)``.

        ``logits2d`` holds the target's rows for the W+1 verified positions (at least
        ``len(drafts) + 1`` rows); row i's argmax (ties to the lowest index, NaN ignored) is
        compared with ``drafts[i]``; ``accepted`` is the length of the agreeing prefix and
        ``bonus`` the argmax of row ``accepted``. The only values that come back are those
        two int32s: 4 bytes ``accept_count`` and 4 bytes ``token_id`` on a device.

        ``fed``: the verification's own int64 tokens feed where the ops live (the pending
        token, then ``drafts``), so a device reads the drafts there instead of adopting
        them again; the caller vouches that it holds them.

        ``head`` (a shifted round): a ``[1, vocab]`` row of the same dtype, from the forward
        that fed the pending token, that goes before ``logits2d``'s rows; ``logits2d`` then
        needs ``len(drafts)`` rows and ``fed`` holds the drafts alone."""
        self.check_resident(logits2d, "logits2d")
        if logits2d.ndim != 2:
            raise InputError("accept_drafts needs a 2-D [rows, vocab] value", field="logits2d",
                             value=tuple(logits2d.shape))
        dtype_name(logits2d.dtype)
        rows, vocab = int(logits2d.shape[0]), int(logits2d.shape[1])
        if vocab == 0:
            raise InputError("rows of width 0 have no argmax", field="logits2d",
                             value=tuple(logits2d.shape))
        ids = self.check_host_ids(drafts if isinstance(drafts, np.ndarray) else list(drafts),
                                  vocab)
        if head is not None:
            self.check_resident(head, "head")
            if tuple(head.shape) != (1, vocab) or head.dtype != logits2d.dtype:
                raise InputError(f"head is {head.dtype.name} {tuple(head.shape)}; the rows are "
                                 f"{logits2d.dtype.name} with {vocab} columns", field="head",
                                 value=tuple(head.shape),
                                 remedy="pass the feeding forward's last row as [1, vocab], "
                                        "of the verification's dtype")
        own = 0 if head is not None else 1  # the rows logits2d holds beyond one per draft
        if ids.size + own > rows:
            raise InputError(f"{ids.size} drafts need {ids.size + own} verified rows, the logits "
                             f"hold {rows}", field="drafts", value=int(ids.size),
                             remedy="verify W drafts with a forward over W+1 positions (W "
                                    "with a head row)")
        if fed is not None:
            self.check_resident(fed, "fed")
            if fed.dtype != np.int64 or int(fed.size) != ids.size + own:
                what = "the drafts" if head is not None else "the pending token, then the drafts"
                raise InputError(f"the tokens feed holds {int(fed.size)} {fed.dtype.name} "
                                 f"values; {ids.size} drafts need {ids.size + own} int64",
                                 field="fed", value=tuple(fed.shape),
                                 remedy=f"pass the verification's tokens feed: {what}")
        accepted, bonus = self._accept(logits2d, ids, fed, head)
        if bonus < 0:
            raise NonFiniteLogits(f"row {accepted} is all NaN, so it has no argmax",
                             field="logits2d", value=f"row {accepted}",
                             remedy="the logits are corrupt upstream")
        return accepted, bonus

    def next_token_feed(self, logits2d: Any) -> tuple[int, Any]:
        """Greedy choice for a ``[1, vocab]`` row: ``(id, feed)``, the id read back (4 bytes
        ``token_id`` on a device, the only crossing) and the same id as an int64 ``[1, 1]``
        value where the ops live, ready to be the next forward's ``tokens`` feed. Ties to
        the lowest index, NaN ignored; an all-NaN row is an ``InputError``."""
        self._check_one_row(logits2d, "next_token_feed")
        token, feed = self._argmax_feed(logits2d)
        return ReadyToken(token).result(), feed  # result() refuses an all-NaN row (-1)

    def next_token_async(self, logits2d: Any) -> tuple[PendingToken, Any]:
        """``next_token_feed`` without waiting for the id: ``(pending, feed)``, the feed as
        there, the 4-byte readback (counted now, as ``token_id``) queued behind the argmax;
        ``pending.result()`` waits for it and refuses an all-NaN row. The pipelined greedy
        loop queues the next forward on ``feed`` before it asks. Ops without an asynchronous
        copy read the id at once."""
        self._check_one_row(logits2d, "next_token_async")
        return self._argmax_feed_async(logits2d)

    def _check_one_row(self, logits2d: Any, what: str) -> None:
        self.check_resident(logits2d, "logits2d")
        if logits2d.ndim != 2 or logits2d.shape[0] != 1:
            raise InputError(f"{what} needs one [1, vocab] row", field="logits2d",
                             value=tuple(logits2d.shape),
                             remedy="pass the last position's logits reshaped to [1, vocab]")
        dtype_name(logits2d.dtype)
        if logits2d.shape[1] == 0:
            raise InputError("rows of width 0 have no argmax", field="logits2d",
                             value=tuple(logits2d.shape))

    def advance_positions(self, positions: Any, step: Any = 1):
        """``positions[0, -1] + step`` (``positions``: int64 ``[1, M]``, M >= 1) as an int64
        ``[1, 1]`` value where the ops live, computed there: the next forward's positions."""
        self.check_resident(positions, "positions")
        if positions.ndim != 2 or positions.shape[0] != 1 or positions.shape[1] < 1:
            raise InputError("positions must be [1, M] with M >= 1", field="positions",
                             value=tuple(positions.shape))
        if positions.dtype != np.int64:
            raise InputError("positions must be int64", field="positions.dtype",
                             value=positions.dtype.name, remedy="feed int64 positions")
        return self._advance_positions(positions, _int_arg(step, "step"))

    def audit_row(self, logits2d: Any) -> np.ndarray:
        """A ``[1, vocab]`` logits row as a host float64 vector (``audit_rows`` of one row)."""
        self.check_resident(logits2d, "logits2d")
        if logits2d.ndim != 2 or logits2d.shape[0] != 1:
            raise InputError("audit_row needs one [1, vocab] row", field="logits2d",
                             value=tuple(logits2d.shape),
                             remedy="pass the last position's logits reshaped to [1, vocab]")
        return self.audit_rows(logits2d)[0]

    def audit_rows(self, logits2d: Any) -> np.ndarray:
        """``[k, vocab]`` logits rows (k >= 1: a decode step's one, a verification's W+1) as
        host float64, for the logits audit (claim 1b). On a device this is a readback under
        the purpose ``logits_audit``, made only in a labelled audit decode, never in a
        budgeted one."""
        self.check_resident(logits2d, "logits2d")
        if logits2d.ndim != 2 or logits2d.shape[0] < 1:
            raise InputError("audit_rows needs [k, vocab] rows, k >= 1", field="logits2d",
                             value=tuple(logits2d.shape),
                             remedy="pass the logits reshaped to [positions, vocab]")
        dtype_name(logits2d.dtype)
        return np.asarray(self._audit_rows(logits2d), dtype=np.float64).reshape(
            tuple(logits2d.shape))

    def _audit_rows(self, logits2d: Any) -> np.ndarray:
        return np.array(logits2d, dtype=np.float64)  # host: nothing crosses

    def _argmax_feed(self, logits2d: Any) -> tuple[int, Any]:
        """(id or -1 for an all-NaN row, the id as int64 [1, 1] where the ops live)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no device feed "
                                  "(supports_device_feed is False)")

    def _argmax_feed_async(self, logits2d: Any) -> tuple[PendingToken, Any]:
        """(the id, already read: ``ReadyToken``; the feed): a backend with an asynchronous
        copy overrides it."""
        token, feed = self._argmax_feed(logits2d)
        return ReadyToken(token), feed

    def _advance_positions(self, positions: Any, step: int):
        raise NotImplementedError(f"{type(self).__name__} keeps no device feed "
                                  "(supports_device_feed is False)")

    def stage_to_host(self, v: Any, site: str) -> np.ndarray:
        """A host copy of ``v``: host staging, outside every budget but the measured one.

        Only the host-snapshot comparison uses it; on a device it is counted
        ``ledger.record_staging(nbytes, site)`` (on the host nothing crosses)."""
        self.check_resident(v, "v")
        return self._stage(v, site)

    # -- backend primitives ------------------------------------------------------------------
    @abc.abstractmethod
    def _copy_into(self, dst: Any, src: Any) -> None: ...

    @abc.abstractmethod
    def _accept(self, logits2d: Any, drafts: np.ndarray, fed: Any = None,
                head: Any = None) -> tuple[int, int]:
        """(accepted, bonus); bonus -1 when row ``accepted`` is all NaN. ``fed``: checked,
        may be None (read the drafts from it or ignore it); ``head``: checked, the row
        before ``logits2d``'s, or None."""

    @abc.abstractmethod
    def _stage(self, v: Any, site: str) -> np.ndarray: ...

    @abc.abstractmethod
    def _adopt(self, host_array: np.ndarray): ...

    @abc.abstractmethod
    def _zeros(self, shape: tuple[int, ...], dtype: np.dtype): ...

    @abc.abstractmethod
    def _copy(self, view: Any): ...

    @abc.abstractmethod
    def _prepare_ids(self, ids: Any, rows: int): ...

    @abc.abstractmethod
    def _gather(self, table: Any, ids: Any): ...

    @abc.abstractmethod
    def _scatter(self, dst: Any, offset: int, src: Any) -> None: ...

    @abc.abstractmethod
    def _argmax(self, logits2d: Any, rows: int) -> list[int]:
        """Row argmaxes as ints, -1 for an all-NaN row (the base raises for it)."""
