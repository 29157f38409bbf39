"""Divergence forensics (issue 15): ``explain`` names the planted node or layer of every
planted bug that lives inside a forward, stays silent on correct engines, and its repro packs
fail on the buggy engine and pass on a correct one (the generated test file run in a
subprocess, as an engine developer would run it)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engines.errors import InputError
from harness.evidence import EvidenceError
from harness.forensics import (explain_record, explain_run, explanation_html,
                               layer_curve_svg, load_explanations, save_layer_curve,
                               shrink_prompt, write_repro)
from harness.forensics.arbiter import OrtRunner, PlanRunner, float64_model
from harness.forensics.layers import assign_layers
from harness.runner import run_matrix
from suites.planted import engines as pe
from suites.planted.engines import K

TOKENS = 16


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """The first failing record of a planted engine on a package (one run per pair), as
    ``run_matrix([EngineClass], [package], None, 16, evidence_dir)`` writes it."""
    made: dict = {}

    def get(cls, package: str) -> Path:
        key = (cls.name, package)
        if key not in made:
            folder = tmp_path_factory.mktemp(f"ev-{cls.name}-{package}")
            summary = run_matrix([cls], [package], None, TOKENS, folder)
            failing = [c for c in summary.cells if c.failed]
            assert failing, f"{cls.name} on {package}: no failing cell to explain"
            made[key] = failing[0].record_path
        return made[key]

    return get


# -- explain names the planted node or layer -----------------------------------------------

def test_position_off_by_one_is_the_rotary_position_gather_of_layer_0(records):
    e = explain_record(records(pe.PositionOffByOne, "tiny_llama"), engine=pe.PositionOffByOne)
    fb = e.first_bad
    assert e.step == K and e.view == "inside"
    assert (fb.where, fb.layer, fb.label, fb.op) == ("inside", 0, "layer 0", "Gather")
    assert "position_ids" in fb.inputs and any(x.startswith("rope_") for x in fb.inputs)
    assert fb.error > fb.floor > 0 and fb.spread_f32 == 0
    [feed] = e.inputs
    assert feed.name == "position_ids" and feed.engine_changed and not feed.interpreter_differs


def test_dropped_kv_append_is_layer_0_attention_at_the_step_after(records):
    e = explain_record(records(pe.KvDropAppend, "tiny_llama"), engine=pe.KvDropAppend)
    fb = e.first_bad
    assert e.step == K + 1
    assert (fb.where, fb.layer, fb.op) == ("inside", 0, "Concat")
    assert {"past_key_0", "past_value_0"} & set(fb.inputs)
    assert any(t.startswith("state k0") or t.startswith("state v0") for t in fb.touches)
    names = [f.name for f in e.inputs]
    assert names[:2] == ["past_key_0", "past_value_0"]
    for feed in e.inputs:  # traced back to the step that wrote it, after a correct forward
        assert feed.interpreter_differs and not feed.engine_changed
        assert feed.origin["step"] == K and feed.origin["where"] == "boundary"


@pytest.mark.parametrize("bug, step", [(pe.LogitsFloat16, 0), (pe.PrefillWrongRow, 0)],
                         ids=["logits-float16", "prefill-wrong-row"])
def test_logits_corruption_is_the_output(records, bug, step):
    e = explain_record(records(bug, "tiny_llama"), engine=bug)
    fb = e.first_bad
    assert e.step == step
    assert (fb.where, fb.label, fb.name) == ("boundary", "output", "logits")
    assert "changed it after its forward" in fb.note
    assert not any(n.exceeds for n in e.nodes if n.where == "inside")
    assert e.inputs == []
    if bug is pe.LogitsFloat16:  # a float16 rounding: small, but far out of the floor
        assert fb.floor < fb.error < 0.05


def test_recurrent_state_lost_is_layer_0_recurrent_nodes(records):
    e = explain_record(records(pe.RecurrentStateLost, "hybrid_mtp"),
                       engine=pe.RecurrentStateLost)
    fb = e.first_bad
    assert e.step == K
    assert (fb.where, fb.layer) == ("inside", 0)
    assert {"conv_state_0", "rec_state_0"} & set(fb.inputs)
    changed = {f.name for f in e.inputs if f.engine_changed}
    assert {"conv_state_0", "rec_state_0"} <= changed


def test_stale_static_slot_is_layer_0_cache_write(records):
    e = explain_record(records(pe.StaleStaticSlot, "tiny_llama_static"),
                       engine=pe.StaleStaticSlot)
    fb = e.first_bad
    assert e.step == K + 1 and (fb.layer, fb.op) == (0, "Where")
    assert {"past_key_0", "past_value_0"} & set(fb.inputs)


@pytest.mark.parametrize("bug, package", [(pe.TokenSwap, "tiny_llama"),
                                          (pe.EarlyStop, "tiny_llama"),
                                          (pe.LastIndexTies, "tied_llama")],
                         ids=["token-swap", "early-stop", "last-index-ties"])
def test_bugs_outside_the_forward_leave_every_value_within_the_floor(records, bug, package):
    e = explain_record(records(bug, package), engine=bug)
    assert e.first_bad is None and e.view == "inside" and e.nodes
    assert all(not n.exceeds for n in e.nodes)
    assert "outside the forward" in e.summary


def test_errors_are_explained_up_to_the_failure(records):
    e = explain_record(records(pe.RaiseMidDecode, "tiny_llama"), engine=pe.RaiseMidDecode)
    assert e.step == K and "planted" in e.engine_error and e.first_bad is None
    e = explain_record(records(pe.WrongStateShape, "tiny_llama"), engine=pe.WrongStateShape)
    fb = e.first_bad
    assert (fb.where, fb.name) == ("boundary", "present_key_0")
    assert math.isinf(fb.error) and "shape" in fb.note


@pytest.mark.parametrize("package", ["tiny_llama", "tiny_llama_static", "hybrid_mtp"])
def test_correct_engines_stay_within_the_noise_floor(tmp_path, package):
    summary = run_matrix(["native-host", "ort-cpu", "onnx-reference"], [package], None, 6,
                         tmp_path, max_prompts=1)
    views = {}
    for cell in summary.cells:
        assert cell.status == "identical"
        e = explain_record(cell.record_path, step=4)
        views[cell.engine] = e.view
        assert e.first_bad is None and e.inputs == []
        assert max(p.max_ratio for p in e.layers) < 1
    assert views == {"native-host": "inside", "ort-cpu": "inside (re-executed)",
                     "onnx-reference": "boundary"}


class ShiftedBlackBox(pe.Planted):
    """A black box that decodes by itself (its forwards invisible: another engine inside)
    and shifts every logit of step K's row by 0.5: its tokens stay right, its row drifts."""
    name = "test-shifted-black-box"
    decodes_itself = True

    def generate(self, prompt, max_new_tokens: int, audit: bool = False):
        from engines.backends.native_host import NativeHostEngine
        from engines.workflow import greedy_decode

        self.reset_ledger()
        result = greedy_decode(NativeHostEngine(self.package), prompt, max_new_tokens,
                               audit=audit)
        if result.logits is not None and len(result.logits) > K:
            result.logits[K] = np.asarray(result.logits[K]) + np.float32(0.5)
        return result


