"""What got worse between a baseline evidence set and this one.

Cells are matched on (package, engine, mode, prompt). Tokens and budgets are exact, so a new
divergence, a new budget breach or a newly failing claim is a regression however small;
throughput and acceptance are noisy, so they regress only when they fall by more than
``NOISE_BAND`` (relative to the baseline), a number the report prints.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from harness.evidence import EvidenceRecord

NOISE_BAND = 0.10  # relative drop in tokens/s or mean acceptance tolerated as noise

CellKey = tuple[str, str, str, str]  # package, engine, mode label, prompt name


@dataclass(frozen=True)
class Regression:
    kind: str  # new-divergence | budget-breach | claim-failing | throughput | acceptance | missing-cell
    cell: CellKey
    detail: str
    baseline: str = ""
    current: str = ""


def cell_key(record: EvidenceRecord) -> CellKey:
    return (record.package.name, record.engine, record.mode.label, record.prompt.name)


def _group(records: Sequence[EvidenceRecord]) -> dict[CellKey, list[EvidenceRecord]]:
    groups: dict[CellKey, list[EvidenceRecord]] = defaultdict(list)
    for record in records:
        groups[cell_key(record)].append(record)
    return groups


def _median_tps(records: list[EvidenceRecord]) -> float | None:
    values = [r.timings.tokens_per_s for r in records if r.timings.tokens_per_s is not None]
    return statistics.median(values) if values else None


def _mean_acceptance(records: list[EvidenceRecord]) -> float | None:
    rounds = [a for r in records for a in r.acceptance_per_round]
    return statistics.fmean(rounds) if rounds else None


def _failed_budgets(records: list[EvidenceRecord]) -> dict[str, str]:
    return {b.claim: f"{b.measured:g} against a budget of {b.budget:g}"
                     f"{' ' + b.unit if b.unit else ''}"
            for r in records for b in r.budgets if b.verdict == "fail"}


def _failed_claims(records: list[EvidenceRecord]) -> set[str]:
    return {claim for r in records for claim, v in r.verdicts.items() if v == "fail"}


def _dropped(before: float | None, now: float | None, band: float) -> bool:
    return before is not None and now is not None and before > 0 and now < before * (1 - band)


def find_regressions(records: Sequence[EvidenceRecord], baseline: Sequence[EvidenceRecord],
                     noise_band: float = NOISE_BAND) -> list[Regression]:
    """Every way ``records`` is worse than ``baseline``, exact claims first."""
    now, before = _group(records), _group(baseline)
    found: list[Regression] = []
    for key in sorted(before.keys() - now.keys()):
        found.append(Regression("missing-cell", key, "cell ran in the baseline but not in this run"))
    for key in sorted(now.keys() & before.keys()):
        cur, old = now[key], before[key]
        new_div = next((r.divergence for r in cur if r.divergence), None)
        if new_div and not any(r.divergence for r in old):
            margin = "" if new_div.margin is None else f", reference margin {new_div.margin:.4g}"
            found.append(Regression(
                "new-divergence", key,
                f"{new_div.verdict} at step {new_div.step}: reference token "
                f"{new_div.reference_token}, engine token {new_div.engine_token}{margin}",
                baseline="identical", current=new_div.verdict))
        old_fail = _failed_budgets(old)
        for claim, what in sorted(_failed_budgets(cur).items()):
            if claim not in old_fail:
                found.append(Regression("budget-breach", key, f"{claim}: {what}",
                                        baseline="pass", current="fail"))
        for claim in sorted(_failed_claims(cur) - _failed_claims(old)):
            found.append(Regression("claim-failing", key, f"claim {claim} now fails",
                                    baseline="pass or skip", current="fail"))
        tps_old, tps_now = _median_tps(old), _median_tps(cur)
        if _dropped(tps_old, tps_now, noise_band):
            found.append(Regression(
                "throughput", key,
                f"tokens/s down {100 * (1 - tps_now / tps_old):.1f}% "
                f"(noise band {100 * noise_band:.0f}%)",
                baseline=f"{tps_old:.1f}", current=f"{tps_now:.1f}"))
        acc_old, acc_now = _mean_acceptance(old), _mean_acceptance(cur)
        if _dropped(acc_old, acc_now, noise_band):
            found.append(Regression(
                "acceptance", key,
                f"mean accepted tokens per round down {100 * (1 - acc_now / acc_old):.1f}% "
                f"(noise band {100 * noise_band:.0f}%)",
                baseline=f"{acc_old:.2f}", current=f"{acc_now:.2f}"))
    order = {"new-divergence": 0, "budget-breach": 1, "claim-failing": 2, "throughput": 3,
             "acceptance": 4, "missing-cell": 5}
    return sorted(found, key=lambda r: (order[r.kind], r.cell))
