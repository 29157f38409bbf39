"""Two example engines, one for each form of lockstep's engine contract.

``example-ort-optimized`` runs a package's components with onnxruntime on the CPU, with
every graph optimisation on (``ORT_ENABLE_ALL``: constant folding, node fusions, layout
changes) and two intra-op threads. The built-in ``ort-cpu`` (the oracle's engine) runs one
thread; whether fusions and a split reduction still give the oracle's tokens is what lockstep
checks. lockstep's workflow interpreter drives it: state cells, token choice and speculative
decoding are the interpreter's, so it supports every mode.

``example-ort-blackbox`` decodes by itself: its own greedy loop over the same onnxruntime
sessions, carrying the package's state cells the way the package declares them. lockstep
hands it the whole request (``generate``) and judges the stream and the logits rows it
returns. It cannot speculate under lockstep's control, so it declares no speculative decoding.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from engines.decode_result import DecodeResult
from engines.dtypes import dtype_of
from engines.engine import Availability, BlackBoxEngine, Engine
from engines.errors import InputError


def _onnxruntime_availability() -> Availability:
    try:
        import onnxruntime
    except ImportError as exc:
        return Availability(False, f"onnxruntime is not importable ({exc}); "
                                   f"pip install onnxruntime")
    return Availability(True, f"onnxruntime {onnxruntime.__version__}")


def _sessions(package) -> dict[str, Any]:
    """One onnxruntime session per component: every graph optimisation, two threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    # no busy-waiting between ops: several engines and test workers share the CPU
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return {name: ort.InferenceSession(str(package.component_path(name)), sess_options=options,
                                       providers=["CPUExecutionProvider"])
            for name in package.spec.components}


class OrtOptimizedEngine(Engine):
    """Components run by onnxruntime with every graph optimisation; lockstep drives it."""

    name = "example-ort-optimized"
    description = "onnxruntime CPU, ORT_ENABLE_ALL graph optimisations, 2 intra-op threads"
    residency = "host"          # numpy arrays in and out: the default host tensor ops serve
    batch_invariant = False     # onnxruntime promises no bitwise row invariance

    @classmethod
    def availability(cls) -> Availability:
        return _onnxruntime_availability()

    def __init__(self, package):
        super().__init__(package)  # ledger and (host) tensor ops
        self.sessions = _sessions(package)
        self.output_names = {name: [o.name for o in s.get_outputs()]
                             for name, s in self.sessions.items()}

    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        session = self.sessions.get(component)
        if session is None:
            raise InputError(f"the package has no component {component!r}", field="component",
                             value=component, remedy=f"use one of: {', '.join(self.sessions)}")
        values = session.run(None, feeds)
        return dict(zip(self.output_names[component], values))

    def close(self) -> None:
        self.sessions = {}


class OrtBlackBoxEngine(BlackBoxEngine):
    """Its own greedy loop: lockstep sees only the tokens and logits rows it returns."""

    name = "example-ort-blackbox"
    description = "own greedy loop over onnxruntime (ORT_ENABLE_ALL, 2 threads), a black box"
    residency = "host"
    logits_audit = True  # it returns each step's logits row when asked

    @classmethod
    def availability(cls) -> Availability:
        return _onnxruntime_availability()

    def __init__(self, package):
        super().__init__(package)
        self.sessions = _sessions(package)
        spec = package.spec
        self.target = spec.components["target"]
        self.cells = [c for c in spec.state.values() if c.component == "target"]
        self.output_names = [o.name for o in self.sessions["target"].get_outputs()]

    def generate(self, prompt: Sequence[int], max_new_tokens: int,
                 audit: bool = False) -> DecodeResult:
        ledger = self.reset_ledger()  # every decode gets a fresh ledger
        spec, ports = self.package.spec, self.target
        state = {c.input: np.zeros(tuple(c.shape), dtype=dtype_of(c.dtype)) for c in self.cells}
        tokens: list[int] = []
        rows: list[np.ndarray] | None = [] if audit else None
        steps: list[float] = []
        pending, position = [int(t) for t in prompt], 0
        start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            m = len(pending)
            feeds = {ports.inputs["tokens"]: np.asarray([pending], dtype=np.int64)}
            if "positions" in ports.inputs:
                feeds[ports.inputs["positions"]] = np.arange(
                    position, position + m, dtype=np.int64).reshape(1, m)
            feeds.update(state)
            out = dict(zip(self.output_names, self.sessions["target"].run(None, feeds)))
            for cell in self.cells:  # append caches grow in-graph, static ones are rewritten
                state[cell.input] = out[cell.output]
            position += m
            row = np.asarray(out[ports.outputs["logits"]])[0, -1].astype(np.float64)
            token = int(np.argmax(np.where(np.isnan(row), -np.inf, row)))  # lowest index on ties
            seconds = time.perf_counter() - t0
            ledger.record_forward("prefill" if not tokens else "decode", m, seconds)
            steps.append(seconds)
            tokens.append(token)
            if rows is not None:
                rows.append(row)
            if len(tokens) >= max_new_tokens or token == spec.eos_id:
                break
            pending = [token]
        wall = time.perf_counter() - start
        return DecodeResult(self.name, list(prompt), tokens, ledger, wall, steps, rows)

    def close(self) -> None:
        self.sessions = {}
