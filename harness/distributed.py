"""The parity matrix over every GPU of a host, on pytest-xdist (``lockstep run --devices``).

The controller (this process) plans the cells exactly as ``run_matrix`` does, writes the run
manifest, then runs one pytest session in a subprocess over a generated parametrization of
those cells: ``-n <GPUs> --dist loadscope``, one xdist worker per GPU, every cell of one
package in one test class, a scope xdist keeps on one worker (so the package's oracle cache
serves all its engines; ``--dist loadgroup`` would be the natural choice, but with pytest 9.2
its grouping silently does nothing, pytest-xdist issue #1386), each test running one cell
(``harness.runner.CellRunner``) and writing its evidence record into
the one evidence folder (a cell that kills its worker gets an ``error`` record from the
worker that takes over, see ``harness.matrix_cells``). The controller then reads the records
back, writes an ``error`` record for any cell no worker got to (the session ended early), and
marks the manifest complete.

Pinning: ``LOCKSTEP_GPUS`` (set by the controller, or by ``scripts/gpu_run.sh`` for the GPU
suites) lists the GPUs as ``CUDA_VISIBLE_DEVICES`` values; ``pin_worker_gpu`` gives xdist
worker ``gw<i>`` the i-th of them by setting ``CUDA_VISIBLE_DEVICES`` before anything starts
CUDA (the root ``conftest.py`` and the ``harness.matrix_cells`` plugin call it on import).
Each worker holds a lock on its GPU for its lifetime, so a worker that replaces a crashed
one (xdist names it ``gw<n>``, n past the GPU count) takes the GPU that was freed.

Counters stay per process: the transfer guard, every engine's ledger and its counting
allocator live in the worker that ran the cell, and each record carries its own cell's
account; nothing here sums them across workers.

This module imports only the standard library and ``harness.plan`` at module level: the root
conftest imports it before CUDA may start.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.plan import CellSpec

GPUS_ENV = "LOCKSTEP_GPUS"          # the controller's GPU list, CUDA_VISIBLE_DEVICES values
GPU_ENV = "LOCKSTEP_GPU"            # the GPU this worker was pinned to
PINNED_ENV = "LOCKSTEP_GPU_PINNED"  # "<testrunuid>:<worker>" that pinned it (inherited pins)
COUNT_ENV = "LOCKSTEP_GPU_COUNT"    # override the number of visible GPUs (tests, odd hosts)
LOCKS_ENV = "LOCKSTEP_GPU_LOCKS"    # folder for the per-GPU worker locks
PLAN_ENV = "LOCKSTEP_MATRIX_PLAN"   # the plan file a matrix session runs
MAX_GPUS = 1024  # more than any host holds: a larger override is a typo, not a machine
SHIM = "test_lockstep_cells.py"

_HELD: list[int] = []  # lock file descriptors this process holds (until it exits)


# -- which GPUs ------------------------------------------------------------------------------

def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _count_gpus() -> int:
    """GPUs CUDA shows this process: CuPy's count, else ``nvidia-smi -L`` (restricted to
    ``CUDA_VISIBLE_DEVICES`` where set), else 0."""
    try:
        import cupy  # noqa: PLC0415 - optional

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver, no device
        pass
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    listed = sum(line.startswith("GPU ") for line in done.stdout.splitlines())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return min(listed, len(_split(visible))) if visible is not None else listed


def visible_gpus(environ: MutableMapping[str, str] | None = None,
                 count: Callable[[], int] = _count_gpus) -> list[str]:
    """The GPUs this process can see, in CUDA order, as the values a worker's
    ``CUDA_VISIBLE_DEVICES`` takes: this process's ``CUDA_VISIBLE_DEVICES`` entries where it is
    set, else the indices ``0..n-1`` (as ``nvidia-smi`` numbers them: workers use
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``). ``LOCKSTEP_GPU_COUNT`` overrides the count."""
    env = os.environ if environ is None else environ
    override = env.get(COUNT_ENV)
    if override is not None and override.strip():
        try:
            n = int(override)
        except ValueError:
            n = -1
        if not 0 <= n <= MAX_GPUS:
            from engines.errors import InputError

            raise InputError(f"the GPU count override is not a count (an integer from 0 to "
                             f"{MAX_GPUS})", field=COUNT_ENV, value=override,
                             remedy=f"unset {COUNT_ENV}, or set it to a count such as 2")
    else:
        n = count()
    if "CUDA_VISIBLE_DEVICES" in env:  # CUDA numbers the listed GPUs 0..n-1
        return _split(env["CUDA_VISIBLE_DEVICES"])[:max(n, 0)]
    return [str(i) for i in range(max(n, 0))]


def parse_devices(text: str | None, visible: Sequence[str]) -> list[str]:
    """``--devices``: ``all`` or a comma list of visible GPU indices -> the chosen GPUs (as
    ``CUDA_VISIBLE_DEVICES`` values). Bad input is an ``InputError`` naming ``--devices``."""
    from engines.errors import InputError

    shown = ", ".join(str(i) for i in range(len(visible))) or "none"
    where = f"{len(visible)} GPU(s) visible here (indices: {shown})"
    if text is None or not text.strip():
        raise InputError("--devices names no GPU", field="--devices", value=text,
                         remedy='write --devices all, or a comma list of GPU indices such as '
                                '--devices 0,1 (drop --devices to run in this process)')
    if text.strip() == "all":
        if not visible:
            raise InputError("no GPU is visible here", field="--devices", value=text,
                             remedy="drop --devices to run the matrix in this process, or run "
                                    "on a machine with CUDA (CuPy or nvidia-smi must see a GPU)")
        return list(visible)
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > len(visible):
        raise InputError(f"{len(parts)} GPUs asked for, but {where}", field="--devices",
                         value=text, remedy="--devices all runs on every visible GPU"
                         if visible else "drop --devices, or run on a machine with CUDA")
    chosen: list[int] = []
    for part in parts:
        if not re.fullmatch(r"\d+", part):
            raise InputError(f"{part!r} is not a GPU index", field="--devices", value=text,
                             remedy=f"write --devices all, or indices such as 0,1; {where}")
        index = int(part)
        if index >= len(visible):
            remedy = (f"use indices below {len(visible)}, or --devices all" if visible
                      else "drop --devices, or run on a machine with CUDA")
            raise InputError(f"GPU {index} is not visible: {where}", field="--devices",
                             value=text, remedy=remedy)
        if index in chosen:
            raise InputError(f"GPU {index} is named twice", field="--devices", value=text,
                             remedy="name each GPU once")
        chosen.append(index)
    return [visible[i] for i in chosen]


# -- pinning a worker -----------------------------------------------------------------------

def _claim(gpus: list[str], number: int, env: MutableMapping[str, str], worker: str) -> str:
    """The GPU worker ``gw<number>`` runs on: its own (the number-th) when free, else the
    first free one (a worker that replaces a crashed one). Free means no live worker of this
    test run holds its lock; without a test run id (or fcntl) the number-th, strictly."""
    run = env.get("PYTEST_XDIST_TESTRUNUID")
    try:
        import fcntl
    except ImportError:  # not POSIX
        fcntl = None  # type: ignore[assignment]
    if not run or fcntl is None:
        if number >= len(gpus):
            raise RuntimeError(f"pytest-xdist worker {worker} has no GPU: {GPUS_ENV} names "
                               f"{len(gpus)} ({','.join(gpus)}); run with -n {len(gpus)} or "
                               f"fewer")
        return gpus[number]
    base = Path(env.get(LOCKS_ENV) or tempfile.gettempdir())
    folder = base / f"lockstep-gpus-{re.sub(r'[^A-Za-z0-9_-]', '_', run)}"
    folder.mkdir(parents=True, exist_ok=True)
    start = number % len(gpus)
    for k in range(len(gpus)):
        gpu = gpus[(start + k) % len(gpus)]
        fd = os.open(folder / f"{re.sub(r'[^A-Za-z0-9_-]', '_', gpu)}.lock",
                     os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _HELD.append(fd)
        return gpu
    raise RuntimeError(f"pytest-xdist worker {worker} has no GPU: every GPU of {GPUS_ENV}="
                       f"{','.join(gpus)} is held by another worker of this run; run with "
                       f"-n {len(gpus)} or fewer")


def pin_worker_gpu(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Pin this process to its GPU before anything starts CUDA; the GPU chosen, or None.

    With ``LOCKSTEP_GPUS`` set: xdist worker ``gw<i>`` gets the i-th GPU of the list
    (``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless set, and
    ``LOCKSTEP_GPU`` for the evidence); a process that is no xdist worker is pinned only when
    the list has one GPU (an xdist controller runs no CUDA). A process started by a pinned
    worker inherits its pin. Without ``LOCKSTEP_GPUS`` nothing changes."""
    env = os.environ if environ is None else environ
    gpus = _split(env.get(GPUS_ENV))
    if not gpus:
        return None
    worker = env.get("PYTEST_XDIST_WORKER")
    stamp = f"{env.get('PYTEST_XDIST_TESTRUNUID', '')}:{worker or ''}"
    if env.get(PINNED_ENV) == stamp and env.get(GPU_ENV):
        return env[GPU_ENV]  # pinned already (this process, or the worker that started it)
    if worker is None:
        if len(gpus) != 1:
            return None
        chosen = gpus[0]
    else:
        match = re.fullmatch(r"gw(\d+)", worker)
        if match is None:
            return None
        chosen = _claim(gpus, int(match.group(1)), env, worker)
    env["CUDA_VISIBLE_DEVICES"] = chosen
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    env[GPU_ENV] = chosen
    env[PINNED_ENV] = stamp
    return chosen


