"""The matrix runner: engines x packages x modes x prompts, every cell judged and recorded.

``run_matrix`` plans every cell (``harness.plan``), writes the plan into the run manifest
first, runs the cells (all of them, or one shard's contiguous share) one by one through the
one cell driver (``harness.cell_runner.CellRunner``), and marks the manifest complete last,
so a run that was killed shows as incomplete, never as green. One oracle per package judges
every engine's stream on the engine's own prefix (``harness.package_judge``).
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from engines.engine import Engine
from engines.oracle import STREAM
from engines.registry import REFERENCE_ENGINE, get_engine_class, resolve_engine_list
from harness import evidence as ev
from harness.cell_runner import CellRunner, decode, engine_provenance
from harness.cells import CellError, CellResult, RunSummary
from harness.judgement import first_difference
from harness.manifest import (LeftOutCells, PlannedCell, RunManifest, ShardShare, finish,
                              write_manifest)
from harness.package_judge import PackageJudge
from harness.packages import resolve_package
from harness.plan import (MODES, CellSpec, PackagePlan, Shard, check_counts, plan_packages,
                          plan_run, widths_for)


def resolve_engines(engines: Sequence[str | type[Engine]]) -> dict[str, type[Engine]]:
    """Engine names (or "module:Class", or classes) -> classes, keyed by the engine's name;
    an unknown or ill-defined engine, or one engine named twice (in one spelling or two),
    fails here, before anything runs (``engines.registry.resolve_engine_list``)."""
    return resolve_engine_list(engines, field="engines")


def engine_refs(engines: Sequence[str | type[Engine]]) -> dict[str, str]:
    """Engine name -> how a process finds it: the name or "module:Class" it was given, or a
    class's own "module:qualname"."""
    refs = {}
    for ref in engines:
        cls = ref if isinstance(ref, type) else get_engine_class(ref)
        refs[cls.name] = ref if isinstance(ref, str) else f"{cls.__module__}:{cls.__qualname__}"
    return refs


def plan_manifest(run_id: str, cells: Sequence[CellSpec], command: Sequence[str] | None = None,
                  *, digest: str | None = None, shard: Shard | None = None, total: int = 0,
                  left_out: Sequence = ()):
    """The run manifest of ``cells`` in the order the runner runs them; a shard's names its
    share of the whole plan (``digest``, ``total`` cells, its bounds); ``left_out``
    (``harness.plan.LeftOut``): what was not planned, and why."""
    share = None
    if shard is not None:
        start, end = shard.bounds(total)
        share = ShardShare(index=shard.index, count=shard.count, plan_cells=total,
                           start=start, end=end)
    return RunManifest(run_id=run_id, started=datetime.now(timezone.utc),
                       command=list(command if command is not None else sys.argv),
                       planned=[PlannedCell(package=c.package, engine=c.engine, mode=c.mode,
                                            prompt=c.prompt) for c in cells],
                       plan_digest=digest, shard=share,
                       left_out=[LeftOutCells(**asdict(lo)) for lo in left_out])


def run_matrix(engines: Sequence[str | type[Engine]], packages: Sequence[str],
               prompts: Sequence[Sequence[int]] | None, max_new_tokens: int,
               evidence_dir: Path | None = None,
               on_cell: Callable[[CellResult], None] | None = None, mode: str = "greedy",
               widths: Sequence[int] | str | None = None, max_prompts: int | None = None,
               on_plan: Callable[[int], None] | None = None,
               command: Sequence[str] | None = None,
               oracle_engine: str | None = None, oracle_mode: str = STREAM,
               shard: Shard | None = None, concurrency: int = 1) -> RunSummary:
    """Run every engine on every package, width and prompt; never stops at a failure.

    ``prompts``: lists of ids, or ``harness.prompts.PromptSource`` (text, chat, ids) resolved
    per package. ``oracle_engine``: the engine the oracle runs on (default ort-cpu), vetted
    against ort-cpu's oracle on each package's first prompt before anything runs
    (``harness.oracle_choice``); ``oracle_mode``: ``stream`` (one forward per stream) or
    ``recompute`` (one per prefix, to audit the oracle itself). ``shard``: run only that
    shard's contiguous share of the planned cells (``lockstep run --shard I/N``).
    ``concurrency`` N > 1: each greedy cell of an engine that declares ``concurrent`` is also
    decoded among N of the package's prompts in flight together and compared with its stream
    alone (claim ``concurrency_invariance``; ``lockstep run --concurrency N``).

    Bad requests (an unknown engine or mode, a width outside a package's range, a package
    without a speculative section in speculative mode, an oracle engine that disagrees)
    fail before anything runs, as do a ``max_prompts`` or ``max_new_tokens`` below 1."""
    check_counts(max_prompts, max_new_tokens)
    classes = resolve_engines(engines)
    refs = engine_refs(engines)
    resolved = [resolve_package(ref) for ref in packages]
    plans = plan_packages(resolved, mode, widths, prompts, max_prompts, max_new_tokens)
    planned = plan_run(plans, classes, refs, mode, max_new_tokens, shard,
                       concurrency=concurrency)
    cells = planned.cells
    judges = {pp.package.spec.name: PackageJudge(pp.package, oracle_engine, oracle_mode)
              for pp in plans}
    if oracle_engine is not None:
        for pp in plans:
            judges[pp.package.spec.name].choose(pp.prompts[0][1])
    run_id = ev.new_run_id()
    env = ev.collect_environment()
    manifest = plan_manifest(run_id, cells, command, digest=planned.digest, shard=shard,
                             total=planned.total, left_out=planned.left_out)
    if evidence_dir is not None:
        write_manifest(evidence_dir, manifest)
    if on_plan:
        on_plan(len(cells))
    runner = CellRunner(run_id, mode, max_new_tokens, evidence_dir, env,
                        oracle_engine=oracle_engine, oracle_mode=oracle_mode,
                        packages={str(p.root): p for p in resolved}, judges=judges,
                        sources={(pp.package.spec.name, name): source for pp in plans
                                 for name, source in pp.sources.items()},
                        engine_classes={refs[name]: cls for name, cls in classes.items()})
    results: list[CellResult] = []
    try:
        for spec in cells:
            cell = runner.run(spec)
            results.append(cell)
            if on_cell:
                on_cell(cell)
    finally:
        runner.close()
        for judge in judges.values():
            judge.close()
    if evidence_dir is not None:
        finish(evidence_dir, manifest, datetime.now(timezone.utc))
    return RunSummary(results, evidence_dir, run_id, len(cells),
                      {name: j.agreement for name, j in judges.items()
                       if j.agreement is not None}, planned.left_out)


__all__ = ["MODES", "CellError", "CellResult", "CellRunner", "PackagePlan", "REFERENCE_ENGINE",
           "RunSummary", "decode", "engine_provenance", "engine_refs", "first_difference",
           "plan_manifest", "resolve_engines", "run_matrix", "widths_for"]
