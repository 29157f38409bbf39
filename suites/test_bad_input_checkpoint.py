"""Corrupt checkpoints and packages refused early and blaming the right party: before the
work they would waste (hashing, dequantizing, allocating tables), and as a package error
rather than an ``error`` cell on every engine. (The one-line form of each refusal is in
``test_bad_input_battery.py``.)"""
from __future__ import annotations

import pytest
import yaml

pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")

from engines.errors import InputError, PackageError  # noqa: E402
from engines.package import load_package  # noqa: E402
from engines.package.schema import MAX_CONTEXT_LIMIT  # noqa: E402
from harness.convert import context_room  # noqa: E402
from harness.convert.conversion import convert  # noqa: E402
from suites.convert_support import DIMS, write_tiny_hf  # noqa: E402


def _never(*args, **kwargs):
    raise AssertionError("reached work a refused checkpoint must not start")


def test_a_gemma_gguf_is_refused_by_name_before_it_is_hashed_or_parsed(tmp_path, monkeypatch):
    import gguf
    import numpy as np

    import harness.convert.conversion as convert_module
    from harness.convert import gguf_reader

    path = tmp_path / "gemma3.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(1)
    w.add_token_list([f"t{i}" for i in range(1000)])  # what makes the full parse slow
    w.add_tensor("token_embd.weight", np.zeros((1000, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    monkeypatch.setattr(convert_module, "checkpoint_hash", _never)
    monkeypatch.setattr(gguf_reader, "open_gguf", _never)
    with pytest.raises(InputError) as info:
        convert(path, tmp_path / "out")
    err = info.value
    assert (err.field, err.value) == ("general.architecture", "gemma3")
    assert "Hugging Face" in err.remedy and "config.json" in err.remedy
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_no_checkpoint_is_refused_before_it_is_hashed(tmp_path, monkeypatch):
    """``convert .`` in a repository (gigabytes of caches) named the folder only after hashing
    all of it: two minutes. The folder's kind is known from its listing."""
    import harness.convert.conversion as convert_module
    from engines.shipped_checkpoint import resolve_checkpoint

    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "big.bin").write_bytes(b"\0" * 1024)
    monkeypatch.setattr(convert_module, "checkpoint_hash", _never)
    with pytest.raises(InputError) as info:
        convert(folder, tmp_path / "out")
    assert info.value.field == "CHECKPOINT" and "config.json" in str(info.value)
    with pytest.raises(InputError) as info:
        resolve_checkpoint("")  # the current folder, unasked
    assert (info.value.field, info.value.value) == ("CHECKPOINT", "")


def test_max_context_past_the_format_limit_is_refused_before_anything_is_allocated(
        tmp_path, monkeypatch):
    import harness.convert.llama_graph
    import harness.convert.conversion as convert_module

    folder = write_tiny_hf(tmp_path / "hf")
    monkeypatch.setattr(convert_module, "checkpoint_hash", _never)
    monkeypatch.setattr(harness.convert.llama_graph, "rope_tables", _never)
    with pytest.raises(InputError) as info:
        convert(folder, tmp_path / "out", max_context=100_000_000)
    err = info.value
    assert (err.field, err.value) == ("--max-context", 100_000_000)
    assert str(MAX_CONTEXT_LIMIT) in err.remedy
    need = context_room.table_bytes(100_000_000, DIMS["head_dim"])
    assert f"{need / 2**30:.1f} GiB" in err.message


def test_max_context_whose_rotary_tables_exceed_free_memory_is_refused(tmp_path, monkeypatch):
    import harness.convert.llama_graph
    import harness.convert.conversion as convert_module

    folder = write_tiny_hf(tmp_path / "hf")
    free = 2**30
    monkeypatch.setattr(context_room, "available_memory", lambda: free)
    per_position = context_room.table_bytes(1, DIMS["head_dim"])
    fits = free // per_position
    asked = fits + 1
    with monkeypatch.context() as untouched:
        untouched.setattr(convert_module, "checkpoint_hash", _never)
        untouched.setattr(harness.convert.llama_graph, "rope_tables", _never)
        with pytest.raises(InputError) as info:
            convert(folder, tmp_path / "out", max_context=asked)
    err = info.value
    assert (err.field, err.value) == ("--max-context", asked)
    assert f"use {fits} or less" in err.remedy
    assert fits * per_position <= free < asked * per_position
    # a context that fits converts, under the same free memory
    assert load_package(convert(folder, tmp_path / "ok", max_context=64).folder)


@pytest.fixture
def converted(tmp_path):
    """A tiny conversion whose rotary tables hold 16 positions."""
    folder = write_tiny_hf(tmp_path / "hf")
    return convert(folder, tmp_path / "pkg", max_context=16).folder


def _set_max_context(folder, value: int) -> None:
    path = folder / "package.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["max_context"] = value
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_rope_table_shorter_than_max_context_is_a_package_error(converted):
    assert load_package(converted).spec.max_context == 16
    _set_max_context(converted, 32)
    with pytest.raises(PackageError) as info:
        load_package(converted)
    err = info.value
    assert (err.field, err.value) == ("max_context", 32)
    assert "target.onnx" in err.message and "16 rows" in err.message
    assert "max_context to 16" in err.remedy and "--max-context 32" in err.remedy
    _set_max_context(converted, 12)  # fewer positions than the table holds is fine
    assert load_package(converted).spec.max_context == 12


def test_truncated_external_data_is_a_package_error_before_any_engine_runs(converted):
    data = converted / "target.onnx.data"
    size = data.stat().st_size
    with open(data, "r+b") as fh:
        fh.truncate(size - 1)  # one byte short of the last initializer
    with pytest.raises(PackageError) as info:
        load_package(converted)
    err = info.value
    assert (err.field, err.value) == ("components.target.path", "target.onnx.data")
    assert "truncated" in err.message and f"holds {size - 1} bytes" in err.message
    with open(data, "ab") as fh:
        fh.write(b"\0")
    assert load_package(converted)


def test_a_truncated_safetensors_file_names_the_tensor_cut_short(tmp_path):
    from harness.convert.safetensors_file import read_header

    folder = write_tiny_hf(tmp_path / "hf")
    path = folder / "model.safetensors"
    header, _, data_bytes = read_header(path)
    last = max(header, key=lambda n: header[n]["data_offsets"][1])
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 4)
    with pytest.raises(InputError) as info:
        read_header(path)
    assert "truncated" in info.value.message and repr(last) in info.value.message
    assert info.value.field == f"model.safetensors {last}.data_offsets"
    assert header[last]["data_offsets"][1] == data_bytes  # the intact file ends there
