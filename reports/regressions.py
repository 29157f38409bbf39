"""What got worse between a baseline evidence set and this one.

Cells are matched on (package, engine, mode, prompt). Tokens and budgets are exact, so a new
divergence, a new budget breach, a newly failing claim or a cell whose status turned failing
(error, non-finite, drift) is a regression however small; throughput and acceptance are
noisy, so they regress only when they fall by more than ``NOISE_BAND`` (relative to the
baseline), a number the report prints.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from harness.evidence import EvidenceRecord, found_status
from harness.judge import BUDGET, DEFECT, FAILING, IDENTICAL, SEVERITY, worst

NOISE_BAND = 0.10  # relative drop in tokens/s or mean acceptance tolerated as noise

CellKey = tuple[str, str, str, str]  # package, engine, mode label, prompt name


def record_status(record: EvidenceRecord) -> str:
    """The status a record stands for: its ``status``, which loading checks against what it
    holds (``harness.evidence.found_status``), made worse by any finding it holds where a
    record was built without that check (``model_copy``). A record that is not ``ok``
    therefore never reads as passing."""
    found = found_status(record)[0]
    return record.status if found == IDENTICAL else worst(record.status, found)


@dataclass(frozen=True)
class Regression:
    kind: str  # new-divergence | status | budget-breach | claim-failing | throughput | acceptance | missing-cell
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
    values = [r.timings.tokens_per_s for r in records
              if r.timings is not None and r.timings.tokens_per_s is not None]
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


def _first_finding(records: list[EvidenceRecord]):
    """(step, oracle token, engine token, margin, verdict) of the first record that has a
    divergence or a judged finding; None when every stream passes as a plain match."""
    for r in records:
        if r.divergence is not None:
            d = r.divergence
            return d.step, d.reference_token, d.engine_token, d.margin, d.verdict
        if r.judgement is not None and r.judgement.findings:
            f = r.judgement.findings[0]
            return f.step, f.oracle_token, f.engine_token, None, f.verdict
    return None


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
        new_div = _first_finding(cur)
        if new_div and _first_finding(old) is None:
            step, ref_tok, eng_tok, margin, verdict = new_div
            margin_text = "" if margin is None else f", reference margin {margin:.4g}"
            found.append(Regression(
                "new-divergence", key,
                f"{verdict} at step {step}: reference token {ref_tok}, engine token "
                f"{eng_tok}{margin_text}",
                baseline="identical", current=verdict))
        status_now = worst(*(record_status(r) for r in cur))
        status_old = worst(*(record_status(r) for r in old))
        if (status_now in FAILING and status_now not in (DEFECT, BUDGET)
                and SEVERITY.index(status_now) < SEVERITY.index(status_old)):
            why = next((r.reason or (r.error.message if r.error else "") for r in cur
                        if record_status(r) == status_now), "")
            found.append(Regression("status", key, f"cell is now {status_now}"
                                    + (f": {why}" if why else ""),
                                    baseline=status_old, current=status_now))
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
    order = {"new-divergence": 0, "status": 1, "budget-breach": 2, "claim-failing": 3,
             "throughput": 4, "acceptance": 5, "missing-cell": 6}
    return sorted(found, key=lambda r: (order[r.kind], r.cell))
