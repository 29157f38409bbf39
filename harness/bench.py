"""Decode speed, engine beside engine in one process: tokens/s, step time, ratio to a baseline.

Speed claims are ratios measured side by side, never absolute numbers compared across runs
or machines. So every engine of a package is loaded at once, warmed up, and timed in turns
(repeat r of every engine before repeat r+1 of any), and each engine's median tokens/s is
divided by the baseline engine's median from the same run. A device engine's stream is
synchronised before the clock starts and before it stops, so a wall time covers the work
itself and not only its launch.
"""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engines.engine import Engine
from engines.errors import EngineUnavailable, InputError, LockstepError
from engines.registry import REFERENCE_ENGINE, get_engine_class
from engines.workflow import greedy_decode
from engines.workflow.speculative import check_width, speculative_decode
from engines.workflow.validation import check_request

MODES = ("greedy", "speculative")
OK, UNAVAILABLE, ERROR = "ok", "unavailable", "error"
FORMAT = 1  # the JSON file's layout version


@dataclass
class BenchRow:
    """One (package, engine, mode): per-repeat measurements and their summary."""

    package: str
    engine: str
    mode: str  # "greedy" or "<kind>/w<width>"
    status: str  # ok | unavailable | error
    reason: str = ""
    residency: str = ""
    prompt: list[int] = field(default_factory=list)
    max_new_tokens: int = 0
    new_tokens: int = 0  # tokens one decode produced (fewer than asked when eos came first)
    repeats: int = 0
    tokens_per_s: list[float] = field(default_factory=list)  # one per timed decode
    tokens_per_s_median: float | None = None
    tokens_per_s_min: float | None = None
    tokens_per_s_max: float | None = None
    # wall ms of one step after the prefill, median over every step of every repeat; a step
    # is a decode forward (greedy) or a whole round (speculative), and ends in a token
    # readback, so on a device it includes the work, not only the launch
    step_ms: float | None = None
    tokens_per_step: float | None = None
    # the ledger's own account: phase_seconds / forwards per phase, over every timed decode;
    # the interpreter times run_component without a sync, so on a device engine this is the
    # host-side launch time unless the engine synchronises inside its forward
    forward_ms: dict[str, float] = field(default_factory=dict)
    baseline: str = ""
    ratio: float | None = None  # tokens_per_s_median / the baseline's, same package and mode

    @property
    def measured(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class BenchTarget:
    """What one package is benchmarked with: its prompt and mode label (and width)."""

    package: Any  # engines.package.Package
    prompt: list[int]
    width: int | None
    label: str


@dataclass(frozen=True)
class BenchPlan:
    """A validated request: every bad input has failed before anything is timed."""

    engines: tuple[tuple[str, type[Engine]], ...]
    targets: tuple[BenchTarget, ...]
    mode: str
    repeats: int
    warmup: int
    max_new_tokens: int
    baseline: str

    @property
    def total_decodes(self) -> int:
        """Warm-up and timed decodes over the whole plan (a progress bar's total)."""
        per = self.warmup + self.repeats + (1 if self.mode == "speculative" else 0)
        return len(self.engines) * len(self.targets) * per


def _positive(value, field_name: str, remedy: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{field_name} must be a positive integer", field=field_name,
                         value=value, remedy=remedy)
    return value


def _engine_entry(ref: str | type[Engine]) -> tuple[str, type[Engine]]:
    if isinstance(ref, type) and issubclass(ref, Engine):
        return ref.name, ref
    return str(ref), get_engine_class(str(ref))  # an unknown name fails here, listing the valid


def plan_bench(engines: Sequence[str | type[Engine]], packages: Sequence[Any],
               mode: str = "greedy", width: int | None = None, repeats: int = 5,
               max_new_tokens: int = 32, baseline: str | type[Engine] = REFERENCE_ENGINE,
               warmup: int = 1, prompt: Sequence[int] | None = None) -> BenchPlan:
    """Validate a benchmark request and resolve its packages; nothing is timed yet.

    ``engines`` are names (or ``Engine`` subclasses); the baseline joins them when missing,
    since a ratio means something only against a baseline timed in the same run.
    ``packages`` are fixture names, folders or loaded packages. ``width`` (speculative only)
    defaults to each package's ``max_width``. ``prompt`` defaults to each package's first."""
    from harness.packages import resolve_package

    if mode not in MODES:
        raise InputError("unknown mode", field="mode", value=mode,
                         remedy=f"use one of: {', '.join(MODES)}")
    if width is not None and mode != "speculative":
        raise InputError("a width applies to speculative decoding only", field="width",
                         value=width, remedy="use mode speculative, or drop the width")
    if width is not None:
        _positive(width, "width", "give a speculative width of 1 or more")
    _positive(repeats, "repeats", "time at least one decode per engine (repeats >= 1)")
    _positive(max_new_tokens, "max_new_tokens", "ask for one or more new tokens")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise InputError("warmup must be a non-negative integer", field="warmup", value=warmup,
                         remedy="give 0 or more warm-up decodes (1 is the default)")
    if not engines:
        raise InputError("no engines to benchmark", field="engines", value=list(engines),
                         remedy="name one or more engines, e.g. ort-cpu,native-host")
    if not packages:
        raise InputError("no packages to benchmark", field="packages", value=list(packages),
                         remedy="name one or more packages, e.g. tiny_llama")
    entries = dict(_engine_entry(e) for e in engines)
    base_name, base_cls = _engine_entry(baseline)
    entries.setdefault(base_name, base_cls)

    targets = []
    for ref in packages:
        package = ref if hasattr(ref, "spec") else resolve_package(ref)
        spec = package.spec
        chosen = list(prompt) if prompt is not None else (list(spec.prompts[0]) if spec.prompts
                                                          else None)
        if chosen is None:
            raise InputError(f"package {spec.name!r} declares no prompts", field="prompt",
                             value=None, remedy="give a prompt (token ids) to benchmark with")
        ids = check_request(spec, chosen, max_new_tokens)
        if mode == "greedy":
            targets.append(BenchTarget(package, ids, None, "greedy"))
            continue
        sp = spec.decoding.speculative
        w = check_width(spec, width if width is not None or sp is None else sp.max_width)
        targets.append(BenchTarget(package, ids, w, f"{sp.kind}/w{w}"))
    return BenchPlan(tuple(entries.items()), tuple(targets), mode, repeats, warmup,
                     max_new_tokens, base_name)


def synchronize(engine: Engine) -> None:
    """Wait for everything the engine has queued: its own stream where it has one (both CUDA
    engines own one), else the whole device for any other device-resident engine."""
    stream = getattr(engine, "stream", None)
    if stream is not None:
        stream.synchronize()
        return
    residency = getattr(engine, "residency", "host")
    if residency.startswith("cuda"):
        from engines.cuda_support import import_cupy

        cupy = import_cupy()
        cupy.cuda.Device(int(residency.partition(":")[2] or 0)).synchronize()


def timed_decode(engine: Engine, prompt: Sequence[int], max_new_tokens: int,
                 width: int | None):
    """One decode between two synchronisations; returns (result, wall seconds)."""
    synchronize(engine)
    start = time.perf_counter()
    if width is None:
        result = greedy_decode(engine, prompt, max_new_tokens)
    else:
        result = speculative_decode(engine, prompt, max_new_tokens, width)
    synchronize(engine)
    return result, time.perf_counter() - start


def attach_ratios(rows: Sequence[BenchRow], baseline: str) -> list[BenchRow]:
    """Set each measured row's ratio to the baseline's median tokens/s of the same package and
    mode; where the baseline was not measured there, the ratio stays None and says why."""
    base = {(r.package, r.mode): r for r in rows if r.engine == baseline}
    for row in rows:
        row.baseline = baseline
        ref = base.get((row.package, row.mode))
        if not row.measured:
            row.ratio = None
        elif ref is None or not ref.measured or not ref.tokens_per_s_median:
            row.ratio = None
            why = "not in this run" if ref is None else (ref.reason or ref.status)
            note = f"no ratio: baseline {baseline} not measured ({why})"
            row.reason = f"{row.reason}; {note}" if row.reason else note
        else:
            row.ratio = row.tokens_per_s_median / ref.tokens_per_s_median
    return list(rows)


def _summarise(row: BenchRow, results: list, walls: list[float]) -> None:
    streams = {tuple(r.tokens) for r in results}
    if len(streams) > 1:
        row.status = ERROR
        row.reason = "the timed decodes produced different tokens (a nondeterministic engine)"
    rates = [len(r.tokens) / w for r, w in zip(results, walls) if w > 0]
    row.repeats = len(results)
    row.new_tokens = len(results[0].tokens)
    row.tokens_per_s = rates
    if rates:
        row.tokens_per_s_median = statistics.median(rates)
        row.tokens_per_s_min, row.tokens_per_s_max = min(rates), max(rates)
    steps = [s for r in results for s in r.step_s[1:]]
    if steps:
        row.step_ms = 1000 * statistics.median(steps)
        row.tokens_per_step = (row.new_tokens - 1) / (len(results[0].step_s) - 1)
    seconds: dict[str, float] = {}
    forwards: dict[str, int] = {}
    for r in results:
        for phase, n in r.ledger.forwards.items():
            if n:
                forwards[phase] = forwards.get(phase, 0) + n
                seconds[phase] = seconds.get(phase, 0.0) + r.ledger.phase_seconds[phase]
    row.forward_ms = {p: 1000 * seconds[p] / n for p, n in forwards.items()}


def run_bench(plan: BenchPlan,
              on_decode: Callable[[int, str], None] | None = None) -> list[BenchRow]:
    """Time every engine on every target of the plan; one row per (package, engine, mode).

    Per package every available engine is loaded, warmed up (``warmup`` greedy decodes, and
    in speculative mode one speculative decode too), then timed in turns. An engine that
    cannot run here is an ``unavailable`` row with its reason; one that fails is an ``error``
    row. ``on_decode(n, description)`` is told of every n decodes done (or skipped)."""
    tell = on_decode or (lambda n, text: None)
    per = plan.warmup + plan.repeats + (1 if plan.mode == "speculative" else 0)
    rows: list[BenchRow] = []
    for target in plan.targets:
        name = target.package.spec.name
        live: dict[str, tuple[Engine, BenchRow]] = {}
        for engine_name, cls in plan.engines:
            row = BenchRow(name, engine_name, target.label, OK, prompt=list(target.prompt),
                           max_new_tokens=plan.max_new_tokens,
                           residency=getattr(cls, "residency", ""))
            rows.append(row)
            avail = cls.availability()
            if not avail.ok:
                row.status, row.reason = UNAVAILABLE, avail.reason
                tell(per, f"{name} · {engine_name}: unavailable")
                continue
            engine, done = None, 0
            try:
                engine = cls(target.package)
                row.residency = engine.residency
                for _ in range(plan.warmup):
                    timed_decode(engine, target.prompt, plan.max_new_tokens, None)
                    done += 1
                    tell(1, f"{name} · {engine_name} · warm-up")
                if target.width is not None:
                    timed_decode(engine, target.prompt, plan.max_new_tokens, target.width)
                    done += 1
                    tell(1, f"{name} · {engine_name} · warm-up {target.label}")
            except LockstepError as err:
                unavailable = isinstance(err, EngineUnavailable)  # e.g. loads some packages only
                row.status, row.reason = (UNAVAILABLE if unavailable else ERROR), str(err)
                tell(per - done, f"{name} · {engine_name}: {row.status}")
                if engine is not None:
                    engine.close()
                continue
            live[engine_name] = (engine, row)
        measured: dict[str, tuple[list, list[float]]] = {n: ([], []) for n in live}
        for r in range(plan.repeats):
            for engine_name, (engine, row) in live.items():
                if row.status != OK:
                    continue
                try:
                    result, wall = timed_decode(engine, target.prompt, plan.max_new_tokens,
                                                target.width)
                except LockstepError as err:
                    row.status, row.reason = ERROR, str(err)
                    tell(plan.repeats - r, f"{name} · {engine_name}: error")
                    continue
                measured[engine_name][0].append(result)
                measured[engine_name][1].append(wall)
                tell(1, f"{name} · {engine_name} · {target.label} · repeat {r + 1}/{plan.repeats}")
        for engine_name, (engine, row) in live.items():
            if row.status == OK:
                _summarise(row, *measured[engine_name])
            engine.close()
    return attach_ratios(rows, plan.baseline)


def bench(engines: Sequence[str | type[Engine]], packages: Sequence[Any], **options) -> list[BenchRow]:
    """``plan_bench`` then ``run_bench``: validate everything first, then time."""
    return run_bench(plan_bench(engines, packages, **options))


def write_json(rows: Sequence[BenchRow], path: Path, plan: BenchPlan | None = None) -> Path:
    """The rows, the settings and the environment in one JSON file (written atomically)."""
    from harness.evidence import collect_environment

    path = Path(path)
    payload = {
        "format": FORMAT,
        "kind": "lockstep-bench",
        "environment": collect_environment().model_dump(mode="json"),
        "settings": None if plan is None else {
            "mode": plan.mode, "repeats": plan.repeats, "warmup": plan.warmup,
            "max_new_tokens": plan.max_new_tokens, "baseline": plan.baseline,
            "engines": [n for n, _ in plan.engines],
            "packages": [t.package.spec.name for t in plan.targets]},
        "rows": [asdict(r) for r in rows],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)
    return path


__all__ = ["BenchPlan", "BenchRow", "BenchTarget", "MODES", "attach_ratios", "bench",
           "plan_bench", "run_bench", "synchronize", "timed_decode", "write_json"]
