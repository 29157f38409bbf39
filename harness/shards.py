"""Do the shards of a plan cover it exactly once? (``lockstep run --shard I/N``)

Each shard's manifest names its plan (``plan_digest``) and its share (index, count, the plan's
cell count and its bounds). Over the manifests a report reads, the shards of one plan must
be each index 1..N exactly once, with bounds that tile the plan: a missing shard, a shard
run twice, or shares that do not fit together make the plan INCOMPLETE, named by shard.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.manifest import RunManifest


@dataclass
class ShardCoverage:
    """How the shards seen cover one plan."""
    plan_digest: str
    count: int  # N, as the shards declare it
    plan_cells: int
    runs: dict[int, list[str]] = field(default_factory=dict)  # shard index -> its run ids
    problems: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[int]:
        return [i for i in range(1, self.count + 1) if i not in self.runs]

    @property
    def doubled(self) -> list[int]:
        return sorted(i for i, runs in self.runs.items() if len(runs) > 1)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.doubled or self.problems)

    def describe(self) -> str:
        """One line: what is wrong with the coverage (empty when it is complete)."""
        parts = [f"shard {i}/{self.count} missing" for i in self.missing]
        parts += [f"shard {i}/{self.count} recorded {len(self.runs[i])} times (runs "
                  f"{', '.join(self.runs[i])})" for i in self.doubled]
        return "; ".join(parts + self.problems)


def shard_coverage(manifests: Sequence[RunManifest]) -> list[ShardCoverage]:
    """The coverage of every sharded plan among ``manifests`` (unsharded runs have none)."""
    by_plan: dict[str, list[RunManifest]] = defaultdict(list)
    for m in manifests:
        if m.shard is not None:
            by_plan[m.plan_digest or "?"].append(m)
    out = []
    for digest, shards in by_plan.items():
        counts = {m.shard.count for m in shards}
        totals = {m.shard.plan_cells for m in shards}
        cov = ShardCoverage(digest, max(counts), max(totals))
        if len(counts) > 1 or len(totals) > 1:
            cov.problems.append(f"the shards disagree on the plan: {sorted(counts)} shard "
                                f"counts, {sorted(totals)} planned cells")
        runs: dict[int, list[str]] = defaultdict(list)
        for m in sorted(shards, key=lambda m: m.shard.index):
            runs[m.shard.index].append(m.run_id)
            expected = (m.shard.index - 1) * cov.plan_cells // cov.count, \
                m.shard.index * cov.plan_cells // cov.count
            # cells of its share that its machine cannot run are left out, not lost
            held = len(m.planned) + sum(lo.cells for lo in m.left_out
                                        if lo.decided_by == "machine")
            if (m.shard.start, m.shard.end) != expected or held != m.shard.end - m.shard.start:
                cov.problems.append(f"shard {m.shard.label} (run {m.run_id}) holds cells "
                                    f"{m.shard.start}..{m.shard.end - 1} ({held} "
                                    f"planned), not its share {expected[0]}..{expected[1] - 1}")
        cov.runs = dict(runs)
        out.append(cov)
    return out


__all__ = ["ShardCoverage", "shard_coverage"]
