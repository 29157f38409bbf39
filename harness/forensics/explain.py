"""``explain_record``: from "token t differs" to "layer L, node N".

Given an evidence record, the forward that decided the first failing step is rebuilt and
compared node by node with an arbiter:

1. **The engine's side, as its decode built it.** The engine is decoded again on the
   record's prompt up to that step (``capture.Recorder``): the same interpreter, the same
   positions and state cells. At that forward every intermediate is recorded from inside the
   engine's executor (native engines: ``Plan.run(observe=)``), with the feeds the executor
   really saw and the outputs it really produced; other engines are seen at their component
   boundary (feeds in, outputs out), black boxes that decode by themselves at their logits.

2. **The correct side, by recomputation.** The correct feeds of the same forward: the same
   new tokens at their true positions, and state cells recomputed *from zero state by one
   forward over the prefix before them* (the recompute formulation, what the oracle does),
   not by replaying the engine's cache steps: a state-handling bug (a dropped KV append, a
   lost recurrent state) cannot then hide on both sides, and the correct state does not
   depend on the engine at all. The arbiter (the native executor in float64, see
   ``arbiter.py``) runs that forward with every intermediate exposed; so do the two runs
   that measure the noise floor (the native executor in float32, onnxruntime CPU), each on
   its own recomputed state.

3. **Node by node, in topological order.** Each value the engine's executor computed is
   compared with the arbiter's; its error is judged against its own noise floor
   (``compare.py``). The first node out of its floor is the answer, with its layer
   (``layers.py``), op and name; then the component's outputs as the engine returned them
   (a corruption after the last node shows only there: the ``output``). The feeds are
   compared first: a feed that differs from the correct one is named with where it went
   wrong (the interpreter passed it so; the engine changed it inside ``run_component``; a
   state cell the engine returned wrong at an earlier step, traced back to that step).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engines.errors import InputError

from .arbiter import OrtRunner, PlanRunner
from .capture import Recorder
from .compare import FACTOR, dtype_name, max_abs_error, noise_floor, scale_of
from .layers import OUTPUT, assign_layers

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
    view: str  # inside | boundary | outputs | none
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
        return _jsonable(out)

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


def _jsonable(value):
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating,)):
        return _jsonable(float(value))
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


# -- explaining -------------------------------------------------------------------------------

def _load_record(record_or_path):
    from harness.evidence import read_evidence
    from harness.evidence.schema import EvidenceRecord

    if isinstance(record_or_path, EvidenceRecord):
        return record_or_path, None
    path = Path(record_or_path)
    return read_evidence(path), str(path)


def failing_step(record) -> tuple[int, str] | None:
    """The first step anything failing was found at in ``record``: a defect finding, a logits
    row out of tolerance or non-finite, an error's step; else a near-tie's step."""
    steps: list[tuple[int, str]] = []
    if record.divergence is not None and record.divergence.verdict == "defect":
        steps.append((record.divergence.step, "defect"))
    if record.judgement is not None:
        for f in record.judgement.findings:
            if f.verdict == "defect":
                steps.append((f.step, "defect"))
                break
    if record.logits_audit is not None:
        for s in record.logits_audit.steps:
            if s.non_finite:
                steps.append((s.step, "non-finite"))
                break
        for s in record.logits_audit.steps:
            if not s.ok and not s.non_finite:
                steps.append((s.step, "drift"))
                break
    if record.error is not None and record.error.step is not None:
        steps.append((record.error.step, "non-finite" if record.status == "non-finite"
                      else "error"))
    if steps:
        return min(steps)
    if record.divergence is not None:
        return record.divergence.step, record.divergence.verdict
    return None


def steps_decided(record) -> int:
    """How many steps a forward of the record's engine decided: one per token it emitted,
    and the step whose forward raised."""
    count = len(record.tokens)
    if record.error is not None and record.error.step is not None:
        count = max(count, record.error.step + 1)
    return count


def resolve_engine_class(engine, record_engine: str, record_class: str | None = None):
    """An engine class from a class, an instance's class, a registered name or
    ``module:Class``; default: the record's engine class (``engine_class``, kept for an
    engine named by its class), else its engine by name."""
    from engines.errors import EngineDefinitionError, UnknownEngine
    from engines.registry import check_engine_class, get_engine_class

    if engine is None:
        try:
            return get_engine_class(record_class or record_engine)
        except (UnknownEngine, EngineDefinitionError) as err:
            where = (f"its class {record_class!r} cannot be loaded here ({err.message})"
                     if record_class else "is not registered here")
            raise InputError(f"the record's engine {record_engine!r} {where}",
                             field="--engine", value=record_class or record_engine,
                             remedy="name its class: --engine package.module:Class (for "
                                    "lockstep's planted bugs: suites.planted.engines:<Class>)"
                             ) from err
    if isinstance(engine, type):
        return engine
    if isinstance(engine, str):
        return get_engine_class(engine)
    return check_engine_class(type(engine))


def resolve_record_package(record, package=None):
    """The package a record ran on: ``package`` (a Package, a folder or a fixture name),
    else the record's folder if it still holds the same content, else its name."""
    from engines.package import Package
    from harness.packages import resolve_package

    if isinstance(package, Package):
        pkg = package
    elif package is not None:
        pkg = resolve_package(package)
    else:
        pkg = None
        if record.package.path and Path(record.package.path).is_dir():
            try:
                pkg = resolve_package(record.package.path)
            except Exception:
                pkg = None
        if pkg is None or pkg.content_hash != record.package.content_hash:
            pkg = resolve_package(record.package.name)
    if pkg.content_hash != record.package.content_hash:
        raise InputError(f"package {pkg.spec.name!r} here is not the package the record ran "
                         f"on (content hash {pkg.content_hash}, the record's "
                         f"{record.package.content_hash})", field="--package",
                         value=str(pkg.root),
                         remedy="pass --package with the folder the record was made from")
    return pkg


