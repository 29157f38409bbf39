"""Append kv cells as capacity buffers (``engines/native/capacity_cache.py``), checked on the
CPU: the capacity plan computes the append plan's logits and caches bit for bit through
prefill, decode, multi-position forwards and rollbacks (truncated views and truncated
copies); a past that is a prefix of the last buffer is reused, any other is copied once; the
rewrite is refused where the cache is read by anything but the fused causal attention; the
interpreter (greedy and speculative, rollback included) decodes the same tokens through a
host engine that translates its cells as native-cuda does; a package is graph-stable exactly
where every kv cell is static or capacity-backed and no proposer borrows an append cell.
The device (capture, replay, staging, timing) is ``test_append_graphs_cuda.py``.
"""
from __future__ import annotations

import numpy as np
import pytest

from engines.backends.native_host import NativeHostEngine
from engines.dtypes import dtype_of
from engines.native.array_backend import NumpyArrayBackend
from engines.native.capacity_cache import CapacityCells, capacity_plan
from engines.native.graph_slots import Signature, graphs_default
from engines.native.plan import Plan
from engines.package.schema import PackageSpec
from engines.workflow import greedy_decode
from engines.workflow.speculative import speculative_decode
from harness.convert.llama_config import LlamaConfig
from harness.convert.llama_graph import llama_model, llama_spec

CONFIGS = {"float32": {}, "bfloat16-mixed": {"dtype": "bfloat16", "precision": "mixed"},
           "tied-gqa4": {"tied": True, "heads": 8, "kv_heads": 2},
           "pairs": {"rope_layout": "pairs", "kv_heads": 1, "heads": 4}}


def _decoder(**overrides):
    c = LlamaConfig(seed=3, **overrides)
    return c, llama_model(c), PackageSpec.model_validate(llama_spec(c, "t", [[1, 2]], "d"))


class _Stepper:
    """The append plan and the capacity plan side by side, fed as the interpreter feeds."""

    def __init__(self, c, model, spec):
        found, why = capacity_plan(model, spec, "target")
        assert found is not None, why
        self.c = c
        self.append = Plan(model, NumpyArrayBackend())
        self.capacity = Plan(found.model, NumpyArrayBackend())
        self.cells = CapacityCells(found, np)
        empty = np.zeros((1, c.kv_heads, 0, c.head_dim), dtype_of(c.dtype))
        self.names = [f"past_{k}_{i}" for i in range(c.layers) for k in ("key", "value")]
        self.a = {n: empty for n in self.names}
        self.b = dict(self.a)
        self.position = 0

    def rollback(self, length: int, copy: set[str] = frozenset()):
        """Truncate every cell: a view, or (names in ``copy``) a contiguous copy."""
        self.position = length
        self.a = {n: v[:, :, :length] for n, v in self.a.items()}
        self.b = {n: (v[:, :, :length].copy() if n in copy else v[:, :, :length])
                  for n, v in self.b.items()}

    def step(self, tokens):
        m = len(tokens)
        base = {"input_ids": np.asarray([tokens], np.int64),
                "position_ids": np.arange(self.position, self.position + m)[None]}
        a = self.append.run({**base, **self.a})
        feeds, lengths = self.cells.feeds({**base, **self.b}, m)
        b = self.cells.outputs(self.capacity.run(feeds), lengths, m)
        assert a["logits"].tobytes() == b["logits"].tobytes(), self.position
        for name in self.names:
            out = name.replace("past", "present")
            assert b[out].shape == a[out].shape
            assert np.ascontiguousarray(b[out]).tobytes() == a[out].tobytes(), (self.position, out)
            self.a[name], self.b[name] = a[out], b[out]
        self.position += m
        return feeds


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_capacity_plan_is_the_append_plan_bit_for_bit(name):
    s = _Stepper(*_decoder(**CONFIGS[name]))
    cells = len(s.names)
    s.step([1, 5, 9, 20, 3])
    assert s.cells.recognised == 0             # the empty first pasts were never handed out
    s.step([7])
    s.step([8])
    s.step([4, 4, 4])                          # a verification's W+1 positions
    assert s.cells.copies == 0                 # every later past was the last buffer's prefix
    assert s.cells.recognised == 3 * cells     # ... known by identity, nothing read again
    s.rollback(7)                              # truncated views: still the buffer's prefix
    s.step([11])
    assert s.cells.copies == 0 and s.cells.recognised == 3 * cells  # new views: looked at
    s.rollback(3, copy={"past_key_0", "past_value_1"})  # truncated copies: copied in once
    s.step([2, 3])
    assert s.cells.copies == 2
    s.step([5])
    assert s.cells.copies == 2


