"""What a speculative bench row adds: how its rounds went, and how it compares with greedy.

In ``lockstep bench --mode speculative`` every engine is timed greedily and speculatively on
the same package and prompts, in turns (``harness.bench``). The speculative row then says:

* **rounds**, **plain steps**: verifications, and forwards of one position whose id was read
  (a proposer that found nothing to draft, or the last token; not a shifted round's head
  forward nor one undone past eos, which ``tokens / forward`` still counts), over one pass of
  the prompts;
* **shifted rounds**: those whose first draft the decode forward queued before them judged
  (``engines.workflow.speculative``; on a device with ``--pipelined``);
* **accept rate**: drafts the verifier accepted over drafts proposed;
* **accepted / round**: the mean accepted drafts a round;
* **tokens / forward**: the tokens after each prompt's first over the target's forwards
  after its prefill (verifications, plain steps, re-advances): what one forward of the
  target bought, 1.0 for greedy;
* **x greedy**: its tokens/s over the greedy row's of the same engine, package and prompts;
* **same tokens**: every prompt's speculative stream equals the greedy one. A batch-invariant
  engine must (claim 2): where it does not, the row is an ``error``, not a speed. Another
  engine may part at a near-tie; the row says where, and the parity run judges it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def round_figures(results: Sequence[Any]) -> dict[str, Any]:
    """The rounds of one pass over the prompts (``SpeculativeResult`` each), summed."""
    rounds = sum(len(r.widths_per_round) for r in results)
    drafted = sum(sum(r.widths_per_round) for r in results)
    accepted = sum(sum(r.acceptance_per_round) for r in results)
    forwards = sum(r.ledger.forwards["verify"] + r.ledger.forwards["decode"]
                   + r.ledger.forwards["readvance"] for r in results)
    after_first = sum(max(len(r.tokens) - 1, 0) for r in results)
    return {"rounds": rounds,
            "shifted_rounds": sum(sum(r.shifted_per_round) for r in results),
            "plain_steps": sum(r.ledger.forwards["decode"] - r.ledger.shifted_verifications
                               - r.ledger.discarded_forwards for r in results),
            "accept_rate": accepted / drafted if drafted else None,
            "accepted_per_round": accepted / rounds if rounds else None,
            "tokens_per_forward": after_first / forwards if forwards else None}


def first_parting(names: Sequence[str], speculative: Sequence[Any],
                  greedy: Sequence[Any]) -> str | None:
    """Where the first prompt's speculative stream leaves its greedy one (``name step k``),
    or None where every stream is the same."""
    for name, spec, ref in zip(names, speculative, greedy):
        if list(spec.tokens) != list(ref.tokens):
            step = next((i for i, (a, b) in enumerate(zip(spec.tokens, ref.tokens)) if a != b),
                        min(len(spec.tokens), len(ref.tokens)))
            return f"{name} step {step}"
    return None


__all__ = ["first_parting", "round_figures"]
