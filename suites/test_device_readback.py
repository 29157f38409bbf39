"""Reading a device engine's value on the host waits for the engine's stream.

native-cuda queues every forward on a non-blocking stream of its own and returns device
arrays without synchronising. A plain ``get`` copies on the current stream, which does not
wait for that one: straight after ``run_component`` it read the logits buffer before the
forward's last kernels had written it (on the H200, after a verification: wrong logits, max
abs 39 and 3,440, that looked like an engine bug). Forensics reads engine values this way,
so its ``to_host`` must wait for the value's device first.
"""
from __future__ import annotations

import numpy as np
import pytest

from harness.forensics.arbiter import to_host
from suites.support import write_figure


class _Device:
    def __init__(self):
        self.idle = False

    def synchronize(self) -> None:
        self.idle = True


class _QueuedArray:
    """A device array whose forward is still queued: ``get`` brings back the buffer's old
    bits until its device has been waited for."""

    def __init__(self, old, new):
        self.device = _Device()
        self._old, self._new = np.asarray(old), np.asarray(new)

    def get(self):
        return self._new.copy() if self.device.idle else self._old.copy()


def test_to_host_waits_for_the_values_device_before_reading():
    value = _QueuedArray(old=[7.0, 7.0], new=[1.0, 2.0])
    assert to_host(value).tolist() == [1.0, 2.0]
    assert value.device.idle


def test_to_host_leaves_host_values_alone():
    host = np.arange(3.0)
    assert to_host(host) is host
    assert to_host([1, 2]).tolist() == [1, 2]


def _smollm2_layers(tmp_path, layers: int):
    from engines.package import load_package
    from harness.convert.llama_config import LlamaConfig
    from harness.convert.llama_graph import build_llama

    config = LlamaConfig(layers=layers, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536,
                         vocab=49152, tied=True, cache="static", max_context=256,
                         dtype="float16", precision="mixed")
    return load_package(build_llama(tmp_path / "pkg", config, [[1, 2, 3, 4]],
                                    name="smollm2_shape_readback"))


@pytest.mark.gpu
def test_forensic_reads_of_native_cuda_logits_wait_for_the_forward(tmp_path, evidence_dir):
    """The H200 sequence that showed wrong logits: a prefill, a verification of 8, then
    ``truncate(0)`` and prefills of the same prompt, each read the moment ``forward``
    returns. ``to_host`` gives every prefill the bits a read ordered on the engine's stream
    gives, and all prefills are equal. A plain ``get`` is taken too (after ``to_host``'s
    wait it can no longer race, so it is taken first, on the prefill before): how often it
    disagreed is kept as a figure, the cause's evidence, not asserted."""
    from engines.registry import get_engine_class
    from engines.workflow.session import DecodeSession

    package = _smollm2_layers(tmp_path, layers=4)
    engine = get_engine_class("native-cuda")(package)
    phrase = [(37 * i + 11) % 49000 + 50 for i in range(40)]
    prompt = phrase * 3
    rows, plain_differs = [], []
    try:
        session = DecodeSession(engine)
        session.forward(prompt, "prefill")
        session.forward(prompt[:8], "verify")
        for run in range(8):
            session.truncate(0)
            logits = session.forward(prompt, "prefill")["logits"][0, -1]
            if run % 2:  # the race the fix closes, observed: a copy on the current stream
                plain = logits.get()
                ordered = logits.get(stream=engine.stream)
                plain_differs.append(bool((plain != ordered).any()))
            else:
                read = to_host(logits)
                ordered = logits.get(stream=engine.stream)
                assert read.tobytes() == ordered.tobytes(), run
            rows.append(ordered)
    finally:
        engine.close()
    assert all(row.tobytes() == rows[0].tobytes() for row in rows)
    write_figure(evidence_dir, "readback_race",
                 {"prefills": len(rows), "plain_get_differed": plain_differs,
                  "argmax": int(np.asarray(rows[0], np.float32).argmax())})
