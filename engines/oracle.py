"""The oracle: the simplest possible decode, every other path is compared to it.

Every logits row it gives is computed from fresh zero state on a reference engine: no cache
carried between forwards, no speculation, and none of the interpreter's state handling, so a
bug there cannot hide in both sides of a comparison. Two modes give the same rows:

- ``stream`` (the default) scores a whole stream in one forward: prompt + tokens fed at once,
  row ``t`` is the logits after the first ``t`` tokens (causal attention makes it the same
  function as recomputing that prefix alone; ``llama-perplexity`` and vLLM's
  ``prompt_logprobs`` score a sequence the same way). One forward per distinct stream;
  streams that share a prefix share its rows. Judging costs what one prefill costs.
- ``recompute`` runs one forward per prefix (the cost grows with the square of the length),
  kept to audit the oracle itself: ``suites/test_oracle_modes.py`` shows the two agree.

The oracle's own greedy stream (``Oracle.decode``) is found by verified proposals in stream
mode: a continuation is guessed (a stream already scored for the prompt, else the
``guesser``'s, such as the reference engine's own cached greedy decode that the harness
plugs in: only ever a guess), scored in one forward, and accepted up to the first step whose
argmax differs, where the argmax is taken and the next guess starts. Every token of it is
the argmax of a from-scratch forward over its prefix.

``oracle_for(package)`` picks the oracle that judges a package: over its declared reference
(a reduced-precision package's float32 twin) when it has one, else over the package itself.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engines.dtypes import dtype_of
from engines.engine import Engine
from engines.errors import ExecutionError, InputError, PackageError
from engines.package.sibling import pinned_sibling
from engines.registry import REFERENCE_ENGINE, get_engine_class
from engines.requests import check_request

STREAM, RECOMPUTE = "stream", "recompute"
ORACLE_MODES = (STREAM, RECOMPUTE)


@dataclass
class OracleTrace:
    engine: str
    prompt: list[int]
    tokens: list[int]
    margins: list[float]  # top-2 logit margin of every generated step
    top2: list[tuple[int, int]]  # (best, runner-up) token ids per step
    mode: str = STREAM  # the oracle mode whose rows chose these tokens

    @property
    def min_margin(self) -> float:
        return min(self.margins) if self.margins else float("inf")


def _nan_error(row: np.ndarray) -> ExecutionError:
    return ExecutionError("the reference produced NaN logits", field="logits",
                          value=f"{int(np.isnan(row).sum())} NaN of {row.size}",
                          remedy="check the package's weights and inputs")


def top2_margin(row: np.ndarray) -> tuple[int, int, float]:
    """Best id (lowest on ties), runner-up id and their logit gap, in float64."""
    row = np.asarray(row, dtype=np.float64)
    if np.isnan(row).any():
        raise _nan_error(row)
    best = int(np.argmax(row))
    rest = row.copy()
    rest[best] = -np.inf
    second = int(np.argmax(rest))
    return best, second, float(row[best] - row[second])


def check_oracle_mode(mode: str, field: str = "oracle_mode") -> str:
    if mode not in ORACLE_MODES:
        raise InputError("unknown oracle mode", field=field, value=mode,
                         remedy=f"use one of: {', '.join(ORACLE_MODES)}")
    return mode


def _fresh_state(spec, component: str) -> dict[str, np.ndarray]:
    return {cell.input: np.zeros(tuple(cell.shape), dtype=dtype_of(cell.dtype))
            for cell in spec.state.values() if cell.component == component}


@dataclass
class OracleCost:
    """What the oracle spent: forwards, positions fed, seconds in forwards and guesses."""
    forwards: int = 0
    positions: int = 0
    seconds: float = 0.0
    guesses: int = 0  # cached greedy decodes run only to guess a continuation
    failed_guesses: int = 0  # guesses that raised: that round went one step at a time


class Oracle:
    """Logits rows from zero state over any prefix, in float64, cached by prefix.

    ``row(prefix)``: the last position's logits after ``prefix``. ``stream_rows(prompt,
    tokens)``: the ``len(tokens) + 1`` rows after ``prompt + tokens[:t]``, one forward in
    stream mode. The runner judges every engine's stream on the prefix that engine produced,
    so one oracle per package serves every engine, width and prompt; streams that agree share
    their rows. NaN in a row is an ``ExecutionError``.
    """

    def __init__(self, package, engine=None, component: str = "target", mode: str = STREAM):
        if engine is None:
            engine = get_engine_class(REFERENCE_ENGINE)(package)
        self.package = package
        self.spec = package.spec
        self.engine = engine
        self.component = component
        self.mode = check_oracle_mode(mode)
        comp = self.spec.components[component]
        self._tokens_in = comp.inputs["tokens"]
        self._positions_in = comp.inputs.get("positions")
        self._logits_out = comp.outputs["logits"]
        self._rows: dict[tuple[int, ...], np.ndarray] = {}
        self._scored: dict[tuple[int, ...], list[tuple[int, ...]]] = {}  # prompt -> streams
        self.cost = OracleCost()
        # (ids, n) -> a guess of the next n tokens after ids, e.g. the reference engine's own
        # cached greedy decode (set by the harness: the oracle never runs the interpreter)
        self.guesser: Callable[[list[int], int], Sequence[int]] | None = None

    @property
    def name(self) -> str:
        return self.engine.name

    # -- rows ------------------------------------------------------------------------------

    def row(self, prefix: Sequence[int]) -> np.ndarray:
        """float64 logits of the position after ``prefix``."""
        key = tuple(int(t) for t in prefix)
        cached = self._rows.get(key)
        if cached is None:
            self._score(key, len(key) - 1)
            cached = self._rows[key]
        return np.asarray(cached, dtype=np.float64)

    def stream_rows(self, prompt: Sequence[int], tokens: Sequence[int]) -> list[np.ndarray]:
        """The float64 rows after ``prompt + tokens[:t]`` for t = 0..len(tokens): in stream
        mode one forward over ``prompt + tokens`` (none when every row is cached), in recompute
        mode one forward per uncached prefix."""
        seq = tuple(int(t) for t in prompt) + tuple(int(t) for t in tokens)
        n0 = len(seq) - len(tokens)
        missing = [t for t in range(len(tokens) + 1) if seq[:n0 + t] not in self._rows]
        if self.mode == STREAM:
            if missing:
                self._score(seq, n0 - 1 + missing[0])
            known = self._scored.setdefault(seq[:n0], [])
            if seq[n0:] not in known:
                known.append(seq[n0:])
        return [self.row(seq[:n0 + t]) for t in range(len(tokens) + 1)]

    def _score(self, seq: tuple[int, ...], first: int) -> None:
        """One forward over ``seq`` from zero state; rows ``first..len(seq)-1`` are cached
        under the prefixes they follow."""
        n = len(seq)
        limit = self.spec.max_context
        if n > limit:
            raise InputError(f"the oracle cannot score {n} positions in one forward: "
                             f"{self.spec.name!r} holds at most max_context {limit}",
                             field="max_context", value=n,
                             remedy=f"keep prompt + new tokens within {limit} (fewer new tokens "
                                    f"or a shorter prompt), or convert the checkpoint with a "
                                    f"larger --max-context")
        feeds = {self._tokens_in: np.asarray(seq, dtype=np.int64).reshape(1, n)}
        if self._positions_in:
            feeds[self._positions_in] = np.arange(n, dtype=np.int64).reshape(1, n)
        feeds.update(_fresh_state(self.spec, self.component))
        start = time.perf_counter()
        rows = self._rows_from(feeds, first)
        self.cost.forwards += 1
        self.cost.positions += n
        self.cost.seconds += time.perf_counter() - start
        for i, row in enumerate(rows):
            if np.isnan(row).any():
                raise _nan_error(np.asarray(row))
            self._rows[seq[:first + i + 1]] = row

    def _rows_from(self, feeds: dict[str, np.ndarray], first: int) -> np.ndarray:
        """Logits rows ``first..n-1`` [k, V] on the host. On a device engine (an oracle chosen
        with ``--oracle-engine``) the feeds are adopted and only those rows are staged back,
        through the oracle engine's own tensor ops: that engine is the oracle's alone, never a
        judged one, so its crossings are outside every budget."""
        # a bare run_component wrapper (the fixtures' conditioning recorder) is a host one
        if not isinstance(self.engine, Engine) or self.engine.residency == "host":
            out = self.engine.run_component(self.component, feeds)[self._logits_out]
            return np.asarray(out)[0, first:]
        ops = self.engine.tensor_ops
        out = self.engine.run_component(self.component,
                                        {k: ops.adopt(v) for k, v in feeds.items()})
        logits = out[self._logits_out]
        n = int(logits.shape[1])
        rows = ops.slice_axis(logits, 1, first, n - first)
        return ops.stage_to_host(rows, "oracle_rows")[0]

    # -- the oracle's own stream --------------------------------------------------------------

    def decode(self, prompt: Sequence[int], max_new_tokens: int,
               hint: Sequence[int] = ()) -> OracleTrace:
        """The oracle's own greedy stream (lowest index on exact ties), stopping at eos.
        ``hint`` (stream mode): a stream believed to be close to it, such as a judged
        engine's, scored first as the guess; it changes what the search costs, never what it
        finds."""
        ids = check_request(self.spec, prompt, max_new_tokens)
        eos = self.spec.eos_id
        if self.mode == STREAM and hint:
            self.stream_rows(ids, self._usable(hint, max_new_tokens))
        tokens, margins, top2 = [], [], []
        while len(tokens) < max_new_tokens and not (tokens and tokens[-1] == eos):
            guess = self._guess(ids, tokens, max_new_tokens) if self.mode == STREAM else []
            rows = self.stream_rows(ids, tokens + guess)[len(tokens):]
            for i, row in enumerate(rows):
                best, second, margin = top2_margin(row)
                tokens.append(best)
                margins.append(margin)
                top2.append((best, second))
                if (len(tokens) == max_new_tokens or best == eos or i >= len(guess)
                        or best != guess[i]):
                    break
        return OracleTrace(self.name, ids, tokens, margins, top2, self.mode)

    def _usable(self, stream: Sequence[int], max_new_tokens: int) -> list[int]:
        """The part of ``stream`` that can be fed: up to ``max_new_tokens``, up to eos, and
        before the first id outside the vocabulary."""
        usable = []
        for token in stream[:max_new_tokens]:
            if not 0 <= int(token) < self.spec.vocab_size:
                break
            usable.append(int(token))
            if usable[-1] == self.spec.eos_id:
                break
        return usable

    def _guess(self, ids: list[int], tokens: list[int], max_new_tokens: int) -> list[int]:
        """A continuation of ``ids + tokens`` to score in one forward: the longest stream
        already scored for this prompt that extends ``tokens``, else the ``guesser``'s (a
        guess only: every token is verified), else none (the next row alone)."""
        done = tuple(tokens)
        known = [s for s in self._scored.get(tuple(ids), ()) if s[:len(done)] == done
                 and len(s) > len(done)]
        if known:
            return list(max(known, key=len)[len(done):max_new_tokens])
        if self.guesser is None:
            return []
        start = time.perf_counter()
        self.cost.guesses += 1
        try:
            return [int(t) for t in self.guesser(ids + tokens, max_new_tokens - len(tokens))]
        except Exception:  # noqa: BLE001 - a guess that fails costs time, never a verdict
            self.cost.failed_guesses += 1
            return []
        finally:
            self.cost.seconds += time.perf_counter() - start


def oracle_decode(package, prompt: Sequence[int], max_new_tokens: int, engine=None,
                  component: str = "target", mode: str = STREAM) -> OracleTrace:
    """The oracle's greedy stream on ``engine`` (an engine instance for ``package``, or None
    for ``ort-cpu``): every token the argmax of a from-scratch forward over its prefix."""
    return Oracle(package, engine, component, mode).decode(prompt, max_new_tokens)


# -- which oracle judges a package ----------------------------------------------------------
# A reduced-precision package (float16, bfloat16) declares its float32 twin in package.yaml
# (``reference: {folder, content_hash}``, written by ``lockstep convert``). The oracle then
# runs the twin, not the package: the reference stays the model's own function, independent
# of the reduced arithmetic under test (onnxruntime's CPU provider widens every float16 op it
# lacks a kernel for to float32 and runs no bfloat16 MatMul at all, so the package itself on
# ort-cpu would hide an overflow and cannot judge bfloat16). Streams are still judged with
# the judged package's own dtype row (``tolerance_for(package.spec.dtype)``).

def reference_package(package):
    """The package the oracle runs to judge ``package``: the reference it declares (a sibling
    folder whose content hash must match), else ``package`` itself."""
    ref = package.spec.reference
    if ref is None:
        return package
    where = str(package.yaml_path)
    remedy = (f"put the reference package {ref.folder!r} beside {package.root.name!r} (for a "
              f"converted checkpoint: run lockstep convert with --dtype "
              f"{package.spec.dtype} again, which writes its float32 twin there)")
    twin = pinned_sibling(package, ref, "reference", "reference", remedy)
    mine, theirs = package.spec, twin.spec
    for key in ("vocab_size", "bos_id", "eos_id"):
        if getattr(mine, key) != getattr(theirs, key):
            raise PackageError(f"the reference package {ref.folder!r} has {key} "
                               f"{getattr(theirs, key)}, this package {getattr(mine, key)}: "
                               f"it cannot judge this package's tokens",
                               field="reference.folder", value=ref.folder,
                               remedy="reference the float32 conversion of the same "
                                      "checkpoint", where=where)
    if theirs.reference is not None:
        raise PackageError(f"the reference package {ref.folder!r} declares a reference of its "
                           f"own; a reference must be judged by itself", field="reference",
                           value=ref.folder, remedy="reference the float32 package directly",
                           where=where)
    if theirs.max_context < mine.max_context:
        raise PackageError(f"the reference package {ref.folder!r} holds {theirs.max_context} "
                           f"positions, fewer than this package's {mine.max_context}",
                           field="reference.folder", value=ref.folder,
                           remedy="convert the reference with at least this max_context",
                           where=where)
    return twin


def oracle_for(package, engine_name: str | None = None, component: str = "target",
               mode: str = STREAM) -> Oracle:
    """The oracle that judges ``package``: on ``engine_name`` (default: the reference engine,
    ``ort-cpu``), over the package's declared reference (its float32 twin) or, without one,
    over the package itself. ``oracle.package`` is the package it runs: record its content
    hash beside the oracle's engine and mode in evidence."""
    check_oracle_mode(mode)
    target = reference_package(package)
    engine = get_engine_class(engine_name or REFERENCE_ENGINE)(target)
    return Oracle(target, engine, component, mode)
