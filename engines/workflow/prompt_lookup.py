"""Prompt lookup (kind ``prompt-lookup``): drafts copied from the sequence itself.

A grounded request (summarise, edit or repeat a given text or code) makes the model copy runs
of its prompt. The proposer finds the latest earlier occurrence of the sequence's last n
tokens (n from ``max_ngram`` down to ``min_ngram``) in the prompt and the tokens committed so
far, and proposes the W tokens that followed it. It runs no model and keeps no device state:
the tokens are already on the host, so a round reads back nothing but the verification's 8
bytes. Whatever it proposes, the target's verification decides every token, so a wrong
draft can only cost acceptance, never change the stream.

- **Index.** For every n, a dict from each n-gram to the position after its latest earlier
  occurrence, extended by the positions committed since the last round (the sequence only
  grows; a sequence that does not extend the indexed one is indexed afresh).
- **Copy with overlap.** A continuation that runs into the sequence's end goes on from the
  drafts themselves (the way a repeating pattern repeats), so every match gives W drafts.
- **No match** (no suffix of ``min_ngram`` tokens occurred before): no drafts; the session
  decodes that token plainly (one M = 1 forward, as greedy).
- **Fixed width** (``fixed_width``): drafting costs nothing, so near ``max_new_tokens`` the
  session still verifies W drafts (where the context has room) and commits only what is
  left; every verification then has one shape, which a device engine captures once.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class PromptLookupProposer:
    """Drafts from the latest earlier occurrence of the sequence's final n-gram."""

    fixed_width = True  # every verification W wide (see the module doc)

    def __init__(self, spec):
        """``spec``: the package's ``decoding.speculative`` (``max_ngram``, ``min_ngram``)."""
        self.sizes = list(range(spec.max_ngram, spec.min_ngram - 1, -1))  # longest first
        self.seen: list[int] = []
        # n -> {n-gram: the position after its latest occurrence that ends before the last}
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}

    def _extend(self, sequence: Sequence[int]) -> None:
        """Index every n-gram that ends before the sequence's last position."""
        if sequence[:len(self.seen)] != self.seen:  # not a continuation: start over
            self.seen = []
            for table in self.index.values():
                table.clear()
        start = len(self.seen)
        self.seen = list(sequence)
        for end in range(max(start, 1), len(sequence)):
            for n, table in self.index.items():
                if end >= n:
                    table[tuple(sequence[end - n:end])] = end

    def match(self, sequence: Sequence[int]) -> int | None:
        """Where the copied continuation starts: the position after the latest earlier
        occurrence of the longest final n-gram that occurred before; None without one."""
        self._extend(sequence)
        length = len(sequence)
        for n in self.sizes:
            if length > n:
                start = self.index[n].get(tuple(sequence[length - n:]))
                if start is not None:
                    return start
        return None

    def propose(self, sequence: Sequence[int], width: int) -> list[int]:
        """``width`` drafts after ``sequence`` (prompt + committed tokens, the last one
        pending), or none where no final n-gram occurred before."""
        sequence = list(sequence)
        start = self.match(sequence)
        if start is None:
            return []
        drafts: list[int] = []
        for k in range(width):
            at = start + k
            drafts.append(sequence[at] if at < len(sequence) else drafts[at - len(sequence)])
        return drafts

    def after_round(self, committed: list[int], **_: Any) -> None:
        """Nothing to undo: the proposer holds no state beyond the committed tokens."""
