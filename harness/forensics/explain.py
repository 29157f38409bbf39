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

from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.backends.ort_cpu import OrtCpuEngine
from engines.dtypes import dtype_of
from engines.errors import InputError

from .arbiter import OrtRunner, PlanRunner
from .capture import Recorder
from .compare import FACTOR, dtype_name, max_abs_error, noise_floor, scale_of
from .explanation import Explanation, InputFinding, LayerPoint, NodeError, StepData
from .layers import OUTPUT, assign_layers
from .record_resolution import (class_ref, load_record, resolve_engine_class,
                                resolve_record_package, step_to_examine, steps_decided)


def explain_record(record_or_path, *, engine=None, package=None, step: int | None = None,
                   factor: float = FACTOR, component: str = "target") -> Explanation:
    """Explain one evidence record (an ``EvidenceRecord`` or a path to one).

    ``engine``: the engine class (or registered name, ``module:Class``); default the record's
    engine by name. ``package``: default the record's. ``step``: default the first failing
    step (a defect, a logits row out of tolerance or non-finite, an error). ``factor``: the
    noise floor's multiple of the measured spread."""
    record, path = load_record(record_or_path)
    if record.mode.kind != "greedy":
        raise InputError("explain rebuilds greedy forwards; this record is a speculative cell",
                         field="mode", value=record.mode.label,
                         remedy="explain the same engine's greedy record (lockstep run "
                                "--mode greedy), whose stream the speculative one must equal")
    if step is None:
        step, trigger = step_to_examine(record, "explain",
                                        ", or pass --step to compare a step anyway")
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


@dataclass
class _Component:
    """The explained component of the package: its graph, the roles of its inputs, its state
    cells and their dtypes."""
    spec: Any
    name: str
    model: Any
    roles: dict[str, str]
    graph_inputs: list[str]
    cells: list
    cell_dtypes: dict[str, np.dtype]

    @classmethod
    def of(cls, pkg, component: str) -> "_Component":
        spec = pkg.spec
        if component not in spec.components:
            raise InputError(f"package {spec.name!r} has no component {component!r}",
                             field="component", value=component,
                             remedy=f"use one of {', '.join(spec.components)}")
        roles = _roles(spec, component)
        graph_inputs = list(pkg.graph_inputs(component))
        unfed = [n for n in graph_inputs
                 if n not in roles or roles[n] in ("embeddings", "carry")]
        if unfed:
            raise InputError("explain rebuilds forwards fed by tokens, positions and state "
                             f"cells; component {component!r} also takes {unfed}",
                             field="component", value=component,
                             remedy="explain a greedy record of the target")
        cells = [c for c in spec.state.values() if c.component == component]
        return cls(spec, component, pkg.component_model(component), roles, graph_inputs,
                   cells, {c.input: dtype_of(c.dtype) for c in cells})

    def correct(self, runner) -> "_Correct":
        return _Correct(self.spec, self.name, runner, self.cell_dtypes)


