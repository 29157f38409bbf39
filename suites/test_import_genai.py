"""``lockstep import-genai`` and ``lockstep convert --builder onnxruntime-genai``.

Facts: the cached SmolLM2 fp32 build, imported from the command line, is a package whose
greedy streams on ort-cpu and native-host are identical to the oracle's (``lockstep run``
exits 0); ``convert smollm2 --builder onnxruntime-genai`` reaches the same build and wraps
it; every bad input (not a build, a build whose config or graph the wrapper does not
understand, an existing output folder, onnxruntime-genai missing, a flag only lockstep's
converter takes) is one line on stderr naming the field, exit 2.
"""
from __future__ import annotations

import contextlib
import io
import json

import onnx
import pytest
from onnx import TensorProto, helper

from harness.cli import main
from suites.genai_support import build, smollm2  # noqa: F401 - shared fixtures
from suites.support import one_line_error


def quiet_main(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


# -- a tiny stand-in build: enough for the checks that come before any weights ---------------

CONFIG = {"model": {"type": "llama", "vocab_size": 8, "bos_token_id": 1, "eos_token_id": 2,
                    "context_length": 16,
                    "decoder": {"filename": "model.onnx", "num_hidden_layers": 1,
                                "num_key_value_heads": 1, "head_size": 2,
                                "inputs": {"input_ids": "input_ids",
                                           "attention_mask": "attention_mask",
                                           "past_key_names": "past_key_values.%d.key",
                                           "past_value_names": "past_key_values.%d.value"},
                                "outputs": {"logits": "logits",
                                            "present_key_names": "present.%d.key",
                                            "present_value_names": "present.%d.value"}}}}


def tiny_build(folder, config=CONFIG, graph_outputs=("logits",)):
    """A folder with genai_config.json and a model.onnx whose inputs are the named ones and
    whose outputs are ``graph_outputs`` (each an Identity of the past key)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "genai_config.json").write_text(json.dumps(config))
    past = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, "p", 2])
            for n in ("past_key_values.0.key", "past_key_values.0.value")]
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "m"])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in graph_outputs]
    nodes = [helper.make_node("Identity", ["past_key_values.0.key"], [n]) for n in graph_outputs]
    graph = helper.make_graph(nodes, "tiny", [ids, *past], outs)
    onnx.save(helper.make_model(graph), str(folder / "model.onnx"))
    return folder


def test_a_folder_that_is_not_a_build_is_named(tmp_path, capsys):
    line = one_line_error(capsys, ["import-genai", str(tmp_path), "-o", str(tmp_path / "o")])
    assert "[field BUILD_FOLDER" in line and "genai_config.json" in line
    build = tiny_build(tmp_path / "b")
    (build / "model.onnx").unlink()
    line = one_line_error(capsys, ["import-genai", str(build), "-o", str(tmp_path / "o")])
    assert "[field model.decoder.filename = 'model.onnx']" in line and "remedy:" in line


def test_a_config_or_graph_the_wrapper_does_not_understand_names_what_it_found(tmp_path,
                                                                               capsys):
    inputs = dict(CONFIG["model"]["decoder"]["inputs"])
    del inputs["past_key_names"]
    config = {"model": {**CONFIG["model"],
                        "decoder": {**CONFIG["model"]["decoder"], "inputs": inputs}}}
    build = tiny_build(tmp_path / "b1", config)
    line = one_line_error(capsys, ["import-genai", str(build), "-o", str(tmp_path / "o")])
    assert "[field model.decoder.inputs" in line and "past_key_names" in line
    assert "found: attention_mask, input_ids, past_value_names" in line
    build = tiny_build(tmp_path / "b2")  # no present.0.key among the graph's outputs
    line = one_line_error(capsys, ["import-genai", str(build), "-o", str(tmp_path / "o")])
    assert "[field decoder.outputs = 'present.0.key']" in line and "found: logits" in line
    assert not (tmp_path / "o").exists()


def test_an_existing_output_folder_needs_force_and_never_the_build(tmp_path, capsys):
    build = tiny_build(tmp_path / "b")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    line = one_line_error(capsys, ["import-genai", str(build), "-o", str(taken)])
    assert f"[field -o = '{taken}']" in line and "--force" in line
    assert (taken / "notes.txt").read_text() == "mine"
    line = one_line_error(capsys, ["import-genai", str(build), "-o", str(tmp_path), "--force"])
    assert "[field -o" in line and "holds the build" in line
    assert (build / "model.onnx").is_file()  # the build survived
    line = one_line_error(capsys, ["import-genai", str(build), "-o", str(tmp_path / "o"),
                                   "--prompts-from", str(tmp_path / "nowhere")])
    assert "[field --prompts-from" in line


@pytest.mark.parametrize("missing", ["genai", "builder"])
def test_convert_without_onnxruntime_genai_says_how_to_install(monkeypatch, capsys, missing):
    from engines.backends import genai_build

    if missing == "genai":
        monkeypatch.setattr(genai_build, "genai_version", lambda: None)
    else:
        monkeypatch.setattr(genai_build, "missing_builder_modules", lambda: ["torch==2.13.0"])
    line = one_line_error(capsys, ["convert", "smollm2", "--builder", "onnxruntime-genai"])
    assert "[field --builder = 'onnxruntime-genai']" in line
    assert "pip install onnxruntime-genai" in line and "genai extra" in line
    said = line.split(" [field")[0]
    assert ("needs torch==2.13.0" in said) == (missing == "builder"), said


@pytest.mark.parametrize("flag", [["--draft-layers", "2"], ["--cache", "static"], ["--no-twin"],
                                  ["--max-context", "64"], ["--no-tokenizer"]])
def test_convert_refuses_a_flag_only_lockstep_s_converter_takes(capsys, flag):
    line = one_line_error(capsys, ["convert", "smollm2", "--builder", "onnxruntime-genai",
                                   *flag])
    assert f"[field {flag[0]} = '--builder onnxruntime-genai']" in line


# -- the real build -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def imported(build, smollm2, tmp_path_factory):
    folder = tmp_path_factory.mktemp("import") / "pkg"
    result = quiet_main(["import-genai", str(build.folder), "-o", str(folder),
                         "--prompts-from", str(smollm2.root)])
    return folder, result


@pytest.mark.real_checkpoint
def test_import_genai_wraps_the_build_with_progress(imported, build, smollm2):
    from engines.package import load_package

    folder, (status, out, err) = imported
    assert status == 0, err
    assert f"wrapped: {folder}" in out
    assert "copying model.onnx.data" in err and "checking the package" in err
    package = load_package(folder)
    assert [list(p) for p in package.spec.prompts] == [list(p) for p in smollm2.spec.prompts]
    origin = json.loads((folder / "genai_build.json").read_text())
    assert origin["key"] == build.record["key"]


@pytest.mark.real_checkpoint
@pytest.mark.claim("token_identity")
def test_the_imported_package_is_identical_on_ort_cpu_and_native_host(imported, tmp_path):
    folder, (status, _, err) = imported
    assert status == 0, err
    evidence = tmp_path / "evidence"
    status, out, err = quiet_main(["run", "--engines", "ort-cpu,native-host", "--packages",
                                   str(folder), "--max-prompts", "1", "--max-new-tokens", "4",
                                   "--strict", "--evidence-dir", str(evidence)])
    assert status == 0, out + err
    records = [json.loads(p.read_text()) for p in evidence.glob("*.json")]
    assert sorted((r["engine"], r["status"]) for r in records) == \
        [("native-host", "identical"), ("ort-cpu", "identical")], out


@pytest.mark.real_checkpoint
def test_convert_with_the_builder_reaches_the_same_build(build, tmp_path):
    from engines.package import load_package

    folder = tmp_path / "pkg"
    status, out, err = quiet_main(["convert", "smollm2", "--builder", "onnxruntime-genai",
                                   "-o", str(folder), "--name", "smol-genai"])
    assert status == 0, err
    assert "building SmolLM2" in err and f"wrapped: {folder}" in out
    package = load_package(folder)
    assert package.spec.name == "smol-genai" and package.spec.prompts
    assert json.loads((folder / "genai_build.json").read_text())["key"] == build.record["key"]
