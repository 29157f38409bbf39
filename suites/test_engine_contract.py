"""The engine contract as ``engines.engine.Engine`` declares it: methods with defaults,
capabilities from class attributes, the black-box form, and the interpreter and runner reading
those declarations instead of probing engines."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from engines.backends.native_host import NativeHostEngine
from engines.backends.ort_cpu import OrtCpuEngine
from engines.decode_result import DecodeResult
from engines.engine import Availability, BlackBoxEngine, Capabilities, Engine
from engines.errors import EngineDefinitionError, ExecutionError, InputError
from engines.registry import BUILTIN, check_engine_class, get_engine_class
from engines.tensor_ops.host import HostTensorOps
from engines.workflow import greedy_decode
from engines.workflow.speculative import speculative_decode
from harness.runner import run_matrix

REPO = Path(__file__).resolve().parents[1]


# -- capabilities ------------------------------------------------------------------------------

def test_capabilities_are_built_from_the_class_attributes():
    class Declared(OrtCpuEngine):
        name = "contract-declared"
        residency = "sim:1"
        graph_slots = True
        speculative = False
        logits_audit = False
        batch_invariant = True

    caps = Declared.capabilities()
    assert caps == Capabilities(residency="sim:1", graph_slots=True, speculative=False,
                                logits_audit=False, decodes_itself=False, batch_invariant=True)
    assert caps.flags == ["graph_slots", "batch_invariant"]
    assert caps.to_dict()["residency"] == "sim:1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.speculative = True  # type: ignore[misc]


def test_the_defaults_describe_an_interpreter_driven_host_engine():
    assert Engine.capabilities() == Capabilities(
        residency="host", graph_slots=False, speculative=True, logits_audit=True,
        decodes_itself=False, batch_invariant=False)


@pytest.mark.parametrize("name, expected", [
    ("ort-cpu", dict(residency="host", decodes_itself=False, batch_invariant=False)),
    ("native-host", dict(residency="host", batch_invariant=True, graph_slots=False)),
    ("native-cuda", dict(residency="cuda:0", batch_invariant=True, graph_slots=True)),
    ("ort-cuda", dict(residency="cuda:0", graph_slots=True)),
    ("hf", dict(decodes_itself=True, speculative=False, logits_audit=True)),
])
def test_builtin_capabilities(name, expected):
    caps = get_engine_class(name).capabilities().to_dict()
    assert {k: caps[k] for k in expected} == expected


def test_the_runner_still_reads_the_plain_attributes_on_an_instance(packages):
    engine = NativeHostEngine(packages["tiny_llama"])
    assert engine.batch_invariant is True and engine.residency == "host"
    assert engine.capabilities() == NativeHostEngine.capabilities()


@pytest.mark.parametrize("attr, value, needle", [
    ("speculative", "yes", "not a bool"),
    ("graph_slots", 1, "not a bool"),
    ("residency", "", "residency that is not a non-empty string"),
])
def test_ill_typed_capabilities_are_refused(attr, value, needle):
    cls = type("IllTyped", (OrtCpuEngine,), {"name": "contract-ill-typed", attr: value})
    with pytest.raises(EngineDefinitionError, match=needle) as info:
        check_engine_class(cls)
    assert info.value.field == attr and info.value.remedy


def test_decodes_itself_without_generate_is_refused():
    cls = type("NoGenerate", (OrtCpuEngine,), {"name": "contract-no-generate",
                                               "decodes_itself": True})
    with pytest.raises(EngineDefinitionError, match="does not implement generate") as info:
        check_engine_class(cls)
    assert info.value.field == "decodes_itself" and "generate(" in info.value.remedy


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_declares_valid_capabilities(name):
    module, _, attr = BUILTIN[name].partition(":")
    cls = getattr(__import__(module, fromlist=[attr]), attr)
    assert isinstance(check_engine_class(cls).capabilities(), Capabilities)


# -- methods with defaults ---------------------------------------------------------------------

def test_default_synchronize_close_and_generate(packages):
    engine = OrtCpuEngine(packages["tiny_llama"])
    assert engine.synchronize() is None and engine.close() is None
    with pytest.raises(NotImplementedError, match="does not decode by itself"):
        engine.generate([1, 2], 3)


def test_reset_ledger_rebinds_the_tensor_ops(packages):
    engine = OrtCpuEngine(packages["tiny_llama"])
    first_ops = engine.tensor_ops
    ledger = engine.reset_ledger()
    assert ledger is engine.ledger and engine.tensor_ops is not first_ops
    assert engine.tensor_ops.ledger is ledger
    assert isinstance(engine.make_tensor_ops(), HostTensorOps)


class _CountingOps(HostTensorOps):
    made = 0


def test_the_former_hook_name_still_makes_the_tensor_ops(packages):
    """A subclass written against ``_make_tensor_ops`` keeps working; the public name is
    what the contract calls, and the old name stays an alias of it."""

    class OldStyle(OrtCpuEngine):
        name = "contract-old-style"

        def _make_tensor_ops(self):
            _CountingOps.made += 1
            return _CountingOps(self.ledger)

    class NewStyle(OrtCpuEngine):
        name = "contract-new-style"

        def make_tensor_ops(self):
            return _CountingOps(self.ledger)

    before = _CountingOps.made
    old = OldStyle(packages["tiny_llama"])
    assert isinstance(old.tensor_ops, _CountingOps) and _CountingOps.made == before + 1
    old.reset_ledger()
    assert isinstance(old.tensor_ops, _CountingOps) and _CountingOps.made == before + 2
    new = NewStyle(packages["tiny_llama"])
    assert isinstance(new.tensor_ops, _CountingOps)
    assert isinstance(new._make_tensor_ops(), _CountingOps)  # the alias


# -- the black-box form ------------------------------------------------------------------------

class Scripted(BlackBoxEngine):
    """Decodes by itself: a fixed stream, the logits rows it was asked for."""

    name = "contract-scripted"
    calls: list = []

    @classmethod
    def availability(cls):
        return Availability(True, "always")

    def generate(self, prompt, max_new_tokens, audit=False):
        Scripted.calls.append((list(prompt), max_new_tokens, audit))
        ledger = self.reset_ledger()
        vocab = self.package.spec.vocab_size
        tokens = [3] * max_new_tokens
        rows = [np.eye(vocab)[3] for _ in tokens] if audit else None
        return DecodeResult(self.name, list(prompt), tokens, ledger, 0.01,
                            [0.001] * len(tokens), rows)


def test_the_interpreter_hands_a_black_box_the_validated_request(packages):
    package = packages["tiny_llama"]
    engine = Scripted(package)
    Scripted.calls.clear()
    result = greedy_decode(engine, np.array([1, 17, 42]), 5, audit=True)
    assert Scripted.calls == [([1, 17, 42], 5, True)]
    assert result.tokens == [3] * 5 and len(result.logits) == 5
    with pytest.raises(InputError):  # validated before the engine sees it
        greedy_decode(engine, [package.spec.vocab_size], 5)
    assert len(Scripted.calls) == 1


def test_a_black_box_runs_no_component_and_does_not_speculate(packages):
    engine = Scripted(packages["tiny_llama_pair"])
    assert Scripted.capabilities().decodes_itself and not Scripted.speculative
    with pytest.raises(ExecutionError, match="decodes by itself"):
        engine.run_component("target", {})
    with pytest.raises(InputError, match="declares no speculative decoding"):
        speculative_decode(engine, list(packages["tiny_llama_pair"].spec.prompts[0]), 4, 1)


def test_the_runner_leaves_speculation_out_for_an_engine_that_declares_none():
    summary = run_matrix([Scripted], ["tiny_llama_pair"], None, 4, mode="speculative",
                         widths=[1], max_prompts=1)
    assert summary.cells == []
    (left,) = summary.left_out
    assert (left.engine, left.package, left.cells, left.decided_by) == \
        (Scripted.name, "tiny_llama_pair", 1, "declaration")
    assert "declares no speculative decoding" in left.reason


def test_hf_decodes_through_generate_and_keeps_its_former_name():
    from engines.backends.hf import HfEngine

    assert HfEngine.decodes_itself and HfEngine.generate is not Engine.generate
    assert HfEngine.greedy is not None  # the alias older callers use


def test_an_engine_without_a_logits_audit_is_judged_without_one():
    class Unaudited(OrtCpuEngine):
        name = "contract-unaudited"
        logits_audit = False

    summary = run_matrix([Unaudited], ["tiny_llama"], None, 6, max_prompts=1)
    cell = summary.cells[0]
    assert cell.status == "identical" and cell.audit is None
    assert "logits not audited" in cell.reason


# -- no probing, and the layers ------------------------------------------------------------------

def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted((REPO / "engines" / "workflow").glob("*.py"))
                         + [REPO / "harness" / n for n in ("runner.py", "plan.py",
                                                           "cell_runner.py")],
                         ids=lambda p: p.name)
def test_the_interpreter_and_the_runner_do_not_probe_engines(path):
    source = path.read_text()
    assert "inspect" not in _imports(path)
    for probe in ('getattr(engine, "greedy"', 'getattr(engine, "generate"',
                  "signature(engine", "hasattr(engine"):
        assert probe not in source


@pytest.mark.parametrize("path", sorted((REPO / "engines" / "backends").glob("*.py"))
                         + [REPO / "engines" / n for n in ("engine.py", "decode_result.py",
                                                          "dtypes.py", "requests.py",
                                                          "oracle.py")],
                         ids=lambda p: p.name)
def test_backends_and_the_contract_sit_below_the_workflow(path):
    assert not any(m == "engines.workflow" or m.startswith("engines.workflow.")
                   for m in _imports(path))


def test_ort_cpu_says_it_cannot_run_bfloat16_before_loading():
    """Seen here: onnxruntime's CPU provider has no bfloat16 kernels for the graph's ops;
    the engine refuses a bfloat16 package as unavailable, naming the dtype and the engines
    that can run it (not as a crash mid-load)."""
    from types import SimpleNamespace

    from engines.backends.ort_cpu import OrtCpuEngine
    from engines.errors import EngineUnavailable

    package = SimpleNamespace(spec=SimpleNamespace(dtype="bfloat16"))
    with pytest.raises(EngineUnavailable) as info:
        OrtCpuEngine(package)
    assert info.value.field == "package.dtype" and info.value.value == "bfloat16"
    assert "native-host" in info.value.remedy


# onnxruntime-gpu 1.31.1's words on the H200 (docs/evidence/2026-12-01-h200-run6), and the
# other form its session creation uses for a kernel no provider has
GAP_MESSAGES = [
    ("[ONNXRuntimeError] : 1 : FAIL : Provider type for ReduceMax node with name "
     "'/model/mask/ReduceMax' is not set.", "ReduceMax", "/model/mask/ReduceMax"),
    ("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for "
     "Trilu(14) node with name 'causal'", "Trilu", "causal"),
]


@pytest.mark.parametrize("message,op,node", GAP_MESSAGES)
def test_ort_cuda_reports_a_missing_kernel_as_the_package_it_cannot_run(message, op, node):
    """ort-cuda tries every package (a bfloat16 graph may have a kernel for every op) and
    turns a session refused for a missing kernel into EngineUnavailable naming the dtype,
    the op and the node, with the engines that can run it."""
    from engines.backends.ort_kernel_gaps import kernel_gap_unavailable, missing_kernel

    assert missing_kernel(RuntimeError(message)) == (op, node)
    err = kernel_gap_unavailable(RuntimeError(message), "ort-cuda", "model.onnx", "bfloat16")
    assert err.field == "package.dtype" and err.value == "bfloat16"
    assert op in str(err) and repr(node) in str(err) and "model.onnx" in str(err)
    assert "native-cuda" in err.remedy and "--dtype float16" in err.remedy


@pytest.mark.parametrize("message", [
    "[ONNXRuntimeError] : 3 : NO_SUCHFILE : Load model from x.onnx failed: file not found",
    "CUDA failure 2: out of memory",
    "Provider type for node is not set",  # no op named: not the form read
])
def test_other_session_failures_are_not_taken_for_a_missing_kernel(message):
    """Anything else stays the error it is (the engine re-raises it)."""
    from engines.backends.ort_kernel_gaps import kernel_gap_unavailable, missing_kernel

    assert missing_kernel(RuntimeError(message)) is None
    assert kernel_gap_unavailable(RuntimeError(message), "ort-cuda", "m.onnx", "float16") is None


def test_supports_defaults_to_every_package(packages):
    assert all(Scripted.supports(p) for p in packages.values())


@pytest.mark.parametrize("name", ["hf", "hf-cuda", "ort-genai", "ort-genai-cuda", "llama-cpp",
                                  "vllm"])
def test_what_supports_refuses_the_constructor_refuses_too(name, packages):
    """``supports`` decides from the package alone, before a run plans it; the constructor
    must refuse the same packages (as ``EngineUnavailable``: an unavailable cell, never an
    error), with the same reason where the engine can run on this machine."""
    from engines.errors import EngineUnavailable
    from engines.registry import get_engine_class

    cls = get_engine_class(name)
    refused = {n: cls.supports(p) for n, p in packages.items()}
    assert not any(refused.values())  # built from seeds (no checkpoint.json), float32
    for fixture, found in refused.items():
        assert found.reason
        with pytest.raises(EngineUnavailable) as err:
            cls(packages[fixture])
        if cls.availability():
            assert err.value.message == found.reason


# -- ort-cpu's sessions ------------------------------------------------------------------------

def test_ort_cpu_engines_share_a_session_per_package_content_and_no_further(packages,
                                                                             tmp_path):
    import shutil

    from engines.package import load_package

    package = packages["tiny_llama"]
    one, two = OrtCpuEngine(package), OrtCpuEngine(package)
    assert one._sessions["target"] is two._sessions["target"]  # optimised once
    copy = shutil.copytree(package.root, tmp_path / "copy")
    changed = load_package(copy)
    assert OrtCpuEngine(changed)._sessions["target"] is not one._sessions["target"]  # its path
    spec = (copy / "package.yaml").read_text()
    (copy / "package.yaml").write_text(spec + "\n# edited\n")
    edited = load_package(copy)
    assert edited.content_hash != changed.content_hash
    assert OrtCpuEngine(edited)._sessions["target"] is not OrtCpuEngine(
        changed)._sessions["target"]