@dataclass
class _CorrectRuns:
    """The forward as it should have run: the arbiter (float64) and the two runs that measure
    the noise floor (native float32, onnxruntime CPU), each on the correct feeds over its own
    recomputed state."""
    arb: Any
    arb_feeds: dict[str, np.ndarray]
    arb_state: _Correct
    f32: Any
    f32_feeds: dict[str, np.ndarray]
    f32_state: _Correct
    f32_runner: PlanRunner
    ort: Any = None  # None: onnxruntime could not run the component
    ort_feeds: dict[str, np.ndarray] | None = None

    @classmethod
    def of(cls, comp: _Component, fed: list[int], start: int, notes: list[str]) -> "_CorrectRuns":
        arb_runner = PlanRunner(comp.model, float64=True)
        f32_runner = PlanRunner(comp.model, float64=False)
        arb_state, f32_state = comp.correct(arb_runner), comp.correct(f32_runner)
        f32_feeds = f32_state.step_feeds(fed, start)
        arb_feeds = arb_state.step_feeds(fed, start)
        runs = cls(arb_runner.run(arb_feeds), arb_feeds, arb_state, f32_runner.run(f32_feeds),
                   f32_feeds, f32_state, f32_runner)
        try:
            ort_runner = OrtRunner(comp.model, runs.value_dtypes())
            runs.ort_feeds = comp.correct(ort_runner).step_feeds(fed, start)
            runs.ort = ort_runner.run(runs.ort_feeds)
        except Exception as exc:  # onnxruntime cannot run this graph (a bfloat16 MatMul, say)
            notes.append(f"onnxruntime could not run the component ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160]}); the floor is the native float32 "
                         f"spread alone")
        return runs

    def value_dtypes(self) -> dict[str, np.dtype]:
        return {k: v.dtype for k, v in self.f32.values.items()}

    def spreads(self, name: str, where: str = "values") -> list[float | None]:
        """How far the two floor runs are from the arbiter on ``name`` (None: not run)."""
        ref = getattr(self.arb, where).get(name)
        out = []
        for run in (self.f32, self.ort):
            got = None if run is None else getattr(run, where).get(name)
            out.append(None if got is None or ref is None else max_abs_error(got, ref)[0])
        return out


def _explain(record, path, cls, engine, pkg, step, trigger, factor, component):
    comp = _Component.of(pkg, component)
    prompt = list(record.prompt.ids)
    notes: list[str] = []
    recorder = Recorder(engine, component, target=step)
    result, exc = recorder.decode(prompt, step + 1, audit=cls.capabilities().logits_audit)
    reproduced = None
    if result is not None:
        reproduced = list(result.tokens[:step + 1]) == list(record.tokens[:step + 1]) or \
            list(result.tokens) == list(record.tokens[:len(result.tokens)])

    def base(**kw) -> Explanation:
        return Explanation(
            record=path, run_id=record.run_id, package=comp.spec.name,
            package_hash=pkg.content_hash, engine=record.engine, engine_class=class_ref(cls),
            prompt=prompt, step=step, trigger=trigger, component=component,
            state_formulation="recompute: one forward over the prefix before the step from "
                              "zero state (as the oracle computes), not the engine's cache",
            arbiter="the native executor in float64 on the host",
            floor_runs=["native float32", "onnxruntime CPU"], factor=factor,
            engine_error=None if exc is None else f"{type(exc).__name__}: {exc}",
            reproduced=reproduced, notes=notes, mode=record.mode.label,
            prompt_name=record.prompt.name, **kw)

    fwd = recorder.forward(step)
    if fwd is None:
        # no forward decided this step: a black box decoding by itself, or the stream ended
        if recorder.forwards or not cls.capabilities().decodes_itself or result is None:
            notes.append(f"the engine ran {len(recorder.forwards)} forward(s); none decided "
                         f"step {step}")
            return base(phase=None, positions=[0, 0], view="none", first_bad=None, inputs=[],
                        nodes=[], layers=[])
        return _explain_outputs(base, comp, prompt, result, step, factor, notes)

    # the prefix the engine fed, from its own tokens feeds
    tokens_in = comp.spec.components[component].inputs.get("tokens")
    fed = [int(t) for f in recorder.forwards[:step + 1]
           for t in np.asarray(f.feeds[tokens_in]).reshape(-1)]
    m = int(np.asarray(fwd.feeds[tokens_in]).size)
    start = len(fed) - m
    runs = _CorrectRuns.of(comp, fed, start, notes)
    floors: dict[str, float] = {}
    inputs = _compare_feeds(comp, fwd, runs, recorder, fed, step, factor)
    layers = assign_layers(comp.model, {c.input: c.input for c in comp.cells})
    view, nodes, engine_values = _compare_inside(comp, fwd, engine, runs, layers, factor,
                                                 floors, notes)
    nodes += _compare_outputs(comp, fwd, runs, factor, floors,
                              len(nodes) and nodes[-1].index + 1)
    first_bad = next((n for n in nodes if n.exceeds and n.where == "inside"), None) or \
        next((n for n in nodes if n.exceeds), None)
    expl = base(phase=fwd.phase, positions=[start, start + m], view=view, first_bad=first_bad,
                inputs=inputs, nodes=nodes, layers=_curve(nodes, layers))
    engine_feeds = fwd.plan_feeds if fwd.plan_feeds is not None else fwd.feeds
    expl.data = StepData(
        model=comp.model, component=component, history=fwd.history, phase=fwd.phase,
        correct_feeds=runs.f32_feeds, arbiter_feeds=runs.arb_feeds, engine_feeds=engine_feeds,
        arbiter=runs.arb, float32=runs.f32, engine_values=engine_values,
        engine_outputs=fwd.outputs, host_resolved=runs.f32_runner.plan.host_resolved,
        floors=floors)
    return expl


