"""The exporter ops on native-cuda: the contrib cases of ``test_ops_contrib.py`` and the
Attention cases of ``test_ops_onnx.py`` (the same Hypothesis strategies) planned on the CuPy
backend, every output against native-host within the tolerance table, with the transfer
guard refusing any device-to-host read during the forward (the kernels read only shapes and
declared host inputs); the genai-builder-shaped graph of ``test_ops_genai.py`` through a
prefill and a decode step on its device cache; and claim 2 for GroupQueryAttention (a verify
block's rows are its decode steps' bits). ONNX's node cases for the ONNX-domain ops run on
the device in ``test_native_cuda.py`` (every selected case does).

The tests carry the ``gpu`` marker: they skip without CUDA and fail under ``--require-gpu``.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engines.ledger import Ledger
from engines.native.plan import Plan
from harness.compare import compare_tensors
from suites.test_ops_contrib import CASES, gqa_block_and_steps, gqa_block_params, run_native_host
from suites.test_ops_onnx import attention_cases

# the contrib families, and ONNX Attention as exports write it
DEVICE_CASES = {**CASES, "Attention": attention_cases}

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend(cp, stream):
    from engines.native.cupy_array_backend import CupyArrayBackend

    return CupyArrayBackend(stream, Ledger(), device_id=0)


def run_native_cuda(case, backend, stream) -> dict[str, np.ndarray]:
    """Plan and run on the device under the transfer guard (disallow), then read back."""
    import cupy

    from harness.transfer_guard import transfer_guard

    with stream:
        plan = Plan(case.model, backend, host_inputs=case.host_inputs)
    feeds = {name: (np.asarray(v) if name in case.host_inputs else backend.adopt(v))
             for name, v in case.feeds.items()}
    with stream, transfer_guard("disallow") as guard:  # the engine runs on its stream too
        result = plan.run(feeds)
    assert guard.staging_count == 0, guard.staging_sites
    for name in case.outputs:
        assert isinstance(result[name], cupy.ndarray), f"{case.label} {name} left the device"
    return {name: cupy.asnumpy(result[name], stream=stream) for name in case.outputs}


@pytest.mark.parametrize("family", sorted(DEVICE_CASES))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_export_op_on_the_device_matches_the_host(cp, stream, backend, family, data):
    case = data.draw(DEVICE_CASES[family](), label="case")
    want = run_native_host(case)
    got = run_native_cuda(case, backend, stream)
    for name, expected in want.items():
        actual = got[name]
        assert actual.dtype == expected.dtype, f"{case.label} {name}"
        result = compare_tensors(actual, expected, dtype=expected.dtype)
        assert result.ok, f"{case.label} {name}: {result.reason}"


def test_genai_style_graph_on_the_device_matches_the_host(cp, stream, backend):
    """The builder-shaped graph (``test_ops_genai.py``): prefill on an empty cache, then a
    decode step on the device cache it returned, nothing read back in between; logits and
    presents against native-host."""
    from harness.transfer_guard import transfer_guard
    from suites.test_ops_genai import (NEXT, PROMPT, genai_style_model, native_host_runner,
                                       prefill_and_decode)

    model = genai_style_model()
    with stream:
        plan = Plan(model, backend)
    assert not plan.host_inputs

    def run_device(feeds):
        adopted = {k: v if isinstance(v, cp.ndarray) else backend.adopt(v)
                   for k, v in feeds.items()}
        return plan.run(adopted)

    with stream, transfer_guard("disallow") as guard:
        got = prefill_and_decode(model, run_device, PROMPT, NEXT)
    assert guard.staging_count == 0, guard.staging_sites
    want = prefill_and_decode(model, native_host_runner(model), PROMPT, NEXT)
    from engines.tolerances import tolerance_for

    for phase, g, w in zip(("prefill", "decode"), got, want):
        for name, expected in w.items():
            actual = cp.asnumpy(g[name], stream=stream)
            tol = tolerance_for("float32").logits if name == "logits" else None
            result = compare_tensors(actual, expected, dtype="float32", tol=tol)
            assert result.ok, f"{phase} {name}: {result.reason}"


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(params=gqa_block_params())
def test_gqa_verify_block_rows_equal_decode_steps_on_the_device(cp, stream, backend, params):
    """Claim 2 for GroupQueryAttention on native-cuda: each row of a verify block is the
    decode step's bits, and the block agrees with native-host within the table."""
    from engines.native.array_backend import NumpyArrayBackend

    with stream:
        block, block_k, steps, step_k = gqa_block_and_steps(backend, params)
    block_h = cp.asnumpy(block, stream=stream)
    for j, out in enumerate(steps):
        assert block_h[:, j:j + 1].tobytes() == cp.asnumpy(out, stream=stream).tobytes(), j
    block_cache = cp.asnumpy(block_k, stream=stream)
    assert block_cache.tobytes() == cp.asnumpy(step_k, stream=stream).tobytes()
    host_block = gqa_block_and_steps(NumpyArrayBackend(), params)[0]
    result = compare_tensors(block_h, host_block, dtype="float32")
    assert result.ok, result.reason
