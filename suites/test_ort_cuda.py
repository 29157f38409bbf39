"""ort-cuda: onnxruntime's CUDA provider with IO binding (claims 1, 3, 4 and its own graphs).

On the GPU (marker ``gpu``): tokens equal the oracle on every fixture; host staging zero by
the ledger, by the transfer guard (disallow mode) and by onnxruntime's own graph (no
MemcpyToHost node); exactly 4 bytes read back per token; outputs stay on the device; on
static packages onnxruntime's CUDA graph captures once (its log says so) and replays every
later decode step, with the outputs poisoned before every run.

On the host (CI): the engine reports itself unavailable without the CUDA provider, naming
onnxruntime-gpu, and refuses to be built; the output-shape resolution matches what
onnxruntime really produces; and the binding logic itself (pointers, fixed graph buffers
reused across steps, counters) decodes every fixture exactly, run on onnxruntime's CPU
provider over host memory.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engines.engine import Availability, Engine
from engines.errors import EngineUnavailable, InputError, ResidencyError
from engines.oracle import oracle_decode
from engines.workflow import greedy_decode
from harness.catalog.builtin import speculative_fixtures
from suites.support import device_greedy_matches_oracle, fixture_names

ENGINE = "ort-cuda"
NEW_TOKENS = 24
ROOT = Path(__file__).resolve().parents[1]
STATIC_FIXTURES = [n for n in fixture_names() if n.endswith("_static")]
CAPTURE_LOG = "capturing the cuda graph"

gpu = pytest.mark.gpu


# -- helpers ---------------------------------------------------------------------------------
def _fresh(package, **options):
    from engines.backends.ort_cuda import OrtCudaEngine

    avail = OrtCudaEngine.availability()
    if not avail.ok:
        pytest.skip(f"{ENGINE} unavailable: {avail.reason}")
    return OrtCudaEngine(package, **options)


def _cpu_session(path, graph: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options,
                                providers=["CPUExecutionProvider"])


class HostBoundEngine(Engine):
    """ort-cuda's binding logic over host memory on the CPU provider (a CI double): the same
    IoBoundComponent, pointers into numpy arrays, a second plain session standing in for
    the CUDA-graph one, fixed buffers reused across decode steps exactly as on the GPU."""

    name = "ort-iobinding-host"
    residency = "host"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True, "CPU provider")

    def __init__(self, package, graph: bool, poison: bool = True):
        from engines.backends.ort_cuda import HostMemory, IoBoundComponent, width_input

        super().__init__(package)
        memory = HostMemory()
        self.components = {}
        for name in package.spec.components:
            path = package.component_path(name)
            self.components[name] = IoBoundComponent(
                name, package.component_model(name), width_input(package.spec, name), memory,
                _cpu_session(path), _cpu_session(path) if graph else None, None, poison)

    def run_component(self, component, feeds, phase=None):
        return self.components[component].run(feeds, self.ledger)


# -- host: availability ----------------------------------------------------------------------
def test_registry_lists_ort_cuda():
    from engines.backends.ort_cuda import OrtCudaEngine
    from engines.registry import engine_names, get_engine_class

    assert ENGINE in engine_names()
    assert get_engine_class(ENGINE) is OrtCudaEngine
    assert OrtCudaEngine.residency == "cuda:0"


def test_unavailable_without_the_cuda_provider(monkeypatch, packages):
    import onnxruntime

    import engines.backends.ort_cuda as ort_cuda

    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CPUExecutionProvider"])
    # CuPy present or not, the missing provider is the reason given
    monkeypatch.setattr(ort_cuda, "cuda_availability", lambda: (True, "a CUDA device"))
    avail = ort_cuda.OrtCudaEngine.availability()
    assert not avail.ok
    assert "onnxruntime-gpu" in avail.reason and "CUDAExecutionProvider" in avail.reason
    with pytest.raises(EngineUnavailable) as info:
        ort_cuda.OrtCudaEngine(packages["tiny_llama"])
    err = info.value
    assert "onnxruntime-gpu" in err.remedy and "lockstep[cuda12]" in err.remedy
    assert "CUDAExecutionProvider" in str(err) and err.value == ENGINE


def test_unavailable_without_cupy_names_cupy(monkeypatch, packages):
    import onnxruntime

    import engines.backends.ort_cuda as ort_cuda
    from engines.cuda_support import REMEDY as CUPY_REMEDY

    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort_cuda, "cuda_availability",
                        lambda: (False, "CuPy is not importable (ImportError: no cupy)"))
    avail = ort_cuda.OrtCudaEngine.availability()
    assert not avail.ok and "CuPy is not importable" in avail.reason
    with pytest.raises(EngineUnavailable) as info:
        ort_cuda.OrtCudaEngine(packages["tiny_llama"])
    assert info.value.remedy == CUPY_REMEDY


def test_this_machine_without_the_provider_is_unavailable():
    import onnxruntime

    from engines.backends.ort_cuda import OrtCudaEngine

    avail = OrtCudaEngine.availability()
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: the claim is about machines without")
    assert not avail.ok and "onnxruntime-gpu" in avail.reason


def test_static_packages_are_the_shape_stable_ones(packages):
    from engines.backends.ort_cuda import is_static_package

    for name, package in packages.items():
        assert is_static_package(package.spec) == (name in STATIC_FIXTURES), name
    assert STATIC_FIXTURES, "no static fixture: the CUDA-graph claims would test nothing"


# -- host: shapes and binding logic ----------------------------------------------------------
def _feeds_for(package, component, m, past_len):
    """Feeds for a forward of ``m`` positions after ``past_len`` (zero caches)."""
    from engines.dtypes import dtype_of

    spec = package.spec
    comp = spec.components[component]
    model = package.component_model(component)
    feeds = {}
    for vi in model.graph.input:
        name = vi.name
        cell = next((c for c in spec.state.values() if c.input == name), None)
        if name in (comp.inputs.get("tokens"), comp.inputs.get("positions")):
            feeds[name] = (np.arange(past_len, past_len + m, dtype=np.int64).reshape(1, m)
                           % spec.vocab_size)
        elif cell is not None:
            shape = list(cell.shape)
            if cell.kind == "kv" and cell.update == "append":
                shape[cell.seq_axis] = past_len
            feeds[name] = np.zeros(shape, dtype_of(cell.dtype))
        else:
            return None  # a proposer's fused or borrowed input: covered by the decodes below
    return feeds


def test_resolved_output_shapes_match_onnxruntime(packages):
    """Every shape the engine would preallocate is the shape onnxruntime produces; an
    output it cannot resolve (an append cache's new length) is left to onnxruntime."""
    from engines.backends.ort_cuda import resolve_output_shapes, value_dims

    checked = 0
    for package in packages.values():
        for component in package.spec.components:
            model = package.component_model(component)
            session = _cpu_session(package.component_path(component))
            in_dims = {i.name: value_dims(i) for i in model.graph.input}
            out_dims = {o.name: value_dims(o) for o in model.graph.output}
            for m, past in ((3, 0), (1, 3), (4, 5)):
                feeds = _feeds_for(package, component, m, past)
                if feeds is None:
                    continue
                got = dict(zip([o.name for o in model.graph.output], session.run(None, feeds)))
                resolved = resolve_output_shapes(in_dims, out_dims,
                                                 {n: v.shape for n, v in feeds.items()})
                for name, shape in resolved.items():
                    if shape is not None:
                        assert shape == got[name].shape, (package.spec.name, component, name)
                        checked += 1
    assert checked > 0


def test_resolution_rules():
    from engines.backends.ort_cuda import resolve_output_shapes

    ins = {"ids": (1, "M"), "past": (1, 2, "P", 8)}
    outs = {"logits": (1, "M", 96), "present": (1, 2, "T", 8), "x": None, "y": (1, None)}
    got = resolve_output_shapes(ins, outs, {"ids": (1, 5), "past": (1, 2, 7, 8)})
    assert got == {"logits": (1, 5, 96), "present": None, "x": None, "y": None}


@pytest.mark.claim("token_identity", "graph_replay")
@pytest.mark.parametrize("package_name", fixture_names())
def test_binding_logic_decodes_like_the_oracle_on_the_host(packages, package_name):
    """Pointers bound per forward, and on static packages the fixed graph buffers reused
    (copied into, poisoned, returned) for every decode step: tokens equal the oracle."""
    from engines.backends.ort_cuda import is_static_package, slot_name

    package = packages[package_name]
    static = is_static_package(package.spec)
    engine = HostBoundEngine(package, graph=static)
    for i, prompt in enumerate(package.spec.prompts):
        oracle = oracle_decode(package, prompt, NEW_TOKENS)
        result = greedy_decode(engine, prompt, NEW_TOKENS)
        assert result.tokens == oracle.tokens
        assert len(result.tokens) == NEW_TOKENS
        slots = result.ledger.graph_slots
        if not static:
            assert slot_name("target") not in slots
            continue
        slot = slots[slot_name("target")]
        steps = result.ledger.forwards["decode"]
        assert steps == NEW_TOKENS - 1
        # first prompt: the first decode step captures, every later one replays;
        # later prompts on the same engine: every decode step replays
        assert (slot.captures, slot.replays) == ((1, steps - 1) if i == 0 else (0, steps))
        assert slot.fallbacks == 0 and slot.invalidations == 0


@pytest.mark.claim("token_identity", "spec_equals_greedy")
@pytest.mark.parametrize("package_name", sorted(speculative_fixtures()))
def test_binding_logic_speculative_equals_the_oracle_on_the_host(packages, package_name):
    """Speculative rounds through the same binding logic (a static drafter's steps on its
    fixed, poisoned graph buffers; verification eager): tokens equal the oracle, widths
    1..max."""
    from engines.backends.ort_cuda import is_static_package, slot_name
    from engines.workflow.speculative import speculative_decode

    package = packages[package_name]
    static = is_static_package(package.spec)
    engine = HostBoundEngine(package, graph=static)
    for width in range(1, package.spec.decoding.speculative.max_width + 1):
        for prompt in package.spec.prompts:
            oracle = oracle_decode(package, prompt, NEW_TOKENS)
            result = speculative_decode(engine, prompt, NEW_TOKENS, width)
            assert result.tokens == oracle.tokens, width
            drafter = result.ledger.graph_slots.get(slot_name(package.spec.decoding.speculative.proposer))
            if static:
                assert drafter.replays > 0 and drafter.fallbacks == 0
            else:
                assert drafter is None


def test_host_feeds_are_refused_with_the_remedy(packages):
    from engines.backends.ort_cuda import CudaMemory, IoBoundComponent, width_input

    class FakeCupy:  # only what _bindable touches: no device here
        class ndarray:
            pass

    memory = CudaMemory.__new__(CudaMemory)
    memory.cp, memory.device_id, memory.residency = FakeCupy, 0, "cuda:0"
    package = packages["tiny_llama"]
    comp = IoBoundComponent("target", package.component_model("target"),
                            width_input(package.spec, "target"), memory,
                            _cpu_session(package.component_path("target")))
    feeds = _feeds_for(package, "target", 2, 0)
    with pytest.raises(ResidencyError) as info:
        comp._bindable(feeds)
    assert "tensor_ops.adopt" in info.value.remedy
    with pytest.raises(InputError):
        comp._bindable({**feeds, "bogus": feeds["input_ids"]})


def test_cuda_graph_on_an_append_package_is_refused(monkeypatch, packages):
    import onnxruntime

    import engines.backends.ort_cuda as ort_cuda

    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort_cuda, "cuda_availability", lambda: (True, "a CUDA device"))
    with pytest.raises(InputError) as info:
        ort_cuda.OrtCudaEngine(packages["tiny_llama"], cuda_graph=True)
    assert info.value.field == "cuda_graph" and "append" in info.value.remedy