def test_a_black_box_is_explained_by_its_logits_rows(records):
    e = explain_record(records(ShiftedBlackBox, "tiny_llama"), engine=ShiftedBlackBox)
    [node] = e.nodes
    assert (e.step, e.view, e.first_bad) == (K, "outputs", node)
    assert node.name == "logits[last row]" and abs(node.error - 0.5) < 1e-3 > node.floor


def test_a_run_manifest_given_as_a_record_is_named_with_a_record_to_give(tmp_path):
    summary = run_matrix(["native-host"], ["tiny_llama"], None, 2, tmp_path, max_prompts=1)
    [manifest] = (tmp_path / "runs").glob("*.json")
    with pytest.raises(InputError, match="run manifest") as err:
        explain_record(manifest)
    assert (err.value.field, err.value.value) == ("EVIDENCE_FILE", str(manifest))
    assert str(summary.cells[0].record_path) in err.value.remedy


def test_a_file_that_is_not_json_is_not_called_a_damaged_record(tmp_path):
    """A report or a log given instead of a record is not a record at all; a .json file that
    is not JSON is still a record cut short or damaged."""
    report = tmp_path / "report.html"
    report.write_text("<html></html>")
    with pytest.raises(InputError) as err:
        explain_record(report)
    assert (err.value.field, err.value.value) == ("EVIDENCE_FILE", str(report))
    assert err.value.remedy == "give one <evidence>/<cell>.json record"
    cut = tmp_path / "cell.json"
    cut.write_text('{"schema_version": ')
    with pytest.raises(EvidenceError, match="partial or corrupted"):
        explain_record(cut)


