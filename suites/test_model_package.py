"""onnx-genai model packages (issue #38, item 1): ``fixtures/model_package.py``'s package
in the seed's format, imported (``engines.model_package``) and judged on every host engine.

Facts: every variant this machine can run becomes a lockstep package and the CUDA one is
left out with its reason; the static caches become static kv cells along the axis their
TensorScatter writes; the write index and sequence length the graph computes from the
positions are exactly what onnx-genai's driver feeds (step for step, bitwise on
onnxruntime); every variant is well-conditioned, and decodes identical to the oracle on
ort-cpu, onnx-reference and native-host (onnx-reference unavailable, by name, where a
variant uses onnxruntime's contrib ops); ``lockstep run --packages DIR`` takes the folder
itself; every declaration without a lockstep meaning is one line naming the file, field,
value and remedy.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import yaml

from engines.model_package import import_model_package
from engines.model_package.wrap import load_graph
from engines.package import load_package
from harness.catalog.conditioning import measure
from fixtures.model_package import VARIANTS, write_model_package
from harness.runner import run_matrix
from suites.support import HOST_ENGINES, one_line_error

ort = pytest.importorskip("onnxruntime")
CPU_VARIANTS = [name for name in VARIANTS if not name.startswith("cuda")]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_model_package(tmp_path_factory.mktemp("seedfmt") / "package")


@pytest.fixture(scope="module")
def imported(source, tmp_path_factory):
    return import_model_package(source, tmp_path_factory.mktemp("imported") / "out")


def test_every_variant_this_machine_runs_is_imported_and_the_cuda_one_left_out(imported):
    assert sorted(imported.imported) == sorted(f"model/{v}" for v in CPU_VARIANTS)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert "CUDAExecutionProvider" in imported.skipped["model/cuda-fp16"]
    for folder in imported.imported.values():
        origin = json.loads((folder / "model_package.json").read_text())
        assert origin["computed_in_graph"] == ["write_indices", "nonpad_kv_seqlen"]
        assert (folder / "tokenizer.json").is_file()


def test_static_caches_become_static_cells_along_the_scattered_axis(imported):
    package = load_package(imported.imported["model/cpu-rope"])
    spec = package.spec
    assert spec.max_context == VARIANTS["cpu-rope"].max_len == 24
    assert spec.bos_id == 2 and spec.eos_id == 3  # the genai_config's
    assert spec.components["target"].inputs == {"tokens": "input_ids",
                                                "positions": "position_ids"}
    assert sorted(spec.state) == ["k0", "k1", "v0", "v1"]
    for cell in spec.state.values():
        assert (cell.update, cell.seq_axis, cell.shape) == ("static", 1, [1, 24, 16])
    inputs = package.graph_inputs("target")
    assert "write_indices" not in inputs and "nonpad_kv_seqlen" not in inputs


def _driver_logits(model, prompt, steps, rope):
    """Greedy logits the way onnx-genai's driver feeds the original graph: write index =
    tokens so far, sequence length = that plus the step's tokens."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    def zeros(vi):  # the batch axis (symbolic) is 1
        dims = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        return np.zeros(dims, np.float32)
    caches = {i.name: zeros(i) for i in model.graph.input
              if i.name.startswith(("key_cache", "value_cache"))}
    tokens, rows, done = list(prompt), [], 0
    for _ in range(steps):
        new = tokens[done:]
        feeds = {"input_ids": np.array([new], np.int64), **caches,
                 "write_indices": np.array([done], np.int64),
                 "nonpad_kv_seqlen": np.array([done + len(new)], np.int64)}
        if rope:
            feeds["position_ids"] = np.arange(done, done + len(new), dtype=np.int64)[None]
        outs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        caches = {name: outs["updated_" + name] for name in caches}
        rows.append(outs["logits"][0, -1])
        done = len(tokens)
        tokens.append(int(np.argmax(rows[-1])))
    return rows


