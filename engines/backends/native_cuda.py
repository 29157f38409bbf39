"""``native-cuda``: lockstep's own ONNX executor on CuPy, on one stream the engine owns.

The same plan and op kernels as ``native-host``; only the array backend differs
(``CupyArrayBackend``: batch-invariant hand-written matmul and sum kernels, CuPy for
elementwise work). Weights cross to the device once, while the plans are built; feeds
arrive already adopted through ``tensor_ops.adopt``; results stay on the device. Nothing in
``run_component`` synchronises with the host, except dropping a captured graph when a new
signature invalidates it (its buffers must not be freed under a queued replay).

Device memory: the plans' weights and every forward's allocations come from the engine's
``CountingAllocator`` (a private pool, live count and bytes exact), published into the
ledger after each forward (``ledger.live_allocations`` / ``live_bytes``, the graph slots'
pools included). Tensor-op allocations made outside ``run_component`` use it only inside
``engine.allocator.scope()``.

CUDA graphs (claim 6): ``run_component(component, feeds, phase)`` runs a ``decode`` forward
in the ``PRIMARY`` graph slot and a ``verify`` forward in ``VERIFY`` (``graph_slots.py``),
any other phase eagerly. Graphs are on by default for packages whose kv cells are all
``static`` (``graphs=`` overrides). A slot's outputs are its static buffers: the caller
consumes them before the next forward in the same slot (the interpreter does).
``poison_outputs=True`` (tests) fills them with NaN before every replay.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import onnx

from engines.cuda_support import cuda_availability, import_cupy
from engines.engine import Availability, Engine
from engines.errors import EngineUnavailable, InputError
from engines.native.graph_slots import (CaptureError, CupyGraphDevice, GraphSlots,
                                        forward_positions, graphs_default)


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


class NativeCudaEngine(Engine):
    name = "native-cuda"
    residency = "cuda:0"
    batch_invariant = True
    graph_slots = True
    description = "lockstep executor, CuPy backend, batch-invariant kernels, one stream"
    device_id: ClassVar[int] = 0

    @classmethod
    def availability(cls) -> Availability:
        ok, reason = cuda_availability()
        return Availability(ok, reason)

    def __init__(self, package, *, graphs: bool | None = None, poison_outputs: bool = False):
        if package is not None and package.spec.dtype == "bfloat16":
            # seen on the H200 (docs/evidence/2026-12-01-h200-run6): the plan refuses to
            # place the package's bfloat16 weights, CuPy having no bfloat16 dtype
            raise EngineUnavailable(
                "native-cuda runs no bfloat16 package yet: CuPy has no bfloat16 dtype, and "
                "the kernels that would keep it as uint16 storage are not written",
                field="package.dtype", value="bfloat16",
                remedy="run it on native-host, onnx-reference or hf-cuda, or convert with "
                       "--dtype float16")
        cupy = import_cupy()  # EngineUnavailable naming what is missing and how to get it
        self._cupy = cupy
        self._device = cupy.cuda.Device(self.device_id)
        with self._device:
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.backend = None
        self._plans: dict[str, Any] = {}
        super().__init__(package)  # builds tensor ops on self.stream

        from engines.device_memory import CountingAllocator
        from engines.native.cupy_array_backend import CupyArrayBackend
        from engines.native.plan import Plan

        self.allocator = CountingAllocator(device_id=self.device_id)
        self.backend = CupyArrayBackend(self.stream, self.ledger, device_id=self.device_id)
        with self.allocator.scope():
            for name in package.spec.components:
                model = package.component_model(name)
                with self.backend.weight_loading(matmul_weight_shapes(model)):
                    self._plans[name] = Plan(model, self.backend)
        self.graphs = graphs_default(package.spec) if graphs is None else bool(graphs)
        self.slots = GraphSlots(CupyGraphDevice(self.stream, device_id=self.device_id),
                                lambda: self.ledger, enabled=self.graphs,
                                poison_outputs=poison_outputs)
        self.publish_memory()

    def make_tensor_ops(self):
        from engines.tensor_ops.cuda import CudaTensorOps

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
        out = self.slots.run(component, self._device_empties(feeds), phase,
                             lambda f: self._eager(plan, f),
                             lambda inputs: self._capture_body(plan, inputs),
                             forward_positions(self.package.spec.components[component], feeds))
        self.publish_memory()
        return out

    def _eager(self, plan, feeds: dict[str, Any]) -> dict[str, Any]:
        with self._device, self.stream, self.allocator.scope():
            return plan.run(feeds)

    def _capture_body(self, plan, inputs):
        """The forward a slot captures (its allocator is current). A host value adopted
        during the capture would be recorded from a temporary host buffer, so it is refused:
        after the eager run of the same signature every such value is cached."""
        adopted = self.ledger.h2d_count
        out = plan.run(inputs)
        if self.ledger.h2d_count != adopted:
            raise CaptureError("a host value crossed to the device during the capture")
        return out, plan.cached_device_values()

    def reset_slot(self, slot) -> None:
        """Drop one graph slot's graph and buffers (``GraphSlot`` or its name); the other
        slot keeps replaying."""
        self.slots.reset(slot)

    def reset_graphs(self) -> None:
        self.slots.reset()

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
            self.backend.release()
        self._plans = {}