def release_gpu_locks() -> None:
    """Drop the GPU locks this process holds (tests; a worker keeps its lock until exit)."""
    while _HELD:
        try:
            os.close(_HELD.pop())
        except OSError:
            pass


# -- the plan a matrix session runs ------------------------------------------------------------

@dataclass(frozen=True)
class MatrixPlan:
    run_id: str
    mode: str
    max_new_tokens: int
    evidence_dir: str
    cells: tuple[CellSpec, ...]
    work_dir: str = ""  # where a worker marks each cell it starts (see harness.matrix_cells)
    oracle_engine: str | None = None  # vetted by the controller before the session
    oracle_mode: str = "stream"
    oracle_checks: dict | None = None  # package -> its OracleAgreement, as a dict

    def write(self, path: Path) -> Path:
        data = asdict(self)
        path.write_text(json.dumps(data, indent=1))
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> "MatrixPlan":
        data = json.loads(Path(path).read_text())
        cells = tuple(CellSpec(**{**c, "ids": tuple(c["ids"])}) for c in data.pop("cells"))
        return cls(cells=cells, **data)


def generated_test_file(packages: list[str]) -> str:
    """The session's test file: one ``PackageCells`` class per package, in plan order."""
    lines = ['"""The planned cells of one lockstep run, one class per package (generated by',
             'harness.distributed; --dist loadscope keeps each class on one worker)."""',
             "from harness.matrix_cells import PackageCells", ""]
    used: set[str] = set()
    for package in packages:
        name = "Test_" + re.sub(r"\W", "_", package)
        while name in used:
            name += "_"
        used.add(name)
        lines += ["", f"class {name}(PackageCells):", f"    package = {package!r}", ""]
    return "\n".join(lines)


