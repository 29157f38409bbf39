"""``onnx-reference``: ONNX's own reference evaluator, the slowest and most literal engine."""
from __future__ import annotations

from typing import Any

from engines.engine import Availability, Engine
from engines.errors import EngineUnavailable


class OnnxReferenceEngine(Engine):
    name = "onnx-reference"
    residency = "host"
    description = "onnx.reference.ReferenceEvaluator"

    @classmethod
    def availability(cls) -> Availability:
        try:
            import onnx
            from onnx.reference import ReferenceEvaluator  # noqa: F401
        except ImportError as exc:
            return Availability(False, f"onnx.reference is not importable ({exc}); pip install onnx")
        return Availability(True, f"onnx {onnx.__version__}")

    def __init__(self, package):
        super().__init__(package)
        from onnx.reference import ReferenceEvaluator

        foreign = sorted({f"{n.domain}:{n.op_type}" for name in package.spec.components
                          for n in package.component_model(name).graph.node
                          if n.domain and not n.domain.startswith("ai.onnx")})
        if foreign:  # onnxruntime's contrib ops, say: a package this engine cannot load
            raise EngineUnavailable(
                f"onnx.reference implements ONNX's own ops only, and package "
                f"{package.spec.name!r} uses {', '.join(foreign)}", field="package",
                value=package.spec.name, remedy="judge it on ort-cpu or native-host")

        self._evaluators = {name: ReferenceEvaluator(package.component_model(name))
                            for name in package.spec.components}
        self._outputs = {name: list(ev.output_names) for name, ev in self._evaluators.items()}

    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        values = self._evaluators[component].run(None, feeds)
        return dict(zip(self._outputs[component], values))
