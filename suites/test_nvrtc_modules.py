"""Every CUDA module compiles with NVRTC (``suites/nvrtc_check.py``), as the GPU compiles it,
each instance its launcher names found: the catalog's modules and the launch programs of a
decode in each dtype. Where no NVRTC library is installed these skip, unless
``LOCKSTEP_REQUIRE_NVRTC`` is set (CI sets it: the test extra installs the library)."""
from __future__ import annotations

import dataclasses
import os

import pytest

from engines.native.kernel_catalog import cuda_modules
from engines.native.program_module import decode_ops, program_module
from scripts.gpu_persistent_bound import MODULE as PERSISTENT_BOUND
from suites.nvrtc_check import compile_with_nvrtc, nvrtc
from suites.support import kernel_folder

REQUIRE = "LOCKSTEP_REQUIRE_NVRTC"
MODULES = {**cuda_modules(),
           **{f"program-{dtype}": program_module(decode_ops(dtype))
              for dtype in ("bfloat16", "float32")},
           "program-float16-min8": program_module(decode_ops("float16"), 8),
           "persistent-bound": PERSISTENT_BOUND}  # scripts/: issue 37's probe, run on a GPU


@pytest.fixture(autouse=True)
def need_nvrtc():
    if nvrtc() is None:
        message = "no NVRTC library here (the test extra's nvidia-cuda-nvrtc)"
        if os.environ.get(REQUIRE):
            pytest.fail(f"{message}, and {REQUIRE} is set", pytrace=False)
        pytest.skip(message)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_compiles_with_nvrtc_with_every_instance(name):
    module = MODULES[name]
    compiled = compile_with_nvrtc(module)
    assert compiled.ok, compiled.log[-4000:]
    assert set(compiled.lowered) == set(module.instances)


def test_a_program_that_restores_global_with_push_macro_is_caught(tmp_path):
    """Planted: ``__global__`` saved and restored with ``#pragma push_macro``/``pop_macro``
    (nvcc honours them, NVRTC does not), so ``lk_program`` stays a device function."""
    folder = kernel_folder(tmp_path, ("program_head.cuh", "#undef __global__\n",
                                      '#pragma push_macro("__global__")\n#undef __global__\n'))
    tail = folder / "program_tail.cuh"
    spelled = "#define __global__ __attribute__((global))\n"
    assert tail.read_text().count(spelled) == 1
    tail.write_text(tail.read_text().replace(
        spelled, '#define __global__ __device__\n#pragma pop_macro("__global__")\n'))
    module = dataclasses.replace(program_module(decode_ops("float16")), folder=folder)
    compiled = compile_with_nvrtc(module)
    assert not compiled.ok  # lk_program, a device function, is no kernel to name (the
    # wording differs between NVRTC versions; both name the expression)
    assert "nv_mangled_name lk_program" in compiled.log
