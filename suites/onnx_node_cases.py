"""ONNX's own node test cases, generated once per onnx and numpy version and kept in the
cache: the generators compute every expected output with numpy (12 s), and each pytest
worker collects ``test_op_conformance`` again. ``make fixtures`` writes the file
(``python -m suites.onnx_node_cases``); a missing or unreadable one is generated again.
"""
from __future__ import annotations

import os
import pickle
import uuid
import warnings
from pathlib import Path

import numpy as np
import onnx

from engines.cache_root import cache_root


def cases_path() -> Path:
    return (cache_root() / "onnx-node-cases" /
            f"onnx-{onnx.__version__}-numpy-{np.__version__}.pickle")


def generate() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow on purpose
        from onnx.backend.test.case.node import collect_testcases

        return list(collect_testcases(None))


def node_cases() -> list:
    """The cases, from the cache when it holds this version's (a file the tests themselves
    wrote: pickle is read from no other place), else generated and written there."""
    path = cases_path()
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except Exception:  # noqa: BLE001 - missing, cut short or from another Python: generate
        pass
    cases = generate()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
        with open(staged, "wb") as fh:
            pickle.dump(cases, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(staged, path)
    except OSError:
        pass  # a read-only cache: generated each time, as before
    return cases


if __name__ == "__main__":
    print(f"{len(node_cases())} ONNX node test cases in {cases_path()}")
