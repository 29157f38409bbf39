"""``write_repro``: the smallest package that still shows a defect, and a test that fails on
the buggy engine and passes on a correct one.

A repro pack is a folder:

    repro.json            what, where and how: the engine (name, class reference, version),
                          the package it came from (name, content hash, path), the source
                          record, the prompt (original and shrunk, with the shrink log), the
                          step (its phase and the engine's ledger before it), the cut value
                          (node, op, layer), what is compared and its noise floor, and the
                          self-check (the pack's tests on the buggy engine and on native-host)
    package/              a lockstep package whose one component is the cut-out subgraph,
                          with the original component's interface: the same graph inputs
                          (tokens, positions, every state cell) and state cells, so an engine
                          sees the same bindings as in the full package
    inputs.npz            the step's correct feeds (the arbiter's, in the engine's dtypes)
    expected.npz          the arbiter's float64 values of the compared outputs
    engine_outputs.npz    what the buggy engine produced for them when the pack was cut
    engine_feeds.npz      the feeds the buggy engine's executor saw at that step
    explanation.json      ``explain``'s finding at the cut step (and layers.svg, its curve)
    test_repro_<...>.py   the generated pytest file (runs standalone: ``python -m pytest DIR``
                          with lockstep installed; ``LOCKSTEP_REPRO_ENGINE=native-host`` runs
                          it on another engine, where it must pass)

The subgraph is the first value out of the noise floor (a node's output, or a component
output as the engine returned it) with its producer node, and that node's producers only as
far as shape arithmetic goes (values the executor must resolve on the host); every other
input of the node is *stored*: an initializer holding the arbiter's value in the engine's
dtype. State cells the cut does not compute pass their input through (an ``Identity``).

Which step is cut: the explained step, unless its finding is a state cell the engine made
wrong at an earlier step (a dropped KV append shows at the step after): then that earlier
step, where the engine itself produced the wrong value, so the pack fails on the engine
given correct inputs. Before cutting, the prompt is shrunk (``shrink_prompt``).
"""
from __future__ import annotations

import importlib.util
import json
import re
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import helper, numpy_helper

from engines.errors import InputError
from engines.package import load_package
from engines.registry import describe_engines, lockstep_version
from harness.evidence import read_evidence
from harness.forensics.plot import save_layer_curve
from harness.runner import run_matrix

from .arbiter import to_host
from .compare import FACTOR
from .explain import explain_record
from .explanation import Explanation, jsonable
from .record_resolution import (class_ref, load_record, resolve_engine_class,
                                resolve_record_package, step_to_examine)

SCHEMA = 1


# -- shrinking the prompt --------------------------------------------------------------------

@dataclass
class ShrinkResult:
    prompt: list[int]
    original: list[int]
    status: str  # the status the shrunk prompt keeps
    first_step: int | None
    runs: int
    log: list[dict] = field(default_factory=list)


