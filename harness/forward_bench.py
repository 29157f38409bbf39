"""One forward at a time, engine beside engine: prefill length and rows per forward.

``lockstep bench`` times whole decodes; two of native-cuda's targets are about single
forwards and need their own clock:

* **prefill**: the forward over a prompt of L tokens from position 0 (L = 512 in the
  issue's target), its last token read back (4 bytes, which waits for the device);
* **rows**: a forward over M new positions after a prefix of P tokens, the shape a
  speculative verification has (M = W + 1), against the M = 1 decode forward at the same
  position: the ratio ``ms(M) / ms(1)`` says what a verification costs over one decode step.

Each timed forward starts from the same state: the session is truncated back to where the
forward began, so every repeat does the same work at the same positions. Each row also
keeps its shape's first forward (``first_ms``, the first warm-up): what a shape the engine
has never run costs, its graph capture or its step memos' recording included. So that the
figure is the shape's and not the engine's start-up, every engine first runs one untimed
prefill of a length no timed shape has. Forwards run with
the phase the interpreter would give them (``prefill``; ``decode`` for M = 1, ``verify``
above), so native-cuda's graph slots capture on the warm-up and replay in the timed
repeats. Engines of one package are timed in turns, as in ``lockstep bench``. The prompt is
the package's prompts concatenated and repeated up to the length needed: real token ids,
deterministic, and the same for every engine.
"""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from engines.engine import Engine
from engines.errors import InputError
from engines.registry import get_engine_class
from engines.workflow.session import DecodeSession
from harness.bench import RowStatus
from harness.packages import resolve_package

FORMAT = 1
KIND = "lockstep-bench-forward"  # the JSON file's "kind"
MARKER = f'"kind": "{KIND}"'  # in a file's first bytes: `bench-forward --json` may replace it


@dataclass
class ForwardRow:
    """One engine's figure for one forward shape of one package."""

    package: str
    engine: str
    kind: Literal["prefill", "rows"]
    tokens: int  # L for prefill, M for rows
    prefix: int  # positions already in the cache when the forward starts
    status: RowStatus = "ok"
    reason: str = ""
    ms: float | None = None  # median wall time of one forward, its token on the host
    spread: float | None = None  # (max - min) / median
    times_ms: list[float] = field(default_factory=list)
    ratio: float | None = None  # rows: ms / ms at M=1 (same engine); prefill: ms / baseline's
    token: int | None = None  # the forward's last token: every repeat must give the same
    first_ms: float | None = None  # this shape's first forward on this engine (a warm-up)


def prompt_of_length(spec, length: int) -> list[int]:
    """``length`` real token ids: the package's prompts concatenated, repeated as needed."""
    pool = [int(t) for p in spec.prompts for t in p]
    if not pool:
        raise InputError(f"package {spec.name!r} declares no prompts", field="prompts",
                         value=[], remedy="give the package a prompt to build forwards from")
    return [pool[i % len(pool)] for i in range(length)]


def _check_lengths(spec, prefill: Sequence[int], rows: Sequence[int], prefix: int) -> None:
    for value in list(prefill) + list(rows):
        if not isinstance(value, int) or value < 1:
            raise InputError("a forward covers one or more positions", field="tokens",
                             value=value, remedy="give lengths of 1 or more")
    limit = spec.max_context
    if limit is None:
        return
    longest, reach = max(prefill, default=0), prefix + max(rows, default=0)
    where = f"past the max_context {limit} of package {spec.name!r}"
    if longest > limit:  # named by what the user gave: the prefill, or the rows' prefix
        raise InputError(f"a prefill of {longest} tokens goes {where}", field="prefill",
                         value=longest, remedy=f"use prefill lengths of at most {limit}")
    if reach > limit:
        raise InputError(f"{max(rows)} rows after a prefix of {prefix} reach position {reach}, "
                         f"{where}", field="prefix", value=prefix,
                         remedy=f"use a smaller --prefix or --rows (prefix + rows at most "
                                f"{limit})")


def _time_forward(engine: Engine, session: DecodeSession, prefix_ids: Sequence[int],
                  ids: Sequence[int], start: int, phase: str) -> tuple[float, int]:
    """One forward of ``ids`` at position ``start``, its last token read back: (seconds,
    that token).
    The prefix before ``start`` is written again first (untimed), so every repeat finds the
    same cache whatever ran before it."""
    session.truncate(0)
    if start:
        session.forward(prefix_ids[:start], "prefill")
    engine.synchronize()
    t0 = time.perf_counter()
    out = session.forward(list(ids), phase)
    token = session.last_token(out["logits"])  # 4 bytes back: the forward has finished
    engine.synchronize()
    return time.perf_counter() - t0, token


def start_up_length(spec, prefill: Sequence[int], rows: Sequence[int],
                    prefix: int) -> int | None:
    """The length of the untimed prefill an engine runs first: one that no timed shape has,
    nor the rows' prefix (so no shape's first forward replays what it made), within
    max_context; None where every length up to max_context is taken."""
    taken = set(prefill) | set(rows) | ({prefix} if rows else set())
    limit = spec.max_context if spec.max_context is not None else max(taken, default=0) + 2
    return next((n for n in range(2, limit + 1) if n not in taken), None)


