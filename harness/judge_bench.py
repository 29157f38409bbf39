"""What judging costs beside what decoding costs, as the prompt grows (``lockstep bench-judge``).

For each prompt length, one greedy cell per engine runs through the real runner
(``run_matrix``: the same judge, oracle and audit as a parity run) on a prompt of exactly that
many tokens: the first tokens of our own long text (``harness/texts/long_context.txt``)
where the package has a tokenizer, else seeded ids. Each cell reports the engine's decode
wall time (prefill and every step) and the judge's wall time for the same cell (oracle
forwards, guesses, the verdict and the logits audit; loading either side is left out of
both). The growth with length is the exponent of judge seconds in total positions between
consecutive lengths (1: linear, 2: quadratic), and over all of them by least squares on the
log-log points.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from engines.errors import InputError
from engines.oracle import STREAM
from engines.tokenizer import package_tokenizer
from harness.packages import resolve_package
from harness.prompts_long import paragraphs
from harness.runner import run_matrix

DEFAULT_LENGTHS = (32, 128, 512, 2048)
KIND = "lockstep-bench-judge"  # the JSON file's "kind"
MARKER = f'"kind": "{KIND}"'  # in a file's first bytes: `bench-judge --json` may replace it


@dataclass
class JudgeCost:
    """One cell: an engine on a prompt of ``prompt_tokens`` tokens."""
    engine: str
    package: str
    oracle_mode: str
    prompt_tokens: int
    new_tokens: int
    status: str
    engine_s: float
    judge_s: float
    oracle_forwards: int
    oracle_positions: int

    @property
    def ratio(self) -> float | None:
        return self.judge_s / self.engine_s if self.engine_s > 0 else None


@dataclass
class JudgeBench:
    package: str
    max_new_tokens: int
    oracle_mode: str
    rows: list[JudgeCost] = field(default_factory=list)

    def growth(self, engine: str) -> tuple[list[float | None], float | None]:
        """Per step between consecutive lengths, and fitted over all: the exponent of the
        judge's seconds in the total positions (prompt + new tokens)."""
        rows = sorted((r for r in self.rows if r.engine == engine and r.judge_s > 0),
                      key=lambda r: r.prompt_tokens)
        xs = [math.log(r.prompt_tokens + r.new_tokens) for r in rows]
        ys = [math.log(r.judge_s) for r in rows]
        steps: list[float | None] = [None]
        for i in range(1, len(rows)):
            steps.append((ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1]) if xs[i] > xs[i - 1]
                         else None)
        fit = float(np.polyfit(xs, ys, 1)[0]) if len(rows) >= 2 else None
        return steps, fit

    def to_dict(self) -> dict:
        engines = list(dict.fromkeys(r.engine for r in self.rows))
        return {"kind": KIND, "package": self.package, "max_new_tokens": self.max_new_tokens,
                "oracle_mode": self.oracle_mode,
                "rows": [asdict(r) | {"ratio": r.ratio} for r in self.rows],
                "growth": {e: {"steps": self.growth(e)[0], "fit": self.growth(e)[1]}
                           for e in engines}}


def prompt_of_length(package, n: int) -> list[int]:
    """Exactly ``n`` prompt ids: the first tokens of our long text, or seeded ids."""
    tok = package_tokenizer(package)
    if tok is not None:
        text = "\n\n".join(paragraphs())
        ids = list(tok.encode(text, add_special_tokens=True))
        while len(ids) < n:
            ids += list(tok.encode("\n\n" + text, add_special_tokens=False))
        return [int(t) for t in ids[:n]]
    rng = np.random.default_rng(n)
    low = min(3, package.spec.vocab_size - 1)
    return [int(t) for t in rng.integers(low, package.spec.vocab_size, n)]


def _check_fit(package, lengths: Sequence[int], max_new_tokens: int) -> None:
    """Every length and the new tokens within the package's context; where the new tokens
    alone leave no room for a prompt, they are what to change, not the lengths."""
    limit, name = package.spec.max_context, package.spec.name
    room = limit - max_new_tokens
    if room < 1:
        shortest = min(lengths, default=1)
        most = limit - shortest
        raise InputError(f"{max_new_tokens} new tokens fill the context of {name!r} ({limit}): "
                         f"no prompt length fits", field="--max-new-tokens",
                         value=max_new_tokens,
                         remedy=f"ask for at most {most} --max-new-tokens (for the shortest "
                                f"length, {shortest})" if most >= 1 else
                                f"give lengths below {limit} and fewer --max-new-tokens")
    for n in lengths:
        if n > room:
            raise InputError(f"a {n}-token prompt and {max_new_tokens} new tokens exceed the "
                             f"context of {name!r} ({limit})", field="--lengths", value=n,
                             remedy=f"keep each length within {room}, or ask for fewer "
                                    f"--max-new-tokens")


def bench_judge(engines: Sequence[str], package_ref: str, lengths: Sequence[int],
                max_new_tokens: int, oracle_mode: str = STREAM,
                on_cell=None) -> JudgeBench:
    """Every engine at every length, each cell through ``run_matrix``; a length that does
    not fit the package's context is refused before anything runs."""
    package = resolve_package(package_ref)
    _check_fit(package, lengths, max_new_tokens)
    bench = JudgeBench(package.spec.name, max_new_tokens, oracle_mode)
    for n in lengths:
        prompt = prompt_of_length(package, n)
        summary = run_matrix(list(engines), [str(package.root)], [prompt], max_new_tokens,
                             oracle_mode=oracle_mode)
        for cell in summary.cells:
            row = JudgeCost(cell.engine, package.spec.name, oracle_mode, n, len(cell.tokens),
                            cell.status, cell.wall_s, cell.judge_s, cell.oracle_forwards,
                            cell.oracle_positions)
            bench.rows.append(row)
            if on_cell:
                on_cell(row)
    return bench


__all__ = ["DEFAULT_LENGTHS", "JudgeBench", "JudgeCost", "bench_judge",
           "prompt_of_length"]