def test_the_other_outputs_are_the_kinds_their_writers_write():
    from harness import bench, calibrate, forward_bench, judge_bench
    from harness.evidence.other_outputs import OUTPUTS
    from harness.forensics import explanation

    assert set(OUTPUTS) == {m.KIND for m in (bench, forward_bench, judge_bench, calibrate,
                                              explanation)}


@pytest.mark.parametrize("module", ["harness.bench", "harness.forward_bench",
                                    "harness.judge_bench", "harness.calibrate"])
def test_a_json_another_command_wrote_is_named_for_what_it_is(tmp_path, module):
    """A bench or calibration JSON given as a record is no damaged record to delete: named by
    its kind, under EVIDENCE_FILE; in an evidence folder, report names it the same way."""
    import importlib

    from harness.evidence import read_evidence

    kind = importlib.import_module(module).KIND
    path = tmp_path / "out.json"
    path.write_text(json.dumps({"kind": kind, "rows": []}))
    with pytest.raises(InputError, match="not a cell's record") as err:
        explain_record(path)
    assert (err.value.field, err.value.value) == ("EVIDENCE_FILE", str(path))
    assert "delete" not in str(err.value)
    with pytest.raises(EvidenceError, match="result .*, not an evidence record") as err:
        read_evidence(path)
    assert "delete" not in str(err.value)


def test_a_record_whose_package_changed_names_its_content_hash_not_an_option(records,
                                                                            tmp_path):
    """The user gave no --package: the record's package.content_hash is what no package here
    matches, named as the record's field."""
    data = json.loads(records(pe.PositionOffByOne, "tiny_llama").read_text())
    stale = "sha256:" + "0" * 64
    data["package"]["content_hash"] = stale
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="not here as it was") as err:
        explain_record(path, engine=pe.PositionOffByOne)
    assert (err.value.field, err.value.value) == ("package.content_hash", stale)
    assert "--package" in err.value.remedy


def test_nothing_to_explain_is_an_input_error(tmp_path, records):
    from harness.evidence import read_evidence

    summary = run_matrix(["native-host"], ["tiny_llama"], None, 4, tmp_path, max_prompts=1)
    with pytest.raises(InputError, match="nothing to explain") as err:
        explain_record(summary.cells[0].record_path)
    assert "--step" in err.value.remedy
    pack = tmp_path / "pack"  # repro has no --step to advise, and makes no folder
    with pytest.raises(InputError, match="nothing to reproduce") as err:
        write_repro(summary.cells[0].record_path, pack)
    assert err.value.field == "status" and "--step" not in str(err.value)
    assert not pack.exists()
    record = read_evidence(records(pe.PositionOffByOne, "tiny_llama"))
    assert record.engine_class == "suites.planted.engines:PositionOffByOne"
    with pytest.raises(InputError, match="not registered here"):  # a record without the class
        explain_record(record.model_copy(update={"engine_class": None}))
    with pytest.raises(InputError, match="cannot be loaded here") as err:
        explain_record(record.model_copy(update={"engine_class": "gone.module:Engine"}))
    assert err.value.field == "--engine" and "No module named 'gone'" in str(err.value)


def test_speculative_records_are_refused(tmp_path):
    summary = run_matrix(["native-host"], ["tiny_llama_pair"], None, 4, tmp_path,
                         mode="speculative", widths=[2], max_prompts=1)
    with pytest.raises(InputError, match="greedy"):
        explain_record(summary.cells[0].record_path, step=1)


# -- the pieces ----------------------------------------------------------------------------

