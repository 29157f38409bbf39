"""transformers' progress bars stay out of lockstep's output (issue 33): building the hf
engine from a Hugging Face folder ("Loading weights") or a GGUF ("Converting and
de-quantizing GGUF tensors...") prints no bar, and transformers' own switch is as it was."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("gguf")

from engines.backends import hf  # noqa: E402
from engines.backends.checkpoint_source import SEARCH_ENV  # noqa: E402
from engines.package import load_package  # noqa: E402
from harness.convert import convert  # noqa: E402
from suites.convert_support import write_tiny_gguf, write_tiny_hf  # noqa: E402


@pytest.mark.parametrize("kind", ["hf folder", "gguf"])
def test_building_hf_prints_no_progress_bar(kind, tmp_path, monkeypatch, capfd):
    from transformers.utils import logging as hf_logging

    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))  # no cached GGUF load
    monkeypatch.setattr(hf, "_GGUF_LOADED", {})
    if kind == "hf folder":
        source = write_tiny_hf(tmp_path / "hf")
    else:
        (tmp_path / "g").mkdir()
        source = write_tiny_gguf(tmp_path / "g" / "tiny.gguf")
    package = load_package(convert(source, tmp_path / "package").folder)
    monkeypatch.setenv(SEARCH_ENV, str(source if source.is_dir() else source.parent))
    hf_logging.enable_progress_bar()
    capfd.readouterr()
    engine = hf.HfEngine(package)
    err = capfd.readouterr().err
    assert engine.provenance()["checkpoint"]["path"] == str(source)
    assert "it/s" not in err and "%|" not in err, err
    assert hf_logging.is_progress_bar_enabled()  # the caller's setting, restored
