"""Launch memos for an eager forward's hot plan steps (issue 12: a prefill is host-bound).

An eager step on the device spends most of its host time in Python that decides, from the
operands' metadata alone, which kernels to launch with which arguments: checks, dtype names,
grid arithmetic, argument lists. A ``StepMemo`` records what one call did, keyed by that
metadata, and replays it for the next call with the same key: the same allocations (shape
and dtype), the same launches (kernel, grid, block, shared memory, stream, scalar
arguments), each device pointer re-based on this call's operands and allocations.

What makes a replay the call's exact work (else the step is never memoised for that key):
- Every device action of the recorded call went through ``KernelLauncher.launch`` (a
  compiled kernel, arguments it packs itself) or an allocation of the kernel families' own
  (``KernelFamily._empty``, ``engines/native/launch/family.py``). An allocation from
  anything else (a CuPy operation: a contiguous copy, a cast, a fallback path) refuses the
  memo; so does a launch CuPy makes for us (a spy, an argument the launcher does not
  pack).
- The key holds every operand's shape, strides, dtype, 256-byte alignment and device, and
  the identity of constant operands (weights: what a kernel family caches by identity).
  Nothing a step decides may depend on the operands' values: the device steps never read
  a value back (they are captured into CUDA graphs as they are).
- Every launch argument and every output is a view of one operand or one allocation (by
  its data pointer), or a pointer fixed for the memo's life (a cached weight it keeps
  alive); an argument inside two operands, or an output that is not a device array,
  refuses the memo.

A key includes M. Recording costs more than a plain call (the H200's host: about 45 us a
step), so a signature is recorded the second time it is seen and replayed from the third:
a prefill at a length never seen before pays the plain call's cost, a length seen twice
replays. ``LOCKSTEP_STEP_MEMO=off`` turns memos off (the A/B of a same-machine compare).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from engines.native.env_switch import switch
from engines.native.kernel_launch import RECORDING, family_allocation

ENV = "LOCKSTEP_STEP_MEMO"

# The op types whose device path is launches of the two kernel families and nothing else
# (where an operand takes another path, the allocation check refuses that key).
MEMO_OPS = frozenset({"NormMatMul", "NormGLU", "SwiGLUMatMul", "RotaryKVAttention",
                      "MatMul", "MatMulN", "AddRMSNorm", "RMSNorm", "SwiGLU", "RotaryKVWrite",
                      "Attention", "Rotary", "Rotary2"})
# signatures a step remembers, the latest used kept (prefill lengths, M = 1, verify and
# re-advance widths). Eight thrashed a bench of two prompt sets: ten prompt lengths, the
# verification and its re-advances cycled more signatures than a step kept, so every prefill
# ran plain or recorded and none replayed (grounded prefill 41 ms beside another set, 21 ms
# alone; 61 ms in the speculative row, whose re-advances add widths). A recipe holds host
# tuples and the constants its launches point at (weights, alive anyway): 64 cost little.
KEYS_PER_STEP = 64
_REFUSED = object()
_SEEN = object()  # seen once: the next call with this signature records
_INPUT, _ALLOC, _FIXED = 0, 1, 2


def memo_enabled() -> bool:
    return switch(ENV)


class Recorder:
    """What one call did on the device: its own allocations and its launches."""

    __slots__ = ("allocations", "launches", "refused")

    def __init__(self):
        self.allocations: list[tuple[Any, Any]] = []  # (array, stream)
        self.launches: list[tuple] = []
        self.refused = False

    def allocation(self, array, stream) -> None:
        self.allocations.append((array, stream))

    def launch(self, launcher, pointer, grid, block, shared_mem, stream, fmt, values,
               args) -> None:
        self.launches.append((launcher, pointer, grid, block, shared_mem, stream, fmt,
                              values, args))

    def refuse(self) -> None:
        self.refused = True


class _Recipe:
    __slots__ = ("device", "stream", "allocs", "launches", "outputs", "keep")

    def __init__(self, device, stream, allocs, launches, outputs, keep):
        self.device = device
        self.stream = stream
        self.allocs = allocs        # [(shape, dtype)]
        self.launches = launches    # [(launcher, pointer, grid, block, smem, stream, fmt,
        #                               values, [(slot, kind, index, offset)])]
        self.outputs = outputs      # [None | (kind, index, offset, shape, strides, dtype)]
        self.keep = keep            # fixed arrays whose pointers the launches hold

    def replay(self, cupy, arrays: list) -> list:
        with self.device, self.stream:  # the recorded call's own allocations
            allocs = family_allocation(
                lambda: [cupy.empty(shape, dtype=dtype) for shape, dtype in self.allocs])
        for launcher, pointer, grid, block, smem, stream, fmt, values, slots in self.launches:
            values = list(values)
            for slot, kind, index, offset in slots:
                values[slot] = (allocs[index] if kind == _ALLOC else arrays[index]).data.ptr \
                    + offset
            launcher.launch_packed(pointer, grid, block, fmt, values, stream, smem)
        out = []
        for spec in self.outputs:
            if spec is None:
                out.append(None)
                continue
            kind, index, offset, shape, strides, dtype = spec
            base = allocs[index] if kind == _ALLOC else arrays[index]
            if offset == 0 and base.shape == shape and base.strides == strides \
                    and base.dtype == dtype:
                out.append(base)
            else:
                out.append(cupy.ndarray(shape, dtype, base.data + offset, strides))
        return out


def _span(array) -> tuple[int, int]:
    """[first byte, one past the last) that a view of any strides reaches."""
    start = array.data.ptr
    low = high = 0
    for extent, stride in zip(array.shape, array.strides):
        if extent == 0:
            return start, start
        reach = (extent - 1) * stride
        if reach < 0:
            low += reach
        else:
            high += reach
    return start + low, start + high + array.itemsize


class StepMemo:
    """One plan step's recipes by operand signature (see the module doc)."""

    def __init__(self, cupy, by_identity: frozenset[int]):
        self._cupy = cupy
        self._ndarray = cupy.ndarray
        self._by_identity = by_identity  # argument positions keyed by identity (constants)
        self._recipes: OrderedDict = OrderedDict()

    def _key(self, args) -> tuple | None:
        ndarray = self._ndarray
        parts = []
        for i, a in enumerate(args):
            if type(a) is ndarray:
                data = a.data
                parts.append((a.shape, a.strides, a.dtype, data.ptr & 255, data.device_id,
                              id(a) if i in self._by_identity else 0))
            elif a is None:
                parts.append(None)
            else:
                return None  # a host value: its bytes could steer the step
        return tuple(parts)

    def run(self, call, args) -> list:
        """``call()``'s result, recorded for this signature the first time, replayed later."""
        key = self._key(args)
        if key is None:
            return call()
        recipe = self._recipes.get(key)
        if recipe is _REFUSED:
            return call()
        if recipe is None or recipe is _SEEN:
            if recipe is None:
                values = call()
                self._remember(key, _SEEN)
            else:
                values, recipe = self._record(call, args)
                self._remember(key, _REFUSED if recipe is None else recipe)
            return values
        self._recipes.move_to_end(key)
        arrays = [a if type(a) is self._ndarray else None for a in args]
        return recipe.replay(self._cupy, arrays)

    def _remember(self, key, entry) -> None:
        self._recipes[key] = entry
        self._recipes.move_to_end(key)
        if len(self._recipes) > KEYS_PER_STEP:
            self._recipes.popitem(last=False)

    def _record(self, call, args):
        cupy = self._cupy
        recorder = Recorder()
        counted = [0]
        current = cupy.cuda.get_allocator()

        def counting(nbytes):
            counted[0] += 1
            return current(nbytes)

        if RECORDING.recorder is not None:  # a step inside a step: record only the outer
            return call(), None
        RECORDING.recorder = recorder
        try:
            with cupy.cuda.using_allocator(counting):
                values = call()
        finally:
            RECORDING.recorder = None
        if recorder.refused or counted[0] != len(recorder.allocations) \
                or not recorder.launches:
            return values, None
        return values, self._recipe(recorder, args, values)

    def _recipe(self, recorder: Recorder, args, values) -> _Recipe | None:
        ndarray = self._ndarray
        allocs = [a for a, _ in recorder.allocations]
        spans = ([(_INPUT, i, a, _span(a)) for i, a in enumerate(args) if type(a) is ndarray]
                 + [(_ALLOC, i, a, _span(a)) for i, a in enumerate(allocs)])

        def source(array):
            """(kind, index, offset from its data pointer); (_FIXED, None, 0) outside every
            operand and allocation; None where two contain it."""
            lo, hi = _span(array)
            found = [(kind, index, array.data.ptr - a.data.ptr)
                     for kind, index, a, (s0, s1) in spans if s0 <= lo and hi <= s1]
            if len(found) > 1:
                return None
            return found[0] if found else (_FIXED, None, 0)

        keep = []
        launches = []
        for launcher, pointer, grid, block, smem, stream, fmt, packed, call_args in \
                recorder.launches:
            slots = []
            for slot, arg in enumerate(call_args):
                if type(arg) is not ndarray:
                    continue
                where = source(arg)
                if where is None:
                    return None
                if where[0] == _FIXED:
                    keep.append(arg)  # its pointer stays in the packed values
                else:
                    slots.append((slot, *where))
            launches.append((launcher, pointer, grid, block, smem, stream, fmt, packed,
                             slots))
        # an output covering a whole allocation C-contiguously is allocated in its shape
        alloc_specs = [[tuple(a.shape), a.dtype] for a in allocs]
        outputs = []
        for value in values:
            if value is None:
                outputs.append(None)
                continue
            if type(value) is not ndarray:
                return None
            where = source(value)
            if where is None or where[0] == _FIXED:
                return None
            kind, index, offset = where
            if kind == _ALLOC and offset == 0 and value.flags.c_contiguous \
                    and value.nbytes == allocs[index].nbytes \
                    and value.dtype == allocs[index].dtype:
                alloc_specs[index][0] = tuple(value.shape)
            outputs.append((kind, index, offset, tuple(value.shape), tuple(value.strides),
                            value.dtype))
        streams = {id(s) for _, s in recorder.allocations} | {id(x[5]) for x in launches}
        if len(streams) != 1:
            return None
        stream = (recorder.allocations[0][1] if recorder.allocations else launches[0][5])
        device = self._cupy.cuda.Device(allocs[0].data.device_id if allocs
                                        else self._cupy.cuda.runtime.getDevice())
        return _Recipe(device, stream, [tuple(s) for s in alloc_specs], launches, outputs,
                       keep)
