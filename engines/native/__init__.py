"""lockstep's own ONNX executor: a Plan per component over an ArrayBackend.

``Plan(model, backend)`` binds kernels once and separates host shape arithmetic from
backend data; ``NumpyArrayBackend`` is the host backend (batch-invariant reductions);
``engines.native.onnx_backend.NativeBackend`` runs ONNX's own node tests through it.
"""
from .array_backend import ArrayBackend, NumpyArrayBackend
from .plan import Plan, required_host_inputs, unsupported_ops

__all__ = ["ArrayBackend", "NumpyArrayBackend", "Plan", "required_host_inputs",
           "unsupported_ops"]
