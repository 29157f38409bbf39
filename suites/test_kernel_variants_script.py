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


def _attention_under(monkeypatch, name: str, fill: int,
                     descending: bool = False) -> list[bytes]:
    """rotary_kv_attention under variant ``name`` on the CPU emulator (SmolLM2's heads scaled
    down, two rows at 200 of 256 slots: scores in seven warps), fresh buffers filled with
    the byte ``fill``, threads in reverse order if ``descending``: its two caches' and its
    output's bytes; then attention's over those caches, of two rows and of twelve (a
    prefill's attention_rows)."""
    import numpy as np

    from engines.native.emulation import host_device
    from engines.native.emulation.host_device import emulated, to_device, to_host
    from engines.native.launch.attention import AttentionKernels

    pattern = host_device._garbage

    def garbage(shape, dtype):
        out = pattern(shape, dtype)
        out.view(np.uint8)[...] = fill
        return out

    with monkeypatch.context() as patch:
        patch.setattr(host_device, "_garbage", garbage)
        variants.apply(name, patch.setattr)
        kernels = emulated(AttentionKernels, descending=descending)
        rng = np.random.default_rng(5)
        f16 = np.float16

        def rand(*shape):
            return to_device(rng.standard_normal(shape).astype(f16))

        angles = np.arange(200, 202)[:, None] * (1e-2 * np.arange(64)[None] + 0.1)
        cos = to_device(np.cos(angles).astype(np.float32)[None, None])
        sin = to_device(np.sin(angles).astype(np.float32)[None, None])
        got = kernels.rotary_kv_attention(
            rand(1, 6, 2, 64), rand(1, 2, 2, 64), cos, sin, "halves", np.dtype(np.float32),
            None, None, np.dtype(f16), rand(1, 2, 256, 64), rand(1, 2, 256, 64),
            rand(1, 2, 2, 64), to_device(np.arange(200, 202, dtype=np.int64)[None]), 2, 3, 0.125,
            np.dtype(np.float32), stream=None)
        assert got is not None
        cache_k, cache_v = got[0], got[1]
        plain = [kernels.attention(rand(1, 6, rows, 64), cache_k, cache_v,
                                   to_device(np.arange(200, 200 + rows, dtype=np.int64)[None]),
                                   2, 3, 0.125, np.dtype(np.float32), stream=None)
                 for rows in (2, 12)]
        return [to_host(v).tobytes() for v in (*got, *plain)]


@pytest.mark.parametrize("name", sorted(variants.ABLATIONS))
def test_an_ablation_writes_every_output_it_is_timed_on(monkeypatch, name):
    # the decode that captures the graphs stops at a NaN row: an ablation whose caches or
    # output keep what a fresh buffer held (0x7B or 0xFF, a NaN) could not be timed
    import numpy as np

    first, second = (_attention_under(monkeypatch, name, fill) for fill in (0x7B, 0xFF))
    assert first == second
    assert all(np.isfinite(np.frombuffer(b, np.float16)).all() for b in first)
    assert first != _attention_under(monkeypatch, "base", 0x7B)  # it cut something


def test_an_ablation_that_leaves_a_cache_unwritten_is_caught(monkeypatch):
    # the planted one: the copying blocks store nothing (the first cutcopy, which the H100
    # could not time: its decode met a NaN row)
    monkeypatch.setitem(variants.VARIANTS, "storeless",
                        [("attention.cu", "        lk_rotary_kv_store<TX, TC, TO>(v, xk,",
                          "        if (v < 0) lk_rotary_kv_store<TX, TC, TO>(v, xk,")])
    assert _attention_under(monkeypatch, "storeless", 0x7B) \
        != _attention_under(monkeypatch, "storeless", 0xFF)


def test_trees_every_thread_finishes_keep_every_bit(monkeypatch):
    # treeall: each block tree summed (and maxed) by every thread in thread 0's order
    tree = _attention_under(monkeypatch, "base", 0x7B)
    assert _attention_under(monkeypatch, "treeall", 0x7B) == tree
    # threads run last to first: no thread reads a partial before every warp wrote it
    assert _attention_under(monkeypatch, "treeall", 0x7B, descending=True) == tree
    # the planted one: the warps' partials added last to first
    monkeypatch.setitem(variants.VARIANTS, "backwards", [
        ("attention.cu", variants._TREE_SUM,
         "    float total = 0.0f;\n"
         "    for (int w = warps - 1; w >= 0; --w) total += smem[w];\n"
         "    return total;")])
    assert _attention_under(monkeypatch, "backwards", 0x7B) != tree


def test_the_issue_scripts_default_variants_are_all_defined():
    # gpu_issue37.sh's variants step runs these on a device: a name the script does not
    # define would cost a device call to find out
    import re

    text = (Path(variants.__file__).parent / "gpu_issue37.sh").read_text()
    ablations = re.search(r"^ABLATIONS=([\w,]+)", text, re.MULTILINE).group(1)
    default = re.search(r"^VARIANTS=\$\{VARIANTS:-([\w,$]+)\}", text, re.MULTILINE).group(1)
    names = default.replace("$ABLATIONS", ablations).split(",")
    assert names[0] == "base" and set(ablations.split(",")) == variants.ABLATIONS
    assert [n for n in names if n not in variants.VARIANTS] == []
