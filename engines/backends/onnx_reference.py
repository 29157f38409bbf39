"""``onnx-reference``: ONNX's own reference evaluator, the slowest and most literal engine."""
from __future__ import annotations

from typing import Any

from engines.engine import Availability, Engine


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

        self._evaluators = {name: ReferenceEvaluator(package.component_model(name))
                            for name in package.spec.components}
        self._outputs = {name: list(ev.output_names) for name, ev in self._evaluators.items()}

    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        values = self._evaluators[component].run(None, feeds)
        return dict(zip(self._outputs[component], values))