def _lockstep_logits(folder, prompt, steps):
    from engines.registry import get_engine_class
    from engines.workflow import greedy_decode

    engine = get_engine_class("ort-cpu")(load_package(folder))
    result = greedy_decode(engine, prompt, steps, audit=True)
    return [np.asarray(row) for row in result.logits]  # float64, exact for float32 rows


@pytest.mark.parametrize("variant", ["cpu", "cpu-rope"])
def test_the_computed_write_index_and_length_are_what_the_driver_feeds(source, imported,
                                                                      variant):
    prompt = [2, 9, 4, 17]
    original = load_graph(next((source / variant).glob("model.onnx*")))
    want = _driver_logits(original, prompt, 4, VARIANTS[variant].rope)
    got = _lockstep_logits(imported.imported[f"model/{variant}"], prompt, 4)
    assert len(got) == len(want) == 4
    for step, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(a, b.astype(np.float64), err_msg=f"step {step}")


@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_every_variant_is_well_conditioned(imported, variant):
    report = measure(imported.imported[f"model/{variant}"])
    assert report.ok, report.problems


def test_every_variant_decodes_identical_on_every_host_engine(imported):
    folders = [str(f) for f in imported.imported.values()]
    summary = run_matrix(list(HOST_ENGINES), folders, None, 8)
    assert summary.cells
    for cell in summary.cells:
        if cell.engine == "onnx-reference" and cell.package.endswith("cpu-fp16"):
            assert cell.status == "unavailable"
            assert "com.microsoft:SkipSimplifiedLayerNormalization" in cell.reason
        else:
            assert cell.status == "identical", (cell.package, cell.engine, cell.reason)


def test_lockstep_run_takes_the_model_package_folder(source, tmp_path, monkeypatch, capsys):
    from harness.cli import main

    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    status = main(["run", "--engines", "ort-cpu,native-host", "--packages", str(source),
                   "--max-new-tokens", "4", "--no-evidence"])
    out = capsys.readouterr().out
    assert status == 0, out
    for variant in CPU_VARIANTS:
        assert f"tiny-scatter-package-{variant}" in out
    assert "12 identical" in out


