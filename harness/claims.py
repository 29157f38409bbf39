"""The claims lockstep asserts: one registry feeding the runner, evidence, report and tests.

Every claim has an id (used as the evidence ``verdicts`` key, the report's column and the
``@pytest.mark.claim("...")`` marker), a one-line statement, the unit its measurement is
in, and the rule that judges a measurement. ``docs/CLAIMS.md`` is the prose; this
module is what the code uses, so the two cannot drift silently (a test compares them).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.judgement import BUDGET, DEFECT, DRIFT, NON_FINITE

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass(frozen=True)
class Claim:
    id: str
    statement: str
    unit: str
    rule: Callable[..., str]  # measurement -> pass | fail
    # the cell status a failed verdict stands for (harness.judgement.SEVERITY): a token or
    # stream claim is a defect, a logits claim non-finite or drift, a device claim a budget
    fails_as: str = BUDGET


def _exact(measured: float, budget: float) -> str:
    return PASS if measured == budget else FAIL


def _zero(measured: float) -> str:
    return PASS if measured == 0 else FAIL


def _no_defect(judgement: Any) -> str:
    return PASS if judgement.defects == 0 else FAIL


def _audit_within(audit: Any) -> str:
    return PASS if audit.within_tolerance else FAIL


def _audit_finite(audit: Any) -> str:
    return PASS if audit.non_finite_steps == 0 else FAIL


def _band_within(statistics: Any) -> str:
    return PASS if statistics.within else FAIL


def _equal_streams(a: Sequence[int], b: Sequence[int]) -> str:
    return PASS if list(a) == list(b) else FAIL


def _flat(series: Sequence[int]) -> str:
    return PASS if len(set(series)) <= 1 else FAIL


def _replays(fallbacks: int, poisoned_mismatches: int = 0) -> str:
    return PASS if fallbacks == 0 and poisoned_mismatches == 0 else FAIL


def _bitwise(rows_equal: bool) -> str:
    return PASS if rows_equal else FAIL


def _snapshot_budget(snapshots: int, restores: int, partial_accepts: int,
                     staging: int = 0) -> str:
    return PASS if restores == partial_accepts and restores <= snapshots and staging == 0 else FAIL


def _agree(ok: bool) -> str:
    return PASS if ok else FAIL


def _concurrency(check: Any) -> str:
    return PASS if check.ok else FAIL


CLAIMS: dict[str, Claim] = {c.id: c for c in (
    Claim("token_identity",
          "every emitted token is the oracle's argmax on the engine's own prefix, or within "
          "the dtype's near-tie tolerance of it", "steps", _no_defect, DEFECT),
    Claim("logits_within_tolerance",
          "each step's logits are within the dtype's logits tolerance of the oracle's on the "
          "same prefix (max abs and NMSE)", "steps", _audit_within, DRIFT),
    Claim("finite_logits", "no logits row holds NaN or an infinity", "steps", _audit_finite,
          NON_FINITE),
    Claim("quantized_band",
          "a quantized engine's stream is within its scheme's calibrated band against float32 "
          "over its own dequantized weights: per-step logits, mean and p99 KL, flips",
          "steps", _band_within, DRIFT),
    Claim("zero_staging",
          "no value is staged to the host on a device engine (ledger and transfer guard)",
          "events", _zero),
    Claim("readback_budget",
          "the bytes read back equal the exact budget: 4 per token id or acceptance count",
          "bytes", _exact),
    Claim("flat_memory",
          "after warm-up, further decodes leave live device allocations unchanged",
          "allocations", _flat),
    Claim("graph_replay",
          "graph slots capture once per signature, replay after, never fall back, and a "
          "stale buffer cannot pass (outputs poisoned before replay)", "replays", _replays),
    Claim("snapshot_budget",
          "recurrent state is snapshotted device to device, restored once per partial "
          "accept and never staged", "snapshots", _snapshot_budget),
    Claim("spec_equals_greedy",
          "a speculative stream equals the same engine's greedy stream token for token",
          "tokens", _equal_streams, DEFECT),
    Claim("batch_invariance",
          "row i of an M-row forward equals the M=1 forward bit for bit", "rows", _bitwise,
          DEFECT),
    Claim("tensor_ops",
          "the CUDA tensor ops equal the host tensor ops element for element", "elements",
          _agree, DEFECT),
    Claim("concurrency_invariance",
          "a prompt decoded among N concurrent requests gives the tokens it gives alone, "
          "its log-probabilities within the dtype's logprob bound", "steps", _concurrency,
          DRIFT),  # parted tokens: a defect (the record's concurrency says so)
)}

CLAIM_IDS: tuple[str, ...] = tuple(CLAIMS)


def claim(claim_id: str) -> Claim:
    """The registered claim ``claim_id``; an unknown id is an error naming the valid ones."""
    try:
        return CLAIMS[claim_id]
    except KeyError:
        raise KeyError(f"no claim {claim_id!r}; claims: {', '.join(CLAIM_IDS)}") from None


def all_pass(verdicts: Sequence[str]) -> str:
    """One claim measured several ways (the ledger and the transfer guard): it passes only
    when every measurement does."""
    return FAIL if FAIL in verdicts else PASS


def judge_claim(claim_id: str, *measurement: Any, **kwargs: Any) -> str:
    """Judge one measurement of ``claim_id`` by the claim's own rule."""
    return claim(claim_id).rule(*measurement, **kwargs)
