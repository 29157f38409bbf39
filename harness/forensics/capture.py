"""Recording an engine's own decode: every forward's feeds and outputs, and at one forward
every intermediate value.

The engine is decoded as the runner decodes it (``greedy_decode``: fresh ledger, the
interpreter building positions and state cells), with two instance-level wrappers and no
change to its class:

* ``run_component`` is wrapped: the interpreter's feeds (what the decode built) and what the
  engine returned, for every forward;
* on a native engine (an attribute holding ``Plan`` objects, by component: ``native-host``,
  ``native-cuda`` and their subclasses) each plan's ``run`` is wrapped too: the feeds the
  plan really saw (after anything the engine did to them inside ``run_component``), its own
  outputs (before anything the engine did to them after the forward), and, at the forward
  being explained, every intermediate through ``Plan.run(feeds, observe=...)``.

So an engine that corrupts its feeds or outputs around its executor is seen from inside:
the plan's feeds differ from the interpreter's, or the returned outputs from the plan's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engines.native.plan import Plan
from engines.workflow import greedy_decode

from .arbiter import Observed, to_host


def _host_copy(values) -> dict[str, np.ndarray]:
    return {k: np.array(to_host(v), copy=True) for k, v in dict(values).items()}


@dataclass
class ForwardRecord:
    index: int  # forwards of this component before it, in this decode
    component: str
    phase: str | None
    feeds: dict[str, np.ndarray]  # as the interpreter passed them
    plan_feeds: dict[str, np.ndarray] | None = None  # as the executor saw them (native)
    plan_outputs: dict[str, np.ndarray] | None = None  # as the executor produced them
    outputs: dict[str, np.ndarray] | None = None  # as run_component returned them
    error: str | None = None  # run_component raised
    observed: Observed | None = None  # every intermediate (the explained forward only)
    # the engine's ledger before this forward: (phase, forwards, positions) per phase
    history: list[tuple[str, int, int]] = field(default_factory=list)


def native_plans(engine) -> dict[str, Any]:
    """The engine's ``Plan`` per component, where it has them (native executors)."""
    found: dict[str, Any] = {}
    for value in vars(engine).values():
        if isinstance(value, dict) and value and all(isinstance(v, Plan) for v in value.values()):
            found.update(value)
    return found


class Recorder:
    """Wraps one engine instance; ``decode(prompt, n)`` runs its greedy decode recording
    every forward of ``component`` and observing every intermediate at forward ``target``."""

    def __init__(self, engine, component: str = "target", target: int | None = None):
        self.engine = engine
        self.component = component
        self.target = target
        self.forwards: list[ForwardRecord] = []
        self._current: ForwardRecord | None = None
        self.plans = native_plans(engine)
        self._install()

    @property
    def inside(self) -> bool:
        """Whether the engine's executor is seen from inside (native plans)."""
        return self.component in self.plans

    def _install(self) -> None:
        engine = self.engine
        original = engine.run_component

        def run_component(component, feeds, phase=None):
            if component != self.component:
                return original(component, feeds, phase=phase)
            index = sum(1 for f in self.forwards if f.component == component)
            rec = ForwardRecord(index, component, phase, _host_copy(feeds),
                                history=_history(getattr(engine, "ledger", None)))
            self.forwards.append(rec)
            self._current = rec
            try:
                out = original(component, feeds, phase=phase)
            except Exception as exc:
                rec.error = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                self._current = None
            rec.outputs = _host_copy(out)
            return out

        engine.run_component = run_component
        for component, plan in self.plans.items():
            self._wrap_plan(component, plan)

    def _wrap_plan(self, component: str, plan) -> None:
        original = plan.run

        def run(feeds, observe=None):
            rec = self._current
            if rec is None or rec.component != component:
                return original(feeds, observe=observe)
            rec.plan_feeds = _host_copy(feeds)
            mine = None
            if self.target is not None and rec.index == self.target:
                rec.observed = Observed({})
                mine = rec.observed.observe
            if observe is not None and mine is not None:
                theirs = observe

                def both(node, name, value):
                    mine(node, name, value)
                    theirs(node, name, value)
                hook = both
            else:
                hook = mine or observe
            out = original(feeds, observe=hook)
            rec.plan_outputs = _host_copy(out)
            if rec.observed is not None:
                rec.observed.outputs = rec.plan_outputs
            return out

        plan.run = run

    def decode(self, prompt, max_new_tokens: int, audit: bool = True):
        """The engine's greedy decode (as the runner runs it); an exception is kept, with
        the step it happened at, and the forwards recorded up to it."""
        try:
            return greedy_decode(self.engine, prompt, max_new_tokens, audit=audit), None
        except Exception as exc:
            return None, exc

    def forward(self, index: int) -> ForwardRecord | None:
        got = [f for f in self.forwards if f.component == self.component]
        return got[index] if index < len(got) else None


def _history(ledger) -> list[tuple[str, int, int]]:
    """The ledger's forwards so far as (phase, forwards, positions), in the ledger's phase
    order: what a replay puts into a fresh ledger before the same forward."""
    if ledger is None:
        return []
    return [(phase, int(n), int(ledger.forward_positions.get(phase, 0)))
            for phase, n in ledger.forwards.items() if n]


def replay_history(ledger, history) -> None:
    """Put ``history`` (``ForwardRecord.history``) into ``ledger``: the engine then stands
    where it stood before the recorded forward (its forward count by phase)."""
    for phase, count, positions in history:
        for k in range(count):
            ledger.record_forward(phase, positions if k == 0 else 0, 0.0)
