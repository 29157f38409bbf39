"""Two logits matrices compared row by row (max abs, NMSE, KL, flips and their margins):
``lockstep calibrate`` measures a band with it and the runner a stream's quality against the
float model, so both read one definition."""
from __future__ import annotations

import numpy as np


def log_softmax(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def compare_rows(engine: np.ndarray, oracle: np.ndarray, chunk: int = 64,
                 tokens: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Row by row (``[n, vocab]`` each, float64 arithmetic, ``chunk`` rows at a time): max
    abs, NMSE, KL(oracle || engine) in nats (``harness.judgement.kl_divergence``'s formula),
    flips, their gaps, the oracle's top-2 margins and the engine's argmax; with ``tokens``
    (one a row) also each side's log-probability of that token."""
    parts = [_compare(engine[i:i + chunk], oracle[i:i + chunk],
                      None if tokens is None else tokens[i:i + chunk])
             for i in range(0, len(oracle), chunk)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _compare(engine, oracle, tokens=None) -> dict[str, np.ndarray]:
    e = np.asarray(engine, dtype=np.float64)
    o = np.asarray(oracle, dtype=np.float64)
    diff = e - o
    log_p, log_q = log_softmax(o), log_softmax(e)
    kl = np.maximum((np.exp(log_p) * (log_p - log_q)).sum(axis=-1), 0.0)
    best, chosen = o.argmax(axis=-1), e.argmax(axis=-1)
    rows = np.arange(len(o))
    top2 = np.partition(o, o.shape[-1] - 2, axis=-1)[:, -2:]  # [second, first]
    out = {"max_abs": np.abs(diff).max(axis=-1),
           "nmse": (diff ** 2).sum(axis=-1) / (o ** 2).sum(axis=-1),
           "kl": kl, "flipped": best != chosen,
           "gap": o[rows, best] - o[rows, chosen],
           "margin": top2[:, 1] - top2[:, 0], "argmax": chosen}
    if tokens is not None:
        out["logp_oracle"] = log_p[rows, tokens]
        out["logp_engine"] = log_q[rows, tokens]
    return out


__all__ = ["compare_rows", "log_softmax"]