def test_a_replays_presents_are_made_once_per_step_and_only_for_lasting_buffers():
    """A graph slot writes the same output buffers every replay (``lasting``), so a step
    seen before hands out the views it handed then; an eager forward's fresh buffers are
    viewed anew and change nothing kept; buffers of a new capture drop what was kept, and
    ``forget`` (a slot reset) drops it too, so no dropped buffer is held."""
    c, model, spec = _decoder()
    found, _ = capacity_plan(model, spec, "target")
    cells = CapacityCells(found, np)
    shape = (1, c.kv_heads, found.max_context, c.head_dim)
    slot = {cell.output: np.zeros(shape, np.float32) for cell in found.cells}
    at = {cell.output: 4 for cell in found.cells}
    first = cells.outputs(slot, at, 1, lasting=True)
    eager = {name: buffer.copy() for name, buffer in slot.items()}
    fresh = cells.outputs(eager, at, 1)
    again = cells.outputs(slot, at, 1, lasting=True)
    longer = cells.outputs(slot, {name: 5 for name in slot}, 1, lasting=True)
    for name, buffer in slot.items():
        assert again[name] is first[name] and first[name].base is buffer
        assert first[name].shape[2] == 5 and longer[name].shape[2] == 6
        assert fresh[name] is not first[name] and fresh[name].base is eager[name]
    assert len(cells._steady) == 2
    # the last views handed out are recognised by identity as the next pasts
    feeds, lengths = cells.feeds({n.replace("present", "past"): v for n, v in longer.items()},
                                 1)
    assert set(lengths.values()) == {6} and cells.recognised == len(slot) and cells.copies == 0
    assert all(feeds[n.replace("present", "past")] is slot[n] for n in slot)
    recaptured = {name: buffer.copy() for name, buffer in slot.items()}
    moved = cells.outputs(recaptured, at, 1, lasting=True)
    assert len(cells._steady) == 1 and all(moved[n].base is recaptured[n] for n in slot)
    cells.forget()
    assert cells._steady == {} and cells._steady_buffers == () and cells._handed == {}


def test_capacity_feeds_have_one_signature_per_forward_width():
    """What makes the step capturable: the graph slot's signature does not grow with P."""
    s = _Stepper(*_decoder())
    s.step([1, 2, 3])
    signatures = {Signature.of("target", s.step([t])) for t in (4, 5, 6, 7)}
    assert len(signatures) == 1
    widths = {Signature.of("target", s.step([8, 9])), Signature.of("target", s.step([1, 2]))}
    assert len(widths) == 1 and widths != signatures


@pytest.mark.parametrize("overrides,reason", [
    ({"sliding_window": 4}, "read by Shape"),
    ({"cache": "static"}, "no append kv cell")])
def test_the_rewrite_is_refused_where_the_cache_is_read_otherwise(overrides, reason):
    _, model, spec = _decoder(**overrides)
    found, why = capacity_plan(model, spec, "target")
    assert found is None and reason in why


def test_a_forward_past_max_context_is_refused_naming_the_cell():
    from engines.errors import InputError

    s = _Stepper(*_decoder(max_context=8))
    s.step([1, 2, 3, 4, 5, 6])
    s.cells.feeds(dict(s.b), 2)  # to the last slot: fine
    with pytest.raises(InputError) as info:
        s.cells.feeds(dict(s.b), 3)
    assert info.value.field == "state.k0" and info.value.value == 9


def test_the_rewrite_refuses_a_chained_target_whose_cache_feeds_a_matmul(packages):
    package = packages["lookup_chained"]
    found, why = capacity_plan(package.component_model("target"), package.spec, "target")
    assert found is None and "MatMul" in why


# -- the interpreter over a host engine that translates as native-cuda does ------------------

class CapacityHost(NativeHostEngine):
    """native-host planning every eligible component with capacity buffers and translating
    the cells as native-cuda's ``run_component`` does (test double)."""

    name = "native-host-capacity"

    def __init__(self, package):
        super().__init__(package)
        self.capacity = {}
        for component in package.spec.components:
            found, _ = capacity_plan(package.component_model(component), package.spec,
                                     component)
            if found is not None:
                self.capacity[component] = CapacityCells(found, np)
                self._plans[component] = Plan(found.model, self.backend)

    def run_component(self, component, feeds, phase=None):
        cells = self.capacity.get(component)
        if cells is None:
            return self._plans[component].run(feeds)
        m = int(feeds[self.package.spec.components[component].inputs["tokens"]].shape[1])
        translated, lengths = cells.feeds(feeds, m)
        return cells.outputs(self._plans[component].run(translated), lengths, m)


@pytest.mark.parametrize("package_name", ["tiny_llama", "tied_llama", "tiny_llama_pair",
                                          "hybrid_mtp"])
def test_the_interpreter_decodes_the_same_tokens_through_capacity_cells(packages,
                                                                         package_name):
    package = packages[package_name]
    plain, capacity = NativeHostEngine(package), CapacityHost(package)
    assert capacity.capacity, "no component was planned with capacity buffers"
    prompt = package.spec.prompts[0]
    want = greedy_decode(plain, prompt, 12).tokens
    assert greedy_decode(capacity, prompt, 12).tokens == want
    if package.spec.decoding.speculative is not None:  # rollbacks after rejected drafts
        rollbacks = 0
        for width in (1, 3):
            result = speculative_decode(capacity, prompt, 12, width)
            assert result.tokens == want, width
            rollbacks += result.ledger.rollbacks
        assert rollbacks > 0  # the truncated cells really went back through the buffers


def test_graphs_default_counts_capacity_cells_and_refuses_borrowed_append_cells(packages):
    static, append = packages["tiny_llama_static"].spec, packages["tiny_llama"].spec
    assert graphs_default(static) and graphs_default(static, {"k0"})
    assert not graphs_default(append)
    assert not graphs_default(append, {"k0", "v0"})  # the other layer's cells stay append
    assert graphs_default(append, set(append.state))
    chained = packages["lookup_chained"].spec      # the drafter borrows the target's k0
    assert not graphs_default(chained, set(chained.state))