def test_import_package_command_writes_and_refuses_an_existing_output(source, tmp_path,
                                                                     capsys):
    from harness.cli import main

    out = tmp_path / "out"
    assert main(["import-package", str(source), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "model/cuda-fp16: left out" in text or "CUDA" not in text
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(
        f"tiny-scatter-package-{v}" for v in CPU_VARIANTS)
    line = one_line_error(capsys, ["import-package", str(source), "-o", str(out)])
    assert "-o names a folder that already holds" in line and "--force" in line
    (out / "earlier.txt").write_text("an earlier import")
    assert main(["import-package", str(source), "-o", str(out), "--force"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(
        f"tiny-scatter-package-{v}" for v in CPU_VARIANTS)
    assert not (out / "earlier.txt").exists() and list(tmp_path.iterdir()) == [out]


# -- bad packages: one line naming the file, the field, the value and the remedy -------------

def _copy(source, tmp_path):
    return shutil.copytree(source, tmp_path / "pkg")


def _edit_yaml(path, change):
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))


def _edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _variant(manifest):
    return manifest["components"]["model"]["variants"]


BAD = {
    "no schema version": (lambda p: _edit_json(p / "manifest.json",
                                               lambda m: m.pop("schema_version")),
                          "schema_version", None),
    "major version": (lambda p: _edit_json(p / "manifest.json",
                                           lambda m: m.update(schema_version="2.0")),
                      "schema_version", "2.0"),
    "escaping reference": (lambda p: _edit_json(p / "manifest.json", lambda m: _variant(m)[
        "cpu"].update(variant_directory="../cpu")),
        "components.model.variants.cpu.variant_directory", "../cpu"),
    "missing shared asset": (lambda p: shutil.rmtree(next((p / "shared_assets").iterdir())),
                             "components.model.variants.cpu-rope.executor_info.nxrt.tokenizer",
                             None),
    "no executor info": (lambda p: _edit_json(p / "manifest.json", lambda m: _variant(m)[
        "cpu"].update(executor_info={})), "components.model.variants.cpu.executor_info", []),
    "embeddings input": (lambda p: _edit_yaml(p / "cpu" / "inference_metadata.yaml",
                                              lambda d: d["model"]["io"].update(
                                                  inputs_embeds_input="embeds")),
                         "model.io.inputs_embeds_input", "embeds"),
    "borrowed cache": (lambda p: _edit_yaml(p / "cpu" / "inference_metadata.yaml",
                                            lambda d: d["model"]["io"].update(
                                                kv_ownership="shared")),
                       "model.io.kv_ownership", "shared"),
    "unknown io key": (lambda p: _edit_yaml(p / "cpu" / "inference_metadata.yaml",
                                            lambda d: d["model"]["io"].update(speculative=1)),
                       "model.io.speculative", 1),
    "workflow form": (lambda p: _edit_yaml(p / "cpu" / "inference_metadata.yaml",
                                           lambda d: d.update(pipeline={"workflow": {}})),
                      "pipeline", ["workflow"]),
    "unscattered cache": (lambda p: _edit_yaml(p / "cpu" / "inference_metadata.yaml",
                                               lambda d: d["model"]["io"]["static_cache"].update(
                                                   key_cache_outputs=["updated_value_cache.0"])),
                          "model.io.static_cache.key_cache_inputs[0]", "key_cache.0"),
    "wrong buffer length": (lambda p: _edit_yaml(p / "cpu" / "inference_metadata.yaml",
                                                 lambda d: d["model"].update(
                                                     max_sequence_length=99)),
                            "model.max_sequence_length", 99),
    "placeholder model": (lambda p: (p / "cpu" / "model.onnx.textproto").write_text(
        "ir_version: 0\n"), "model_file", None),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_declaration_without_lockstep_meaning_is_one_line(case, source, tmp_path, capsys):
    edit, field, value = BAD[case]
    package = _copy(source, tmp_path)
    edit(package)
    out = tmp_path / "out"
    line = one_line_error(capsys, ["import-package", str(package), "-o", str(out)])
    assert f"[field {field}" in line, line
    if value is not None:
        assert f"= {value!r}]" in line, line
    assert "remedy:" in line
    assert not out.exists()  # nothing half-written


def test_a_folder_without_a_manifest_is_named(tmp_path, capsys):
    line = one_line_error(capsys, ["import-package", str(tmp_path)])
    assert "[field DIR" in line and "manifest.json" in line


def test_a_graph_input_the_metadata_leaves_unbound_is_refused(source, tmp_path):
    """A graph input the metadata binds to nothing (cpu-rope's position_ids, undeclared)
    refuses the import, listing the unbound inputs, nothing written."""
    from engines.errors import PackageError

    package = _copy(source, tmp_path)
    _edit_yaml(package / "cpu-rope" / "inference_metadata.yaml",
               lambda d: d["model"]["io"].pop("position_ids_input"))
    with pytest.raises(PackageError) as info:
        import_model_package(package, tmp_path / "out")
    assert info.value.field == "graph.input" and info.value.value == ["position_ids"]
    assert not (tmp_path / "out").exists()


def test_the_original_graph_is_kept_node_for_node(source, imported):
    original = load_graph(source / "cpu-rope" / "model.onnx")
    wrapped = onnx.load(str(imported.imported["model/cpu-rope"] / "target.onnx"))
    prologue = [n for n in wrapped.graph.node if n.name.startswith("/lockstep/")]
    assert [n.op_type for n in wrapped.graph.node[len(prologue):]] == \
        [n.op_type for n in original.graph.node]


def test_one_package_reference_to_a_several_variant_model_package_names_them(source, tmp_path,
                                                                          monkeypatch):
    from engines.errors import PackageError
    from harness.packages import resolve_package

    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    with pytest.raises(PackageError) as info:
        resolve_package(str(source))
    assert info.value.field == "package" and "name one" in str(info.value)
    assert all(f"tiny-scatter-package-{v}" in info.value.remedy for v in CPU_VARIANTS)