def _package_cost(package, cells: int) -> float:
    """A rough cost of a package's cells, to hand the largest classes out first (xdist gives
    each worker the next class in collection order): cells x ONNX nodes (a device engine's step
    is a launch per node), halved where every kv cache is static (device engines replay CUDA
    graphs there). Any failure to read the graphs: cells alone."""
    try:
        import onnx

        nodes = sum(len(onnx.load(str(f), load_external_data=False).graph.node)
                    for f in Path(package.root).rglob("*.onnx"))
        kv = [c for c in package.spec.state.values() if c.kind == "kv"]
        static = bool(kv) and all(c.update == "static" for c in kv)
    except Exception:
        return float(cells)
    return float(cells) * max(nodes, 1) * (0.5 if static else 1.0)


# -- the controller --------------------------------------------------------------------------

def _xdist_args() -> list[str]:
    """Keep the collection order of the classes (largest first) where xdist would re-sort
    them by test count (``--loadscope-reorder``, the default where xdist has the option)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("xdist.plugin")
        text = Path(spec.origin).read_text() if spec and spec.origin else ""
    except (ImportError, OSError, ValueError):
        text = ""
    return ["--no-loadscope-reorder"] if "--no-loadscope-reorder" in text else []


def require_xdist() -> None:
    import importlib.util

    from engines.errors import InputError

    if importlib.util.find_spec("xdist") is None:
        raise InputError("--devices runs the matrix on pytest-xdist, which is not installed",
                         field="--devices", remedy="pip install pytest-xdist (it comes with "
                                                   "lockstep's test extra: pip install "
                                                   "'lockstep[test]'), or drop --devices")


def session_env(devices: Sequence[str], plan_path: Path, locks: Path,
                base: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the matrix's pytest session: this one, less any pytest or xdist
    state of an enclosing session (which would pin or configure it wrongly), plus the GPU
    list, the plan, and lockstep itself on the path."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith(("PYTEST_", "LOCKSTEP_GPU"))}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root] + _split_path(env.get("PYTHONPATH")))
    env[GPUS_ENV] = ",".join(devices)
    env[PLAN_ENV] = str(plan_path)
    env[LOCKS_ENV] = str(locks)
    return env


def _split_path(text: str | None) -> list[str]:
    return [p for p in (text or "").split(os.pathsep) if p]


def _records_of(folder: Path, run_id: str) -> list[Path]:
    from harness.evidence.store import SUFFIX, _slug

    prefix = _slug(run_id) + "__"
    try:
        return sorted(p for p in folder.iterdir() if p.name.startswith(prefix)
                      and p.suffix == SUFFIX)
    except OSError:
        return []


def cell_from_record(record, path: Path | None):
    """A ``CellResult`` as the CLI's tables read it, from a record a worker wrote."""
    from harness.cells import CellError, CellResult
    from harness.judgement import StepJudgement

    div = record.divergence
    divergence = None if div is None else StepJudgement(
        div.step, div.engine_token, div.reference_token, div.rank, div.gap, div.verdict,
        div.reason or "")
    error = None if record.error is None else CellError(
        record.error.stage, record.error.type, record.error.message, record.error.step,
        list(record.error.traceback))
    tallies = {}
    if record.mode.kind != "greedy" and record.timings is not None:
        tallies = {k: getattr(record.ledger, k) for k in (
            "proposals", "accepted", "rejected", "rollbacks", "full_accepts", "snapshots",
            "restores")}
    timings = record.timings
    return CellResult(
        record.package.name, record.engine, record.prompt.name, list(record.prompt.ids),
        record.status, tokens=list(record.tokens),
        reference=list(record.reference.tokens) if record.reference is not None else [],
        divergence=divergence, reason=record.reason or "",
        tokens_per_s=timings.tokens_per_s if timings is not None else None,
        record_path=path, mode=record.mode.label,
        acceptance_per_round=list(record.acceptance_per_round), tallies=tallies,
        greedy_tokens=list(record.greedy.tokens) if record.greedy is not None else None,
        budgets=list(record.budgets), verdicts=dict(record.verdicts), error=error,
        wall_s=timings.wall_s if timings is not None else 0.0)


