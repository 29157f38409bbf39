"""The oracle on a chosen engine (``lockstep run --oracle-engine``): vetted against ort-cpu's
oracle on a short prefix before any cell, recorded in evidence, refused for reduced-precision
packages; a planted disagreement stops the run. On the CPU the chosen engines are native-host
and onnx-reference; the device path is checked with counting tensor ops."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engines.backends.native_host import NativeHostEngine
from engines.engine import Availability
from engines.errors import EngineUnavailable, ExecutionError, InputError
from engines.oracle import Oracle, oracle_for
from engines.tensor_ops.host import HostTensorOps
from harness.cli import main
from harness.evidence import load_evidence_dir
from harness.oracle_choice import check_agreement, check_engine_choice, chosen_oracle
from harness.packages import resolve_package
from harness.runner import run_matrix

pytestmark = pytest.mark.claim("token_identity")
TOKENS = 6


class SkewedOracle(NativeHostEngine):
    """native-host whose logits for token 0 are 0.05 too high: a wrong recompute that keeps
    the argmax on these prompts, so only the logits comparison can catch it."""
    name = "skewed-oracle"

    def run_component(self, component, feeds, phase=None):
        out = dict(super().run_component(component, feeds, phase))
        name = self.package.spec.components[component].outputs["logits"]
        logits = out[name].copy()
        logits[..., 0] += np.float32(0.05)
        out[name] = logits
        return out


class SwappedOracle(NativeHostEngine):
    """native-host that swaps the two best logits at every position: a wrong argmax."""
    name = "swapped-oracle"

    def run_component(self, component, feeds, phase=None):
        out = dict(super().run_component(component, feeds, phase))
        name = self.package.spec.components[component].outputs["logits"]
        logits = out[name].copy()
        order = np.argsort(-logits, axis=-1, kind="stable")
        a, b = order[..., :1], order[..., 1:2]
        va, vb = np.take_along_axis(logits, a, -1), np.take_along_axis(logits, b, -1)
        np.put_along_axis(logits, a, vb, -1)
        np.put_along_axis(logits, b, va, -1)
        out[name] = logits
        return out


class NotHere(NativeHostEngine):
    name = "oracle-not-here"

    @classmethod
    def availability(cls):
        return Availability(False, "needs the imaginary libbar")


@pytest.mark.parametrize("engine", ["native-host", "onnx-reference"])
def test_a_chosen_oracle_that_agrees_judges_the_run_and_is_recorded(engine, tmp_path):
    summary = run_matrix(["ort-cpu"], ["tiny_llama"], None, TOKENS, tmp_path, max_prompts=1,
                         oracle_engine=engine)
    assert [c.status for c in summary.cells] == ["identical"]
    check = summary.oracle_checks["tiny_llama"]
    assert check.engine == engine and check.against == "ort-cpu" and check.steps > 0
    assert check.max_abs <= 1e-3
    (record,) = load_evidence_dir(tmp_path)
    assert record.judgement.oracle == f"oracle:{engine}"
    assert record.reference.engine == f"oracle:{engine}"
    assert record.judgement.oracle_check.engine == engine
    assert record.judgement.oracle_check.prefix_tokens == check.prefix_tokens
    # the moved oracle's stream is the default oracle's stream on this package
    default = oracle_for(resolve_package("tiny_llama")).decode(record.prompt.ids, TOKENS)
    assert record.reference.tokens == default.tokens


def test_the_default_oracle_records_no_check(tmp_path):
    summary = run_matrix(["native-host"], ["tiny_llama"], None, 4, tmp_path, max_prompts=1)
    (record,) = load_evidence_dir(tmp_path)
    assert record.judgement.oracle == "oracle:ort-cpu" and record.judgement.oracle_check is None
    assert summary.oracle_checks == {}


@pytest.mark.parametrize("planted, words", [(SkewedOracle, "max abs"),
                                            (SwappedOracle, "argmax")])
def test_a_planted_disagreement_stops_the_run_before_any_cell(planted, words, tmp_path):
    evidence = tmp_path / "ev"
    with pytest.raises(ExecutionError) as err:
        run_matrix(["native-host"], ["tiny_llama"], None, TOKENS, evidence,
                   oracle_engine=f"{__name__}:{planted.__name__}")
    assert err.value.field == "--oracle-engine" and err.value.value == planted.name
    assert "disagrees with 'ort-cpu'" in str(err.value) and words in str(err.value)
    assert "step 0" in str(err.value)
    assert not evidence.exists() or not list(evidence.rglob("*.json"))


def test_the_cli_exits_2_naming_the_disagreement(tmp_path, capsys):
    status = main(["run", "--engines", "native-host", "--packages", "tiny_llama",
                   "--oracle-engine", f"{__name__}:SwappedOracle", "--no-evidence"])
    err = capsys.readouterr().err
    assert status == 2
    assert "swapped-oracle" in err and "disagrees" in err and "drop --oracle-engine" in err


def test_the_agreement_check_compares_every_step_not_only_the_first():
    package = resolve_package("tiny_llama")

    class LateSkew(NativeHostEngine):  # wrong only from the third checked prefix on
        name = "late-skew"

        def run_component(self, component, feeds, phase=None):
            out = dict(super().run_component(component, feeds, phase))
            name = package.spec.components[component].outputs["logits"]
            if out[name].shape[1] >= 3 + 2:
                out[name] = out[name] + np.float32(0.01)
            return out

    reference = oracle_for(package)
    with pytest.raises(ExecutionError, match="at step 2"):
        check_agreement(Oracle(package, LateSkew(package)), reference, [1, 17, 42][:3])


def test_a_reduced_precision_package_may_not_move_its_oracle():
    fake = SimpleNamespace(spec=SimpleNamespace(dtype="float16", name="half"))
    with pytest.raises(InputError) as err:
        check_engine_choice("native-host", fake)
    assert err.value.field == "--oracle-engine" and "float32 packages only" in str(err.value)
    assert "float32 twin" in str(err.value)
    check_engine_choice("ort-cpu", fake)  # the default oracle itself is always allowed


def test_an_unavailable_oracle_engine_is_refused_with_its_reason():
    with pytest.raises(EngineUnavailable, match="libbar") as err:
        chosen_oracle(resolve_package("tiny_llama"), f"{__name__}:NotHere", [1, 2])
    assert err.value.field == "--oracle-engine"


@pytest.mark.parametrize("name", ["llama-cpp", "http:openai=http://127.0.0.1:9"])
def test_an_engine_that_decodes_by_itself_cannot_be_the_oracle(name):
    """Refused before availability is asked (no server contacted, no GGUF looked for)."""
    with pytest.raises(InputError, match="decodes by itself") as err:
        check_engine_choice(name, resolve_package("tiny_llama"))
    assert err.value.field == "--oracle-engine" and err.value.value == name


class _CountingOps(HostTensorOps):
    """Host tensor ops that count what the oracle adopts and stages, as a device's would."""

    def __init__(self, ledger):
        super().__init__(ledger)
        self.adopted, self.staged = [], []

    def adopt(self, host_array):
        self.adopted.append(host_array.shape)
        return super().adopt(host_array)

    def stage_to_host(self, v, site):
        self.staged.append((v.shape, site))
        return super().stage_to_host(v, site)


