"""The plan of a matrix run: which cells run, in which order, and a shard's share of them.

A run plans every cell first (engines x packages x widths x prompts, in that nesting:
package, engine, width, prompt), writes the plan into its manifest, then runs the cells one
by one through ``harness.cell_runner.CellRunner``: in this process (``run_matrix``), on
pytest-xdist workers (``lockstep run --devices``) or as one shard of several machines
(``--shard I/N``). Bad requests fail here, before any cell runs.

The plan holds only the cells an engine could run, and it is the same on every machine:
what an engine's declarations exclude (no speculation in a speculative run, a package its
``supports`` refuses) is left out of the plan and its digest; what this machine cannot run
(``availability``: no GPU, a library missing) is left out of this machine's share only, so
the shards of one plan still tile it wherever they run. Both are recorded (``LeftOut``).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from engines.errors import InputError
from engines.requests import check_count, check_request
from engines.workflow.speculative import speculative_widths  # the one width rule
from harness.prompts import PromptSource, resolve_all

MODES = ("greedy", "speculative")


def widths_for(package, mode: str, widths: Sequence[int] | str | None) -> list[int | None]:
    """The widths a package runs at: [None] for greedy; for speculative, ``"all"`` (or None)
    is 1..max_width, a list must lie within it (else ``InputError``)."""
    if mode not in MODES:
        raise InputError("unknown mode", field="--mode", value=mode,
                         remedy=f"use one of: {', '.join(MODES)}")
    if mode == "greedy":
        return [None]
    return list(speculative_widths(package.spec, widths, field="--width"))


def check_counts(max_prompts: int | None, max_new_tokens: int) -> None:
    """``max_prompts`` None (all) or >= 1 and ``max_new_tokens`` >= 1, else an ``InputError``
    naming the field: 0 prompts would otherwise mean all of them, -1 all but the last."""
    if max_prompts is not None:
        check_count(max_prompts, "max_prompts",
                    "pass max_prompts=N with N >= 1, or None for all of a package's prompts")
    check_count(max_new_tokens, "max_new_tokens", "ask for one or more new tokens")


@dataclass
class PackagePlan:
    """One package's part of a plan: its widths (with their mode labels) and prompts."""
    package: object
    widths: list[int | None]
    labels: dict[int | None, str]
    prompts: list[tuple[str, list[int]]]
    sources: dict = field(default_factory=dict)  # prompt name -> harness.prompts.ResolvedPrompt


def plan_packages(resolved, mode, widths, prompts, max_prompts, max_new_tokens
                  ) -> list[PackagePlan]:
    """What runs where; a bad request (prompt, width, mode) is an ``InputError`` here, before
    any cell runs (exit 2), never an error cell."""
    plans = []
    for package in resolved:
        package_widths = widths_for(package, mode, widths)
        sp = package.spec.decoding.speculative
        labels = {w: ("greedy" if w is None else f"{sp.kind}/w{w}") for w in package_widths}
        sources = {}
        if prompts and any(isinstance(p, PromptSource) for p in prompts):
            # text and chat prompts: through this package's tokenizer and chat template
            sources = dict(resolve_all(prompts, package, max_new_tokens))
            named = [(name, list(r.ids)) for name, r in sources.items()]
        else:
            chosen = ([list(p) for p in prompts] if prompts
                      else [list(p) for p in package.spec.prompts])
            named = [(f"p{i}", p) for i, p in enumerate(chosen)]
        named = named[:max_prompts] if max_prompts else named
        for _, p in named:
            check_request(package.spec, p, max_new_tokens)
        plans.append(PackagePlan(package, package_widths, labels, named, sources))
    return plans


@dataclass(frozen=True)
class CellSpec:
    """One planned cell, as any process needs it: how to load the package and the engine."""
    package: str        # the package's name (the record's)
    package_ref: str    # what a worker resolves: a fixture name or an absolute folder
    engine: str         # the engine's name (the record's)
    engine_ref: str     # a registered name or "module:Class"
    mode: str           # greedy, or <kind>/w<width>
    width: int | None
    prompt: str         # p0, p1, ... or the name of a text or chat prompt
    ids: tuple[int, ...]
    # --concurrency N: the N prompts in flight together (this one at ``concurrent_slot``);
    # empty: no concurrency claim for this cell
    concurrent_with: tuple[tuple[int, ...], ...] = ()
    concurrent_slot: int = 0

    def __post_init__(self):
        # a spec read back from JSON (a worker's plan) carries lists: keep it hashable
        object.__setattr__(self, "ids", tuple(int(t) for t in self.ids))
        object.__setattr__(self, "concurrent_with",
                           tuple(tuple(int(t) for t in p) for p in self.concurrent_with))

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.package, self.engine, self.mode, self.prompt)

    @property
    def test_id(self) -> str:
        return "-".join((self.package, self.engine, self.mode.replace("/", "."), self.prompt))


