"""onnxruntime's refusal to create a session because a provider has no kernel for an op at
the graph's types (bfloat16 on the CUDA provider, seen on the H200), read from its message
so the engine reports itself unavailable for that package, naming the op and the node,
instead of refusing a whole dtype up front or crashing mid-load."""
from __future__ import annotations

import re

from engines.errors import EngineUnavailable

# the two forms onnxruntime 1.31 words it in (session creation, CUDA provider)
_PATTERNS = (
    re.compile(r"Provider type for (?P<op>\w+) node with name '(?P<node>[^']*)' is not set"),
    re.compile(r"Could not find an implementation for (?P<op>\w+)\(\d+\) node with name "
               r"'(?P<node>[^']*)'"),
)


def missing_kernel(exc: BaseException) -> tuple[str, str] | None:
    """(op type, node name) when ``exc`` says no kernel serves that node, else None."""
    text = str(exc)
    for pattern in _PATTERNS:
        found = pattern.search(text)
        if found:
            return found["op"], found["node"]
    return None


def kernel_gap_unavailable(exc: BaseException, engine: str, model: str,
                           dtype: str) -> EngineUnavailable | None:
    """The EngineUnavailable for a session ``exc`` refused for a missing kernel (field
    ``package.dtype``), or None when the failure is something else."""
    gap = missing_kernel(exc)
    if gap is None:
        return None
    op, node = gap
    return EngineUnavailable(
        f"{engine} cannot run {model}: onnxruntime has no {dtype} kernel for its {op} node "
        f"{node!r} on this provider (session creation failed)",
        field="package.dtype", value=dtype,
        remedy="run this package on native-cuda, native-host or hf-cuda, or convert it with "
               "--dtype float16 (or another cache kind: the graphs differ in their ops)")
