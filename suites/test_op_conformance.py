"""ONNX's own node test cases, run through the native executor's Backend adapter.

The cases come from ONNX's generators (``collect_testcases``; the data folder is not in the
wheel), kept in the cache once generated (``suites.onnx_node_cases``). A case is selected when its main op (the op of the single-node base case, also for
its ``_expanded`` function-body variants) has a kernel and every op in its model has one.
Each selected case must match the expected outputs: same dtype and shape, NaN at the same
positions, integers/bools/strings exactly, floats within the case's rtol/atol. A case that
fails for a known reason is listed in ``KNOWN_GAPS`` and marked xfail(strict=True); there
are no skips. The module prints a per-op tally and every gap/exclusion at its end.
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from engines.native.onnx_backend import NativeBackend
from engines.native.ops import KERNELS
from engines.native.plan import unsupported_ops
from harness.convert.onnx_graph import ALLOWED_OPS
from suites.onnx_node_cases import node_cases

# The ops a fixture (or a converted checkpoint, built by the same graph code) may use, as the
# graph builder enforces them: each must pass every node test. One list, not a copy of it.
FIXTURE_OPS = ALLOWED_OPS

# Ops that carry subgraphs: out of the executor's scope by design.
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})

# case name -> why it fails. Empty today: every selected case passes.
KNOWN_GAPS: dict[str, str] = {}


def _collect():
    started = time.perf_counter()
    cases = node_cases()
    return cases, time.perf_counter() - started


CASES, COLLECT_SECONDS = _collect()
_BY_NAME = {case.name: case for case in CASES}


def main_op(case) -> str:
    """The op a case tests: its own node, or for ``*_expanded*`` its base case's node."""
    name = case.name
    if "_expanded" in name:
        base = _BY_NAME.get(name[: name.index("_expanded")])
        if base is not None:
            return base.model.graph.node[0].op_type
    return case.model.graph.node[0].op_type


SELECTED, EXCLUDED = [], {}  # EXCLUDED: case name -> ops it needs that have no kernel
for _case in CASES:
    if main_op(_case) not in KERNELS:
        continue
    _missing = unsupported_ops(_case.model)
    if _missing:
        EXCLUDED[_case.name] = _missing
    else:
        SELECTED.append(_case)
SELECTED_NAMES = {case.name for case in SELECTED}
NOT_IMPLEMENTED = Counter(main_op(c) for c in CASES if main_op(c) not in KERNELS)

# Filled as cases run; printed at module teardown.
TALLY: dict[str, Counter] = defaultdict(Counter)
RUN_SECONDS = [0.0]


def _host(value):
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def _is_integer(dtype: np.dtype) -> bool:
    if dtype.kind in "biuO":
        return True
    try:
        ml_dtypes.iinfo(dtype)
    except (ValueError, TypeError):
        return False
    return True


def assert_matches(got, expected, rtol: float, atol: float, where: str = "output") -> None:
    if isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), f"{where}: sequence differs"
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_matches(g, e, rtol, atol, f"{where}[{i}]")
        return
    assert isinstance(got, np.ndarray), f"{where}: got {type(got).__name__}, not an array"
    assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{where}: shape {got.shape} != {expected.shape}"
    if _is_integer(expected.dtype):
        exact_got = got.astype(np.int64) if got.dtype.kind == "V" else got
        exact_exp = expected.astype(np.int64) if expected.dtype.kind == "V" else expected
        np.testing.assert_array_equal(exact_got, exact_exp, err_msg=where)
        return
    g, e = got.astype(np.float64), expected.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(e), err_msg=f"{where}: NaN positions")
    np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True, err_msg=where)


def _param(case):
    marks = ()
    if case.name in KNOWN_GAPS:
        marks = (pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[case.name]),)
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in SELECTED])
def test_node_case(case):
    op = main_op(case)
    TALLY[op]["ran"] += 1
    started = time.perf_counter()
    try:
        for inputs, expected in case.data_sets:
            outputs = NativeBackend.run_model(case.model, [_host(x) for x in inputs])
            assert len(outputs) == len(expected)
            for i, (got, want) in enumerate(zip(outputs, expected)):
                assert_matches(got, _host(want), case.rtol, case.atol, f"output {i}")
    except BaseException:
        TALLY[op]["gap" if case.name in KNOWN_GAPS else "failed"] += 1
        raise
    finally:
        RUN_SECONDS[0] += time.perf_counter() - started
    TALLY[op]["passed"] += 1


def test_fixture_ops_have_full_coverage_and_no_gaps():
    """Every fixture op has node tests, none of them a gap, and none excluded except
    function-body variants whose bodies need a subgraph op (out of scope)."""
    selected_ops = {main_op(c) for c in SELECTED}
    assert FIXTURE_OPS <= selected_ops, sorted(FIXTURE_OPS - selected_ops)
    gapped = sorted(n for n in KNOWN_GAPS if main_op(_BY_NAME[n]) in FIXTURE_OPS)
    assert not gapped, gapped
    bad = {n: ops for n, ops in EXCLUDED.items()
           if main_op(_BY_NAME[n]) in FIXTURE_OPS and not set(ops) & SUBGRAPH_OPS}
    assert not bad, bad


def test_known_gaps_name_selected_cases():
    stale = sorted(set(KNOWN_GAPS) - SELECTED_NAMES)
    assert not stale, f"KNOWN_GAPS entries that are not selected cases: {stale}"


def test_collection_is_complete_and_quick():
    # ONNX 1.23 generates ~1884 node cases; far fewer means the generators changed.
    assert len(CASES) > 1500, len(CASES)
    assert len(SELECTED) > 400, len(SELECTED)
    assert COLLECT_SECONDS < 30, COLLECT_SECONDS


class _TallyReport:
    """Prints the tally in pytest's terminal summary (registered while this module runs)."""

    def pytest_terminal_summary(self, terminalreporter):
        write = terminalreporter.write_line
        terminalreporter.section("ONNX node conformance (native executor)")
        write(f"{len(CASES)} cases collected in {COLLECT_SECONDS:.1f}s; {len(SELECTED)} "
              f"selected; the selected cases that ran took {RUN_SECONDS[0]:.2f}s")
        write(f"{'op':<18}{'ran':>5}{'passed':>8}{'gaps':>6}{'failed':>8}")
        for op in sorted(TALLY):
            t = TALLY[op]
            write(f"{op:<18}{t['ran']:>5}{t['passed']:>8}{t['gap']:>6}{t['failed']:>8}")
        total = sum(TALLY.values(), Counter())
        write(f"{'total':<18}{total['ran']:>5}{total['passed']:>8}{total['gap']:>6}"
              f"{total['failed']:>8}")
        for name, reason in sorted(KNOWN_GAPS.items()):
            write(f"gap: {name}: {reason}")
        for name, ops in sorted(EXCLUDED.items()):
            write(f"not selected: {name}: its model needs {', '.join(ops)} (no kernel)")
        write(f"not selected: {sum(NOT_IMPLEMENTED.values())} cases of "
              f"{len(NOT_IMPLEMENTED)} ops without a kernel")


@pytest.fixture(scope="module", autouse=True)
def _tally_report(request):
    manager = request.config.pluginmanager
    if not manager.has_plugin("lockstep-op-conformance-tally"):
        manager.register(_TallyReport(), "lockstep-op-conformance-tally")
    yield