def concurrent_groups(prompts: Sequence[Sequence[int]], n: int
                      ) -> list[tuple[tuple[tuple[int, ...], ...], int]]:
    """For each prompt, the ``n`` prompts sent together with it and its place among them:
    the prompts taken ``n`` at a time in order, the last group filled from the start again
    (a package with fewer than ``n`` prompts repeats them: identical prompts in flight
    together are a case of their own)."""
    ids = [tuple(int(t) for t in p) for p in prompts]
    out = []
    for i in range(len(ids)):
        first = (i // n) * n
        out.append((tuple(ids[(first + j) % len(ids)] for j in range(n)), i - first))
    return out


def check_concurrency(concurrency: int) -> int:
    return check_count(concurrency, "--concurrency",
                       "give the number of requests to keep in flight together, such as 4 "
                       "(1: every prompt alone, no concurrency claim)")


def plan_cells(plans: Sequence[PackagePlan], engines: dict[str, str],
               package_refs: dict[str, str] | None = None,
               concurrency: int = 1) -> list[CellSpec]:
    """Every cell of ``plans`` over ``engines`` (name -> engine ref), in the order a run runs
    them: package, engine, width, prompt (so one engine is loaded at a time, and one package's
    oracle serves all its engines). ``concurrency`` N > 1: each greedy cell also names the N
    prompts it is sent among (``concurrent_groups``) for the claim concurrency_invariance."""
    check_concurrency(concurrency)
    refs = package_refs or {}
    cells = []
    for pp in plans:
        name = pp.package.spec.name
        ref = refs.get(name, str(pp.package.root))
        groups = (concurrent_groups([ids for _, ids in pp.prompts], concurrency)
                  if concurrency > 1 else [((), 0)] * len(pp.prompts))
        for engine, engine_ref in engines.items():
            for w in pp.widths:
                for (prompt_name, ids), (group, slot) in zip(pp.prompts, groups):
                    if w is not None:
                        group, slot = (), 0  # greedy cells only
                    cells.append(CellSpec(name, ref, engine, engine_ref, pp.labels[w], w,
                                          prompt_name, tuple(int(t) for t in ids), group, slot))
    return cells


@dataclass(frozen=True)
class LeftOut:
    """Cells a run did not plan for one engine, package and mode, and why. ``decided_by``:
    ``declaration`` (the engine's capabilities or ``supports``: the same on every machine,
    so outside the plan and its digest) or ``machine`` (``availability`` here: inside the
    plan, left out of this machine's share)."""
    engine: str
    package: str
    mode: str
    reason: str
    cells: int
    decided_by: Literal["declaration", "machine"]


def declared_refusal(cls, package, mode: str) -> str | None:
    """Why ``cls`` cannot run ``package`` in ``mode`` by what it declares (None: it may try):
    no speculation in a speculative run, or a package its ``supports`` refuses. A
    declaration that raises is no refusal: the cell runs and records the error."""
    if mode == "speculative" and not cls.capabilities().speculative:
        return f"{cls.name} declares no speculative decoding (capabilities: speculative false)"
    try:
        found = cls.supports(package)
    except Exception:  # noqa: BLE001 - the constructor raises it again, into an error cell
        return None
    return None if found else (found.reason or f"{cls.name} does not support this package")


def unavailable_here(cls) -> str | None:
    """Why ``cls`` cannot run on this machine (``availability``), else None; an availability
    check that raises is no answer: the cells run and record the error."""
    try:
        found = cls.availability()
    except Exception:  # noqa: BLE001 - the cell runner records it as each cell's error
        return None
    return None if found else f"not available here: {found.reason or 'no reason given'}"


@dataclass
class RunPlan:
    """What one run runs: ``cells``, its share of the plan less the cells of engines that
    cannot run on this machine; ``digest`` and ``total`` name the whole plan, which is the
    same on every machine; ``left_out`` says what was not run and why."""
    cells: list[CellSpec]
    digest: str
    total: int
    left_out: list[LeftOut]


def _left_out(cells: Sequence[CellSpec], reasons: dict[tuple[str, str], str], decided_by: str
              ) -> list[LeftOut]:
    counts: dict[tuple[str, str, str], int] = {}
    for c in cells:
        key = (c.engine, c.package, c.mode)
        counts[key] = counts.get(key, 0) + 1
    return [LeftOut(e, p, m, reasons[(e, p)], n, decided_by) for (e, p, m), n in counts.items()]


def plan_run(plans: Sequence[PackagePlan], classes: dict[str, type], refs: dict[str, str],
             mode: str, max_new_tokens: int, shard: "Shard | None" = None,
             package_refs: dict[str, str] | None = None, concurrency: int = 1) -> RunPlan:
    """The cells this run runs. The plan holds every cell an engine could run by its
    declarations (``declared_refusal``), so it does not depend on the machine and every
    shard of it agrees on its digest; this run takes its shard's share of it and leaves out
    the cells of engines unavailable here (``unavailable_here``). ``classes`` and ``refs``:
    engine name -> class and -> ref; ``concurrency``: see ``plan_cells``."""
    every = plan_cells(plans, refs, package_refs, concurrency)
    packages = {pp.package.spec.name: pp.package for pp in plans}
    declared = {(e, p): why for e, cls in classes.items() for p, package in packages.items()
                if (why := declared_refusal(cls, package, mode)) is not None}
    cells = [c for c in every if (c.engine, c.package) not in declared]
    left_out = _left_out([c for c in every if (c.engine, c.package) in declared], declared,
                         "declaration")
    digest, total = plan_digest(cells, max_new_tokens, mode), len(cells)
    if shard is not None:
        start, end = shard.bounds(total)
        cells = cells[start:end]
    here = {(e, p): why for e, cls in classes.items() if (why := unavailable_here(cls))
            for p in packages}
    left_out += _left_out([c for c in cells if (c.engine, c.package) in here], here, "machine")
    return RunPlan([c for c in cells if (c.engine, c.package) not in here], digest, total,
                   left_out)


@dataclass
class NotRun:
    """One engine's cells that were not run (left out, or ``unavailable`` when tried), folded
    into one line for ``lockstep run`` and the report."""
    engine: str
    cells: int = 0
    packages: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    SHOWN = 2  # reasons a line names; a reason that names its package would repeat

    @property
    def shown_reasons(self) -> str:
        more = len(self.reasons) - self.SHOWN
        return "; ".join(self.reasons[:self.SHOWN]) + (
            f" (and {more} other reason(s))" if more > 0 else "")

    def line(self) -> str:
        return (f"{self.engine}: {self.cells} cell(s) on {len(self.packages)} package(s) not "
                f"run: {self.shown_reasons}")


def fold_not_run(entries) -> list[NotRun]:
    """``(engine, package, reason, cells)`` entries folded into one ``NotRun`` per engine, in
    the order engines first appear; each reason and package listed once."""
    folded: dict[str, NotRun] = {}
    for engine, package, reason, cells in entries:
        row = folded.setdefault(engine, NotRun(engine))
        row.cells += cells
        if package not in row.packages:
            row.packages.append(package)
        if reason not in row.reasons:
            row.reasons.append(reason)
    return list(folded.values())


def plan_digest(cells: Sequence[CellSpec], max_new_tokens: int, mode: str) -> str:
    """What identifies a plan across machines: its cells (keys and prompt ids), in order, and
    the settings every cell shares. Shards of one plan carry the same digest."""
    plan = {"mode": mode, "max_new_tokens": max_new_tokens,
            "cells": [[*c.key, list(c.ids)] for c in cells]}
    if any(c.concurrent_with for c in cells):  # absent otherwise: digests stay as they were
        plan["concurrent"] = [[[list(p) for p in c.concurrent_with], c.concurrent_slot]
                              for c in cells]
    body = json.dumps(plan, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


# -- shards -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``: a contiguous, deterministic share of the plan."""
    index: int
    count: int

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    def bounds(self, total: int) -> tuple[int, int]:
        """[start, end) of this shard's cells among ``total``: contiguous blocks whose sizes
        differ by one at most, so an engine is loaded in as few shards as it can be."""
        return ((self.index - 1) * total // self.count, self.index * total // self.count)


def parse_shard(text: str | None) -> Shard | None:
    """``--shard I/N`` (1 <= I <= N) -> ``Shard``; None when not given."""
    if text is None:
        return None
    parts = text.strip().split("/")
    try:
        index, count = (int(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        index = count = None
    if index is None or count is None or count < 1 or not 1 <= index <= count:
        raise InputError("a shard is I/N with 1 <= I <= N", field="--shard", value=text,
                         remedy="write --shard 2/3 for the second of three shares (a CI matrix "
                                "job, a Slurm array task or a Kubernetes indexed job each take "
                                "one), or drop --shard")
    return Shard(index, count)


__all__ = ["CellSpec", "LeftOut", "MODES", "NotRun", "PackagePlan", "RunPlan", "Shard",
           "check_concurrency", "check_counts", "concurrent_groups", "declared_refusal",
           "fold_not_run", "parse_shard", "plan_cells", "plan_digest", "plan_packages",
           "plan_run", "unavailable_here", "widths_for"]
