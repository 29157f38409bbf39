"""Decode speed, engine beside engine in one process: prefill, steady decode, a floor, ratios.

Speed claims are ratios measured side by side, never absolute numbers compared across runs
or machines. So every engine of a package is loaded at once, warmed up, and timed in turns
(repeat r of every engine before repeat r+1 of any), and each engine's median tokens/s is
divided by the baseline engine's median from the same run. ``Engine.synchronize()`` is
called before the clock starts and before it stops, so a wall time covers the work itself
and not only its launch (a device engine waits for its stream there).

What one row reports (``docs/PERFORMANCE.md`` has the method):

* **tok/s**: generated tokens / wall time of the whole decode (prefill included), median
  over the timed decodes, and its spread; the **ratio** to the baseline is taken on it.
* **prefill ms**: the first step, i.e. the forward over the prompt and its token read back,
  median over the timed decodes.
* **decode ms/token** (steady): the median time of one decode step (a forward over one
  position ending with its token on the host) over every step of every timed decode after
  the first ``warmup_steps`` steps of each, and its **tokens/s**. Speculative rounds commit
  several tokens: there it is the median round time over the mean tokens per round.
* **floor ms/token**: the bytes of the decoded component's initializers (what one decode
  step must read at least once) over the copy bandwidth of the engine's residency measured
  in the same run (a device-to-device copy on CUDA, a numpy copy on the host), and **x
  floor**, steady decode ms over floor ms.
* **dtype**: what the engine computed in (``Engine.compute_dtype``); the bench builds each
  engine as it is run for speed (``Engine.for_speed``: hf-cuda in the package's dtype).

Prompts: the package's first, the ``prompt`` given, or prompt sets (``prompt_sets``: built-in
names such as ``grounded`` and ``free``, or JSONL files, ``harness.prompts``), each set its
own rows; a timed decode of a set decodes each of its prompts in turn, and its tokens/s is
their tokens over their summed wall time.

Speculative mode times each engine greedily and speculatively on the same prompts, in
turns: the speculative row carries its rounds, accept rate, tokens per target forward, its
tokens/s over the greedy row's and whether its tokens are the greedy ones
(``harness.bench_speculation``).

``pipelined`` (``--pipelined``) runs every greedy decode with
``DecodeSession._greedy_pipelined`` (each next forward queued before the last id is read;
the same tokens) and lets a prompt-lookup decode on a device shift its rounds
(``engines.workflow.speculative``: its plain steps pipelined the same way); without it both
run their classic loops. Recorded in the JSON's settings and the table's title.

``ignore_eos`` (``--ignore-eos``) keeps every decode, greedy or speculative (and the greedy
warm-ups), going past eos, so each engine is timed on exactly ``max_new_tokens`` tokens; a
decode that still stops short is an ``error`` row. An engine that decodes by itself (``hf``,
``ort-genai``) is asked through the declared contract only:
``Engine.generate(prompt, n, ignore_eos=True)``; it declares no speculative decoding, so in
speculative mode it is an ``unavailable`` row, never timed.
"""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import onnx
from onnx import helper

from engines.cuda_support import import_cupy
from engines.engine import Engine
from engines.errors import EngineUnavailable, InputError, LockstepError
from engines.registry import REFERENCE_ENGINE, resolve_engine_list
from engines.workflow import greedy_decode
from engines.workflow.speculative import check_width, speculative_decode
from engines.workflow.validation import check_count, check_request
from harness.bench_speculation import first_parting, round_figures
from harness.collector import CollectorTime, collector_watched, thaw
from harness.decode_profile import profile_decode
from harness.evidence import collect_environment
from harness.packages import resolve_package
from harness.prompts import read_prompts_file, resolve_all

MODES = ("greedy", "speculative")
RowStatus = Literal["ok", "unavailable", "error"]
OK, UNAVAILABLE, ERROR = get_args(RowStatus)
# the JSON file's layout version (2: prefill, steady decode, floor, bandwidth; 3: prompt
# sets, the compute dtype, greedy beside speculative rows and their rounds)
FORMAT = 3
KIND = "lockstep-bench"  # the JSON file's "kind"
MARKER = f'"kind": "{KIND}"'  # in a file's first bytes: `bench --json` may replace it
WARMUP_STEPS = 2  # decode steps of every timed decode left out of the steady median
COPY_BYTES = 256 * 2 ** 20  # the copy that measures a residency's bandwidth
COPY_REPEATS = 5