def _compare_feeds(comp: _Component, fwd, runs: _CorrectRuns, recorder, fed, step,
                   factor) -> list[InputFinding]:
    """The feeds the engine's executor saw that are out of their floor, each with where it
    went wrong (a state cell traced back to the forward that returned it wrong)."""
    engine_feeds = fwd.plan_feeds if fwd.plan_feeds is not None else fwd.feeds
    inputs: list[InputFinding] = []
    for name in comp.graph_inputs:
        if name not in engine_feeds:
            continue
        ref = runs.arb_feeds[name]
        spread = [max_abs_error(runs.f32_feeds[name], ref)[0],
                  None if runs.ort_feeds is None else max_abs_error(runs.ort_feeds[name], ref)[0]]
        floor = noise_floor(dtype_name(engine_feeds[name]), spread, factor)
        err, note = max_abs_error(engine_feeds[name], ref)
        if err <= floor:
            continue
        interp_err = max_abs_error(fwd.feeds[name], ref)[0]
        changed = fwd.plan_feeds is not None and \
            max_abs_error(fwd.plan_feeds[name], fwd.feeds[name])[0] != 0
        finding = InputFinding(name, comp.roles.get(name, "input"), err, floor,
                               interpreter_differs=interp_err > floor, engine_changed=changed,
                               note=note)
        cell = next((c for c in comp.cells if c.input == name), None)
        if cell is not None and finding.interpreter_differs:
            finding.origin = _state_origin(recorder, cell, fed, runs.arb_state,
                                           runs.f32_state, step, factor)
        inputs.append(finding)
    return inputs


def _compare_inside(comp: _Component, fwd, engine, runs: _CorrectRuns, layers, factor,
                    floors, notes) -> tuple[str, list[NodeError], dict[str, np.ndarray]]:
    """(view, nodes, the engine's values): every value the engine's executor computed against
    the arbiter's, in execution order, as far as the executor can be seen."""
    touches_map = {n: f"{r} ({n})" for n, r in comp.roles.items()}
    nodes: list[NodeError] = []

    def add(index, name, node, value):
        _add_node(nodes, index, name, node, value, runs, layers, touches_map, factor, floors)

    if fwd.observed is not None:
        for index, name in enumerate(fwd.observed.order):
            if name in runs.arb.values:
                add(index, name, fwd.observed.producer[name], fwd.observed.values[name])
        return "inside", nodes, fwd.observed.values
    if not _is_ort(engine):
        notes.append("the engine's executor is not visible from here: it is compared at its "
                     "component boundary (feeds and outputs) only")
        return "boundary", nodes, {}
    # onnxruntime: its session is not instrumented; the same graph is re-executed on
    # onnxruntime CPU with every intermediate as an output, on the engine's own feeds
    notes.append("onnxruntime's session cannot be observed: the component was re-executed "
                 "on onnxruntime CPU with every intermediate as a graph output, on the "
                 "feeds the engine was given")
    try:
        again = OrtRunner(comp.model, runs.value_dtypes()).run(fwd.feeds)
    except Exception as exc:
        notes.append(f"re-execution failed ({type(exc).__name__}); compared at the "
                     f"boundary only")
        return "inside (re-executed)", nodes, {}
    producer = {y: n for n in comp.model.graph.node for y in n.output if y}
    order = [k for k in runs.f32.order if k in again.values]
    for index, name in enumerate(order):
        if name in runs.arb.values:
            add(index, name, producer[name], again.values[name])
    return "inside (re-executed)", nodes, again.values


