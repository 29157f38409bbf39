"""``scripts/gpu_kernel_variants.py`` times kernel changes by undoing them in the .cu files
as the modules read them; its substitutions must still find their text, or the A/B it exists
for cannot run."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engines.native.kernel_catalog import cuda_modules

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gpu_kernel_variants as variants  # noqa: E402


def texts() -> dict[str, str]:
    """What every module compiles, by module."""
    return {name: module.text() for name, module in cuda_modules().items()}


@pytest.mark.parametrize("name", sorted(variants.VARIANTS))
def test_every_variant_applies_to_the_tree_and_base_is_the_tree(monkeypatch, name):
    before = texts()
    variants.apply(name, monkeypatch.setattr)
    after = texts()
    assert (after == before) == (name == "base")


def test_before_undoes_the_hardware_rounding_and_the_rolled_staging(monkeypatch):
    attention = cuda_modules()["attention"]
    assert "cvt.rn.bf16.f32" in attention.text()
    rolled = attention.text().count("#pragma unroll 1\n")
    variants.apply("before", monkeypatch.setattr)
    assert "cvt.rn.bf16.f32" not in attention.text()
    assert "cvt.rn.bf16.f32" not in cuda_modules()["gemv"].text()  # the prelude: every module
    assert attention.text().count("#pragma unroll 1\n") < rolled


def test_a_variant_whose_text_is_gone_stops_with_its_name(monkeypatch):
    monkeypatch.setitem(variants.VARIANTS, "stale", [("prelude.cuh", "no such text", "x")])
    with pytest.raises(SystemExit, match="stale"):
        variants.apply("stale", monkeypatch.setattr)


def test_the_verification_a_variant_times_is_the_width_the_bench_verifies(packages):
    # VERIFY_ROWS ids, one a row, the same from a second engine; three verify forwards ran at
    # one position (eager, captured and replayed on a device), after one prefill
    from engines.package import load_package
    from engines.registry import get_engine_class

    package = load_package(packages["tiny_llama"].root)
    prompt = list(package.spec.prompts[0])
    engine = get_engine_class("native-host")(package)
    ids = variants.verify_ids(engine, prompt)
    vocab = package.spec.vocab_size
    assert len(ids) == variants.VERIFY_ROWS == 8 and all(0 <= i < vocab for i in ids)
    assert engine.ledger.forwards["verify"] == 3 and engine.ledger.forwards["prefill"] == 1
    assert variants.verify_ids(get_engine_class("native-host")(package), prompt) == ids
