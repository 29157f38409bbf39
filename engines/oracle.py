"""The oracle: the simplest possible decode, every other path is compared to it.

Each step recomputes the whole prefix from fresh zero state on a reference engine: no cache
carried between steps, no speculation, and none of the interpreter's state handling, so a
bug there cannot hide in both sides of a comparison. ``oracle_for(package)`` picks the oracle
that judges a package: over its declared reference (a reduced-precision package's float32
twin) when it has one, else over the package itself.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engines.dtypes import dtype_of
from engines.errors import ExecutionError
from engines.requests import check_request


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


class Oracle:
    """The recompute oracle over any prefix: ``row(prefix)`` is the last position's logits
    after a forward over the whole prefix from zero state, in float64, cached by prefix.

    The runner judges every engine's stream on the prefix that engine produced, so one
    oracle per package serves every engine, width and prompt; streams that agree share
    their rows.
    """

    def __init__(self, package, engine=None, component: str = "target"):
        if engine is None:
            from engines.registry import REFERENCE_ENGINE, get_engine_class

            engine = get_engine_class(REFERENCE_ENGINE)(package)
        self.package = package
        self.spec = package.spec
        self.engine = engine
        self.component = component
        comp = self.spec.components[component]
        self._tokens_in = comp.inputs["tokens"]
        self._positions_in = comp.inputs.get("positions")
        self._logits_out = comp.outputs["logits"]
        self._rows: dict[tuple[int, ...], np.ndarray] = {}

    @property
    def name(self) -> str:
        return self.engine.name

    def row(self, prefix: Sequence[int]) -> np.ndarray:
        """float64 logits of the position after ``prefix``; NaN is an ``ExecutionError``."""
        key = tuple(int(t) for t in prefix)
        cached = self._rows.get(key)
        if cached is not None:
            return cached
        n = len(key)
        feeds = {self._tokens_in: np.asarray(key, dtype=np.int64).reshape(1, n)}
        if self._positions_in:
            feeds[self._positions_in] = np.arange(n, dtype=np.int64).reshape(1, n)
        feeds.update(_fresh_state(self.spec, self.component))
        row = np.array(self._last_row(feeds)[0, -1], dtype=np.float64)
        if np.isnan(row).any():
            raise ExecutionError("the reference produced NaN logits", field="logits",
                                 value=f"{int(np.isnan(row).sum())} NaN of {row.size}",
                                 remedy="check the package's weights and inputs")
        self._rows[key] = row
        return row

    def _last_row(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The last position's logits [1, 1, V] on the host. On a device engine (an oracle
        chosen with ``--oracle-engine``) the feeds are adopted and only that row is staged
        back, through the oracle engine's own tensor ops: that engine is the oracle's alone,
        never a judged one, so its crossings are outside every budget."""
        # a bare run_component wrapper (the fixtures' conditioning recorder) is a host one
        if getattr(self.engine, "residency", "host") == "host":
            out = self.engine.run_component(self.component, feeds)[self._logits_out]
            return np.asarray(out)[:, -1:]
        ops = self.engine.tensor_ops
        out = self.engine.run_component(self.component,
                                        {k: ops.adopt(v) for k, v in feeds.items()})
        return ops.stage_to_host(ops.last_along_axis(out[self._logits_out], 1), "oracle_row")

    def decode(self, prompt: Sequence[int], max_new_tokens: int) -> OracleTrace:
        """The oracle's own greedy stream (lowest index on exact ties), stopping at eos."""
        ids = check_request(self.spec, prompt, max_new_tokens)
        seq = list(ids)
        tokens, margins, top2 = [], [], []
        for _ in range(max_new_tokens):
            best, second, margin = top2_margin(self.row(seq))
            tokens.append(best)
            margins.append(margin)
            top2.append((best, second))
            seq.append(best)
            if best == self.spec.eos_id:
                break
        return OracleTrace(self.name, ids, tokens, margins, top2)


