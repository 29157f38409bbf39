"""Planted bugs for servers: the engine a fake server computes with, broken only when the
server has more than one request in flight (``in_flight`` is set by the server before each
decode). Claim ``concurrency_invariance`` must catch the first and pass the control."""
from __future__ import annotations

import numpy as np

from suites.planted.engines import Planted


class ServedEngine(Planted):
    """native-host as a fake server runs it: harmless whatever is in flight (the control:
    concurrent and correct)."""

    name = "planted-served"
    in_flight = 1

    def corrupt(self, component, feeds, out, phase):
        return out


class BatchNoise(ServedEngine):
    """With more than one request in flight, every logit moves by up to ``amplitude`` (a
    batched kernel that reads its neighbours' rows): alone, it is exact."""

    name = "planted-batch-noise"
    amplitude = 4.0

    def noisy(self) -> bool:
        return self.in_flight > 1

    def corrupt(self, component, feeds, out, phase):
        if not self.noisy():
            return out
        name = self.logits_name(component)
        logits = out[name]
        pattern = np.sin(np.arange(logits.shape[-1]) * 1.7).astype(logits.dtype)
        out[name] = (logits + np.float32(self.amplitude) * pattern).astype(logits.dtype)
        return out


class SlightBatchNoise(BatchNoise):
    """The same, small enough to leave every token alone: only the log-probabilities move
    (0.05, some 25 times the float32 logprob bound)."""

    name = "planted-slight-batch-noise"
    amplitude = 0.05


class SlightNoise(SlightBatchNoise):
    """The same small noise on every request, alone too: a server whose log-probabilities
    are off (the top-k audit's planted bug, not a concurrency one)."""

    name = "planted-slight-noise"

    def noisy(self) -> bool:
        return True