@dataclass
class BenchRow:
    """One (package, prompts, engine, mode): per-repeat measurements and their summary."""

    package: str
    engine: str
    mode: str  # "greedy" or "<kind>/w<width>"
    status: RowStatus
    reason: str = ""
    residency: str = ""
    compute_dtype: str = ""  # what the engine computed in (Engine.compute_dtype)
    prompt_set: str = ""  # "first" (the package's), "given", or a set's name
    prompts: dict[str, list[int]] = field(default_factory=dict)  # name -> ids, in order
    max_new_tokens: int = 0
    ignore_eos: bool = False  # every decode asked to go on past eos
    # tokens one pass over the prompts produced (fewer than asked where eos came first)
    new_tokens: int = 0
    repeats: int = 0
    tokens_per_s: list[float] = field(default_factory=list)  # one per timed pass
    tokens_per_s_median: float | None = None
    tokens_per_s_min: float | None = None
    tokens_per_s_max: float | None = None
    # wall ms of one step after the prefill, median over every step of every repeat; a step
    # is a decode forward (greedy) or a whole round (speculative), and ends in a token
    # readback, so on a device it includes the work, not only the launch
    step_ms: float | None = None
    tokens_per_step: float | None = None
    # the prefill: the first forward (over the prompt) and its token; median over repeats
    prefill_ms: float | None = None
    # steady decode: the median step over the steps after the first warmup_steps of every
    # decode, per token (a speculative round's median over its mean tokens per round)
    warmup_steps: int = 0
    decode_steps: int = 0  # steps the steady median was taken over (all repeats)
    decode_ms: float | None = None
    decode_tokens_per_s: float | None = None
    # every step after the prefill (the warm-up steps too) over the tokens they gave, all
    # repeats: a mean, where decode_ms is a median step (of a speculative row, over a mix of
    # plain steps and verifications, which may be far from the mean)
    decode_mean_ms: float | None = None
    # the floor: the decoded component's initializer bytes / the residency's copy bandwidth
    weight_bytes: int | None = None
    bandwidth_gb_s: float | None = None  # bytes moved (read + write) per second / 1e9
    bandwidth_how: str = ""
    floor_ms: float | None = None
    x_floor: float | None = None  # decode_ms / floor_ms
    # the ledger's own account: phase_seconds / forwards per phase, over every timed decode;
    # the interpreter times run_component without a sync, so on a device engine this is the
    # host-side launch time unless the engine synchronises inside its forward
    forward_ms: dict[str, float] = field(default_factory=dict)
    baseline: str = ""
    ratio: float | None = None  # tokens_per_s_median / the baseline's, same package and mode
    decode_ratio: float | None = None  # decode_tokens_per_s / the baseline's
    # tokens_per_s_median / each compared engine's (the baseline first, then compare_to),
    # same package, prompts and mode; an engine not measured there has no entry
    ratios: dict[str, float] = field(default_factory=dict)
    # with --profile: where one more (untimed) decode's time went (harness.decode_profile)
    profile: dict[str, Any] | None = None
    # speculative rows (harness.bench_speculation): one pass's rounds, and against greedy
    rounds: int | None = None
    plain_steps: int | None = None
    shifted_rounds: int | None = None  # rounds judged partly by the forward queued before
    accept_rate: float | None = None
    accepted_per_round: float | None = None
    tokens_per_forward: float | None = None
    greedy_ratio: float | None = None  # tokens_per_s_median / the same engine's greedy row's
    same_tokens: bool | None = None  # every prompt's stream is the greedy row's
    # Python's collector inside this row's timed decodes, every repeat (harness.collector)
    gc_collections: int = 0
    gc_ms: float = 0.0

    @property
    def measured(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class BenchTarget:
    """What one package is benchmarked with: its prompts and, in speculative mode, the
    width (and mode label) timed beside greedy."""

    package: Any  # engines.package.Package
    prompts: tuple[tuple[str, tuple[int, ...]], ...]  # (name, ids), decoded in this order
    width: int | None
    label: str
    prompt_set: str = "first"

    @property
    def prompt(self) -> list[int]:
        """The first prompt's ids (what ``--profile`` decodes)."""
        return list(self.prompts[0][1])

    @property
    def modes(self) -> list[tuple[str, int | None]]:
        """(label, width) of each row an engine gets: greedy, then the speculative width."""
        return [("greedy", None)] + ([] if self.width is None else [(self.label, self.width)])


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
    ignore_eos: bool = False
    warmup_steps: int = WARMUP_STEPS
    pipelined: bool = False  # greedy decodes queue each next forward before the id is read
    interleave: bool = False  # every package's engines loaded at once, timed in one rotation
    profile: bool = False  # one more decode of each measured row, profiled (not timed)
    compare_to: tuple[str, ...] = ()  # engines each row is divided by too, beside the baseline

    @property
    def total_decodes(self) -> int:
        """Warm-up and timed decodes over the whole plan (a progress bar's total)."""
        return len(self.engines) * sum(self.decodes_per_engine(t) for t in self.targets)

    def decodes_per_engine(self, target: BenchTarget) -> int:
        """Warm-up and timed decodes of one engine on one target: greedy warm-ups, one
        speculative warm-up, and every mode's repeats, each over every prompt."""
        speculative = self.mode == "speculative"
        return len(target.prompts) * (self.warmup + int(speculative)
                                      + self.repeats * len(target.modes))


@dataclass(frozen=True)
class Bandwidth:
    """A residency's copy bandwidth, measured in this run: bytes moved (read + write) per
    second / 1e9, or None with what prevented the measurement."""

    residency: str
    gb_per_s: float | None
    how: str


def plan_bench(engines: Sequence[str | type[Engine]], packages: Sequence[Any],
               mode: str = "greedy", width: int | None = None, repeats: int = 5,
               max_new_tokens: int = 32, baseline: str | type[Engine] = REFERENCE_ENGINE,
               warmup: int = 1, prompt: Sequence[int] | None = None,
               ignore_eos: bool = False, warmup_steps: int = WARMUP_STEPS,
               pipelined: bool = False, interleave: bool = False,
               profile: bool = False,
               prompt_sets: Sequence[str | Path] | None = None,
               compare_to: Sequence[str | type[Engine]] = ()) -> BenchPlan:
    """Validate a benchmark request and resolve its packages; nothing is timed yet.

    ``engines`` are names (or ``Engine`` subclasses); the baseline joins them when missing,
    since a ratio means something only against a baseline timed in the same run.
    ``packages`` are fixture names, folders or loaded packages. ``width`` (speculative only)
    defaults to each package's ``max_width``; speculative mode times greedy beside it.
    ``prompt`` defaults to each package's first; ``prompt_sets`` (built-in set names or
    JSONL files, ``harness.prompts``; not with ``prompt``) gives each package one target per
    set, every prompt resolved by the package's tokenizer.
    ``ignore_eos`` times exactly ``max_new_tokens`` tokens (either mode); ``warmup_steps``
    decode steps of each timed decode are left out of the steady decode median;
    ``interleave`` times every package's engines in one rotation (``run_bench``);
    ``profile`` decodes each measured row once more, profiled (``harness.decode_profile``);
    ``compare_to`` names engines each row's tokens/s is divided by too (``BenchRow.ratios``),
    joining the engines when missing, as the baseline does: one table, a ratio to every peer."""
    if mode not in MODES:
        raise InputError("unknown mode", field="mode", value=mode,
                         remedy=f"use one of: {', '.join(MODES)}")
    if width is not None and mode != "speculative":
        raise InputError("a width applies to speculative decoding only", field="width",
                         value=width, remedy="use mode speculative, or drop the width")
    if width is not None:
        check_count(width, "width", "give a speculative width of 1 or more")
    for flag, given in (("ignore_eos", ignore_eos), ("pipelined", pipelined),
                        ("interleave", interleave), ("profile", profile)):
        if not isinstance(given, bool):
            raise InputError(f"{flag} must be True or False", field=flag, value=given,
                             remedy=f"pass {flag}=True or False")
    check_count(repeats, "repeats", "time at least one decode per engine (repeats >= 1)")
    check_count(max_new_tokens, "max_new_tokens", "ask for one or more new tokens")
    check_count(warmup, "warmup", "give 0 or more warm-up decodes (1 is the default)", minimum=0)
    check_count(warmup_steps, "warmup_steps",
                f"give 0 or more decode steps to leave out ({WARMUP_STEPS} is the default)",
                minimum=0)
    if not engines:
        raise InputError("no engines to benchmark", field="engines", value=list(engines),
                         remedy="name one or more engines, e.g. ort-cpu,native-host")
    if not packages:
        raise InputError("no packages to benchmark", field="packages", value=list(packages),
                         remedy="name one or more packages, e.g. tiny_llama")
    # keyed by each class's own name; an unknown name fails here, listing the valid ones, and
    # one engine named twice (one spelling or two) is refused, as ``run_matrix`` refuses it
    entries = resolve_engine_list(engines, field="engines")
    # the baseline and the compared engines join the list; one name for two classes is refused
    joined = {}
    for option, given in (("baseline", [baseline]), ("compare_to", list(compare_to))):
        joining = resolve_engine_list(given, field=option) if given else {}
        for (name, cls), spelled in zip(joining.items(), given):
            if entries.setdefault(name, cls) is not cls:
                raise InputError(f"the {option} engine {name!r} and an engine of the list are "
                                 f"two different classes of one name", field=option,
                                 value=spelled if isinstance(spelled, str) else name,
                                 remedy=f"use the listed {name!r}, or give one class a "
                                        f"`name` of its own")
        joined[option] = list(joining)
    (base_name,) = joined["baseline"]

    if prompt is not None and prompt_sets:
        raise InputError("give a prompt or prompt sets, not both", field="prompt_sets",
                         value=list(prompt_sets), remedy="drop the prompt, or the prompt sets")
    sets = [(Path(str(ref)).stem, read_prompts_file(ref)) for ref in prompt_sets or ()]
    names = [name for name, _ in sets]
    if len(set(names)) < len(names):  # a set's name keys its rows and ratios
        raise InputError("two prompt sets have one name", field="prompt_sets",
                         value=[str(ref) for ref in prompt_sets],
                         remedy="give every prompt set a file name of its own")
    targets = []
    for ref in packages:
        package = ref if hasattr(ref, "spec") else resolve_package(ref)
        spec = package.spec
        if sets:
            chosen = [(name, [(n, tuple(r.ids)) for n, r in
                              resolve_all(sources, package, max_new_tokens)])
                      for name, sources in sets]
        elif prompt is not None:
            chosen = [("given", [("given", tuple(check_request(spec, list(prompt),
                                                               max_new_tokens)))])]
        elif spec.prompts:
            chosen = [("first", [("p0", tuple(check_request(spec, list(spec.prompts[0]),
                                                            max_new_tokens)))])]
        else:
            raise InputError(f"package {spec.name!r} declares no prompts", field="prompt",
                             value=None, remedy="give a prompt (token ids) to benchmark with")
        w, label = None, "greedy"
        if mode == "speculative":
            sp = spec.decoding.speculative
            if sp is None:
                raise InputError(f"package {spec.name!r} has no speculative section "
                                 f"(decoding.speculative): nothing of it to time in "
                                 f"speculative mode", field="package", value=spec.name,
                                 remedy="bench it with --mode greedy, or leave --packages out "
                                        "to bench every speculative fixture")
            w = check_width(spec, width if width is not None else sp.max_width)
            label = f"{sp.kind}/w{w}"
        targets += [BenchTarget(package, tuple(ids), w, label, name) for name, ids in chosen]
    return BenchPlan(tuple(entries.items()), tuple(targets), mode, repeats, warmup,
                     max_new_tokens, base_name, ignore_eos, warmup_steps, pipelined,
                     interleave, profile,
                     tuple(name for name in joined["compare_to"] if name != base_name))


# -- the floor -------------------------------------------------------------------------------

def weight_bytes(package, component: str = "target") -> int:
    """The bytes of the component's initializers: what one decode step must read at least
    once. From the ONNX file's tensor shapes and types; external data is not loaded."""
    model = onnx.load(str(package.component_path(component)), load_external_data=False)
    total = 0
    for tensor in model.graph.initializer:
        count = 1
        for d in tensor.dims:
            count *= int(d)
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            total += (count + 1) // 2
        else:
            total += count * itemsize
    return total


def floor_ms(nbytes: int, gb_per_s: float) -> float:
    """Milliseconds to read ``nbytes`` once at ``gb_per_s`` (1e9 bytes a second)."""
    return 1000.0 * nbytes / (gb_per_s * 1e9)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2 ** 20:g} MiB"


