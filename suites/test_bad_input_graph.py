"""A package whose graph loads but fails during the forward (a Gather index out of range):
each cell of it is an ``error`` record with evidence, the matrix goes on with the next
package, and the commands that act on such a record answer in one line."""
from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from engines.errors import ExecutionError
from engines.package import load_package
from engines.registry import get_engine_class
from engines.workflow import greedy_decode
from harness.cli import main
from harness.evidence import load_evidence_dir


@pytest.fixture(scope="module")
def broken(packages, tmp_path_factory):
    """tiny_llama whose logits pass through a Gather with one index past the vocabulary."""
    folder = tmp_path_factory.mktemp("broken") / "broken"
    shutil.copytree(packages["tiny_llama"].root, folder)
    path = folder / "target.onnx"
    model = onnx.load(path)
    graph = model.graph
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name == "logits":
                node.output[i] = "logits_raw"
    vocab = packages["tiny_llama"].spec.vocab_size
    index = np.arange(vocab, dtype=np.int64)
    index[vocab // 2] = vocab + 5
    graph.initializer.append(numpy_helper.from_array(index, "broken_index"))
    graph.node.append(helper.make_node("Gather", ["logits_raw", "broken_index"], ["logits"],
                                       axis=2, name="broken_gather"))
    onnx.save(model, path)
    return folder


def test_the_forward_fails_naming_the_node(broken):
    engine = get_engine_class("native-host")(load_package(broken))
    with pytest.raises(ExecutionError) as info:
        greedy_decode(engine, [1, 17, 42], 2)
    assert "broken_gather" in str(info.value) and info.value.remedy


@pytest.fixture(scope="module")
def evidence(broken, tmp_path_factory):
    folder = tmp_path_factory.mktemp("evidence")
    status = main(["run", "--packages", f"{broken},lookup_chained", "--engines",
                   "native-host,ort-cpu", "--max-new-tokens", "2", "--max-prompts", "1",
                   "--evidence-dir", str(folder)])
    assert status == 1  # a failing cell, not bad input
    return folder


def test_every_cell_of_the_broken_package_is_an_error_record_and_the_matrix_goes_on(evidence):
    records = load_evidence_dir(evidence)
    by_package = {}
    for r in records:
        by_package.setdefault(r.package.name, []).append(r)
    assert {r.status for r in by_package["tiny_llama"]} == {"error"}
    assert len(by_package["tiny_llama"]) == 2
    assert all("broken_gather" in r.error.message for r in by_package["tiny_llama"])
    assert [r.status for r in by_package["lookup_chained"]] == ["identical", "identical"]


@pytest.mark.parametrize("command", ["explain", "repro"])
def test_explaining_an_error_record_is_one_line(evidence, command, capsys, tmp_path):
    record = next(p for p in sorted(evidence.glob("*tiny_llama*native-host*.json")))
    argv = [command, str(record)] + (["-o", str(tmp_path / "repro")] if command == "repro"
                                     else [])
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "error.stage" in err
