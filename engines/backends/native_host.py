"""``native-host``: lockstep's own ONNX executor on numpy, batch-invariant by construction."""
from __future__ import annotations

from typing import Any

import numpy

from engines.engine import Availability, Engine
from engines.native.array_backend import NumpyArrayBackend
from engines.native.plan import Plan


class NativeHostEngine(Engine):
    name = "native-host"
    residency = "host"
    batch_invariant = True
    description = "lockstep executor, numpy backend"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True, f"numpy {numpy.__version__}")

    def __init__(self, package):
        super().__init__(package)
        self.backend = NumpyArrayBackend()
        self._plans = {name: Plan(package.component_model(name), self.backend)
                       for name in package.spec.components}

    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        return self._plans[component].run(feeds)
