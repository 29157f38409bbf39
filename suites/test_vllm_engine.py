"""The ``vllm`` engine without vLLM: what it says where vLLM is missing, how vLLM's output
objects become a ``DecodeResult``, and the judge catching a planted wrong token.

vLLM runs only on a CUDA machine, so its objects are faked here with the field names of
vLLM 0.26.0 (``vllm/outputs.py``: ``RequestOutput``, ``CompletionOutput``;
``vllm/logprobs.py``: ``Logprob``; ``vllm/inputs``: ``TokensPrompt``, a ``TypedDict``);
``test_the_fakes_have_vllms_field_names`` checks them against the real classes where vLLM is
installed (the GPU suite). The fake ``LLM`` decodes with a real host engine on the fixture,
so the happy path must be judged identical.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import sys
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from engines.backends import vllm_engine
from engines.backends.checkpoint_source import CheckpointSource
from engines.backends.vllm_engine import VllmEngine, prompt_record, step_logprobs, to_result
from engines.engine import Availability
from engines.errors import ExecutionError, InputError
from engines.ledger import Ledger
from harness.runner import run_matrix
from suites.fake_server import log_softmax


# -- fakes with vLLM 0.26.0's field names ---------------------------------------------------

@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    routed_experts: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any = None


class RequestOutput:
    def __init__(self, request_id, prompt, prompt_token_ids, prompt_logprobs, outputs,
                 finished, metrics=None, lora_request=None, encoder_prompt=None):
        self.request_id, self.prompt = request_id, prompt
        self.prompt_token_ids, self.prompt_logprobs = prompt_token_ids, prompt_logprobs
        self.outputs, self.finished, self.metrics = outputs, finished, metrics
        self.lora_request, self.encoder_prompt = lora_request, encoder_prompt


@dataclass
class SamplingParams:
    temperature: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True


def TokensPrompt(**kw) -> dict:  # noqa: N802 - vLLM's TypedDict: calling it makes a dict
    return dict(kw)


def position(lsm: np.ndarray, token: int, k: int) -> dict[int, Logprob]:
    """One position as vLLM reports it: the top k by rank, and the token itself if outside."""
    order = np.lexsort((np.arange(lsm.size), -lsm))
    ranks = {int(i): r + 1 for r, i in enumerate(order)}
    chosen = [int(i) for i in order[:k]]
    if token not in chosen:
        chosen.append(token)
    return {i: Logprob(float(lsm[i]), ranks[i]) for i in chosen}


class FakeLLM:
    """``vllm.LLM`` computed by native-host on the package (greedy, top-k per step);
    ``wrong_step``: at that step it emits the runner-up token instead (the planted bug)."""

    wrong_step: int | None = None
    batched_wrong_step: int | None = None  # the same, only with several prompts in one call
    package = None
    calls: list[list[list[int]]] = []

    def __init__(self, **options):
        from engines.registry import get_engine_class

        self.options = options
        self.host = get_engine_class("native-host")(self.package)
        vocab = self.package.spec.vocab_size
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(
            get_vocab_size=lambda: vocab))

    def collective_rpc(self, method):
        worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(attn_groups=[[
            types.SimpleNamespace(backend=types.SimpleNamespace(get_name=lambda: "FLASH_ATTN"))
        ]]))
        return [method(worker)]

    def _decode(self, ids: list[int], params: SamplingParams) -> RequestOutput:
        from engines.workflow import greedy_decode

        tokens: list[int] = []
        steps = []
        for n in range(params.max_tokens):
            row = greedy_decode(self.host, ids + tokens, 1, audit=True).logits[0]
            lsm = log_softmax(row)
            order = np.lexsort((np.arange(lsm.size), -lsm))
            token = int(order[1] if n == self.wrong_step else order[0])
            tokens.append(token)
            steps.append(position(lsm, token, params.logprobs or 0))
            if token in (params.stop_token_ids or []):
                break
        prompt_lp = [None] + [position(np.zeros(4), 0, 1) for _ in ids[1:]] \
            if params.prompt_logprobs else None
        done = CompletionOutput(0, "", tokens, None, steps if params.logprobs else None,
                                finish_reason="length")
        return RequestOutput("0", None, ids, prompt_lp, [done], True)

    def generate(self, prompts, params, use_tqdm=True):
        assert use_tqdm is False and params.temperature == 0 and params.detokenize is False
        self.calls.append([list(p["prompt_token_ids"]) for p in prompts])
        alone = self.wrong_step
        if len(prompts) > 1 and self.batched_wrong_step is not None:
            self.wrong_step = self.batched_wrong_step
        try:
            return [self._decode(list(p["prompt_token_ids"]), params) for p in prompts]
        finally:
            self.wrong_step = alone


@pytest.fixture
def fake_vllm(monkeypatch, packages):
    """A ``vllm`` module of the fakes in ``sys.modules``, ``FakeLLM`` bound to tiny_llama."""
    module = types.ModuleType("vllm")
    module.__version__ = "0.26.0-fake"
    module.LLM, module.SamplingParams = FakeLLM, SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = TokensPrompt
    module.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setattr(FakeLLM, "package", packages["tiny_llama"])
    monkeypatch.setattr(FakeLLM, "calls", [])
    return module


class FakeVllm(VllmEngine):
    """The real engine over the fake module, on a fixture (which names no checkpoint: the
    package's own folder stands in for the Hugging Face folder vLLM would load)."""

    name = "vllm-fake"

    @classmethod
    def availability(cls):
        return Availability(True, "the fake vllm module")

    @classmethod
    def supports(cls, package):
        return Availability(True)

    def __init__(self, package):
        super().__init__(package, checkpoint=CheckpointSource(package.root, "hf", "sha256:0"))


class WrongTokenVllm(FakeVllm):
    name = "vllm-wrong-token"

    def __init__(self, package):
        FakeLLM.wrong_step = 3
        try:
            super().__init__(package)
        finally:
            FakeLLM.wrong_step = None
        self.llm.wrong_step = 3


class BatchedWrongTokenVllm(FakeVllm):
    """Right alone, a wrong token at step 2 when vLLM batches several prompts."""

    name = "vllm-batched-wrong-token"

    def __init__(self, package):
        super().__init__(package)
        self.llm.batched_wrong_step = 2


# -- availability ---------------------------------------------------------------------------

def _vllm_version(monkeypatch, version: str | None) -> None:
    """``importlib.metadata.version`` answering ``version`` for vllm (None: not installed)
    and the truth for every other distribution (torch reads some as it imports)."""
    real = importlib.metadata.version

    def answer(name):
        if name != "vllm":
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", answer)


def test_without_vllm_it_is_unavailable_naming_the_remedy(monkeypatch):
    _vllm_version(monkeypatch, None)
    found = VllmEngine.availability()
    assert not found.ok
    assert "vllm is not installed" in found.reason
    assert "scripts/fetch_gpu_wheels.sh --with-vllm" in found.reason


def test_with_vllm_but_no_gpu_it_is_unavailable_saying_so(monkeypatch):
    _vllm_version(monkeypatch, "0.26.0")
    monkeypatch.setattr(vllm_engine, "cuda_availability",
                        lambda torch: Availability(False, "torch 2.13.0 is a CPU-only build"))
    found = VllmEngine.availability()
    assert not found.ok and found.reason == "vllm 0.26.0 needs CUDA: torch 2.13.0 is a CPU-only build"


def test_the_engines_listing_names_it_built_in():
    from engines.registry import BUILTIN, describe_engines

    assert BUILTIN["vllm"] == "engines.backends.vllm_engine:VllmEngine"
    listing = {e.name: e for e in describe_engines()}["vllm"]
    assert listing.engine_class is VllmEngine and listing.problem is None
    caps = VllmEngine.capabilities()
    assert caps.logprobs_audit and caps.concurrent and caps.decodes_itself
    assert not caps.logits_audit and not caps.speculative and caps.residency == "cuda:0"


@pytest.mark.parametrize("env, text, needle", [
    ("LOCKSTEP_VLLM_GPU_MEMORY", "1.5", "fraction in (0, 1]"),
    ("LOCKSTEP_VLLM_GPU_MEMORY", "lots", "fraction in (0, 1]"),
    ("LOCKSTEP_VLLM_EAGER", "yes", "must be 0 or 1"),
])
def test_a_bad_setting_names_the_variable(monkeypatch, env, text, needle):
    monkeypatch.setenv(env, text)
    with pytest.raises(InputError) as err:
        vllm_engine.memory_fraction() if env.endswith("MEMORY") else vllm_engine.flag(env, True)
    assert needle in err.value.message and err.value.field == env and err.value.value == text


# -- vLLM's outputs as lockstep's -----------------------------------------------------------

def test_steps_carry_the_token_its_logprob_and_the_top_k_best_first():
    lsm = log_softmax(np.array([0.0, 3.0, 1.0, 2.0, -1.0]))
    outside = position(lsm, 4, 2)  # greedy would not pick 4; vLLM adds it as a k+1-th entry
    steps = step_logprobs([1, 4], [position(lsm, 1, 2), outside])
    assert steps[0].token == 1 and steps[0].logprob == pytest.approx(lsm[1])
    assert [i for i, _ in steps[0].top] == [1, 3]
    assert [i for i, _ in steps[1].top] == [1, 3, 4]  # the sampled token kept, sorted in
    assert steps[1].logprob == pytest.approx(lsm[4])


def test_a_position_without_its_token_or_a_count_that_differs_is_an_execution_error():
    lsm = log_softmax(np.arange(5.0))
    with pytest.raises(ExecutionError, match="lack the token it emitted"):
        step_logprobs([0], [{4: Logprob(float(lsm[4]), 1)}])
    with pytest.raises(ExecutionError, match="2 tokens but 1 log-probability positions"):
        step_logprobs([4, 4], [position(lsm, 4, 1)])
    with pytest.raises(ExecutionError, match="no log-probability positions"):
        step_logprobs([4], None)


def test_a_request_output_becomes_a_decode_result():
    lsm = log_softmax(np.arange(6.0))
    done = CompletionOutput(0, "", [5, 5], None, [position(lsm, 5, 3)] * 2)
    out = RequestOutput("r", None, [1, 2], None, [done], True)
    result = to_result("vllm", [1, 2], out, Ledger(), 0.5, audit=True)
    assert result.tokens == [5, 5] and result.prompt == [1, 2] and result.wall_s == 0.5
    assert [s.token for s in result.top_logprobs] == [5, 5]
    assert result.logits is None
    assert to_result("vllm", [1, 2], out, Ledger(), 0.5, audit=False).top_logprobs is None
    with pytest.raises(ExecutionError, match="no completion"):
        to_result("vllm", [1, 2], RequestOutput("r", None, [1], None, [], True), Ledger(),
                  0.1, audit=False)


def test_the_prompt_record_skips_the_first_position_and_keeps_each_tokens_own():
    lsm = log_softmax(np.arange(4.0))
    record = prompt_record([7, 2, 9], [None, position(lsm, 2, 1), {3: Logprob(-0.5, 1)}])
    assert record[0] is None
    assert record[1]["token"] == 2 and record[1]["logprob"] == pytest.approx(lsm[2])
    assert record[1]["top"][0][0] == 3
    assert record[2] == {"token": 9, "logprob": None, "top": [[3, -0.5]]}
    assert prompt_record([1], None) == []


# -- the folder vLLM loads ------------------------------------------------------------------

def test_the_folder_of_smollm2s_gguf_stops_at_the_ggufs_eos():
    """transformers' GGUF tokenizer names <|im_start|> (1) as SmolLM2's eos, the GGUF says
    <|im_end|> (2); vLLM stops at the tokenizer's, so the folder must carry the GGUF's."""
    pytest.importorskip("gguf", reason="make real (pip install gguf tokenizers)")
    import transformers

    from engines.backends.checkpoint_source import content_hash
    from engines.shipped_checkpoint import INSTALL, smollm2_path
    from engines.backends.vllm_engine import align_eos, hf_folder
    from engines.cache_root import cache_root

    path = smollm2_path()
    if path is None:
        pytest.skip(f"SmolLM2 is not installed: {INSTALL}")
    folder = hf_folder(CheckpointSource(path, "gguf", content_hash(path)))  # make real's
    assert folder.parent == cache_root() / "vllm-hf"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["eos_token_id"] == 2
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.eos_token_id == 2 and tokenizer.eos_token == "<|im_end|>"
    assert hf_folder(CheckpointSource(path, "gguf", content_hash(path))) == folder  # cached
    # what transformers 5.17 hands over (5.24 has it right): the tokenizer's eos is moved
    tokenizer.eos_token = "<|im_start|>"
    assert tokenizer.eos_token_id == 1
    align_eos(tokenizer, config["eos_token_id"])
    assert tokenizer.eos_token_id == 2
    align_eos(tokenizer, None)  # a configuration without one leaves it
    assert tokenizer.eos_token_id == 2


# -- judged through the runner --------------------------------------------------------------

@pytest.mark.claim("token_identity")
def test_the_fake_is_judged_identical_and_records_what_ran(fake_vllm, tmp_path):
    summary = run_matrix([FakeVllm], ["tiny_llama"], None, 6, max_prompts=2,
                         evidence_dir=tmp_path)
    assert [c.status for c in summary.cells] == ["identical"] * 2, \
        [c.reason for c in summary.cells]
    cell = summary.cells[0]
    assert cell.verdicts["logits_within_tolerance"] == "pass"
    assert cell.audit.k == vllm_engine.TOP_K and len(cell.audit.steps) == len(cell.tokens)
    record = json.loads(cell.record_path.read_text())
    assert record["logits_audit"]["kind"] == "top-k"
    prov = record["engine_provenance"]
    assert prov["vllm"] == "0.26.0-fake" and prov["attention_backends"] == ["FLASH_ATTN"]
    assert prov["sampling"]["temperature"] == 0 and prov["sampling"]["logprobs"] == 10
    assert prov["options"]["dtype"] == "float32" and prov["options"]["seed"] == 0
    assert prov["VLLM_BATCH_INVARIANT"] in ("unset", "0", "1")
    lines = (tmp_path / prov["prompt_logprobs_file"]).read_text().splitlines()
    assert lines and json.loads(lines[0])["prompt_logprobs"][0] is None


@pytest.mark.claim("token_identity")
def test_a_wrong_token_at_one_step_is_caught(fake_vllm):
    summary = run_matrix([WrongTokenVllm], ["tiny_llama"], None, 6, max_prompts=1)
    cell = summary.cells[0]
    assert cell.status != "identical" and cell.verdicts["token_identity"] == "fail", cell.reason
    assert "step 3" in cell.reason


@pytest.mark.claim("concurrency_invariance")
def test_concurrency_is_judged_and_a_batch_only_bug_is_caught(fake_vllm):
    fine = run_matrix([FakeVllm], ["tiny_llama"], None, 4, max_prompts=2, concurrency=2)
    assert [c.verdicts["concurrency_invariance"] for c in fine.cells] == ["pass"] * 2
    broken = run_matrix([BatchedWrongTokenVllm], ["tiny_llama"], None, 4, max_prompts=2,
                        concurrency=2)
    for cell in broken.cells:
        assert cell.verdicts["token_identity"] == "pass"  # alone it is right
        assert cell.verdicts["concurrency_invariance"] == "fail", cell.reason


def test_concurrent_prompts_go_to_vllm_in_one_call(fake_vllm, packages):
    engine = FakeVllm(packages["tiny_llama"])
    prompts = [[1, 2, 3], [4, 5]]
    results = engine.generate_concurrent(prompts, 3, audit=True)
    assert FakeLLM.calls == [prompts]
    alone = [engine.generate(p, 3, audit=True).tokens for p in prompts]
    assert [r.tokens for r in results] == alone
    engine.close()
    assert engine.llm is None


@pytest.mark.gpu
def test_the_fakes_have_vllms_field_names():
    """Where vLLM is installed: the fakes' fields are the real classes' (by name, in order)."""
    import inspect

    outputs = pytest.importorskip("vllm.outputs")
    from vllm import SamplingParams as RealParams
    from vllm.inputs import TokensPrompt as RealPrompt
    from vllm.logprobs import Logprob as RealLogprob

    def names(cls):
        return [f.name for f in dataclasses.fields(cls)]

    def arguments(fn):
        return list(inspect.signature(fn).parameters)[1:]

    assert names(Logprob) == names(RealLogprob)
    assert names(CompletionOutput) == names(outputs.CompletionOutput)
    ours = arguments(RequestOutput.__init__)
    assert arguments(outputs.RequestOutput.__init__)[:len(ours)] == ours
    assert set(names(SamplingParams)) <= set(RealParams.__struct_fields__)
    assert "prompt_token_ids" in RealPrompt.__annotations__
