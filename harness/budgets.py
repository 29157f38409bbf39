"""Claims 3 and 4 on a device engine: zero host staging and the exact readback budget,
measured by the engine's own ledger and, where the decode ran under it, by the independent
transfer guard. Judged by the claim registry, whether or not evidence is written."""
from __future__ import annotations

from engines.package.schema import MODEL_FREE_KINDS
from engines.workflow.speculative import SpeculativeResult
from harness.claims import FAIL, SKIP, all_pass, judge_claim
from harness.evidence import BudgetCheck


def expected_readback(result) -> tuple[int, str]:
    """Claim 4's exact budget for a decode, in bytes, and how it is made up."""
    if not isinstance(result, SpeculativeResult):
        return 4 * len(result.tokens), "exactly 4 bytes (one int32 token id) per generated token"
    ledger = result.ledger
    if result.kind in MODEL_FREE_KINDS:  # drafts copied from ids the host holds
        # a decode forward whose row went into a shifted round, or that was queued past eos
        # and undone, has no id of its own read
        read = (1 + ledger.forwards["decode"] - ledger.shifted_verifications
                - ledger.discarded_forwards)
        return ((4 * read + 8 * ledger.proposals),
                f"nothing per proposer step ({result.kind} drafts on the host), 8 per "
                f"verification (accept count + bonus id), 4 per prefill or decode token (a "
                f"decode forward whose row a shifted verification judged, or undone past "
                f"eos, has none)")
    return ((4 * (1 + ledger.forwards["decode"] + sum(result.widths_per_round))
             + 8 * ledger.proposals),
            "4 bytes per proposer step (draft id), 8 per verification (accept count + bonus "
            "id), 4 per prefill or decode token")


def device_budgets(engine, result, guard=None):
    """The budget checks of one decode on a device-resident engine, and the two claims'
    verdicts; a host engine has none (both ``skip``)."""
    if engine.residency == "host" or engine.capabilities().decodes_itself:
        # nothing crosses on the host; a black box that decodes by itself keeps no
        # crossing ledger the interpreter could judge (its own library moves its values)
        return [], {"zero_staging": SKIP, "readback_budget": SKIP}
    expected, note = expected_readback(result)
    ledger = result.ledger
    measured = [("zero_staging", ledger.host_staging, "events (ledger)"),
                ("readback_budget", ledger.readback_total, "bytes (ledger)")]
    if guard is not None:
        measured += [("zero_staging", guard.staging_count, "events (transfer guard)"),
                     ("readback_budget", sum(guard.readback_bytes.values()),
                      "bytes (transfer guard)")]
    checks = []
    for claim_id, value, unit in measured:
        if claim_id == "zero_staging":
            budget, verdict = 0, judge_claim(claim_id, value)
        else:
            budget, verdict = expected, judge_claim(claim_id, value, expected)
        checks.append(BudgetCheck(claim=claim_id, budget=budget, measured=value, unit=unit,
                                  verdict=verdict,
                                  note=None if claim_id == "zero_staging" else note))
    verdicts = {claim_id: all_pass([c.verdict for c in checks if c.claim == claim_id])
                for claim_id in ("zero_staging", "readback_budget")}
    return checks, verdicts


def budget_summary(checks) -> str:
    """One line naming each failed budget: claim, measured, budget, unit."""
    return "; ".join(f"{c.claim}: measured {c.measured:g}, budget {c.budget:g} {c.unit or ''}"
                     .rstrip() for c in checks if c.verdict == FAIL)