def class_ref(cls) -> str:
    """How to name ``cls`` again: its registered name for a built-in or entry point, else
    ``module:Class``."""
    from engines.registry import class_reference

    return class_reference(cls) or cls.name


def explain_record(record_or_path, *, engine=None, package=None, step: int | None = None,
                   factor: float = FACTOR, component: str = "target") -> Explanation:
    """Explain one evidence record (an ``EvidenceRecord`` or a path to one).

    ``engine``: the engine class (or registered name, ``module:Class``); default the record's
    engine by name. ``package``: default the record's. ``step``: default the first failing
    step (a defect, a logits row out of tolerance or non-finite, an error). ``factor``: the
    noise floor's multiple of the measured spread."""
    record, path = _load_record(record_or_path)
    if record.mode.kind != "greedy":
        raise InputError("explain rebuilds greedy forwards; this record is a speculative cell",
                         field="mode", value=record.mode.label,
                         remedy="explain the same engine's greedy record (lockstep run "
                                "--mode greedy), whose stream the speculative one must equal")
    if step is None:
        found = failing_step(record)
        if found is None and record.error is not None:
            raise InputError(f"nothing to explain: the cell failed in its {record.error.stage} "
                             f"({record.error.type}), outside any forward", field="error.stage",
                             value=record.error.stage,
                             remedy="fix what the error names; explain needs a forward")
        if found is None and record.status == "budget":
            raise InputError("nothing to explain: a budget failure is about crossings, not "
                             "values (every token and logits row passed)", field="status",
                             value=record.status, remedy="see the record's budgets")
        if found is None:
            raise InputError("nothing to explain: the record has no finding (no defect, no "
                             "logits out of tolerance, no error)", field="status",
                             value=record.status, remedy="explain a failing record, or pass "
                                                         "--step to compare a step anyway")
        step, trigger = found
    else:
        decided = steps_decided(record)
        if not 0 <= step < decided:
            raise InputError(f"step {step} is not a step of the record: its engine decided "
                             + (f"steps 0 to {decided - 1}" if decided else "none"),
                             field="--step", value=step,
                             remedy=f"pass --step from 0 to {decided - 1}, or leave it out "
                                    f"for the first failing step" if decided else
                                    "explain a record whose engine ran a forward")
        trigger = "requested"
    cls = resolve_engine_class(engine, record.engine, record.engine_class)
    pkg = resolve_record_package(record, package)
    try:
        instance = cls(pkg)
    except Exception as exc:
        raise InputError(f"the engine cannot be constructed on this package, so there is no "
                         f"forward to explain: {type(exc).__name__}: {exc}", field="engine",
                         value=record.engine, remedy="explain a record whose cell ran "
                                                     "forwards") from exc
    try:
        return _explain(record, path, cls, instance, pkg, int(step), trigger, factor,
                        component)
    finally:
        try:
            instance.close()
        except Exception:
            pass


