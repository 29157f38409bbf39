"""The reference engine's greedy streams, kept per process to guess the oracle's own stream.

Where a judged stream leaves the oracle's, the oracle guesses the rest of its own stream by
its engine's cached greedy decode and verifies the guess in one forward
(``harness.package_judge.with_guesser``). That decode reads every weight once a token (SmolLM2
in float32: about 35 ms a step on one core), and every judge of the same package and prompt
ran it again from wherever its engine left the oracle. A decode is kept here under what it
was computed from (the engine class, the package's content hash, the component) and serves
any later guess whose sequence it extends. It stays a guess: the oracle verifies every token
of it in its own forward from zero state, so a kept stream changes what judging costs, never
a row, a token or a verdict.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

MAX_SOURCES = 8  # (engine, package content, component) triples kept
MAX_STREAMS = 64  # sequences kept a source, the latest first out


class GreedyStreams:
    """Sequences (prompt and greedy continuation) by source; a guess is served by a kept
    sequence that extends the asked prefix far enough, or that ended at eos."""

    def __init__(self):
        self._by_source: OrderedDict[Hashable, list[tuple[tuple[int, ...], bool]]] = \
            OrderedDict()
        self._lock = threading.Lock()

    def guess(self, source: Hashable, ids: Sequence[int], n: int, eos: int | None,
              decode: Callable[[list[int], int], Sequence[int]]) -> list[int]:
        """The next ``n`` tokens after ``ids`` (fewer where the stream ends at ``eos``): a
        kept sequence's, else ``decode(ids, n)``'s, which is kept."""
        prefix = tuple(int(t) for t in ids)
        with self._lock:
            for seq, ended in self._by_source.get(source, ()):
                if seq[:len(prefix)] == prefix and (len(seq) >= len(prefix) + n or ended):
                    self._by_source.move_to_end(source)
                    return list(seq[len(prefix):len(prefix) + n])
        tokens = [int(t) for t in decode(list(prefix), n)]
        ended = bool(tokens) and eos is not None and tokens[-1] == eos
        with self._lock:
            kept = self._by_source.setdefault(source, [])
            kept.insert(0, (prefix + tuple(tokens), ended))
            del kept[MAX_STREAMS:]
            self._by_source.move_to_end(source)
            while len(self._by_source) > MAX_SOURCES:
                self._by_source.popitem(last=False)
        return tokens


STREAMS = GreedyStreams()


__all__ = ["GreedyStreams", "STREAMS"]
