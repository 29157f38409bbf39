"""hf builds its model from the checkpoint, not from the converter's record.

If hf read the converter's record, a configuration field the converter ignores would be
ignored by both, and they would agree on a wrong model. The plant: a package that claims to
be converted from a checkpoint whose ``rms_norm_eps`` is 0.25 but was built as a converter
that ignores the field would build it (the default 1e-6). hf on that checkpoint disagrees
with the package and the verdict fails the cell; hf from the package's record (the old
behaviour, still the fallback) agrees with it, which is exactly the blind spot; a correct
conversion of the same checkpoint passes (the control).
"""
from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from engines.backends.checkpoint_source import (SEARCH_ENV, content_hash,  # noqa: E402
                                                find_checkpoint)
from engines.errors import EngineUnavailable  # noqa: E402
from engines.package import load_package  # noqa: E402
from engines.registry import get_engine_class  # noqa: E402
from harness.convert.conversion import convert  # noqa: E402
from harness.judgement import DEFECT, DRIFT, IDENTICAL  # noqa: E402
from harness.runner import run_matrix  # noqa: E402
from suites.convert_support import write_tiny_hf  # noqa: E402

TOKENS = 6
PROMPTS = [[1, 40, 7, 99, 250], [1, 3, 18, 200]]
EPS = 0.25


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The real checkpoint (rms_norm_eps 0.25) and, beside it, the copy a converter that
    ignores the field saw."""
    root = tmp_path_factory.mktemp("hfckpt")
    real = write_tiny_hf(root / "real", extra_config={"rms_norm_eps": EPS})
    seen = root / "seen"
    shutil.copytree(real, seen)
    config = json.loads((seen / "config.json").read_text())
    config["rms_norm_eps"] = 1e-6  # a converter that ignores the field models its default
    (seen / "config.json").write_text(json.dumps(config))
    return real, seen


def _claim_source(package_folder, checkpoint):
    """Point a package's record at ``checkpoint`` (name and content hash)."""
    path = package_folder / "checkpoint.json"
    record = json.loads(path.read_text())
    record["source"].update(file=checkpoint.name, content_hash=content_hash(checkpoint))
    path.write_text(json.dumps(record))


@pytest.fixture(scope="module")
def planted(checkpoints, tmp_path_factory):
    real, seen = checkpoints
    folder = convert(seen, tmp_path_factory.mktemp("planted") / "p").folder
    _claim_source(folder, real)
    return folder


@pytest.fixture(scope="module")
def control(checkpoints, tmp_path_factory):
    real, _ = checkpoints
    return convert(real, tmp_path_factory.mktemp("control") / "p").folder


def _statuses(package_folder, monkeypatch, checkpoints, evidence_dir):
    monkeypatch.setenv(SEARCH_ENV, str(checkpoints[0].parent))
    summary = run_matrix(["hf"], [str(package_folder)], PROMPTS, TOKENS,
                         evidence_dir=evidence_dir)
    return [c.status for c in summary.cells], summary


def test_the_checkpoint_is_found_by_content_not_by_name(planted, checkpoints, monkeypatch):
    real, seen = checkpoints
    monkeypatch.setenv(SEARCH_ENV, str(real.parent))
    assert find_checkpoint(planted, "hf").path == real
    monkeypatch.setenv(SEARCH_ENV, str(seen))  # right place, other bytes: refused
    with pytest.raises(EngineUnavailable) as err:
        find_checkpoint(planted, "hf")
    assert err.value.field == "checkpoint" and SEARCH_ENV in err.value.remedy


@pytest.mark.claim("token_identity", "logits_within_tolerance")
def test_hf_on_the_checkpoint_catches_a_field_the_conversion_ignored(planted, checkpoints,
                                                                     monkeypatch, tmp_path):
    statuses, summary = _statuses(planted, monkeypatch, checkpoints, tmp_path / "ev")
    # a wrong model, not a crash: tokens or logits outside tolerance of the oracle's
    assert statuses and all(s in (DEFECT, DRIFT) for s in statuses), statuses
    assert summary.failed
    records = [json.loads(p.read_text()) for p in (tmp_path / "ev").rglob("*.json")
               if p.name != "manifest.json" and "status" in json.loads(p.read_text())]
    assert {r["status"] for r in records} == set(statuses)


def test_hf_from_the_record_agrees_with_the_wrong_model(planted, monkeypatch):
    """The blind spot this closes: without the checkpoint, hf builds from the package's record
    and weights (the fallback, said in a warning and in its provenance) and agrees with it."""
    monkeypatch.delenv(SEARCH_ENV, raising=False)
    pkg = load_package(planted)
    with pytest.warns(UserWarning, match="building from the package's weights"):
        hf = get_engine_class("hf")(pkg)
    assert hf.provenance()["conversion"].startswith("the package's weights")
    summary = run_matrix([type(hf)], [str(planted)], PROMPTS[:1], TOKENS)
    assert [c.status for c in summary.cells] == [IDENTICAL]


@pytest.mark.claim("token_identity", "logits_within_tolerance")
def test_a_correct_conversion_of_the_same_checkpoint_passes(control, checkpoints, monkeypatch,
                                                             tmp_path):
    statuses, _ = _statuses(control, monkeypatch, checkpoints, None)
    assert statuses == [IDENTICAL] * len(PROMPTS), statuses
    hf = get_engine_class("hf")(load_package(control))
    source = hf.provenance()
    assert source["checkpoint"]["path"] == str(checkpoints[0])
    assert source["architecture"] == "LlamaForCausalLM"
    assert hf.model.config.rms_norm_eps == EPS



def test_the_fallback_refuses_a_record_it_cannot_rebuild():
    """Where the source checkpoint is gone, hf rebuilds plain Llama/Qwen2 from the package's
    record; a record with a feature that fallback cannot model (here rope scaling, or a
    Llama attention bias) makes hf unavailable rather than a second, wrong model that would
    agree with the converter."""
    from types import SimpleNamespace

    from engines.backends.hf_model import PLAIN_FEATURES, model_from_package
    from harness.convert.checkpoint import FEATURES, Architecture

    fields = Architecture.__dataclass_fields__
    assert PLAIN_FEATURES == {k: fields[k].default for k in FEATURES}  # one list, in step
    for extra in ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
                  {"attention_bias": True}):
        sidecar = {"architecture": {"family": "llama", "attention_bias": False, **extra}}
        with pytest.raises(EngineUnavailable) as err:
            model_from_package(SimpleNamespace(spec=SimpleNamespace()), sidecar, "eager",
                               "no checkpoint here")
        assert err.value.field == "architecture" and next(iter(extra)) in str(err.value)