def _run_session(cmd: list[str], env: dict[str, str], log: Path, cwd: str,
                 tick: Callable[[], None] | None) -> int:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    return proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    if tick is not None:
                        tick()
        except BaseException:  # Ctrl-C or anything else: the session must not outlive us
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_matrix_on_devices(engines: Sequence[str], packages: Sequence[str],
                          prompts: Sequence[Sequence[int]] | None, max_new_tokens: int,
                          evidence_dir: Path | None, devices: Sequence[str], *,
                          mode: str = "greedy", widths=None, max_prompts: int | None = None,
                          on_plan: Callable[[int], None] | None = None,
                          on_progress: Callable[[int], None] | None = None,
                          command: Sequence[str] | None = None,
                          oracle_engine: str | None = None, oracle_mode: str = "stream",
                          shard=None):
    """``run_matrix`` on pytest-xdist, one worker per GPU of ``devices`` (values for
    ``CUDA_VISIBLE_DEVICES``): the same plan, manifest, records and ``RunSummary``. An
    ``oracle_engine`` is vetted here, before the session, as ``run_matrix`` vets it; the
    workers then build the same oracle. ``shard``: this run's share of the plan.

    Bad requests fail here before anything runs, as in ``run_matrix``. ``evidence_dir`` None
    (``--no-evidence``): the workers write into a temporary folder that is deleted after."""
    from datetime import datetime, timezone

    from engines.errors import LockstepError
    from harness import evidence as ev
    from harness.cell_runner import CellRunner
    from harness.cells import CellError, RunSummary
    from harness.manifest import finish, write_manifest
    from harness.package_judge import PackageJudge
    from harness.packages import REAL_CHECKPOINTS, fixture_names, resolve_package
    from harness.plan import check_counts, plan_packages, plan_run
    from harness.runner import engine_refs, plan_manifest, resolve_engines

    check_counts(max_prompts, max_new_tokens)
    require_xdist()
    if not devices:
        raise LockstepError("no GPU to run on", field="--devices",
                            remedy="name at least one GPU")
    classes = resolve_engines(engines)
    refs = engine_refs(engines)
    named = set(fixture_names()) | set(REAL_CHECKPOINTS)
    resolved, package_refs = [], {}
    for ref in packages:
        package = resolve_package(ref)
        resolved.append(package)
        text = str(ref)
        package_refs[package.spec.name] = text if text in named else str(
            Path(text).expanduser().resolve())
    plans = plan_packages(resolved, mode, widths, prompts, max_prompts, max_new_tokens)
    planned_run = plan_run(plans, classes, refs, mode, max_new_tokens, shard, package_refs)
    cells = planned_run.cells
    checks = {}
    if oracle_engine is not None:
        for pp in plans:
            judge = PackageJudge(pp.package, oracle_engine, oracle_mode)
            try:
                judge.choose(pp.prompts[0][1])
            finally:
                judge.close()
            checks[pp.package.spec.name] = judge.agreement

    run_id = ev.new_run_id()
    manifest = plan_manifest(run_id, cells, command, digest=planned_run.digest, shard=shard,
                             total=planned_run.total, left_out=planned_run.left_out)
    planned = manifest.planned
    scratch = Path(tempfile.mkdtemp(prefix="lockstep-devices-"))
    folder = Path(evidence_dir) if evidence_dir is not None else scratch / "evidence"
    folder.mkdir(parents=True, exist_ok=True)
    folder = folder.resolve()
    try:
        write_manifest(folder, manifest)
        if on_plan:
            on_plan(len(planned))
        groups = []
        for pp in plans:
            specs = [c for c in cells if c.package == pp.package.spec.name]
            groups.append((_package_cost(pp.package, len(specs)), len(groups), specs))
        groups.sort(key=lambda g: (-g[0], g[1]))  # largest first, then plan order
        (scratch / "started").mkdir()
        plan = MatrixPlan(run_id, mode, max_new_tokens, str(folder),
                          tuple(c for _, _, specs in groups for c in specs),
                          str(scratch / "started"), oracle_engine, oracle_mode,
                          {name: asdict(check) for name, check in checks.items()})
        plan_path = plan.write(scratch / "plan.json")
        (scratch / SHIM).write_text(generated_test_file(list(dict.fromkeys(c.package
                                                                for c in plan.cells))))
        ini = scratch / "pytest.ini"
        ini.write_text("[pytest]\naddopts =\n")
        log = (folder / "runs" / f"{run_id}-pytest.log") if evidence_dir is not None \
            else scratch / "pytest.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pytest", str(scratch / SHIM), "-c", str(ini),
               "--rootdir", str(scratch), "-p", "xdist", "-p", "harness.matrix_cells",
               "-n", str(len(devices)), "--dist", "loadscope", *_xdist_args(),
               "-p", "no:cacheprovider", "-p", "no:randomly", "-q", "-rfE"]
        env = session_env(devices, plan_path, scratch / "locks")

        def tick():
            if on_progress is not None:
                on_progress(len(_records_of(folder, run_id)))

        rc = _run_session(cmd, env, log, os.getcwd(), tick)
        paths = _records_of(folder, run_id)
        if rc not in (0, 1) and not paths:
            raise LockstepError(f"the pytest-xdist session over the cells failed (pytest exit "
                                f"status {rc}) before any cell ran:\n{_tail(log)}",
                                where=str(log) if evidence_dir is not None else None,
                                remedy="see the session log; check that pytest-xdist is "
                                       "installed and that the engines import here")
        found = {}
        for path in paths:
            record = ev.read_evidence(path)
            key = (record.package.name, record.engine, record.mode.label, record.prompt.name)
            found[key] = (record, path)
        lost = None  # the controller's runner, for cells no worker recorded
        results = []
        for spec in cells:
            got = found.get(spec.key)
            if got is not None:
                cell = cell_from_record(*got)
            else:
                if lost is None:
                    lost = CellRunner(run_id, mode, max_new_tokens, folder,
                                      packages={package_refs[p.spec.name]: p
                                                for p in resolved})
                where = f"; the session log is {log}" if evidence_dir is not None else ""
                cell = lost.failed(spec, CellError(
                    "worker", "WorkerLost", f"no record: the pytest-xdist worker running this "
                                            f"cell stopped before writing it (pytest exit "
                                            f"status {rc}){where}"))
            if evidence_dir is None:
                cell.record_path = None
            results.append(cell)
        if lost is not None:
            lost.close()
        finish(folder, manifest, datetime.now(timezone.utc))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return RunSummary(results, evidence_dir, run_id, len(planned), checks,
                      planned_run.left_out)


__all__ = ["CellSpec", "MatrixPlan", "cell_from_record", "parse_devices", "pin_worker_gpu",
           "release_gpu_locks", "run_matrix_on_devices", "session_env", "visible_gpus"]