def _roles(spec, component):
    comp = spec.components[component]
    roles: dict[str, str] = {}
    for role, name in comp.inputs.items():
        roles[name] = role
    for cell_name, cell in spec.state.items():
        if cell.component == component:
            roles[cell.input] = f"state {cell_name} ({cell.kind})"
    return roles


class _Correct:
    """The correct feeds of any forward over a prefix, per run, by recomputation."""

    def __init__(self, spec, component, runner, cell_dtypes):
        self.spec = spec
        comp = spec.components[component]
        self.tokens_in = comp.inputs.get("tokens")
        self.positions_in = comp.inputs.get("positions")
        self.cells = [c for c in spec.state.values() if c.component == component]
        self.runner = runner
        self.cell_dtypes = cell_dtypes
        self._states: dict[int, dict[str, np.ndarray]] = {}

    def state_after(self, prefix: list[int], n: int) -> dict[str, np.ndarray]:
        """Every state cell after the first ``n`` positions of ``prefix``: zero state for
        n = 0, else the state outputs of one forward over prefix[:n] from zero state."""
        if n not in self._states:
            zero = {c.input: np.zeros(tuple(c.shape), dtype=self.cell_dtypes[c.input])
                    for c in self.cells}
            if n == 0:
                self._states[n] = zero
            else:
                feeds = self.token_feeds(prefix[:n], 0)
                feeds.update(zero)
                out = self.runner.run(feeds, observe=False).outputs
                self._states[n] = {c.input: out[c.output] for c in self.cells}
        return self._states[n]

    def token_feeds(self, tokens: list[int], start: int) -> dict[str, np.ndarray]:
        m = len(tokens)
        feeds = {}
        if self.tokens_in:
            feeds[self.tokens_in] = np.asarray(tokens, dtype=np.int64).reshape(1, m)
        if self.positions_in:
            feeds[self.positions_in] = np.arange(start, start + m, dtype=np.int64).reshape(1, m)
        return feeds

    def step_feeds(self, prefix: list[int], start: int) -> dict[str, np.ndarray]:
        feeds = self.token_feeds(prefix[start:], start)
        feeds.update(self.state_after(prefix, start))
        return feeds


