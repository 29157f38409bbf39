"""llama.cpp's weights in plain CPU buffers: no extra buffer types (weight repacking, AMX).

At load ggml may move weights into "extra" buffer types: interleaved repacked layouts, and on
a CPU with AMX, AMX tiles. Its AMX matrix product segfaults on some hosts (seen here on x86
machines with ``amx_int8``: SIGSEGV in ``ggml_backend_amx_mul_mat`` at the first decode, in
the engine and in llama-server alike; llama.cpp issue 20824, closed without a fix), and each
extra buffer type is another kernel, so one GGUF would compute differently from host to host.
llama.cpp's model parameter ``use_extra_bufts`` turns them off (llama-server:
``--no-repack``). llama-cpp-python 0.3.36's ``Llama`` does not take it, so ``plain_llama``
hands its constructor default model parameters with it off.

On x86 a Q4_1 GGUF's weights (Q4_1, and a Q8_0 embedding) are never repacked, so where AMX
was not in play nothing changes: ggml's plain CPU kernels, the ones the bands were measured on.
"""
from __future__ import annotations

import threading
from typing import Any

SERVER_FLAG = "--no-repack"  # llama-server's switch for the same parameter
_LOADING = threading.Lock()  # the default is swapped for one construction at a time


def plain_llama(path: str, **options: Any):
    """``llama_cpp.Llama(path, **options)`` with ``use_extra_bufts`` off."""
    import llama_cpp.llama_cpp as lib
    from llama_cpp import Llama

    default = lib.llama_model_default_params

    def without_extra_buffers():
        params = default()
        params.use_extra_bufts = False
        return params

    with _LOADING:
        lib.llama_model_default_params = without_extra_buffers
        try:
            llama = Llama(path, **options)
        finally:
            lib.llama_model_default_params = default
    if llama.model_params.use_extra_bufts:  # a llama-cpp-python that builds them elsewhere
        raise RuntimeError("llama-cpp-python ignored use_extra_bufts = False")
    return llama