def _compare_outputs(comp: _Component, fwd, runs: _CorrectRuns, factor, floors,
                     first_index: int) -> list[NodeError]:
    """The component's outputs as the engine returned them (a corruption after the last node
    shows only there), noting a value the engine changed after its own forward."""
    if fwd.outputs is None:
        return []
    nodes = []
    outputs = comp.spec.components[comp.name].outputs
    for k, out_name in enumerate(o.name for o in comp.model.graph.output):
        if out_name not in fwd.outputs or out_name not in runs.arb.outputs:
            continue
        value, ref = fwd.outputs[out_name], runs.arb.outputs[out_name]
        err, note = max_abs_error(value, ref)
        sf, so = runs.spreads(out_name, "outputs")
        floor = noise_floor(dtype_name(value), [sf, so], factor)
        floors[out_name] = max(floors.get(out_name, 0.0), floor)
        if fwd.plan_outputs is not None and out_name in fwd.plan_outputs and \
                max_abs_error(value, fwd.plan_outputs[out_name])[0] != 0:
            own = "within" if max_abs_error(fwd.plan_outputs[out_name], ref)[0] <= floor \
                else "out of"
            extra = f"the engine changed it after its forward (its executor's own value is " \
                    f"{own} the floor)"
            note = f"{note}; {extra}" if note else extra
        role = next((r for r, n in outputs.items() if n == out_name), None)
        touches = [f"output {role}"] if role else []
        cell = next((name for name, c in comp.spec.state.items()
                     if c in comp.cells and c.output == out_name), None)
        if cell is not None:
            touches.append(f"state {cell} ({comp.spec.state[cell].kind})")
        nodes.append(NodeError(
            first_index + k, out_name, "", "output", None, OUTPUT, dtype_name(value),
            list(np.shape(value)), err, scale_of(ref), floor, sf, so, err > floor, "boundary",
            [], touches, note))
    return nodes


def _is_ort(engine) -> bool:
    return isinstance(engine, OrtCpuEngine)


def _add_node(nodes, index, name, node, value, runs: _CorrectRuns, layers, touches_map, factor,
              floors) -> None:
    arb = runs.arb
    err, note = max_abs_error(value, arb.values[name])
    sf, so = runs.spreads(name)
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


def _explain_outputs(base, comp: _Component, prompt, result, step, factor, notes):
    """A black box that decodes by itself: its logits row at ``step`` against the arbiter's
    last row over the same prefix (the oracle's formulation), floors as everywhere."""
    if result.logits is None or step >= len(result.logits):
        notes.append("the engine returned no logits row for this step")
        return base(phase=None, positions=[0, 0], view="none", first_bad=None, inputs=[],
                    nodes=[], layers=[])
    spec, model = comp.spec, comp.model
    prefix = prompt + list(result.tokens[:step])
    row = np.asarray(result.logits[step]).reshape(-1)
    logits_name = spec.components[comp.name].outputs["logits"]

    def last_row(runner):
        feeds = comp.correct(runner).step_feeds(prefix, 0)
        return np.asarray(runner.run(feeds, observe=False).outputs[logits_name])[0, -1]

    runs = {"arb": last_row(PlanRunner(model, True)), "f32": last_row(PlanRunner(model, False))}
    try:
        runs["ort"] = last_row(OrtRunner(model, {}))
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


__all__ = ["explain_record"]