def _explain(record, path, cls, engine, pkg, step, trigger, factor, component):
    spec = pkg.spec
    if component not in spec.components:
        raise InputError(f"package {spec.name!r} has no component {component!r}",
                         field="component", value=component,
                         remedy=f"use one of {', '.join(spec.components)}")
    model = pkg.component_model(component)
    roles = _roles(spec, component)
    graph_inputs = list(pkg.graph_inputs(component))
    unfed = [n for n in graph_inputs if n not in roles or roles[n] in ("embeddings", "carry")]
    if unfed:
        raise InputError("explain rebuilds forwards fed by tokens, positions and state cells; "
                         f"component {component!r} also takes {unfed}", field="component",
                         value=component, remedy="explain a greedy record of the target")
    cells = [c for c in spec.state.values() if c.component == component]
    from engines.dtypes import dtype_of

    cell_dtypes = {c.input: dtype_of(c.dtype) for c in cells}
    prompt = list(record.prompt.ids)
    notes: list[str] = []

    recorder = Recorder(engine, component, target=step)
    audit = cls.capabilities().logits_audit
    result, exc = recorder.decode(prompt, step + 1, audit=audit)
    engine_error = None
    if exc is not None:
        engine_error = f"{type(exc).__name__}: {exc}"
    reproduced = None
    if result is not None:
        reproduced = list(result.tokens[:step + 1]) == list(record.tokens[:step + 1]) or \
            list(result.tokens) == list(record.tokens[:len(result.tokens)])
    layers = assign_layers(model, {c.input: c.input for c in cells})

    def base(**kw) -> Explanation:
        return Explanation(
            record=path, run_id=record.run_id, package=spec.name,
            package_hash=pkg.content_hash, engine=record.engine, engine_class=class_ref(cls),
            prompt=prompt, step=step, trigger=trigger, component=component,
            state_formulation="recompute: one forward over the prefix before the step from "
                              "zero state (as the oracle computes), not the engine's cache",
            arbiter="the native executor in float64 on the host",
            floor_runs=["native float32", "onnxruntime CPU"], factor=factor,
            engine_error=engine_error, reproduced=reproduced, notes=notes,
            mode=record.mode.label, prompt_name=record.prompt.name, **kw)

    fwd = recorder.forward(step)
    if fwd is None:
        # no forward decided this step: a black box decoding by itself, or the stream ended
        if recorder.forwards or not cls.capabilities().decodes_itself or result is None:
            notes.append(f"the engine ran {len(recorder.forwards)} forward(s); none decided "
                         f"step {step}")
            return base(phase=None, positions=[0, 0], view="none", first_bad=None, inputs=[],
                        nodes=[], layers=[])
        return _explain_outputs(base, record, pkg, model, component, cells, cell_dtypes,
                                prompt, result, step, factor, notes)

    # the prefix the engine fed, from its own tokens feeds
    tokens_in = spec.components[component].inputs.get("tokens")
    fed = []
    for f in recorder.forwards[:step + 1]:
        fed.extend(int(t) for t in np.asarray(f.feeds[tokens_in]).reshape(-1))
    m = int(np.asarray(fwd.feeds[tokens_in]).size)
    start = len(fed) - m

    # the three correct runs on the correct feeds, each on its own recomputed state
    arb_runner = PlanRunner(model, float64=True)
    f32_runner = PlanRunner(model, float64=False)
    arb_c = _Correct(spec, component, arb_runner, cell_dtypes)
    f32_c = _Correct(spec, component, f32_runner, cell_dtypes)
    f32_feeds = f32_c.step_feeds(fed, start)
    f32 = f32_runner.run(f32_feeds)
    arb_feeds = arb_c.step_feeds(fed, start)
    arb = arb_runner.run(arb_feeds)
    ort = ort_feeds = None
    try:
        wanted = {k: v.dtype for k, v in f32.values.items()}
        ort_runner = OrtRunner(model, wanted)
        ort_c = _Correct(spec, component, ort_runner, cell_dtypes)
        ort_feeds = ort_c.step_feeds(fed, start)
        ort = ort_runner.run(ort_feeds)
    except Exception as exc2:  # onnxruntime cannot run this graph (a bfloat16 MatMul, say)
        notes.append(f"onnxruntime could not run the component ({type(exc2).__name__}: "
                     f"{str(exc2).splitlines()[0][:160]}); the floor is the native float32 "
                     f"spread alone")

    def spreads(name, where="values"):
        ref = getattr(arb, where).get(name)
        out = []
        for run in (f32, ort):
            got = None if run is None else getattr(run, where).get(name)
            out.append(None if got is None or ref is None else max_abs_error(got, ref)[0])
        return out

    # -- the feeds ---------------------------------------------------------------------------
    engine_feeds = fwd.plan_feeds if fwd.plan_feeds is not None else fwd.feeds
    inputs: list[InputFinding] = []
    floors: dict[str, float] = {}
    for name in graph_inputs:
        if name not in engine_feeds:
            continue
        ref = arb_feeds[name]
        runs = [max_abs_error(f32_feeds[name], ref)[0],
                None if ort_feeds is None else max_abs_error(ort_feeds[name], ref)[0]]
        floor = noise_floor(dtype_name(engine_feeds[name]), runs, factor)
        err, note = max_abs_error(engine_feeds[name], ref)
        if err <= floor:
            continue
        interp_err = max_abs_error(fwd.feeds[name], ref)[0]
        changed = fwd.plan_feeds is not None and \
            max_abs_error(fwd.plan_feeds[name], fwd.feeds[name])[0] != 0
        finding = InputFinding(name, roles.get(name, "input"), err, floor,
                               interpreter_differs=interp_err > floor, engine_changed=changed,
                               note=note)
        cell = next((c for c in cells if c.input == name), None)
        if cell is not None and finding.interpreter_differs:
            finding.origin = _state_origin(recorder, cell, fed, arb_c, f32_c, step, factor)
        inputs.append(finding)

    # -- node by node --------------------------------------------------------------------------
    comp = spec.components[component]
    touches_map = {n: f"{r} ({n})" for n, r in roles.items()}
    nodes: list[NodeError] = []
    engine_values: dict[str, np.ndarray] = {}
    if fwd.observed is not None:
        view = "inside"
        engine_values = fwd.observed.values
        for index, name in enumerate(fwd.observed.order):
            if name not in arb.values:
                continue
            _add_node(nodes, index, name, fwd.observed.producer[name], engine_values[name],
                      arb, spreads, layers, touches_map, factor, floors)
    elif _is_ort(engine):
        # onnxruntime: its session is not instrumented; the same graph is re-executed on
        # onnxruntime CPU with every intermediate as an output, on the engine's own feeds
        view = "inside (re-executed)"
        notes.append("onnxruntime's session cannot be observed: the component was re-executed "
                     "on onnxruntime CPU with every intermediate as a graph output, on the "
                     "feeds the engine was given")
        try:
            wanted = {k: v.dtype for k, v in f32.values.items()}
            again = OrtRunner(model, wanted).run(fwd.feeds)
        except Exception as exc3:
            again = None
            notes.append(f"re-execution failed ({type(exc3).__name__}); compared at the "
                         f"boundary only")
        if again is not None:
            producer = {y: n for n in model.graph.node for y in n.output if y}
            engine_values = again.values
            order = [k for k in f32.order if k in engine_values]
            for index, name in enumerate(order):
                if name not in arb.values:
                    continue
                node = producer[name]
                _add_node(nodes, index, name, node, engine_values[name], arb, spreads, layers,
                          touches_map, factor, floors)
    else:
        view = "boundary"
        notes.append("the engine's executor is not visible from here: it is compared at its "
                     "component boundary (feeds and outputs) only")

    # -- the outputs as the engine returned them -----------------------------------------------
    if fwd.outputs is not None:
        base_index = len(nodes) and nodes[-1].index + 1
        for k, out_name in enumerate(o.name for o in model.graph.output):
            if out_name not in fwd.outputs or out_name not in arb.outputs:
                continue
            value = fwd.outputs[out_name]
            err, note = max_abs_error(value, arb.outputs[out_name])
            sf, so = spreads(out_name, "outputs")
            floor = noise_floor(dtype_name(value), [sf, so], factor)
            floors[out_name] = max(floors.get(out_name, 0.0), floor)
            changed = None
            if fwd.plan_outputs is not None and out_name in fwd.plan_outputs:
                changed = max_abs_error(value, fwd.plan_outputs[out_name])
                if changed[0] != 0:
                    extra = "the engine changed it after its forward (its executor's own " \
                            "value is " + ("within" if max_abs_error(
                                fwd.plan_outputs[out_name], arb.outputs[out_name])[0] <= floor
                                else "out of") + " the floor)"
                    note = f"{note}; {extra}" if note else extra
            role = next((r for r, n in comp.outputs.items() if n == out_name), None)
            cell = next((c for c in cells if c.output == out_name), None)
            touches = [f"output {role}"] if role else []
            if cell is not None:
                touches.append(f"state {next(k for k, c in spec.state.items() if c is cell)} "
                               f"({cell.kind})")
            nodes.append(NodeError(
                base_index + k, out_name, "", "output", None, OUTPUT, dtype_name(value),
                list(np.shape(value)), err, scale_of(arb.outputs[out_name]), floor, sf, so,
                err > floor, "boundary", [], touches, note))

    first_bad = next((n for n in nodes if n.exceeds and n.where == "inside"), None) or \
        next((n for n in nodes if n.exceeds), None)
    curve = _curve(nodes, layers)
    expl = base(phase=fwd.phase, positions=[start, start + m], view=view, first_bad=first_bad,
                inputs=inputs, nodes=nodes, layers=curve)
    expl.data = StepData(
        model=model, component=component, history=fwd.history, phase=fwd.phase,
        correct_feeds=f32_feeds, arbiter_feeds=arb_feeds, engine_feeds=engine_feeds,
        arbiter=arb, float32=f32, engine_values=engine_values, engine_outputs=fwd.outputs,
        host_resolved=f32_runner.plan.host_resolved, floors=floors)
    return expl


