"""Where a decode's time goes (``lockstep bench --profile``): the host functions of one greedy
decode under cProfile, and, for an engine that replays its decode forward as a CUDA graph
(native-cuda's ``PRIMARY`` slot), that forward's device time (the graph replayed back to
back, timed with CUDA events), the host's share of a steady step beside it, and each
kernel's device time (torch's CUPTI profiler, where torch is importable).

Diagnostic, like the figures beside the bench table: speed claims are the table's ratios;
this says what bounds them (``docs/PERFORMANCE.md``). The profiled decode is not a timed
one (cProfile slows the host), and it is greedy: a speculative row is not profiled.
"""
from __future__ import annotations

import cProfile
import pstats
from dataclasses import asdict, dataclass, field
from typing import Any

from engines.cuda_support import import_cupy
from engines.native.graph_slots import GraphSlot, GraphSlots
from engines.workflow import greedy_decode

REPLAYS = 200  # back-to-back replays one device time is the mean of
HOST_ROWS = 15  # host functions shown, by their own time


@dataclass
class HostFunction:
    function: str  # file:line(name)
    calls: int
    own_ms: float  # time in the function itself
    cumulative_ms: float  # with its callees


@dataclass
class DecodeProfile:
    host: list[HostFunction] = field(default_factory=list)
    replay_ms: float | None = None  # device ms of one PRIMARY replay (graph engines)
    host_share_ms: float | None = None  # steady decode ms minus the replay
    kernels: str = ""  # the CUPTI table by kernel, or why there is none

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DecodeProfile":
        return cls(**{**data, "host": [HostFunction(**f) for f in data.get("host", [])]})

    def text(self, title: str) -> str:
        lines = [f"where the time goes: {title}"]
        if self.replay_ms is not None:
            lines.append(f"  PRIMARY graph replay, back to back: {self.replay_ms:.3f} ms a "
                         f"forward" + ("" if self.host_share_ms is None else
                                       f"; host share of a steady step "
                                       f"{self.host_share_ms:.3f} ms"))
        lines.append(f"  {'own ms':>9} {'cum ms':>9} {'calls':>7}  host function (one "
                     f"decode under cProfile)")
        lines += [f"  {f.own_ms:>9.2f} {f.cumulative_ms:>9.2f} {f.calls:>7}  {f.function}"
                  for f in self.host]
        if self.kernels:
            lines.append(self.kernels)
        return "\n".join(lines)


def host_functions(profiler: cProfile.Profile, rows: int = HOST_ROWS) -> list[HostFunction]:
    """The profiled functions that cost most by their own time."""
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, calls, own, cum, ...)
    ranked = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:rows]
    return [HostFunction(pstats.func_std_string(func), calls, own * 1e3, cum * 1e3)
            for func, (_, calls, own, cum, _) in ranked]


def graph_replay_ms(engine, cupy, replays: int = REPLAYS,
                    slot: GraphSlot = GraphSlot.PRIMARY) -> float | None:
    """Device ms of one replay of the engine's captured ``slot`` graph (None: it has none),
    launched ``replays`` times back to back on its stream between two CUDA events."""
    slots = getattr(engine, "slots", None)
    graph = slots[slot].graph if isinstance(slots, GraphSlots) else None
    if graph is None:
        return None
    for _ in range(10):
        graph.launch(engine.stream)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(engine.stream)
    for _ in range(replays):
        graph.launch(engine.stream)
    stop.record(engine.stream)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / replays


def kernel_table(engine) -> str:
    """Five PRIMARY replays under torch's profiler (CUPTI sees CuPy's kernels), by kernel."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as exc:
        return f"  (no kernel table: torch is not importable: {exc})"
    graph = engine.slots[GraphSlot.PRIMARY].graph
    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            graph.launch(engine.stream)
        engine.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)


def profile_decode(engine, prompt, max_new_tokens: int, ignore_eos: bool,
                   steady_ms: float | None, rows: int = HOST_ROWS) -> DecodeProfile:
    """One greedy decode of ``engine`` under cProfile, then, where the engine replays a
    captured decode graph, that graph's device time against ``steady_ms`` (the bench row's
    steady decode ms a token) and its kernels."""
    profiler = cProfile.Profile()
    engine.synchronize()
    profiler.enable()
    greedy_decode(engine, prompt, max_new_tokens, ignore_eos=ignore_eos)
    engine.synchronize()
    profiler.disable()
    found = DecodeProfile(host=host_functions(profiler, rows))
    if isinstance(getattr(engine, "slots", None), GraphSlots):
        found.replay_ms = graph_replay_ms(engine, import_cupy())
        if found.replay_ms is not None:
            found.kernels = kernel_table(engine)
            if steady_ms is not None:
                found.host_share_ms = steady_ms - found.replay_ms
    return found


__all__ = ["DecodeProfile", "HostFunction", "graph_replay_ms", "host_functions",
           "kernel_table", "profile_decode"]
