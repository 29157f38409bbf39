"""What the onnxruntime-genai suites share: SmolLM2's float32 package (skipped where the
checkpoint is not installed; onnxruntime-genai must be, wherever `make real` ran) and the
builder's cached fp32 CPU build of the same checkpoint."""
from __future__ import annotations

import pytest


def smollm2_for_genai():
    pytest.importorskip("gguf", reason="make real (pip install gguf tokenizers)")
    from engines.package import load_package
    from engines.registry import get_engine_class
    from engines.shipped_checkpoint import INSTALL, smollm2_path
    from harness.convert.smollm2 import smollm2_package

    if smollm2_path() is None:
        pytest.skip(f"SmolLM2 is not installed: {INSTALL}")
    found = get_engine_class("ort-genai").availability()
    assert found.ok, f"onnxruntime-genai must be installed where make real ran: {found.reason}"
    return load_package(smollm2_package(cache="dynamic", dtype="float32"))


def genai_fp32_build(package):
    from engines.backends import genai_build
    from engines.backends.checkpoint_source import find_checkpoint

    return genai_build.ensure_build(find_checkpoint(package.root, "ort-genai"), "fp32", "cpu")


@pytest.fixture(scope="module")
def smollm2():
    """Fixture: ``smollm2_for_genai()`` once per module."""
    return smollm2_for_genai()


@pytest.fixture(scope="module")
def build(smollm2):
    """Fixture: the cached fp32 CPU build of SmolLM2's checkpoint."""
    return genai_fp32_build(smollm2)
