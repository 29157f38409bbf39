"""Evidence -> one self-contained HTML parity report (inline CSS and SVG, nothing fetched)."""
from .regressions import NOISE_BAND, Regression, find_regressions
from .render import render_report

__all__ = ["NOISE_BAND", "Regression", "find_regressions", "render_report"]