def shrink_prompt(engine_class, package_ref, prompt, max_new_tokens: int,
                  status: str | None = None, max_runs: int = 64) -> ShrinkResult:
    """Hypothesis-style shrinking of ``prompt``: delete chunks (halves, quarters, ... single
    ids), then lower each id (to 0, then by halving its distance to 0), keeping a candidate
    whenever the engine still fails with the same status against the oracle
    (``harness.runner.run_matrix`` on the engine class with ``prompts=[candidate]``). At most
    ``max_runs`` candidates are run. ``status``: the status to keep (default: the original
    prompt's own, run first)."""
    cache: dict[tuple[int, ...], tuple[str, int | None]] = {}
    log: list[dict] = []
    spent = [0]  # candidates actually run

    def budget_left() -> bool:
        return spent[0] < max_runs

    def run(candidate: list[int]) -> tuple[str, int | None] | None:
        key = tuple(candidate)
        if key in cache:
            return cache[key]
        if not budget_left():
            return None
        spent[0] += 1
        try:
            summary = run_matrix([engine_class], [str(package_ref)], [candidate],
                                 max_new_tokens, None)
            cell = summary.cells[0]
            got = (cell.status, cell.first_step)
        except InputError:  # a request the package refuses: not a candidate
            got = ("refused", None)
        cache[key] = got
        return got

    original = [int(t) for t in prompt]
    if status is None:  # learn the status to keep from the original prompt itself
        first = run(original)
        want = first[0] if first else "defect"
        log.append({"prompt": original, "status": want, "first_step": first[1] if first
                    else None, "kept": True})
    else:
        want = status
        cache[tuple(original)] = (status, None)
        log.append({"prompt": original, "status": want, "first_step": None, "kept": True,
                    "note": "the record's own status (not run again)"})
    current = list(original)

    def interesting(candidate: list[int]) -> bool:
        if not candidate or candidate == current:
            return False
        got = run(candidate)
        if got is None:
            return False
        ok = got[0] == want
        log.append({"prompt": list(candidate), "status": got[0], "first_step": got[1],
                    "kept": ok})
        return ok

    size = max(1, len(current) // 2)
    while size >= 1 and budget_left():
        i = 0
        while i < len(current) and budget_left():
            candidate = current[:i] + current[i + size:]
            if interesting(candidate):
                current = candidate
            else:
                i += size
        size //= 2
    for i in range(len(current)):  # then lower each id towards 0
        value = current[i]
        for lower in sorted({0, 1, value // 4, value // 2} - {value}):
            if lower >= value or not budget_left():
                continue
            candidate = list(current)
            candidate[i] = lower
            if interesting(candidate):
                current = candidate
                break
    final = cache.get(tuple(current), (want, None))
    return ShrinkResult(current, original, final[0], final[1], spent[0], log)


# -- cutting the subgraph --------------------------------------------------------------------

@dataclass
class Cut:
    model: onnx.ModelProto
    spec: dict
    feeds: dict[str, np.ndarray]
    compare: dict[str, dict]
    expected: dict[str, np.ndarray]
    engine_outputs: dict[str, np.ndarray]
    nodes: list[str]
    stored: list[str]


def _value_info(graph: onnx.GraphProto, name: str):
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if vi.name == name:
            return vi
    return None


_ELEM = {np.dtype(np.float32): onnx.TensorProto.FLOAT,
         np.dtype(np.float16): onnx.TensorProto.FLOAT16,
         np.dtype(np.float64): onnx.TensorProto.DOUBLE,
         np.dtype(np.int64): onnx.TensorProto.INT64, np.dtype(np.int32): onnx.TensorProto.INT32,
         np.dtype(np.bool_): onnx.TensorProto.BOOL}


def _elem(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return onnx.TensorProto.BFLOAT16
    return _ELEM[dtype]


def cut_subgraph(explanation: Explanation, spec, prompt: list[int]) -> Cut:
    """The subgraph around ``explanation.first_bad`` (see the module docstring)."""
    data = explanation.data
    bad = explanation.first_bad
    if data is None or bad is None:
        raise InputError("nothing to cut: the explanation names no value out of the floor",
                         field="first_bad", value=None,
                         remedy="cut a pack from an explanation with a first bad value")
    model = data.model
    graph = model.graph
    component = data.component
    comp = spec.components[component]
    cells = {k: c for k, c in spec.state.items() if c.component == component}
    nodes_all = list(graph.node)
    producer = {y: k for k, node in enumerate(nodes_all) for y in node.output if y}
    inits = {t.name: t for t in graph.initializer}
    graph_inputs = [vi for vi in graph.input if vi.name not in inits]
    input_names = {vi.name for vi in graph_inputs}
    target = bad.name
    if target not in producer:
        raise InputError(f"the value {target!r} is produced by no node of the component",
                         field="first_bad", value=target, remedy="cut another value")
    arb_values = dict(data.arbiter.values)
    arb_values.update(data.arbiter.outputs)
    f32_values = dict(data.float32.values)
    f32_values.update(data.float32.outputs)

    chosen: set[int] = set()
    used_inits: set[str] = set()
    stored: dict[str, np.ndarray] = {}

    def need(x: str) -> None:
        if not x or x in input_names or x in stored:
            return
        if x in inits:
            used_inits.add(x)
            return
        k = producer[x]
        if k in chosen:
            return
        observed = x in arb_values
        if observed and x not in data.host_resolved:
            like = f32_values.get(x)
            dtype = like.dtype if like is not None else np.asarray(arb_values[x]).dtype
            stored[x] = np.asarray(arb_values[x]).astype(dtype)
            return
        add(k)  # shape arithmetic (host-resolved) or a build-time constant: recompute it

    def add(k: int) -> None:
        chosen.add(k)
        for x in nodes_all[k].input:
            need(x)

    add(producer[target])
    nodes = [nodes_all[k] for k in sorted(chosen)]
    out_graph = helper.make_graph([], f"repro_{graph.name}", [], [])
    for node in nodes:
        out_graph.node.append(node)
    produced = {y for n in nodes for y in n.output if y}
    for vi in graph_inputs:
        out_graph.input.append(vi)
    for name in sorted(used_inits):
        out_graph.initializer.append(inits[name])
    for name, value in stored.items():
        out_graph.initializer.append(numpy_helper.from_array(value, name))

    value = np.asarray(arb_values[target])
    engine_dtype = np.asarray(f32_values.get(target, value)).dtype
    outputs: list[str] = []
    original = _value_info(graph, target) if target in {o.name for o in graph.output} else None
    out_graph.output.append(original if original is not None else helper.make_tensor_value_info(
        target, _elem(engine_dtype), list(value.shape)))
    outputs.append(target)
    for cell_name, cell in cells.items():
        if cell.output in outputs:
            continue
        if cell.output not in produced:
            out_graph.node.append(helper.make_node("Identity", [cell.input], [cell.output],
                                                   name=f"repro_passthrough_{cell_name}"))
        out_graph.output.append(_value_info(graph, cell.output))
        outputs.append(cell.output)

    roles_out: dict[str, str] = {}
    for role, name in comp.outputs.items():
        if name == target:
            roles_out[role] = name
    if not roles_out:
        if np.dtype(engine_dtype).kind == "f" or np.dtype(engine_dtype).name == "bfloat16":
            roles_out["carry"] = target
        else:
            out_graph.node.append(helper.make_node(
                "Cast", [target], ["repro_carry"], to=onnx.TensorProto.FLOAT,
                name="repro_carry_cast"))
            out_graph.output.append(helper.make_tensor_value_info(
                "repro_carry", onnx.TensorProto.FLOAT, list(value.shape)))
            roles_out["carry"] = "repro_carry"

    sub = helper.make_model(out_graph, opset_imports=list(model.opset_import),
                            ir_version=model.ir_version, producer_name="lockstep-repro")
    onnx.checker.check_model(sub)
    pkg_spec = {
        "format": 1,
        "name": re.sub(r"[^A-Za-z0-9_.-]+", "-", f"repro-{spec.name}")[:64],
        "description": (f"lockstep repro: {bad.label}, {bad.op} {bad.node or ''} -> "
                        f"{target!r}, cut from {spec.name} at step {explanation.step}"),
        "vocab_size": spec.vocab_size, "bos_id": spec.bos_id, "eos_id": spec.eos_id,
        "max_context": spec.max_context, "dtype": spec.dtype, "tokenizer": None,
        "prompts": [list(map(int, prompt))],
        "components": {component: {"path": f"{component}.onnx",
                                   "inputs": dict(comp.inputs), "outputs": roles_out}},
        "state": {k: _cell_dict(c) for k, c in cells.items()},
        "decoding": {"greedy": {}, "speculative": None},
    }
    arb_feeds = data.arbiter_feeds
    feeds = {}
    for vi in graph_inputs:
        like = data.correct_feeds[vi.name]
        feeds[vi.name] = np.asarray(arb_feeds[vi.name]).astype(like.dtype)
    floor = data.floors.get(target, bad.floor)
    kind = "f" if np.dtype(engine_dtype).name == "bfloat16" else np.dtype(engine_dtype).kind
    compare = {target: {"floor": float(floor), "dtype": np.dtype(engine_dtype).name if kind == "f"
                        else value.dtype.name,
                        "shape": list(value.shape), "error_at_cut": bad.error,
                        "spread_f32": bad.spread_f32, "spread_ort": bad.spread_ort}}
    engine_outputs = {}
    if bad.where == "boundary" and data.engine_outputs is not None:
        engine_outputs[target] = data.engine_outputs[target]
    elif target in data.engine_values:
        engine_outputs[target] = data.engine_values[target]
    return Cut(sub, pkg_spec, feeds, compare, {target: value.astype(np.float64)
                                               if value.dtype.kind == "f" else value},
               engine_outputs, [n.name or n.op_type for n in nodes], sorted(stored))


def _cell_dict(cell) -> dict:
    out = {"kind": cell.kind, "component": cell.component, "input": cell.input,
           "output": cell.output, "dtype": cell.dtype, "shape": list(cell.shape)}
    if cell.kind == "kv":
        out["seq_axis"] = cell.seq_axis
        out["update"] = cell.update
    return out


# -- the pack --------------------------------------------------------------------------------

@dataclass
class ReproPack:
    folder: Path
    manifest: dict
    explanation: Explanation | None
    test_file: Path

    @property
    def shrunk_prompt(self) -> list[int]:
        return self.manifest["prompt"]["shrunk"]


def engine_version(cls) -> str | None:
    """The engine's version: its registry listing's (lockstep's for built-ins, the plugin's
    distribution's), else the distribution of the module it comes from, else lockstep's."""
    try:
        for listing in describe_engines():
            if listing.engine_class is cls:
                return listing.version
    except Exception:
        pass
    top = cls.__module__.split(".")[0]
    try:
        dists = metadata.packages_distributions().get(top) or []
        if dists:
            return metadata.version(dists[0])
    except Exception:
        pass
    return lockstep_version()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()[:60] or "x"


def _choose_cut(record, explanation: Explanation, cls, pkg, factor: float
                ) -> tuple[Explanation | None, str]:
    """The explanation to cut from, and why (see the module docstring)."""
    if explanation.data is None:
        return None, ("the engine is seen only at its logits rows (a black box that decodes "
                      "by itself): there is no graph value to cut; the pack keeps the shrunk "
                      "prompt's decode test")
    if explanation.first_bad is None:
        if explanation.engine_error:
            return None, (f"the engine raised ({explanation.engine_error}) with every value "
                          f"before it within the floor: no value to cut")
        return None, ("every value of the forward is within its noise floor: the defect is "
                      "outside the forward, so there is no subgraph to cut; the pack keeps "
                      "the shrunk prompt's decode test")
    earlier = [f.origin["step"] for f in explanation.inputs
               if f.origin and f.origin.get("where") in ("boundary", "inside")
               and f.origin["step"] < explanation.step]
    if earlier:
        step = min(earlier)
        again = explain_record(record, engine=cls, package=pkg, step=step, factor=factor)
        if again.first_bad is not None:
            return again, (f"the state fed at step {explanation.step} was made wrong by the "
                           f"engine at step {step}: the pack cuts step {step}, where the "
                           f"engine produced it from correct inputs")
    wrong_feed = [f for f in explanation.inputs if f.interpreter_differs and not
                  (f.origin and f.origin.get("where") in ("boundary", "inside"))]
    if wrong_feed and not any(f.engine_changed for f in explanation.inputs):
        return None, (f"the interpreter fed {wrong_feed[0].name!r} wrong; the engine's forward "
                      f"is right on what it was given: no forward-level cut")
    return explanation, "the first value out of the noise floor at the explained step"


def write_repro(record_or_path, out_dir, *, engine=None, package=None, shrink: bool = True,
                max_runs: int = 64, factor: float = FACTOR, self_check: bool = True
                ) -> ReproPack:
    """Write a repro pack for an evidence record into ``out_dir`` (created; files in it are
    overwritten). ``engine``/``package`` as for ``explain_record``; ``shrink``: shrink the
    prompt first (at most ``max_runs`` candidate runs); ``self_check``: run the pack's tests
    in-process on the buggy engine and on native-host and record what they did
    (``_self_check``)."""
    record, source = load_record(record_or_path)
    step_to_examine(record, "reproduce")  # before the output folder is made
    cls = resolve_engine_class(engine, record.engine, record.engine_class)
    pkg = resolve_record_package(record, package)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    first = explain_record(record, engine=cls, package=pkg, factor=factor)
    max_new = max(len(record.tokens), len(record.reference.tokens) if record.reference else 0,
                  first.step + 1)
    prompt = list(record.prompt.ids)
    shrunk = ShrinkResult(prompt, prompt, record.status, first.step, 0, [])
    used_record, explanation = record, first
    if shrink:
        shrunk = shrink_prompt(cls, pkg.root, prompt, max_new, status=record.status,
                               max_runs=max_runs)
        if shrunk.prompt != prompt:
            with tempfile.TemporaryDirectory(prefix="lockstep-repro-") as tmp:
                summary = run_matrix([cls], [str(pkg.root)], [shrunk.prompt], max_new,
                                     Path(tmp))
                candidate = read_evidence(summary.cells[0].record_path)
            try:
                again = explain_record(candidate, engine=cls, package=pkg, factor=factor)
            except InputError:
                again = None
            if again is not None and (again.first_bad is not None or first.first_bad is None):
                used_record, explanation = candidate, again
    cut_from, why = _choose_cut(used_record, explanation, cls, pkg, factor)

    ref = class_ref(cls)
    manifest: dict = {
        "schema": SCHEMA,
        "engine": {"name": cls.name, "ref": ref, "version": engine_version(cls),
                   "availability": _availability(cls)},
        "package": {"name": pkg.spec.name, "content_hash": pkg.content_hash,
                    "path": str(pkg.root)},
        "source_record": {"path": source, "run_id": record.run_id, "status": record.status,
                          "step": first.step, "prompt": prompt},
        "prompt": {"original": prompt, "shrunk": list(used_record.prompt.ids),
                   "status": shrunk.status, "first_step": shrunk.first_step,
                   "runs": shrunk.runs, "max_new_tokens": max_new, "log": shrunk.log},
        "component": explanation.component,
        "why": why,
        "subgraph": None,
        "step": None,
        "compare": {},
        "explanation": explanation.summary,
    }
    for stale in ("inputs.npz", "expected.npz", "engine_outputs.npz", "engine_feeds.npz"):
        (out / stale).unlink(missing_ok=True)
    shown = cut_from or explanation
    shown.write(out / "explanation.json")
    if shown.layers:
        save_layer_curve(shown, out / "layers.svg")
    if cut_from is not None:
        cut = cut_subgraph(cut_from, pkg.spec, list(used_record.prompt.ids))
        folder = out / "package"
        folder.mkdir(exist_ok=True)
        for old in folder.glob("*.onnx"):
            old.unlink()
        with open(folder / f"{cut_from.component}.onnx", "wb") as fh:
            fh.write(cut.model.SerializeToString(deterministic=True))
        (folder / "package.yaml").write_text(
            yaml.safe_dump(cut.spec, sort_keys=False, default_flow_style=None, width=100))
        load_package(folder)  # the pack must be a valid package: fail here, not in the test
        np.savez(out / "inputs.npz", **cut.feeds)
        np.savez(out / "expected.npz", **cut.expected)
        np.savez(out / "engine_outputs.npz", **{k: to_host(v) for k, v in
                                                 cut.engine_outputs.items()})
        np.savez(out / "engine_feeds.npz", **{k: to_host(v) for k, v in
                                               cut_from.data.engine_feeds.items()})
        fb = cut_from.first_bad
        manifest["subgraph"] = {"value": fb.name, "node": fb.node, "op": fb.op,
                                "layer": fb.layer, "label": fb.label, "where": fb.where,
                                "nodes": cut.nodes, "stored": cut.stored}
        manifest["step"] = {"index": cut_from.step, "phase": cut_from.data.phase,
                            "positions": cut_from.positions,
                            "history": [list(h) for h in cut_from.data.history]}
        manifest["compare"] = cut.compare
    test_name = f"test_repro_{_slug(cls.name)}_{_slug(pkg.spec.name)}_" \
                f"step{(cut_from or explanation).step}.py"
    for old in out.glob("test_repro_*.py"):
        old.unlink()
    test_file = out / test_name
    test_file.write_text(TEST_TEMPLATE.format(
        engine=cls.name, package=pkg.spec.name, summary=explanation.summary.replace('"""', "'"),
        why=why), encoding="utf-8")
    (out / "README.md").write_text(_readme(manifest, test_name), encoding="utf-8")
    _write_manifest(out, manifest)
    if self_check and manifest["subgraph"] is not None:
        manifest["self_check"] = {r: _self_check(test_file, r)
                                  for r in dict.fromkeys([ref, "native-host"])}
        _write_manifest(out, manifest)
    return ReproPack(out, manifest, cut_from or explanation, test_file)


def _availability(cls) -> str | None:
    try:
        return cls.availability().reason
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _write_manifest(out: Path, manifest: dict) -> None:
    (out / "repro.json").write_text(json.dumps(jsonable(manifest), indent=2) + "\n",
                                    encoding="utf-8")


def _self_check(test_file: Path, ref: str) -> dict:
    """The pack's two tests run in-process on engine ``ref``, as ``python -m pytest DIR``
    runs them: ``cut``, the cut-out value from correct inputs against its floor
    (``test_first_bad_value``), and ``decode``, the whole decode of the shrunk prompt
    against the oracle (``test_shrunk_prompt``). ``outcome`` is the pack's: it fails where
    either fails. An engine whose defect lives in what it carries itself from forward to
    forward computes the cut right (a fresh engine, correct inputs) and still fails the
    decode: the cut does not reproduce it, and the outcome must not read "passes"."""
    spec = importlib.util.spec_from_file_location(f"_lockstep_repro_{abs(hash(ref))}",
                                                  test_file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        results = module.run_step(ref)
        cell = module.decode_shrunk(ref)
    except Exception as exc:
        return {"outcome": "error", "detail": f"{type(exc).__name__}: {exc}"}
    cut = "fails" if any(not v[0] <= v[2] for v in results.values()) else "passes"
    decode = "skipped" if isinstance(cell, str) else "fails" if cell.failed else "passes"
    return {"outcome": "fails" if "fails" in (cut, decode) else "passes", "cut": cut,
            "decode": decode,
            "decode_verdict": cell if isinstance(cell, str) else f"{cell.status}: {cell.reason}",
            "errors": {k: {"error": v[0], "floor": v[2], "note": v[1]}
                       for k, v in results.items()}}


def _readme(manifest: dict, test_name: str) -> str:
    sub = manifest["subgraph"]
    lines = [f"# lockstep repro: {manifest['engine']['name']} on {manifest['package']['name']}",
             "", manifest["explanation"], "", f"Cut: {manifest['why']}.", ""]
    if sub:
        lines += [f"The package in `package/` computes `{sub['value']}` ({sub['op']}, "
                  f"{sub['label']}) from stored inputs; `inputs.npz` feeds it as the engine "
                  f"was fed at step {manifest['step']['index']} ({manifest['step']['phase']}), "
                  f"`expected.npz` holds the arbiter's values.", ""]
    lines += ["Run it (lockstep installed):", "", "```sh", f"python -m pytest . -q",
              "LOCKSTEP_REPRO_ENGINE=native-host python -m pytest . -q   # a correct engine: "
              "passes", "```", "",
              f"Prompt: {manifest['prompt']['original']} shrunk to "
              f"{manifest['prompt']['shrunk']} ({manifest['prompt']['runs']} runs).", ""]
    return "\n".join(lines)


TEST_TEMPLATE = '''"""lockstep repro pack: {engine} on {package}.

{summary}

Cut: {why}.

Generated by ``lockstep repro``; runs standalone with lockstep installed:
``python -m pytest <this folder>``. The engine is the pack's (``repro.json``: engine.ref)
unless ``LOCKSTEP_REPRO_ENGINE`` names another (a registered name or ``module:Class``): on a
correct engine (native-host, ort-cpu) every test here passes.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
MANIFEST = json.loads((HERE / "repro.json").read_text(encoding="utf-8"))


def engine_ref() -> str:
    return os.environ.get("LOCKSTEP_REPRO_ENGINE") or MANIFEST["engine"]["ref"]


def _host(value):
    get = getattr(value, "get", None)
    if callable(get) and not isinstance(value, np.ndarray):
        value = get()
    return np.asarray(value)


def max_abs_error(value, reference):
    """(max |value - reference|, note): inf on a shape or non-finite mismatch."""
    x, ref = np.asarray(value), np.asarray(reference)
    if x.shape != ref.shape:
        return math.inf, f"shape {{tuple(x.shape)}}, expected {{tuple(ref.shape)}}"
    if x.size == 0:
        return 0.0, None
    xf, rf = x.astype(np.float64), ref.astype(np.float64)
    fx, fr = np.isfinite(xf), np.isfinite(rf)
    same = (np.isnan(xf) & np.isnan(rf)) | (~fx & ~fr & (xf == rf))
    bad = ~(fx & fr) & ~same
    if bad.any():
        return math.inf, f"{{int(bad.sum())}} non-finite entries differ"
    ok = fx & fr
    return (float(np.abs(xf[ok] - rf[ok]).max()) if ok.any() else 0.0), None


def run_step(ref: str | None = None) -> dict:
    """The cut-out forward on the engine, standing where it stood (its ledger's forwards
    before the step): {{value: (error vs the arbiter, note, noise floor)}}."""
    from engines.package import load_package
    from engines.registry import get_engine_class

    cls = get_engine_class(ref or engine_ref())
    engine = cls(load_package(HERE / "package"))
    try:
        ledger = engine.reset_ledger()
        for phase, count, positions in MANIFEST["step"]["history"]:
            for k in range(count):
                ledger.record_forward(phase, positions if k == 0 else 0, 0.0)
        with np.load(HERE / "inputs.npz") as data:
            feeds = {{k: engine.tensor_ops.adopt(np.array(data[k])) for k in data.files}}
        out = engine.run_component(MANIFEST["component"], feeds,
                                   phase=MANIFEST["step"]["phase"])
        results = {{}}
        with np.load(HERE / "expected.npz") as expected:
            for name, spec in MANIFEST["compare"].items():
                err, note = max_abs_error(_host(out[name]), expected[name])
                results[name] = (err, note, spec["floor"])
        return results
    finally:
        engine.close()


@pytest.mark.skipif(not MANIFEST.get("subgraph"), reason="no value to cut (see repro.json: why)")
def test_first_bad_value():
    """The cut-out value, computed by the engine from correct inputs, within the noise
    floor of the arbiter's."""
    sub = MANIFEST["subgraph"]
    for name, (err, note, floor) in run_step().items():
        assert err <= floor, (
            f"{{engine_ref()}}: {{sub['label']}} {{sub['op']}} {{sub['node']}} -> {{name!r}} at "
            f"step {{MANIFEST['step']['index']}}: error {{err:.3g}} vs noise floor {{floor:.3g}}"
            + (f" ({{note}})" if note else ""))


def decode_shrunk(ref: str | None = None):
    """The whole decode of the shrunk prompt on the engine against the oracle: its cell
    (``status``, ``reason``, ``failed``), or why it cannot run here (a string)."""
    package = MANIFEST["package"]
    try:
        from harness.packages import resolve_package
        from harness.runner import run_matrix
    except ImportError as exc:
        return f"lockstep's harness is not importable: {{exc}}"
    try:
        path = package.get("path")
        pkg = resolve_package(path if path and Path(path).is_dir() else package["name"])
    except Exception as exc:
        return f"the full package {{package['name']!r}} is not here: {{exc}}"
    if pkg.content_hash != package["content_hash"]:
        return f"package {{package['name']!r}} here is not the one the pack was cut from"
    from engines.registry import get_engine_class

    prompt = MANIFEST["prompt"]
    summary = run_matrix([get_engine_class(ref or engine_ref())], [str(pkg.root)],
                         [prompt["shrunk"]], prompt["max_new_tokens"], None)
    return summary.cells[0]


def test_shrunk_prompt():
    """The whole decode on the shrunk prompt: no failing verdict against the oracle."""
    cell = decode_shrunk()
    if isinstance(cell, str):
        pytest.skip(cell)
    assert not cell.failed, f"{{engine_ref()}} on prompt {{MANIFEST['prompt']['shrunk']}}: " \
                            f"{{cell.status}}: {{cell.reason}}"
'''
