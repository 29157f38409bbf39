"""The greedy step's argmax kernel alone, in two trees on one machine (issue 12): the device
time of one row's argmax over SmolLM2's vocabulary (49152 float16 logits) as each tree
launches it, timed with CUDA events over back-to-back launches, and the ids both return.
Diagnostic only (the figure that counts is the decode step in ``lockstep bench``).

Usage (on a CUDA machine): python scripts/gpu_argmax_probe.py OLD_TREE NEW_TREE
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np

VOCAB = 49152
LAUNCHES = 2000


def _ops_module(tree: str, tag: str):
    """``engines/tensor_ops/cuda.py`` of ``tree``, imported under its own name."""
    spec = importlib.util.spec_from_file_location(f"argmax_{tag}",
                                                  f"{tree}/engines/tensor_ops/cuda.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _argmax(mod, cp):
    """The tree's float16 row argmax and whether it takes the int64 feed."""
    if hasattr(mod, "ARGMAX_MODULES"):  # the kernels in .cu files
        module = mod.ARGMAX_MODULES["float16"]
        return module.load(0)[module.instances[0]], True
    source = mod.kernel_source("float16")
    return cp.RawModule(code=source).get_function("lockstep_argmax_rows"), "out64" in source


def main(old: str, new: str) -> int:
    import cupy as cp

    sys.path.insert(0, new)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((1, VOCAB)).astype(np.float16)
    x = cp.asarray(logits).view(cp.uint16)
    want = int(np.argmax(logits[0]))
    stream = cp.cuda.Stream(non_blocking=True)
    for tag, tree in (("old", old), ("new", new)):
        mod = _ops_module(tree, tag)
        fn, takes_feed = _argmax(mod, cp)
        out = cp.empty((1,), cp.int32)
        feed = cp.empty((1, 1), cp.int64)
        extra = (feed,) if takes_feed else ()
        args = (x, np.int64(0), np.int32(VOCAB), out) + extra
        with stream:
            for _ in range(10):
                fn((1,), (mod.ARGMAX_BLOCK,), args)
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            for _ in range(LAUNCHES):
                fn((1,), (mod.ARGMAX_BLOCK,), args)
            stop.record(stream)
            stop.synchronize()
        us = cp.cuda.get_elapsed_time(start, stop) * 1e3 / LAUNCHES
        got = int(out.get(stream=stream)[0])
        print(f"{tag}: {us:.2f} us a launch (block {mod.ARGMAX_BLOCK}), id {got} "
              f"(numpy {want})")
        if got != want:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
