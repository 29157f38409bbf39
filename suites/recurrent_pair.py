"""A test-only hybrid package for the snapshot path: a target with a recurrent cell AND a kv
cell, both of which decide its tokens, and a draft model that is often wrong.

Each token t carries two bits x(t) and y(t). The target keeps the running sum of x in the
recurrent cell ``r0`` (``state_out = state_in + sum x``) and one key y per position in the
append kv cell ``k0`` (summed over the visible keys). Its next token is ``A(t)`` when
``sum x + sum y`` is even and ``B(t)`` when it is odd (``cos(pi * S)``, a planted margin),
so a recurrent cell not restored after a rejection, or a kv cell not rolled back, flips the
parity whenever the stale tokens' bits are odd: the stream leaves the oracle. The draft
model always proposes ``A(t)``, so it is right on even steps only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.convert.onnx_graph import INT64, GraphBuilder
from harness.convert.package_writer import write_package

VOCAB = 24
MAX_CONTEXT = 64
GAIN = 3.0


def successors(t: int) -> tuple[int, int]:
    return (7 * t + 5) % VOCAB, (11 * t + 2) % VOCAB


def _tables(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.choice([0.0, 1.0], size=(VOCAB, 1))
    y = rng.choice([0.0, 1.0], size=(VOCAB, 1))
    base = rng.uniform(-1.0, 0.0, size=(VOCAB, VOCAB))
    sign = np.zeros((VOCAB, VOCAB))
    draft = rng.uniform(-1.0, 1.0, size=(VOCAB, VOCAB))
    for t in range(VOCAB):
        a, b = successors(t)
        base[t, a] = base[t, b] = 0.5
        sign[t, a], sign[t, b] = 1.0, -1.0
        draft[t, a] = 3.0
    return x, y, base, sign, draft


def _target(seed: int):
    x_table, y_table, base, sign, _ = _tables(seed)
    g = GraphBuilder("recurrent_pair_target")
    ids = g.input("input_ids", [1, "M"], INT64)
    positions = g.input("position_ids", [1, "M"], INT64)
    state = g.input("state_in", [1, 1])
    past = g.input("past_key_0", [1, 1, "P", 1])
    x = g.op("Gather", g.weight(x_table, "x_table"), ids)                   # [1, M, 1]
    m = g.op("Gather", g.op("Shape", ids), g.ints(1, "m_axis"))
    idx = g.op("Range", g.ints(0, "zero"), m, g.ints(1, "one"))               # [M]
    tri = g.op("Where", g.op("LessOrEqual", g.unsqueeze(idx, [0]), g.unsqueeze(idx, [1])),
               g.scalar(1.0), g.scalar(0.0))                                  # [M, M]: j <= i
    running = g.op("Add", g.op("MatMul", tri, x), g.unsqueeze(state, [1]))    # [1, M, 1]
    new_state = g.op("Add", state, g.reduce("ReduceSum", x, [1], keepdims=0))  # [1, 1]
    y = g.op("Gather", g.weight(y_table, "y_table"), ids)                   # [1, M, 1]
    present = g.op("Concat", past, g.unsqueeze(y, [1]), axis=2)              # [1, 1, T, 1]
    length = g.op("Gather", g.op("Shape", present), g.ints(2, "seq_axis"))
    key_pos = g.op("Range", g.ints(0, "zero"), length, g.ints(1, "one"))      # [T]
    visible = g.op("Where", g.op("LessOrEqual", key_pos, g.unsqueeze(positions, [2])),
                   g.scalar(1.0), g.scalar(0.0))                              # [1, M, T]
    cached = g.op("MatMul", visible, g.reshape(present, [1, -1, 1]))          # [1, M, 1]
    parity = g.op("Cos", g.op("Mul", g.op("Add", running, cached), g.scalar(np.pi)))
    pick = g.op("Tanh", g.op("Mul", parity, g.scalar(4.0)))                   # [1, M, 1]
    signs = g.op("Gather", g.weight(sign * GAIN, "sign"), ids)              # [1, M, V]
    logits = g.op("Add", g.op("Gather", g.weight(base, "base"), ids), g.op("Mul", pick, signs))
    g.output(logits, "logits", [1, "M", VOCAB])
    g.output(new_state, "state_out", [1, 1])
    g.output(present, "present_key_0", [1, 1, "T", 1])
    return g.model()


def _drafter(seed: int):
    *_, draft = _tables(seed)
    g = GraphBuilder("recurrent_pair_drafter")
    ids = g.input("input_ids", [1, "M"], INT64)
    g.output(g.op("Gather", g.weight(draft, "draft"), ids), "logits", [1, "M", VOCAB])
    return g.model()


def build_recurrent_pair(folder: Path, seed: int = 0) -> Path:
    spec = {
        "format": 1, "name": "recurrent_pair",
        "description": "test-only hybrid: running sum in a recurrent and a kv cell",
        "vocab_size": VOCAB, "bos_id": 1, "eos_id": None, "max_context": MAX_CONTEXT,
        "dtype": "float32", "tokenizer": None,
        "prompts": [[1, 5, 9], [2, 3], [1, 20, 7, 4, 11]],
        "components": {
            "target": {"path": "target.onnx",
                       "inputs": {"tokens": "input_ids", "positions": "position_ids"},
                       "outputs": {"logits": "logits"}},
            "drafter": {"path": "drafter.onnx", "inputs": {"tokens": "input_ids"},
                        "outputs": {"logits": "logits"}},
        },
        "state": {
            "k0": {"kind": "kv", "component": "target", "input": "past_key_0",
                   "output": "present_key_0", "dtype": "float32", "shape": [1, 1, 0, 1],
                   "seq_axis": 2, "update": "append"},
            "r0": {"kind": "recurrent", "component": "target", "input": "state_in",
                   "output": "state_out", "dtype": "float32", "shape": [1, 1]},
        },
        "decoding": {"greedy": {}, "speculative": {
            "kind": "draft", "proposer": "drafter", "target": "target", "max_width": 4,
            "rollback": ["k0"], "snapshot": ["r0"]}},
    }
    return write_package(Path(folder), spec, {"target": _target(seed), "drafter": _drafter(seed)})
