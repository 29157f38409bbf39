"""Engines for the distributed-run tests (``suites/test_distributed.py``), named as
``suites.distributed_engines:Class`` so the pytest-xdist workers of ``lockstep run --devices``
import them too."""
from __future__ import annotations

import os

import numpy as np

from engines.engine import Availability
from suites.planted.engines import Planted

DEADLY_PROMPT = [1, 60, 3, 88, 23, 9, 71]  # tiny_llama's p1


class NotHere(Planted):
    """An engine whose dependency is missing on this machine."""
    name = "distributed-not-here"

    @classmethod
    def availability(cls):
        return Availability(False, "needs the imaginary libbar; pip install bar")


class DiesOnPrompt(Planted):
    """Kills its own process, as a segfault in a driver would, when it prefills tiny_llama's
    second prompt. Only ever run it in a worker process (``--devices``)."""
    name = "distributed-dies"

    def corrupt_feeds(self, component, feeds, phase):
        if phase == "prefill" and self.package.spec.name == "tiny_llama":
            graph_input = self.package.spec.components[component].inputs["tokens"]
            if np.asarray(feeds[graph_input]).ravel().tolist() == DEADLY_PROMPT:
                os._exit(70)
        return feeds