def _small_model() -> onnx.ModelProto:
    """x -> Cast(float16) -> Cast(float) -> Mul(c) -> Add(Constant value_float) -> y, with an
    integer Shape branch."""
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16, name="down"),
        helper.make_node("Cast", ["h"], ["u"], to=TensorProto.FLOAT, name="up"),
        helper.make_node("Mul", ["u", "c"], ["m"], name="scale"),
        helper.make_node("Constant", [], ["k"], value_float=0.5, name="half"),
        helper.make_node("Add", ["m", "k"], ["y"], name="add"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
    ]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        initializer=[numpy_helper.from_array(np.asarray(1 / 3, np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_plan_observe_sees_every_run_time_value_and_changes_nothing():
    from engines.native import NumpyArrayBackend, Plan

    plan = Plan(_small_model(), NumpyArrayBackend())
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    seen = []
    out = plan.run({"x": x}, observe=lambda node, name, value: seen.append(
        (node.name, name, np.asarray(value).copy())))
    plain = plan.run({"x": x})
    assert [s[1] for s in seen] == ["h", "u", "m", "y", "s"]  # the Constant: at build
    assert seen[0][2].dtype == np.float16 and seen[0][0] == "down"
    np.testing.assert_array_equal(out["y"], plain["y"])
    np.testing.assert_array_equal(seen[3][2], plain["y"])


def test_float64_arbiter_keeps_integer_arithmetic_and_widens_every_float():
    model = _small_model()
    wide = float64_model(model)
    assert model.graph.node[0].attribute[0].i == TensorProto.FLOAT16  # the input is untouched
    assert [a.i for n in wide.graph.node if n.op_type == "Cast" for a in n.attribute] == \
        [TensorProto.DOUBLE, TensorProto.DOUBLE]
    assert wide.graph.initializer[0].data_type == TensorProto.DOUBLE
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    arb = PlanRunner(model, float64=True).run({"x": x})
    f32 = PlanRunner(model, float64=False).run({"x": x})
    assert arb.outputs["y"].dtype == np.float64 and arb.outputs["s"].dtype == np.int64
    third = np.float64(np.float32(1 / 3))  # the initializer's value, widened exactly
    np.testing.assert_allclose(arb.outputs["y"], x.astype(np.float64) * third + 0.5, rtol=1e-15)
    assert np.abs(f32.outputs["y"] - arb.outputs["y"]).max() > 1e-5  # the float16 rounding
    ort = OrtRunner(model, {k: v.dtype for k, v in f32.values.items()}).run({"x": x})
    assert set(ort.values) >= {"h", "u", "m", "y", "s"}
    np.testing.assert_allclose(ort.values["m"], f32.values["m"], rtol=1e-6)


def test_layers_follow_per_layer_weights_state_cells_and_the_head():
    from harness.packages import resolve_package

    pkg = resolve_package("tiny_llama")
    model = pkg.component_model("target")
    cells = {c.input: k for k, c in pkg.spec.state.items()}
    layers = assign_layers(model, cells)
    by_op = {}
    for node in model.graph.node:
        by_op.setdefault(node.op_type, []).append(node)
    rope = [n for n in by_op["Gather"] if any(x.startswith("rope_") for x in n.input)]
    assert rope and all(layers.of(n.output[0]) == 0 for n in rope)
    for node in by_op["MatMul"]:
        for x in node.input:
            if x.startswith("wq_"):
                assert layers.of(node.output[0]) == int(x.split("_")[1])
    assert layers.count == 2
    assert layers.label(next(n for n in model.graph.node if n.name == "out_logits").output[0]) \
        == "head"
    hybrid = resolve_package("hybrid_mtp")
    hl = assign_layers(hybrid.component_model("target"),
                       {c.input: k for k, c in hybrid.spec.state.items()})
    for node in hybrid.component_model("target").graph.node:
        if "conv_state_1" in node.input:
            assert hl.of(node.output[0]) == 1


# -- repro packs ---------------------------------------------------------------------------

ACCEPTANCE = [(pe.PositionOffByOne, "tiny_llama", "inside"),
              (pe.KvDropAppend, "tiny_llama", "boundary"),
              (pe.LogitsFloat16, "tiny_llama", "boundary"),
              (pe.PrefillWrongRow, "tiny_llama", "boundary"),
              (pe.RecurrentStateLost, "hybrid_mtp", "inside")]


def _pytest(folders: list[Path], engine: str | None, junit: Path) -> dict[tuple[str, str], str]:
    """Run the packs' generated test files in one pytest subprocess (``engine``: the
    ``LOCKSTEP_REPRO_ENGINE`` override, None for each pack's own engine); returns
    {(test file stem, test name): passed | failed | skipped} from its JUnit XML."""
    import xml.etree.ElementTree as ET

    env = dict(os.environ)
    env.pop("LOCKSTEP_REPRO_ENGINE", None)
    env.pop("PYTEST_ADDOPTS", None)
    if engine:
        env["LOCKSTEP_REPRO_ENGINE"] = engine
    subprocess.run([sys.executable, "-m", "pytest", *map(str, folders), "-q",
                    "-p", "no:cacheprovider", "-p", "no:randomly", f"--junitxml={junit}"],
                   cwd=folders[0].parent, env=env, capture_output=True, text=True, timeout=600)
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        outcomes[(case.get("classname").rsplit(".", 1)[-1], case.get("name"))] = \
            {"failure": "failed", "error": "error"}.get(kind, kind)
    return outcomes


def test_repro_packs_fail_on_the_buggy_engine_and_pass_on_a_correct_one(records, tmp_path):
    """One pack per planted bug that lives inside a forward (and one outside it); the
    generated test files are run in a subprocess on each pack's own engine and on
    native-host, as an engine developer would run them."""
    packs = {}
    for bug, package, where in ACCEPTANCE:
        record = records(bug, package)
        pack = write_repro(record, tmp_path / bug.name, engine=bug, max_runs=24)
        m = pack.manifest
        for name in ("repro.json", "inputs.npz", "expected.npz", "engine_outputs.npz",
                     "engine_feeds.npz", "explanation.json", "layers.svg", "README.md",
                     "package/package.yaml"):
            assert (pack.folder / name).is_file(), (bug.name, name)
        assert m["engine"]["ref"] == f"suites.planted.engines:{bug.__qualname__}"
        assert m["engine"]["version"] and m["package"]["name"] == package
        assert m["subgraph"]["where"] == where and m["subgraph"]["nodes"], bug.name
        assert len(m["prompt"]["shrunk"]) <= len(m["prompt"]["original"])
        assert m["prompt"]["status"] == json.loads(Path(record).read_text())["status"]
        assert m["self_check"][m["engine"]["ref"]]["outcome"] == "fails", bug.name
        assert m["self_check"]["native-host"]["outcome"] == "passes", bug.name
        if bug is pe.KvDropAppend:  # cut where the engine wrote the cache, not where it shows
            assert m["step"]["index"] == K and m["subgraph"]["value"] == "present_key_0"
        packs[bug.name] = pack
    outside = write_repro(records(pe.TokenSwap, "tiny_llama"), tmp_path / "token-swap",
                          engine=pe.TokenSwap, max_runs=12, self_check=False)
    assert outside.manifest["subgraph"] is None
    assert "outside the forward" in outside.manifest["why"]
    assert not (outside.folder / "package").exists()
    packs[pe.TokenSwap.name] = outside

    folders = [p.folder for p in packs.values()]
    buggy = _pytest(folders, None, tmp_path / "buggy.xml")
    correct = _pytest(folders, "native-host", tmp_path / "correct.xml")
    for name, pack in packs.items():
        stem = pack.test_file.stem
        cut = pack.manifest["subgraph"] is not None
        assert buggy[(stem, "test_first_bad_value")] == ("failed" if cut else "skipped"), name
        assert buggy[(stem, "test_shrunk_prompt")] == "failed", name
        assert correct[(stem, "test_first_bad_value")] == ("passed" if cut else "skipped"), name
        assert correct[(stem, "test_shrunk_prompt")] == "passed", name


class OwnCounter(pe.Planted):
    """Counts its forwards itself, not in the ledger, and from its fourth on scales the
    logits: a defect in state the engine carries, which one forward of a fresh engine from
    correct inputs (the cut) cannot show."""
    name = "planted-own-counter"

    def __init__(self, package):
        super().__init__(package)
        self.calls = 0

    def corrupt(self, component, feeds, out, phase):
        self.calls += 1
        if self.calls > K:
            name = self.logits_name(component)
            out[name] = (out[name] * np.float32(1.5)).astype(out[name].dtype)
        return out


def test_a_cut_that_misses_the_defect_is_never_reported_as_passing(records, tmp_path, capsys):
    """The self-check ran only the cut: "self-check on ENGINE: passes" while the pack's
    tests failed on that engine (its decode of the shrunk prompt). It now runs both tests
    and its outcome is the pack's."""
    from harness.cli.repro import self_check_line

    pack = write_repro(records(OwnCounter, "tiny_llama"), tmp_path / "pack", engine=OwnCounter,
                       max_runs=8)
    checks = pack.manifest["self_check"]
    own = checks["suites.test_forensics:OwnCounter"]
    assert (own["cut"], own["decode"], own["outcome"]) == ("passes", "fails", "fails")
    assert checks["native-host"]["outcome"] == "passes"
    line = self_check_line("suites.test_forensics:OwnCounter", own)
    assert line.startswith("self-check on suites.test_forensics:OwnCounter: fails")
    assert "the cut does not reproduce the defect" in line


def test_shrinking_keeps_the_status_and_never_grows(records):
    from harness.packages import resolve_package

    pkg = resolve_package("tiny_llama")
    prompt = pkg.spec.prompts[1]
    got = shrink_prompt(pe.PositionOffByOne, pkg.root, prompt, TOKENS, max_runs=30)
    assert len(got.prompt) < len(prompt) and got.status in ("defect", "drift")
    assert got.runs <= 30
    kept = [entry for entry in got.log if entry["kept"]]
    assert kept[-1]["prompt"] == got.prompt
    assert all(entry["status"] == got.log[0]["status"] for entry in kept)


# -- the CLI, the run hook and the report fragment ------------------------------------------

def test_lockstep_explain_and_repro_cli(records, tmp_path, capsys):
    from harness.cli import main

    record = str(records(pe.PositionOffByOne, "tiny_llama"))
    ref = "suites.planted.engines:PositionOffByOne"
    assert main(["explain", record, "--engine", ref, "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["first_bad"]["label"] == "layer 0" and data["first_bad"]["op"] == "Gather"
    assert data["layers"][0]["label"] == "layer 0"
    assert main(["explain", record, "--engine", ref, "--plot", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "first value out of its noise floor" in out and "per-layer error" in out
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads(Path(record).read_text())["engine_class"] == ref
    assert main(["explain", record, "--json", "-"]) == 0  # the record names the class
    assert json.loads(capsys.readouterr().out)["engine_class"] == ref
    older = json.loads(Path(record).read_text())
    del older["engine_class"]  # a record written before the field: named by --engine
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert main(["explain", str(tmp_path / "older.json")]) == 2
    assert "--engine" in capsys.readouterr().err
    assert main(["repro", record, "--engine", ref, "-o", str(tmp_path / "pack"),
                 "--no-shrink", "--max-runs", "5"]) == 2  # a bound on a search not run
    err = capsys.readouterr().err
    assert "--max-runs" in err and "--no-shrink" in err and "Traceback" not in err
    assert not (tmp_path / "pack").exists()
    assert main(["repro", record, "--engine", ref, "-o", str(tmp_path / "pack"),
                 "--no-shrink"]) == 0
    out = capsys.readouterr().out
    assert "self-check on native-host: passes" in out and "pack:" in out


def test_explain_run_writes_explanations_the_report_can_embed(tmp_path):
    summary = run_matrix([pe.PositionOffByOne, "native-host"], ["tiny_llama"], None, 8,
                         tmp_path, max_prompts=1)
    from harness.evidence import read_evidence
    from harness.forensics import explain_and_print, explanation_for

    done = explain_run(summary, {pe.PositionOffByOne.name: pe.PositionOffByOne})
    assert len(done) == 1 and done[0].error is None and "layer 0" in done[0].summary
    assert done[0].plot.is_file() and done[0].explanation.is_file()
    loaded = load_explanations(tmp_path)
    entry = loaded[done[0].record.name]
    assert explanation_for(read_evidence(done[0].record), loaded) is entry
    lines = []
    again = explain_and_print(summary, ["native-host", pe.PositionOffByOne],
                              print_fn=lines.append)
    assert len(again) == 1 and lines[0].startswith("explain: planted-position-off-by-one")
    fragment = explanation_html(entry, prefix="x0")
    assert fragment.count("<svg") == 1 and 'id="x0-' in fragment and "Gather" in fragment


def test_layer_curve_plot_formats(records, tmp_path):
    e = explain_record(records(pe.KvDropAppend, "tiny_llama"), engine=pe.KvDropAppend)
    svg = layer_curve_svg(e, prefix="kv")
    assert svg.startswith("<svg") and "<!--" not in svg
    assert layer_curve_svg(e.to_dict(), prefix="kv2").startswith("<svg")
    assert save_layer_curve(e, tmp_path / "k.svg").read_text().lstrip().startswith("<?xml")
    curve = e.layer_curve()
    assert curve["labels"] == ["layer 0", "layer 1", "head", "output"]
    assert curve["first_bad"] == "layer 0"


def test_the_report_shows_each_explained_finding_with_its_layer_curve_and_repro(tmp_path):
    """``lockstep run --explain`` writes explanations and repro packs beside the records;
    ``lockstep report`` puts each one into its finding's article."""
    from harness.cli import main
    from harness.evidence import load_evidence_dir
    from reports.render import render_report

    ev = tmp_path / "ev"
    assert main(["run", "--engines", "suites.planted.engines:PositionOffByOne", "--packages",
                 "tiny_llama", "--max-new-tokens", "8", "--max-prompts", "1",
                 "--evidence-dir", str(ev), "--explain"]) == 1
    explained = load_explanations(ev)
    assert explained
    html = render_report(load_evidence_dir(ev), explanations=explained)
    assert "Where it starts (lockstep explain)" in html and "n_Gather_1" in html
    assert "repro pack" in html and "<svg" in html