def oracle_decode(package, prompt: Sequence[int], max_new_tokens: int, engine=None,
                  component: str = "target") -> OracleTrace:
    """Recompute decoding: the whole prefix every step, from zero state, on ``engine``.

    ``engine`` is an engine instance for ``package`` or None for ``ort-cpu``.
    """
    return Oracle(package, engine, component).decode(prompt, max_new_tokens)


# -- which oracle judges a package ----------------------------------------------------------
# A reduced-precision package (float16, bfloat16) declares its float32 twin in package.yaml
# (``reference: {folder, content_hash}``, written by ``lockstep convert``). The oracle then
# runs the twin, not the package: the reference stays the model's own function, independent
# of the reduced arithmetic under test (onnxruntime's CPU provider widens every float16 op it
# lacks a kernel for to float32 and runs no bfloat16 MatMul at all, so the package itself on
# ort-cpu would hide an overflow and cannot judge bfloat16). Streams are still judged with
# the judged package's own dtype row (``tolerance_for(package.spec.dtype)``).

def reference_package(package):
    """The package the oracle runs to judge ``package``: the reference it declares (a sibling
    folder whose content hash must match), else ``package`` itself."""
    ref = package.spec.reference
    if ref is None:
        return package
    from engines.errors import PackageError
    from engines.package import load_package, package_content_hash

    folder = package.root.parent / ref.folder
    where = str(package.yaml_path)
    remedy = (f"put the reference package {ref.folder!r} beside {package.root.name!r} (for a "
              f"converted checkpoint: run lockstep convert with --dtype "
              f"{package.spec.dtype} again, which writes its float32 twin there)")
    if not (folder / "package.yaml").is_file():
        raise PackageError(f"package {package.spec.name!r} is judged against its reference "
                           f"package {ref.folder!r}, which is not in {package.root.parent}",
                           field="reference.folder", value=ref.folder, remedy=remedy,
                           where=where)
    actual = package_content_hash(folder)
    if actual != ref.content_hash:
        raise PackageError(f"the reference package {ref.folder!r} has changed since "
                           f"{package.spec.name!r} was made: its content hash is {actual}",
                           field="reference.content_hash", value=ref.content_hash,
                           remedy=remedy, where=where)
    twin = load_package(folder)
    mine, theirs = package.spec, twin.spec
    for key in ("vocab_size", "bos_id", "eos_id"):
        if getattr(mine, key) != getattr(theirs, key):
            raise PackageError(f"the reference package {ref.folder!r} has {key} "
                               f"{getattr(theirs, key)}, this package {getattr(mine, key)}: "
                               f"it cannot judge this package's tokens",
                               field="reference.folder", value=ref.folder,
                               remedy="reference the float32 conversion of the same "
                                      "checkpoint", where=where)
    if theirs.reference is not None:
        raise PackageError(f"the reference package {ref.folder!r} declares a reference of its "
                           f"own; a reference must be judged by itself", field="reference",
                           value=ref.folder, remedy="reference the float32 package directly",
                           where=where)
    if theirs.max_context < mine.max_context:
        raise PackageError(f"the reference package {ref.folder!r} holds {theirs.max_context} "
                           f"positions, fewer than this package's {mine.max_context}",
                           field="reference.folder", value=ref.folder,
                           remedy="convert the reference with at least this max_context",
                           where=where)
    return twin


def oracle_for(package, engine_name: str | None = None, component: str = "target") -> Oracle:
    """The recompute oracle that judges ``package``: on ``engine_name`` (default: the
    reference engine, ``ort-cpu``), over the package's declared reference (its float32 twin)
    or, without one, over the package itself. ``oracle.package`` is the package it runs:
    record its content hash beside the oracle's engine in evidence."""
    from engines.registry import REFERENCE_ENGINE, get_engine_class

    target = reference_package(package)
    engine = get_engine_class(engine_name or REFERENCE_ENGINE)(target)
    return Oracle(target, engine, component)