@pytest.mark.claim("zero_staging")
def test_memcpy_audit_counts_the_nodes_onnxruntime_saves(tmp_path, packages):
    """The audit reads onnxruntime's saved optimized graph: the file appears where the
    engine looks, and inserted copy nodes are counted by kind."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from engines.backends.ort_cuda import count_memcpy_nodes

    package = packages["tiny_llama"]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(package.component_path("target")), sess_options=options,
                         providers=["CPUExecutionProvider"])
    assert count_memcpy_nodes(tmp_path / "optimized.onnx") == {"MemcpyToHost": 0,
                                                               "MemcpyFromHost": 0}
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("MemcpyToHost", ["x"], ["a"]),
             helper.make_node("MemcpyToHost", ["a"], ["b"]),
             helper.make_node("MemcpyFromHost", ["b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph), str(tmp_path / "copies.onnx"))
    assert count_memcpy_nodes(tmp_path / "copies.onnx") == {"MemcpyToHost": 2, "MemcpyFromHost": 1}


# -- host: staging script ---------------------------------------------------------------------
def test_stage_script_splits_and_joins_byte_identically(tmp_path):
    script = ROOT / "scripts" / "stage_large_file.sh"
    data = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8).tobytes()
    src = tmp_path / "thing.whl"
    src.write_bytes(data)
    env = {**os.environ, "STAGE_OUT": str(tmp_path / "out"), "STAGE_DIR": str(tmp_path / "in"),
           "STAGE_PART_BYTES": "3000"}
    subprocess.run(["bash", str(script), "split", str(src)], check=True, env=env,
                   capture_output=True)
    parts = sorted((tmp_path / "out").glob("thing.whl.part*"))
    assert [p.name for p in parts] == [f"thing.whl.part{i:02d}" for i in range(4)]
    assert [p.stat().st_size for p in parts] == [3000, 3000, 3000, 1000]
    (tmp_path / "in").mkdir()
    for p in [*parts, tmp_path / "out" / "thing.whl.sha256"]:
        (tmp_path / "in" / p.name).write_bytes(p.read_bytes())
    dest = tmp_path / "joined" / "thing.whl"
    subprocess.run(["bash", str(script), "join", "thing.whl", str(dest)], check=True, env=env,
                   capture_output=True)
    assert dest.read_bytes() == data
    # a missing part is caught by the checksum, and nothing is left at the destination
    (tmp_path / "in" / parts[2].name).unlink()
    dest.unlink()
    bad = subprocess.run(["bash", str(script), "join", "thing.whl", str(dest)], env=env,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "sha256" in bad.stderr and not dest.exists()


# -- GPU --------------------------------------------------------------------------------------
@pytest.mark.claim("token_identity", "zero_staging", "readback_budget", "graph_replay")
@gpu
@pytest.mark.parametrize("package_name", fixture_names())
def test_greedy_equals_oracle_with_zero_staging(packages, engine_cache, package_name):
    from engines.backends.ort_cuda import is_static_package, slot_name

    package = packages[package_name]
    engine = engine_cache(ENGINE, package)
    # onnxruntime's own device-to-host copies, invisible to the guard: none in its graph
    assert all(c is not None and c["MemcpyToHost"] == 0 for c in engine.memcpy_nodes.values()), (
        engine.memcpy_nodes, engine.audit_errors)
    for prompt in package.spec.prompts:
        ledger = device_greedy_matches_oracle(engine, package, prompt, NEW_TOKENS).ledger
        slot = ledger.graph_slots.get(slot_name("target"))
        if is_static_package(package.spec):
            assert slot is not None and slot.fallbacks == 0, engine.graph_refusals
            assert slot.captures + slot.replays == ledger.forwards["decode"]
        else:
            assert slot is None


@pytest.mark.claim("logits_within_tolerance")
@gpu
def test_outputs_stay_on_the_device_and_match_ort_cpu(packages):
    """Preallocated outputs and onnxruntime-allocated ones (the append cache) are CuPy arrays
    on cuda:0 holding what ort-cpu computes (tolerance table)."""
    from engines.residency import residency_of
    from engines.tolerances import tolerance_for

    package = packages["tiny_llama"]
    engine = _fresh(package)
    try:
        for m, past in ((4, 0), (1, 4)):
            host = _feeds_for(package, "target", m, past)
            feeds = {n: (engine.tensor_ops.adopt(v) if v.size else v) for n, v in host.items()}
            out = engine.run_component("target", feeds)
            want = dict(zip(out, _cpu_session(package.component_path("target")).run(list(out), host)))
            for name, value in out.items():
                assert residency_of(value) == "cuda:0", name
                got = value.get(stream=engine.stream)  # the engine queues on its own stream
                assert got.shape == want[name].shape and got.dtype == want[name].dtype, name
                tol = tolerance_for(got.dtype)
                np.testing.assert_allclose(got, want[name], atol=tol.max_abs, rtol=tol.max_rel)
    finally:
        engine.close()


@pytest.mark.claim("graph_replay", "token_identity", "zero_staging")
@gpu
@pytest.mark.parametrize("package_name", STATIC_FIXTURES)
def test_cuda_graph_captures_once_and_replays_every_later_step(packages, package_name):
    """A fresh engine, outputs poisoned (NaN) before every graph run: the first decode step
    captures (``captures`` 1), each later one replays (``replays`` = decode steps - 1), no
    fallback; a second prompt replays every step; tokens equal the oracle and the same
    engine without graphs."""
    from engines.backends.ort_cuda import is_static_package, slot_name

    package = packages[package_name]
    assert is_static_package(package.spec)
    graphed = _fresh(package, cuda_graph=True, poison_graph_outputs=True)
    eager = _fresh(package, cuda_graph=False)
    try:
        assert not graphed.graph_refusals, graphed.graph_refusals
        for i, prompt in enumerate(package.spec.prompts):
            oracle = oracle_decode(package, prompt, NEW_TOKENS)
            result = greedy_decode(graphed, prompt, NEW_TOKENS)
            plain = greedy_decode(eager, prompt, NEW_TOKENS)
            assert result.tokens == plain.tokens == oracle.tokens
            assert len(result.tokens) == NEW_TOKENS
            steps = result.ledger.forwards["decode"]
            assert steps == NEW_TOKENS - 1
            slot = result.ledger.graph_slots[slot_name("target")]
            assert (slot.captures, slot.replays) == ((1, steps - 1) if i == 0 else (0, steps))
            assert slot.fallbacks == 0 and slot.invalidations == 0
            assert slot_name("target") not in plain.ledger.graph_slots
            assert result.ledger.host_staging == 0
    finally:
        graphed.close()
        eager.close()


@pytest.mark.claim("graph_replay")
@gpu
def test_onnxruntime_log_shows_exactly_one_capture(packages, capfd):
    """Independent of lockstep's counters: onnxruntime's CUDA provider logs each capture; the
    first decode captures once, and a whole second decode captures never (replays only)."""
    import onnxruntime

    package = packages["tiny_llama_static"]
    onnxruntime.set_default_logger_severity(1)
    try:
        engine = _fresh(package, log_severity_level=1)
        capfd.readouterr()  # drop session-creation logs
        try:
            prompt = package.spec.prompts[0]
            first = greedy_decode(engine, prompt, NEW_TOKENS)
            log1 = capfd.readouterr().err
            second = greedy_decode(engine, prompt, NEW_TOKENS)
            log2 = capfd.readouterr().err
        finally:
            engine.close()
    finally:
        onnxruntime.set_default_logger_severity(2)
    assert first.tokens == second.tokens
    assert log1.lower().count(CAPTURE_LOG) == 1, log1[-3000:]
    assert log2.lower().count(CAPTURE_LOG) == 0, log2[-3000:]
