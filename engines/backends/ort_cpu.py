"""``ort-cpu``: onnxruntime with the CPU provider. The oracle's default engine."""
from __future__ import annotations

from typing import Any

from engines.engine import Availability, Engine


class OrtCpuEngine(Engine):
    name = "ort-cpu"
    residency = "host"
    description = "onnxruntime, CPUExecutionProvider"

    @classmethod
    def availability(cls) -> Availability:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            return Availability(False, f"onnxruntime is not importable ({exc}); pip install onnxruntime")
        return Availability(True, f"onnxruntime {onnxruntime.__version__}")

    @classmethod
    def supports(cls, package) -> Availability:
        if package.spec.dtype == "bfloat16":
            return Availability(False, "onnxruntime's CPU provider runs no bfloat16 MatMul "
                                       "(NOT_IMPLEMENTED at session creation) and its Python "
                                       "binding takes no bfloat16 arrays")
        return Availability(True)

    def __init__(self, package):
        found = self.supports(package)
        if not found:
            from engines.errors import EngineUnavailable

            raise EngineUnavailable(
                found.reason, field="package.dtype", value=package.spec.dtype,
                remedy="run bfloat16 packages on native-host, onnx-reference or a device "
                       "engine; ort-cpu judges them through their float32 twin")
        super().__init__(package)
        import onnxruntime as ort

        options = ort.SessionOptions()
        # One thread: small graphs gain nothing from more, and results stay reproducible.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._sessions = {
            name: ort.InferenceSession(str(package.component_path(name)), sess_options=options,
                                       providers=["CPUExecutionProvider"])
            for name in package.spec.components
        }
        self._outputs = {name: [o.name for o in s.get_outputs()] for name, s in self._sessions.items()}

    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        values = self._sessions[component].run(None, feeds)
        return dict(zip(self._outputs[component], values))