def _summary(row: ForwardRow, seconds: list[float]) -> None:
    row.times_ms = [s * 1e3 for s in seconds]
    row.ms = statistics.median(row.times_ms)
    row.spread = (max(row.times_ms) - min(row.times_ms)) / row.ms if row.ms else None


def bench_forwards(engines: Sequence[str], packages: Sequence[Any], *,
                   prefill: Sequence[int] = (), rows: Sequence[int] = (1,), prefix: int = 64,
                   repeats: int = 10, warmup: int = 2,
                   on_step: Callable[[str], None] | None = None) -> list[ForwardRow]:
    """Time every engine on every package's forward shapes; one row per shape and engine.

    ``prefill`` lists prompt lengths timed from position 0; ``rows`` lists M values timed at
    position ``prefix``. An engine that cannot run here (or fails) gets rows with that
    status and reason; the others go on."""
    if repeats < 1 or warmup < 0:
        raise InputError("repeats must be 1 or more and warmup 0 or more", field="repeats",
                         value=(repeats, warmup), remedy="e.g. --repeats 10 --warmup 2")
    tell = on_step or (lambda text: None)
    out: list[ForwardRow] = []
    for ref in packages:
        package = ref if hasattr(ref, "spec") else resolve_package(ref)
        spec = package.spec
        _check_lengths(spec, prefill, rows, prefix)
        start_up = start_up_length(spec, prefill, rows, prefix)
        longest = max([*prefill, prefix + max(rows, default=0), start_up or 0], default=0)
        ids = prompt_of_length(spec, longest)
        shapes = ([("prefill", n, 0, "prefill") for n in prefill]
                  + [("rows", m, prefix, "decode" if m == 1 else "verify") for m in rows])
        live: dict[str, tuple[Engine, DecodeSession]] = {}
        table: dict[tuple[str, str, int], ForwardRow] = {}
        for name in engines:
            cls = get_engine_class(name)
            for kind, n, start, _ in shapes:
                table[(name, kind, n)] = ForwardRow(spec.name, name, kind, n, start)
            avail = cls.availability()
            reason = avail.reason if not avail.ok else (
                "the engine decodes by itself: it runs no single forward"
                if cls.decodes_itself else "")
            if reason:
                for key in [k for k in table if k[0] == name]:
                    table[key].status, table[key].reason = "unavailable", reason
                continue
            try:
                engine = cls(package)
                live[name] = (engine, DecodeSession(engine))
                if start_up is not None:  # the engine's own first-forward costs, untimed
                    _time_forward(engine, live[name][1], ids, ids[:start_up], 0, "prefill")
            except Exception as exc:
                for key in [k for k in table if k[0] == name]:
                    table[key].status = "error"
                    table[key].reason = f"{type(exc).__name__}: {exc}"
        timings: dict[tuple[str, str, int], list[float]] = {k: [] for k in table}
        # one shape at a time (its warm-up, then its repeats back to back, engines in turns):
        # a graph slot holds one signature, so interleaving M=2 and M=3 verifications would
        # recapture the VERIFY graph on every forward and time captures, not replays
        for kind, n, start, phase in shapes:
            for name, (engine, session) in list(live.items()):  # warm-up: capture, allocations
                try:
                    for w in range(warmup):
                        seconds, _ = _time_forward(engine, session, ids, ids[start:start + n],
                                                   start, phase)
                        if w == 0:
                            table[(name, kind, n)].first_ms = seconds * 1e3
                except Exception as exc:
                    row = table[(name, kind, n)]
                    row.status, row.reason = "error", f"{type(exc).__name__}: {exc}"
            for r in range(repeats):
                for name, (engine, session) in live.items():
                    row = table[(name, kind, n)]
                    if row.status != "ok":
                        continue
                    try:
                        seconds, token = _time_forward(engine, session, ids,
                                                       ids[start:start + n], start, phase)
                    except Exception as exc:
                        row.status, row.reason = "error", f"{type(exc).__name__}: {exc}"
                        continue
                    timings[(name, kind, n)].append(seconds)
                    if row.token is None:
                        row.token = token
                    elif token != row.token:  # the same forward on the same state
                        row.status = "error"
                        row.reason = (f"repeats disagree: token {row.token}, then {token} "
                                      "from the same forward on the same cache")
            tell(f"{spec.name}: {kind} {n} timed ({repeats} repeats)")
        for engine, _ in live.values():
            engine.close()
        for key, row in table.items():
            if row.status == "ok":
                _summary(row, timings[key])
        for name in engines:
            one = table.get((name, "rows", 1))
            for m in rows:
                row = table[(name, "rows", m)]
                if one is not None and one.ms and row.ms is not None:
                    row.ratio = row.ms / one.ms
        base = engines[0]
        for n in prefill:
            ref_row = table[(base, "prefill", n)]
            for name in engines:
                row = table[(name, "prefill", n)]
                if ref_row.ms and row.ms is not None:
                    row.ratio = row.ms / ref_row.ms
        out.extend(table.values())
    return out


def write_json(rows: Sequence[ForwardRow], path: Path, settings: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": FORMAT, "kind": KIND, "settings": settings,
                                "rows": [asdict(r) for r in rows]}, indent=2))
    return path
