"""Divergence forensics: from "token t differs" to "layer L, node N" to a repro pack.

* ``explain_record(record_or_path, ...) -> Explanation``: rebuild the failing step's forward
  as the engine ran it and as it should have run, compare node by node with the float64
  arbiter against a measured noise floor, and name the first value out of it (``explain.py``;
  what it says: ``explanation.py``; which record, engine and package: ``record_resolution.py``).
* ``write_repro(record_or_path, out_dir, ...) -> ReproPack``: the smallest package that still
  shows the defect, its inputs, the arbiter's outputs and a generated pytest file; the prompt
  shrunk first (``shrink_prompt``; ``repro.py``).
* ``layer_curve_svg(explanation)`` / ``save_layer_curve(explanation, path)``: the per-layer
  error curve as a plot (``plot.py``).
* ``explain_and_print(summary, engines)`` (``explain_run`` plus a line per cell): what
  ``lockstep run --explain`` calls for every failing cell; ``load_explanations(evidence_dir)``,
  ``explanation_for(record, explained)`` and ``explanation_html(entry)``: what the report
  calls (``batch.py``).
"""
from .batch import (ExplainedCell, explain_and_print, explain_run, explanation_for,
                    explanation_html, load_explanations, record_key)
from .compare import FACTOR
from .explain import explain_record
from .explanation import Explanation, InputFinding, LayerPoint, NodeError
from .record_resolution import class_ref, failing_step
from .plot import layer_curve_svg, save_layer_curve
from .repro import ReproPack, ShrinkResult, shrink_prompt, write_repro

__all__ = ["FACTOR", "ExplainedCell", "Explanation", "InputFinding", "LayerPoint", "NodeError",
           "ReproPack", "ShrinkResult", "class_ref", "explain_and_print", "explain_record",
           "explain_run", "explanation_for", "explanation_html", "failing_step",
           "layer_curve_svg", "load_explanations", "record_key", "save_layer_curve",
           "shrink_prompt", "write_repro"]
