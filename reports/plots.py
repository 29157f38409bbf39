"""Plots as inline SVG strings (matplotlib's SVG backend, no pyplot): nothing to fetch.

Text is drawn as glyph paths, the SVG's comments and namespace URIs are removed, and every
id is prefixed per plot so several plots can share one HTML document without clashing.
Labels come from evidence, so ``$`` is escaped (no mathtext parsing of user strings).
"""
from __future__ import annotations

import io
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence

import matplotlib
from matplotlib.figure import Figure  # pyplot-free: no GUI backend, no global state

from harness.evidence import EvidenceRecord

_RC = {"svg.fonttype": "path", "svg.hashsalt": "lockstep", "font.size": 9}
_ID = re.compile(r'\bid="([^"]+)"')
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_XMLNS = re.compile(r'\s+xmlns(:\w+)?="[^"]*"')
MAX_SERIES = 12  # beyond this a legend is unreadable; the rest are drawn unlabelled


def _label(text: str) -> str:
    return text.replace("$", r"\$")


def cell_label(record: EvidenceRecord) -> str:
    return f"{record.package.name} · {record.engine} · {record.mode.label} · {record.prompt.name}"


def _svg(fig: Figure, prefix: str) -> str:
    buffer = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buffer, format="svg", bbox_inches="tight",
                    metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    text = _COMMENT.sub("", text)
    head_end = text.index(">")
    text = _XMLNS.sub("", text[:head_end]) + text[head_end:]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.DOTALL)
    for old in set(_ID.findall(text)):
        new = f"{prefix}-{old}"
        text = (text.replace(f'id="{old}"', f'id="{new}"')
                .replace(f'"#{old}"', f'"#{new}"')
                .replace(f"url(#{old})", f"url(#{new})"))
    return text.replace("xlink:href", "href")


def _figure(height: float = 3.0) -> Figure:
    with matplotlib.rc_context(_RC):
        return Figure(figsize=(7.5, height), layout="constrained")


def memory_plot(records: Sequence[EvidenceRecord]) -> str | None:
    """Live device allocations and free device memory over iterations, one line per cell."""
    series = [r for r in records if r.memory_series]
    if not series:
        return None
    with matplotlib.rc_context(_RC):
        fig = _figure(4.2)
        alloc_ax, free_ax = fig.subplots(2, 1, sharex=True)
        for i, record in enumerate(series):
            label = _label(cell_label(record)) if i < MAX_SERIES else None
            xs = [s.iteration for s in record.memory_series]
            allocs = [s.live_allocations for s in record.memory_series]
            free = [None if s.free_bytes is None else s.free_bytes / 2**20
                    for s in record.memory_series]
            if any(a is not None for a in allocs):
                alloc_ax.plot(xs, [float("nan") if a is None else a for a in allocs],
                              marker=".", label=label)
            if any(f is not None for f in free):
                free_ax.plot(xs, [float("nan") if f is None else f for f in free],
                             marker=".", label=label)
        alloc_ax.set_ylabel("live allocations")
        free_ax.set_ylabel("free device MiB")
        free_ax.set_xlabel("iteration")
        free_ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        alloc_ax.set_title("device memory over iterations (flat after warm-up is the claim)")
        if alloc_ax.get_legend_handles_labels()[0] or free_ax.get_legend_handles_labels()[0]:
            source = alloc_ax if alloc_ax.get_legend_handles_labels()[0] else free_ax
            source.legend(fontsize=7, loc="best")
        return _svg(fig, "plot-memory")


def acceptance_plot(records: Sequence[EvidenceRecord]) -> str | None:
    """Tokens accepted per verification round, one line per speculative cell."""
    series = [r for r in records if r.acceptance_per_round]
    if not series:
        return None
    with matplotlib.rc_context(_RC):
        fig = _figure()
        ax = fig.subplots()
        for i, record in enumerate(series):
            rounds = record.acceptance_per_round
            ax.plot(range(len(rounds)), rounds, marker=".", drawstyle="steps-mid",
                    label=_label(cell_label(record)) if i < MAX_SERIES else None)
        ax.set_xlabel("round")
        ax.set_ylabel("accepted tokens")
        ax.set_title("acceptance per round")
        ax.legend(fontsize=7, loc="best")
        return _svg(fig, "plot-acceptance")