class PretendDevice(NativeHostEngine):
    """native-host declaring a device residency: the oracle must adopt its feeds and stage
    back only the logits rows it judges with."""
    name = "pretend-device"
    residency = "cuda:0"

    def make_tensor_ops(self):
        return _CountingOps(self.ledger)


def test_an_oracle_on_a_device_engine_adopts_feeds_and_stages_only_the_rows_it_needs():
    package = resolve_package("tiny_llama")
    engine = PretendDevice(package)
    device, host = Oracle(package, engine), oracle_for(package, "native-host")
    prefix = [1, 17, 42, 5, 9]
    np.testing.assert_array_equal(device.row(prefix), host.row(prefix))
    ops = engine.tensor_ops
    feeds = 2 + sum(c.component == "target" for c in package.spec.state.values())
    assert len(ops.adopted) == feeds
    vocab = package.spec.vocab_size
    assert ops.staged == [((1, 1, vocab), "oracle_rows")]
    # a stream after a 2-token prompt: one forward, and only its 4 judged rows come back
    rows = Oracle(package, engine).stream_rows(prefix[:2], prefix[2:])
    assert ops.staged[1:] == [((1, 4, vocab), "oracle_rows")]
    for t, row in enumerate(rows):
        np.testing.assert_array_equal(row, host.row(prefix[:2 + t]))


def test_devices_with_text_prompts_is_refused_naming_the_flag(capsys):
    for extra, flag in ((["--text", "hello"], "--text"),):
        status = main(["run", "--engines", "native-host", "--packages", "tiny_llama",
                       "--devices", "0", "--no-evidence", *extra])
        err = capsys.readouterr().err
        assert status == 2
        assert f"{flag} is not carried to the --devices workers" in err and "drop" in err


@pytest.mark.gpu
def test_the_oracle_on_ort_cuda_agrees_and_judges_native_cuda(tmp_path):
    """On the GPU: the moved oracle passes its check, its stream is ort-cpu's, and it judges a
    device engine's cells (the nightly long-context step runs the same at 2k tokens)."""
    from engines.registry import get_engine_class

    for name in ("ort-cuda", "native-cuda"):
        avail = get_engine_class(name).availability()
        if not avail.ok:
            pytest.skip(f"{name} unavailable: {avail.reason}")
    summary = run_matrix(["native-cuda"], ["tiny_llama"], None, 16, tmp_path, max_prompts=2,
                         oracle_engine="ort-cuda")
    assert [c.status for c in summary.cells] == ["identical", "identical"]
    assert summary.oracle_checks["tiny_llama"].max_abs <= 1e-3
    package = resolve_package("tiny_llama")
    for record in load_evidence_dir(tmp_path):
        assert record.judgement.oracle == "oracle:ort-cuda"
        default = oracle_for(package).decode(record.prompt.ids, 16)
        assert record.reference.tokens == default.tokens