def host_copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> Bandwidth:
    """numpy copy of an ``nbytes`` array into another (after one untimed copy that faults
    the pages in); bytes moved = 2 x nbytes (read + write) over the median copy time."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return Bandwidth("host", 2 * nbytes / seconds / 1e9,
                     f"numpy copy of {_mib(nbytes)}, median of {repeats}, read + write")


def cuda_copy_bandwidth(device_id: int = 0, nbytes: int = COPY_BYTES,
                        repeats: int = COPY_REPEATS, cupy=None) -> Bandwidth:
    """A device-to-device ``memcpyAsync`` of ``nbytes`` on a stream of its own, timed with
    CUDA events on that stream (one untimed copy first); bytes moved = 2 x nbytes (read +
    write) over the median event time. The buffers are plain ``cudaMalloc`` allocations,
    outside every memory pool, and freed before returning."""
    if cupy is None:
        cupy = import_cupy()
    residency = f"cuda:{device_id}"
    rt = cupy.cuda.runtime
    with cupy.cuda.Device(device_id):
        stream = cupy.cuda.Stream(non_blocking=True)
        src, dst = cupy.cuda.Memory(nbytes), cupy.cuda.Memory(nbytes)
        try:
            rt.memsetAsync(src.ptr, 1, nbytes, stream.ptr)
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            times = []
            for i in range(repeats + 1):
                start.record(stream)
                rt.memcpyAsync(dst.ptr, src.ptr, nbytes, rt.memcpyDeviceToDevice, stream.ptr)
                end.record(stream)
                end.synchronize()
                if i:  # the first copy is untimed
                    times.append(cupy.cuda.get_elapsed_time(start, end) / 1000.0)
            stream.synchronize()
        finally:
            del src, dst
    seconds = statistics.median(times)
    return Bandwidth(residency, 2 * nbytes / seconds / 1e9,
                     f"device-to-device copy of {_mib(nbytes)} on {residency}, CUDA events, "
                     f"median of {repeats}, read + write")


def measure_bandwidth(residency: str, nbytes: int = COPY_BYTES,
                      repeats: int = COPY_REPEATS) -> Bandwidth:
    """The copy bandwidth where an engine's values live: ``host`` (numpy) or ``cuda:N``
    (CuPy); anything else, or a CUDA residency without CuPy, gives None and the reason."""
    if residency == "host":
        return host_copy_bandwidth(nbytes, repeats)
    kind, _, index = residency.partition(":")
    if kind == "cuda":
        try:
            return cuda_copy_bandwidth(int(index or 0), nbytes, repeats)
        except Exception as exc:  # no CuPy, no device: no floor, and why
            return Bandwidth(residency, None, f"not measured: {_reason(exc)}")
    return Bandwidth(residency, None,
                     f"not measured: no copy benchmark for residency {residency!r}")


# -- timing ----------------------------------------------------------------------------------

def synchronize(engine: Engine) -> None:
    """Wait for everything the engine has queued (its declared ``Engine.synchronize``)."""
    engine.synchronize()


def timed_decode(engine: Engine, prompt: Sequence[int], max_new_tokens: int,
                 width: int | None, ignore_eos: bool = False, pipelined: bool = False,
                 spent: CollectorTime | None = None):
    """One decode between two synchronisations, the heap collected and frozen before it
    (``harness.collector``; its collections added to ``spent``); returns (result, wall
    seconds)."""
    with collector_watched(CollectorTime() if spent is None else spent):
        engine.synchronize()
        start = time.perf_counter()
        if width is None:
            result = greedy_decode(engine, prompt, max_new_tokens, ignore_eos=ignore_eos,
                                   pipelined=pipelined)
        else:
            result = speculative_decode(engine, prompt, max_new_tokens, width,
                                        ignore_eos=ignore_eos, pipelined=pipelined)
        engine.synchronize()
        return result, time.perf_counter() - start


def timed_pass(engine: Engine, target: BenchTarget, width: int | None, plan: BenchPlan,
               order: Sequence[int] | None = None,
               spent: CollectorTime | None = None) -> tuple[list, float]:
    """Every prompt of ``target`` decoded in turn (``order``: their indices; default as
    given), each between two synchronisations; the results in the target's prompt order and
    the summed wall seconds."""
    results: list = [None] * len(target.prompts)
    wall = 0.0
    for i in order if order is not None else range(len(target.prompts)):
        results[i], seconds = timed_decode(engine, target.prompts[i][1], plan.max_new_tokens,
                                           width, plan.ignore_eos, plan.pipelined, spent)
        wall += seconds
    return results, wall


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, LockstepError) else f"{type(exc).__name__}: {exc}"


def _failure(exc: BaseException, cls: type[Engine], plan: BenchPlan) -> tuple[str, str]:
    """(status, reason) of an engine that raised while loading, warming up or decoding."""
    if isinstance(exc, EngineUnavailable):  # e.g. it loads some packages only
        return UNAVAILABLE, str(exc)
    reason = _reason(exc)
    if (plan.ignore_eos and cls.decodes_itself and isinstance(exc, TypeError)
            and "ignore_eos" in str(exc)):
        reason += (" (this engine decodes by itself and its generate lacks the contract's "
                   "ignore_eos keyword, Engine.generate(prompt, max_new_tokens, audit=False, "
                   "ignore_eos=False): add it, or bench it without --ignore-eos)")
    return ERROR, reason


def attach_ratios(rows: Sequence[BenchRow], baseline: str,
                  compare_to: Sequence[str] = ()) -> list[BenchRow]:
    """Set each measured row's ratio to the baseline's median tokens/s of the same package,
    prompts and mode (and its decode ratio to the baseline's steady decode tokens/s); where
    the baseline was not measured there, the ratios stay None and the reason says why.
    ``ratios`` holds the same quotient for the baseline and every ``compare_to`` engine
    measured there (an engine's own row states why it was not)."""
    measured = {(r.engine, r.package, r.prompt_set, r.mode): r for r in rows
                if r.measured and r.tokens_per_s_median}
    base = {(r.package, r.prompt_set, r.mode): r for r in rows if r.engine == baseline}
    for row in rows:
        row.baseline = baseline
        row.ratios = {} if not row.measured else {
            name: row.tokens_per_s_median / other.tokens_per_s_median
            for name in dict.fromkeys((baseline, *compare_to))
            if (other := measured.get((name, row.package, row.prompt_set, row.mode)))}
        ref = base.get((row.package, row.prompt_set, row.mode))
        if not row.measured:
            row.ratio = row.decode_ratio = None
        elif ref is None or not ref.measured or not ref.tokens_per_s_median:
            row.ratio = row.decode_ratio = None
            why = "not in this run" if ref is None else (ref.reason or ref.status)
            note = f"no ratio: baseline {baseline} not measured ({why})"
            row.reason = f"{row.reason}; {note}" if row.reason else note
        else:
            row.ratio = row.ratios[baseline]
            if row.decode_tokens_per_s and ref.decode_tokens_per_s:
                row.decode_ratio = row.decode_tokens_per_s / ref.decode_tokens_per_s
    return list(rows)


def _note(row: BenchRow, text: str) -> None:
    row.reason = f"{row.reason}; {text}" if row.reason else text


def _summarise(row: BenchRow, passes: list[list], walls: list[float], plan: BenchPlan) -> None:
    """The row's figures from its timed passes (each a result per prompt) and their walls."""
    streams = {tuple(tuple(r.tokens) for r in results) for results in passes}
    if len(streams) > 1:
        row.status = ERROR
        row.reason = ("the timed decodes produced different tokens (a nondeterministic "
                      f"engine): {_first_difference(row, passes)}")
    decodes = [r for results in passes for r in results]
    short = [len(r.tokens) for r in decodes if len(r.tokens) != plan.max_new_tokens]
    if plan.ignore_eos and short and row.status == OK:
        row.status = ERROR
        row.reason = (f"a decode produced {short[0]} of {plan.max_new_tokens} tokens under "
                      f"--ignore-eos: the engine did not go on past eos, so it was not timed "
                      f"on the same tokens as the others")
    first = passes[0]
    rates = [sum(len(r.tokens) for r in results) / w for results, w in zip(passes, walls)
             if w > 0]
    row.repeats = len(passes)
    row.new_tokens = sum(len(r.tokens) for r in first)
    row.tokens_per_s = rates
    if rates:
        row.tokens_per_s_median = statistics.median(rates)
        row.tokens_per_s_min, row.tokens_per_s_max = min(rates), max(rates)
    asked = plan.max_new_tokens * len(first)
    if not plan.ignore_eos and row.status == OK and row.new_tokens < asked:
        what = (f"eos after {row.new_tokens} of {plan.max_new_tokens} tokens" if len(first) == 1
                else f"eos before {plan.max_new_tokens} tokens in {len(short) // len(passes)} "
                     f"of {len(first)} prompts")
        _note(row, f"{what}: the figures cover {row.new_tokens} (--ignore-eos times all "
                   f"{asked})")
    if any(len(r.step_s) < 1 for r in decodes):
        _note(row, "the engine reports no per-step times: prefill and decode not separated")
    else:
        row.prefill_ms = 1000 * statistics.median(r.step_s[0] for r in decodes)
        steps = [s for r in decodes for s in r.step_s[1:]]
        rounds = sum(len(r.step_s) - 1 for r in first)
        if steps and rounds:
            row.step_ms = 1000 * statistics.median(steps)
            row.tokens_per_step = sum(len(r.tokens) - 1 for r in first) / rounds
        steady = []
        for r in decodes:
            decode = r.step_s[1:]
            steady += decode[min(plan.warmup_steps, max(len(decode) - 1, 0)):]
        row.warmup_steps = plan.warmup_steps
        row.decode_steps = len(steady)
        if steady and row.tokens_per_step:
            row.decode_ms = 1000 * statistics.median(steady) / row.tokens_per_step
            row.decode_tokens_per_s = 1000 / row.decode_ms if row.decode_ms > 0 else None
        after = sum(len(r.tokens) - 1 for r in decodes)
        if after > 0:
            row.decode_mean_ms = 1000 * sum(sum(r.step_s[1:]) for r in decodes) / after
    seconds: dict[str, float] = {}
    forwards: dict[str, int] = {}
    for r in decodes:
        for phase, n in r.ledger.forwards.items():
            if n:
                forwards[phase] = forwards.get(phase, 0) + n
                seconds[phase] = seconds.get(phase, 0.0) + r.ledger.phase_seconds[phase]
    row.forward_ms = {p: 1000 * seconds[p] / n for p, n in forwards.items()}
    wall_ms = 1000 * sum(walls)
    if row.gc_ms > 0.01 * wall_ms:
        _note(row, f"Python's collector ran {row.gc_collections} times inside the timed "
                   f"decodes: {row.gc_ms:.1f} ms of {wall_ms:.0f} ms")


def _first_difference(row: BenchRow, passes: list[list]) -> str:
    """Where the first prompt whose streams differ between repeats parts: its name, the
    repeats and the token index."""
    names = list(row.prompts) or [str(i) for i in range(len(passes[0]))]
    for i, name in enumerate(names):
        first = list(passes[0][i].tokens)
        for k, results in enumerate(passes[1:], start=2):
            other = list(results[i].tokens)
            if other != first:
                at = next((j for j, (a, b) in enumerate(zip(first, other)) if a != b),
                          min(len(first), len(other)))
                return (f"prompt {name!r}, repeats 1 and {k} part at new token {at} "
                        f"({first[at] if at < len(first) else 'end'} against "
                        f"{other[at] if at < len(other) else 'end'})")
    return "the repeats' streams differ"


def _beside_greedy(row: BenchRow, greedy: BenchRow, passes: list[list], greedy_passes: list[list],
                   cls: type[Engine]) -> None:
    """A measured speculative row's rounds, and its tokens and speed against the greedy row
    of the same engine, package and prompts (``harness.bench_speculation``)."""
    for key, value in round_figures(passes[0]).items():
        setattr(row, key, value)
    if not greedy.measured:
        _note(row, f"no greedy comparison: the greedy row is {greedy.status}")
        return
    parted = first_parting(list(row.prompts), passes[0], greedy_passes[0])
    row.same_tokens = parted is None
    if greedy.tokens_per_s_median:
        row.greedy_ratio = row.tokens_per_s_median / greedy.tokens_per_s_median
    if parted is not None and cls.batch_invariant:
        row.status = ERROR
        row.reason = (f"the speculative stream leaves the greedy one at {parted} on an engine "
                      f"that declares batch invariance (claim 2): not a speed")
    elif parted is not None:
        _note(row, f"speculative and greedy part at {parted} (the engine is not "
                   f"batch-invariant; lockstep run --mode speculative judges both against "
                   f"the oracle)")


def _attach_floor(row: BenchRow, nbytes: int | None, bw: Bandwidth) -> None:
    row.weight_bytes = nbytes
    row.bandwidth_gb_s, row.bandwidth_how = bw.gb_per_s, bw.how
    if nbytes is not None and bw.gb_per_s:
        row.floor_ms = floor_ms(nbytes, bw.gb_per_s)
        if row.decode_ms is not None and row.floor_ms > 0:
            row.x_floor = row.decode_ms / row.floor_ms
    elif bw.gb_per_s is None:
        _note(row, f"no floor: {row.residency} copy bandwidth {bw.how}")


def run_bench(plan: BenchPlan, on_decode: Callable[[int, str], None] | None = None,
              bandwidth: Callable[[str], Bandwidth] | None = None) -> list[BenchRow]:
    """Time every engine on every target of the plan; one row per (package, prompts, engine,
    mode).

    Per package every available engine is loaded once (``Engine.for_speed``) and serves each
    of its prompt sets (a target): warmed up on the target (``warmup`` greedy passes over its
    prompts, the longest prompt first, and in speculative mode one speculative pass too),
    then timed in turns: repeat r of every engine on every target of the package, each
    greedy then speculative, before repeat r+1 of any. With ``plan.interleave`` every
    package's engines are loaded first and the turns go over all of them, so a ratio across
    packages (a dtype, a cache) is measured side by side too. An engine that cannot run here
    is an ``unavailable`` row with its reason (so is the speculative row of one that
    declares no speculative decoding); one that fails is an ``error`` row.
    ``bandwidth(residency)`` measures a residency's copy bandwidth for the floor (default
    :func:`measure_bandwidth`, once per residency per run, with every engine idle).
    ``on_decode(n, description)`` is told of every n decodes done (or skipped)."""
    tell = on_decode or (lambda n, text: None)
    measure = bandwidth or measure_bandwidth
    bandwidths: dict[str, Bandwidth] = {}
    rows: list[BenchRow] = []
    for group in _groups(plan):
        built: dict[int, _Engines] = {}
        loaded = []
        for target in group:
            engines = built.setdefault(id(target.package), _Engines(plan, target.package))
            loaded.append((target, _load(plan, target, engines, rows, tell)))
        try:
            for r in range(plan.repeats):
                for target, (live, measured) in loaded:
                    _time_turn(plan, target, live, measured, r, tell)
            for target, (live, measured) in loaded:
                _finish(plan, target, live, measured, bandwidths, measure)
        finally:
            for engines in built.values():
                engines.close()
            thaw()
    return attach_ratios(rows, plan.baseline, plan.compare_to)


def _groups(plan: BenchPlan) -> list[tuple[BenchTarget, ...]]:
    """The targets timed in one rotation: all of them with ``interleave``, else each
    package's (its prompt sets, which share its engines)."""
    if plan.interleave:
        return [plan.targets]
    groups: list[list[BenchTarget]] = []
    for target in plan.targets:
        if groups and groups[-1][0].package is target.package:
            groups[-1].append(target)
        else:
            groups.append([target])
    return [tuple(g) for g in groups]


class _Engines:
    """The plan's engines on one package, each built once (``Engine.for_speed``) for every
    prompt set of the package; one that cannot run here, or failed to build, keeps why."""

    def __init__(self, plan: BenchPlan, package):
        self.plan, self.package = plan, package
        self.built: dict[str, Engine | tuple[str, str]] = {}

    def get(self, name: str, cls: type[Engine]) -> Engine | tuple[str, str]:
        """The engine, or (status, reason)."""
        if name not in self.built:
            avail = cls.availability()
            if not avail.ok:
                self.built[name] = (UNAVAILABLE, avail.reason)
            else:
                try:
                    self.built[name] = cls.for_speed(self.package)
                except Exception as exc:  # this engine's rows, the others go on
                    self.built[name] = _failure(exc, cls, self.plan)
        return self.built[name]

    def close(self) -> None:
        for engine in self.built.values():
            if isinstance(engine, Engine):
                engine.close()


# engine name -> (the engine, its class, its row per mode label)
_Live = dict[str, tuple[Engine, type[Engine], dict[str, BenchRow]]]
# (engine name, mode label) -> (the timed passes, their walls)
_Measured = dict[tuple[str, str], tuple[list, list]]


def _what(target: BenchTarget) -> str:
    name = target.package.spec.name
    return name if target.prompt_set == "first" else f"{name} · {target.prompt_set}"


def _load(plan: BenchPlan, target: BenchTarget, engines: _Engines, rows: list[BenchRow],
          tell: Callable[[int, str], None]) -> tuple[_Live, _Measured]:
    """Each engine's rows for ``target`` (appended to ``rows``), and the engines that loaded
    and warmed up on its prompts, by name, with their empty measurements."""
    per = plan.decodes_per_engine(target)
    name, what = target.package.spec.name, _what(target)
    prompts = {n: list(ids) for n, ids in target.prompts}
    longest_first = sorted(range(len(target.prompts)), key=lambda i: -len(target.prompts[i][1]))
    live: _Live = {}
    for engine_name, cls in plan.engines:
        own = {label: BenchRow(name, engine_name, label, OK, residency=cls.residency,
                               prompt_set=target.prompt_set, prompts=prompts,
                               max_new_tokens=plan.max_new_tokens, ignore_eos=plan.ignore_eos)
               for label, _ in target.modes}
        rows.extend(own.values())
        engine = engines.get(engine_name, cls)
        if not isinstance(engine, Engine):
            for row in own.values():
                row.status, row.reason = engine
            tell(per, f"{what} · {engine_name}: {engine[0]}")
            continue
        speculates = target.width is not None and cls.speculative
        if target.width is not None and not cls.speculative:
            row = own[target.label]
            row.status = UNAVAILABLE
            row.reason = (f"engine {engine_name!r} declares no speculative decoding (it "
                          f"decodes by itself)" if cls.decodes_itself else
                          f"engine {engine_name!r} declares no speculative decoding")
            skipped = len(target.prompts) * (1 + plan.repeats)
            per -= skipped
            tell(skipped, f"{what} · {engine_name} · {target.label}: unavailable")
        done = 0
        try:
            for row in own.values():
                row.compute_dtype = engine.compute_dtype()
            for _ in range(plan.warmup):
                timed_pass(engine, target, None, plan, longest_first)
                done += len(target.prompts)
                tell(len(target.prompts), f"{what} · {engine_name} · warm-up")
            if speculates:
                timed_pass(engine, target, target.width, plan, longest_first)
                done += len(target.prompts)
                tell(len(target.prompts), f"{what} · {engine_name} · warm-up {target.label}")
        except Exception as exc:  # any failure is this engine's rows, the others go on
            status, reason = _failure(exc, cls, plan)
            for row in own.values():
                if row.status == OK:
                    row.status, row.reason = status, reason
            tell(per - done, f"{what} · {engine_name}: {status}")
            continue
        live[engine_name] = (engine, cls, own)
    return live, {(n, label): ([], []) for n, (_, _, own) in live.items() for label in own}


def _time_turn(plan: BenchPlan, target: BenchTarget, live: _Live, measured: _Measured,
               r: int, tell: Callable[[int, str], None]) -> None:
    """Repeat ``r`` of every live engine on ``target``, one after another, each in every
    mode (greedy, then speculative)."""
    what = _what(target)
    for engine_name, (engine, cls, own) in live.items():
        for label, width in target.modes:
            row = own[label]
            if row.status != OK:
                continue
            spent = CollectorTime()
            try:
                results, wall = timed_pass(engine, target, width, plan, spent=spent)
            except Exception as exc:
                row.status, row.reason = _failure(exc, cls, plan)
                tell(len(target.prompts) * (plan.repeats - r), f"{what} · {engine_name}: "
                                                               f"{row.status}")
                continue
            measured[engine_name, label][0].append(results)
            measured[engine_name, label][1].append(wall)
            row.gc_collections += spent.collections
            row.gc_ms += 1e3 * spent.seconds
            tell(len(target.prompts), f"{what} · {engine_name} · {label} · repeat "
                                      f"{r + 1}/{plan.repeats}")


def _finish(plan: BenchPlan, target: BenchTarget, live: _Live, measured: _Measured,
            bandwidths: dict[str, Bandwidth], measure: Callable[[str], Bandwidth]) -> None:
    """Summarise each live row (a speculative one beside its greedy row) and attach its
    floor (bandwidth measured with the engine idle, once per residency)."""
    nbytes: int | None = None
    if any(row.status == OK for _, _, own in live.values() for row in own.values()):
        try:
            nbytes = weight_bytes(target.package)
        except Exception as exc:  # a floor is a figure, never a reason to fail
            for _, _, own in live.values():
                for row in own.values():
                    _note(row, f"no floor: weight bytes unknown ({_reason(exc)})")
    for engine_name, (engine, cls, own) in live.items():
        for label, width in target.modes:
            row = own[label]
            if row.status == OK:
                _summarise(row, *measured[engine_name, label], plan)
            if row.status == OK and width is not None:
                _beside_greedy(row, own["greedy"], measured[engine_name, label][0],
                               measured[engine_name, "greedy"][0], cls)
            if row.status == OK:
                engine.synchronize()
                if row.residency not in bandwidths:
                    bandwidths[row.residency] = measure(row.residency)
                _attach_floor(row, nbytes, bandwidths[row.residency])
            if row.status == OK and plan.profile and width is None:
                try:
                    row.profile = profile_decode(engine, target.prompt, plan.max_new_tokens,
                                                 plan.ignore_eos, row.decode_ms).to_dict()
                except Exception as exc:  # a profile is a figure, never a reason to fail
                    _note(row, f"no profile: {_reason(exc)}")


def bench(engines: Sequence[str | type[Engine]], packages: Sequence[Any],
          bandwidth: Callable[[str], Bandwidth] | None = None, **options) -> list[BenchRow]:
    """``plan_bench`` then ``run_bench``: validate everything first, then time."""
    return run_bench(plan_bench(engines, packages, **options), bandwidth=bandwidth)


def bandwidths_of(rows: Sequence[BenchRow]) -> list[dict[str, Any]]:
    """Each residency's measured copy bandwidth, once (from the rows that carry it)."""
    seen: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.measured and r.bandwidth_how and r.residency not in seen:
            seen[r.residency] = {"residency": r.residency, "gb_per_s": r.bandwidth_gb_s,
                                 "how": r.bandwidth_how}
    return list(seen.values())


def write_json(rows: Sequence[BenchRow], path: Path, plan: BenchPlan | None = None) -> Path:
    """The rows, the settings and the environment in one JSON file (written atomically)."""
    path = Path(path)
    payload = {
        "format": FORMAT,
        "kind": KIND,
        "environment": collect_environment().model_dump(mode="json"),
        "settings": None if plan is None else {
            "mode": plan.mode, "repeats": plan.repeats, "warmup": plan.warmup,
            "max_new_tokens": plan.max_new_tokens, "ignore_eos": plan.ignore_eos,
            "pipelined": plan.pipelined, "interleave": plan.interleave,
            "warmup_steps": plan.warmup_steps, "baseline": plan.baseline,
            "compare_to": list(plan.compare_to),
            "engines": [n for n, _ in plan.engines],
            "packages": list(dict.fromkeys(t.package.spec.name for t in plan.targets)),
            "prompt_sets": list(dict.fromkeys(t.prompt_set for t in plan.targets))},
        "bandwidth": bandwidths_of(rows),
        "rows": [asdict(r) for r in rows],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)
    return path


__all__ = ["Bandwidth", "BenchPlan", "BenchRow", "BenchTarget", "MODES", "attach_ratios",
           "bandwidths_of", "bench", "cuda_copy_bandwidth", "floor_ms", "host_copy_bandwidth",
           "measure_bandwidth", "plan_bench", "run_bench", "synchronize", "timed_decode",
           "timed_pass", "weight_bytes", "write_json"]