def engine_throughput(records: Sequence[EvidenceRecord]) -> dict[str, float]:
    """Median tokens/s per engine over the cells that measured it."""
    per_engine: dict[str, list[float]] = defaultdict(list)
    for record in records:
        if record.timings is not None and record.timings.tokens_per_s is not None:
            per_engine[record.engine].append(record.timings.tokens_per_s)
    return {name: statistics.median(values) for name, values in sorted(per_engine.items())}


def throughput_plot(records: Sequence[EvidenceRecord],
                    baseline: Sequence[EvidenceRecord] | None = None) -> str | None:
    """Median tokens/s per engine as bars; the baseline's beside them when given."""
    current = engine_throughput(records)
    if not current:
        return None
    before = engine_throughput(baseline) if baseline else {}
    names = list(current)
    with matplotlib.rc_context(_RC):
        fig = _figure(max(1.6, 0.45 * len(names) + 0.9))
        ax = fig.subplots()
        ys = list(range(len(names)))
        height = 0.38 if before else 0.7
        ax.barh([y + (height / 2 if before else 0) for y in ys], [current[n] for n in names],
                height=height, label="this run", color="#3b6ea8")
        if before:
            ax.barh([y - height / 2 for y in ys], [before.get(n, 0.0) for n in names],
                    height=height, label="baseline", color="#b0b0b0")
            ax.legend(fontsize=7, loc="best")
        ax.set_yticks(ys, [_label(n) for n in names])
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s (median over cells)")
        ax.set_title("tokens/s per engine")
        return _svg(fig, "plot-throughput")


def band_plot(record: EvidenceRecord, anchor: str) -> str | None:
    """A quantized cell against its band (claim 1d): each step's KL divergence from the
    oracle (log scale) beside the band's per-step bound and mean, and each flip (a token
    that is not the oracle's argmax) by the oracle's top-2 margin at that step against how
    far below the oracle's best the engine's token was, beside the band's near-tie margin."""
    band = record.band
    audit = record.logits_audit
    if band is None or audit is None:
        return None
    steps = [(s.step, s.kl) for s in audit.steps if s.kl is not None]
    flips = []
    if record.judgement is not None:
        for f in record.judgement.findings:
            if f.engine_token is None or f.engine_token == f.oracle_token or len(f.oracle_top) < 2:
                continue
            flips.append((f.oracle_top[0][1] - f.oracle_top[1][1], f.gap or 0.0, f.verdict))
    with matplotlib.rc_context(_RC):
        fig = _figure(2.4)
        kl_ax, flip_ax = fig.subplots(1, 2, width_ratios=(3, 2))
        if steps:
            xs, ys = zip(*steps)
            kl_ax.plot(xs, [max(y, 1e-7) for y in ys], marker=".", lw=0.8, color="#3b6ea8",
                       label="KL(oracle ‖ engine)")
        for key, style, text in (("step_kl", "--", "band: step KL"),
                                 ("mean_kl", ":", "band: mean KL")):
            if key in band.bounds:
                kl_ax.axhline(band.bounds[key], ls=style, color="#b03030", lw=0.9, label=text)
        kl_ax.set_yscale("log")
        kl_ax.set_xlabel("step")
        kl_ax.set_ylabel("nats")
        kl_ax.set_title(_label(f"KL along the steps · {band.scheme}"), fontsize=8)
        kl_ax.legend(fontsize=6, loc="best")
        margin = band.bounds.get("near_tie_margin")
        for verdict, colour in (("near-tie", "#d08a1e"), ("defect", "#b03030")):
            pts = [(x, y) for x, y, v in flips if v == verdict]
            if pts:
                flip_ax.scatter(*zip(*pts), s=14, color=colour, label=f"{verdict} ({len(pts)})")
        if margin is not None:
            flip_ax.axhline(margin, ls="--", color="#b03030", lw=0.9, label="band: near-tie margin")
        top = max([margin or 0.0] + [y for _, y, _ in flips]) * 1.15 or 1.0
        right = max([0.1] + [x for x, _, _ in flips]) * 1.15
        flip_ax.plot([0, min(top, right)], [0, min(top, right)], color="#999999", lw=0.6,
                     label="gap = margin (the runner-up)")
        flip_ax.set_xlim(0, right)
        flip_ax.set_ylim(0, top)
        flip_ax.set_xlabel("oracle's top-2 margin")
        flip_ax.set_ylabel("engine token below best")
        flip_ax.set_title(f"flips ({len(flips)})" if flips else "no flips", fontsize=8)
        flip_ax.legend(fontsize=6, loc="best")
        return _svg(fig, f"plot-band-{anchor}")
