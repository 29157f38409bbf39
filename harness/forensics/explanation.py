"""What an explanation says: the compared values (``NodeError``), the feeds that differ
(``InputFinding``), the per-layer curve (``LayerPoint``) and the ``Explanation`` itself, with
its text and JSON forms; ``StepData`` keeps the arrays behind it, which a repro pack is cut
from. Built by ``explain.explain_record``.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

KIND = "lockstep-explanation"  # an explanation file's "kind": lockstep knows it as its own
MARKER = f'"kind": "{KIND}"'


# -- the result ----------------------------------------------------------------------------

@dataclass
class NodeError:
    """One compared value: a node's output (``where="inside"``) or a component output as
    the engine returned it (``where="boundary"``)."""
    index: int
    name: str  # the value (node output / graph output) name
    node: str  # the producing node's name ("" for a boundary output)
    op: str
    layer: int | None
    label: str  # "layer 3", "head", "output", "-"
    dtype: str
    shape: list[int]
    error: float  # max |engine - arbiter|
    scale: float  # max |arbiter|
    floor: float
    spread_f32: float | None  # the arbiter's float32 execution vs the arbiter
    spread_ort: float | None  # onnxruntime CPU vs the arbiter
    exceeds: bool
    where: str = "inside"
    inputs: list[str] = field(default_factory=list)
    touches: list[str] = field(default_factory=list)  # graph inputs it reads, by role
    note: str | None = None

    @property
    def ratio(self) -> float:
        if self.error == 0:
            return 0.0
        return math.inf if self.floor == 0 else self.error / self.floor

    def describe(self) -> str:
        what = (f"component output {self.name!r} as the engine returned it"
                if self.where == "boundary" else f"node {self.node!r} ({self.op}) -> "
                                                 f"{self.name!r}")
        return (f"{self.label}, {what}: error {_g(self.error)} vs noise floor {_g(self.floor)}"
                + (f" ({self.note})" if self.note else ""))


@dataclass
class InputFinding:
    """A feed of the explained forward that differs from the correct one."""
    name: str
    role: str  # tokens, positions, state <cell> (<kind>)
    error: float
    floor: float
    interpreter_differs: bool  # the feed the interpreter passed is already wrong
    engine_changed: bool  # the executor saw another value than the interpreter passed
    origin: dict | None = None  # state: {"step", "where", "detail"}
    note: str | None = None

    def describe(self) -> str:
        if self.engine_changed and not self.interpreter_differs:
            how = "the interpreter passed the right value; the engine changed it inside " \
                  "run_component before its forward"
        elif self.origin is not None:
            how = self.origin["detail"]
        else:
            how = "the interpreter passed it so"
        return (f"feed {self.name!r} ({self.role}) differs from the correct feed: error "
                f"{_g(self.error)} vs floor {_g(self.floor)}; {how}")


@dataclass
class LayerPoint:
    label: str
    layer: int | None
    max_error: float
    floor: float  # the floor of the node with the largest error
    max_ratio: float
    nodes: int
    exceeded: int


@dataclass
class Explanation:
    record: str | None
    run_id: str | None
    package: str
    package_hash: str
    engine: str
    engine_class: str
    prompt: list[int]
    step: int
    trigger: str  # what made this step the one: defect, drift, non-finite, error, near-tie
    component: str
    phase: str | None
    positions: list[int]  # [start, end) of the explained forward
    view: Literal["inside", "inside (re-executed)", "boundary", "outputs", "none"]
    state_formulation: str
    arbiter: str
    floor_runs: list[str]
    factor: float
    first_bad: NodeError | None
    inputs: list[InputFinding]
    nodes: list[NodeError]
    layers: list[LayerPoint]
    engine_error: str | None = None
    reproduced: bool | None = None  # the re-run emitted the record's tokens up to the step
    notes: list[str] = field(default_factory=list)
    mode: str = "greedy"
    prompt_name: str | None = None
    # the arrays behind it (not serialized): what a repro pack is cut from
    data: Any = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> str:
        """The evidence cell it explains (``batch.record_key`` of its record)."""
        return "|".join([self.run_id or "", self.package, self.engine, self.mode,
                         self.prompt_name or ""])

    @property
    def summary(self) -> str:
        head = f"{self.engine} on {self.package}, step {self.step} ({self.trigger})"
        if self.first_bad is not None:
            fb = self.first_bad
            text = f"{head}: first value out of the noise floor: {fb.describe()}"
        elif self.engine_error:
            text = f"{head}: the engine raised {self.engine_error}; every value before it " \
                   f"is within the noise floor"
        elif self.view == "none":
            text = f"{head}: no forward of the engine decided this step"
        else:
            text = (f"{head}: every node and output of the forward is within its noise floor: "
                    f"the defect is outside the forward (token choice, stopping, or the "
                    f"interpreter)")
        bad_inputs = [f for f in self.inputs]
        if bad_inputs:
            text += "; " + bad_inputs[0].describe()
        return text

    def to_dict(self) -> dict:
        out = {"kind": KIND, **asdict(self)}
        out.pop("data", None)
        out["summary"] = self.summary
        out["key"] = self.key
        return jsonable(out)

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path

    def layer_curve(self) -> dict:
        """The per-layer error curve as plain data: labels, max errors, floors, ratios."""
        return {"labels": [p.label for p in self.layers],
                "max_error": [p.max_error for p in self.layers],
                "floor": [p.floor for p in self.layers],
                "max_ratio": [p.max_ratio for p in self.layers],
                "first_bad": self.first_bad.label if self.first_bad else None}

    def text(self, top: int = 8) -> str:
        """The human-readable explanation ``lockstep explain`` prints."""
        lines = [self.summary, ""]
        lines.append(f"record     {self.record or '(in memory)'}")
        lines.append(f"engine     {self.engine} ({self.engine_class}); view: {self.view}")
        lines.append(f"package    {self.package} {self.package_hash}")
        lines.append(f"step       {self.step} ({self.trigger}), {self.phase} forward of "
                     f"{self.component!r} over positions {self.positions[0]}..."
                     f"{self.positions[1] - 1}; prompt {self.prompt}")
        lines.append(f"arbiter    {self.arbiter}; state: {self.state_formulation}")
        lines.append(f"floor      {self.factor:g} x max({', '.join(self.floor_runs)} vs the "
                     f"arbiter), at least the dtype's max_abs")
        if self.reproduced is False:
            lines.append("note       the engine did not emit the record's tokens again "
                         "(nondeterministic?): explained on the stream it emitted now")
        for note in self.notes:
            lines.append(f"note       {note}")
        if self.inputs:
            lines.append("")
            lines.append("feeds that differ from the correct ones:")
            for f in self.inputs[:top]:
                lines.append(f"  {f.describe()}")
            if len(self.inputs) > top:
                lines.append(f"  ... and {len(self.inputs) - top} more")
        if self.first_bad is not None:
            fb = self.first_bad
            lines.append("")
            lines.append("first value out of its noise floor:")
            lines.append(f"  layer  {fb.label}")
            lines.append(f"  node   {fb.node or '(component output)'}  op {fb.op}  "
                         f"value {fb.name}  {fb.dtype}{fb.shape}")
            lines.append(f"  error  {_g(fb.error)}  floor {_g(fb.floor)}  (float32 spread "
                         f"{_g(fb.spread_f32)}, onnxruntime spread {_g(fb.spread_ort)}; "
                         f"|arbiter| up to {_g(fb.scale)})")
            if fb.inputs:
                lines.append(f"  reads  {', '.join(fb.inputs)}")
            if fb.touches:
                lines.append(f"  feeds  {', '.join(fb.touches)}")
            if fb.note:
                lines.append(f"  note   {fb.note}")
        if self.layers:
            lines.append("")
            lines.append("per-layer error (max over the layer's nodes):")
            lines.append(f"  {'layer':<10} {'max error':>11} {'floor':>11} {'ratio':>9} "
                         f"{'nodes':>6} {'out':>5}")
            for p in self.layers:
                lines.append(f"  {p.label:<10} {_g(p.max_error):>11} {_g(p.floor):>11} "
                             f"{_g(p.max_ratio):>9} {p.nodes:>6} {p.exceeded:>5}")
        worst = sorted((n for n in self.nodes if n.exceeds), key=lambda n: n.index)[:top]
        if worst:
            lines.append("")
            lines.append(f"first {len(worst)} values out of the floor, in execution order:")
            for n in worst:
                lines.append(f"  #{n.index:<4} {n.describe()}")
        return "\n".join(lines)


def _g(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def jsonable(value):
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.floating,)):
        return jsonable(float(value))
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


# -- the arrays a repro pack is cut from ------------------------------------------------------

@dataclass
class StepData:
    model: Any  # the component's onnx.ModelProto
    component: str
    history: list  # the engine's ledger before the forward (capture.ForwardRecord.history)
    phase: str | None
    correct_feeds: dict[str, np.ndarray]  # the float32 execution's (its own recomputed state)
    arbiter_feeds: dict[str, np.ndarray]  # the arbiter's (float64 state)
    engine_feeds: dict[str, np.ndarray]
    arbiter: Any  # arbiter.Observed (float64)
    float32: Any  # arbiter.Observed (native float32)
    engine_values: dict[str, np.ndarray]
    engine_outputs: dict[str, np.ndarray] | None
    host_resolved: frozenset
    floors: dict[str, float]


__all__ = ["KIND", "MARKER", "Explanation", "InputFinding", "LayerPoint", "NodeError",
           "StepData", "jsonable"]
