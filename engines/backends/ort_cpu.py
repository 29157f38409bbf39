"""``ort-cpu``: onnxruntime with the CPU provider. The oracle's default engine.

A session is shared by every engine of one process on the same component of the same
package content (``content_hash``): onnxruntime optimises the graph and packs the weights
when a session is created, about a second for a real checkpoint, and a run builds the
oracle and the judged engine over the same files. A session's ``run`` holds no state
between calls and may be called from several threads, so sharing it changes no output.
"""
from __future__ import annotations

from typing import Any

import onnxruntime as ort

from engines.engine import Availability, Engine
from engines.errors import EngineUnavailable
from engines.package.file_identity import IdentityMemo

_SESSIONS = IdentityMemo(size=6)


def _session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    # One thread: small graphs gain nothing from more, and results stay reproducible.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


def cpu_session(package, component: str) -> ort.InferenceSession:
    """The CPU session of ``component``, shared by package content (a package without a
    content hash gets its own)."""
    path = str(package.component_path(component))

    def create() -> ort.InferenceSession:
        return ort.InferenceSession(path, sess_options=_session_options(),
                                    providers=["CPUExecutionProvider"])

    content = getattr(package, "content_hash", None)
    if not content:
        return create()
    return _SESSIONS.get((content, component, path), create)


class OrtCpuEngine(Engine):
    name = "ort-cpu"
    residency = "host"
    description = "onnxruntime, CPUExecutionProvider"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True, f"onnxruntime {ort.__version__}")

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
            raise EngineUnavailable(
                found.reason, field="package.dtype", value=package.spec.dtype,
                remedy="run bfloat16 packages on native-host, onnx-reference or a device "
                       "engine; ort-cpu judges them through their float32 twin")
        super().__init__(package)
        self._sessions = {name: cpu_session(package, name) for name in package.spec.components}
        self._outputs = {name: [o.name for o in s.get_outputs()] for name, s in self._sessions.items()}

    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        values = self._sessions[component].run(None, feeds)
        return dict(zip(self._outputs[component], values))