def _is_ort(engine) -> bool:
    from engines.backends.ort_cpu import OrtCpuEngine

    return isinstance(engine, OrtCpuEngine)


def _add_node(nodes, index, name, node, value, arb, spreads, layers, touches_map, factor,
              floors) -> None:
    err, note = max_abs_error(value, arb.values[name])
    sf, so = spreads(name)
    floor = noise_floor(dtype_name(value), [sf, so], factor)
    floors[name] = floor
    nodes.append(NodeError(
        index, name, node.name, node.op_type, layers.of(name), layers.label(name),
        dtype_name(value), list(np.shape(value)), err, scale_of(arb.values[name]), floor, sf,
        so, err > floor, "inside", [x for x in node.input if x],
        [touches_map[x] for x in node.input if x in touches_map], note))


def _state_origin(recorder, cell, fed, arb_c, f32_c, step, factor) -> dict:
    """Where a wrong state feed at ``step`` came from: the first earlier forward whose
    returned state for ``cell`` is out of the floor (the engine changed it after its forward,
    or the forward computed it so), else the hand-over between forwards."""
    end = 0
    for s in range(step):
        rec = recorder.forward(s)
        if rec is None:
            break
        end += int(np.asarray(rec.feeds[arb_c.tokens_in]).size)
        if rec.outputs is None or cell.output not in rec.outputs:
            continue
        ref = arb_c.state_after(fed, end)[cell.input]
        floor = noise_floor(dtype_name(rec.outputs[cell.output]),
                            [max_abs_error(f32_c.state_after(fed, end)[cell.input], ref)[0]],
                            factor)
        err = max_abs_error(rec.outputs[cell.output], ref)[0]
        if err <= floor:
            continue
        if rec.plan_outputs is not None and cell.output in rec.plan_outputs and \
                max_abs_error(rec.plan_outputs[cell.output], ref)[0] <= floor:
            return {"step": s, "where": "boundary", "error": err, "floor": floor,
                    "detail": f"the engine returned {cell.output!r} wrong at step {s} although "
                              f"its forward computed it right (changed after the forward)"}
        return {"step": s, "where": "inside", "error": err, "floor": floor,
                "detail": f"the engine's forward at step {s} computed {cell.output!r} wrong "
                          f"(explain step {s})"}
    return {"step": step, "where": "between", "error": None, "floor": None,
            "detail": "every earlier forward returned this cell right: it went wrong between "
                      "forwards (the interpreter's state handling)"}


