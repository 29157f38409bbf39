"""The per-layer error curve as a small plot (matplotlib, no display needed).

``layer_curve_svg(explanation) -> str`` is an inline SVG the HTML report can embed as it
is; ``save_layer_curve(explanation, path)`` writes ``.svg`` or ``.png`` by the suffix. Both
take an ``Explanation`` or its JSON form (``Explanation.to_dict()``, as written next to the
evidence). The curve
is the largest error over each layer's nodes (log scale) beside that node's noise floor; the
layer of the first value out of its floor is marked.
"""
from __future__ import annotations

import io
import math
import re
from pathlib import Path
from types import SimpleNamespace

import matplotlib
from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

from engines.errors import InputError

TINY = 1e-12  # zero errors are drawn here on the log axis
# in a saved plot's metadata (SVG dc:creator, PNG Software): lockstep knows the file is its own
PLOT_MARKER = "lockstep explain"
FORMATS = {".svg": "svg", ".png": "png"}  # by the file's suffix
_RC = {"svg.fonttype": "path", "svg.hashsalt": "lockstep", "font.size": 8}
_ID = re.compile(r'\bid="([^"]+)"')
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def _num(value) -> float:
    if isinstance(value, str):  # JSON's "Infinity" / "NaN" (Explanation.to_dict)
        return float(value.replace("Infinity", "inf"))
    return float(value) if value is not None else 0.0


def _view(explanation) -> SimpleNamespace:
    """The fields a plot needs, from an ``Explanation`` or its ``to_dict()`` (JSON) form."""
    if isinstance(explanation, dict):
        first = explanation.get("first_bad") or None
        return SimpleNamespace(
            engine=explanation["engine"], package=explanation["package"],
            step=explanation["step"], first_bad=SimpleNamespace(**first) if first else None,
            layers=[SimpleNamespace(label=p["label"], max_error=_num(p["max_error"]),
                                    floor=_num(p["floor"])) for p in explanation["layers"]])
    return explanation


def _figure(explanation, title: str | None = None):
    explanation = _view(explanation)
    points = explanation.layers
    labels = [p.label.replace("layer ", "L") for p in points]
    errors = [p.max_error for p in points]
    floors = [p.floor for p in points]
    finite = [e for e in errors + floors if e and math.isfinite(e)]
    top = max(finite) * 10 if finite else 1.0

    def clip(v):
        if v is None or v <= 0:
            return TINY
        return top if math.isinf(v) else v

    fig = Figure(figsize=(min(12.0, max(5.5, 0.35 * len(points) + 2.5)), 3.0), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(len(points)))
    ax.plot(xs, [clip(e) for e in errors], marker="o", linewidth=1.5, color="#c0392b",
            label="engine error (max over the layer)")
    ax.plot(xs, [clip(f) for f in floors], linestyle="--", linewidth=1.0, color="#7f8c8d",
            label="noise floor")
    first = explanation.first_bad.label if explanation.first_bad is not None else None
    for x, p in zip(xs, points):
        if p.label == first:
            ax.axvline(x, color="#c0392b", alpha=0.25, linewidth=6)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=0 if len(xs) < 14 else 90, fontsize=7)
    ax.set_ylabel("max |engine - arbiter|", fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    title = title or (f"{explanation.engine} on {explanation.package}, step {explanation.step}\n"
                      + (f"first out of the noise floor: {first}" if first
                         else "within the noise floor"))
    ax.set_title(title.replace("$", r"\$"), fontsize=8)
    ax.set_xlim(-0.5, len(points) - 0.5)
    ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    return fig


def layer_curve_svg(explanation, title: str | None = None, prefix: str = "layers") -> str:
    """The curve as SVG text, embeddable inline in HTML: no XML prolog, no comments or
    metadata, text as paths, every id prefixed with ``prefix`` (several plots can share one
    document)."""
    fig = _figure(explanation, title)
    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg",
                    metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buf.getvalue()
    text = _COMMENT.sub("", text[text.find("<svg"):])
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.DOTALL)
    for old in set(_ID.findall(text)):
        new = f"{prefix}-{old}"
        text = (text.replace(f'id="{old}"', f'id="{new}"').replace(f'"#{old}"', f'"#{new}"')
                .replace(f"url(#{old})", f"url(#{new})"))
    return text


def plot_format(path: str | Path, option: str = "--plot") -> str:
    """The format a curve is written in, by ``path``'s suffix (``FORMATS``); any other suffix
    is refused, since a ``.jpg`` holding SVG opens as a broken image."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise InputError(f"{option} writes an .svg or a .png file", field=option,
                         value=str(path), remedy=f"name the file .svg or .png, e.g. "
                                                 f"{Path(path).with_suffix('.svg')}")
    return fmt


def save_layer_curve(explanation, path: str | Path, title: str | None = None) -> Path:
    """Write the curve to ``path``, as SVG or PNG by its suffix (``plot_format``)."""
    path = Path(path)
    fmt = plot_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = _figure(explanation, title)
    fig.savefig(path, format=fmt,
                metadata={"Software" if fmt == "png" else "Creator": PLOT_MARKER})
    return path
