"""``native-cuda``: lockstep's own ONNX executor on CuPy, on one stream the engine owns.

The same plan and op kernels as ``native-host``; only the array backend differs
(``CupyArrayBackend``: batch-invariant hand-written matmul and sum kernels, CuPy for
elementwise work). Weights cross to the device once, while the plans are built; feeds
arrive already adopted through ``tensor_ops.adopt``; results stay on the device. Nothing in
``run_component`` synchronises with the host.

Device memory: the plans' weights and every forward's allocations come from the engine's
``CountingAllocator`` (a private pool, live count and bytes exact), published into the
ledger after each forward (``ledger.live_allocations`` / ``live_bytes``). Tensor-op
allocations made outside ``run_component`` use it only inside ``engine.allocator.scope()``.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import onnx

from engines.cuda_support import cuda_availability, import_cupy
from engines.engine import Availability, Engine
from engines.errors import InputError


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
    description = "lockstep executor, CuPy backend, batch-invariant kernels, one stream"
    device_id: ClassVar[int] = 0

    @classmethod
    def availability(cls) -> Availability:
        ok, reason = cuda_availability()
        return Availability(ok, reason)

    def __init__(self, package):
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
        self.allocator.publish(self.ledger)

    def _make_tensor_ops(self):
        from engines.tensor_ops.cuda import CudaTensorOps

        if getattr(self, "backend", None) is not None:
            self.backend.ledger = self.ledger  # a fresh ledger counts the backend's adopts too
        return CudaTensorOps(self.ledger, self.stream, device_id=self.device_id)

    def run_component(self, component: str, feeds: dict[str, Any]) -> dict[str, Any]:
        plan = self._plans.get(component)
        if plan is None:
            raise InputError(f"the package has no component {component!r}", field="component",
                             value=component, remedy=f"use one of: {', '.join(self._plans)}")
        # The plan checks every feed's residency (host feeds: a ResidencyError naming
        # tensor_ops.adopt); nothing here reads a device value.
        with self._device, self.stream, self.allocator.scope():
            out = plan.run(self._device_empties(feeds))
        self.allocator.publish(self.ledger)
        return out

    def _device_empties(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """An empty value is host-empty by rule (an append kv cell before its first forward,
        or truncated to length 0); its device twin holds no bytes, so nothing crosses."""
        cupy = self._cupy
        if not any(isinstance(v, np.ndarray) and v.size == 0 for v in feeds.values()):
            return feeds
        return {name: (cupy.empty(v.shape, v.dtype)
                       if isinstance(v, np.ndarray) and v.size == 0 else v)
                for name, v in feeds.items()}

    def close(self) -> None:
        """Wait for the stream's queued work, then drop plans and cached weights."""
        if self.backend is not None:
            self.stream.synchronize()
            self.backend.release()
        self._plans = {}