def _curve(nodes: list[NodeError], layers) -> list[LayerPoint]:
    """Per layer: the largest error over its nodes with that node's floor, and the largest
    error/floor ratio over its nodes."""
    groups: dict[str, list[NodeError]] = {}
    for n in nodes:
        groups.setdefault(n.label, []).append(n)
    order = [label for label in layers.order() if label in groups]
    order += [label for label in groups if label not in order and label != "-"]
    points = []
    for label in order:
        group = groups[label]
        largest = max(group, key=lambda n: (n.error, n.ratio))
        points.append(LayerPoint(
            label, group[0].layer if label.startswith("layer") else None,
            largest.error, largest.floor, max(n.ratio for n in group), len(group),
            sum(n.exceeds for n in group)))
    return points


def _explain_outputs(base, record, pkg, model, component, cells, cell_dtypes, prompt, result,
                     step, factor, notes):
    """A black box that decodes by itself: its logits row at ``step`` against the arbiter's
    last row over the same prefix (the oracle's formulation), floors as everywhere."""
    if result.logits is None or step >= len(result.logits):
        notes.append("the engine returned no logits row for this step")
        return base(phase=None, positions=[0, 0], view="none", first_bad=None, inputs=[],
                    nodes=[], layers=[])
    spec = pkg.spec
    prefix = prompt + list(result.tokens[:step])
    row = np.asarray(result.logits[step]).reshape(-1)
    logits_name = spec.components[component].outputs["logits"]
    runs = {}
    for label, runner in (("arb", PlanRunner(model, True)), ("f32", PlanRunner(model, False))):
        c = _Correct(spec, component, runner, cell_dtypes)
        runs[label] = np.asarray(runner.run(c.step_feeds(prefix, 0), observe=False)
                                 .outputs[logits_name])[0, -1]
    try:
        ort_runner = OrtRunner(model, {})
        c = _Correct(spec, component, ort_runner, cell_dtypes)
        runs["ort"] = np.asarray(ort_runner.run(c.step_feeds(prefix, 0), observe=False)
                                 .outputs[logits_name])[0, -1]
    except Exception:
        runs["ort"] = None
    ref = runs["arb"]
    sf = max_abs_error(runs["f32"], ref)[0]
    so = None if runs["ort"] is None else max_abs_error(runs["ort"], ref)[0]
    dtype = spec.dtype
    floor = noise_floor(dtype, [sf, so], factor)
    err, note = max_abs_error(row.astype(np.float64), ref)
    node = NodeError(0, f"{logits_name}[last row]", "", "output", None, OUTPUT, dtype,
                     list(row.shape), err, scale_of(ref), floor, sf, so, err > floor,
                     "boundary", [], ["output logits"], note)
    notes.append("a black box that decodes by itself: only its logits rows are visible")
    return base(phase="generate", positions=[len(prefix) - 1, len(prefix)], view="outputs",
                first_bad=node if node.exceeds else None, inputs=[], nodes=[node],
                layers=_curve([node], assign_layers(model)))


__all__ = ["Explanation", "NodeError", "InputFinding", "LayerPoint", "StepData",
           "explain_record", "failing_step", "resolve_engine_class", "class_ref"]
