"""The oracle: the simplest possible decode, every other path is compared to it.

Each step recomputes the whole prefix from fresh zero state on a reference engine: no cache
carried between steps, no speculation, and none of the interpreter's state handling, so a
bug there cannot hide in both sides of a comparison.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engines.errors import ExecutionError
from engines.workflow.state import dtype_of
from engines.workflow.validation import check_request


@dataclass
class OracleTrace:
    engine: str
    prompt: list[int]
    tokens: list[int]
    margins: list[float]  # top-2 logit margin of every generated step
    top2: list[tuple[int, int]]  # (best, runner-up) token ids per step

    @property
    def min_margin(self) -> float:
        return min(self.margins) if self.margins else float("inf")


def top2_margin(row: np.ndarray) -> tuple[int, int, float]:
    """Best id (lowest on ties), runner-up id and their logit gap, in float64."""
    row = np.asarray(row, dtype=np.float64)
    if np.isnan(row).any():
        raise ExecutionError("the reference produced NaN logits", field="logits",
                             value=f"{int(np.isnan(row).sum())} NaN of {row.size}",
                             remedy="check the package's weights and inputs")
    best = int(np.argmax(row))
    rest = row.copy()
    rest[best] = -np.inf
    second = int(np.argmax(rest))
    return best, second, float(row[best] - row[second])


def _fresh_state(spec, component: str) -> dict[str, np.ndarray]:
    return {cell.input: np.zeros(tuple(cell.shape), dtype=dtype_of(cell.dtype))
            for cell in spec.state.values() if cell.component == component}


def oracle_decode(package, prompt: Sequence[int], max_new_tokens: int, engine=None,
                  component: str = "target") -> OracleTrace:
    """Recompute decoding: the whole prefix every step, from zero state, on ``engine``.

    ``engine`` is an engine instance for ``package`` or None for ``ort-cpu``.
    """
    if engine is None:
        from engines.registry import REFERENCE_ENGINE, get_engine_class

        engine = get_engine_class(REFERENCE_ENGINE)(package)
    spec = package.spec
    ids = check_request(spec, prompt, max_new_tokens)
    comp = spec.components[component]
    tokens_in, positions_in = comp.inputs["tokens"], comp.inputs.get("positions")
    logits_out = comp.outputs["logits"]
    seq = list(ids)
    tokens, margins, top2 = [], [], []
    for _ in range(max_new_tokens):
        n = len(seq)
        feeds = {tokens_in: np.asarray(seq, dtype=np.int64).reshape(1, n)}
        if positions_in:
            feeds[positions_in] = np.arange(n, dtype=np.int64).reshape(1, n)
        feeds.update(_fresh_state(spec, component))
        logits = np.asarray(engine.run_component(component, feeds)[logits_out])
        best, second, margin = top2_margin(logits[0, -1])
        tokens.append(best)
        margins.append(margin)
        top2.append((best, second))
        seq.append(best)
        if best == spec.eos_id:
            break
    return OracleTrace(engine.name, ids, tokens, margins, top2)
