"""The oracle on an engine of the user's choosing (``lockstep run --oracle-engine``), vetted first.

The recompute oracle costs a forward over the whole prefix per step: on ``ort-cpu`` a
2k-token prompt with 256 new tokens is out of reach, on a GPU engine it is seconds. Moving
the oracle moves the reference every verdict rests on, so the chosen engine must first
agree with ``ort-cpu``'s oracle on a short prefix: the same argmax and a logits row within
the float32 tolerance at every step of a few greedy steps. A disagreement stops the run
before any cell. Only float32 packages may move their oracle: a float16 or bfloat16
package is judged against its float32 twin on ``ort-cpu``, the reference its tolerance rows
were measured against.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engines.errors import EngineUnavailable, ExecutionError, InputError
from engines.oracle import STREAM, Oracle, oracle_for, top2_margin
from engines.registry import REFERENCE_ENGINE, get_engine_class
from engines.tolerances import tolerance_for
from harness.compare import compare_tensors

PREFIX_TOKENS = 16  # the short prefix the two oracles must agree on
CHECK_STEPS = 4  # greedy steps decoded (by ort-cpu's oracle) and compared after it


@dataclass
class OracleAgreement:
    """How the chosen oracle compared with ``ort-cpu``'s before the run (for evidence)."""
    engine: str
    against: str
    prefix_tokens: int
    steps: int
    max_abs: float
    nmse: float
    tokens: list[int]  # ort-cpu's greedy tokens over the checked steps


def check_engine_choice(engine_name: str, package) -> None:
    """A chosen oracle engine must exist, compute logits rows (no black box: a server or an
    engine that decodes by itself has no forward to recompute with), run here, and judge a
    float32 package."""
    cls = get_engine_class(engine_name)
    if cls.decodes_itself:
        raise InputError(f"the oracle engine {cls.name!r} decodes by itself (a black box or a "
                         f"server): it runs no forward, so it cannot compute the oracle's rows",
                         field="--oracle-engine", value=engine_name,
                         remedy=f"choose an engine that runs the package's graph (lockstep "
                                f"engines), or drop --oracle-engine for the default "
                                f"{REFERENCE_ENGINE}")
    avail = cls.availability()
    if not avail.ok:
        raise EngineUnavailable(f"the oracle engine {cls.name!r} cannot run here: {avail.reason}",
                                field="--oracle-engine", value=engine_name,
                                remedy=f"choose an engine that runs here (lockstep engines), or "
                                       f"drop --oracle-engine for the default {REFERENCE_ENGINE}")
    dtype = package.spec.dtype
    if dtype != "float32" and cls.name != REFERENCE_ENGINE:
        raise InputError(f"--oracle-engine applies to float32 packages only; "
                         f"{package.spec.name!r} is {dtype}, judged against its float32 twin "
                         f"on {REFERENCE_ENGINE}, the reference its tolerance rows were "
                         f"measured against", field="--oracle-engine", value=engine_name,
                         remedy=f"run {dtype} packages without --oracle-engine, or pass only "
                                f"float32 packages")


def check_agreement(candidate: Oracle, reference: Oracle, prompt: Sequence[int],
                    steps: int = CHECK_STEPS) -> OracleAgreement:
    """``candidate`` against ``reference`` on ``prompt``'s first tokens and ``steps`` greedy
    steps after them: the same argmax and a row within the float32 logits tolerance at each
    prefix, else an ``ExecutionError`` naming the step and what differs."""
    tol = tolerance_for("float32")
    room = max(1, reference.spec.max_context - steps)
    prefix = [int(t) for t in prompt][:min(PREFIX_TOKENS, room)]
    trace = reference.decode(prefix, steps)
    seq, worst_abs, worst_nmse = list(prefix), 0.0, 0.0
    for step, token in enumerate(trace.tokens):
        want, got = reference.row(seq), candidate.row(seq)
        cmp = compare_tensors(got, want, tol=tol.logits)
        worst_abs, worst_nmse = max(worst_abs, cmp.max_abs), max(worst_nmse, cmp.nmse)
        best = top2_margin(got)[0]
        if best != token or not cmp.ok:
            what = (f"its argmax is {best}, {reference.name}'s {token}" if best != token else
                    f"its logits differ by max abs {cmp.max_abs:.3g}, NMSE {cmp.nmse:.3g} "
                    f"(float32 bounds {tol.logits_max_abs:g}, {tol.logits_nmse:g})")
            raise ExecutionError(
                f"the oracle on {candidate.name!r} disagrees with {reference.name!r}'s oracle on "
                f"{candidate.spec.name!r} at step {step} after a {len(prefix)}-token prefix: "
                f"{what}; it cannot judge this run", field="--oracle-engine",
                value=candidate.name,
                remedy=f"drop --oracle-engine (the {reference.name} oracle), or fix the "
                       f"engine until its recompute agrees")
        seq.append(token)
    return OracleAgreement(candidate.name, reference.name, len(prefix), len(trace.tokens),
                           float(worst_abs), float(worst_nmse), list(trace.tokens))


def chosen_oracle(package, engine_name: str, prompt: Sequence[int], mode: str = STREAM
                  ) -> tuple[Oracle, OracleAgreement | None]:
    """The oracle on ``engine_name`` for ``package`` in ``mode``, checked against ``ort-cpu``'s
    on ``prompt`` (no check when the choice is ``ort-cpu`` itself)."""
    check_engine_choice(engine_name, package)
    candidate = oracle_for(package, engine_name, mode=mode)
    if candidate.name == REFERENCE_ENGINE:
        return candidate, None
    reference = oracle_for(package, mode=mode)
    try:
        agreement = check_agreement(candidate, reference, prompt)
    finally:
        reference.engine.close()
    return candidate, agreement


__all__ = ["OracleAgreement", "check_agreement", "check_engine_choice", "chosen_oracle"]
