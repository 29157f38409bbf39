"""Quality beside the verdict: a quantized engine against the original float model its
package was quantized from, in the terms ``llama-perplexity --kl-divergence`` reports.

The verdict (claim 1d) judges a quantized engine against float32 over its *own* dequantized
weights: is it computing what its weights say? Whether those weights are a good
approximation of the model they were made from is another question, and no verdict: a
fresh Q4_0 of a small model is far from its float original (mean KL ~0.27 on SmolLM2-135M)
while computing exactly what it should. A package may declare that original
(``package.yaml``: ``original: {folder, content_hash}``, a sibling folder pinned by its hash;
``harness.requantize`` makes such packages); then the engine's rows are compared with the
original's, on the engine's own prefix in a run (``lockstep run``: the record's
``quality``) and teacher-forced on the calibration corpus (``lockstep calibrate``: the band's
provenance), as llama-perplexity does:

- KL divergence per position, the original as P (mean, median, 90th and 99th percentile,
  max);
- "same top": the share of positions whose argmax is the original's;
- Δp, the change of the chosen token's probability (engine minus original): mean, RMS
  (spread) and skew (a symmetric spread is noise, a skew is damage), with percentiles. The
  chosen token is the engine's own in a run, the corpus's next token in calibration;
- on the corpus, the perplexity ratio (the engine's perplexity over the original's).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from engines.errors import PackageError
from engines.package.sibling import pinned_sibling
from harness.row_compare import compare_rows


def original_package(package):
    """The float package ``package`` declares it was quantized from (a sibling folder whose
    content hash must match, with the same vocabulary), else None."""
    spec = package.spec.original
    if spec is None:
        return None
    where = str(package.yaml_path)
    remedy = (f"put the original package {spec.folder!r} beside {package.root.name!r}, or "
              f"remake this package (python -m harness.requantize)")
    original = pinned_sibling(package, spec, "original", "original", remedy)
    if original.spec.vocab_size != package.spec.vocab_size:
        raise PackageError(f"the original package {spec.folder!r} has vocab_size "
                           f"{original.spec.vocab_size}, this package "
                           f"{package.spec.vocab_size}", field="original.folder",
                           value=spec.folder, remedy=remedy, where=where)
    return original


@dataclass
class Quality:
    """The engine's rows against the original's at the same positions (``llama-perplexity``'s
    statistics); ``ppl_ratio`` only where the chosen tokens are a text's own (the corpus)."""
    positions: int
    kl: dict[str, float]  # mean, median, p90, p99, max
    same_top: float
    delta_p: dict[str, float]  # mean, rms, skew, p1, p5, p50, p95, p99
    ppl_ratio: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _skew(x: np.ndarray) -> float | None:
    sd = float(x.std())
    return float(((x - x.mean()) ** 3).mean() / sd ** 3) if sd > 0 else None


def quality(engine_rows, original_rows, tokens, perplexity: bool = False) -> Quality:
    """``engine_rows`` and ``original_rows`` (``[n, vocab]``) at the same positions, and the
    token chosen after each (``perplexity``: the text's own next tokens, so the perplexity
    ratio means what llama-perplexity's does)."""
    return summarize(compare_rows(np.asarray(engine_rows), np.asarray(original_rows),
                                  tokens=np.asarray(tokens, dtype=np.int64)), perplexity)


def summarize(cmp: dict, perplexity: bool = False) -> Quality:
    """``Quality`` from ``harness.row_compare.compare_rows`` output with the chosen tokens'
    log-probabilities (the original as the oracle side)."""
    kl = cmp["kl"]
    dp = np.exp(cmp["logp_engine"]) - np.exp(cmp["logp_oracle"])
    pct = lambda x, q: float(np.percentile(x, q))  # noqa: E731
    ratio = None
    if perplexity:
        ratio = float(np.exp(np.mean(-cmp["logp_engine"]) - np.mean(-cmp["logp_oracle"])))
    skew = _skew(dp)
    return Quality(
        positions=len(kl),
        kl={"mean": float(kl.mean()), "median": pct(kl, 50), "p90": pct(kl, 90),
            "p99": pct(kl, 99), "max": float(kl.max())},
        same_top=float((~cmp["flipped"]).mean()),
        delta_p={"mean": float(dp.mean()), "rms": float(np.sqrt((dp ** 2).mean())),
                 **({"skew": skew} if skew is not None else {}),
                 **{f"p{q}": pct(dp, q) for q in (1, 5, 50, 95, 99)}},
        ppl_ratio=ratio)


__all__ = ["Quality", "original_package", "quality", "summarize"]
