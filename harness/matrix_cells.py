"""The parity matrix as pytest tests: one test per planned cell (``lockstep run --devices``).

A pytest plugin, loaded with ``-p harness.matrix_cells`` into the session that
``harness.distributed.run_matrix_on_devices`` starts (and so imported by every xdist worker
before anything starts CUDA: importing it pins the worker to its GPU). The session's generated
test file holds one ``PackageCells`` subclass per package; each class's ``test_cell`` is
parametrized over that package's planned cells (``LOCKSTEP_MATRIX_PLAN``), and ``--dist
loadscope`` hands each class, whole, to one worker, which runs its cells in plan order: the
package's oracle cache serves every engine, one engine is loaded at a time. (Not ``--dist
loadgroup``: with pytest 9.2 its ``xdist_group`` grouping silently stops working, pytest-xdist
issue #1386, while a class scope does not depend on it.)

A test runs its cell with the worker's ``harness.runner.CellRunner``, which writes the cell's
evidence record; it fails when the cell fails and skips when the engine is unavailable, but
the verdicts the CLI reports come from the records.

A cell that kills its worker (a segfault, an abort in a driver) is not run twice: each test
marks its cell started first; xdist hands the rest of a dead worker's class to a new worker,
and a cell found already started there gets an ``error`` record (stage ``worker``) naming the
worker and GPU that died running it, and the package's other cells go on.
"""
from harness.distributed import pin_worker_gpu

pin_worker_gpu()  # first: before anything below can import CUDA

import functools  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from harness.cell_runner import CellRunner  # noqa: E402
from harness.cells import CellError  # noqa: E402
from harness.distributed import PLAN_ENV, MatrixPlan  # noqa: E402
from harness.oracle_choice import OracleAgreement  # noqa: E402
from harness.plan import CellSpec  # noqa: E402


@functools.lru_cache(maxsize=1)
def _plan() -> MatrixPlan:
    path = os.environ.get(PLAN_ENV)
    if not path:
        raise pytest.UsageError(f"{PLAN_ENV} names no plan: these tests are the cells of a "
                                f"`lockstep run --devices` run, which sets it")
    return MatrixPlan.read(path)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    package = getattr(metafunc.cls, "package", None)
    if "planned_cell" not in metafunc.fixturenames or package is None:
        return
    metafunc.parametrize("planned_cell", [pytest.param(c, id=c.test_id)
                                          for c in _plan().cells if c.package == package])


def _marker(cell: CellSpec) -> Path | None:
    work = _plan().work_dir
    if not work:
        return None
    index = _plan().cells.index(cell)
    return Path(work) / f"{index}.started"


@pytest.fixture(scope="session")
def cell_runner():
    """This worker's runner: its engines, judges and environment (the GPU it was pinned to)."""
    plan = _plan()
    checks = {name: OracleAgreement(**check) for name, check in (plan.oracle_checks or {}).items()}
    runner = CellRunner(plan.run_id, plan.mode, plan.max_new_tokens, Path(plan.evidence_dir),
                        oracle_engine=plan.oracle_engine, oracle_mode=plan.oracle_mode,
                        agreements=checks)
    yield runner
    runner.close()


class PackageCells:
    """The cells of one package (``package``); the generated test file subclasses it."""
    package: str

    def test_cell(self, planned_cell: CellSpec, cell_runner) -> None:
        """One planned cell: judged, recorded; fails when the cell fails."""
        c = planned_cell
        marker = _marker(c)
        if marker is not None and marker.exists():
            who = marker.read_text().strip()
            cell = cell_runner.failed(c, CellError("worker", "WorkerCrashed",
                                                   f"the process running this cell ({who}) "
                                                   f"died while running it; it is not run "
                                                   f"again"))
        else:
            if marker is not None:
                worker = os.environ.get("PYTEST_XDIST_WORKER", "?")
                gpu = os.environ.get("LOCKSTEP_GPU")
                marker.write_text(f"pytest-xdist worker {worker}"
                                  + (f" on GPU {gpu}" if gpu else ""))
            try:
                cell = cell_runner.run(c)
            except Exception as exc:  # outside the cell's own guards: still a record
                cell = cell_runner.failed(c, CellError.of("runner", exc))
        if cell.status == "unavailable":
            pytest.skip(f"{cell.engine} is unavailable here: {cell.reason}")
        if cell.failed:
            pytest.fail(f"{cell.status}: {cell.reason}", pytrace=False)
