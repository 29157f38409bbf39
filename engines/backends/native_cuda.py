"""``native-cuda``: lockstep's own ONNX executor on CuPy, on one stream the engine owns.

The same plan and op kernels as ``native-host``; only the array backend differs
(``CupyArrayBackend``: batch-invariant hand-written matmul and sum kernels, CuPy for
elementwise work). Weights cross to the device once, while the plans are built; feeds
arrive already adopted through ``tensor_ops.adopt``; results stay on the device. Nothing in
``run_component`` synchronises with the host, except dropping a captured graph when a new
signature invalidates it (its buffers must not be freed under a queued replay). So a caller
reads a result on ``engine.stream`` (``x.get(stream=engine.stream)``) or after
``engine.synchronize()``: a plain ``get`` copies on the current stream, which does not wait
for this one.

Device memory: the plans' weights and every forward's allocations come from the engine's
``CountingAllocator`` (a private pool, live count and bytes exact), published into the
ledger after each forward (``ledger.live_allocations`` / ``live_bytes``, the graph slots'
pools included). Tensor-op allocations made outside ``run_component`` use it only inside
``engine.allocator.scope()``.

CUDA graphs (claim 6): ``run_component(component, feeds, phase)`` runs a ``decode`` forward
in the ``PRIMARY`` graph slot, a ``verify`` forward in ``VERIFY`` (``graph_slots.py``), a
``prefill`` in a graph of its prompt length once that length has been seen twice
(``prefill_graphs.py``), any other phase eagerly. Graphs are on by default for packages whose kv cells are all
``static``; ``graphs=`` overrides. With graphs on, a component with ``append`` cells that
the engine can plan with capacity buffers is planned so (``capacity_cache.py``: every
forward then has one shape per phase, while the interpreter still sees cells that grow);
``graph_stable`` says whether every forward is then capturable. Capacity buffers are not
the default for append packages yet: the forensics recorder compares the plan's feeds with
the interpreter's and would need the translation first. A slot's outputs are its static
buffers: the caller consumes them before the next forward in the same slot (the interpreter
does).
``poison_outputs=True`` (tests) fills them with NaN before every replay.
``LOCKSTEP_PROGRAMS=on`` (off by default) captures forwards as launch programs
(``engines/native/forward_programs.py``), attention then in 128-thread blocks.

bfloat16: a component that declares a bfloat16 value is planned as a ``Bf16Plan``
(``engines/native/bf16.py``): its bfloat16 values are 16-bit CuPy arrays of dtype
``ml_dtypes.bfloat16`` that only bit moves, the two conversions and the ``lk_bf16`` kernels
touch. Any other op on one is an ``ExecutionError`` naming it.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, ClassVar

import numpy as np
import onnx

from engines.cuda_support import cuda_availability, import_cupy
from engines.device_memory import CountingAllocator
from engines.dtypes import dtype_of
from engines.engine import Availability, Engine
from engines.errors import EngineUnavailable, InputError, ResidencyError
from engines.native import dependent_launch
from engines.native.bf16_plan import Bf16Plan, model_uses_bf16
from engines.native.capacity_cache import CapacityCells, capacity_plan
from engines.native.cupy_array_backend import CupyArrayBackend
from engines.native.forward_programs import ForwardPrograms, programs_requested
from engines.native.graph_slots import (CaptureError, CupyGraphDevice, GraphSlots,
                                        forward_positions, graphs_default)
from engines.native.kernel_launch import plain_launches
from engines.native.launch.prologue_gemv import wide_verify_requested
from engines.native.plan import Plan
from engines.native.prefill_graphs import PrefillGraphs, budget_for
from engines.native.step_memo import memo_enabled
from engines.tensor_ops.cuda import CudaTensorOps


def matmul_weight_shapes(model: onnx.ModelProto) -> set[tuple[int, int]]:
    """Shapes of the 2-D initializers a MatMul (or a Gemm without transB) multiplies by:
    the weights worth a cached [N, K] transpose on the device."""
    inits = {t.name: tuple(int(d) for d in t.dims) for t in model.graph.initializer}
    shapes: set[tuple[int, int]] = set()
    for node in model.graph.node:
        if len(node.input) < 2 or node.input[1] not in inits:
            continue
        if node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            if trans_b:
                continue  # already [N, K]: used through its transposed view
        elif node.op_type != "MatMul":
            continue
        dims = inits[node.input[1]]
        if len(dims) == 2:
            shapes.add(dims)
    return shapes


def _require_bfloat16_arrays(cupy) -> None:
    """bfloat16 values live in CuPy arrays of dtype ``ml_dtypes.bfloat16`` (their 16-bit
    storage; no CuPy routine computes on them): CuPy 14 can hold one, CuPy 13 cannot."""
    try:
        cupy.empty((1,), dtype=dtype_of("bfloat16"))
    except Exception as exc:  # noqa: BLE001 - CuPy < 14 raises a TypeError or ValueError
        raise EngineUnavailable(
            f"CuPy {cupy.__version__} cannot hold bfloat16 arrays ({type(exc).__name__})",
            field="package.dtype", value="bfloat16",
            remedy="use CuPy >= 14 (pip install 'lockstep[cuda13]'), or run the package on "
                   "native-host or onnx-reference") from None


GRAPHS_ENV = "LOCKSTEP_NATIVE_CUDA_GRAPHS"  # auto (default) | on | off


def graphs_mode() -> str:
    """``LOCKSTEP_NATIVE_CUDA_GRAPHS``: auto, on or off (anything else refused)."""
    value = os.environ.get(GRAPHS_ENV, "auto").strip().lower()
    if value not in ("auto", "on", "off"):
        raise InputError(f"{GRAPHS_ENV} must be auto, on or off", field=GRAPHS_ENV,
                         value=value, remedy=f"unset it, or set {GRAPHS_ENV}=on")
    return value


def graphs_setting(spec) -> bool:
    """Graphs when the engine is built without ``graphs=``: ``auto`` (the default) is
    ``graphs_default`` (static packages); ``on`` asks for them on every package, append
    caches included (capacity buffers where the graph allows); ``off`` runs every forward
    eagerly. For runs that construct engines themselves (``lockstep run``/``bench``)."""
    value = graphs_mode()
    return graphs_default(spec) if value == "auto" else value == "on"


class NativeCudaEngine(Engine):
    name = "native-cuda"
    residency = "cuda:0"
    batch_invariant = True
    graph_slots = True
    description = "lockstep executor, CuPy backend, batch-invariant kernels, one stream"
    device_id: ClassVar[int] = 0

    @classmethod
    def check_settings(cls) -> None:
        """Its graphs mode and its A/B switches, before any cell."""
        graphs_mode()
        memo_enabled()
        dependent_launch.requested()
        programs_requested()
        wide_verify_requested()

    @classmethod
    def availability(cls) -> Availability:
        ok, reason = cuda_availability()
        return Availability(ok, reason)

    def __init__(self, package, *, graphs: bool | None = None, poison_outputs: bool = False):
        cupy = import_cupy()  # EngineUnavailable naming what is missing and how to get it
        models = {name: package.component_model(name) for name in package.spec.components}
        bf16_components = {name for name, model in models.items() if model_uses_bf16(model)}
        if bf16_components or package.spec.dtype == "bfloat16":
            _require_bfloat16_arrays(cupy)
        self._cupy = cupy
        self._device = cupy.cuda.Device(self.device_id)
        with self._device:
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.backend = None
        self._plans: dict[str, Any] = {}
        super().__init__(package)  # builds tensor ops on self.stream

        self.allocator = CountingAllocator(device_id=self.device_id)
        programs = programs_requested()
        self.backend = CupyArrayBackend(self.stream, self.ledger, device_id=self.device_id,
                                        programs=programs)
        # LOCKSTEP_PROGRAMS=on: captured forwards as launch programs (forward_programs.py)
        self.programs = (ForwardPrograms(cupy, self.device_id, self.stream,
                                         [self.backend.kernels, self.backend.fused_kernels()])
                         if programs else None)
        # append kv cells as capacity buffers (capacity_cache.py) where the graph allows it,
        # when graphs are asked for: the default stays static-only until the forensics
        # recorder (harness/forensics/capture.py) knows the capacity translation
        if graphs is None:
            graphs = graphs_setting(package.spec)
        self.graphs = bool(graphs)
        capacity, self.capacity_refusals = {}, {}
        if self.graphs:
            for name, model in models.items():
                found, why = capacity_plan(model, package.spec, name)
                if found is not None:
                    capacity[name] = found
                elif why != "no append kv cell":
                    self.capacity_refusals[name] = why
        cells = {cell.name for found in capacity.values() for cell in found.cells}
        # every forward graph-stable: what would let graphs default on for this package
        self.graph_stable = self.graphs and graphs_default(package.spec, cells)
        self._capacity = {name: CapacityCells(found, cupy, zeros=self._zeros,
                                              copy_into=self._copy_bits)
                          for name, found in capacity.items()}
        with self.allocator.scope():
            for name, model in models.items():
                plan_class = Bf16Plan if name in bf16_components else Plan
                if name in capacity:
                    model = capacity[name].model
                with self.backend.weight_loading(matmul_weight_shapes(model)):
                    self._plans[name] = plan_class(model, self.backend)
        device = CupyGraphDevice(self.stream, device_id=self.device_id)
        with self._device:
            total = cupy.cuda.runtime.memGetInfo()[1]
        prefill = PrefillGraphs(device, lambda: self.ledger, poison_outputs=poison_outputs,
                                budget_bytes=budget_for(total))
        self.slots = GraphSlots(device, lambda: self.ledger, enabled=self.graphs,
                                poison_outputs=poison_outputs, prefill=prefill)
        self.publish_memory()

    def make_tensor_ops(self):
        if getattr(self, "backend", None) is not None:
            self.backend.ledger = self.ledger  # a fresh ledger counts the backend's adopts too
        return CudaTensorOps(self.ledger, self.stream, device_id=self.device_id)

    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        """One forward; ``decode`` and ``verify`` forwards go through their graph slot when
        graphs are on (their outputs are then the slot's static buffers)."""
        plan = self._plans.get(component)
        if plan is None:
            raise InputError(f"the package has no component {component!r}", field="component",
                             value=component, remedy=f"use one of: {', '.join(self._plans)}")
        # The plan checks every feed's residency (host feeds: a ResidencyError naming
        # tensor_ops.adopt); nothing here reads a device value.
        feeds = self._device_empties(feeds)
        positions = forward_positions(self.package.spec.components[component], feeds)
        cells = self._capacity.get(component)
        if cells is not None:  # pasts as capacity buffers (lengths from their shapes)
            feeds, lengths = cells.feeds(feeds, positions)
        # a verification launches plain, eager or captured (kernel_launch.plain_launches)
        with plain_launches() if phase == "verify" else contextlib.nullcontext():
            out = self.slots.run(component, feeds, phase, lambda f: self._eager(plan, f),
                                 lambda inputs: self._capture_body(plan, inputs), positions)
        if cells is not None:  # presents as views of their first P + M slots (a replay's
            # outputs are the slot's own buffers: the views of a step seen before are kept)
            out = cells.outputs(out, lengths, positions, lasting=self.slots.replayed)
        self.publish_memory()
        return out

    @property
    def capacity_components(self) -> frozenset[str]:
        """Components whose append kv cells run as capacity buffers (graph-stable)."""
        return frozenset(self._capacity)

    def _zeros(self, shape, dtype):
        """A fresh capacity buffer, from the engine's pool, zeroed on its stream."""
        with self._device, self.stream, self.allocator.scope():
            return self._cupy.zeros(shape, dtype=dtype)

    def _copy_bits(self, dst, src) -> None:
        """``dst[...] = src`` device to device on the stream, moving bits (bfloat16 too); a
        host ``src`` is refused as the plan refuses a host feed (nothing crosses silently)."""
        if not isinstance(src, self._cupy.ndarray):
            raise ResidencyError(f"a state feed is a host {type(src).__name__}; native-cuda "
                                 "computes on the device", field="feeds", value="host",
                                 remedy="adopt it first (tensor_ops.adopt)")
        with self._device, self.stream:
            if dst.dtype.itemsize == 2:
                dst.view(np.uint16)[...] = src.view(np.uint16)
            else:
                dst[...] = src

    def _eager(self, plan, feeds: dict[str, Any]) -> dict[str, Any]:
        with self._device, self.stream, self.allocator.scope():
            if self.programs is None:
                return plan.run(feeds)
            with self.programs.observing():  # the modules its capture's programs need
                return plan.run(feeds)

    def _capture_body(self, plan, inputs):
        """The forward a slot captures (its allocator is current). A host value adopted
        during the capture would be recorded from a temporary host buffer, so it is refused:
        after the eager run of the same signature every such value is cached."""
        adopted = self.ledger.h2d_count
        keep = []
        if self.programs is None:
            out = plan.run(inputs)
        else:
            with self.programs.capturing() as deferral:
                out = plan.run(inputs)
            keep = deferral.keep  # the programs' device arrays: alive with the graph
        if self.ledger.h2d_count != adopted:
            raise CaptureError("a host value crossed to the device during the capture")
        return out, plan.cached_device_values() + keep

    def reset_slot(self, slot) -> None:
        """Drop one graph slot's graph and buffers (``GraphSlot`` or its name); the other
        slot keeps replaying."""
        self.slots.reset(slot)
        self._forget_views()

    def reset_graphs(self) -> None:
        self.slots.reset()
        self._forget_views()

    def _forget_views(self) -> None:
        for cells in getattr(self, "_capacity", {}).values():
            cells.forget()

    def publish_memory(self) -> None:
        """Live allocations into the ledger: the engine's pool and the graph slots' pools."""
        self.allocator.publish(self.ledger)
        slots = getattr(self, "slots", None)
        if slots is not None:
            count, size = slots.live()
            self.ledger.live_allocations += count
            self.ledger.live_bytes += size

    def _device_empties(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """An empty value is host-empty by rule (an append kv cell before its first forward,
        or truncated to length 0); its device twin holds no bytes, so nothing crosses."""
        cupy = self._cupy
        if not any(isinstance(v, np.ndarray) and v.size == 0 for v in feeds.values()):
            return feeds
        return {name: (cupy.empty(v.shape, v.dtype)
                       if isinstance(v, np.ndarray) and v.size == 0 else v)
                for name, v in feeds.items()}

    def synchronize(self) -> None:
        """Wait for everything queued on the engine's stream."""
        self.stream.synchronize()

    def close(self) -> None:
        """Wait for the stream's queued work, then drop plans and cached weights."""
        if self.backend is not None:
            self.stream.synchronize()
            if getattr(self, "slots", None) is not None:
                self.slots.close()
            self._forget_views()
            self.backend.release()
        self._plans = {}
